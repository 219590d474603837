"""cuforge.cute keys CuTe DSL code as its users write it (no GPU: ``CUTE_DSL_ARCH=sm_90a``):
kernel class instances and bound methods as ``fn``, instances as ``Constexpr`` arguments,
option objects (``options=`` and ``compile[...]``), raw numpy arrays, ``enable()`` /
``disable()`` patching ``cutlass.cute.compile`` in place, an export failure served uncached,
and ``verify="trace"`` catching a stale class-instance entry. Real compiles, real exports,
real ``load_module``; ``counters["compile"]`` counts the DSL's own ``cute.compile`` calls.
"""

from __future__ import annotations

import os
import threading

import pytest

from tests.conftest import GPU_VISIBLE, ROOT, SRC

if not GPU_VISIBLE:
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

pytest.importorskip(
    "cutlass.cute", reason="the CuTe DSL is not installed (pip install 'cuforge[cute]')"
)

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402

import cuforge.cute as cc  # noqa: E402
from cuforge.cute import cache as cute_cache  # noqa: E402
from cuforge.cute.cache import counters  # noqa: E402
from tests.child import run_python  # noqa: E402
from tests.cute import classes as C  # noqa: E402
from tests.cute import kernels as K  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh():
    cc.clear_memo()
    yield
    cc.disable()
    cc.clear_memo()


_key = cute_cache.key_fields


def _compiles(call):
    before = counters["compile"]
    result = call()
    return result, counters["compile"] - before


# ---------------------------------------------------------------- keys (no compile)


@pytest.mark.parametrize(
    "change",
    [
        {"tile": (256,)},
        {"dtype": cutlass.Float16},
        {"stages": 2},
        {"flag": True},
        {"scale": 3.0},
        {"tiling": C.Tiling(unroll=2)},  # a nested dataclass
    ],
    ids=lambda c: next(iter(c)),
)
def test_every_codegen_attribute_of_a_kernel_instance_is_keyed(change):
    a, b = K.fake_args()
    base = _key(C.ScaleKernel(), a, b)
    assert base["callable"] == "instance.__call__"
    assert base["function"] == "tests.cute.classes.ScaleKernel.__call__"
    assert _key(C.ScaleKernel(), a, b) == base  # same state: same key
    assert _key(C.ScaleKernel(**change), a, b)["args"] != base["args"]
    # the same rules for a bound method and for an instance passed as a Constexpr
    assert _key(C.ScaleKernel(**change).run, a, b) != _key(C.ScaleKernel().run, a, b)
    assert _key(C.run_with, C.ScaleKernel(**change), a, b) != _key(
        C.run_with, C.ScaleKernel(), a, b
    )


def test_class_attributes_methods_and_slots_are_keyed(monkeypatch):
    a, b = K.fake_args()
    base = _key(C.ScaleKernel(), a, b)
    monkeypatch.setattr(C.ScaleKernel, "EPILOGUE", 1.0)  # a class attribute
    assert _key(C.ScaleKernel(), a, b) != base
    monkeypatch.undo()
    assert _key(C.ScaleKernel(), a, b) == base

    class Derived(C.ScaleKernel):  # a subclass: its bases and methods are keyed
        def helper(self):
            return 1

    assert _key(Derived(), a, b)["args"] != base["args"]
    slotted = _key(C.SlottedKernel(extra=1), a, b)
    assert slotted != _key(C.SlottedKernel(extra=2), a, b)  # a __slots__ value


def test_state_with_no_stable_value_is_served_by_the_ir_key_naming_the_path():
    a, b = K.fake_args()
    k = C.ScaleKernel()
    k.lock = threading.Lock()
    r, n = _compiles(lambda: cc.compile_cached(k, a, b))
    # the pre-trace key is refused, naming the path; the traced module's key serves it
    assert r.source_of_result == "compiled" and r.served_by == "ir" and n == 1
    assert "argument 'self'" in r.reason and ".lock" in r.reason, r.reason
    cfg = C.ScaleKernel()
    cfg.tiling = threading.Lock()
    with pytest.raises(Exception, match=r"tiling"):
        _key(C.run_with, cfg, a, b)


def test_driver_handles_are_keyed_by_type_and_constant_defaults_by_value():
    import cuda.bindings.driver as cuda

    a, b = K.fake_args()
    # a CUcontext / CUdevice in the state (the DSL's HardwareInfo): keyed by type alone
    base = _key(C.StreamKernel(context=0x1000), a, b)
    assert _key(C.StreamKernel(context=0x2000), a, b) == base
    assert _key(C.StreamKernel(context=0x1000, scale=3.0), a, b) != base  # the rest counts
    assert base["handle_defaults"] == "stream=CUstream(0)"

    @cute.jit
    def addressed(a: cute.Tensor, stream: cuda.CUstream = cuda.CUstream(0x7F00)):  # noqa: B008
        pass

    with pytest.raises(cute_cache.UnkeyableArgument, match="default of parameter 'stream'"):
        _key(addressed, a)


def test_option_objects_are_keyed_by_value_in_both_forms():
    a, b = K.fake_args()
    plain = _key(K.scale, a, b)["options"]
    line = _key(K.scale, a, b, options=cute.GenerateLineInfo(True))["options"]
    assert line != plain
    assert line == _key(K.scale, a, b, options=cute.GenerateLineInfo(True))["options"]
    assert line != _key(K.scale, a, b, options=cute.GenerateLineInfo(False))["options"]
    assert _key(K.scale, a, b, options=cute.OptLevel(2)) != _key(
        K.scale, a, b, options=cute.OptLevel(3)
    )
    bracket = cc.compile[cute.GenerateLineInfo(True)]
    assert isinstance(bracket, cute_cache.CachedCompile)
    # a bare boolean option class means Option(True), as in the DSL
    f1, _ = cute_cache._key_fields(K.scale, (a, b), {}, cute.GenerateLineInfo)
    f2, _ = cute_cache._key_fields(K.scale, (a, b), {}, cute.GenerateLineInfo(True))
    f3, _ = cute_cache._key_fields(K.scale, (a, b), {}, (cute.OptLevel(2), cute.EnableAssertions))
    assert f2["options"] != plain and f3["options"] not in (plain, f2["options"])
    assert f1["options"] == f2["options"]


def test_raw_numpy_arrays_are_keyed_as_the_dsl_adapts_them():
    np = pytest.importorskip("numpy")
    f32 = _key(C.scale_raw, np.zeros(128, np.float32), np.zeros(128, np.float32))["args"]
    assert "array:numpy.ndarray" in f32
    # the DSL marks a raw array's layout dynamic: another size is the same kernel ...
    assert _key(C.scale_raw, np.zeros(512, np.float32), np.zeros(64, np.float32))["args"] == f32
    # ... another dtype, rank or a non-unit stride is not
    assert _key(C.scale_raw, np.zeros(128, np.float16), np.zeros(128, np.float32))["args"] != f32
    two_d = np.zeros((4, 32), np.float32)
    assert _key(C.scale_raw, two_d, np.zeros(128, np.float32))["args"] != f32
    strided = np.zeros(256, np.float32)[::2]
    assert _key(C.scale_raw, strided, np.zeros(128, np.float32))["args"] != f32


# ---------------------------------------------------------------- compiles


def test_class_kernel_instance_and_bound_method_round_trip(cache):
    a, b = K.fake_args()
    r, n = _compiles(lambda: cc.compile_cached(C.ScaleKernel(stages=2), a, b, cache=cache))
    assert r.source_of_result == "compiled" and n == 1
    m, n = _compiles(lambda: cc.compile_cached(C.ScaleKernel(stages=2).run, a, b, cache=cache))
    assert m.source_of_result == "compiled" and m.key != r.key and n == 1
    cc.clear_memo(cache)
    again, n = _compiles(lambda: cc.compile_cached(C.ScaleKernel(stages=2), a, b, cache=cache))
    assert again.source_of_result == "memory" and again.key == r.key and n == 0
    other, n = _compiles(lambda: cc.compile_cached(C.ScaleKernel(stages=3), a, b, cache=cache))
    assert other.source_of_result == "compiled" and n == 1
    ce, n = _compiles(lambda: cc.compile_cached(C.run_with, C.ScaleKernel(), a, b, cache=cache))
    assert ce.source_of_result == "compiled" and n == 1


def test_raw_numpy_arrays_compile_export_and_hit(cache):
    np = pytest.importorskip("numpy")
    x, y = np.zeros(128, np.float32), np.zeros(128, np.float32)
    r, n = _compiles(lambda: cc.compile_cached(C.scale_raw, x, y, cache=cache))
    assert r.source_of_result == "compiled" and n == 1, r.reason
    cc.clear_memo(cache)
    big = np.zeros(1024, np.float32)
    hit, n = _compiles(lambda: cc.compile_cached(C.scale_raw, big, big, cache=cache))
    assert hit.hit and n == 0


def test_an_export_failure_serves_the_compiled_function_uncached(cache):
    np = pytest.importorskip("numpy")
    # a user-registered argument adapter: the DSL compiles it, its export_to_c raises
    # DSLRuntimeError (not NotImplementedError)
    x, y = C.Wrapped(np.zeros(128, np.float32)), C.Wrapped(np.zeros(128, np.float32))
    r, n = _compiles(lambda: cc.compile_cached(C.scale_raw, x, y, cache=cache))
    assert r.source_of_result == "uncached" and n == 1
    assert "cannot be exported (DSLRuntimeError" in r.reason and "\x1b" not in r.reason
    assert callable(r.value)
    cc.clear_memo(cache)
    again, n = _compiles(lambda: cc.compile_cached(C.scale_raw, x, y, cache=cache))
    assert again.source_of_result == "uncached" and n == 1  # nothing was stored


def test_a_stream_default_is_exported_and_comes_back_on_a_hit(cache):
    # sgemm.py: cute.compile[cute.GenerateLineInfo](SGemm(), a, b, c, stream=stream) on a
    # class whose __call__ has stream=cuda.CUstream(...) as a default
    import cuda.bindings.driver as cuda

    a, b = K.fake_args()
    compile_ = cc.compile[cute.GenerateLineInfo]
    r, n = _compiles(
        lambda: compile_.cached(C.StreamKernel(), a, b, stream=cuda.CUstream(0), cache=cache)
    )
    assert r.source_of_result == "compiled" and n == 1, r.reason
    # the compiled function keeps its own default
    assert type(r.value.execution_args.signature.parameters["stream"].default) is cuda.CUstream
    cc.clear_memo(cache)
    hit, n = _compiles(lambda: compile_.cached(C.StreamKernel(context=7), a, b, cache=cache))
    assert hit.hit and n == 0 and hit.key == r.key
    default = hit.value.execution_args.signature.parameters["stream"].default
    assert type(default) is cuda.CUstream and int(default) == 0


def test_keep_cubin_in_a_dump_dir_hits_and_writes_the_cubin(cache, tmp_path):
    # the DSL's own HardwareInfo: cute.compile(self._host_function,
    # options=f"--dump-dir={temp_dir} --keep-cubin"), then compiled.artifacts.CUBIN
    import cuda.bindings.driver as cuda
    from cutlass.utils.hardware_info import HardwareInfo

    def probe(context):  # HardwareInfo's state without asking a GPU for it
        hw = object.__new__(HardwareInfo)
        hw.device_id, hw.driver_version = 0, 12080
        hw.device, hw.context = cuda.CUdevice(0), cuda.CUcontext(context)
        return hw

    first, second = tmp_path / "one", tmp_path / "two"
    first.mkdir()
    second.mkdir()
    r, n = _compiles(
        lambda: cc.compile_cached(
            probe(1)._host_function, options=f"--dump-dir={first} --keep-cubin", cache=cache
        )
    )
    assert r.source_of_result == "compiled" and n == 1, r.reason
    cubin = r.value.artifacts.CUBIN
    assert isinstance(cubin, bytes) and cubin
    (name,) = os.listdir(first)
    cc.clear_memo(cache)
    hit, n = _compiles(
        lambda: cc.compile_cached(
            probe(2)._host_function, options=f"--dump-dir={second} --keep-cubin", cache=cache
        )
    )
    assert hit.hit and n == 0 and hit.key == r.key
    assert hit.value.artifacts.CUBIN == cubin and (second / name).read_bytes() == cubin
    with pytest.raises(cute_cache.UnkeyableArgument, match="--keep-sass"):
        _key(probe(1)._host_function, options=f"--dump-dir={first} --keep-sass")


def test_subscripted_compile_and_file_dump_options(cache, tmp_path, monkeypatch):
    a, b = K.fake_args()
    r, n = _compiles(
        lambda: cc.compile[cute.GenerateLineInfo(True)].cached(K.scale, a, b, cache=cache)
    )
    assert r.source_of_result == "compiled" and n == 1
    plain = cc.compile_cached(K.scale, a, b, cache=cache)
    assert plain.key != r.key
    cc.clear_memo(cache)
    again, n = _compiles(
        lambda: cc.compile[cute.GenerateLineInfo(True)].cached(K.scale, a, b, cache=cache)
    )
    assert again.hit and again.key == r.key and n == 0
    monkeypatch.chdir(tmp_path)  # the DSL writes the kept PTX into the working directory
    dump, _ = _compiles(lambda: cc.compile[cute.KeepPTX].cached(K.scale, a, b, cache=cache))
    assert dump.source_of_result == "uncached" and "KeepPTX" in dump.reason


def test_enable_patches_cute_compile_in_place_and_disable_restores(cache):
    original = cute.compile
    a, b = K.fake_args()
    cc.enable(cache)
    assert cc.enabled() and cute.compile is not original
    # plain user code: no recursion, the DSL's own compile runs once, then the store serves
    _, n = _compiles(lambda: cute.compile(C.ScaleKernel(), a, b))
    assert n == 1
    cc.clear_memo(cache)
    _, n = _compiles(lambda: cute.compile(C.ScaleKernel(), a, b))
    assert n == 0
    fn, n = _compiles(lambda: cute.compile[cute.GenerateLineInfo(True)](K.scale, a, b))
    assert n == 1 and callable(fn)
    assert cute_cache.real_compile() is original
    cc.enable(cache)  # enabling twice keeps the DSL's original
    cc.disable()
    assert cute.compile is original and not cc.enabled()


def test_enable_in_a_fresh_process_compiles_nothing(cache):
    code = """
import json, os
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
import cuforge.cute
cuforge.cute.enable()
import cutlass.cute as cute
from cuforge.cute.cache import counters
from tests.cute import classes as C, kernels as K
a, b = K.fake_args()
cute.compile(C.ScaleKernel(stages=2), a, b)
cute.compile(C.ScaleKernel().run, a, b)
cute.compile[cute.OptLevel(2)](K.scale, a, b)
cute.compile[cute.GenerateLineInfo](C.StreamKernel(context=id(a)), a, b)  # as sgemm.py
import cuda.bindings.driver as cuda, tempfile
from cutlass.utils.hardware_info import HardwareInfo
hw = object.__new__(HardwareInfo)  # its state, without a GPU
hw.device_id, hw.driver_version = 0, 12080
hw.device, hw.context = cuda.CUdevice(0), cuda.CUcontext(id(hw))
with tempfile.TemporaryDirectory() as d:
    assert cute.compile(hw._host_function, options=f"--dump-dir={d} --keep-cubin").artifacts.CUBIN
print(json.dumps(counters))
"""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([SRC, ROOT])
    env["CUFORGE_CACHE_DIR"] = str(cache.layout.root)
    cold = run_python(code, env, cwd=ROOT)
    warm = run_python(code, env, cwd=ROOT)
    assert cold["compile"] == 5 and warm["compile"] == 0 and warm["load"] == 5, (cold, warm)


def test_verify_trace_catches_a_stale_class_instance_entry(cache, monkeypatch, caplog):
    from cuforge.cute import spec

    a, b = K.fake_args()
    # plant a stale entry: a keying rule blinded to instance state ...
    monkeypatch.setattr(spec, "_instance", lambda value, where, hook, constexpr=False: "blind")
    built = cc.compile_cached(C.ScaleKernel(scale=2.0), a, b, cache=cache)
    assert built.source_of_result == "compiled"
    cc.clear_memo(cache)
    stale = cc.compile_cached(C.ScaleKernel(scale=5.0), a, b, cache=cache)
    assert stale.key == built.key and stale.source_of_result == "memory"  # served stale
    cc.clear_memo(cache)
    # ... is caught by verify="trace": reported, deleted, rebuilt
    checked = cc.compile_cached(C.ScaleKernel(scale=5.0), a, b, cache=cache, verify="trace")
    assert checked.source_of_result == "compiled"
    assert checked.trace_hash != built.trace_hash
    assert "verify='trace'" in caplog.text


def test_a_tvm_ffi_function_is_exported_and_loaded_as_one(cache):
    # quack (and other libraries) compile with options="--enable-tvm-ffi"
    pytest.importorskip("tvm_ffi", reason="apache-tvm-ffi is not installed")
    a, b = K.fake_args()
    r, n = _compiles(
        lambda: cc.compile_cached(K.scale, a, b, options="--enable-tvm-ffi", cache=cache)
    )
    assert r.source_of_result == "compiled" and n == 1, r.reason
    cc.clear_memo(cache)
    hit, n = _compiles(
        lambda: cc.compile_cached(K.scale, a, b, options="--enable-tvm-ffi", cache=cache)
    )
    assert hit.hit and n == 0
    assert type(hit.value).__module__.startswith("tvm_ffi")
