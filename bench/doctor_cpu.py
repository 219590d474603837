"""How much CPU does a second ``cuforge doctor`` cost, against ``cuforge cache stats``?

The doctor's fp16/bf16/CUB probe kernels go through the cache it reports on (issue 36,
item 4), so after one warm-up run a ``cuforge doctor`` compiles nothing. This runs
``python -m cuforge doctor`` once to warm a fresh cache dir, then ``--runs`` times each of
``cuforge doctor`` and ``cuforge cache stats`` as child processes, and prints the medians
of the children's CPU time (user + system, the child and its own children, from
``os.wait4``'s rusage) and their ratio. Goal: the second doctor <= 3x ``cache stats``.

    PYTHONPATH=src python bench/doctor_cpu.py [--runs 7] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")


def child_cpu(args: list[str], env: dict[str, str]) -> float:
    """CPU seconds (user + system) of ``python -m cuforge ARGS`` and everything it ran."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "cuforge", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode not in (0, 1):  # doctor exits 1 when a check FAILs; still measured
        raise SystemExit(f"cuforge {' '.join(args)} exited {proc.returncode}")
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="runs of each command (7)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    ns = parser.parse_args()
    if ns.runs < 1:
        parser.error("--runs must be at least 1")
    with tempfile.TemporaryDirectory(prefix="cuforge-doctor-bench-") as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CUFORGE_")}
        env.update(
            CUFORGE_CACHE_DIR=os.path.join(tmp, "cache"),
            PYTHONPATH=SRC + os.pathsep + env.get("PYTHONPATH", ""),
            CI="true",
        )
        first = child_cpu(["doctor"], env)  # compiles the probe kernels into the cache
        doctor, stats = [], []
        for _ in range(ns.runs):  # interleaved, so drift hits both alike
            doctor.append(child_cpu(["doctor"], env))
            stats.append(child_cpu(["cache", "stats"], env))
    result = {
        "runs": ns.runs,
        "first_doctor_cpu_s": round(first, 3),
        "doctor_cpu_s": round(statistics.median(doctor), 3),
        "cache_stats_cpu_s": round(statistics.median(stats), 3),
    }
    result["ratio"] = round(result["doctor_cpu_s"] / result["cache_stats_cpu_s"], 2)
    if ns.json:
        print(json.dumps(result))
    else:
        print(f"first doctor (compiles the probes): {result['first_doctor_cpu_s']:.3f} s CPU")
        print(f"second doctor, median of {ns.runs}:    {result['doctor_cpu_s']:.3f} s CPU")
        print(f"cache stats, median of {ns.runs}:      {result['cache_stats_cpu_s']:.3f} s CPU")
        print(f"ratio: {result['ratio']:.2f}x (goal <= 3x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
