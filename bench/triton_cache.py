"""Issue 21's two benchmarks, on a GPU (each case in a fresh process):

1. torch.compile cold start of a transformer block (d=1024, fp16, 8 x 256 tokens): the time
   to the first compiled output with (a) no cache (empty dirs), (b) torch's and Triton's own
   caches warm on this machine, (c) cuforge with a remote hit only (empty local dirs, a
   file:// remote filled by an earlier process);
2. a ``@triton.jit`` vector add: the time from its first call to its launch, (a) cold, (b)
   Triton's own warm disk cache, (c) a cuforge remote hit only.

    PYTHONPATH=src python3 bench/triton_cache.py --json $OUT/triton.json

Figures are ratios against (b), measured in the same run (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")

BLOCK = """
import time, json
t0 = time.perf_counter()
import torch
if USE_CUFORGE:
    from cuforge.torch import compile_cache
    assert compile_cache.enable()
class Block(torch.nn.Module):
    def __init__(self, d=1024, heads=16):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.attn = torch.nn.MultiheadAttention(d, heads, batch_first=True)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))
    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))
torch.manual_seed(0)
model = Block().cuda().half().eval()
x = torch.randn(8, 256, 1024, device="cuda", dtype=torch.half)
torch.cuda.synchronize()
t1 = time.perf_counter()
with torch.no_grad():
    out = torch.compile(model)(x)
torch.cuda.synchronize()
t2 = time.perf_counter()
print(json.dumps({"first_output_s": t2 - t1, "process_s": t2 - t0}))
"""

VECADD = """
import time, json
t0 = time.perf_counter()
import torch, triton, triton.language as tl
if USE_CUFORGE:
    import cuforge.triton
    assert cuforge.triton.enable()
@triton.jit
def add_kernel(x, y, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)
n = 1 << 20
x = torch.rand(n, device="cuda"); y = torch.rand(n, device="cuda"); out = torch.empty_like(x)
torch.cuda.synchronize()
t1 = time.perf_counter()
add_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
torch.cuda.synchronize()
t2 = time.perf_counter()
assert torch.allclose(out, x + y)
print(json.dumps({"first_output_s": t2 - t1, "process_s": t2 - t0}))
"""


def run(code: str, dirs: dict[str, str], use_cuforge: bool, remote: str | None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    env.update(
        CUFORGE_CACHE_DIR=dirs["cuforge"],
        TORCHINDUCTOR_CACHE_DIR=dirs["inductor"],
        TRITON_CACHE_DIR=dirs["triton"],
    )
    env.pop("CUFORGE_REMOTE", None)
    if remote:
        env["CUFORGE_REMOTE"] = remote
    if use_cuforge:  # Inductor's compile workers are other processes
        env["TRITON_CACHE_MANAGER"] = "cuforge.triton:CacheManager"
    program = f"USE_CUFORGE = {use_cuforge!r}\n" + textwrap.dedent(code)
    # a file, not ``python -c``: ``@triton.jit`` reads its function's source from a file
    script = os.path.join(os.path.dirname(dirs["cuforge"]), "bench_child.py")
    with open(script, "w") as f:
        f.write(program)
    done = subprocess.run(
        [sys.executable, script],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        cwd=os.path.dirname(script),
    )
    if done.returncode != 0:
        raise SystemExit(f"a benchmark process failed:\n{done.stdout}\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def fresh(root: str, label: str) -> dict[str, str]:
    base = tempfile.mkdtemp(prefix=label + "-", dir=root)
    return {k: os.path.join(base, k) for k in ("cuforge", "inductor", "triton")}


def bench(code: str, root: str, repeat: int) -> dict:
    results: dict[str, list[dict]] = {"no_cache": [], "own_warm": [], "cuforge_remote": []}
    for _ in range(repeat):
        results["no_cache"].append(run(code, fresh(root, "cold"), False, None))
        warm = fresh(root, "warm")
        run(code, warm, False, None)  # fills torch's and Triton's own caches
        results["own_warm"].append(run(code, warm, False, None))
        remote = tempfile.mkdtemp(prefix="remote-", dir=root)
        run(code, fresh(root, "fill"), True, f"file://{remote}")  # fills the remote
        results["cuforge_remote"].append(run(code, fresh(root, "hit"), True, f"file://{remote}"))
    summary = {}
    for case, runs in results.items():
        best = min(r["first_output_s"] for r in runs)
        summary[case] = {"first_output_s": best, "runs": runs}
    anchor = summary["own_warm"]["first_output_s"]
    for case in summary:
        summary[case]["x_own_warm"] = summary[case]["first_output_s"] / anchor
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--only", choices=("block", "vecadd"))
    args = parser.parse_args()
    # cuforge's bytecode, as an installed package has it (pip compiles it at install time)
    import compileall

    compileall.compile_dir(os.path.join(SRC, "cuforge"), quiet=1)
    out = {}
    with tempfile.TemporaryDirectory(prefix="cuforge-triton-bench-") as root:
        if args.only in (None, "vecadd"):
            out["triton_vecadd_first_call"] = bench(VECADD, root, args.repeat)
        if args.only in (None, "block"):
            out["torch_compile_block"] = bench(BLOCK, root, args.repeat)
    for name, cases in out.items():
        for case, r in cases.items():
            print(
                f"{name:26s} {case:15s} {r['first_output_s']:8.3f} s  {r['x_own_warm']:.2f}x own warm"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
