"""A CuTe DSL kernel library from a checkout, unmodified, under ``cuforge.cute`` (GPU).

Acceptance for issue 34 (never uncached, never silent): point it at a checkout of a CuTe DSL
kernel library -- flash-attention's CuTe kernels (``flash_attn/cute``) or quack -- and it
runs each kernel three times, each in a fresh process:

* **baseline**: without cuforge (the DSL's own ``cute.compile``); its outputs are saved;
* **cold**: ``cuforge.cute.enable()`` first, an empty cache dir;
* **warm**: a fresh process on the same cache dir.

Per kernel and run it reports the real ``cute.compile`` calls (``counters["compile"]``), the
DSL's compiles (its ``compile_and_cache`` pipeline, outermost calls, counted on every DSL
class as ``bench/cute_examples.py`` does), the traces cuforge made (``counters["trace"]``:
the IR key traces), which key served the calls (``pretrace`` / ``ir`` / ``uncached``), the
"not keyed before tracing" and "runs uncached" warnings, and whether the outputs equal the
baseline's (``torch.equal``; ``--atol`` for a tolerance). The warm run of a fully cached
library makes 0 DSL compiles; ``pretrace`` calls make 0 traces too.

The library is put first on ``sys.path`` (``--library DIR``: the directory that holds the
top-level package, e.g. a flash-attention checkout for ``flash_attn.cute``), so it is
imported from the checkout as it is (a namespace package where it has no
``__init__.py``), not from an installed distribution. Which kernels run: ``--driver``, one
of the built-in drivers (``flash_attn_cute``, ``quack``, ``flashinfer_norm``: their public
functions on small torch tensors) or a Python file of your own defining ``KERNELS = {name: fn}``, each ``fn()``
returning a tensor or a tuple of tensors (seed torch yourself). No third-party code is kept
in this repository.

    git clone https://github.com/Dao-AILab/flash-attention
    pip install nvidia-cutlass-dsl apache-tvm-ffi einops torch
    PYTHONPATH=src python3 bench/cute_real_libraries.py --library flash-attention \\
        --driver flash_attn_cute --json $OUT/fa_cute.json
    PYTHONPATH=src python3 bench/cute_real_libraries.py --library quack --driver quack
    PYTHONPATH=src python3 bench/cute_real_libraries.py --library SITE --driver flashinfer_norm

Each row also gives the kernel's first call in the process (its compile or cache load
included) warm against the baseline's: the issue's "warm fresh process against the DSL".
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from _cute_child import HERE, PIPELINE_COUNTER, run_child


def _flash_attn_cute() -> dict:
    """flash-attention's CuTe DSL kernels through ``flash_attn.cute.flash_attn_func``."""
    import torch
    from flash_attn.cute import flash_attn_func

    def qkv(seqlen: int = 256, heads: int = 4, dim: int = 128, grad: bool = False):
        torch.manual_seed(0)
        shape = (2, seqlen, heads, dim)
        return [
            torch.randn(shape, device="cuda", dtype=torch.bfloat16).requires_grad_(grad)
            for _ in range(3)
        ]

    def first(result):
        return result[0] if isinstance(result, tuple) else result

    def fwd(causal: bool):
        return lambda: first(flash_attn_func(*qkv(), causal=causal))

    def fwd_bwd(causal: bool):
        def run():
            q, k, v = qkv(grad=True)
            out = first(flash_attn_func(q, k, v, causal=causal))
            out.sum().backward()
            return out, q.grad, k.grad, v.grad

        return run

    return {
        "fwd": fwd(False),
        "fwd_causal": fwd(True),
        "fwd_bwd": fwd_bwd(False),
        "fwd_bwd_causal": fwd_bwd(True),
    }


def _quack() -> dict:
    """quack's kernels through its public functions."""
    import quack
    import torch

    def x():
        torch.manual_seed(0)
        return torch.randn(256, 4096, device="cuda", dtype=torch.bfloat16)

    def rmsnorm():
        w = torch.ones(4096, device="cuda", dtype=torch.float32)
        return quack.rmsnorm(x(), w, eps=1e-6)

    def cross_entropy():
        inp = x()
        target = torch.randint(0, inp.shape[1], (inp.shape[0],), device="cuda")
        return quack.cross_entropy(inp, target, reduction="none")

    return {
        "rmsnorm": rmsnorm,
        "softmax": lambda: quack.softmax(x()),
        "cross_entropy": cross_entropy,
    }


def _flashinfer_norm() -> dict:
    """FlashInfer's normalization kernels (``flashinfer.norm``), which 0.7.x writes in the
    CuTe DSL: kernel class instances compiled with ``cute.compile(obj, ...,
    options="--enable-tvm-ffi")`` on fake tensors with symbolic row counts, each behind its own
    ``functools.cache`` (so every fresh process compiles them again without cuforge)."""
    import torch
    from flashinfer import norm

    if norm._use_cuda_norm(torch.device("cuda")):
        raise RuntimeError(
            "flashinfer.norm would take its CUDA JIT kernels here, not the CuTe DSL ones "
            "(FLASHINFER_USE_CUDA_NORM=1, or the installed DSL cannot target this GPU)"
        )

    def x(dtype=torch.bfloat16):
        torch.manual_seed(0)
        return torch.randn(256, 4096, device="cuda", dtype=dtype)

    def w(dtype=torch.bfloat16):
        return torch.rand(4096, device="cuda", dtype=dtype) + 0.5

    def fused_add(fn):
        def run():
            inp, residual = x(), x() * 0.5
            fn(inp, residual, w(), eps=1e-6)
            return inp, residual

        return run

    return {
        "rmsnorm": lambda: norm.rmsnorm(x(), w(), eps=1e-6),
        "gemma_rmsnorm": lambda: norm.gemma_rmsnorm(x(), w(), eps=1e-6),
        "fused_add_rmsnorm": fused_add(norm.fused_add_rmsnorm),
        "layernorm": lambda: norm.layernorm(x(), w(torch.float32), w(torch.float32) - 1, 1e-6),
    }


DRIVERS = {
    "flash_attn_cute": _flash_attn_cute,
    "quack": _quack,
    "flashinfer_norm": _flashinfer_norm,
}


def _kernels(driver: str) -> dict:
    if driver in DRIVERS:
        return DRIVERS[driver]()
    driver = os.path.abspath(driver) if os.path.isfile(driver) else driver
    if not os.path.isfile(driver):
        raise SystemExit(
            f"--driver {driver!r}: expected one of {', '.join(DRIVERS)} or a Python file "
            "defining KERNELS = {name: fn}"
        )
    import runpy

    found = runpy.run_path(driver).get("KERNELS")
    if not isinstance(found, dict) or not found:
        raise SystemExit(f"--driver {driver}: defines no KERNELS = {{name: fn}} dict")
    return found


CHILD = (
    r"""
import json, os, sys, time
driver, name, mode, ref, out = sys.argv[1:6]
sys.path.insert(0, os.environ["CF_BENCH_LIBRARY"])
sys.path.insert(1, os.environ["CF_BENCH_HERE"])
t0 = time.perf_counter()
if mode != "baseline":
    import cuforge.cute
    cuforge.cute.enable()
"""
    + PIPELINE_COUNTER
    + r"""
import torch
from cute_real_libraries import _kernels
result = {"ok": True, "error": None, "same_as_baseline": None}
try:
    fn = _kernels(driver)[name]
    t_call = time.perf_counter()
    outputs = fn()
    torch.cuda.synchronize()
    result["first_call_s"] = time.perf_counter() - t_call
    outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
    torch.cuda.synchronize()
    outputs = [o.detach().cpu() for o in outputs]
    if mode == "baseline":
        torch.save(outputs, ref)
    else:
        want = torch.load(ref)
        atol = float(os.environ.get("CF_BENCH_ATOL", "0"))
        result["same_as_baseline"] = len(want) == len(outputs) and all(
            (torch.equal(a, b) if atol == 0 else torch.allclose(a.float(), b.float(), atol=atol))
            for a, b in zip(want, outputs)
        )
except BaseException as exc:
    result.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:2000])
result["pipeline"] = pipeline["n"]
result["seconds"] = time.perf_counter() - t0
if mode != "baseline":
    from cuforge.cute.cache import counters
    result.update({k: counters[k] for k in ("compile", "trace", "load", "pretrace", "ir", "uncached")})
with open(out, "w") as f:
    json.dump(result, f)
"""
)


def _run(opts: argparse.Namespace, name: str, mode: str, cache_dir: str, ref: str) -> dict:
    env = {
        "CUFORGE_CACHE_DIR": cache_dir,
        "CF_BENCH_LIBRARY": os.path.abspath(opts.library),
        "CF_BENCH_HERE": HERE,
        "CF_BENCH_ATOL": str(opts.atol),
        "QUACK_CACHE_ENABLED": os.environ.get("QUACK_CACHE_ENABLED", "0"),  # the only cache
    }
    result = run_child(CHILD, [opts.driver, name, mode, ref], env, opts.timeout)
    stderr = result.pop("stderr")
    result["not_keyed_before_tracing"] = stderr.count("cannot be keyed before tracing")
    result["uncached_warnings"] = stderr.count("runs uncached") + stderr.count(
        "built but not cached"
    )
    result["stderr_tail"] = stderr[-3000:]
    return result


def _served(r: dict) -> str:
    return f"pretrace={r.get('pretrace')} ir={r.get('ir')} uncached={r.get('uncached')}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--library", required=True, help="the directory to put first on sys.path")
    ap.add_argument(
        "--driver", required=True, help=f"{' / '.join(DRIVERS)} or a file defining KERNELS"
    )
    ap.add_argument("--only", nargs="*", help="kernels to run (default: all of the driver's)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--cache-dir", help="cache dir (default: a fresh temporary one)")
    ap.add_argument("--atol", type=float, default=0.0, help="0: outputs must be bit-equal")
    ap.add_argument("--timeout", type=float, default=600)
    opts = ap.parse_args()
    if not os.path.isdir(opts.library):
        ap.error(f"--library {opts.library!r} is not a directory")
    sys.path.insert(0, os.path.abspath(opts.library))
    names = list(_kernels(opts.driver))
    for name in opts.only or ():
        if name not in names:
            ap.error(f"--only: unknown kernel {name!r}; expected one of {', '.join(names)}")
    names = opts.only or names
    cache_dir = opts.cache_dir or tempfile.mkdtemp(prefix="cuforge-cute-real-")
    refs = tempfile.mkdtemp(prefix="cuforge-cute-real-ref-")
    rows = []
    for name in names:
        ref = os.path.join(refs, name + ".pt")
        base = _run(opts, name, "baseline", cache_dir, ref)
        cold = _run(opts, name, "cold", cache_dir, ref)
        warm = _run(opts, name, "warm", cache_dir, ref)
        ratio = None
        if base.get("first_call_s") and warm.get("first_call_s"):
            ratio = warm["first_call_s"] / base["first_call_s"]
        rows.append(
            {"kernel": name, "baseline": base, "cold": cold, "warm": warm, "warm_vs_dsl": ratio}
        )
        print(
            f"{name:18s} baseline {'ok' if base['ok'] else 'FAIL'} (DSL compiles "
            f"{base.get('pipeline')}) | cold: cute.compile={cold.get('compile')} DSL="
            f"{cold.get('pipeline')} traces={cold.get('trace')} {_served(cold)} same="
            f"{cold.get('same_as_baseline')} | warm: cute.compile={warm.get('compile')} DSL="
            f"{warm.get('pipeline')} traces={warm.get('trace')} {_served(warm)} same="
            f"{warm.get('same_as_baseline')} warnings={warm.get('not_keyed_before_tracing')}"
            f"/{warm.get('uncached_warnings')} | first call: DSL {base.get('first_call_s', 0):.3f} s,"
            f" warm {warm.get('first_call_s', 0):.3f} s"
            + (f" ({ratio:.2f}x)" if ratio is not None else ""),
            flush=True,
        )
        for when, r in (("baseline", base), ("cold", cold), ("warm", warm)):
            if not r["ok"] or r.get("uncached_warnings") or r.get("not_keyed_before_tracing"):
                print(f"  {when}: {r.get('error')}\n{r.get('stderr_tail', '')[-1500:]}")
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(
                {
                    "library": os.path.abspath(opts.library),
                    "driver": opts.driver,
                    "cache_dir": cache_dir,
                    "python": sys.version,
                    "rows": rows,
                },
                f,
                indent=1,
            )
    good = all(
        r["baseline"]["ok"]
        and r["cold"]["ok"]
        and r["warm"]["ok"]
        and r["warm"].get("pipeline") == 0
        and r["warm"].get("same_as_baseline")
        for r in rows
    )
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
