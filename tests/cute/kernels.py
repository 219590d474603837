"""Small CuTe DSL kernels for the cuforge.cute tests, parameterized by environment variables
so that a child process can change exactly one thing the key must see:

* ``CF_SCALE``: a module global the kernel reads;
* ``CF_OFFSET``: a value captured in a closure;
* ``CF_DTYPE``: the element type of the fake tensors.

Importing this module needs the CuTe DSL; without a GPU, ``CUTE_DSL_ARCH`` must be set
before the DSL is first used (the tests set ``sm_90a``).
"""

from __future__ import annotations

import os

import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_fake_compact_tensor

SCALE = float(os.environ.get("CF_SCALE", "2.0"))
BLOCK = 128


def _make_kernel(offset: float):
    @cute.kernel
    def scale_kernel(a: cute.Tensor, b: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        i = bidx * BLOCK + tidx
        b[i] = a[i] * SCALE + offset

    return scale_kernel


scale_kernel = _make_kernel(float(os.environ.get("CF_OFFSET", "0.0")))


@cute.jit
def scale(a: cute.Tensor, b: cute.Tensor):
    """b = a * SCALE + OFFSET, one thread per element (n a multiple of 128)."""
    scale_kernel(a, b).launch(grid=(a.shape[0] // BLOCK, 1, 1), block=(BLOCK, 1, 1))


@cute.jit
def scale_times(a: cute.Tensor, b: cute.Tensor, reps: cutlass.Constexpr[int] = 1):
    """Like :func:`scale`, launched ``reps`` times (a Constexpr parameter)."""
    for _ in range(reps):
        scale_kernel(a, b).launch(grid=(a.shape[0] // BLOCK, 1, 1), block=(BLOCK, 1, 1))


def dtype():
    return getattr(cutlass, os.environ.get("CF_DTYPE", "Float32"))


def fake_args(n=None):
    """Two fake 1-D tensors of ``CF_DTYPE``; ``n=None``: a shared dynamic extent."""
    extent = cute.sym_int32(divisibility=BLOCK) if n is None else n
    a = make_fake_compact_tensor(dtype(), (extent,))
    b = make_fake_compact_tensor(dtype(), (extent,))
    return a, b


LOCK = __import__("threading").Lock()


@cute.jit
def with_lock(a: cute.Tensor, b: cute.Tensor):
    """Reads a global lock at trace time: a function cuforge cannot key stably."""
    assert LOCK is not None
    scale_kernel(a, b).launch(grid=(a.shape[0] // BLOCK, 1, 1), block=(BLOCK, 1, 1))


def _decorated():
    import cuforge.cute as cc

    @cc.jit
    def scale_cached(a: cute.Tensor, b: cute.Tensor):
        """:func:`scale` through ``@cuforge.cute.jit``: compiled (cached) on call."""
        scale_kernel(a, b).launch(grid=(a.shape[0] // BLOCK, 1, 1), block=(BLOCK, 1, 1))

    return scale_cached


scale_cached = _decorated()


#: a new value at every trace, with no stable fingerprint: a kernel no key can cover
TICKS = __import__("itertools").count()
NOW = [0.0]


@cute.kernel
def tick_kernel(a: cute.Tensor, b: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i = bidx * BLOCK + tidx
    b[i] = a[i] + NOW[0]


@cute.jit
def with_ticks(a: cute.Tensor, b: cute.Tensor):
    """Bakes a value that changes at every trace into the module: its traced module differs
    between two traces, so neither the pre-trace key nor the IR key can cover it."""
    NOW[0] = float(next(TICKS))
    tick_kernel(a, b).launch(grid=(a.shape[0] // BLOCK, 1, 1), block=(BLOCK, 1, 1))
