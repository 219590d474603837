"""On a GPU: torch.compile of a small CUDA model whose Triton kernels go through cuforge;
"machine" B (fresh Inductor, Triton and cuforge dirs, the same file:// remote) runs 0
Triton compiles and gives the same outputs. Run with ``pytest -m gpu tests/adapters/triton``.

Inductor compiles Triton kernels in the parent until its worker pool is ready, then in the
workers: Triton's listener in the parent sees the first kind, and the ``triton`` entries in
the shared remote count both (a compile anywhere puts a new one)."""

from __future__ import annotations

import pytest

pytest.importorskip("triton", reason="Triton is not installed")
pytest.importorskip("torch", reason="torch is not installed")

from tests.child import ROOT, child_env, run_python  # noqa: E402

MACHINE = f"""
import json, sys
sys.path.insert(0, {ROOT!r})
import torch, triton
import cuforge
from cuforge.torch import compile_cache
from tests.adapters.triton.kernels import CompileCounter
counter = CompileCounter().install()
assert compile_cache.enable()
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.LayerNorm(256), torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256)
).cuda().half()
x = torch.randn(64, 256, device="cuda", dtype=torch.half)
with torch.no_grad():
    out = torch.compile(model)(x)
torch.cuda.synchronize()
print(json.dumps({{"compiles": counter.compiles, "hits": counter.hits,
                  "out": out.float().flatten()[:512].tolist(),
                  "counters": dict(cuforge.default_cache().counters)}}))
"""


def _machine(tmp_path, label: str, remote: str) -> dict:
    home = tmp_path / label
    (home / "cwd").mkdir(parents=True)
    env = child_env(
        CUFORGE_CACHE_DIR=str(home / "cuforge"),
        CUFORGE_REMOTE=remote,
        TORCHINDUCTOR_CACHE_DIR=str(home / "inductor"),
        TRITON_CACHE_DIR=str(home / "triton"),
        TRITON_HOME=str(home),
        # Inductor's compile workers are other processes: they need the manager by name
        TRITON_CACHE_MANAGER="cuforge.triton:CacheManager",
    )
    return run_python(MACHINE, env, timeout=600, cwd=str(home / "cwd"))


def _remote_triton_entries(shared) -> int:
    return sum(1 for p in shared.rglob("*") if p.is_file() and "triton" in p.parts)


@pytest.mark.gpu
def test_torch_compile_on_machine_b_runs_no_triton_compile(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    a = _machine(tmp_path, "a", f"file://{shared}")
    stored = _remote_triton_entries(shared)
    assert stored >= 1, a
    b = _machine(tmp_path, "b", f"file://{shared}")
    assert b["compiles"] == 0, (a, b)
    assert _remote_triton_entries(shared) == stored, "B compiled a kernel A had not stored"
    assert b["out"] == pytest.approx(a["out"], rel=1e-3, abs=1e-3)


# the Triton benchmark as a test: a @triton.jit launch in a fresh process
VECADD = f"""
import json, os, sys
sys.path.insert(0, {ROOT!r})
import torch, triton
import cuforge, cuforge.triton as ct
from tests.adapters.triton.kernels import CompileCounter, add_kernel, c_builds
counter = CompileCounter().install()
assert ct.enable()
n = 1 << 16
x = torch.rand(n, device="cuda"); y = torch.rand(n, device="cuda"); out = torch.empty_like(x)
add_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
torch.cuda.synchronize()
assert torch.allclose(out, x + y)
print(json.dumps({{"compiles": counter.compiles, "hits": counter.hits,
                  "c_builds": c_builds(os.environ["CC_LOG"]),
                  "counters": dict(cuforge.default_cache().counters)}}))
"""


@pytest.mark.gpu
def test_a_triton_launch_on_machine_b_builds_nothing(tmp_path):
    """B (fresh Triton and cuforge dirs, the same remote): no kernel compile and no C
    compiler run (Triton's cuda_utils and, on Triton <= 3.6, its launcher come from cuforge)."""
    from tests.adapters.triton.kernels import logging_cc

    cc = logging_cc(tmp_path / "cc")
    shared = tmp_path / "shared"
    shared.mkdir()
    runs = {}
    for label in ("a", "b"):
        home = tmp_path / label
        home.mkdir()
        env = child_env(
            CUFORGE_CACHE_DIR=str(home / "cuforge"),
            CUFORGE_REMOTE=f"file://{shared}",
            # Triton's C modules are native host code: an unsigned share serves them only
            # when allowed (issue 35 item 5; a signed share needs no setting)
            CUFORGE_REMOTE_NATIVE="allow",
            TRITON_CACHE_DIR=str(home / "triton"),
            TRITON_HOME=str(home),
            CC=cc,
            CC_LOG=str(home / "cc.log"),
        )
        runs[label] = run_python(VECADD, env, timeout=600, cwd=str(home))
    a, b = runs["a"], runs["b"]
    assert a["compiles"] == 1 and a["c_builds"] >= 1, a
    assert b["compiles"] == 0 and b["hits"] == 1, b
    assert b["c_builds"] == 0, b
