"""Record -> replay across systems (slow; `make test-integrations`): a workload that compiles
a cuforge kernel, a cuforge.jit specialization, a small torch extension, a cuda.compute
algorithm (stub libcuda without a driver) and a CuTe DSL kernel (CUTE_DSL_ARCH=sm_90a) --
each system only where its package is installed -- is recorded with CUFORGE_RECORD; the warm
set is built from the lock (`cuforge build --lock`), shipped as a wheel (`cuforge bundle
wheel`) and pip-installed into a fresh venv; a fresh cache dir there replays the workload
under fence("error"): nothing compiles in any system, the same keys and binaries.

The pipeline runs once per module (one record, one build, one wheel, one replay: the torch
extension's build is the slow part, a few seconds with its pybind11-only source); each
system's test then checks its part of the replay, or skips with the reason."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

from tests.child import ROOT, SRC, child_env, finish, spawn
from tests.core.test_bundle_wheel import _in_venv, _pip_install, _venv
from tests.core.test_record import _cli
from tests.libcuda_stub import child_env_or_skip

pytestmark = pytest.mark.slow

WORKLOAD = r"""
import json, sys, cuforge
SYSTEMS = sys.argv[1].split(",")
if sys.argv[2:] == ["replay"]:
    cuforge.fence("error")
SCALE = '''
template <typename T, int BLOCK>
__global__ void scale(const T* __restrict__ x, T* out, T alpha, int n) {
    int i = blockIdx.x * BLOCK + threadIdx.x;
    if (i < n) out[i] = x[i] * alpha;
}
'''
out = {}
a = cuforge.compile('extern "C" __global__ void z(int* p) { *p = 1; }', name="z.cu", arch="sm_90")
j = cuforge.jit(SCALE, "scale", arch="sm_90").specialize(T="float", BLOCK=64)
out["kernel"] = [a.key, a.binary.hex()[:64]]
out["jit"] = [j.program.key, j.program.binary.hex()[:64]]
if "torch" in SYSTEMS:
    from cuforge.torch import load
    ext = load("cf_record_systems_ext", ["ext.cpp"])
    out["torch"] = [ext.add(2, 3)]
if "cccl" in SYSTEMS:
    import numpy as np
    import cuda.compute as cc
    import cuforge.cccl as cccl
    P = cc.ProxyArray
    cccl.make_reduce_into(d_in=P(np.int32), d_out=P(np.int32), op=cc.OpKind.PLUS,
                          h_init=np.zeros(1, np.int32), compute_capability=90)
    r = cccl.last_result()
    out["cccl"] = [r.key, r.source_of_result]
if "cute" in SYSTEMS:
    import cuforge.cute as cf_cute
    from tests.cute import kernels as K
    x, y = K.fake_args()
    r = cf_cute.compile_cached(K.scale, x, y)
    out["cute"] = [r.key, r.source_of_result]
counters = cuforge.default_cache().counters
out["compiles"] = {k: v for k, v in counters.items() if k == "compiles" or k.endswith(":compiles")}
print(json.dumps(out))
"""

EXT = """#include <pybind11/pybind11.h>
static int add(int a, int b) { return a + b; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("add", &add); }
"""


def _missing(system: str) -> str | None:
    """Why ``system`` cannot be part of the workload here, or None."""
    if system == "torch":
        return None if importlib.util.find_spec("torch") else "torch is not installed"
    if system == "cccl":
        found = importlib.util.find_spec("cuda") and importlib.util.find_spec("cuda.compute")
        return None if found else "cuda-cccl (cuda.compute) is not installed"
    if system == "cute":
        found = importlib.util.find_spec("cutlass") and importlib.util.find_spec("cutlass.cute")
        return None if found else "nvidia-cutlass-dsl (the CuTe DSL) is not installed"
    return None


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    """(systems, recorded run, replayed run) of the whole pipeline, once."""
    tmp = tmp_path_factory.mktemp("record-systems")
    systems = [s for s in ("torch", "cccl", "cute") if _missing(s) is None]
    extra = {"CUTE_DSL_ARCH": "sm_90a"}
    if "cccl" in systems or "cute" in systems:
        extra.update(child_env_or_skip(tmp_path_factory))
    (tmp / "ext.cpp").write_text(EXT)
    script = tmp / "workload.py"
    script.write_text(WORKLOAD)
    which = ",".join(["kernel", *systems])

    env = child_env(
        CUFORGE_CACHE_DIR=str(tmp / "c1"), CUFORGE_ARCH="sm_90", CUFORGE_RECORD="cuforge.lock",
        **extra,
    )  # fmt: skip
    env["PYTHONPATH"] = f"{SRC}:{ROOT}:{env['PYTHONPATH']}"
    code = f"import sys; sys.argv = ['w', {which!r}]; exec(open({str(script)!r}).read())"
    first = finish(spawn(code, env, cwd=str(tmp)), timeout=600)

    built = _cli(tmp, tmp / "c1", "build", "--lock", "cuforge.lock", "--bundle", "w.cfb")
    assert built.returncode == 0, built.stderr + built.stdout
    made = _cli(
        tmp, tmp / "c1", "bundle", "wheel", "w.cfb", "--name", "systems-kernels",
        "--version", "1.0", "--out", "dist", "--json",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    python, venv_env = _venv(tmp)
    _pip_install(python, json.loads(made.stdout)["wheel"])
    stub = extra.get("LD_LIBRARY_PATH", "").split(":")[0]  # the stub's dir, if any
    venv_env.update({k: v for k, v in extra.items() if k != "LD_LIBRARY_PATH"})
    if stub:
        venv_env["LD_LIBRARY_PATH"] = f"{stub}:{venv_env['LD_LIBRARY_PATH']}"
    venv_env["PYTHONPATH"] += f":{ROOT}"
    if "cute" in systems:  # the DSL's package dir comes from a .pth file PYTHONPATH skips
        where = importlib.util.find_spec("cutlass").submodule_search_locations[0]
        venv_env["PYTHONPATH"] += ":" + os.path.dirname(where)
    venv_env["CUFORGE_CACHE_DIR"] = str(tmp / "fresh")
    ran = _in_venv(python, venv_env, tmp, str(script), which, "replay")
    assert ran.returncode == 0, ran.stderr[-4000:]  # fence("error"): a compile would raise
    return systems, first, json.loads(ran.stdout.strip().splitlines()[-1])


def test_kernels_and_jit_replay(replayed):
    _, first, replay = replayed
    assert first["compiles"]["compiles"] == 2
    assert replay["compiles"].get("compiles", 0) == 0
    assert replay["kernel"] == first["kernel"] and replay["jit"] == first["jit"]


@pytest.mark.parametrize("system", ["torch", "cccl", "cute"])
def test_system_replays_from_the_wheel(replayed, system):
    why = _missing(system)
    if why is not None:
        pytest.skip(why)
    _, first, replay = replayed
    assert replay[system][0] == first[system][0]  # the same key (torch: the same module)
    if system == "torch":
        assert first["compiles"]["torch:compiles"] == 1
        assert replay["compiles"].get("torch:compiles", 0) == 0
    else:
        assert (first[system][1], replay[system][1]) == ("compiled", "bundle")
