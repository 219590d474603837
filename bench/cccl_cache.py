"""Fresh-process time to a ready cuda.compute ``reduce_into``: cold against a cuforge hit.

Every sample is a new Python process (what a CI job, a worker or a notebook restart pays):

* ``cold``      -- plain ``cuda.compute.make_reduce_into``, its precompiled-header cache
                   empty too (``CCCL_PCH_CACHE_DIR`` = a new dir): a fresh machine;
* ``cold-pch``  -- the same with cuda.compute's precompiled headers already on disk
                   (its best case without cuforge);
* ``hit``       -- ``cuforge.cccl.make_reduce_into`` with the entry in cuforge's disk cache.

Measured in each child: ``make`` = the factory call alone (imports and the CUDA context are
done before the clock starts), and ``total`` = the whole process, start to exit, measured
by the parent (cuforge's bytecode is compiled first, as an installed package's is). On a
GPU machine the child builds for the current device with real arrays
(cupy, else torch), runs the reduction once and checks the sum; without one it builds for
``--cc`` with ``ProxyArray`` and a stub ``libcuda.so.1`` (compiled with ``cc``).

    python bench/cccl_cache.py                 # 5 hits, 3 of each cold kind
    python bench/cccl_cache.py --runs 9 --cold-runs 5 --json out.json

Prints a table of medians and the ratios cold / hit (goal: >= 1000x on ``make``).
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

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

CHILD = r"""
import json, os, sys, time
mode, cc_arg, gpu = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
import numpy as np
import cuda.compute as cc
if mode == "hit":
    import cuforge.cccl as api
else:
    api = cc
xp = None
if gpu:
    from cuda.core import Device
    Device(0).set_current()
    try:
        import cupy as xp
        dev = xp.asarray
        host = xp.asnumpy
        sync = xp.cuda.runtime.deviceSynchronize
    except ImportError:
        import torch
        dev = lambda a: torch.as_tensor(a, device="cuda")
        host = lambda t: t.cpu().numpy()
        sync = torch.cuda.synchronize
    n = 1 << 20
    h_in = (np.arange(n) % 7).astype(np.int32)
    d_in, d_out = dev(h_in), dev(np.zeros(1, np.int32))
    args = dict(d_in=d_in, d_out=d_out, op=cc.OpKind.PLUS, h_init=np.zeros(1, np.int32))
else:
    args = dict(d_in=cc.ProxyArray(np.int32), d_out=cc.ProxyArray(np.int32),
                op=cc.OpKind.PLUS, h_init=np.zeros(1, np.int32), compute_capability=cc_arg)
profile = os.environ.get("CCCL_BENCH_PROFILE") == "1"
if profile:
    import cProfile
    prof = cProfile.Profile()
    prof.enable()
t0 = time.perf_counter()
reducer = api.make_reduce_into(**args)
make = time.perf_counter() - t0
if profile:
    import pstats
    prof.disable()
    pstats.Stats(prof, stream=sys.stderr).sort_stats("cumulative").print_stats(40)
out = {"make": make}
if mode == "hit":
    r = api.last_result()
    out["source"] = r.source_of_result
if gpu:
    t1 = time.perf_counter()
    nbytes = reducer(temp_storage=None, d_in=d_in, d_out=d_out, num_items=n,
                     op=cc.OpKind.PLUS, h_init=np.zeros(1, np.int32))
    tmp = dev(np.zeros(max(int(nbytes), 1), np.uint8))
    reducer(temp_storage=tmp, d_in=d_in, d_out=d_out, num_items=n,
            op=cc.OpKind.PLUS, h_init=np.zeros(1, np.int32))
    sync()
    out["first_run"] = time.perf_counter() - t1
    got, want = int(host(d_out)[0]), int(h_in.astype(np.int64).sum())
    out["correct"] = got == want
print(json.dumps(out))
"""


def gpu_visible() -> bool:
    import ctypes

    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    count = ctypes.c_int(0)
    return (
        cuda.cuInit(0) == 0 and cuda.cuDeviceGetCount(ctypes.byref(count)) == 0 and count.value > 0
    )


def child_env(cache_dir: str, pch_dir: str | None, stub_dir: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(ROOT, "src") + os.pathsep + env.get("PYTHONPATH", "")
    env["CUFORGE_CACHE_DIR"] = cache_dir
    for name in ("CUFORGE_DISABLE_CACHE", "CUFORGE_DISABLE_FILE_CACHE", "CUFORGE_VERBOSE"):
        env.pop(name, None)
    if pch_dir is not None:
        env["CCCL_PCH_CACHE_DIR"] = pch_dir
    if stub_dir is not None:
        env["LD_LIBRARY_PATH"] = stub_dir + os.pathsep + env.get("LD_LIBRARY_PATH", "")
    return env


def sample(mode: str, cc: int, gpu: bool, env: dict[str, str]) -> dict:
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", CHILD, mode, str(cc), "1" if gpu else "0"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    total = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{mode} child failed:\n{done.stdout}\n{done.stderr}")
    if env.get("CCCL_BENCH_PROFILE") == "1":
        print(done.stderr, file=sys.stderr)
    out = json.loads(done.stdout.strip().splitlines()[-1])
    out["total"] = total
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5, help="hit samples (default 5)")
    p.add_argument("--cold-runs", type=int, default=3, help="samples of each cold kind (default 3)")
    p.add_argument("--cc", type=int, default=90, help="compute capability without a GPU (90)")
    p.add_argument("--json", help="also write the samples and medians here")
    p.add_argument(
        "--profile", action="store_true", help="one build, then one hit under cProfile (stderr)"
    )
    args = p.parse_args()

    # an installed cuforge has its bytecode compiled (pip does it); a source checkout may not
    # (read-only, PYTHONDONTWRITEBYTECODE): compile it once so no sample pays for it
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", os.path.join(ROOT, "src", "cuforge")],
        check=False,
        capture_output=True,
    )
    gpu = gpu_visible()
    stub = None
    if not gpu:
        sys.path.insert(0, ROOT)
        from tests.libcuda_stub import build_stub

        stub = build_stub(os.path.join(tempfile.gettempdir(), "cuforge-libcuda-stub"))
    work = tempfile.mkdtemp(prefix="cccl-bench-")
    cache = os.path.join(work, "cuforge-cache")
    warm_pch = os.path.join(work, "pch-warm")

    if args.profile:
        env = child_env(cache, warm_pch, stub)
        sample("hit", args.cc, gpu, env)
        env["CCCL_BENCH_PROFILE"] = "1"
        print(sample("hit", args.cc, gpu, env))
        return 0
    samples: dict[str, list[dict]] = {"cold": [], "cold-pch": [], "hit": []}
    # the cuforge entry (and a warm PCH dir) first: one build, not timed
    first = sample("hit", args.cc, gpu, child_env(cache, warm_pch, stub))
    if first.get("source") != "compiled":
        raise SystemExit(f"expected the first cuforge call to build, got {first}")
    for i in range(args.cold_runs):
        fresh_pch = os.path.join(work, f"pch-cold-{i}")
        samples["cold"].append(sample("cold", args.cc, gpu, child_env(cache, fresh_pch, stub)))
        samples["cold-pch"].append(sample("cold", args.cc, gpu, child_env(cache, warm_pch, stub)))
    for _ in range(args.runs):
        s = sample("hit", args.cc, gpu, child_env(cache, warm_pch, stub))
        if s.get("source") != "disk":
            raise SystemExit(f"expected a disk hit, got {s}")
        samples["hit"].append(s)
    if gpu and not all(s.get("correct") for v in samples.values() for s in v):
        raise SystemExit("a reduction gave a wrong sum")

    med = {
        k: {m: statistics.median(s[m] for s in v) for m in ("make", "total")}
        for k, v in samples.items()
    }
    where = "GPU (current device, real arrays)" if gpu else f"no GPU (cc {args.cc}, ProxyArray)"
    print(f"cuda.compute make_reduce_into, fresh process each, {where}")
    print(f"{'':10} {'make (median)':>15} {'process (median)':>17} {'n':>3}")
    for k, v in med.items():
        print(f"{k:10} {v['make'] * 1e3:12.2f} ms {v['total']:14.3f} s {len(samples[k]):>3}")
    for k in ("cold", "cold-pch"):
        print(
            f"{k} / hit: make {med[k]['make'] / med['hit']['make']:.0f}x, "
            f"whole process {med[k]['total'] / med['hit']['total']:.1f}x"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": gpu, "samples": samples, "median": med}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
