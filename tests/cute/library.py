"""CuTe DSL kernels written the way kernel libraries (flash-attention's CuTe kernels, quack)
write them, for the cuforge.cute tests:

* a helper class (a tile scheduler's work tile) with the DSL's MLIR-value protocol,
  ``__new_from_mlir_values__(self, values: list[ir.Value])``: its annotations reach the
  DSL's compiled IR types;
* a helper with a ``loc: Optional[ir.Location] = None`` parameter (quack's ``@dsl_user_op``
  style);
* a kernel *class* compiled as an instance (``cute.compile(obj, ..., options=...)``).

Without a GPU, ``CUTE_DSL_ARCH`` must be set before the DSL is first used (the tests set
``sm_90a``).
"""

# no ``from __future__ import annotations``: the annotations are the objects themselves, as
# in the libraries (the fingerprint walks them)
from typing import Optional  # noqa: UP035 - written as the libraries write it

import cutlass
import cutlass.cute as cute
from cutlass._mlir import ir
from cutlass.cutlass_dsl import extract_mlir_values, new_from_mlir_values

BLOCK = 128


class WorkTile:
    """A tile scheduler's work tile: a DSL value that crosses the DSL's control flow."""

    def __init__(self, tile_idx: cutlass.Int32) -> None:
        self.tile_idx = tile_idx

    def __extract_mlir_values__(self) -> list[ir.Value]:
        return extract_mlir_values(self.tile_idx)

    def __new_from_mlir_values__(self, values: list[ir.Value]) -> "WorkTile":
        return WorkTile(new_from_mlir_values(self.tile_idx, values))


def first_index(tile: WorkTile, *, loc: Optional[ir.Location] = None, ip=None):  # noqa: UP045
    """The first element of ``tile`` (a helper with the ``loc`` / ``ip`` parameters)."""
    return tile.tile_idx * BLOCK


@cute.kernel
def tiled_kernel(a: cute.Tensor, b: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    tile = WorkTile(bidx)
    i = first_index(tile) + tidx
    b[i] = a[i] * 3.0


@cute.jit
def tiled(a: cute.Tensor, b: cute.Tensor):
    """b = a * 3 through a work tile and a ``loc``-taking helper."""
    tiled_kernel(a, b).launch(grid=(a.shape[0] // BLOCK, 1, 1), block=(BLOCK, 1, 1))


class TiledKernel:
    """A kernel class compiled as an instance: ``cute.compile(TiledKernel(2.0), a, b)``."""

    def __init__(self, scale: float = 2.0) -> None:
        self.scale = scale

    @cute.kernel
    def kernel(self, a: cute.Tensor, b: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        tile = WorkTile(bidx)
        i = first_index(tile) + tidx
        b[i] = a[i] * self.scale

    @cute.jit
    def __call__(self, a: cute.Tensor, b: cute.Tensor):
        self.kernel(a, b).launch(grid=(a.shape[0] // BLOCK, 1, 1), block=(BLOCK, 1, 1))
