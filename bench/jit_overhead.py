"""Per-call overhead of ``cuforge.jit``: a JitKernel call vs its executor, a plain Kernel and
Triton's ``@jit`` launch.

Runs on a GPU machine. One kernel, ``scale<T, BLOCK>(const T* x, T* out, T a, int n)``
(2 pointers + 2 scalars, a 1x32 launch so the GPU is never the bottleneck), launched:

* ``k[1, 32](x, out, a, n, BLOCK=32)`` -- the JitKernel (per-call specialization lookup);
* ``f = k[1, 32]; f(...)`` -- the same with the launcher bound once;
* ``exe[1, 32](x, out, a, n)`` -- the executor from ``k.compile(...)`` (a Kernel);
* the plain Kernel: ``cuforge.compile(..., name_expressions=["scale<float, 32>"])``, the
  anchor every ratio is taken against, measured in the same run;
* Triton's ``@triton.jit`` kernel with a ``tl.constexpr`` BLOCK (when triton is installed);
* the peer rows of bench/_peers.py (raw ``cuda.bindings`` ``cuLaunchKernel`` -- the anchor of
  the "× raw" column --, the raw METH_FASTCALL floor, cuforge ``k[1, 32]`` on saxpy,
  cuda.core, CuPy, a torch op, Triton), in the same rounds.

The rows are interleaved round by round; each sample is ``--launches`` back-to-back
launches (the GPU drains between samples); the figure is the median over ``--repeats``
samples of host microseconds per launch.

    PYTHONPATH=src python3 bench/jit_overhead.py [--launches 1000] [--repeats 31] [--json out.json]

Goals: JitKernel - plain Kernel <= 0.5 us (issue 25; <= 1.5 us, issue 14: the exit status).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import _peers

SRC = r"""
template <typename T, int BLOCK>
__global__ void scale(const T* x, T* out, T a, int n) {
    int i = blockIdx.x * BLOCK + threadIdx.x;
    if (i < n) out[i] = a * x[i];
}
"""


def measure(rows, launches: int, repeats: int, sync) -> dict[str, list[float]]:
    """Host microseconds per launch per row: ``launches`` back-to-back calls timed, rows
    interleaved round by round so that clock drift hits every row alike."""
    for _label, fn in rows:
        for _ in range(500):
            fn()
    sync()
    samples: dict[str, list[float]] = {label: [] for label, _ in rows}
    for _ in range(repeats):
        for label, fn in rows:
            sync()
            t0 = time.perf_counter_ns()
            for _ in range(launches):
                fn()
            t1 = time.perf_counter_ns()
            sync()
            samples[label].append((t1 - t0) / launches / 1e3)
    return samples


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--launches", type=int, default=1000, help="launches per timed sample")
    ap.add_argument("--repeats", type=int, default=31, help="samples (rounds) per row")
    ap.add_argument("--json", help="also write the results here")
    opts = ap.parse_args()

    import torch

    import cuforge

    if not torch.cuda.is_available():
        print("bench/jit_overhead.py needs a CUDA GPU", file=sys.stderr)
        return 2
    n = 32
    x = torch.randn(n, device="cuda")
    out = torch.empty_like(x)
    a = 2.0
    sync = torch.cuda.synchronize

    k = cuforge.jit(SRC, "scale", source_name="bench_jit_scale.cu")
    exe = k.compile(x, out, a, n, BLOCK=32)
    plain = cuforge.compile(
        SRC, name="bench_jit_scale.cu", name_expressions=["scale<float, 32>"]
    ).kernel("scale<float, 32>")
    bound = k[1, 32]
    ref = a * x

    def check(label, fn) -> None:
        out.zero_()
        fn()
        sync()
        if not torch.allclose(out, ref):
            raise SystemExit(f"{label}: wrong result")

    rows = [
        ("plain Kernel `k[1, 32](x, out, a, n)`", lambda: plain[1, 32](x, out, a, n)),
        ("JitKernel `k[1, 32](x, out, a, n, BLOCK=32)`", lambda: k[1, 32](x, out, a, n, BLOCK=32)),
        ("JitKernel, launcher bound once `f(x, out, a, n, BLOCK=32)`",
         lambda: bound(x, out, a, n, BLOCK=32)),
        ("executor `exe[1, 32](x, out, a, n)` (k.compile)", lambda: exe[1, 32](x, out, a, n)),
    ]  # fmt: skip
    notes = {}
    try:
        import triton
        import triton.language as tl

        @triton.jit
        def tscale(x_ptr, out_ptr, a, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            tl.store(out_ptr + offs, a * tl.load(x_ptr + offs, mask=mask), mask=mask)

        tscale[(1,)](x, out, a, n, BLOCK=32)
        rows.append(
            ("Triton `kernel[(1,)](x, out, a, n, BLOCK=32)`",
             lambda: tscale[(1,)](x, out, a, n, BLOCK=32))
        )  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - no triton (or no working one): the row is skipped
        notes["Triton"] = f"skipped: {type(exc).__name__}: {str(exc)[:160]}"
    for label, fn in rows:
        check(label, fn)

    from cuforge.runtime import fastlaunch

    path = (
        "C launcher"
        if plain._state is not None
        else f"Python fast path (no C launcher: {fastlaunch.error()})"
    )
    peers, peer_notes = _peers.peer_rows(torch, cuforge)
    notes.update(peer_notes)
    samples = measure(rows + peers, opts.launches, opts.repeats, sync)
    results = [(label, statistics.median(samples[label])) for label, _ in rows + peers]
    anchor = results[0][1]
    raw = dict(results).get(_peers.RAW)
    print(
        f"\ncuforge.jit per-call overhead on {torch.cuda.get_device_name()}: median host µs per "
        f"launch over {opts.repeats} rounds of {opts.launches} back-to-back launches "
        f"(rows interleaved; torch {torch.__version__}, Python {sys.version.split()[0]}; "
        f"launch path: {path}; JitKernel launcher: {type(bound).__name__})\n"
    )
    print("| path | µs / launch | × plain Kernel | over plain Kernel (µs) | × raw cuLaunchKernel |")
    print("|---|---:|---:|---:|---:|")
    for label, t in results:
        print(
            f"| {label} | {t:.2f} | {t / anchor:.2f}× | {t - anchor:+.2f} | {_peers.ratio(t, raw)} |"
        )
    for label, note in notes.items():
        print(f"| {label} | - | - | - | {note} |")
    jit_over = results[1][1] - anchor
    print(
        f"\nJitKernel - plain Kernel = {jit_over:.2f} µs (goal <= 0.5, issue 25; <= 1.5, issue 14)"
    )
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(
                {
                    "gpu": torch.cuda.get_device_name(),
                    "rows": results,
                    "raw_anchor_us": raw,
                    "notes": notes,
                    "jit_over_plain_us": jit_over,
                },
                f,
                indent=1,
            )
    return 0 if jit_over <= 1.5 else 1


if __name__ == "__main__":
    sys.exit(main())
