"""Facts about the torch install that ``cuforge doctor`` and ``cuforge env`` report, found
without importing torch (which takes seconds and may initialize CUDA)."""

from __future__ import annotations

import importlib.util
import os
import shutil
from typing import Any

__all__ = ["torch_info", "torch_installed", "torch_cuda_home_guess"]


def torch_installed() -> bool:
    """Whether ``import torch`` would find a package (without importing it)."""

    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return False


def torch_info() -> dict[str, Any] | None:
    """``{"path", "version", "cuda", "hip"}`` read from torch/version.py, or None when torch
    is absent (``{"path"}`` alone when version.py cannot be read)."""

    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "version.py")
    info: dict[str, Any] = {"path": os.path.dirname(path)}
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return info
    for line in text.splitlines():
        name, sep, value = line.partition("=")
        name = name.split(":")[0].strip()
        value = value.strip()
        if sep and name in ("__version__", "cuda", "hip"):
            info[name.strip("_")] = None if value == "None" else value.strip("'\"")
    return info


def torch_cuda_home_guess() -> tuple[str | None, str]:
    """What torch.utils.cpp_extension would use as CUDA_HOME, and how it got there."""

    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            return os.environ[var], f"from {var}"
    nvcc = shutil.which("nvcc")
    if nvcc:
        return os.path.dirname(os.path.dirname(nvcc)), f"guessed from `which nvcc` = {nvcc}"
    if os.path.exists("/usr/local/cuda"):
        return "/usr/local/cuda", "the default /usr/local/cuda"
    return None, "nvcc is not on PATH and /usr/local/cuda does not exist"
