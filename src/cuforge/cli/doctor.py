"""``cuforge doctor``: the setup checklist, made executable.

Every check prints PASS, WARN or FAIL with a one-line fix; SKIP marks a check that could
not run here (no GPU, no torch) and says why. The exit code is 1 when any check FAILs.
``--json`` gives a stable document (``"schema": 1``)::

    {"schema": 1, "command": "doctor", "ok": bool,
     "summary": {"pass": n, "warn": n, "fail": n, "skip": n},
     "gpus": [{"index", "name", "arch", "memory_bytes"}], "no_gpu_reason": str | null,
     "skipped": ["gpu.arch", ...],
     "checks": [{"id", "title", "status", "detail", "fix", "data"}, ...]}

Check ids: ninja, gpu, gpu.arch, gpu.driver, arch_list (arch_list.TORCH_CUDA_ARCH_LIST,
arch_list.CUFORGE_ARCH when set; arch_list.agreement when both are set: WARN when they name
different archs, saying which wins where), build_jobs, ccache, sccache, nvrtc,
nvrtc.headers (NVRTC's version against the CUDA_VERSION of the headers it compiles with),
nvrtc.headers_compile (a real NVRTC compile of tiny kernels using cuda_fp16.h, cuda_bf16.h
and CUB, cache disabled; FAIL with the pip fix when one does not compile), nvcc, cuda_home,
cuda_headers, torch, cache.dir, cache.size, cache.hits, cache.integrity, remote (one per
URL in CUFORGE_REMOTE). The doctor never raises: a check that breaks becomes a WARN saying
so.

``remote`` (:func:`cuforge.store.remote.sync.probe`): reachable (a get of a key that does
not exist answers a miss, not an error), latency (the median of a few such round trips,
``data.latency_ms``), writable (a put and a get of a small probe entry; not tried in
read-only mode), signing (whether CUFORGE_REMOTE_KEY / _KEY_FILE is set, and when it is,
that the probe entry came back through the signature check). FAIL when unreachable or a
write is refused; WARN when slower than the transfer timeout's tenth; SKIP when no remote
is configured.

``cache.dir`` FAILs when the cache dir, or a directory directly under it (``v1``,
``locks``, ...), fails :func:`cuforge._fs.trust_problem` (not owned by you, or writable by
group or others): cuforge then reads nothing from it, and the fix (``chmod go-w ...`` or
``chown ...``) is printed; the cache.size/hits/integrity checks are SKIPped.
"""

from __future__ import annotations

import argparse
import os
import shutil
from collections.abc import Callable
from typing import Any

from cuforge.cli import output

__all__ = ["add_parser", "run", "collect", "Check", "STATUSES"]

STATUSES = ("PASS", "WARN", "FAIL", "SKIP")


class Check:
    """One row of the report."""

    __slots__ = ("id", "title", "status", "detail", "fix", "data")

    def __init__(
        self,
        id: str,
        title: str,
        status: str,
        detail: str,
        fix: str | None = None,
        data: dict[str, Any] | None = None,
    ) -> None:
        assert status in STATUSES, status
        self.id, self.title, self.status, self.detail = id, title, status, detail
        self.fix, self.data = fix, data or {}

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


def _rows(id: str, title: str) -> Callable[..., Check]:
    """``row(status, detail, fix=None, **data)`` making Checks of one id and title."""

    def row(status: str, detail: str, fix: str | None = None, **data: Any) -> Check:
        return Check(id, title, status, detail, fix, data)

    return row


def _run(cmd: list[str], timeout: float = 20) -> tuple[int, str]:
    import subprocess

    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return -1, str(exc)
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def _version_tuple(text: str | None) -> tuple[int, ...]:
    out: list[int] = []
    for part in (text or "").split("."):
        if not part.isdigit():
            break
        out.append(int(part))
    return tuple(out)


class _Probe:
    """Facts several checks share, each found once."""

    def __init__(self) -> None:
        from cuforge.cli.env import machine_resources

        self.resources = machine_resources()
        self._gpus: tuple[list[dict[str, Any]], str | None] | None = None
        self._memo: dict[str, Any] = {}

    def once(self, name: str, fn: Callable[[], Any]) -> Any:
        if name not in self._memo:
            try:
                self._memo[name] = (fn(), None)
            except Exception as exc:  # noqa: BLE001 - kept and re-raised to each asker
                self._memo[name] = (None, exc)
        value, exc = self._memo[name]
        if exc is not None:
            raise exc
        return value

    def gpus(self) -> tuple[list[dict[str, Any]], str | None]:
        """([{"index", "name", "arch", "memory_bytes"}], None) or ([], why there are none)."""
        if self._gpus is None:
            self._gpus = _query_gpus()
        return self._gpus


def _query_gpus() -> tuple[list[dict[str, Any]], str | None]:
    """The visible GPUs through the driver API (:func:`cuforge.toolchain.gpu.devices`:
    ctypes, no CUDA Python bindings needed)."""
    from cuforge.toolchain import gpu

    return gpu.devices()


def _kernel_driver_version() -> str | None:
    """The display driver's version (``580.159.04``), or None."""
    try:
        with open("/proc/driver/nvidia/version") as f:
            text = f.read()
    except OSError:
        return None
    for token in text.split():
        if token.count(".") >= 1 and token.replace(".", "").isdigit():
            return token
    return None


# -- the checks -----------------------------------------------------------------------


def check_ninja(p: _Probe) -> list[Check]:
    row = _rows("ninja", "ninja")
    path = shutil.which("ninja")
    if path:
        rc, text = _run([path, "--version"])
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


def check_nvrtc(p: _Probe) -> list[Check]:
    from cuforge import toolchain

    row = _rows("nvrtc", "NVRTC")
    try:
        path = toolchain.nvrtc_library_path()
    except Exception as exc:  # noqa: BLE001 - ToolchainError says how to fix it
        return [
            row(
                "FAIL",
                f"NVRTC cannot be used: {exc}",
                "pip install 'cuforge[cu13]'  (or 'cuforge[cu12]' for a CUDA 12 driver)",
            )
        ]
    version = toolchain.nvrtc_version()
    if not version:
        return [
            row(
                "FAIL",
                f"NVRTC at {path} cannot be loaded",
                "pip install --force-reinstall 'cuforge[cu13]'  (or 'cuforge[cu12]')",
            )
        ]
    return [row("PASS", f"NVRTC {version} ({path})", version=version, path=path)]


def _headers_cuda_version(headers: str) -> tuple[int, int] | None:
    """(major, minor) from the NVRTC identity's ``headers`` field (``CUDA_VERSION=13000``)."""
    import re

    m = re.search(r"CUDA_VERSION=(\d+)", headers or "")
    if not m:
        return None
    value = int(m.group(1))
    return value // 1000, (value % 1000) // 10


def check_nvrtc_headers(p: _Probe) -> list[Check]:
    """NVRTC against the CUDA headers it compiles with (the key holds both): a newer NVRTC
    than the headers (or an older one) compiles against declarations of another release."""
    from cuforge import toolchain

    row = _rows("nvrtc.headers", "NVRTC vs headers")
    try:
        identity = toolchain.compiler_identity("nvrtc")
    except Exception as exc:  # noqa: BLE001 - the nvrtc row already says how to fix it
        return [row("SKIP", f"skipped: NVRTC cannot be used ({exc})")]
    nvrtc = _version_tuple(identity.get("version"))[:2]
    headers = _headers_cuda_version(identity.get("headers", ""))
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
    fix = (
        f"pip install 'cuda-toolkit[nvrtc,cudart,cccl]=={n}.*'  (one release for NVRTC "
        f"and its headers; or point CUDA_HOME at a CUDA {n} toolkit)"
    )
    return [row("WARN", detail, fix, **data)]


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

_HEADER_COMPILE_CHILD = """
import json, sys
import cuforge
arch, kernels = sys.argv[1], json.loads(sys.stdin.read())
out = {}
for name, src in kernels.items():
    try:
        cuforge.compile(src, name="doctor_" + name.replace(".", "_") + ".cu", arch=arch)
        out[name] = None
    except Exception as exc:  # noqa: BLE001
        out[name] = (type(exc).__name__ + ": " + str(exc))[:600]
print(json.dumps(out))
"""


def _header_compile_arch(p: _Probe) -> str:
    """A supported arch to compile the header probes for: the visible GPU's, else sm_90
    when NVRTC supports it, else the newest NVRTC supports."""
    from cuforge import toolchain

    gpus, _ = p.gpus()
    if gpus and gpus[0].get("arch"):
        return str(gpus[0]["arch"])
    supported = toolchain.nvrtc_supported_archs()
    if not supported or "sm_90" in supported:
        return "sm_90"
    return supported[-1]


def check_header_compiles(p: _Probe) -> list[Check]:
    """Real NVRTC compiles of kernels that use cuda_fp16.h, cuda_bf16.h and CUB, in a
    child process with the cache disabled (nothing is read from or written to the cache)."""
    import json
    import subprocess
    import sys

    from cuforge import toolchain

    row = _rows("nvrtc.headers_compile", "fp16/bf16/CUB compile")
    try:
        toolchain.nvrtc_library_path()
    except Exception as exc:  # noqa: BLE001 - the nvrtc row already says how to fix it
        return [row("SKIP", f"skipped: NVRTC cannot be used ({exc})")]
    arch = _header_compile_arch(p)
    env = dict(os.environ, CUFORGE_DISABLE_CACHE="1", CUFORGE_PROGRESS="0")
    try:
        done = subprocess.run(
            [sys.executable, "-c", _HEADER_COMPILE_CHILD, arch],
            input=json.dumps(_HEADER_KERNELS),
            capture_output=True,
            text=True,
            timeout=180,
            env=env,
            check=False,
        )
        results = json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
        return [row("WARN", f"could not run the test compile ({exc})", None, arch=arch)]
    failed = {name: why for name, why in results.items() if why}
    data = {"arch": arch, "failed": failed}
    if not failed:
        return [row("PASS", f"{', '.join(results)} kernels compile with NVRTC ({arch})", **data)]
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


def check_fast_launch(p: _Probe) -> list[Check]:
    """Which fast launch path kernels use: the C extension installed with cuforge, one
    built on first use into the cache dir, or the ~1.4x slower pure-Python path."""
    from cuforge.runtime import fastlaunch

    row = _rows("fast_launch", "fast launch path")
    path, detail = fastlaunch.status()
    if path == "installed":
        return [row("PASS", f"the C launcher installed with cuforge ({detail})", path=path)]
    if path == "built":
        return [
            row(
                "PASS",
                f"the C launcher built on first use ({detail})",
                path=path,
            )
        ]
    return [
        row(
            "WARN",
            f"launches use the pure-Python path, ~1.4x slower than the C launcher: {detail}",
            "install a C compiler and the Python headers (apt-get install gcc python3-dev), "
            "then pip install --force-reinstall cuforge",
            path=path,
        )
    ]


def check_arch_agreement(p: _Probe) -> list[Check]:
    """CUFORGE_ARCH against TORCH_CUDA_ARCH_LIST when both are set."""
    from cuforge.arch import parse_arch_list

    row = _rows("arch_list.agreement", "CUFORGE_ARCH vs torch")
    ours = os.environ.get("CUFORGE_ARCH", "").strip()
    torch_list = os.environ.get("TORCH_CUDA_ARCH_LIST", "").strip()
    if not (ours and torch_list):
        return []
    try:
        a, b = parse_arch_list(ours), parse_arch_list(torch_list)
    except ValueError:
        return []  # the arch_list rows report the unreadable one
    data = {"CUFORGE_ARCH": list(a), "TORCH_CUDA_ARCH_LIST": list(b)}
    if sorted(set(a)) == sorted(set(b)):
        return [row("PASS", f"both name {', '.join(a)}", **data)]
    return [
        row(
            "WARN",
            f"CUFORGE_ARCH={ours!r} ({', '.join(a)}) and TORCH_CUDA_ARCH_LIST="
            f"{torch_list!r} ({', '.join(b)}) disagree. With no GPU visible, CUFORGE_ARCH wins "
            "for cuforge (cuforge.compile, `cuforge compile`, cuforge.torch builds); "
            "TORCH_CUDA_ARCH_LIST decides plain torch.utils.cpp_extension and setup.py builds",
            "unset CUFORGE_ARCH  (or export TORCH_CUDA_ARCH_LIST to the same archs)",
            **data,
        )
    ]


def check_nvcc(p: _Probe) -> list[Check]:
    from cuforge import toolchain

    row = _rows("nvcc", "nvcc")
    try:
        path = toolchain.nvcc_path()
    except Exception as exc:  # noqa: BLE001 - ToolchainError says how to fix it
        return [
            row(
                "WARN",
                f"nvcc not found: backend='nvcc' and torch extension builds need it ({exc})",
                "install the CUDA toolkit and export CUDA_HOME=<its root>",
            )
        ]
    version = toolchain.nvcc_version()
    if not version:
        return [
            row(
                "FAIL",
                f"{path} does not run",
                "reinstall the CUDA toolkit, or point CUFORGE_NVCC at a working nvcc",
            )
        ]
    return [row("PASS", f"nvcc {version} ({path})", version=version, path=path)]


def _torch_cuda_home_guess() -> tuple[str | None, str]:
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


def check_cuda_home(p: _Probe) -> list[Check]:
    from cuforge import toolchain

    root = toolchain.toolkit_root()
    guess, how = _torch_cuda_home_guess()
    row = _rows("cuda_home", "CUDA toolkit root")
    data = {"toolkit_root": root, "torch_cuda_home": guess}
    set_var = next((v for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)), None)
    if set_var:
        value = os.environ[set_var]
        if toolchain.is_toolkit(value):
            return [row("PASS", f"{set_var}={value}", **data)]
        return [
            row(
                "FAIL",
                f"{set_var}={value} is not a CUDA toolkit (neither bin/nvcc nor "
                "include/cuda_runtime.h)",
                f"export {set_var}={root}" if root else f"unset {set_var}",
                **data,
            )
        ]
    if root is None:
        return [
            row(
                "WARN",
                "no CUDA toolkit found (NVRTC still works; nvcc and torch extensions need one)",
                "install the CUDA toolkit and export CUDA_HOME=<its root>",
                **data,
            )
        ]
    if guess and toolchain.is_toolkit(guess):
        return [row("PASS", f"{root} (CUDA_HOME unset; torch finds {guess}, {how})", **data)]
    return [
        row(
            "WARN",
            f"toolkit at {root}, but CUDA_HOME is unset and torch.utils.cpp_extension would "
            f"use {guess} ({how}), which is not a toolkit (cuforge.torch finds the toolkit itself)",
            f"export CUDA_HOME={root}",
            **data,
        )
    ]


def _torch_info() -> dict[str, Any] | None:
    """torch's version and CUDA version, read from torch/version.py without importing
    torch (which takes seconds and may initialize CUDA). None when torch is absent."""
    import importlib.util

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


def check_cuda_headers(p: _Probe) -> list[Check]:
    from cuforge import toolchain
    from cuforge.cli.env import TORCH_HEADERS, find_library_headers

    root = toolchain.toolkit_root()
    torch = p.once("torch", _torch_info)
    places, where = find_library_headers(root)
    row = _rows("cuda_headers", "CUDA library headers")
    data = {"headers": places, "from": where}
    missing = [h for h, d in places.items() if not d]
    pip_only = [h for h in places if where.get(h) == "pip"]
    if missing:
        return [
            row(
                "FAIL" if torch else "WARN",
                f"{', '.join(missing)} not found in the toolkit ({root}) or in pip nvidia "
                "packages: torch's CUDA headers include them"
                + ("" if torch else " (needed only for torch extensions; torch is not installed)"),
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


def check_gpus(p: _Probe) -> list[Check]:
    from cuforge import toolchain

    gpu_row = _rows("gpu", "GPUs")
    arch_row = _rows("gpu.arch", "GPU arch support")
    driver_row = _rows("gpu.driver", "driver vs toolkit")
    gpus, why = p.gpus()
    if not gpus:
        return [
            gpu_row("SKIP", f"no GPU: {why}", gpus=[]),
            arch_row("SKIP", "skipped: no GPU"),
            driver_row("SKIP", "skipped: no GPU"),
        ]
    driver = toolchain.driver_version()
    kernel_driver = _kernel_driver_version()
    drv = f"{driver // 1000}.{driver % 1000 // 10}" if driver else "?"
    desc = "; ".join(f"#{g['index']} {g['name']} ({g['arch']})" for g in gpus)
    rows = [
        gpu_row(
            "PASS",
            f"{desc}; driver {kernel_driver or '?'} (CUDA {drv})",
            gpus=gpus,
            driver_cuda=driver,
            driver=kernel_driver,
        )
    ]
    # Can the compilers target each GPU's arch?
    archs = sorted({g["arch"] for g in gpus})
    problems, notes = [], []
    for backend in ("nvrtc", "nvcc"):
        supported = p.once(f"supported.{backend}", lambda b=backend: toolchain.supported_archs(b))
        if not supported:
            notes.append(f"{backend}: unavailable")
            continue
        bad = [a for a in archs if a not in supported]
        if bad:
            problems.append(f"{backend} cannot build {', '.join(bad)}")
        else:
            notes.append(f"{backend} builds {', '.join(archs)}")
    if problems:
        rows.append(
            arch_row(
                "FAIL" if any(pb.startswith("nvrtc") for pb in problems) else "WARN",
                "; ".join(problems + notes),
                "install a newer CUDA toolkit / nvidia-cuda-nvrtc that knows this GPU",
            )
        )
    else:
        rows.append(arch_row("PASS", "; ".join(notes)))
    # Is the driver new enough for what the compilers emit?
    if not driver:
        rows.append(
            driver_row("WARN", "the driver's CUDA version is unknown", "update the NVIDIA driver")
        )
        return rows
    dv = (driver // 1000, driver % 1000 // 10)
    worst, lines, fix = "PASS", [], None
    for label, version in (
        ("NVRTC", toolchain.nvrtc_version()),
        ("nvcc", toolchain.nvcc_version()),
    ):
        tv = _version_tuple(version)[:2]
        if len(tv) < 2:
            continue
        if tv[0] > dv[0]:
            worst = "FAIL"
            lines.append(
                f"{label} {version} is CUDA {tv[0]}, the driver only CUDA {drv}: its output "
                "cannot load (CUDA_ERROR_UNSUPPORTED_PTX_VERSION)"
            )
            fix = (
                f"install a driver for CUDA {tv[0]}.{tv[1]}+, or a CUDA {dv[0]} toolkit / "
                "nvidia-cuda-nvrtc"
            )
        elif tv > dv:
            worst = "WARN" if worst == "PASS" else worst
            lines.append(
                f"{label} {version} is newer than the driver's CUDA {drv}: cubins load, but its "
                "PTX fails with CUDA_ERROR_UNSUPPORTED_PTX_VERSION"
            )
            fix = fix or (
                f"compile to cubin (the default), or install a driver for CUDA {tv[0]}.{tv[1]}+"
            )
        else:
            lines.append(f"{label} {version} <= driver CUDA {drv}")
    rows.append(driver_row(worst, "; ".join(lines), fix))
    return rows


def check_arch_list(p: _Probe) -> list[Check]:
    from cuforge.arch import arch_to_torch
    from cuforge.cli.env import arch_findings, supported_archs

    gpus, why = p.gpus()
    gpu_archs = sorted({g["arch"] for g in gpus})
    supported = p.once("supported.nvrtc", lambda: supported_archs())
    rows = []
    for name in ("TORCH_CUDA_ARCH_LIST", "CUFORGE_ARCH"):
        value = os.environ.get(name)
        if not value:
            continue
        row = _rows(f"arch_list.{name}", name)
        found = arch_findings(name, value, gpu_archs, supported)
        if not found:
            rows.append(row("PASS", f"{name}={value!r}"))
            continue
        rows.append(
            row(
                "FAIL" if any(st == "FAIL" for st, _, _ in found) else "WARN",
                "; ".join(msg for _, msg, _ in found),
                next(fix for _, _, fix in found if fix),
                findings=[{"status": s, "message": m, "fix": f} for s, m, f in found],
            )
        )
    if rows:
        return rows
    row = _rows("arch_list", "arch list")
    if gpu_archs:
        want = ";".join(arch_to_torch(a) for a in gpu_archs)
        return [
            row(
                "WARN",
                f"not set: kernels use the visible GPU ({', '.join(gpu_archs)}), torch "
                "extensions build for every visible card and warn; pin it for "
                "reproducible, shareable builds",
                f"export TORCH_CUDA_ARCH_LIST='{want}'",
            )
        ]
    return [
        row(
            "WARN",
            f"not set, and {why}: compile() without arch= raises ArchError, "
            "and torch cannot tell which arch to build",
            "export CUFORGE_ARCH=sm_90 TORCH_CUDA_ARCH_LIST='9.0'  (your target GPU)",
        )
    ]


def check_jobs(p: _Probe) -> list[Check]:
    from cuforge.cli.env import recommended_jobs
    from cuforge.torch.jobs import TORCH_TU_BYTES

    res = p.resources
    cores, mem = res["cores"], res["memory_available"] or 0
    jobs, why = recommended_jobs(res)
    row = _rows("build_jobs", "build jobs")
    data = {**res, "recommended": jobs}
    fix = f"export MAX_JOBS={jobs}"
    have = f"{cores} cores, {output.human_bytes(mem)} available"
    current = os.environ.get("MAX_JOBS")
    if not current:
        ninja_default = cores + 2
        if mem and ninja_default * TORCH_TU_BYTES > mem:
            return [
                row(
                    "WARN",
                    f"MAX_JOBS unset: ninja runs {ninja_default} jobs, but "
                    f"{output.human_bytes(mem)} fits {jobs} ({why})",
                    fix,
                    **data,
                )
            ]
        return [row("PASS", f"{have}: {jobs} jobs ({why})", **data)]
    if not current.strip().isdigit():
        return [row("FAIL", f"MAX_JOBS={current!r} is not a number", fix, **data)]
    n = int(current)
    if mem and n * TORCH_TU_BYTES > mem:
        need = output.human_bytes(n * TORCH_TU_BYTES)
        return [
            row(
                "WARN",
                f"MAX_JOBS={n} needs ~{need}, {output.human_bytes(mem)} available: builds may "
                "be OOM-killed",
                fix,
                **data,
            )
        ]
    if n > cores * 2:
        return [row("WARN", f"MAX_JOBS={n} for {cores} cores oversubscribes the CPU", fix, **data)]
    return [row("PASS", f"MAX_JOBS={n}; {have}", **data)]


def _ccache_stats(path: str) -> dict[str, Any]:
    rc, text = _run([path, "--print-stats"])
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
    import json

    rc, text = _run([path, "--show-stats", "--stats-format", "json"], timeout=30)
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


def check_compiler_caches(p: _Probe) -> list[Check]:
    rows = []
    for tool, stats_fn in (("ccache", _ccache_stats), ("sccache", _sccache_stats)):
        row = _rows(tool, tool)
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
        rc, text = _run([path, "--version"])
        detail = f"{text.splitlines()[0] if rc == 0 and text else '?'} ({path})"
        stats = stats_fn(path)
        if "hits" in stats:
            total = stats["hits"] + stats["misses"]
            rate = f"{100 * stats['hits'] / total:.0f}%" if total else "no lookups yet"
            detail += f"; {stats['hits']} hits, {stats['misses']} misses ({rate})"
        rows.append(row("PASS", detail, path=path, **stats))
    return rows


def check_torch(p: _Probe) -> list[Check]:
    from cuforge import toolchain

    row = _rows("torch", "torch")
    info = p.once("torch", _torch_info)
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
    tv, nv = _version_tuple(cuda), _version_tuple(nvcc)
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


def _probe_writable(root: str) -> bool:
    import tempfile

    try:
        fd, path = tempfile.mkstemp(prefix=".doctor-", dir=root)
    except OSError:
        return False
    os.close(fd)
    os.unlink(path)
    return True


def _trust_problems(root: str) -> list[tuple[str, str | None]]:
    """(problem, fix) for the cache dir and each directory directly under it (``v1``,
    ``locks``, ``runtime``, ...) that fails :func:`cuforge._fs.trust_problem`."""
    from cuforge import _fs

    dirs = [root]
    try:
        with os.scandir(root) as it:
            dirs += sorted(e.path for e in it if e.is_dir(follow_symlinks=False))
    except OSError:
        pass
    found: list[tuple[str, str | None]] = []
    for path in dirs:
        problem = _fs.trust_problem(path)
        if problem is None:
            continue
        # trust_problem ends with the fix in backquotes: pull it out for the fix line
        start, end = problem.find("`"), problem.rfind("`")
        fix = problem[start + 1 : end] if 0 <= start < end else None
        found.append((problem, fix))
    return found


def _check_cache_dir(root: str, disabled: str | None) -> list[Check]:
    row = _rows("cache.dir", "cache dir")
    rows = []
    if disabled:
        rows.append(row("WARN", f"{disabled}=1: nothing is cached on disk", f"unset {disabled}"))
    if not os.path.isdir(root):
        parent = root
        while parent and not os.path.exists(parent):
            parent = os.path.dirname(parent)
        if parent and os.access(parent, os.W_OK | os.X_OK):
            rows.append(
                row(
                    "PASS", f"{root} (created with mode 0700 on first use)", path=root, exists=False
                )
            )
        else:
            rows.append(
                row(
                    "FAIL",
                    f"{root} cannot be created ({parent} is not writable): nothing will be cached",
                    "export CUFORGE_CACHE_DIR=<a writable directory>",
                    path=root,
                    exists=False,
                )
            )
        return rows
    mode = os.stat(root).st_mode & 0o777
    problems = _trust_problems(root)
    if problems:
        fixes = [fix for _, fix in problems if fix]
        rows.append(
            row(
                "FAIL",
                "cuforge will not use this cache dir (whoever can write it can run code in "
                "your processes): " + "; ".join(problem for problem, _ in problems),
                " && ".join(dict.fromkeys(fixes)) or "export CUFORGE_CACHE_DIR=~/.cache/cuforge",
                path=root,
                exists=True,
                mode=oct(mode),
                untrusted=[problem for problem, _ in problems],
            )
        )
        return rows
    writable = _probe_writable(root)
    data = {"path": root, "exists": True, "mode": oct(mode), "writable": writable}
    if not writable:
        rows.append(
            row(
                "FAIL",
                f"{root} is not writable: compiles work but nothing is cached",
                f"chmod u+rwx {root}  (or export CUFORGE_CACHE_DIR=<a writable directory>)",
                **data,
            )
        )
    elif mode & 0o077:
        rows.append(
            row(
                "WARN",
                f"{root} has mode {oct(mode)}: other users can read or plant cached binaries",
                f"chmod 700 {root}",
                **data,
            )
        )
    else:
        rows.append(row("PASS", f"{root} (mode {oct(mode)})", **data))
    return rows


def check_cache(p: _Probe) -> list[Check]:
    from cuforge.config import settings
    from cuforge.store import telemetry
    from cuforge.store.disk import DiskStore

    st = settings()
    root = st.cache_dir
    disabled = (
        "CUFORGE_DISABLE_CACHE"
        if st.disable_cache
        else "CUFORGE_DISABLE_FILE_CACHE"
        if st.disable_file_cache
        else None
    )
    rows = _check_cache_dir(root, disabled)
    if not os.path.isdir(root):
        return rows
    if rows[-1].status == "FAIL" and rows[-1].data.get("untrusted"):
        why = "skipped: the cache dir is not trusted (see cache dir), so nothing is read from it"
        return rows + [
            Check("cache.size", "cache size", "SKIP", why),
            Check("cache.hits", "cache hit rate", "SKIP", why),
            Check("cache.integrity", "cache integrity", "SKIP", why),
        ]

    store = DiskStore(root, st.cache_max_bytes, telemetry=False)
    stats = store.stats()
    cap, used = st.cache_max_bytes, stats.bytes
    row = _rows("cache.size", "cache size")
    detail = f"{stats.entries} entries, {output.human_bytes(used)}"
    if cap:
        detail += f" of {output.human_bytes(cap)} ({100 * used / cap:.0f}%)"
    data = {"entries": stats.entries, "bytes": used, "max_bytes": cap}
    if cap and used > cap:
        rows.append(
            row(
                "WARN",
                detail + ": over the cap (the next write evicts)",
                "cuforge cache prune",
                **data,
            )
        )
    else:
        rows.append(row("PASS", detail, **data))

    row = _rows("cache.hits", "cache hit rate")
    summ = telemetry.summary(root)
    disk = summ.get("tiers", {}).get("disk", {})
    hits, misses = disk.get("hits", 0), disk.get("misses", 0)
    if not summ.get("enabled", True):
        rows.append(row("PASS", "telemetry is off (CUFORGE_TELEMETRY=0)", enabled=False))
    elif hits + misses == 0:
        rows.append(row("PASS", "no lookups recorded yet", **disk))
    else:
        rate = hits / (hits + misses)
        saved = output.human_seconds(summ.get("seconds_saved", 0.0))
        rows.append(
            row(
                "PASS",
                f"disk tier: {hits} hits, {misses} misses ({100 * rate:.0f}%), "
                f"{saved} of compiling saved",
                hit_rate=rate,
                **disk,
            )
        )

    row = _rows("cache.integrity", "cache integrity")
    report = store.verify(repair=False, quick=True)
    corrupt, checked = len(report.corrupt), report.checked
    if corrupt:
        rows.append(
            row(
                "WARN",
                f"{corrupt} of {checked} entries are damaged (they miss and get rebuilt; "
                "never served)",
                "cuforge cache verify --repair",
                checked=checked,
                corrupt=corrupt,
            )
        )
    else:
        rows.append(
            row(
                "PASS",
                f"{checked} entries checked (quick), none damaged",
                checked=checked,
                corrupt=0,
            )
        )
    return rows


def check_remote(p: _Probe) -> list[Check]:
    """One row per URL in CUFORGE_REMOTE (see the module docstring)."""
    from cuforge.config import settings

    row = _rows("remote", "remote cache")
    st = settings()
    if not st.remote:
        return [row("SKIP", "no remote cache configured (CUFORGE_REMOTE is unset)")]
    from cuforge.store.remote import open_remotes, sync

    try:
        remotes = list(open_remotes(st))
    except Exception as exc:  # noqa: BLE001 - a bad URL or plug-in is this check's answer
        return [
            row(
                "FAIL",
                f"CUFORGE_REMOTE cannot be used: {exc}",
                "fix CUFORGE_REMOTE (redis://host:port/db, http(s)://host/prefix, "
                "file:///dir) or CUFORGE_REMOTE_BACKEND",
            )
        ]
    return [_remote_row(row, sync.probe(remote, st), st) for remote in remotes]


def _remote_row(row: Callable[..., Check], r: Any, st: Any) -> Check:
    data = r.as_dict()
    if not r.reachable:
        return row(
            "FAIL",
            f"{r.remote} is unreachable ({_reason(r.error, r.remote)}); compiles go on without it",
            "start the server or fix the URL in CUFORGE_REMOTE (on a slow network, raise "
            "CUFORGE_REMOTE_CONNECT_TIMEOUT)",
            **data,
        )
    status, fix = "PASS", None
    parts = [f"{r.latency_ms:.1f} ms"]
    if r.readonly:
        parts.append("read-only")
    elif r.writable:
        parts.append("writable")
    else:
        status = "FAIL"
        parts.append(f"not writable ({_reason(r.error, r.remote)})")
        fix = (
            "let this user write the remote (permissions, maxmemory, disk space), or "
            "export CUFORGE_REMOTE_READONLY=1"
        )
    if not r.signed:
        parts.append("unsigned (CUFORGE_REMOTE_KEY signs entries)")
    elif r.verified is False:
        status = "FAIL"
        parts.append("signed, but the probe entry did not verify")
        fix = "give every machine the same CUFORGE_REMOTE_KEY (or CUFORGE_REMOTE_KEY_FILE)"
    else:
        parts.append("signed, verified" if r.verified else "signed")
    if status == "PASS" and r.latency_ms > st.remote_timeout * 100:  # a tenth, in ms
        status = "WARN"
        fix = "use a closer server, or raise CUFORGE_REMOTE_TIMEOUT"
    return row(status, f"{r.remote}: " + ", ".join(parts), fix, **data)


def _reason(error: str | None, url: str) -> str:
    """A remote's error without the class name and URL the row already shows."""
    text = error or "no reason given"
    for prefix in ("get: ", "put: ", "RemoteError: ", f"remote cache {url}: "):
        if text.startswith(prefix):
            text = text[len(prefix) :]
    return text


#: In the order of the issue's checklist: build tools, GPUs, archs, parallelism, compiler
#: caches, the toolkit, torch, the cache, the remote cache.
CHECKS: tuple[tuple[str, Callable[[_Probe], list[Check]]], ...] = (
    ("ninja", check_ninja),
    ("gpu", check_gpus),
    ("arch_list", check_arch_list),
    ("arch_list.agreement", check_arch_agreement),
    ("build_jobs", check_jobs),
    ("ccache", check_compiler_caches),
    ("nvrtc", check_nvrtc),
    ("nvrtc.headers", check_nvrtc_headers),
    ("nvrtc.headers_compile", check_header_compiles),
    ("nvcc", check_nvcc),
    ("cuda_home", check_cuda_home),
    ("cuda_headers", check_cuda_headers),
    ("torch", check_torch),
    ("cache", check_cache),
    ("remote", check_remote),
    ("fast_launch", check_fast_launch),
)


def collect() -> tuple[list[Check], _Probe]:
    """Run every check. A check that breaks becomes a WARN saying so, never a crash."""
    probe = _Probe()
    rows: list[Check] = []
    for name, fn in CHECKS:
        try:
            rows.extend(fn(probe))
        except Exception as exc:  # noqa: BLE001 - the doctor must finish its report
            rows.append(
                Check(
                    name,
                    name,
                    "WARN",
                    f"could not run this check ({type(exc).__name__}: {exc})",
                    "report this at the cuforge issue tracker with `cuforge doctor --json`",
                )
            )
    return rows, probe


_COLORS = {"PASS": "green", "WARN": "yellow", "FAIL": "bold red", "SKIP": "dim"}

#: doctor's output fits this many columns (a terminal's or not): details wrap with a
#: hanging indent, and a fix command is never split (see :func:`layout`)
_COLUMNS = 80
#: where ``fix: COMMAND`` goes when it does not fit under the detail: under the title
_FIX_INDENT = 0
#: first words that make a fix a shell command (kept whole) rather than prose (wrapped)
_COMMAND_WORDS = frozenset(
    {
        "export", "unset", "pip", "pip3", "python", "python3", "uv", "conda", "apt-get",
        "apt", "sudo", "chmod", "chown", "rm", "mkdir", "ln", "mv", "cuforge", "eval",
    }
)  # fmt: skip


def _split_fix(fix: str) -> tuple[str, str]:
    """(the command to copy, a note after it): ``"pip install x  (or apt-get ...)"`` ->
    ``("pip install x", "(or apt-get ...)")``. Fixes write a note after two spaces."""
    command, sep, note = fix.partition("  (")
    return (command.strip(), "(" + note.strip()) if sep else (fix.strip(), "")


def _is_command(text: str) -> bool:
    return (text.split() or [""])[0] in _COMMAND_WORDS


def _wrap(text: str, room: int) -> list[str]:
    """Word-wrap ``text`` to ``room`` columns, never inside a `backquoted command` nor
    inside a word (a long path stays whole on its own line)."""
    import re
    import textwrap

    glue = "\x00"
    joined = re.sub(r"`[^`]*`", lambda m: m.group(0).replace(" ", glue), text)
    lines = textwrap.wrap(joined, room, break_on_hyphens=False, break_long_words=False)
    return [line.replace(glue, " ") for line in lines] or [""]


def layout(rows: list[Check], columns: int = _COLUMNS) -> list[tuple[str | None, str]]:
    """The report as (status or None, text) lines, each within ``columns`` once the
    6-column status head (``"FAIL  "``) is added, except a fix command or a path longer
    than a line: those stay whole (copy-paste must work) on lines of their own.

    * a row: ``TITLE  detail...``, the detail wrapped at word boundaries, its continuation
      lines indented under the detail's first column;
    * a WARN or FAIL row's fix, when it is a shell command: ``fix: COMMAND`` under the
      detail when it fits there, else ``fix: COMMAND`` on its own line under the title
      column, whole; a note after the command (``"  (or ...)"``) wraps on lines indented
      under the command. A prose fix wraps like a detail, never inside `backquotes`.
    * no line ever continues at column 0."""
    head = len("PASS  ")
    width = min(max((len(r.title) for r in rows), default=0), 28)
    lines: list[tuple[str | None, str]] = []
    for r in rows:
        column = width + 2  # where the detail starts (after the status head)
        room = max(24, columns - head - column)
        if len(r.title) > width:  # a long title gets a line of its own
            lines.append((r.status, r.title))
            first: tuple[str | None, str] = (None, " " * width)
        else:
            first = (r.status, r.title.ljust(width))
        detail = _wrap(r.detail, room)
        lines.append((first[0], f"{first[1]}  {detail[0]}"))
        lines.extend((None, f"{' ' * column}{line}") for line in detail[1:])
        if not (r.fix and r.status in ("WARN", "FAIL")):
            continue
        command, note = _split_fix(r.fix)
        if not _is_command(command):
            fix = _wrap(r.fix, room - len("fix: "))
            lines.append((None, f"{' ' * column}fix: {fix[0]}"))
            lines.extend((None, f"{' ' * (column + 5)}{line}") for line in fix[1:])
            continue
        indent = column if head + column + 5 + len(command) <= columns else _FIX_INDENT
        lines.append((None, f"{' ' * indent}fix: {command}"))
        if note:
            lines.extend(
                (None, f"{' ' * (indent + 5)}{line}")
                for line in _wrap(note, max(24, columns - head - indent - 5))
            )
    return lines


def render(rows: list[Check], summary: dict[str, int], skipped: list[str]) -> None:
    """One block per check (status, title, wrapped detail), a ``fix:`` under each problem
    (see :func:`layout`), and a summary line. Colored on a terminal, plain otherwise; 80
    columns either way."""
    if output.fancy():
        from rich.console import Console
        from rich.markup import escape

        # soft_wrap: never let rich re-wrap a line (a fix command must stay whole)
        console = Console(highlight=False, soft_wrap=True)

        def say(status: str | None, text: str) -> None:
            head = f"[{_COLORS[status]}]{status}[/]" if status else "    "
            console.print(f"{head}  {escape(text)}")
    else:

        def say(status: str | None, text: str) -> None:
            print(f"{status or '    '}  {text}".rstrip())

    for status, text in layout(rows):
        say(status, text)
    line = (
        f"{summary['pass']} passed, {summary['warn']} warnings, {summary['fail']} failed, "
        f"{summary['skip']} skipped"
    )
    if skipped:
        line += f" ({', '.join(skipped)})"
    print(f"\n{line}")  # one line, always last: scripts read it


def add_parser(subparsers: Any, common: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser(
        "doctor",
        parents=[common],
        help="check this machine's CUDA/torch build setup (PASS/WARN/FAIL with fixes)",
        description="Check ninja, the GPUs, the CUDA toolkit, NVRTC, torch, the arch "
        "settings, build parallelism, the cuforge cache and the remote caches. Exit code 1 "
        "when any check "
        "FAILs. Works without a GPU (GPU checks are SKIPped).",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    rows, probe = collect()
    summary = {s.lower(): sum(1 for r in rows if r.status == s) for s in STATUSES}
    skipped = [r.id for r in rows if r.status == "SKIP"]
    failed = summary["fail"] > 0
    if args.json:
        gpus, why = probe.gpus()
        output.emit_json(
            {
                "command": "doctor",
                "ok": not failed,
                "summary": summary,
                "gpus": gpus,
                "no_gpu_reason": why,
                "skipped": skipped,
                "checks": [r.as_dict() for r in rows],
            }
        )
    else:
        render(rows, summary, skipped)
    return 1 if failed else 0
