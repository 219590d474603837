"""How long does the disk tier's stats() take on a big cache?

Fills a temp cache with N small entries (default 100,000) through the real put() path,
then times ``DiskStore(root).stats()`` on a fresh instance (so the index is read from
scratch, as ``cuforge cache stats`` does in a new process) and in a fresh interpreter.
Prints the medians. The goal (issue 5): under 2 s for 100,000 entries.

    python bench/store_stats.py [--entries 100000] [--runs 5] [--dir DIR] [--json]

The fill uses /dev/shm when it exists (put() fsyncs every entry; on tmpfs that is free,
which keeps the fill itself quick); pass --dir to measure another filesystem.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))

from cuforge.store.base import Entry  # noqa: E402
from cuforge.store.disk import DiskStore  # noqa: E402


def fill(root: str, n: int) -> float:
    store = DiskStore(root, 1 << 40, telemetry=False)
    kinds = ("kernel", "manifest", "object")
    t0 = time.perf_counter()
    for i in range(n):
        key = hashlib.sha256(b"%d" % i).hexdigest()
        meta = {"name": f"kernel_{i % 500}.cu", "arch": "sm_90", "compile_seconds": 0.2}
        store.put(Entry(key, kinds[i % 3], os.urandom(256), meta))
    return time.perf_counter() - t0


def time_in_process(root: str, runs: int) -> tuple[list[float], dict]:
    times = []
    stats = None
    for _ in range(runs):
        t0 = time.perf_counter()
        stats = DiskStore(root, 1 << 40).stats()
        times.append(time.perf_counter() - t0)
    return times, stats.as_dict()


def time_fresh_process(root: str, runs: int) -> list[float]:
    code = (
        "import sys, time; t0 = time.perf_counter()\n"
        "from cuforge.store.disk import DiskStore\n"
        f"s = DiskStore({root!r}, 1 << 40).stats()\n"
        "print(time.perf_counter() - t0, s.entries)"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(os.path.dirname(HERE), "src")
    times = []
    for _ in range(runs):
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        times.append(float(out.stdout.split()[0]))
    return times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--dir", default=None, help="parent dir of the temp cache")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    parent = args.dir or ("/dev/shm" if os.path.isdir("/dev/shm") else None)
    root = tempfile.mkdtemp(prefix="cuforge-bench-stats-", dir=parent)
    try:
        fill_s = fill(root, args.entries)
        in_proc, stats = time_in_process(root, args.runs)
        fresh = time_fresh_process(root, args.runs)
        journal = os.path.join(root, "v1", "index", "journal")
        result = {
            "entries": stats["entries"],
            "bytes": stats["bytes"],
            "fill_seconds": round(fill_s, 2),
            "stats_median_s": round(statistics.median(in_proc), 4),
            "stats_runs_s": [round(t, 4) for t in in_proc],
            "fresh_process_stats_median_s": round(statistics.median(fresh), 4),
            "fresh_process_runs_s": [round(t, 4) for t in fresh],
            "journal_bytes": os.path.getsize(journal),
            "dir": parent or tempfile.gettempdir(),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"disk tier stats() on {result['entries']:,} entries "
            f"({result['bytes'] / 1e6:.1f} MB, index {result['journal_bytes'] / 1e6:.1f} MB): "
            f"median {result['stats_median_s'] * 1e3:.0f} ms over {args.runs} runs "
            f"(fresh interpreter, import included: "
            f"{result['fresh_process_stats_median_s'] * 1e3:.0f} ms); "
            f"fill took {result['fill_seconds']:.1f} s"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
