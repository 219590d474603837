"""The CuTe DSL's identity in a key: what is installed, by content, never by path.

:func:`dsl_version` is a SHA-256 hex digest over

* the name and version of every installed ``nvidia-cutlass-dsl*`` distribution (read from
  the ``*.dist-info`` directory names beside the package: no metadata scan);
* what the DSL's own version digest (``CuTeDSL.get_version()``) covers -- every ``.py``
  file of the DSL's packages, keyed by module name, and the loaded compiler library
  ``_cutlass_ir`` -- each by the SHA-256 of its contents (a fresh cache dir reads every
  source and the 190 MB library once: ~0.2 s). Remembered in cuforge's toolchain memo
  under a stat signature (name, size, mtime, ctime, inode) of the ``.py`` and library
  files of every package the digest covers (``cutlass`` and ``iket``; one ``scandir`` per
  directory): an edited file changes the signature (ctime: even a same-size edit with its
  mtime put back) and the digest is computed again;
* the SHA-256 of the runtime library the exported objects link against
  (``libcute_dsl_runtime.so`` of the loaded CUDA flavor), remembered in cuforge's
  toolchain memo by the file's stat.

Two virtual environments with the same wheels give the same digest; a different build of
a library gives a different one. The digest is computed once per process (:func:`reset`
forgets it, for tests).

**A fresh process does not compute it**: the whole digest is remembered in cuforge's
toolchain memo under an install signature (:func:`_install_signature`: the stat -- size,
mtime, inode -- of each ``nvidia-cutlass-dsl*`` wheel's ``RECORD`` with the wheel's name
and version, and of the loaded ``_cutlass_ir`` and runtime libraries), as ccache's direct
mode trusts a stat: a few ``stat`` calls and the memo file, read once per process.
pip rewrites a wheel's ``RECORD`` on every install, upgrade or reinstall, so any change
made through an installer computes the digest again. An edit made *in place* to an
installed DSL ``.py`` file (not through an installer) is not seen by this signature (the
wheel's ``RECORD`` already vouches for it by SHA-256): ``verify="trace"`` catches a stale
entry from such an edit (the traced module differs), and ``cuforge cache clear`` or a
reinstall starts over. A wheel with no ``RECORD`` (a development install) falls back to
the tree signature, which sees every edit.

Layer 5; imports the DSL lazily.
"""

from __future__ import annotations

import hashlib
import os
import sys

from cuforge.keys.key import file_digest_of
from cuforge.toolchain import installed as _installed
from cuforge.toolchain import memo as _memo

__all__ = ["dsl_version", "dsl_distributions", "reset"]

_cached: str | None = None
_infos: list[tuple[str, str]] | None = None


def reset() -> None:
    """Forget the digest computed in this process (tests that change the install)."""
    global _cached, _infos
    _cached = None
    _infos = None


def dsl_distributions() -> list[str]:
    """``["nvidia-cutlass-dsl==4.8.1", ...]``: every installed ``nvidia-cutlass-dsl*``
    distribution beside the imported package, sorted. Empty when none is found."""
    return sorted(item for item, _info in _dsl_dist_infos())


def _dsl_dist_infos() -> list[tuple[str, str]]:
    """``("nvidia-cutlass-dsl==4.8.1", its *.dist-info directory)`` of every installed
    ``nvidia-cutlass-dsl*`` distribution beside the imported package, in directory order
    (listed once per process, as the digest is computed once)."""
    global _infos
    if _infos is None:
        _infos = _list_dist_infos()
    return _infos


def _list_dist_infos() -> list[tuple[str, str]]:
    import nvidia_cutlass_dsl  # a namespace package: no __file__

    roots = list(getattr(nvidia_cutlass_dsl, "__path__", ()))
    if not roots:
        return []
    site = os.path.dirname(os.path.abspath(roots[0]))
    found = []
    for entry in _installed.dist_infos(site, cached=False):
        name, version = _installed.split_info_name(entry) or ("", "")
        if name.lower().startswith("nvidia_cutlass_dsl") and version:
            found.append(
                (f"{name.replace('_', '-').lower()}=={version}", os.path.join(site, entry))
            )
    return found


def _runtime_library_digests(dsl) -> list[str]:
    """``basename:sha256`` of each runtime library the DSL links exported objects against."""

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


def _packages(dsl_path: str) -> list[tuple[str, str]]:
    """``(name, path)`` of the regular packages (a directory with ``__init__.py``) directly
    under ``dsl_path``, sorted: the packages whose files the DSL's version digest covers."""
    try:
        names = sorted(os.listdir(dsl_path))
    except OSError:
        return []
    return [
        (name, os.path.join(dsl_path, name))
        for name in names
        if os.path.isfile(os.path.join(dsl_path, name, "__init__.py"))
    ]


def _tree_signature(dsl_path: str) -> list[int]:
    """A stat signature (names, sizes, mtimes, ctimes, inodes) of the ``.py`` and shared-library
    files of every regular package under ``dsl_path`` (:func:`_packages`, the ones the
    digest covers): it changes whenever one of them is edited, added or removed. One
    ``scandir`` per directory, one ``stat`` per file (a fresh process's hit pays it)."""

    lines: list[str] = []
    for name, top in _packages(dsl_path):
        stack = [(name + "/", top)]
        while stack:
            rel, directory = stack.pop()
            try:
                with os.scandir(directory) as it:
                    entries = sorted(it, key=lambda e: e.name)
            except OSError:
                continue
            subs = []
            for entry in entries:
                fname = entry.name
                try:
                    is_dir = entry.is_dir()
                except OSError:
                    continue
                if is_dir:
                    if fname != "__pycache__" and not entry.is_symlink():
                        subs.append((f"{rel}{fname}/", entry.path))
                    continue
                if not (fname.endswith(".py") or ".so" in fname):
                    continue
                try:
                    st = entry.stat()
                except OSError:
                    continue
                lines.append(
                    f"{rel}{fname}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}\0{st.st_ino}\n"
                )
            stack.extend(reversed(subs))  # depth first, in name order
    h = hashlib.sha256("".join(lines).encode("utf-8", "surrogateescape"))
    return [int.from_bytes(h.digest()[:8], "big")]


def _dsl_files(dsl_path: str, loaded_ir: str) -> list[tuple[str, str]]:
    """``(name, path)`` of what ``CuTeDSL.get_version()`` digests: every ``.py`` file of the
    regular packages under ``dsl_path`` (named by module), and the loaded ``_cutlass_ir``
    library (named by its file name). The walk is the DSL's own (regular packages only)."""
    files = []
    if loaded_ir:
        files.append((os.path.basename(loaded_ir), loaded_ir))
    for _name, sub in _packages(dsl_path):
        for root, dirs, names in os.walk(sub):
            dirs[:] = sorted(
                d
                for d in dirs
                if d != "__pycache__" and os.path.isfile(os.path.join(root, d, "__init__.py"))
            )
            for name in sorted(names):
                if not name.endswith(".py"):
                    continue
                path = os.path.join(root, name)
                module = os.path.relpath(path, dsl_path)[: -len(".py")].replace(os.sep, ".")
                files.append((module.removesuffix(".__init__"), path))
    return files


def _dsl_files_digest(dsl_path: str, loaded_ir: str) -> str:
    """SHA-256 over :func:`_dsl_files`, each file by the SHA-256 of its contents (the
    value its wheel's RECORD gives when the file is the one installed)."""

    h = hashlib.sha256(b"cuforge-cute-dsl-files 1\n")
    files = _dsl_files(dsl_path, loaded_ir)
    digests = _installed.file_sha256s([path for _name, path in files], persist=False)
    for name, path in files:
        h.update(f"{name}\0{digests.get(path) or 'missing'}\n".encode())
    return h.hexdigest()


def _dsl_get_version(dsl) -> str:
    """The digest of the DSL's sources and compiler library (:func:`_dsl_files_digest`),
    remembered in cuforge's toolchain memo under a stat signature of the DSL's files."""

    import cutlass

    root = os.path.dirname(os.path.dirname(os.path.abspath(cutlass.__file__)))
    loaded = sys.modules.get("cutlass._mlir._mlir_libs._cutlass_ir")
    loaded_file = getattr(loaded, "__file__", "") or ""
    flavor = os.path.basename(loaded_file)
    where = f"{root}|{flavor}"
    sig = _tree_signature(root)
    with _memo.lock:
        memo = _memo.load()
        data = _memo.probed(memo, "cute-dsl-files", where, sig)
        if data is not None and isinstance(data.get("digest"), str):
            return data["digest"]
        digest = _dsl_files_digest(root, loaded_file)
        _memo.remember(memo, "cute-dsl-files", where, sig, {"digest": digest})
        _memo.save(memo)
    return digest


def _stat_line(label: str, path: str) -> str | None:
    """``label size mtime_ns inode`` of the file at ``path`` (None: it cannot be stat'ed)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return f"{label}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}\n"


def _install_signature(
    items: list[str], infos: list[tuple[str, str]], loaded_ir: str, libs: list[str]
) -> list[int] | None:
    """A stat signature of what the whole digest covers, as installed: the ``RECORD`` of
    every ``nvidia-cutlass-dsl*`` wheel (its name, version, size, mtime, inode: pip
    rewrites it on every install, upgrade or reinstall, and it fixes every file the wheel
    installed by SHA-256), the loaded ``_cutlass_ir`` library and the runtime libraries
    (file names, sizes, mtimes, inodes). No path: a copy of the same install signs alike
    only where the inodes agree. None when a wheel has no ``RECORD`` (then the digest is
    computed, each file checked by stat as before)."""
    if not infos:
        return None
    lines = [f"dist {item}\n" for item in items]
    for item, info in sorted(infos):
        line = _stat_line(item, os.path.join(info, "RECORD"))
        if line is None:
            return None
        lines.append(line)
    for path in ([loaded_ir] if loaded_ir else []) + sorted(libs):
        lines.append(_stat_line(os.path.basename(path), path) or f"{path}\0missing\n")
    h = hashlib.sha256("".join(lines).encode("utf-8", "surrogateescape"))
    return [int.from_bytes(h.digest()[:8], "big"), len(lines)]


_file_memo_on = _installed.file_memo_on


def dsl_version() -> str:
    """The DSL version digest (see the module doc). Raises ``ImportError`` when the DSL is
    not installed.

    A fresh process reads it from cuforge's toolchain memo, keyed by
    :func:`_install_signature` (a few ``stat`` calls: the wheels' ``RECORD`` files and the
    loaded libraries) instead of walking the DSL's tree; it is computed (and remembered)
    when the signature changed or a wheel has no ``RECORD``."""
    global _cached
    if _cached is not None:
        return _cached

    import cutlass
    from cutlass.cutlass_dsl import CuTeDSL

    dsl = CuTeDSL._get_dsl()
    infos = _dsl_dist_infos()
    root = os.path.dirname(os.path.dirname(os.path.abspath(cutlass.__file__)))
    loaded = sys.modules.get("cutlass._mlir._mlir_libs._cutlass_ir")
    loaded_ir = getattr(loaded, "__file__", "") or ""
    libs = [p for p in dsl.get_shared_libs() if isinstance(p, str)]
    items = dsl_distributions()
    sig = _install_signature(items, infos, loaded_ir, libs) if _file_memo_on() else None
    where = f"{root}|{os.path.basename(loaded_ir)}"
    if sig is not None:
        with _memo.lock:
            data = _memo.probed(_memo.load(), "cute-dsl-version", where, sig)
        digest = data.get("digest") if data is not None else None
        if isinstance(digest, str) and len(digest) == 64:
            _cached = digest
            return digest

    h = hashlib.sha256(b"cuforge-cute-dsl-version 1\n")
    for item in items:
        h.update(f"dist {item}\n".encode())
    h.update(b"dsl-files " + _dsl_get_version(dsl).encode() + b"\n")
    for item in _runtime_library_digests(dsl):
        h.update(f"lib {item}\n".encode())
    digest = h.hexdigest()
    if sig is not None:
        with _memo.lock:
            memo = _memo.load()
            _memo.remember(memo, "cute-dsl-version", where, sig, {"digest": digest})
            _memo.save(memo)
    _cached = digest
    return digest
