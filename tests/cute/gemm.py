"""A GEMM for the cuforge.cute tests and benchmark: the SIMT SGEMM of the CUTLASS CuTe DSL
examples (``sgemm_example.py``, BSD-3-Clause, copied unchanged from
``examples/python/CuTeDSL/cute/ampere/kernel/dense_gemm/sgemm.py``), behind a plain
``@cute.jit`` function so that cuforge can key it (C = A @ B^T, fp32, K-major A and B,
N-major C, dynamic M, N, K)."""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_fake_stream, make_fake_tensor

from tests.cute.sgemm_example import SGemm


@cute.jit
def sgemm(mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor, stream: cuda.CUstream):
    """C[m, n] = sum_k A[m, k] * B[n, k] with the example's default tiling."""
    SGemm()(mA, mB, mC, stream=stream)


def fake_args():
    """Fake fp32 tensors (dynamic M, N, K and leading dims) and a fake stream."""
    m, n, k = (cute.sym_int32(divisibility=4) for _ in range(3))
    lda, ldb, ldc = (cute.sym_int64(divisibility=4) for _ in range(3))
    a = make_fake_tensor(cutlass.Float32, (m, k), (lda, 1), assumed_align=16)
    b = make_fake_tensor(cutlass.Float32, (n, k), (ldb, 1), assumed_align=16)
    c = make_fake_tensor(cutlass.Float32, (m, n), (ldc, 1), assumed_align=16)
    return a, b, c, make_fake_stream()
