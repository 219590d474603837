"""Argument conversion, the packer layout, streams and launch-time errors, without a GPU."""

from __future__ import annotations

import ctypes
import struct

import pytest

import cuforge
from cuforge.frontend.program import Program
from cuforge.runtime import args as argmod
from cuforge.runtime.errors import (
    ArgumentCountError,
    ArgumentError,
    ArgumentValueError,
    KernelNotFoundError,
    LaunchError,
)
from cuforge.runtime.signature import Param, parse_param
from cuforge.runtime.streams import stream_handle
from cuforge.samples import sample_path


def _p(text: str) -> Param:
    return parse_param(0, text)


# -- scalars -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "decl,value,expected",
    [
        ("int n", 5, 5),
        ("int n", -(1 << 31), -(1 << 31)),
        ("unsigned n", (1 << 32) - 1, (1 << 32) - 1),
        ("int64_t n", -(1 << 63), -(1 << 63)),
        ("size_t n", (1 << 64) - 1, (1 << 64) - 1),
        ("char c", -128, -128),
        ("unsigned char c", 255, 255),
        ("short s", -32768, -32768),
        ("int n", True, 1),
        ("float a", 2, 2.0),
        ("float a", 1.5, 1.5),
        ("double a", 1e300, 1e300),
        ("__half h", 65504.0, 65504.0),
        ("float a", float("inf"), float("inf")),
        ("bool b", True, True),
        ("bool b", 0, False),
    ],
)
def test_scalar_conversion(decl, value, expected):
    assert argmod.convert_scalar(_p(decl), value) == expected


@pytest.mark.parametrize(
    "decl,value,error,match",
    [
        ("int n", 1 << 31, ArgumentValueError, "does not fit in int"),
        ("int n", -(1 << 31) - 1, ArgumentValueError, "does not fit"),
        ("unsigned n", -1, ArgumentValueError, "does not fit in unsigned"),
        ("unsigned char c", 256, ArgumentValueError, "range 0..255"),
        ("size_t n", 1 << 64, ArgumentValueError, "does not fit"),
        ("int n", 2.5, ArgumentError, "expects an integer, got float"),
        ("int n", "3", ArgumentError, "expects an integer"),
        ("float a", 1e39, ArgumentValueError, "overflows float"),
        ("__half h", 70000.0, ArgumentValueError, "overflows __half"),
        ("float a", "x", ArgumentError, "expects a number"),
        ("float a", None, ArgumentError, "expects a number"),
        ("bool b", 2, ArgumentValueError, "expects a bool"),
        ("bool b", 1.0, ArgumentError, "expects a bool"),
    ],
)
def test_scalar_errors(decl, value, error, match):
    with pytest.raises(error, match=match) as e:
        argmod.convert_scalar(_p(decl), value)
    assert "parameter" in str(e.value)
    assert isinstance(e.value, LaunchError)


def test_scalar_errors_are_builtin_exceptions_too():
    with pytest.raises(TypeError):
        argmod.convert_scalar(_p("int n"), 2.5)
    with pytest.raises(ValueError):
        argmod.convert_scalar(_p("int n"), 1 << 40)


def test_numpy_scalars():
    np = pytest.importorskip("numpy")
    assert argmod.convert_scalar(_p("int n"), np.int64(7)) == 7
    assert argmod.convert_scalar(_p("float a"), np.float16(0.5)) == 0.5
    assert argmod.convert_scalar(_p("bool b"), np.bool_(True)) is True
    with pytest.raises(ArgumentError):
        argmod.convert_scalar(_p("int n"), np.float32(1.0))
    with pytest.raises(ArgumentValueError):
        argmod.convert_scalar(_p("int n"), np.int64(1 << 40))


def test_bfloat16_bits():
    assert argmod.float_to_bf16_bits(1.0) == 0x3F80
    assert argmod.float_to_bf16_bits(-2.0) == 0xC000
    assert argmod.float_to_bf16_bits(3.140625) == 0x4049
    assert argmod.float_to_bf16_bits(float("nan")) == 0x7FC0
    assert argmod.convert_scalar(_p("__nv_bfloat16 b"), 1.0) == 0x3F80


# -- structs -------------------------------------------------------------------------------


def test_struct_arguments():
    p = Param(0, "p", "Params", "struct", "Params", None, 8)
    assert argmod.convert_struct(p, b"12345678") == b"12345678"
    assert argmod.convert_struct(p, bytearray(8)) == bytes(8)

    class S(ctypes.Structure):
        _fields_ = [("a", ctypes.c_int), ("b", ctypes.c_float)]

    assert argmod.convert_struct(p, S(1, 2.0)) == struct.pack("<if", 1, 2.0)
    with pytest.raises(ArgumentValueError, match="got 4 bytes for a struct of 8 bytes"):
        argmod.convert_struct(p, b"1234")
    with pytest.raises(ArgumentError, match="by value"):
        argmod.convert_struct(p, 3.0)
    v = Param(0, "v", "float2", "struct", "float2", None, 8)
    assert argmod.convert_struct(v, (1.0, 2.0)) == struct.pack("<ff", 1.0, 2.0)


def test_numpy_structured_scalar():
    np = pytest.importorskip("numpy")
    dt = np.dtype([("scale", "<f4"), ("shift", "<f4"), ("n", "<i4"), ("bias", "<f8")], align=True)
    value = np.array((1.5, 2.0, 3, 4.0), dtype=dt)[()]
    p = Param(0, "p", "Affine", "struct", "Affine", None, 24)
    packed = argmod.convert_struct(p, value)
    # numpy leaves padding bytes uninitialized: compare the fields, not the padding
    assert len(packed) == 24 and struct.unpack("<ffi4xd", packed) == (1.5, 2.0, 3, 4.0)
    with pytest.raises(ArgumentError, match="structured"):
        argmod.convert_struct(p, np.float64(1.0))


# -- pointers ------------------------------------------------------------------------------


def test_pointer_wrapper():
    p = cuforge.Pointer(0xDEAD0000, 4096)
    assert int(p) == 0xDEAD0000 and p.nbytes == 4096
    assert repr(p) == "Pointer(0xdead0000, nbytes=4096)"
    assert p == cuforge.Pointer(0xDEAD0000)
    with pytest.raises(ValueError):
        cuforge.Pointer(-1)
    with pytest.raises(TypeError):
        cuforge.Pointer("0x10")
    param = _p("float* y")
    assert argmod.convert_pointer(param, p) == (0xDEAD0000, -1, None)
    assert argmod.convert_pointer(param, None) == (0, -1, None)


def test_pointer_refusals_without_gpu():
    param = _p("float* y")
    with pytest.raises(ArgumentError, match=r"'y'.*plain int.*cuforge.Pointer"):
        argmod.convert_pointer(param, 1234)
    with pytest.raises(ArgumentError, match="cannot pass a str as a pointer"):
        argmod.convert_pointer(param, "abc")
    np = pytest.importorskip("numpy")
    with pytest.raises(ArgumentError, match="host memory"):
        argmod.convert_pointer(param, np.zeros(4, np.float32))


def test_torch_cpu_tensor_refused():
    torch = pytest.importorskip("torch")
    param = _p("float* y")
    with pytest.raises(ArgumentError, match="'y'.*cpu.*cuda"):
        argmod.convert_pointer(param, torch.zeros(4))


def test_dlpack_cpu_refused():
    np = pytest.importorskip("numpy")
    if not hasattr(np.zeros(1), "__dlpack__"):
        pytest.skip("numpy without DLPack")

    class Wrapper:
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, **kw):
            return self.a.__dlpack__()

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    with pytest.raises(ArgumentError, match="the CPU"):
        argmod.convert_pointer(_p("float* y"), Wrapper(np.zeros(4, np.float32)))


# -- layout --------------------------------------------------------------------------------


def test_layout_natural_alignment_and_buffers():
    params = [
        _p("float* y"),
        _p("char c"),
        _p("double d"),
        _p("short s"),
        _p("int n"),
        Param(5, "p", "S", "struct", "S", None, 12),
        _p("__half h"),
    ]
    layout = argmod.Layout(params)
    assert layout.offsets == [0, 8, 16, 24, 28, 32, 44]
    assert layout.format == "<Qb7xdh2xi12se"
    assert layout.size == 46
    buf, array, address = layout.new_buffers()
    base = ctypes.addressof(buf)
    assert [array[i] for i in range(len(params))] == [base + o for o in layout.offsets]
    assert address == ctypes.addressof(array)
    layout.struct.pack_into(buf, 0, 0x1000, -1, 2.5, 7, 9, b"x" * 12, 1.0)
    raw = bytes(buf.raw[: layout.size])
    assert struct.unpack_from("<Q", raw, 0)[0] == 0x1000
    assert struct.unpack_from("<d", raw, 16)[0] == 2.5
    assert struct.unpack_from("<i", raw, 28)[0] == 9
    assert raw[32:44] == b"x" * 12


def test_layout_with_driver_offsets():
    layout = argmod.Layout([_p("int a"), _p("float* p")], offsets=[0, 16])
    assert layout.format == "<i12xQ" and layout.size == 24
    with pytest.raises(ValueError):
        argmod.Layout([_p("double a"), _p("int b")], offsets=[0, 4])


# -- streams -------------------------------------------------------------------------------


def test_stream_handles():
    class TorchLike:
        cuda_stream = 0x1234

    class CoreLike:
        def __cuda_stream__(self):
            return (0, 0x5678)

    class CupyLike:
        ptr = 0x9ABC

    assert stream_handle(0) == 0
    assert stream_handle(0xABC) == 0xABC
    assert stream_handle(TorchLike()) == 0x1234
    assert stream_handle(CoreLike()) == 0x5678
    assert stream_handle(CupyLike()) == 0x9ABC
    with pytest.raises(ArgumentError, match="stream="):
        stream_handle("default")
    with pytest.raises(ArgumentError):
        stream_handle(-1)


# -- Kernel without a GPU --------------------------------------------------------------------


def _program(name: str, lowered=None, source=None) -> Program:
    src = source if source is not None else open(sample_path(name)).read()
    return Program(
        binary=b"\0" * 16,
        output="cubin",
        arch="sm_90",
        lowered_names=lowered or {},
        name_expressions=tuple(lowered or ()),
        source=src,
        name=name,
        key=None,
    )


def test_kernel_names_and_missing_kernel():
    prog = _program("saxpy.cu")
    k = prog.kernel("saxpy")
    assert k.symbol == "saxpy"
    assert k.signature == "saxpy(float* y, const float* x, float a, int n)"
    assert k.layout.format == "<QQfi"
    assert prog.kernel("saxpy") is k
    with pytest.raises(
        KernelNotFoundError, match="no kernel 'saxpi' in saxpy.cu; kernels there: saxpy, saxpy_half"
    ) as e:
        prog.kernel("saxpi")
    assert isinstance(e.value, LookupError)


def test_template_kernel_names():
    mangled = "_Z9block_sumILi256EfEvPKT0_PS0_i"
    prog = _program("block_reduce.cu", {"block_sum<256, float>": mangled})
    k = prog.kernel("block_sum<256, float>")
    assert k.symbol == mangled
    assert k.signature == "block_sum<256, float>(const float* in, float* out, int n)"
    assert prog.kernel("block_sum<256,float>").symbol == mangled
    assert prog.kernel(mangled).signature.endswith("(const float* in, float* out, int n)")
    with pytest.raises(
        KernelNotFoundError, match=r"template.*name_expressions=\('block_sum<...>',\)"
    ):
        prog.kernel("block_sum")
    with pytest.raises(KernelNotFoundError, match="block_sum<256, float>"):
        prog.kernel("block_sum<128, float>")
    with pytest.raises(
        KernelNotFoundError, match="kernels there: block_sum<BLOCK, T>, block_sum<256, float>"
    ):
        prog.kernel("nothing")


def test_argument_count_checked_before_any_driver_call():
    k = _program("saxpy.cu").kernel("saxpy")
    with pytest.raises(ArgumentCountError, match="takes 4 arguments, got 2") as e:
        k[1, 32](1, 2)
    assert isinstance(e.value, TypeError)
    with pytest.raises(ArgumentCountError):
        k(grid=1, block=32, args=(1, 2, 3, 4, 5))


def test_launch_configuration_errors():
    k = _program("saxpy.cu").kernel("saxpy")
    with pytest.raises(ArgumentValueError, match="1024"):
        k[1, (32, 64)]
    with pytest.raises(ArgumentValueError, match=">= 1"):
        k[0, 32]
    with pytest.raises(ArgumentError, match="ints"):
        k[1.5, 32]
    with pytest.raises(ArgumentValueError, match="1 to 3"):
        k[(1, 1, 1, 1), 32]
    with pytest.raises(ArgumentError, match=r"k\[grid, block\]"):
        k[1]
    with pytest.raises(ArgumentValueError, match="shared_mem"):
        k[1, 32, -1]
    # configurations are cached
    assert k[4, 256] is k[4, 256]
    assert k[[4], [256]] is not None  # unhashable: built, not cached


def test_arrays_on_two_devices_are_refused(monkeypatch):
    class OnDevice:
        def __init__(self, device):
            self.device = device

    monkeypatch.setitem(
        argmod._POINTER_HANDLERS,
        OnDevice,
        lambda param, a: (0x1000 * (a.device + 1), a.device, "torch"),
    )
    k = _program("saxpy.cu").kernel("saxpy")
    device, framework, values = k._convert(k.params, (OnDevice(0), OnDevice(0), 1.0, 4))
    assert (device, framework, values) == (0, "torch", [0x1000, 0x1000, 1.0, 4])
    with pytest.raises(ArgumentValueError, match=r"parameter 'x'.*cuda:1.*cuda:0"):
        k._convert(k.params, (OnDevice(0), OnDevice(1), 1.0, 4))
