"""extension-cpp's three ops as a cuforge user writes them, in any namespace: ``define(ns)``
registers ``<ns>::mymuladd(Tensor a, Tensor b, float c) -> Tensor`` (with autograd),
``<ns>::mymul(Tensor a, Tensor b) -> Tensor`` and ``<ns>::myadd_out(Tensor a, Tensor b,
Tensor(a!) out) -> ()`` (extension-cpp's schemas, letter for letter) and returns them.

CUDA: cuforge kernels launched on torch's current stream (compiled on the first CUDA call,
then served by cuforge's cache). CPU: plain torch, as extension-cpp's CPU kernels compute.
Importing this module registers nothing (cuforge's GPU tests define the ops in fresh
namespaces with it)."""

from __future__ import annotations

import torch
from torch import Tensor

import cuforge
from cuforge.torch import custom_op

__all__ = ["define", "SOURCE"]

SOURCE = r"""
extern "C" __global__ void muladd_kernel(int numel, const float* a, const float* b, float c,
                                         float* result) {
  int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx < numel) result[idx] = a[idx] * b[idx] + c;
}
extern "C" __global__ void mul_kernel(int numel, const float* a, const float* b, float* result) {
  int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx < numel) result[idx] = a[idx] * b[idx];
}
extern "C" __global__ void add_kernel(int numel, const float* a, const float* b, float* result) {
  int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx < numel) result[idx] = a[idx] + b[idx];
}
"""
_kernels: dict[str, cuforge.Kernel] = {}


def _kernel(name: str) -> cuforge.Kernel:
    """The kernel ``name``, the program compiled on the first CUDA call (a cache hit after)."""
    if not _kernels:
        prog = cuforge.compile(SOURCE, name="muladd.cu")
        for n in ("muladd_kernel", "mul_kernel", "add_kernel"):
            _kernels[n] = prog.kernel(n)
    return _kernels[name]


def check(a: Tensor, b: Tensor) -> None:  # extension-cpp's TORCH_CHECKs; the fakes run them too
    torch._check(a.shape == b.shape)
    torch._check(a.dtype == torch.float32 and b.dtype == torch.float32)
    torch._check(a.device == b.device)


def fake(a: Tensor, b: Tensor, c: float | None = None) -> Tensor:
    check(a, b)
    return torch.empty_like(a)


def define(ns: str):
    """Register the three ops in namespace ``ns``; (mymuladd, mymul, myadd_out)."""

    @custom_op(f"{ns}::mymuladd", fake=fake)
    def mymuladd(a: Tensor, b: Tensor, c: float) -> Tensor:
        check(a, b)
        a, b = a.contiguous(), b.contiguous()
        result = torch.empty_like(a)
        numel = a.numel()
        _kernel("muladd_kernel")[(numel + 255) // 256, 256](numel, a, b, c, result)
        return result

    @custom_op(f"{ns}::mymul", fake=fake)
    def mymul(a: Tensor, b: Tensor) -> Tensor:
        check(a, b)
        a, b = a.contiguous(), b.contiguous()
        result = torch.empty_like(a)
        numel = a.numel()
        _kernel("mul_kernel")[(numel + 255) // 256, 256](numel, a, b, result)
        return result

    @custom_op(f"{ns}::myadd_out", mutates_args=("out",))
    def myadd_out(a: Tensor, b: Tensor, out: Tensor) -> None:
        check(a, b)
        torch._check(out.shape == a.shape and out.is_contiguous())
        a, b = a.contiguous(), b.contiguous()
        numel = a.numel()
        _kernel("add_kernel")[(numel + 255) // 256, 256](numel, a, b, out)

    @mymuladd.register_kernel("cpu")
    def _(a: Tensor, b: Tensor, c: float) -> Tensor:
        check(a, b)
        return a.contiguous() * b.contiguous() + c

    @mymul.register_kernel("cpu")
    def _(a: Tensor, b: Tensor) -> Tensor:
        check(a, b)
        return a.contiguous() * b.contiguous()

    @myadd_out.register_kernel("cpu")
    def _(a: Tensor, b: Tensor, out: Tensor) -> None:
        check(a, b)
        torch._check(out.shape == a.shape and out.is_contiguous())
        torch.add(a, b, out=out)

    def backward(ctx, grad: Tensor):
        a, b = ctx.saved_tensors
        grad_a = mymul(grad, b) if ctx.needs_input_grad[0] else None
        grad_b = mymul(grad, a) if ctx.needs_input_grad[1] else None
        return grad_a, grad_b, None

    def setup_context(ctx, inputs, output) -> None:
        a, b, c = inputs
        ctx.save_for_backward(a, b)

    mymuladd.register_autograd(backward, setup_context=setup_context)
    return mymuladd, mymul, myadd_out
