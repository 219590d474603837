"""The CuTe DSL's identity in a key: what is installed, by content, never by path.

:func:`dsl_version` is a SHA-256 hex digest over

* the name and version of every installed ``nvidia-cutlass-dsl*`` distribution (read from
  the ``*.dist-info`` directory names beside the package: no metadata scan);
* the DSL's own version digest (``CuTeDSL.get_version()``: the contents of every ``.py``
  file of the ``cutlass`` packages, keyed by module name, plus the build-time SHA-256 of the
  loaded compiler library ``_cutlass_ir``) -- the digest the DSL's own cache uses, minus
  nothing, plus nothing path-dependent. It reads every source (~25 ms), so it is remembered
  in cuforge's toolchain memo under a stat signature (name, size, mtime, inode) of the
  DSL's ``.py`` and library files: an edited file changes the signature and the digest is
  computed again;
* the SHA-256 of the *contents* of the runtime library the exported objects link against
  (``libcute_dsl_runtime.so`` of the loaded CUDA flavor), remembered in cuforge's toolchain
  memo by the file's stat so that a fresh process does not re-read 40 MB.

Two virtual environments with the same wheels give the same digest; an edited DSL source
file or a different build of a library gives a different one. The digest is computed once
per process (:func:`reset` forgets it, for tests).

Layer 5; imports the DSL lazily.
"""

from __future__ import annotations

import os

__all__ = ["dsl_version", "dsl_distributions", "reset"]

_cached: str | None = None


def reset() -> None:
    """Forget the digest computed in this process (tests that change the install)."""
    global _cached
    _cached = None


def dsl_distributions() -> list[str]:
    """``["nvidia-cutlass-dsl==4.8.1", ...]``: every installed ``nvidia-cutlass-dsl*``
    distribution beside the imported package, sorted. Empty when none is found."""
    import nvidia_cutlass_dsl  # a namespace package: no __file__

    roots = list(getattr(nvidia_cutlass_dsl, "__path__", ()))
    if not roots:
        return []
    site = os.path.dirname(os.path.abspath(roots[0]))
    found = []
    try:
        names = os.listdir(site)
    except OSError:
        return []
    for entry in names:
        low = entry.lower()
        if not (low.startswith("nvidia_cutlass_dsl") and low.endswith(".dist-info")):
            continue
        stem = entry[: -len(".dist-info")]
        name, _, version = stem.rpartition("-")
        if name and version:
            found.append(f"{name.replace('_', '-').lower()}=={version}")
    return sorted(found)


def _runtime_library_digests(dsl) -> list[str]:
    """``basename:sha256`` of each runtime library the DSL links exported objects against."""
    from cuforge.key import file_digest_of
    from cuforge.toolchain import memo as _memo

    libs = [p for p in dsl.get_shared_libs() if isinstance(p, str)]
    out = []
    with _memo.lock:
        memo = _memo.load()
        changed = False
        for path in libs:
            sig = _memo.file_stat_key(path)
            if sig is None:
                out.append(f"{os.path.basename(path)}:missing")
                continue
            data = _memo.probed(memo, "cute-runtime-lib", path, sig)
            if data is None or not isinstance(data.get("sha256"), str):
                data = {"sha256": file_digest_of(path)}
                _memo.remember(memo, "cute-runtime-lib", path, sig, data)
                changed = True
            out.append(f"{os.path.basename(path)}:{data['sha256']}")
        if changed:
            _memo.save(memo)
    return sorted(out)


def _tree_signature(root: str) -> list[int]:
    """A stat signature (names, sizes, mtimes, inodes) of the ``.py`` and shared-library
    files under ``root``: it changes whenever one of them is edited, added or removed."""
    import hashlib

    h = hashlib.sha256()
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if not (name.endswith(".py") or ".so" in name):
                continue
            try:
                st = os.stat(os.path.join(dirpath, name))
            except OSError:
                continue
            rel = os.path.relpath(os.path.join(dirpath, name), root)
            h.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}\n".encode())
    return [int.from_bytes(h.digest()[:8], "big")]


def _dsl_get_version(dsl) -> str:
    """``dsl.get_version().hexdigest()`` (~25 ms: it reads every DSL source), remembered in
    cuforge's toolchain memo under a stat signature of the DSL's files."""
    import sys

    import cutlass

    from cuforge.toolchain import memo as _memo

    root = os.path.dirname(os.path.dirname(os.path.abspath(cutlass.__file__)))
    loaded = sys.modules.get("cutlass._mlir._mlir_libs._cutlass_ir")
    flavor = os.path.basename(getattr(loaded, "__file__", "") or "")
    where = f"{root}|{flavor}"
    sig = _tree_signature(os.path.join(root, "cutlass"))
    with _memo.lock:
        memo = _memo.load()
        data = _memo.probed(memo, "cute-dsl-version", where, sig)
        if data is not None and isinstance(data.get("digest"), str):
            return data["digest"]
        digest = dsl.get_version().hexdigest()
        _memo.remember(memo, "cute-dsl-version", where, sig, {"digest": digest})
        _memo.save(memo)
    return digest


def dsl_version() -> str:
    """The DSL version digest (see the module doc). Raises ``ImportError`` when the DSL is
    not installed."""
    global _cached
    if _cached is not None:
        return _cached
    import hashlib

    from cutlass.cutlass_dsl import CuTeDSL

    dsl = CuTeDSL._get_dsl()
    h = hashlib.sha256(b"cuforge-cute-dsl-version 1\n")
    for item in dsl_distributions():
        h.update(f"dist {item}\n".encode())
    h.update(b"dsl-get-version " + _dsl_get_version(dsl).encode() + b"\n")
    for item in _runtime_library_digests(dsl):
        h.update(f"lib {item}\n".encode())
    _cached = h.hexdigest()
    return _cached
