"""Installed Python distributions: the one place cuforge finds them, reads their ``RECORD``
and checks an installed file against it -- without :mod:`importlib.metadata` on the common
path (it imports ~15 ms of modules and parses every distribution's metadata).

A wheel's ``<name>.dist-info/RECORD`` lists every file it installed as
``path,sha256=<urlsafe base64, no padding>,size`` (paths relative to the site-packages
directory). A file counts as the one its wheel installed only when its **contents** hash to
that digest: the size alone is not enough (``SCALE = 1`` edited to ``SCALE = 3`` keeps it,
and ``touch -r`` / ``cp -p`` put the old mtime back). Hashing is paid once per file
version: :func:`file_sha256s` remembers each digest in cuforge's toolchain memo under the
file's :func:`stat_key` (size, mtime_ns, ctime_ns, inode -- the kernel sets ctime on every
write, rename or utime and nothing can set it back), so a fresh process with a warm memo
stats files and hashes nothing.

The API:

* finding distributions -- :func:`dist_infos` (the ``*.dist-info`` names in a directory),
  :func:`split_info_name`, :func:`installed_versions` / :func:`installed_version` /
  :func:`info_path` (what is on ``sys.path``, first found wins), :func:`distributions_of`
  (which distributions install a module), :func:`editable`, :func:`site_dir`;
* reading ``RECORD`` -- :func:`record` (its rows), :func:`recorded_digest` (one row's hex
  SHA-256 and size);
* checking a file -- :func:`stat_key`, :func:`file_sha256` / :func:`file_sha256s` (a
  file's digest, memoized), :func:`matches_record` (a file against its RECORD row),
  :func:`recorded_sha256` (the RECORD digest of a file found by walking up to its
  site-packages, when the contents match), :func:`installed_sha256`.

Layer 1: the standard library, :mod:`cuforge.base` and :mod:`cuforge.toolchain.memo`.
"""

from __future__ import annotations

import os
import sys
import time

from cuforge.base import _fs
from cuforge.base.config import settings
from cuforge.base.paths import SITE_DIR_NAMES
from cuforge.toolchain import memo as _memo

TYPE_CHECKING = False
if TYPE_CHECKING:
    import types
    from collections.abc import Iterable

__all__ = [
    "dist_infos",
    "split_info_name",
    "installed_versions",
    "installed_version",
    "info_path",
    "info_dirs",
    "distributions_of",
    "editable",
    "site_dir",
    "normalize",
    "record",
    "recorded_digest",
    "stat_key",
    "file_sha256",
    "file_sha256s",
    "matches_record",
    "recorded_sha256",
    "installed_sha256",
    "hash_file",
    "file_memo_on",
    "reset",
]

#: where installers put distributions (a directory of this name is never a source
#: checkout): ``cuforge.base.paths.SITE_DIR_NAMES``, imported above

# dist-info dir -> {relative path: (sha256 field, size field)}
_records: dict[str, dict[str, tuple[str, str]]] = {}
# directory -> its *.dist-info entries (sorted; [] when none)
_dist_infos: dict[str, list[str]] = {}
# a file's directory -> the *.dist-info whose RECORD listed the last file looked up there:
# tried first for its neighbours (the DSL's ~230 files: one RECORD probe each, not ~100)
_owners: dict[str, str] = {}
# path -> (stat key, hex sha256): files hashed (or read from the memo) in this process
_hashed: dict[str, tuple[list[int], str]] = {}

#: how many directories above a file are searched for the site-packages holding it
_MAX_UP = 8
#: a digest is remembered only for a file last changed longer ago than this: the kernel's
#: timestamps are coarse (a jiffy), so a write in the same tick as the hash could leave the
#: stat key as it was (git's "racily clean" rule)
_SETTLED_NS = 2_000_000_000
_MEMO_KIND = "file-sha256"


def reset() -> None:
    """Forget what was read in this process (tests that install or change files)."""
    global _versions, _dists
    _records.clear()
    _dist_infos.clear()
    _owners.clear()
    _hashed.clear()
    _versions = None
    _dists = None
    _info_dirs.clear()
    _info_paths.clear()
    _editable_cache.clear()


def file_memo_on() -> bool:
    """Whether answers may be kept in the toolchain memo (file caching is on)."""
    cfg = settings()
    return not (cfg.disable_cache or cfg.disable_file_cache)


# ------------------------------------------------------------------ hashing a file, once
def hash_file(path: str) -> str:
    """The hex SHA-256 of ``path``'s contents (symlinks followed; anything but a regular
    file refused without blocking; raises OSError)."""
    import hashlib  # hashlib, base64: imported when a file is first checked, not at import

    fd = _fs.open_regular(path, follow=True)
    h = hashlib.sha256()
    try:
        while chunk := os.read(fd, 1 << 20):
            h.update(chunk)
    finally:
        os.close(fd)
    return h.hexdigest()


def stat_key(path: str) -> list[int] | None:
    """``[size, mtime_ns, ctime_ns, inode]`` of ``path`` (symlinks followed), the key a
    file's digest is remembered under; None when it cannot be stat'ed. ``touch -r`` and
    ``cp -p`` restore mtime, never ctime."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def file_sha256(path: str) -> str:
    """``path``'s hex SHA-256, memoized (:func:`file_sha256s`); raises OSError when it
    cannot be read."""
    digest = file_sha256s([path]).get(path)
    if digest is None:
        return hash_file(path)  # raises the OSError that says why
    return digest


def file_sha256s(paths: Iterable[str], *, persist: bool = True) -> dict[str, str | None]:
    """``{path: hex SHA-256 or None (unreadable)}``, each file hashed at most once per
    version of it: known in this process, or in the toolchain memo under its
    :func:`stat_key` (one memo read and at most one write for all of ``paths``;
    ``persist=False``: this process only). Measured: a warm call costs one ``stat`` and a
    dict lookup a file (Triton 3.9's 29 covered files: 0.3 ms), against hashing them (~1 s
    on a 2-core machine, mostly its 500 MB ``libtriton.so``)."""
    out: dict[str, str | None] = {}
    todo: list[tuple[str, list[int]]] = []
    for path in paths:
        sig = stat_key(path)
        if sig is None:
            out[path] = None
            continue
        known = _hashed.get(path)
        if known is not None and known[0] == sig:
            out[path] = known[1]
        else:
            todo.append((path, sig))
    if not todo:
        return out
    disk = persist and file_memo_on()
    with _memo.lock:
        memo = _memo.load() if disk else {}
        changed = False
        now = time.time_ns()
        for path, sig in todo:
            data = _memo.probed(memo, _MEMO_KIND, path, sig) if disk else None
            digest = data.get("sha256") if data is not None else None
            if isinstance(digest, str) and len(digest) == 64:
                _hashed[path] = (sig, digest)
                out[path] = digest
                continue
            try:
                digest = hash_file(path)
            except OSError:
                out[path] = None
                continue
            out[path] = digest
            settled = now - max(sig[1], sig[2]) > _SETTLED_NS
            if settled and stat_key(path) == sig:  # not changed while (or just before) read
                _hashed[path] = (sig, digest)
                if disk:
                    _memo.remember(memo, _MEMO_KIND, path, sig, {"sha256": digest})
                    changed = True
        if changed:
            _memo.save(memo)
    return out


# ------------------------------------------------------------------------- RECORD rows
def dist_infos(directory: str, *, cached: bool = True) -> list[str]:
    """The ``*.dist-info`` entry names in ``directory``, sorted; ``[]`` when none or
    unreadable. Listed once per process (``cached=False``: listed again now)."""
    found = _dist_infos.get(directory) if cached else None
    if found is None:
        try:
            names = os.listdir(directory)
        except OSError:
            names = []
        found = sorted(n for n in names if n.endswith(".dist-info"))
        _dist_infos[directory] = found
    return found


def split_info_name(name: str) -> tuple[str, str] | None:
    """``("nvidia_cuda_nvrtc", "13.0.88")`` of ``nvidia_cuda_nvrtc-13.0.88.dist-info`` (an
    ``.egg-info`` too; the version ``""`` when the name has none); None for another name."""
    stem, dot, suffix = name.rpartition(".")
    if not dot or suffix not in ("dist-info", "egg-info"):
        return None
    dist, _, version = stem.partition("-")
    return (dist, version) if dist else None


def record(dist_info: str) -> dict[str, tuple[str, str]]:
    """``dist_info``'s ``RECORD`` as ``{relative path: (urlsafe sha256, size)}``, parsed once
    per process; a line with no ``sha256=`` hash (an editable install's, the RECORD's own)
    maps to ``("", size)``; an unreadable RECORD gives ``{}``."""
    table = _records.get(dist_info)
    if table is not None:
        return table
    table = {}
    try:
        with open(os.path.join(dist_info, "RECORD"), encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        text = ""
    for line in text.splitlines():
        path, sep, rest = line.rpartition(",")  # rest: the size
        path, sep2, digest = path.rpartition(",")
        if not (sep and sep2):
            continue
        if path.startswith('"') and path.endswith('"'):  # csv quoting (a comma in the path)
            path = path[1:-1].replace('""', '"')
        hashed = digest.startswith("sha256=")
        table[path] = (digest[len("sha256=") :] if hashed else "", rest)
    _records[dist_info] = table
    return table


def _hex(urlsafe: str) -> str | None:
    import base64
    import binascii

    try:
        raw = base64.urlsafe_b64decode(urlsafe + "=" * (-len(urlsafe) % 4))
    except (binascii.Error, ValueError):
        return None
    return raw.hex() if len(raw) == 32 else None


def recorded_digest(dist_info: str, rel: str) -> tuple[str, int] | None:
    """(hex SHA-256, size) that ``dist_info``'s RECORD gives for ``rel`` (a path relative
    to the site-packages dir, ``/``-separated); None when it does not list it with both."""
    line = record(dist_info).get(rel)
    if line is None or not line[0] or not line[1].isdigit():
        return None
    digest = _hex(line[0])
    return None if digest is None else (digest, int(line[1]))


def matches_record(path: str, dist_info: str, rel: str, *, persist: bool = True) -> bool:
    """Whether the file at ``path`` is the one ``dist_info``'s RECORD lists as ``rel``: the
    size first (a stat), then the contents' SHA-256 (:func:`file_sha256s`, memoized)."""
    row = recorded_digest(dist_info, rel)
    if row is None:
        return False
    sig = stat_key(path)
    if sig is None or sig[0] != row[1]:
        return False
    return file_sha256s([path], persist=persist).get(path) == row[0]


def _likeness(dist_info: str, rel: str) -> int:
    """How many words of a distribution's name the path holds (``nvidia_cuda_nvrtc``:
    ``nvidia`` and ``nvrtc`` in ``nvidia/cu13/lib/libnvrtc.so.13``): the likely owner's
    RECORD is read first."""
    name = dist_info.lower().partition("-")[0].replace(".", "_")
    low = rel.lower()
    return sum(1 for word in name.split("_") if len(word) > 2 and word in low)


def _owner(real: str) -> tuple[str, str] | None:
    """(the *.dist-info whose RECORD lists ``real`` with a hash, its relative path), found
    in the nearest directory above it that holds distributions."""
    home = directory = os.path.dirname(real)
    for _ in range(_MAX_UP):
        infos = dist_infos(directory)
        if infos:
            rel = os.path.relpath(real, directory).replace(os.sep, "/")
            hint = _owners.get(home)
            if hint is not None and os.path.dirname(hint) == directory:
                line = record(hint).get(rel)
                if line is not None and line[0]:
                    return hint, rel
            for name in sorted(infos, key=lambda n: -_likeness(n, rel)):
                info = os.path.join(directory, name)
                line = record(info).get(rel)
                if line is not None and line[0]:  # an unhashed line vouches for nothing
                    _owners[home] = info
                    return info, rel
        parent = os.path.dirname(directory)
        if parent == directory:
            break
        directory = parent
    return None


def recorded_sha256(path: str) -> str | None:
    """The hex SHA-256 a wheel's ``RECORD`` gives for ``path`` (symlinks resolved), when
    the file's contents still hash to it; None when no RECORD lists it, or the file was
    changed since it was installed, or is missing."""
    real = os.path.realpath(path)
    found = _owner(real)
    if found is None or not matches_record(real, *found):
        return None
    row = recorded_digest(*found)
    return row[0] if row is not None else None


def installed_sha256(path: str) -> str:
    """``path``'s hex SHA-256 (symlinks resolved), memoized by its stat key: the digest its
    wheel's RECORD gives when the contents match, which is the same value (raises OSError
    when it cannot be read)."""
    return file_sha256(os.path.realpath(path))


# --------------------------------------------------------------- distributions on sys.path
_versions: dict[str, str] | None = None
_info_dirs: list[str] = []  # the sys.path entries that hold *.dist-info / *.egg-info
# normalized distribution name -> its *.dist-info / *.egg-info directory (the first found)
_info_paths: dict[str, str] = {}
_dists: dict[str, list[str]] | None = None
_editable_cache: dict[str, bool] = {}


def normalize(dist: str) -> str:
    """A distribution's name as its dist-info directory spells it (``cuda_cccl``)."""
    return dist.lower().replace("-", "_").replace(".", "_")


def installed_versions() -> dict[str, str]:
    """Normalized distribution name (``cuda_cccl``) -> version, read once per process from
    the ``*.dist-info`` / ``*.egg-info`` directory names on ``sys.path`` (the first found
    wins, as for :mod:`importlib.metadata`): one directory listing per path entry, far
    cheaper than a metadata query per distribution."""
    global _versions
    if _versions is not None:
        return _versions
    found: dict[str, str] = {}
    stdlib = os.path.dirname(os.__file__)  # holds no distributions: skip its ~200 names
    for entry in sys.path:
        if entry == stdlib:
            continue
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue  # a zip, a missing dir: nothing installed there
        holds = False
        for name in names:
            if not name.endswith("-info"):
                continue
            split = split_info_name(name)
            if split is None:
                continue
            dist, version = split
            _info_paths.setdefault(normalize(dist), os.path.join(entry or ".", name))
            if version:
                holds = True
                found.setdefault(normalize(dist), version)
        if holds and entry not in _info_dirs:
            _info_dirs.append(entry)
    _versions = found
    return found


def info_path(dist: str) -> str | None:
    """The ``*.dist-info`` / ``*.egg-info`` directory of ``dist`` first found on
    ``sys.path``, or None."""
    installed_versions()
    return _info_paths.get(normalize(dist))


def info_dirs() -> list[str]:
    """The ``sys.path`` entries that hold versioned distributions (installing or removing
    one changes the directory's stat)."""
    installed_versions()
    return list(_info_dirs)


def installed_version(dist: str) -> str | None:
    """The installed version of distribution ``dist`` (any spelling), or None."""
    version = installed_versions().get(normalize(dist))
    if version is None:
        from importlib import metadata  # only for a name the listing did not find

        try:
            version = metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None
    return version


def editable(dist: str) -> bool:
    """Whether ``dist`` is an editable install (its sources can change under one version)."""
    found = _editable_cache.get(dist)
    if found is None:
        from importlib import metadata

        try:
            text = metadata.distribution(dist).read_text("direct_url.json") or ""
        except (metadata.PackageNotFoundError, OSError):
            text = ""
        found = '"editable": true' in text.replace("'", '"').lower()
        _editable_cache[dist] = found
    return found


def site_dir(directory: str) -> bool:
    """Whether ``directory`` is where installers put distributions (not a source checkout)."""
    if os.path.basename(directory) in SITE_DIR_NAMES:
        return True
    site = sys.modules.get("site")
    dirs: list[str] = []
    if site is not None:
        try:
            dirs = [*site.getsitepackages(), site.getusersitepackages()]
        except AttributeError:  # a virtualenv's old site.py
            dirs = []
    real = os.path.realpath(directory)
    return any(os.path.realpath(d) == real for d in dirs)


def _distributions() -> dict[str, list[str]]:
    """Top-level import name -> the distributions that install it.

    :func:`importlib.metadata.packages_distributions` reads every installed distribution's
    file list (~200 ms in a large environment: most of a fresh process's cache hit), so its
    answer is kept in cuforge's toolchain memo, keyed by the stat of every ``sys.path``
    directory (installing, upgrading or removing a distribution changes its directory). The
    memo only names distributions, whose versions are then read from their metadata; it is
    not used when file caching is off."""
    global _dists
    if _dists is not None:
        return _dists

    if not file_memo_on():
        _dists = _scan_distributions()
        return _dists

    # only the path entries that hold distributions: a script's own directory (sys.path[0])
    # or a source checkout on PYTHONPATH changes whenever a file is added there
    dirs = info_dirs()
    sig: list[int] = []
    for d in dirs:
        sig.extend(_memo.file_stat_key(d) or [-1, -1])
    where = os.pathsep.join(dirs)
    with _memo.lock:
        memo = _memo.load()
        data = _memo.probed(memo, "python-distributions", where, sig)
        found = data.get("map") if data else None
        if isinstance(found, dict) and all(
            isinstance(k, str) and isinstance(v, list) and all(isinstance(x, str) for x in v)
            for k, v in found.items()
        ):
            _dists = {k: list(v) for k, v in found.items()}
            return _dists
        _dists = _scan_distributions()
        _memo.remember(memo, "python-distributions", where, sig, {"map": _dists})
        _memo.save(memo)
    return _dists


def _scan_distributions() -> dict[str, list[str]]:
    """:func:`importlib.metadata.packages_distributions`, sorted and deduplicated. Its
    answer, read faster: a ``*.dist-info`` directory's name and top-level packages come from
    its ``METADATA`` header, ``top_level.txt`` or ``RECORD`` text as the standard library
    reads them (no ``email`` parser, no ``pathlib`` object per installed file: ~10x faster
    on a new cache dir); any other distribution goes through the standard library."""
    from importlib import metadata

    found: dict[str, list[str]] = {}
    for dist in metadata.distributions():
        info = getattr(dist, "_path", None)
        fast = _fast_top_level(str(info)) if info is not None else None
        if fast is None:
            name = dist.metadata["Name"]
            tops = metadata._top_level_declared(dist) or metadata._top_level_inferred(dist)  # type: ignore[attr-defined]
        else:
            name, tops = fast
        for top in tops:
            found.setdefault(top, []).append(name)
    return {k: sorted(set(v)) for k, v in found.items()}


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        return None


def _fast_top_level(info: str) -> tuple[str, list[str] | set[str]] | None:
    """``(name, top-level names)`` of the ``*.dist-info`` directory ``info`` as
    :func:`importlib.metadata.packages_distributions` finds them, or None when it is not a
    plain one (then the standard library reads it)."""
    if not info.endswith(".dist-info"):
        return None
    try:
        head = _read_text(os.path.join(info, "METADATA"))
        declared = _read_text(os.path.join(info, "top_level.txt"))
        record = None if declared else _read_text(os.path.join(info, "RECORD"))
    except (OSError, UnicodeDecodeError):
        return None
    if head is None:
        return None
    name = None
    for line in head.split("\n"):
        if not line.strip():
            break
        key, sep, value = line.partition(":")
        if sep and key.lower() == "name":
            name = value.strip()
            break
    if not name:
        return None
    if declared:
        return name, declared.split()
    if record is None:
        return name, []
    tops: set[str] = set()
    every = sys.version_info >= (3, 12)  # 3.11 infers from ``.py`` files only
    for row in record.splitlines():
        if not every and ".py," not in row:
            continue
        path = row.rsplit(",", 2)[0] if row.count(",") >= 2 else None
        if path is None or '"' in path:
            return None  # csv quoting: the standard library's reader
        parts = [p for p in path.split("/") if p and p != "."]
        if not parts:
            continue
        last = parts[-1]
        if every:
            import inspect

            top = parts[0] if len(parts) > 1 else (inspect.getmodulename(last) or last)
            if "." not in top:
                tops.add(top)
        elif last.endswith(".py") and last != ".py":
            tops.add(parts[0] if len(parts) > 1 else last[: -len(".py")])
    return name, tops


def distributions_of(module: types.ModuleType) -> list[str]:
    """The distributions that install ``module``'s top-level package, else those that
    install the directory its file lies in (a wheel that puts its packages in a
    subdirectory added to ``sys.path`` by a ``.pth`` file, as nvidia-cutlass-dsl does with
    ``cutlass``); ``[]`` for a module no distribution installs."""
    top = module.__name__.partition(".")[0]
    dists = _distributions()
    found = dists.get(top)
    if found:
        return list(found)
    file = getattr(module, "__file__", None)
    if not isinstance(file, str):
        return []
    roots = {os.path.abspath(d) for d in sys.path if d}
    here = os.path.dirname(os.path.abspath(file))
    while True:
        parent = os.path.dirname(here)
        if parent == here:
            return []
        if parent in roots:
            found = dists.get(os.path.basename(here))
            if found:
                dists[top] = list(found)
                return list(found)
        here = parent
