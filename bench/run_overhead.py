"""What ``cuforge run`` and the ``cuforge-enable.pth`` hook cost, measured in one run.

    python bench/run_overhead.py [--runs 21] [--json out.json]

Fresh processes, the variants interleaved run by run (each sees the same machine load),
wall time of the whole process from the parent (``time.perf_counter`` around
``subprocess.run``); medians, and ratios against the anchor of the same run:

1. **the wrapper**: ``cuforge run -- python -c pass`` against ``python -c pass`` (the
   anchor). The wrapper is this checkout's ``python -m cuforge run`` (its CLI, the
   telemetry snapshots before and after, the summary).
2. **the hook, unset**: ``python -c pass`` in a throwaway venv (``--without-pip``) with
   ``cuforge-enable.pth`` in its site-packages against the same venv without it, with
   ``CUFORGE_ENABLE`` unset: what every interpreter start of an environment with cuforge
   installed pays (goal: <= 1 ms).
   Also the hook's own work in process, timed precisely: ``site.addpackage`` of the file
   (what ``site`` does for each .pth at start: open, read, exec the line), microseconds.
3. for scale, the hook **set** (``CUFORGE_ENABLE=all``, this checkout on the venv's path):
   ``import cuforge`` and the after-import finder, with no peer imported.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")
PTH = os.path.join(SRC, "cuforge-enable.pth")


def _time(cmd: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{cmd} failed ({done.returncode}): {done.stderr.decode()[-2000:]}")
    return seconds


def _venv(where: str) -> tuple[str, str]:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", where], check=True)
    python = os.path.join(where, "bin", "python")
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return python, site


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=21)
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = ap.parse_args()

    base_env = {k: v for k, v in os.environ.items() if not k.startswith("CUFORGE_")}
    base_env.pop("PYTHONPATH", None)
    base_env.pop("PYTHONDONTWRITEBYTECODE", None)  # bytecode, as an installed package has it
    tmp = tempfile.mkdtemp(prefix="cuforge-run-bench-")
    try:
        cache_dir = os.path.join(tmp, "cache")
        run_env = dict(base_env, PYTHONPATH=SRC, CUFORGE_CACHE_DIR=cache_dir)
        bare, _site = _venv(os.path.join(tmp, "bare"))
        hooked, site_hooked = _venv(os.path.join(tmp, "hook"))
        shutil.copy(PTH, os.path.join(site_hooked, "cuforge-enable.pth"))
        # the set case imports this checkout's cuforge: a third venv, with src on its path
        # through a path file read before the hook (site reads .pth files sorted by name),
        # as an editable install's __editable__.cuforge-*.pth is
        with_src, site_src = _venv(os.path.join(tmp, "hook-and-src"))
        shutil.copy(PTH, os.path.join(site_src, "cuforge-enable.pth"))
        with open(os.path.join(site_src, "a-cuforge-src.pth"), "w") as f:
            f.write(SRC + "\n")

        variants = {
            "python -c pass": ([sys.executable, "-c", "pass"], base_env),
            "cuforge run -- python -c pass": (
                [sys.executable, "-m", "cuforge", "run", "--", sys.executable, "-c", "pass"],
                run_env,
            ),
            "venv, no hook": ([bare, "-c", "pass"], base_env),
            "venv, hook, CUFORGE_ENABLE unset": ([hooked, "-c", "pass"], base_env),
            "venv, hook, CUFORGE_ENABLE=all": (
                [with_src, "-c", "pass"],
                dict(base_env, CUFORGE_ENABLE="all", CUFORGE_CACHE_DIR=cache_dir),
            ),
        }
        os.environ.pop("CUFORGE_ENABLE", None)  # (this process: the hook's unset path)
        import site
        import timeit

        per_call = timeit.repeat(
            lambda: site.addpackage(site_hooked, "cuforge-enable.pth", set()),
            number=500,
            repeat=9,
        )
        hook_us = statistics.median(per_call) / 500 * 1e6
        for cmd, env in variants.values():  # warm the page cache and write bytecode
            _time(cmd, env)
        times: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.runs):
            for name, (cmd, env) in variants.items():
                times[name].append(_time(cmd, env))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    med = {name: statistics.median(ts) * 1e3 for name, ts in times.items()}
    anchor, venv_anchor = med["python -c pass"], med["venv, no hook"]
    print(f"python {sys.version.split()[0]} on {sysconfig.get_platform()}, {args.runs} runs")
    print(f"{'variant':<36} {'median ms':>10} {'vs anchor':>10} {'delta ms':>9}")
    rows = []
    for name, ms in med.items():
        ref = venv_anchor if name.startswith("venv") else anchor
        rows.append({"variant": name, "median_ms": round(ms, 3), "ratio": round(ms / ref, 3),
                     "delta_ms": round(ms - ref, 3)})  # fmt: skip
        print(f"{name:<36} {ms:>10.2f} {ms / ref:>9.2f}x {ms - ref:>+9.2f}")
    hook = med["venv, hook, CUFORGE_ENABLE unset"] - venv_anchor
    print(f"the hook with CUFORGE_ENABLE unset: {hook:+.2f} ms per interpreter start "
          f"(goal <= 1 ms: {'met' if hook <= 1.0 else 'NOT met'})")  # fmt: skip
    print(f"the hook's own work (site.addpackage of cuforge-enable.pth, unset): {hook_us:.1f} us")
    if args.json:
        with open(args.json, "w") as f:
            doc = {"runs": args.runs, "rows": rows, "hook_unset_ms": round(hook, 3),
                   "hook_addpackage_us": round(hook_us, 2)}  # fmt: skip
            json.dump(doc, f)


if __name__ == "__main__":
    main()
