"""The C fast path's argument checks and packing, without a GPU or torch: a stand-in
tensor type and a stand-in ``cuLaunchKernel`` that records what it was given."""

from __future__ import annotations

import ctypes
import os
import shutil
import struct
import subprocess

import pytest

from cuforge.runtime import fastlaunch
from cuforge.runtime.args import Layout
from cuforge.runtime.signature import parse_param

MOCK = r"""
#include <stdint.h>
#include <string.h>
unsigned char last_buf[256];
unsigned last_dims[7];
void* last_func; void* last_stream; int calls; int result;
int cuLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                   unsigned bz, unsigned sh, void* s, void** p, void** e) {
    last_func = f; last_stream = s; calls++;
    unsigned d[7] = {gx, gy, gz, bx, by, bz, sh}; memcpy(last_dims, d, sizeof d);
    memcpy(last_buf, p[0], 256);
    return result;
}
/* torch's C shim, standing in: a "tensor" is a bytes object whose text is an FT */
typedef struct { unsigned long long ptr; int dtype, devtype, devidx; unsigned char contig; } FT;
static FT ft(void* h) { FT f; memcpy(&f, h, sizeof f); return f; }
int shim_calls;
int fake_dtype(void* h, int* o) { shim_calls++; *o = ft(h).dtype; return 0; }
int fake_device_type(void* h, int* o) { *o = ft(h).devtype; return 0; }
int fake_device_index(void* h, int* o) { *o = ft(h).devidx; return 0; }
int fake_is_contiguous(void* h, _Bool* o) { *o = ft(h).contig; return 0; }
int fake_data_ptr(void* h, void** o) { *o = (void*)ft(h).ptr; return ft(h).ptr == 0xBAD; }
int fake_stream(int dev, void** o) { *o = (void*)(uintptr_t)(0x5000 + dev); return dev == 7; }
typedef struct { unsigned g[7]; void* s; void* a; unsigned n; } Config;
int ex_calls;
int cuLaunchKernelEx(const Config* c, void* f, void** p, void** e) {
    ex_calls++;
    return cuLaunchKernel(f, c->g[0], c->g[1], c->g[2], c->g[3], c->g[4], c->g[5], c->g[6], c->s, p, e);
}
"""


@pytest.fixture(scope="module")
def c_compiler() -> str:
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    return cc


@pytest.fixture(scope="module")
def mock(tmp_path_factory, c_compiler):
    """The stand-in driver: ``cuLaunchKernel`` / ``cuLaunchKernelEx`` that record their call."""
    tmp = tmp_path_factory.mktemp("mock")
    (tmp / "mock.c").write_text(MOCK)
    so = tmp / "libmock.so"
    subprocess.run([c_compiler, "-shared", "-fPIC", str(tmp / "mock.c"), "-o", str(so)], check=True)
    return ctypes.CDLL(str(so))


@pytest.fixture(scope="module")
def runtime_built(tmp_path_factory, c_compiler):
    """The launcher module as the runtime build makes it (compiled into a cache dir)."""
    tmp = tmp_path_factory.mktemp("fl")
    mp = pytest.MonkeyPatch()
    mp.setenv("CUFORGE_CACHE_DIR", str(tmp / "cache"))
    try:
        return fastlaunch._build_and_import()
    except (OSError, RuntimeError) as exc:  # no Python headers, a compiler that fails
        pytest.skip(f"the runtime build of the C fast path is unavailable: {exc}")
    finally:
        mp.undo()


@pytest.fixture(scope="module", params=["built", "installed"])
def env(request, mock):
    """(the C launcher module, the stand-in driver): every C-path test runs against the
    runtime build and against the extension installed with cuforge (the same source)."""
    if request.param == "built":
        return request.getfixturevalue("runtime_built"), mock
    module, why_not = fastlaunch._installed()
    if module is None:
        pytest.skip(f"the installed C extension is unavailable: {why_not}")
    return module, mock


class FakeTensor:
    def __init__(self, ptr, dtype="f32", device=0, contiguous=True):
        self.ptr, self._dtype, self.device, self.contiguous = ptr, dtype, device, contiguous

    @property
    def dtype(self):
        return self._dtype

    def data_ptr(self):
        return self.ptr

    def get_device(self):
        return self.device

    def is_contiguous(self):
        return self.contiguous


class FakeMem:
    def __init__(self, ptr, device_id):
        self.ptr, self.device_id = ptr, device_id


class FakeCupy:
    def __init__(self, ptr, dtype="np.f32", device=0, contiguous=True):
        self.data, self.dtype, self._c_contiguous = FakeMem(ptr, device), dtype, contiguous


def _setup(env, decls, check_device=0, tensor_type=FakeTensor):
    """A C state and launcher for ``decls`` over the stand-in driver; ``tensor_type`` is what
    the state takes for torch.Tensor (``bytes``: the stand-in shim's tensors, no dtypes)."""
    module, mock = env
    params = [parse_param(i, d) for i, d in enumerate(decls)]
    layout = Layout(params)
    buf, array, params_addr = layout.new_buffers()
    kinds = [fastlaunch.KINDS["ptr" if p.kind == "pointer" else p.code] for p in params]
    dtypes = ["f32" if p.kind == "pointer" else None for p in params]
    slow_calls, fail_calls = [], []
    state = module.State(
        kinds,
        layout.offsets,
        ctypes.addressof(buf),
        params_addr,
        ctypes.cast(mock.cuLaunchKernel, ctypes.c_void_p).value,
        check_device,
        lambda cfg, args: slow_calls.append(args) or "slow",
        lambda code, cfg, args: fail_calls.append(code) or "failed",
        (buf, array),
    )
    state.set_torch(
        tensor_type,
        dtypes if tensor_type is FakeTensor else [None] * len(params),
        lambda dev: 0xABC0 + dev,
        lambda: 0,
        FakeTensor.__dict__["dtype"],
        FakeTensor.is_contiguous,
        FakeTensor.get_device,
        FakeTensor.data_ptr,
    )
    state.set_cupy(
        FakeCupy,
        ["np.f32" if p.kind == "pointer" else None for p in params],
        lambda: 0xC0FE,
        lambda: 0,
    )
    state.set_device(0, 0x1234, 49152)
    launcher = module.Launcher(state, ("cfg",), 2, 3, 4, 128, 1, 1, 0, 0, None)
    return state, launcher, layout, mock, slow_calls, fail_calls


def _last(mock, layout):
    raw = bytes((ctypes.c_ubyte * 256).in_dll(mock, "last_buf"))
    return raw[: layout.size]


def test_packs_and_launches(env):
    decls = [
        "float* y",
        "const float* x",
        "float a",
        "int n",
        "double d",
        "__half h",
        "unsigned char c",
        "long long q",
        "unsigned long long u",
        "short s",
    ]
    state, launcher, layout, mock, slow, fail = _setup(env, decls)
    calls = ctypes.c_int.in_dll(mock, "calls").value
    args = (
        FakeTensor(0x1000),
        FakeTensor(0x2000),
        2.5,
        -7,
        1e300,
        0.5,
        255,
        -(1 << 62),
        (1 << 64) - 1,
        -300,
    )
    assert launcher(*args) is None
    assert ctypes.c_int.in_dll(mock, "calls").value == calls + 1
    assert not slow and not fail
    expected = layout.struct.pack(
        0x1000, 0x2000, 2.5, -7, 1e300, 0.5, 255, -(1 << 62), (1 << 64) - 1, -300
    )
    assert _last(mock, layout) == expected
    assert list((ctypes.c_uint * 7).in_dll(mock, "last_dims")) == [2, 3, 4, 128, 1, 1, 0]
    assert ctypes.c_void_p.in_dll(mock, "last_stream").value == 0xABC0
    assert ctypes.c_void_p.in_dll(mock, "last_func").value == 0x1234
    # int accepted for a float parameter
    launcher(FakeTensor(1), FakeTensor(2), 3, 4, 5, 6, 7, 8, 9, 10)
    assert _last(mock, layout) == layout.struct.pack(1, 2, 3.0, 4, 5.0, 6.0, 7, 8, 9, 10)
    assert not slow


@pytest.mark.parametrize(
    "bad",
    [
        (FakeTensor(0x1000, dtype="f16"), FakeTensor(0x2000), 1.0, 1),  # dtype
        (FakeTensor(0x1000, contiguous=False), FakeTensor(0x2000), 1.0, 1),  # strides
        (FakeTensor(0x1000, device=-1), FakeTensor(0x2000), 1.0, 1),  # CPU
        (FakeTensor(0x1000), FakeTensor(0x2000, device=1), 1.0, 1),  # mixed devices
        (FakeTensor(0x1000, device=1), FakeTensor(0x2000, device=1), 1.0, 1),  # not loaded there
        (0x1000, FakeTensor(0x2000), 1.0, 1),  # int for a pointer
        (FakeTensor(0x1000), FakeTensor(0x2000), 1e39, 1),  # float overflow
        (FakeTensor(0x1000), FakeTensor(0x2000), "1", 1),  # str
        (FakeTensor(0x1000), FakeTensor(0x2000), 1.0, 1 << 31),  # int overflow
        (FakeTensor(0x1000), FakeTensor(0x2000), 1.0, 1.0),  # float for int
        (FakeTensor(0x1000), FakeTensor(0x2000), 1.0, True),  # bool: not exactly int
        (FakeTensor(0x1000), FakeTensor(0x2000), 1.0),  # count
    ],
)
def test_anything_unusual_goes_to_the_slow_path(env, bad):
    state, launcher, layout, mock, slow, fail = _setup(
        env, ["float* y", "const float* x", "float a", "int n"]
    )
    calls = ctypes.c_int.in_dll(mock, "calls").value
    assert launcher(*bad) == "slow"
    assert slow == [tuple(bad)]
    assert ctypes.c_int.in_dll(mock, "calls").value == calls


def test_driver_error_goes_to_fail_and_disable(env):
    state, launcher, layout, mock, slow, fail = _setup(env, ["float* y", "int n"])
    ctypes.c_int.in_dll(mock, "result").value = 700
    try:
        assert launcher(FakeTensor(8), 1) == "failed"
    finally:
        ctypes.c_int.in_dll(mock, "result").value = 0
    assert fail == [700]
    state.disable()
    assert launcher(FakeTensor(8), 1) == "slow"
    # explicit stream and shared-memory limit
    module = env[0]
    state2, _, _, _, slow2, _ = _setup(env, ["float* y", "int n"])
    big = module.Launcher(state2, ("cfg",), 1, 1, 1, 32, 1, 1, 65536, 65536, None)
    assert big(FakeTensor(8), 1) == "slow"
    state2.set_device(0, 0x1234, 65536)
    assert big(FakeTensor(8), 1) is None
    explicit = module.Launcher(state2, ("cfg",), 1, 1, 1, 32, 1, 1, 0, 0, 0x7777)
    explicit(FakeTensor(8), 1)
    assert ctypes.c_void_p.in_dll(mock, "last_stream").value == 0x7777
    assert struct.unpack_from("<Q", _last(mock, Layout([parse_param(0, "float* y")])))[0] == 8


def test_cupy_arrays(env):
    state, launcher, layout, mock, slow, fail = _setup(
        env, ["float* y", "const float* x", "float a", "int n"]
    )
    assert launcher(FakeCupy(0x3000), FakeCupy(0x4000), 1.5, 9) is None
    assert not slow
    assert _last(mock, layout) == layout.struct.pack(0x3000, 0x4000, 1.5, 9)
    assert ctypes.c_void_p.in_dll(mock, "last_stream").value == 0xC0FE
    for bad in (
        (FakeCupy(0x3000, dtype="np.f16"), FakeCupy(0x4000), 1.5, 9),
        (FakeCupy(0x3000, contiguous=False), FakeCupy(0x4000), 1.5, 9),
        (FakeCupy(0x3000), FakeCupy(0x4000, device=1), 1.5, 9),
        (FakeCupy(0x3000), FakeTensor(0x4000), 1.5, 9),  # torch and CuPy mixed
    ):
        assert launcher(*bad) == "slow"
    assert len(slow) == 4


def test_cycles_through_the_c_objects_are_collected(env):
    import gc
    import weakref

    module, mock = env

    class Owner:  # stands in for Kernel: owner -> launcher -> state -> owner.slow
        def slow(self, cfg, args):
            return "slow"

        def fail(self, code, cfg, args):
            return "failed"

    owner = Owner()
    layout = Layout([parse_param(0, "float* y")])
    buf, array, addr = layout.new_buffers()
    state = module.State(
        [0],
        layout.offsets,
        ctypes.addressof(buf),
        addr,
        ctypes.cast(mock.cuLaunchKernel, ctypes.c_void_p).value,
        0,
        owner.slow,
        owner.fail,
        (buf, array),
    )
    owner.launcher = module.Launcher(state, ("cfg",), 1, 1, 1, 1, 1, 1, 0, 0, None)
    ref = weakref.ref(owner)
    del owner, state
    gc.collect()
    assert ref() is None


def test_the_c_launcher_has_one_entry_cuLaunchKernel(env):
    state, launcher, layout, mock, slow, fail = _setup(
        env, ["float* y", "const float* x", "float a", "int n"]
    )
    before = ctypes.c_int.in_dll(mock, "ex_calls").value
    calls = ctypes.c_int.in_dll(mock, "calls").value
    assert launcher(FakeTensor(0x1000), FakeTensor(0x2000), 2.0, 5) is None
    assert ctypes.c_int.in_dll(mock, "ex_calls").value == before  # never cuLaunchKernelEx
    assert ctypes.c_int.in_dll(mock, "calls").value == calls + 1
    assert _last(mock, layout) == layout.struct.pack(0x1000, 0x2000, 2.0, 5)
    assert list((ctypes.c_uint * 7).in_dll(mock, "last_dims")) == [2, 3, 4, 128, 1, 1, 0]
    assert ctypes.c_void_p.in_dll(mock, "last_stream").value == 0xABC0


def test_launch_ex_takes_the_prebuilt_config(env):
    module, _ = env
    state, launcher, layout, mock, slow, fail = _setup(
        env, ["float* y", "const float* x", "float a", "int n"]
    )
    assert state.launch_entry() == "cuLaunchKernel"
    state.set_launch_ex(ctypes.cast(mock.cuLaunchKernelEx, ctypes.c_void_p).value)
    assert state.launch_entry() == "cuLaunchKernelEx"
    ex = ctypes.c_int.in_dll(mock, "ex_calls").value
    calls = ctypes.c_int.in_dll(mock, "calls").value
    assert launcher(FakeTensor(0x1000), FakeTensor(0x2000), 2.0, 5) is None
    assert ctypes.c_int.in_dll(mock, "ex_calls").value == ex + 1
    assert ctypes.c_int.in_dll(mock, "calls").value == calls + 1  # the stand-in Ex forwards
    assert _last(mock, layout) == layout.struct.pack(0x1000, 0x2000, 2.0, 5)
    assert list((ctypes.c_uint * 7).in_dll(mock, "last_dims")) == [2, 3, 4, 128, 1, 1, 0]
    assert ctypes.c_void_p.in_dll(mock, "last_stream").value == 0xABC0
    # a launcher with its own stream and shared memory: the config carries both
    fixed = module.Launcher(state, ("cfg",), 5, 1, 1, 64, 2, 1, 256, 256, 0x7700)
    assert fixed(FakeTensor(0x3000), FakeTensor(0x4000), -1.5, 7) is None
    assert ctypes.c_int.in_dll(mock, "ex_calls").value == ex + 2
    assert list((ctypes.c_uint * 7).in_dll(mock, "last_dims")) == [5, 1, 1, 64, 2, 1, 256]
    assert ctypes.c_void_p.in_dll(mock, "last_stream").value == 0x7700
    assert _last(mock, layout) == layout.struct.pack(0x3000, 0x4000, -1.5, 7)
    # the checks stay: a wrong argument goes to the slow path, nothing is launched
    assert launcher(FakeTensor(0x1000, dtype="f16"), FakeTensor(0x2000), 2.0, 5) == "slow"
    assert ctypes.c_int.in_dll(mock, "ex_calls").value == ex + 2
    # a driver error goes to fail, as with cuLaunchKernel
    ctypes.c_int.in_dll(mock, "result").value = 700
    try:
        assert launcher(FakeTensor(0x1000), FakeTensor(0x2000), 2.0, 5) == "failed"
    finally:
        ctypes.c_int.in_dll(mock, "result").value = 0
    assert fail == [700]
    assert ctypes.c_int.in_dll(mock, "ex_calls").value == ex + 3
    state.set_launch_ex(0)  # back to cuLaunchKernel
    assert launcher(FakeTensor(0x1000), FakeTensor(0x2000), 2.0, 5) is None
    assert ctypes.c_int.in_dll(mock, "ex_calls").value == ex + 3
    assert ctypes.c_int.in_dll(mock, "calls").value == calls + 4


# -- torch tensors read through torch's C shim ----------------------------------------------

CUDA = 1  # the stand-in shim's CUDA device type
F32 = 6  # ... and float32 code


def shim_tensor(ptr, dtype=F32, devtype=CUDA, devidx=0, contig=True) -> bytes:
    """A stand-in tensor for the stand-in shim: the shim reads this struct at the offset
    where a bytes object keeps its text."""
    return struct.pack("<QiiiB3x", ptr, dtype, devtype, devidx, contig)


def _setup_abi(env, decls):
    module, mock = env
    state, _, layout, mock, slow, fail = _setup(env, decls, tensor_type=bytes)
    names = ("dtype", "device_type", "device_index", "is_contiguous", "data_ptr")
    fns = tuple(ctypes.cast(getattr(mock, f"fake_{n}"), ctypes.c_void_p).value for n in names)
    codes = [F32 if "float*" in d else -1 for d in decls]  # void*: any dtype
    state.set_torch_abi(bytes.__basicsize__ - 1, fns, CUDA, codes)
    launcher = module.Launcher(state, ("cfg",), 2, 3, 4, 128, 1, 1, 0, 0, None)
    return state, launcher, layout, mock, slow, fns


def test_torch_shim_reads_and_packs(env):
    state, launcher, layout, mock, slow, fns = _setup_abi(
        env, ["float* y", "const float* x", "float a", "int n", "void* raw"]
    )
    shim = ctypes.c_int.in_dll(mock, "shim_calls").value
    calls = ctypes.c_int.in_dll(mock, "calls").value
    args = (shim_tensor(0x1000), shim_tensor(0x2000), 2.5, -7, shim_tensor(0x3000, dtype=15))
    assert launcher(*args) is None
    assert not slow
    assert ctypes.c_int.in_dll(mock, "calls").value == calls + 1
    assert ctypes.c_int.in_dll(mock, "shim_calls").value == shim + 3  # every tensor via the shim
    assert _last(mock, layout) == layout.struct.pack(0x1000, 0x2000, 2.5, -7, 0x3000)
    assert ctypes.c_void_p.in_dll(mock, "last_stream").value == 0xABC0
    assert ctypes.c_void_p.in_dll(mock, "last_func").value == 0x1234
    ok = shim_tensor(0x2000)
    for bad in (
        shim_tensor(0x1000, dtype=5),  # another dtype
        shim_tensor(0x1000, devtype=0),  # CPU
        shim_tensor(0x1000, devidx=1),  # another device than the others
        shim_tensor(0x1000, devidx=-1),
        shim_tensor(0x1000, contig=False),
        shim_tensor(0xBAD),  # the shim reports an error
    ):
        assert launcher(bad, ok, 1.0, 1, ok) == "slow"
    assert len(slow) == 6
    assert ctypes.c_int.in_dll(mock, "calls").value == calls + 1
    # torch's current stream through the shim too (an error there: the general path)
    state.set_torch_stream(ctypes.cast(mock.fake_stream, ctypes.c_void_p).value)
    state.set_device(7, 0x7777, 49152)
    assert launcher(*args) is None
    assert ctypes.c_void_p.in_dll(mock, "last_stream").value == 0x5000
    assert launcher(*(shim_tensor(1, devidx=7) if isinstance(a, bytes) else a for a in args)) == (
        "slow"
    )
    assert len(slow) == 7
    state.set_torch_stream(0)
    assert launcher(*args) is None
    assert ctypes.c_void_p.in_dll(mock, "last_stream").value == 0xABC0


def test_torch_shim_probe_checks_the_offset(env):
    module, mock = env
    *_, fns = _setup_abi(env, ["float* y"])
    off = bytes.__basicsize__ - 1
    assert module.torch_abi_probe(off, fns, shim_tensor(0x42, devidx=3, contig=False)) == (
        F32,
        CUDA,
        3,
        False,
        0x42,
    )
    with pytest.raises(ValueError, match="outside the object"):
        module.torch_abi_probe(off, fns, object())
    with pytest.raises(ValueError, match="address is 0"):
        module.torch_abi_probe(off, (0, *fns[1:]), shim_tensor(1))


def test_real_torch_through_the_shim(env):
    """With the real torch: the shim reads what the methods say (torch_abi checks that
    before using it), and a real tensor's bytes land in the argument buffer."""
    torch = pytest.importorskip("torch")
    from cuforge.runtime import fastpath

    module, mock = env
    fastpath._abi.clear()
    abi = fastpath.torch_abi(module, torch)
    assert abi is not None, fastpath._abi.get("why")
    offset, fns, cuda, dtype_code = abi
    t = torch.arange(10, dtype=torch.float32)
    assert module.torch_abi_probe(offset, fns, t[2:])[3:] == (True, t[2:].data_ptr())
    assert module.torch_abi_probe(offset, fns, t.reshape(2, 5).t())[3] is False
    assert dtype_code(torch.float32) != dtype_code(torch.float16)
    # a CPU tensor is not for a kernel: the launcher sends it to the general path
    state, _, layout, mock, slow, _ = _setup(env, ["float* y", "int n"])
    state.set_torch(
        torch.Tensor,
        [torch.float32, None],
        lambda dev: 0,
        lambda: 0,
        fastpath._class_attr(torch.Tensor, "dtype"),
        torch.Tensor.is_contiguous,
        torch.Tensor.get_device,
        torch.Tensor.data_ptr,
    )
    state.set_torch_abi(offset, fns, cuda, [dtype_code(torch.float32), -1])
    launcher = module.Launcher(state, ("cfg",), 1, 1, 1, 32, 1, 1, 0, 0, None)
    assert launcher(t, 3) == "slow"
    # ... unless the "CUDA" device type is the CPU's and the device index matches: then
    # the real data pointer is what gets packed (device -1 never launches: checked too)
    assert slow == [(t, 3)]


def test_subscript_hits_the_cache_in_c(env):
    module, _ = env
    misses = []

    class K:
        def __init__(self):
            self._configs = {}

        def _getitem(self, key):
            misses.append(key)
            launcher = self._configs[key] = ("launcher", key)
            return launcher

    K.__getitem__ = module.Subscript("_configs", K._getitem)
    k = K()
    first = k[1, 32]
    assert first == ("launcher", (1, 32)) and misses == [(1, 32)]
    assert k[1, 32] is first and misses == [(1, 32)]  # a hit: not the Python method
    with pytest.raises(TypeError):  # unhashable: the slow method runs (and raises here)
        k[[1], 32]
    assert misses[-1] == ([1], 32)
    assert k.__getitem__((1, 32)) is first  # bound like a method
    assert isinstance(K.__dict__["__getitem__"], module.Subscript)
    del k._configs
    with pytest.raises(AttributeError):  # no dict: the slow method (which needs one)
        k[1, 32]
    assert misses[-1] == (1, 32) and len(misses) == 3


# -- the C source, the build's name, and what is trusted enough to import ---------------------

PLANTED = r"""
#include <Python.h>
#include <stdio.h>
static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "_cuforge_fastlaunch", NULL, -1, NULL};
PyMODINIT_FUNC PyInit__cuforge_fastlaunch(void) {
    FILE* f = fopen(MARKER, "w");  /* proof that this library's code ran */
    if (f) { fputs("planted code ran", f); fclose(f); }
    PyObject* m = PyModule_Create(&def);
    if (m) PyModule_AddIntConstant(m, "PLANTED", 1);
    return m;
}
"""

# the runtime build's process: the installed extension is skipped (never touched either),
# so these tests exercise the build into the cache dir whether or not it is installed
CHILD = """
import json, os, sys
from cuforge.runtime import fastlaunch
fastlaunch.use_installed = False
m = fastlaunch.load()
print(json.dumps({
    "file": getattr(m, "__file__", None),
    "planted": hasattr(m, "PLANTED"),
    "has_launcher": hasattr(m, "Launcher"),
    "error": fastlaunch.error(),
    "notice": fastlaunch.notice(),
    "expected": fastlaunch.library_name(fastlaunch.source(), fastlaunch.compiler()),
}))
"""


def _child(cache_dir, verbose: bool = False, umask: int = 0o022) -> tuple[dict, str]:
    """Load the C launcher in a fresh process with ``cache_dir``; (its report, its stderr)."""
    import json
    import sys

    from tests.conftest import child_env

    env = child_env(CUFORGE_CACHE_DIR=str(cache_dir))
    env.pop("CUFORGE_FAST_LAUNCH", None)
    if verbose:
        env["CUFORGE_VERBOSE"] = "1"
    done = subprocess.run(
        [sys.executable, "-c", CHILD],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=lambda: os.umask(umask),
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


@pytest.fixture
def planted(tmp_path, runtime_built, c_compiler):
    """A library that would run our code if imported: (its path, the marker it writes)."""
    import sysconfig

    cc = c_compiler
    marker = tmp_path / "planted-code-ran"
    (tmp_path / "planted.c").write_text(PLANTED)
    so = tmp_path / "planted.so"
    include = sysconfig.get_paths()["include"]
    subprocess.run(
        [
            cc,
            "-shared",
            "-fPIC",
            f"-I{include}",
            f'-DMARKER="{marker}"',
            str(tmp_path / "planted.c"),
        ]
        + ["-o", str(so)],
        check=True,
    )
    return so, marker


def test_c_source_is_a_package_file_and_names_the_build():
    from importlib import resources

    path = resources.files("cuforge.runtime").joinpath("_launcher.c")
    assert path.is_file()
    text = path.read_bytes()
    assert b"PyInit__cuforge_fastlaunch" in text
    assert fastlaunch.source() == text
    cc = ["/usr/bin/cc"]
    name = fastlaunch.library_name(text, cc)
    assert name == fastlaunch.library_name(text, cc)  # stable
    assert name.startswith("_cuforge_fastlaunch-")
    # the text, the compiler and the Python ABI each change the name
    assert fastlaunch.library_name(text + b"\n/* edited */\n", cc) != name
    assert fastlaunch.library_name(text, ["/usr/bin/clang"]) != name
    assert fastlaunch.library_name(text, cc, ".cpython-399-x86_64-linux-gnu.so") != name


def test_built_library_is_named_by_the_hash(tmp_path, runtime_built):
    # a umask that lets the group write (common: user private groups) must not make the
    # cache dir or the library untrusted
    report, _ = _child(tmp_path / "cache", umask=0o002)
    assert report["notice"] is None
    for d in (tmp_path / "cache", tmp_path / "cache" / "runtime"):
        assert os.stat(d).st_mode & 0o777 == 0o700
    assert report["error"] is None and report["has_launcher"]
    runtime = tmp_path / "cache" / "runtime"
    assert report["file"] == str(runtime / report["expected"])
    st = os.lstat(report["file"])
    assert st.st_mode & 0o022 == 0
    assert sorted(os.listdir(runtime)) == [report["expected"]]  # no temp file left behind
    # a second process imports the same file, building nothing
    mtime = st.st_mtime_ns
    again, _ = _child(tmp_path / "cache")
    assert again["file"] == report["file"] and os.lstat(report["file"]).st_mtime_ns == mtime


@pytest.mark.parametrize("how", ["symlink", "group-writable file"])
def test_planted_library_is_not_imported(tmp_path, planted, how):
    so, marker = planted
    cache = tmp_path / "cache"
    first, _ = _child(cache)
    target = first["file"]
    os.unlink(target)
    if how == "symlink":
        os.symlink(so, target)
    else:
        shutil.copy(so, target)
        os.chmod(target, 0o775)
    report, stderr = _child(cache, verbose=True)
    assert not marker.exists(), "the planted library's code ran"
    assert not report["planted"] and report["has_launcher"]
    assert report["file"] == target
    assert not os.path.islink(target) and os.lstat(target).st_mode & 0o022 == 0  # rebuilt
    expected = "symlink" if how == "symlink" else "writable by group or others"
    assert expected in report["notice"]
    assert stderr.count(expected) == 1


def test_group_writable_runtime_dir_is_not_used(tmp_path, planted):
    so, marker = planted
    cache = tmp_path / "cache"
    first, _ = _child(cache)
    runtime = cache / "runtime"
    # plant a library under the exact name the hash gives; a group member could have
    os.unlink(first["file"])
    shutil.copy(so, first["file"])
    os.chmod(first["file"], 0o700)
    os.chmod(runtime, 0o770)
    report, stderr = _child(cache, verbose=True)
    assert not marker.exists(), "the planted library's code ran"
    assert not report["planted"] and report["has_launcher"] and report["error"] is None
    assert not report["file"].startswith(str(runtime))  # built privately instead
    assert not os.path.exists(report["file"])  # ... and that temp dir is gone again
    assert os.listdir(runtime) == [first["expected"]]  # nothing was written there
    assert (
        "writable by group" in report["notice"] and "chmod -R go-w" in report["notice"]
    )  # the whole tree
    assert stderr.count("writable by group") == 1


def test_untrusted_cache_dir_is_not_used(tmp_path, runtime_built):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    os.chmod(cache, 0o707)  # writable by others
    report, _ = _child(cache)
    assert report["error"] is None and report["has_launcher"]
    assert not os.path.exists(cache / "runtime")
    assert "writable by others" in report["notice"]


# -- the generated Python fast path (used when the C launcher cannot be built) ---------------


class FakeTorch:
    """Just what the Python fast path asks of torch."""

    Tensor = FakeTensor
    float32 = "f32"  # FakeTensor's dtype: the fast path checks it by identity

    class _C:
        @staticmethod
        def _cuda_getDevice():
            return 0

        @staticmethod
        def _cuda_getCurrentRawStream(dev):
            return 0xABC0 + dev


@pytest.mark.parametrize("use_ex", [True, False], ids=["cuLaunchKernelEx", "cuLaunchKernel"])
def test_python_fast_path(mock, use_ex):
    import threading
    import types

    from cuforge.runtime import fastpath

    params = [
        parse_param(i, d) for i, d in enumerate(["float* y", "const float* x", "float a", "int n"])
    ]
    layout = Layout(params)
    buf, array, params_addr = layout.new_buffers()
    devices = [fastpath.NOT_LOADED] * fastpath.MAX_DEVICES
    devices[0] = fastpath.DeviceState(0x1234, 49152, 49152)
    slow_calls, fail_calls = [], []
    d = types.SimpleNamespace(launch=mock.cuLaunchKernel, launch_ex=mock.cuLaunchKernelEx)
    fast, source = fastpath.python_launcher(
        "saxpy",
        params,
        layout,
        buf,
        params_addr,
        devices,
        [threading.get_ident()],
        threading.get_ident,
        lambda cfg, args: slow_calls.append(args) or "slow",
        lambda code, cfg, args: fail_calls.append((code, cfg)) or "failed",
        FakeTorch,
        d,
        use_ex,
        False,
    )
    assert "cfg.check" in source
    cfg = fastpath.Config((2, 3, 4), (128, 1, 1), 0, fastpath.DEFAULT, False, None)
    calls = ctypes.c_int.in_dll(mock, "calls").value
    ex_calls = ctypes.c_int.in_dll(mock, "ex_calls").value
    y, x = FakeTensor(0x1000), FakeTensor(0x2000)
    assert fast(cfg, y, x, 2.5, 7) is None
    assert not slow_calls and not fail_calls
    assert ctypes.c_int.in_dll(mock, "calls").value == calls + 1
    assert ctypes.c_int.in_dll(mock, "ex_calls").value == ex_calls + (1 if use_ex else 0)
    assert _last(mock, layout) == layout.struct.pack(0x1000, 0x2000, 2.5, 7)
    assert list((ctypes.c_uint * 7).in_dll(mock, "last_dims")) == [2, 3, 4, 128, 1, 1, 0]
    assert ctypes.c_void_p.in_dll(mock, "last_stream").value == 0xABC0
    assert ctypes.c_void_p.in_dll(mock, "last_func").value == 0x1234
    # an explicit stream
    explicit = fastpath.Config((1, 1, 1), (32, 1, 1), 0, 0x7777, False, None)
    assert fast(explicit, y, x, 1.0, 1) is None
    assert ctypes.c_void_p.in_dll(mock, "last_stream").value == 0x7777
    # what the fast path must not take goes to the slow path, with the same cfg and args
    cooperative = fastpath.Config((1, 1, 1), (32, 1, 1), 0, fastpath.DEFAULT, True, None)
    big = fastpath.Config((1, 1, 1), (32, 1, 1), 65536, fastpath.DEFAULT, False, None)
    for c, args in [
        (cfg, (FakeTensor(1, dtype="f16"), x, 1.0, 1)),  # dtype
        (cfg, (FakeTensor(1, contiguous=False), x, 1.0, 1)),  # strides
        (cfg, (FakeTensor(1, device=1), FakeTensor(2, device=1), 1.0, 1)),  # not loaded there
        (cfg, (FakeTensor(1, device=-1), FakeTensor(2, device=-1), 1.0, 1)),  # CPU
        (cfg, (y, x, "1", 1)),  # str
        (cfg, (y, x, 1.0)),  # count
        (cooperative, (y, x, 1.0, 1)),
        (big, (y, x, 1.0, 1)),  # more shared memory than allowed so far
    ]:
        before = ctypes.c_int.in_dll(mock, "calls").value
        assert fast(c, *args) == "slow"
        assert slow_calls[-1] == args
        assert ctypes.c_int.in_dll(mock, "calls").value == before
    devices[0].shm_fast = 65536  # what _allow_shared_memory does
    assert fast(big, y, x, 1.0, 1) is None
    # another thread than the loading one: slow path
    out = []
    t = threading.Thread(target=lambda: out.append(fast(cfg, y, x, 1.0, 1)))
    t.start()
    t.join()
    assert out == ["slow"]
    # a driver error goes to fail()
    ctypes.c_int.in_dll(mock, "result").value = 700
    try:
        assert fast(cfg, y, x, 1.0, 1) == "failed"
    finally:
        ctypes.c_int.in_dll(mock, "result").value = 0
    assert fail_calls == [(700, cfg)]


def test_settings_choose_the_launch_path(tmp_path):
    """CUFORGE_FAST_LAUNCH is read through cuforge.base.config."""
    from tests.conftest import child_env, run_python

    code = """
    import json
    from cuforge.runtime import fastlaunch
    print(json.dumps({"module": fastlaunch.load() is not None, "error": fastlaunch.error()}))
    """
    cache = tmp_path / "cache"
    env = child_env(CUFORGE_CACHE_DIR=str(cache), CUFORGE_FAST_LAUNCH=" Python ")
    report = run_python(code, env)
    assert report == {"module": False, "error": "CUFORGE_FAST_LAUNCH=python"}
    assert not cache.exists()  # nothing was built


# -- which path is in use: installed extension, else runtime build, else Python ---------------

STATUS = """
import hashlib, json, logging, sys
from cuforge.runtime import fastlaunch
if {log}:
    logging.basicConfig(level=logging.INFO, format="LOG %(name)s %(levelname)s %(message)s")
fastlaunch.use_installed = {use_installed}
m = fastlaunch.load()
path, detail = fastlaunch.status()
print(json.dumps({{
    "path": path, "detail": detail, "error": fastlaunch.error(),
    "file": getattr(m, "__file__", None), "has_launcher": hasattr(m, "Launcher"),
    "built_from": getattr(m, "SOURCE_SHA256", None),
    "source_sha256": hashlib.sha256(fastlaunch.source()).hexdigest(),
    "package": fastlaunch.__file__,
}}))
"""


def _status(
    cache_dir, *, use_installed=True, verbose=False, log=False, pythonpath=None, **env_vars
) -> tuple[dict, str]:
    """``fastlaunch.status()`` and more from a fresh process; (its report, its stderr)."""
    import json
    import sys

    from tests.conftest import child_env

    env = child_env(CUFORGE_CACHE_DIR=str(cache_dir))
    for name in ("CUFORGE_FAST_LAUNCH", "CUFORGE_VERBOSE", "CC"):
        env.pop(name, None)
    env.update(env_vars)
    if verbose:
        env["CUFORGE_VERBOSE"] = "1"
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    code = STATUS.format(use_installed=use_installed, log=log)
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


@pytest.fixture
def installed():
    """The installed extension's file, as a child process with the tests' environment finds
    it; skips when there is none (cuforge installed without a C compiler, or not reinstalled
    since setup.py gained the extension)."""
    from tests.conftest import child_env, run_python

    code = """
    import json
    from cuforge.runtime import fastlaunch
    module, why_not = fastlaunch._installed()
    print(json.dumps({"file": getattr(module, "__file__", None), "why_not": why_not}))
    """
    report = run_python(code, child_env())
    if report["file"] is None:
        pytest.skip(f"the installed C extension is unavailable: {report['why_not']}")
    return report["file"]


def test_installed_extension_comes_first_and_is_quiet(tmp_path, installed):
    import hashlib

    cache = tmp_path / "cache"
    report, stderr = _status(cache)
    assert report["path"] == "installed" and report["has_launcher"]
    assert report["file"] == installed == report["detail"]
    assert report["error"] is None
    # built from exactly the C source the runtime build compiles, and beside it
    assert report["built_from"] == report["source_sha256"]
    assert report["source_sha256"] == hashlib.sha256(fastlaunch.source()).hexdigest()
    assert os.path.dirname(installed) == os.path.dirname(report["package"])
    assert stderr == ""  # nothing printed on normal use
    assert not (cache / "runtime").exists()  # nothing built
    # said once: on stderr when verbose, as an INFO record when logging is set up
    _, stderr = _status(cache, verbose=True)
    assert stderr.count("C launch path") == 1 and "the installed extension" in stderr
    _, stderr = _status(cache, log=True)
    assert stderr.count("LOG cuforge INFO C launch path: the installed extension") == 1
    assert stderr.count("\n") == 1


@pytest.mark.parametrize("how", ["missing", "stale"])
def test_runtime_build_when_the_installed_extension_is_missing_or_stale(tmp_path, installed, how):
    """A copy of the package without the extension, or with an edited ``_launcher.c``:
    the runtime build is used, from the source beside the module, and status says why."""
    copy = tmp_path / "site"
    shutil.copytree(
        os.path.dirname(os.path.dirname(fastlaunch.__file__)),
        copy / "cuforge",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    runtime_pkg = copy / "cuforge" / "runtime"
    if how == "missing":
        os.unlink(runtime_pkg / os.path.basename(installed))
        expected_why = "not installed"
    else:
        with open(runtime_pkg / "_launcher.c", "a") as f:
            f.write("\n/* edited after the install */\n")
        expected_why = "was built from another _launcher.c"
    cache = tmp_path / "cache"
    report, stderr = _status(cache, verbose=True, pythonpath=copy)
    assert report["package"].startswith(str(copy))
    assert report["path"] == "built" and report["has_launcher"] and report["error"] is None
    assert report["built_from"] is None  # the runtime build, not the installed module
    assert report["file"].startswith(str(cache / "runtime"))
    assert expected_why in report["detail"] and report["file"] in report["detail"]
    assert os.path.basename(report["file"]) == fastlaunch.library_name(
        (runtime_pkg / "_launcher.c").read_bytes(), fastlaunch.compiler()
    )
    lines = [line for line in stderr.splitlines() if "C launch path:" in line]
    assert len(lines) == 1 and "built at run time" in lines[0] and expected_why in lines[0]


def test_python_path_when_nothing_can_be_built(tmp_path, c_compiler):
    cache = tmp_path / "cache"
    missing = str(tmp_path / "no-such-cc")
    report, stderr = _status(cache, use_installed=False, verbose=True, CC=missing)
    assert report["path"] == "python" and report["file"] is None
    assert missing in report["error"]
    assert report["detail"].startswith("installed extension: skipped")
    assert "runtime build: " + report["error"] in report["detail"]
    assert stderr.count("using the Python fast path") == 1
    assert stderr.count("cuforge:") == 1
    # quiet without CUFORGE_VERBOSE
    report, stderr = _status(cache, use_installed=False, CC=missing)
    assert report["path"] == "python" and stderr == ""
    # CUFORGE_FAST_LAUNCH=python: neither C path is tried
    report, _ = _status(tmp_path / "other", CUFORGE_FAST_LAUNCH="python")
    assert (report["path"], report["detail"]) == ("python", "CUFORGE_FAST_LAUNCH=python")
    assert not (tmp_path / "other").exists()
