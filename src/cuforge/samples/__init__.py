"""The bundled sample kernels (used by ``make demo``, the tests and the benchmarks)."""

from __future__ import annotations

import os

__all__ = ["SAMPLES_DIR", "sample_path"]

SAMPLES_DIR = os.path.dirname(os.path.abspath(__file__))


def sample_path(name: str) -> str:
    """Absolute path of a bundled sample, e.g. ``sample_path("saxpy.cu")``."""
    path = os.path.join(SAMPLES_DIR, name)
    if not os.path.exists(path):
        names = sorted(f for f in os.listdir(SAMPLES_DIR) if f.endswith((".cu", ".cuh")))
        raise FileNotFoundError(f"no sample {name!r}; samples: {', '.join(names)}")
    return path
