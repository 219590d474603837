"""The bytes a remote tier stores: a checked, optionally signed wrapper around one entry.

Format (version :data:`VERSION`), integers little-endian::

    b"CUFR" u8(version) u32(len(header)) header entry

* ``header``: UTF-8 JSON ``{"ns", "kind", "key", "sha256"}`` plus ``"sig"`` when signed
  with the shared HMAC key, and ``"ed25519"`` + ``"kid"`` when signed with a private key.
  ``ns`` is the namespace (:func:`namespace`: cuforge's version and the key schema
  version), ``sha256`` the hex SHA-256 of ``entry``, ``sig`` the hex HMAC-SHA256 (with the
  shared key) of the length-prefixed fields ``ns``, ``kind``, ``key``, ``sha256``;
  ``ed25519`` the hex Ed25519 signature of the same fields
  (:func:`cuforge.base.signing.entry_message`) by the key whose id is ``kid``.
* ``entry``: an entry file of the disk tier (:func:`cuforge.store.disk.encode_entry`:
  its own BLAKE2b checksum, and metadata that must follow :mod:`cuforge.store.schema`).

Backends read a value's first :data:`HEAD_BYTES` (and its total size) before the rest, and
:func:`check_head` refuses it there (size cap, magic, version, header length; the header
itself when it came along), so garbage or an oversized value is never buffered whole.

:func:`open_envelope` checks, in this order, and raises :class:`Rejected` naming the
first check that failed: the size cap (``max_bytes``), magic and version,
the header, the namespace, kind and key against what was asked, the digest, the
HMAC signature (when a key is set: unsigned or badly signed values are refused; without a
key a signature is not checked, the digest still is), the Ed25519 signature (when a keyring
is given: unsigned, unknown-key, revoked-key and bad signatures are refused), then the
entry's own checksum and schema. With a keyring, the entry's ``meta["signer"]`` is the
trusted name of its signer and ``meta["signer_kid"]`` its key id (a ``signer`` or
``signer_kid`` the writer put there is never kept).

One signature per direct-mode hit: a signed manifest's meta may carry ``"sealed"``,
``{target key: sha256 of its envelope's entry bytes}`` (written by the remote tier for the
entries it sealed or verified, :class:`~cuforge.store.remote.tier.RemoteStore`). Once the
manifest's own signature is verified, an entry whose bytes have exactly that digest is
covered by it (``open_envelope(..., vouched=...)``): the Ed25519 check is not repeated.
Bytes with any other digest are checked as usual, so nothing unsigned is served.
:attr:`Rejected.trust` tells trust failures (namespace, signature) from damage.
"""

from __future__ import annotations

from cuforge.store.remote import namespace  # (defined there: a lazy tier needs no envelope)
from cuforge.store.remote.base import DEFAULT_MAX_BYTES, DamagedValue

try:  # hmac.compare_digest, picked as hmac picks it, without importing hmac (and warnings)
    from _hashlib import compare_digest as _compare_digest
except ImportError:  # pragma: no cover - a Python without OpenSSL
    from _operator import _compare_digest

TYPE_CHECKING = False  # not `typing.TYPE_CHECKING`: importing typing costs ~10 ms
if TYPE_CHECKING:  # pragma: no cover
    from typing import Any

    from cuforge.base.signing import Keyring, SigningKey
    from cuforge.store.base import Entry

__all__ = [
    "MAGIC",
    "VERSION",
    "MAX_VALUE_BYTES",
    "MAX_HEADER_BYTES",
    "HEAD_BYTES",
    "check_head",
    "Rejected",
    "namespace",
    "seal",
    "seal_with_digest",
    "open_envelope",
    "signature",
]

MAGIC = b"CUFR"
#: version of the envelope layout
VERSION = 1
#: the default cap on a remote value (``CUFORGE_REMOTE_MAX_BYTES``): a larger one is
#: refused before it is transferred where the backend can see its size first
MAX_VALUE_BYTES = DEFAULT_MAX_BYTES
#: the JSON header is a few hundred bytes; anything much larger is garbage
MAX_HEADER_BYTES = 1 << 16
_PREFIX = len(MAGIC) + 1 + 4
#: what a backend reads first to check a value (:func:`check_head`): magic, version and
#: the header's length
HEAD_BYTES = _PREFIX


class Rejected(Exception):
    """A remote value that must not be used. ``trust``: it failed a trust check (wrong
    namespace, unsigned, bad signature) rather than being damaged."""

    def __init__(self, reason: str, *, trust: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.trust = trust


def signature(secret: bytes, ns: str, kind: str, key: str, sha256: str) -> str:
    """Hex HMAC-SHA256 of the length-prefixed header fields."""
    import hmac

    msg = b"".join(
        len(part).to_bytes(4, "little") + part
        for part in (b"cuforge-remote-v1", *(f.encode() for f in (ns, kind, key, sha256)))
    )
    return hmac.new(secret, msg, "sha256").hexdigest()


def seal(
    entry: Entry, ns: str, secret: bytes | None = None, signer: SigningKey | None = None
) -> bytes:
    """The envelope holding ``entry`` (HMAC-signed when ``secret`` is given, Ed25519-signed
    when ``signer`` is)."""
    return seal_with_digest(entry, ns, secret, signer)[0]


def seal_with_digest(
    entry: Entry, ns: str, secret: bytes | None = None, signer: SigningKey | None = None
) -> tuple[bytes, str]:
    """:func:`seal`, and the header's ``sha256`` (the hex SHA-256 of the entry bytes): what
    a signed manifest names to vouch for this envelope (:func:`open_envelope`'s
    ``vouched``)."""
    import hashlib

    from cuforge.base._fastjson import dumps
    from cuforge.store.disk import encode_entry

    body = encode_entry(entry)
    digest = hashlib.sha256(body).hexdigest()
    header = {"ns": ns, "kind": entry.kind, "key": entry.key, "sha256": digest}
    if secret is not None:
        header["sig"] = signature(secret, ns, entry.kind, entry.key, digest)
    if signer is not None:
        from cuforge.base.signing import entry_message

        header["ed25519"] = signer.sign(entry_message(ns, entry.kind, entry.key, digest))
        header["kid"] = signer.kid
    raw = dumps(header).encode()  # json.dumps(header, separators=(",", ":"))
    data = b"".join((MAGIC, bytes((VERSION,)), len(raw).to_bytes(4, "little"), raw, body))
    return data, digest


def _check_prefix(head, total: int, max_bytes: int) -> int:
    """The end of the header of a value of ``total`` bytes starting with ``head`` (at
    least :data:`HEAD_BYTES` of it, or all of it); raises :class:`Rejected`."""
    if total > max_bytes:
        raise Rejected(
            f"value of {total} bytes is over the {max_bytes}-byte cap (CUFORGE_REMOTE_MAX_BYTES)"
        )
    if total < _PREFIX or len(head) < _PREFIX or head[:4] != MAGIC:
        raise Rejected("not a cuforge remote entry (bad magic or truncated)")
    if head[4] != VERSION:
        raise Rejected(f"envelope version {head[4]}, this cuforge reads {VERSION}")
    size = int.from_bytes(head[5:9], "little")
    if size > MAX_HEADER_BYTES or _PREFIX + size > total:
        raise Rejected("truncated or oversized header")
    return _PREFIX + size


def _parse_header(raw, kind: str, key: str) -> dict:
    """The JSON header ``raw`` (bytes or a memoryview of them), checked for shape and for
    naming ``(kind, key)``; raises :class:`Rejected`. The namespace is the caller's check
    (a trust failure, not damage)."""
    from cuforge.base._fastjson import loads

    try:
        header = loads(bytes(raw).decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise Rejected(f"bad header: {exc}") from None
    if not isinstance(header, dict) or not all(
        isinstance(header.get(f), str) for f in ("ns", "kind", "key", "sha256")
    ):
        raise Rejected("bad header: ns, kind, key and sha256 must be strings")
    if header["kind"] != kind or header["key"] != key:
        raise Rejected(f"holds {header['kind']} {header['key'][:16]}..., not what was asked")
    return header


def check_head(head, total: int, kind: str, key: str, max_bytes: int | None = None) -> int:
    """For a backend, before it transfers the rest of a value of ``total`` bytes for
    ``(kind, key)`` whose first bytes are ``head`` (at least :data:`HEAD_BYTES`, or the
    whole value when shorter): the size cap, magic, version and header length, and the
    header itself when ``head`` holds all of it. Returns the header's end (the bytes a
    backend needs to check the header too). Raises
    :class:`~cuforge.store.remote.base.DamagedValue` naming what is wrong (the tier installs
    it as its backend's :attr:`~cuforge.store.remote.base.RemoteBackend.head_check`)."""
    try:
        end = _check_prefix(head, total, MAX_VALUE_BYTES if max_bytes is None else max_bytes)
        if len(head) >= end:
            _parse_header(memoryview(head)[_PREFIX:end], kind, key)
    except Rejected as exc:
        raise DamagedValue(f"{kind}/{key[:16]}: {exc.reason}") from None
    return end


#: cuforge.base.signing once a keyring was used (imported on the first verify, not per hit)
_signing: Any = None


def _load_signing() -> Any:
    global _signing
    from cuforge.base import signing

    _signing = signing
    return signing


def open_envelope(
    data: bytes,
    *,
    ns: str,
    kind: str,
    key: str,
    secret: bytes | None = None,
    max_bytes: int | None = None,
    keyring: Keyring | None = None,
    vouched: tuple[str, str, str] | None = None,
    seen: dict | None = None,
) -> tuple[dict, bytes]:
    """``(entry header {"key", "kind", "meta", "created"}, payload)`` of a value read for
    ``(kind, key)``. Raises :class:`Rejected` (see the module doc for the checks). Copies
    nothing but the payload it returns (``data`` may be a bytearray or memoryview).

    ``vouched``: ``(sha256, signer name, signer kid)`` that a manifest verified with
    ``keyring`` names for this ``key``; when the entry's SHA-256 (computed here) is that
    one, the manifest's signature covers these bytes and the Ed25519 check is not made
    again (any other bytes are checked as usual). ``seen``: a dict that gets ``sha256``
    (the entry's digest) and ``verified`` (whether an Ed25519 signature was verified)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise Rejected(f"the backend returned {type(data).__name__}, not bytes")
    view = memoryview(data).cast("B")
    end = _check_prefix(view, view.nbytes, MAX_VALUE_BYTES if max_bytes is None else max_bytes)
    header = _parse_header(view[_PREFIX:end], kind, key)
    if header["ns"] != ns:
        raise Rejected(f"namespace {header['ns']!r}, this cuforge uses {ns!r}", trust=True)
    body = view[end:]
    import hashlib

    digest = hashlib.sha256(body).hexdigest()
    if not _compare_digest(digest, header["sha256"]):
        raise Rejected("sha256 mismatch (damaged or tampered)")
    if secret is not None:
        sig = header.get("sig")
        if not isinstance(sig, str):
            raise Rejected("unsigned, and CUFORGE_REMOTE_KEY requires signed entries", trust=True)
        if not _compare_digest(sig, signature(secret, ns, kind, key, digest)):
            raise Rejected("bad signature (written with another key?)", trust=True)
    signer = kid = None
    verified = False
    if keyring is not None:
        if vouched is not None and _compare_digest(digest, vouched[0]):
            _, signer, kid = vouched  # these exact bytes are named by a verified signature
        else:
            signing = _signing or _load_signing()
            kid = header.get("kid")
            try:
                signer = keyring.check(
                    header.get("ed25519"), kid, signing.entry_message(ns, kind, key, digest)
                )
            except signing.Untrusted as exc:
                raise Rejected(exc.reason, trust=True) from None
            verified = True
    if seen is not None:
        seen["sha256"] = digest
        seen["verified"] = verified
    from cuforge.store.disk import CorruptEntry, decode_entry

    try:
        obj, payload = decode_entry(body)
    except CorruptEntry as exc:
        raise Rejected(f"bad entry: {exc}") from None
    if obj.get("key") != key or obj.get("kind") != kind:
        raise Rejected("the entry inside names another key or kind")
    meta = obj.get("meta")
    if isinstance(meta, dict):
        # provenance: only a signature this reader checked names a writer (by the name
        # of its own keyring, and by key id: a local hit refuses a key revoked since)
        meta.pop("signer", None)
        meta.pop("signer_kid", None)
        if signer is not None:
            meta["signer"] = signer
            meta["signer_kid"] = kid
    return obj, payload
