"""Content keys: labeled, length-prefixed fields hashed with SHA-256, plus a schema version.

A key covers everything that changes generated code and nothing else. Each field has a
label, so two keys can be compared field by field to explain a miss ("header
include/common.cuh changed", "option -O3 added", "arch sm_80 -> sm_90").

Encoding (schema 1)::

    b"cuforge-key" u32(SCHEMA_VERSION) str(kind)
    then for every field, in the order added:
        str(label) u8(type) value
    where str(x) = u64(len(utf8(x))) utf8(x) and value is
        type 1 (text):   str(value)
        type 2 (bytes):  u64(len) bytes
        type 3 (list):   u64(count) then str(item) for each item
        type 4 (map):    u64(count) then str(k) str(v) for each pair, sorted by k

Length prefixes make the encoding unambiguous: no choice of field values can make two
different field lists encode the same bytes.

Also here: the allow-listed environment (:data:`cuforge.base.config.CODEGEN_ENV_VARS`) as a
field, and :func:`diff_fields`, which turns two keys' fields into human reasons.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Iterable, Mapping

from cuforge._version import __version__
from cuforge.base._fs import open_regular
from cuforge.base.config import codegen_environment

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: see docs/architecture.md, the warm path
if TYPE_CHECKING:
    from typing import Any


__all__ = [
    "SCHEMA_VERSION",
    "KeyBuilder",
    "diff_fields",
    "text_digest",
    "bytes_digest",
    "file_digest_of",
]

#: Bump when the encoding or the meaning of a field changes: every old key then misses.
SCHEMA_VERSION = 1

_U64 = struct.Struct(">Q").pack
_U32 = struct.Struct(">I").pack


def bytes_digest(data: bytes) -> str:
    """SHA-256 hex digest of bytes (the content hash used for sources and headers)."""
    return hashlib.sha256(data).hexdigest()


def text_digest(text: str) -> str:
    """SHA-256 hex digest of text, encoded as UTF-8 (lone surrogates kept byte for byte)."""
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


_READ_CHUNK = 1 << 20


def file_digest_of(path: str) -> str:
    """SHA-256 hex digest of the regular file ``path``, read in chunks (equal to
    :func:`bytes_digest` of its bytes).

    Symlinks are followed (user headers may be links), but anything other than a regular
    file (a FIFO, a device, a directory) raises :class:`cuforge.base._fs.NotRegularFile` (an
    ``OSError``) at once instead of blocking. Raises ``OSError`` when it cannot be read."""

    fd = open_regular(path, follow=True)
    try:
        h = hashlib.sha256()
        while True:
            chunk = os.read(fd, _READ_CHUNK)
            if not chunk:
                break
            h.update(chunk)
        return h.hexdigest()
    finally:
        os.close(fd)


def _enc(text: str) -> bytes:
    raw = text.encode("utf-8", "surrogateescape")
    return _U64(len(raw)) + raw


class KeyBuilder:
    """Builds one key. ``kind`` separates key spaces ("kernel", "manifest", "object", ...).

    >>> kb = KeyBuilder("kernel")
    >>> kb.text("arch", "sm_90"); kb.items("options", ["-O3"])
    >>> kb.hexdigest()  # doctest: +SKIP

    ``fields`` keeps a readable record of every field for :func:`diff_fields`: text values
    are kept as they are when short (else their digest), lists and maps as they are.
    """

    __slots__ = ("_hash", "fields", "kind")

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._hash = hashlib.sha256(b"cuforge-key" + _U32(SCHEMA_VERSION) + _enc(kind))
        self.fields: dict[str, Any] = {}

    def _label(self, label: str, type_code: int) -> None:
        if label in self.fields:
            raise ValueError(f"key field {label!r} added twice")
        self._hash.update(_enc(label) + bytes((type_code,)))

    def text(self, label: str, value: str, *, record: str | None = None) -> KeyBuilder:
        """A text field. ``record`` overrides what ``fields`` keeps (e.g. a digest of a long
        source instead of the source itself)."""
        self._label(label, 1)
        self._hash.update(_enc(value))
        if record is None:
            record = value if len(value) <= 200 else "sha256:" + text_digest(value)
        self.fields[label] = record
        return self

    def data(self, label: str, value: bytes) -> KeyBuilder:
        self._label(label, 2)
        self._hash.update(_U64(len(value)) + value)
        self.fields[label] = "sha256:" + bytes_digest(value)
        return self

    def items(self, label: str, values: Iterable[str]) -> KeyBuilder:
        """An ordered list field (options, name expressions, archs)."""
        values = [str(v) for v in values]
        self._label(label, 3)
        self._hash.update(_U64(len(values)) + b"".join(_enc(v) for v in values))
        self.fields[label] = values
        return self

    def mapping(self, label: str, values: Mapping[str, str]) -> KeyBuilder:
        """A map field, order-independent (headers -> content digest, env name -> value)."""
        pairs = sorted((str(k), str(v)) for k, v in values.items())
        self._label(label, 4)
        self._hash.update(_U64(len(pairs)) + b"".join(_enc(k) + _enc(v) for k, v in pairs))
        self.fields[label] = dict(pairs)
        return self

    def environment(self) -> KeyBuilder:
        """The allow-listed codegen environment (set and unset variables alike)."""
        return self.mapping("env", dict(codegen_environment()))

    def cuforge_version(self) -> KeyBuilder:
        return self.text("cuforge", __version__)

    def hexdigest(self) -> str:
        return self._hash.hexdigest()

    def copy(self) -> KeyBuilder:
        clone = KeyBuilder.__new__(KeyBuilder)
        clone.kind = self.kind
        clone._hash = self._hash.copy()
        clone.fields = dict(self.fields)
        return clone


def diff_fields(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Human reasons why two keys' fields differ, most specific first.

    >>> diff_fields({"arch": "sm_80"}, {"arch": "sm_90"})
    ['arch sm_80 -> sm_90']
    """
    reasons: list[str] = []
    for label in list(old) + [k for k in new if k not in old]:
        if label not in new:
            reasons.append(f"{label} removed")
            continue
        if label not in old:
            reasons.append(f"{label} added")
            continue
        before, after = old[label], new[label]
        if before == after:
            continue
        if isinstance(before, list) and isinstance(after, list):
            reasons.extend(_diff_lists(label, before, after))
        elif isinstance(before, dict) and isinstance(after, dict):
            reasons.extend(_diff_maps(label, before, after))
        elif label == "source":
            reasons.append("source changed")
        elif _short(before) and _short(after):
            reasons.append(f"{label} {before} -> {after}")
        else:
            reasons.append(f"{label} changed")
    return reasons


def _short(value: Any) -> bool:
    return (
        isinstance(value, (str, int, float))
        and not str(value).startswith("sha256:")
        and len(str(value)) <= 80
    )


_LIST_NOUNS = {
    "options": "option",
    "name_expressions": "name expression",
    "archs": "arch",
    "ldflags": "ldflag",
}
_MAP_NOUNS = {"headers": "header", "env": "env", "defines": "define", "objects": "object"}


def _diff_lists(label: str, before: list, after: list) -> list[str]:
    noun = _LIST_NOUNS.get(label, label)
    # each value once: an option given twice (-X-lineinfo -X-lineinfo) is one change
    added = _once(v for v in after if v not in before)
    removed = _once(v for v in before if v not in after)
    reasons = [f"{noun} {v} added" for v in added] + [f"{noun} {v} removed" for v in removed]
    if not reasons:
        reasons.append(f"{label} reordered: {' '.join(before)} -> {' '.join(after)}")
    return reasons


def _once(values: Iterable[Any]) -> list[Any]:
    """``values`` in order, each once (values may be unhashable)."""
    out: list[Any] = []
    for v in values:
        if v not in out:
            out.append(v)
    return out


def _diff_maps(label: str, before: dict, after: dict) -> list[str]:
    noun = _MAP_NOUNS.get(label, label)
    reasons: list[str] = []
    for k in sorted(set(before) | set(after)):
        if k not in before:
            reasons.append(f"{noun} {k} added")
        elif k not in after:
            reasons.append(f"{noun} {k} removed")
        elif before[k] != after[k]:
            if label == "env":
                reasons.append(f"env {k}={before[k]!r} -> {after[k]!r}")
            else:
                reasons.append(f"{noun} {k} changed")
    return reasons
