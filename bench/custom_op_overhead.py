"""What a cuforge kernel costs per call as a torch custom op (GPU).

    PYTHONPATH=src python3 bench/custom_op_overhead.py [--repeats 15] [--calls 1000] [--json out.json]

One tiny kernel (muladd on 4096 floats: launch-bound, so the figures are overhead), called
several ways in one process, host time per call (median of --repeats rounds of --calls
back-to-back calls, every row once per round, interleaved; each sample ends in a
synchronize):

* ``kernel``: the plain ``cuforge.Kernel`` launch with a preallocated output -- the anchor of
  the "× kernel" column (issue 25's goals: eager op <= 2×, under torch.compile <= 3×);
* ``empty_like + kernel``: the same with the output allocated per call, as an out-of-place
  op must;
* ``op, kernel mode``: ``custom_op(..., kernel, outputs=..., out_like=...)`` called eagerly,
  with the Python CUDA kernel (a lambda grid keeps it Python) through the shim's eager entry
  to that Python kernel, and the same op as ``torch.ops.<ns>.<op>.default`` (through the
  dispatcher, as before the entry);
* ``op, kernel mode, in place``: the same kernel as an op that writes a passed-in tensor;
* ``op, kernel mode, C++ kernel``: both again with the C++ CUDA kernel of
  ``cuforge.torch.opshim`` (``grid=cdiv_grid(...)``, ``cpp=True``), eagerly (the op's eager
  entry) and compiled, and the same op called as ``torch.ops.<ns>.<op>.default`` (torch's
  Python -> dispatcher path, which the eager entry skips);
* ``each op a compiled model adds``: a ``torch.compile``'d chain of 9 ops against the
  one-op function, per extra op, round by round (the compiled region's own per-call cost
  cancels);
* floors, for context: ``torch.ops.aten.empty_like`` called eagerly (a C++ aten op through
  the dispatcher from Python) and a ``torch.compile``'d function holding only
  ``torch.empty_like(x)`` (the per-call floor of a compiled region);
* ``op, launcher mode``: ``custom_op`` over a typed Python launcher, called eagerly (its
  eager entry), and through the dispatcher;
* ``torch's own custom_op``: the same launcher through ``torch.library.custom_op`` (the
  registration cuforge used before issue 25: three Python layers per call more);
* ``torch.compile``: the launcher op, and the in-place kernel op, inside
  ``torch.compile(fullgraph=True)`` functions, and the launcher op under
  ``torch.compile(mode="reduce-overhead")`` (torch's CUDA graphs);
* ``CUDA graph replay``: ten op calls captured once, replayed (per op call);

and the peer rows of bench/_peers.py (raw ``cuda.bindings`` ``cuLaunchKernel`` -- the anchor
of the "× raw" column --, the raw METH_FASTCALL floor, cuforge ``k[1, 32]``, cuda.core,
CuPy, a torch op, Triton) in the same rounds.

Prints a markdown table.
"""

# no `from __future__ import annotations`: torch.library.custom_op reads the launchers'
# hints, which name a Tensor imported inside main()
import argparse
import json
import sys
import uuid

import _peers

SOURCE = r"""
extern "C" __global__ void muladd(int numel, const float* a, const float* b, float c,
                                  float* result) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < numel) result[i] = a[i] * b[i] + c;
}
"""


CHAIN = 8
CPP_CHAIN = f"torch.compile(fullgraph=True), {CHAIN + 1} C++ kernel ops in a chain"
LAUNCHER_CHAIN = f"torch.compile(fullgraph=True), {CHAIN + 1} launcher ops in a chain"
CPP_MARGINAL = "torch.compile(fullgraph=True), C++ kernel op: each op a compiled model adds"
LAUNCHER_MARGINAL = "torch.compile(fullgraph=True), launcher op: each op a compiled model adds"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15, help="rounds (samples) per row")
    parser.add_argument("--calls", type=int, default=1000, help="calls per timed sample")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()

    import torch
    from torch import Tensor

    import cuforge
    from cuforge.torch import cdiv_grid, custom_op

    if not torch.cuda.is_available():
        print("bench/custom_op_overhead.py needs a CUDA GPU", file=sys.stderr)
        return 2
    n = 4096
    k = cuforge.compile(SOURCE, name="custom_op_bench.cu").kernel("muladd")
    ns = f"cuforge_bench_{uuid.uuid4().hex[:8]}"
    grid = lambda numel, a, b, c, result: (numel + 255) // 256  # noqa: E731
    # a lambda grid keeps the CUDA kernel Python (with the eager entry to it)
    kernel_op = custom_op(
        f"{ns}::muladd_k", k, outputs=("result",), out_like="a", grid=grid, block=256
    )
    inplace_op = custom_op(f"{ns}::muladd_i", k, mutates_args=("result",), grid=grid, block=256)
    for op in (kernel_op, inplace_op):
        if op._cuforge_entry_why:
            print(f"no eager entry to the Python kernel: {op._cuforge_entry_why}", file=sys.stderr)
    cgrid = cdiv_grid("numel", 256)
    cpp_op = custom_op(
        f"{ns}::muladd_c", k, outputs=("result",), out_like="a", grid=cgrid, block=256, cpp=True
    )
    cpp_inplace = custom_op(
        f"{ns}::muladd_ci", k, mutates_args=("result",), grid=cgrid, block=256, cpp=True
    )
    if cpp_op._cuforge_cpp_why or cpp_inplace._cuforge_cpp_why:
        print(f"the C++ kernel is not used: {cpp_op._cuforge_cpp_why}", file=sys.stderr)

    @custom_op(f"{ns}::muladd_l", out_like="a")
    def launcher_op(a: Tensor, b: Tensor, c: float) -> Tensor:
        result = torch.empty_like(a)
        numel = a.numel()
        k[(numel + 255) // 256, 256](numel, a, b, c, result)
        return result

    @torch.library.custom_op(f"{ns}::muladd_t", mutates_args=())
    def torch_op(a: Tensor, b: Tensor, c: float) -> Tensor:
        result = torch.empty_like(a)
        numel = a.numel()
        k[(numel + 255) // 256, 256](numel, a, b, c, result)
        return result

    torch_op.register_fake(lambda a, b, c: torch.empty_like(a))

    a = torch.randn(n, device="cuda")
    b = torch.randn(n, device="cuda")
    out = torch.empty_like(a)
    launch = k[(n + 255) // 256, 256]
    ref = a * b + 0.5
    launch(n, a, b, 0.5, out)
    for result in (out, kernel_op(n, a, b, 0.5), launcher_op(a, b, 0.5), torch_op(a, b, 0.5)):
        torch.testing.assert_close(result, ref)
    torch.testing.assert_close(cpp_op(n, a, b, 0.5), ref)
    for op in (inplace_op, cpp_inplace):
        out.zero_()
        op(n, a, b, 0.5, out)
        torch.testing.assert_close(out, ref)

    compiled = torch.compile(lambda x, y: launcher_op(x, y, 0.5), fullgraph=True)
    torch.testing.assert_close(compiled(a, b), ref)

    def inplace(x, y, r):
        inplace_op(n, x, y, 0.5, r)
        return r

    compiled_inplace = torch.compile(inplace, fullgraph=True)
    out.zero_()
    torch.testing.assert_close(compiled_inplace(a, b, out), ref)
    compiled_cpp = torch.compile(lambda x, y: cpp_op(n, x, y, 0.5), fullgraph=True)
    torch.testing.assert_close(compiled_cpp(a, b), ref)

    def cpp_inplace_fn(x, y, r):
        cpp_inplace(n, x, y, 0.5, r)
        return r

    compiled_cpp_inplace = torch.compile(cpp_inplace_fn, fullgraph=True)
    out.zero_()
    torch.testing.assert_close(compiled_cpp_inplace(a, b, out), ref)

    # the marginal cost of one op inside a compiled model: a chain of CHAIN + 1 ops against
    # the one-op function, per extra op (what each op a model adds costs; the compiled
    # region's own per-call cost, the floor row below, cancels)
    def cpp_chain(x, y):
        for _ in range(CHAIN + 1):
            x = cpp_op(n, x, y, 0.5)
        return x

    def launcher_chain(x, y):
        for _ in range(CHAIN + 1):
            x = launcher_op(x, y, 0.5)
        return x

    compiled_cpp_chain = torch.compile(cpp_chain, fullgraph=True)
    compiled_launcher_chain = torch.compile(launcher_chain, fullgraph=True)
    for chain in (compiled_cpp_chain, compiled_launcher_chain):
        torch.testing.assert_close(chain(a, b), cpp_chain(a, b))
    compiled_floor = torch.compile(lambda x: torch.empty_like(x), fullgraph=True)
    compiled_floor(a)
    aten_empty_like = torch.ops.aten.empty_like.default
    cpp_overload = cpp_op._opoverload
    kernel_overload, inplace_overload = kernel_op._opoverload, inplace_op._opoverload
    launcher_overload = launcher_op._opoverload
    # torch.compile's CUDA graphs: the compiled region is replayed, Python runs once per call
    graphed = torch.compile(lambda x, y: launcher_op(x, y, 0.5), mode="reduce-overhead")
    for _ in range(3):
        torch.testing.assert_close(graphed(a, b), ref)

    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            launcher_op(a, b, 0.5)
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        for _ in range(10):
            g_out = launcher_op(a, b, 0.5)
    graph.replay()
    torch.testing.assert_close(g_out, ref)

    def alloc_and_launch():
        r = torch.empty_like(a)
        launch(n, a, b, 0.5, r)

    anchor = "kernel `f(n, a, b, c, out)`, bound launcher (anchor)"
    rows = [
        (anchor, lambda: launch(n, a, b, 0.5, out)),
        ("kernel `k[16, 256](n, a, b, c, out)`", lambda: k[16, 256](n, a, b, 0.5, out)),
        ("empty_like + kernel", alloc_and_launch),
        ("op, kernel mode (allocates the output)", lambda: kernel_op(n, a, b, 0.5)),
        ("op, kernel mode, in place", lambda: inplace_op(n, a, b, 0.5, out)),
        (
            "op, kernel mode, through the dispatcher (`torch.ops...default`), allocates",
            lambda: kernel_overload(n, a, b, 0.5),
        ),
        (
            "op, kernel mode, through the dispatcher, in place",
            lambda: inplace_overload(n, a, b, 0.5, out),
        ),
        ("op, kernel mode, C++ kernel (allocates the output)", lambda: cpp_op(n, a, b, 0.5)),
        ("op, kernel mode, C++ kernel, in place", lambda: cpp_inplace(n, a, b, 0.5, out)),
        (
            "op, C++ kernel through the dispatcher (`torch.ops...default`: what the eager "
            "entry skips)",
            lambda: cpp_overload(n, a, b, 0.5),
        ),
        ("op, launcher mode (allocates the output)", lambda: launcher_op(a, b, 0.5)),
        ("op, launcher mode, through the dispatcher", lambda: launcher_overload(a, b, 0.5)),
        ("torch's own `torch.library.custom_op`, same launcher", lambda: torch_op(a, b, 0.5)),
        ("torch.compile(fullgraph=True), launcher op", lambda: compiled(a, b)),
        ("torch.compile(fullgraph=True), in-place kernel op", lambda: compiled_inplace(a, b, out)),
        ("torch.compile(fullgraph=True), C++ kernel op", lambda: compiled_cpp(a, b)),
        (
            "torch.compile(fullgraph=True), in-place C++ kernel op",
            lambda: compiled_cpp_inplace(a, b, out),
        ),
        (CPP_CHAIN, lambda: compiled_cpp_chain(a, b)),
        (LAUNCHER_CHAIN, lambda: compiled_launcher_chain(a, b)),
        ("floor: torch.compile'd `torch.empty_like(x)` alone", lambda: compiled_floor(a)),
        ("floor: `torch.ops.aten.empty_like.default(a)`, eager", lambda: aten_empty_like(a)),
        ('torch.compile(mode="reduce-overhead"), launcher op', lambda: graphed(a, b)),
        ("CUDA graph replay (per op, 10 per graph)", graph.replay),
    ]
    peers, notes = _peers.peer_rows(torch, cuforge)
    samples = _peers.measure(rows + peers, args.calls, args.repeats, torch.cuda.synchronize)
    samples["CUDA graph replay (per op, 10 per graph)"] = [
        t / 10 for t in samples["CUDA graph replay (per op, 10 per graph)"]
    ]
    # per extra op in the chains, round by round (each round measured every row once)
    for chain, one, label in (
        (CPP_CHAIN, "torch.compile(fullgraph=True), C++ kernel op", CPP_MARGINAL),
        (LAUNCHER_CHAIN, "torch.compile(fullgraph=True), launcher op", LAUNCHER_MARGINAL),
    ):
        samples[label] = [
            (c - o) / CHAIN for c, o in zip(samples[chain], samples[one], strict=True)
        ]
        rows.append((label, None))
    med = _peers.medians(samples)
    raw, plain = med.get(_peers.RAW), med[anchor]
    print(
        f"\ntorch.custom_op overhead on {torch.cuda.get_device_name()}: median host µs per call "
        f"over {args.repeats} interleaved rounds of {args.calls} calls (torch {torch.__version__}, "
        f"Python {sys.version.split()[0]})\n"
    )
    print("| call | µs / call | × kernel | × raw cuLaunchKernel |")
    print("|---|---:|---:|---:|")
    for label, _ in rows + peers:
        t = med[label]
        print(f"| {label} | {t:.2f} | {t / plain:.2f}× | {_peers.ratio(t, raw)} |")
    for label, note in notes.items():
        print(f"| {label} | - | - | {note} |")
    print()
    goals = (
        ("op, kernel mode (allocates the output)", 2.0),
        ("op, kernel mode, in place", 2.0),
        ("op, kernel mode, C++ kernel (allocates the output)", 2.0),
        ("op, kernel mode, C++ kernel, in place", 2.0),
        ("op, launcher mode (allocates the output)", 2.0),
        ("torch.compile(fullgraph=True), launcher op", 3.0),
        ("torch.compile(fullgraph=True), in-place kernel op", 3.0),
        ("torch.compile(fullgraph=True), C++ kernel op", 3.0),
        ("torch.compile(fullgraph=True), in-place C++ kernel op", 3.0),
        (CPP_MARGINAL, 3.0),
        (LAUNCHER_MARGINAL, 3.0),
    )
    for label, goal in goals:
        print(f"{label} / kernel = {med[label] / plain:.2f} (goal <= {goal}, issue 25)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"gpu": torch.cuda.get_device_name(), "medians": med, "notes": notes}, f, indent=1
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
