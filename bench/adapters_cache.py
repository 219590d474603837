"""The system adapters' first-use time from a warm remote (issue 22), each against the
system's own warm local cache in the same run.

    PYTHONPATH=src python3 bench/adapters_cache.py [--runs 5] [--json out.json]
        [--only cuda-core,cuda-core-cub] [--breakdown]

Every figure is a fresh Python process's time from the start of its script (for cuda.core:
before ``from cuda.core import ...``; for CuPy and JAX: after the system's imports) to the
first result, median of ``--runs``:

* ``cuda-core``: ``Program.compile("cubin", cache=...)`` of a plain templated kernel, with
  ``cuforge.cuda_core.ProgramCache`` over an EMPTY local dir and a warm ``file://`` remote,
  against cuda.core's ``FileStreamProgramCache`` warm (anchor);
* ``cuda-core-cub``: the issue's program, a templated CUB ``BlockReduce`` with the toolkit's
  include dirs and a name expression (which ``cache=`` refuses):
  ``cuforge.cuda_core.compile(...)`` (user headers keyed by content, ``symbol_mapping``
  kept) over an EMPTY local dir and a warm remote, against ``FileStreamProgramCache`` warm
  used as cuda.core documents for include paths (``make_program_cache_key`` with an
  ``extra_digest`` the user supplies, then the cache by hand). Goal: <= 1.2x;
* ``cupy`` (CuPy and a GPU): the first launch of a templated, CUB-using ``RawModule`` with
  a fresh ``CUPY_CACHE_DIR`` and cuforge's backend on a warm remote, against CuPy's own warm
  ``CUPY_CACHE_DIR`` (anchor). Goal: <= 1.2x;
* ``jax`` (JAX): the first result of a jitted function with cuforge's cache on a warm
  remote and an empty local dir, against JAX's own warm ``jax_compilation_cache_dir``
  (anchor).

A system that is not installed (or needs a GPU that is not there) is reported as skipped.
The ``compiled`` row of each is the cold time (nothing cached anywhere), for scale.

``--breakdown`` (cuda.core rows): each child also times its phases -- importing cuda.core,
importing and opening the cache, the ``compile()`` call and inside it cuforge's header scan
(``extra_digest``), the cache lookup, the remote read and the copy into the local disk
tier -- by wrapping those functions, and a table of their medians is printed, cuforge's
remote hit beside the anchor.
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
phases = {"import cuda.core": time.perf_counter() - t0}
mode, where, cub = MODE, WHERE, __CUB__
BREAKDOWN = __BREAKDOWN__
def timed(owner, attr, label):
    # --breakdown: the seconds spent in owner.attr, summed (a wrapper, nothing else changes)
    fn = getattr(owner, attr)
    def wrapper(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            phases[label] = phases.get(label, 0.0) + time.perf_counter() - t
    setattr(owner, attr, wrapper)
t = time.perf_counter()
if mode == "cuforge":
    import cuforge.cuda_core as ccc
    if BREAKDOWN:
        from cuforge.store.disk import DiskStore
        from cuforge.store.remote.tier import RemoteStore
        timed(RemoteStore, "get", "    remote read")
        timed(DiskStore, "put", "    local copy (disk put)")
        timed(ccc, "header_digest", "  header scan (extra_digest)")
        timed(ccc.ProgramCache, "__getitem__", "  cache lookup")
        timed(ccc.blobcache, "get_or_build", "  cache lookup")
    cache = ccc.ProgramCache()
elif mode == "filestream":
    from cuda.core.utils import FileStreamProgramCache
    if BREAKDOWN:
        timed(FileStreamProgramCache, "get", "  cache lookup")
    cache = FileStreamProgramCache(where)
else:
    cache = None
phases["import + open the cache"] = time.perf_counter() - t
t1 = time.perf_counter()
if not cub:
    src = PLAIN
    opts = ProgramOptions(arch="sm_90", std="c++17")
    obj = Program(src, "c++", opts).compile("cubin", cache=cache) if cache is not None else Program(src, "c++", opts).compile("cubin")
else:
    # a templated CUB program: include paths and a name expression, which cuda.core's
    # cache= refuses; cuforge.cuda_core.compile keys the user headers itself, and the
    # anchor follows cuda.core's own recipe (make_program_cache_key with an extra_digest
    # the user supplies, then the cache by hand)
    src, names = SRC, ("block_sum<float, 128>",)
    opts = ProgramOptions(arch="sm_90", std="c++17", include_path=__INC__)
    if mode == "cuforge":
        obj = ccc.compile(src, "c++", options=opts, name_expressions=names)
    else:
        from cuda.core import ObjectCode
        from cuda.core.utils import make_program_cache_key
        key = make_program_cache_key(code=src, code_type="c++", options=opts, target_type="cubin", name_expressions=names, extra_digest=b"headers-as-installed")
        data = cache.get(key)
        if data is None:
            obj = Program(src, "c++", opts).compile("cubin", names)
            cache[key] = obj
        else:
            obj = data if isinstance(data, ObjectCode) else ObjectCode.from_cubin(data)
phases["compile() call"] = time.perf_counter() - t1
print(json.dumps({"seconds": time.perf_counter() - t0, "phases": phases}))
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


def _child(template: str, mode: str, where: str, env: dict[str, str], opts: dict) -> dict:
    code = (
        template.replace("MODE", repr(mode))
        .replace("WHERE", repr(where))
        .replace("SRC", repr(CUB_SRC))
        .replace("PLAIN", repr(PLAIN))
        .replace("__CUB__", repr(opts.get("cub", False)))
        .replace("__INC__", repr(opts.get("inc", [])))
        .replace("__BREAKDOWN__", repr(opts.get("breakdown", False)))
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600
    )
    if out.returncode != 0:
        raise RuntimeError(f"{mode} child failed:\n{out.stdout}\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _env(tmp: str, name: str, remote: str | None, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(ROOT, "src") + os.pathsep + env.get("PYTHONPATH", "")
    env["CUFORGE_CACHE_DIR"] = os.path.join(tmp, name)
    env.pop("CUFORGE_REMOTE", None)
    if remote:
        env["CUFORGE_REMOTE"] = remote
    env.update(extra)
    return env


def _phases(runs: list[dict]) -> dict[str, float] | None:
    """Median seconds of each phase a child reported (``--breakdown``)."""
    names: list[str] = []
    for r in runs:
        names += [n for n in r.get("phases", {}) if n not in names]
    if not names:
        return None
    return {n: statistics.median(r.get("phases", {}).get(n, 0.0) for r in runs) for n in names}


def _system(label: str, template: str, anchor_mode: str, runs: int, opts: dict) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"cuforge-bench-{label}-") as tmp:
        shared = os.path.join(tmp, "shared")
        own = os.path.join(tmp, "own")
        os.makedirs(shared)
        remote = f"file://{shared}"
        extra = {"CUPY_CACHE_DIR": os.path.join(tmp, "cupy-warm")} if label == "cupy" else {}
        cold = _child(template, "cuforge", own, _env(tmp, "warm", remote, **extra), opts)[
            "seconds"
        ]  # warms the remote
        _child(
            template, anchor_mode, own, _env(tmp, "anchor0", None, **extra), opts
        )  # warms the anchor
        hits, anchors = [], []
        for i in range(runs):
            fresh = (
                {"CUPY_CACHE_DIR": os.path.join(tmp, f"cupy-fresh{i}")} if label == "cupy" else {}
            )
            env = _env(tmp, f"fresh{i}", remote, **fresh)
            hits.append(_child(template, "cuforge", own, env, opts))
            anchors.append(
                _child(template, anchor_mode, own, _env(tmp, "anchor0", None, **extra), opts)
            )
        hit = statistics.median(r["seconds"] for r in hits)
        anchor = statistics.median(r["seconds"] for r in anchors)
        out = {
            "compiled_s": cold,
            "cuforge_remote_hit_s": hit,
            "anchor_warm_s": anchor,
            "anchor": anchor_mode,
            "ratio_vs_anchor": hit / anchor if anchor else None,
        }
        if opts.get("breakdown"):
            out["breakdown"] = {"cuforge_remote_hit": _phases(hits), anchor_mode: _phases(anchors)}
        return out


#: the phases in the order printed (indented: part of the phase above)
_ORDER = (
    "import cuda.core",
    "import + open the cache",
    "compile() call",
    "  header scan (extra_digest)",
    "  cache lookup",
    "    remote read",
    "    local copy (disk put)",
)


def _print_breakdown(label: str, result: dict) -> None:
    """The median seconds of each phase, cuforge's remote hit beside the anchor."""
    bd = result.get("breakdown") or {}
    cols = [(name, phases) for name, phases in bd.items() if phases]
    if not cols:
        return
    rows = [n for n in _ORDER if any(n in phases for _, phases in cols)]
    for _, phases in cols:
        rows += [n for n in phases if n not in rows]
    print(f"  {label}: median seconds per phase (indented: part of the line above)")
    print(f"  {'phase':<34}" + "".join(f"{name:>22}" for name, _ in cols))
    for row in rows:
        cells = "".join(
            f"{phases[row]:>22.4f}" if row in phases else f"{'-':>22}" for _, phases in cols
        )
        print(f"  {row:<34}{cells}")
    total = "".join(
        f"{result[k]:>22.4f}" for k in ("cuforge_remote_hit_s", "anchor_warm_s")[: len(cols)]
    )
    print(f"  {'total (child, from before imports)':<34}{total}")


def _toolkit_includes() -> list[str]:
    """The CUDA/CCCL header roots a CUB program needs (as cuforge finds them)."""
    sys.path.insert(0, os.path.join(ROOT, "src"))
    from cuforge.toolchain.locate import toolkit_include_dirs

    return toolkit_include_dirs()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument(
        "--breakdown",
        action="store_true",
        help="also print where each cuda.core process's time goes (cuforge vs the anchor)",
    )
    ap.add_argument("--only", help="run only these rows (comma-separated labels)")
    args = ap.parse_args()
    # cuforge's bytecode, as an installed package has it (pip compiles it at install time):
    # a process that compiles cuforge's sources each time (PYTHONDONTWRITEBYTECODE=1, a
    # fresh checkout) pays ~0.14 s on the H100 box, which no user of a wheel pays
    import compileall

    compileall.compile_dir(os.path.join(ROOT, "src", "cuforge"), quiet=1)
    results: dict[str, dict] = {}
    opts = {"breakdown": args.breakdown}
    plan = [
        ("cuda-core", "cuda.core", CUDA_CORE, "filestream", opts),
        ("cuda-core-cub", "cuda.core", CUDA_CORE, "filestream", {**opts, "cub": True}),
        ("cupy", "cupy", CUPY, "own", {}),
        ("jax", "jax", JAX, "own", {}),
    ]
    only = set(args.only.split(",")) if args.only else None
    for label, module, template, anchor, row_opts in plan:
        if only is not None and label not in only:
            continue
        if importlib.util.find_spec(module.split(".")[0]) is None or (
            "." in module and importlib.util.find_spec(module) is None
        ):
            results[label] = {"skipped": f"{module} is not installed"}
        else:
            if row_opts.get("cub"):
                row_opts = {**row_opts, "inc": _toolkit_includes()}
            try:
                results[label] = _system(label, template, anchor, args.runs, row_opts)
            except RuntimeError as exc:
                results[label] = {"skipped": str(exc)[-400:]}
        print(label, json.dumps({k: v for k, v in results[label].items() if k != "breakdown"}))
        _print_breakdown(label, results[label])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
