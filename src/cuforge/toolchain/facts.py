"""Facts about this machine's CUDA toolchain that ``cuforge doctor`` and ``cuforge env``
report (not the compile path): the CUDA library headers torch's headers include, the
display driver's version, version strings as tuples.

Imports nothing costly at import time.
"""

from __future__ import annotations

import os
import re

__all__ = [
    "TORCH_HEADERS",
    "find_library_headers",
    "kernel_driver_version",
    "version_tuple",
    "identity_headers_version",
]

#: The CUDA library headers torch's own CUDA headers include (ATen/cuda/CUDAContext.h).
TORCH_HEADERS = (("cusparse", "cusparse.h"), ("cublas", "cublas_v2.h"))


def find_library_headers(root: str | None) -> tuple[dict[str, str | None], dict[str, str]]:
    """({header: include dir or None}, {header: "toolkit" or "pip"}) for
    :data:`TORCH_HEADERS`: the toolkit's (``root``) include dirs first, else pip
    ``nvidia`` packages (through cuda-pathfinder)."""
    places: dict[str, str | None] = {}
    where: dict[str, str] = {}
    for lib, header in TORCH_HEADERS:
        found = None
        if root:
            dirs = [os.path.join(root, "include")]
            targets = os.path.join(root, "targets")
            if os.path.isdir(targets):
                dirs += [os.path.join(targets, t, "include") for t in sorted(os.listdir(targets))]
            for inc in dirs:
                if os.path.isfile(os.path.join(inc, header)):
                    found, where[header] = inc, "toolkit"
                    break
        if found is None:
            try:
                import cuda.pathfinder as pathfinder

                found = pathfinder.find_nvidia_header_directory(lib)
            except Exception:  # noqa: BLE001 - no pathfinder, or no such package
                found = None
            if found:
                where[header] = "pip"
        places[header] = found
    return places, where


def kernel_driver_version() -> str | None:
    """The display driver's version (``580.159.04``) from ``/proc/driver/nvidia/version``,
    or None."""
    try:
        with open("/proc/driver/nvidia/version") as f:
            text = f.read()
    except OSError:
        return None
    for token in text.split():
        if token.count(".") >= 1 and token.replace(".", "").isdigit():
            return token
    return None


def version_tuple(text: str | None) -> tuple[int, ...]:
    """``"13.0.88"`` -> ``(13, 0, 88)``: the leading dotted numbers (``()`` for none)."""
    out: list[int] = []
    for part in (text or "").split("."):
        if not part.isdigit():
            break
        out.append(int(part))
    return tuple(out)


def identity_headers_version(headers: str) -> tuple[int, int] | None:
    """(major, minor) from the NVRTC identity's ``headers`` field (``CUDA_VERSION=13000``),
    or None when it names no CUDA_VERSION."""

    m = re.search(r"CUDA_VERSION=(\d+)", headers or "")
    if not m:
        return None
    value = int(m.group(1))
    return value // 1000, (value % 1000) // 10
