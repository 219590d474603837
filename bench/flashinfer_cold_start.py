"""FlashInfer's cold start with and without cuforge, on a GPU machine (not run on the CPU).

Four JIT modules, each through FlashInfer's public API: decode attention
(``single_decode_with_kv_cache``), prefill attention (``single_prefill_with_kv_cache``),
sampling (``sampling_from_probs``) and a norm (``rmsnorm``). Every case is a fresh process
(FlashInfer reads its workspace at import) and times each op's first call (its JIT build
or load included) and the whole run:

1. ``cold``: an empty FlashInfer workspace, cuforge enabled on an empty cache dir with an
   empty ``file://`` remote (FlashInfer builds every module; cuforge stores them);
2. ``cuforge``: a second empty workspace and an empty cuforge dir, the same remote
   (a second machine: no compiler should run);
3. ``flashinfer-warm``: no cuforge, the workspace of case 1 (FlashInfer's own warm
   workspace: ninja finds everything up to date).

Cases 2 and 3 run ``--runs`` times each, interleaved (case 2 on a new empty workspace and
cuforge dir each time); the table gives medians and the ratios. Every program a child
starts is recorded (a spy on ``subprocess.Popen``): machine B's runs must start none.

    python bench/flashinfer_cold_start.py [--out DIR] [--runs 3] [--json results.json]

Needs flashinfer-python 0.7.x, a CUDA GPU, nvcc. ``CUFORGE_REMOTE_NATIVE=allow`` is set for
the children (the throwaway remote is unsigned). Prints one table; ``--json`` writes it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

_CHILD = r"""
import json, os, subprocess, sys, time
t0 = time.perf_counter()
spawned = []  # every program this process starts (ninja, nvcc, c++ ...): machine B's must be none
_popen_init = subprocess.Popen.__init__
def _spy(self, args, *a, **k):
    argv = [args] if isinstance(args, (str, bytes)) else list(args)
    spawned.append(" ".join(map(str, argv))[:300])
    _popen_init(self, args, *a, **k)
subprocess.Popen.__init__ = _spy
if os.environ.get("BENCH_CUFORGE") == "1":
    from cuforge.core.caching import Cache
    import cuforge.flashinfer as cf
    cache = Cache(os.environ["BENCH_CACHE"], remotes=[os.environ["BENCH_REMOTE"]])
    assert cf.enable(cache), cf.hook_problem()
import torch
import flashinfer
t_import = time.perf_counter() - t0
dev = "cuda"
q = torch.randn(32, 128, dtype=torch.float16, device=dev)
k = torch.randn(2048, 8, 128, dtype=torch.float16, device=dev)
v = torch.randn(2048, 8, 128, dtype=torch.float16, device=dev)
qp = torch.randn(512, 32, 128, dtype=torch.float16, device=dev)
probs = torch.softmax(torch.randn(8, 32000, device=dev), dim=-1)
x = torch.randn(64, 4096, dtype=torch.float16, device=dev)
w = torch.randn(4096, dtype=torch.float16, device=dev)
ops = {
    "decode": lambda: flashinfer.single_decode_with_kv_cache(q, k, v),
    "prefill": lambda: flashinfer.single_prefill_with_kv_cache(qp, k, v, causal=True),
    "sampling": lambda: flashinfer.sampling.sampling_from_probs(probs),
    "norm": lambda: flashinfer.norm.rmsnorm(x, w),
}
times = {"import": t_import}
for name, op in ops.items():
    t = time.perf_counter()
    op()
    torch.cuda.synchronize()
    times[name] = time.perf_counter() - t
times["total"] = time.perf_counter() - t0
counters = {}
if os.environ.get("BENCH_CUFORGE") == "1":
    counters = {k: v for k, v in cache.counters.items() if k.startswith("flashinfer")}
print("RESULT " + json.dumps({"times": times, "counters": counters, "spawned": spawned}))
"""


def _run(case: str, env: dict[str, str]) -> dict:
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=3600
    )
    if proc.returncode != 0:
        raise SystemExit(f"{case} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")][-1]
    out = json.loads(line[len("RESULT ") :])
    out["wall"] = time.perf_counter() - started
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="work dir (default: a temp dir)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument(
        "--runs", type=int, default=3, help="runs of the two warm cases (medians reported)"
    )
    args = parser.parse_args()
    root = args.out or tempfile.mkdtemp(prefix="cuforge-fi-bench-")
    remote = os.path.join(root, "remote")
    os.makedirs(remote, exist_ok=True)
    base = dict(os.environ, CUFORGE_REMOTE_NATIVE="allow", BENCH_REMOTE=f"file://{remote}")

    def machine_b(i: int) -> dict[str, str]:  # an empty workspace and cuforge dir each run
        return dict(
            base,
            BENCH_CUFORGE="1",
            FLASHINFER_WORKSPACE_BASE=f"{root}/ws-b{i}",
            BENCH_CACHE=f"{root}/cuforge-b{i}",
        )

    warm_fi = dict(base, BENCH_CUFORGE="0", FLASHINFER_WORKSPACE_BASE=f"{root}/ws-a")
    cold_env = dict(
        base,
        BENCH_CUFORGE="1",
        FLASHINFER_WORKSPACE_BASE=f"{root}/ws-a",
        BENCH_CACHE=f"{root}/cuforge-a",
    )
    runs: dict[str, list[dict]] = {
        "cold": [_run("cold", cold_env)],
        "cuforge": [],
        "flashinfer-warm": [],
    }
    for i in range(args.runs):  # interleaved, so drift hits both cases alike
        runs["cuforge"].append(_run("cuforge", machine_b(i)))
        runs["flashinfer-warm"].append(_run("flashinfer-warm", warm_fi))
    cols = ["import", "decode", "prefill", "sampling", "norm", "total"]
    median = {
        case: {c: statistics.median(r["times"][c] for r in rs) for c in cols}
        for case, rs in runs.items()
    }
    print(f"{'case (median)':<16}" + "".join(f"{c:>10}" for c in cols) + "  runs")
    for case, m in median.items():
        print(f"{case:<16}" + "".join(f"{m[c]:>10.2f}" for c in cols) + f"  {len(runs[case])}")
    for case, rs in runs.items():
        print(
            f"{case}: counters {rs[-1]['counters']}; programs spawned per run "
            f"{[len(r['spawned']) for r in rs]} ({sorted({os.path.basename(a.split()[0]) for r in rs for a in r['spawned']})})"
        )
    ops = ["decode", "prefill", "sampling", "norm"]
    jit = {case: sum(m[c] for c in ops) for case, m in median.items()}
    print(
        f"machine B (cuforge's remote) against FlashInfer's own warm workspace: "
        f"{median['cuforge']['total'] / median['flashinfer-warm']['total']:.2f}x whole run, "
        f"{jit['cuforge'] / jit['flashinfer-warm']:.2f}x the four first calls; against the cold "
        f"JIT: {median['cuforge']['total'] / median['cold']['total']:.3f}x"
    )
    results = {"runs": runs, "median": median}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
