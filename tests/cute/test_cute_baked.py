"""What ``cute.compile`` could bake into code that the spec key would miss (issue 20, item
2): device addresses read at trace time and pointer alignment. Key level only (no compile):
real DSL objects, no GPU."""

from __future__ import annotations

import os

import pytest

from tests.conftest import GPU_VISIBLE

if not GPU_VISIBLE:
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")  # before the DSL's first import

pytest.importorskip(
    "cutlass.cute", reason="the CuTe DSL is not installed (pip install 'cuforge[cute]')"
)
torch = pytest.importorskip("torch", reason="the DLPack tensors here come from torch")

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
from cutlass._mlir import ir  # noqa: E402
from cutlass.cute.runtime import from_dlpack, make_ptr  # noqa: E402

from cuforge.cute.cache import key_fields  # noqa: E402
from cuforge.keys.fingerprint import UnstableKeyError  # noqa: E402

HOST = torch.zeros(64, dtype=torch.float32)
POINTER = make_ptr(cutlass.Float32, 0x7F0000001000, cute.AddressSpace.gmem, assumed_align=16)
TENSOR = from_dlpack(HOST)


@cute.jit
def reads_a_pointer(x: cute.Tensor):
    cute.printf("%d", POINTER)


@cute.jit
def reads_a_tensor(x: cute.Tensor):
    cute.printf("%d", TENSOR)


@cute.jit
def reads_an_address(x: cute.Tensor):
    cute.printf("%d", HOST.data_ptr())


@cute.jit
def plain(x: cute.Tensor):
    cute.printf("%d", x.shape[0])


def test_a_pointer_or_tensor_a_kernel_reads_at_trace_time_makes_the_key_refuse():
    arg = from_dlpack(torch.zeros(8, dtype=torch.float32))
    for fn, name in (
        (reads_a_pointer, "POINTER"),
        (reads_a_tensor, "TENSOR"),
        (reads_an_address, "HOST"),
    ):
        with pytest.raises(UnstableKeyError) as err:
            key_fields(fn, arg)
        assert f"__globals__[{name!r}]" in err.value.path


def test_alignment_is_the_assumed_one_never_the_pointers():
    base = torch.zeros(4096, dtype=torch.float32)
    views = [base[off : off + 1024] for off in (0, 1, 3, 16)]  # pointers 4..64 bytes aligned
    fields = [key_fields(plain, from_dlpack(v))["args"] for v in views]
    with ir.Context(), ir.Location.unknown():
        types = {str(from_dlpack(v).mlir_type) for v in views}
        aligned = str(from_dlpack(views[0], assumed_align=16).mlir_type)
    assert len(set(fields)) == 1 and len(types) == 1  # the DSL compiles the same type
    assert aligned not in types  # an assumed alignment is in the type, and in the key
    assert key_fields(plain, from_dlpack(views[0], assumed_align=16))["args"] != fields[0]
