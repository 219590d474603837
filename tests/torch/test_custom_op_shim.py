"""The C++ CUDA kernel of kernel-mode custom ops (``cuforge.torch.opshim``) on a machine
without a GPU: the shim builds once per torch version and is cached (a second process
compiles nothing), registers a C++ kernel for the CUDA dispatch key, and leaves the fake,
opcheck and torch.compile tracing as they were. Which ops keep the Python kernel, and why.

The launch itself needs a GPU: tests/torch/test_custom_op_gpu.py compares the C++ path with
the Python one, on several streams and under CUDA-graph capture.

One shim build for the whole module: a module-wide cache dir, built by the first child
process; the test process loads the shim from there."""

from __future__ import annotations

import ctypes
import shutil
import uuid

import pytest

torch = pytest.importorskip("torch")

import cuforge  # noqa: E402
from cuforge.torch import (  # noqa: E402
    cdiv_grid,
    custom_op,
    opshim,  # noqa: E402
)
from tests.child import child_env, run_python  # noqa: E402

pytestmark = pytest.mark.skipif(
    shutil.which("c++") is None and shutil.which("g++") is None, reason="no C++ compiler"
)

SOURCE = r"""
extern "C" __global__ void muladd(int numel, const float* a, const float* b, float c,
                                  float* result) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < numel) result[i] = a[i] * b[i] + c;
}
extern "C" __global__ void saxpy(float* y, const float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""

CHILD = """
import json
from cuforge.torch import opshim
lib = opshim.load_shim()
print(json.dumps({"ok": lib is not None, **opshim.shim_info()}))
"""


@pytest.fixture(autouse=True)
def _switch_unset(monkeypatch):
    """The C++ kernel is on unless CUFORGE_TORCH_OP_SHIM=0 (the process's own setting aside)."""
    monkeypatch.delenv("CUFORGE_TORCH_OP_SHIM", raising=False)


@pytest.fixture(scope="module")
def shim_dir(tmp_path_factory):
    """A cache dir holding the built shim: (dir, first child's info, second child's info)."""
    d = tmp_path_factory.mktemp("opshim-cache")
    first = run_python(CHILD, child_env(CUFORGE_CACHE_DIR=str(d)), timeout=600)
    second = run_python(CHILD, child_env(CUFORGE_CACHE_DIR=str(d)), timeout=600)
    return d, first, second


@pytest.fixture
def shim(shim_dir):
    lib = opshim.load_shim(cuforge.Cache(shim_dir[0]))
    assert lib is not None, opshim.shim_info()
    return lib


@pytest.fixture
def prog():
    return cuforge.compile(SOURCE, name="custom_op_shim_test.cu", arch="sm_90")


def qual(name: str) -> str:
    return f"cuforge_shim_{uuid.uuid4().hex[:10]}::{name}"


def muladd_op(prog, q: str, grid=None, block: int = 256):
    """``muladd`` as a kernel-mode op that qualifies for the C++ kernel (``cpp=True``);
    ``grid`` defaults to ``cdiv_grid("numel", block)``."""
    return custom_op(
        q,
        prog.kernel("muladd"),
        outputs=("result",),
        out_like="a",
        grid=cdiv_grid("numel", block) if grid is None else grid,
        block=block,
        cpp=True,
    )


def test_shim_builds_once_and_a_second_process_compiles_nothing(shim_dir):
    _, first, second = shim_dir
    assert first["ok"] and second["ok"], (first, second)
    assert first["compiled"] == 1
    assert second["compiled"] == 0
    assert second["path"] == first["path"]
    assert torch.__version__.replace(".", "_").replace("+", "_") in first["path"]


def test_cpp_kernel_is_registered_for_the_cuda_key(shim, prog):
    q = qual("muladd")
    op = muladd_op(prog, q)
    assert op._cuforge_cpp_why is None
    assert op._cuforge_cpp is not None
    assert torch._C._dispatch_has_kernel_for_dispatch_key(q, "CUDA")
    assert not torch._C._dispatch_has_kernel_for_dispatch_key(q, "CPU")
    assert opshim.calls(op) == 0
    # in place, fixed grid, device_types=None: the Python kernel stays for the other devices
    q2 = qual("saxpy")
    op2 = custom_op(
        q2,
        prog.kernel("saxpy"),
        mutates_args=("y",),
        grid=4,
        block=256,
        device_types=None,
        cpp=True,
    )
    assert op2._cuforge_cpp_why is None
    assert torch._C._dispatch_has_kernel_for_dispatch_key(q2, "CUDA")
    assert torch._C._dispatch_has_kernel_for_dispatch_key(q2, "CompositeExplicitAutograd")


def test_fake_opcheck_and_compile_tracing_still_work(shim, prog):
    q = qual("muladd")
    op = muladd_op(prog, q, grid=cdiv_grid("a", 128), block=128)
    assert op._cuforge_cpp_why is None
    a = torch.empty(64, device="meta")
    results = torch.library.opcheck(op, (64, a, a.clone(), 0.5))
    assert set(results.values()) == {"SUCCESS"}, results
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(10, 3, device="cuda")
        assert op(30, x, x, 1.0).shape == (10, 3)

    def f(a, b):
        return op(a.numel(), a, b, 3.0).relu() * 2

    torch._dynamo.reset()
    out = torch.compile(f, backend="aot_eager", fullgraph=True)(a, a.clone())
    assert out.shape == (64,)
    explained = torch._dynamo.explain(f)(a, a.clone())
    assert explained.graph_break_count == 0, explained.break_reasons


def test_which_ops_keep_the_python_kernel(shim, prog):
    k = prog.kernel("muladd")
    common = dict(outputs=("result",), block=256)
    cases = [
        (dict(out_like="a", grid=lambda numel, a, b, c, result: 1, cpp=True), "Python function"),
        (dict(fake=lambda numel, a, b, c: torch.empty_like(a), grid=1, cpp=True), "fake="),
        (dict(out_like="a", grid=1, cpp=False), "cpp=False"),
    ]
    for extra, why in cases:
        q = qual("muladd")
        with (
            pytest.warns(UserWarning, match="the Python kernel stays")
            if extra["cpp"]
            else _nothing()
        ):
            op = custom_op(q, k, **common, **extra)
        assert why in op._cuforge_cpp_why
        assert getattr(op, "_cuforge_cpp", None) is None
        assert torch._C._dispatch_has_kernel_for_dispatch_key(q, "CUDA")  # the Python one

    with pytest.warns(UserWarning, match="launcher mode"):

        @custom_op(qual("launch"), out_like="a", cpp=True)
        def launcher(a: torch.Tensor) -> torch.Tensor:
            return a.clone()

    assert "launcher" in launcher._cuforge_cpp_why


def test_on_unless_the_switch_turns_it_off(monkeypatch):
    assert opshim.enabled(True) is None
    assert opshim.enabled(False) == "cpp=False"
    assert (opshim.enabled(None) is None) is torch.cuda.is_available()
    monkeypatch.setenv("CUFORGE_TORCH_OP_SHIM", "0")
    assert opshim.enabled(True) == opshim.OFF_WHY  # cpp=True does not override the process
    assert opshim.enabled(None) == opshim.OFF_WHY
    for on in ("1", "experimental"):  # the last release's spelling still means on
        monkeypatch.setenv("CUFORGE_TORCH_OP_SHIM", on)
        assert opshim.enabled(True) is None
    monkeypatch.setenv("CUFORGE_TORCH_OP_SHIM", "yes")  # not a value it takes: says which
    with pytest.raises(ValueError, match="CUFORGE_TORCH_OP_SHIM"):
        opshim.enabled(True)


def test_cpp_true_with_the_switch_off_warns_and_keeps_the_python_kernel(prog, monkeypatch):
    monkeypatch.setenv("CUFORGE_TORCH_OP_SHIM", "0")
    with pytest.warns(UserWarning, match="CUFORGE_TORCH_OP_SHIM=0"):
        op = muladd_op(prog, qual("off"))
    assert op._cuforge_cpp_why == opshim.OFF_WHY


def test_cdiv_grid_in_the_python_kernel(prog):
    """The Python kernel evaluates cdiv_grid too (a recording stand-in for the launch)."""
    launches = []

    class Rec:
        params = prog.kernel("muladd").params
        program = prog
        name = "muladd"

        def __getitem__(self, config):
            return lambda *args: launches.append((config, args))

    op = custom_op(
        qual("muladd"),
        Rec(),
        outputs=("result",),
        out_like="a",
        grid=cdiv_grid("a", 128),
        block=128,
        device_types="cpu",
        cpp=False,
    )
    op(300, torch.ones(300), torch.ones(300), 1.0)
    op(0, torch.ones(0), torch.ones(0), 1.0)
    assert [c for c, _ in launches] == [(3, 128, 0)]  # and none for the empty one
    with pytest.raises(ValueError, match="'nope', which is not a kernel parameter"):
        custom_op(
            qual("m"), Rec(), outputs=("result",), out_like="a", grid=cdiv_grid("nope", 1), block=1
        )
    with pytest.raises(ValueError, match="per must be an int >= 1"):
        cdiv_grid("a", 0)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# -- the C++ kernel itself, registered for the CPU key with a recording launch -------------


class LaunchConfig(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint) for n in ("gx", "gy", "gz", "bx", "by", "bz", "shmem")] + [
        ("stream", ctypes.c_void_p),
        ("attrs", ctypes.c_void_p),
        ("nattrs", ctypes.c_uint),
    ]


LAUNCH = ctypes.CFUNCTYPE(
    ctypes.c_int,
    ctypes.POINTER(LaunchConfig),
    ctypes.c_void_p,
    ctypes.POINTER(ctypes.c_void_p),
    ctypes.c_void_p,
)
STREAM = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_int32, ctypes.POINTER(ctypes.c_void_p))


@pytest.fixture
def recorded(shim, monkeypatch):
    """Ops registered while this is active get the C++ kernel on the CPU key; each launch
    appends (grid, block, shmem, stream, func, params pointer array) to the list."""
    launches: list = []
    result = {"code": 0, "n": 5}  # n: the kernel's parameter count (muladd's; saxpy: 4)

    def launch(cfg, func, params, extra):
        c = cfg.contents
        # the parameter buffer lives on the C++ kernel's stack: copied now, during the launch
        slots = [bytes((ctypes.c_char * 8).from_address(params[i])) for i in range(result["n"])]
        launches.append(((c.gx, c.gy, c.gz), (c.bx, c.by, c.bz), c.shmem, c.stream, func, slots))
        if result.get("run") is not None:  # runs the kernel on the packed buffer, now
            result["run"]((c.gx, c.gy, c.gz), (c.bx, c.by, c.bz), params)
        return result["code"]

    def stream(device, out):
        out[0] = 0x5151
        return 0

    keep = (LAUNCH(launch), STREAM(stream))
    addrs = tuple(ctypes.cast(f, ctypes.c_void_p).value for f in keep)
    monkeypatch.setattr(opshim, "_test_cpu", addrs)
    yield launches, result
    del keep


def value(params, i: int, ctype):
    """Kernel parameter ``i`` as ``ctype``: from a launch's copied slots, or (during the
    launch) from the live parameter pointer array."""
    if isinstance(params, list):
        return ctype.from_buffer_copy(params[i][: ctypes.sizeof(ctype)]).value
    return ctypes.cast(params[i], ctypes.POINTER(ctype))[0]


def dispatched(op, *args) -> list[str]:
    """The ops torch's dispatcher saw while ``op(*args)`` ran under a dispatch mode (a mode
    sends every call through the dispatcher: an eager entry must hand it over)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: list[str] = []

    class Seen(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    with Seen():
        op(*args)
    return seen


def test_cpp_kernel_packs_allocates_and_launches(recorded, prog):
    launches, result = recorded
    op = muladd_op(prog, qual("muladd"))
    assert op._cuforge_cpp_why is None
    a, b = torch.arange(300, dtype=torch.float32), torch.ones(300)
    out = op(300, a, b, 1.5)
    assert out.shape == (300,) and out.dtype == torch.float32 and out.is_contiguous()
    ((grid, block, shmem, stream, func, params),) = launches
    assert (grid, block, shmem, stream, func) == ((2, 1, 1), (256, 1, 1), 0, 0x5151, 0xF00D)
    assert value(params, 0, ctypes.c_int) == 300
    assert value(params, 1, ctypes.c_void_p) == a.data_ptr()
    assert value(params, 2, ctypes.c_void_p) == b.data_ptr()
    assert value(params, 3, ctypes.c_float) == 1.5
    assert value(params, 4, ctypes.c_void_p) == out.data_ptr()
    assert opshim.calls(op) == 1
    # an empty grid launches nothing; a read-only non-contiguous input is made contiguous
    launches.clear()
    assert op(0, torch.ones(0), torch.ones(0), 1.0).shape == (0,)
    assert launches == []
    m = torch.ones(8, 4).t()
    op(32, m, b[:32], 1.0)
    assert value(launches[-1][5], 1, ctypes.c_void_p) != m.data_ptr()
    # the checks
    with pytest.raises(RuntimeError, match="expects another dtype"):
        op(4, torch.ones(4, dtype=torch.float64), torch.ones(4, dtype=torch.float64), 1.0)
    with pytest.raises(RuntimeError, match="out of its C type's range"):
        op(1 << 40, a, b, 1.0)
    with pytest.raises(RuntimeError, match="requires grad but the op has no autograd formula"):
        op(300, a.clone().requires_grad_(), b, 1.0)
    result["code"] = 700
    with pytest.raises(RuntimeError, match=r"refused the launch \(CUresult 700\) with grid 2x1x1"):
        op(300, a, b, 1.0)


def test_eager_entry_takes_plain_calls_and_hands_the_rest_to_the_dispatcher(recorded, prog):
    """op(...) eagerly runs the C++ kernel straight from its METH_FASTCALL entry when the
    dispatcher would do nothing else; a dispatch mode, a tensor subclass, an input that
    needs grad, the profiler or keyword arguments go through torch's OpOverload instead."""

    launches, _ = recorded
    q = qual("muladd")
    op = muladd_op(prog, q)
    a, b = torch.arange(300, dtype=torch.float32), torch.ones(300)
    out = op(300, a, b, 1.5)
    assert out.shape == (300,) and (opshim.calls(op), opshim.fast_calls(op)) == (1, 1)
    with pytest.raises(RuntimeError, match="expects another dtype"):  # its own checks
        op(4, torch.ones(4, dtype=torch.float64), torch.ones(4, dtype=torch.float64), 1.0)
    assert opshim.fast_calls(op) == 2

    assert dispatched(op, 300, a, b, 1.5) == [f"{q.replace('::', '.')}.default"]

    class Sub(torch.Tensor):
        pass

    assert op(300, a.as_subclass(Sub), b, 1.5).shape == (300,)
    op(300, a, b, c=1.5)  # keyword arguments: torch binds them
    with pytest.raises(RuntimeError, match="requires grad but the op has no autograd formula"):
        op(300, a.clone().requires_grad_(), b, 1.0)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        op(300, a, b, 1.5)
    assert any(e.name == f"{q}" or q in e.name for e in prof.events())
    # each of those ran the kernel (two raised in its checks) through the dispatcher, none
    # through the eager entry
    assert (opshim.calls(op), opshim.fast_calls(op)) == (5, 2)
    with torch.no_grad():  # grad off: an input that requires grad is plain data
        op(300, a.clone().requires_grad_(), b, 1.0)
    assert opshim.fast_calls(op) == 3 and len(launches) == 6
    # a tensor of another device than the kernel's (here meta: opcheck's, or fake tracing
    # outside a mode) goes to the dispatcher and its kernel for that device, the fake
    out = op(300, a.to("meta"), b.to("meta"), 1.5)
    assert out.device.type == "meta" and out.shape == (300,)
    assert (opshim.fast_calls(op), len(launches)) == (3, 6)


def test_cpp_kernel_in_place_bumps_the_version_and_refuses_strided_writes(recorded, prog):
    launches, result = recorded
    result["n"] = 4
    op = custom_op(
        qual("saxpy"), prog.kernel("saxpy"), mutates_args=("y",), grid=(3, 2), block=64, cpp=True
    )
    assert op._cuforge_cpp_why is None
    y, x = torch.zeros(16), torch.ones(16)
    v = y._version
    assert op(y, x, 2.0, 16) is None
    assert y._version == v + 1 and opshim.fast_calls(op) == 1  # the eager entry bumps it too
    ((grid, block, _, _, _, params),) = launches
    assert grid == (3, 2, 1) and block == (64, 1, 1)
    assert value(params, 0, ctypes.c_void_p) == y.data_ptr()
    assert value(params, 3, ctypes.c_int) == 16
    with pytest.raises(RuntimeError, match="'y' is written by the kernel but is not contiguous"):
        op(torch.zeros(4, 4).t(), torch.ones(4, 4), 1.0, 16)


def test_no_shim_keeps_the_python_kernel_with_one_reason_line(prog, monkeypatch, caplog):
    why = "the C++ op shim is not available (CompileError: no c++)"
    monkeypatch.setattr(opshim, "_state", {"lib": None, "why": why})
    for _ in range(2):
        q = qual("muladd")
        with pytest.warns(UserWarning, match="no c\\+\\+"):
            op = muladd_op(prog, q, grid=1, block=32)
        assert op._cuforge_cpp_why == why
        assert torch._C._dispatch_has_kernel_for_dispatch_key(q, "CUDA")  # the Python one
    assert [r.getMessage() for r in caplog.records if "no c++" in r.getMessage()] == [
        f"cuforge.torch.custom_op: the Python CUDA kernel stays: {why}"
    ]


def floats(params, i: int, n: int):
    """The ``float*`` kernel parameter ``i`` as a numpy array of ``n`` (no copy)."""
    import numpy as np

    ptr = value(params, i, ctypes.c_void_p)
    return np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(n,))


def muladd_on_the_cpu(grid, block, params):
    """extension-cpp's muladd, run on what the C++ kernel packed, during the launch: every
    pointer must still point at live memory holding the right values then."""
    n = value(params, 0, ctypes.c_int)
    assert grid[0] * block[0] >= n and (n == 0 or (grid[0] - 1) * block[0] < n)
    if n:
        a, b, out = floats(params, 1, n), floats(params, 2, n), floats(params, 4, n)
        out[:] = a * b + value(params, 3, ctypes.c_float)


def saxpy_on_the_cpu(grid, block, params):
    n = value(params, 3, ctypes.c_int)
    assert grid[0] * block[0] >= n
    y, x = floats(params, 0, n), floats(params, 1, n)
    y[:] = value(params, 2, ctypes.c_float) * x + y


def test_cpp_kernel_on_the_cpu_key_step_by_step(recorded, prog):
    """tests/torch/test_custom_op_gpu.py::test_cpp_kernel_matches_the_python_kernel, step by
    step, on the CPU key, with a launch that runs the kernel on the packed buffer during the
    launch (so a dangling pointer -- a contiguous() copy freed before the launch -- shows)."""
    launches, result = recorded
    result["run"] = muladd_on_the_cpu
    fast = muladd_op(prog, qual("muladd"))
    assert fast._cuforge_cpp_why is None
    for n in (1, 255, 256, 4097, 1 << 20):  # cdiv_grid from an int parameter
        g = torch.Generator().manual_seed(n)
        a, b = torch.randn(n, generator=g), torch.randn(n, generator=g)
        launches.clear()
        out = fast(n, a, b, 0.25)
        torch.testing.assert_close(out, a * b + 0.25, rtol=0, atol=0)
        torch.testing.assert_close(fast(n, a, b, 0.25), out, rtol=0, atol=0)
        assert [grid for grid, *_ in launches] == [(-(-n // 256), 1, 1)] * 2
    assert opshim.calls(fast) == 10
    # zero-size: an empty output, no launch
    launches.clear()
    assert fast(0, torch.empty(0), torch.empty(0), 1.0).numel() == 0
    assert launches == [] and opshim.calls(fast) == 11
    # a read-only non-contiguous input: its contiguous copy is what the kernel reads
    m = torch.randn(64, 32).t()
    torch.testing.assert_close(fast(m.numel(), m, m, 1.0), (m * m + 1.0).contiguous())
    # cdiv_grid from a tensor's numel, and a float parameter packed as 4 bytes
    by_numel = muladd_op(prog, qual("muladd"), grid=cdiv_grid("a", 128), block=128)
    a, b = torch.randn(1000), torch.randn(1000)
    launches.clear()
    torch.testing.assert_close(by_numel(1000, a, b, 1.0 / 3.0), a * b + 1.0 / 3.0)
    assert launches[0][0] == (8, 1, 1)
    assert value(launches[0][5], 3, ctypes.c_float) == ctypes.c_float(1.0 / 3.0).value
    # in place: same result as the Python expression, version counter bumped once
    result["run"], result["n"] = saxpy_on_the_cpu, 4
    ifast = custom_op(
        qual("saxpy"),
        prog.kernel("saxpy"),
        mutates_args=("y",),
        grid=cdiv_grid("n", 128),
        block=128,
        cpp=True,
    )
    x = torch.randn(5000)
    y = torch.ones(5000)
    v = y._version
    launches.clear()
    assert ifast(y, x, 3.0, 5000) is None
    torch.testing.assert_close(y, 3.0 * x + 1.0)
    assert y._version == v + 1 and launches[0][0] == (40, 1, 1)
    # the checks, in the GPU test's order; none launches, none leaves a version bump
    launches.clear()
    with pytest.raises(RuntimeError, match="expects another dtype"):
        fast(8, a[:8].double(), a[:8].double(), 1.0)
    with pytest.raises(RuntimeError, match="not contiguous"):
        ifast(torch.ones(8, 2).t(), torch.ones(2, 8), 1.0, 16)
    with pytest.raises(RuntimeError, match="requires grad"):
        fast(8, a[:8].clone().requires_grad_(), a[:8], 1.0)
    with pytest.raises(RuntimeError, match="out of its C type's range"):
        ifast(y, x, 1.0, 1 << 40)
    assert launches == [] and y._version == v + 1
    # and the op still works after every error
    result["run"], result["n"] = muladd_on_the_cpu, 5
    torch.testing.assert_close(fast(4, a[:4], b[:4], 0.0), a[:4] * b[:4])


VOID_SOURCE = r"""
extern "C" __global__ void scale(int n, const void* x, float* out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = 2.0f * ((const float*)x)[i];
}
"""


def test_every_dtype_is_checked_with_its_input_before_anything_is_allocated(recorded, prog):
    """The dtype checks run in phase 1 with the input's other checks (the path of the
    not-contiguous error): an input's own pointer parameter, the second input alone, an
    in-place input, and an output's dtype checked on the input it is shaped like (here a
    ``const void*`` one, which takes any dtype itself). The message names the argument, the
    kernel parameter and both dtypes; nothing is launched, no version bumped, and the op
    works after each error."""
    launches, result = recorded
    result["run"] = muladd_on_the_cpu
    fast = muladd_op(prog, qual("muladd"))
    assert fast._cuforge_cpp_why is None
    a, b, d = torch.randn(8), torch.randn(8), torch.randn(8, dtype=torch.float64)
    cases = [
        ((8, d, d, 1.0), r"argument 'a' is torch\.float64 \(code 7\) but kernel parameter 1 "),
        ((8, a, d, 1.0), r"argument 'b' is torch\.float64 \(code 7\) but kernel parameter 2 "),
        ((8, a.half(), b, 1.0), r"argument 'a' is torch\.float16 \(code 5\)"),
        ((8, a, b.to(torch.int32), 1.0), r"argument 'b' is torch\.int32 \(code 3\)"),
    ]
    for call_args, message in cases:
        with pytest.raises(
            RuntimeError, match=message + r".*expects another dtype: torch\.float32"
        ):
            fast(*call_args)
        assert launches == []
        torch.testing.assert_close(fast(4, a[:4], b[:4], 0.0), a[:4] * b[:4])
        launches.clear()
    # in place: the written input's dtype, no version bump
    result["run"], result["n"] = saxpy_on_the_cpu, 4
    ifast = custom_op(
        qual("saxpy"),
        prog.kernel("saxpy"),
        mutates_args=("y",),
        grid=cdiv_grid("n", 128),
        block=128,
        cpp=True,
    )
    y = torch.ones(16, dtype=torch.float64)
    v = y._version
    with pytest.raises(RuntimeError, match=r"argument 'y' is torch\.float64 .*parameter 0 "):
        ifast(y, torch.ones(16), 1.0, 16)
    assert launches == [] and y._version == v
    # an output's dtype is its model's: checked on the model, even one that takes any dtype
    result["run"], result["n"] = None, 3
    scale = custom_op(
        qual("scale"),
        cuforge.compile(VOID_SOURCE, name="custom_op_shim_void.cu", arch="sm_90").kernel("scale"),
        outputs=("out",),
        out_like="x",
        grid=cdiv_grid("n", 64),
        block=64,
        cpp=True,
    )
    assert scale._cuforge_cpp_why is None, scale._cuforge_cpp_why
    with pytest.raises(
        RuntimeError,
        match=r"argument 'x' is torch\.int32 \(code 3\) but kernel parameter 2 expects another "
        r"dtype: torch\.float32",
    ):
        scale(4, torch.ones(4, dtype=torch.int32))
    assert launches == []
    assert scale(4, torch.ones(4)).dtype == torch.float32 and len(launches) == 1


def test_python_kernel_eager_entry_runs_plain_calls_straight(shim):
    """An op whose kernel stays Python (here a launcher, on the CPU key) gets the shim's
    eager entry too: a plain call runs the registered kernel without the dispatcher's round
    trip; a mode, grad, keyword arguments, another device or an int for a float go through
    torch's OpOverload, and each path hands the kernel the same values."""

    seen_args: list = []

    def scale(x: torch.Tensor, a: float, n: int, flag: bool) -> torch.Tensor:
        seen_args.append((type(a), type(n), type(flag)))
        return x * a + n + flag

    q = qual("scale")
    with pytest.warns(UserWarning, match="launcher mode"):
        op = custom_op(q, scale, out_like="x", device_types="cpu", cpp=True)
    assert op._cuforge_entry_why is None and op._cuforge_fast is not None
    x = torch.arange(4, dtype=torch.float32)
    assert torch.equal(op(x, 2.0, 1, True), x * 2 + 2)
    assert opshim.fast_calls(op) == 1 and seen_args == [(float, int, bool)]

    assert dispatched(op, x, 2.0, 1, False) == [f"{q.replace('::', '.')}.default"]
    assert torch.equal(op(x, 2, 1, False), x * 2 + 1)  # an int for a float: torch converts
    assert seen_args[-1] == (float, int, bool)
    op(x, a=2.0, n=1, flag=False)  # keyword arguments: torch binds them
    with pytest.raises(RuntimeError, match="requires grad but the op has no autograd formula"):
        op(x.clone().requires_grad_(), 2.0, 1, False)
    assert op(x.to("meta"), 2.0, 1, False).device.type == "meta"  # to the fake
    assert opshim.fast_calls(op) == 1  # none of those took the entry
    with torch.no_grad():
        op(x.clone().requires_grad_(), 2.0, 1, False)
    assert opshim.fast_calls(op) == 2
    torch.library.opcheck(op, (x, 2.0, 1, True))

    # a new kernel for the entry's device: the entry goes, and the call is torch's again
    try:
        op.register_kernel("cpu", lambda x, a, n, flag: x - a)
    except RuntimeError:  # a torch that keeps one kernel per key refuses: the entry stays
        assert op._cuforge_fast is not None
    else:
        assert op._cuforge_fast is None and "register_kernel" in op._cuforge_entry_why
        assert torch.equal(op(x, 2.0, 1, True), x - 2)


def test_python_kernel_eager_entry_bumps_written_tensors_like_the_dispatcher(shim):
    def add_(y: torch.Tensor, x: torch.Tensor) -> None:
        y.add_(x)

    with pytest.warns(UserWarning, match="launcher mode"):
        op = custom_op(qual("add_"), add_, mutates_args=("y",), device_types="cpu", cpp=True)
    y, x = torch.zeros(3), torch.ones(3)
    v = y._version
    op(y, x)  # the entry
    entry_bumps = y._version - v
    v = y._version
    op(y, x=x)  # the dispatcher
    assert opshim.fast_calls(op) == 1 and y._version - v == entry_bumps >= 1
    assert torch.equal(y, torch.full((3,), 2.0))


def test_which_ops_get_no_python_kernel_entry(shim):
    def two(x: torch.Tensor, xs: list[int]) -> torch.Tensor:
        return x.clone()

    with pytest.warns(UserWarning, match="launcher mode"):
        op = custom_op(qual("two"), two, out_like="x", device_types="cpu", cpp=True)
    assert op._cuforge_fast is None and "xs" in op._cuforge_entry_why
    op = custom_op(qual("off"), two, out_like="x", device_types="cpu", cpp=False)
    assert op._cuforge_entry_why == "cpp=False" and op._cuforge_fast is None
    with pytest.warns(UserWarning, match="launcher mode"):
        op = custom_op(qual("every"), two, out_like="x", device_types=None, cpp=True)
    assert "CompositeExplicitAutograd" in op._cuforge_entry_why


def test_python_kernel_entry_hands_calls_under_dynamos_frame_hook_to_the_op(shim):
    """The entry checks Dynamo's frame hook itself (the registered kernel's wrapper did):
    while the hook returns a callback, a call goes to the fallback (the OpOverload, whose
    kernel runs with Dynamo off); None or False: to the kernel. The entry here is made
    directly, with stand-in callables for the kernel, the fallback and the hook."""
    from ctypes import c_int64

    make = opshim._state["py_entry"]
    hook_returns: list = [None]

    def hook():
        if isinstance(hook_returns[0], Exception):
            raise hook_returns[0]
        return hook_returns[0]

    one = (c_int64 * 1)(0)  # one Tensor argument, not written
    entry = make(one, (c_int64 * 1)(0), 1, 1, lambda t: "kernel", lambda t: "fallback", hook)
    x = torch.ones(2)
    assert entry(x) == "kernel"
    hook_returns[0] = object()  # a callback: a compiled region's frame hook is set
    assert entry(x) == "fallback"
    hook_returns[0] = False  # Dynamo's "run, do not compile"
    assert entry(x) == "kernel"
    hook_returns[0] = RuntimeError("the hook failed")
    with pytest.raises(RuntimeError, match="the hook failed"):
        entry(x)
    plain = make(one, (c_int64 * 1)(0), 1, 1, lambda t: "kernel", lambda t: "fallback", None)
    assert plain(x) == "kernel"  # no hook given: no check
