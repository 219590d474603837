"""The payload format of a blob entry (a set of named files) and the key of one, for
:mod:`cuforge.core.blobcache` and the system adapters (``cuforge.jax``, ``cuforge.cupy``,
``cuforge.torch.compile_cache``...), which read and write such entries without the build
protocol around them.

Payload format: ``b"cuforge-blobs\\0"`` u32(version) u32(count) then, per file, u64(len(name))
name u64(len(data)) data. Nothing is ever unpickled; file names are data, never paths.
:mod:`cuforge.core.blobcache` re-exports every name here (the same objects).
"""

from __future__ import annotations

import struct

from cuforge.keys.key import KeyBuilder

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: see docs/architecture.md, the warm path
if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Mapping

__all__ = ["BLOB_FORMAT_VERSION", "BlobFormatError", "pack", "unpack", "make_key"]

#: Bump when the payload format changes: every old entry then misses.
BLOB_FORMAT_VERSION = 1
_MAGIC = b"cuforge-blobs\0"
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")


class BlobFormatError(ValueError):
    """Stored bytes are not a blob set this version of cuforge wrote."""


def pack(files: Mapping[str, bytes]) -> bytes:
    """One payload holding the named files (in the order given)."""
    parts = [_MAGIC, _U32.pack(BLOB_FORMAT_VERSION), _U32.pack(len(files))]
    for name, data in files.items():
        raw = name.encode("utf-8")
        parts += [_U64.pack(len(raw)), raw, _U64.pack(len(data)), bytes(data)]
    return b"".join(parts)


def unpack(payload: bytes) -> dict[str, bytes]:
    """The named files of a payload :func:`pack` made. Raises :class:`BlobFormatError` for
    anything else (truncated, trailing bytes, another version, duplicate or bad names)."""
    view = memoryview(payload)
    if bytes(view[: len(_MAGIC)]) != _MAGIC:
        raise BlobFormatError("not a cuforge blob set (bad magic)")
    pos = len(_MAGIC)

    def take(n: int) -> bytes:
        nonlocal pos
        if n < 0 or pos + n > len(view):
            raise BlobFormatError(f"truncated blob set (needed {n} bytes at offset {pos})")
        out = bytes(view[pos : pos + n])
        pos += n
        return out

    (version,) = _U32.unpack(take(4))
    if version != BLOB_FORMAT_VERSION:
        raise BlobFormatError(f"blob set format {version}, expected {BLOB_FORMAT_VERSION}")
    (count,) = _U32.unpack(take(4))
    files: dict[str, bytes] = {}
    for _ in range(count):
        (n,) = _U64.unpack(take(8))
        try:
            name = take(n).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BlobFormatError(f"a file name is not UTF-8 ({exc})") from None
        if not name or name in files:
            raise BlobFormatError(f"empty or duplicate file name {name!r}")
        (n,) = _U64.unpack(take(8))
        files[name] = take(n)
    if pos != len(view):
        raise BlobFormatError(f"{len(view) - pos} trailing bytes after the blob set")
    return files


def make_key(kind: str, fields: Mapping[str, str]) -> tuple[str, dict[str, str]]:
    """``(hex key, recorded fields)`` for ``kind`` and ``fields`` (labels sorted; every value
    must be a str: a TypeError names the label otherwise)."""

    kb = KeyBuilder(kind)
    kb.text("blob_format", str(BLOB_FORMAT_VERSION))
    for label in sorted(fields):
        value = fields[label]
        if not isinstance(label, str) or not isinstance(value, str):
            raise TypeError(
                f"key field {label!r} of a {kind!r} entry is {type(value).__name__}; every "
                "label and value must be a str"
            )
        kb.text(label, value)
    return kb.hexdigest(), dict(kb.fields)
