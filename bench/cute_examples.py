"""CUTLASS's own CuTe DSL examples, unmodified, under ``cuforge.cute.enable()`` (GPU).

The examples are not kept in this repository: the script runs them from a CUTLASS checkout,
at their upstream paths under ``DIR/examples/python/CuTeDSL/cute/`` (``--cutlass DIR``, or
the environment variable ``CUTLASS_DIR``). The figures in docs/cute.md were taken at commit
7107b05535f8977f5ecb9d01ee203205b1fd9bc4 (main after v4.7.0, for nvidia-cutlass-dsl 4.8.1):

    git clone https://github.com/NVIDIA/cutlass && git -C cutlass checkout \
        7107b05535f8977f5ecb9d01ee203205b1fd9bc4
    PYTHONPATH=src python3 bench/cute_examples.py --cutlass cutlass --json $OUT/cute.json

Each example runs as ``__main__`` through :mod:`runpy` in a fresh process, with
``cuforge.cute.enable()`` called first and small sizes given through the example's own
command line; twice on one cache dir: cold (empty cache) and warm (a fresh process, the
same cache). The child counts the calls of the real ``cute.compile`` (cuforge's
``counters["compile"]``) and of the DSL's compile pipeline (every ``compile_and_cache`` of
the DSL classes: it runs once per real compilation, implicit ``@cute.jit`` calls included).

Prints a table (example, cold ok, warm ok, warm compiles) and writes the JSON. Bytecode is
cached as in a real install (``PYTHONDONTWRITEBYTECODE`` is dropped for the children).
Every example file (and the files it imports) is checked before anything runs: a missing
one is an error naming its path and the commit above.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from _cute_child import PIPELINE_COUNTER, run_child

#: the CUTLASS commit the figures in docs/cute.md were taken at
CUTLASS_COMMIT = "7107b05535f8977f5ecb9d01ee203205b1fd9bc4"
CLONE = f"git clone https://github.com/NVIDIA/cutlass && git -C cutlass checkout {CUTLASS_COMMIT}"
#: where the CuTe DSL examples live in a CUTLASS checkout
EXAMPLES_SUBDIR = os.path.join("examples", "python", "CuTeDSL", "cute")

_ITERS = ["--warmup_iterations", "0", "--iterations", "1"]

#: example (its path under EXAMPLES_SUBDIR) -> its own command-line arguments (small sizes,
#: no benchmark loops)
EXAMPLES: dict[str, list[str]] = {
    "ampere/kernel/elementwise/elementwise_add.py": ["--M", "256", "--N", "256", *_ITERS],
    "ampere/kernel/elementwise/elementwise_apply.py": ["--M", "256", "--N", "256", *_ITERS],
    "ampere/kernel/dense_gemm/sgemm.py": ["--mnk", "256,256,64", *_ITERS],
    "ampere/kernel/dense_gemm/tensorop_gemm.py": ["--mnkl", "256,256,256,1", *_ITERS],
    "hopper/kernel/dense_gemm/dense_gemm.py": ["--mnkl", "256,256,256,1", *_ITERS],
    "hopper/kernel/dense_gemm/dense_gemm_persistent.py": ["--mnkl", "256,256,256,1", *_ITERS],
    # RMSNorm (a row reduction; Hopper & Blackwell): imports its sibling
    # blackwell/kernel/reduce/reduce.py through the path it puts on sys.path itself
    "blackwell/kernel/rmsnorm/rmsnorm.py": ["--M", "256", "--N", "4096"],
    "ampere/kernel/attention/flash_attention_v2.py": [
        "--batch_size",
        "1",
        "--seqlen_q",
        "256",
        "--seqlen_k",
        "256",
        "--num_head",
        "2",
        "--head_dim",
        "64",
        *_ITERS,
    ],
}

#: example -> the other files of the checkout it imports (checked before it runs)
NEEDS: dict[str, list[str]] = {
    "blackwell/kernel/rmsnorm/rmsnorm.py": ["blackwell/kernel/reduce/reduce.py"],
}


def select(only: list[str] | None) -> list[str]:
    """The examples to run: all, or those ``only`` names, each by its path under
    EXAMPLES_SUBDIR or its file name; an unknown name is an error listing the known ones."""
    if not only:
        return list(EXAMPLES)
    chosen = []
    for name in only:
        match = [e for e in EXAMPLES if name in (e, os.path.basename(e))]
        if not match:
            raise SystemExit(
                f"--only: unknown example {name!r}; expected one of: " + ", ".join(EXAMPLES)
            )
        chosen += [e for e in match if e not in chosen]
    return chosen


def locate(cutlass_dir: str, examples: list[str]) -> dict[str, str]:
    """Each example's file in the CUTLASS checkout ``cutlass_dir`` (example -> absolute
    path). Every file an example needs must exist: the error names each missing path and
    the commit the examples were taken at."""
    root = os.path.join(os.path.abspath(cutlass_dir), EXAMPLES_SUBDIR)
    if not os.path.isdir(root):
        raise SystemExit(
            f"--cutlass {cutlass_dir!r} is not a CUTLASS checkout: {root} is not a "
            f"directory (get one at commit {CUTLASS_COMMIT}: {CLONE})"
        )
    missing = []
    paths = {}
    for example in examples:
        for rel in (example, *NEEDS.get(example, ())):
            path = os.path.join(root, *rel.split("/"))
            if not os.path.isfile(path):
                missing.append(path)
        paths[example] = os.path.join(root, *example.split("/"))
    if missing:
        raise SystemExit(
            "CuTe DSL example files missing from the CUTLASS checkout:\n  "
            + "\n  ".join(missing)
            + f"\nthe examples are run as they are at commit {CUTLASS_COMMIT}: {CLONE}"
        )
    return paths


CHILD = (
    r"""
import json, os, runpy, sys, time
t0 = time.perf_counter()
import cuforge.cute
cuforge.cute.enable()
from cuforge.cute.cache import counters
import cutlass.cute  # noqa: F401
"""
    + PIPELINE_COUNTER
    + r"""
path, argv, out = sys.argv[1], sys.argv[2:-1], sys.argv[-1]
sys.argv = [path, *argv]
sys.path.insert(0, os.path.dirname(path))
ok, error = True, None
try:
    runpy.run_path(path, run_name="__main__")
except SystemExit as exc:
    ok = exc.code in (None, 0)
    error = None if ok else f"SystemExit({exc.code!r})"
except BaseException as exc:  # report any failure of the example
    ok, error = False, f"{type(exc).__name__}: {exc}"[:2000]
with open(out, "w") as f:
    json.dump({"ok": ok, "error": error, "cute_compile": counters["compile"],
               "loads": counters["load"], "pipeline": pipeline["n"],
               "seconds": time.perf_counter() - t0}, f)
"""
)


def run_one(path: str, args: list[str], cache_dir: str, timeout: float) -> dict:
    """Run the script ``path`` (with ``args``) in a fresh child under cuforge.cute.enable()
    on ``cache_dir``; the child's counters, its exit and the tail of its stderr."""
    result = run_child(CHILD, [path, *args], {"CUFORGE_CACHE_DIR": cache_dir}, timeout)
    result["stderr_tail"] = result.pop("stderr")[-3000:]
    return result


def report(label: str, cold: dict, warm: dict) -> None:
    """Print one row (cold ok, warm ok, warm compiles, walls) and the output of a failed or
    uncached run."""
    print(
        f"{label:28s} cold {'ok' if cold['ok'] else 'FAIL':4s} "
        f"warm {'ok' if warm['ok'] else 'FAIL':4s} "
        f"warm compiles: cute.compile={warm.get('cute_compile')} "
        f"pipeline={warm.get('pipeline')} loads={warm.get('loads')} "
        f"(cold {cold.get('cute_compile')}/{cold.get('pipeline')}) "
        f"wall {cold['wall_s']:.1f}s/{warm['wall_s']:.1f}s",
        flush=True,
    )
    for when, r in (("cold", cold), ("warm", warm)):
        if not r["ok"] or "runs uncached" in r.get("stderr_tail", ""):
            print(f"  {when}: {r.get('error')}\n{r.get('stderr_tail', '')[-1500:]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--cutlass",
        metavar="DIR",
        default=os.environ.get("CUTLASS_DIR") or None,
        help=f"a CUTLASS checkout (default: $CUTLASS_DIR; the figures: commit {CUTLASS_COMMIT})",
    )
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--cache-dir", help="cache dir (default: a fresh temporary one)")
    ap.add_argument(
        "--only", nargs="*", help="examples to run, by path or file name (default: all)"
    )
    ap.add_argument("--timeout", type=float, default=300)
    opts = ap.parse_args()
    if not opts.cutlass:
        ap.error(f"--cutlass DIR (or CUTLASS_DIR) is required: a CUTLASS checkout ({CLONE})")
    paths = locate(opts.cutlass, select(opts.only))
    cache_dir = opts.cache_dir or tempfile.mkdtemp(prefix="cuforge-cute-examples-")
    rows = []
    for name, path in paths.items():
        args = EXAMPLES[name]
        cold = run_one(path, args, cache_dir, opts.timeout)
        warm = run_one(path, args, cache_dir, opts.timeout)
        rows.append({"example": name, "path": path, "args": args, "cold": cold, "warm": warm})
        report(os.path.basename(name), cold, warm)
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(
                {
                    "cache_dir": cache_dir,
                    "cutlass": os.path.abspath(opts.cutlass),
                    "python": sys.version,
                    "rows": rows,
                },
                f,
                indent=1,
            )
    good = all(r["cold"]["ok"] and r["warm"]["ok"] and r["warm"].get("pipeline") == 0 for r in rows)
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
