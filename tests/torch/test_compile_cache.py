"""torch.compile's caches in cuforge, on the CPU (Inductor's CPU backend uses the same
FX-graph and AOTAutograd caches): a model compiled on "machine" A is compiled on B (fresh
TORCHINDUCTOR_CACHE_DIR, another cwd, the same cuforge remote) with no Inductor codegen,
counted with torch's own counters."""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="torch is not installed")

from tests.child import child_env, run_python  # noqa: E402

MACHINE = """
import json
import torch
import cuforge
from cuforge.torch import compile_cache
assert compile_cache.enable()
from torch._dynamo.utils import counters

torch.manual_seed(0)
# extern kernels only (addmm): no C++ kernel build, so the test stays fast on 2 cores
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 4))
x = torch.randn(8, 16)
with torch.no_grad():
    out = torch.compile(model)(x)
inductor = counters["inductor"]
print(json.dumps({
    "hit": inductor["fxgraph_cache_hit"], "miss": inductor["fxgraph_cache_miss"],
    "out": out.flatten().tolist(),
    "counters": dict(cuforge.default_cache().counters),
}))
"""


def _machine(tmp_path, label: str, remote: str) -> dict:
    home = tmp_path / label / "some" / "checkout"
    home.mkdir(parents=True)
    env = child_env(
        CUFORGE_CACHE_DIR=str(tmp_path / label / "cuforge"),
        CUFORGE_REMOTE=remote,
        TORCHINDUCTOR_CACHE_DIR=str(tmp_path / label / "inductor"),
        TRITON_CACHE_DIR=str(tmp_path / label / "triton"),
        TORCHINDUCTOR_COMPILE_THREADS="1",
        HOME=str(tmp_path / label),
        USER=f"user-{label}",
    )
    return run_python(MACHINE, env, timeout=240, cwd=str(home))


@pytest.mark.slow
def test_a_model_compiled_on_machine_a_is_loaded_on_b_without_codegen(tmp_path, redis_server):
    # A writes to a shared dir and to a real redis-server; one B reads each (3 processes,
    # not 4: torch's import and dynamo are most of each one's time)
    shared = tmp_path / "shared"
    shared.mkdir()
    a = _machine(tmp_path, "a", f"file://{shared},{redis_server.url}")
    assert a["miss"] >= 1 and a["hit"] == 0, a
    for label, remote in (("b-dir", f"file://{shared}"), ("b-redis", redis_server.url)):
        b = _machine(tmp_path, label, remote)
        assert b["miss"] == 0 and b["hit"] == a["miss"], (label, b)
        assert b["out"] == pytest.approx(a["out"])
        assert b["counters"].get("inductor:RemoteFxGraphCache:remote", 0) >= 1, b["counters"]
