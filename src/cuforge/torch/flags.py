"""Where everything a PyTorch extension build needs lives, and the flags it gets.

Nothing here imports ``torch.utils.cpp_extension`` (it imports setuptools and guesses
``CUDA_HOME=/usr/local`` on machines whose ``nvcc`` is a wrapper script). Instead:

* torch's include and library dirs come from ``torch.__file__``;
* the CUDA toolkit is :func:`cuforge.toolchain.toolkit_root` (wrapper scripts followed);
* the headers the toolkit lacks here (cusparse, cublas, nvrtc, ...) come from the pip
  ``nvidia-*`` wheels torch installs, found by ``cuda.pathfinder`` once and remembered in
  ``<cache_dir>/torch/paths.json`` (``cuda.pathfinder`` costs ~120 ms to import, too much
  for a warm load);
* the host compiler is ``$CXX`` (else ``c++``), like torch.

:class:`BuildEnv` is all of that, computed once per process (and re-checked cheaply).
:func:`compile_flags` gives the exact command-line flags of each kind of translation unit
and :func:`link_flags` those of the link, with the presets of :data:`PRESETS` applied.
"""

from __future__ import annotations

import importlib.machinery
import json
import os
import shutil
import sys
import sysconfig

from cuforge import toolchain
from cuforge.base._fs import atomic_write, read_bytes
from cuforge.base.arch import gencode_flags
from cuforge.base.config import settings
from cuforge.base.errors import ToolchainError
from cuforge.base.layout import CacheLayout, machine_dir
from cuforge.toolchain.identity import version_output

__all__ = [
    "PRESETS",
    "COMMON_NVCC_FLAGS",
    "BuildEnv",
    "build_env",
    "compile_flags",
    "link_flags",
    "is_cuda_file",
    "tool_identity",
    "launcher",
    "trusted_memo_dir",
]

#: torch's own nvcc flags (cpp_extension.COMMON_NVCC_FLAGS), kept identical so that code
#: written for torch.utils.cpp_extension compiles the same way.
COMMON_NVCC_FLAGS = (
    "-D__CUDA_NO_HALF_OPERATORS__",
    "-D__CUDA_NO_HALF_CONVERSIONS__",
    "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-D__CUDA_NO_HALF2_OPERATORS__",
    "--expt-relaxed-constexpr",
)

#: Flag presets: (host C++ flags, extra nvcc flags). The user's own flags come after a
#: preset, so they win. ``--use_fast_math`` is never implied: pass ``fast_math=True``.
PRESETS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # optimized CUDA TUs with line info for profilers and sanitizers. Host .cpp TUs keep
    # torch's flags (no -O): on a torch binding -O3 costs 12% more compile time (57.3 s vs
    # 50.9 s on 2 cores) for glue code; pass extra_cflags=["-O3"] for CPU kernels.
    "release": ((), ("-O3", "-lineinfo")),
    # what torch.utils.cpp_extension does: no optimization flags at all
    "torch": ((), ()),
    # debuggable host code, device code with line info (not -G: it changes codegen a lot)
    "debug": (("-O0", "-g"), ("-O0", "-g", "-lineinfo")),
}
DEFAULT_PRESET = "release"

_CUDA_SUFFIXES = (".cu", ".cuh")
#: the pip wheels whose headers torch's headers (or users) include
_NVIDIA_HEADER_LIBS = ("cudart", "cublas", "cusparse", "cusolver", "cufft", "curand", "nvrtc")


def is_cuda_file(path: str) -> bool:
    return os.path.splitext(path)[1] in _CUDA_SUFFIXES


# ------------------------------------------------------------------ small JSON memo


def trusted_memo_dir() -> str | None:
    """``<cache_dir>/torch`` when the cache dir (and that subdirectory) passes the cache
    dir's trust rule (:meth:`cuforge.base.layout.CacheLayout.trust_problem`), else None: an
    untrusted memo could name the include dirs a build uses, so it is neither read nor
    written then."""
    layout = CacheLayout.of(machine_dir())
    if layout.trust_problem(layout.torch) is not None:
        return None
    return layout.torch


def _memo_path() -> str | None:
    layout = CacheLayout.of(machine_dir())
    return None if trusted_memo_dir() is None else layout.torch_paths_memo


def _load_memo() -> dict:
    path = _memo_path()
    if path is None:
        return {}

    try:
        data = json.loads(read_bytes(path, max_bytes=1 << 20))
    except (OSError, ValueError):
        return {}  # missing, too big, not a regular file or not JSON: probe again
    return data if isinstance(data, dict) else {}


def _save_memo(memo: dict) -> None:
    """Best effort: the memo only saves probes, so a write that fails is skipped."""
    path = _memo_path()
    if path is None:
        return

    try:
        atomic_write(path, json.dumps(memo, indent=1, sort_keys=True))
    except OSError:
        pass  # read-only or full cache dir: the next process probes again


def launcher(choice: str | None = None) -> str | None:
    """The compiler launcher a build uses: ``choice`` (``load(launcher=...)``), else
    ``CUFORGE_TORCH_LAUNCHER``: ``ccache``, ``sccache``, a path, or ``auto`` (sccache, then
    ccache). None when none is asked for (``""``, ``0``, ``off``, ``none``, ``no``) or the
    program is not installed."""
    choice = (choice or settings().torch_launcher or "").strip()
    if not choice or choice.lower() in ("0", "off", "none", "no"):
        return None
    candidates = ("sccache", "ccache") if choice.lower() == "auto" else (choice,)
    for candidate in candidates:
        found = shutil.which(candidate)
        if found:
            return found
    return None


def tool_identity(program: str) -> str:
    """``<program> --version`` of a host tool (the C++ compiler), its first line: probed
    once per version of the executable (:func:`cuforge.toolchain.identity.version_output`,
    remembered by its real path and stat in this process and in the machine memo), so a
    warm process runs no subprocess to learn it."""
    path = shutil.which(program)
    if path is None:
        raise ToolchainError(
            f"the C++ compiler {program!r} was not found on PATH. Install g++ (e.g. "
            "`apt-get install g++`) or set CXX to a C++ compiler."
        )
    real = os.path.realpath(path)
    out = version_output(real) or ""
    return f"{os.path.basename(real)}: {(out.splitlines() or [''])[0].strip()}"


# ------------------------------------------------------------------ the environment


class BuildEnv:
    """Paths and identities of one (python, torch, toolkit, host compiler) combination."""

    __slots__ = (
        "torch_dir",
        "torch_version",
        "torch_git",
        "torch_cuda",
        "python_include",
        "python_abi",
        "toolkit",
        "nvidia_include",
        "nvidia_lib",
        "cxx",
        "system_roots",
        "placeholders",
    )

    def include_dirs(self, with_cuda: bool) -> list[str]:
        """System include dirs, in torch's order plus the pip CUDA header dirs."""
        inc = os.path.join(self.torch_dir, "include")
        dirs = [inc, os.path.join(inc, "torch", "csrc", "api", "include")]
        if with_cuda:
            if self.toolkit:
                dirs.append(os.path.join(self.toolkit, "include"))
            dirs.extend(d for d in self.nvidia_include if d not in dirs)
        if self.python_include:
            dirs.append(self.python_include)
        return dirs

    def library_dirs(self, with_cuda: bool) -> list[str]:
        dirs = [os.path.join(self.torch_dir, "lib")]
        if with_cuda:
            if self.toolkit:
                for sub in ("lib64", "lib"):
                    d = os.path.join(self.toolkit, sub)
                    if os.path.isdir(d):
                        dirs.append(d)
                        break
            dirs.extend(d for d in self.nvidia_lib if d not in dirs)
        return dirs

    def normalize(self, text: str) -> str:
        """``text`` with machine-specific roots replaced by placeholders (for keys)."""
        for prefix, name in self.placeholders:
            if prefix in text:
                text = text.replace(prefix, name)
        return text


_env_memo: tuple[tuple, BuildEnv] | None = None


def _torch():
    import torch

    return torch


def build_env() -> BuildEnv:
    """The :class:`BuildEnv` of this process (memoized; re-made when CXX, CUDA_HOME, PATH
    or the cache dir change)."""
    global _env_memo
    fingerprint = (
        os.environ.get("CXX"),
        os.environ.get("CUDA_HOME"),
        os.environ.get("CUDA_PATH"),
        os.environ.get("PATH"),
        machine_dir(),
    )
    memo = _env_memo
    if memo is not None and memo[0] == fingerprint:
        return memo[1]
    torch = _torch()

    env = BuildEnv()
    env.torch_dir = os.path.dirname(os.path.abspath(torch.__file__))
    env.torch_version = str(torch.__version__)
    env.torch_git = str(getattr(torch.version, "git_version", "") or "")
    env.torch_cuda = str(torch.version.cuda or "")

    env.python_include = sysconfig.get_path("include", scheme="posix_prefix") or ""

    env.python_abi = f"{sys.implementation.cache_tag} {importlib.machinery.EXTENSION_SUFFIXES[0]}"
    env.toolkit = toolchain.toolkit_root() or ""
    env.nvidia_include, env.nvidia_lib = _nvidia_dirs()
    env.cxx = os.environ.get("CXX") or "c++"
    roots = [os.path.join(env.torch_dir, "include"), env.python_include]
    if env.toolkit:
        roots.append(env.toolkit)
        roots.append(os.path.realpath(env.toolkit))
    roots.extend(env.nvidia_include)
    roots.extend(("/usr/include", "/usr/lib/gcc", "/usr/local/cuda"))
    env.system_roots = tuple(r.rstrip(os.sep) + os.sep for r in roots if r)
    places = [(env.torch_dir, "${TORCH}"), (env.python_include, "${PYTHON_INCLUDE}")]
    if env.toolkit:
        places.append((env.toolkit, "${CUDA}"))
    for d in env.nvidia_include + env.nvidia_lib:
        places.append((d, "${NVIDIA}"))
    env.placeholders = tuple(sorted(((p, n) for p, n in places if p), key=lambda x: -len(x[0])))
    _env_memo = (fingerprint, env)
    return env


def _nvidia_dirs() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(include dirs, lib dirs) of the pip ``nvidia-*`` CUDA wheels, via cuda.pathfinder,
    remembered in paths.json by sys.prefix (re-validated by existence)."""
    memo = _load_memo()
    key = sys.prefix + "|" + (os.environ.get("CONDA_PREFIX") or "")
    entry = memo.get("nvidia", {}).get(key)
    if (
        isinstance(entry, dict)
        and isinstance(entry.get("include"), list)
        and isinstance(entry.get("lib"), list)
        and all(os.path.isdir(d) for d in entry["include"] + entry["lib"])
    ):
        return tuple(entry["include"]), tuple(entry["lib"])
    include: list[str] = []
    lib: list[str] = []
    try:
        import cuda.pathfinder as pathfinder
    except ImportError:
        pathfinder = None
    if pathfinder is not None:
        for name in _NVIDIA_HEADER_LIBS:
            try:
                d = pathfinder.find_nvidia_header_directory(name)
            except Exception:  # noqa: BLE001 - pathfinder raises several kinds
                d = None
            if d and os.path.isdir(d):
                d = os.path.abspath(d)
                if d not in include:
                    include.append(d)
                libdir = os.path.join(os.path.dirname(d), "lib")
                if os.path.isdir(libdir) and libdir not in lib:
                    lib.append(libdir)
    memo.setdefault("nvidia", {})[key] = {"include": include, "lib": lib}
    _save_memo(memo)
    return tuple(include), tuple(lib)


# ------------------------------------------------------------------ flags


def has_arch_flag(flags) -> bool:
    return any(
        f.startswith(("-arch", "--gpu-architecture", "-gencode", "--generate-code", "-code"))
        for f in flags
    )


def compile_flags(
    env: BuildEnv,
    *,
    name: str | None,
    with_cuda: bool,
    extra_cflags,
    extra_cuda_cflags,
    extra_include_paths,
    archs: tuple[str, ...],
    preset: str = DEFAULT_PRESET,
    fast_math: bool = False,
    threads: int = 1,
) -> tuple[list[str], list[str]]:
    """(host C++ flags, nvcc flags): everything between the compiler and ``-c``.

    Torch's flags, in torch's order (``-DTORCH_EXTENSION_NAME``, user ``-I``, system
    ``-isystem``, ``-fPIC``, ``-std=c++20``), then the preset, then the user's flags.
    ``name`` None: a standalone executable (no extension-name defines).
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}: use one of {', '.join(PRESETS)}")
    host_preset, cuda_preset = PRESETS[preset]
    extra_cflags = [f.strip() for f in extra_cflags or ()]
    extra_cuda_cflags = [f.strip() for f in extra_cuda_cflags or ()]
    common: list[str] = []
    if name is not None:
        common += [f"-DTORCH_EXTENSION_NAME={name}", "-DTORCH_API_INCLUDE_EXTENSION_H"]
    common += [f"-I{os.path.abspath(p.strip())}" for p in extra_include_paths or ()]
    for d in env.include_dirs(with_cuda):
        common += ["-isystem", d]
    cflags = common + ["-fPIC", "-std=c++20", *host_preset, *extra_cflags]
    if not with_cuda:
        return cflags, []
    cuda = common + list(COMMON_NVCC_FLAGS)
    if not has_arch_flag(extra_cuda_cflags):
        cuda += gencode_flags(archs)
    cuda += ["--compiler-options", "-fPIC", *cuda_preset]
    if fast_math:
        cuda.append("--use_fast_math")
    cuda += extra_cuda_cflags
    if not any(f.startswith("-std=") for f in cuda):
        cuda.append("-std=c++20")
    if threads > 1 and not any(f.startswith(("--threads", "-t")) for f in extra_cuda_cflags):
        cuda += ["--threads", str(threads)]
    cc = os.environ.get("CC")
    if cc:
        cuda = ["-ccbin", cc] + cuda
    return cflags, cuda


def link_flags(
    env: BuildEnv, *, with_cuda: bool, extra_ldflags, is_standalone: bool, is_python_module: bool
) -> list[str]:
    """The link flags after the objects: ``-shared``, the user's flags, torch's libraries
    (as torch orders them) and cudart, with every library dir also in the rpath-free -L."""
    flags = [] if is_standalone else ["-shared"]
    flags += [f.strip() for f in extra_ldflags or ()]
    lib_dirs = env.library_dirs(with_cuda)
    flags.append(f"-L{lib_dirs[0]}")
    flags.append("-lc10")
    if with_cuda:
        flags.append("-lc10_cuda")
    flags.append("-ltorch_cpu")
    if with_cuda:
        flags.append("-ltorch_cuda")
    flags.append("-ltorch")
    if not is_standalone:
        flags.append("-ltorch_python")
    else:
        flags.append(f"-Wl,-rpath,{lib_dirs[0]}")
    if with_cuda:
        flags += [f"-L{d}" for d in lib_dirs[1:]]
        flags.append("-lcudart")
    return flags
