"""The disk tier's entry file: the bytes of one entry, encoded and checked.

An entry file (format :data:`DISK_FORMAT_VERSION`), all integers little-endian::

    b"CUFG" u32(version) u32(len(meta)) u64(len(payload)) meta payload digest

``meta`` is UTF-8 JSON ``{"key", "kind", "meta", "created"}`` (no pickle anywhere) and
``digest`` is the 32-byte BLAKE2b of everything before it. :func:`decode_entry` checks the
magic, the version, the lengths against the file size, the digest and the metadata's
shape (:mod:`cuforge.store.schema`); any damage raises :class:`CorruptEntry`.

Also here: the file helpers the disk tier's objects share (:func:`remove_path`,
:func:`not_regular`, :func:`read_all`). Imports only builtin modules at load time.
"""

from __future__ import annotations

import os
import stat
from time import time

from cuforge.base import _fs
from cuforge.base._fastjson import dumps as _dumps
from cuforge.base._fastjson import loads as _loads
from cuforge.store.schema import entry_problem

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: see docs/architecture.md, the warm path
if TYPE_CHECKING:  # pragma: no cover
    from typing import Any

    from cuforge.store.base import Entry

__all__ = [
    "DISK_FORMAT_VERSION",
    "CorruptEntry",
    "encode_entry",
    "decode_entry",
    "read_info",
    "read_all",
    "remove_path",
    "not_regular",
]

#: Version of the entry file format and of the layout.
DISK_FORMAT_VERSION = 1
MAGIC = b"CUFG"
HEADER_SIZE = 20  # magic 4 + version 4 + meta length 4 + payload length 8
DIGEST_SIZE = 32
_VERSION_BYTES = DISK_FORMAT_VERSION.to_bytes(4, "little")

try:
    from _blake2 import blake2b as _blake2b
except ImportError:  # pragma: no cover - a Python without the builtin module
    from hashlib import blake2b as _blake2b


class CorruptEntry(Exception):
    """An entry file that failed its checks (the message says which)."""


def dumps(obj: Any) -> bytes:
    """Compact UTF-8 JSON, as entry metadata is written: ``json.dumps(obj, separators=(",",
    ":"), ensure_ascii=False).encode()``, through json's C encoder without importing
    :mod:`json` (and :mod:`re`: ~10 ms in a process that has neither, e.g. one whose
    first lookup is a remote hit copied to the disk)."""
    return _dumps(obj, ensure_ascii=False).encode()


def encode_entry(entry: Entry, created: float | None = None) -> bytes:
    """The bytes of an entry file for ``entry``."""
    meta = dumps(
        {
            "key": entry.key,
            "kind": entry.kind,
            "meta": entry.meta,
            # whole seconds: two processes putting the same key then write files of the
            # same size, so the index's size is right whichever rename lands last
            "created": int(time() if created is None else created),
        }
    )
    payload = entry.payload
    head = _head(len(meta), len(payload))
    h = _blake2b(head, digest_size=DIGEST_SIZE)
    h.update(meta)
    h.update(payload)
    return b"".join((head, meta, payload, h.digest()))  # one copy of the payload


def _head(meta_len: int, payload_len: int) -> bytes:
    return (
        MAGIC + _VERSION_BYTES + meta_len.to_bytes(4, "little") + payload_len.to_bytes(8, "little")
    )


def _parse_header(data: bytes, file_size: int) -> tuple[int, int]:
    if len(data) < HEADER_SIZE or data[:4] != MAGIC:
        raise CorruptEntry("bad magic or truncated header")
    if data[4:8] != _VERSION_BYTES:
        raise CorruptEntry(f"format version {int.from_bytes(data[4:8], 'little')}")
    meta_len = int.from_bytes(data[8:12], "little")
    payload_len = int.from_bytes(data[12:20], "little")
    if HEADER_SIZE + meta_len + payload_len + DIGEST_SIZE != file_size:
        raise CorruptEntry(
            f"size {file_size} != {HEADER_SIZE + meta_len + payload_len + DIGEST_SIZE} (truncated?)"
        )
    return meta_len, payload_len


def _parse_meta(raw: bytes, *, schema: bool = True) -> dict:
    """The header object, checked: a JSON object whose ``kind`` and ``meta`` follow the
    schema (:func:`cuforge.store.schema.entry_problem`; ``schema=False``: only that
    ``meta`` is an object, for index building, which must count every entry's bytes)."""
    try:
        obj = _loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise CorruptEntry(f"bad metadata: {exc}") from None
    if not isinstance(obj, dict):
        raise CorruptEntry("bad metadata: not a JSON object")
    if not schema:
        if not isinstance(obj.get("meta"), dict):
            raise CorruptEntry("bad metadata: meta is not a JSON object")
        return obj
    why = entry_problem(obj.get("kind"), obj.get("meta"))
    if why is not None:
        raise CorruptEntry(f"bad metadata: {why}")
    created = obj.get("created")
    if created is not None and (not isinstance(created, (int, float)) or created != created):
        raise CorruptEntry("bad metadata: created is not a number")
    return obj


def decode_entry(data: bytes) -> tuple[dict, bytes]:
    """(header object ``{"key","kind","meta","created"}``, payload) of a whole entry file.

    Raises :class:`CorruptEntry` on any damage, including metadata of the wrong shape.
    ``data`` may be a memoryview (a remote's buffer): only the payload is copied out."""
    meta_len, payload_len = _parse_header(data, len(data))
    view = memoryview(data)
    if _blake2b(view[:-DIGEST_SIZE], digest_size=DIGEST_SIZE).digest() != data[-DIGEST_SIZE:]:
        raise CorruptEntry("checksum mismatch")
    end = HEADER_SIZE + meta_len
    obj = _parse_meta(bytes(data[HEADER_SIZE:end]))
    return obj, bytes(data[end : end + payload_len])  # (bytes of bytes: no copy)


def read_info(
    path: str, file_size: int, *, strict: bool = False, schema: bool = True
) -> dict | None:
    """The header object of the entry file at ``path`` without its payload; None (or
    CorruptEntry / OSError when ``strict``) if the header is damaged or malformed
    (``schema=False``: its meta's shape is not checked) or the path is not a regular file."""
    try:
        fd = _fs.open_regular(path)
        try:
            head = os.read(fd, HEADER_SIZE)
            meta_len, _ = _parse_header(head, file_size)
            raw = os.read(fd, meta_len)
            if len(raw) != meta_len:
                raise CorruptEntry("truncated metadata")
            return _parse_meta(raw, schema=schema)
        finally:
            os.close(fd)
    except (OSError, CorruptEntry):
        if strict:
            raise
        return None


# ---------------------------------------------------------------------- file helpers
def read_all(fd: int) -> bytes:
    """Everything left to read on ``fd``."""
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def not_regular(exc: OSError) -> bool:
    """The open failed because the path is a symlink, a directory, a FIFO, a device..."""
    import errno  # errno: only on the error path

    return isinstance(exc, _fs.NotRegularFile) or exc.errno in (errno.ELOOP, errno.EISDIR)


def remove_path(path: str) -> bool:
    """Remove whatever is at ``path`` (a file, a link, a FIFO, a directory tree); never
    follows a link. True when something was removed."""
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False
    except OSError:
        try:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                return False
        except OSError:
            return False
        import shutil  # shutil: only to remove a stray directory

        shutil.rmtree(path, ignore_errors=True)
        return not os.path.lexists(path)
