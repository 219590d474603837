"""Triton's autotune sweep on a second machine, with and without cuforge (a GPU machine).

An ``@triton.autotune(..., cache_results=True)`` matmul with 8 configs, its first call
(compiles, the benchmark sweep, the launch) timed in fresh processes:

1. ``triton-cold``: no cuforge, an empty ``TRITON_CACHE_DIR`` T (Triton compiles 8 configs
   and benchmarks them, and writes the results to T);
2. ``cuforge-cold``: machine A, cuforge on an empty cache dir and an empty ``file://``
   remote, an empty Triton dir (the same sweep; cuforge stores the kernels and the result);
3. alternating, ``--runs`` times each:
   * ``triton-warm``: no cuforge, T again (the anchor: Triton's own warm autotune cache);
   * ``cuforge-B``: a second machine, fresh Triton and cuforge dirs, the same remote.

The sweep is counted by the autotuner's own ``Autotuner._bench`` (a counting wrapper in the
child): B should benchmark 0 configs and compile 0 kernels (``knobs.compilation.listener``
cache misses). Time is from just after ``import triton`` (cuforge's import and enable count)
to the first result on the GPU.

    python bench/triton_autotune.py [--runs 5] [--json results.json]

Needs Triton 3.6+, torch, a CUDA GPU. ``CUFORGE_REMOTE_NATIVE=allow`` is set for the
children (Triton's launcher modules are native and the throwaway remote is unsigned).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

_CHILD = r"""
import json, os, sys, time
import torch
import triton
import triton.language as tl
t0 = time.perf_counter()
if os.environ.get("BENCH_CUFORGE") == "1":
    from cuforge.core.caching import Cache
    import cuforge.triton as ct
    cache = Cache(os.environ["BENCH_CACHE"], remotes=[os.environ["BENCH_REMOTE"]])
    assert ct.enable(cache), ct.hook_problem()
from triton.runtime import autotuner

benched = [0]
_bench = autotuner.Autotuner._bench
def counting(self, *args, **kwargs):
    benched[0] += 1
    return _bench(self, *args, **kwargs)
autotuner.Autotuner._bench = counting
compiled = [0]
def listener(*, src, metadata, metadata_group, times, cache_hit):
    compiled[0] += not cache_hit
triton.knobs.compilation.listener = listener

configs = [
    triton.Config({"BM": bm, "BN": bn, "BK": bk}, num_warps=w, num_stages=s)
    for bm, bn, bk, w, s in [
        (64, 64, 32, 4, 3), (128, 64, 32, 4, 3), (64, 128, 32, 4, 3), (128, 128, 32, 8, 3),
        (128, 128, 64, 8, 4), (64, 64, 64, 4, 4), (128, 64, 64, 4, 4), (64, 128, 64, 4, 4),
    ]
]

@triton.autotune(configs=configs, key=["M", "N", "K"], cache_results=True)
@triton.jit
def matmul(a, b, c, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pm = tl.program_id(0)
    pn = tl.program_id(1)
    rm = pm * BM + tl.arange(0, BM)
    rn = pn * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        x = tl.load(a + rm[:, None] * K + (k + rk)[None, :])
        y = tl.load(b + (k + rk)[:, None] * N + rn[None, :])
        acc += tl.dot(x, y)
    tl.store(c + rm[:, None] * N + rn[None, :], acc.to(tl.float16))

M = N = K = 2048
a = torch.randn(M, K, device="cuda", dtype=torch.float16)
b = torch.randn(K, N, device="cuda", dtype=torch.float16)
c = torch.empty(M, N, device="cuda", dtype=torch.float16)
grid = lambda meta: (M // meta["BM"], N // meta["BN"])
matmul[grid](a, b, c, M, N, K)
torch.cuda.synchronize()
seconds = time.perf_counter() - t0
ok = torch.allclose(c.float(), (a.float() @ b.float()), atol=1.0, rtol=0.05)
print(json.dumps({"seconds": seconds, "benched": benched[0], "compiled": compiled[0],
                  "best": str(matmul.best_config), "ok": bool(ok)}))
"""


def run(script: str, env: dict[str, str]) -> dict:
    """One fresh child process running ``script`` (a file: ``@triton.jit`` reads its source)."""
    full = dict(os.environ, **env)
    done = subprocess.run(
        [sys.executable, script], env=full, capture_output=True, text=True, timeout=600
    )
    if done.returncode:
        raise SystemExit(f"a child failed ({env}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="alternating runs of each case")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="cuforge-autotune-")
    remote = os.path.join(root, "remote")
    os.mkdir(remote, 0o700)
    src = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.pathsep.join([os.path.join(src, "src"), os.environ.get("PYTHONPATH", "")])
    own = os.path.join(root, "triton-own")
    script = os.path.join(root, "child.py")
    with open(script, "w") as f:
        f.write(_CHILD)

    def case(label: str, n: int, use_cuforge: bool) -> dict[str, str]:
        env = {"PYTHONPATH": path, "TRITON_CACHE_DIR": own}
        if use_cuforge:
            env.update(
                BENCH_CUFORGE="1",
                BENCH_CACHE=os.path.join(root, f"{label}{n}", "cuforge"),
                BENCH_REMOTE=f"file://{remote}",
                TRITON_CACHE_DIR=os.path.join(root, f"{label}{n}", "triton"),
                CUFORGE_REMOTE_NATIVE="allow",
            )
        return env

    results: dict[str, list[dict]] = {"triton-cold": [], "cuforge-cold": []}
    results["triton-cold"].append(run(script, case("triton", 0, False)))
    results["cuforge-cold"].append(run(script, case("a", 0, True)))
    results["triton-warm"], results["cuforge-B"] = [], []
    for n in range(args.runs):
        results["triton-warm"].append(run(script, case("triton", n, False)))
        results["cuforge-B"].append(run(script, case("b", n, True)))
    anchor = statistics.median(r["seconds"] for r in results["triton-warm"])
    print(
        "| case | first call (median) | vs Triton's own warm cache | configs benchmarked | kernels compiled | correct |"
    )
    print("|---|---:|---:|---|---|---|")
    for label, rows in results.items():
        med = statistics.median(r["seconds"] for r in rows)
        benched = sorted({r["benched"] for r in rows})
        compiled = sorted({r["compiled"] for r in rows})
        ok = all(r["ok"] for r in rows)
        print(
            f"| {label} (n={len(rows)}) | {med:.3f} s | {med / anchor:.2f}x | {benched} "
            f"| {compiled} | {ok} |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
