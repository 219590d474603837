"""Program.get_global: the device pointer and size of __device__ / __constant__ variables
(CPU: the listing of declared globals; GPU: reading and writing a __constant__ table)."""

from __future__ import annotations

import ctypes

import pytest

import cuforge
from cuforge.runtime.errors import GlobalNotFoundError
from cuforge.runtime.signature import global_names

SRC = r"""
__constant__ float table[4] = {1.0f, 2.0f, 3.0f, 4.0f};
__device__ float scale = 1.0f;
__device__ unsigned long long calls = 0, spare[2];
namespace ns { __device__ int hidden = 7; }
__device__ __forceinline__ float lookup(int i) { return table[i & 3] * scale; }

extern "C" __global__ void gather(float* out, int n) {
    __shared__ float cache[4];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (threadIdx.x < 4) cache[threadIdx.x] = lookup(threadIdx.x);
    __syncthreads();
    if (i < n) out[i] = cache[i & 3];
    if (i == 0) atomicAdd(&calls, 1ull);
}
"""


def test_global_names_lists_variables_not_functions_or_shared():
    assert global_names(SRC) == ["table", "scale", "calls", "spare", "hidden"]
    assert global_names(None) == []
    assert global_names("// __device__ int commented;\n__device__ int real;") == ["real"]


def test_get_global_argument_must_be_a_name():
    prog = cuforge.compile(SRC, arch="sm_80")
    with pytest.raises(TypeError, match="variable name"):
        prog.get_global("")


def test_missing_global_message_lists_what_the_source_declares():
    prog = cuforge.compile(SRC, arch="sm_80")
    msg = prog._missing_global("tabel")
    assert "'tabel'" in msg and "table, scale, calls, spare, hidden" in msg
    bare = cuforge.load_binary(prog.binary)
    assert "no source" in bare._missing_global("table")


# -- GPU ---------------------------------------------------------------------------------------


def _copy_to_host(address: int, nbytes: int) -> bytes:
    from cuforge.runtime.driver import driver

    buf = ctypes.create_string_buffer(nbytes)
    driver().call("cuMemcpyDtoH_v2", buf, ctypes.c_uint64(address), ctypes.c_size_t(nbytes))
    return buf.raw


def _copy_to_device(address: int, data: bytes) -> None:
    from cuforge.runtime.driver import driver

    driver().call("cuMemcpyHtoD_v2", ctypes.c_uint64(address), data, ctypes.c_size_t(len(data)))


@pytest.mark.gpu
def test_constant_table_read_and_written_through_get_global():
    torch = pytest.importorskip("torch")
    import struct

    torch.cuda.init()
    torch.zeros(1, device="cuda")  # the primary context is current, as after any torch use
    prog = cuforge.compile(SRC)
    address, size = prog.get_global("table")
    assert address and size == 16
    assert struct.unpack("<4f", _copy_to_host(address, 16)) == (1.0, 2.0, 3.0, 4.0)
    k = prog.kernel("gather")
    out = torch.empty(8, device="cuda")
    k[1, 32](out, 8)
    torch.cuda.synchronize()
    assert out.tolist() == [1.0, 2.0, 3.0, 4.0] * 2
    # write a new table and a new scale: the next launch reads them
    _copy_to_device(address, struct.pack("<4f", 10.0, 20.0, 30.0, 40.0))
    s_addr, s_size = prog.get_global("scale", device=torch.cuda.current_device())
    assert s_size == 4
    _copy_to_device(s_addr, struct.pack("<f", 0.5))
    k[1, 32](out, 8)
    torch.cuda.synchronize()
    assert out.tolist() == [5.0, 10.0, 15.0, 20.0] * 2
    c_addr, c_size = prog.get_global("calls")
    assert c_size == 8 and struct.unpack("<Q", _copy_to_host(c_addr, 8))[0] == 2
    # the same pointer on the next ask; the program loaded once
    assert prog.get_global("table") == (address, size)


@pytest.mark.gpu
def test_missing_global_on_the_gpu_lists_the_declared_ones():
    pytest.importorskip("torch")
    prog = cuforge.compile(SRC)
    with pytest.raises(GlobalNotFoundError, match="no global 'tabel'.*table, scale, calls"):
        prog.get_global("tabel")
    with pytest.raises(LookupError):
        cuforge.load_binary(prog.binary).get_global("tabel")


@pytest.mark.gpu
def test_namespaced_global_through_a_name_expression():
    pytest.importorskip("torch")
    import struct

    prog = cuforge.compile(SRC, name_expressions=("&ns::hidden",))
    address, size = prog.get_global("&ns::hidden")
    assert size == 4 and struct.unpack("<i", _copy_to_host(address, 4))[0] == 7
    assert prog.get_global("ns::hidden") == (address, size)


@pytest.mark.gpu
def test_every_device_has_its_own_copy():
    torch = pytest.importorskip("torch")
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    prog = cuforge.compile(SRC)
    a0, _ = prog.get_global("table", device=0)
    a1, _ = prog.get_global("table", device=1)
    assert a0 != a1
