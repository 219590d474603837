"""cuforge under CuPy's kernel cache (``pip install "cuforge[cupy]"``).

``cuforge.cupy.enable(cache=None, include_dirs=())`` makes CuPy keep the kernels it
compiles (``RawKernel``, ``RawModule``, ``ElementwiseKernel``, ``ReductionKernel``, its own
kernels) in a :class:`cuforge.Cache`: entries of kind ``"cupy"``, every tier, the one LRU
cap, checksummed, shared through the remotes, signed when signing is on
(``cuforge cache ls --kind cupy``).

The hook is CuPy's ``KernelCacheBackend`` (``load(name) -> bytes | None``,
``save(name, cubin, source)``), set through the private
``cupy.cuda.compiler._set_kernel_cache_backend`` (CuPy 14). It is private, so
:func:`enable` is version-gated (:data:`SUPPORTED`) and checks the hook's shape: on another
CuPy it warns once, changes nothing and returns False -- CuPy's own cache keeps working.

**The key.** CuPy names an entry by a SHA-1 of the source, the options, the arch, the
NVRTC version and CuPy's own headers; it leaves out the user headers the source
``#include``-s, so a header edit is served the stale binary. CuPy's backend gets only that
name on ``load`` (not the source or the options), so cuforge cannot add to the name; it
does the next best thing: ``save`` records the user headers the source includes (found by
cuforge's dependency scanner in the ``-I`` / ``--include-path`` directories of the
compile's options -- :func:`enable` wraps CuPy's ``_compile_with_cache_cuda`` to read them,
since CuPy does not pass them to the backend -- then ``include_dirs``, then the working
directory), each by its path under the directory it was found in and its content digest, and ``load`` serves the entry only when every one of them still has that content
here. A header edit misses (CuPy compiles and the entry is replaced), a ``touch`` hits, and
the same headers in another checkout hit.

A stored entry that does not unpack is deleted and reported as missing: CuPy compiles.

**The compile fence** (:func:`cuforge.fence`): a ``load`` that misses (or finds a user
header changed) is a compile about to run: reported once per kernel name under ``warn``;
under ``error`` ``load`` raises :class:`~cuforge.base.errors.CompileAfterFenceError` (system
``"cupy"``, CuPy's kernel cache name, the cuforge key) and CuPy compiles nothing. A hit never
trips it.
"""

from __future__ import annotations

import contextvars
import json
import os
import threading
from typing import TYPE_CHECKING

from cuforge.adapters.common import (
    damaged,
    read_files,
    refused,
    warn_once,
    window_verdict,
    write_files,
)
from cuforge.adapters.windows import window
from cuforge.core import blobformat
from cuforge.core.caching import Cache, resolve
from cuforge.keys.deps import file_digest, scan_includes

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

__all__ = [
    "KIND",
    "SUPPORTED",
    "enable",
    "disable",
    "is_enabled",
    "hook_problem",
    "backend",
    "entry_key",
    "headers_of",
]

KIND = "cupy"
#: CuPy versions whose private hook this module was written against: [low, high)
SUPPORTED = window("cupy")  # the tested releases: cuforge/adapters/windows.py

_PAYLOAD = "payload"
_HEADERS = "headers.json"
_lock = threading.Lock()
_previous: list[Any] = []
_wrapped: list[Any] = []
#: the include directories of the CuPy compile in progress (read from its options)
_option_dirs: contextvars.ContextVar[tuple[tuple[str, ...], tuple[str, ...]]] = (
    contextvars.ContextVar("cuforge_cupy_option_dirs", default=((), ()))
)


def hook_problem() -> str | None:
    """Why the installed CuPy cannot take cuforge's cache (None when it can)."""
    try:
        import cupy
        from cupy.cuda import compiler
    except ImportError as exc:
        return f"CuPy cannot be imported ({exc})"
    setter = getattr(compiler, "_set_kernel_cache_backend", None)
    if not callable(setter) or not hasattr(compiler, "_kernel_cache_backend"):
        return refused(
            "cupy", "cupy.cuda.compiler has no _set_kernel_cache_backend / _kernel_cache_backend"
        )
    try:
        from cupy.cuda._compiler_cache import KernelCacheBackend
    except ImportError:
        return refused("cupy", "cupy.cuda._compiler_cache has no KernelCacheBackend")
    if getattr(KernelCacheBackend, "__abstractmethods__", None) != frozenset({"load", "save"}):
        return refused(
            "cupy", "CuPy's KernelCacheBackend is not load(name) / save(name, cubin, source)"
        )
    return window_verdict("cupy", "CuPy", cupy.__version__, SUPPORTED, _probe)


def _probe() -> str | None:
    """The contract, on a CuPy outside :data:`SUPPORTED`: cuforge's ``KernelCacheBackend``
    stores a cubin and loads it back, from a throwaway cache dir."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="cuforge-cupy-probe-") as tmp:
        b = backend(Cache(tmp, remotes=(), telemetry=False))
        b.save("cuforge_probe.cubin", b"\x7fELF-probe", 'extern "C" __global__ void k() {}')
        if b.load("cuforge_probe.cubin") != b"\x7fELF-probe":
            return "a cubin saved through the KernelCacheBackend was not loaded back"
    return None


def include_dirs_of(options: Sequence[str]) -> list[str]:
    """The directories of the ``-I<dir>``, ``-I <dir>``, ``--include-path=<dir>`` and
    ``--include-path <dir>`` items of CuPy compile ``options``, in order."""
    dirs: list[str] = []
    items = [o for o in options if isinstance(o, str)]
    i = 0
    while i < len(items):
        item = items[i]
        if item in ("-I", "--include-path") and i + 1 < len(items):
            dirs.append(items[i + 1])
            i += 2
            continue
        if item.startswith("--include-path="):
            dirs.append(item[len("--include-path=") :])
        elif item.startswith("-I") and len(item) > 2:
            dirs.append(item[2:])
        i += 1
    return dirs


def _own_roots() -> list[str]:
    """CuPy's and the CUDA toolkit's include roots: their headers are in CuPy's own key."""
    roots = []
    try:
        import cupy

        roots.append(os.path.dirname(os.path.abspath(cupy.__file__)))
    except ImportError:
        pass
    for var in ("CUDA_PATH", "CUDA_HOME"):
        if os.environ.get(var):
            roots.append(os.path.abspath(os.environ[var]))
    return roots


def _split_option_dirs(options: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(user include dirs, system include dirs) of ``options``, as absolute paths."""
    own = _own_roots()
    user, system = [], []
    for d in include_dirs_of(options):
        path = os.path.abspath(d)
        inside = any(path == r or path.startswith(r + os.sep) for r in own)
        (system if inside else user).append(path)
    return tuple(user), tuple(system)


def _roots(include_dirs: Sequence[str]) -> list[str]:
    """Where user headers are looked for, in order: the compile's ``-I`` dirs, then
    ``include_dirs``, then the working directory."""
    user, _ = _option_dirs.get()
    return [*user, *(os.path.abspath(d) for d in include_dirs), os.getcwd()]


def _relative(path: str, roots: list[str]) -> tuple[int, str] | None:
    for i, root in enumerate(roots):
        rel = os.path.relpath(path, root)
        if not rel.startswith(".."):
            return i, rel
    return None


def headers_of(source: str, include_dirs: Sequence[str] = ()) -> list[list[Any]] | None:
    """``[[root index, path under that root, sha256], ...]`` of the user headers ``source``
    includes (the roots: the compile's ``-I`` dirs, ``include_dirs``, the working
    directory); None when they cannot
    be known (the entry is then stored with no header check, as CuPy would)."""
    roots = _roots(include_dirs)
    scan = scan_includes(
        source, source_dir=None, include_dirs=roots, system_dirs=_option_dirs.get()[1]
    )
    if scan.uncacheable:
        return None
    out = []
    for path in scan.headers:
        where = _relative(path, roots)
        digest = file_digest(path)
        if where is None or digest is None:
            return None
        out.append([where[0], where[1], digest])
    return out


def _headers_hold(recorded: Any, include_dirs: Sequence[str]) -> bool:
    if not isinstance(recorded, list):
        raise ValueError("the recorded headers are not a list")
    roots = _roots(include_dirs)
    for item in recorded:
        if not (isinstance(item, list) and len(item) == 3 and isinstance(item[0], int)):
            raise ValueError(f"a recorded header is malformed: {item!r}")
        index, rel, digest = item
        if not (0 <= index < len(roots)) or file_digest(os.path.join(roots[index], rel)) != digest:
            return False
    return True


def entry_key(name: str) -> str:
    """The cuforge entry key of CuPy's kernel name ``name`` (a pure function of it; the
    user headers are checked at load against what :func:`headers_of` recorded)."""
    return blobformat.make_key(KIND, {"cupy_name": name})[0]


def backend(cache: Cache | None = None, include_dirs: Sequence[str] = ()) -> Any:
    """A CuPy ``KernelCacheBackend`` over ``cache`` (default: :func:`cuforge.default_cache`
    at each call); ``include_dirs``: where the sources' user headers are found besides the
    working directory (the ``-I`` of CuPy's compile options)."""
    from cupy.cuda._compiler_cache import KernelCacheBackend

    dirs = [os.fspath(d) for d in include_dirs]

    class CuforgeKernelCacheBackend(KernelCacheBackend):
        entry_key = staticmethod(entry_key)

        def load(self, name: str) -> bytes | None:
            c = resolve(cache)
            ckey = self.entry_key(name)
            files = read_files(c, ckey, KIND, f"CuPy kernel {name}")
            if files is None:
                c.count(f"{KIND}:miss")
                _fence_miss(name, ckey, "not in cuforge's cache")
                return None
            try:
                payload = files[_PAYLOAD]
                recorded = json.loads(files[_HEADERS].decode("utf-8"))
                fresh = recorded is None or _headers_hold(recorded, dirs)
            except (KeyError, ValueError) as exc:
                damaged(c, ckey, KIND, f"CuPy kernel {name}", exc)
                return None
            if not fresh:
                c.count(f"{KIND}:header_changed")
                _fence_miss(name, ckey, "a user header it includes changed")
                return None
            c.count(f"{KIND}:hit")
            return payload

        def save(self, name: str, cubin: bytes, source: str) -> None:
            c = resolve(cache)
            headers = headers_of(source, dirs)
            files = {_PAYLOAD: bytes(cubin), _HEADERS: json.dumps(headers).encode()}
            output = "ptx" if name.endswith(".ptx") else "cubin"
            meta = {"name": name, "backend": KIND, "output": output}
            write_files(c, self.entry_key(name), KIND, files, meta)

    if cache is not None:
        resolve(cache)
    return CuforgeKernelCacheBackend()


def _fence_miss(name: str, key: str, why: str) -> None:
    """The compile fence (:mod:`cuforge.core.fencing`): CuPy compiles right after a ``load``
    that returns None, so ``error`` raises here (out of CuPy's compile call) and nothing is
    compiled."""
    from cuforge.core import fencing

    if fencing.mode():
        fencing.adapter_miss("cupy", KIND, name, key, [why])


def enable(cache: Cache | None = None, include_dirs: Sequence[str] = ()) -> bool:
    """Make CuPy's kernel cache a :class:`cuforge.Cache` (see :func:`backend`). True when
    done; False (with a warning, once) on a CuPy cuforge does not support -- CuPy's own
    cache is then left as it was. :func:`disable` undoes it."""
    why = hook_problem()
    if why is not None:
        warn_once(f"cuforge.cupy: {why}; CuPy's own kernel cache is left as it is")
        return False
    from cupy.cuda import compiler

    made = backend(cache, include_dirs)
    with _lock:
        if not _previous:
            _previous.append(compiler._kernel_cache_backend)
        compiler._set_kernel_cache_backend(made)
        _wrap_compile(compiler)
    return True


def _wrap_compile(compiler: Any) -> None:
    """Wrap ``compiler._compile_with_cache_cuda`` (the caller of the backend's ``load`` and
    ``save``) so that the backend sees the ``-I`` dirs of the compile's options. Where the
    function is missing or already wrapped, nothing changes (``include_dirs`` still work)."""
    original = getattr(compiler, "_compile_with_cache_cuda", None)
    if not callable(original) or getattr(original, "__cuforge_wrapped__", False):
        return

    def _compile_with_cache_cuda(source, options=(), *args, **kwargs):
        token = _option_dirs.set(_split_option_dirs(options or ()))
        try:
            return original(source, options, *args, **kwargs)
        finally:
            _option_dirs.reset(token)

    _compile_with_cache_cuda.__cuforge_wrapped__ = True  # type: ignore[attr-defined]
    _compile_with_cache_cuda.__wrapped__ = original  # type: ignore[attr-defined]
    _wrapped.append((compiler, original))
    compiler._compile_with_cache_cuda = _compile_with_cache_cuda


def disable() -> None:
    """Undo :func:`enable`: CuPy's kernel cache is what it was before."""
    with _lock:
        if _previous:
            from cupy.cuda import compiler

            compiler._set_kernel_cache_backend(_previous.pop())
        while _wrapped:
            module, original = _wrapped.pop()
            module._compile_with_cache_cuda = original


def is_enabled() -> bool:
    if not _previous:
        return False
    from cupy.cuda import compiler

    return type(compiler._kernel_cache_backend).__name__ == "CuforgeKernelCacheBackend"
