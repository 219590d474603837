"""The system adapters' first-use time from a warm remote (issue 22), each against the
system's own warm local cache in the same run.

    PYTHONPATH=src python3 bench/adapters_cache.py [--runs 5] [--json out.json]

Every figure is a fresh Python process's time from the start of its script (after the
imports of the system, before cuforge's) to the first result, median of ``--runs``:

* ``cuda-core``: ``Program.compile("cubin", cache=...)`` of a templated kernel (not CUB:
  cuda.core's ``cache=`` refuses include paths), with ``cuforge.cuda_core.ProgramCache`` over an
  EMPTY local dir and a warm ``file://`` remote, against cuda.core's
  ``FileStreamProgramCache`` warm (anchor);
* ``cupy`` (CuPy and a GPU): the first launch of a templated, CUB-using ``RawModule`` with
  a fresh ``CUPY_CACHE_DIR`` and cuforge's backend on a warm remote, against CuPy's own warm
  ``CUPY_CACHE_DIR`` (anchor). Goal: <= 1.2x;
* ``jax`` (JAX): the first result of a jitted function with cuforge's cache on a warm
  remote and an empty local dir, against JAX's own warm ``jax_compilation_cache_dir``
  (anchor).

A system that is not installed (or needs a GPU that is not there) is reported as skipped.
The ``compiled`` row of each is the cold time (nothing cached anywhere), for scale.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CUB_SRC = r"""
#include <cub/block/block_reduce.cuh>
template <typename T, int BLOCK>
__global__ void block_sum(const T* in, T* out) {
    using R = cub::BlockReduce<T, BLOCK>;
    __shared__ typename R::TempStorage tmp;
    T v = R(tmp).Sum(in[threadIdx.x]);
    if (threadIdx.x == 0) *out = v;
}
"""

#: cuda.core's cache= refuses include paths (CUB's), so its row compiles a plain template
PLAIN = r"""
template <typename T> __global__ void axpy(T a, const T* x, T* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    for (int k = 0; k < 64; ++k) if (i < n) y[i] = a * x[i] + y[i] * T(k);
}
template __global__ void axpy<float>(float, const float*, float*, int);
template __global__ void axpy<double>(double, const double*, double*, int);
"""

CUDA_CORE = r"""
import time, json
t0 = time.perf_counter()
from cuda.core import Program, ProgramOptions
mode, where = MODE, WHERE
if mode == "cuforge":
    from cuforge.cuda_core import ProgramCache
    cache = ProgramCache()
elif mode == "filestream":
    from cuda.core.utils import FileStreamProgramCache
    cache = FileStreamProgramCache(where)
else:
    cache = None
src = PLAIN
opts = ProgramOptions(arch="sm_90", std="c++17")
obj = Program(src, "c++", opts).compile("cubin", cache=cache) if cache is not None else Program(src, "c++", opts).compile("cubin")
print(json.dumps({"seconds": time.perf_counter() - t0}))
"""

CUPY = r"""
import time, json
import cupy
t0 = time.perf_counter()
if MODE == "cuforge":
    import cuforge.cupy
    cuforge.cupy.enable()
mod = cupy.RawModule(code=SRC, options=("-std=c++17",), name_expressions=["block_sum<float, 128>"])
x = cupy.ones(128, dtype=cupy.float32); out = cupy.zeros(1, dtype=cupy.float32)
mod.get_function("block_sum<float, 128>")((1,), (128,), (x, out))
cupy.cuda.Device().synchronize()
print(json.dumps({"seconds": time.perf_counter() - t0, "sum": float(out.get()[0])}))
"""

JAX = r"""
import time, json
import jax, jax.numpy as jnp
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
t0 = time.perf_counter()
if MODE == "cuforge":
    import cuforge.jax
    cuforge.jax.enable()
elif MODE == "own":
    jax.config.update("jax_compilation_cache_dir", WHERE)
def f(x):
    for _ in range(8):
        x = jnp.tanh(x @ x.T) + jnp.sin(x)
    return x.sum()
r = jax.jit(f)(jnp.ones((64, 64)))
r.block_until_ready()
print(json.dumps({"seconds": time.perf_counter() - t0}))
"""


def _child(template: str, mode: str, where: str, env: dict[str, str]) -> float:
    code = (
        template.replace("MODE", repr(mode))
        .replace("WHERE", repr(where))
        .replace("SRC", repr(CUB_SRC))
        .replace("PLAIN", repr(PLAIN))
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600
    )
    if out.returncode != 0:
        raise RuntimeError(f"{mode} child failed:\n{out.stdout}\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])["seconds"]


def _env(tmp: str, name: str, remote: str | None, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(ROOT, "src") + os.pathsep + env.get("PYTHONPATH", "")
    env["CUFORGE_CACHE_DIR"] = os.path.join(tmp, name)
    env.pop("CUFORGE_REMOTE", None)
    if remote:
        env["CUFORGE_REMOTE"] = remote
    env.update(extra)
    return env


def _system(label: str, template: str, anchor_mode: str, runs: int) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"cuforge-bench-{label}-") as tmp:
        shared = os.path.join(tmp, "shared")
        own = os.path.join(tmp, "own")
        os.makedirs(shared)
        remote = f"file://{shared}"
        extra = {"CUPY_CACHE_DIR": os.path.join(tmp, "cupy-warm")} if label == "cupy" else {}
        cold = _child(
            template, "cuforge", own, _env(tmp, "warm", remote, **extra)
        )  # warms the remote
        _child(template, anchor_mode, own, _env(tmp, "anchor0", None, **extra))  # warms the anchor
        hits, anchors = [], []
        for i in range(runs):
            fresh = (
                {"CUPY_CACHE_DIR": os.path.join(tmp, f"cupy-fresh{i}")} if label == "cupy" else {}
            )
            hits.append(_child(template, "cuforge", own, _env(tmp, f"fresh{i}", remote, **fresh)))
            anchors.append(_child(template, anchor_mode, own, _env(tmp, "anchor0", None, **extra)))
        hit, anchor = statistics.median(hits), statistics.median(anchors)
        return {
            "compiled_s": cold,
            "cuforge_remote_hit_s": hit,
            "anchor_warm_s": anchor,
            "anchor": anchor_mode,
            "ratio_vs_anchor": hit / anchor if anchor else None,
        }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    # cuforge's bytecode, as an installed package has it (pip compiles it at install time):
    # a process that compiles cuforge's sources each time (PYTHONDONTWRITEBYTECODE=1, a
    # fresh checkout) pays ~0.14 s on the H100 box, which no user of a wheel pays
    import compileall

    compileall.compile_dir(os.path.join(ROOT, "src", "cuforge"), quiet=1)
    results: dict[str, dict] = {}
    plan = [
        ("cuda-core", "cuda.core", CUDA_CORE, "filestream"),
        ("cupy", "cupy", CUPY, "own"),
        ("jax", "jax", JAX, "own"),
    ]
    for label, module, template, anchor in plan:
        if importlib.util.find_spec(module.split(".")[0]) is None or (
            "." in module and importlib.util.find_spec(module) is None
        ):
            results[label] = {"skipped": f"{module} is not installed"}
        else:
            try:
                results[label] = _system(label, template, anchor, args.runs)
            except RuntimeError as exc:
                results[label] = {"skipped": str(exc)[-400:]}
        print(label, json.dumps(results[label]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
