"""The key of a cuda.compute build: what goes into it, and how each argument is spelled.

:func:`key_fields` turns one ``make_<algo>(...)`` call into labeled text fields:

* ``algorithm``: the factory's name (``make_reduce_into``);
* ``python``: Python major.minor;
* ``version:<dist>``: the installed version (or ``absent``) of cuda-cccl and of every
  distribution that takes part in code generation (:data:`CODEGEN_DISTRIBUTIONS`: the
  Python-operator compiler, NVRTC, nvJitLink, NVVM, the CCCL headers, the CUDA bindings,
  numpy...);
* ``compute_capability``: the targets, normalized (``8.0,9.0``): the explicit
  ``compute_capability=`` or, without it, the current device's (so a build made ahead of
  time for 9.0 serves a later call on a 9.0 device);
* ``arg:<name>``: every other argument, defaults applied, keyword arguments sorted:
  device arrays and :class:`~cuda.compute.ProxyArray` by dtype (``array <f4``), initial
  values (numpy arrays and scalars, :class:`~cuda.compute.ProxyValue`) by dtype, GPU
  structs by type name and layout, iterators by their kind (their value types, modifiers,
  nested iterators and operators, never their state), ``OpKind`` and other enums by name,
  Python callables by :func:`cuforge.fingerprint.fingerprint` (code, constants, closures,
  globals, recursively; device arrays they capture by dtype and shape), plain data by value.

An argument that cannot be keyed the same way in every process raises
:class:`cuforge.fingerprint.UnstableKeyError`; the caller then builds without caching.
"""

from __future__ import annotations

import inspect
import sys
from typing import TYPE_CHECKING

from cuforge.fingerprint import UNHANDLED, _normalize, fingerprint
from cuforge.fingerprint import installed_versions as _installed_versions

if TYPE_CHECKING:
    from typing import Any

__all__ = ["key_fields", "CODEGEN_DISTRIBUTIONS", "installed_versions", "target_ccs"]

#: distributions whose version changes what cuda.compute generates (absent ones count too)
CODEGEN_DISTRIBUTIONS = (
    "cuda-cccl",
    "numba-cuda-mlir",
    "numba-cuda",
    "numba",
    "llvmlite",
    "cuda-bindings",
    "cuda-core",
    "cuda-pathfinder",
    "nvidia-cuda-nvrtc",
    "nvidia-cuda-nvrtc-cu12",
    "nvidia-nvjitlink",
    "nvidia-nvjitlink-cu12",
    "nvidia-nvvm",
    "nvidia-cuda-nvcc-cu12",
    "nvidia-cuda-cccl",
    "nvidia-cuda-cccl-cu12",
    "nvidia-cuda-crt",
    "numpy",
    "ml-dtypes",
)


def installed_versions() -> dict[str, str]:
    """Normalized distribution name -> version (:func:`cuforge.fingerprint.installed_versions`)."""
    return _installed_versions()


def version_of(dist: str) -> str:
    """The installed version of distribution ``dist``, or ``"absent"``."""
    return installed_versions().get(_normalize(dist), "absent")


_versions_fields: dict[str, str] | None = None


def _codegen_versions() -> dict[str, str]:
    """``version:<dist>`` -> version or ``absent`` for :data:`CODEGEN_DISTRIBUTIONS`
    (computed once per process: what is installed does not change under a running one)."""
    global _versions_fields
    if _versions_fields is None:
        _versions_fields = {"version:" + d: version_of(d) for d in CODEGEN_DISTRIBUTIONS}
    return _versions_fields


def target_ccs(compute_capability: Any) -> str | None:
    """The normalized targets (``"8.0,9.0"``) of an explicit ``compute_capability=``, the
    current device's when it is None, or None when no device can be queried (the
    factory itself then raises its own error). Raises ValueError / TypeError for a
    value cuda.compute would reject."""
    from cuda.compute._cccl_interop import normalize_compute_capabilities

    if compute_capability is None:
        try:
            from cuda.core import Device

            major, minor = Device().compute_capability
        except Exception:  # noqa: BLE001 - no driver / no device: the factory says how to fix it
            return None
        return f"{major}.{minor}"
    ccs = normalize_compute_capabilities(compute_capability)
    return ",".join(f"{major}.{minor}" for major, minor in ccs)


def key_fields(algorithm: str, signature: Any, args: tuple, kwargs: dict) -> dict[str, str] | None:
    """The key fields of ``algorithm(*args, **kwargs)`` (see the module doc), or None when
    the targets cannot be determined (no device and no ``compute_capability=``). Raises
    :class:`cuforge.fingerprint.UnstableKeyError` for an argument that cannot be keyed, and the
    binding's TypeError for arguments the factory would reject."""

    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    values: dict[str, Any] = {}
    for name, value in bound.arguments.items():
        param = signature.parameters[name]
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            values.update(value)
        elif param.kind is inspect.Parameter.VAR_POSITIONAL:
            for i, item in enumerate(value):
                values[f"{name}[{i}]"] = item
        else:
            values[name] = value
    ccs = target_ccs(values.pop("compute_capability", None))
    if ccs is None:
        return None
    fields = {
        "algorithm": algorithm,
        "python": f"{sys.version_info[0]}.{sys.version_info[1]}",
        "compute_capability": ccs,
    }
    fields.update(_codegen_versions())
    for name in sorted(values):
        fields["arg:" + name] = spec(values[name], name)
    return fields


def spec(value: Any, what: str) -> str:
    """How one argument enters the key (see the module doc)."""
    import numpy as np
    from cuda.compute import ProxyArray, ProxyValue
    from cuda.compute._utils.protocols import get_dtype, is_device_array
    from cuda.compute.iterators._base import IteratorBase
    from cuda.compute.struct import _Struct

    if value is None or type(value) in (bool, int, float, str):
        return f"{type(value).__name__} {value!r}"
    enum = sys.modules["enum"]
    if isinstance(value, enum.Enum):
        from cuda.compute import OpKind

        owner = "OpKind" if type(value) is OpKind else type(value).__qualname__
        return f"enum {owner}.{value.name}"
    if isinstance(value, IteratorBase):
        return f"iterator {type(value).__name__} " + fingerprint(value.kind, what=what, hook=hook)
    if isinstance(value, _Struct):
        return f"struct {type(value).__qualname__} {value.dtype!r}"
    if isinstance(value, (ProxyValue, np.ndarray, np.generic)):
        return f"value {np.dtype(value.dtype)!r}"
    if isinstance(value, ProxyArray) or is_device_array(value):
        return f"array {np.dtype(get_dtype(value))!r}"
    if type(value).__name__ == "DoubleBuffer":
        return f"double-buffer {np.dtype(get_dtype(value.current()))!r}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(spec(v, f"{what}[{i}]") for i, v in enumerate(value)) + "]"
    if isinstance(value, (np.dtype, type)):
        return "type " + fingerprint(value, what=what, hook=hook)
    if callable(value):
        return "op " + fingerprint(value, what=what, hook=hook)
    return "data " + fingerprint(value, what=what, hook=hook)


def hook(obj: Any) -> Any:
    """:func:`cuforge.fingerprint.fingerprint`'s hook for cuda.compute's own objects: type
    descriptors, iterators, operator adapters, GPU struct types and values, device arrays
    captured by an operator (dtype and shape: their pointer is state, set at call time)
    and JIT dispatchers (their Python function)."""
    from cuda.compute.iterators._base import IteratorBase
    from cuda.compute.op import RawOp, _WellKnownOp
    from cuda.compute.struct import _Struct
    from cuda.compute.types import TypeDescriptor

    if isinstance(obj, type):
        if issubclass(obj, _Struct) and obj is not _Struct:
            return ("struct-type", obj.__qualname__, repr(obj.dtype))
        return UNHANDLED
    if isinstance(obj, (tuple, list, dict, str, bytes)):
        return UNHANDLED
    if isinstance(obj, TypeDescriptor):
        return _type_descriptor(obj)
    if isinstance(obj, IteratorBase):
        return ("iterator", type(obj).__name__, obj.kind)
    if isinstance(obj, _Struct):
        return ("struct", type(obj).__qualname__, repr(obj.dtype))
    if isinstance(obj, _WellKnownOp):
        return ("OpKind", obj._kind.name)
    if isinstance(obj, RawOp):
        return ("RawOp", obj._identity)
    name = type(obj).__name__
    if type(obj).__module__.startswith("cuda.compute") and name in ("_StatelessOp", "_StatefulOp"):
        return ("op", name, obj._func)
    py_func = getattr(obj, "py_func", None)
    if py_func is not None and callable(py_func):  # a numba(-mlir) dispatcher
        return ("dispatcher", name, py_func)
    if hasattr(obj, "__cuda_array_interface__") or _is_torch_cuda(obj):
        from cuda.compute._utils.protocols import get_dtype, get_shape

        return ("device-array", repr(get_dtype(obj)), tuple(get_shape(obj)))
    return UNHANDLED


def _is_torch_cuda(obj: Any) -> bool:
    return type(obj).__module__ == "torch" and type(obj).__name__ == "Tensor"


def _type_descriptor(td: Any) -> tuple:
    fields = getattr(td, "_fields", None)
    pointee = getattr(td, "_pointee", None)
    return (
        type(td).__name__,
        int(td.size),
        int(td.alignment),
        int(td.info.typenum),
        repr(td.dtype),
        getattr(td, "_name", ""),
        tuple((k, _type_descriptor(v)) for k, v in fields.items()) if fields else (),
        _type_descriptor(pointee) if pointee is not None else (),
    )
