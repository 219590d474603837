"""The toolchain checks: ninja, NVRTC and its headers (a real fp16/bf16/CUB compile),
nvcc, the toolkit root, the CUDA library headers torch needs, ccache and sccache."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from typing import Any

import cuforge
from cuforge import toolchain
from cuforge.base.config import settings
from cuforge.cli.doctor.base import Check, Probe, row_maker, run_command
from cuforge.toolchain import locate
from cuforge.toolchain.facts import (
    TORCH_HEADERS,
    find_library_headers,
    identity_headers_version,
    version_tuple,
)
from cuforge.torch.facts import torch_cuda_home_guess, torch_info


def check_ninja(p: Probe) -> list[Check]:
    row = row_maker("ninja", "ninja")
    path = shutil.which("ninja")
    if path:
        rc, text = run_command([path, "--version"])
        if rc == 0:
            return [row("PASS", f"ninja {text} ({path})", path=path)]
        return [
            row(
                "FAIL",
                f"{path} --version failed: {text[:200]}",
                "pip install --force-reinstall ninja",
            )
        ]
    try:
        import ninja  # type: ignore[import-not-found]

        bin_dir = getattr(ninja, "BIN_DIR", None)
    except ImportError:
        bin_dir = None
    if bin_dir and os.path.exists(os.path.join(bin_dir, "ninja")):
        return [
            row(
                "WARN",
                f"ninja is not on PATH; the pip package has it in {bin_dir} "
                "(torch extension builds look on PATH)",
                f'export PATH="{bin_dir}:$PATH"',
                path=None,
                pip_bin_dir=bin_dir,
            )
        ]
    return [
        row(
            "FAIL",
            "ninja is not installed: torch extension builds need it",
            "pip install ninja  (or apt-get install ninja-build)",
            path=None,
        )
    ]


def _compiler_row(
    row: Callable[..., Check],
    label: str,
    find: Callable[[], str],
    version_of: Callable[[], str | None],
    not_found: Callable[[Exception], tuple[str, str, str]],
    broken: Callable[[str], tuple[str, str]],
) -> list[Check]:
    """A compiler's row: ``not_found(exc)`` gives (status, detail, fix) when ``find()``
    raises, ``broken(path)`` (detail, fix) of a FAIL when it has no version, else a PASS."""
    try:
        path = find()
    except Exception as exc:  # noqa: BLE001 - ToolchainError says how to fix it
        return [row(*not_found(exc))]
    version = version_of()
    if not version:
        return [row("FAIL", *broken(path))]
    return [row("PASS", f"{label} {version} ({path})", version=version, path=path)]


def check_nvrtc(p: Probe) -> list[Check]:
    return _compiler_row(
        row_maker("nvrtc", "NVRTC"),
        "NVRTC",
        toolchain.nvrtc_library_path,
        toolchain.nvrtc_version,
        lambda exc: (
            "FAIL",
            f"NVRTC cannot be used: {exc}",
            "pip install 'cuforge[cu13]'  (or 'cuforge[cu12]' for a CUDA 12 driver)",
        ),
        lambda path: (
            f"NVRTC at {path} cannot be loaded",
            "pip install --force-reinstall 'cuforge[cu13]'  (or 'cuforge[cu12]')",
        ),
    )


def check_nvrtc_headers(p: Probe) -> list[Check]:
    """NVRTC against the CUDA headers it compiles with (the key holds both): a newer NVRTC
    than the headers (or an older one) compiles against declarations of another release."""

    row = row_maker("nvrtc.headers", "NVRTC vs headers")
    try:
        identity = toolchain.compiler_identity("nvrtc")
    except Exception as exc:  # noqa: BLE001 - the nvrtc row already says how to fix it
        return [row("SKIP", f"skipped: NVRTC cannot be used ({exc})")]
    nvrtc = version_tuple(identity.get("version"))[:2]
    headers = identity_headers_version(identity.get("headers", ""))
    data = {"nvrtc": identity.get("version"), "headers": identity.get("headers")}
    if headers is None:
        return [
            row(
                "WARN",
                "no CUDA headers found for NVRTC (cuda.h with CUDA_VERSION): kernels that "
                "include <cuda_fp16.h>, <cuda_bf16.h> or CUB cannot compile",
                "pip install --force-reinstall 'cuforge[cu13]'  (or 'cuforge[cu12]'; "
                "or install the CUDA toolkit and export CUDA_HOME=<its root>)",
                **data,
            )
        ]
    h = f"{headers[0]}.{headers[1]}"
    n = ".".join(map(str, nvrtc))
    if nvrtc == headers:
        return [row("PASS", f"NVRTC {n} with CUDA {h} headers", **data)]
    newer = nvrtc > headers
    detail = (
        f"NVRTC {n} compiles with CUDA {h} headers ({identity['headers'].split()[0]}): "
        + (
            "a newer compiler than its headers; kernels may miss intrinsics and types "
            "the headers of its own release declare, and the headers may use builtins "
            "this NVRTC changed"
            if newer
            else "headers newer than the compiler; they may use builtins this NVRTC lacks"
        )
        + " (both are in the cache key, so results stay correct)"
    )
    return [row("WARN", detail, _nvrtc_headers_fix(n), **data)]


def _nvrtc_headers_fix(n: str) -> str:
    """The fix that makes NVRTC ``n`` (``"13.5"``) compile with headers of its release.
    cuforge takes the header wheels of NVRTC's release when they are installed
    (:func:`cuforge.toolchain.locate.toolkit_include_dirs`), so for an NVRTC wheel the fix is
    to install them; an NVRTC from a toolkit wants that toolkit's headers (CUDA_HOME)."""

    library = toolchain.nvrtc_library_path()
    if locate.nvrtc_wheel_version(library) is not None:
        return (
            f"pip install 'cuda-toolkit[nvrtc,cudart,cccl]=={n}.*'  (the header wheels of "
            f"NVRTC's release: cuforge compiles with them once installed; or pin NVRTC to "
            "the headers' release)"
        )
    root = os.path.dirname(os.path.dirname(library))
    while root != os.path.dirname(root) and not toolchain.is_toolkit(root):
        root = os.path.dirname(root)
    if toolchain.is_toolkit(root):
        return f"export CUDA_HOME={root}  (the CUDA {n} toolkit this NVRTC comes from)"
    return f"install the CUDA {n} headers and export CUDA_HOME=<their toolkit root>"


#: tiny kernels that need the CUDA headers NVRTC does not carry itself
_HEADER_KERNELS = {
    "cuda_fp16.h": (
        "#include <cuda_fp16.h>\n"
        'extern "C" __global__ void k(__half* x) { x[0] = __hadd(x[0], x[1]); }\n'
    ),
    "cuda_bf16.h": (
        "#include <cuda_bf16.h>\n"
        'extern "C" __global__ void k(__nv_bfloat16* x) { x[0] = __hadd(x[0], x[1]); }\n'
    ),
    "CUB": (
        "#include <cub/block/block_reduce.cuh>\n"
        'extern "C" __global__ void k(const float* x, float* out) {\n'
        "  using R = cub::BlockReduce<float, 128>;\n"
        "  __shared__ typename R::TempStorage t;\n"
        "  float s = R(t).Sum(x[threadIdx.x]);\n"
        "  if (threadIdx.x == 0) *out = s;\n}\n"
    ),
}


def _header_compile_arch(p: Probe) -> str:
    """A supported arch to compile the header probes for: the visible GPU's, else sm_90
    when NVRTC supports it, else the newest NVRTC supports."""

    gpus, _ = p.gpus()
    if gpus and gpus[0].get("arch"):
        return str(gpus[0]["arch"])
    supported = toolchain.nvrtc_supported_archs()
    if not supported or "sm_90" in supported:
        return "sm_90"
    return supported[-1]


def _compile_headers(arch: str) -> tuple[dict[str, str | None], dict[str, str]]:
    """Compile each of :data:`_HEADER_KERNELS` through the cache the doctor reports on
    (:func:`cuforge.base.config.settings`' cache dir, which ``--cache-dir`` sets): the
    first run compiles them, every later one is a hit. Returns ({name: None or why it
    failed}, {name: where the result came from})."""
    cache = cuforge.Cache(settings().cache_dir)
    failed: dict[str, str | None] = {}
    sources: dict[str, str] = {}
    for name, src in _HEADER_KERNELS.items():
        try:
            prog = cuforge.compile(
                src, name="doctor_" + name.replace(".", "_") + ".cu", arch=arch, cache=cache
            )
        except Exception as exc:  # noqa: BLE001 - a failed compile is this check's answer
            failed[name] = (type(exc).__name__ + ": " + str(exc))[:600]
            continue
        failed[name] = None
        sources[name] = prog.source_of_result
    return failed, sources


def check_header_compiles(p: Probe) -> list[Check]:
    """Real NVRTC compiles of kernels that use cuda_fp16.h, cuda_bf16.h and CUB, through
    the cache the doctor reports on: a second ``cuforge doctor`` compiles nothing
    (``data.sources`` says where each result came from)."""

    row = row_maker("nvrtc.headers_compile", "fp16/bf16/CUB compile")
    try:
        toolchain.nvrtc_library_path()
    except Exception as exc:  # noqa: BLE001 - the nvrtc row already says how to fix it
        return [row("SKIP", f"skipped: NVRTC cannot be used ({exc})")]
    arch = _header_compile_arch(p)
    results, sources = _compile_headers(arch)
    failed = {name: why for name, why in results.items() if why}
    data = {"arch": arch, "failed": failed, "sources": sources}
    if not failed:
        cached = sum(1 for s in sources.values() if s != "compiled")
        how = f"{cached} of {len(sources)} from the cache" if cached else "compiled, now cached"
        return [
            row(
                "PASS",
                f"{', '.join(results)} kernels compile with NVRTC ({arch}; {how})",
                **data,
            )
        ]
    first = next(iter(failed.values())).splitlines()[0][:200]
    return [
        row(
            "FAIL",
            f"{', '.join(failed)} kernels do not compile with NVRTC ({arch}): {first}",
            "pip install --force-reinstall 'cuforge[cu13]'  (or 'cuforge[cu12]': it brings "
            "NVRTC's header wheels; or install the CUDA toolkit and export CUDA_HOME=<its root>)",
            **data,
        )
    ]


def check_nvcc(p: Probe) -> list[Check]:
    return _compiler_row(
        row_maker("nvcc", "nvcc"),
        "nvcc",
        toolchain.nvcc_path,
        toolchain.nvcc_version,
        lambda exc: (
            "WARN",
            f"nvcc not found: backend='nvcc' and torch extension builds need it ({exc})",
            "install the CUDA toolkit and export CUDA_HOME=<its root>",
        ),
        lambda path: (
            f"{path} does not run",
            "reinstall the CUDA toolkit, or point CUFORGE_NVCC at a working nvcc",
        ),
    )


def _has_runtime_header(root: str | None) -> bool:
    return bool(root) and os.path.isfile(os.path.join(str(root), "include", "cuda_runtime.h"))


def _cuda_home_fix(root: str | None) -> str:
    """The export that gives torch a CUDA_HOME with include/cuda_runtime.h."""
    for candidate in (root, "/usr/local/cuda"):
        if _has_runtime_header(candidate):
            return f"export CUDA_HOME={os.path.realpath(str(candidate))}"
    return "install the CUDA toolkit and export CUDA_HOME=<its root>"


def check_cuda_home(p: Probe) -> list[Check]:
    """The toolkit root, and the CUDA_HOME torch.utils.cpp_extension would use
    (``_find_cuda_home``: CUDA_HOME or CUDA_PATH, else the parent of ``which nvcc``'s
    directory, else /usr/local/cuda): WARN when that root lacks include/cuda_runtime.h,
    since torch's extension builds then fail to find the runtime headers."""
    root = toolchain.toolkit_root()
    guess, how = torch_cuda_home_guess()
    row = row_maker("cuda_home", "CUDA toolkit root")
    data = {"toolkit_root": root, "torch_cuda_home": guess}
    set_var = next((v for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)), None)
    if set_var:
        value = os.environ[set_var]
        if not toolchain.is_toolkit(value):
            return [
                row(
                    "FAIL",
                    f"{set_var}={value} is not a CUDA toolkit (neither bin/nvcc nor "
                    "include/cuda_runtime.h)",
                    f"export {set_var}={root}" if root else f"unset {set_var}",
                    **data,
                )
            ]
        if not _has_runtime_header(value):
            return [
                row(
                    "WARN",
                    f"{set_var}={value} has no include/cuda_runtime.h: torch extension builds "
                    "there cannot find the CUDA runtime headers (cuforge.torch finds the "
                    "toolkit itself)",
                    _cuda_home_fix(root).replace("CUDA_HOME", set_var, 1),
                    **data,
                )
            ]
        return [row("PASS", f"{set_var}={value}", **data)]
    if root is None:
        return [
            row(
                "WARN",
                "no CUDA toolkit found (NVRTC still works; nvcc and torch extensions need one)",
                "install the CUDA toolkit and export CUDA_HOME=<its root>",
                **data,
            )
        ]
    if _has_runtime_header(guess):
        return [row("PASS", f"{root} (CUDA_HOME unset; torch finds {guess}, {how})", **data)]
    what = (
        "does not exist" if guess and not os.path.isdir(guess) else "lacks include/cuda_runtime.h"
    )
    return [
        row(
            "WARN",
            f"toolkit at {root}, but CUDA_HOME is unset and torch.utils.cpp_extension would "
            f"use {guess} ({how}), which {what} (cuforge.torch finds the toolkit itself)",
            _cuda_home_fix(root),
            **data,
        )
    ]


def check_cuda_headers(p: Probe) -> list[Check]:
    """The CUDA library headers torch's own headers include (cusparse.h, cublas_v2.h):
    they matter only for torch extensions, so without torch this is a SKIP."""

    row = row_maker("cuda_headers", "CUDA library headers")
    if p.once("torch", torch_info) is None:
        return [
            row(
                "SKIP",
                "skipped: torch is not installed (torch extensions need cusparse.h and "
                "cublas_v2.h; nothing else does)",
            )
        ]
    root = toolchain.toolkit_root()
    places, where = find_library_headers(root)
    data = {"headers": places, "from": where}
    missing = [h for h, d in places.items() if not d]
    pip_only = [h for h in places if where.get(h) == "pip"]
    if missing:
        return [
            row(
                "FAIL",
                f"{', '.join(missing)} not found in the toolkit ({root}) or in pip nvidia "
                "packages: torch's CUDA headers include them",
                "pip install nvidia-cusparse nvidia-cublas  (or the toolkit's "
                "libcusparse-dev / libcublas-dev packages)",
                **data,
            )
        ]
    if pip_only:
        dirs = sorted({places[h] for h in pip_only if places[h]})
        fix = (
            f"export CUDA_INC_PATH={dirs[0]}  (torch's cpp_extension adds it; `cuforge env` does this)"
            if len(dirs) == 1
            else f'export CPATH="{os.pathsep.join(dirs)}:$CPATH"'
        )
        return [
            row(
                "WARN",
                f"{', '.join(pip_only)} only in pip nvidia packages: {', '.join(dirs)} "
                f"(not under the toolkit {root}): cuforge.torch adds them, a plain "
                "torch.utils.cpp_extension build misses them",
                fix,
                **data,
            )
        ]
    headers = ", ".join(h for _, h in TORCH_HEADERS)
    return [row("PASS", f"{headers} in the toolkit ({root})", **data)]


def _ccache_stats(path: str) -> dict[str, Any]:
    rc, text = run_command([path, "--print-stats"])
    if rc != 0:
        return {}
    stats: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) == 2 and parts[1].strip().isdigit():
            stats[parts[0]] = int(parts[1])
    hits = stats.get("direct_cache_hit", 0) + stats.get("preprocessed_cache_hit", 0)
    return {"hits": hits, "misses": stats.get("cache_miss", 0)}


def _sccache_stats(path: str) -> dict[str, Any]:
    rc, text = run_command([path, "--show-stats", "--stats-format", "json"], timeout=30)
    if rc != 0:
        return {}
    try:
        data = json.loads(text[text.find("{") :])
        stats = data.get("stats", data)
        hits = sum((stats.get("cache_hits", {}) or {}).get("counts", {}).values())
        misses = sum((stats.get("cache_misses", {}) or {}).get("counts", {}).values())
    except (ValueError, AttributeError, TypeError):
        return {}
    return {"hits": hits, "misses": misses}


def check_compiler_caches(p: Probe) -> list[Check]:
    rows = []
    for tool, stats_fn in (("ccache", _ccache_stats), ("sccache", _sccache_stats)):
        row = row_maker(tool, tool)
        path = shutil.which(tool)
        if not path:
            rows.append(
                row(
                    "PASS",
                    "not installed (optional: cuforge caches kernels and extension objects itself)",
                    path=None,
                )
            )
            continue
        rc, text = run_command([path, "--version"])
        detail = f"{text.splitlines()[0] if rc == 0 and text else '?'} ({path})"
        stats = stats_fn(path)
        if "hits" in stats:
            total = stats["hits"] + stats["misses"]
            rate = f"{100 * stats['hits'] / total:.0f}%" if total else "no lookups yet"
            detail += f"; {stats['hits']} hits, {stats['misses']} misses ({rate})"
        rows.append(row("PASS", detail, path=path, **stats))
    return rows
