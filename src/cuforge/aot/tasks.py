"""One build variant as a self-contained task, and the one function that runs it.

A :class:`BuildTask` is what an executor ships to a worker: a label for people, the JIT
call's arguments (``spec``, JSON types only, paths relative to the manifest's directory)
and the SHA-256 of every file the call may read (``files``). Files travel by content:
:func:`read_blobs` reads them once on the driver (checking they still have the digests
the manifest expansion recorded), :func:`materialize` writes them under a worker's
scratch dir (checking each digest again, never following a symlink).

:func:`run_task` makes exactly the call a user would make from the manifest's directory
(``cuforge.compile_file(...)`` for a ``kernel``; ``cuforge.torch.load(...)``'s build for an
``extension``), with the working directory (the base dir of keyed paths) set to ``root``.
So the entries it writes are the ones the user's later call finds: a hit, no compile.

Task contract (shared with ``cuforge.aot.ray_executor``; fields may be added, never renamed).

``spec`` of a ``kernel``: ``source`` (rel path), ``include_dirs`` (rel paths),
``name_expressions``, ``defines`` (name -> str), ``options``, ``arch`` (str, or a list for a
fatbin), ``backend``, ``output``. ``spec`` of an ``extension``: ``name``, ``sources`` (rel
paths), ``extra_cflags``, ``extra_cuda_cflags``, ``extra_ldflags``,
``extra_include_paths`` (rel paths), ``arch`` (list of archs).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = [
    "BuildTask",
    "TaskResult",
    "TaskFileError",
    "run_task",
    "is_cached",
    "materialize",
    "read_blobs",
    "task_files",
    "task_entries",
    "store_entries",
    "KINDS",
]

#: the task kinds :func:`run_task` knows
KINDS = ("kernel", "extension")

#: past this many files under a task's include dirs (a computed ``#include MACRO`` makes
#: every file there a candidate), the task refuses to travel rather than guess
MAX_TASK_FILES = 2000


class TaskFileError(ValueError):
    """A task's file is missing, changed since the manifest was expanded, or has a path
    that may not travel (absolute, or with ``..``)."""


@dataclass(frozen=True)
class BuildTask:
    """One variant to build. ``label``: for people (``"red.cu  blk<128, float>  sm_90"``);
    ``kind``: ``"kernel"`` or ``"extension"``; ``spec``: the JIT call's arguments (JSON
    types; paths relative to the manifest's dir); ``files``: rel path -> SHA-256 hex of
    every file under that dir the call may read. ``collect``: ask the executor to build it
    in a private cache and return its entries (bundles of extensions); ``line``: where the
    manifest declares it (for error messages; 0 when unknown)."""

    label: str
    kind: str
    spec: dict
    files: dict[str, str]
    collect: bool = False
    line: int = 0
    manifest: str = ""

    def __hash__(self) -> int:  # spec/files are dicts: hash what identifies the variant
        return hash((self.label, self.kind))


@dataclass
class TaskResult:
    """What running one task gave. ``hit``: nothing was compiled (it was in the cache);
    ``log``: the compiler log (or the error) when ``ok`` is False; ``entries``: every
    entry the task wrote, ``(key, kind, payload, meta)``, when it ran with ``collect``."""

    label: str
    ok: bool
    hit: bool
    seconds: float
    log: str
    entries: list[tuple[str, str, bytes, dict]] | None = None
    task: BuildTask | None = field(default=None, repr=False)


# os.chdir and os.environ are process-wide: tasks run in this process one at a time
_process_lock = threading.RLock()


def run_task(task: BuildTask, root: str, *, collect: bool = False) -> TaskResult:
    """Make the JIT call of ``task`` with the working directory set to ``root`` (restored
    after), so the keys equal those of the user's later call from the manifest's dir.

    ``collect``: build in a private, empty cache dir (the remote tiers of
    ``CUFORGE_REMOTE`` stay configured, so workers write to a shared cache directly) and
    return every entry written, for executors whose workers cannot see the driver's cache.
    Never raises for a failing build: the result says ``ok=False`` with the log."""
    start = time.perf_counter()
    with _process_lock:
        here = os.getcwd()
        try:
            os.chdir(root)
            if collect:
                with _private_cache() as cache_dir:
                    hit, log = _run(task)
                    entries = _entries_in(cache_dir) if log is None else None
            else:
                hit, log = _run(task)
                entries = None
        finally:
            os.chdir(here)
    return TaskResult(
        label=task.label,
        ok=log is None,
        hit=bool(hit) and log is None,
        seconds=time.perf_counter() - start,
        log=log or "",
        entries=entries,
        task=task,
    )


def is_cached(task: BuildTask, root: str) -> bool:
    """Whether the task's JIT call is answered from the cache now, compiling nothing (a
    strict lookup). Always False for an ``extension`` (its build checks its own cache)."""
    if task.kind != "kernel":
        return False
    from cuforge.errors import CuforgeError

    with _process_lock:
        here = os.getcwd()
        try:
            os.chdir(root)
            _kernel_call(task.spec, strict=True)
        except (CuforgeError, OSError, ValueError):
            # OfflineMissError: not cached; anything else is a real problem that the
            # build itself reports, with its log, when it runs the task
            return False
        finally:
            os.chdir(here)
    return True


def _run(task: BuildTask) -> tuple[bool, str | None]:
    """(hit, None) or (False, the log of the failure)."""
    from cuforge.errors import CompileError, CuforgeError

    try:
        if task.kind == "kernel":
            from cuforge.pipeline import counters

            before = counters["compiles"]
            _kernel_call(task.spec, strict=False)
            return counters["compiles"] == before, None
        if task.kind == "extension":
            return _extension_call(task.spec), None
        return False, f"unknown task kind {task.kind!r}: expected one of {', '.join(KINDS)}"
    except CompileError as exc:
        return False, str(exc)
    except (CuforgeError, OSError, ValueError, ImportError) as exc:
        return False, f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # noqa: BLE001 - one variant's failure is reported; the others still build
        import traceback

        return False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"


def _kernel_args(spec: Mapping) -> tuple[str, dict]:
    """(source text, keyword arguments of ``compile_cached``) of the call
    ``cuforge.compile_file(spec["source"], ...)`` makes from the working directory."""
    from cuforge.program import Program

    path = spec["source"]
    with open(path, "rb") as f:
        raw = f.read()
    arch = spec.get("arch")
    if isinstance(arch, list):
        arch = tuple(arch)
    return raw.decode("utf-8"), {
        "name": os.path.basename(path),
        "options": tuple(spec.get("options", ())),
        "include_dirs": tuple(spec.get("include_dirs", ())),
        "defines": dict(spec.get("defines") or {}) or None,
        "arch": arch,
        "backend": spec.get("backend", "nvrtc"),
        "output": spec.get("output", "cubin"),
        "name_expressions": tuple(spec.get("name_expressions", ())),
        "source_dir": os.path.dirname(os.path.abspath(path)),
        "result_type": Program,
    }


def _kernel_call(spec: Mapping, *, strict: bool):
    """``cuforge.compile_file(spec["source"], ...)`` from the working directory, exactly
    as :func:`cuforge.api.compile_file` makes it (plus ``strict``)."""
    from cuforge.pipeline import compile_cached

    source, kwargs = _kernel_args(spec)
    return compile_cached(source, strict=strict, **kwargs)


def task_entries(task: BuildTask, root: str) -> list:
    """The store entries (:class:`~cuforge.store.base.Entry`) that answer ``task``'s JIT
    call now: for a kernel, its entry and its direct-mode manifest (what a bundle needs
    for the call to hit). Compiles nothing; a miss raises ``OfflineMissError``. Not for
    extensions (their entries come back from a ``collect`` run)."""
    if task.kind != "kernel":
        raise ValueError(f"{task.label}: only kernel tasks can be looked up in place")
    from cuforge.pipeline import call_entries

    with _process_lock:
        here = os.getcwd()
        try:
            os.chdir(root)
            source, kwargs = _kernel_args(task.spec)
            return call_entries(source, **kwargs)
        finally:
            os.chdir(here)


def _extension_call(spec: Mapping) -> bool:
    """The build ``cuforge.torch.load(name, sources, ...)`` makes; True when nothing was
    compiled or linked."""
    from cuforge.torch.build import BuildSpec, build

    result = build(
        BuildSpec(
            spec["name"],
            list(spec["sources"]),
            extra_cflags=list(spec.get("extra_cflags", ())),
            extra_cuda_cflags=list(spec.get("extra_cuda_cflags", ())),
            extra_ldflags=list(spec.get("extra_ldflags", ())),
            extra_include_paths=list(spec.get("extra_include_paths", ())),
            arch=list(spec["arch"]) if spec.get("arch") else None,
        )
    )
    return not result.compiled and not result.linked


class _private_cache:
    """A fresh, private cache dir as ``CUFORGE_CACHE_DIR`` (file cache on) while the block
    runs; the environment and the call memo are restored / cleared around it."""

    _SWITCHES = ("CUFORGE_DISABLE_CACHE", "CUFORGE_DISABLE_FILE_CACHE")

    def __enter__(self) -> str:
        import tempfile

        from cuforge.pipeline import reset_memo

        self.dir = tempfile.mkdtemp(prefix="cuforge-task-")  # 0700, ours
        self.saved = {k: os.environ.get(k) for k in ("CUFORGE_CACHE_DIR", *self._SWITCHES)}
        os.environ["CUFORGE_CACHE_DIR"] = self.dir
        for k in self._SWITCHES:
            os.environ.pop(k, None)
        reset_memo()  # an answer memoized from the real cache would write nothing here
        return self.dir

    def __exit__(self, *exc: object) -> None:
        import shutil

        from cuforge.pipeline import reset_memo

        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        reset_memo()
        shutil.rmtree(self.dir, ignore_errors=True)


def _entries_in(cache_dir: str) -> list[tuple[str, str, bytes, dict]]:
    """Every entry of the disk cache at ``cache_dir``."""
    from cuforge.store.disk import DiskStore

    store = DiskStore(cache_dir, 2**62, telemetry=False)
    out = []
    for info in store.iterate():
        entry = store.get(info.key)
        if entry is not None:
            out.append((entry.key, entry.kind, bytes(entry.payload), dict(entry.meta)))
    return out


def store_entries(results: Iterable[TaskResult]) -> int:
    """Put every collected entry of ``results`` into this process's store tiers; the number
    stored. Entries are checked against :mod:`cuforge.store.schema` first (a malformed one
    raises ``ValueError`` naming the task)."""
    from cuforge.store import default_store
    from cuforge.store.base import Entry
    from cuforge.store.schema import entry_problem

    store = default_store()
    if store is None:
        return 0
    stored = 0
    for result in results:
        for key, kind, payload, meta in result.entries or ():
            problem = entry_problem(kind, meta)
            if problem is not None or not _is_key(key):
                raise ValueError(
                    f"{result.label}: the worker returned a malformed entry {key[:16]!r} "
                    f"({problem or 'not a hex key'}); nothing of it was stored"
                )
            if store.put(Entry(key, kind, bytes(payload), meta)):
                stored += 1
    return stored


def _is_key(text: str) -> bool:
    return 16 <= len(text) <= 128 and all(c in "0123456789abcdef" for c in text)


# -- files that travel ----------------------------------------------------------------


def _sha256(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def _check_rel(rel: str, label: str) -> str:
    """``rel`` as a safe relative path (no absolute path, no ``..``), or TaskFileError."""
    norm = os.path.normpath(rel)
    if os.path.isabs(rel) or norm == ".." or norm.startswith(".." + os.sep) or norm == ".":
        raise TaskFileError(
            f"{label}: file {rel!r} may not travel with the task: paths must be relative to "
            "the manifest's directory and stay inside it"
        )
    return norm


def task_files(kind: str, spec: Mapping, root: str) -> dict[str, str]:
    """rel path -> SHA-256 of every file under ``root`` the JIT call of ``spec`` may read:
    its source(s) and the user headers the include scanner finds (every file under the
    include dirs when a computed ``#include MACRO`` is seen). Files outside ``root`` do
    not travel (a worker must have them at the same path, like the CUDA toolkit)."""
    from cuforge.deps import scan_includes
    from cuforge.toolchain import toolkit_include_dirs

    root = os.path.abspath(root)
    if kind == "kernel":
        sources = [spec["source"]]
        dirs = [os.path.join(root, d) for d in spec.get("include_dirs", ())]
    else:
        sources = list(spec["sources"])
        dirs = [os.path.join(root, d) for d in spec.get("extra_include_paths", ())]
    found: list[str] = []
    for rel in sources:
        path = os.path.join(root, rel)
        found.append(path)
        with open(path, "rb") as f:
            text = f.read().decode("utf-8", errors="replace")
        scan = scan_includes(
            text,
            source_dir=os.path.dirname(path),
            include_dirs=dirs,
            system_dirs=toolkit_include_dirs(),
        )
        found.extend(scan.headers)
        if scan.computed:
            for d in [os.path.dirname(path), *dirs]:
                for dirpath, _subdirs, names in os.walk(d):
                    found.extend(os.path.join(dirpath, n) for n in names)
                    if len(found) > MAX_TASK_FILES:
                        raise TaskFileError(
                            f"{rel} has a computed #include and its include dirs hold over "
                            f"{MAX_TASK_FILES} files; use literal #include names"
                        )
    files: dict[str, str] = {}
    prefix = root.rstrip(os.sep) + os.sep
    for path in found:
        full = os.path.abspath(path)
        if not full.startswith(prefix) or not os.path.isfile(full):
            continue
        rel = os.path.relpath(full, root)
        if rel not in files:
            from cuforge._fs import read_bytes

            files[rel] = _sha256(read_bytes(full, follow=True))
    return files


def read_blobs(tasks: Iterable[BuildTask], root: str) -> dict[str, bytes]:
    """sha -> bytes for every file of ``tasks`` (each file read once). Raises
    :class:`TaskFileError` when a file is gone or its content changed since the manifest
    was expanded (its digest no longer matches)."""
    from cuforge._fs import read_bytes

    blobs: dict[str, bytes] = {}
    for task in tasks:
        for rel, sha in task.files.items():
            if sha in blobs:
                continue
            path = os.path.join(root, _check_rel(rel, task.label))
            try:
                data = read_bytes(path, follow=True)
            except OSError as exc:
                raise TaskFileError(f"{task.label}: cannot read {path}: {exc}") from None
            if _sha256(data) != sha:
                raise TaskFileError(
                    f"{task.label}: {path} changed since the manifest was expanded; "
                    "run the build again"
                )
            blobs[sha] = data
    return blobs


def materialize(task: BuildTask, blobs: Mapping[str, bytes], dest_root: str) -> None:
    """Write ``task.files`` under ``dest_root`` from ``blobs`` (sha -> bytes). Checks each
    blob's SHA-256 and each path (relative, inside ``dest_root``); never follows a symlink
    (an existing link at a target path is replaced). Raises :class:`TaskFileError`."""
    from cuforge._fs import atomic_write

    for rel, sha in task.files.items():
        norm = _check_rel(rel, task.label)
        data = blobs.get(sha)
        if data is None:
            raise TaskFileError(f"{task.label}: no content for {rel} (sha256 {sha[:16]}...)")
        if _sha256(bytes(data)) != sha:
            raise TaskFileError(f"{task.label}: the content sent for {rel} has the wrong sha256")
        path = os.path.join(dest_root, norm)
        parent = os.path.dirname(path)
        _no_links_between(dest_root, parent, task.label)
        atomic_write(path, bytes(data), mode=0o600)


def _no_links_between(root: str, parent: str, label: str) -> None:
    """No directory between ``root`` and ``parent`` is a symlink (else a write could land
    outside ``root``)."""
    rel = os.path.relpath(parent, root)
    if rel == ".":
        return
    current = root
    for part in rel.split(os.sep):
        current = os.path.join(current, part)
        if os.path.islink(current):
            raise TaskFileError(f"{label}: {current} is a symlink; refusing to write through it")
