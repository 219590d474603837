"""The host-side dispatch of ``cuforge.jit``, without a GPU: what a JitKernel call adds
before the executor's launcher runs.

The launch itself needs a GPU (bench/jit_overhead.py measures it on one). Here the launcher
each path ends in is replaced by one stand-in, the C callable ``"".format`` (it takes the
positional arguments and does next to nothing), so the rows differ only by their dispatch:

* ``launcher(x, out, a, n)`` -- the stand-in alone;
* ``plain[1, 32](x, out, a, n)`` -- a plain Kernel's ``k[grid, block]`` lookup, then the
  stand-in (the Kernel's ``__getitem__`` is the C extension's ``Subscript`` where that
  loads, as on a GPU machine);
* ``f(x, out, a, n, BLOCK=32)`` -- a JitKernel launcher bound once: the specialization
  lookup (dtypes + keywords), then the stand-in;
* ``k[1, 32](x, out, a, n, BLOCK=32)`` -- the JitKernel call as users write it;
* the generated Python launcher bound once -- the same lookup without the C extension (the
  launcher ``k[grid, block]`` returned before the extension's ``JitDispatch``).

Torch CPU tensors stand in for the arrays (only their ``.dtype`` is read). The rows are
interleaved round by round; the figure is the median over ``--repeats`` rounds of ns per
call, each round ``--calls`` back-to-back calls.

    PYTHONPATH=src python3 bench/jit_dispatch_cpu.py [--calls 20000] [--repeats 15]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

SRC = r"""
template <typename T, int BLOCK>
__global__ void scale(const T* x, T* out, T a, int n) {
    int i = blockIdx.x * BLOCK + threadIdx.x;
    if (i < n) out[i] = a * x[i];
}
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20000, help="calls per timed sample")
    ap.add_argument("--repeats", type=int, default=15, help="samples (rounds) per row")
    opts = ap.parse_args()

    import torch

    import cuforge
    from cuforge.runtime import fastlaunch
    from cuforge.runtime.kernel import Kernel

    x = torch.zeros(32)
    out = torch.zeros(32)
    a, n = 2.0, 32
    stand_in = "".format

    k = cuforge.jit(SRC, "scale", arch="sm_80", source_name="bench_jit_scale.cu")
    f = k[1, 32]
    try:
        f(x, out, a, n, BLOCK=32)  # compiles and resolves; the launch itself fails (no GPU)
    except cuforge.CuforgeError:
        pass
    py = k._python_make((1, 32))  # the launcher without the C extension
    for launcher in (f, py):
        try:
            launcher(x, out, a, n, BLOCK=32)  # resolves; the launch itself fails (no GPU)
        except cuforge.CuforgeError:
            pass
        (key,) = launcher.table
        launcher.table[key] = (launcher.table[key][0], stand_in)

    plain = cuforge.compile(
        SRC, name="bench_jit_scale.cu", arch="sm_80", name_expressions=["scale<float, 32>"]
    ).kernel("scale<float, 32>")
    module = fastlaunch.load()
    if module is not None and not isinstance(Kernel.__dict__["__getitem__"], module.Subscript):
        Kernel.__getitem__ = module.Subscript("_configs", Kernel._getitem)  # as on a GPU
    plain._configs[1, 32] = stand_in

    rows = [
        ("launcher alone `launcher(x, out, a, n)`", lambda: stand_in(x, out, a, n)),
        ("plain Kernel `k[1, 32](x, out, a, n)`", lambda: plain[1, 32](x, out, a, n)),
        ("JitKernel bound once `f(x, out, a, n, BLOCK=32)`", lambda: f(x, out, a, n, BLOCK=32)),
        ("JitKernel `k[1, 32](x, out, a, n, BLOCK=32)`", lambda: k[1, 32](x, out, a, n, BLOCK=32)),
        ("generated Python launcher bound once `f(x, out, a, n, BLOCK=32)`",
         lambda: py(x, out, a, n, BLOCK=32)),
    ]  # fmt: skip
    calls = opts.calls
    for _, fn in rows:
        for _ in range(2000):
            fn()
    samples: dict[str, list[float]] = {label: [] for label, _ in rows}
    for _ in range(opts.repeats):
        for label, fn in rows:
            t0 = time.perf_counter_ns()
            for _ in range(calls):
                fn()
            samples[label].append((time.perf_counter_ns() - t0) / calls)
    res = {label: statistics.median(v) for label, v in samples.items()}
    path = f"JitKernel launcher {type(f).__module__}.{type(f).__qualname__}"
    print(
        f"\ncuforge.jit dispatch on the CPU (no GPU; {path}; fast launch path "
        f"{fastlaunch.status()[0]}; Python {sys.version.split()[0]}): median ns per call over "
        f"{opts.repeats} rounds of {calls}\n"
    )
    plain_ns = res[rows[1][0]]
    print("| path | ns / call | over plain Kernel (ns) |")
    print("|---|---:|---:|")
    for label, _ in rows:
        print(f"| {label} | {res[label]:.0f} | {res[label] - plain_ns:+.0f} |")
    print(f"\nJitKernel dispatch over plain Kernel: {res[rows[3][0]] - plain_ns:+.0f} ns")
    return 0


if __name__ == "__main__":
    sys.exit(main())
