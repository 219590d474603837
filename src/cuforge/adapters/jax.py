"""cuforge under JAX's persistent compilation cache (``pip install "cuforge[jax]"``).

``cuforge.jax.enable(cache=None)`` makes JAX store its compiled executables in a
:class:`cuforge.Cache` (entries of kind ``"jax"``: every tier, the one LRU cap, checksummed,
shared through the remotes, signed when signing is on; ``cuforge cache ls --kind jax``).

JAX has one hook for this: ``jax._src.compilation_cache._cache``, a private global holding
a ``CacheInterface`` (``get(key) -> bytes | None``, ``put(key, bytes)``). It is private, so
:func:`enable` is version-gated (:data:`SUPPORTED`): on a JAX outside that range, or one
whose hook does not look as expected, it warns once, changes nothing and returns False --
JAX's own cache (``jax_compilation_cache_dir``) keeps working.

The key is JAX's own (``jit_<name>-<sha256>``, which covers the computation, the compile
options, the backend and the versions of jax and jaxlib). cuforge adds nothing to it, so
nothing machine-specific enters the key: machines with the same JAX and devices share
entries. JAX's own thresholds still decide what is written
(``jax_persistent_cache_min_compile_time_secs``, default 1 s;
``jax_persistent_cache_min_entry_size_bytes``).

A stored entry that does not unpack is deleted and reported as missing (JAX compiles); JAX
itself turns an executable that fails to deserialize into a warning and a compile.
``jax.experimental.compilation_cache.reset_cache()`` drops the hook; call :func:`enable`
again after it.

**The compile fence** (:func:`cuforge.fence`): a ``get`` that misses is a compile about to
run: reported once per key under ``warn``. Under ``error`` the
:class:`~cuforge.base.errors.CompileAfterFenceError` (system ``"jax"``, the module name, the
cuforge key) cannot be raised from ``get``: JAX's ``_cache_read`` turns errors there into
a warning and compiles. :func:`enable` wraps ``jax._src.compiler._cache_read`` so the
error is raised as it returns, before the compile: nothing is compiled. (On a JAX without
``_cache_read`` it is raised from ``get``.) JAX writes only compiles slower than
``jax_persistent_cache_min_compile_time_secs`` (1 s by default): faster ones miss in every
process and are reported -- set it to 0 for a fenced service.
"""

from __future__ import annotations

import pathlib
import threading
from typing import TYPE_CHECKING

from cuforge.adapters.common import read_files, refused, warn_once, window_verdict, write_files
from cuforge.adapters.windows import window
from cuforge.core import blobformat
from cuforge.core.caching import Cache, resolve

if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "KIND",
    "SUPPORTED",
    "enable",
    "disable",
    "is_enabled",
    "hook_problem",
    "entry_key",
]

KIND = "jax"
#: JAX versions whose private hook this module was written against: [low, high)
SUPPORTED = window("jax")  # the tested releases: cuforge/adapters/windows.py

_FILE = "executable"
_lock = threading.Lock()
#: the fence's error held for the wrapped ``_cache_read`` to raise (per thread)
_pending = threading.local()
#: (jax._src.compiler, its own _cache_read) while wrapped
_wrapped: list[tuple[Any, Any]] = []
#: (the module patched, what its _cache held before) while enabled
_previous: list[tuple[Any, Any]] = []


def hook_problem() -> str | None:
    """Why the installed JAX cannot take cuforge's cache (None when it can): the version is
    outside :data:`SUPPORTED`, or the private hook is not what cuforge expects."""
    try:
        import jax
        from jax._src import compilation_cache as cc
        from jax._src.compilation_cache_interface import CacheInterface
    except ImportError as exc:
        return f"JAX's compilation cache cannot be imported ({exc})"
    if not hasattr(cc, "_cache") or not callable(getattr(cc, "_get_cache", None)):
        return refused("jax", "jax._src.compilation_cache has no _cache / _get_cache")
    if getattr(CacheInterface, "__abstractmethods__", None) != frozenset({"get", "put"}):
        return refused("jax", "jax's CacheInterface is not get(key) / put(key, value)")
    return window_verdict("jax", "JAX", jax.__version__, SUPPORTED, _probe)


def _probe() -> str | None:
    """The contract, on a JAX outside :data:`SUPPORTED`: cuforge's ``CacheInterface``
    subclass can be made, and bytes put through it come back, from a throwaway cache dir."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="cuforge-jax-probe-") as tmp:
        adapter = _adapter_class()(Cache(tmp, remotes=(), telemetry=False))
        adapter.put("cuforge-probe-key", b"probe-bytes")
        if adapter.get("cuforge-probe-key") != b"probe-bytes":
            return "bytes put through the CacheInterface were not served back"
    return None


def entry_key(key: str) -> str:
    """The cuforge entry key of JAX's cache key ``key`` (a pure function of it: cuforge adds
    nothing, so nothing machine-specific enters the key)."""
    return blobformat.make_key(KIND, {"jax_key": key})[0]


def _adapter_class() -> type:
    from jax._src.compilation_cache_interface import CacheInterface

    class CuforgeJaxCache(CacheInterface):
        """A JAX ``CacheInterface`` over a :class:`cuforge.Cache`."""

        def __init__(self, cache: Cache | None) -> None:
            self._cache = cache
            self._path = pathlib.Path(str(resolve(cache).directory or "cuforge"))

        entry_key = staticmethod(entry_key)

        def get(self, key: str) -> bytes | None:
            cache = resolve(self._cache)
            ckey = self.entry_key(key)
            files = read_files(cache, ckey, KIND, f"JAX executable {key!r}")
            data = None if files is None else files.get(_FILE)
            if data is None:
                cache.count(f"{KIND}:miss")
                _fence_miss(key, ckey)
                return None
            cache.count(f"{KIND}:hit")
            return data

        def put(self, key: str, value: bytes) -> None:
            cache = resolve(self._cache)
            name = _module_name(key)
            meta = {"name": name, "backend": KIND, "output": "executable", "jax_key": key}
            write_files(cache, self.entry_key(key), KIND, {_FILE: bytes(value)}, meta)

        def __len__(self) -> int:
            """The JAX executables in the local tiers (JAX's own tests count entries)."""
            return sum(1 for i in resolve(self._cache).iterate() if i.kind == KIND)

        def clear(self) -> None:
            cache = resolve(self._cache)
            for k in [i.key for i in cache.iterate() if i.kind == KIND]:
                cache.delete(k)

    return CuforgeJaxCache


def _module_name(key: str) -> str:
    return key.rsplit("-", 1)[0] if "-" in key else key


def _fence_miss(key: str, ckey: str) -> None:
    """The compile fence (:mod:`cuforge.core.fencing`) on a miss: JAX compiles next."""
    from cuforge.core import fencing

    if not fencing.mode():
        return
    try:
        fencing.adapter_miss(
            "jax", KIND, _module_name(key), ckey, [f"JAX key {key} not in cuforge's cache"]
        )
    except fencing.CompileAfterFenceError as exc:
        if not getattr(_pending, "inside", False):
            raise  # not under the wrapped _cache_read: raised from get()
        _pending.error = exc  # raised by the wrapped _cache_read, outside JAX's try


def _wrap_cache_read() -> None:
    """Wrap ``jax._src.compiler._cache_read`` (which calls ``get`` inside a ``try`` that
    turns errors into warnings) so that the fence's error is raised as it returns, before
    JAX compiles. Where it is missing or already wrapped, nothing changes."""
    try:
        from jax._src import compiler
    except ImportError:
        return
    original = getattr(compiler, "_cache_read", None)
    if not callable(original) or getattr(original, "__cuforge_wrapped__", False):
        return

    def _cache_read(*args: Any, **kwargs: Any) -> Any:
        _pending.error, _pending.inside = None, True
        try:
            result = original(*args, **kwargs)
        finally:
            error, _pending.error, _pending.inside = getattr(_pending, "error", None), None, False
        if error is not None:
            raise error
        return result

    _cache_read.__cuforge_wrapped__ = True  # type: ignore[attr-defined]
    _cache_read.__wrapped__ = original  # type: ignore[attr-defined]
    _wrapped.append((compiler, original))
    compiler._cache_read = _cache_read


def enable(cache: Cache | None = None) -> bool:
    """Make JAX's persistent compilation cache a :class:`cuforge.Cache` (``cache``;
    default: :func:`cuforge.default_cache` at each lookup). True when done; False (with a
    warning, once) when the installed JAX is not one cuforge supports -- JAX's own cache
    is then left as it was. Idempotent; :func:`disable` undoes it."""
    if cache is not None:
        resolve(cache)  # a wrong argument is named now
    why = hook_problem()
    if why is not None:
        warn_once(f"cuforge.jax: {why}; JAX's own compilation cache is left as it is")
        return False
    from jax._src import compilation_cache as cc

    adapter = _adapter_class()(cache)
    with _lock:
        if not _previous:
            _previous.append((cc, cc._cache))
        cc._cache = adapter
        _wrap_cache_read()
    return True


def disable() -> None:
    """Undo :func:`enable`: JAX's compilation cache is what it was before."""
    with _lock:
        while _previous:
            module, before = _previous.pop()
            module._cache = before
        while _wrapped:
            module, original = _wrapped.pop()
            module._cache_read = original


def is_enabled() -> bool:
    """Whether JAX's compilation cache is cuforge's now."""
    if not _previous:
        return False
    module = _previous[0][0]
    return type(module._cache).__name__ == "CuforgeJaxCache"
