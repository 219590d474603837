"""A CuTe DSL library in the wild, unmodified, under ``cuforge.cute.enable()`` (GPU).

The library: Dao-AILab's quack (PyPI ``quack-kernels``, https://github.com/Dao-AILab/quack;
version printed in the table) -- not written by NVIDIA's CUTLASS team. Its kernels are
kernel-class instances compiled with ``cute.compile(Kernel(...), fake tensors...,
make_fake_stream(use_tvm_ffi_env_stream=True), options="--enable-tvm-ffi")``; it needs
``apache-tvm-ffi`` and ``einops`` next to it. quack's own persistent cache is switched off
(``QUACK_CACHE_ENABLED=0``) so that cuforge is the only cache.

Each kernel (rmsnorm forward and backward, softmax forward, cross entropy forward) runs
through quack's public functions with torch tensors on the GPU, checked against torch, in a
fresh process with ``cuforge.cute.enable()`` called first: cold (empty cache dir) then warm (a
fresh process, the same cache dir). The child counts the real ``cute.compile`` calls and the
DSL's compile pipeline as ``bench/cute_examples.py`` does (the same child code).

    pip install --no-deps --target /tmp/quack-site quack_kernels-*.whl apache_tvm_ffi-*.whl \
        einops-*.whl
    PYTHONPATH=src python3 bench/cute_library.py --site /tmp/quack-site --json $OUT/lib.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

#: kernel -> what it runs (quack's public API on torch tensors, checked against torch)
KERNELS = ("rmsnorm", "softmax", "cross_entropy")


def _run_kernel(name: str) -> None:
    """Runs in the child (as ``__main__`` through runpy, after cuforge.cute.enable())."""
    import quack
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    m, n = 256, 4096
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    if name == "rmsnorm":
        w = torch.randn(n, device="cuda", dtype=torch.float32)
        xg = x.clone().requires_grad_(True)
        out = quack.rmsnorm(xg, w, eps=1e-6)
        ref = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)) * w
        torch.testing.assert_close(out.float(), ref, atol=5e-2, rtol=5e-2)
        out.sum().backward()  # the backward kernel too
        assert xg.grad is not None and torch.isfinite(xg.grad).all()
    elif name == "softmax":
        out = quack.softmax(x)
        torch.testing.assert_close(out.float(), torch.softmax(x.float(), -1), atol=1e-2, rtol=1e-2)
    elif name == "cross_entropy":
        target = torch.randint(0, n, (m,), device="cuda")
        out = quack.cross_entropy(x, target, reduction="none")
        ref = F.cross_entropy(x.float(), target, reduction="none")
        torch.testing.assert_close(out.float(), ref, atol=5e-2, rtol=5e-2)
    else:
        raise SystemExit(f"unknown kernel {name!r}; expected one of {KERNELS}")
    torch.cuda.synchronize()
    print(f"{name}: ok")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", help=argparse.SUPPRESS)  # the child's kernel
    ap.add_argument("--site", help="a directory holding quack (pip install --target DIR)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--cache-dir", help="cache dir (default: a fresh temporary one)")
    ap.add_argument("--timeout", type=float, default=300)
    opts = ap.parse_args()
    if opts.run:
        _run_kernel(opts.run)
        return 0
    sys.path.insert(0, HERE)
    from cute_examples import report, run_one  # the same child and counters as the examples

    if opts.site:
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (os.path.abspath(opts.site), os.environ.get("PYTHONPATH", "")) if p
        )
    os.environ["QUACK_CACHE_ENABLED"] = "0"  # cuforge is the only cache
    version = _quack_version(opts.site)
    cache_dir = opts.cache_dir or tempfile.mkdtemp(prefix="cuforge-cute-library-")
    me = os.path.abspath(__file__)
    rows = []
    for name in KERNELS:
        cold = run_one(me, ["--run", name], cache_dir, opts.timeout)
        warm = run_one(me, ["--run", name], cache_dir, opts.timeout)
        rows.append({"kernel": name, "cold": cold, "warm": warm})
        report(f"quack {version} {name}", cold, warm)
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(
                {
                    "library": "quack-kernels",
                    "version": version,
                    "cache_dir": cache_dir,
                    "python": sys.version,
                    "rows": rows,
                },
                f,
                indent=1,
            )
    good = all(r["cold"]["ok"] and r["warm"]["ok"] and r["warm"].get("pipeline") == 0 for r in rows)
    return 0 if good else 1


def _quack_version(site: str | None) -> str:
    import importlib.metadata

    where = {"path": [os.path.abspath(site)]} if site else {}
    for dist in importlib.metadata.distributions(**where):
        if dist.metadata["Name"] in ("quack-kernels", "quack_kernels"):
            return dist.version
    return "?"


if __name__ == "__main__":
    sys.exit(main())
