"""A persistent, shared cache for CCCL's ``cuda.compute`` (install ``cuforge[cccl]``).

cuda.compute keeps its builds in memory only: every new process rebuilds every algorithm
(seconds each). ``cuforge.cccl`` stores them in cuforge's cache -- memory, disk and the
remote tiers, obeying every ``CUFORGE_*`` knob -- and restores them with
``cuda.compute.deserialize`` (about a millisecond)::

    import cuforge.cccl as cccl
    reducer = cccl.make_reduce_into(d_in=..., d_out=..., op=cccl.OpKind.PLUS, h_init=...)

or, to speed up code that calls cuda.compute directly::

    import cuforge.cccl
    cuforge.cccl.enable()          # patches cuda.compute's make_* factories in place

Every ``make_*`` factory and one-shot algorithm the installed cuda.compute has is here,
with the same signature (found at run time, not listed for one version). Other public
names of cuda.compute (``ProxyArray``, ``OpKind``, iterators...) are passed through.
What the key holds: :mod:`cuforge.cccl._key`. ``cuda.compute`` is imported on first use,
never by ``import cuforge`` or ``import cuforge.cccl``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import cuforge.cccl._wrap as _wrap  # cuforge's side only: cuda.compute is imported on first use

if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "enable",
    "disable",
    "is_enabled",
    "key_of",
    "last_result",
    "clear_memo",
    "factory_names",
    "oneshot_names",
    "available",
]

#: the names served by cuforge.cccl._wrap (the rest of __all__ is defined here)
_API = frozenset(__all__) - {"available"}


def available() -> str | None:
    """None when cuda.compute can be used here, else why not (for skip messages and
    ``cuforge doctor``): not installed, or its CUDA bindings could not load libcuda."""
    try:
        import cuda.compute as compute
    except ImportError as exc:
        return f"cuda.compute is not installed (pip install 'cuforge[cccl]'): {exc}"
    if not getattr(compute, "_BINDINGS_AVAILABLE", False):
        return (
            "cuda.compute's CUDA bindings are not available (no libcuda.so.1: install the "
            "NVIDIA driver, or use a stub libcuda to build for an explicit compute_capability)"
        )
    return None


def __getattr__(name: str) -> Any:
    if name in _API:
        value = getattr(_wrap, name)
        globals()[name] = value
        return value
    if name.startswith("_"):
        raise AttributeError(f"module 'cuforge.cccl' has no attribute {name!r}")
    problem = available()
    if problem is not None:
        raise AttributeError(f"cuforge.cccl.{name} is unavailable: {problem}")
    if name in _wrap.factory_names():
        value = _wrap.cached_factory(name)
    elif name in _wrap.oneshot_names():
        value = _wrap.cached_oneshot(name)
    else:
        import cuda.compute as compute

        if name not in getattr(compute, "__all__", ()):
            raise AttributeError(
                f"module 'cuforge.cccl' has no attribute {name!r} (nor has cuda.compute "
                f"{getattr(compute, '__version__', '')})"
            )
        value = getattr(compute, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    names = set(globals()) | set(__all__)
    if available() is None:
        import cuda.compute as compute

        names.update(getattr(compute, "__all__", ()))
    return sorted(names)
