"""CuTe DSL: where a cuforge.cute hit call in a fresh process goes (CPU reproduction).

    python bench/cute_hit_profile.py                       # both kernels, 5 children each
    python bench/cute_hit_profile.py --kernels gemm --runs 9
    python bench/cute_hit_profile.py --profile elementwise # cProfile one hit call

No GPU is needed: the kernels (``tests/cute/kernels.py``, ``tests/cute/gemm.py``) are
compiled from fake tensors for ``CUTE_DSL_ARCH`` (default here ``sm_90a``) and exported
into a fresh cache dir; then each child is a fresh interpreter that imports the kernel's
module and ``cuforge.cute`` (as a user's ``enable()`` would) *before* timing, and times
one ``cuforge.cute.compile_cached`` call that hits the disk tier. The first child on the
cache dir also fills cuforge's toolchain memo; it is reported apart. The children run with
bytecode cached (``PYTHONDONTWRITEBYTECODE`` and ``PYTHONPYCACHEPREFIX`` are dropped from
their environment). Each child also reports the hit's phases (the key's parts, the store
read, the load) from a few wrapped functions. The call is reported as wall time (median
and minimum) and as the process's CPU time (``time.process_time``), which a busy shared
machine disturbs less.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

KERNELS = {
    "elementwise": ("tests.cute.kernels", "scale", "fake_args"),
    "gemm": ("tests.cute.gemm", "sgemm", "fake_args"),
}

CHILD = r"""
import importlib, json, sys, time
mod = importlib.import_module(sys.argv[1])
fn, make = getattr(mod, sys.argv[2]), getattr(mod, sys.argv[3])
args = make()
import cuforge.cute as cc
import cuforge.cute.cache as cache_mod
import cuforge.cute.version as version_mod
from cuforge.core import blobcache
from cuforge.keys import fingerprint
phases = {}
def timed(owner, name, label):
    real = getattr(owner, name)
    def wrapper(*a, **k):
        t = time.perf_counter()
        try:
            return real(*a, **k)
        finally:
            phases[label] = phases.get(label, 0.0) + time.perf_counter() - t
    setattr(owner, name, wrapper)
if sys.argv[4] == "phases":
    timed(cache_mod, "dsl_version", "dsl version digest")
    timed(fingerprint, "fingerprint", "fingerprint (function, hooks)")
    timed(cache_mod, "describe_args", "describe args")
    timed(cache_mod, "_dsl_of", "the DSL object")
    timed(cache_mod, "_load_object", "load the object (load_module)")
    timed(cache_mod, "_parse_record", "parse the record")
    timed(blobcache, "get_or_build", "store lookup + load (get_or_build)")
if sys.argv[4] == "profile":
    import cProfile, pstats
    prof = cProfile.Profile()
    t1, c1 = time.perf_counter(), time.process_time()
    prof.enable()
    r = cc.compile_cached(fn, *args)
    prof.disable()
    t2, c2 = time.perf_counter(), time.process_time()
    pstats.Stats(prof, stream=sys.stderr).sort_stats("cumulative").print_stats(45)
else:
    t1, c1 = time.perf_counter(), time.process_time()
    r = cc.compile_cached(fn, *args)
    t2, c2 = time.perf_counter(), time.process_time()
print(json.dumps({"call": t2 - t1, "cpu": c2 - c1, "source": r.source_of_result,
                  "phases": phases}))
"""


def _env(cache_dir: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("PYTHONPYCACHEPREFIX", None)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(ROOT, "src"), ROOT, env.get("PYTHONPATH", "")]
    )
    env["CUFORGE_CACHE_DIR"] = cache_dir
    env.setdefault("CUTE_DSL_ARCH", "sm_90a")
    return env


def _child(kernel: str, mode: str, cache_dir: str) -> dict:
    module, fn, make = KERNELS[kernel]
    done = subprocess.run(
        [sys.executable, "-c", CHILD, module, fn, make, mode],
        env=_env(cache_dir),
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    if done.returncode != 0:
        raise SystemExit(f"child failed ({kernel} {mode}):\n{done.stderr}")
    if mode == "profile":
        sys.stdout.write(done.stderr)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _fill(kernel: str, cache_dir: str) -> None:
    module, fn, make = KERNELS[kernel]
    code = (
        f"import importlib; m = importlib.import_module({module!r}); import cuforge.cute as cc; "
        f"r = cc.compile_cached(m.{fn}, *m.{make}()); "
        "assert r.source_of_result == 'compiled', r"
    )
    subprocess.run([sys.executable, "-c", code], env=_env(cache_dir), check=True, cwd=ROOT)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cute_hit_profile.py", description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="hit children per kernel (median)")
    parser.add_argument("--kernels", default="elementwise,gemm")
    parser.add_argument("--profile", metavar="KERNEL", help="print a cProfile of one hit call")
    args = parser.parse_args(argv)
    kernels = [args.profile] if args.profile else args.kernels.split(",")
    for kernel in kernels:
        cache_dir = tempfile.mkdtemp(prefix="cuforge-bench-cute-hit-")
        try:
            _fill(kernel, cache_dir)
            first = _child(kernel, "plain", cache_dir)
            assert first["source"] == "disk", first
            if args.profile:
                _child(kernel, "profile", cache_dir)
                continue
            calls, cpus = [], []
            phases: dict[str, list[float]] = {}
            for _ in range(args.runs):
                got = _child(kernel, "plain", cache_dir)
                calls.append(got["call"])
                cpus.append(got["cpu"])
                got = _child(kernel, "phases", cache_dir)
                for name, value in got["phases"].items():
                    phases.setdefault(name, []).append(value)
            print(f"## {kernel}: median of {args.runs} fresh processes")
            print(f"first process on the cache dir: hit call {first['call'] * 1e3:.1f} ms")
            print(
                f"hit call: median {statistics.median(calls) * 1e3:.1f} ms, "
                f"min {min(calls) * 1e3:.1f} ms; CPU time: median "
                f"{statistics.median(cpus) * 1e3:.1f} ms"
            )
            for name, values in phases.items():
                print(f"  {name}: {statistics.median(values) * 1e3:.2f} ms")
        finally:
            shutil.rmtree(cache_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
