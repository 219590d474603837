"""Ahead-of-time build throughput (issue 13, section 7), and the per-task costs behind the
scaling model of docs/aot_distributed.md. Runs on the CPU; no GPU needed.

    python bench/aot_build.py [--runs 3] [--jobs 2] [--variants 48] [--no-ray] [--json out.json]
    python bench/aot_build.py --ray-address HOST:PORT     # a running cluster instead

The project: one templated kernel over a grid (BLOCK x UNROLL x T), one arch: 48 small
NVRTC variants by default. Every run builds all of them into a FRESH cache dir (nothing is
a hit; each run checks that every variant was compiled and none failed). Rows:

* ``serial``: ``LocalExecutor(jobs=1)``, the variants one after another in this process;
* ``--jobs N``: ``LocalExecutor(jobs=N)``, a process pool started for the build (its
  start-up is part of the time, as in ``cuforge build``);
* ``ray``: ``RayExecutor`` on a Ray started once before the rows (a standing cluster: its
  start-up is reported apart), 1 CPU per task, N CPUs; the driver stores the entries the
  workers send back (``store_entries``) as each result arrives, inside the timing;
* ``cli``: the same as ``cuforge build --jobs N`` end to end in a fresh process (Python
  start, manifest expansion, the cache lookups, the pool): what a user waits for.

Each figure is the median of ``--runs`` runs; ratios are against ``serial`` of the same
invocation. Goals: ``--jobs N`` >= 0.85 x N x serial on N free cores; Ray within 15 % of
the local pool.

Then the per-task costs (median of repeated measurements): an empty Ray task's round
trip and its cost when many are queued, moving one object to a task per KB, starting a
fresh Ray worker, and a fresh worker's first cuforge compile; with them, build time
against node count for a 1,000-variant build (``--model-variants``, ``--cores-per-node``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "src"))

KERNEL = r"""
#include "vec.cuh"
template <int BLOCK, int UNROLL, typename T>
__global__ void scale(T* out, const T* in, int n, T a) {
    int base = (blockIdx.x * BLOCK + threadIdx.x) * UNROLL;
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        int i = base + u;
        if (i < n) out[i] = axpb<T>(a, in[i], (T)TAG);
    }
}
"""
HEADER = (
    "#pragma once\ntemplate <typename T> __device__ T axpb(T a, T x, T b) { return a * x + b; }\n"
)

BLOCKS = [64, 128, 256, 512, 1024, 32, 96, 192, 48, 80, 112, 160, 224, 320, 384, 768]
UNROLLS = [1, 2, 4, 8]
TYPES = ["float", "double", "int", "long long", "unsigned", "short"]


def grid_for(variants: int) -> tuple[list, list, list]:
    """BLOCK x UNROLL x T lists whose product is ``variants`` (a multiple of 12, <= 192)."""
    if variants % 12 or not 12 <= variants <= 12 * len(BLOCKS):
        raise SystemExit(
            f"--variants must be a multiple of 12 between 12 and {12 * len(BLOCKS)}, not {variants}"
        )
    blocks = variants // 12
    return BLOCKS[:blocks], UNROLLS, TYPES[:3]


def make_project(where: str, variants: int, arch: str) -> str:
    blocks, unrolls, types = grid_for(variants)
    os.makedirs(os.path.join(where, "include"))
    with open(os.path.join(where, "scale.cu"), "w") as f:
        f.write(KERNEL)
    with open(os.path.join(where, "include", "vec.cuh"), "w") as f:
        f.write(HEADER)
    with open(os.path.join(where, "cuforge.toml"), "w") as f:
        f.write(
            f'arch = ["{arch}"]\n\n[[kernel]]\nsource = "scale.cu"\ninclude_dirs = ["include"]\n'
            'name_expressions = ["scale<{BLOCK}, {UNROLL}, {T}>"]\n'
            'defines = { TAG = "{BLOCK}" }\n[kernel.grid]\n'
            f"BLOCK = {blocks}\nUNROLL = {unrolls}\nT = {json.dumps(types)}\n"
        )
    return os.path.join(where, "cuforge.toml")


def fresh_cache(scratch: str, label: str) -> str:
    """A new, empty cache dir as this process's cache (a new default cache: store, call
    memo and counters are fresh)."""
    path = tempfile.mkdtemp(prefix=f"cache-{label}-", dir=scratch)
    os.environ["CUFORGE_CACHE_DIR"] = path
    return path


#: seconds the last build_once spent in store_entries (the driver storing what came back)
last_store_seconds = 0.0


def build_once(executor, tasks, root: str) -> tuple[float, list]:
    global last_store_seconds
    from cuforge.aot.tasks import store_entries

    start = time.perf_counter()
    results = []
    last_store_seconds = 0.0
    for result in executor.run(tasks, root):  # store what comes back as it arrives
        results.append(result)
        if result.ok and result.entries:
            t = time.perf_counter()
            store_entries([result])
            last_store_seconds += time.perf_counter() - t
    seconds = time.perf_counter() - start
    bad = [r for r in results if not r.ok or r.hit]
    if len(results) != len(tasks) or bad:
        detail = bad[0].log[-2000:] if bad else f"{len(results)} results for {len(tasks)} tasks"
        raise SystemExit(f"{executor!r}: not every variant was compiled: {detail}")
    return seconds, results


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def ray_costs(ray, reps: int) -> dict:
    """Per-task costs of this Ray: empty task round trip, queued task cost, object move
    per KB, fresh worker start."""

    @ray.remote(num_cpus=1)
    def nothing():
        return None

    @ray.remote(num_cpus=1)
    def size_of(blob):
        return len(blob)

    @ray.remote(num_cpus=1, max_calls=1)
    def fresh():
        return os.getpid()

    ray.get([nothing.remote() for _ in range(20)])  # warm workers
    rtt = []
    for _ in range(reps * 20):
        t = time.perf_counter()
        ray.get(nothing.remote())
        rtt.append(time.perf_counter() - t)
    queued = []
    for _ in range(reps):
        n = 500
        t = time.perf_counter()
        ray.get([nothing.remote() for _ in range(n)])
        queued.append((time.perf_counter() - t) / n)
    transfer = {}
    for kb in (1, 64, 1024, 16384):
        data = os.urandom(kb * 1024)
        times = []
        for _ in range(reps * 3):
            t = time.perf_counter()
            ref = ray.put(data)
            assert ray.get(size_of.remote(ref)) == len(data)
            times.append(time.perf_counter() - t)
        transfer[kb] = median(times)
    starts = []
    for _ in range(reps + 1):
        t = time.perf_counter()
        ray.get(fresh.remote())
        starts.append(time.perf_counter() - t)
    rtt_m = median(rtt)
    big = transfer[16384] - transfer[1]
    return {
        "task_round_trip_s": rtt_m,
        "task_queued_s": median(queued),
        "put_and_pass_s": transfer,
        "transfer_per_kb_s": max(big, 0.0) / (16384 - 1),
        "worker_start_s": median(starts[1:]),
    }


def fresh_worker_compile(ray, project: str, arch: str, reps: int) -> float:
    """A fresh Ray worker's first cuforge compile (import cuforge, load NVRTC, compile one
    small variant), end to end from the driver."""

    @ray.remote(num_cpus=1, max_calls=1)
    def first_compile(src: str, cache: str, expr: str) -> float:
        os.environ["CUFORGE_CACHE_DIR"] = cache
        t = time.perf_counter()
        import cuforge

        cuforge.compile(src, arch=arch, name_expressions=[expr], defines={"TAG": "1"})
        return time.perf_counter() - t

    with open(os.path.join(project, "include", "vec.cuh")) as f:
        header = f.read()
    with open(os.path.join(project, "scale.cu")) as f:
        src = f.read().replace('#include "vec.cuh"', header)
    times = []
    for i in range(reps):
        cache = tempfile.mkdtemp(prefix="fresh-worker-")
        t = time.perf_counter()
        ray.get(first_compile.remote(src, cache, f"scale<{64 + i}, 1, float>"))
        times.append(time.perf_counter() - t)
        shutil.rmtree(cache, ignore_errors=True)
    return median(times)


def model(costs: dict, variants: int, cores: int, compile_s: float, nodes_list) -> list[dict]:
    """Build time of ``variants`` on ``n`` nodes of ``cores`` CPUs each.

    T(n) = start + max(ceil(V / (n c)) * (t_c + t_task), V * t_driver)
    start: one fresh worker per core (in parallel across nodes; a node starts its workers
    about ``c`` at a time) plus its first-compile overhead; t_task: a task's round trip
    overhead on the worker side; t_driver: what the one driver spends per task (submitting,
    receiving ~8 KB of entries, storing them): the serial part."""
    t_task = costs["task_round_trip_s"]
    t_driver = costs["driver_per_task_s"]
    start = costs["worker_start_s"] + costs["first_compile_overhead_s"]
    rows = []
    for n in nodes_list:
        waves = math.ceil(variants / (n * cores))
        compute = waves * (compile_s + t_task)
        serial = variants * t_driver
        total = start + max(compute, serial)
        rows.append(
            {
                "nodes": n,
                "seconds": total,
                "bound": "driver" if serial > compute else "compile",
                "speedup": None,
            }
        )
    one = rows[0]["seconds"] if rows and rows[0]["nodes"] == 1 else None
    for r in rows:
        r["speedup"] = one / r["seconds"] if one else None
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="aot_build.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3, help="runs per row (median); default 3")
    ap.add_argument("--jobs", type=int, default=2, help="local pool size and Ray CPUs; default 2")
    ap.add_argument("--variants", type=int, default=48, help="variants to build; default 48")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--no-ray", action="store_true", help="skip the Ray rows and costs")
    ap.add_argument("--no-cli", action="store_true", help="skip the end-to-end CLI rows")
    ap.add_argument(
        "--steady",
        action="store_true",
        help="also build 4x the variants: steady throughput and fixed start-up per row",
    )
    ap.add_argument("--ray-address", default=None, help="use this Ray cluster (default: start one)")
    ap.add_argument("--model-variants", type=int, default=1000)
    ap.add_argument("--cores-per-node", type=int, default=16)
    ap.add_argument("--json", dest="json_out", default=None, help="write the numbers here")
    ap.add_argument(
        "--more-jobs",
        default="",
        help="more pool sizes to measure in the same rounds, e.g. 4,8,16",
    )
    args = ap.parse_args(argv)
    args.more_jobs = sorted({args.jobs, *(int(x) for x in args.more_jobs.split(",") if x)})

    os.environ.setdefault("CUFORGE_PROGRESS", "0")
    scratch = tempfile.mkdtemp(prefix="cuforge-aot-bench-")
    out: dict = {
        "variants": args.variants,
        "runs": args.runs,
        "jobs": args.jobs,
        "cpus": os.cpu_count(),
        "load_before": os.getloadavg()[0],
        "rows": {},
    }
    try:
        project = os.path.join(scratch, "proj")
        # with --steady, a 4x larger build too: its extra variants over the extra time is
        # the throughput once workers run, without the fixed start-up of a pool
        big = 4 * args.variants if args.steady else args.variants
        manifest = make_project(project, big, args.arch)
        from cuforge.aot.executor import LocalExecutor
        from cuforge.aot.manifest import load_manifest

        m = load_manifest(manifest)
        all_tasks = list(m.tasks)
        assert len(all_tasks) == big, len(all_tasks)
        tasks = all_tasks[: args.variants]
        out["unique_file_bytes"] = sum(
            os.path.getsize(os.path.join(m.root, rel))
            for rel in {r for t in tasks for r in t.files}
        )

        def measure(make, which: list) -> tuple[float, list]:
            fresh_cache(scratch, "run")
            return build_once(make(), which, m.root)

        specs = [
            ("serial", lambda: LocalExecutor(1)),
            *((f"jobs{j}", lambda j=j: LocalExecutor(j)) for j in args.more_jobs),
        ]
        costs = None
        if not args.no_ray:
            import ray

            from cuforge.aot.ray_executor import RayExecutor

            os.environ["CUFORGE_CACHE_DIR"] = os.path.join(scratch, "ray-workers")
            t = time.perf_counter()
            if args.ray_address:
                ray.init(address=args.ray_address, log_to_driver=False)
            else:
                ray.init(
                    address="local",
                    num_cpus=args.jobs,
                    include_dashboard=False,
                    log_to_driver=False,
                )
            out["ray_init_s"] = time.perf_counter() - t
            # the first build on fresh workers (cuforge import, NVRTC load), apart
            out["ray_first_build_s"], _ = measure(RayExecutor, tasks)
            specs.append(("ray", RayExecutor))
        print(f"{args.variants} variants, {args.runs} rounds, {os.cpu_count()} CPUs", flush=True)
        try:
            # rounds: every row once per round, so a load change on a shared machine
            # hits all rows alike
            raw: dict[str, dict[str, list]] = {name: {} for name, _ in specs}
            for _ in range(args.runs):
                for name, make in specs:
                    seconds, results = measure(make, tasks)
                    d = raw[name]
                    d.setdefault("times", []).append(seconds)
                    d.setdefault("task", []).append(median([r.seconds for r in results]))
                    d.setdefault("store", []).append(last_store_seconds)
                    d.setdefault("bytes", []).append(
                        sum(
                            len(e[2]) + len(json.dumps(e[3]))
                            for r in results
                            for e in r.entries or ()
                        )
                    )
                    if args.steady:
                        d.setdefault("big", []).append(measure(make, all_tasks)[0])
            if not args.no_ray:
                costs = ray_costs(ray, max(args.runs, 3))
                costs["first_compile_s"] = fresh_worker_compile(
                    ray, project, args.arch, max(args.runs, 3)
                )
                out["costs"] = costs
        finally:
            if not args.no_ray:
                ray.shutdown()
        for name, _ in specs:
            d = raw[name]
            med = median(d["times"])
            out["rows"][name] = r = {
                "seconds": med,
                "all": d["times"],
                "variants_per_s": args.variants / med,
                "task_seconds": median(d["task"]),
                "store_seconds": median(d["store"]),
                "returned_bytes": median(d["bytes"]),
            }
            line = f"  {name:<10} {med:7.2f} s  {args.variants / med:6.1f} variants/s"
            if args.steady:
                r["big_seconds"] = median(d["big"])
                r["big_all"] = d["big"]
                extra = max(r["big_seconds"] - med, 1e-9)
                r["steady_variants_per_s"] = (big - args.variants) / extra
                r["fixed_seconds"] = max(med - args.variants / r["steady_variants_per_s"], 0.0)
                line += (
                    f"   {big} variants: {r['big_seconds']:.2f} s -> steady "
                    f"{r['steady_variants_per_s']:.1f} variants/s, fixed {r['fixed_seconds']:.2f} s"
                )
            print(line, flush=True)
        if "ray_first_build_s" in out:
            print(f"  ray first  {out['ray_first_build_s']:7.2f} s (workers starting)", flush=True)

        if not args.no_cli:
            cli_rows = [("cli serial", 1, "local"), (f"cli jobs{args.jobs}", args.jobs, "local")]
            if not args.no_ray and not args.ray_address:  # each run starts and stops a Ray
                cli_rows.append(("cli ray", args.jobs, "ray"))
            cli_manifest = make_project(os.path.join(scratch, "cli-proj"), args.variants, args.arch)
            for name, jobs, executor in cli_rows:
                times = []
                for _ in range(args.runs):
                    cache = fresh_cache(scratch, "cli")
                    env = dict(os.environ, CUFORGE_CACHE_DIR=cache, CI="true")
                    env["PYTHONPATH"] = (
                        os.path.join(ROOT, "src") + os.pathsep + env.get("PYTHONPATH", "")
                    )
                    t = time.perf_counter()
                    done = subprocess.run(
                        [
                            sys.executable,
                            "-m",
                            "cuforge",
                            "build",
                            cli_manifest,
                            "--jobs",
                            str(jobs),
                            "--executor",
                            executor,
                            "--json",
                        ],
                        env=env,
                        capture_output=True,
                        text=True,
                        check=False,
                    )
                    times.append(time.perf_counter() - t)
                    doc = json.loads(done.stdout) if done.stdout.strip() else {}
                    if done.returncode != 0 or doc.get("built") != args.variants:
                        raise SystemExit(
                            f"{name}: cuforge build failed:\n{done.stdout}\n{done.stderr}"
                        )
                med = median(times)
                out["rows"][name] = {
                    "seconds": med,
                    "all": times,
                    "variants_per_s": args.variants / med,
                }
                print(
                    f"  {name:<10} {med:7.2f} s  {args.variants / med:6.1f} variants/s", flush=True
                )
        out["load_after"] = os.getloadavg()[0]
        report(out, args)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(out, f, indent=2)
    return 0


def report(out: dict, args) -> None:
    rows = out["rows"]
    serial = rows["serial"]["variants_per_s"]
    more = [j for j in args.more_jobs if j != args.jobs]
    print()
    print(f"| build of {args.variants} variants | seconds | variants/s | vs serial |")
    print("|---|---:|---:|---:|")
    for name, r in rows.items():
        ratio = r["variants_per_s"] / serial
        print(f"| {name} | {r['seconds']:.2f} | {r['variants_per_s']:.1f} | {ratio:.2f}x |")
    if args.steady:
        base = rows["serial"]["steady_variants_per_s"]
        print("\n| steady state | variants/s | vs serial | fixed start-up |")
        print("|---|---:|---:|---:|")
        for name, r in rows.items():
            if "steady_variants_per_s" in r:
                v = r["steady_variants_per_s"]
                print(f"| {name} | {v:.1f} | {v / base:.2f}x | {r['fixed_seconds']:.2f} s |")
        print()
        for j in [args.jobs, *more]:
            steady = rows[f"jobs{j}"]["steady_variants_per_s"] / base
            print(
                f"steady --jobs {j}: {steady:.2f}x serial (goal >= {0.85 * j:.2f}x): "
                f"{'met' if steady >= 0.85 * j else 'NOT met'}"
            )
    print()
    for j in [args.jobs, *more]:
        ratio = rows[f"jobs{j}"]["variants_per_s"] / serial
        print(
            f"--jobs {j}: {ratio:.2f}x serial (goal >= {0.85 * j:.2f}x): "
            f"{'met' if ratio >= 0.85 * j else 'NOT met'}"
        )
    if "ray" in rows:
        over = rows["ray"]["seconds"] / rows[f"jobs{args.jobs}"]["seconds"] - 1
        print(
            f"ray: {over * 100:+.1f} % time over the local pool (goal <= +15 %): "
            f"{'met' if over <= 0.15 else 'NOT met'}"
        )
        if args.steady:
            pool = rows[f"jobs{args.jobs}"]["steady_variants_per_s"]
            steady_over = pool / rows["ray"]["steady_variants_per_s"] - 1
            print(
                f"steady ray: {steady_over * 100:+.1f} % time over the local pool "
                f"(goal <= +15 %): {'met' if steady_over <= 0.15 else 'NOT met'}"
            )
        c = out["costs"]
        t_c = rows["serial"]["task_seconds"]
        c["compile_s"] = t_c
        c["first_compile_overhead_s"] = max(c["first_compile_s"] - t_c, 0.0)
        # the driver's serial share per task: a queued task's cost (submit, wait, get), the
        # transfer of the entries it returns, and storing them (store_entries), all measured
        per_task_kb = rows["ray"]["returned_bytes"] / args.variants / 1024
        c["returned_kb_per_task"] = per_task_kb
        c["store_per_task_s"] = rows["ray"]["store_seconds"] / args.variants
        c["driver_per_task_s"] = (
            c["task_queued_s"] + per_task_kb * c["transfer_per_kb_s"] + c["store_per_task_s"]
        )
        print("\nper-task costs (median):")
        print(f"  Ray init (local start)            {out['ray_init_s'] * 1e3:8.0f} ms")
        print(f"  empty task round trip             {c['task_round_trip_s'] * 1e3:8.2f} ms")
        print(f"  empty task, 500 queued (each)     {c['task_queued_s'] * 1e3:8.2f} ms")
        for kb, s in c["put_and_pass_s"].items():
            print(f"  put + pass {kb:>6} KB to a task     {s * 1e3:8.2f} ms")
        print(f"  object transfer per KB            {c['transfer_per_kb_s'] * 1e6:8.3f} us")
        print(f"  fresh worker start                {c['worker_start_s'] * 1e3:8.0f} ms")
        print(f"  fresh worker's first compile      {c['first_compile_s'] * 1e3:8.0f} ms")
        print(f"  one variant's compile (warm)      {t_c * 1e3:8.1f} ms")
        print(f"  entries sent back per variant     {c['returned_kb_per_task']:8.1f} KB")
        print(f"  driver stores them (per variant)  {c['store_per_task_s'] * 1e3:8.2f} ms")
        print(f"  driver's serial share per task    {c['driver_per_task_s'] * 1e3:8.2f} ms")
        out["model"] = {}
        nodes = [1, 2, 4, 8, 16, 32, 64, 100]
        for label, compile_s in (("measured", t_c), ("20 s kernels", 20.0)):
            rows_m = model(c, args.model_variants, args.cores_per_node, compile_s, nodes)
            out["model"][label] = rows_m
            print(
                f"\nmodel: {args.model_variants} variants of {compile_s:.3g} s each, "
                f"{args.cores_per_node} CPUs per node"
            )
            print("| nodes | build time | speed-up vs 1 node | bound by |")
            print("|---:|---:|---:|---|")
            for r in rows_m:
                print(
                    f"| {r['nodes']} | {r['seconds']:.1f} s | {r['speedup']:.1f}x | {r['bound']} |"
                )
    print(f"\nload average before / after: {out['load_before']:.2f} / {out['load_after']:.2f}")


if __name__ == "__main__":
    sys.exit(main())
