"""The compile fence (cuforge.fence / CUFORGE_FENCE): a hit never trips it, a build after it
is reported once per key (warn) or refused with CompileAfterFenceError (error), in every
system: kernels, cuforge.jit, blob builds (cached and uncached), Triton."""

from __future__ import annotations

import pytest

import cuforge
from cuforge.base.errors import CompileAfterFenceError, CuforgeError
from cuforge.core import blobcache, fencing
from tests.frontend.test_jit import SCALE

SRC = 'extern "C" __global__ void k(float* x) { x[0] = TILE; }\n'


@pytest.fixture(autouse=True)
def no_fence(isolated_cache):
    fencing._mode = None
    fencing.reset()
    yield
    fencing._mode = None
    fencing.reset()


def _compile(cache, tile):
    return cuforge.compile(SRC, name="k.cu", defines={"TILE": tile}, cache=cache)


def test_warm_replay_trips_nothing_and_a_new_kernel_is_refused(cache):
    _compile(cache, 4)
    builds = cache.counters["compiles"]
    with cuforge.fence("error"):
        _compile(cache, 4)  # call memo
        cache.clear_memos()
        _compile(cache, 4)  # memory tier
        _compile(cache.replace(), 4)  # disk tier, a fresh process's view
        with pytest.raises(CompileAfterFenceError) as info:
            _compile(cache, 8)
    err = info.value
    assert isinstance(err, CuforgeError)
    assert (err.system, err.kind, err.name) == ("kernel", "kernel", "k.cu")
    assert err.key and err.key[:16] in str(err) and "k.cu" in str(err)
    assert "define TILE changed 4 -> 8" in err.reasons
    assert "[[kernel]]" in err.manifest_entry
    assert any("test_fence.py" in frame for frame in err.stack)
    assert cache.counters["compiles"] == builds  # nothing was compiled
    assert fencing.mode() == ""  # the block's fence is down after it
    _compile(cache, 8)  # and builds again


def test_warn_reports_each_key_once_and_builds(cache, capsys):
    fence = cuforge.fence("warn")
    assert fence.mode == "warn" and fencing.mode() == "warn"
    _compile(cache, 16)
    cache.clear_memos()
    cache.delete(_compile(cache, 16).key)  # gone from the cache: the same key builds again
    cache.clear_memos()
    _compile(cache.replace(memory=False), 16)
    err = capsys.readouterr().err
    assert err.count("compile after the fence") == 1
    assert "kernel 'k.cu'" in err and "test_fence.py" in err
    assert len(fencing.reports()) == 1
    cuforge.fence("off")


def test_environment_variable_and_bad_mode(cache, monkeypatch):
    monkeypatch.setenv("CUFORGE_FENCE", "error")
    with pytest.raises(CompileAfterFenceError):
        _compile(cache, 32)
    monkeypatch.setenv("CUFORGE_FENCE", "sometimes")
    with pytest.raises(ValueError, match="CUFORGE_FENCE"):
        fencing.mode()
    with pytest.raises(ValueError, match="fence mode"):
        cuforge.fence("loud")


def test_jit_specialization(cache):
    k = cuforge.jit(SCALE, "scale", arch="sm_80", cache=cache)
    k.specialize(T="float", BLOCK=32)
    with cuforge.fence("error"):
        k2 = cuforge.jit(SCALE, "scale", arch="sm_80", cache=cache.replace())
        k2.specialize(T="float", BLOCK=32)  # a warm replay in a new kernel object
        with pytest.raises(CompileAfterFenceError) as info:
            k2.specialize(T="float", BLOCK=64)
    assert info.value.system == "cuforge.jit"


def test_blob_builds_cached_and_uncached(cache):
    built = []

    def build():
        built.append(1)
        return {"a.bin": b"x"}

    fields = {"arch": "sm_90", "what": "reduce"}
    blobcache.get_or_build("cccl", "reduce", fields, build, dict, cache=cache)
    with cuforge.fence("error"):
        hit = blobcache.get_or_build("cccl", "reduce", fields, build, dict, cache=cache.replace())
        assert hit.source_of_result == "disk"
        with pytest.raises(CompileAfterFenceError) as info:
            blobcache.get_or_build(
                "cccl", "reduce", {**fields, "arch": "sm_100"}, build, dict, cache=cache
            )
        assert (info.value.system, info.value.name) == ("cuda.compute", "reduce")
        assert "arch sm_90 -> sm_100" in info.value.reasons
        with pytest.raises(CompileAfterFenceError):
            blobcache.get_or_build(
                "cute", "f", fields, build, dict, uncacheable="a closure", cache=cache
            )
    assert len(built) == 1


def test_builds_with_caching_off_are_fenced_too(cache, capsys, monkeypatch):
    off = cache.replace(enabled=False)
    built = []

    def build():
        built.append(1)
        return {"a.bin": b"x"}

    with cuforge.fence("error"):
        with pytest.raises(CompileAfterFenceError) as info:
            _compile(off, 4)
        assert (info.value.system, info.value.name) == ("kernel", "k.cu")
        assert info.value.key and "[[kernel]]" in info.value.manifest_entry
        k = cuforge.jit(SCALE, "scale", arch="sm_80", cache=off)
        with pytest.raises(CompileAfterFenceError) as info:
            k.specialize(T="float", BLOCK=32)
        assert info.value.system == "cuforge.jit"
        with pytest.raises(CompileAfterFenceError) as info:
            blobcache.get_or_build("cccl", "reduce", {"arch": "sm_90"}, build, dict, cache=off)
        assert (info.value.system, info.value.name) == ("cuda.compute", "reduce")
        monkeypatch.setenv("CUFORGE_DISABLE_CACHE", "1")  # the default cache, off
        assert not cuforge.default_cache().enabled
        with pytest.raises(CompileAfterFenceError):
            cuforge.compile(SRC, name="k.cu", defines={"TILE": 5})
    assert off.counters["compiles"] == 0 and built == []  # nothing was compiled
    with cuforge.fence("warn"):  # each key once, and it builds every time (nothing cached)
        for _ in range(2):
            _compile(off, 4)
            blobcache.get_or_build("cccl", "reduce", {"arch": "sm_90"}, build, dict, cache=off)
    err = capsys.readouterr().err
    assert err.count("compile after the fence: kernel 'k.cu'") == 1
    assert err.count("compile after the fence: cuda.compute 'reduce'") == 1
    assert off.counters["compiles"] == 2 and len(built) == 2


def test_triton_compile_outside_cuforge(capsys, tmp_path, monkeypatch):
    triton = pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    @triton.jit
    def add_one(x_ptr, n: tl.constexpr):
        offs = tl.arange(0, n)
        tl.store(x_ptr + offs, tl.load(x_ptr + offs) + 1)

    def compile_it(n):
        src = ASTSource(add_one, {"x_ptr": "*fp32", "n": "constexpr"}, constexprs={"n": n})
        return triton.compile(src, target=GPUTarget("cuda", 90, 32))

    try:
        compile_it(16)  # warm
    except Exception as exc:  # noqa: BLE001 - no ptxas / backend here
        pytest.skip(f"Triton cannot compile for sm_90 here: {exc}")
    with cuforge.fence("error"):
        compile_it(16)  # Triton's own cache: a hit
        with pytest.raises(CompileAfterFenceError) as info:
            compile_it(32)
    assert info.value.system == "triton" and info.value.key
    with cuforge.fence("warn"):
        compile_it(64)
        compile_it(64)
    assert capsys.readouterr().err.count("compile after the fence: triton") == 1


def test_cupy_backend_load_miss_is_fenced_and_a_hit_is_not(cache, capsys, monkeypatch):
    """cuforge.cupy's backend (CuPy compiles right after a load that returns None): under
    error the load raises, so CuPy compiles nothing; a hit never trips. CuPy is not
    installed here: only its backend base class stands in (the GPU test drives the real
    CuPy: tests/adapters/cupy)."""
    import sys
    import types

    if "cupy" not in sys.modules:
        base = types.ModuleType("cupy.cuda._compiler_cache")
        base.KernelCacheBackend = type("KernelCacheBackend", (), {})
        for name in ("cupy", "cupy.cuda"):
            monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
        monkeypatch.setitem(sys.modules, "cupy.cuda._compiler_cache", base)
    import cuforge.cupy as cc

    backend = cc.backend(cache)
    backend.save("abc123.cubin", b"\x7fELF cubin", 'extern "C" __global__ void k() {}')
    with cuforge.fence("error"):
        assert backend.load("abc123.cubin") == b"\x7fELF cubin"  # a hit: no trip
        with pytest.raises(CompileAfterFenceError) as info:
            backend.load("new456.cubin")
    err = info.value
    assert err.system == "cupy" and err.name == "new456.cubin"
    assert err.key == cc.entry_key("new456.cubin") and err.key[:16] in str(err)
    assert "Nothing was compiled" in str(err)
    with cuforge.fence("warn"):
        assert backend.load("other.cubin") is None and backend.load("other.cubin") is None
    assert capsys.readouterr().err.count("compile after the fence: cupy 'other.cubin'") == 1
    assert backend.load("another.cubin") is None  # no fence: a plain miss


# a Python C module like the ones Triton builds with the C compiler (cuda_utils, launchers)
_C_MODULE = r"""
#include <Python.h>
static PyObject* answer(PyObject* self, PyObject* args) { return PyLong_FromLong(ANSWER); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, NULL}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "NAME", NULL, -1, methods};
PyMODINIT_FUNC PyInit_NAME(void) { return PyModule_Create(&mod); }
"""


@pytest.fixture
def triton_cc(tmp_path, monkeypatch):
    """Triton's C compiler logged (``$CC_LOG``; Triton's compiler choice is memoized, so it
    is cleared before and after): yields a function that counts the C builds so far."""
    pytest.importorskip("triton")
    from triton.runtime import build

    from tests.adapters.triton.kernels import c_builds, logging_cc

    try:
        cc = logging_cc(tmp_path / "cc")
    except RuntimeError as exc:
        pytest.skip(str(exc))
    monkeypatch.setenv("CC", cc)
    monkeypatch.setenv("CC_LOG", str(tmp_path / "cc.log"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    build._find_compiler.cache_clear()
    yield lambda: c_builds(tmp_path / "cc.log")
    build._find_compiler.cache_clear()


def _c_module(name: str, answer: int):
    from triton.runtime.build import compile_module_from_src

    src = _C_MODULE.replace("NAME", name).replace("ANSWER", str(answer))
    return compile_module_from_src(src, name).answer()


def test_tritons_c_modules_are_fenced_in_its_cache_and_in_cuforges(cache, triton_cc, capsys):
    """Triton's native modules (compile_module_from_src: cuda_utils, the launchers) ask the
    fence before the C compiler runs, whichever cache manager missed (issue 35, item 2)."""
    import cuforge.triton as ct

    assert _c_module("fence_warm", 1) == 1 and triton_cc() == 1
    with cuforge.fence("error"):
        assert _c_module("fence_warm", 1) == 1  # Triton's cache: a hit, no trip
        with pytest.raises(CompileAfterFenceError) as info:
            _c_module("fence_fresh", 2)
        assert triton_cc() == 1  # nothing was compiled
        err = info.value
        assert (err.system, err.kind, err.name) == ("triton", "triton-module", "fence_fresh")
        assert err.key and err.key[:16] in str(err) and "Nothing was compiled" in str(err)
        assert any("test_fence.py" in frame for frame in err.stack)
        assert ct.enable(cache)  # cuforge's cache manager: its native miss is fenced too
        try:
            with pytest.raises(CompileAfterFenceError):
                _c_module("fence_cuforge", 3)
            assert triton_cc() == 1 and "triton:native_built" not in cache.counters
        finally:
            ct.disable()
    with cuforge.fence("warn"):
        assert _c_module("fence_fresh", 2) == 2  # reported, and built
    assert triton_cc() == 2
    assert capsys.readouterr().err.count("compile after the fence: triton 'fence_fresh'") == 1
    assert _c_module("fence_other", 4) == 4  # no fence: a plain build


def test_the_fence_names_a_base_key_cache_show_and_explain_accept(tmp_path):
    """Issue 35 item 12: the fence names direct mode's base key, which `cuforge cache show`
    and `cuforge cache explain` rejected; now it is labeled, and both resolve it to the
    variants of its manifest."""
    import json
    import subprocess
    import sys

    from cuforge.core.caching import Cache
    from tests.child import child_env

    (tmp_path / "h.cuh").write_text("#define TILE 4\n")
    (tmp_path / "k.cu").write_text('#include "h.cuh"\n' + SRC)
    cache = Cache(tmp_path / "c")
    first = cuforge.compile_file(tmp_path / "k.cu", arch="sm_90", cache=cache)
    (tmp_path / "h.cuh").write_text("#define TILE 6\n")  # same base key, a new variant
    second = cuforge.compile_file(tmp_path / "k.cu", arch="sm_90", cache=cache.replace())
    (tmp_path / "h.cuh").write_text("#define TILE 8\n")
    with cuforge.fence("error"), pytest.raises(CompileAfterFenceError) as info:
        cuforge.compile_file(tmp_path / "k.cu", arch="sm_90", cache=cache.replace())
    base = info.value.key
    assert base != first.key
    assert f"base key of direct mode {base}" in str(info.value)

    def cli(*args):
        return subprocess.run(
            [sys.executable, "-m", "cuforge", "cache", *args, "--cache-dir", str(tmp_path / "c")],
            env=child_env(), capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    shown = cli("show", base, "--json")
    assert shown.returncode == 0, shown.stderr
    assert "is a base key of direct mode" in shown.stderr and "2 variants" in shown.stderr
    docs, text, decoder = [], shown.stdout.strip(), json.JSONDecoder()
    while text:  # one JSON document per variant
        doc, end = decoder.raw_decode(text)
        docs.append(doc)
        text = text[end:].strip()
    assert {d["key"] for d in docs} == {first.key, second.key}
    explained = cli("explain", base, "--json")
    assert explained.returncode == 0, explained.stderr
    # the misses recorded with their reasons (the header changed): the base key's variants
    misses = [m["key"] for m in json.loads(explained.stdout)["misses"]]
    assert second.key in misses and set(misses) <= {first.key, second.key}
    assert cli("show", "f" * 64).returncode == 1  # not a key of anything: still an error
