"""Small Triton kernels the cuforge.triton tests compile for an explicit target (sm_90),
without a GPU. Kept in a file: ``@triton.jit`` reads its function's source."""

from __future__ import annotations

import hashlib

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

TARGET = GPUTarget("cuda", 90, 32)
SIGNATURE = {"x": "*fp32", "y": "*fp32", "out": "*fp32", "n": "i32"}


@triton.jit
def add_kernel(x, y, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=mask) + tl.load(y + offs, mask=mask), mask=mask)


@triton.jit
def mul_kernel(x, y, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=mask) * tl.load(y + offs, mask=mask), mask=mask)


KERNELS = {"add_kernel": add_kernel, "mul_kernel": mul_kernel}


def compile_kernel(name: str = "add_kernel", block: int = 128):
    """``triton.compile`` of one kernel for sm_90 (through whatever cache manager is set)."""
    return triton.compile(ASTSource(KERNELS[name], SIGNATURE, {"BLOCK": block}), target=TARGET)


def cubin_digest(compiled) -> str:
    return hashlib.sha256(compiled.asm["cubin"]).hexdigest()


class CompileCounter:
    """Triton's own compilation listener: how many compiles and cache hits it saw."""

    def __init__(self) -> None:
        self.compiles = 0
        self.hits = 0

    def __call__(self, *, src, metadata, metadata_group, times, cache_hit) -> None:
        if cache_hit:
            self.hits += 1
        else:
            self.compiles += 1

    def install(self) -> CompileCounter:
        triton.knobs.compilation.listener = self
        return self
