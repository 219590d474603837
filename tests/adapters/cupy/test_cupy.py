"""cuforge.cupy on the real CuPy. The contract test needs CuPy (it skips without it); the
process-B test needs a GPU (``pytest -m gpu tests/adapters/cupy`` on a machine with cupy-cuda13x)."""

from __future__ import annotations

import importlib.util
import inspect

import pytest

from tests.child import child_env, run_python

needs_cupy = pytest.mark.skipif(
    importlib.util.find_spec("cupy") is None,
    reason="cupy is not installed: pip install 'cuforge[cupy]'",
)

#: a child: cuforge's backend on, a RawKernel, a templated RawModule (name expressions) and
#: an ElementwiseKernel; NVRTC compiles counted by a spy on CuPy's own compile function
CHILD = r"""
import json
import cupy
from cupy.cuda import compiler
compiles = []
real = compiler._compile_using_nvrtc_no_warning
def spy(*args, **kwargs):
    compiles.append(1)
    return real(*args, **kwargs)
compiler._compile_using_nvrtc_no_warning = spy
import cuforge, cuforge.cupy as cc
enabled = cc.enable()
x = cupy.arange(8, dtype=cupy.float32)
import os
# the header's dir as CuPy users pass it: an -I option (cuforge reads it from the options)
raw = cupy.RawKernel(r'''
#include "scale.h"
extern "C" __global__ void scale(float* a) { a[threadIdx.x] *= SCALE; }
''', "scale", options=("-I", os.getcwd()))
a = x.copy(); raw((1,), (8,), (a,))
mod = cupy.RawModule(code=r'''
template<typename T> __global__ void twice(T* a) { a[threadIdx.x] += a[threadIdx.x]; }
''', name_expressions=["twice<float>"])
b = x.copy(); mod.get_function("twice<float>")((1,), (8,), (b,))
ew = cupy.ElementwiseKernel("float32 x", "float32 y", "y = x * x + 1", "cuforge_sq")
c = ew(x)
print(json.dumps({
    "enabled": enabled, "compiles": len(compiles),
    "a": a.get().tolist(), "b": b.get().tolist(), "c": c.get().tolist(),
    "counters": dict(cuforge.default_cache().counters),
}))
"""


@needs_cupy
def test_contract_with_the_installed_cupy():
    import cupy
    from cupy.cuda import compiler
    from cupy.cuda._compiler_cache import KernelCacheBackend

    import cuforge.cupy as cc

    assert cc.hook_problem() is None, f"cupy {cupy.__version__}: {cc.hook_problem()}"
    assert list(inspect.signature(compiler._set_kernel_cache_backend).parameters) == ["backend"]
    assert list(inspect.signature(KernelCacheBackend.load).parameters) == ["self", "name"]
    assert list(inspect.signature(KernelCacheBackend.save).parameters) == [
        "self",
        "name",
        "cubin",
        "source",
    ]
    assert callable(compiler._compile_using_nvrtc_no_warning)  # the test's spy


@needs_cupy
@pytest.mark.gpu
def test_process_b_compiles_nothing(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    (work / "scale.h").write_text("#define SCALE 3.0f\n")

    def run(name: str) -> dict:
        env = child_env(
            CUFORGE_CACHE_DIR=str(tmp_path / name),
            CUFORGE_REMOTE=f"file://{shared}",
            CUPY_CACHE_DIR=str(tmp_path / f"cupy-{name}"),
        )
        return run_python(CHILD, env, cwd=str(work))

    a = run("a")
    assert a["enabled"] and a["compiles"] >= 3
    b = run("b")
    assert b["compiles"] == 0, b
    assert (b["a"], b["b"], b["c"]) == (a["a"], a["b"], a["c"])
    assert a["a"][1] == 3.0 and a["b"][1] == 2.0 and a["c"][2] == 5.0
    (work / "scale.h").write_text("#define SCALE 5.0f\n")  # a header edit misses
    c = run("c")
    assert c["compiles"] == 1 and c["a"][1] == 5.0 and c["counters"].get("cupy:header_changed") == 1


def test_include_dirs_are_read_from_cupy_compile_options():
    """The adapter keys headers found through the compile's own -I options (no CuPy needed)."""
    from cuforge.cupy import include_dirs_of

    options = ("-std=c++17", "-I", "a", "-Ib", "--include-path=c", "--include-path", "d", "-DX")
    assert include_dirs_of(options) == ["a", "b", "c", "d"]
    assert include_dirs_of(("-I",)) == []


#: a child: under fence("error") a warm replay compiles nothing and trips nothing; a new
#: RawKernel raises CompileAfterFenceError and CuPy compiles nothing
FENCED = CHILD.replace(
    "print(json.dumps({",
    r"""new = None
with cuforge.fence("error"):
    try:
        cupy.RawKernel('extern "C" __global__ void brand_new(float* a) { a[0] = 7; }',
                       "brand_new")((1,), (1,), (x.copy(),))
    except cuforge.CompileAfterFenceError as exc:
        new = {"system": exc.system, "key": exc.key, "compiles": len(compiles)}
print(json.dumps({"new": new,""",
)


@needs_cupy
@pytest.mark.gpu
def test_fence_catches_a_new_cupy_kernel_and_never_a_hit(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "scale.h").write_text("#define SCALE 3.0f\n")

    def run(fence: str) -> dict:
        env = child_env(
            CUFORGE_CACHE_DIR=str(tmp_path / "c"),
            CUFORGE_FENCE=fence,
            CUPY_CACHE_DIR=str(tmp_path / "cupy"),
        )
        return run_python(FENCED, env, cwd=str(work))

    first = run("")
    assert first["compiles"] >= 3
    replay = run("error")  # every kernel of CHILD hits: nothing trips, nothing compiles
    assert replay["new"] == {"system": "cupy", "key": replay["new"]["key"], "compiles": 0}
    assert (replay["a"], replay["b"], replay["c"]) == (first["a"], first["b"], first["c"])
