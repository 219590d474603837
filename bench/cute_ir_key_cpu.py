"""The IR key's own cost over the DSL's trace (issue 34), on the CPU (export-only).

A kernel the pre-trace key cannot cover (it reads a global ``threading.Lock`` at trace time)
is served by the IR key: a warm fresh process traces it (the DSL's own
``to_precompiled_mlir``), hashes the traced module, looks the hash up and loads the stored
object; it never compiles. What the IR key adds to the trace the DSL makes anyway is the
hashing (``cuforge.cute.cache._trace_hashes``: the module's text without locations, the
DSL's version digest, its settings and options, and the DSL's own module hash). Each warm
fresh process reports, for the one call: the whole call, the trace (``_trace``, the hashing
included) and the hashing alone, timed by wrapping those two functions of
``cuforge.cute.cache``.

    CUTE_DSL_ARCH=sm_90a PYTHONPATH=src python bench/cute_ir_key_cpu.py [--runs 7] [--reps 1 32]

``--reps``: the kernel is launched that many times in the traced function (a ``Constexpr``
loop), so the traced module grows with it. Needs nvidia-cutlass-dsl; no GPU.
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

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")

KERNELS = """
import threading
import cutlass
import cutlass.cute as cute

LOCK = threading.Lock()
BLOCK = 128


@cute.kernel
def scale_kernel(a: cute.Tensor, b: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i = bidx * BLOCK + tidx
    b[i] = a[i] * 2.0 + 1.0


@cute.jit
def with_lock(a: cute.Tensor, b: cute.Tensor, reps: cutlass.Constexpr[int] = 1):
    assert LOCK is not None  # no stable fingerprint: the IR key serves this function
    for _ in range(reps):
        scale_kernel(a, b).launch(grid=(a.shape[0] // BLOCK, 1, 1), block=(BLOCK, 1, 1))
"""

CHILD = r"""
import json, os, sys, time
reps = int(sys.argv[1])
import cuforge.cute
from cuforge.cute import cache as C
timed = {"trace": 0.0, "hash": 0.0}
def wrap(name, slot):
    real = getattr(C, name)
    def timed_call(*a, **k):
        t = time.perf_counter()
        try:
            return real(*a, **k)
        finally:
            timed[slot] += time.perf_counter() - t
    setattr(C, name, timed_call)
wrap("_trace", "trace")
wrap("_trace_hashes", "hash")
cuforge.cute.enable()
import cutlass, cutlass.cute as cute
from cutlass.cute.runtime import make_fake_compact_tensor
import ir_key_kernels as K
n = cute.sym_int32(divisibility=K.BLOCK)
a = make_fake_compact_tensor(cutlass.Float32, (n,))
b = make_fake_compact_tensor(cutlass.Float32, (n,))
t = time.perf_counter()
r = cuforge.cute.compile_cached(K.with_lock, a, b, reps)
call = time.perf_counter() - t
print(json.dumps({"call": call, **timed, "source": r.source_of_result, "served_by": r.served_by,
                  "compiles": C.counters["compile"]}))
"""


def _child(reps: int, env: dict[str, str]) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(reps)], env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"the child failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="warm fresh processes per size")
    parser.add_argument("--reps", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    scratch = tempfile.mkdtemp(prefix="cuforge-ir-key-")
    with open(os.path.join(scratch, "ir_key_kernels.py"), "w") as f:
        f.write(textwrap.dedent(KERNELS))
    env = dict(os.environ)
    env.setdefault("CUTE_DSL_ARCH", "sm_90a")
    env["PYTHONPATH"] = os.pathsep.join([SRC, scratch, env.get("PYTHONPATH", "")])
    env["CUFORGE_CACHE_DIR"] = os.path.join(scratch, "cache")
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as an installed package: bytecode written
    results = {}
    print(f"{'reps':>5}{'call ms':>10}{'trace ms':>10}{'hash ms':>9}  served (warm)")
    for reps in args.reps:
        cold = _child(reps, env)
        if cold["source"] != "compiled" or cold["served_by"] != "ir":
            raise SystemExit(f"reps={reps}: the cold call was {cold}, not an IR-key compile")
        runs = [_child(reps, env) for _ in range(args.runs)]
        for r in runs:
            if r["served_by"] != "ir" or r["compiles"] != 0 or r["source"] == "compiled":
                raise SystemExit(f"reps={reps}: a warm call compiled or missed: {r}")
        med = {k: statistics.median(r[k] for r in runs) * 1e3 for k in ("call", "trace", "hash")}
        results[reps] = {"median_ms": med, "runs": runs}
        print(
            f"{reps:>5}{med['call']:10.1f}{med['trace']:10.1f}{med['hash']:9.2f}  "
            f"{runs[-1]['source']} / {runs[-1]['served_by']}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
