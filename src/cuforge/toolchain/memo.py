"""The toolchain's on-disk memo, ``<cache_dir>/toolchain.json``.

What was learned about the toolchain at some cost (a version, a SHA-256, ``nvcc --version``
text, where NVRTC was found, the visible GPUs) is kept here so that a fresh process need
not learn it again. Guarantees:

* **A memo caches probe results; it never decides which file is loaded or run.** Every
  entry is keyed by the stat of the file it describes (:func:`file_stat_key`); the paths
  cuforge loads (``ctypes.CDLL``) or executes are derived again in the process that does
  so (see :mod:`cuforge.toolchain.locate`). The one answer a compile reads files by, the
  header dirs cuda-pathfinder found, is checked against pathfinder's own before NVRTC
  compiles with it (:func:`cuforge.toolchain.locate.recheck_include_dirs`); a disk hit
  keys with it, importing nothing.
* **It is read only from a trusted cache dir** (:func:`cuforge.base._fs.trust_problem`: owned
  by the current user, not writable by group or others), and written only there.
* It is read as a regular file only (no FIFO, no symlink; at most 16 MiB) and replaced
  atomically; a missing, unreadable or corrupt memo is the same as an empty one, and an
  unwritable cache dir only means probing again later.

The bottom layer: imports config and :mod:`cuforge.base._fs` only, json lazily.
"""

from __future__ import annotations

import _thread
import os

from cuforge.base import _fs
from cuforge.base._fastjson import loads
from cuforge.base.layout import CacheLayout, machine_dir

__all__ = [
    "lock",
    "load",
    "save",
    "probed",
    "remember",
    "file_stat_key",
    "write_json_atomic",
    "memo_path",
    "SCHEMA",
]

#: Bump when the memo's layout or the meaning of a probed field changes.
SCHEMA = 1
#: Far above any real memo (a few KiB); a bigger file is treated as corrupt.
_MAX_BYTES = 16 << 20

#: Held around every read-modify-write of the memo, and around the probes that fill it.
lock = _thread.RLock()

# (memo path, its (size, mtime_ns, inode), the parsed memo): read the file once per process
_cache: tuple[str, tuple[int, int, int], dict] | None = None


def memo_path() -> str:
    """``<cache_dir>/toolchain.json`` of the cache doing the work
    (:func:`cuforge.base.layout.machine_dir`)."""
    return CacheLayout.of(machine_dir()).toolchain_memo


def _trusted(path: str) -> bool:
    """Whether the memo's directory may be read from and written to (see module doc): the
    cache dir's one trust rule (:meth:`cuforge.base.layout.CacheLayout.trust_problem`)."""
    from cuforge.base.layout import CacheLayout

    return CacheLayout.of(os.path.dirname(path)).trust_problem(path) is None


def load() -> dict:
    """The parsed memo (callers may change it, then :func:`save` it). An empty memo when
    the file is missing, corrupt, not a regular file, or in an untrusted cache dir."""
    global _cache
    path = memo_path()
    if not _trusted(path):
        return {"schema": SCHEMA}
    try:
        st = os.stat(path)
    except OSError:
        return {"schema": SCHEMA}
    sig = (st.st_size, st.st_mtime_ns, st.st_ino)
    cached = _cache
    if cached is not None and cached[0] == path and cached[1] == sig:
        return cached[2]

    try:
        data = loads(_fs.read_bytes(path, max_bytes=_MAX_BYTES))
    except (OSError, ValueError):
        return {"schema": SCHEMA}
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        return {"schema": SCHEMA}
    _cache = (path, sig, data)
    return data


def save(memo: dict) -> None:
    """Atomically replace the memo; an unwritable or untrusted cache dir just means
    probing again later."""
    global _cache
    path = memo_path()
    if not _trusted(path) or not write_json_atomic(path, memo):
        return
    try:
        st = os.stat(path)
    except OSError:
        return
    _cache = (path, (st.st_size, st.st_mtime_ns, st.st_ino), memo)


def write_json_atomic(path: str, data: dict) -> bool:
    """Replace ``path`` with ``data`` as JSON (:func:`cuforge.base._fs.atomic_write`: temp file
    + ``os.replace``, a symlink at ``path`` replaced, never followed). False when it could
    not be written: callers treat these memo files as optional."""
    import json  # json: ~10 ms to import, only when the memo is written

    try:
        _fs.atomic_write(path, json.dumps(data, indent=1, sort_keys=True))
    except OSError:
        return False
    return True


def file_stat_key(path: str) -> list[int] | None:
    """[size, mtime_ns] of a file, the key memo entries are stored under (None: missing)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns]


def probed(memo: dict, kind: str, path: str, sig: list[int] | None) -> dict | None:
    """The data remembered for (kind, path) when it was probed at stat ``sig``; None when
    it must be probed (again). Remember a new result with :func:`remember`."""
    entry = memo.get("probes", {}).get(f"{kind}|{path}")
    if isinstance(entry, dict) and entry.get("sig") == sig and isinstance(entry.get("data"), dict):
        return entry["data"]
    return None


def remember(memo: dict, kind: str, path: str, sig: list[int] | None, data: dict) -> None:
    """Record what probing ``path`` (of stat ``sig``) found; :func:`save` writes it."""
    memo.setdefault("probes", {})[f"{kind}|{path}"] = {"sig": sig, "data": data}
