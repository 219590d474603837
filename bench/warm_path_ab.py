"""The warm path of two cuforge trees, measured in one run (A/B, interleaved).

    python bench/warm_path_ab.py --base /path/to/other/checkout/src [--runs 21] [--json out.json]

For each tree (this checkout's ``src`` and ``--base``), in fresh processes, alternating
between the trees run by run so that both see the same machine load:

1. ``import cuforge`` (ms);
2. the first ``compile_file`` of the CUB block-reduce sample right after the import: a warm
   disk hit (ms; its own cache dir per tree, warmed once before timing);
3. the same call repeated in-process (the call memo, microseconds; best of 5 x 20,000).

Reported: the median of each, and new/base ratios. Bytecode is written (as an installed
package has it): ``PYTHONDONTWRITEBYTECODE`` is unset in the children.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
NEW_SRC = os.path.join(os.path.dirname(HERE), "src")

CHILD = textwrap.dedent(
    """
    import json, sys, time, timeit
    t0 = time.perf_counter()
    import cuforge
    t1 = time.perf_counter()
    from cuforge.samples import SAMPLES_DIR
    path = SAMPLES_DIR + "/block_reduce.cu"
    kw = dict(arch="sm_90", name_expressions=("block_sum<256, float>",))
    r = cuforge.compile_file(path, **kw)
    t2 = time.perf_counter()
    repeat = None
    if sys.argv[1] == "repeat":
        f = lambda: cuforge.compile_file(path, **kw)
        repeat = min(timeit.repeat(f, number=20000, repeat=5)) / 20000 * 1e6
    print(json.dumps({"import_ms": (t1 - t0) * 1e3, "hit_ms": (t2 - t1) * 1e3,
                      "source": r.source_of_result, "repeat_us": repeat}))
    """
)


def _run(src: str, cache: str, mode: str) -> dict:
    env = dict(os.environ, PYTHONPATH=src, CUFORGE_CACHE_DIR=cache)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    for name in ("CUFORGE_REMOTE", "CUFORGE_OFFLINE", "CUFORGE_DISABLE_CACHE"):
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, mode], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the other tree's src directory")
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    trees = {"base": os.path.abspath(args.base), "new": NEW_SRC}
    scratch = tempfile.mkdtemp(prefix="cuforge-ab-")
    caches = {name: os.path.join(scratch, name) for name in trees}
    for name, src in trees.items():  # warm each tree's cache (and its bytecode)
        _run(src, caches[name], "hit")
        assert _run(src, caches[name], "hit")["source"] == "disk"
    samples: dict[str, list[dict]] = {name: [] for name in trees}
    for i in range(args.runs):
        order = list(trees) if i % 2 == 0 else list(reversed(trees))
        for name in order:
            samples[name].append(_run(trees[name], caches[name], "hit"))
    repeats = {name: [] for name in trees}
    for i in range(5):
        for name in trees if i % 2 == 0 else reversed(list(trees)):
            repeats[name].append(_run(trees[name], caches[name], "repeat")["repeat_us"])
    out: dict = {}
    for name in trees:
        out[name] = {
            "import_ms": statistics.median(s["import_ms"] for s in samples[name]),
            "hit_ms": statistics.median(s["hit_ms"] for s in samples[name]),
            "import_plus_hit_ms": statistics.median(
                s["import_ms"] + s["hit_ms"] for s in samples[name]
            ),
            "repeat_us": statistics.median(repeats[name]),
        }
    out["ratio_new_over_base"] = {
        k: out["new"][k] / out["base"][k] for k in out["new"] if out["base"][k]
    }
    print(f"{'':22}{'base':>10}{'new':>10}{'new/base':>10}")
    for k in ("import_ms", "hit_ms", "import_plus_hit_ms", "repeat_us"):
        print(
            f"{k:22}{out['base'][k]:10.3f}{out['new'][k]:10.3f}"
            f"{out['ratio_new_over_base'][k]:10.3f}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
