"""What a cuforge kernel costs per call as a torch custom op (GPU).

    python bench/custom_op_overhead.py [--runs 5] [--calls 2000]

One tiny kernel (muladd on 4096 floats: launch-bound, so the figures are overhead), called
five ways in one process, host time per call (median of --runs runs of --calls calls, each
run ending in a synchronize):

* ``kernel``: the plain ``cuforge.Kernel`` launch with a preallocated output -- the anchor;
* ``op, kernel mode``: ``custom_op(..., kernel, outputs=..., out_like=...)`` called eagerly;
* ``op, launcher mode``: ``custom_op`` over a typed Python launcher, called eagerly;
* ``torch.compile``: the launcher op inside a ``torch.compile(fullgraph=True)`` function;
* ``CUDA graph replay``: ten op calls captured once, replayed (per op call).

Prints a markdown table; every figure is also given as a ratio to the anchor.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

SOURCE = r"""
extern "C" __global__ void muladd(int numel, const float* a, const float* b, float c,
                                  float* result) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < numel) result[i] = a[i] * b[i] + c;
}
"""


def per_call_us(fn, calls: int, runs: int, sync) -> float:
    samples = []
    for _ in range(runs):
        sync()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(samples)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()

    import torch
    from torch import Tensor

    import cuforge
    from cuforge.torch import custom_op

    n = 4096
    k = cuforge.compile(SOURCE, name="custom_op_bench.cu").kernel("muladd")
    ns = f"cuforge_bench_{uuid.uuid4().hex[:8]}"
    kernel_op = custom_op(
        f"{ns}::muladd_k",
        k,
        outputs=("result",),
        out_like="a",
        grid=lambda numel, a, b, c, result: (numel + 255) // 256,
        block=256,
    )

    @custom_op(f"{ns}::muladd_l", out_like="a")
    def launcher_op(a: Tensor, b: Tensor, c: float) -> Tensor:
        result = torch.empty_like(a)
        numel = a.numel()
        k[(numel + 255) // 256, 256](numel, a, b, c, result)
        return result

    a = torch.randn(n, device="cuda")
    b = torch.randn(n, device="cuda")
    out = torch.empty_like(a)
    launch = k[(n + 255) // 256, 256]
    ref = a * b + 0.5
    launch(n, a, b, 0.5, out)
    for result in (out, kernel_op(n, a, b, 0.5), launcher_op(a, b, 0.5)):
        torch.testing.assert_close(result, ref)

    compiled = torch.compile(lambda x, y: launcher_op(x, y, 0.5), fullgraph=True)
    torch.testing.assert_close(compiled(a, b), ref)

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

    sync = torch.cuda.synchronize
    c, r = args.calls, args.runs
    rows = [
        ("kernel (anchor)", per_call_us(lambda: launch(n, a, b, 0.5, out), c, r, sync)),
        ("op, kernel mode", per_call_us(lambda: kernel_op(n, a, b, 0.5), c, r, sync)),
        ("op, launcher mode", per_call_us(lambda: launcher_op(a, b, 0.5), c, r, sync)),
        ("torch.compile(fullgraph=True)", per_call_us(lambda: compiled(a, b), c, r, sync)),
        ("CUDA graph replay (per op)", per_call_us(graph.replay, c // 10, r, sync) / 10),
    ]
    anchor = rows[0][1]
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, median of {r} runs of {c}")
    print("| call | us per call | vs kernel |")
    print("|---|---|---|")
    for label, us in rows:
        print(f"| {label} | {us:.2f} | {us / anchor:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
