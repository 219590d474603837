"""What a configured remote costs the warm path. Runs on the CPU; no GPU needed.

    python bench/remote_warm_path.py [--runs 7] [--arch sm_90] [--json out.json]

Starts a redis-server on 127.0.0.1 (``tests/remote_servers.py``) and stops it at the end.
Every figure is one ``cuforge.compile_file`` call of the CUB block-reduce sample
(``block_sum<256, float>``) in a fresh process (the first call of the process: it pays for
whatever the path loads), the median of ``--runs`` processes:

* (a) local disk hit, no remote configured;
* (b) local disk hit, ``CUFORGE_REMOTE=redis://...`` configured (the entry is on disk, so
  the remote is never needed);
* (c) remote hit on a new, empty cache dir (the entry on Redis only; the first process on
  that cache dir also identifies the compiler);
* (d) the compile itself: an empty cache dir, no remote.

Also reported: ``b - a`` (goal: within 1 ms), ``c / d`` (goal: <= 0.1), whether the (b)
processes imported redis-py, and the server's connection count over the (b) runs (goal:
no connection at all).
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

CHILD = textwrap.dedent(
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


def _env(cache_dir: str, remote: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUFORGE_")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # measure with cached bytecode, as users run
    env["PYTHONPATH"] = os.path.join(ROOT, "src")
    env["CUFORGE_CACHE_DIR"] = cache_dir
    if remote:
        env["CUFORGE_REMOTE"] = remote
    return env


def _child(env: dict[str, str], arch: str, expect: str) -> dict:
    code = CHILD.format(path=SAMPLE, arch=arch, exprs=EXPRS)
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"benchmark child failed:\n{done.stdout}\n{done.stderr}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    if out["from"] != expect:
        raise RuntimeError(f"expected a {expect} result, got {out['from']}")
    return out


def run(arch: str, runs: int, workdir: str) -> dict:
    from tests.remote_servers import RedisServer

    server = RedisServer(os.path.join(workdir, "redis"))
    try:
        url = server.url
        warm = os.path.join(workdir, "warm")
        _child(_env(warm), arch, "compiled")  # the disk entry (a) and (b) hit
        _child(_env(warm), arch, "disk")  # (and the toolchain memo, warm)
        seed = os.path.join(workdir, "seed")
        _child(_env(seed, url), arch, "compiled")  # written through to Redis
        fig: dict[str, list[float]] = {"a": [], "b": [], "c": [], "d": []}
        redis_imported = False
        raw = server.client()
        before = raw.info("stats")["total_connections_received"]
        for _ in range(runs):
            fig["a"].append(_child(_env(warm), arch, "disk")["seconds"])
        for _ in range(runs):
            out = _child(_env(warm, url), arch, "disk")
            fig["b"].append(out["seconds"])
            redis_imported |= out["redis_imported"]
        connections_b = raw.info("stats")["total_connections_received"] - before
        for i in range(runs):
            fresh = os.path.join(workdir, f"fresh-{i}")
            fig["c"].append(_child(_env(fresh, url), arch, "remote")["seconds"])
        for i in range(runs):
            cold = os.path.join(workdir, f"cold-{i}")
            fig["d"].append(_child(_env(cold), arch, "compiled")["seconds"])
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


def render(doc: dict) -> str:
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
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="cuforge-remote-warm-")
    try:
        doc = run(args.arch, args.runs, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(render(doc))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
