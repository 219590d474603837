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
  Python callables by :func:`cuforge.keys.fingerprint.fingerprint` (code, constants, closures,
  globals, recursively; the device arrays cuda.compute turns into runtime state by dtype
  and shape), plain data by value.

Device arrays an operator reaches: cuda.compute turns into runtime state (a pointer set at
every call) only the arrays the operator *itself* names as a global or a closure variable
(:func:`state_arrays`, the same test as cuda.compute's ``_detect_all_device_arrays``). Any
other device array the operator reaches -- a ``@cuda.jit(device=True)`` helper's global, a
nested function's closure, a default argument, an attribute of a module it names -- is
compiled in as a constant: its address is in the machine code. :func:`baked_array` finds
the first such array and the call is not keyed (it runs uncached, the reason naming the
array's path): a build that holds one process's device address must never serve another.

An argument that cannot be keyed the same way in every process raises
:class:`cuforge.keys.fingerprint.UnstableKeyError`; the caller then keys an operator or iterator
by its traced LTO-IR instead (:mod:`cuforge.cccl._ir`; ``key_fields(traced=[])``), and builds
anything else without caching.
"""

from __future__ import annotations

import functools
import inspect
import sys
import types
from typing import TYPE_CHECKING

from cuforge.keys.fingerprint import (
    MAX_DEPTH,
    UNHANDLED,
    UnstableKeyError,
    _global_names,
    _resolvable,
    attribute_names,
    fingerprint,
)
from cuforge.toolchain.installed import installed_versions as _installed_versions
from cuforge.toolchain.installed import normalize as _normalize

if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "key_fields",
    "CODEGEN_DISTRIBUTIONS",
    "installed_versions",
    "target_ccs",
    "state_arrays",
    "baked_array",
    "traceable",
    "BAKED_REASON",
]

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
    """Normalized distribution name -> version (:func:`cuforge.toolchain.installed.installed_versions`)."""
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


def key_fields(
    algorithm: str,
    signature: Any,
    args: tuple,
    kwargs: dict,
    traced: list[UnstableKeyError] | None = None,
) -> dict[str, str] | None:
    """The key fields of ``algorithm(*args, **kwargs)`` (see the module doc), or None when
    the targets cannot be determined (no device and no ``compute_capability=``). Raises
    :class:`cuforge.keys.fingerprint.UnstableKeyError` for an argument that cannot be keyed, and the
    binding's TypeError for arguments the factory would reject.

    ``traced``: a list to collect, instead of raising, the errors of arguments the IR key
    covers (:func:`traceable`: an operator or an iterator whose fingerprint is refused);
    their field is ``"traced"``. A baked device array (:data:`BAKED_REASON`) and any other
    argument still raise."""

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
        state = baked_array(values[name], name)
        try:
            fields["arg:" + name] = spec(values[name], name, state)
        except UnstableKeyError as exc:
            if traced is None or not traceable(values[name]):
                raise
            traced.append(exc)
            fields["arg:" + name] = "traced"
    return fields


def traceable(value: Any) -> bool:
    """Whether everything ``value`` changes in a build reaches the build as LTO-IR and type
    descriptors (what the IR key digests): an operator (a Python callable, a cuda.compute
    op adapter) or an iterator, or a list / tuple of them. Classes and plain data are not."""
    from cuda.compute.iterators._base import IteratorBase
    from cuda.compute.op import OpAdapter

    if isinstance(value, (list, tuple)):
        return bool(value) and all(traceable(v) for v in value)
    if isinstance(value, (IteratorBase, OpAdapter)):
        return True
    return callable(value) and not isinstance(value, type)


def spec(value: Any, what: str, state: frozenset[int] = frozenset()) -> str:
    """How one argument enters the key (see the module doc). ``state``: the ids of the
    device arrays cuda.compute turns into runtime state (:func:`baked_array`'s answer),
    keyed by dtype and shape; any other device array met is keyed by its address too."""
    hook = functools.partial(_hook, state=state)
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
        items = (spec(v, f"{what}[{i}]", state) for i, v in enumerate(value))
        return "[" + ", ".join(items) + "]"
    if isinstance(value, (np.dtype, type)):
        return "type " + fingerprint(value, what=what, hook=hook)
    if callable(value):
        return "op " + fingerprint(value, what=what, hook=hook)
    return "data " + fingerprint(value, what=what, hook=hook)


def hook(obj: Any) -> Any:
    """:func:`cuforge.keys.fingerprint.fingerprint`'s hook for cuda.compute's own objects (see
    :func:`_hook`; every device array keyed by its address too)."""
    return _hook(obj, frozenset())


def _hook(obj: Any, state: frozenset[int]) -> Any:
    """The hook for cuda.compute's own objects: type descriptors, iterators, operator
    adapters, GPU struct types and values, JIT dispatchers (their Python function) and
    device arrays: those in ``state`` (ids: arrays cuda.compute passes as runtime state)
    by dtype and shape, their pointer being set at call time; any other by its address as
    well, the compiler having baked it into the code (:func:`baked_array` names the usual
    ways in and makes the call uncached; this is the net for any other)."""
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
        from cuda.compute._utils.protocols import get_data_pointer, get_dtype, get_shape

        found = ("device-array", repr(get_dtype(obj)), tuple(get_shape(obj)))
        if id(obj) in state:
            return found
        try:
            return (*found, "at", int(get_data_pointer(obj)))
        except (RuntimeError, LookupError, AttributeError, TypeError):
            return (*found, "no address")  # a ProxyArray: nothing to bake
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


#: why a device array an operator reaches other than as its own global / closure variable
#: makes the call uncached
BAKED_REASON = (
    "it is a device array that cuda.compute does not pass as runtime state (it does so "
    "only for arrays the operator itself names as a global or closure variable), so the "
    "compiler bakes its address into the machine code, which must not serve another "
    "process; name the array in the operator itself, or pass it in through an iterator"
)


def is_device_array(obj: Any) -> bool:
    """cuda.compute's test (``__cuda_array_interface__``), plus CUDA torch tensors."""
    try:
        return hasattr(obj, "__cuda_array_interface__") or _is_torch_cuda(obj)
    except Exception:  # noqa: BLE001 - a property that raises (a CPU tensor): not a device array
        return False


def state_arrays(func: Any) -> tuple[frozenset[str], frozenset[str]]:
    """``(global names, closure names)`` of the device arrays cuda.compute turns into runtime
    state when ``func`` is an operator: the names in ``func``'s own ``co_names`` whose global
    is a device array, and its closure variables holding one (the same test as
    ``cuda.compute._jit._detect_all_device_arrays``, repeated here so a cache hit never
    imports the JIT backend; a test checks that the two agree)."""
    code = getattr(func, "__code__", None)
    glb = getattr(func, "__globals__", None)
    if not isinstance(code, types.CodeType) or not isinstance(glb, dict):
        return frozenset(), frozenset()
    names = frozenset(
        n for n in code.co_names if glb.get(n) is not None and is_device_array(glb.get(n))
    )
    cells: set[str] = set()
    for name, cell in zip(code.co_freevars, func.__closure__ or (), strict=False):
        try:
            value = cell.cell_contents
        except ValueError:
            continue
        if is_device_array(value):
            cells.add(name)
    return names, frozenset(cells)


def baked_array(value: Any, what: str) -> frozenset[int]:
    """Raise :class:`cuforge.keys.fingerprint.UnstableKeyError` naming the path of the first device
    array that argument ``value`` makes the compiler bake into the code (see the module
    doc). Otherwise return the ids of the device arrays in it that cuda.compute turns into
    runtime state (its operators' own globals and closure variables). A device array passed
    as the argument itself (or an item of a list / tuple argument) is an argument, set at
    call time."""
    if is_device_array(value):
        return frozenset()
    if isinstance(value, (list, tuple)):
        ids: frozenset[int] = frozenset()
        for i, item in enumerate(value):
            ids |= baked_array(item, f"{what}[{i}]")
        return ids
    walk = _Baked(what)
    walk.walk(value, what, root=True)
    return frozenset(walk.state)


class _Baked:
    """One walk of :func:`baked_array`: the objects an operator's code can reach at compile
    time (functions' globals, closures and defaults, JIT dispatchers' Python functions,
    cuda.compute operator adapters and iterator kinds, containers, attributes of modules
    named in the code). Functions of installed and standard-library modules are not
    entered (they are keyed by name and version, and hold no array of the caller's)."""

    __slots__ = ("_seen", "_what", "state")

    def __init__(self, what: str) -> None:
        self._what = what
        self._seen: set[int] = set()
        self.state: set[int] = set()  # ids of the arrays cuda.compute passes as state

    def walk(self, obj: Any, path: str, *, root: bool = False, depth: int = 0) -> None:
        if obj is None or type(obj) in (bool, int, float, str, bytes, complex):
            return
        if is_device_array(obj):
            raise UnstableKeyError(self._what, path, BAKED_REASON)
        if id(obj) in self._seen:
            return
        self._seen.add(id(obj))
        if depth >= MAX_DEPTH:
            raise UnstableKeyError(
                self._what, path, f"it is nested more than {MAX_DEPTH} levels deep"
            )
        depth += 1
        if isinstance(obj, types.FunctionType):
            if root or _resolvable(obj) is None:  # installed code holds no user array
                self._function(obj, path, root, depth)
        elif isinstance(obj, (tuple, list, set, frozenset)):
            for i, item in enumerate(obj):
                self.walk(item, f"{path}[{i}]", depth=depth)
        elif isinstance(obj, dict):
            for k, v in obj.items():
                self.walk(v, f"{path}[{k!r}]", depth=depth)
        elif isinstance(obj, types.MethodType):
            self.walk(obj.__func__, f"{path}.__func__", depth=depth)
        elif isinstance(obj, (types.ModuleType, type)):
            return  # a module's attributes are walked where code names them
        elif type(obj).__module__.startswith("cuda.compute"):
            self._compute_object(obj, path, depth)
        elif type(obj).__name__ == "partial" and type(obj).__module__ == "functools":
            self.walk(obj.func, f"{path}.func", depth=depth)
            self.walk(obj.args, f"{path}.args", depth=depth)
            self.walk(obj.keywords, f"{path}.keywords", depth=depth)
        else:
            py_func = getattr(obj, "py_func", None)
            if isinstance(py_func, types.FunctionType):  # a numba(-mlir) dispatcher
                self.walk(py_func, f"{path}.py_func", depth=depth)

    def _compute_object(self, obj: Any, path: str, depth: int) -> None:
        from cuda.compute.iterators._base import IteratorBase

        if isinstance(obj, IteratorBase):  # its state is set at call time; its kind is code
            self.walk(obj.kind, f"{path}.kind", depth=depth)
        elif type(obj).__name__ in ("_StatelessOp", "_StatefulOp"):
            self.walk(obj._func, f"{path}._func", root=True, depth=depth)

    def _function(self, fn: types.FunctionType, path: str, root: bool, depth: int) -> None:
        # root: the operator cuda.compute itself inspects (its own arrays are state);
        # anything it calls (a helper) is compiled as it is, arrays and all
        state_globals, state_cells = state_arrays(fn) if root else (frozenset(), frozenset())
        code = fn.__code__
        glb = fn.__globals__
        attrs = attribute_names(code)
        for name in _global_names(code):
            if name not in glb:
                continue
            value = glb[name]
            where = f"{path}.__globals__[{name!r}]"
            if name in state_globals and is_device_array(value):
                self.state.add(id(value))
                continue
            if isinstance(value, types.ModuleType):
                for attr in attrs:
                    found = getattr(value, attr, None)
                    if found is not None and not isinstance(found, types.ModuleType):
                        self.walk(found, f"{where}.{attr}", depth=depth)
                continue
            self.walk(value, where, depth=depth)
        for name, cell in zip(code.co_freevars, fn.__closure__ or (), strict=False):
            try:
                value = cell.cell_contents
            except ValueError:
                continue
            if name in state_cells and is_device_array(value):
                self.state.add(id(value))
                continue
            self.walk(value, f"{path}.<closure {name}>", depth=depth)
        self.walk(fn.__defaults__, f"{path}.__defaults__", depth=depth)
        self.walk(fn.__kwdefaults__, f"{path}.__kwdefaults__", depth=depth)
