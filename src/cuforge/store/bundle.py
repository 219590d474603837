"""The bundle file format (``.cfb``) and a read-only :class:`Store` over one bundle.

A bundle is one file holding cache entries (kernels, their direct-mode manifests, torch
objects and modules) plus an index, so a set of prebuilt variants can ship as one
artifact (inside a wheel, a container image) and be served in place::

    header (96 bytes, little-endian)
        magic      8 bytes  b"CFBUNDL\\0"
        version    u32      FORMAT_VERSION
        flags      u32      0
        index_off  u64      where the index starts
        index_len  u64      its length in bytes
        index_sha  32 bytes SHA-256 of the index bytes
        header_sha 32 bytes SHA-256 of the 64 bytes above
    payloads, back to back (each entry's bytes, at the offset its index row gives)
    index: UTF-8 JSON {"format": 1, "info": {...},
                       "entries": [{"key", "kind", "offset", "size", "sha256", "meta"}, ...],
                       "signature": {"kid", "ed25519"}}   (optional)

``signature`` (written when a signing key is given or ``CUFORGE_SIGNING_KEY`` is set): the
Ed25519 signature (:func:`cuforge.base.signing.bundle_message`) of the SHA-256 of the index
without it, canonical JSON (sorted keys, no spaces). With a keyring (``CUFORGE_TRUSTED_KEYS``
or ``keyring=``), opening refuses an unsigned bundle or one whose signature no trusted,
unrevoked key made, offline (no network); the served entries' ``meta["signer"]`` names the
signer.

``info`` is the writer's description (cuforge writes the variants, the archs, the cuforge
version and the toolchain identity; see :mod:`cuforge.aot.bundle`).

Guarantees of :class:`BundleStore` (a bundle is code: whatever it serves, a process runs):

* Opening refuses a file this process should not trust: it must be owned by the current
  user or root and not be writable by group or others (else :class:`BundleError` says
  why and how to fix it: ``chown``, ``chmod go-w``, or copy it). A bundle reached through
  a symlink is loaded with a warning (once per link) naming the link, its target and the
  target's owner.
* Opening checks the header, the index checksum (and its nesting depth), every row (a hex
  key given once, a known kind, a meta that passes :mod:`cuforge.store.schema`, a
  non-empty payload for a kernel, an offset and size inside the payload area, no two rows
  overlapping) and, with ``verify=True`` (the default), every payload's SHA-256. Anything
  wrong raises :class:`BundleError` naming the file and what is wrong: a damaged bundle
  is never half-served.
* The file stays open and is read in place (``os.pread``), nothing is copied into a cache
  dir. Every ``get`` copies the payload out of the file, checks the copy's SHA-256 and
  serves that copy: a file rewritten after it was opened is refused
  (:class:`BundleError`), never served, and one cut short is an error naming the file,
  never a SIGBUS (the file is not memory-mapped).
* Read-only: ``put`` and ``delete`` do nothing and return False.

Layer 2: imports :mod:`cuforge.base._fs`, :mod:`cuforge.store.base` and
:mod:`cuforge.store.schema` only.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from typing import TYPE_CHECKING

from cuforge.base._fs import atomic_write, destination_problem, open_regular
from cuforge.base.errors import CuforgeError
from cuforge.store.base import Entry, EntryInfo, Store, StoreStats, is_entry_key
from cuforge.store.schema import entry_problem

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Iterable, Iterator
    from typing import Any

__all__ = ["BundleError", "BundleStore", "write_bundle_file", "MAGIC", "FORMAT_VERSION"]

MAGIC = b"CFBUNDL\0"
FORMAT_VERSION = 1
_HEADER = "<8sIIQQ32s32s"
_HEADER_SIZE = 96
#: an index larger than this is refused (a damaged length field must not allocate GBs)
MAX_INDEX_BYTES = 256 * 1024**2


class BundleError(CuforgeError, ValueError):
    """A bundle file cuforge cannot use (damaged, truncated, another format version, not a
    bundle); the message names the file and what is wrong."""


def _sha256(data) -> bytes:
    return hashlib.sha256(data).digest()


#: "the signing key / keyring the settings name" (CUFORGE_SIGNING_KEY, CUFORGE_TRUSTED_KEYS)
CONFIGURED: Any = "configured"


def _signed_digest(doc: dict[str, Any]) -> str:
    """The SHA-256 a bundle signature covers: the index without its signature."""
    unsigned = {k: v for k, v in doc.items() if k != "signature"}
    return _sha256(
        json.dumps(unsigned, sort_keys=True, separators=(",", ":")).encode("utf-8")
    ).hex()


def write_bundle_file(
    path: str, entries: Iterable[Entry], info: dict[str, Any], *, signer: Any = CONFIGURED
) -> int:
    """Write ``entries`` (each key once; a repeated key must have the same kind and payload)
    and ``info`` (JSON types) as a bundle at ``path``, atomically (mode 0644: a bundle is
    meant to be shipped). Returns the file's size. Raises ``ValueError`` for a malformed
    entry (a kernel needs a non-empty payload) or a ``path`` that exists and is not a
    regular file (a symlink, a device such as /dev/null, a directory: never replaced),
    ``OSError`` when the file cannot be written. ``signer``: a
    :class:`cuforge.base.signing.SigningKey` to sign the index with (default: the one
    ``CUFORGE_SIGNING_KEY`` names, if any; None: unsigned)."""

    problem = destination_problem(path)
    if problem is not None:
        raise ValueError(f"cannot write the bundle {path}: {problem}")
    rows: list[dict[str, Any]] = []
    seen: dict[str, tuple[str, bytes]] = {}
    body = bytearray()
    for entry in entries:
        payload = bytes(entry.payload)
        if entry.key in seen:
            if seen[entry.key] != (entry.kind, payload):
                raise ValueError(f"two different entries have the key {entry.key[:16]}...")
            continue
        problem = entry_problem(entry.kind, entry.meta)
        if problem is None and entry.kind == "kernel" and not payload:
            problem = "a kernel with an empty payload"
        if problem is not None or not is_entry_key(entry.key):
            raise ValueError(
                f"entry {entry.key[:16]!r} cannot go into a bundle: {problem or 'not a hex key'}"
            )
        seen[entry.key] = (entry.kind, payload)
        rows.append(
            {
                "key": entry.key,
                "kind": entry.kind,
                "offset": _HEADER_SIZE + len(body),
                "size": len(payload),
                "sha256": _sha256(payload).hex(),
                "meta": entry.meta,
            }
        )
        body += payload
    doc: dict[str, Any] = {"format": FORMAT_VERSION, "info": info, "entries": rows}
    if signer is CONFIGURED:
        from cuforge.base.signing import configured

        signer = configured()[0]
    if signer is not None:
        from cuforge.base.signing import bundle_message

        # the digest of the index as a reader parses it back (JSON types only)
        doc = json.loads(json.dumps(doc))
        sig = signer.sign(bundle_message(_signed_digest(doc)))
        doc["signature"] = {"kid": signer.kid, "ed25519": sig}
    index = json.dumps(doc, sort_keys=True).encode("utf-8")
    head = struct.pack(
        "<8sIIQQ32s", MAGIC, FORMAT_VERSION, 0, _HEADER_SIZE + len(body), len(index), _sha256(index)
    )
    data = head + _sha256(head) + bytes(body) + index
    atomic_write(path, data, mode=0o644)
    return len(data)


#: deeper JSON than this in the index's ``info`` or an entry's ``meta`` is damage (cuforge
#: writes 3 levels; a deep one would blow the stack of whoever prints or stores it)
MAX_INDEX_DEPTH = 32

# bundle links already warned about in this process
_warned_links: set[str] = set()


def _too_deep(value: Any, limit: int = MAX_INDEX_DEPTH) -> bool:
    """Whether the JSON value ``value`` nests deeper than ``limit`` (no recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


def _owner(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _trust_problem(path: str, st: os.stat_result) -> str | None:
    """Why the opened bundle file (``st``: its ``fstat``) must not be loaded, or None. The
    rule of the cache dir, for one file: owned by this user or root, and not writable by
    group or others (whoever can write it chooses the code this process runs)."""
    uid = os.geteuid()
    if st.st_uid not in (uid, 0):
        return (
            f"it is owned by {_owner(st.st_uid)}, not by you ({_owner(uid)}) or root, and a "
            f"bundle is code. If you trust it, copy it (`cp {path} ~/`) or take it over "
            f"(`chown $(id -un) {path}`), then load the copy"
        )
    if st.st_mode & 0o022:
        who = " and ".join(
            w for w, bit in (("group", 0o020), ("others", 0o002)) if st.st_mode & bit
        )
        return (
            f"it is writable by {who}, who could change the code it serves; fix it with "
            f"`chmod go-w {path}`"
        )
    return None


class BundleStore(Store):
    """A read-only tier over the bundle at ``path`` (see the module doc). ``info``: the
    writer's description (a dict; empty when the index's is not an object, which
    ``info_problem`` then says); ``path``: the absolute path of the file (a symlink's
    target)."""

    tier = "bundle"

    def __init__(
        self, path: str | os.PathLike[str], *, verify: bool = True, keyring: Any = CONFIGURED
    ) -> None:
        """``keyring``: a :class:`cuforge.base.signing.Keyring` the bundle must be signed by
        (default: ``CUFORGE_TRUSTED_KEYS``'s, if set; None: no signature required)."""
        if keyring is CONFIGURED:
            from cuforge.base.signing import configured

            keyring = configured()[1]
        self._keyring = keyring
        #: the trusted name of the bundle's signer (None: no keyring was asked)
        self.signer: str | None = None

        self._fd = -1
        given = os.path.abspath(os.fspath(path))
        self.path = os.path.realpath(given)
        self.hits = self.misses = 0
        try:
            fd = open_regular(given, follow=True)  # the user's own file, named in code
        except OSError as exc:
            raise BundleError(
                f"cannot open bundle {given}: {exc.strerror or exc}; build one with "
                "`cuforge build --bundle FILE`"
            ) from None
        self._fd = fd
        try:
            st = os.fstat(fd)
            problem = _trust_problem(self.path, st)
            if problem is not None:
                raise BundleError(f"cuforge does not load the bundle {self.path}: {problem}")
            if given != self.path and os.path.islink(given) and given not in _warned_links:
                _warned_links.add(given)
                import logging

                logging.getLogger("cuforge").warning(
                    "cuforge: the bundle %s is a symlink to %s (owned by %s); loading the "
                    "target. Load the file itself to silence this",
                    given,
                    self.path,
                    _owner(st.st_uid),
                )
            self._size = st.st_size
            if self._size < _HEADER_SIZE:
                raise self._error(f"it is {self._size} bytes, shorter than a bundle header")
            self._rows = self._read_index(self._size)
            if verify:
                for key in self._rows:
                    self._read(key)
        except BaseException:
            self.close()
            raise

    def _error(self, what: str) -> BundleError:
        return BundleError(
            f"bundle {self.path} is damaged or not a bundle: {what}. Rebuild it with "
            "`cuforge build --bundle FILE` (or copy it again)"
        )

    def _pread(self, size: int, offset: int) -> bytes:
        """``size`` bytes at ``offset``, copied out of the file; a file that no longer
        holds them (cut short since it was opened) raises :class:`BundleError`."""
        if self._fd < 0:
            raise BundleError(f"bundle {self.path} was closed (unload_bundle); load it again")
        chunks, done = [], 0
        while done < size:
            chunk = os.pread(self._fd, min(size - done, 1 << 30), offset + done)
            if not chunk:
                now = os.fstat(self._fd).st_size
                raise BundleError(
                    f"bundle {self.path} changed after it was loaded: it is now {now} bytes, "
                    f"was {self._size} (cut short in place). Nothing more is served from it; "
                    "replace bundles by renaming a new file over them, then load it again"
                )
            chunks.append(chunk)
            done += len(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def _read_index(self, size: int) -> dict[str, dict[str, Any]]:

        header = self._pread(_HEADER_SIZE, 0)
        magic, version, _flags, off, length, index_sha, header_sha = struct.unpack(_HEADER, header)
        if magic != MAGIC:
            raise self._error("it does not start with the bundle magic bytes")
        if _sha256(header[:64]) != header_sha:
            raise self._error("the header checksum does not match")
        if version != FORMAT_VERSION:
            raise BundleError(
                f"bundle {self.path} has format version {version}; this cuforge reads version "
                f"{FORMAT_VERSION}. Rebuild it with this cuforge (`cuforge build --bundle`)"
            )
        if length > MAX_INDEX_BYTES or off < _HEADER_SIZE or off + length != size:
            raise self._error(f"the index ({length} bytes at {off}) does not end the file")
        raw = self._pread(length, off)
        if _sha256(raw) != index_sha:
            raise self._error("the index checksum does not match")
        try:
            doc = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise self._error("the index is not JSON") from None
        except RecursionError:
            raise self._error("the index nests too deeply to be read") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("entries"), list):
            raise self._error("the index has no entry list")
        info = doc.get("info")
        if _too_deep(info):
            raise self._error(f"the index's info nests deeper than {MAX_INDEX_DEPTH} levels")
        self.info: dict[str, Any] = info if isinstance(info, dict) else {}
        #: what is wrong with the index's ``info`` (not an object), or None
        self.info_problem = (
            None
            if info is None or isinstance(info, dict)
            else f"the index's info is a {type(info).__name__}, not an object"
        )
        rows: dict[str, dict[str, Any]] = {}
        where: dict[str, int] = {}
        for i, row in enumerate(doc["entries"]):
            if not isinstance(row, dict) or not is_entry_key(row.get("key")):
                raise self._error(f"index row {i} has no valid key")
            key = row["key"]
            if key in rows:
                raise self._error(f"index rows {where[key]} and {i} have the same key {key[:16]}")
            o, n, sha = row.get("offset"), row.get("size"), row.get("sha256")
            if not (
                isinstance(o, int)
                and isinstance(n, int)
                and _HEADER_SIZE <= o
                and 0 <= n
                and o + n <= off
                and isinstance(sha, str)
                and len(sha) == 64
            ):
                raise self._error(f"index row {i} ({key[:16]}) has a bad offset/size/sha256")
            meta = row.get("meta")
            if _too_deep(meta):
                raise self._error(f"entry {key[:16]}: meta nests deeper than {MAX_INDEX_DEPTH}")
            problem = entry_problem(row.get("kind"), meta)
            if problem is None and row["kind"] == "kernel" and n == 0:
                problem = "a kernel with an empty payload"
            if problem is not None:
                raise self._error(f"entry {key[:16]}: {problem}")
            rows[key] = row
            where[key] = i
        self._check_signature(doc, rows)
        # each row's bytes are its own: overlapping rows would serve (and install) the same
        # bytes many times over
        end, last = _HEADER_SIZE, ""
        for row in sorted(rows.values(), key=lambda r: (r["offset"], r["size"])):
            if row["offset"] < end:
                raise self._error(
                    f"entries {last[:16]} and {row['key'][:16]} overlap (their byte ranges "
                    "share bytes)"
                )
            if row["size"]:
                end, last = row["offset"] + row["size"], row["key"]
        return rows

    def _check_signature(self, doc: dict[str, Any], rows: dict[str, dict[str, Any]]) -> None:
        """Refuse a bundle the keyring does not accept; name the signer in every row."""
        keyring = self._keyring
        kid = None
        if keyring is not None:
            from cuforge.base.signing import Untrusted, bundle_message

            sig = doc.get("signature")
            sig = sig if isinstance(sig, dict) else {}
            try:
                self.signer = keyring.check(
                    sig.get("ed25519"), sig.get("kid"), bundle_message(_signed_digest(doc))
                )
            except Untrusted as exc:
                raise BundleError(
                    f"cuforge does not load the bundle {self.path}: {exc.reason} "
                    "(CUFORGE_TRUSTED_KEYS). Sign it with `CUFORGE_SIGNING_KEY=KEYFILE "
                    "cuforge build --bundle` using a key the keyring trusts"
                ) from None
            kid = sig.get("kid")
        for row in rows.values():
            row["meta"].pop("signer", None)  # only a checked signature names a writer
            row["meta"].pop("signer_kid", None)
            if self.signer is not None:
                row["meta"]["signer"] = self.signer
                row["meta"]["signer_kid"] = kid

    def _read(self, key: str) -> bytes:
        """The payload of ``key``, copied out of the file and then checked: the bytes
        checked are the bytes returned."""
        row = self._rows[key]
        payload = self._pread(row["size"], row["offset"])
        if _sha256(payload).hex() != row["sha256"]:
            raise self._error(f"entry {key[:16]} ({row['kind']}) fails its SHA-256 check")
        return payload

    # -- Store --------------------------------------------------------------------

    def get(self, key: str, *, kind: str | None = None) -> Entry | None:
        row = self._rows.get(key)
        if row is None or (kind is not None and row["kind"] != kind):
            self.misses += 1
            return None
        payload = self._read(key)
        self.hits += 1
        return Entry(key, row["kind"], payload, dict(row["meta"]))

    def put(self, entry: Entry, *, durable: bool = True) -> bool:
        return False  # read-only

    def delete(self, key: str) -> bool:
        return False  # read-only

    def iterate(self) -> Iterator[EntryInfo]:
        created = self.info.get("created", 0.0)
        created = float(created) if isinstance(created, (int, float)) else 0.0
        for key, row in self._rows.items():
            yield EntryInfo(key, row["kind"], row["size"], created, 0.0, dict(row["meta"]))

    def entries(self) -> Iterator[Entry]:
        """Every entry, payloads included (each checked)."""
        for key in self._rows:
            entry = self.get(key)
            if entry is not None:
                yield entry

    def stats(self) -> StoreStats:
        return StoreStats(
            "bundle",
            entries=len(self._rows),
            bytes=sum(r["size"] for r in self._rows.values()),
            hits=self.hits,
            misses=self.misses,
            extra={"path": self.path},
        )

    def __len__(self) -> int:
        return len(self._rows)

    def close(self) -> None:
        """Close the file (entries already returned stay valid: they are copies)."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def __del__(self) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"BundleStore({self.path!r}, {len(self._rows)} entries)"
