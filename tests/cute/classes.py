"""CuTe DSL kernels written the way CUTLASS's examples write them: a kernel *class* whose
``@cute.jit`` ``__call__`` (or a ``@cute.jit`` method) is the entry point, an instance
passed to ``cute.compile`` as ``fn``, kernel state in instance attributes; a config object
passed as a ``Constexpr``; an un-annotated function called with raw arrays.

Without a GPU, ``CUTE_DSL_ARCH`` must be set before the DSL is first used (the tests set
``sm_90a``).
"""

from __future__ import annotations

import dataclasses
import os

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute


@dataclasses.dataclass(frozen=True)
class Tiling:
    """A nested, dataclass part of a kernel's state."""

    block: int = 128
    unroll: int = 1


class ScaleKernel:
    """b = a * scale (+ 1 when ``flag``), ``stages`` launches, one thread per element."""

    EPILOGUE = float(os.environ.get("CF_EPILOGUE", "0.0"))  # a class attribute

    def __init__(
        self,
        scale: float = 2.0,
        dtype: type = cutlass.Float32,
        tile: tuple = (128,),
        stages: int = 1,
        flag: bool = False,
        tiling: Tiling | None = None,
    ) -> None:
        self.scale = scale
        self.dtype = dtype
        self.tile = tile
        self.stages = stages
        self.flag = flag
        self.tiling = tiling or Tiling()

    @cute.kernel
    def kernel(self, a: cute.Tensor, b: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        i = bidx * self.tile[0] + tidx
        if cutlass.const_expr(self.flag):
            b[i] = a[i] * self.scale + self.EPILOGUE + 1.0
        else:
            b[i] = a[i] * self.scale + self.EPILOGUE

    @cute.jit
    def __call__(self, a: cute.Tensor, b: cute.Tensor):
        for _ in cutlass.range_constexpr(self.stages):
            self.kernel(a, b).launch(
                grid=(a.shape[0] // self.tile[0], 1, 1), block=(self.tile[0], 1, 1)
            )

    @cute.jit
    def run(self, a: cute.Tensor, b: cute.Tensor):
        """The same as calling the instance: a bound method as ``fn``."""
        self.kernel(a, b).launch(
            grid=(a.shape[0] // self.tile[0], 1, 1), block=(self.tile[0], 1, 1)
        )


class SlottedKernel(ScaleKernel):
    """State in ``__slots__`` as well as ``__dict__``."""

    __slots__ = ("extra",)

    def __init__(self, extra: int = 0, **kw) -> None:
        super().__init__(**kw)
        self.extra = extra


class StreamKernel(ScaleKernel):
    """``sgemm.py``'s entry point: a stream parameter whose default is a driver handle
    (``cuda.CUstream(cuda.CUstream_flags.CU_STREAM_DEFAULT)``, which pickle refuses), and
    driver handles in the state, as the DSL's own ``HardwareInfo`` holds them."""

    def __init__(self, context: int = 0x1000, **kw) -> None:
        super().__init__(**kw)
        self.device = cuda.CUdevice(0)
        self.context = cuda.CUcontext(context)

    @cute.jit
    def __call__(
        self,
        a: cute.Tensor,
        b: cute.Tensor,
        stream: cuda.CUstream = cuda.CUstream(cuda.CUstream_flags.CU_STREAM_DEFAULT),  # noqa: B008
    ):
        self.kernel(a, b).launch(
            grid=(a.shape[0] // self.tile[0], 1, 1), block=(self.tile[0], 1, 1), stream=stream
        )


@cute.jit
def run_with(k: cutlass.Constexpr, a: cute.Tensor, b: cute.Tensor):
    """A kernel object passed as a Constexpr argument."""
    k.kernel(a, b).launch(grid=(a.shape[0] // k.tile[0], 1, 1), block=(k.tile[0], 1, 1))


@cute.kernel
def _raw_kernel(a: cute.Tensor, b: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    b[tidx] = a[tidx] * 2.0


@cute.jit
def scale_raw(a, b):
    """Un-annotated parameters: called with raw numpy / torch arrays, as elementwise_add.py."""
    _raw_kernel(a, b).launch(grid=(1, 1, 1), block=(128, 1, 1))


class Wrapped:
    """A user type the DSL converts through a user-registered JIT argument adapter: the DSL
    compiles and runs it, but its ``export_to_c`` fails on it (a real DSL limitation)."""

    def __init__(self, array) -> None:
        self.array = array


@cute.register_jit_arg_adapter(Wrapped)
class WrappedAdapter:
    def __init__(self, w: Wrapped) -> None:
        from cutlass.cute.runtime import from_dlpack

        self._arg = from_dlpack(w.array).mark_layout_dynamic()

    def __new_from_mlir_values__(self, values):
        return self._arg.__new_from_mlir_values__(values)

    def __c_pointers__(self):
        return self._arg.__c_pointers__()

    def __get_mlir_types__(self):
        return self._arg.__get_mlir_types__()
