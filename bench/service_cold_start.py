"""Cold start of a multi-kernel "service" (issue 23's benchmark), and the size of its
recorded warm set against the full grid a manifest would enumerate.

    # the GPU machine (the size needs no GPU: --skip-size saves its ~312 compiles there)
    python setup.py build_ext --inplace     # the C launcher, as an installed cuforge has it
    PYTHONPATH=src python bench/service_cold_start.py --runs 5 --cold-runs 2 --skip-size
    # any machine (no GPU): compile for an explicit arch, launch nothing
    python bench/service_cold_start.py --compile-only --arch sm_90 --runs 3
    # the size ratio only (compiles, no GPU needed)
    python bench/service_cold_start.py --size-only --arch sm_90

**The service** (``service.py``, written into the work dir and run as a fresh process each
time): 50 ``cuforge.jit`` specializations of a templated kernel (5 dtypes x 10 block sizes),
10 CUB kernels compiled with ``cuforge.compile`` (``cub::BlockReduce`` / ``cub::BlockScan``,
block sizes 128..512, float and int) and, when ``cuda.compute`` is importable, 5
cuda.compute algorithms made through ``cuforge.cccl`` (built for the device's compute
capability with ProxyArrays: they are built and cached, not launched). Its first served
batch: every kernel launched once on the device, then ``cuCtxSynchronize``. Device memory
comes from the driver (``cuMemAlloc``): no torch or CuPy import in the timed process.

**What is timed**: from just before the parent spawns the process to the moment the batch
is synchronized (the child's ``time.time()``), median of ``--runs`` processes, each with an
empty local cache dir where the row says so:

1. *no cache*: an empty cache dir, nothing installed: everything compiles (``--cold-runs``);
2. *wheel*: the recorded warm set (record -> ``cuforge build --lock`` -> ``cuforge bundle
   wheel``) pip-installed (``pip install --no-deps --target``, the dir on ``PYTHONPATH``),
   an empty cache dir;
3. *prefetch*: ``cuforge prefetch cuforge.lock`` from the remote into an empty cache dir,
   then the service; the time is the prefetch process plus the service process. The remote
   is a loopback ``redis-server`` when one is on PATH, else a ``file://`` dir (the report
   says which);
3b. *in-process prefetch*: the service itself calls
   ``cuforge.prefetch("cuforge.lock", background=True)`` just after ``import cuforge``: the
   warm set is pulled in a thread while the process creates its CUDA context, and its
   lookups wait for it (then they are memory hits); same empty cache dir and remote, one
   process;
3c. *prefetch -- service*: ``cuforge prefetch cuforge.lock -- service.py``: the CLI runs the
   unchanged service in its own process while the pull runs in a thread (as 3b does, with
   no change to the service); same empty cache dir and remote;
4. *warm*: the anchor: a fully warm local cache dir.

Python bytecode is cached as for installed packages (``PYTHONDONTWRITEBYTECODE`` is dropped
for the children; the recording run writes it). (2)-(4) run under ``CUFORGE_FENCE=error``: a
compile there would fail the run, so each is checked to serve the batch with 0 compiles.
Reported: (1)-(4), the ratios (2)/(4), (3)/(4), (3b)/(4) and (3c)/(4) (goal <= 1.2), also
paired round by round, and where the warm process's time goes: interpreter
start, ``import cuforge`` (and ``cuda.compute``), CUDA context creation (+ allocations), the cache work (every
compile call, each a hit), the launches (module loads included) and the synchronize.

**Size** (``--size-only``, or always at the end): the recorded bundle (what the service used)
against a bundle of every variant in the grid the service's kernels span: the jit kernel over
8 dtypes x 10 block sizes and the CUB kernels over 2 algorithms x 4 block sizes x 3 dtypes,
each for every arch of ``--grid-archs`` (sm_80, sm_90, sm_100 by default), built the same way
(recorded, then ``cuforge build --lock``). Ratio = recorded / grid.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "src")

JIT_DTYPES = ["float", "double", "int", "long long", "unsigned int"]
GRID_DTYPES = JIT_DTYPES + ["unsigned long long", "short", "signed char"]
BLOCKS = [32, 64, 96, 128, 160, 192, 256, 384, 512, 1024]
#: (algorithm, BLOCK, T) of the 10 CUB kernels the service uses
CUB_USED = [("reduce", b, t) for b in (128, 256, 512) for t in ("float", "int")] + [
    ("scan", b, t) for b in (128, 256) for t in ("float", "int")
]
CUB_GRID = [
    (a, b, t) for a in ("reduce", "scan") for b in (128, 256, 512, 1024) for t in ("float", "int")
] + [(a, b, "double") for a in ("reduce", "scan") for b in (128, 256, 512, 1024)]

SERVICE = r'''
import time
T_START = time.time()
import json, os, sys
import cuforge
T_IMPORT = time.time()
ARCH = os.environ.get("SVC_ARCH") or None
LAUNCH = ARCH is None
CONFIG = json.loads(os.environ["SVC_CONFIG"])
PREFETCH = os.environ.get("SVC_PREFETCH")
TASK = None
if PREFETCH:  # row (3b): the service pulls its warm set in a thread while it starts CUDA
    TASK = cuforge.prefetch(PREFETCH, background=True)
T_PREFETCH = time.time()

SCALE = """
template <typename T, int BLOCK>
__global__ void scale(const T* __restrict__ x, T* out, T alpha, int n) {
    int i = blockIdx.x * BLOCK + threadIdx.x;
    if (i < n) out[i] = x[i] * alpha;
}
"""
CUB = {
    "reduce": """#include <cub/block/block_reduce.cuh>
template <int BLOCK, typename T>
__global__ void block_sum(const T* in, T* out, int n) {
    using Reduce = cub::BlockReduce<T, BLOCK>;
    __shared__ typename Reduce::TempStorage storage;
    int i = blockIdx.x * BLOCK + threadIdx.x;
    T total = Reduce(storage).Sum(i < n ? in[i] : T(0));
    if (threadIdx.x == 0) out[blockIdx.x] = total;
}
""",
    "scan": """#include <cub/block/block_scan.cuh>
template <int BLOCK, typename T>
__global__ void block_scan(const T* in, T* out, int n) {
    using Scan = cub::BlockScan<T, BLOCK>;
    __shared__ typename Scan::TempStorage storage;
    int i = blockIdx.x * BLOCK + threadIdx.x;
    T result;
    Scan(storage).InclusiveSum(i < n ? in[i] : T(0), result);
    if (i < n) out[i] = result;
}
""",
}
FUNC = {"reduce": "block_sum", "scan": "block_scan"}
N = 1 << 16

def sq(x):
    return x * x

d = None
if LAUNCH:
    import ctypes
    from cuforge.runtime.driver import driver
    d = driver()
    d.use_device(0)
    def alloc(nbytes):
        p = ctypes.c_uint64()
        d.call("cuMemAlloc_v2", ctypes.byref(p), ctypes.c_size_t(nbytes))
        d.call("cuMemsetD8_v2", ctypes.c_uint64(p.value), ctypes.c_ubyte(0), ctypes.c_size_t(nbytes))
        return cuforge.Pointer(p.value, nbytes)
    X, Y = alloc(8 * N), alloc(8 * N)
T_CONTEXT = time.time()

cccl_note = CONFIG.get("cccl_note", "")
cccl = None
if CONFIG.get("cccl"):  # its import counts as import time, not cache work
    try:
        import numpy as np
        import cuda.compute as cc
        import cuforge.cccl as cccl
    except Exception as exc:  # noqa: BLE001 - the benchmark runs without it
        cccl_note = f"cuda.compute not usable here ({type(exc).__name__}: {exc}): skipped"
        cccl = None

T_IMPORTS = time.time()

def make_cccl(arch):
    if LAUNCH:
        cap = 10 * d.device_attribute(75, 0) + d.device_attribute(76, 0)
    else:
        cap = int(arch.split("_")[1].rstrip("a"))
    P = cc.ProxyArray
    def red(dt):
        return dict(d_in=P(dt), d_out=P(dt), op=cc.OpKind.PLUS, h_init=np.zeros(1, dt),
                    compute_capability=cap)
    cccl.make_reduce_into(**red(np.int32))
    cccl.make_reduce_into(**red(np.float32))
    cccl.make_reduce_into(**red(np.float64))
    cccl.make_unary_transform(d_in=P(np.float32), d_out=P(np.float32), op=sq,
                              compute_capability=cap)
    cccl.make_radix_sort(d_in_keys=P(np.int32), d_out_keys=P(np.int32), d_in_values=None,
                         d_out_values=None, order=cc.SortOrder.DESCENDING,
                         compute_capability=cap)

ready = []  # (kernel, grid, block, args)
archs = CONFIG.get("archs") or [ARCH]
for arch in archs:
    jit = cuforge.jit(SCALE, "scale", arch=arch)
    for t, block in CONFIG["jit"]:
        exe = jit.specialize(T=t, BLOCK=block)
        if LAUNCH:
            ready.append((exe, (N + block - 1) // block, block, (X, Y, 2, N)))
    for algo, block, t in CONFIG["cub"]:
        expr = f"{FUNC[algo]}<{block}, {t}>"
        prog = cuforge.compile(CUB[algo], name=f"{algo}.cu", name_expressions=(expr,), arch=arch)
        if LAUNCH:
            ready.append((prog.kernel(expr), (N + block - 1) // block, block, (X, Y, N)))
    if cccl is not None:
        make_cccl(arch)
        cccl_note = "5 cuda.compute algorithms built per arch (not launched)"
T_CACHE = time.time()
for kernel, grid, block, args in ready:
    kernel[grid, block](*args)
T_LAUNCH = time.time()
if LAUNCH:
    d.call("cuCtxSynchronize")
T_END = time.time()
if TASK is not None:
    report = TASK.wait()
    if not report.ok:
        raise SystemExit(f"cuforge.prefetch: missing {report.missing}")
fast = ""
if LAUNCH:  # "installed" is what a pip-installed cuforge uses; "built" costs ~0.4 s once
    from cuforge.runtime.fastlaunch import status
    fast = status()[0]
print(json.dumps({
    "start": T_START, "import": T_IMPORT - T_START + T_IMPORTS - T_CONTEXT,
    "context": T_CONTEXT - T_PREFETCH, "cache": T_CACHE - T_IMPORTS, "prefetch": T_PREFETCH - T_IMPORT, "launch": T_LAUNCH - T_CACHE, "sync": T_END - T_LAUNCH,
    "prefetch_thread": TASK.seconds if TASK is not None else 0.0,
    "end": T_END, "compiles": cuforge.default_cache().counters["compiles"],
    "launched": len(ready), "cccl": cccl_note, "fastlaunch": fast,
    "pathfinder": "cuda.pathfinder" in sys.modules,
}))
'''


def _env(work: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUFORGE_")}
    # as installed packages are: bytecode cached (the recording writes it), else every row
    # pays for compiling the Python modules it imports, and the rows import different sets
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in [SRC, extra.pop("PYTHONPATH", ""), os.environ.get("PYTHONPATH", "")] if p
    )
    env.update(extra)
    return env


def _service(work: str, env: dict[str, str], via: tuple[str, ...] = ()) -> dict:
    """Run the service (``via``: what runs it, e.g. ``-m cuforge prefetch LOCK --``)."""
    started = time.time()
    done = subprocess.run(
        [sys.executable, *via, os.path.join(work, "service.py")],
        env=env,
        cwd=work,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if done.returncode != 0:
        raise SystemExit(f"the service failed (rc {done.returncode}):\n{done.stderr[-4000:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    out["total"] = out["end"] - started
    out["interpreter"] = out["start"] - started
    return out


def _cli(work: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "-m", "cuforge", *args],
        env=env,
        cwd=work,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if done.returncode != 0:
        raise SystemExit(f"cuforge {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return done


def _fresh(work: str, name: str) -> str:
    path = os.path.join(work, name)
    shutil.rmtree(path, ignore_errors=True)
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _remote(work: str, choice: str) -> tuple[str, str, subprocess.Popen | None]:
    """(kind, url, server process or None)."""
    server = shutil.which("redis-server")
    if choice == "redis" or (choice == "auto" and server):
        if not server:
            raise SystemExit("--remote redis needs redis-server on PATH")
        port = _free_port()
        proc = subprocess.Popen(
            [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly"]
            + ["no", "--maxmemory", "0"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                break
            except OSError:
                time.sleep(0.05)
        return "redis (loopback redis-server)", f"redis://127.0.0.1:{port}/0", proc
    path = os.path.join(work, "remote")
    os.makedirs(path, mode=0o700, exist_ok=True)
    why = "--remote file" if choice == "file" else "no redis-server"
    return f"file:// ({why} here)", f"file://{path}", None


def _cccl_env(work: str, env: dict[str, str]) -> tuple[bool, str]:
    """Whether the service makes its cuda.compute algorithms (and, with no driver here, a
    stub libcuda on LD_LIBRARY_PATH for them)."""
    if importlib.util.find_spec("cuda") is None or importlib.util.find_spec("cuda.compute") is None:
        return False, "cuda.compute is not installed: the service has no cccl algorithms"
    sys.path.insert(0, ROOT)
    try:
        from tests.libcuda_stub import build_stub, real_driver_present, stub_env
    except ImportError:
        return True, ""
    if not real_driver_present():
        stub = os.path.join(work, "stub")
        os.makedirs(stub, exist_ok=True)
        build_stub(stub)
        env["LD_LIBRARY_PATH"] = stub_env(stub)["LD_LIBRARY_PATH"]
    return True, ""


def _size(path: str) -> int:
    return os.path.getsize(path)


def _median(rows: list[dict], field: str) -> float:
    return statistics.median(r[field] for r in rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="processes per warm row (median)")
    ap.add_argument("--cold-runs", type=int, default=1, help="processes for the no-cache row")
    ap.add_argument("--compile-only", action="store_true", help="no GPU: compile for --arch")
    ap.add_argument("--size-only", action="store_true", help="only the bundle size ratio")
    ap.add_argument("--arch", default=None, help="the arch to compile for (no GPU needed)")
    ap.add_argument("--grid-archs", default="sm_80,sm_90,sm_100", help="the size grid's archs")
    ap.add_argument("--skip-size", action="store_true", help="leave out the size grid")
    ap.add_argument("--remote", choices=("auto", "redis", "file"), default="auto")
    ap.add_argument("--cccl", choices=("auto", "off"), default="auto")
    ap.add_argument("--work", default=None, help="work dir (default: a temporary one)")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args(argv)
    if (args.compile_only or args.size_only) and not args.arch:
        ap.error("--compile-only and --size-only need --arch (e.g. sm_90)")
    work = os.path.abspath(args.work or tempfile.mkdtemp(prefix="cuforge-service-"))
    os.makedirs(work, exist_ok=True)
    with open(os.path.join(work, "service.py"), "w") as f:
        f.write(SERVICE)

    launch = not (args.compile_only or args.size_only)
    base: dict[str, str] = {}
    if not launch:
        base["SVC_ARCH"] = args.arch
    cccl, note = (False, "--cccl off") if args.cccl == "off" else _cccl_env(work, base)
    config = {
        "jit": [[t, b] for t in JIT_DTYPES for b in BLOCKS],
        "cub": CUB_USED,
        "cccl": cccl,
        "cccl_note": note,
    }
    base["SVC_CONFIG"] = json.dumps(config)
    kind, url, server = _remote(work, args.remote if launch or not args.size_only else "file")
    results: dict = {"remote": kind, "work": work, "launch": launch}
    try:
        # record the service once (its entries also go to the remote), build the warm set
        t0 = time.time()
        rec = _fresh(work, "rec")
        lock = os.path.join(work, "cuforge.lock")
        first = _service(
            work, _env(work, **base, CUFORGE_CACHE_DIR=rec, CUFORGE_RECORD=lock, CUFORGE_REMOTE=url)
        )
        print(f"recorded: {first['compiles']} compiles, {first['launched']} launches; "
              f"cccl: {first['cccl'] or note}", flush=True)  # fmt: skip
        results["cccl"] = first["cccl"] or note
        cenv = _env(work, CUFORGE_CACHE_DIR=rec)
        warm = os.path.join(work, "warm.cfb")
        _cli(work, cenv, "build", "--lock", lock, "--bundle", warm)
        dist = _fresh(work, "dist")
        made = _cli(work, cenv, "bundle", "wheel", warm, "--name", "service-kernels",
                    "--version", "1.0", "--out", dist, "--json")  # fmt: skip
        wheel = json.loads(made.stdout)["wheel"]
        site = _fresh(work, "site")
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q"]
            + ["--disable-pip-version-check", "--target", site, wheel],
            check=True,
            timeout=600,
        )
        results["warm_bundle_bytes"] = _size(warm)
        results["wheel_bytes"] = _size(wheel)
        print(f"warm set: {_size(warm) / 1e6:.2f} MB bundle, wheel {_size(wheel) / 1e6:.2f} MB "
              f"(setup {time.time() - t0:.1f} s)", flush=True)  # fmt: skip

        if not args.size_only:
            results.update(_measure(args, work, base, rec, lock, url, site))
        if not args.skip_size:
            results.update(_grid(args, work, base, warm))
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=10)
    _report(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2, sort_keys=True)
    return 0


def _measure(args, work, base, rec, lock, url, site) -> dict:
    rows: dict[str, list[dict]] = {
        "cold": [], "wheel": [], "prefetch": [], "prefetch_inproc": [], "prefetch_run": [],
        "warm": [],
    }  # fmt: skip
    fence = {"CUFORGE_FENCE": "error"}
    for i in range(max(args.runs, args.cold_runs)):
        if i < args.runs:
            rows["warm"].append(_service(work, _env(work, **base, **fence, CUFORGE_CACHE_DIR=rec)))
            dirs = _fresh(work, "fresh-wheel")
            env = _env(work, **base, **fence, CUFORGE_CACHE_DIR=dirs, PYTHONPATH=site)
            rows["wheel"].append(_service(work, env))
            dirp = _fresh(work, "fresh-prefetch")
            started = time.time()
            _cli(work, _env(work, CUFORGE_CACHE_DIR=dirp, CUFORGE_REMOTE=url), "prefetch", lock)
            pulled = time.time() - started
            env = _env(work, **base, **fence, CUFORGE_CACHE_DIR=dirp)
            row = _service(work, env)
            row["prefetch"] = pulled
            row["total"] += pulled
            rows["prefetch"].append(row)
            dirq = _fresh(work, "fresh-prefetch-inproc")
            env = _env(work, **base, **fence, CUFORGE_CACHE_DIR=dirq, CUFORGE_REMOTE=url,
                       SVC_PREFETCH=lock)  # fmt: skip
            rows["prefetch_inproc"].append(_service(work, env))
            dirr = _fresh(work, "fresh-prefetch-run")
            env = _env(work, **base, **fence, CUFORGE_CACHE_DIR=dirr, CUFORGE_REMOTE=url)
            via = ("-m", "cuforge", "prefetch", lock, "--")
            rows["prefetch_run"].append(_service(work, env, via))
        if i < args.cold_runs:
            row = _service(work, _env(work, **base, CUFORGE_CACHE_DIR=_fresh(work, "fresh-cold")))
            rows["cold"].append(row)
        print(f"run {i + 1}: " + ", ".join(
            f"{k} {r[-1]['total']:.3f} s" for k, r in rows.items() if len(r) > i
        ), flush=True)  # fmt: skip
    for name in ("wheel", "prefetch", "prefetch_inproc", "prefetch_run", "warm"):
        bad = [r["compiles"] for r in rows[name] if r["compiles"]]
        if bad:
            raise SystemExit(f"the {name} row compiled {bad} kernels: the warm set is incomplete")
    med = {k: _median(v, "total") for k, v in rows.items()}
    fast = sorted({r["fastlaunch"] for v in rows.values() for r in v if r["fastlaunch"]})
    # "prefetch": the CLI process for (3), what the cuforge.prefetch call blocked for (3b:
    # the lockfile read and a thread started; "prefetch_thread" is that thread's wall time),
    # else 0
    phases = ("interpreter", "import", "context", "prefetch", "cache", "launch", "sync")
    breakdown = {k: {p: _median(v, p) for p in phases} for k, v in rows.items() if k != "cold"}
    return {
        "median_seconds": med,
        "ratio_wheel_vs_warm": med["wheel"] / med["warm"],
        "ratio_prefetch_vs_warm": med["prefetch"] / med["warm"],
        "ratio_prefetch_inproc_vs_warm": med["prefetch_inproc"] / med["warm"],
        "ratio_prefetch_run_vs_warm": med["prefetch_run"] / med["warm"],
        "ratio_cold_vs_warm": med["cold"] / med["warm"],
        "breakdown": breakdown,
        "prefetch_thread": _median(rows["prefetch_inproc"], "prefetch_thread"),
        # each round's row against that round's warm process (the rows run interleaved),
        # median over the rounds: steadier than a ratio of medians when the host drifts
        "paired_ratio": {
            k: statistics.median(
                a["total"] / w["total"] for a, w in zip(rows[k], rows["warm"], strict=True)
            )
            for k in ("wheel", "prefetch", "prefetch_inproc", "prefetch_run")
        },
        # the runs of each row that imported cuda.pathfinder (~45 ms: NVRTC located by it)
        "pathfinder": {k: sum(bool(r.get("pathfinder")) for r in v) for k, v in rows.items()},
        "runs": args.runs,
        "cold_runs": args.cold_runs,
        "compiles_cold": rows["cold"][0]["compiles"],
        "launched": rows["warm"][0]["launched"],
        "fastlaunch": fast,
    }


def _grid(args, work, base, warm) -> dict:
    """Every variant of the grid, recorded and built into a bundle the same way."""
    archs = [a.strip() for a in args.grid_archs.split(",") if a.strip()]
    config = {
        "jit": [[t, b] for t in GRID_DTYPES for b in BLOCKS],
        "cub": CUB_GRID,
        "cccl": json.loads(base["SVC_CONFIG"])["cccl"],  # the same 5 algorithms, every arch
        "archs": archs,
    }
    grid_env = dict(base, SVC_CONFIG=json.dumps(config), SVC_ARCH=archs[0])
    t0 = time.time()
    cache = os.path.join(work, "grid-cache")  # kept between runs: a rerun is warm
    lock = os.path.join(work, "grid.lock")
    out = _service(work, _env(work, **grid_env, CUFORGE_CACHE_DIR=cache, CUFORGE_RECORD=lock))
    bundle = os.path.join(work, "grid.cfb")
    _cli(work, _env(work, CUFORGE_CACHE_DIR=cache), "build", "--lock", lock, "--bundle", bundle)
    ncccl = 5 if config["cccl"] else 0
    variants = (len(config["jit"]) + len(CUB_GRID) + ncccl) * len(archs)
    print(f"grid: {variants} variants over {', '.join(archs)} ({out['compiles']} compiles, "
          f"{time.time() - t0:.1f} s)", flush=True)  # fmt: skip
    return {
        "grid_variants": variants,
        "grid_archs": archs,
        "recorded_variants": len(JIT_DTYPES) * len(BLOCKS) + len(CUB_USED) + ncccl,
        "grid_bundle_bytes": _size(bundle),
        "size_ratio_recorded_vs_grid": _size(warm) / _size(bundle),
    }


def _report(r: dict) -> None:
    print()
    print(f"remote: {r['remote']}; cccl: {r.get('cccl')}")
    if "median_seconds" in r:
        m = r["median_seconds"]
        what = "first served batch" if r["launch"] else "all kernels ready (compile-only)"
        print(f"time from process start to the {what}, median of {r['runs']} "
              f"({r['cold_runs']} for no cache); {r['launched']} launches")  # fmt: skip
        print(f"  (1) no cache          {m['cold']:8.3f} s   {r['ratio_cold_vs_warm']:7.1f}x warm")
        print(
            f"  (2) warm-set wheel    {m['wheel']:8.3f} s   {r['ratio_wheel_vs_warm']:7.2f}x warm"
        )
        print(
            f"  (3) prefetch + serve  {m['prefetch']:8.3f} s   "
            f"{r['ratio_prefetch_vs_warm']:7.2f}x warm "
            f"(prefetch {r['breakdown']['prefetch']['prefetch']:.3f} s)"
        )
        print(
            f"  (3b) cuforge.prefetch {m['prefetch_inproc']:8.3f} s   "
            f"{r['ratio_prefetch_inproc_vs_warm']:7.2f}x warm "
            f"(in-process prefetch: {r['breakdown']['prefetch_inproc']['prefetch']:.3f} s "
            f"blocking, its thread {r['prefetch_thread']:.3f} s overlapping)"
        )
        print(
            f"  (3c) prefetch -- svc  {m['prefetch_run']:8.3f} s   "
            f"{r['ratio_prefetch_run_vs_warm']:7.2f}x warm "
            "(`cuforge prefetch LOCK -- service.py`: one process, the pull in the background)"
        )
        print(f"  (4) warm local cache  {m['warm']:8.3f} s   (anchor)")
        pr = r["paired_ratio"]
        print(f"  paired (each round's row / that round's warm, median): wheel "
              f"{pr['wheel']:.2f}x, prefetch {pr['prefetch']:.2f}x, cuforge.prefetch "
              f"{pr['prefetch_inproc']:.2f}x, prefetch -- service {pr['prefetch_run']:.2f}x; "
              "runs importing cuda.pathfinder: "
              f"{r['pathfinder']}")  # fmt: skip
        if r["fastlaunch"] and r["fastlaunch"] != ["installed"]:
            print(f"  NOTE: launch paths {r['fastlaunch']}: build cuforge's C launcher first "
                  "(pip install -e . or python setup.py build_ext --inplace), else each fresh "
                  "cache dir builds it (~0.4 s)")  # fmt: skip
        print("  where the time goes (median seconds):")
        print(f"    {'row':15s} {'interp':>8s} {'import':>8s} {'context':>8s} "
              f"{'prefetch':>8s} {'cache':>8s} {'launch':>8s} {'sync':>8s}")  # fmt: skip
        for row, b in r["breakdown"].items():
            print(
                f"    {row:15s} {b['interpreter']:8.3f} {b['import']:8.3f} {b['context']:8.3f} "
                f"{b.get('prefetch', 0.0):8.3f} {b['cache']:8.3f} {b['launch']:8.3f} "
                f"{b['sync']:8.3f}"
            )
    if "grid_bundle_bytes" not in r:
        return
    print(
        f"size: recorded warm set {r['warm_bundle_bytes'] / 1e6:.2f} MB "
        f"({r['recorded_variants']} variants, one arch) vs every variant in the grid "
        f"{r['grid_bundle_bytes'] / 1e6:.2f} MB ({r['grid_variants']} variants, "
        f"{', '.join(r['grid_archs'])}): ratio {r['size_ratio_recorded_vs_grid']:.3f} "
        f"(1 : {1 / r['size_ratio_recorded_vs_grid']:.1f})"
    )


if __name__ == "__main__":
    sys.exit(main())
