"""CuTe DSL: ``cute.compile`` against a cuforge.cute hit, for an elementwise kernel and a GEMM.

    python bench/cute_cache.py                    # 3 runs per figure (~2-3 min)
    python bench/cute_cache.py --runs 9 --json bench/out/cute_cache.json

Run from the repository root (the kernels are ``tests/cute/kernels.py`` -- ``b = a * 2`` --
and ``tests/cute/gemm.py`` -- the project's own SIMT GEMM on the CuTe DSL). Arguments
are fake tensors (dynamic extents), so no GPU is needed to compile: without one the arch is
``CUTE_DSL_ARCH`` (default here ``sm_90a``); with one, the device's. Every figure is the
median of ``--runs`` runs, each in a fresh cache directory or process as stated:

* ``cute.compile``: the DSL's compile (trace + MLIR + ptxas), in a process where the DSL is
  already imported and warm (the DSL's ``cute.compile`` has no cache);
* ``cuforge memo hit``: ``cuforge.cute.compile`` again in the same process (the median of
  20 calls; the key is recomputed every call);
* ``cuforge store hit, same process``: after ``clear_memo()``: the store's memory tier and
  ``load_module``;
* ``fresh process, compile`` / ``fresh process, cuforge hit``: a new interpreter that
  imports the DSL and gets a ready function, by ``cute.compile`` / from a warm disk cache.
  Reported both as the call alone and as the whole process (interpreter start, imports,
  exit): its median and fastest wall time, and its median CPU time (user + system, from
  ``getrusage``), which a busy shared machine disturbs least.
  The hit process imports ``cuforge.cute`` (and its ``cache`` module) *before* the timed
  call, as a user's ``cuforge.cute.enable()`` at start-up does: the call figure is the
  call; the import is in the whole-process figure.
  With a GPU, each child creates its CUDA context before the timed call (as a program whose
  tensors are on the GPU has done); without that, the DSL's query of the device's arch pays
  ``cuInit`` (~17 ms on the H100) inside the first call, cuforge or not.
  The first process on a new cache dir also fills cuforge's toolchain memo (the DSL's
  version digest, the installed-distributions map: ~0.3 s once); it is reported apart.

Each ratio divides the ``cute.compile`` figure by the hit figure of the same run.

The children run with bytecode cached as a real install has it (``PYTHONDONTWRITEBYTECODE``
and ``PYTHONPYCACHEPREFIX`` are dropped from their environment; the bytecode is written by
the warm-up child of each kernel, so no timed child compiles a ``.pyc``). ``process_breakdown`` says
where the rest of a fresh process goes: interpreter start, ``import cuforge.cute``,
``import cutlass`` / ``cutlass.cute``, the DSL's runtime (``CuTeDSL._get_dsl()``), with a
GPU the CUDA context, ``import torch`` (which the kernel processes timed above do not
import, but CUTLASS's examples do), and the exit (the breakdown process's wall time less its
phases and a bare interpreter's start and exit).
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
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_GPU = [False]  # set by main(): the children create a CUDA context before the timed call

KERNELS = {
    # name: (module, function, fake-args factory)
    "elementwise": ("tests.cute.kernels", "scale", "fake_args"),
    "gemm": ("tests.cute.gemm", "sgemm", "fake_args"),
}

CHILD = r"""
import importlib, json, os, sys, time
t0 = time.perf_counter()
mod = importlib.import_module(sys.argv[1])
fn, make = getattr(mod, sys.argv[2]), getattr(mod, sys.argv[3])
args = make()
import cutlass.cute as cute
if sys.argv[4] != "compile":
    # imported before the timed call, as a user's cuforge.cute.enable() at start-up does
    import cuforge.cute as cc
    import cuforge.cute.cache  # noqa: F401
if sys.argv[5] == "1":
    # with a GPU, the CUDA context exists before the call, as in any program whose tensors
    # are on the GPU already (the CUTLASS examples allocate theirs first); otherwise the
    # DSL's device-arch query pays cuInit inside the first call, with or without cuforge
    import cuda.bindings.driver as driver
    driver.cuInit(0)
    _, dev = driver.cuDeviceGet(0)
    _, ctx = driver.cuDevicePrimaryCtxRetain(dev)
    driver.cuCtxSetCurrent(ctx)
t1 = time.perf_counter()
if sys.argv[4] == "compile":
    out = cute.compile(fn, *args)
    source = "compiled"
else:
    r = cc.compile_cached(fn, *args)
    out, source = r.value, r.source_of_result
t2 = time.perf_counter()
print(json.dumps({"call": t2 - t1, "imports": t1 - t0, "source": source}))
"""


BREAKDOWN = r"""
import json, os, sys, time
t = time.perf_counter()
phases = {}
def mark(name):
    global t
    now = time.perf_counter()
    phases[name] = now - t
    t = now
import cuforge.cute  # noqa: F401
mark("import cuforge.cute")
import cutlass  # noqa: F401
mark("import cutlass")
import cutlass.cute  # noqa: F401
mark("import cutlass.cute")
from cutlass.cutlass_dsl import CuTeDSL
CuTeDSL._get_dsl()
mark("the DSL's runtime (CuTeDSL._get_dsl(): MLIR context, libraries)")
if sys.argv[1] == "1":
    import cuda.bindings.driver as driver
    driver.cuInit(0)
    err, dev = driver.cuDeviceGet(0)
    err, ctx = driver.cuDevicePrimaryCtxRetain(dev)
    driver.cuCtxSetCurrent(ctx)
    mark("CUDA context (cuInit + primary context)")
import torch  # noqa: F401
mark("import torch (not in the kernel processes above; the CUTLASS examples import it)")
print(json.dumps(phases))
"""


def _env(cache_dir: str) -> dict[str, str]:
    env = dict(os.environ)
    # bytecode cached as in a real install: the children write and read __pycache__
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("PYTHONPYCACHEPREFIX", None)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(ROOT, "src"), ROOT, env.get("PYTHONPATH", "")]
    )
    env["CUFORGE_CACHE_DIR"] = cache_dir
    return env


def _child(kernel: str, mode: str, cache_dir: str) -> dict:
    import resource

    module, fn, make = KERNELS[kernel]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", CHILD, module, fn, make, mode, "1" if _GPU[0] else "0"],
        env=_env(cache_dir),
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"child failed ({kernel} {mode}):\n{done.stderr}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    out["process"] = wall
    # the child's CPU time (user + system): what a busy machine disturbs least
    out["process_cpu"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return out


def _warm_bytecode(kernel: str) -> None:
    """Children that write the ``.pyc`` files of everything a timed child imports (a miss,
    a hit, a plain compile), in a throwaway cache dir: no timed child compiles bytecode."""
    cache_dir = tempfile.mkdtemp(prefix="cuforge-bench-cute-")
    try:
        for mode in ("compile", "cuforge", "cuforge"):
            _child(kernel, mode, cache_dir)
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)


def breakdown(runs: int, gpu: bool) -> dict[str, float]:
    """Where a fresh process's time goes before any compile: the interpreter alone, then
    each import, the DSL's runtime and the CUDA context, in that order, one process per
    run (medians; the imports are incremental)."""
    cache_dir = tempfile.mkdtemp(prefix="cuforge-bench-cute-")
    try:
        starts, phases, rests = [], [], []
        for _ in range(runs):
            t = time.perf_counter()
            subprocess.run([sys.executable, "-c", "pass"], env=_env(cache_dir), check=True)
            starts.append(time.perf_counter() - t)
            t = time.perf_counter()
            done = subprocess.run(
                [sys.executable, "-c", BREAKDOWN, "1" if gpu else "0"],
                env=_env(cache_dir),
                capture_output=True,
                text=True,
                check=False,
                cwd=ROOT,
            )
            if done.returncode != 0:
                raise SystemExit(f"breakdown child failed:\n{done.stderr}")
            wall = time.perf_counter() - t
            phases.append(json.loads(done.stdout.strip().splitlines()[-1]))
            rests.append(wall - sum(phases[-1].values()) - starts[-1])
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)
    out = {"interpreter start (python -c pass)": _median(starts)}
    for name in phases[0]:
        out[name] = _median([p[name] for p in phases])
    out["interpreter exit: tearing down the DSL (and torch), beyond a bare interpreter's"] = (
        _median(rests)
    )
    return out


def _median(values: list[float]) -> float:
    return statistics.median(values)


def bench_kernel(kernel: str, runs: int) -> dict:
    import importlib

    import cutlass.cute as cute

    import cuforge.cute as cc

    module, fn_name, make_name = KERNELS[kernel]
    mod = importlib.import_module(module)
    fn, make = getattr(mod, fn_name), getattr(mod, make_name)
    cute.compile(fn, *make())  # warm the DSL (first-use costs are not the compile's)
    _warm_bytecode(kernel)
    compile_s, memo_s, store_s = [], [], []
    fresh_compile, fresh_hit, fresh_first = [], [], []
    for _ in range(runs):
        args = make()  # argument construction is timed in neither figure
        t = time.perf_counter()
        cute.compile(fn, *args)
        compile_s.append(time.perf_counter() - t)
    for _ in range(runs):
        cache_dir = tempfile.mkdtemp(prefix="cuforge-bench-cute-")
        os.environ["CUFORGE_CACHE_DIR"] = cache_dir
        try:
            cc.clear_memo()
            first = cc.compile_cached(fn, *make())
            assert first.source_of_result == "compiled", first
            args = make()
            calls = []
            for _ in range(20):
                t = time.perf_counter()
                again = cc.compile_cached(fn, *args)
                calls.append(time.perf_counter() - t)
                assert again.source_of_result == "memo", again
            memo_s.append(_median(calls))
            cc.clear_memo()
            args = make()
            t = time.perf_counter()
            stored = cc.compile_cached(fn, *args)
            store_s.append(time.perf_counter() - t)
            assert stored.source_of_result in ("memory", "disk"), stored
            fresh_compile.append(_child(kernel, "compile", cache_dir))
            first_hit = _child(kernel, "cuforge", cache_dir)  # also fills the toolchain memo
            hit = _child(kernel, "cuforge", cache_dir)
            assert first_hit["source"] == hit["source"] == "disk", (first_hit, hit)
            fresh_first.append(first_hit)
            fresh_hit.append(hit)
        finally:
            shutil.rmtree(cache_dir, ignore_errors=True)
    c = _median(compile_s)
    rows = {
        "cute.compile (warm process)": c,
        "cuforge memo hit": _median(memo_s),
        "cuforge store hit, same process": _median(store_s),
        "fresh process: cute.compile call": _median([r["call"] for r in fresh_compile]),
        "fresh process: cuforge hit call": _median([r["call"] for r in fresh_hit]),
        "fresh process: cuforge hit call, first process of a new cache dir": _median(
            [r["call"] for r in fresh_first]
        ),
        "fresh process: whole process, cute.compile": _median(
            [r["process"] for r in fresh_compile]
        ),
        "fresh process: whole process, cuforge hit": _median([r["process"] for r in fresh_hit]),
        "fresh process: whole process (fastest run), cute.compile": min(
            r["process"] for r in fresh_compile
        ),
        "fresh process: whole process (fastest run), cuforge hit": min(
            r["process"] for r in fresh_hit
        ),
        "fresh process: whole process CPU time, cute.compile": _median(
            [r["process_cpu"] for r in fresh_compile]
        ),
        "fresh process: whole process CPU time, cuforge hit": _median(
            [r["process_cpu"] for r in fresh_hit]
        ),
    }
    ratios = {
        "memo hit": c / rows["cuforge memo hit"],
        "store hit, same process": c / rows["cuforge store hit, same process"],
        "fresh process call": rows["fresh process: cute.compile call"]
        / rows["fresh process: cuforge hit call"],
        "fresh process call, new cache dir": rows["fresh process: cute.compile call"]
        / rows["fresh process: cuforge hit call, first process of a new cache dir"],
        "fresh process, whole": rows["fresh process: whole process, cute.compile"]
        / rows["fresh process: whole process, cuforge hit"],
        "fresh process, whole, fastest": rows[
            "fresh process: whole process (fastest run), cute.compile"
        ]
        / rows["fresh process: whole process (fastest run), cuforge hit"],
        "fresh process, whole, CPU": rows["fresh process: whole process CPU time, cute.compile"]
        / rows["fresh process: whole process CPU time, cuforge hit"],
    }
    return {"seconds": rows, "ratios": ratios}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cute_cache.py", description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per figure (median)")
    parser.add_argument(
        "--kernels", default="elementwise,gemm", help="comma-separated: elementwise,gemm"
    )
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    sys.path[:0] = [os.path.join(ROOT, "src"), ROOT]
    from tests.conftest import GPU_VISIBLE

    _GPU[0] = GPU_VISIBLE
    if not GPU_VISIBLE:
        os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    import cutlass
    from cutlass.cutlass_dsl import CuTeDSL

    arch = CuTeDSL._get_dsl().envar.arch
    results = {
        "dsl": cutlass.__version__,
        "arch": arch,
        "gpu_visible": GPU_VISIBLE,
        "runs": args.runs,
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "kernels": {},
    }
    results["process_breakdown"] = breakdown(args.runs, GPU_VISIBLE)
    for kernel in args.kernels.split(","):
        results["kernels"][kernel] = bench_kernel(kernel.strip(), args.runs)
    cmd = "python bench/cute_cache.py " + " ".join(sys.argv[1:] if argv is None else argv)
    print(f"# CuTe DSL {results['dsl']}, arch {arch}, median of {args.runs} runs: `{cmd.strip()}`")
    print()
    print("| kernel | figure | time | cute.compile / this |")
    print("|---|---|---:|---:|")
    for kernel, data in results["kernels"].items():
        s, r = data["seconds"], data["ratios"]
        ratio_of = {
            "cuforge memo hit": r["memo hit"],
            "cuforge store hit, same process": r["store hit, same process"],
            "fresh process: cuforge hit call": r["fresh process call"],
            "fresh process: cuforge hit call, first process of a new cache dir": r[
                "fresh process call, new cache dir"
            ],
            "fresh process: whole process, cuforge hit": r["fresh process, whole"],
            "fresh process: whole process (fastest run), cuforge hit": r[
                "fresh process, whole, fastest"
            ],
            "fresh process: whole process CPU time, cuforge hit": r["fresh process, whole, CPU"],
        }
        for figure, seconds in s.items():
            shown = f"{seconds * 1e3:.2f} ms" if seconds < 1 else f"{seconds:.3f} s"
            ratio = (
                f"{ratio_of[figure]:.0f}x"
                if figure in ratio_of and ratio_of[figure] >= 10
                else (
                    f"{ratio_of[figure]:.2f}x"
                    if figure in ratio_of
                    else "anchor"
                    if figure.startswith(("cute.compile", "fresh process: cute"))
                    or figure.endswith(", cute.compile")
                    else ""
                )
            )
            print(f"| {kernel} | {figure} | {shown} | {ratio} |")
    print()
    print("Where a fresh process goes before any compile (median, incremental):")
    print()
    print("| phase | time |")
    print("|---|---:|")
    for phase, seconds in results["process_breakdown"].items():
        print(f"| {phase} | {seconds * 1e3:.0f} ms |")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
