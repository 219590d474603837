"""cuforge.jit on a GPU: a launch per dtype checked against torch, the per-call lookup
(nothing recompiled, dtypes switching call to call), executors, streams."""

from __future__ import annotations

import pytest

import cuforge
from cuforge.core.pipeline import counters
from cuforge.frontend.jitkernel import SpecializationError

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

SRC = r"""
template <typename T, int BLOCK>
__global__ void reverse(const T* x, T* out, int n) {
    int i = blockIdx.x * BLOCK + threadIdx.x;
    if (i < n) out[i] = x[n - 1 - i];
}

template <typename T, int BLOCK>
__global__ void axpb(const T* x, const T* y, T* out, T a, int n) {
    int i = blockIdx.x * BLOCK + threadIdx.x;
    if (i < n) out[i] = (T)(a * x[i] + y[i]);
}
"""

ALL = [
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.int16,
    torch.int32, torch.int64, torch.uint8, torch.bool,
] + [getattr(torch, n) for n in ("uint16", "uint32", "uint64") if hasattr(torch, n)]  # fmt: skip
ARITH = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int16, torch.int32,
         torch.int64]  # fmt: skip


def _values(dtype, n, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    if dtype == torch.bool:
        return (torch.rand(n, generator=g) > 0.5).cuda()
    if dtype.is_floating_point:
        return torch.randn(n, generator=g).to(dtype).cuda()
    hi = 100 if dtype != torch.uint8 else 200
    return torch.randint(0, hi, (n,), generator=g).to(dtype).cuda()


@pytest.mark.parametrize("dtype", ALL, ids=str)
def test_reverse_every_dtype_matches_torch(dtype):
    k = cuforge.jit(SRC, "reverse")
    n = 1000
    x = _values(dtype, n, 0)
    out = torch.zeros_like(x)
    k[(n + 127) // 128, 128](x, out, n, BLOCK=128)
    torch.cuda.synchronize()
    if dtype in (torch.float16, torch.bfloat16) or dtype.itemsize == 1 or dtype.is_signed:
        assert torch.equal(out.cpu(), x.cpu().flip(0))
    else:  # torch has no flip (nor much else) for uint16 / uint32 / uint64: compare in NumPy
        assert (out.cpu().numpy() == x.cpu().numpy()[::-1]).all()


@pytest.mark.parametrize("dtype", ARITH, ids=str)
def test_axpb_every_arithmetic_dtype_matches_torch(dtype):
    k = cuforge.jit(SRC, "axpb")
    n = 4097
    x, y = _values(dtype, n, 1), _values(dtype, n, 2)
    out = torch.empty_like(x)
    a = 3 if not dtype.is_floating_point else 0.5
    k[(n + 255) // 256, 256](x, y, out, a, n, BLOCK=256)
    torch.cuda.synchronize()
    if dtype.is_floating_point:
        ref = (a * x.double() + y.double()).to(dtype)
        tol = {torch.float16: 2e-3, torch.bfloat16: 2e-2}.get(dtype, 1e-6)
        assert torch.allclose(out.double(), ref.double(), rtol=tol, atol=tol)
    else:
        assert torch.equal(out, (a * x + y).to(dtype))


def test_repeat_calls_do_not_recompile_and_dtypes_switch_per_call():
    k = cuforge.jit(SRC, "reverse")
    launch = k[8, 128]
    xs = {dt: _values(dt, 1000, 3) for dt in (torch.float32, torch.float16, torch.int32)}
    for _ in range(3):
        for x in xs.values():
            out = torch.zeros_like(x)
            launch(x, out, 1000, BLOCK=128)
            torch.cuda.synchronize()
            assert torch.equal(out, x.flip(0))
    assert counters["compiles"] <= 3  # one per dtype at most (the cache may already hold them)
    assert len(k.specializations) == 3
    assert len(launch.table) == 3


def test_executor_and_specialize_launch_without_lookup():
    k = cuforge.jit(SRC, "axpb")
    x = torch.randn(512, device="cuda")
    y = torch.randn(512, device="cuda")
    out = torch.empty_like(x)
    exe = k.compile(x, y, out, 2.0, 512, BLOCK=128)
    assert isinstance(exe, cuforge.Kernel)
    assert exe is k.specialize(T="float", BLOCK=128)
    exe[4, 128](x, y, out, 2.0, 512)
    torch.cuda.synchronize()
    assert torch.allclose(out, 2.0 * x + y)
    assert exe.program.source_of_result in ("compiled", "memory", "disk")
    assert exe.program.key


def test_stream_and_shared_memory_configuration():
    k = cuforge.jit(SRC, "reverse")
    s = torch.cuda.Stream()
    x = torch.arange(256, device="cuda", dtype=torch.float32)
    out = torch.zeros_like(x)
    with torch.cuda.stream(s):
        k[2, 128, 0, s](x, out, 256, BLOCK=128)
    s.synchronize()
    assert torch.equal(out, x.flip(0))


def test_conflict_on_the_gpu_path_raises_before_launch():
    k = cuforge.jit(SRC, "reverse")
    x = torch.zeros(4, device="cuda")
    with pytest.raises(SpecializationError, match="T is bound"):
        k[1, 32](x, x.half(), 4, BLOCK=32)
