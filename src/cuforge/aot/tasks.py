"""One build variant as a self-contained task, and the one function that runs it.

A :class:`BuildTask` is what an executor ships to a worker: a label for people, the JIT
call's arguments (``spec``, JSON types only, paths relative to the manifest's directory)
and the SHA-256 of every file the call may read (``files``). Files travel by content:
:func:`read_blobs` reads them once on the driver (checking they still have the digests
the manifest expansion recorded), :func:`materialize` writes them under a worker's
scratch dir (checking each digest again, never following a symlink).

:func:`run_task` makes exactly the call a user would make from the manifest's directory
(``cuforge.compile_file(...)`` for a ``kernel``; ``cuforge.torch.load(...)``'s build for an
``extension``; the project's own function for a ``python`` variant, which makes
``cuforge.cccl`` / ``cuforge.cute`` calls) against a :class:`cuforge.Cache` whose base dir
of keyed paths is ``root``, with relative paths resolved against ``root``. So the entries it
writes are the ones the user's later call finds: a hit, no compile. It changes nothing
process-wide (no working directory, no environment variable), so tasks may run in threads.

Task contract (shared with ``cuforge.aot.ray_executor``; fields may be added, never renamed).

``spec`` of a ``kernel``: ``source`` (rel path), ``include_dirs`` (rel paths),
``name_expressions``, ``defines`` (name -> str), ``options``, ``arch`` (str, or a list for a
fatbin), ``backend``, ``output``. ``spec`` of an ``extension``: ``name``, ``sources`` (rel
paths), ``extra_cflags``, ``extra_cuda_cflags``, ``extra_ldflags``,
``extra_include_paths`` (rel paths), ``arch`` (list of archs). ``spec`` of a ``python``:
``call`` (``"module:function"``, the module under ``root``), ``kwargs`` (JSON types),
``arch`` (str, passed as the ``arch`` keyword argument, or None: not passed), ``files``
(extra rel paths / globs that travel with it; the module's own file always does).
"""

from __future__ import annotations

import glob
import importlib
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cuforge.base._fs import atomic_write, read_bytes, read_source
from cuforge.base.errors import CompileError, CuforgeError
from cuforge.core.caching import Cache, resolve, using
from cuforge.core.pipeline import BACKENDS, call_entries, compile_cached
from cuforge.frontend.program import Program
from cuforge.keys.deps import scan_includes
from cuforge.keys.key import bytes_digest
from cuforge.store.base import Entry, is_entry_key
from cuforge.store.disk import DiskStore
from cuforge.store.schema import entry_problem
from cuforge.toolchain import toolkit_include_dirs
from cuforge.torch.build import BuildSpec, build

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
    "python_module_files",
    "python_files",
    "KINDS",
]

#: the task kinds :func:`run_task` knows
KINDS = ("kernel", "extension", "python")

#: past this many files under a task's include dirs (a computed ``#include MACRO`` makes
#: every file there a candidate), the task refuses to travel rather than guess
MAX_TASK_FILES = 2000


class TaskFileError(ValueError):
    """A task's file is missing, changed since the manifest was expanded, or has a path
    that may not travel (absolute, or with ``..``)."""


@dataclass(frozen=True)
class BuildTask:
    """One variant to build. ``label``: for people (``"red.cu  blk<128, float>  sm_90"``);
    ``kind``: ``"kernel"``, ``"extension"`` or ``"python"``; ``spec``: the JIT call's arguments (JSON
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

    @classmethod
    def failed(cls, task: BuildTask, log: str, seconds: float = 0.0) -> TaskResult:
        """``task`` did not build; ``log`` says why."""
        return cls(task.label, False, False, seconds, log, task=task)


def task_cache(cache: Cache | None, root: str, **changes: Any) -> Cache:
    """The cache a task's call runs against: ``cache`` (default: the default cache) with
    keyed paths relative to ``root`` -- the key of the user's later call made from the
    manifest's directory -- unless the cache names its own base dir. ``changes``: more
    :meth:`~cuforge.Cache.replace` arguments (``offline=True``, a private ``directory``)."""
    cache = resolve(cache)
    if cache.base_dir is None:
        changes.setdefault("base_dir", root)
    if not changes:
        return cache
    if "directory" in changes:  # a private dir per task: nothing to share
        return cache.replace(**changes)
    # one variant per (root, changes), kept by the cache: the tasks of a build share its
    # tiers (one journal read, one memory tier) instead of opening them once per task
    memo = cache.memo("aot.task_caches")
    key = (root, tuple(sorted(changes.items())))
    found = memo.get(key)
    if found is None:
        found = memo[key] = cache.replace(**changes)
    return found


def run_task(
    task: BuildTask,
    root: str,
    *,
    cache: Cache | None = None,
    collect: bool = False,
    offline: bool = False,
) -> TaskResult:
    """Make the JIT call of ``task`` as the user would from ``root`` (the manifest's
    directory: relative paths are resolved against it and keyed paths are relative to it),
    against ``cache`` (default: the default cache), so the entries it writes are the ones
    the user's later call finds. Nothing process-wide changes: no working directory, no
    environment variable.

    ``collect``: build in a private, empty cache dir (with ``cache``'s remote tiers, so
    workers write to a shared cache directly) and return every entry written, for
    executors whose workers cannot see the driver's cache. ``offline``: strict mode (a
    miss raises, nothing is built; how ``cuforge build --strict`` checks a ``python``
    variant). Never raises for a failing build: the result says ``ok=False`` with the log."""
    start = time.perf_counter()
    root = os.path.abspath(root)
    if collect:
        private = tempfile.mkdtemp(prefix="cuforge-task-")  # 0700, ours
        try:
            run_in = task_cache(cache, root, directory=private, disk=True, enabled=True)
            hit, log = _run(task, root, run_in)
            entries = _entries_in(private) if log is None else None
        finally:
            shutil.rmtree(private, ignore_errors=True)
    else:
        run_in = task_cache(cache, root, offline=True) if offline else task_cache(cache, root)
        hit, log = _run(task, root, run_in)
        entries = None
    return TaskResult(
        label=task.label,
        ok=log is None,
        hit=bool(hit) and log is None,
        seconds=time.perf_counter() - start,
        log=log or "",
        entries=entries,
        task=task,
    )


def is_cached(task: BuildTask, root: str, *, cache: Cache | None = None) -> bool:
    """Whether the task's JIT call is answered from ``cache`` now, compiling nothing (a
    strict lookup). Always False for an ``extension`` (its build checks its own cache) and
    a ``python`` variant (its function is called: its cuforge calls are hits, cheap)."""
    if task.kind != "kernel":
        return False

    try:
        _kernel_call(task.spec, root, task_cache(cache, root), strict=True)
    except (CuforgeError, OSError, ValueError):
        # OfflineMissError: not cached; anything else is a real problem that the
        # build itself reports, with its log, when it runs the task
        return False
    return True


def _builds(cache: Cache) -> int:
    """Builds ``cache`` made so far: kernel compiles and blob builds (cuda.compute, CuTe
    DSL; stored or uncached)."""
    counters = cache.counters
    return counters.get("compiles", 0) + sum(
        n for k, n in counters.items() if k.endswith((":compiled", ":uncached"))
    )


def _run(task: BuildTask, root: str, cache: Cache) -> tuple[bool, str | None]:
    """(hit, None) or (False, the log of the failure)."""

    if task.kind == "python":
        return _python_call(task.spec, root, cache)
    try:
        if task.kind == "kernel":
            before = _builds(cache)
            _kernel_call(task.spec, root, cache, strict=False)
            return _builds(cache) == before, None
        if task.kind == "extension":
            return _extension_call(task.spec, root, cache), None
        return False, f"unknown task kind {task.kind!r}: expected one of {', '.join(KINDS)}"
    except CompileError as exc:
        return False, str(exc)
    except (CuforgeError, OSError, ValueError, ImportError) as exc:
        return False, f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # noqa: BLE001 - one variant's failure is reported; the others still build
        return False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"


def _kernel_args(spec: Mapping, root: str) -> tuple[str, dict]:
    """(source text, keyword arguments of ``compile_cached``) of the call
    ``cuforge.compile_file(spec["source"], ...)`` makes from the directory ``root``."""

    path = os.path.join(root, spec["source"])
    arch = spec.get("arch")
    if isinstance(arch, list):
        arch = tuple(arch)
    backend = spec.get("backend", "nvrtc")
    options = tuple(spec.get("options", ()))
    if backend in BACKENDS:  # else compile_cached names the argument
        options = tuple(BACKENDS[backend].absolute_options(options, root))
    return read_source(path), {
        "name": os.path.basename(path),
        "options": options,
        "include_dirs": tuple(os.path.join(root, d) for d in spec.get("include_dirs", ())),
        "defines": dict(spec.get("defines") or {}) or None,
        "arch": arch,
        "backend": backend,
        "output": spec.get("output", "cubin"),
        "name_expressions": tuple(spec.get("name_expressions", ())),
        "source_dir": os.path.dirname(os.path.abspath(path)),
        "result_type": Program,
    }


def _kernel_call(spec: Mapping, root: str, cache: Cache, *, strict: bool):
    """``cuforge.compile_file(spec["source"], ...)`` from ``root``, exactly as
    :func:`cuforge.frontend.api.compile_file` makes it (plus ``strict``), against ``cache``."""

    source, kwargs = _kernel_args(spec, root)
    return compile_cached(source, strict=strict, cache=cache, **kwargs)


def task_entries(task: BuildTask, root: str, *, cache: Cache | None = None) -> list:
    """The store entries (:class:`~cuforge.store.base.Entry`) that answer ``task``'s JIT
    call now: for a kernel, its entry and its direct-mode manifest (what a bundle needs
    for the call to hit). Compiles nothing; a miss raises ``OfflineMissError``. Not for
    extensions (their entries come back from a ``collect`` run)."""
    if task.kind != "kernel":
        raise ValueError(f"{task.label}: only kernel tasks can be looked up in place")

    source, kwargs = _kernel_args(task.spec, root)
    return call_entries(source, cache=task_cache(cache, root), **kwargs)


def _extension_call(spec: Mapping, root: str, cache: Cache) -> bool:
    """The build ``cuforge.torch.load(name, sources, ...)`` makes from ``root``; True when
    nothing was compiled or linked."""

    result = build(
        BuildSpec(
            spec["name"],
            [os.path.join(root, s) for s in spec["sources"]],
            extra_cflags=list(spec.get("extra_cflags", ())),
            extra_cuda_cflags=list(spec.get("extra_cuda_cflags", ())),
            extra_ldflags=list(spec.get("extra_ldflags", ())),
            extra_include_paths=[
                os.path.join(root, d) for d in spec.get("extra_include_paths", ())
            ],
            arch=list(spec["arch"]) if spec.get("arch") else None,
            cache=cache,
        )
    )
    return not result.compiled and not result.linked


# -- python variants ---------------------------------------------------------------------


def _under(path: str | None, root: str) -> bool:
    if not path:
        return False
    real = os.path.realpath(path)
    return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


def _python_call(spec: Mapping, root: str, cache: Cache) -> tuple[bool, str | None]:
    """Import ``spec["call"]``'s module with ``root`` first on ``sys.path`` and call the
    function with ``spec["kwargs"]`` (plus ``arch=`` when the spec has one), with ``cache``
    as the cache of every cuforge call that passes none (:func:`cuforge.using`). (hit, None),
    hit = nothing was built; or (False, the traceback). The modules imported from ``root``
    are dropped from ``sys.modules`` after (a worker process runs many tasks, each from its
    own copy of the files); a module of the same name imported from elsewhere before is set
    aside while the call runs and put back after."""

    real_root = os.path.realpath(root)
    module_name, _, attr = spec["call"].partition(":")
    parts = module_name.split(".")
    names = [".".join(parts[: i + 1]) for i in range(len(parts))]
    aside = {
        n: sys.modules.pop(n)
        for n in names
        if n in sys.modules and not _under(getattr(sys.modules[n], "__file__", None), real_root)
    }
    before = set(sys.modules)
    sys.path.insert(0, root)
    builds = _builds(cache)
    try:
        importlib.invalidate_caches()
        target = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
        if not callable(target):
            return False, f"{spec['call']} is {type(target).__name__}, not a function"
        kwargs = dict(spec.get("kwargs") or {})
        if spec.get("arch") is not None:
            kwargs["arch"] = spec["arch"]
        with using(cache):
            target(**kwargs)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the project's code failed: this variant's log
        tb = exc.__traceback__.tb_next if exc.__traceback__ else None  # from the call down
        text = "".join(traceback.format_exception(type(exc), exc, tb))
        return False, f"{spec['call']}(**{kwargs_text(spec)}) raised:\n{text}"
    finally:
        try:
            sys.path.remove(root)
        except ValueError:
            pass  # the function removed it itself
        for name in set(sys.modules) - before:
            if _under(getattr(sys.modules[name], "__file__", None), real_root):
                del sys.modules[name]
        sys.modules.update(aside)
    return _builds(cache) == builds, None


def kwargs_text(spec: Mapping) -> str:
    """The keyword arguments a ``python`` variant's function gets, as text."""
    kwargs = dict(spec.get("kwargs") or {})
    if spec.get("arch") is not None:
        kwargs["arch"] = spec["arch"]
    return repr(kwargs)


def python_module_files(module: str, root: str) -> list[str]:
    """Rel paths under ``root`` of the files importing ``module`` (``"pkg.mod"``) reads:
    its file (``pkg/mod.py`` or ``pkg/mod/__init__.py``), first, then the ``__init__.py``
    of each parent package that has one. Raises ValueError when the module is not there."""
    parts = module.split(".")
    base = os.path.join(*parts)
    for rel in (base + ".py", os.path.join(base, "__init__.py")):
        if os.path.isfile(os.path.join(root, rel)):
            break
    else:
        raise ValueError(
            f"no module {module} under {root} (looked for {base}.py and "
            f"{os.path.join(base, '__init__.py')}; modules are resolved relative to the "
            "manifest's directory)"
        )
    found = [rel]
    for i in range(1, len(parts)):
        init = os.path.join(*parts[:i], "__init__.py")
        if os.path.isfile(os.path.join(root, init)):
            found.append(init)
    return found


def python_files(spec: Mapping, root: str) -> list[str]:
    """Rel paths of every file a ``python`` variant needs: its module's files
    (:func:`python_module_files`), then each of ``spec["files"]``: a file, a glob
    (``"kernels/*.py"``, ``"**/*.py"``) or a directory (every ``*.py`` under it). Raises
    ValueError for a pattern that names nothing or leaves ``root``."""

    root = os.path.abspath(root)
    out = python_module_files(spec["call"].partition(":")[0], root)
    for pattern in spec.get("files", ()):
        norm = os.path.normpath(pattern)
        if os.path.isabs(pattern) or norm == ".." or norm.startswith(".." + os.sep):
            raise TaskFileError(
                f"{pattern!r} may not travel with the task: paths and globs must be relative "
                "to the manifest's directory and stay inside it"
            )
        matches = sorted(glob.glob(pattern, root_dir=root, recursive=True))
        if not matches:
            raise ValueError(
                f"{pattern!r} names no file under {root} (paths and globs are relative to "
                "the manifest's directory)"
            )
        for rel in matches:
            full = os.path.join(root, rel)
            if os.path.isdir(full):
                for dirpath, subdirs, names in os.walk(full):
                    subdirs[:] = sorted(d for d in subdirs if d != "__pycache__")
                    out.extend(
                        os.path.relpath(os.path.join(dirpath, n), root)
                        for n in sorted(names)
                        if n.endswith(".py")
                    )
            elif os.path.isfile(full):
                out.append(os.path.normpath(rel))
    return list(dict.fromkeys(out))


def _entries_in(cache_dir: str) -> list[tuple[str, str, bytes, dict]]:
    """Every entry of the disk cache at ``cache_dir``."""

    store = DiskStore(cache_dir, 2**62, telemetry=False)
    out = []
    for info in store.iterate():
        entry = store.get(info.key)
        if entry is not None:
            out.append((entry.key, entry.kind, bytes(entry.payload), dict(entry.meta)))
    return out


def store_entries(results: Iterable[TaskResult], *, cache: Cache | None = None) -> int:
    """Put every collected entry of ``results`` into ``cache``'s writable tiers (default:
    the default cache); the number stored. Entries are checked against
    :mod:`cuforge.store.schema` first (a malformed one raises ``ValueError`` naming the
    task)."""

    store = resolve(cache).store
    if store is None:
        return 0
    stored = 0
    for result in results:
        for key, kind, payload, meta in result.entries or ():
            problem = entry_problem(kind, meta)
            if problem is not None or not is_entry_key(key):
                raise ValueError(
                    f"{result.label}: the worker returned a malformed entry {key[:16]!r} "
                    f"({problem or 'not a hex key'}); nothing of it was stored"
                )
            if store.put(Entry(key, kind, bytes(payload), meta)):
                stored += 1
    return stored


# -- files that travel ----------------------------------------------------------------


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
    include dirs when a computed ``#include MACRO`` is seen); for ``python``, the files of
    :func:`python_files`. Files outside ``root`` do
    not travel (a worker must have them at the same path, like the CUDA toolkit)."""

    root = os.path.abspath(root)
    if kind == "python":
        return {
            rel: bytes_digest(read_bytes(os.path.join(root, rel), follow=True))
            for rel in python_files(spec, root)
        }
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
            files[rel] = bytes_digest(read_bytes(full, follow=True))
    return files


def read_blobs(tasks: Iterable[BuildTask], root: str) -> dict[str, bytes]:
    """sha -> bytes for every file of ``tasks`` (each file read once). Raises
    :class:`TaskFileError` when a file is gone or its content changed since the manifest
    was expanded (its digest no longer matches)."""

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
            if bytes_digest(data) != sha:
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

    for rel, sha in task.files.items():
        norm = _check_rel(rel, task.label)
        data = blobs.get(sha)
        if data is None:
            raise TaskFileError(f"{task.label}: no content for {rel} (sha256 {sha[:16]}...)")
        if bytes_digest(bytes(data)) != sha:
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
