"""Finding the CUDA toolchain: the toolkit root, nvcc, the NVRTC library, the header roots.

Every path this module returns that cuforge loads or runs is derived in the calling
process, from the environment and the filesystem. Two answers are memo-backed (kept in the
toolchain memo, re-validated by stat): :func:`nvrtc_library_path` *identifies* NVRTC for the
cache key and for messages (what is loaded comes from :func:`find_nvrtc_library`), and the
header dirs cuda-pathfinder finds for :func:`toolkit_include_dirs` (the header wheels NVRTC
compiles with when the toolkit's are of another release, or when there is no toolkit),
which key a compile without importing cuda-pathfinder and are checked against
pathfinder's own answer before NVRTC compiles with them (:func:`recheck_include_dirs`).

Imports nothing costly at import time (no ``shutil``, no ``cuda.*``).
"""

from __future__ import annotations

import os
import stat as _stat
import sys

from cuforge.base import _fs
from cuforge.base.config import raw_env_get, raw_env_key, settings
from cuforge.base.errors import ToolchainError
from cuforge.base.paths import SITE_DIR_NAMES
from cuforge.toolchain import memo as _memo

__all__ = [
    "is_toolkit",
    "which",
    "resolve_nvcc",
    "toolkit_root",
    "nvcc_path",
    "nvrtc_library_path",
    "find_nvrtc_library",
    "derive_nvrtc_library",
    "toolkit_include_dirs",
    "header_cuda_version",
    "nvrtc_library_major",
    "nvrtc_wheel_version",
    "recheck_include_dirs",
]

_DEFAULT_ROOT = "/usr/local/cuda"


def _env(name: str) -> str:
    return os.environ.get(name) or ""


def is_toolkit(root: str) -> bool:
    """Whether ``root`` is a CUDA toolkit: it has ``bin/nvcc`` or ``include/cuda_runtime.h``
    (a headers-only install serves NVRTC). The one definition; ``cuforge doctor`` uses it."""
    return os.path.isfile(os.path.join(root, "bin", "nvcc")) or os.path.isfile(
        os.path.join(root, "include", "cuda_runtime.h")
    )


def which(program: str, path: str | None = None) -> str | None:
    """The first executable regular file ``program`` in ``path`` (default ``$PATH``), or None.

    Not ``shutil.which``: importing shutil costs 5.6 ms in a fresh process, while this
    loop costs ~58 us for ``nvcc`` over a 12-entry PATH (measured 2026-11-23 on the 2-core
    dev box: ``python -c "import time; t=time.perf_counter(); import shutil; ..."``), and
    it runs on every fresh process's warm cache hit (through :func:`toolkit_root`)."""
    for directory in (_env("PATH") if path is None else path).split(os.pathsep):
        if not directory:
            continue
        candidate = os.path.join(directory, program)
        try:
            st = os.stat(candidate)  # one syscall per PATH entry
        except OSError:
            continue
        if _stat.S_ISREG(st.st_mode) and st.st_mode & 0o111:
            return candidate
    return None


def _script_target(path: str) -> str | None:
    """The absolute ``.../nvcc`` a small shell-script wrapper execs, or None."""
    try:
        fd = _fs.open_regular(path)
    except OSError:
        return None
    try:
        if os.read(fd, 2) != b"#!":  # the real (ELF) nvcc: nothing more to read
            return None
        head = b"#!" + os.read(fd, 16382)
    except OSError:
        return None
    finally:
        os.close(fd)
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


def resolve_nvcc(path: str) -> str:
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


_ROOT_VARS = tuple(map(raw_env_key, ("CUDA_HOME", "CUDA_PATH", "PATH")))
_root_memo: tuple[tuple, str | None] | None = None


def toolkit_root() -> str | None:
    """The real CUDA toolkit root, or None when there is none.

    ``CUDA_HOME`` / ``CUDA_PATH`` when they name a toolkit (:func:`is_toolkit`); else the
    toolkit of the ``nvcc`` on ``PATH``, following symlinks and shell-script wrappers
    (``exec /usr/local/cuda-13.0/bin/nvcc "$@"``); else ``/usr/local/cuda``. Symlinks are
    resolved: ``/usr/local/cuda`` -> ``/usr/local/cuda-13.0``. Memoized per process until
    one of those variables changes.
    """
    global _root_memo
    env = tuple(map(raw_env_get, _ROOT_VARS))
    memo = _root_memo
    if memo is not None and memo[0] == env:
        return memo[1]
    root = _find_toolkit_root(_env("CUDA_HOME"), _env("CUDA_PATH"), _env("PATH"))
    _root_memo = (env, root)
    return root


def _find_toolkit_root(cuda_home: str, cuda_path: str, path: str) -> str | None:
    for value in (cuda_home, cuda_path):
        if value and is_toolkit(value):
            return os.path.realpath(value)
    found = which("nvcc", path)
    if found is not None:
        real = resolve_nvcc(found)
        bindir = os.path.dirname(real)
        if os.path.basename(bindir) == "bin":
            root = os.path.dirname(bindir)
            if is_toolkit(root):
                return root
    if is_toolkit(_DEFAULT_ROOT):
        return os.path.realpath(_DEFAULT_ROOT)
    return None


def nvcc_path() -> str:
    """The nvcc to run: ``CUFORGE_NVCC`` when set, else ``<toolkit_root>/bin/nvcc``.
    Raises :class:`~cuforge.base.errors.ToolchainError` saying how to fix it."""
    configured = settings().nvcc
    if configured:
        candidate = os.path.expanduser(configured)
        if os.sep not in candidate:
            candidate = which(candidate) or candidate
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


# --------------------------------------------------------------------------- NVRTC


def _nvrtc_locate_key() -> str:
    return "|".join((sys.prefix, _env("CUDA_HOME"), _env("CUDA_PATH"), _env("LD_LIBRARY_PATH")))


def _site_signature() -> list[list]:
    """(dir, mtime_ns) of every site-packages dir on sys.path. pip adds or removes a
    top-level ``*.dist-info`` on every install, so this changes when a wheel that could
    hold NVRTC (which cuda-pathfinder prefers) comes or goes."""
    sig: list[list] = []
    for entry in sys.path:
        if entry and os.path.basename(entry) in SITE_DIR_NAMES:
            try:
                sig.append([entry, os.stat(entry).st_mtime_ns])
            except OSError:
                continue
    return sig


# locate key -> path: the answer nvrtc_library_path() gives in this process
_nvrtc_path_memo: dict[str, str] = {}
# locate key -> path cuda-pathfinder found in this process: the only paths ever loaded
_found_memo: dict[str, str] = {}


def nvrtc_library_path() -> str:
    """Absolute path of the NVRTC shared library (``libnvrtc.so.13`` or ``.so.12``) as
    cuda-pathfinder finds it (the ``nvidia-cuda-nvrtc`` / ``nvidia-cuda-nvrtc-cu12`` wheel
    first), for the cache key and for messages.

    Cheap when memoized: the path is remembered per process and in the on-disk memo
    (keyed by ``sys.prefix``, ``CUDA_HOME``, ``CUDA_PATH`` and ``LD_LIBRARY_PATH``) and
    re-validated with a stat of it and of the site-packages dirs (a wheel installed or
    removed since makes cuda-pathfinder search again). **Never load this path**: it may
    come from the cache dir. Load :func:`find_nvrtc_library`. Raises
    :class:`~cuforge.base.errors.ToolchainError` when NVRTC cannot be found."""
    key = _nvrtc_locate_key()
    path = _nvrtc_path_memo.get(key)
    if path is not None and os.path.isfile(path):
        return path
    with _memo.lock:
        memo = _memo.load()
        site = _site_signature()
        entry = memo.get("locate", {}).get("nvrtc|" + key)
        path = entry.get("path") if isinstance(entry, dict) else None
        if not (isinstance(path, str) and entry.get("site") == site and os.path.isfile(path)):
            path = derive_nvrtc_library()
            memo.setdefault("locate", {})["nvrtc|" + key] = {"path": path, "site": site}
            _memo.save(memo)
        _nvrtc_path_memo[key] = path
        return path


def find_nvrtc_library() -> str:
    """Absolute path of the NVRTC library, found by cuda-pathfinder in this process (never
    read from a memo): the path to load. Costs the cuda-pathfinder import (~120 ms) on the
    first call of a process. Raises :class:`~cuforge.base.errors.ToolchainError`."""
    key = _nvrtc_locate_key()
    path = _found_memo.get(key)
    if path is not None and os.path.isfile(path):
        return path
    path = _search_nvrtc()
    _found_memo[key] = path
    if _nvrtc_path_memo.get(key) not in (None, path):
        _nvrtc_path_memo[key] = path  # what this process found beats what a memo said
    return path


def derive_nvrtc_library() -> str:
    """NVRTC's path as cuda-pathfinder would find it, derived in this process (never read
    from a memo, so it may be loaded, e.g. to probe its version): pathfinder's own answer
    once this process has one; else, when no NVRTC is loaded yet, its first search step
    replayed (:func:`_nvrtc_wheel_in_site_packages`: the pip wheel it prefers, a few
    ``stat`` calls); else pathfinder's search. Importing cuda-pathfinder costs ~45 ms, most
    of a fresh cache dir's first lookup; the compile path checks that the NVRTC
    cuda-bindings loads is this one (:func:`cuforge.toolchain.identity.check_loaded_nvrtc`). Raises
    :class:`~cuforge.base.errors.ToolchainError` when NVRTC cannot be found."""
    key = _nvrtc_locate_key()
    path = _found_memo.get(key) or _derived_memo.get(key)
    if path is not None and os.path.isfile(path):
        return path
    path = _nvrtc_wheel_in_site_packages() if not _nvrtc_loaded() else None
    if path is None:
        return find_nvrtc_library()
    _derived_memo[key] = path
    return path


# locate key -> path derive_nvrtc_library() replayed from pathfinder's search in this process
_derived_memo: dict[str, str] = {}

#: cuda-pathfinder's first search step for NVRTC on Linux (its ``descriptor_catalog``,
#: cuda-pathfinder 1.x): these dirs under each site-packages dir, in this order, and in
#: each the first of these file names
_NVRTC_WHEEL_DIRS = (("nvidia", "cu13", "lib"), ("nvidia", "cuda_nvrtc", "lib"))
_NVRTC_SONAMES = ("libnvrtc.so.13", "libnvrtc.so.12")


def _nvrtc_wheel_in_site_packages() -> str | None:
    """The NVRTC of a pip wheel, searched as cuda-pathfinder's first step searches
    (``find_sub_dirs_all_sitepackages``: ``site.getsitepackages()``, the user site
    second in a venv and first outside one); None when there is none there, or off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    import site

    parents = list(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        user = site.getusersitepackages()
        if user:
            parents.insert(1 if sys.prefix != sys.base_prefix else 0, user)
    for rel in _NVRTC_WHEEL_DIRS:
        for parent in parents:
            lib_dir = os.path.join(parent, *rel)
            if not os.path.isdir(lib_dir):
                continue
            for soname in _NVRTC_SONAMES:
                path = os.path.join(lib_dir, soname)
                if os.path.isfile(path):
                    return path
    return None


def _nvrtc_loaded() -> bool:
    """Whether some NVRTC is already loaded in this process (pathfinder's step 0 then
    answers with it: leave the search to pathfinder)."""
    if not sys.platform.startswith("linux"):
        return True
    import ctypes

    for soname in _NVRTC_SONAMES:
        try:
            ctypes.CDLL(soname, mode=os.RTLD_NOLOAD)
        except OSError:
            continue
        return True
    return False


def _search_nvrtc() -> str:
    fix = (
        "Install it with `pip install 'cuforge[cu13]'` (CUDA 13) or `pip install "
        "'cuforge[cu12]'` (CUDA 12 drivers), or install the CUDA toolkit and set CUDA_HOME."
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


def remember_nvrtc_library(memo: dict, path: str) -> None:
    """Record ``path`` (just found by :func:`find_nvrtc_library`) as the located NVRTC, in
    this process and in ``memo`` (the caller saves it)."""
    key = _nvrtc_locate_key()
    _nvrtc_path_memo[key] = path
    memo.setdefault("locate", {})["nvrtc|" + key] = {"path": path, "site": _site_signature()}


# --------------------------------------------------------------------------- headers

_include_memo: dict[str | None, tuple[str, ...]] = {}
_pf_dirs_memo: dict[str, tuple[str, ...]] = {}


def toolkit_include_dirs() -> list[str]:
    """The CUDA header roots NVRTC needs (``cuda_fp16.h``, ``cub/...``): the headers of the
    NVRTC release in use when they are installed as pip wheels and the toolkit's are of
    another release (NVRTC 13.5 from the ``nvidia-cuda-nvrtc`` wheel with the 13.5
    ``cudart``/``cccl`` header wheels, beside a CUDA 13.0 toolkit: the wheels'); else
    ``<root>/include`` and ``<root>/include/cccl`` when present; else what cuda-pathfinder
    finds for the ``cudart`` and ``cccl`` header wheels. These are *system* roots: the
    toolkit identity covers their headers, which are not hashed one by one. Nothing is
    imported once the toolchain memo knows the machine: pathfinder's answer is remembered
    there (:func:`_pathfinder_include_dirs`)."""
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
    release = _nvrtc_release_include_dirs(dirs[0]) if dirs else []
    if release:
        dirs = release
    elif dirs and _toolkit_major_differs(dirs[0]):
        # NVRTC 12 from the -cu12 wheel beside a CUDA 13 toolkit (or the reverse): the
        # toolkit's headers would not match the compiler, so take the header wheels that
        # come with NVRTC when there are any (the mismatch is reported by
        # identity.nvrtc_header_mismatch and `cuforge doctor` when there are none)
        wheel = list(_pathfinder_include_dirs())
        if wheel and header_cuda_version(wheel[0]) is not None:
            dirs = wheel
    if not dirs:
        dirs = list(_pathfinder_include_dirs())
    _include_memo[root] = tuple(dirs)
    return dirs


def header_cuda_version(include_dir: str) -> tuple[int, int] | None:
    """``CUDA_VERSION`` of ``<include_dir>/cuda.h`` as (major, minor) (``12090`` ->
    ``(12, 9)``), or None when there is no such header or no readable define. Memoized
    in the process and in the toolchain memo by the header's stat."""
    path = os.path.join(include_dir, "cuda.h")
    sig = _memo.file_stat_key(path)
    if sig is None:
        return None
    known = _version_memo.get(("cuda_h", path))
    if known is not None and known[0] == sig:
        return known[1]
    with _memo.lock:
        memo = _memo.load()
        data = _memo.probed(memo, "cuda_h", path, sig)
        if data is None:
            found = _read_cuda_version(path)
            data = {"version": list(found) if found else None}
            _memo.remember(memo, "cuda_h", path, sig, data)
            _memo.save(memo)
    raw = data.get("version")
    version = (int(raw[0]), int(raw[1])) if isinstance(raw, list) and len(raw) == 2 else None
    _version_memo[("cuda_h", path)] = (sig, version)
    return version


#: (probe kind, path) -> (stat signature, version): the in-process layer of the memo
_version_memo: dict[tuple[str, str], tuple[list[int], tuple[int, int] | None]] = {}


def _read_cuda_version(path: str) -> tuple[int, int] | None:
    try:
        fd = _fs.open_regular(path)
    except OSError:
        return None
    try:
        head = os.read(fd, 1 << 16)  # the define sits in the first few KB of cuda.h
    except OSError:
        return None
    finally:
        os.close(fd)
    for line in head.split(b"\n"):
        if line.startswith(b"#define CUDA_VERSION"):
            parts = line.split()
            if len(parts) >= 3 and parts[2].isdigit():
                value = int(parts[2])
                return value // 1000, (value % 1000) // 10
    return None


def nvrtc_library_major(path: str) -> int | None:
    """The CUDA major of an NVRTC library from its file name (``libnvrtc.so.12``,
    ``libnvrtc.so.13.0.88``, ``nvrtc64_120_0.dll``), without loading it; None if unknown."""
    name = os.path.basename(path)
    for prefix in ("libnvrtc.so.", "nvrtc64_"):
        if name.startswith(prefix):
            digits = name[len(prefix) :].split(".")[0].split("_")[0]
            if digits.isdigit():
                return int(digits[:2]) if prefix == "nvrtc64_" else int(digits)
    return None


def nvrtc_wheel_version(library: str) -> tuple[int, int] | None:
    """(major, minor) of the pip wheel that holds the NVRTC library ``library``
    (``nvidia-cuda-nvrtc`` 13.5.x -> ``(13, 5)``), read from the name of its ``.dist-info``
    in the same site-packages dir (one ``listdir``; nothing is loaded), or None when
    ``library`` is not in such a wheel."""
    d = os.path.dirname(os.path.abspath(library))
    while os.path.basename(d) not in SITE_DIR_NAMES:
        parent = os.path.dirname(d)
        if parent == d:
            return None
        d = parent
    # memoized by the library's stat and the site-packages dir's (its mtime changes when a
    # distribution is installed or removed): one listdir per install, not per process
    lib_sig, dir_sig = _memo.file_stat_key(library), _memo.file_stat_key(d)
    sig = None if lib_sig is None or dir_sig is None else lib_sig + dir_sig
    known = _version_memo.get(("nvrtc_wheel", library))
    if sig is not None and known is not None and known[0] == sig:
        return known[1]
    with _memo.lock:
        memo = _memo.load()
        data = _memo.probed(memo, "nvrtc_wheel", library, sig) if sig is not None else None
        if data is None:
            found = _scan_nvrtc_wheel_version(library, d)
            data = {"version": list(found) if found else None}
            if sig is not None:
                _memo.remember(memo, "nvrtc_wheel", library, sig, data)
                _memo.save(memo)
    raw = data.get("version")
    version = (int(raw[0]), int(raw[1])) if isinstance(raw, list) and len(raw) == 2 else None
    if sig is not None:
        _version_memo[("nvrtc_wheel", library)] = (sig, version)
    return version


def _scan_nvrtc_wheel_version(library: str, d: str) -> tuple[int, int] | None:
    from cuforge.toolchain import installed as _installed  # off the import path (~0.5 ms)

    major = nvrtc_library_major(library)
    for name in _installed.dist_infos(d, cached=False):
        dist, version = _installed.split_info_name(name) or ("", "")
        if dist not in ("nvidia_cuda_nvrtc", "nvidia_cuda_nvrtc_cu12", "nvidia_cuda_nvrtc_cu11"):
            continue
        parts = version.split(".")
        if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
            found = int(parts[0]), int(parts[1])
            if major is None or found[0] == major:
                return found
    return None


def _nvrtc_release_include_dirs(toolkit_include: str) -> list[str]:
    """The header wheels' dirs when NVRTC comes from a pip wheel of another release than
    the toolkit headers in ``toolkit_include`` and the header wheels of NVRTC's own release
    are installed; else [] (keep the toolkit's)."""
    try:
        release = nvrtc_wheel_version(nvrtc_library_path())
    except ToolchainError:
        return []
    if release is None or header_cuda_version(toolkit_include) == release:
        return []
    wheel = list(_pathfinder_include_dirs())
    if wheel and header_cuda_version(wheel[0]) == release:
        return wheel
    return []


def _toolkit_major_differs(include_dir: str) -> bool:
    """Whether the toolkit headers in ``include_dir`` and the NVRTC that is located are of
    different CUDA majors (both must be known)."""
    headers = header_cuda_version(include_dir)
    if headers is None:
        return False
    try:
        major = nvrtc_library_major(nvrtc_library_path())
    except ToolchainError:
        return False
    return major is not None and major != headers[0]


#: The header each of cuda-pathfinder's header libraries is found by (its descriptor's
#: ``header_basename``): the file whose stat a remembered answer is checked against
_PF_HEADER_LIBS = (("cudart", "cuda_runtime.h"), ("cccl", os.path.join("cuda", "std", "version")))


def _pf_key() -> str:
    """What cuda-pathfinder's header search reads besides the filesystem: the interpreter's
    prefix (its site-packages), ``CONDA_PREFIX``, ``CUDA_HOME``, ``CUDA_PATH`` and
    ``LD_LIBRARY_PATH`` (its toolkit-root canary)."""
    return _nvrtc_locate_key() + "|" + _env("CONDA_PREFIX")


def _pathfinder_include_dirs() -> tuple[str, ...]:
    """The ``cudart`` and ``cccl`` header dirs cuda-pathfinder finds (each once, in this
    order). Memoized per process and in the toolchain memo, so that a fresh process's key
    does not import cuda-pathfinder (~50-190 ms of CPU, more than a disk hit's own work):
    a remembered answer stands while the site-packages dirs are unchanged (a wheel
    installed or removed makes pathfinder search again) and the header each dir was found
    by has the same stat, and only when every dir lies under a root those checks cover (a
    site-packages dir, ``CONDA_PREFIX``, ``CUDA_HOME``, ``CUDA_PATH``): a dir found by
    pathfinder's later steps (a system install dir, its toolkit-root canary), or no dir,
    is searched again in each process. A remembered answer is checked against
    pathfinder's own before this process compiles with NVRTC
    (:func:`recheck_include_dirs`)."""
    key = _pf_key()
    found = _pf_dirs_memo.get(key)
    if found is not None:
        return found
    with _memo.lock:
        memo = _memo.load()
        site = _site_signature()
        dirs = _remembered_pf_dirs(memo.get("locate", {}).get("include|" + key), site)
        if dirs is not None:
            _pf_unchecked.add(key)
        else:
            dirs = _search_pf_dirs()
            entry = _pf_entry(dirs, site)
            locate = memo.setdefault("locate", {})
            if entry is not None:
                locate["include|" + key] = entry
                _memo.save(memo)
            elif locate.pop("include|" + key, None) is not None:
                _memo.save(memo)
    _pf_dirs_memo[key] = dirs
    return dirs


# pathfinder keys whose header dirs this process took from the toolchain memo and has not
# yet checked against cuda-pathfinder's own answer (recheck_include_dirs)
_pf_unchecked: set[str] = set()


def _search_pf_dirs() -> tuple[str, ...]:
    """cuda-pathfinder's answer, searched in this process (imports it)."""
    dirs: list[str] = []
    try:
        import cuda.pathfinder as pathfinder
    except ImportError:
        return ()
    for lib, _ in _PF_HEADER_LIBS:
        try:
            d = pathfinder.find_nvidia_header_directory(lib)
        except Exception:  # noqa: BLE001 - pathfinder raises several kinds; none = absent
            d = None
        if d and d not in dirs:
            dirs.append(d)
    return tuple(dirs)


def _pf_entry(dirs: tuple[str, ...], site: list[list]) -> dict | None:
    """The memo entry for pathfinder's answer ``dirs``, or None when it must not be
    remembered (see :func:`_pathfinder_include_dirs`)."""
    if not dirs:
        return None
    roots = [p for p, _ in site]
    roots += [v for v in (_env("CONDA_PREFIX"), _env("CUDA_HOME"), _env("CUDA_PATH")) if v]
    roots = [os.path.realpath(r).rstrip(os.sep) + os.sep for r in roots]
    checks: list[list] = []
    for d in dirs:
        if not os.path.realpath(d).startswith(tuple(roots)):
            return None
        for _, header in _PF_HEADER_LIBS:
            path = os.path.join(d, header)
            sig = _memo.file_stat_key(path)
            if sig is not None:
                checks.append([path, sig])
                break
        else:
            return None
    return {"dirs": list(dirs), "site": site, "checks": checks}


def _remembered_pf_dirs(entry: object, site: list[list]) -> tuple[str, ...] | None:
    """The dirs of a memo entry that still stands (see :func:`_pathfinder_include_dirs`),
    else None."""
    if not isinstance(entry, dict) or entry.get("site") != site:
        return None
    dirs, checks = entry.get("dirs"), entry.get("checks")
    if not (isinstance(dirs, list) and dirs and isinstance(checks, list)):
        return None
    if len(checks) != len(dirs) or not all(isinstance(d, str) for d in dirs):
        return None
    for d, check in zip(dirs, checks, strict=True):
        if not (isinstance(check, list) and len(check) == 2 and isinstance(check[0], str)):
            return None
        if os.path.dirname(check[0]) not in (d, os.path.join(d, "cuda", "std")):
            return None
        if _memo.file_stat_key(check[0]) != check[1]:
            return None
    return tuple(dirs)


def recheck_include_dirs() -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """Check the header dirs this process took from the toolchain memo
    (:func:`_pathfinder_include_dirs`) against the ones cuda-pathfinder finds now. None when
    they agree (or none were taken); else (remembered, found), after the memo and this
    process's answers are set to pathfinder's, so that the next key names them. A set lookup
    once each remembered answer is checked; the check imports cuda-pathfinder, which is
    imported anyway by then (it loads NVRTC). The raising form, for the compile path:
    :func:`cuforge.toolchain.identity.check_nvrtc_headers`."""
    if not _pf_unchecked:
        return None
    with _memo.lock:
        for key in list(_pf_unchecked):
            _pf_unchecked.discard(key)
            remembered = _pf_dirs_memo.get(key)
            if key != _pf_key() or remembered is None:
                continue  # another environment's answer: taken again, checked again
            found = _search_pf_dirs()
            if found == remembered:
                continue
            memo = _memo.load()
            entry = _pf_entry(found, _site_signature())
            if entry is not None:
                memo.setdefault("locate", {})["include|" + key] = entry
            else:
                memo.setdefault("locate", {}).pop("include|" + key, None)
            _memo.save(memo)
            _pf_dirs_memo[key] = found
            _include_memo.clear()
            return remembered, found
    return None
