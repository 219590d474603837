"""Runtime tests: GPU tests (``-m gpu``) are skipped cleanly when no GPU, or no torch to
check results with, is there. (tests/conftest.py gives every test its own cache dir.)"""

from __future__ import annotations

import functools
import os

import pytest


@functools.lru_cache(maxsize=1)
def gpu_reason() -> str | None:
    """None when a CUDA GPU is usable, else why not."""
    try:
        from cuforge.runtime.driver import driver

        if driver().device_count() < 1:
            return "no CUDA device visible"
    except Exception as exc:  # noqa: BLE001 - any failure means: no GPU here
        return f"no CUDA GPU: {exc}"
    try:
        import torch
    except ImportError:
        return "the GPU tests need torch"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    return None


_HERE = os.path.dirname(os.path.abspath(__file__))


def pytest_collection_modifyitems(config, items):
    reason = None
    checked = False
    for item in items:
        if "gpu" in item.keywords and str(item.path).startswith(_HERE):
            if not checked:
                reason, checked = gpu_reason(), True
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))
