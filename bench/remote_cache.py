"""Remote-cache benchmark (issue 10, section 7). Runs on the CPU; no GPU needed.

    python bench/remote_cache.py [--runs 7] [--arch sm_90] [--json out.json]

Starts its own servers on 127.0.0.1 (redis-server, and nginx with WebDAV PUT when
installed; the helpers of ``tests/remote_servers.py``) and stops them at the end.

1. **Remote hit.** The CUB block-reduce sample (``block_sum<256, float>``). Every run is a
   fresh process that makes two calls, each for a different variant of the kernel
   (a second variant differs by an unused ``-D``): the *first* call pays for loading what
   the path needs (NVRTC, the Redis client, the connection), the *next* one is the steady
   state of a long-running process. Rows:

   * local compile (cold): an empty cache, no remote;
   * local disk hit: a cache dir that holds both variants;
   * Redis / HTTP (nginx) / file:// remote hit: an empty local cache dir, both variants
     (kernel and manifest) on the remote, put there with ``cuforge cache push``'s library
     function.

   Each figure is the median of ``--runs`` processes; ``x compile`` is the local compile
   of the same call divided by the row's time. Goal: a Redis hit <= 3 ms and >= 500x
   faster than compiling.

2. **Remote down.** What a remote that is down adds to a miss. In a fresh process with
   ``CUFORGE_REMOTE`` pointing at (a) a closed port and (b) a black hole (a server that
   accepts connections and never answers), 8 misses in a row (each a new small kernel,
   compiled); the same 8 without a remote are the anchor. ``added`` is the difference of
   the medians over ``--runs`` processes, per miss. Goal: at most the timeout, once; then
   about 0 with the circuit breaker open.

3. **Warm path** (``--only warm`` runs just this). What a configured remote costs a process
   that never needs it, and what a remote hit costs a process on a new cache dir. Each
   figure is the *first* ``compile_file`` call of the sample in a fresh process (it pays
   for whatever the path loads), the median of ``--runs`` processes: (a) local disk hit, no
   remote; (b) local disk hit with ``CUFORGE_REMOTE=redis://...`` (the remote is never
   needed); (c) Redis hit on a new, empty cache dir (that first process also identifies the
   compiler); (d) the compile, on an empty cache dir. Reported: ``b - a`` (goal <= 1 ms),
   ``c / d`` (goal <= 0.1), whether (b) imported redis-py and how many connections the
   server saw during (b) (goal: none).
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
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "src"))
sys.path.insert(0, ROOT)  # tests.remote_servers

from cuforge.samples import SAMPLES_DIR  # noqa: E402

SAMPLE = os.path.join(SAMPLES_DIR, "block_reduce.cu")
EXPRS = ["block_sum<256, float>"]
#: the two variants each process asks for (same kernel; the second has an unused define)
VARIANTS = ({}, {"CUFORGE_BENCH_VARIANT": "2"})

HIT_CHILD = textwrap.dedent(
    """
    import json, time
    t0 = time.perf_counter()
    import cuforge
    import cuforge.store
    t1 = time.perf_counter()
    out = {{"import": t1 - t0, "calls": [], "from": []}}
    for defines in {variants!r}:
        start = time.perf_counter()
        p = cuforge.compile_file({path!r}, arch={arch!r}, name_expressions={exprs!r},
                                 defines=defines)
        out["calls"].append(time.perf_counter() - start)
        out["from"].append(p.source_of_result)
    # the remote tier alone: one GET of the kernel entry (envelope checked), no back-fill
    remotes = [t for t in getattr(cuforge.default_cache().store, "tiers", ())
               if t.tier.startswith("remote")]
    if remotes:
        gets = []
        for _ in range(21):
            start = time.perf_counter()
            assert remotes[0].get(p.key, kind="kernel") is not None
            gets.append(time.perf_counter() - start)
        out["get"] = sorted(gets)[len(gets) // 2]
    print(json.dumps(out))
    """
)

MISS_CHILD = textwrap.dedent(
    """
    import json, time, uuid
    import cuforge
    tag = uuid.uuid4().hex
    times = []
    for i in range({misses}):
        src = ('extern "C" __global__ void k(float* x) {{ x[threadIdx.x] += %d; }}'
               '// %s' % (i, tag))
        start = time.perf_counter()
        p = cuforge.compile(src, name="miss_%d.cu" % i, arch={arch!r})
        times.append(time.perf_counter() - start)
        assert p.source_of_result == "compiled", p.source_of_result
    print(json.dumps({{"times": times}}))
    """
)


def _env(cache_dir: str, remote: str | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUFORGE_")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # measure with cached bytecode, as users run
    env["PYTHONPATH"] = os.path.join(ROOT, "src")
    env["CUFORGE_CACHE_DIR"] = cache_dir
    if remote:
        env["CUFORGE_REMOTE"] = remote
    env.update(extra)
    return env


def _child(code: str, env: dict[str, str]) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"benchmark child failed:\n{done.stdout}\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _hit_code(arch: str) -> str:
    return HIT_CHILD.format(variants=list(VARIANTS), path=SAMPLE, arch=arch, exprs=EXPRS)


def _median_calls(samples: list[dict]) -> tuple[float, float]:
    return (
        statistics.median(s["calls"][0] for s in samples),
        statistics.median(s["calls"][1] for s in samples),
    )


# -- servers ------------------------------------------------------------------------------


def _start_servers(workdir: str) -> tuple[dict[str, str], list, dict[str, str]]:
    """{label: url}, the server objects (to stop), {label: why it is unavailable}."""
    import pytest
    from tests import remote_servers

    urls: dict[str, str] = {}
    servers: list = []
    missing: dict[str, str] = {}
    for label, cls in (("Redis", "RedisServer"), ("HTTP (nginx)", "NginxServer")):
        try:
            server = getattr(remote_servers, cls)(os.path.join(workdir, cls))
        except pytest.skip.Exception as exc:
            missing[label] = str(exc.msg if hasattr(exc, "msg") else exc)
            continue
        except RuntimeError as exc:
            missing[label] = str(exc)[:200]
            continue
        servers.append(server)
        urls[label] = server.url
    shared = os.path.join(workdir, "shared")
    os.makedirs(shared)
    urls["file://"] = "file://" + shared
    return urls, servers, missing


def _push(cache_dir: str, url: str) -> None:
    """Put every entry of ``cache_dir`` on the remote ``url`` (as `cuforge cache push`)."""
    from cuforge.base.config import settings
    from cuforge.store.disk import DiskStore
    from cuforge.store.remote import sync

    local = DiskStore(cache_dir, settings().cache_max_bytes, telemetry=False)
    for remote in sync.open_targets([url]):
        result = sync.push(local, remote)
        if not result.ok or result.copied == 0:
            raise RuntimeError(f"could not fill {url}: {result.as_dict()}")


# -- 1. remote hit --------------------------------------------------------------------------


def bench_hits(arch: str, runs: int, workdir: str) -> tuple[list[dict], dict[str, str]]:
    code = _hit_code(arch)
    rows: list[dict] = []

    cold = []
    for i in range(runs):
        cold.append(_child(code, _env(os.path.join(workdir, f"cold-{i}"))))
    assert all(s["from"] == ["compiled", "compiled"] for s in cold), cold
    compile_first, compile_next = _median_calls(cold)
    rows.append(_row("local compile (cold)", cold, compile_first, compile_next))

    filled = os.path.join(workdir, "filled")
    _child(code, _env(filled))  # compiles both variants
    _child(code, _env(filled))  # bytecode and page cache warm-up
    disk = [_child(code, _env(filled)) for _ in range(runs)]
    assert all(s["from"] == ["disk", "disk"] for s in disk), disk
    rows.append(_row("local disk hit", disk, compile_first, compile_next))

    urls, servers, missing = _start_servers(workdir)
    try:
        for label, url in urls.items():
            _push(filled, url)
            samples, empty = [], []
            for i in range(runs + 1):  # the first run warms bytecode; not counted
                # an empty cache dir: the first call also probes the toolchain (hashes the
                # NVRTC library, memoized in <cache>/toolchain.json), as on a new machine
                fresh = os.path.join(workdir, f"remote-{len(rows)}-{i}-empty")
                sample = _child(code, _env(fresh, url))
                if i:
                    empty.append(sample)
                # a cache dir that has been used before (its toolchain memo present) but
                # holds none of these entries: the everyday remote hit
                used = os.path.join(workdir, f"remote-{len(rows)}-{i}")
                os.makedirs(used, mode=0o700)
                shutil.copy2(os.path.join(filled, "toolchain.json"), used)
                sample = _child(code, _env(used, url))
                if i:
                    samples.append(sample)
            wrong = [s["from"] for s in samples + empty if s["from"] != ["remote", "remote"]]
            row = _row(f"{label} remote hit", samples, compile_first, compile_next)
            row["empty_dir_first_ms"] = statistics.median(s["calls"][0] for s in empty) * 1e3
            if wrong:
                row["note"] = f"not served by the remote: {wrong[0]}"
            rows.append(row)
    finally:
        for server in servers:
            server.kill()
    return rows, missing


def _row(label: str, samples: list[dict], compile_first: float, compile_next: float) -> dict:
    first, nxt = _median_calls(samples)
    gets = [s["get"] for s in samples if "get" in s]
    return {
        "what": label,
        "get_ms": statistics.median(gets) * 1e3 if gets else None,
        "first_ms": first * 1e3,
        "next_ms": nxt * 1e3,
        "x_compile_first": compile_first / first,
        "x_compile_next": compile_next / nxt,
        "import_ms": statistics.median(s["import"] for s in samples) * 1e3,
    }


# -- 2. remote down -------------------------------------------------------------------------


def bench_down(arch: str, runs: int, workdir: str, misses: int = 8) -> dict:
    from tests.remote_servers import BlackHole, free_port

    code = MISS_CHILD.format(misses=misses, arch=arch)

    def medians(remote: str | None, tag: str) -> list[float]:
        per_call: list[list[float]] = [[] for _ in range(misses)]
        for i in range(runs):
            out = _child(code, _env(os.path.join(workdir, f"down-{tag}-{i}"), remote))
            for j, t in enumerate(out["times"]):
                per_call[j].append(t)
        return [statistics.median(c) for c in per_call]

    medians(None, "warmup")  # bytecode, NVRTC in the page cache
    anchor = medians(None, "none")
    hole = BlackHole()
    try:
        cases = {
            "closed port (redis://)": f"redis://127.0.0.1:{free_port()}/0",
            "closed port (http://)": f"http://127.0.0.1:{free_port()}/cache",
            "black hole (redis://)": hole.url("redis"),
            "black hole (http://)": hole.url("http"),
        }
        out = {"anchor_ms": [t * 1e3 for t in anchor], "cases": {}}
        for label, url in cases.items():
            times = medians(url, str(len(out["cases"])))
            out["cases"][label] = [(t - a) * 1e3 for t, a in zip(times, anchor, strict=True)]
    finally:
        hole.close()
    return out


# -- report ---------------------------------------------------------------------------------


def render(hits: list[dict], missing: dict[str, str], down: dict, args) -> str:
    from cuforge.base.config import settings

    st = settings()
    lines = [
        f"`python bench/remote_cache.py --runs {args.runs} --arch {args.arch}` "
        f"(median of {args.runs} fresh processes; loopback servers)",
        "",
        "Remote hit, CUB block reduce (`block_sum<256, float>`):",
        "",
        "| path | first call in a process | next call | x compile (first / next) "
        "| first call, empty cache dir | one remote GET of the kernel |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in hits:
        note = f" ({r['note']})" if r.get("note") else ""
        get = f"{r['get_ms']:.2f} ms" if r.get("get_ms") is not None else "-"
        empty = f"{r['empty_dir_first_ms']:.1f} ms" if "empty_dir_first_ms" in r else "-"
        lines.append(
            f"| {r['what']}{note} | {r['first_ms']:.2f} ms | {r['next_ms']:.2f} ms | "
            f"{r['x_compile_first']:.0f}x / {r['x_compile_next']:.0f}x | {empty} | {get} |"
        )
    for label, why in missing.items():
        lines.append(f"| {label} remote hit | not measured: {why} | | | | |")
    lines += [
        "",
        "First call: a fresh process whose cache dir was used before (its toolchain memo is "
        "there) but lacks these entries; next call: the second variant in the same process. "
        "Empty cache dir: the first call also probes the toolchain once (hashes the NVRTC "
        "library), as on a new machine.",
    ]
    lines += [
        "",
        f"Remote down: time a down remote adds to each of {len(down['anchor_ms'])} misses in "
        f"a row (connect timeout {st.remote_connect_timeout * 1e3:.0f} ms, transfer timeout "
        f"{st.remote_timeout * 1e3:.0f} ms; a miss without a remote: "
        f"{statistics.median(down['anchor_ms']):.1f} ms):",
        "",
        "| remote | " + " | ".join(f"miss {i + 1}" for i in range(len(down["anchor_ms"]))) + " |",
        "|---|" + "---:|" * len(down["anchor_ms"]),
    ]
    for label, added in down["cases"].items():
        lines.append(f"| {label} | " + " | ".join(f"{a:+.1f} ms" for a in added) + " |")
    return "\n".join(lines)


WARM_CHILD = textwrap.dedent(
    """
    import json, sys, time
    import cuforge
    start = time.perf_counter()
    p = cuforge.compile_file({path!r}, arch={arch!r}, name_expressions={exprs!r})
    seconds = time.perf_counter() - start
    print(json.dumps({{"seconds": seconds, "from": p.source_of_result,
                      "redis_imported": "redis" in sys.modules}}))
    """
)


def _warm_child(env: dict[str, str], arch: str, expect: str) -> dict:
    out = _child(WARM_CHILD.format(path=SAMPLE, arch=arch, exprs=EXPRS), env)
    if out["from"] != expect:
        raise RuntimeError(f"expected a {expect} result, got {out['from']}")
    return out


def bench_warm_path(arch: str, runs: int, workdir: str) -> dict:
    from tests.remote_servers import RedisServer

    server = RedisServer(os.path.join(workdir, "redis"))
    try:
        url = server.url
        warm = os.path.join(workdir, "warm")
        _warm_child(_env(warm), arch, "compiled")  # the disk entry (a) and (b) hit
        _warm_child(_env(warm), arch, "disk")  # (and the toolchain memo, warm)
        seed = os.path.join(workdir, "seed")
        _warm_child(_env(seed, url), arch, "compiled")  # written through to Redis
        fig: dict[str, list[float]] = {"a": [], "b": [], "c": [], "d": []}
        redis_imported = False
        raw = server.client()
        before = raw.info("stats")["total_connections_received"]
        for _ in range(runs):
            fig["a"].append(_warm_child(_env(warm), arch, "disk")["seconds"])
        for _ in range(runs):
            out = _warm_child(_env(warm, url), arch, "disk")
            fig["b"].append(out["seconds"])
            redis_imported |= out["redis_imported"]
        connections_b = raw.info("stats")["total_connections_received"] - before
        for i in range(runs):
            fresh = os.path.join(workdir, f"fresh-{i}")
            fig["c"].append(_warm_child(_env(fresh, url), arch, "remote")["seconds"])
        for i in range(runs):
            cold = os.path.join(workdir, f"cold-{i}")
            fig["d"].append(_warm_child(_env(cold), arch, "compiled")["seconds"])
    finally:
        server.kill()
    med = {k: statistics.median(v) for k, v in fig.items()}
    return {
        "runs": runs,
        "arch": arch,
        "median_ms": {k: round(v * 1e3, 2) for k, v in med.items()},
        "samples_ms": {k: [round(x * 1e3, 2) for x in v] for k, v in fig.items()},
        "b_minus_a_ms": round((med["b"] - med["a"]) * 1e3, 2),
        "c_over_d": round(med["c"] / med["d"], 4),
        "b_imported_redis": redis_imported,
        "b_connections": connections_b,
    }


def render_warm_path(doc: dict) -> str:
    m = doc["median_ms"]
    lines = [
        f"remote warm path (CUB block_sum<256, float>, {doc['arch']}; median of "
        f"{doc['runs']} fresh processes, one compile_file call each)",
        f"  (a) local disk hit, no remote         {m['a']:9.2f} ms",
        f"  (b) local disk hit, redis configured  {m['b']:9.2f} ms",
        f"  (c) redis hit, new cache dir          {m['c']:9.2f} ms",
        f"  (d) compile, new cache dir            {m['d']:9.2f} ms",
        f"  b - a = {doc['b_minus_a_ms']:.2f} ms (goal <= 1 ms); c / d = {doc['c_over_d']:.4f} "
        "(goal <= 0.1)",
        f"  (b) imported redis-py: {doc['b_imported_redis']}; connections to the server "
        f"during (b): {doc['b_connections']}",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    parser.add_argument(
        "--only", choices=("warm",), help="run one section only (warm: the warm path, 3.)"
    )
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="cuforge-bench-remote-")
    doc: dict = {}
    try:
        if args.only is None:
            hits, missing = bench_hits(args.arch, args.runs, workdir)
            down = bench_down(args.arch, args.runs, workdir)
            doc.update(hits=hits, unavailable=missing, down=down)
        doc["warm_path"] = bench_warm_path(args.arch, args.runs, os.path.join(workdir, "warm"))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if args.only is None:
        print(render(doc["hits"], doc["unavailable"], doc["down"], args))
        print()
    print(render_warm_path(doc["warm_path"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
