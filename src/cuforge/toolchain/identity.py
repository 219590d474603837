"""What the toolchain is: the compiler identity the cache key records, versions, archs.

:func:`compiler_identity` is cheap on a warm process: the library or executable is
identified by (path, size, mtime_ns), and what was probed about it (version, SHA-256 of
its contents -- read once per version of the file, :mod:`cuforge.toolchain.installed` --
``nvcc --version`` text) is kept in :mod:`cuforge.toolchain.memo` keyed by that stat, so a
warm call neither imports the CUDA Python bindings nor loads NVRTC nor runs nvcc. When a
probe must run, it loads or runs a path derived in this process, never one from the memo.
"""

from __future__ import annotations

import _thread
import os
import sys

from cuforge.base.config import raw_env_get, raw_env_key
from cuforge.base.errors import ToolchainError
from cuforge.toolchain import locate
from cuforge.toolchain import memo as _memo
from cuforge.toolchain.memo import file_stat_key

__all__ = [
    "compiler_identity",
    "check_loaded_nvrtc",
    "check_nvrtc_headers",
    "nvcc_version",
    "nvrtc_version",
    "nvrtc_version_tuple",
    "nvrtc_header_version",
    "cuda_bindings_version",
    "nvrtc_header_mismatch",
    "supported_archs",
    "version_output",
]


# --------------------------------------------------------------------------- probes


_nvrtc_dll_lock = _thread.allocate_lock()


def _nvrtc_dll(path: str):
    """``ctypes.CDLL`` of NVRTC. Only ever given a path derived in this process
    (:func:`locate.find_nvrtc_library`, :func:`locate.derive_nvrtc_library`)."""
    import ctypes  # ctypes: only when NVRTC is probed (the result is memoized)

    with _nvrtc_dll_lock:
        return ctypes.CDLL(path)


def _probe_nvrtc(path: str) -> dict:
    # the version: the pip wheel's (its .dist-info's name, "13.0.88" -> "13.0": nothing
    # loaded; loading NVRTC here, before cuda-pathfinder does, would skip the NVRTC 13.0
    # wheel's builtins preload pathfinder makes), else nvrtcVersion
    wheel = locate.nvrtc_wheel_version(path)
    if wheel is not None:
        major, minor = wheel
    else:
        major, minor = _loaded_nvrtc_version(path)
    # by content, path-free: read once per version of the file (~70 ms for a 100 MB
    # library), then known from the memo by its stat (cuforge.toolchain.installed)
    from cuforge.toolchain.installed import installed_sha256  # only on a probe: memoized

    try:
        sha256 = installed_sha256(path)
    except OSError as exc:
        raise ToolchainError(
            f"cannot read NVRTC at {path}: {exc.strerror or exc}. Reinstall it with "
            "`pip install --force-reinstall nvidia-cuda-nvrtc`."
        ) from None
    return {"version": f"{major}.{minor}", "sha256": sha256}


def _loaded_nvrtc_version(path: str) -> tuple[int, int]:
    """``nvrtcVersion`` of the NVRTC at ``path`` (loaded: a path derived in this process)."""
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
    return major.value, minor.value


def _define(path: str, name: bytes) -> str:
    """The value of ``#define <name> <value>`` in the header ``path`` ("" when absent)."""
    try:
        with open(path, "rb") as f:
            for raw in f:
                if raw.startswith(b"#define " + name):
                    return raw.split()[2].decode()
    except (OSError, IndexError, UnicodeDecodeError):
        return ""
    return ""


def _probe_headers(cuda_h: str, include: list[str] | tuple[str, ...] = ()) -> dict:
    """Versions of the headers: CUDA_VERSION from cuda.h, CCCL_VERSION from CCCL, which
    sits beside cuda.h (toolkit, CUDA 13 wheels) or in its own include dir (the
    ``nvidia-cuda-cccl-cu12`` wheel: another entry of ``include``)."""
    from cuforge.toolchain.installed import hash_file

    version = _define(cuda_h, b"CUDA_VERSION")
    cccl = ""
    for inc in (os.path.dirname(cuda_h), *include):
        for candidate in (
            os.path.join(inc, "cccl", "cuda", "std", "__cccl", "version.h"),
            os.path.join(inc, "cuda", "std", "__cccl", "version.h"),
        ):
            cccl = _define(candidate, b"CCCL_VERSION")
            if cccl:
                break
        if cccl:
            break
    # cuda.h by content, not by path or mtime: the same toolkit release installed in another
    # venv or on another machine keys the same (a shared cache hits across them)
    return {"cuda_version": version, "cccl_version": cccl, "cuda_h_sha256": hash_file(cuda_h)}


def _probe_nvcc(path: str) -> dict:
    import subprocess  # subprocess: only when nvcc is probed (memoized)

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


# (path, mtime_ns, size, inode, ctime_ns) -> stdout of ``path --version``
_version_outputs: dict[tuple, str] = {}


def version_output(path: str, timeout: float = 60) -> str | None:
    """The stdout of ``path --version`` (a host compiler, nvcc), or None when it cannot run.

    Probed once per version of the file: remembered in this process and in the machine memo
    (``toolchain.json`` of the cache doing the work) under the file's stat (mtime, size,
    inode, ctime), so a second process runs no subprocess. The memo caches the text only:
    what runs is ``path``, which the caller derived in this process. A probe that fails is
    not remembered."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    sig = [st.st_mtime_ns, st.st_size, st.st_ino, st.st_ctime_ns]
    key = (path, *sig)
    found = _version_outputs.get(key)
    if found is not None:
        return found
    with _memo.lock:
        memo = _memo.load()
        known = _memo.probed(memo, "version-output", path, sig)
        if known is not None and isinstance(known.get("stdout"), str):
            found = known["stdout"]
        else:
            import subprocess  # only when a tool is probed (memoized)

            try:
                found = subprocess.run(
                    [path, "--version"],
                    capture_output=True,
                    text=True,
                    timeout=timeout,
                    check=False,
                ).stdout
            except (OSError, subprocess.SubprocessError):
                return None
            _memo.remember(memo, "version-output", path, sig, {"stdout": found})
            _memo.save(memo)
    _version_outputs[key] = found
    return found


# --------------------------------------------------------------------------- identity

# (backend, env) -> (stat-checked paths with their sigs, identity)
_identity_memo: dict[tuple, tuple[tuple[tuple[str, list[int] | None], ...], dict[str, str]]] = {}

_IDENTITY_VARS = {
    # what locates NVRTC (as cuda-pathfinder searches) and the toolkit headers
    "nvrtc": tuple(map(raw_env_key, ("CUDA_HOME", "CUDA_PATH", "LD_LIBRARY_PATH", "PATH"))),
    # what locates nvcc
    "nvcc": tuple(map(raw_env_key, ("CUFORGE_NVCC", "CUDA_HOME", "CUDA_PATH", "PATH"))),
}


def _identity_env(backend: str) -> tuple:
    names = _IDENTITY_VARS.get(backend, ())
    return (backend, sys.prefix, *map(raw_env_get, names))


def compiler_identity(backend: str) -> dict[str, str]:
    """What the cache key records about the compiler.

    ``"nvrtc"``: ``{"compiler", "version", "library", "library_sha256", "headers"}``;
    ``"nvcc"``: ``{"compiler", "path", "version", "version_output"}``.

    No absolute path is in it (the library's and nvcc's file names only; the headers by
    their versions and ``cuda.h``'s SHA-256): one toolkit release installed in two venvs,
    or on two machines, gives one identity, so a shared cache hits across them.

    Warm, this costs a dictionary lookup and one or two ``stat`` calls; in a fresh process
    it reads ``<cache_dir>/toolchain.json`` instead of loading NVRTC or running nvcc.
    Raises :class:`~cuforge.base.errors.ToolchainError` when the compiler is missing, and
    ``ValueError`` for an unknown backend.
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
    probe = _IDENTIFY.get(backend)
    if probe is None:
        raise ValueError(f"unknown backend {backend!r}: use {' or '.join(map(repr, _IDENTIFY))}")
    checks, identity = probe()
    _identity_memo[env] = (checks, identity)
    return dict(identity)


def check_loaded_nvrtc() -> None:
    """Raise :class:`~cuforge.base.errors.ToolchainError` when the NVRTC that compiles (the one
    cuda-pathfinder loads) is not the one this process's keys identify (a replayed search
    that pathfinder would not make: a newer pathfinder that searches elsewhere). Its path
    is remembered, so the next try keys with it. Called once, when NVRTC is first loaded to
    compile."""
    keyed = locate.nvrtc_library_path()
    found = locate.find_nvrtc_library()
    if os.path.realpath(keyed) == os.path.realpath(found):
        return
    with _memo.lock:
        memo = _memo.load()
        found_sig = file_stat_key(found)
        same = (
            found_sig is not None
            and _content_sha256(memo, keyed)
            == (_probe_memoized(memo, found, found_sig)[0]["sha256"])
        )
        locate.remember_nvrtc_library(memo, found)
        _memo.save(memo)
    _identity_memo.clear()
    if same:  # two copies of one library, byte for byte: the keys stand
        return
    raise ToolchainError(
        f"cuforge keyed this process's compiles with the NVRTC at {keyed}, but cuda-bindings "
        f"loaded the one at {found}. Nothing was compiled; try again (cuforge now keys with "
        "the loaded one). Please report it with `cuforge doctor`'s output."
    )


def check_nvrtc_headers() -> None:
    """Raise :class:`~cuforge.base.errors.ToolchainError` when the header dirs this process's
    keys named came from the toolchain memo and cuda-pathfinder now finds others
    (:func:`cuforge.toolchain.locate.recheck_include_dirs`); the next try keys with
    pathfinder's. Called before each NVRTC compile: a set lookup once checked."""
    if not locate._pf_unchecked:
        return
    changed = locate.recheck_include_dirs()
    if changed is None:
        return
    _identity_memo.clear()
    remembered, found = changed
    raise ToolchainError(
        "cuforge keyed this process's compiles with the CUDA headers in "
        f"{', '.join(remembered)} (remembered in {_memo.memo_path()}), but cuda-pathfinder "
        f"now finds {', '.join(found) or 'none'}. Nothing was compiled; try again (cuforge "
        "now keys with the headers pathfinder finds)."
    )


def _probe_memoized(memo: dict, library: str, sig: list[int]) -> tuple[dict, bool]:
    """``library``'s probe (version, SHA-256) from ``memo``, else probed now and put there;
    and whether it was probed now. Only for a path derived in this process: a probe may
    load it."""
    lib = _memo.probed(memo, "nvrtc", library, sig)
    if lib is not None:
        return lib, False
    lib = _probe_nvrtc(library)
    _memo.remember(memo, "nvrtc", library, sig, lib)
    return lib, True


def _content_sha256(memo: dict, library: str) -> str | None:
    """``library``'s SHA-256 without loading it (its path may have come from the memo):
    its memoized probe's, else read when it is a regular file; None otherwise."""
    sig = file_stat_key(library)
    if sig is None:
        return None
    lib = _memo.probed(memo, "nvrtc", library, sig)
    if lib is not None:
        return lib.get("sha256")
    if not os.path.isfile(library):  # read a regular file only (never a FIFO, a device)
        return None
    from cuforge.toolchain.installed import installed_sha256

    try:
        return installed_sha256(library)
    except OSError:
        return None


def _nvrtc_identity():
    library = locate.nvrtc_library_path()  # identifies NVRTC; never loaded from here
    with _memo.lock:
        memo = _memo.load()
        changed = False
        sig = file_stat_key(library)
        if sig is None:
            raise ToolchainError(f"the NVRTC library {library} disappeared; reinstall it")
        lib = _memo.probed(memo, "nvrtc", library, sig)
        if lib is None:
            # a probe loads the library: take the path derived in this process, not the memo's
            found = locate.derive_nvrtc_library()
            if found != library:
                library = found
                locate.remember_nvrtc_library(memo, library)
                changed = True
                sig = file_stat_key(library)
            lib, probed = _probe_memoized(memo, library, sig)
            changed = changed or probed
        checks = [(library, sig)]
        include = locate.toolkit_include_dirs()
        # where the headers are is not keyed (another venv's path keys the same); what they
        # are is: their versions and cuda.h's digest
        headers = "none"
        if include:
            cuda_h = os.path.join(include[0], "cuda.h")
            hsig = file_stat_key(cuda_h)
            if hsig is not None:
                hdr = _memo.probed(memo, "headers", cuda_h, hsig)
                if hdr is None or "cuda_h_sha256" not in hdr:
                    hdr = _probe_headers(cuda_h, include)
                    _memo.remember(memo, "headers", cuda_h, hsig, hdr)
                    changed = True
                # not re-checked per call (one stat per call, of the library, is the
                # budget); a fresh process or a changed library re-reads the headers' stat
                headers = (
                    f"CUDA_VERSION={hdr.get('cuda_version', '')} "
                    f"CCCL_VERSION={hdr.get('cccl_version', '')} "
                    f"cuda.h={hdr.get('cuda_h_sha256', '')[:16]}"
                )
        if changed:
            _memo.save(memo)
    identity = {
        "compiler": "nvrtc",
        "version": str(lib["version"]),
        # the library by content; its file name, not its path (a venv's path is not keyed)
        "library": os.path.basename(library),
        "library_sha256": str(lib["sha256"]),
        "headers": headers,
    }
    return tuple(checks), identity


def _nvcc_identity():
    path = locate.nvcc_path()  # derived in this process: settings and the toolkit root
    sig = file_stat_key(path)
    if sig is None:
        raise ToolchainError(f"nvcc at {path} disappeared; check the CUDA toolkit install")
    checks = [(path, sig)]
    # a wrapper script (CUFORGE_NVCC=/usr/local/bin/nvcc): the executable it runs counts too
    real = locate.resolve_nvcc(path)
    if real != path:
        real_sig = file_stat_key(real)
        if real_sig is not None:
            checks.append((real, real_sig))
    memo_sig = [n for _, s in checks for n in (s or [])]
    with _memo.lock:
        memo = _memo.load()
        data = _memo.probed(memo, "nvcc", path, memo_sig)
        if data is None:
            data = _probe_nvcc(path)
            _memo.remember(memo, "nvcc", path, memo_sig, data)
            _memo.save(memo)
    identity = {
        "compiler": "nvcc",
        # not its path or the toolkit's: the same release elsewhere keys the same; the
        # version output names the exact build ("Build cuda_13.0.r13.0/compiler.36424714_0")
        "path": os.path.basename(path),
        "version": str(data["version"]),
        "version_output": str(data["version_output"]),
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


def _version_tuple(text: str | None) -> tuple[int, int] | None:
    parts = (text or "").split(".")
    if len(parts) < 2 or not (parts[0].isdigit() and parts[1].isdigit()):
        return None
    return int(parts[0]), int(parts[1])


def nvrtc_version_tuple() -> tuple[int, int] | None:
    """NVRTC's (major, minor) (``(12, 9)``), or None when NVRTC cannot be found or loaded.
    The cache key holds the same major.minor (``compiler_identity("nvrtc")["version"]``)."""
    return _version_tuple(nvrtc_version())


def nvrtc_header_version() -> tuple[int, int] | None:
    """``CUDA_VERSION`` of the headers NVRTC compiles against (the first of
    :func:`~cuforge.toolchain.locate.toolkit_include_dirs`) as (major, minor), or None when
    there are no such headers."""
    include = locate.toolkit_include_dirs()
    return locate.header_cuda_version(include[0]) if include else None


def cuda_bindings_version() -> tuple[int, int] | None:
    """The installed cuda-bindings (major, minor), read from its metadata without importing
    it; None when it is not installed."""
    from cuforge.toolchain.installed import installed_version

    version = installed_version("cuda-bindings")
    return None if version is None else _version_tuple(version)


def nvrtc_header_mismatch() -> str | None:
    """A sentence for a person when NVRTC, its headers and cuda-bindings disagree, or None.

    Checked: NVRTC newer than the headers it compiles against (an older ``cuda_fp16.h`` or
    CUB may not build, or build differently), a different CUDA major of NVRTC and headers,
    and cuda-bindings of another major than NVRTC. Each message ends with the fix. Loads
    NVRTC when it is not memoized: for ``cuforge doctor``, not the compile path."""
    nvrtc = nvrtc_version_tuple()
    if nvrtc is None:
        return None
    include = locate.toolkit_include_dirs()
    headers = locate.header_cuda_version(include[0]) if include else None
    fix_pkg = f"cuforge[cu{nvrtc[0]}]"
    if headers is not None and headers[0] != nvrtc[0]:
        return (
            f"NVRTC {nvrtc[0]}.{nvrtc[1]} compiles against CUDA {headers[0]}.{headers[1]} "
            f"headers in {include[0]}: the majors differ. Fix: `pip install '{fix_pkg}'` for "
            f"headers of the same major, or set CUDA_HOME to a CUDA {nvrtc[0]} toolkit."
        )
    if headers is not None and headers < nvrtc:
        return (
            f"NVRTC {nvrtc[0]}.{nvrtc[1]} is newer than the CUDA {headers[0]}.{headers[1]} "
            f"headers it compiles against ({include[0]}). Fix: upgrade the headers "
            f"(`pip install -U '{fix_pkg}'`, or a newer toolkit in CUDA_HOME), or install "
            f"an NVRTC of {headers[0]}.{headers[1]}."
        )
    bindings = cuda_bindings_version()
    if bindings is not None and bindings[0] != nvrtc[0]:
        return (
            f"cuda-bindings {bindings[0]}.{bindings[1]} is installed with NVRTC "
            f"{nvrtc[0]}.{nvrtc[1]}: the majors differ. Fix: `pip install '{fix_pkg}'` "
            f"(or 'cuforge[cu{bindings[0]}]' to move NVRTC to CUDA {bindings[0]})."
        )
    return None


def nvrtc_supported_archs() -> list[str]:
    """The real archs (``sm_XY``) NVRTC can build for; [] when it is unavailable. Loads
    NVRTC (found in this process): for doctor-style checks, not for the compile path."""
    import ctypes

    try:
        lib = _nvrtc_dll(locate.find_nvrtc_library())
        count = ctypes.c_int()
        if lib.nvrtcGetNumSupportedArchs(ctypes.byref(count)) != 0:
            return []
        archs = (ctypes.c_int * count.value)()
        if lib.nvrtcGetSupportedArchs(archs) != 0:
            return []
    except (ToolchainError, OSError, AttributeError):
        return []
    return [f"sm_{a}" for a in archs]


def nvcc_supported_archs() -> list[str]:
    """The real archs (``sm_XY``) nvcc can build for (``nvcc --list-gpu-arch``); [] when
    it is unavailable."""
    import subprocess

    try:
        proc = subprocess.run(
            [locate.nvcc_path(), "--list-gpu-arch"],
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


#: Per compiler: its identity probe and its supported-arch query.
_IDENTIFY = {"nvrtc": _nvrtc_identity, "nvcc": _nvcc_identity}
_SUPPORTED = {"nvrtc": nvrtc_supported_archs, "nvcc": nvcc_supported_archs}


def supported_archs(backend: str) -> list[str]:
    """The real archs (``sm_XY``) the ``backend`` compiler can build for; [] when it is
    unavailable. Raises ``ValueError`` for an unknown backend."""
    query = _SUPPORTED.get(backend)
    if query is None:
        raise ValueError(f"unknown backend {backend!r}: use {' or '.join(map(repr, _SUPPORTED))}")
    return query()
