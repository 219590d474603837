"""cuforge.cute on CuTe DSL code written as kernel libraries write it (issue 34), without a
GPU (``CUTE_DSL_ARCH=sm_90a``): real compiles, real exports, real fresh processes.

* the patterns of flash-attention's CuTe kernels and quack get the **pre-trace key** (a
  fresh process makes 0 traces and 0 DSL compiles): a work-tile class with
  ``__new_from_mlir_values__(self, values: list[ir.Value])``, a ``loc: Optional[ir.Location]``
  helper, a kernel class instance (with ``options="--enable-tvm-ffi"`` where apache-tvm-ffi
  is importable), a library imported from a namespace package in a checkout;
* a kernel the pre-trace key cannot cover is served by the **IR key** (a fresh process
  traces, never compiles); one neither key covers runs uncached, said once per kernel;
* ``cuforge cache stats`` counts the calls per key, ``cuforge cache explain`` lists the
  uncached kernel with its reason.

``counters["compile"]`` counts the DSL's own ``cute.compile`` calls; ``dsl_compiles`` counts
the DSL's compile pipeline (``compile_and_cache``, patched on the class in the child).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.child import run_python
from tests.conftest import GPU_VISIBLE, ROOT, SRC

if not GPU_VISIBLE:
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

pytest.importorskip(
    "cutlass.cute", reason="the CuTe DSL is not installed (pip install 'cuforge[cute]')"
)

CHILD = """
import json, os, sys
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
from cutlass.cutlass_dsl.cutlass import CutlassBaseDSL
dsl_compiles = [0]
real = CutlassBaseDSL.compile_and_cache
def counted(self, *args, **kwargs):
    dsl_compiles[0] += 1
    return real(self, *args, **kwargs)
CutlassBaseDSL.compile_and_cache = counted
import cuforge.cute
cuforge.cute.enable()
import cutlass.cute as cute
from cuforge.cute.cache import counters
from tests.cute import kernels as K
a, b = K.fake_args()
served = []
for _ in range(int(os.environ.get("CF_CALLS", "1"))):
    r = cuforge.cute.compile_cached(*CALL(a, b), **KW)
    served.append([r.source_of_result, r.served_by])
print(json.dumps({"counters": counters, "dsl_compiles": dsl_compiles[0], "served": served,
                  "reason": r.reason}))
"""


def _child(setup: str, call: str, kw: str = "{}", **env: str) -> dict:
    code = CHILD.replace(
        "served = []", f"{textwrap.dedent(setup)}\nCALL = {call}\nKW = {kw}\nserved = []"
    )
    full = dict(os.environ)
    full["PYTHONPATH"] = os.pathsep.join([SRC, ROOT, full.get("PYTHONPATH", "")])
    full.update(env)
    return run_python(code, full, cwd=ROOT, stderr_key="stderr")


def _cold_then_warm(setup: str, call: str, kw: str = "{}", **env: str) -> tuple[dict, dict]:
    cold = _child(setup, call, kw, **env)
    warm = _child(setup, call, kw, **env)
    return cold, warm


def _assert_pretrace_hit(cold: dict, warm: dict) -> None:
    assert cold["served"] == [["compiled", "pretrace"]], cold
    assert cold["counters"]["compile"] == 1 and cold["dsl_compiles"] == 1, cold
    # a fresh process: no trace, no cute.compile, no DSL compile; one load
    assert warm["served"] == [["disk", "pretrace"]], warm
    assert warm["counters"]["compile"] == 0 and warm["dsl_compiles"] == 0, warm
    assert warm["counters"]["trace"] == 0 and warm["counters"]["load"] == 1, warm
    assert "cannot be keyed" not in warm["stderr"] and "uncached" not in warm["stderr"]


LIB = "from tests.cute import library as L"


def test_a_work_tile_with_mlir_value_annotations_and_a_loc_helper_get_the_pretrace_key():
    _assert_pretrace_hit(*_cold_then_warm(LIB, "lambda a, b: (L.tiled, a, b)"))


def test_a_kernel_class_instance_gets_the_pretrace_key():
    _assert_pretrace_hit(*_cold_then_warm(LIB, "lambda a, b: (L.TiledKernel(2.5), a, b)"))


def test_a_kernel_class_instance_with_tvm_ffi_options_gets_the_pretrace_key():
    pytest.importorskip(
        "tvm_ffi", reason="apache-tvm-ffi is not installed (the DSL's --enable-tvm-ffi needs it)"
    )
    cold, warm = _cold_then_warm(
        LIB, "lambda a, b: (L.TiledKernel(2.5), a, b)", "{'options': '--enable-tvm-ffi'}"
    )
    _assert_pretrace_hit(cold, warm)
    plain = _child(LIB, "lambda a, b: (L.TiledKernel(2.5), a, b)")
    assert plain["served"] == [["compiled", "pretrace"]]  # the options string is keyed


NS_HELPERS = """
from typing import Optional
from cutlass._mlir import ir

FACTOR = {factor}

def offset(i, *, loc: Optional[ir.Location] = None, ip=None):
    return i * FACTOR
"""

NS_KERNEL = """
import cutlass.cute as cute
import nslib.cute.helpers  # the global "nslib": a namespace package
from nslib.cute.tiles import WorkTile

@cute.kernel
def ns_kernel(a: cute.Tensor, b: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i = WorkTile(bidx).tile_idx * 128 + tidx
    b[i] = nslib.cute.helpers.offset(a[i])

@cute.jit
def ns_entry(a: cute.Tensor, b: cute.Tensor):
    ns_kernel(a, b).launch(grid=(a.shape[0] // 128, 1, 1), block=(128, 1, 1))
"""

NS_TILES = """
from cutlass._mlir import ir
from cutlass.cutlass_dsl import extract_mlir_values, new_from_mlir_values

class WorkTile:
    def __init__(self, tile_idx):
        self.tile_idx = tile_idx

    def __extract_mlir_values__(self) -> list[ir.Value]:
        return extract_mlir_values(self.tile_idx)

    def __new_from_mlir_values__(self, values: list[ir.Value]) -> "WorkTile":
        return WorkTile(new_from_mlir_values(self.tile_idx, values))
"""


def _checkout(root, factor: str) -> None:
    # nslib/ and nslib/cute/ have no __init__.py: namespace packages, as a checkout of a
    # library put on sys.path (flash_attn/cute) is imported
    pkg = root / "nslib" / "cute"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "helpers.py").write_text(NS_HELPERS.format(factor=factor))
    (pkg / "kernels.py").write_text(NS_KERNEL)
    (pkg / "tiles.py").write_text(NS_TILES)


def test_a_library_in_a_namespace_package_of_a_checkout_is_keyed_by_its_files(tmp_path):
    checkout = tmp_path / "checkout"
    _checkout(checkout, "2.0")
    setup = f"sys.path.insert(0, {str(checkout)!r})\nimport nslib.cute.kernels as NK"
    call = "lambda a, b: (NK.ns_entry, a, b)"
    cold, warm = _cold_then_warm(setup, call)
    _assert_pretrace_hit(cold, warm)
    _checkout(checkout, "3.0")  # an edit of a helper module of the checkout: a new key
    edited = _child(setup, call)
    assert edited["served"] == [["compiled", "pretrace"]] and edited["dsl_compiles"] == 1


def test_a_kernel_the_pretrace_key_cannot_cover_compiles_nothing_in_a_fresh_process():
    setup = ""
    call = "lambda a, b: (K.with_lock, a, b)"  # a global lock: no stable fingerprint
    cold, warm = _cold_then_warm(setup, call)
    assert cold["served"] == [["compiled", "ir"]] and cold["dsl_compiles"] == 1, cold
    assert warm["served"] == [["disk", "ir"]], warm
    # traced (the IR key), not compiled: the compiled object comes from cuforge's store
    assert warm["counters"]["compile"] == 0 and warm["dsl_compiles"] == 0, warm
    assert warm["counters"]["trace"] == 1 and warm["counters"]["load"] == 1, warm
    assert "LOCK" in warm["reason"]
    # said once per kernel, naming the object and what to do
    assert warm["stderr"].count("cannot be keyed before tracing") == 1, warm["stderr"]
    assert "__globals__['LOCK']" in warm["stderr"] and "Constexpr" in warm["stderr"]


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([SRC, env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "cuforge", "cache", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )


def test_cache_stats_counts_calls_per_key_and_explain_lists_the_uncached():
    _child("", "lambda a, b: (K.scale, a, b)", CF_CALLS="2")  # pre-trace: compile, memo
    _child("", "lambda a, b: (K.with_lock, a, b)")  # IR key
    out = _child("", "lambda a, b: (K.with_ticks, a, b)", CF_CALLS="2")  # neither
    assert out["served"] == [["uncached", "uncached"]] * 2
    assert out["stderr"].count("runs uncached") == 1 and "TICKS" in out["stderr"]
    doc = json.loads(_cli("stats", "--json").stdout)
    assert doc["served"]["cute"] == {"pretrace": 2, "ir": 1, "uncached": 2}, doc["served"]
    text = _cli("stats").stdout
    assert "cute: 2 by the pre-trace key, 1 by the IR key" in text and "2 uncached" in text
    explain = _cli("explain").stdout
    assert "tests.cute.kernels.with_ticks" in explain and "two different modules" in explain
