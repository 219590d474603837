"""Kernel arguments: pointers from torch / CuPy / ``__cuda_array_interface__`` / ``__dlpack__``
/ :class:`Pointer`, scalars converted to their declared C type, structs by value, and the
:class:`Layout` that packs them into the buffer ``cuLaunchKernel`` reads.

Each converter is looked up by the argument's ``type`` in a dict (no ``isinstance`` chain
per call) and raises an error that names the parameter.
"""

from __future__ import annotations

import ctypes
import operator
import struct
import sys

from cuforge.base.scalar_types import ELEMENT_KINDS, SCALAR_TYPES, torch_dtype_for
from cuforge.runtime.driver import MEMORYTYPE_HOST, driver
from cuforge.runtime.errors import ArgumentError, ArgumentValueError
from cuforge.runtime.signature import SCALAR_CODES, Param

__all__ = [
    "Pointer",
    "Layout",
    "convert_pointer",
    "convert_scalar",
    "convert_struct",
    "convert_raw",
    "torch_dtype_for",
    "element_kind_names",
    "dlpack_dtype",
]


class Pointer:
    """A raw device address, passed to a pointer parameter as is (no checks).

    ``nbytes`` is informational (shown in ``repr``). Plain ``int`` arguments are refused
    for pointer parameters so that a size or an index can't be mistaken for an address.
    """

    __slots__ = ("address", "nbytes")

    def __init__(self, address: int, nbytes: int | None = None) -> None:
        try:
            address = int(address)
        except (TypeError, ValueError):
            raise TypeError(
                f"Pointer needs an integer address, got {type(address).__name__}"
            ) from None
        if not 0 <= address < 1 << 64:
            raise ValueError(f"Pointer address {address:#x} is not a 64-bit unsigned value")
        if nbytes is not None and nbytes < 0:
            raise ValueError(f"Pointer nbytes must be >= 0, got {nbytes}")
        self.address = address
        self.nbytes = nbytes

    def __int__(self) -> int:
        return self.address

    def __eq__(self, other) -> bool:
        return isinstance(other, Pointer) and other.address == self.address

    def __hash__(self) -> int:
        return hash(self.address)

    def __repr__(self) -> str:
        size = f", nbytes={self.nbytes}" if self.nbytes is not None else ""
        return f"Pointer({self.address:#x}{size})"


# -- element types ----------------------------------------------------------------------
# An element kind is (kind, itemsize): kind "f" float, "bf" bfloat16, "i" signed int,
# "u" unsigned int, "b" bool, "c" complex, "?" unknown.

#: pointee code -> the element kinds an array passed for it may have
_POINTEE_ACCEPTS: dict[str, frozenset] = {t.code: t.element_kinds for t in SCALAR_TYPES}
_KIND_NAMES = {k.letter: k.prefix for k in ELEMENT_KINDS}
#: NumPy dtype / ``__cuda_array_interface__`` kind character -> element kind letter
_ARRAY_KINDS = {k.array_char: k.letter for k in ELEMENT_KINDS if k.array_char}


def element_kind_names(kind: tuple[str, int]) -> str:
    k, size = kind
    if k == "b":
        return "bool"
    if k == "?":
        return "unknown"
    return f"{_KIND_NAMES.get(k, k)}{size * 8}"


#: pointee code -> the numpy (and CuPy) dtype name the fast paths expect (the torch one:
#: numpy has no bfloat16)
NUMPY_DTYPE_NAMES = {t.code: t.torch_dtype for t in SCALAR_TYPES if t.kind != "bf"}


_torch_kinds: dict = {}


def _torch_kind(dtype) -> tuple[str, int]:
    kind = _torch_kinds.get(dtype)
    if kind is None:
        name = str(dtype).replace("torch.", "")
        size = dtype.itemsize
        if name == "bfloat16":
            kind = ("bf", 2)
        elif name == "bool":
            kind = ("b", 1)
        elif dtype.is_complex:
            kind = ("c", size)
        elif dtype.is_floating_point:
            kind = ("f" if not name.startswith("float8") else "f8", size)
        elif name.startswith("uint"):
            kind = ("u", size)
        else:
            kind = ("i", size)
        _torch_kinds[dtype] = kind
    return kind


def _numpy_kind(dtype) -> tuple[str, int]:
    if getattr(dtype, "name", "") == "bfloat16":
        return ("bf", 2)
    return (_ARRAY_KINDS.get(dtype.kind, "?"), dtype.itemsize)


def _typestr_kind(typestr: str) -> tuple[str, int]:
    return (_ARRAY_KINDS.get(typestr[1:2], "?"), int(typestr[2:] or 0))


def _check_kind(param: Param, kind: tuple[str, int], what: str) -> None:
    accepts = _POINTEE_ACCEPTS.get(param.code) if param.kind == "pointer" else None
    if accepts is not None and kind[0] != "?" and kind not in accepts:
        raise ArgumentError(
            f"{param.label}: got {what} of element type {element_kind_names(kind)}, which "
            f"contradicts the declared pointee {param.base!r}"
        )


# -- pointer converters ------------------------------------------------------------------
# Each returns (address, device ordinal or -1 if unknown, framework name or None).


def _torch_pointer(param: Param, t):
    if not t.is_cuda:
        raise ArgumentError(
            f"{param.label}: got a torch tensor on {t.device}; kernels need GPU memory "
            "(move it with .cuda())"
        )
    _check_kind(param, _torch_kind(t.dtype), f"a torch.{str(t.dtype)[6:]} tensor")
    if not t.is_contiguous():
        raise ArgumentValueError(
            f"{param.label}: the torch tensor is not contiguous (shape {tuple(t.shape)}, "
            f"strides {tuple(t.stride())}); pass t.contiguous()"
        )
    return t.data_ptr(), t.get_device(), "torch"


def _cupy_pointer(param: Param, a):
    _check_kind(param, _numpy_kind(a.dtype), f"a cupy {a.dtype} array")
    if not (a.flags.c_contiguous or a.size <= 1):
        raise ArgumentValueError(
            f"{param.label}: the CuPy array is not C-contiguous (shape {a.shape}, strides "
            f"{a.strides}); pass cupy.ascontiguousarray(a)"
        )
    return a.data.ptr, a.data.device_id, "cupy"


def _cai_pointer(param: Param, obj):
    cai = obj.__cuda_array_interface__
    address = int(cai["data"][0])
    typestr = cai.get("typestr", "|V1")
    _check_kind(param, _typestr_kind(typestr), f"a {type(obj).__name__} (typestr {typestr})")
    strides = cai.get("strides")
    shape = tuple(cai.get("shape", ()))
    if strides is not None:
        itemsize = int(typestr[2:] or 1)
        expected = []
        acc = itemsize
        for dim in reversed(shape):
            expected.append(acc)
            acc *= dim
        expected.reverse()
        if any(d > 1 and s != e for d, s, e in zip(shape, strides, expected, strict=False)):
            raise ArgumentValueError(
                f"{param.label}: the {type(obj).__name__} is not C-contiguous (shape {shape}, "
                f"strides {tuple(strides)})"
            )
    device = -1
    if address:
        mtype, device = driver().pointer_info(address)
        if mtype in (0, MEMORYTYPE_HOST):
            raise ArgumentError(
                f"{param.label}: the {type(obj).__name__}'s __cuda_array_interface__ points to "
                "host memory; kernels need GPU memory"
            )
    return address, device, None


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


_DL_CUDA = 2
_DL_CUDA_MANAGED = 13
_DL_NAMES = {
    1: "the CPU",
    2: "a CUDA device",
    3: "CUDA pinned host memory",
    13: "CUDA managed memory",
}
_DL_CODES = {k.dlpack: k.letter for k in ELEMENT_KINDS}


def dlpack_dtype(obj) -> tuple[int, int, int]:
    """The DLPack element type of ``obj`` (an object with ``__dlpack__``): (type code, bits,
    lanes); codes: 0 int, 1 uint, 2 float, 4 bfloat, 5 complex, 6 bool."""
    capsule = obj.__dlpack__()
    dtype = _dltensor(capsule).dtype
    # read while the capsule (and so the tensor it describes) is alive
    return int(dtype.code), int(dtype.bits), int(dtype.lanes)


def _dltensor(capsule) -> _DLTensor:
    """The DLTensor a DLPack capsule describes (valid while ``capsule`` is alive)."""
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype, get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    name = get_name(capsule)
    address = get_pointer(capsule, name)
    # DLManagedTensor and DLManagedTensorVersioned both lead to a DLTensor: the versioned
    # one has a version (2 x u32) and manager_ctx, deleter, flags first.
    if name == b"dltensor_versioned":
        address += 8 + 8 + 8 + 8
    return _DLTensor.from_address(address)


def _dlpack_pointer(param: Param, obj):
    try:
        device_type, device_id = obj.__dlpack_device__()
    except AttributeError:
        device_type, device_id = None, -1
    if device_type is not None and int(device_type) not in (_DL_CUDA, _DL_CUDA_MANAGED):
        where = _DL_NAMES.get(int(device_type), f"DLPack device type {int(device_type)}")
        raise ArgumentError(
            f"{param.label}: the {type(obj).__name__} lives on {where}; kernels need GPU memory"
        )
    capsule = obj.__dlpack__()
    t = _dltensor(capsule)
    kind = (_DL_CODES.get(t.dtype.code, "?"), t.dtype.bits // 8 * max(1, t.dtype.lanes))
    _check_kind(param, kind, f"a {type(obj).__name__} (via __dlpack__)")
    if t.strides:
        shape = [t.shape[i] for i in range(t.ndim)]
        strides = [t.strides[i] for i in range(t.ndim)]
        acc = 1
        for dim, stride in zip(reversed(shape), reversed(strides), strict=False):
            if dim > 1 and stride != acc:
                raise ArgumentValueError(
                    f"{param.label}: the {type(obj).__name__} is not contiguous (shape "
                    f"{tuple(shape)}, strides {tuple(strides)} in elements)"
                )
            acc *= dim
    # the capsule stays unconsumed: its destructor gives the reference back; obj owns the memory
    return (
        (t.data or 0) + t.byte_offset,
        t.device.device_id if device_id == -1 else int(device_id),
        None,
    )


def _pointer_pointer(param: Param, p: Pointer):
    return p.address, -1, None


def _none_pointer(param: Param, _):
    return 0, -1, None


def _int_pointer(param: Param, value):
    raise ArgumentError(
        f"{param.label}: got a plain int ({value}); to pass a raw device address, wrap it: "
        "cuforge.Pointer(address)"
    )


def _host_pointer(param: Param, obj):
    raise ArgumentError(
        f"{param.label}: got a {type(obj).__module__}.{type(obj).__name__} in host memory; "
        "kernels need GPU memory (a CUDA torch tensor, a CuPy array, or cuforge.Pointer)"
    )


def _unknown_pointer(param: Param, obj):
    raise ArgumentError(
        f"{param.label}: cannot pass a {type(obj).__name__} as a pointer; pass a CUDA torch "
        "tensor, a CuPy array, an object with __cuda_array_interface__ or __dlpack__, or "
        "cuforge.Pointer(address)"
    )


_POINTER_HANDLERS: dict[type, object] = {Pointer: _pointer_pointer, type(None): _none_pointer}


def _classify_pointer(t: type):
    torch = sys.modules.get("torch")
    if torch is not None and issubclass(t, torch.Tensor):
        return _torch_pointer
    cupy = sys.modules.get("cupy")
    if cupy is not None and issubclass(t, cupy.ndarray):
        return _cupy_pointer
    if issubclass(t, Pointer):
        return _pointer_pointer
    if issubclass(t, bool) or issubclass(t, int):
        return _int_pointer
    if hasattr(t, "__cuda_array_interface__"):
        return _cai_pointer
    if hasattr(t, "__array_interface__"):  # numpy and friends: host memory by definition
        return _host_pointer
    if hasattr(t, "__dlpack__"):
        return _dlpack_pointer
    if hasattr(t, "__array__"):
        return _host_pointer
    return None


def convert_pointer(param: Param, arg) -> tuple[int, int, str | None]:
    """(address, device or -1, "torch" / "cupy" / None) for a pointer parameter."""
    t = type(arg)
    handler = _POINTER_HANDLERS.get(t)
    if handler is None:
        handler = _classify_pointer(t)
        if handler is None:
            # instance attributes (a __cuda_array_interface__ set on the object)
            if hasattr(arg, "__cuda_array_interface__"):
                return _cai_pointer(param, arg)
            return _unknown_pointer(param, arg)
        _POINTER_HANDLERS[t] = handler
    return handler(param, arg)


# -- scalars -----------------------------------------------------------------------------

_INT_RANGES = {
    "b": (-(1 << 7), (1 << 7) - 1),
    "B": (0, (1 << 8) - 1),
    "h": (-(1 << 15), (1 << 15) - 1),
    "H": (0, (1 << 16) - 1),
    "i": (-(1 << 31), (1 << 31) - 1),
    "I": (0, (1 << 32) - 1),
    "q": (-(1 << 63), (1 << 63) - 1),
    "Q": (0, (1 << 64) - 1),
}
_FLOAT_MAX = {"f": 3.4028234663852886e38, "e": 65504.0, "bf16": 3.3895313892515355e38}
_F32 = struct.Struct("<f")
_U32 = struct.Struct("<I")


def _reject_tensor(param: Param, arg) -> None:
    mod = type(arg).__module__ or ""
    if mod.startswith(("torch", "cupy")) and getattr(arg, "ndim", None) is not None:
        raise ArgumentError(
            f"{param.label}: got a {type(arg).__name__}; a scalar parameter takes a Python or "
            "NumPy number (use .item() for a one-element tensor)"
        )


def float_to_bf16_bits(value: float) -> int:
    """Round-to-nearest-even float32 -> bfloat16 bits."""
    bits = _U32.unpack(_F32.pack(value))[0]
    if (bits & 0x7F800000) == 0x7F800000 and bits & 0x7FFFFF:
        return 0x7FC0  # NaN
    bits += 0x7FFF + ((bits >> 16) & 1)
    return (bits >> 16) & 0xFFFF


def convert_scalar(param: Param, arg):
    """A Python value struct can pack for ``param``'s C type, range-checked."""
    code = param.code
    _reject_tensor(param, arg)
    if code == "?":
        if isinstance(arg, bool) or type(arg).__name__ in ("bool_", "bool"):
            return bool(arg)
        try:
            value = _index(arg)
        except TypeError:
            raise ArgumentError(
                f"{param.label} expects a bool, got {type(arg).__name__} {arg!r}"
            ) from None
        if value not in (0, 1):
            raise ArgumentValueError(f"{param.label} expects a bool, got {value}")
        return bool(value)
    if code in _INT_RANGES:
        try:
            value = _index(arg)
        except TypeError:
            raise ArgumentError(
                f"{param.label} expects an integer, got {type(arg).__name__} {arg!r}"
            ) from None
        lo, hi = _INT_RANGES[code]
        if not lo <= value <= hi:
            raise ArgumentValueError(
                f"{param.label}: {value} does not fit in {param.base} (range {lo}..{hi})"
            )
        return value
    # floating point
    if isinstance(arg, (str, bytes, bytearray)):
        raise ArgumentError(f"{param.label} expects a number, got {type(arg).__name__} {arg!r}")
    try:
        value = float(arg)
    except (TypeError, ValueError):
        raise ArgumentError(
            f"{param.label} expects a number, got {type(arg).__name__} {arg!r}"
        ) from None
    limit = _FLOAT_MAX.get(code)
    if limit is not None and abs(value) > limit and value == value and abs(value) != float("inf"):
        raise ArgumentValueError(f"{param.label}: {value!r} overflows {param.base} (max {limit:g})")
    if code == "bf16":
        return float_to_bf16_bits(value)
    return value


def _index(arg) -> int:
    if isinstance(arg, float):
        raise TypeError

    return operator.index(arg)


_VECTOR_TYPES = {}
for _base, _fmt in (
    ("char", "b"),
    ("uchar", "B"),
    ("short", "h"),
    ("ushort", "H"),
    ("int", "i"),
    ("uint", "I"),
    ("long", "q"),
    ("ulong", "Q"),
    ("longlong", "q"),
    ("ulonglong", "Q"),
    ("float", "f"),
    ("double", "d"),
):
    for _n in (1, 2, 3, 4):
        _VECTOR_TYPES[f"{_base}{_n}"] = "<" + _fmt * _n
del _base, _fmt, _n


def convert_struct(param: Param, arg) -> bytes:
    """Bytes of a by-value struct argument, checked against the parameter's size."""
    if isinstance(arg, (tuple, list)) and param.base in _VECTOR_TYPES:
        fmt = _VECTOR_TYPES[param.base]
        try:
            data = struct.pack(fmt, *arg)
        except struct.error as exc:
            raise ArgumentError(
                f"{param.label}: cannot pack {arg!r} as {param.base}: {exc}"
            ) from None
    elif isinstance(arg, (bytes, bytearray, memoryview)):
        data = bytes(memoryview(arg).cast("B")) if isinstance(arg, memoryview) else bytes(arg)
    elif hasattr(arg, "tobytes") and type(arg).__module__.startswith("numpy"):
        if (
            getattr(arg, "dtype", None) is not None
            and getattr(arg.dtype, "names", None) is None
            and param.base not in _VECTOR_TYPES
        ):
            raise ArgumentError(
                f"{param.label} takes the struct {param.base!r} by value: got a numpy "
                f"{arg.dtype} value; pass a numpy structured scalar, bytes or a ctypes.Structure"
            )
        data = arg.tobytes()
    else:
        try:
            data = bytes(memoryview(arg).cast("B"))
        except TypeError:
            raise ArgumentError(
                f"{param.label} takes the struct {param.base!r} by value: pass bytes, a numpy "
                f"structured scalar or a ctypes.Structure of {param.size or 'its'} bytes, not "
                f"{type(arg).__name__}"
            ) from None
    if param.size is not None and len(data) != param.size:
        raise ArgumentValueError(
            f"{param.label}: got {len(data)} bytes for a struct of {param.size} bytes"
        )
    return data


def convert_raw(param: Param, arg):
    """An argument for a parameter whose type could not be read from the source: packed by
    the argument's own kind and the size the driver reports."""
    size = param.size
    if isinstance(arg, (bytes, bytearray, memoryview)) or (
        hasattr(arg, "tobytes") and getattr(getattr(arg, "dtype", None), "names", None)
    ):
        return "s", convert_struct(param, arg)
    if isinstance(arg, bool):
        return "s", bytes([int(arg)]) + bytes(max(0, (size or 1) - 1))
    if isinstance(arg, float) or type(arg).__name__.startswith("float"):
        if size == 4:
            return "s", struct.pack("<f", float(arg))
        if size == 8:
            return "s", struct.pack("<d", float(arg))
        if size == 2:
            return "s", struct.pack("<e", float(arg))
    if isinstance(arg, int) or type(arg).__name__.startswith(("int", "uint")):
        value = int(arg)
        try:
            return "s", value.to_bytes(size or 8, "little", signed=value < 0)
        except OverflowError:
            raise ArgumentValueError(
                f"{param.label}: {value} does not fit in {size} bytes"
            ) from None
    if size == 8:
        address, _, _ = convert_pointer(param, arg)
        return "s", address.to_bytes(8, "little")
    raise ArgumentError(
        f"{param.label}: cannot pass {type(arg).__name__} for a {size}-byte parameter"
    )


# -- layout ------------------------------------------------------------------------------


class Layout:
    """Where each argument sits in the kernel's argument buffer, and how to pack them.

    One buffer per kernel holds every argument at its natural alignment (the offsets
    ``cuFuncGetParamInfo`` reports, where known); a ``void*[n]`` array points at each slot.
    ``pack(buffer, values)`` writes all values with one precompiled ``struct.Struct``.
    """

    __slots__ = ("params", "offsets", "sizes", "size", "format", "struct")

    def __init__(self, params: list[Param], offsets: list[int] | None = None) -> None:
        self.params = params
        sizes: list[int] = []
        fmt_parts: list[str] = []
        offs: list[int] = []
        cursor = 0
        for i, p in enumerate(params):
            if p.kind in ("pointer",):
                size, ch, align = 8, "Q", 8
            elif p.kind == "scalar":
                ch, size = SCALAR_CODES[p.code]
                align = size
            else:  # struct or raw: bytes
                if p.size is None:
                    raise ValueError(f"{p.label}: size unknown")
                size, ch = p.size, f"{p.size}s"
                align = 16 if size % 16 == 0 else 8 if size % 8 == 0 else 4 if size % 4 == 0 else 1
            offset = offsets[i] if offsets is not None else (cursor + align - 1) // align * align
            if offset < cursor:
                raise ValueError(f"parameter offsets overlap at {p.label}")
            if offset > cursor:
                fmt_parts.append(f"{offset - cursor}x")
            fmt_parts.append(ch)
            offs.append(offset)
            sizes.append(size)
            cursor = offset + size
        self.offsets = offs
        self.sizes = sizes
        self.size = cursor
        self.format = "<" + "".join(fmt_parts)
        self.struct = struct.Struct(self.format)

    def new_buffers(self):
        """(argument buffer, void* array pointing into it, the array's address or None)."""
        buf = ctypes.create_string_buffer(max(self.size, 1))
        base = ctypes.addressof(buf)
        n = len(self.offsets)
        array = (ctypes.c_void_p * max(n, 1))(*[base + o for o in self.offsets])
        return buf, array, (ctypes.addressof(array) if n else None)

    def __repr__(self) -> str:
        return f"Layout({self.format!r}, size={self.size})"
