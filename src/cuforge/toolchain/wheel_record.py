"""What pip recorded about an installed file: its SHA-256 and size, from the ``RECORD`` of
the wheel that installed it, so a large library is identified without reading it.

A wheel's ``<name>.dist-info/RECORD`` lists every file it installed as
``path,sha256=<urlsafe base64, no padding>,size`` (paths relative to the site-packages
directory). :func:`installed_sha256` answers a file's hex SHA-256 from that line when the
file's size still matches it, and hashes the file otherwise (not installed by a wheel, or
changed since: a different size). The answer is the same hex digest hashing gives, with
no path in it: the same wheel keys the same in every venv and on every machine.

Cheap: no :mod:`importlib.metadata` (it imports ~15 ms of modules); the owning
``site-packages`` is the nearest directory above the file that holds ``*.dist-info``
directories, and each ``RECORD`` read is parsed once per process.

Layer 1: standard library only.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os

__all__ = ["recorded_sha256", "installed_sha256", "hash_file", "record", "reset"]

# dist-info dir -> {relative path: (sha256 field, size field)}
_records: dict[str, dict[str, tuple[str, str]]] = {}
# directory -> its *.dist-info entries (sorted; [] when none)
_dist_infos: dict[str, list[str]] = {}
# a file's directory -> the *.dist-info whose RECORD listed the last file looked up there:
# tried first for its neighbours (the DSL's ~230 files: one RECORD probe each, not ~100)
_owners: dict[str, str] = {}

#: how many directories above a file are searched for the site-packages holding it
_MAX_UP = 8


def reset() -> None:
    """Forget the RECORDs read in this process (tests that install or change files)."""
    _records.clear()
    _dist_infos.clear()
    _owners.clear()


def hash_file(path: str) -> str:
    """The hex SHA-256 of ``path``'s contents (raises OSError)."""

    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _listing(directory: str) -> list[str]:
    found = _dist_infos.get(directory)
    if found is None:
        try:
            names = os.listdir(directory)
        except OSError:
            names = []
        found = sorted(n for n in names if n.endswith(".dist-info"))
        _dist_infos[directory] = found
    return found


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
    try:
        raw = base64.urlsafe_b64decode(urlsafe + "=" * (-len(urlsafe) % 4))
    except (binascii.Error, ValueError):
        return None
    return raw.hex() if len(raw) == 32 else None


def _likeness(dist_info: str, rel: str) -> int:
    """How many words of a distribution's name the path holds (``nvidia_cuda_nvrtc``:
    ``nvidia`` and ``nvrtc`` in ``nvidia/cu13/lib/libnvrtc.so.13``): the likely owner's
    RECORD is read first."""
    name = dist_info.lower().partition("-")[0].replace(".", "_")
    low = rel.lower()
    return sum(1 for word in name.split("_") if len(word) > 2 and word in low)


def recorded_sha256(path: str) -> str | None:
    """The hex SHA-256 a wheel's ``RECORD`` gives for ``path`` (symlinks resolved), when
    it lists the file with its current size; None when no RECORD lists it, the size
    differs, or the file is missing."""
    real = os.path.realpath(path)
    try:
        size = os.stat(real).st_size
    except OSError:
        return None
    home = directory = os.path.dirname(real)
    for _ in range(_MAX_UP):
        infos = _listing(directory)
        if infos:
            rel = os.path.relpath(real, directory).replace(os.sep, "/")
            hint = _owners.get(home)
            if hint is not None and os.path.dirname(hint) == directory:
                line = record(hint).get(rel)
                if line is not None and line[0]:
                    return _checked(line, size)
            for name in sorted(infos, key=lambda n: -_likeness(n, rel)):
                info = os.path.join(directory, name)
                line = record(info).get(rel)
                if line is not None and line[0]:  # an unhashed line vouches for nothing
                    _owners[home] = info
                    return _checked(line, size)
        parent = os.path.dirname(directory)
        if parent == directory:
            break
        directory = parent
    return None


def _checked(line: tuple[str, str], size: int) -> str | None:
    digest, recorded_size = line
    if recorded_size != str(size):
        return None  # changed since it was installed: hash it
    return _hex(digest)


def installed_sha256(path: str) -> str:
    """``path``'s hex SHA-256: :func:`recorded_sha256` when a RECORD vouches for it, else
    by reading the file (raises OSError when it cannot be read)."""
    return recorded_sha256(path) or hash_file(path)
