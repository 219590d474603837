"""Kernel launches on a real GPU: correctness against torch, every argument kind, every
error path, streams, shared memory, cooperative and cluster launches, and a warm start."""

from __future__ import annotations

import ctypes
import json
import os
import struct
import subprocess
import sys
import textwrap
import threading

import pytest

import cuforge
from cuforge.runtime.errors import (
    ArgumentCountError,
    ArgumentError,
    ArgumentValueError,
    KernelNotFoundError,
    LaunchError,
)
from cuforge.samples import sample_path

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")


def _program(name: str, **kw):
    return cuforge.compile_file(sample_path(name), **kw)


@pytest.fixture(scope="module")
def saxpy_prog():
    return _program("saxpy.cu")


def _rel(out, ref) -> float:
    out = out.double()
    ref = ref.double()
    assert not torch.isnan(out).any(), "NaN in output (an unwritten element?)"
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


# -- correctness ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype,name,tol", [(torch.float32, "saxpy", 1e-6), (torch.float16, "saxpy_half", 2e-3)]
)
def test_saxpy(saxpy_prog, dtype, name, tol):
    k = saxpy_prog.kernel(name)
    for n in (1, 1000, 1 << 20 | 7):
        x = torch.randn(n, device="cuda", dtype=dtype)
        y = torch.randn(n + 64, device="cuda", dtype=dtype)
        y[n:] = float("nan")  # poison past the end: must stay untouched
        a = float(torch.randn(()).item())
        ref = a * x.double() + y[:n].double()
        k[(n + 255) // 256, 256](y, x, a, n)
        torch.cuda.synchronize()
        assert _rel(y[:n], ref) < tol
        assert torch.isnan(y[n:]).all()


def test_block_reduce_template_name_expression():
    prog = _program("block_reduce.cu", name_expressions=("block_sum<256, float>",))
    k = prog.kernel("block_sum<256, float>")
    assert [p.type for p in k.params] == ["const float*", "float*", "int"]
    n = 256 * 37 + 11
    blocks = (n + 255) // 256
    x = torch.randn(n, device="cuda")
    out = torch.full((blocks,), float("nan"), device="cuda")
    k[blocks, 256](x, out, n)
    ref = torch.nn.functional.pad(x.double(), (0, blocks * 256 - n)).view(blocks, 256).sum(1)
    torch.cuda.synchronize()
    assert _rel(out, ref) < 1e-5
    # the mangled symbol works too
    k2 = prog.kernel(prog.lowered_names["block_sum<256, float>"])
    out.fill_(float("nan"))
    k2[blocks, 256](x, out, n)
    torch.cuda.synchronize()
    assert _rel(out, ref) < 1e-5


def test_tiled_matmul():
    prog = _program("matmul.cu", defines={"SAMPLE_TILE": 16})
    k = prog.kernel("matmul")
    M, N, K = 129, 77, 95
    A = torch.randn(M, K, device="cuda")
    B = torch.randn(K, N, device="cuda")
    C = torch.full((M, N), float("nan"), device="cuda")
    k(grid=((N + 15) // 16, (M + 15) // 16), block=(16, 16), args=(A, B, C, M, N, K))
    torch.cuda.synchronize()
    assert _rel(C, A.double() @ B.double()) < 1e-5


def _affine_numpy(scale, shift, n, bias):
    np = pytest.importorskip("numpy")
    dt = np.dtype([("scale", "<f4"), ("shift", "<f4"), ("n", "<i4"), ("bias", "<f8")], align=True)
    assert dt.itemsize == 24
    return np.array((scale, shift, n, bias), dtype=dt)[()]


class _Affine(ctypes.Structure):
    _fields_ = [
        ("scale", ctypes.c_float),
        ("shift", ctypes.c_float),
        ("n", ctypes.c_int),
        ("bias", ctypes.c_double),
    ]


@pytest.mark.parametrize("form", ["numpy", "bytes", "ctypes"])
def test_struct_argument(form):
    k = _program("struct_arg.cu").kernel("affine")
    assert k.params[2].kind == "struct"
    n = 5000
    x = torch.randn(n + 10, device="cuda")
    out = torch.full((n + 10,), float("nan"), device="cuda")
    scale, shift, bias = 1.5, -0.25, 0.125
    if form == "numpy":
        p = _affine_numpy(scale, shift, n, bias)
    elif form == "bytes":
        p = struct.pack("<ffi4xd", scale, shift, n, bias)
    else:
        p = _Affine(scale, shift, n, bias)
    k[(n + 255) // 256, 256](out, x, p)
    torch.cuda.synchronize()
    assert _rel(out[:n], x[:n].double() * scale + shift + bias) < 1e-6
    assert torch.isnan(out[n:]).all()
    with pytest.raises(ArgumentValueError, match="24 bytes"):
        k[1, 32](out, x, b"\0" * 16)
    with pytest.raises(ArgumentError, match="struct"):
        k[1, 32](out, x, 3.0)


# -- every argument kind ------------------------------------------------------------------


class _CAI:
    def __init__(self, t):
        self._t = t
        self.__cuda_array_interface__ = t.__cuda_array_interface__


class _DLPack:
    def __init__(self, t):
        self._t = t

    def __dlpack__(self, stream=None, **kw):
        return self._t.__dlpack__()

    def __dlpack_device__(self):
        return self._t.__dlpack_device__()


def _pointer_forms(t):
    forms = {
        "torch": t,
        "cai": _CAI(t),
        "dlpack": _DLPack(t),
        "Pointer": cuforge.Pointer(t.data_ptr(), t.numel() * t.element_size()),
    }
    try:
        import cupy

        forms["cupy"] = cupy.asarray(t)
    except ImportError:
        pass
    return forms


@pytest.mark.parametrize("kind", ["torch", "cai", "dlpack", "Pointer", "cupy"])
def test_pointer_argument_kinds(saxpy_prog, kind):
    k = saxpy_prog.kernel("saxpy")
    n = 4099
    x = torch.randn(n, device="cuda")
    y = torch.randn(n, device="cuda")
    ref = 3.0 * x.double() + y.double()
    xf, yf = _pointer_forms(x), _pointer_forms(y)
    if kind not in xf:
        pytest.skip("CuPy not installed")
    torch.cuda.synchronize()
    k[(n + 255) // 256, 256](yf[kind], xf[kind], 3.0, n)
    torch.cuda.synchronize()
    if kind == "cupy":
        import cupy

        cupy.cuda.get_current_stream().synchronize()
    assert _rel(y, ref) < 1e-6


def test_none_is_a_null_pointer_and_pointer_repr():
    p = cuforge.Pointer(0x1000, 64)
    assert "0x1000" in repr(p) and int(p) == 0x1000


SCALARS_SRC = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
extern "C" __global__ void scalars(double* out, int a, unsigned b, long long c, unsigned long long d,
                                   float e, double f, __half g, bool h, char i, short j,
                                   __nv_bfloat16 k, size_t l, unsigned char m) {
    out[0] = a; out[1] = b; out[2] = (double)c; out[3] = (double)d; out[4] = e; out[5] = f;
    out[6] = __half2float(g); out[7] = h ? 1.0 : 0.0; out[8] = i; out[9] = j;
    out[10] = __bfloat162float(k); out[11] = (double)l; out[12] = m;
}
"""


def test_every_scalar_type():
    np = pytest.importorskip("numpy")
    k = cuforge.compile(SCALARS_SRC, name="scalars.cu").kernel("scalars")
    out = torch.full((13,), float("nan"), device="cuda", dtype=torch.float64)
    vals = (
        -7,
        4000000000,
        -(1 << 40),
        (1 << 53),
        1.5,
        -2.25,
        0.5,
        True,
        -3,
        -1234,
        2.5,
        1 << 33,
        255,
    )
    k[1, 1](out, *vals)
    torch.cuda.synchronize()
    assert out.tolist() == [float(v) for v in vals]
    # numpy scalars convert too
    nvals = (
        np.int32(-7),
        np.uint32(5),
        np.int64(-9),
        np.uint64(11),
        np.float32(1.5),
        np.float64(2.0),
        np.float16(0.25),
        np.bool_(False),
        np.int8(4),
        np.int16(-5),
        np.float32(-1.0),
        np.uint64(3),
        np.uint8(9),
    )
    out.fill_(float("nan"))
    k[1, 1](out, *nvals)
    torch.cuda.synchronize()
    assert out.tolist() == [float(v) for v in nvals]


# -- error paths ---------------------------------------------------------------------------


def test_pointer_errors_name_the_parameter(saxpy_prog):
    k = saxpy_prog.kernel("saxpy")
    y = torch.zeros(64, device="cuda")
    with pytest.raises(ArgumentError, match="'x'.*cpu") as e:
        k[1, 64](y, torch.zeros(64), 1.0, 64)
    assert isinstance(e.value, TypeError) and isinstance(e.value, LaunchError)
    with pytest.raises(ArgumentError, match="'y'.*float16.*'float'"):
        k[1, 64](torch.zeros(64, device="cuda", dtype=torch.float16), y, 1.0, 64)
    with pytest.raises(ArgumentValueError, match="'x'.*not contiguous"):
        k[1, 64](y, torch.zeros(64, 2, device="cuda")[:, 0], 1.0, 64)
    with pytest.raises(ArgumentError, match="cuforge.Pointer"):
        k[1, 64](y, y.data_ptr(), 1.0, 64)
    with pytest.raises(ArgumentError, match="host memory"):
        import numpy as np

        k[1, 64](y, np.zeros(64, np.float32), 1.0, 64)
    with pytest.raises(ArgumentError, match="the CPU"):
        k[1, 64](y, _DLPack(torch.zeros(64)), 1.0, 64)
    with pytest.raises(ArgumentError, match="float16"):
        k[1, 64](y, _CAI(torch.zeros(64, device="cuda", dtype=torch.float16)), 1.0, 64)


def test_scalar_and_count_errors(saxpy_prog):
    k = saxpy_prog.kernel("saxpy")
    y = torch.zeros(64, device="cuda")
    with pytest.raises(ArgumentValueError, match="'n'.*does not fit in int"):
        k[1, 64](y, y, 1.0, 1 << 31)
    with pytest.raises(ArgumentError, match="'n'.*integer"):
        k[1, 64](y, y, 1.0, 64.0)
    with pytest.raises(ArgumentValueError, match="'a'.*overflows float"):
        k[1, 64](y, y, 1e39, 64)
    with pytest.raises(ArgumentError, match="'a'.*number"):
        k[1, 64](y, y, "2", 64)
    with pytest.raises(ArgumentCountError, match="takes 4 arguments, got 3"):
        k[1, 64](y, y, 1.0)
    with pytest.raises(ArgumentError, match="scalar parameter"):
        k[1, 64](y, y, torch.tensor(1.0, device="cuda"), 64)
    with pytest.raises(ArgumentValueError, match="1024"):
        k[1, 2048](y, y, 1.0, 64)


def test_tensor_on_another_device(saxpy_prog):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    k = saxpy_prog.kernel("saxpy")
    with pytest.raises(ArgumentValueError, match="cuda:1"):
        k[1, 64](torch.zeros(64, device="cuda:0"), torch.zeros(64, device="cuda:1"), 1.0, 64)
    # and a launch on device 1 loads the kernel there
    y = torch.ones(64, device="cuda:1")
    k[1, 64](y, y, 1.0, 64)
    torch.cuda.synchronize(1)
    assert y.eq(2).all()


def test_missing_kernel_lists_names(saxpy_prog):
    with pytest.raises(KernelNotFoundError, match="saxpy, saxpy_half"):
        saxpy_prog.kernel("saxpi")
    prog = _program("block_reduce.cu", name_expressions=("block_sum<256, float>",))
    with pytest.raises(KernelNotFoundError, match="template"):
        prog.kernel("block_sum")
    with pytest.raises(KernelNotFoundError, match="_Z_nope"):
        prog.kernel("_Z_nope")[1, 1]()


def test_cxx_kernel_by_plain_name():
    src = "__global__ void twice(float* y, int n) { int i = threadIdx.x; if (i < n) y[i] *= 2; }"
    k = cuforge.compile(src, name="cxx.cu").kernel("twice")
    y = torch.randn(32, device="cuda")
    ref = y * 2
    k[1, 32](y, 32)
    torch.cuda.synchronize()
    assert torch.equal(y, ref)
    assert k.symbol.startswith("_Z5twice")


# -- streams -------------------------------------------------------------------------------


def test_side_stream_ordering(saxpy_prog):
    k = saxpy_prog.kernel("saxpy")
    n = 1 << 22
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        x = torch.randn(n, device="cuda")
        y = torch.randn(n, device="cuda")
        ref = 2.0 * x.double() + y.double()
        for _ in range(3):
            y.mul_(1.0)  # queue work ahead of the kernel on the side stream
        k[(n + 255) // 256, 256](y, x, 2.0, n)  # default: torch's current stream = side
        z = y * 2  # reads the kernel's output on the same stream
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    assert _rel(y, ref) < 1e-6
    assert _rel(z, 2 * ref) < 1e-6


@pytest.mark.parametrize("use_ex", [True, False], ids=["cuLaunchKernelEx", "cuLaunchKernel"])
def test_c_launcher_entry_points(saxpy_prog, use_ex):
    """The C launcher goes through cuLaunchKernelEx (a CUlaunchConfig pre-built per launcher)
    where the driver has it, else cuLaunchKernel: both land the same results, on torch's
    current stream, on an explicit stream, bound or not."""
    from cuforge.runtime import driver as drv_mod
    from cuforge.runtime import fastpath
    from cuforge.runtime.kernel import Kernel

    fastpath.use_launch_ex = use_ex
    try:
        k = Kernel(saxpy_prog, "saxpy")
        n = 5000
        x = torch.randn(n, device="cuda")
        y = torch.randn(n, device="cuda")
        ref = y.double()
        k[(n + 255) // 256, 256](y, x, 1.0, n)
        ref = ref + x.double()
    finally:
        fastpath.use_launch_ex = True
    if k._state is None:
        pytest.skip("no C launcher here")
    has_ex = drv_mod.driver().launch_ex is not None
    want = "cuLaunchKernelEx" if use_ex and has_ex else "cuLaunchKernel"
    assert k._state.launch_entry() == want
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            y.mul_(1.0)  # queued ahead of the kernel on the side stream
        f = k[(n + 255) // 256, 256]
        f(y, x, 2.0, n)  # torch's current stream: side
        ref = ref + 2.0 * x.double()
    torch.cuda.current_stream().wait_stream(side)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    k[(n + 255) // 256, 256, 0, s](y, x, -0.5, n)
    ref = ref - 0.5 * x.double()
    torch.cuda.synchronize()
    assert _rel(y, ref) < 1e-6


def test_torch_tensors_through_torchs_c_shim(saxpy_prog):
    """The C launcher reads CUDA tensors and torch's stream through torch's C shim (issue
    25): what it reads equals the methods, offset views land at their own address, and
    what it must not take (a strided view, a wrong dtype) still gets the named error."""
    from cuforge.runtime import fastlaunch, fastpath

    k = saxpy_prog.kernel("saxpy")
    y = torch.zeros(1024, device="cuda")
    x = torch.ones(1024, device="cuda")
    k[4, 256](y, x, 1.0, 1024)
    module = fastlaunch.load()
    if k._state is None or module is None:
        pytest.skip(f"the C launcher is not in use here: {fastlaunch.status()}")
    abi = fastpath.torch_abi(module, torch)
    assert abi is not None, fastpath._abi.get("why")
    offset, fns, cuda, dtype_code = abi
    dev = x.get_device()
    for t in (x, x[3:], y.view(32, 32).t()):
        assert module.torch_abi_probe(offset, fns, t) == (
            dtype_code(torch.float32),
            cuda,
            dev,
            t.is_contiguous(),
            t.data_ptr(),
        )
    assert fastpath._abi.get("stream"), "aoti_torch_get_current_cuda_stream not found"
    y2 = torch.zeros(1030, device="cuda")
    k[4, 256](y2[6:], x, 2.0, 1024)  # an offset view: written at its own address
    torch.cuda.synchronize()
    assert y2[:6].eq(0).all() and y2[6:].eq(2).all()
    with pytest.raises(ArgumentValueError, match="not contiguous"):
        k[4, 256](y.view(32, 32).t(), x, 1.0, 1024)
    with pytest.raises(ArgumentError):
        k[4, 256](y.half(), x, 1.0, 1024)


def test_graph_capture_uses_torch_stream(saxpy_prog):
    """A launch inside torch.cuda.graph capture must go to the capturing stream."""
    k = saxpy_prog.kernel("saxpy")
    n = 4096
    x = torch.randn(n, device="cuda")
    y = torch.zeros(n, device="cuda")
    k[(n + 255) // 256, 256](y, x, 1.0, n)  # warm: loaded before capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        k[(n + 255) // 256, 256](y, x, 1.0, n)
    y.zero_()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    assert _rel(y, 3 * x.double()) < 1e-6


@pytest.mark.parametrize("kind", ["torch", "int", "cupy", "cuda.core"])
def test_explicit_stream(saxpy_prog, kind):
    k = saxpy_prog.kernel("saxpy")
    n = 1000
    x = torch.randn(n, device="cuda")
    y = torch.randn(n, device="cuda")
    ref = 2.0 * x.double() + y.double()
    torch.cuda.synchronize()
    ts = torch.cuda.Stream()
    if kind == "torch":
        s = ts
    elif kind == "int":
        s = ts.cuda_stream
    elif kind == "cupy":
        cupy = pytest.importorskip("cupy")
        s = cupy.cuda.Stream(non_blocking=True)
    else:
        try:
            from cuda.core import Device
        except ImportError:
            try:
                from cuda.core.experimental import Device
            except ImportError:
                pytest.skip("cuda.core not installed")
        dev = Device()
        dev.set_current()
        s = dev.create_stream()
    k[(n + 255) // 256, 256, 0, s](y, x, 2.0, n)
    k(grid=(n + 255) // 256, block=256, args=(y, x, 0.0, n), stream=s)
    torch.cuda.synchronize()
    if kind == "cupy":
        s.synchronize()
    elif kind == "cuda.core":
        s.sync()
    assert _rel(y, ref) < 1e-6


# -- launch options ------------------------------------------------------------------------

SHMEM_SRC = r"""
extern "C" __global__ void reverse_block(float* out, const float* in, int n) {
    extern __shared__ float tile[];
    int per = n / blockDim.x;
    for (int k = 0; k < per; ++k) tile[threadIdx.x * per + k] = in[threadIdx.x * per + k];
    __syncthreads();
    for (int k = 0; k < per; ++k) out[threadIdx.x * per + k] = tile[n - 1 - (threadIdx.x * per + k)];
}
"""


def test_large_dynamic_shared_memory():
    k = cuforge.compile(SHMEM_SRC, name="shmem.cu").kernel("reverse_block")
    n = 256 * 96  # 96 KiB of floats: above the 48 KiB default
    x = torch.randn(n, device="cuda")
    out = torch.full((n,), float("nan"), device="cuda")
    k[1, 256, n * 4](out, x, n)
    torch.cuda.synchronize()
    assert torch.equal(out, x.flip(0))
    with pytest.raises(ArgumentValueError, match="exceeds"):
        k[1, 256, 1 << 20](out, x, n)


COOP_SRC = r"""
#include <cooperative_groups.h>
namespace cg = cooperative_groups;
extern "C" __global__ void cluster_rank(int* out) {
    out[blockIdx.x] = (int)cg::this_cluster().block_rank();
}
extern "C" __global__ void fill(int* out, int v) { out[blockIdx.x * blockDim.x + threadIdx.x] = v; }
"""


def test_cooperative_and_cluster_launch():
    k = cuforge.compile(COOP_SRC, name="coop.cu")
    fill = k.kernel("fill")
    out = torch.full((8 * 32,), -1, device="cuda", dtype=torch.int32)
    fill(grid=8, block=32, args=(out, 7), cooperative=True)
    torch.cuda.synchronize()
    assert out.eq(7).all()
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("clusters need sm_90")
    rank = k.kernel("cluster_rank")
    out = torch.full((8,), -1, device="cuda", dtype=torch.int32)
    rank(grid=8, block=32, args=(out,), cluster=2)
    torch.cuda.synchronize()
    assert out.tolist() == [0, 1] * 4
    with pytest.raises(ArgumentValueError, match="multiple of cluster"):
        rank(grid=7, block=32, args=(out,), cluster=2)


def test_fast_path_is_engaged_and_threads(saxpy_prog):
    k = saxpy_prog.kernel("saxpy")
    y = torch.zeros(256, device="cuda")
    x = torch.ones(256, device="cuda")
    k[1, 256](y, x, 1.0, 256)
    assert k._state is not None or getattr(k, "_fast_source", None), "no fast path"
    errors = []

    def worker():
        try:
            for _ in range(100):
                k[1, 256](y, x, 1.0, 256)
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for _ in range(100):
        k[1, 256](y, x, 1.0, 256)
    for t in threads:
        t.join()
    torch.cuda.synchronize()
    assert not errors, errors
    assert y.eq(501).all()


def test_attributes(saxpy_prog):
    attrs = saxpy_prog.kernel("saxpy").attributes()
    assert attrs["num_regs"] > 0 and attrs["max_threads_per_block"] >= 256


# -- warm start ----------------------------------------------------------------------------

WARM = textwrap.dedent(
    """
    import json, sys, torch, cuforge
    from cuforge.samples import sample_path
    prog = cuforge.compile_file(sample_path("saxpy.cu"))
    k = prog.kernel("saxpy")
    n = 10007
    x = torch.randn(n, device="cuda"); y = torch.randn(n, device="cuda")
    ref = 0.5 * x.double() + y.double()
    k[(n + 255) // 256, 256](y, x, 0.5, n)
    torch.cuda.synchronize()
    err = ((y.double() - ref).norm() / ref.norm()).item()
    print(json.dumps({"source": prog.source_of_result, "err": err}))
    """
)


def test_warm_start_in_fresh_process(tmp_path):
    env = dict(os.environ, CUFORGE_CACHE_DIR=str(tmp_path / "cache"))
    src_dir = os.path.dirname(os.path.dirname(os.path.abspath(cuforge.__file__)))
    env["PYTHONPATH"] = src_dir + os.pathsep + env.get("PYTHONPATH", "")
    results = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", WARM], env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert results[0]["source"] == "compiled"
    assert results[1]["source"] == "disk"  # 0 compiles in the fresh process
    assert results[1]["err"] < 1e-6 and results[0]["err"] < 1e-6


def test_kernel_is_garbage_collected(saxpy_prog):
    import gc
    import weakref

    from cuforge.runtime.kernel import Kernel

    k = Kernel(saxpy_prog, "saxpy")
    y = torch.zeros(32, device="cuda")
    k[1, 32](y, y, 1.0, 32)
    launcher = k[1, 32]
    ref = weakref.ref(k)
    del k
    gc.collect()
    launcher(y, y, 1.0, 32)  # a launcher keeps its kernel alive
    assert ref() is not None
    del launcher
    gc.collect()
    assert ref() is None


def test_launchers_stay_valid_when_cupy_appears(saxpy_prog):
    from cuforge.runtime.kernel import Kernel

    cupy = pytest.importorskip("cupy")
    k = Kernel(saxpy_prog, "saxpy")
    y = torch.zeros(64, device="cuda")
    x = torch.ones(64, device="cuda")
    f = k[1, 64]
    f(y, x, 1.0, 64)
    state = k._state
    k[1, 64](cupy.asarray(y), cupy.asarray(x), 1.0, 64)
    cupy.cuda.get_current_stream().synchronize()
    f(y, x, 1.0, 64)
    torch.cuda.synchronize()
    assert y.eq(3).all()
    assert k._state is state and k[1, 64] is f  # nothing was rebuilt
