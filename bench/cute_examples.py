"""CUTLASS's own CuTe DSL examples, unmodified, under ``cuforge.cute.enable()`` (GPU).

Each example in ``bench/cute_examples/`` runs as ``__main__`` through :mod:`runpy` in a
fresh process, with ``cuforge.cute.enable()`` called first and small sizes given through
the example's own command line; twice on one cache dir: cold (empty cache) and warm (a
fresh process, the same cache). The child counts the calls of the real ``cute.compile``
(cuforge's ``counters["compile"]``) and of the DSL's compile pipeline (every
``compile_and_cache`` of the DSL classes: it runs once per real compilation, implicit
``@cute.jit`` calls included).

    PYTHONPATH=src python3 bench/cute_examples.py --json $OUT/cute.json

Prints a table (example, cold ok, warm ok, warm compiles) and writes the JSON. Bytecode is
cached as in a real install (``PYTHONDONTWRITEBYTECODE`` is dropped for the children).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES_DIR = os.path.join(HERE, "cute_examples")
SRC = os.path.join(os.path.dirname(HERE), "src")

#: example file -> its own command-line arguments (small sizes, no benchmark loops)
EXAMPLES: dict[str, list[str]] = {
    "elementwise_add.py": [
        "--M",
        "256",
        "--N",
        "256",
        "--warmup_iterations",
        "0",
        "--iterations",
        "1",
    ],
    "elementwise_apply.py": [
        "--M",
        "256",
        "--N",
        "256",
        "--warmup_iterations",
        "0",
        "--iterations",
        "1",
    ],
    "sgemm.py": ["--mnk", "256,256,64", "--warmup_iterations", "0", "--iterations", "1"],
    "tensorop_gemm.py": [
        "--mnkl",
        "256,256,256,1",
        "--warmup_iterations",
        "0",
        "--iterations",
        "1",
    ],
    "dense_gemm.py": ["--mnkl", "256,256,256,1", "--warmup_iterations", "0", "--iterations", "1"],
    "dense_gemm_persistent.py": [
        "--mnkl",
        "256,256,256,1",
        "--warmup_iterations",
        "0",
        "--iterations",
        "1",
    ],
    # RMSNorm (a row reduction; Hopper & Blackwell): imports its sibling
    # blackwell/kernel/reduce/reduce.py through the path it puts on sys.path itself
    "blackwell/kernel/rmsnorm/rmsnorm.py": ["--M", "256", "--N", "4096"],
    "flash_attention_v2.py": [
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
        "--warmup_iterations",
        "0",
        "--iterations",
        "1",
    ],
}

CHILD = r"""
import json, os, runpy, sys, time
t0 = time.perf_counter()
import cuforge.cute
cuforge.cute.enable()
from cuforge.cute.cache import counters
import cutlass.cute  # noqa: F401
from cutlass.base_dsl import dsl as _dsl_mod

pipeline = {"n": 0, "depth": 0}
def _count(cls):
    original = cls.__dict__.get("compile_and_cache")
    if original is None:
        return
    def wrapper(self, *a, **k):
        # count the outermost call only (an override calls its base's through super())
        pipeline["depth"] += 1
        if pipeline["depth"] == 1:
            pipeline["n"] += 1
        try:
            return original(self, *a, **k)
        finally:
            pipeline["depth"] -= 1
    cls.compile_and_cache = wrapper
def _walk(cls):
    _count(cls)
    for sub in cls.__subclasses__():
        _walk(sub)
import cutlass.cutlass_dsl  # noqa: F401  (the DSL classes, so that they are all walked)
_walk(_dsl_mod.BaseDSL)

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


def run_one(name: str, args: list[str], cache_dir: str, timeout: float) -> dict:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("PYTHONPYCACHEPREFIX", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, env.get("PYTHONPATH", "")) if p)
    env["CUFORGE_CACHE_DIR"] = cache_dir
    fd, out = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    started = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, os.path.join(EXAMPLES_DIR, name), *args, out],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        try:
            with open(out) as f:
                result = json.load(f)
        except (OSError, ValueError):
            result = {"ok": False, "error": f"no result (exit {proc.returncode})"}
        result["returncode"] = proc.returncode
        result["stderr_tail"] = proc.stderr[-3000:]
    except subprocess.TimeoutExpired:
        result = {"ok": False, "error": f"timed out after {timeout:.0f} s"}
    finally:
        os.unlink(out)
    result["wall_s"] = round(time.perf_counter() - started, 3)
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
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--cache-dir", help="cache dir (default: a fresh temporary one)")
    ap.add_argument("--only", nargs="*", help="example files to run (default: all)")
    ap.add_argument("--timeout", type=float, default=300)
    opts = ap.parse_args()
    cache_dir = opts.cache_dir or tempfile.mkdtemp(prefix="cuforge-cute-examples-")
    rows = []
    for name, args in EXAMPLES.items():
        if opts.only and name not in opts.only:
            continue
        cold = run_one(name, args, cache_dir, opts.timeout)
        warm = run_one(name, args, cache_dir, opts.timeout)
        rows.append({"example": name, "args": args, "cold": cold, "warm": warm})
        report(os.path.basename(name), cold, warm)
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump({"cache_dir": cache_dir, "python": sys.version, "rows": rows}, f, indent=1)
    good = all(r["cold"]["ok"] and r["warm"]["ok"] and r["warm"].get("pipeline") == 0 for r in rows)
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
