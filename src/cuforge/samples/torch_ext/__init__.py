"""The bundled sample PyTorch extension, in two layouts (``bench/build_extension.py`` builds it).

* ``classic/``: ``ops.cu`` (3 kernels + torch wrappers, includes torch's headers) and
  ``binding.cpp`` -- the layout torch's tutorials use;
* ``fast/``: ``kernels.cu`` (3 kernels + thin launchers, no torch headers),
  ``kernels.h`` and ``binding.cpp`` (torch side, ``PYBIND11_MODULE`` and ``TORCH_LIBRARY``).
"""

from __future__ import annotations

import os

__all__ = ["SAMPLE_DIR", "sources"]

SAMPLE_DIR = os.path.dirname(os.path.abspath(__file__))

_LAYOUTS = {
    "classic": ("classic/ops.cu", "classic/binding.cpp"),
    "fast": ("fast/kernels.cu", "fast/binding.cpp"),
}


def sources(layout: str = "fast", root: str | None = None) -> list[str]:
    """Absolute paths of the sample's sources in ``layout`` ("classic" or "fast"),
    under ``root`` (a copy of this directory) or the installed package."""
    try:
        names = _LAYOUTS[layout]
    except KeyError:
        raise ValueError(f"unknown layout {layout!r}: use 'classic' or 'fast'") from None
    base = root or SAMPLE_DIR
    return [os.path.join(base, n) for n in names]
