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
typedef struct { unsigned g[7]; void* s; void* a; unsigned n; } Config;
int ex_calls;
int cuLaunchKernelEx(const Config* c, void* f, void** p, void** e) {
    ex_calls++;
    return cuLaunchKernel(f, c->g[0], c->g[1], c->g[2], c->g[3], c->g[4], c->g[5], c->g[6], c->s, p, e);
}
"""


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    tmp = tmp_path_factory.mktemp("fl")
    mp = pytest.MonkeyPatch()
    if "CUFORGE_CACHE_DIR" not in os.environ:
        mp.setenv("CUFORGE_CACHE_DIR", str(tmp / "cache"))
    try:
        module = fastlaunch.load()
    finally:
        mp.undo()
    if module is None:
        pytest.skip(f"C fast path unavailable: {fastlaunch.error()}")
    (tmp / "mock.c").write_text(MOCK)
    so = tmp / "libmock.so"
    subprocess.run([cc, "-shared", "-fPIC", str(tmp / "mock.c"), "-o", str(so)], check=True)
    return module, ctypes.CDLL(str(so))


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


def _setup(env, decls, check_device=0, use_ex=False):
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
        ctypes.cast(mock.cuLaunchKernelEx, ctypes.c_void_p).value if use_ex else 0,
        check_device,
        lambda cfg, args: slow_calls.append(args) or "slow",
        lambda code, cfg, args: fail_calls.append(code) or "failed",
        (buf, array),
    )
    state.set_torch(
        FakeTensor,
        dtypes,
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


def test_launch_through_cuLaunchKernelEx(env):
    state, launcher, layout, mock, slow, fail = _setup(
        env, ["float* y", "const float* x", "float a", "int n"], use_ex=True
    )
    before = ctypes.c_int.in_dll(mock, "ex_calls").value
    assert launcher(FakeTensor(0x1000), FakeTensor(0x2000), 2.0, 5) is None
    assert ctypes.c_int.in_dll(mock, "ex_calls").value == before + 1
    assert _last(mock, layout) == layout.struct.pack(0x1000, 0x2000, 2.0, 5)
    assert list((ctypes.c_uint * 7).in_dll(mock, "last_dims")) == [2, 3, 4, 128, 1, 1, 0]
    assert ctypes.c_void_p.in_dll(mock, "last_stream").value == 0xABC0
