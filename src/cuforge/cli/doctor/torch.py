"""The torch check: torch's CUDA version against nvcc's (torch is never imported)."""

from __future__ import annotations

from cuforge import toolchain
from cuforge.cli.doctor.base import Check, Probe, row_maker
from cuforge.toolchain.facts import version_tuple
from cuforge.torch.facts import torch_info


def check_torch(p: Probe) -> list[Check]:
    row = row_maker("torch", "torch")
    info = p.once("torch", torch_info)
    if info is None:
        return [
            row(
                "SKIP",
                "torch is not installed: torch checks skipped (pip install 'cuforge[torch]' "
                "for extension builds)",
            )
        ]
    version, cuda = info.get("version"), info.get("cuda")
    data = {"version": version, "cuda": cuda, "path": info.get("path")}
    if not cuda:
        return [
            row(
                "WARN",
                f"torch {version} is a CPU-only build: it cannot build or run CUDA extensions",
                "pip install torch --index-url https://download.pytorch.org/whl/cu130",
                **data,
            )
        ]
    nvcc = toolchain.nvcc_version()
    data["nvcc"] = nvcc
    if not nvcc:
        return [
            row(
                "WARN",
                f"torch {version} (CUDA {cuda}); no nvcc to build extensions with",
                f"install the CUDA {cuda} toolkit",
                **data,
            )
        ]
    tv, nv = version_tuple(cuda), version_tuple(nvcc)
    if tv[:1] != nv[:1]:
        wheel = f"cu{nv[0]}{nv[1] if len(nv) > 1 else 0}"
        return [
            row(
                "FAIL",
                f"torch {version} is built for CUDA {cuda} but nvcc is {nvcc}: extension "
                "builds fail (major versions differ)",
                f"install torch for CUDA {nv[0]} (pip install torch --index-url "
                f"https://download.pytorch.org/whl/{wheel}), or point CUDA_HOME at a CUDA "
                f"{tv[0]} toolkit",
                **data,
            )
        ]
    if tv[:2] != nv[:2]:
        return [
            row(
                "WARN",
                f"torch {version} (CUDA {cuda}) and nvcc {nvcc} differ in the minor version: "
                "builds work, torch warns",
                f"use a CUDA {cuda} toolkit to silence it",
                **data,
            )
        ]
    return [row("PASS", f"torch {version}, CUDA {cuda} = nvcc {nvcc}", **data)]
