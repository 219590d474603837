"""``cuforge.torch.custom_op`` on a GPU: results checked against torch, eagerly, under
``torch.compile(fullgraph=True)`` with no graph break (Dynamo's counters and ``explain``),
inside a CUDA graph capture + replay with new inputs copied into the static buffers, under
``mode="reduce-overhead"`` (CUDA graph trees), and on a side stream.

Run: ``pytest -m gpu tests/torch/test_custom_op_gpu.py``.
"""

from __future__ import annotations

import uuid

import pytest

torch = pytest.importorskip("torch")

import cuforge  # noqa: E402
from cuforge.torch import custom_op  # noqa: E402

pytestmark = pytest.mark.gpu

SOURCE = r"""
// extension-cpp's kernels, as written there
extern "C" __global__ void muladd(int numel, const float* a, const float* b, float c,
                                  float* result) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < numel) result[i] = a[i] * b[i] + c;
}
extern "C" __global__ void add(int numel, const float* a, const float* b, float* result) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < numel) result[i] = a[i] + b[i];
}
extern "C" __global__ void saxpy(float* y, const float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""


def qual(name: str) -> str:
    return f"cuforge_gpu_{uuid.uuid4().hex[:10]}::{name}"


def blocks(n: int, block: int = 256) -> int:
    return (n + block - 1) // block


@pytest.fixture
def ops():
    """Three ops over real kernels: out-of-place and in-place kernel ops, and a launcher op
    that runs two kernels."""
    prog = cuforge.compile(SOURCE, name="custom_op_gpu.cu")
    muladd = custom_op(
        qual("muladd"),
        prog.kernel("muladd"),
        outputs=("result",),
        out_like="a",
        grid=lambda numel, a, b, c, result: blocks(numel),
        block=256,
    )
    saxpy = custom_op(
        qual("saxpy"),
        prog.kernel("saxpy"),
        mutates_args=("y",),
        grid=lambda y, x, a, n: blocks(n),
        block=256,
    )
    k_muladd, k_add = prog.kernel("muladd"), prog.kernel("add")

    def muladd_add(a: torch.Tensor, b: torch.Tensor, c: float) -> torch.Tensor:
        """(a * b + c) + b, in two kernel launches."""
        a, b = a.contiguous(), b.contiguous()
        n = a.numel()
        tmp = torch.empty_like(a)
        out = torch.empty_like(a)
        k_muladd[blocks(n), 256](n, a, b, c, tmp)
        k_add[blocks(n), 256](n, tmp, b, out)
        return out

    launcher = custom_op(qual("muladd_add"), muladd_add, out_like="a")
    return muladd, saxpy, launcher


def inputs(n: int = 5000, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(n, device="cuda", generator=g)
    b = torch.randn(n, device="cuda", generator=g)
    return a, b


def test_eager_results_match_torch(ops):
    muladd, saxpy, launcher = ops
    a, b = inputs()
    torch.testing.assert_close(muladd(a.numel(), a, b, 0.5), a * b + 0.5)
    torch.testing.assert_close(launcher(a, b, 0.5), a * b + 0.5 + b)
    y = b.clone()
    assert saxpy(y, a, 2.0, y.numel()) is None
    torch.testing.assert_close(y, 2.0 * a + b)
    # a non-contiguous read-only input is made contiguous for the kernel
    m = torch.randn(64, 32, device="cuda")
    torch.testing.assert_close(muladd(m.numel(), m.t(), m.t(), 1.0), m.t() * m.t() + 1.0)


def test_compile_fullgraph_no_graph_break(ops):
    muladd, saxpy, launcher = ops
    from torch._dynamo.utils import counters

    def f(a, b):
        y = muladd(a.numel(), a, b, 0.5).sin()
        saxpy(y, b, 3.0, y.numel())
        return launcher(y, a, -1.0) * 2

    def reference(a, b):
        y = (a * b + 0.5).sin() + 3.0 * b
        return (y * a - 1.0 + a) * 2

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(f, fullgraph=True)
    for seed, n in ((0, 5000), (1, 5000), (2, 777)):  # new values, then a new shape
        a, b = inputs(n, seed)
        torch.testing.assert_close(compiled(a, b), reference(a, b))
    assert not counters["graph_break"], dict(counters["graph_break"])
    a, b = inputs()
    explained = torch._dynamo.explain(f)(a, b)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1


def test_compile_in_place_mutation_is_seen_by_the_caller(ops):
    _, saxpy, _ = ops

    def f(y, x):
        saxpy(y, x, 2.0, y.numel())
        return y * 3

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True)
    a, b = inputs()
    y = b.clone()
    out = compiled(y, a)
    torch.testing.assert_close(y, 2.0 * a + b)
    torch.testing.assert_close(out, (2.0 * a + b) * 3)


def test_cuda_graph_capture_and_replay(ops):
    muladd, saxpy, launcher = ops
    n = 4096
    static_a, static_b = inputs(n, 10)
    static_y = torch.zeros(n, device="cuda")

    def step():
        out = muladd(n, static_a, static_b, 0.25)
        saxpy(static_y, out, 2.0, n)
        return launcher(out, static_b, 1.0)

    # warm up on a side stream (loads the kernels), as torch's CUDA graph docs ask
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()

    graph = torch.cuda.CUDAGraph()
    static_y.zero_()
    with torch.cuda.graph(graph):
        static_out = step()
    torch.cuda.synchronize()

    previous = None
    for seed in (11, 12, 13):
        a, b = inputs(n, seed)
        static_a.copy_(a)
        static_b.copy_(b)
        static_y.zero_()
        graph.replay()
        torch.cuda.synchronize()
        mid = a * b + 0.25
        torch.testing.assert_close(static_y, 2.0 * mid)
        torch.testing.assert_close(static_out, mid * b + 1.0 + b)
        if previous is not None:  # replay used the new inputs
            assert not torch.allclose(static_out, previous)
        previous = static_out.clone()


def test_compile_reduce_overhead_cuda_graph_trees(ops):
    muladd, _, launcher = ops

    def f(a, b):
        return launcher(muladd(a.numel(), a, b, 0.5), b, 2.0)

    torch._dynamo.reset()
    compiled = torch.compile(f, mode="reduce-overhead", fullgraph=True)
    for seed in range(5):  # the first runs record, later ones replay the graph
        a, b = inputs(2048, seed)
        out = compiled(a, b).clone()
        torch.testing.assert_close(out, (a * b + 0.5) * b + 2.0 + b)


def test_python_kernels_run_eagerly_through_the_shim_entry(ops):
    """The lambda-grid kernel ops and the launcher op keep Python kernels; eagerly, a plain
    call runs them through the shim's entry (no dispatcher round trip), on torch's current
    stream like any call."""
    from cuforge.torch import opshim

    muladd, saxpy, launcher = ops
    for op in ops:
        assert op._cuforge_entry_why is None and op._cuforge_py_entry is not None
    a, b = inputs()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = muladd(a.numel(), a, b, 0.5)
        two = launcher(a, b, 0.5)
        y = b.clone()
        saxpy(y, a, 2.0, y.numel())
    side.synchronize()
    torch.testing.assert_close(out, a * b + 0.5)
    torch.testing.assert_close(two, a * b + 0.5 + b)
    torch.testing.assert_close(y, 2.0 * a + b)
    assert [opshim.fast_calls(op) for op in ops] == [1, 1, 1]
    muladd._opoverload(a.numel(), a, b, 0.5)  # the dispatcher: not the entry
    assert opshim.fast_calls(muladd) == 1


def test_launch_follows_torch_current_stream(ops):
    muladd, _, _ = ops
    side = torch.cuda.Stream()
    n = 1 << 20
    a = torch.zeros(n, device="cuda")
    b = torch.ones(n, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # keep `side` busy, so a launch elsewhere would race
        a.fill_(3.0)
        out = muladd(n, a, b, 1.0)
    side.synchronize()
    assert torch.all(out == 4.0).item()


# -- docs/custom_ops.md's extension-cpp equivalent: bench/upstream/extension_cpp ----------------


def extension_cpp_ops(ns: str):
    """The three ops of pytorch/extension-cpp (mymuladd with autograd, mymul, myadd_out), as
    bench/upstream/extension_cpp defines them (the package extension-cpp's own suite runs
    against), in the namespace ``ns``."""
    import importlib.util
    import os

    path = os.path.join(
        os.path.dirname(__file__), "..", "..", "bench", "upstream", "extension_cpp", "define.py"
    )
    spec = importlib.util.spec_from_file_location("_cuforge_extension_cpp_define", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.define(ns)


def test_extension_cpp_equivalent():
    ns = f"extension_cpp_{uuid.uuid4().hex[:8]}"
    mymuladd, mymul, myadd_out = extension_cpp_ops(ns)
    schema = str(getattr(torch.ops, ns).mymuladd.default._schema)
    assert schema == f"{ns}::mymuladd(Tensor a, Tensor b, float c) -> Tensor"
    a, b = inputs(1000, 3)
    torch.testing.assert_close(mymuladd(a, b, 3.0), a * b + 3.0)
    torch.testing.assert_close(mymul(a, b), a * b)
    out = torch.empty_like(a)
    myadd_out(a, b, out)
    torch.testing.assert_close(out, a + b)
    # torch's own checks: schema (undeclared mutations), fake, autograd registration, AOT
    ga = a.clone().requires_grad_()
    gb = b.clone().requires_grad_()
    for op, args in (
        (mymuladd, (a, b, 1.5)),
        (mymuladd, (ga, gb, 1.5)),
        (mymul, (a, b)),
        (myadd_out, (a, b, torch.empty_like(a))),
    ):
        results = torch.library.opcheck(op, args)
        assert set(results.values()) == {"SUCCESS"}, (op, results)
    # gradients through the registered backward, eager and compiled
    for fn in (
        lambda x, y: mymuladd(x, y, 2.0),
        torch.compile(lambda x, y: mymuladd(x, y, 2.0), fullgraph=True),
    ):
        x = a.clone().requires_grad_()
        y = b.clone().requires_grad_()
        fn(x, y).sum().backward()
        torch.testing.assert_close(x.grad, b)
        torch.testing.assert_close(y.grad, a)


def test_cuda_graph_first_call_inside_capture():
    # a kernel never launched before: its module is loaded during the capture
    source = SOURCE + f"\n// fresh {uuid.uuid4().hex}\n"
    kernel = cuforge.compile(source, name="custom_op_fresh.cu").kernel("muladd")
    op = custom_op(
        qual("fresh"),
        kernel,
        outputs=("result",),
        out_like="a",
        grid=lambda numel, a, b, c, result: blocks(numel),
        block=256,
    )
    a, b = inputs(3000, 21)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = op(a.numel(), a, b, 0.5)
    for seed in (22, 23):
        new_a, new_b = inputs(3000, seed)
        a.copy_(new_a)
        b.copy_(new_b)
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, new_a * new_b + 0.5)


# -- the C++ CUDA kernel (cuforge.torch.opshim) against the Python one ----------------------


def both_paths(name: str, kernel_name: str, **kw):
    """The same kernel op twice: with the C++ kernel (cpp=True) and the Python one."""
    from cuforge.torch import opshim

    prog = cuforge.compile(SOURCE, name="custom_op_gpu.cu")
    fast = custom_op(qual(name), prog.kernel(kernel_name), cpp=True, **kw)
    slow = custom_op(qual(name), prog.kernel(kernel_name), cpp=False, **kw)
    assert fast._cuforge_cpp_why is None, (fast._cuforge_cpp_why, opshim.shim_info())
    return fast, slow


def test_cpp_kernel_matches_the_python_kernel():
    from cuforge.torch import cdiv_grid, opshim

    fast, slow = both_paths(
        "muladd",
        "muladd",
        outputs=("result",),
        out_like="a",
        grid=cdiv_grid("numel", 256),
        block=256,
    )
    for n in (1, 255, 256, 4097, 1 << 20):
        a, b = inputs(n, n)
        torch.testing.assert_close(fast(n, a, b, 0.25), slow(n, a, b, 0.25), rtol=0, atol=0)
        torch.testing.assert_close(fast(n, a, b, 0.25), a * b + 0.25)
    assert opshim.calls(fast) == 10
    assert fast(0, torch.empty(0, device="cuda"), torch.empty(0, device="cuda"), 1.0).numel() == 0
    # a read-only non-contiguous input is made contiguous, as the Python kernel does
    m = torch.randn(64, 32, device="cuda").t()
    torch.testing.assert_close(fast(m.numel(), m, m, 1.0), (m * m + 1.0).contiguous())
    # in place: same result, version counter bumped
    ifast, islow = both_paths(
        "saxpy", "saxpy", mutates_args=("y",), grid=cdiv_grid("n", 128), block=128
    )
    x = torch.randn(5000, device="cuda")
    y1, y2 = torch.ones(5000, device="cuda"), torch.ones(5000, device="cuda")
    v = y1._version
    assert ifast(y1, x, 3.0, 5000) is None
    islow(y2, x, 3.0, 5000)
    torch.testing.assert_close(y1, y2, rtol=0, atol=0)
    assert y1._version == v + 1
    # the checks: dtype, a written tensor that is not contiguous, grad
    with pytest.raises(RuntimeError, match="expects another dtype"):
        fast(8, a[:8].double(), a[:8].double(), 1.0)
    with pytest.raises(RuntimeError, match="not contiguous"):
        ifast(torch.ones(8, 2, device="cuda").t(), torch.ones(2, 8, device="cuda"), 1.0, 16)
    with pytest.raises(RuntimeError, match="requires grad"):
        fast(8, a[:8].clone().requires_grad_(), a[:8], 1.0)


def test_cpp_kernel_on_several_streams_and_under_compile():
    from cuforge.torch import cdiv_grid

    fast, _ = both_paths(
        "muladd", "muladd", outputs=("result",), out_like="a", grid=cdiv_grid("a", 256), block=256
    )
    n = 1 << 20
    streams = [torch.cuda.Stream() for _ in range(3)]
    outs = []
    torch.cuda.synchronize()
    for i, s in enumerate(streams):
        with torch.cuda.stream(s):
            torch.cuda._sleep(20_000_000)  # busy: a launch on another stream would race
            a = torch.full((n,), float(i), device="cuda")
            b = torch.ones(n, device="cuda")
            outs.append((i, fast(n, a, b, 1.0)))
    torch.cuda.synchronize()
    for i, out in outs:
        assert torch.all(out == i + 1.0).item()
    a, b = inputs(3000, 5)
    compiled = torch.compile(lambda x, y: fast(x.numel(), x, y, 2.0) * 2, fullgraph=True)
    torch.testing.assert_close(compiled(a, b), (a * b + 2.0) * 2)
    graphed = torch.compile(lambda x, y: fast(x.numel(), x, y, 2.0), mode="reduce-overhead")
    for seed in range(4):
        a, b = inputs(3000, seed)
        torch.testing.assert_close(graphed(a, b).clone(), a * b + 2.0)


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "first-call-in-capture"])
def test_cpp_kernel_in_a_cuda_graph(warm):
    from cuforge.torch import cdiv_grid

    source = SOURCE + f"\n// fresh {uuid.uuid4().hex}\n"
    kernel = cuforge.compile(source, name="custom_op_fresh.cu").kernel("muladd")
    op = custom_op(
        qual("fresh"),
        kernel,
        outputs=("result",),
        out_like="a",
        grid=cdiv_grid("numel", 256),
        block=256,
        cpp=True,
    )
    assert op._cuforge_cpp_why is None
    a, b = inputs(3000, 21)
    if warm:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            op(a.numel(), a, b, 0.5)
        torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = op(a.numel(), a, b, 0.5)
    for seed in (22, 23):
        new_a, new_b = inputs(3000, seed)
        a.copy_(new_a)
        b.copy_(new_b)
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, new_a * new_b + 0.5)


def test_cpp_kernel_on_a_second_gpu():
    from cuforge.torch import cdiv_grid

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    fast, _ = both_paths(
        "muladd", "muladd", outputs=("result",), out_like="a", grid=cdiv_grid("a", 256), block=256
    )
    for dev in (1, 0):
        a = torch.full((4096,), 2.0, device=f"cuda:{dev}")
        out = fast(4096, a, a, 1.0)  # the current device stays cuda:0
        assert out.device == a.device and torch.all(out == 5.0).item()
