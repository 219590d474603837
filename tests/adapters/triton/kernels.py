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


def logging_cc(path) -> str:
    """Write at ``path`` a ``CC`` that appends each invocation's arguments to ``$CC_LOG`` and
    runs the real compiler (``CC``, else gcc, else clang); returns ``path`` as a str, or
    raises RuntimeError when there is no C compiler. Count builds with :func:`c_builds`."""
    import os
    import shutil

    real = os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang")
    if real is None:
        raise RuntimeError("no C compiler (gcc or clang) for Triton's native modules")
    with open(path, "w") as f:
        f.write(f'#!/bin/sh\necho "$@" >> "$CC_LOG"\nexec {real} "$@"\n')
    os.chmod(path, 0o755)
    return str(path)


def c_builds(log) -> int:
    """How many builds (``-shared`` links, not ``--version`` probes) a :func:`logging_cc`
    log holds."""
    import os

    if not os.path.exists(log):
        return 0
    with open(log) as f:
        return sum(1 for line in f if "-shared" in line.split())
