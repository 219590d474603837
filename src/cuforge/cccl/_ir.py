"""The second key of a cuda.compute build: the operators' LTO-IR, traced before the build.

A factory call whose arguments cannot all be keyed before building (an operator closing
over an object with no stable value) is *traced*: the real factory runs with cuda.compute's
own build step stopped at its door. Every algorithm of cuda.compute 1.2 compiles its
operators and iterators to LTO-IR in its ``__init__`` (``op.compile(...)``, numba-cuda-mlir's
``compile_to_ltoir``), then hands everything the build links to
``cuda.compute._cccl_interop.build_for_ccs`` (NVRTC of CUB + nvJitLink: the seconds), through
``cuda.compute._caching.cache_build_results`` and its ``_cache_single_flight``. The trace
replaces that build with a stop (:class:`_Traced`) carrying the build's arguments: the
``Op`` objects (kind, ABI name, LTO-IR, extra LTO-IR, state size and alignment), the
``Iterator`` objects (their advance / dereference ops and value types), the value types,
the enums and plain data. :func:`describe` digests them with cuda.compute's own
serialization writers (``_serialization.codec.write_op`` / ``write_iterator`` /
``write_value`` / ``write_type_info``: what a serialized algorithm holds of them, per-call
state left out), so the digest covers everything the build receives and nothing that is set
at call time. Nothing about the trace is cached; the compiled operator stays in
cuda.compute's own in-process memo (``_jit._compile_op_impl``), so the build after a miss
does not compile it again.

Hooks (:func:`install`): ``_cccl_interop.build_for_ccs`` and ``_caching._cache_single_flight``
are wrapped once, in place; outside a trace (a thread-local flag) both call the real ones
unchanged. In a trace, the process-wide build-results cache is not consulted (so the trace
always reaches the build's door) and the build is not run. In the *capture* mode of the
build after a miss, the build runs for real and its arguments are digested again: only
when both digests agree is the result stored under the IR key. :func:`seam` is the probe:
when a name the hooks need is missing (another cuda.compute), the call runs uncached and
says why.

What a hit needs: the same LTO-IR, byte for byte (NVVM's LTO-IR is an opaque encoding:
nothing in it can be renamed or normalized). The C-ABI name of a compiled Python operator
holds a process-wide counter (``_odr_helpers._make_wrapper_name``: ``wrapped_op_0``,
``wrapped_op_1``...), and the name is in the IR. So a fresh process hits an entry when it
compiles its Python operators in the same order as the process that stored it (a program
run again: the usual case); a process that compiled other operators first gets another
name, misses, builds and stores its own entry (never a wrong hit). Within a process, a new
closure over a new object compiles a new wrapper and misses, as cuda.compute's own
in-process cache (which keys such an object by ``id()``) rebuilds it too. A stateful
operator (device arrays as state) is compiled again by the build after a miss, under a new
name, so its build never matches its trace: it runs uncached, saying so.

Device addresses: an operator that bakes one into its code
(:func:`cuforge.cccl._key.baked_array`) is not traced: such calls stay uncached, as before.
Its LTO-IR would hold the address, so a hit would even be correct, but it could only come
from another process that happened to allocate at the same address: a disk filled with
entries no one reads, for nothing.
"""

from __future__ import annotations

import hashlib
import sys
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

__all__ = ["seam", "install", "trace", "capture", "describe", "Undescribable", "SEAM"]

#: where the trace stops, in cuda.compute's words
SEAM = "cuda.compute._cccl_interop.build_for_ccs"

_local = threading.local()
_lock = threading.Lock()
_installed: list[bool] = []


class _Traced(BaseException):  # noqa: N818 - a stop, not an error; BaseException so no
    """Raised at the build's door in a trace: carries the build's arguments."""

    # `except Exception` between the door and the trace swallows it

    def __init__(self, args: tuple, kwargs: dict) -> None:
        super().__init__("traced")
        self.build_args = args
        self.build_kwargs = kwargs


class Undescribable(Exception):  # noqa: N818
    """A build argument :func:`describe` has no exact description for."""


def seam() -> str | None:
    """None when this cuda.compute has the names the trace needs, else why not."""
    try:
        from cuda.compute import _caching, _cccl_interop
        from cuda.compute._serialization import codec
    except ImportError as exc:
        return f"cuda.compute has no {exc.name or exc} module"
    missing = [
        f"{mod.__name__}.{name}"
        for mod, name in (
            (_cccl_interop, "build_for_ccs"),
            (_caching, "_cache_single_flight"),
            (_caching, "_process_wide_build_results_cache"),
            (_caching, "cache_build_results"),
            (codec, "Writer"),
            (codec, "write_op"),
            (codec, "write_iterator"),
            (codec, "write_value"),
            (codec, "write_type_info"),
        )
        if not hasattr(mod, name)
    ]
    if not missing and getattr(_caching.cache_build_results, "__globals__", None) is not vars(
        _caching
    ):
        missing.append("cuda.compute._caching.cache_build_results (not a plain function)")
    if missing:
        return "this cuda.compute has no " + ", ".join(missing)
    return None


def install() -> None:
    """Wrap the build's door and the build-results cache's single flight (once)."""
    with _lock:
        if _installed:
            return
        from cuda.compute import _caching, _cccl_interop

        real_build = _cccl_interop.build_for_ccs
        real_flight = _caching._cache_single_flight
        results = _caching._process_wide_build_results_cache

        def build_for_ccs(*args: Any, **kwargs: Any) -> Any:
            mode = getattr(_local, "mode", None)
            if mode == "trace":
                raise _Traced(args, kwargs)
            if mode == "capture":
                _local.captured = (args, kwargs)
            return real_build(*args, **kwargs)

        def cache_single_flight(cache: Any, cache_key: Any, builder: Callable) -> Any:
            if cache is results and getattr(_local, "mode", None) is not None:
                return builder()  # the trace (and its build) must reach the door
            return real_flight(cache, cache_key, builder)

        build_for_ccs.__cuforge_original__ = real_build  # type: ignore[attr-defined]
        cache_single_flight.__cuforge_original__ = real_flight  # type: ignore[attr-defined]
        _cccl_interop.build_for_ccs = build_for_ccs
        _caching._cache_single_flight = cache_single_flight
        _installed.append(True)


def trace(factory: Callable, args: tuple, kwargs: dict) -> tuple[str, Any]:
    """Run ``factory`` up to its build: ``("ir", digest)``, or ``("object", algorithm)`` when
    it returned without building (cuda.compute's per-thread wrapper cache served it, or
    the build did not go through the seam). Raises :class:`Undescribable`, and whatever the
    factory raises before building (a type error in the operator...)."""
    install()
    previous = getattr(_local, "mode", None)
    _local.mode = "trace"
    try:
        obj = factory(*args, **kwargs)
    except _Traced as stop:
        return "ir", describe(stop.build_args, stop.build_kwargs)
    finally:
        _local.mode = previous
    return "object", obj


def capture(factory: Callable, args: tuple, kwargs: dict) -> tuple[Any, str | None]:
    """Run ``factory`` for real: ``(algorithm, digest of what its build received)``; the
    digest is None when no build ran through the seam."""
    install()
    previous = getattr(_local, "mode", None)
    _local.mode = "capture"
    _local.captured = None
    try:
        obj = factory(*args, **kwargs)
        captured = _local.captured
    finally:
        _local.mode = previous
        _local.captured = None
    if captured is None:
        return obj, None
    return obj, describe(*captured)


def describe(args: tuple, kwargs: dict) -> str:
    """sha256 of the build's arguments (see the module doc), byte for byte."""
    from cuda.compute._serialization import codec

    w = codec.Writer()
    w.text("cuforge-cccl-ir 1")
    _feed(w, codec, list(args), "args")
    for name in sorted(kwargs):
        w.text("kw " + name)
        _feed(w, codec, kwargs[name], name)
    return hashlib.sha256(w.getvalue()).hexdigest()


def _feed(w: Any, codec: Any, value: Any, path: str) -> None:
    from cuda.compute import _bindings

    enum = sys.modules["enum"]
    if isinstance(value, _bindings.Op):
        w.text("op")
        codec.write_op(w, value)
    elif isinstance(value, _bindings.Iterator):
        w.text("iterator")
        codec.write_iterator(w, value)
    elif isinstance(value, _bindings.Value):
        w.text("value")
        codec.write_value(w, value)
    elif isinstance(value, _bindings.TypeInfo):
        w.text("type-info")
        codec.write_type_info(w, value)
    elif isinstance(value, enum.Enum):
        w.text(f"enum {type(value).__module__}.{type(value).__qualname__}.{value.name}")
        w.text(repr(value.value))
    elif value is None or type(value) in (bool, int, float, str):
        w.text(f"{type(value).__name__} {value!r}")
    elif type(value) is bytes:
        w.text("bytes")
        w.blob(value)
    elif isinstance(value, type):
        w.text(f"class {value.__module__}.{value.__qualname__}")
    elif type(value) in (list, tuple):
        w.text(f"{type(value).__name__} {len(value)}")
        for i, item in enumerate(value):
            _feed(w, codec, item, f"{path}[{i}]")
    else:
        raise Undescribable(
            f"the build argument {path} is a {type(value).__module__}.{type(value).__qualname__}, "
            "which cuforge cannot describe exactly"
        )
