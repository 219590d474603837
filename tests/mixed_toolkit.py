"""The mixed install, made here: a CUDA toolkit whose headers are of another release than
the pip NVRTC wheel (NVRTC 13.x from ``nvidia-cuda-nvrtc`` beside a toolkit of 13.y).

:func:`toolkit_of_another_release` is this machine's toolkit include dir again, as symlinks,
but for a ``cuda.h`` that says ``CUDA_VERSION`` one minor up: point ``CUDA_HOME`` at it and
NVRTC compiles with the header wheels of its own release, found through cuda-pathfinder
(:func:`cuforge.toolchain.locate.toolkit_include_dirs`). Real files; nothing is faked
beyond the one define."""

from __future__ import annotations

import os

import pytest


def toolkit_of_another_release(dest: str) -> str:
    """A toolkit root under ``dest`` (see the module doc). Skips the test when this machine
    has no toolkit headers to copy."""
    from cuforge.toolchain import header_cuda_version, toolkit_root

    real = toolkit_root()
    real_inc = os.path.join(real or "", "include")
    version = header_cuda_version(real_inc) if real else None
    if version is None:
        pytest.skip("no CUDA toolkit headers here to make a toolkit of another release from")
    root = os.path.join(dest, "toolkit-13.y")
    inc = os.path.join(root, "include")
    os.makedirs(inc)
    for name in os.listdir(real_inc):
        if name != "cuda.h":
            os.symlink(os.path.join(real_inc, name), os.path.join(inc, name))
    define = f"#define CUDA_VERSION {version[0] * 1000 + version[1] * 10}"
    with open(os.path.join(real_inc, "cuda.h")) as f:
        text = f.read()
    assert define in text, f"{real_inc}/cuda.h has no {define!r}"
    bumped = f"#define CUDA_VERSION {version[0] * 1000 + version[1] * 10 + 10}"
    with open(os.path.join(inc, "cuda.h"), "w") as f:
        f.write(text.replace(define, bumped))
    return root


def skip_unless_header_wheels_win(include: list[str], toolkit: str) -> None:
    """Skip unless NVRTC took the header wheels over ``toolkit``'s (the mixed case really
    ran: an NVRTC wheel with the header wheels of its release installed)."""
    if not include or include[0].startswith(os.path.realpath(toolkit) + os.sep):
        pytest.skip("no NVRTC wheel with header wheels of its own release here")
