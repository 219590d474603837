"""The two-machine flow on today's peer releases, on the CPU: machine B's first result
(fresh local dirs, cuforge's ``file://`` remote filled by machine A) against the system's
own warm local cache, in one run, as ratios of medians.

    PYTHONPATH=src python3 bench/two_machines_today.py [--runs 5] [--only triton,inductor,jax]
        [--json out.json]

* ``triton``: Triton 3.9 compile-only (``triton.compile`` of a vector add for sm_90, no GPU
  needed), ``cuforge.triton.enable()`` against Triton's own warm ``TRITON_CACHE_DIR``;
  compiles counted by Triton's ``knobs.compilation.listener``;
* ``inductor``: torch 2.15 ``torch.compile`` on Inductor's CPU backend (an MLP of
  ``Linear`` layers: extern kernels, see docs/torch_compile.md on Inductor's C++ kernels),
  ``cuforge.torch.compile_cache.enable()`` against Inductor's own warm
  ``TORCHINDUCTOR_CACHE_DIR``; compiles counted by ``counters["inductor"]``
  (``fxgraph_cache_miss``), and the host compiler runs of Inductor's ``CppBuilder.build``;
* ``jax``: JAX 0.12.0.1 on the CPU (Python 3.12), ``cuforge.jax.enable()`` against JAX's own
  warm ``jax_compilation_cache_dir``; compiles counted at
  ``jax._src.compiler.backend_compile_and_load`` (XLA's compile; a hit deserializes).

Each figure is a fresh process's time from just after the peer's import (so cuforge's own
import and ``enable()`` count) to the first result. The peers come from ``pip --target``
folders put first on ``PYTHONPATH`` (``--triton``, ``--torch``, ``--jax``; default
``.compat/<release>`` of this checkout, which ``make test-compat`` installs) and
``--python312`` for JAX. Run by run, a machine-B process (its own fresh dirs) and an
own-warm process alternate, so load on the machine hits both alike.

cuforge's bytecode is compiled first for each interpreter that runs (``compileall`` of
``src``, as ``pip install`` compiles an installed wheel, and as pip compiled the peers'
folders): with ``PYTHONDONTWRITEBYTECODE=1`` in the shell and no ``cpython-312`` files,
the JAX process would compile cuforge's sources on every import (~0.2 s) while JAX's own
are compiled.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "src")
COMPAT = os.path.join(ROOT, ".compat")

TRITON = r"""
import json, time
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

class Listener:
    compiles = hits = 0
    def __call__(self, *, src, metadata, metadata_group, times, cache_hit):
        if cache_hit:
            self.hits += 1
        else:
            self.compiles += 1

seen = Listener()
triton.knobs.compilation.listener = seen
t0 = time.perf_counter()
if MODE == "cuforge":
    import cuforge.triton
    assert cuforge.triton.enable()

@triton.jit
def add_kernel(x, y, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)

sig = {"x": "*fp32", "y": "*fp32", "out": "*fp32", "n": "i32"}
k = triton.compile(ASTSource(add_kernel, sig, {"BLOCK": 128}), target=GPUTarget("cuda", 90, 32))
assert k.asm["cubin"]
seconds = time.perf_counter() - t0
print(json.dumps({"seconds": seconds, "compiles": seen.compiles, "hits": seen.hits,
                  "version": triton.__version__}))
"""

INDUCTOR = r"""
import json, time
import torch
import torch._inductor.cpp_builder as cpp_builder
builds = [0]
real_build = cpp_builder.CppBuilder.build
def counted_build(self, *args, **kwargs):
    builds[0] += 1
    return real_build(self, *args, **kwargs)
cpp_builder.CppBuilder.build = counted_build
from torch._dynamo.utils import counters
t0 = time.perf_counter()
if MODE == "cuforge":
    from cuforge.torch import compile_cache
    assert compile_cache.enable()
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(256, 1024), torch.nn.Linear(1024, 1024), torch.nn.Linear(1024, 256)).eval()
x = torch.randn(8, 256)
with torch.no_grad():
    out = torch.compile(model)(x)
seconds = time.perf_counter() - t0
assert out.shape == (8, 256)
print(json.dumps({"seconds": seconds, "compiles": counters["inductor"]["fxgraph_cache_miss"],
                  "hits": counters["inductor"]["fxgraph_cache_hit"], "cpp_builds": builds[0],
                  "version": torch.__version__}))
"""

JAX = r"""
import json, time
import jax, jax.numpy as jnp
from jax._src import compiler
compiles = [0]
real_compile = compiler.backend_compile_and_load
def counted(*args, **kwargs):
    compiles[0] += 1
    return real_compile(*args, **kwargs)
compiler.backend_compile_and_load = counted
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
t0 = time.perf_counter()
if MODE == "cuforge":
    import cuforge.jax
    assert cuforge.jax.enable()
else:
    jax.config.update("jax_compilation_cache_dir", WHERE)
def f(x):
    for _ in range(8):
        x = jnp.tanh(x @ x.T) + jnp.sin(x)
    return x.sum()
r = jax.jit(f)(jnp.ones((64, 64)))
r.block_until_ready()
seconds = time.perf_counter() - t0
print(json.dumps({"seconds": seconds, "compiles": compiles[0], "version": jax.__version__}))
"""


def _dirs(root: str, label: str) -> dict[str, str]:
    base = tempfile.mkdtemp(prefix=label + "-", dir=root)
    return {k: os.path.join(base, k) for k in ("cuforge", "triton", "inductor", "jax", "home")}


def _child(system: dict, mode: str, dirs: dict[str, str], remote: str | None) -> dict:
    env = dict(os.environ)
    for name in [n for n in env if n.startswith("CUFORGE_")]:
        del env[name]
    env["PYTHONPATH"] = os.pathsep.join([system["path"], SRC])
    env.update(
        CUFORGE_CACHE_DIR=dirs["cuforge"],
        TRITON_CACHE_DIR=dirs["triton"],
        TRITON_HOME=dirs["home"],
        TORCHINDUCTOR_CACHE_DIR=dirs["inductor"],
        JAX_PLATFORMS="cpu",
    )
    if remote:
        env["CUFORGE_REMOTE"] = remote
    code = f"MODE = {mode!r}\nWHERE = {dirs['jax']!r}\n" + system["code"]
    os.makedirs(dirs["home"], exist_ok=True)
    # a file, not ``python -c``: ``@triton.jit`` reads its function's source from a file
    script = os.path.join(dirs["home"], "child.py")
    with open(script, "w", encoding="utf-8") as f:
        f.write(code)
    done = subprocess.run(
        [system["python"], script],
        env=env,
        cwd=dirs["home"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"a {mode} process failed:\n{done.stdout}\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _compile_bytecode(python: str) -> None:
    """cuforge's ``.pyc`` files for ``python`` (an installed wheel has them)."""
    subprocess.run([python, "-m", "compileall", "-q", SRC], check=True, timeout=600)


def bench(system: dict, runs: int) -> dict:
    _compile_bytecode(system["python"])
    with tempfile.TemporaryDirectory(prefix="cuforge-two-machines-") as root:
        shared = os.path.join(root, "remote")
        os.makedirs(shared)
        remote = f"file://{shared}"
        machine_a = _child(system, "cuforge", _dirs(root, "a"), remote)  # fills the remote
        own = _dirs(root, "own")
        own_cold = _child(system, "own", own, None)  # fills the system's own cache
        hits, anchors = [], []
        for i in range(runs):
            hits.append(_child(system, "cuforge", _dirs(root, f"b{i}"), remote))
            anchors.append(_child(system, "own", own, None))
    hit = statistics.median(r["seconds"] for r in hits)
    anchor = statistics.median(r["seconds"] for r in anchors)
    return {
        "version": machine_a["version"],
        "machine_a_cold_s": machine_a["seconds"],
        "own_cold_s": own_cold["seconds"],
        "machine_b_s": hit,
        "own_warm_s": anchor,
        "ratio": hit / anchor,
        "machine_b_s_all": [r["seconds"] for r in hits],
        "own_warm_s_all": [r["seconds"] for r in anchors],
        "machine_a_compiles": machine_a["compiles"],
        "machine_b_compiles": [r["compiles"] for r in hits],
        "own_warm_compiles": [r["compiles"] for r in anchors],
        "machine_b_cpp_builds": [r.get("cpp_builds") for r in hits],
    }


def _python312(given: str | None) -> str | None:
    if given:
        return given
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidate = os.path.join(root, "versions", "3.12.1", "bin", "python3")
    return candidate if os.path.isfile(candidate) else shutil.which("python3.12")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--only", default="triton,inductor,jax")
    ap.add_argument("--triton", default=os.path.join(COMPAT, "triton-3.9.0"))
    ap.add_argument("--torch", default=os.path.join(COMPAT, "torch-2.15.0"))
    ap.add_argument("--jax", default=os.path.join(COMPAT, "jax-0.12.0.1"))
    ap.add_argument("--python312", default=None, help="the Python 3.12 that runs --jax")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    systems = {
        "triton": {"path": args.triton, "python": sys.executable, "code": TRITON},
        "inductor": {"path": args.torch, "python": sys.executable, "code": INDUCTOR},
        "jax": {"path": args.jax, "python": _python312(args.python312), "code": JAX},
    }
    out: dict[str, dict] = {}
    for label in args.only.split(","):
        system = systems[label]
        if not os.path.isdir(system["path"]) or not system["python"]:
            out[label] = {"skipped": f"{system['path']} or its Python is missing"}
            print(f"{label:9s} skipped: {out[label]['skipped']}", flush=True)
            continue
        r = out[label] = bench(system, args.runs)
        print(
            f"{label:9s} {r['version']:>12s}  machine B {r['machine_b_s']:.3f} s / own warm "
            f"{r['own_warm_s']:.3f} s = {r['ratio']:.2f}x  (cold: A {r['machine_a_cold_s']:.2f} s"
            f", own {r['own_cold_s']:.2f} s; compiles: A {r['machine_a_compiles']}, "
            f"B {r['machine_b_compiles']}, own warm {r['own_warm_compiles']}"
            + (f"; B's C++ builds {r['machine_b_cpp_builds']}" if label == "inductor" else "")
            + ")",
            flush=True,
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
