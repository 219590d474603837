"""Build variants as Ray tasks: ``cuforge build --executor ray`` (layer 5, optional extra
``cuforge[ray]``).

:class:`RayExecutor` runs each :class:`~cuforge.aot.tasks.BuildTask` as one Ray task.

How files travel: content-addressed. The driver reads every file the tasks name once
(:func:`~cuforge.aot.tasks.read_blobs`, which checks each file still has the digest the
manifest expansion recorded), ``ray.put``\\ s each distinct content once, and passes each
task the object refs of exactly its files. Ray moves an object to a node once and shares
it there between workers. The worker writes the files under a fresh private temp dir
(:func:`~cuforge.aot.tasks.materialize`, which checks every SHA-256 again and follows no
symlink), makes the task's JIT call with that dir as the base dir, and deletes it after.
Ray's ``working_dir`` is not used (``runtime_env`` carries only variables): a worker needs only cuforge and a
CUDA compiler.

What comes back: the :class:`~cuforge.aot.tasks.TaskResult`, as tasks finish
(``ray.wait``). Its ``entries`` hold every entry the worker wrote (``run_task(...,
collect=True)`` in a private cache dir); the caller stores them with
:func:`~cuforge.aot.tasks.store_entries` (:func:`cuforge.aot.build.build` does). When a
writable remote tier is configured (``CUFORGE_REMOTE`` on the driver, forwarded to the
workers), workers write their entries to it directly, read each one back from it, and
return ``entries=None`` for a result the remote confirmed; if the remote did not take an
entry, the payloads come back to the driver as without a remote.

What the worker sees of the driver's environment: the variables that enter cache keys or
pick the arch (:data:`FORWARDED_ENV`), set as on the driver (unset ones sent empty, which
cuforge reads as unset) through Ray's ``runtime_env={"env_vars": ...}``, so the worker makes the entries the driver's later JIT call looks up. The
remote tier's HMAC key (``CUFORGE_REMOTE_KEY`` / ``_FILE``) is never sent: a worker that
must sign needs it in its own environment, else its entries come back to the driver.
Before building, a worker compares its compiler identity (what the key records about
NVRTC / nvcc) with the driver's: a node with another toolkit would make entries the driver
never looks up, so its variants fail with a message saying which field differs.

Failures never raise: a compile error, a file that cannot be written, a worker killed or a
node lost (after ``max_retries`` retries) each give ``TaskResult(ok=False, log=why)``.
Ray's object transport pickles (cloudpickle), as every Ray program does: a Ray cluster is
one trust domain (whoever can submit tasks to it can run code on it). The cache dir is not
part of it: entries coming back are checked against :mod:`cuforge.store.schema` by
:func:`~cuforge.aot.tasks.store_entries` before they are stored.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import socket
import tempfile
import time
import traceback
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from cuforge.aot.executor import Executor
from cuforge.aot.tasks import (
    BuildTask,
    TaskFileError,
    TaskResult,
    materialize,
    read_blobs,
    run_task,
)
from cuforge.base.config import CODEGEN_ENV_VARS, settings
from cuforge.base.errors import CuforgeError, ToolchainError
from cuforge.core.caching import Cache, default_cache
from cuforge.store.remote import open_remotes
from cuforge.toolchain.identity import compiler_identity

if TYPE_CHECKING:
    from typing import Any

__all__ = ["RayExecutor", "FORWARDED_ENV", "RAY_MISSING"]

#: Environment variables a worker gets from the driver while it runs a task (set to the
#: driver's value, or unset when the driver has them unset): those that enter cache keys
#: (``cuforge.base.config.CODEGEN_ENV_VARS``), the arch fallbacks, and the remote tier's
#: settings except its secret.
FORWARDED_ENV: tuple[str, ...] = (
    *CODEGEN_ENV_VARS,
    "CUFORGE_ARCH",
    "CUTE_DSL_ARCH",
    "TORCH_CUDA_ARCH_LIST",
    "CUFORGE_REMOTE",
    "CUFORGE_REMOTE_BACKEND",
    "CUFORGE_REMOTE_READONLY",
    "CUFORGE_REMOTE_CONNECT_TIMEOUT",
    "CUFORGE_REMOTE_TIMEOUT",
    "CUFORGE_REMOTE_TTL",
)

#: the message when Ray cannot be imported
RAY_MISSING = (
    "the Ray executor needs Ray: pip install 'cuforge[ray]' (on the driver and on every node "
    "of the cluster, with cuforge and a CUDA compiler)"
)


def _import_ray():
    try:
        import ray
    except ImportError as exc:
        raise CuforgeError(f"{RAY_MISSING} (import ray failed: {exc})") from None
    return ray


class RayExecutor(Executor):
    """Each task a Ray task; results in the order they finish.

    Args:
        address: the cluster to use (``"host:port"``, ``"auto"``: the one ``ray start``
            started on this machine, ``"ray://..."``). None: ``RAY_ADDRESS`` when set,
            else a Ray started on this machine for this build (shut down by
            :meth:`close`). An already initialized Ray (``ray.init`` by the caller) is
            used as it is and never shut down here.
        num_cpus: CPUs Ray reserves per task (1: one compile per core).
        max_retries: how often Ray re-runs a task whose worker died or whose node was
            lost (a compile is idempotent) before its result says ``ok=False``.
        init_options: extra keyword arguments of ``ray.init`` when this executor starts
            or joins Ray (e.g. ``{"num_cpus": 8}`` for a local start).
    """

    name = "ray"

    def __init__(
        self,
        address: str | None = None,
        *,
        num_cpus: float = 1,
        max_retries: int = 1,
        init_options: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(num_cpus, (int, float)) or isinstance(num_cpus, bool) or num_cpus <= 0:
            raise ValueError(f"num_cpus must be a number > 0, not {num_cpus!r}")
        if not isinstance(max_retries, int) or isinstance(max_retries, bool) or max_retries < 0:
            raise ValueError(f"max_retries must be a whole number >= 0, not {max_retries!r}")
        self.address = address
        self.num_cpus = num_cpus
        self.max_retries = max_retries
        self.init_options = dict(init_options or {})
        self._owned = False  # whether close() shuts Ray down (we started or joined it)

    def __repr__(self) -> str:
        return f"RayExecutor(address={self.address!r}, num_cpus={self.num_cpus})"

    # -- connecting ---------------------------------------------------------------------

    def _connect(self, ray) -> None:
        if ray.is_initialized():
            return

        options = dict(self.init_options)
        options.setdefault("logging_level", logging.WARNING)  # no INFO lines in the build's output
        address = self.address or os.environ.get("RAY_ADDRESS") or None
        if address is None:  # a local Ray: no dashboard (it costs a process and a port)
            options.setdefault("include_dashboard", False)
        try:  # "local": never join whatever cluster /tmp/ray last recorded (may be stale)
            ray.init(address=address or "local", **options)
        except ConnectionError as exc:
            where = f"address={self.address!r}" if self.address else "RAY_ADDRESS"
            raise CuforgeError(
                f"cannot reach the Ray cluster at {address} ({where}): {exc}. Check that "
                "the head node runs (`ray status --address ...`) and that this machine can "
                "reach it, or unset RAY_ADDRESS to build with a Ray started here"
            ) from None
        self._owned = True

    def close(self) -> None:
        """Shut Ray down if this executor started or joined it; idempotent."""
        if self._owned:
            self._owned = False
            import ray

            ray.shutdown()

    # -- running --------------------------------------------------------------------------

    def run(
        self, tasks: Sequence[BuildTask], root: str, cache: Cache | None = None
    ) -> Iterator[TaskResult]:
        """Submit every task, then yield each result as it finishes (exactly one per task).
        ``cache`` is not sent: a worker builds into a private cache dir with the remote
        tiers its environment (the driver's, through ``runtime_env``) names.
        A task whose files cannot be read, whose worker fails, or whose node is lost yields
        ``ok=False`` with the reason; nothing here raises for one variant's problem."""
        tasks = list(tasks)
        if not tasks:
            return
        ray = _import_ray()
        self._connect(ray)
        want = _driver_identities(tasks)
        signs = _driver_signs()
        # the driver's key-relevant environment, through Ray's own runtime_env (workers are
        # started with it; cuforge writes no os.environ): an unset variable is sent empty,
        # which every one of them reads as unset
        env_vars = {name: os.environ.get(name) or "" for name in FORWARDED_ENV}
        fn = _remote_function(ray).options(
            num_cpus=self.num_cpus,
            max_retries=self.max_retries,
            retry_exceptions=False,
            runtime_env={"env_vars": env_vars},
        )
        refs: dict[str, Any] = {}  # sha256 -> ObjectRef: each content put once
        pending: dict[Any, tuple[BuildTask, float]] = {}
        failed: list[TaskResult] = []
        try:
            for task in tasks:
                t0 = time.perf_counter()
                problem = self._put_files(ray, task, root, refs)
                if problem is not None:
                    failed.append(TaskResult.failed(task, problem))
                    continue
                shas = tuple(sorted(set(task.files.values())))
                ref = fn.remote(task, want, signs, shas, *[refs[s] for s in shas])
                pending[ref] = (task, t0)
            yield from failed
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                if len(pending) > 1:  # take everything else that is ready too
                    rest = [r for r in pending if r not in done]
                    more, _ = ray.wait(rest, num_returns=len(rest), timeout=0)
                    done = [*done, *more]
                for ref in done:
                    task, t0 = pending.pop(ref)
                    yield _collect(ray, ref, task, t0, self.max_retries)
        finally:  # the caller stopped early (an error, Ctrl-C): do not leave work running
            if pending and ray.is_initialized():
                for ref in pending:
                    ray.cancel(ref)

    @staticmethod
    def _put_files(ray, task: BuildTask, root: str, refs: dict[str, Any]) -> str | None:
        """``ray.put`` the contents of ``task``'s files not put yet; a message when one
        cannot be read (or changed since the manifest was expanded), else None."""

        new = {rel: sha for rel, sha in task.files.items() if sha not in refs}
        if not new:
            return None
        try:
            blobs = read_blobs([dataclasses.replace(task, files=new)], root)
        except TaskFileError as exc:
            return str(exc)
        for sha, data in blobs.items():
            refs[sha] = ray.put(data)
        return None


def _collect(ray, ref, task: BuildTask, t0: float, retries: int) -> TaskResult:
    """The result behind ``ref``, or ``ok=False`` saying what Ray reported."""
    from ray import exceptions as rex

    try:
        result = ray.get(ref)
    except (rex.WorkerCrashedError, rex.NodeDiedError, rex.OwnerDiedError) as exc:
        log = (
            f"the Ray worker building it died or its node was lost, "
            f"{retries + 1} time(s) (out of memory, killed, or the node left the cluster): "
            f"{type(exc).__name__}: {exc}"
        )
        return TaskResult.failed(task, log, time.perf_counter() - t0)
    except rex.RayError as exc:
        log = f"Ray could not run it: {type(exc).__name__}: {exc}"
        return TaskResult.failed(task, log, time.perf_counter() - t0)
    if not isinstance(result, TaskResult):  # a worker with another cuforge, or none
        log = f"the Ray worker returned {type(result).__name__}, not a TaskResult"
        return TaskResult.failed(task, log, time.perf_counter() - t0)
    result.task = task
    return result


def _driver_identities(tasks: Sequence[BuildTask]) -> dict[str, dict[str, str]]:
    """backend -> the driver's compiler identity, for the backends the kernel tasks use
    (left out where the driver has no such compiler: then nothing is compared)."""

    out: dict[str, dict[str, str]] = {}
    for backend in sorted({t.spec.get("backend", "nvrtc") for t in tasks if t.kind == "kernel"}):
        try:
            out[backend] = compiler_identity(backend)
        except (ToolchainError, ValueError):
            continue
    return out


def _driver_signs() -> bool:
    """Whether the driver signs remote entries (then a worker writes the remote directly
    only if it has the key too)."""

    current = settings()
    return bool(current.remote_key or current.remote_key_file)


# -- the worker side ----------------------------------------------------------------------


_remote_functions: dict[Any, Any] = {}  # the worker function -> its Ray remote function


def _remote_function(ray):
    """The Ray remote function of :func:`_build_on_worker`, made once (looked up at each
    run, so a test can replace the worker function)."""
    body = _build_on_worker
    fn = _remote_functions.get(body)
    if fn is None:
        fn = _remote_functions[body] = ray.remote(body)
    return fn


def _build_on_worker(
    task: BuildTask,
    want: dict[str, dict[str, str]],
    signs: bool,
    shas: tuple[str, ...],
    *blobs: bytes,
) -> TaskResult:
    """Run ``task`` here (a worker started with the driver's key-relevant environment):
    the files written under a private temp dir, ``run_task(collect=True)``; entries
    confirmed by a writable remote tier are dropped from the result (the driver need not
    receive them)."""

    start = time.perf_counter()
    try:
        cache = default_cache()
        if signs and not _worker_has_key():
            # the remote would refuse (or be polluted by) unsigned entries: read it, write
            # nothing; the entries go back to the driver, which signs them
            cache = cache.replace(read_only=True)
        problem = _identity_problem(want)
        if problem is not None:
            return TaskResult(task.label, False, False, time.perf_counter() - start, problem)
        root = tempfile.mkdtemp(prefix="cuforge-ray-")
        try:
            materialize(task, dict(zip(shas, blobs, strict=True)), root)
            result = run_task(task, root, cache=cache, collect=True)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        if result.ok and result.entries and _remote_holds(result.entries, signs):
            result.entries = None
    except Exception as exc:  # noqa: BLE001 - a worker-side failure is this variant's result, never a crash
        log = f"{_where()}: {type(exc).__name__}: {exc}\n{traceback.format_exc()}"
        return TaskResult(task.label, False, False, time.perf_counter() - start, log)
    result.seconds = time.perf_counter() - start
    result.task = None  # the driver has it; do not send it back
    if not result.ok:
        result.log = f"[{_where()}]\n{result.log}"
    return result


def _where() -> str:
    return f"on Ray node {socket.gethostname()} (pid {os.getpid()})"


def _identity_problem(want: Mapping[str, Mapping[str, str]]) -> str | None:
    """Why this worker's compilers would make keys the driver never looks up, or None."""

    for backend, expected in want.items():
        try:
            mine = compiler_identity(backend)
        except ToolchainError as exc:
            return f"{_where()}: no {backend} here: {exc}"
        differ = sorted(k for k in set(expected) | set(mine) if expected.get(k) != mine.get(k))
        if differ:
            fields = "; ".join(
                f"{k}: driver {expected.get(k)!r}, worker {mine.get(k)!r}" for k in differ
            )
            return (
                f"{_where()}: its {backend} differs from the driver's ({fields}). Entries built "
                "here would have keys the driver never looks up: give every node the same CUDA "
                "toolkit at the same path as the machines that will use the cache"
            )
    return None


def _worker_has_key() -> bool:
    """Whether this worker's own environment can sign remote entries."""

    current = settings()
    return bool(current.remote_key or current.remote_key_file)


def _remote_holds(entries: list[tuple[str, str, bytes, dict]], signs: bool) -> bool:
    """Whether a writable remote tier configured here holds every entry with its exact
    payload (read back from the remote itself, not from a local tier)."""

    current = settings()
    if not current.remote or current.remote_readonly:
        return False
    if signs and not _worker_has_key():
        return False  # the driver signs and this worker cannot: its entries go back
    remotes = _worker_remotes(current)
    for key, kind, payload, _meta in entries:
        for remote in remotes:
            entry = remote.get(key, kind=kind)
            if entry is not None and bytes(entry.payload) == payload:
                break
        else:
            return False
    return True


# this worker's remote tiers, kept across tasks (connections, circuit breakers), keyed by
# the settings that shape them
_remotes_memo: dict[tuple, list] = {}


def _worker_remotes(current) -> list:
    shape = current.remote_shape()
    remotes = _remotes_memo.get(shape)
    if remotes is None:
        remotes = _remotes_memo[shape] = open_remotes(current)
    return remotes
