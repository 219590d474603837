"""A GEMM for the cuforge.cute tests and benchmarks, written for this project on the CuTe DSL:
C = A @ B^T in fp32 (K-major A and B, N-major C, dynamic M, N, K), a plain SIMT kernel.

Each CTA covers a ``tile_m x tile_n`` tile of C with one thread per element of the tile;
each thread walks K for its element (``acc += A[m, k] * B[n, k]``) and stores it, if it lies
inside C (M and N need not be multiples of the tile). Like a library kernel it is a class
instance (the tile in its state, a ``@cute.jit`` ``__call__`` whose stream parameter defaults
to a driver handle, a ``@cute.kernel`` method) behind a plain ``@cute.jit`` function, so
that cuforge keys all of that.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_fake_stream, make_fake_tensor


class SimtGemm:
    """C[m, n] = sum_k A[m, k] * B[n, k]: grid (ceil(M / tile_m), ceil(N / tile_n)), block
    (tile_n, tile_m): thread x walks N (coalesced stores to the N-major C), thread y M."""

    def __init__(self, tile_m: int = 16, tile_n: int = 16) -> None:
        self.tile_m = tile_m
        self.tile_n = tile_n

    @cute.jit
    def __call__(
        self,
        mA: cute.Tensor,
        mB: cute.Tensor,
        mC: cute.Tensor,
        stream: cuda.CUstream = cuda.CUstream(cuda.CUstream_flags.CU_STREAM_DEFAULT),  # noqa: B008
    ):
        grid = *cute.ceil_div(mC.shape, (self.tile_m, self.tile_n)), 1
        self.kernel(mA, mB, mC).launch(
            grid=grid, block=(self.tile_n, self.tile_m, 1), stream=stream
        )

    @cute.kernel
    def kernel(self, mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor):
        tidx, tidy, _ = cute.arch.thread_idx()
        bidx, bidy, _ = cute.arch.block_idx()
        m = bidx * self.tile_m + tidy
        n = bidy * self.tile_n + tidx
        if m < mC.shape[0]:
            if n < mC.shape[1]:
                acc = cutlass.Float32(0.0)
                for k in range(mA.shape[1]):
                    acc += mA[m, k] * mB[n, k]
                mC[m, n] = acc


@cute.jit
def sgemm(mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor, stream: cuda.CUstream):
    """C[m, n] = sum_k A[m, k] * B[n, k] (A: (M, K), B: (N, K), C: (M, N), fp32)."""
    SimtGemm()(mA, mB, mC, stream=stream)


def fake_args():
    """Fake fp32 tensors (dynamic M, N, K and leading dims) and a fake stream."""
    m, n, k = (cute.sym_int32(divisibility=4) for _ in range(3))
    lda, ldb, ldc = (cute.sym_int64(divisibility=4) for _ in range(3))
    a = make_fake_tensor(cutlass.Float32, (m, k), (lda, 1), assumed_align=16)
    b = make_fake_tensor(cutlass.Float32, (n, k), (ldb, 1), assumed_align=16)
    c = make_fake_tensor(cutlass.Float32, (m, n), (ldc, 1), assumed_align=16)
    return a, b, c, make_fake_stream()
