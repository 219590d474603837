"""Where the CUDA toolchain is, what it is, and which GPU archs to build for.

The bottom layer beside :mod:`cuforge.config`: it imports only config and errors, and
nothing expensive at import time (no ``cuda.*``, no ``subprocess``).

* :func:`toolkit_root`, :func:`nvcc_path`, :func:`nvrtc_library_path`,
  :func:`toolkit_include_dirs` -- finding things.
* :func:`compiler_identity` -- what the cache key says about the compiler. Cheap on a warm
  process: the library or executable is identified by (path, size, mtime_ns), and what was
  probed about it (version, SHA-256, ``nvcc --version`` text) is kept in a small JSON memo at
  ``<cache_dir>/toolchain.json`` keyed by that stat, so a warm call neither imports the CUDA
  Python bindings nor loads NVRTC nor runs nvcc.
* :func:`visible_gpu_archs`, :func:`driver_version` -- the driver, through ctypes.
* :func:`resolve_archs` -- the arch a compile targets: explicit, else the visible GPU, else
  ``CUFORGE_ARCH``, else ``TORCH_CUDA_ARCH_LIST``, else a clear error.
* :func:`supported_archs`, :func:`nvcc_version`, :func:`nvrtc_version` -- for ``cuforge doctor``.
"""

from __future__ import annotations

import _thread
import os
import sys

from cuforge.config import ArchError, normalize_arch, parse_arch_list, settings
from cuforge.errors import ToolchainError

__all__ = [
    "toolkit_root",
    "nvcc_path",
    "nvrtc_library_path",
    "toolkit_include_dirs",
    "compiler_identity",
    "visible_gpu_archs",
    "driver_version",
    "resolve_archs",
    "supported_archs",
    "nvcc_version",
    "nvrtc_version",
    "arch_number",
]

#: Bump when the memo's layout or the meaning of a probed field changes.
_MEMO_SCHEMA = 1
_MEMO_NAME = "toolchain.json"
_DEFAULT_ROOT = "/usr/local/cuda"

_lock = _thread.RLock()


# --------------------------------------------------------------------------- finding things


def _env(name: str) -> str:
    return os.environ.get(name) or ""


# os.environ keeps its real data in a dict of bytes; reading it directly makes the
# per-call environment snapshot of compiler_identity() cost well under a microsecond.
_environ_data = getattr(os.environ, "_data", None)
if os.name == "posix" and isinstance(_environ_data, dict):
    _raw_env = _environ_data.get

    def _env_key(name: str):
        return os.fsencode(name)

else:  # pragma: no cover - non-posix
    _raw_env = os.environ.get

    def _env_key(name: str):
        return name


def _is_toolkit(root: str) -> bool:
    return os.path.isfile(os.path.join(root, "bin", "nvcc")) or os.path.isfile(
        os.path.join(root, "include", "cuda_runtime.h")
    )


def _which(program: str, path: str) -> str | None:
    import stat

    for directory in path.split(os.pathsep):
        if not directory:
            continue
        candidate = os.path.join(directory, program)
        try:
            st = os.stat(candidate)  # one syscall per PATH entry
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and st.st_mode & 0o111:
            return candidate
    return None


def _script_target(path: str) -> str | None:
    """The absolute ``.../nvcc`` a small shell-script wrapper execs, or None."""
    try:
        with open(path, "rb") as f:
            if f.read(2) != b"#!":  # the real (ELF) nvcc: nothing more to read
                return None
            head = b"#!" + f.read(16382)
    except OSError:
        return None
    if b"\0" in head:
        return None
    text = head.decode("utf-8", "replace")
    for line in text.splitlines()[1:]:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        for token in line.replace(";", " ").split():
            token = token.strip("'\"")
            if token.startswith("/") and os.path.basename(token) == "nvcc":
                return token
    return None


def _resolve_nvcc(path: str) -> str:
    """Follow symlinks and shell-script wrappers to the real nvcc executable."""
    seen: set[str] = set()
    current = os.path.realpath(path)
    while current not in seen and len(seen) < 8:
        seen.add(current)
        target = _script_target(current)
        if target is None or not os.path.isfile(target):
            break
        current = os.path.realpath(target)
    return current


_ROOT_VARS = tuple(map(_env_key, ("CUDA_HOME", "CUDA_PATH", "PATH")))
_root_memo: tuple[tuple, str | None] | None = None


def toolkit_root() -> str | None:
    """The real CUDA toolkit root, or None when there is none.

    ``CUDA_HOME`` / ``CUDA_PATH`` when they name a toolkit (one with ``bin/nvcc`` or
    ``include/cuda_runtime.h``); else the toolkit of the ``nvcc`` on ``PATH``, following
    symlinks and shell-script wrappers (``exec /usr/local/cuda-13.0/bin/nvcc "$@"``); else
    ``/usr/local/cuda``. Symlinks are resolved: ``/usr/local/cuda`` -> ``/usr/local/cuda-13.0``.
    """
    global _root_memo
    env = tuple(map(_raw_env, _ROOT_VARS))
    memo = _root_memo
    if memo is not None and memo[0] == env:
        return memo[1]
    root = _find_toolkit_root(_env("CUDA_HOME"), _env("CUDA_PATH"), _env("PATH"))
    _root_memo = (env, root)
    return root


def _find_toolkit_root(cuda_home: str, cuda_path: str, path: str) -> str | None:
    for value in (cuda_home, cuda_path):
        if value and _is_toolkit(value):
            return os.path.realpath(value)
    found = _which("nvcc", path)
    if found is not None:
        real = _resolve_nvcc(found)
        bindir = os.path.dirname(real)
        if os.path.basename(bindir) == "bin":
            root = os.path.dirname(bindir)
            if _is_toolkit(root):
                return root
    if _is_toolkit(_DEFAULT_ROOT):
        return os.path.realpath(_DEFAULT_ROOT)
    return None


def nvcc_path() -> str:
    """The nvcc to run: ``CUFORGE_NVCC`` when set, else ``<toolkit_root>/bin/nvcc``."""
    configured = settings().nvcc
    if configured:
        candidate = os.path.expanduser(configured)
        if os.sep not in candidate:
            candidate = _which(candidate, _env("PATH")) or candidate
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return os.path.abspath(candidate)
        raise ToolchainError(
            f"CUFORGE_NVCC={configured!r} is not an executable file. Point it at nvcc "
            "(e.g. CUFORGE_NVCC=/usr/local/cuda/bin/nvcc) or unset it to use the toolkit's."
        )
    root = toolkit_root()
    if root is not None:
        candidate = os.path.join(root, "bin", "nvcc")
        if os.path.isfile(candidate):
            return candidate
    raise ToolchainError(
        "nvcc was not found"
        + (f" (the toolkit at {root} has no bin/nvcc)" if root else "")
        + ". Install the CUDA toolkit, then set CUDA_HOME to its root (e.g. CUDA_HOME=/usr/local/cuda), "
        "put its bin/ on PATH, or set CUFORGE_NVCC to the nvcc executable. "
        "Or compile with backend='nvrtc', which needs no toolkit executable."
    )


def _nvrtc_locate_key() -> str:
    return "|".join((sys.prefix, _env("CUDA_HOME"), _env("CUDA_PATH"), _env("LD_LIBRARY_PATH")))


def _site_signature() -> list[list]:
    """(dir, mtime_ns) of every site-packages dir on sys.path. pip adds or removes a
    top-level ``*.dist-info`` on every install, so this changes when a wheel that could
    hold NVRTC (which cuda-pathfinder prefers) comes or goes."""
    sig: list[list] = []
    for entry in sys.path:
        if entry and os.path.basename(entry) in ("site-packages", "dist-packages"):
            try:
                sig.append([entry, os.stat(entry).st_mtime_ns])
            except OSError:
                continue
    return sig


_nvrtc_path_memo: dict[str, str] = {}


def nvrtc_library_path() -> str:
    """Absolute path of the NVRTC shared library (``libnvrtc.so.13``), as cuda-pathfinder
    finds it (the ``nvidia-cuda-nvrtc`` wheel first).

    Cheap when memoized: the located path is remembered per process and in the on-disk
    memo (keyed by ``sys.prefix``, ``CUDA_HOME``, ``CUDA_PATH`` and ``LD_LIBRARY_PATH``),
    and re-validated with a stat of it and of the site-packages dirs (a wheel installed
    or removed since makes cuda-pathfinder search again)."""
    key = _nvrtc_locate_key()
    path = _nvrtc_path_memo.get(key)
    if path is not None and os.path.isfile(path):
        return path
    with _lock:
        memo = _load_memo()
        site = _site_signature()
        entry = memo.get("locate", {}).get("nvrtc|" + key)
        path = entry.get("path") if isinstance(entry, dict) else None
        if not (isinstance(path, str) and entry.get("site") == site and os.path.isfile(path)):
            path = _locate_nvrtc()
            memo.setdefault("locate", {})["nvrtc|" + key] = {"path": path, "site": site}
            _save_memo(memo)
        _nvrtc_path_memo[key] = path
        return path


def _locate_nvrtc() -> str:
    fix = (
        "Install it with `pip install nvidia-cuda-nvrtc` (CUDA 13: `pip install "
        "'nvidia-cuda-nvrtc>=13,<14'`), or install the CUDA toolkit and set CUDA_HOME."
    )
    try:
        import cuda.pathfinder as pathfinder
    except ImportError:
        raise ToolchainError(
            "cuda-pathfinder is not installed, so cuforge cannot find NVRTC. "
            "Install it with `pip install cuda-pathfinder`. " + fix
        ) from None
    try:
        loaded = pathfinder.load_nvidia_dynamic_lib("nvrtc")
    except Exception as exc:  # noqa: BLE001 - pathfinder raises several kinds
        raise ToolchainError(f"the NVRTC library was not found ({exc}). {fix}") from None
    path = getattr(loaded, "abs_path", None)
    if not path or not os.path.isfile(path):
        raise ToolchainError(f"NVRTC was loaded but its file is unknown ({loaded!r}). {fix}")
    return os.path.abspath(path)


def toolkit_include_dirs() -> list[str]:
    """The CUDA header roots NVRTC needs (``cuda_fp16.h``, ``cub/...``): ``<root>/include``
    and ``<root>/include/cccl`` when present, else what cuda-pathfinder finds for the
    ``cudart`` and ``cccl`` header wheels. These are *system* roots: the toolkit identity
    covers their headers, which are not hashed one by one."""
    root = toolkit_root()
    known = _include_memo.get(root)
    if known is not None:
        return list(known)
    dirs: list[str] = []
    if root is not None:
        inc = os.path.join(root, "include")
        if os.path.isfile(os.path.join(inc, "cuda_runtime.h")):
            dirs.append(inc)
            cccl = os.path.join(inc, "cccl")
            if os.path.isdir(cccl):
                dirs.append(cccl)
    if not dirs:
        dirs = list(_pathfinder_include_dirs())
    _include_memo[root] = tuple(dirs)
    return dirs


_include_memo: dict[str | None, tuple[str, ...]] = {}


_pf_dirs_memo: dict[str, tuple[str, ...]] = {}


def _pathfinder_include_dirs() -> tuple[str, ...]:
    key = sys.prefix + "|" + _env("CONDA_PREFIX")
    found = _pf_dirs_memo.get(key)
    if found is not None:
        return found
    dirs: list[str] = []
    try:
        import cuda.pathfinder as pathfinder

        for lib in ("cudart", "cccl"):
            try:
                d = pathfinder.find_nvidia_header_directory(lib)
            except Exception:  # noqa: BLE001
                d = None
            if d and d not in dirs:
                dirs.append(d)
    except ImportError:
        pass
    _pf_dirs_memo[key] = tuple(dirs)
    return tuple(dirs)


# --------------------------------------------------------------------------- the on-disk memo


def _memo_path() -> str:
    return os.path.join(settings().cache_dir, _MEMO_NAME)


# (memo path, its (size, mtime_ns, inode), the parsed memo): read the file once per process
_memo_cache: tuple[str, tuple[int, int, int], dict] | None = None


def _load_memo() -> dict:
    """The parsed memo (callers may change it, then :func:`_save_memo` it)."""
    global _memo_cache
    path = _memo_path()
    try:
        st = os.stat(path)
    except OSError:
        return {"schema": _MEMO_SCHEMA}
    sig = (st.st_size, st.st_mtime_ns, st.st_ino)
    cached = _memo_cache
    if cached is not None and cached[0] == path and cached[1] == sig:
        return cached[2]
    from cuforge._fastjson import loads  # json itself costs ~10 ms to import

    try:
        with open(path, "rb") as f:
            data = loads(f.read())
    except (OSError, ValueError):
        return {"schema": _MEMO_SCHEMA}
    if not isinstance(data, dict) or data.get("schema") != _MEMO_SCHEMA:
        return {"schema": _MEMO_SCHEMA}
    _memo_cache = (path, sig, data)
    return data


def write_json_atomic(path: str, data: dict) -> bool:
    """Replace ``path`` with ``data`` as JSON (temp file + ``os.replace``). False when the
    directory is unwritable: callers treat these memo files as optional."""
    import json

    tmp = f"{path}.{os.getpid()}.{_thread.get_ident()}.tmp"
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
        return True
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return False


def _save_memo(memo: dict) -> None:
    """Atomically replace the memo; an unwritable cache dir just means re-probing later."""
    global _memo_cache
    path = _memo_path()
    if not write_json_atomic(path, memo):
        return
    try:
        st = os.stat(path)
    except OSError:
        return
    _memo_cache = (path, (st.st_size, st.st_mtime_ns, st.st_ino), memo)


def file_stat_key(path: str) -> list[int] | None:
    """[size, mtime_ns] of a file, the key memo entries are stored under (None: missing)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns]


def _probed(memo: dict, kind: str, path: str, sig: list[int], probe) -> tuple[dict, bool]:
    """``probe(path)`` memoized in ``memo`` by (kind, path, size, mtime_ns).
    Returns (data, changed)."""
    entries = memo.setdefault("probes", {})
    entry = entries.get(f"{kind}|{path}")
    if isinstance(entry, dict) and entry.get("sig") == sig and isinstance(entry.get("data"), dict):
        return entry["data"], False
    data = probe(path)
    entries[f"{kind}|{path}"] = {"sig": sig, "data": data}
    return data, True


# --------------------------------------------------------------------------- probes


def _sha256_file(path: str) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


_nvrtc_dll_lock = _thread.allocate_lock()


def _nvrtc_dll(path: str):
    import ctypes

    with _nvrtc_dll_lock:
        return ctypes.CDLL(path)


def _probe_nvrtc(path: str) -> dict:
    import ctypes

    try:
        lib = _nvrtc_dll(path)
        major, minor = ctypes.c_int(), ctypes.c_int()
        if lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)) != 0:
            raise OSError("nvrtcVersion failed")
    except (OSError, AttributeError) as exc:
        raise ToolchainError(
            f"cannot load NVRTC from {path}: {exc}. Reinstall it with "
            "`pip install --force-reinstall nvidia-cuda-nvrtc`."
        ) from None
    return {"version": f"{major.value}.{minor.value}", "sha256": _sha256_file(path)}


def _probe_headers(cuda_h: str) -> dict:
    """Versions of the toolkit headers: CUDA_VERSION from cuda.h, CCCL_VERSION from CCCL."""
    version = ""
    try:
        with open(cuda_h, "rb") as f:
            for raw in f:
                if raw.startswith(b"#define CUDA_VERSION"):
                    version = raw.split()[2].decode()
                    break
    except (OSError, IndexError):
        pass
    cccl = ""
    inc = os.path.dirname(cuda_h)
    for candidate in (
        os.path.join(inc, "cccl", "cuda", "std", "__cccl", "version.h"),
        os.path.join(inc, "cuda", "std", "__cccl", "version.h"),
    ):
        try:
            with open(candidate, "rb") as f:
                for raw in f:
                    if raw.startswith(b"#define CCCL_VERSION"):
                        cccl = raw.split()[2].decode()
                        break
        except (OSError, IndexError):
            continue
        if cccl:
            break
    return {"cuda_version": version, "cccl_version": cccl}


def _probe_nvcc(path: str) -> dict:
    import subprocess

    try:
        proc = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=120, check=False
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise ToolchainError(
            f"cannot run {path} --version: {exc}. Check the CUDA toolkit install, or point "
            "CUFORGE_NVCC at a working nvcc."
        ) from None
    output = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0:
        raise ToolchainError(
            f"{path} --version failed (exit {proc.returncode}): {output[:500]}. Check the CUDA "
            "toolkit install, or point CUFORGE_NVCC at a working nvcc."
        )
    version = ""
    for token in output.replace(",", " ").split():
        if token.startswith("V") and token[1:2].isdigit():
            version = token[1:]
    if not version:
        marker = "release "
        idx = output.find(marker)
        if idx >= 0:
            version = output[idx + len(marker) :].split()[0].rstrip(",")
    return {"version": version, "version_output": output}


# --------------------------------------------------------------------------- identity

# (backend, env) -> (stat-checked paths with their sigs, identity)
_identity_memo: dict[tuple, tuple[tuple[tuple[str, list[int] | None], ...], dict[str, str]]] = {}


_IDENTITY_VARS = {
    # what locates NVRTC (as cuda-pathfinder searches) and the toolkit headers
    "nvrtc": tuple(map(_env_key, ("CUDA_HOME", "CUDA_PATH", "LD_LIBRARY_PATH", "PATH"))),
    # what locates nvcc
    "nvcc": tuple(map(_env_key, ("CUFORGE_NVCC", "CUDA_HOME", "CUDA_PATH", "PATH"))),
}


def _identity_env(backend: str) -> tuple:
    names = _IDENTITY_VARS.get(backend, ())
    return (backend, sys.prefix, *map(_raw_env, names))


def compiler_identity(backend: str) -> dict[str, str]:
    """What the cache key records about the compiler.

    ``"nvrtc"``: ``{"compiler", "version", "library", "library_sha256", "headers"}``;
    ``"nvcc"``: ``{"compiler", "path", "version", "version_output", "toolkit"}``.

    Warm, this costs a dictionary lookup and one or two ``stat`` calls; in a fresh process
    it reads ``<cache_dir>/toolchain.json`` instead of loading NVRTC or running nvcc.
    Raises :class:`~cuforge.errors.ToolchainError` when the compiler is missing.
    """
    env = _identity_env(backend)
    memo = _identity_memo.get(env)
    if memo is not None:
        checks, identity = memo
        for path, sig in checks:
            if file_stat_key(path) != sig:
                break
        else:
            return dict(identity)
    if backend == "nvrtc":
        checks, identity = _nvrtc_identity()
    elif backend == "nvcc":
        checks, identity = _nvcc_identity()
    else:
        raise ValueError(f"unknown backend {backend!r}: use 'nvrtc' or 'nvcc'")
    _identity_memo[env] = (checks, identity)
    return dict(identity)


def _nvrtc_identity():
    library = nvrtc_library_path()
    with _lock:
        memo = _load_memo()
        changed = False
        sig = file_stat_key(library)
        if sig is None:
            raise ToolchainError(f"the NVRTC library {library} disappeared; reinstall it")
        lib, ch = _probed(memo, "nvrtc", library, sig, _probe_nvrtc)
        changed |= ch
        checks = [(library, sig)]
        include = toolkit_include_dirs()
        headers = ";".join(include) if include else "none"
        if include:
            cuda_h = os.path.join(include[0], "cuda.h")
            hsig = file_stat_key(cuda_h)
            if hsig is not None:
                hdr, ch = _probed(memo, "headers", cuda_h, hsig, _probe_headers)
                changed |= ch
                # not re-checked per call (one stat per call, of the library, is the
                # budget); a fresh process or a changed library re-reads the headers' stat
                headers = (
                    f"{headers} CUDA_VERSION={hdr.get('cuda_version', '')} "
                    f"CCCL_VERSION={hdr.get('cccl_version', '')} cuda.h={hsig[0]}:{hsig[1]}"
                )
        if changed:
            _save_memo(memo)
    identity = {
        "compiler": "nvrtc",
        "version": str(lib["version"]),
        "library": library,
        "library_sha256": str(lib["sha256"]),
        "headers": headers,
    }
    return tuple(checks), identity


def _nvcc_identity():
    path = nvcc_path()
    sig = file_stat_key(path)
    if sig is None:
        raise ToolchainError(f"nvcc at {path} disappeared; check the CUDA toolkit install")
    checks = [(path, sig)]
    # a wrapper script (CUFORGE_NVCC=/usr/local/bin/nvcc): the executable it runs counts too
    real = _resolve_nvcc(path)
    if real != path:
        real_sig = file_stat_key(real)
        if real_sig is not None:
            checks.append((real, real_sig))
    memo_sig = [n for _, s in checks for n in (s or [])]
    with _lock:
        memo = _load_memo()
        data, changed = _probed(memo, "nvcc", path, memo_sig, _probe_nvcc)
        if changed:
            _save_memo(memo)
    identity = {
        "compiler": "nvcc",
        "path": path,
        "version": str(data["version"]),
        "version_output": str(data["version_output"]),
        "toolkit": toolkit_root() or "",
    }
    return tuple(checks), identity


def nvcc_version() -> str | None:
    """nvcc's version (``"13.0.88"``), or None when there is no working nvcc."""
    try:
        return compiler_identity("nvcc")["version"] or None
    except ToolchainError:
        return None


def nvrtc_version() -> str | None:
    """NVRTC's version (``"13.5"``), or None when NVRTC cannot be found or loaded."""
    try:
        return compiler_identity("nvrtc")["version"] or None
    except ToolchainError:
        return None


def supported_archs(backend: str) -> list[str]:
    """The real archs (``sm_XY``) the compiler can build for; [] when it is unavailable."""
    if backend == "nvrtc":
        import ctypes

        try:
            lib = _nvrtc_dll(nvrtc_library_path())
            count = ctypes.c_int()
            if lib.nvrtcGetNumSupportedArchs(ctypes.byref(count)) != 0:
                return []
            archs = (ctypes.c_int * count.value)()
            if lib.nvrtcGetSupportedArchs(archs) != 0:
                return []
        except (ToolchainError, OSError, AttributeError):
            return []
        return [f"sm_{a}" for a in archs]
    if backend == "nvcc":
        import subprocess

        try:
            proc = subprocess.run(
                [nvcc_path(), "--list-gpu-arch"],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
        except (ToolchainError, OSError, subprocess.SubprocessError):
            return []
        found: list[str] = []
        for line in proc.stdout.split():
            if line.startswith("compute_"):
                arch = "sm_" + line[len("compute_") :]
                if arch not in found:
                    found.append(arch)
        return found
    raise ValueError(f"unknown backend {backend!r}: use 'nvrtc' or 'nvcc'")


# --------------------------------------------------------------------------- the driver

_driver_memo: dict[str, object] = {}


def _libcuda():
    """libcuda.so.1 through ctypes, or None (no driver). Never raises."""
    if "lib" in _driver_memo:
        return _driver_memo["lib"]
    lib = None
    try:
        import ctypes

        lib = ctypes.CDLL("libcuda.so.1" if sys.platform != "win32" else "nvcuda.dll")
    except OSError:
        lib = None
    _driver_memo["lib"] = lib
    return lib


def driver_version() -> int | None:
    """The driver's CUDA version (``cuDriverGetVersion``, e.g. 13000), or None without a driver."""
    if "version" in _driver_memo:
        return _driver_memo["version"]  # type: ignore[return-value]
    version = None
    with _lock:
        lib = _libcuda()
        if lib is not None:
            try:
                import ctypes

                value = ctypes.c_int()
                if lib.cuDriverGetVersion(ctypes.byref(value)) == 0:
                    version = value.value
            except (OSError, AttributeError):
                version = None
        _driver_memo["version"] = version
    return version


def visible_gpu_archs() -> list[str]:
    """``["sm_90", ...]``, one per visible device, through the driver (ctypes on
    ``libcuda.so.1``); [] without a driver or GPU. Never raises; memoized per process.

    ``cuInit`` costs ~180 ms in a fresh process (measured on an H200), so a found answer
    is also kept in the on-disk memo, keyed by what would change it: the boot id, the
    driver version, the GPUs the driver lists (``/proc/driver/nvidia/gpus``, which
    containers mask to their own), the ``/dev/nvidiaN`` nodes, ``CUDA_VISIBLE_DEVICES``
    and ``CUDA_DEVICE_ORDER``. A later process on the same boot skips ``cuInit``."""
    cached = _driver_memo.get("archs")
    if cached is not None:
        return list(cached)  # type: ignore[arg-type]
    archs: list[str] = []
    with _lock:
        cached = _driver_memo.get("archs")
        if cached is not None:
            return list(cached)  # type: ignore[arg-type]
        try:
            archs = _memoized_archs()
        except Exception:  # noqa: BLE001 - never raise from a probe
            archs = []
        _driver_memo["archs"] = tuple(archs)
    return archs


def _gpu_memo_key() -> str | None:
    """What identifies the set of visible GPUs without asking the driver; None when the
    NVIDIA kernel driver exposes nothing to key on (then the driver is asked)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip()
        with open("/proc/driver/nvidia/version", encoding="utf-8", errors="replace") as f:
            driver = f.readline().strip()
        gpus = sorted(os.listdir("/proc/driver/nvidia/gpus"))
        nodes = sorted(n for n in os.listdir("/dev") if n.startswith("nvidia") and n[6:].isdigit())
    except OSError:
        return None
    if not boot or not gpus:
        return None
    return "|".join(
        (
            boot,
            driver,
            ",".join(gpus),
            ",".join(nodes),
            "CUDA_VISIBLE_DEVICES=" + os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"),
            "CUDA_DEVICE_ORDER=" + _env("CUDA_DEVICE_ORDER"),
        )
    )


def _no_nvidia_driver() -> bool:
    """True when Linux shows no NVIDIA kernel driver (nor WSL's GPU bridge): then there is
    no GPU to ask about, and importing ctypes and dlopen-ing libcuda (~4 ms) is skipped."""
    return (
        sys.platform.startswith("linux")
        and not os.path.exists("/proc/driver/nvidia")
        and not os.path.exists("/dev/dxg")
    )


def _memoized_archs() -> list[str]:
    if _no_nvidia_driver():
        return []
    key = _gpu_memo_key()
    if key is None:
        return _query_archs()
    memo = _load_memo()
    found = memo.get("gpus", {}).get(key)
    if isinstance(found, list) and found and all(isinstance(a, str) for a in found):
        return list(found)
    archs = _query_archs()
    if archs:
        memo["gpus"] = {key: archs}  # only the current boot's answer is worth keeping
        _save_memo(memo)
    return archs


def _query_archs() -> list[str]:
    import ctypes

    lib = _libcuda()
    if lib is None:
        return []
    if lib.cuInit(0) != 0:
        return []
    count = ctypes.c_int()
    if lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return []
    archs: list[str] = []
    for ordinal in range(count.value):
        device = ctypes.c_int()
        major, minor = ctypes.c_int(), ctypes.c_int()
        if lib.cuDeviceGet(ctypes.byref(device), ordinal) != 0:
            continue
        # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75, _MINOR = 76
        if lib.cuDeviceGetAttribute(ctypes.byref(major), 75, device) != 0:
            continue
        if lib.cuDeviceGetAttribute(ctypes.byref(minor), 76, device) != 0:
            continue
        archs.append(f"sm_{major.value}{minor.value}")
    return archs


# --------------------------------------------------------------------------- archs


def arch_number(arch: str) -> tuple[int, str]:
    """Sort key of a normalized arch: ``"sm_90a"`` -> ``(90, "a")``."""
    digits = arch.split("_", 1)[-1]
    suffix = digits[-1] if digits and not digits[-1].isdigit() else ""
    return (int(digits[: len(digits) - len(suffix)]), suffix)


_HOW_TO_SET = (
    "Pass arch='sm_90' (or '9.0', '90') to compile(), or set CUFORGE_ARCH=sm_90 "
    "(TORCH_CUDA_ARCH_LIST='9.0' is read too)."
)


def _explicit_archs(arch) -> tuple[str, ...]:
    if isinstance(arch, (str, int)):
        text = str(arch)
        if any(sep in text for sep in ";, "):
            return parse_arch_list(text.strip())
        return (normalize_arch(text),)
    try:
        items = list(arch)
    except TypeError:
        raise ArchError(f"cannot read arch {arch!r}: {_HOW_TO_SET}") from None
    archs: list[str] = []
    for item in items:
        if not isinstance(item, (str, int)):
            raise ArchError(f"cannot read arch {item!r}: {_HOW_TO_SET}")
        for one in _explicit_archs(item):
            if one not in archs:
                archs.append(one)
    if not archs:
        raise ArchError(f"an empty arch list was given. {_HOW_TO_SET}")
    return tuple(archs)


def resolve_archs(arch, *, allow_many: bool) -> tuple[str, ...]:
    """The archs to compile for, normalized (``sm_90``, ``sm_90a``, ``compute_90``).

    ``arch``: None, a string (``"sm_90"``, ``"9.0"``, ``"90"``, ``"sm_90a"``, or a list
    such as ``"8.0;9.0"``), an int (``90``) or a sequence of those. When None: the first
    visible GPU's arch; else ``CUFORGE_ARCH``; else ``TORCH_CUDA_ARCH_LIST``; else
    :class:`~cuforge.errors.ArchError` saying how to set it. With ``allow_many`` False an
    explicit list of several is an error, and a list from the environment gives its
    highest arch.
    """
    if arch is not None:
        archs = _explicit_archs(arch)
        if len(archs) > 1 and not allow_many:
            raise ArchError(
                f"arch={arch!r} names {len(archs)} archs, but this compile targets one "
                "(NVRTC, or output 'cubin'/'ptx'). Pass one arch, or use backend='nvcc' "
                "with output='fatbin' for several."
            )
        return archs
    gpus = visible_gpu_archs()
    if gpus:
        return (gpus[0],)
    current = settings()
    for var, value in (
        ("CUFORGE_ARCH", current.arch),
        ("TORCH_CUDA_ARCH_LIST", current.torch_arch_list),
    ):
        if not value:
            continue
        try:
            archs = parse_arch_list(value)
        except ArchError as exc:
            raise ArchError(f"{var}={value!r}: {exc}. {_HOW_TO_SET}") from None
        if len(archs) > 1 and not allow_many:
            return (max(archs, key=arch_number),)
        return archs
    raise ArchError(
        "no GPU arch to compile for: no GPU is visible and neither CUFORGE_ARCH nor "
        f"TORCH_CUDA_ARCH_LIST is set. {_HOW_TO_SET}"
    )
