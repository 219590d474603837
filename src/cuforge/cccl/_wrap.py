"""Cached cuda.compute factories and one-shot algorithms, and patching them in place.

Discovery, not a list: every name in ``cuda.compute.__all__`` that starts with ``make_``
and is callable is a factory; every other callable ``X`` with a ``make_X`` beside it is
its one-shot algorithm (``reduce_into`` -> ``make_reduce_into``).

A cached factory keys the call (:mod:`cuforge.cccl._key`), looks it up through
:func:`cuforge.core.blobcache.get_or_build` (entry kind ``"cccl"``, every tier, every
``CUFORGE_*`` knob, single flight), and on a hit returns ``cuda.compute.deserialize`` of
the stored blob -- no build. On a miss it calls the real factory, serializes the result,
checks that the blob deserializes, stores it, and returns the factory's own object.
Within a thread, the same key returns the same object again (like cuda.compute's own
per-thread wrapper cache: a deserialized algorithm must not be shared between threads).

Two keys, in order. The key above is made *before building* (``"pretrace"``: a hit runs
nothing of cuda.compute but ``deserialize``). When an operator (or an iterator holding one)
cannot be fingerprinted (an object with no stable value in its closure or globals), the call
falls back to the key of its *traced operators* (``"ir"``, :mod:`cuforge.cccl._ir`): the
real factory runs up to cuda.compute's build (``_cccl_interop.build_for_ccs``), compiling
its operators to LTO-IR on the way; the key is the pre-build fields with that argument
``"traced"`` plus the digest of what the build would receive (the operators' LTO-IR and ABI
names, the iterators, the value types: ``key: ir``, ``ir: <sha256>``). A hit deserializes
the stored algorithm (the operators compiled, no algorithm build); a miss builds, and stores
only when the build received what the trace saw. A call neither key covers runs the real
factory *uncached*: a device array the operator bakes into its code (never traced), an
unkeyable argument that is no operator or iterator, the HostJIT ("v2") build backend (it
cannot serialize), a cuda.compute without the trace's seam, a trace that does not repeat.
Each blocked call is warned once per factory and blocker, naming it (the reason is logged
for ``cuforge cache explain``), and counted by the key that served it
(:meth:`cuforge.Cache.count_served`: ``"pretrace"``, ``"ir"``, ``"uncached"``; ``cuforge
cache stats``). ``last_result().reason`` of an IR-served call says why the pre-build key was
blocked.
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
import types
from typing import TYPE_CHECKING

from cuforge.base.arch import ArchError, normalize_arch
from cuforge.cccl import _ir
from cuforge.cccl._key import BAKED_REASON, key_fields

# loaded with the module: `import cuforge.cccl` is the import cost, the first call is not
from cuforge.core.blobcache import BlobResult, fence_uncached, get_or_build, make_key
from cuforge.core.caching import Cache, resolve
from cuforge.keys.fingerprint import UnstableKeyError

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

__all__ = [
    "factory_names",
    "oneshot_names",
    "cached_factory",
    "cached_oneshot",
    "enable",
    "disable",
    "is_enabled",
    "key_of",
    "last_result",
    "KIND",
    "HOSTJIT_REASON",
]

KIND = "cccl"
HOSTJIT_REASON = (
    "cuda-cccl was built with the HostJIT (v2) backend, which cannot serialize build "
    "results, so cuforge cannot store them (install the standard cuda-cccl wheel)"
)

_lock = threading.Lock()
_local = threading.local()
_originals: dict[str, Callable] = {}  # factory name -> the real factory
_cached: dict[str, Callable] = {}  # name -> cuforge's version
# (module, attribute name, original value) of every patch enable() made
_patches: list[tuple[Any, str, Any]] = []


def _compute() -> Any:
    import cuda.compute as compute

    return compute


def factory_names() -> list[str]:
    """The ``make_*`` factories of the installed cuda.compute (sorted)."""
    compute = _compute()
    return sorted(
        n
        for n in getattr(compute, "__all__", ())
        if n.startswith("make_") and callable(getattr(compute, n, None))
    )


def oneshot_names() -> list[str]:
    """The one-shot algorithms (``reduce_into``...) that have a ``make_*`` factory."""
    compute = _compute()
    factories = set(factory_names())
    return sorted(
        n
        for n in getattr(compute, "__all__", ())
        if not n.startswith(("make_", "_"))
        and "make_" + n in factories
        and callable(getattr(compute, n, None))
    )


def _original(name: str) -> Callable:
    """The real factory ``name``, even while :func:`enable` has patched cuda.compute."""
    with _lock:
        found = _originals.get(name)
        if found is None:
            current = getattr(_compute(), name)
            found = getattr(current, "__cuforge_original__", current)
            _originals[name] = found
        return found


def _uses_hostjit() -> bool:
    from cuda.compute import _caching

    return not getattr(_caching, "_BACKEND_SERIALIZES_BUILD_RESULTS", True)


def key_of(name: str, *args: Any, **kwargs: Any) -> tuple[str, dict[str, str]]:
    """``(key, fields)`` a call ``name(*args, **kwargs)`` of a factory would use, without
    building or looking anything up. Raises :class:`cuforge.keys.fingerprint.UnstableKeyError` for an
    argument that cannot be keyed, and ValueError when no compute capability is given and
    no device can be queried."""

    original = _original(name)
    fields = key_fields(name, inspect.signature(original), args, kwargs)
    if fields is None:
        raise ValueError(
            f"{name}: no compute_capability= was given and no CUDA device could be queried; "
            "pass compute_capability=<cc or list of ccs> to key a build without a GPU"
        )
    return make_key(KIND, fields)


def last_result() -> Any:
    """The :class:`cuforge.core.blobcache.BlobResult` of this thread's last cached factory call
    (``source_of_result``, ``key``, ``fields``, ``reason``), or None."""
    return getattr(_local, "last", None)


def cached_factory(name: str) -> Callable:
    """cuforge's version of the factory ``name`` (same signature)."""
    found = _cached.get(name)
    if found is not None:
        return found

    original = _original(name)
    signature = inspect.signature(original)

    @functools.wraps(original)
    def factory(*args: Any, **kwargs: Any) -> Any:
        return _call(name, original, signature, args, kwargs)

    factory.__cuforge_original__ = original  # type: ignore[attr-defined]
    with _lock:
        return _cached.setdefault(name, factory)


def cached_oneshot(name: str) -> Callable:
    """cuforge's version of the one-shot algorithm ``name``: the real function, run with
    cuforge's factories in place of cuda.compute's (same signature, same behaviour)."""
    found = _cached.get(name)
    if found is not None:
        return found

    real = getattr(_compute(), name)
    real = getattr(real, "__cuforge_original__", real)
    globs = dict(real.__globals__)
    for factory in factory_names():
        if factory in globs:
            globs[factory] = cached_factory(factory)
    clone = types.FunctionType(
        real.__code__, globs, real.__name__, real.__defaults__, real.__closure__
    )
    clone.__kwdefaults__ = real.__kwdefaults__
    functools.update_wrapper(clone, real)
    clone.__cuforge_original__ = real  # type: ignore[attr-defined]
    with _lock:
        return _cached.setdefault(name, clone)


def _call(name: str, original: Callable, signature: Any, args: tuple, kwargs: dict) -> Any:
    cache = None
    if "cache" in kwargs and "cache" not in signature.parameters:
        kwargs = dict(kwargs)
        cache = kwargs.pop("cache")  # cuforge's keyword, not cuda.compute's
    cache = resolve(cache if cache is not None else _enabled_cache[0])
    reason = None
    blocked = None  # why the pre-build key cannot be made (then: the IR key, or uncached)
    try:
        fields = key_fields(name, signature, args, kwargs)
    except UnstableKeyError as exc:
        fields, blocked, reason = _blocked_fields(name, signature, args, kwargs, exc)
    if fields is None:  # no device and no compute_capability: the factory explains
        return original(*args, **kwargs)
    if not cache.enabled and not cache.offline:  # cuda.compute exactly as it is
        # ... but a compile after the fence is reported (or refused) all the same
        fence_uncached(cache, KIND, f"cccl/{name}", fields, "is built with caching off")
        value = original(*args, **kwargs)
        _local.last = BlobResult(value, "compiled", "", fields, "CUFORGE_DISABLE_CACHE is set")
        return value
    if reason is None and _uses_hostjit():
        reason = HOSTJIT_REASON if blocked is None else f"{blocked}; and {HOSTJIT_REASON}"
    if reason is None and blocked is not None:
        return _call_ir(name, original, args, kwargs, cache, fields, blocked)
    memo = _memo(cache)
    key = None
    if reason is None:
        key, recorded = make_key(KIND, fields)
        found = memo.get(key)
        if found is not None:
            _local.last = BlobResult(found, "memory", key, recorded)
            cache.count_served(KIND, "pretrace")
            return found
    built: list[Any] = []

    def build() -> dict[str, bytes]:
        obj = original(*args, **kwargs)
        built.append(obj)
        if reason is not None:
            return {"uncached": b""}
        return {"algorithm": _compute().serialize(obj)}

    def load(files: Any) -> Any:
        if reason is not None:
            return built[-1]
        return _compute().deserialize(files["algorithm"])

    result = get_or_build(
        KIND,
        f"cccl/{name}",
        fields,
        build,
        load,
        uncacheable=reason,
        meta={"arch": _arch_text(fields.get("compute_capability", ""))},
        cache=cache,
    )
    value = result.value
    if result.source_of_result == "compiled" and built:
        value = built[-1]  # the factory's own object (already bound to this device)
        result.value = value
    _local.last = result
    # a call the pre-build key cannot cover and the IR key does not try is uncached
    cache.count_served(KIND, "uncached" if result.source_of_result == "uncached" else "pretrace")
    if key is not None:
        memo[key] = value
    return value


def _blocked_fields(
    name: str, signature: Any, args: tuple, kwargs: dict, exc: UnstableKeyError
) -> tuple[dict[str, str] | None, str | None, str | None]:
    """``(fields, blocked, reason)`` of a call whose pre-build key raised ``exc``: the IR
    key's base fields (the unkeyable operators ``"traced"``) and why the pre-build key is
    blocked; or uncached fields and the reason, when the IR key cannot cover it either (a
    baked device address, an argument that is no operator or iterator, no seam)."""
    uncached = {"algorithm": name, "unkeyable": exc.path}
    if exc.reason == BAKED_REASON:  # stays uncached: see cuforge.cccl._ir
        return uncached, None, str(exc)
    errors: list[UnstableKeyError] = []
    try:
        fields = key_fields(name, signature, args, kwargs, traced=errors)
    except UnstableKeyError as again:
        return uncached, None, str(again)
    if fields is None:
        return None, None, None
    blocked = "; ".join(str(e) for e in errors)
    missing = _ir.seam()
    if missing is not None:
        return uncached, None, f"{blocked}; and the IR key cannot trace it ({missing})"
    return fields, blocked, None


def _call_ir(
    name: str,
    original: Callable,
    args: tuple,
    kwargs: dict,
    cache: Cache,
    base: dict[str, str],
    blocked: str,
) -> Any:
    """The second key: trace the call to its build (the operators' LTO-IR, no algorithm
    build), key on what the build would receive (:mod:`cuforge.cccl._ir`), and serve the
    stored algorithm on a hit; on a miss build, check that the build received what the
    trace saw, and store under the IR key."""
    what = f"cccl/{name}"
    _warn_blocked(cache, name, blocked)
    try:
        how, traced = _ir.trace(original, args, kwargs)
    except _ir.Undescribable as exc:
        return _uncached_ir(cache, name, original, args, kwargs, base, f"{blocked}; and {exc}")
    seen = _seen()
    if how == "object":  # cuda.compute's own per-thread cache had it: no build ran
        known = seen.get(id(traced))
        if known is not None and known[0] is traced:
            _local.last = BlobResult(traced, "memory", known[1], known[2], blocked)
            cache.count_served(KIND, "ir")
            return traced
        why = (
            f"{blocked}; and cuda.compute served it from its own in-process cache, made "
            f"without cuforge, so no trace reached {_ir.SEAM}"
        )
        cache.warn_once(f"cuforge.cccl: {name} runs uncached: {why}")
        _local.last = BlobResult(traced, "uncached", "", base, why)
        cache.count_served(KIND, "uncached")
        return traced
    fields = {**base, "key": "ir", "ir": traced}
    memo = _memo(cache)
    key, recorded = make_key(KIND, fields)
    found = memo.get(key)
    if found is not None:
        _local.last = BlobResult(found, "memory", key, recorded, blocked)
        cache.count_served(KIND, "ir")
        return found
    built: list[Any] = []

    def build() -> dict[str, bytes]:
        obj, digest = _ir.capture(original, args, kwargs)
        built.append(obj)
        if digest != traced:
            raise _NotTraced(obj, digest)
        return {"algorithm": _compute().serialize(obj)}

    def load(files: Any) -> Any:
        return _compute().deserialize(files["algorithm"])

    try:
        result = get_or_build(
            KIND,
            what,
            fields,
            build,
            load,
            meta={"arch": _arch_text(fields.get("compute_capability", ""))},
            cache=cache,
        )
    except _NotTraced as exc:
        why = (
            f"{blocked}; and the build received other operators than its trace "
            "(the trace is not deterministic), so the IR key cannot cover it either"
            if exc.digest is not None
            else f"{blocked}; and its build did not go through {_ir.SEAM}"
        )
        cache.warn_once(f"cuforge.cccl: {name} runs uncached: {why}")
        if cache.enabled:
            cache.record_build(what, key, recorded, uncached=why)
        _local.last = BlobResult(exc.obj, "uncached", key, recorded, why)
        cache.count_served(KIND, "uncached")
        return exc.obj
    value = result.value
    if result.source_of_result == "compiled" and built:
        value = built[-1]  # the factory's own object (already bound to this device)
        result.value = value
    result.reason = blocked
    _local.last = result
    cache.count_served(KIND, "ir")
    memo[key] = value
    seen[id(value)] = (value, key, recorded)
    return value


def _uncached_ir(
    cache: Cache,
    name: str,
    original: Callable,
    args: tuple,
    kwargs: dict,
    fields: dict[str, str],
    why: str,
) -> Any:
    """Build uncached (the trace found nothing it can key), saying why."""
    result = get_or_build(
        KIND,
        f"cccl/{name}",
        fields,
        lambda: {"uncached": b""},
        lambda files: original(*args, **kwargs),
        uncacheable=why,
        cache=cache,
    )
    _local.last = result
    cache.count_served(KIND, "uncached")
    return result.value


class _NotTraced(Exception):  # noqa: N818
    """The build after a miss did not receive what its trace saw: not stored."""

    def __init__(self, obj: Any, digest: str | None) -> None:
        super().__init__("not traced")
        self.obj = obj
        self.digest = digest


#: what to do about a call the pre-build key cannot cover (said with every such warning)
_HINT = (
    "To key it before building: give the object a __cuforge_fingerprint__() method returning "
    "plain data (or cuforge.keys.fingerprint.register(its class, fn)), or keep such state out "
    "of what the operator reaches"
)


def _warn_blocked(cache: Cache, name: str, why: str) -> None:
    cache.warn_once(
        f"cuforge.cccl: {name} cannot be keyed before building ({why}); it is served by the "
        "key of its operators' LTO-IR instead: every call compiles its operators (no "
        "algorithm build when cached). " + _HINT
    )


def _seen() -> dict[int, tuple[Any, str, dict[str, str]]]:
    """This thread's algorithms served by the IR key: id -> (object, key, fields), to
    recognize one cuda.compute's own per-thread cache hands back to a later trace."""
    seen = getattr(_local, "seen", None)
    if seen is None:
        seen = _local.seen = {}
    return seen


def _arch_text(ccs: str) -> str:
    """``"8.0,9.0"`` -> ``"sm_80 sm_90"`` (how ``cuforge cache ls --arch`` matches)."""

    try:
        return " ".join(normalize_arch(cc) for cc in ccs.split(",") if cc)
    except ArchError:
        return ccs


def _memo(cache: Cache) -> dict[str, Any]:
    """This thread's algorithm objects made through ``cache`` (algorithm objects are kept
    per thread, as cuda.compute makes them; the memo never outlives or crosses its cache)."""
    return cache.memo(f"cccl:{threading.get_ident()}")


def clear_memo(cache: Cache | None = None) -> None:
    """Forget this thread's algorithm objects of ``cache`` (default: the default cache);
    the store keeps its entries."""
    _memo(resolve(cache)).clear()


#: the cache enable() was given (None: the default cache at each call)
_enabled_cache: list[Cache | None] = [None]


def enable(cache: Cache | None = None) -> None:
    """Patch cuda.compute in place: every ``make_*`` factory, wherever cuda.compute's own
    modules hold it (so its one-shot algorithms use the cached factories too), becomes
    cuforge's cached version. Code that imports names from cuda.compute *after* this call
    gets the cached versions; names imported before keep what they were. Idempotent;
    :func:`disable` undoes it. ``cache``: the :class:`cuforge.Cache` the patched factories
    use (default: :func:`cuforge.default_cache` at each call); a factory call may also
    pass ``cache=`` itself."""
    if cache is not None:
        resolve(cache)  # a wrong argument is named now
    _enabled_cache[0] = cache

    with _lock:
        if _patches:
            return
    names = factory_names()
    originals = {n: _original(n) for n in names}
    cached = {n: cached_factory(n) for n in names}
    by_id = {id(fn): n for n, fn in originals.items()}
    patches = []
    for modname, module in list(sys.modules.items()):
        if module is None or not (modname == "cuda.compute" or modname.startswith("cuda.compute.")):
            continue
        for attr, value in list(vars(module).items()):
            n = by_id.get(id(value))
            if n is not None and value is originals[n]:
                patches.append((module, attr, value))
                setattr(module, attr, cached[n])
    with _lock:
        _patches.extend(patches)


def disable() -> None:
    """Undo :func:`enable`: cuda.compute's own factories are back in every place."""
    with _lock:
        patches = list(_patches)
        _patches.clear()
        _enabled_cache[0] = None
    for module, attr, value in reversed(patches):
        setattr(module, attr, value)


def is_enabled() -> bool:
    """Whether :func:`enable` has patched cuda.compute."""
    return bool(_patches)
