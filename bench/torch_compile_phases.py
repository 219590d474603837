"""Where a torch.compile cold start goes, by phase, with each cache state (issue 21: "say
where (3)'s time goes"). Runs on the CPU (Inductor's CPU backend uses the same FX-graph and
AOTAutograd caches as on a GPU; a GPU run adds Triton's kernel loads, which cuforge's
Triton cache serves) or on a GPU (``--device cuda``).

    PYTHONPATH=src python bench/torch_compile_phases.py [--device cpu] [--d 256]

Each case is a fresh process with its own empty dirs, as a second machine has them:

1. ``no_cache``: nothing cached anywhere;
2. ``own_warm``: torch's own caches (``TORCHINDUCTOR_CACHE_DIR``) warm from an earlier
   process on the same dirs (the anchor);
3. ``cuforge_remote``: empty local dirs, cuforge's ``file://`` remote filled by an earlier
   process (``cuforge.torch.compile_cache.enable()``).

For each: the time to the first compiled output, and torch's own per-phase compile times
(``torch._dynamo.utils.compile_times()``: Dynamo's tracing, AOTAutograd, Inductor's
``compile_fx`` including the FX-graph cache lookup and load) plus the time spent in
cuforge's cache (remote reads and local writes) in case 3.
"""

from __future__ import annotations

import argparse
import json
import tempfile

import triton_cache  # bench/: the child runner and the fresh dirs of issue 21's GPU bench
from triton_cache import fresh

CHILD = """
import json, time
t0 = time.perf_counter()
import torch
spent = {"cuforge cache": 0.0}
if USE_CUFORGE:
    import cuforge
    from cuforge.torch import compile_cache
    assert compile_cache.enable()
    cache = cuforge.default_cache()
    real_get = type(cache).get_with_tier
    def timed_get(self, *a, **k):
        t = time.perf_counter()
        try:
            return real_get(self, *a, **k)
        finally:
            spent["cuforge cache"] += time.perf_counter() - t
    type(cache).get_with_tier = timed_get
from torch._dynamo.utils import compile_times, counters

class Block(torch.nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.attn = torch.nn.MultiheadAttention(d, heads, batch_first=True)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))
    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))

torch.manual_seed(0)
model = Block(D, max(1, D // 64)).to(DEVICE).eval()
x = torch.randn(2, 64, D, device=DEVICE)
t1 = time.perf_counter()
with torch.no_grad():
    out = torch.compile(model)(x)
if DEVICE == "cuda":
    torch.cuda.synchronize()
t2 = time.perf_counter()
phases = {}
names, values = compile_times(repr="csv", aggregate=True)
for name, value in zip(names, values):
    try:
        phases[name] = float(value)
    except (TypeError, ValueError):
        pass
print(json.dumps({
    "first_output_s": t2 - t1, "imports_s": t1 - t0, "phases": phases, "spent": spent,
    "fxgraph_hit": counters["inductor"]["fxgraph_cache_hit"],
    "fxgraph_miss": counters["inductor"]["fxgraph_cache_miss"],
}))
"""


def run(dirs: dict[str, str], use_cuforge: bool, remote: str | None, args) -> dict:
    """One fresh process, through bench/triton_cache.py's child runner (same env, dirs)."""
    return triton_cache.run(
        f"D = {args.d}\nDEVICE = {args.device!r}\n" + CHILD, dirs, use_cuforge, remote
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--d", type=int, default=256, help="model width (heads = d // 64)")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="cuforge-torch-phases-") as root:
        out = {"no_cache": run(fresh(root, "cold"), False, None, args)}
        warm = fresh(root, "warm")
        run(warm, False, None, args)
        out["own_warm"] = run(warm, False, None, args)
        remote = tempfile.mkdtemp(prefix="remote-", dir=root)
        run(fresh(root, "fill"), True, f"file://{remote}", args)
        out["cuforge_remote"] = run(fresh(root, "hit"), True, f"file://{remote}", args)
    anchor = out["own_warm"]["first_output_s"]
    for case, r in out.items():
        print(
            f"{case:15s} first output {r['first_output_s']:7.3f} s  "
            f"{r['first_output_s'] / anchor:5.2f}x own warm  "
            f"(FX graph cache: {r['fxgraph_hit']} hit, {r['fxgraph_miss']} miss)"
        )
        top = sorted(r["phases"].items(), key=lambda kv: -kv[1])[:8]
        for name, seconds in top:
            print(f"    {seconds:7.3f} s  {name}")
        if r["spent"].get("cuforge cache"):
            print(f"    {r['spent']['cuforge cache']:7.3f} s  cuforge's cache lookups (all tiers)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
