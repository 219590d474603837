"""Issue 13, section 4: strict production mode (``strict=True`` / ``CUFORGE_OFFLINE=1``):
a miss raises a clear error and compiles nothing; hits are served."""

from __future__ import annotations

import inspect

import pytest

import cuforge
from cuforge.base.errors import ConfigError, CuforgeError
from cuforge.core.pipeline import OfflineMissError, compile_cached, counters

SRC = r"""
template <int N> __global__ void fill(float* out) { out[threadIdx.x] = N * SCALE; }
"""


def call(**kw):
    args = dict(
        name="fill.cu",
        arch="sm_90",
        name_expressions=("fill<4>",),
        defines={"SCALE": 2},
        options=("-lineinfo",),
    )
    args.update(kw)
    return compile_cached(SRC, **args)


def test_strict_miss_raises_naming_kernel_arch_variant_and_manifest_entry():
    with pytest.raises(OfflineMissError) as info:
        call(strict=True)
    err = info.value
    assert isinstance(err, CuforgeError)
    text = str(err)
    assert "fill.cu for sm_90" in text
    assert "name_expressions fill<4>" in text and "defines SCALE=2" in text
    assert "options -lineinfo" in text
    assert "no bundle is loaded" in text
    assert err.manifest_entry in text
    assert 'source = "fill.cu"' in err.manifest_entry
    assert 'arch = ["sm_90"]' in err.manifest_entry
    assert 'name_expressions = ["fill<4>"]' in err.manifest_entry
    assert 'defines = { SCALE = "2" }' in err.manifest_entry
    assert counters["compiles"] == 0


def test_strict_serves_hits_and_compiles_nothing():
    first = call()  # not strict: compiles
    assert counters["compiles"] == 1
    cuforge.core.pipeline.reset_memo()
    again = call(strict=True)
    assert again.source_of_result in ("memory", "disk") and again.binary == first.binary
    assert counters["compiles"] == 1
    with pytest.raises(OfflineMissError):
        call(strict=True, arch="sm_80")  # another variant: a miss
    assert counters["compiles"] == 1


def test_cuforge_offline_switch(monkeypatch):
    monkeypatch.setenv("CUFORGE_OFFLINE", "1")
    with pytest.raises(OfflineMissError, match="strict mode"):
        call()
    assert counters["compiles"] == 0
    monkeypatch.setenv("CUFORGE_OFFLINE", "0")
    assert call().source_of_result == "compiled"
    monkeypatch.setenv("CUFORGE_OFFLINE", "1")
    cuforge.core.pipeline.reset_memo()
    assert call().source_of_result in ("memory", "disk")


def test_offline_with_the_cache_disabled_says_so(monkeypatch):
    monkeypatch.setenv("CUFORGE_OFFLINE", "1")
    monkeypatch.setenv("CUFORGE_DISABLE_CACHE", "1")
    with pytest.raises(OfflineMissError, match="CUFORGE_DISABLE_CACHE is set"):
        call()


def test_a_bad_offline_value_is_a_config_error(monkeypatch):
    monkeypatch.setenv("CUFORGE_OFFLINE", "maybe")
    with pytest.raises(ConfigError, match="CUFORGE_OFFLINE"):
        call()


def test_a_changed_header_is_named_as_the_reason(tmp_path, monkeypatch):
    (tmp_path / "k.cuh").write_text("#define V 1\n")
    src = '#include "k.cuh"\nextern "C" __global__ void k(int* o) { *o = V; }\n'
    (tmp_path / "k.cu").write_text(src)
    monkeypatch.chdir(tmp_path)
    args = dict(name="k.cu", arch="sm_90", source_dir=str(tmp_path))
    compile_cached(src, **args)
    (tmp_path / "k.cuh").write_text("#define V 2\n")
    cuforge.core.pipeline.reset_memo()
    with pytest.raises(OfflineMissError, match="a header changed since it was built"):
        compile_cached(src, strict=True, **args)


@pytest.mark.skipif(
    "strict" not in inspect.signature(cuforge.compile_file).parameters,
    reason="cuforge.frontend.api.compile_file has no strict= yet (the lead adds it)",
)
def test_compile_file_strict(tmp_path):
    path = tmp_path / "fill.cu"
    path.write_text(SRC)
    kw = dict(arch="sm_90", name_expressions=("fill<4>",), defines={"SCALE": 2})
    with pytest.raises(OfflineMissError):
        cuforge.compile_file(path, strict=True, **kw)
    cuforge.compile_file(path, **kw)
    cuforge.core.pipeline.reset_memo()
    assert cuforge.compile_file(path, strict=True, **kw).source_of_result in ("memory", "disk")
