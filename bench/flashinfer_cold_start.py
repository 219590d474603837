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

    python bench/flashinfer_cold_start.py [--out DIR] [--json results.json]

Needs flashinfer-python 0.7.x, a CUDA GPU, nvcc. ``CUFORGE_REMOTE_NATIVE=allow`` is set for
the children (the throwaway remote is unsigned). Prints one table; ``--json`` writes it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

_CHILD = r"""
import json, os, sys, time
t0 = time.perf_counter()
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
print("RESULT " + json.dumps({"times": times, "counters": counters}))
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
    args = parser.parse_args()
    root = args.out or tempfile.mkdtemp(prefix="cuforge-fi-bench-")
    remote = os.path.join(root, "remote")
    os.makedirs(remote, exist_ok=True)
    base = dict(os.environ, CUFORGE_REMOTE_NATIVE="allow", BENCH_REMOTE=f"file://{remote}")
    cases = [
        (
            "cold",
            dict(
                base,
                BENCH_CUFORGE="1",
                FLASHINFER_WORKSPACE_BASE=f"{root}/ws-a",
                BENCH_CACHE=f"{root}/cuforge-a",
            ),
        ),
        (
            "cuforge",
            dict(
                base,
                BENCH_CUFORGE="1",
                FLASHINFER_WORKSPACE_BASE=f"{root}/ws-b",
                BENCH_CACHE=f"{root}/cuforge-b",
            ),
        ),
        (
            "flashinfer-warm",
            dict(base, BENCH_CUFORGE="0", FLASHINFER_WORKSPACE_BASE=f"{root}/ws-a"),
        ),
    ]
    results = {case: _run(case, env) for case, env in cases}
    cols = ["import", "decode", "prefill", "sampling", "norm", "total"]
    print(f"{'case':<16}" + "".join(f"{c:>10}" for c in cols) + "  counters")
    for case, r in results.items():
        row = "".join(f"{r['times'][c]:>10.2f}" for c in cols)
        print(f"{case:<16}{row}  {r['counters']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
