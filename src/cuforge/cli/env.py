"""``cuforge env``: the tuned build settings for this machine, as shell exports.

Usable as ``eval "$(cuforge env)"`` (bash, zsh), ``cuforge env --shell fish | source``, or
``cuforge env --json``. ``--explain`` says where each value comes from. Problems with the
current environment (an unreadable ``TORCH_CUDA_ARCH_LIST``, an arch no GPU has, ninja
missing) are warned about on stderr, so the exports on stdout stay eval-able.

The machine facts it reads live in the library: the job count in
:mod:`cuforge.torch.jobs`, arch-list findings in :mod:`cuforge.base.arch`, the library headers
in :mod:`cuforge.toolchain.facts`.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
from typing import Any

from cuforge import toolchain
from cuforge.base.arch import arch_findings, arch_number, arch_to_torch, parse_arch_list
from cuforge.base.config import settings
from cuforge.cli import output
from cuforge.toolchain.facts import find_library_headers
from cuforge.torch.facts import torch_installed
from cuforge.torch.jobs import machine_resources, recommended_jobs

__all__ = ["add_parser", "run", "compute"]

# -- the settings ---------------------------------------------------------------------


def _visible_archs() -> tuple[list[str], str | None]:
    """(archs of the visible GPUs, None) or ([], why none)."""
    try:
        from cuforge import toolchain

        archs = list(toolchain.visible_gpu_archs() or [])
    except Exception as exc:  # noqa: BLE001 - no driver, no GPU, no bindings: all "none"
        return [], f"no GPU visible ({type(exc).__name__}: {exc})"
    if not archs:
        return [], "no GPU visible"
    out: list[str] = []
    for a in archs:
        a = str(a)
        if a not in out:
            out.append(a)
    return out, None


def compute(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """The settings ``cuforge env`` prints: ``{"vars": {NAME: {"value", "why"}},
    "findings": [(status, message, fix)], "gpu_archs", "no_gpu", "resources"}``. A variable
    whose value is None is left as it is (the reason says why)."""

    env = os.environ if environ is None else environ
    res = machine_resources()
    gpu_archs, no_gpu = _visible_archs()
    supported = toolchain.supported_archs("nvrtc")  # [] when NVRTC is unavailable
    findings: list[tuple[str, str, str | None]] = []
    out: dict[str, dict[str, Any]] = {}

    # TORCH_CUDA_ARCH_LIST: the visible GPUs' archs; else a readable existing setting.
    readable: dict[str, bool] = {}
    for name in ("TORCH_CUDA_ARCH_LIST", "CUFORGE_ARCH"):
        text = env.get(name)
        if text:
            problems = arch_findings(name, text, gpu_archs, supported)
            findings.extend(problems)
            readable[name] = not any(st == "FAIL" for st, _, _ in problems)
    if gpu_archs:
        out["TORCH_CUDA_ARCH_LIST"] = {
            "value": ";".join(arch_to_torch(a) for a in gpu_archs),
            "why": f"the visible GPUs are {', '.join(gpu_archs)}: build for exactly those",
        }
    elif readable.get("TORCH_CUDA_ARCH_LIST"):
        out["TORCH_CUDA_ARCH_LIST"] = {
            "value": env["TORCH_CUDA_ARCH_LIST"],
            "why": f"{no_gpu}: keeping the current setting",
        }
    elif readable.get("CUFORGE_ARCH"):
        archs = parse_arch_list(env["CUFORGE_ARCH"])
        out["TORCH_CUDA_ARCH_LIST"] = {
            "value": ";".join(arch_to_torch(a) for a in archs),
            "why": f"{no_gpu}: the arch CUFORGE_ARCH names",
        }
    else:
        out["TORCH_CUDA_ARCH_LIST"] = {
            "value": None,
            "why": f"{no_gpu} and no usable arch setting: name your target GPU's arch",
        }
        if not readable:
            findings.append(
                (
                    "WARN",
                    f"{no_gpu} and neither CUFORGE_ARCH nor TORCH_CUDA_ARCH_LIST is set: "
                    "nothing says which arch to build for",
                    "export CUFORGE_ARCH=sm_90 TORCH_CUDA_ARCH_LIST='9.0'  (your target GPU's arch)",
                )
            )
    # CUFORGE_ARCH matters only without a GPU (a visible GPU wins); keep a good one.
    if not gpu_archs and readable.get("CUFORGE_ARCH"):
        out["CUFORGE_ARCH"] = {
            "value": env["CUFORGE_ARCH"],
            "why": f"{no_gpu}: kernels compile for this arch (keeping the current setting)",
        }
    elif not gpu_archs and readable.get("TORCH_CUDA_ARCH_LIST"):
        archs = parse_arch_list(env["TORCH_CUDA_ARCH_LIST"])
        best = max(archs, key=arch_number)
        out["CUFORGE_ARCH"] = {
            "value": best,
            "why": f"{no_gpu}: the newest arch of TORCH_CUDA_ARCH_LIST",
        }
    elif not gpu_archs:
        # the line README promises without a GPU: unset, and what to set it to
        out["CUFORGE_ARCH"] = {
            "value": None,
            "why": f"{no_gpu} and no usable arch setting: export CUFORGE_ARCH=<your target "
            "GPU's arch, e.g. sm_90>",
        }

    # MAX_JOBS: ninja's parallelism for torch extension builds.
    jobs, why = recommended_jobs(res)
    out["MAX_JOBS"] = {"value": str(jobs), "why": why}
    current_jobs = env.get("MAX_JOBS")
    if current_jobs and current_jobs != str(jobs):
        findings.append(
            (
                "WARN",
                f"MAX_JOBS={current_jobs} is set; this machine suits {jobs} ({why})",
                f"export MAX_JOBS={jobs}",
            )
        )
    if not shutil.which("ninja", path=env.get("PATH", "")):
        findings.append(
            (
                "WARN",
                "ninja is not on PATH: torch extension builds need it, and MAX_JOBS does "
                "nothing without it",
                "pip install ninja, and put its bin directory on PATH",
            )
        )

    # nvcc threads: split each nvcc call's archs across threads when jobs leave cores idle.
    arch_value = out["TORCH_CUDA_ARCH_LIST"]["value"]
    n_archs = len(arch_value.split(";")) if arch_value else 1
    threads = max(1, min(n_archs, res["cores"] // max(1, jobs)))
    out["NVCC_THREADS"] = {
        "value": str(threads),
        "why": f"{n_archs} arch(s) per nvcc call, {res['cores']} cores shared by {jobs} jobs"
        + ("" if threads > 1 else ": one thread each is best")
        + " (read by flash-attn/vLLM-style setup.py files; cuforge.torch passes nvcc "
        "--threads itself)",
    }

    # CUDA_HOME: torch guesses it from `which nvcc`; a wrapper script on PATH fools it.
    root = _toolkit_root()
    if root:
        current_home = env.get("CUDA_HOME") or env.get("CUDA_PATH")
        if current_home and os.path.realpath(current_home) != os.path.realpath(root):
            findings.append(
                (
                    "WARN",
                    f"CUDA_HOME={current_home!r} is not the toolkit cuforge uses ({root})",
                    f"export CUDA_HOME={root}",
                )
            )
        out["CUDA_HOME"] = {
            "value": root,
            "why": "the CUDA toolkit cuforge found; torch's own guess from `which nvcc` "
            "is wrong when nvcc on PATH is a wrapper script",
        }

    # CUDA_INC_PATH: torch's cpp_extension adds it to the include path; needed when the
    # library headers its CUDA headers include come only from pip nvidia packages.
    if root and not env.get("CUDA_INC_PATH") and torch_installed():
        places, where = find_library_headers(root)
        pip_dirs = sorted({places[h] for h, w in where.items() if w == "pip" and places[h]})
        if len(pip_dirs) == 1:
            out["CUDA_INC_PATH"] = {
                "value": pip_dirs[0],
                "why": f"{', '.join(h for h, w in where.items() if w == 'pip')} come only "
                f"from pip nvidia packages, not the toolkit at {root}; torch extension "
                "builds add CUDA_INC_PATH to their include path",
            }

    # Triton (and torch.compile's Triton kernels) cached in cuforge, in every process.
    if env.get("TRITON_CACHE_MANAGER") is None and _triton_installed():
        out["TRITON_CACHE_MANAGER"] = {
            "value": "cuforge.triton:CacheManager",
            "why": "Triton's kernels in cuforge's cache (one entry per kernel, every tier; "
            "docs/triton.md)",
        }

    # The cache directory, made explicit so that every tool and process shares it.
    out["CUFORGE_CACHE_DIR"] = {
        "value": settings().cache_dir,
        "why": "the cuforge cache in use"
        + (" (from CUFORGE_CACHE_DIR)" if env.get("CUFORGE_CACHE_DIR") else " (the default)"),
    }
    return {
        "vars": out,
        "findings": findings,
        "gpu_archs": gpu_archs,
        "no_gpu": no_gpu,
        "resources": res,
    }


def _triton_installed() -> bool:
    from importlib.util import find_spec

    return find_spec("triton") is not None


def _toolkit_root() -> str | None:
    try:
        from cuforge import toolchain

        root = toolchain.toolkit_root()
    except Exception:  # noqa: BLE001 - no toolkit: leave CUDA_HOME alone
        return None
    return os.fspath(root) if root else None


# -- rendering ------------------------------------------------------------------------


def _fish_quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def render(settings_: dict[str, Any], shell: str, explain: bool) -> str:
    lines: list[str] = []
    for name, item in settings_["vars"].items():
        value, why = item["value"], item["why"]
        if explain:
            lines.append(f"# {name}: {why}")
        if value is None:
            hint = "  (no GPU visible: export CUFORGE_ARCH=sm_90, your target GPU's arch)"
            lines.append(f"# {name} left unset" + (hint if name == "CUFORGE_ARCH" else ""))
            continue
        if shell == "fish":
            lines.append(f"set -gx {name} {_fish_quote(value)};")
        else:
            lines.append(f"export {name}={shlex.quote(value)}")
    return "\n".join(lines)


def add_parser(subparsers: Any, common: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser(
        "env",
        parents=[common],
        help="print tuned build settings as shell exports",
        description="Print the tuned build settings for this machine as shell exports. "
        'Use as: eval "$(cuforge env)"  (fish: cuforge env --shell fish | source).',
    )
    p.add_argument(
        "--shell",
        choices=("bash", "zsh", "fish", "sh"),
        default="bash",
        help="syntax of the exports (default: bash; zsh and sh read the same)",
    )
    p.add_argument("--explain", action="store_true", help="explain each value in a comment")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the exports (stdout stays eval-able even when a finding FAILs). Exit code 1
    when any finding is a FAIL (a variable that cannot be read), else 0."""
    result = compute()
    failed = any(status == "FAIL" for status, _, _ in result["findings"])
    if args.json:
        output.emit_json(
            {
                "command": "env",
                "ok": not failed,
                "vars": {k: v["value"] for k, v in result["vars"].items()},
                "explain": {k: v["why"] for k, v in result["vars"].items()},
                "findings": [
                    {"status": st, "message": msg, "fix": fix}
                    for st, msg, fix in result["findings"]
                ],
                "gpu_archs": result["gpu_archs"],
                "resources": result["resources"],
            }
        )
        return 1 if failed else 0
    # Findings go to stderr so that stdout stays eval-able.
    for status, message, fix in result["findings"]:
        line = f"cuforge env: {status} {message}"
        print(line + (f"\n    fix: {fix}" if fix else ""), file=sys.stderr)
    print(render(result, args.shell, args.explain))
    return 1 if failed else 0
