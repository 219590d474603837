"""cuforge.cute on a GPU: a cached kernel restored in a fresh process gives the right result.

Run on a GPU machine: ``pytest -q -m gpu tests/cute/test_cute_gpu.py`` (needs torch with
CUDA and the CuTe DSL). Each test compiles in one child process (and checks the result
there), then restores the stored export in a second, fresh child process (no compile, no
trace) and checks the result again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip(
    "cutlass.cute", reason="the CuTe DSL is not installed (pip install 'cuforge[cute]')"
)

from tests.conftest import ROOT, SRC  # noqa: E402

pytestmark = pytest.mark.gpu

ELEMENTWISE = """
import json, os
import torch
from cutlass.cute.runtime import from_dlpack
import cuforge.cute as cc
from cuforge.cute.cache import counters
from tests.cute import kernels as K

n = 1 << 20
x = torch.randn(n, device="cuda", dtype=torch.float32)
y = torch.empty_like(x)
tx = from_dlpack(x).mark_layout_dynamic()
ty = from_dlpack(y).mark_layout_dynamic()
r = cc.compile_cached(K.scale, tx, ty, verify=os.environ.get("CF_VERIFY") or None)
r.value(tx, ty)
torch.cuda.synchronize()
ok = torch.allclose(y, x * K.SCALE)
# another size through the same dynamic-shape kernel
x2 = torch.randn(n // 2, device="cuda", dtype=torch.float32)
y2 = torch.empty_like(x2)
t2x, t2y = from_dlpack(x2).mark_layout_dynamic(), from_dlpack(y2).mark_layout_dynamic()
r2 = cc.compile_cached(K.scale, t2x, t2y)
r2.value(t2x, t2y)
torch.cuda.synchronize()
ok2 = torch.allclose(y2, x2 * K.SCALE)

y.zero_()
K.scale_cached(tx, ty)  # @cuforge.cute.jit: compiles (cached) on call, then runs
torch.cuda.synchronize()
ok3 = torch.allclose(y, x * K.SCALE)
print(json.dumps({"source": r.source_of_result, "second": r2.source_of_result, "ok": bool(ok),
                  "ok_other_size": bool(ok2), "ok_decorator": bool(ok3), "counters": counters,
                  "verified": r.verified}))
"""

GEMM = """
import json
import torch
import cuda.bindings.driver as cuda
from cutlass.cute.runtime import from_dlpack
import cuforge.cute as cc
from cuforge.cute.cache import counters
from tests.cute import gemm

torch.manual_seed(0)
M, N, K = 512, 256, 128
a = torch.randint(-5, 5, (M, K), device="cuda").float()
b = torch.randint(-5, 5, (N, K), device="cuda").float()
c = torch.zeros(M, N, device="cuda")
ta = from_dlpack(a, assumed_align=16).mark_layout_dynamic(leading_dim=1)
tb = from_dlpack(b, assumed_align=16).mark_layout_dynamic(leading_dim=1)
tc = from_dlpack(c, assumed_align=16).mark_layout_dynamic(leading_dim=1)
stream = cuda.CUstream(torch.cuda.current_stream().cuda_stream)
r = cc.compile_cached(gemm.sgemm, ta, tb, tc, stream)
r.value(ta, tb, tc, stream)
torch.cuda.synchronize()
ref = a @ b.T
err = (c - ref).abs().max().item()
print(json.dumps({"source": r.source_of_result, "max_abs_err": err, "counters": counters}))
"""


def _child(code: str, **env: str) -> dict:
    full = dict(os.environ)
    full["PYTHONPATH"] = os.pathsep.join([SRC, ROOT, full.get("PYTHONPATH", "")])
    full.pop("CUTE_DSL_ARCH", None)  # the device's arch
    full.update(env)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=full,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=ROOT,
    )
    assert done.returncode == 0, f"child failed:\n{done.stdout}\n{done.stderr}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_elementwise_restored_in_a_fresh_process_is_right():
    first = _child(ELEMENTWISE)
    assert first["source"] == "compiled", first
    assert first["ok"] and first["ok_other_size"] and first["ok_decorator"], first
    second = _child(ELEMENTWISE)
    assert second["source"] == "disk", second
    assert second["second"] == "memo"
    assert second["counters"]["compile"] == 0 and second["counters"]["trace"] == 0
    assert second["ok"] and second["ok_other_size"] and second["ok_decorator"], second
    verified = _child(ELEMENTWISE, CF_VERIFY="trace")
    assert verified["source"] == "disk" and verified["verified"] is True and verified["ok"]


def test_gemm_restored_in_a_fresh_process_is_right():
    first = _child(GEMM)
    assert first["source"] == "compiled", first
    assert first["max_abs_err"] == 0.0, first  # small integers: exact in fp32
    second = _child(GEMM)
    assert second["source"] == "disk", second
    assert second["counters"]["compile"] == 0
    assert second["max_abs_err"] == 0.0, second
