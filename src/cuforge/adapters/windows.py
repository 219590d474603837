"""The peer releases each adapter is tested on, ``[low, high)``, in one place (docs/compat.md).

Adding the next release is one edit here (the high bound) plus its row in
``tests/compat/run.py``. A release outside its window is not refused: the adapter's contract
probe decides (:func:`cuforge.adapters.common.window_verdict`). This module imports
nothing, so ``cuforge doctor`` reads the windows without importing any peer.
"""

from __future__ import annotations

#: ``cuforge.enable`` name -> (the peer's distribution, its name for people, (low, high))
WINDOWS: dict[str, tuple[str, str, tuple[tuple[int, ...], tuple[int, ...]]]] = {
    "triton": ("triton", "Triton", ((3, 6), (3, 10))),
    "torch_compile": ("torch", "torch", ((2, 6), (2, 16))),
    "jax": ("jax", "JAX", ((0, 4, 36), (0, 13))),
    "cupy": ("cupy-cuda13x", "CuPy", ((14, 1), (16, 0))),
    "flashinfer": ("flashinfer-python", "FlashInfer", ((0, 7), (0, 8))),
}


def window(system: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The tested window of ``system`` (a key of :data:`WINDOWS`)."""
    return WINDOWS[system][2]
