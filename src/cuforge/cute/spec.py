"""What a ``cute.compile`` argument contributes to the key: its *spec*, never its data.

The CuTe DSL compiles for a signature, not for values: a tensor argument is specialized on
its dtype, memory space, assumed alignment and those parts of its shape and stride that are
compile-time; a dynamic extent (a :class:`cutlass.cute.typing.SymInt` in a fake tensor, or a
``from_dlpack(...).mark_layout_dynamic()`` / ``mark_compact_shape_dynamic`` mode) is a
runtime parameter and enters only as "dynamic" (with its width and divisibility). A
``Constexpr`` parameter is specialized on its value.

Guarantees of :func:`describe_args`:

* The description is a plain string, the same in every process for the same specs (no
  ``id()``, no addresses, no absolute paths). ``SymInt`` objects are numbered by their first
  appearance, so "the same runtime extent in two places" and "two different extents" give
  different descriptions, as they give different kernels.
* Everything the DSL could specialize on is in it; when in doubt it says more (a plain
  Python scalar passed to a parameter that is not annotated with a DSL numeric type is
  keyed by its value), which can cost a compile, never a stale hit.
* A raw array (numpy, torch, JAX: a type the DSL has a ``TensorAdapter`` for) is keyed
  as the tensor the DSL makes of it: ``from_dlpack(array).mark_layout_dynamic()`` (dtype,
  rank, which extents and strides are static, the leading dimension, alignment).
* Any other object (a kernel class instance, passed as ``self`` or as a Constexpr) is
  keyed by :func:`cuforge.keys.fingerprint.fingerprint` with ``instances=True``: its class by
  content (methods, class attributes, bases) and its ``__dict__`` / ``__slots__`` state.
* An argument it cannot describe stably raises :class:`UnkeyableArgument` naming the
  argument; the caller then compiles uncached and says why.

Layer 5 (an integration). Imports nothing from the DSL at module level.
"""

from __future__ import annotations

import inspect
import typing
from typing import TYPE_CHECKING

from cuforge.keys.fingerprint import UnstableKeyError, fingerprint

if TYPE_CHECKING:  # pragma: no cover
    from typing import Any

__all__ = ["UnkeyableArgument", "describe_args", "describe_value"]

_SCALARS = (bool, int, float, str, bytes, type(None))


class UnkeyableArgument(Exception):
    """An argument whose compile-time spec cannot be described stably across processes."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: {reason}")
        self.where = where
        self.reason = reason


class _SymNames:
    """Numbers ``SymInt`` objects by first appearance (identity within one call only)."""

    def __init__(self) -> None:
        self._seen: dict[int, int] = {}
        self._keep: list[object] = []  # keeps the ids valid for the call

    def name(self, sym: Any) -> str:
        idx = self._seen.get(id(sym))
        if idx is None:
            idx = self._seen[id(sym)] = len(self._seen)
            self._keep.append(sym)
        width = getattr(sym, "_width", getattr(sym, "width", "?"))
        div = getattr(sym, "_divisibility", getattr(sym, "divisibility", "?"))
        symbol = getattr(sym, "_symbol", getattr(sym, "symbol", None))
        return f"sym{idx}(i{width},div={div},name={symbol!r})"


def _dtype_name(dtype: Any) -> str:
    """A DSL numeric type by its qualified name (``cutlass.base_dsl.typing.Float32``)."""
    if isinstance(dtype, type):
        return f"{dtype.__module__}.{dtype.__qualname__}"
    return repr(dtype)


def _mode_list(items: Any, syms: _SymNames, sym_type: type) -> str:
    if items is None:
        return "None"
    if isinstance(items, (tuple, list)):
        return "(" + ",".join(_mode_list(i, syms, sym_type) for i in items) + ")"
    if isinstance(items, sym_type):
        return syms.name(items)
    if isinstance(items, int) and not isinstance(items, bool):
        return str(items)
    return repr(str(items))


def _is_numeric_annotation(annotation: Any) -> bool:
    """Whether a parameter annotation is a DSL numeric type (a dynamic runtime scalar)."""
    from cutlass.base_dsl.typing import Numeric

    return isinstance(annotation, type) and issubclass(annotation, Numeric)


def _is_constexpr_annotation(annotation: Any) -> bool:
    from cutlass.base_dsl.typing import Constexpr

    return annotation is Constexpr or typing.get_origin(annotation) is Constexpr


def _adapted_tensor(value: Any) -> Any:
    """The DSL tensor a raw array becomes when passed to ``cute.compile`` (numpy, torch,
    JAX: the DSL's registered ``TensorAdapter``, ``from_dlpack(value).mark_layout_dynamic()``),
    or None when the DSL has no tensor adapter for the value's type."""
    from cutlass.base_dsl.runtime.jit_arg_adapters import JitArgAdapterRegistry
    from cutlass.cute import runtime as cute_rt

    adapter = JitArgAdapterRegistry.get_registered_adapter(value)
    if not (isinstance(adapter, type) and issubclass(adapter, cute_rt.TensorAdapter)):
        return None
    return adapter(value)._arg


def _dlpack_spec(value: Any) -> str:
    value.load_dltensor()
    wrapper = value._dltensor_wrapper
    tvm = getattr(value, "_tvm_ffi_tensor", None) is not None
    # the DSL's own layout spec: static extents as numbers, dynamic ones as `?{...}`
    return (
        f"dlpack(dtype={_dtype_name(value.element_type)},align={value._assumed_align},"
        f"layout={wrapper.cache_key()!s},i32stride={bool(value._use_32bit_stride)},"
        f"tvm_ffi={tvm})"
    )


def _instance(value: Any, where: str, hook: Any, constexpr: bool = False) -> str:
    """A kernel object (or any Python object) by its class and state:
    :func:`cuforge.keys.fingerprint.fingerprint` with ``instances=True``."""
    try:
        return fingerprint(value, what=where, hook=hook, instances=True)
    except UnstableKeyError as exc:
        what = "Constexpr value" if constexpr else f"a {type(value).__qualname__} object"
        raise UnkeyableArgument(where, f"{what}: {exc}") from exc


#: the stream types an argument may be, keyed by type alone (the DSL's fake stream, the
#: CUDA driver's handle, torch's streams)
_STREAM_TYPES = frozenset(
    {
        "cutlass.runtime._FakeStream",
        "cuda.bindings.driver.CUstream",
        "torch.cuda.streams.Stream",
        "torch.cuda.streams.ExternalStream",
    }
)


def describe_value(
    value: Any, annotation: Any, where: str, syms: _SymNames, hook: Any = None
) -> str:
    """The spec of one argument (see the module doc). Raises :class:`UnkeyableArgument`."""
    from cutlass.base_dsl.typing import Numeric
    from cutlass.cute import runtime as cute_rt
    from cutlass.cute.typing import SymInt

    cls = type(value)  # the real class: _Tensor reports `Tensor` through __class__
    if _is_constexpr_annotation(annotation):
        return f"constexpr:{_instance(value, where, hook, constexpr=True)}"
    if isinstance(value, cute_rt._FakeTensor):
        tt = value._typed_tensor
        return (
            f"fake:{cls.__module__}.{cls.__qualname__}(dtype={_dtype_name(value.element_type)},"
            f"mem={value.memspace},align={tt.assumed_align},"
            f"shape={_mode_list(tuple(value.shape), syms, SymInt)},"
            f"stride={_mode_list(tuple(value.stride), syms, SymInt)},"
            f"i32stride={bool(getattr(value, '_use_32bit_stride', False))})"
        )
    if isinstance(value, cute_rt._Tensor):
        return _dlpack_spec(value)
    if isinstance(value, cute_rt._Pointer):
        return (
            f"ptr(dtype={_dtype_name(value.dtype)},mem={value.memspace},"
            f"align={value._assumed_align})"
        )
    if isinstance(value, SymInt):
        return syms.name(value)
    if isinstance(value, Numeric):
        # a DSL scalar object: a runtime value of that type
        return f"scalar:{_dtype_name(cls)}"
    if isinstance(value, _SCALARS):
        if _is_numeric_annotation(annotation) and not isinstance(value, (str, bytes)):
            return f"scalar:{_dtype_name(annotation)}<-{cls.__name__}"
        return f"value:{cls.__name__}:{value!r}"
    if isinstance(value, (tuple, list)):
        inner = ",".join(
            describe_value(v, None, f"{where}[{i}]", syms, hook) for i, v in enumerate(value)
        )
        return f"{cls.__name__}({inner})"
    qual = f"{cls.__module__}.{cls.__qualname__}"
    if qual in _STREAM_TYPES:
        # a stream is a runtime handle: its type is the whole spec (only these exact types:
        # a user's kernel class named ``...Stream...`` is keyed by its state)
        return f"stream:{qual}"
    adapted = _adapted_tensor(value)
    if adapted is not None:  # a raw array: keyed as the tensor the DSL makes of it
        try:
            return f"array:{qual}:{_dlpack_spec(adapted)}"
        except Exception as exc:  # noqa: BLE001 - the DSL refuses it: cuforge does not key it
            raise UnkeyableArgument(where, f"a {qual} the DSL cannot describe ({exc})") from exc
    return f"object:{_instance(value, where, hook)}"


def describe_args(fn: Any, args: tuple, kwargs: dict, hook: Any = None) -> str:
    """The spec of every argument of ``fn(*args, **kwargs)``, bound to its parameters.

    Raises :class:`UnkeyableArgument` for an argument that cannot be described stably, and
    for arguments that do not fit the signature (naming the problem). ``hook``: passed to
    :func:`cuforge.keys.fingerprint.fingerprint` for Constexpr values and objects.
    """

    target = inspect.unwrap(fn)
    try:
        try:  # resolve postponed (string) annotations the way the DSL does
            sig = inspect.signature(target, eval_str=True)
        except Exception:  # noqa: BLE001 - an annotation that does not evaluate stays text
            sig = inspect.signature(target)
        bound = sig.bind(*args, **kwargs)
    except (TypeError, ValueError) as exc:
        raise UnkeyableArgument(
            f"arguments of {getattr(target, '__qualname__', target)!r}",
            f"they do not fit its signature ({exc})",
        ) from exc
    bound.apply_defaults()
    syms = _SymNames()
    parts = []
    for name, value in bound.arguments.items():
        param = sig.parameters[name]
        annotation = param.annotation
        if isinstance(annotation, str):
            # postponed annotations: the DSL resolves them; key the text itself too
            annotation_text = annotation
            annotation = None
        else:
            annotation_text = ""
        where = f"argument {name!r}"
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            desc = describe_value(tuple(value), None, where, syms, hook)
        elif param.kind is inspect.Parameter.VAR_KEYWORD:
            desc = (
                "{"
                + ",".join(
                    f"{k}={describe_value(v, None, f'{where}[{k!r}]', syms, hook)}"
                    for k, v in sorted(value.items())
                )
                + "}"
            )
        else:
            desc = describe_value(value, annotation, where, syms, hook)
        parts.append(f"{name}{'@' + annotation_text if annotation_text else ''}={desc}")
    return ";".join(parts)
