"""Issue 21's two benchmarks, on a GPU (each case in a fresh process):

1. torch.compile cold start of a transformer block (d=1024, fp16, 8 x 256 tokens): the time
   to the first compiled output with (a) no cache (empty dirs), (b) torch's and Triton's own
   caches warm on this machine, (c) cuforge with a remote hit only (empty local dirs, a
   file:// remote filled by an earlier process);
2. a ``@triton.jit`` vector add: the time from its first call to its launch, (a) cold, (b)
   Triton's own warm disk cache, (c) a cuforge remote hit only.

    PYTHONPATH=src python3 bench/triton_cache.py --json $OUT/triton.json

Figures are ratios against (b), measured in the same run (docs/benchmarks.md).

``--breakdown`` also says where each case's fresh process spends its time (imports, cuforge's
enable, Triton's cache-manager calls, ``triton.compile``, the C compiler builds of Triton's
native modules, their loads, the cubin load and launcher set-up, every subprocess by program,
Triton's own hit/compile counts, cuforge's key of the Triton build: ``build_key``, in place of
``triton_key``); times are inclusive (a row can contain another):

    PYTHONPATH=src python3 bench/triton_cache.py --only vecadd --breakdown --repeat 1
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
MARK("import torch")
if USE_CUFORGE:
    from cuforge.torch import compile_cache
    assert compile_cache.enable()
    MARK("import cuforge.torch.compile_cache + enable")
HOOK()
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
MARK("model on the GPU")
t1 = time.perf_counter()
with torch.no_grad():
    out = torch.compile(model)(x)
torch.cuda.synchronize()
t2 = time.perf_counter()
MARK("first compiled output")
print(json.dumps({"first_output_s": t2 - t1, "process_s": t2 - t0, "breakdown": REPORT()}))
"""

# without --breakdown: no-ops; with it, BREAKDOWN_CODE below
NO_BREAKDOWN = """
def MARK(label): pass
def HOOK(): pass
def REPORT(): return None
"""

BREAKDOWN_CODE = """
import time as _time
_T = [_time.perf_counter()]
_ROWS = {}
_DEPTH = [0]


def _add(label, seconds):
    row = _ROWS.setdefault(label, [0, 0.0])
    row[0] += 1
    row[1] += seconds


def MARK(label):
    now = _time.perf_counter()
    _add("phase: " + label, now - _T[0])
    _T[0] = now


def _wrap(owner, name, label, guard=False):
    original = getattr(owner, name, None)
    if original is None or getattr(original, "_bench_wrapped", False):
        return

    def wrapper(*args, **kwargs):
        if guard and _DEPTH[0]:
            return original(*args, **kwargs)
        tag = label(args) if callable(label) else label
        _DEPTH[0] += guard
        start = _time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            _add(tag, _time.perf_counter() - start)
            _DEPTH[0] -= guard

    wrapper._bench_wrapped = True
    setattr(owner, name, wrapper)


def _program(args):
    import os
    cmd = args[0] if args else "?"
    first = cmd if isinstance(cmd, str) else (cmd[0] if cmd else "?")
    return "subprocess: " + os.path.basename(str(first).split()[0])


def HOOK():
    import subprocess
    import triton
    import triton.compiler
    import triton.runtime.build as build
    import triton.runtime.cache as tcache
    from triton.compiler import compiler

    for name in ("run", "call", "check_call", "check_output"):
        _wrap(subprocess, name, _program, guard=True)
    _wrap(build, "_build", "C compiler build of a native module (Triton's _build)")
    _wrap(build, "_load_module_from_path", "native module load (.so import)")
    _wrap(triton.compiler, "compile", "triton.compile (key, cache lookup, load; compile on a miss)")
    _wrap(tcache, "triton_key", "triton_key() (hash of Triton's own files)")
    _wrap(compiler.CompiledKernel, "_init_handles", "CompiledKernel._init_handles (cubin load + launcher)")
    try:
        from triton.backends.nvidia import driver as nv
        _wrap(nv.CudaUtils, "__init__", "CudaUtils() (cuda_utils module: build or cache)")
        if hasattr(nv, "CudaLauncher"):
            _wrap(nv.CudaLauncher, "__init__", "CudaLauncher() (launcher module: build or cache)")
    except ImportError:
        pass
    managers = [tcache.FileCacheManager]
    try:
        import cuforge.triton as ct
        managers.append(ct.CacheManager)
        _wrap(ct, "build_key", "cuforge build_key() (Triton's build from pip's RECORD; memoized)")
        _wrap(ct, "cache_key", "cuforge cache_key() (Triton's get_cache_key with build_key)")
    except ImportError:
        pass
    for cls in managers:
        for method in ("get_group", "get_file", "put", "put_group"):
            _wrap(cls, method, "cache: " + cls.__module__.split(".")[0] + " " + method)
    hits = [0, 0]

    def listener(*, src, metadata, metadata_group, times, cache_hit):
        hits[0 if cache_hit else 1] += 1
        _ROWS["triton listener: count = hits, seconds = compiles"] = [hits[0], float(hits[1])]

    if getattr(triton.knobs.compilation, "listener", None) is None:
        triton.knobs.compilation.listener = listener


def REPORT():
    return {k: {"count": v[0], "seconds": v[1]} for k, v in _ROWS.items()}
"""

VECADD = """
import time, json
t0 = time.perf_counter()
import torch, triton, triton.language as tl
MARK("import torch + triton")
if USE_CUFORGE:
    import cuforge.triton
    assert cuforge.triton.enable()
    MARK("import cuforge.triton + enable")
HOOK()
@triton.jit
def add_kernel(x, y, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)
n = 1 << 20
x = torch.rand(n, device="cuda"); y = torch.rand(n, device="cuda"); out = torch.empty_like(x)
torch.cuda.synchronize()
MARK("tensors on the GPU")
t1 = time.perf_counter()
add_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
torch.cuda.synchronize()
t2 = time.perf_counter()
MARK("first call to launch")
assert torch.allclose(out, x + y)
print(json.dumps({"first_output_s": t2 - t1, "process_s": t2 - t0, "breakdown": REPORT()}))
"""


BREAKDOWN = [False]


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
    helpers = BREAKDOWN_CODE if BREAKDOWN[0] else NO_BREAKDOWN
    program = f"USE_CUFORGE = {use_cuforge!r}\n" + helpers + textwrap.dedent(code)
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
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="print where each case's fresh process spends its time (inclusive rows)",
    )
    args = parser.parse_args()
    BREAKDOWN[0] = args.breakdown
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
    if args.breakdown:
        for name, cases in out.items():
            for case, r in cases.items():
                best = min(r["runs"], key=lambda run: run["first_output_s"])
                print(f"\n{name} / {case} (the best run: {best['first_output_s']:.3f} s)")
                rows = sorted((best.get("breakdown") or {}).items(), key=lambda kv: kv[0])
                for label, row in rows:
                    print(f"  {row['seconds']:8.3f} s  x{row['count']:<4d} {label}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
