"""The bytes a remote tier stores: a checked, optionally signed wrapper around one entry.

Format (version :data:`VERSION`), integers little-endian::

    b"CUFR" u8(version) u32(len(header)) header entry

* ``header``: UTF-8 JSON ``{"ns", "kind", "key", "sha256"}`` plus ``"sig"`` when signed.
  ``ns`` is the namespace (:func:`namespace`: cuforge's version and the key schema
  version), ``sha256`` the hex SHA-256 of ``entry``, ``sig`` the hex HMAC-SHA256 (with the
  shared key) of the length-prefixed fields ``ns``, ``kind``, ``key``, ``sha256``.
* ``entry``: an entry file of the disk tier (:func:`cuforge.store.disk.encode_entry`:
  its own BLAKE2b checksum, and metadata that must follow :mod:`cuforge.store.schema`).

:func:`open_envelope` checks, in this order, and raises :class:`Rejected` naming the
first check that failed: the size cap (:data:`MAX_VALUE_BYTES`), magic and version,
the header, the namespace, kind and key against what was asked, the digest, the
signature (when a key is set: unsigned or badly signed values are refused; without a key a
signature is not checked, the digest still is), then the entry's own checksum and schema.
:attr:`Rejected.trust` tells trust failures (namespace, signature) from damage.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import TYPE_CHECKING

from cuforge._fastjson import loads
from cuforge.store.disk import CorruptEntry, decode_entry, encode_entry
from cuforge.store.remote import namespace  # (defined there: a lazy tier needs no envelope)

if TYPE_CHECKING:  # pragma: no cover
    from cuforge.store.base import Entry

__all__ = [
    "MAGIC",
    "VERSION",
    "MAX_VALUE_BYTES",
    "MAX_HEADER_BYTES",
    "Rejected",
    "namespace",
    "seal",
    "open_envelope",
    "signature",
]

MAGIC = b"CUFR"
#: version of the envelope layout
VERSION = 1
#: a remote value larger than this is refused without being decoded (backends that can
#: see a size before transferring, such as the file backend, refuse it unread)
MAX_VALUE_BYTES = 1 << 30
#: the JSON header is a few hundred bytes; anything much larger is garbage
MAX_HEADER_BYTES = 1 << 16
_PREFIX = len(MAGIC) + 1 + 4


class Rejected(Exception):
    """A remote value that must not be used. ``trust``: it failed a trust check (wrong
    namespace, unsigned, bad signature) rather than being damaged."""

    def __init__(self, reason: str, *, trust: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.trust = trust


def signature(secret: bytes, ns: str, kind: str, key: str, sha256: str) -> str:
    """Hex HMAC-SHA256 of the length-prefixed header fields."""

    msg = b"".join(
        len(part).to_bytes(4, "little") + part
        for part in (b"cuforge-remote-v1", *(f.encode() for f in (ns, kind, key, sha256)))
    )
    return hmac.new(secret, msg, "sha256").hexdigest()


def seal(entry: Entry, ns: str, secret: bytes | None = None) -> bytes:
    """The envelope holding ``entry`` (signed when ``secret`` is given)."""

    body = encode_entry(entry)
    digest = hashlib.sha256(body).hexdigest()
    header = {"ns": ns, "kind": entry.kind, "key": entry.key, "sha256": digest}
    if secret is not None:
        header["sig"] = signature(secret, ns, entry.kind, entry.key, digest)
    raw = json.dumps(header, separators=(",", ":")).encode()
    return b"".join((MAGIC, bytes((VERSION,)), len(raw).to_bytes(4, "little"), raw, body))


def open_envelope(
    data: bytes, *, ns: str, kind: str, key: str, secret: bytes | None = None
) -> tuple[dict, bytes]:
    """``(entry header {"key", "kind", "meta", "created"}, payload)`` of a value read for
    ``(kind, key)``. Raises :class:`Rejected` (see the module doc for the checks)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise Rejected(f"the backend returned {type(data).__name__}, not bytes")
    if len(data) > MAX_VALUE_BYTES:
        raise Rejected(f"value of {len(data)} bytes is over the {MAX_VALUE_BYTES}-byte cap")
    data = bytes(data)
    if len(data) < _PREFIX or data[:4] != MAGIC:
        raise Rejected("not a cuforge remote entry (bad magic or truncated)")
    if data[4] != VERSION:
        raise Rejected(f"envelope version {data[4]}, this cuforge reads {VERSION}")
    size = int.from_bytes(data[5:9], "little")
    if size > MAX_HEADER_BYTES or _PREFIX + size > len(data):
        raise Rejected("truncated or oversized header")

    try:
        header = loads(data[_PREFIX : _PREFIX + size].decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise Rejected(f"bad header: {exc}") from None
    if not isinstance(header, dict) or not all(
        isinstance(header.get(f), str) for f in ("ns", "kind", "key", "sha256")
    ):
        raise Rejected("bad header: ns, kind, key and sha256 must be strings")
    if header["ns"] != ns:
        raise Rejected(f"namespace {header['ns']!r}, this cuforge uses {ns!r}", trust=True)
    if header["kind"] != kind or header["key"] != key:
        raise Rejected(f"holds {header['kind']} {header['key'][:16]}..., not what was asked")
    body = data[_PREFIX + size :]

    digest = hashlib.sha256(body).hexdigest()
    if not hmac.compare_digest(digest, header["sha256"]):
        raise Rejected("sha256 mismatch (damaged or tampered)")
    if secret is not None:
        sig = header.get("sig")
        if not isinstance(sig, str):
            raise Rejected("unsigned, and CUFORGE_REMOTE_KEY requires signed entries", trust=True)
        if not hmac.compare_digest(sig, signature(secret, ns, kind, key, digest)):
            raise Rejected("bad signature (written with another key?)", trust=True)

    try:
        obj, payload = decode_entry(body)
    except CorruptEntry as exc:
        raise Rejected(f"bad entry: {exc}") from None
    if obj.get("key") != key or obj.get("kind") != kind:
        raise Rejected("the entry inside names another key or kind")
    return obj, payload
