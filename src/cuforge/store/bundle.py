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
                       "entries": [{"key", "kind", "offset", "size", "sha256", "meta"}, ...]}

``info`` is the writer's description (cuforge writes the variants, the archs, the cuforge
version and the toolchain identity; see :mod:`cuforge.aot.bundle`).

Guarantees of :class:`BundleStore`:

* Opening checks the header, the index checksum, every row (a hex key, a known kind, a
  meta that passes :mod:`cuforge.store.schema`, an offset and size inside the payload
  area) and, with ``verify=True`` (the default), every payload's SHA-256. Anything wrong
  raises :class:`BundleError` naming the file and what is wrong: a damaged bundle is never
  half-served.
* The file is memory-mapped: nothing is copied into a cache dir; ``get`` copies one
  payload out of the map. With ``verify=False``, an entry's SHA-256 is checked the first
  time it is served (a mismatch raises :class:`BundleError`).
* Read-only: ``put`` and ``delete`` do nothing and return False.

Layer 2: imports :mod:`cuforge._fs`, :mod:`cuforge.store.base` and
:mod:`cuforge.store.schema` only.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import struct
from typing import TYPE_CHECKING

from cuforge._fs import atomic_write, open_regular
from cuforge.errors import CuforgeError
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


def write_bundle_file(path: str, entries: Iterable[Entry], info: dict[str, Any]) -> int:
    """Write ``entries`` (each key once; a repeated key must have the same kind and payload)
    and ``info`` (JSON types) as a bundle at ``path``, atomically (mode 0644: a bundle is
    meant to be shipped). Returns the file's size. Raises ``ValueError`` for a malformed
    entry, ``OSError`` when the file cannot be written."""

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
    index = json.dumps(
        {"format": FORMAT_VERSION, "info": info, "entries": rows}, sort_keys=True
    ).encode("utf-8")
    head = struct.pack(
        "<8sIIQQ32s", MAGIC, FORMAT_VERSION, 0, _HEADER_SIZE + len(body), len(index), _sha256(index)
    )
    data = head + _sha256(head) + bytes(body) + index
    atomic_write(path, data, mode=0o644)
    return len(data)


class BundleStore(Store):
    """A read-only tier over the bundle at ``path`` (see the module doc). ``info``: the
    writer's description; ``path``: the absolute path."""

    tier = "bundle"

    def __init__(self, path: str | os.PathLike[str], *, verify: bool = True) -> None:
        self.path = os.path.abspath(os.fspath(path))
        self.hits = self.misses = 0
        try:
            fd = open_regular(self.path, follow=True)  # the user's own file, named in code
        except OSError as exc:
            raise BundleError(
                f"cannot open bundle {self.path}: {exc.strerror or exc}; build one with "
                "`cuforge build --bundle FILE`"
            ) from None
        try:
            size = os.fstat(fd).st_size
            if size < _HEADER_SIZE:
                raise self._error(f"it is {size} bytes, shorter than a bundle header")
            self._map = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        try:
            self._rows = self._read_index(size)
            self._verified: set[str] = set()
            if verify:
                for key in self._rows:
                    self._check(key)
        except BaseException:
            self._map.close()
            raise

    def _error(self, what: str) -> BundleError:
        return BundleError(
            f"bundle {self.path} is damaged or not a bundle: {what}. Rebuild it with "
            "`cuforge build --bundle FILE` (or copy it again)"
        )

    def _read_index(self, size: int) -> dict[str, dict[str, Any]]:
        m = self._map
        magic, version, _flags, off, length, index_sha, header_sha = struct.unpack(
            _HEADER, m[:_HEADER_SIZE]
        )
        if magic != MAGIC:
            raise self._error("it does not start with the bundle magic bytes")
        if _sha256(m[:64]) != header_sha:
            raise self._error("the header checksum does not match")
        if version != FORMAT_VERSION:
            raise BundleError(
                f"bundle {self.path} has format version {version}; this cuforge reads version "
                f"{FORMAT_VERSION}. Rebuild it with this cuforge (`cuforge build --bundle`)"
            )
        if length > MAX_INDEX_BYTES or off < _HEADER_SIZE or off + length != size:
            raise self._error(f"the index ({length} bytes at {off}) does not end the file")
        raw = m[off : off + length]
        if _sha256(raw) != index_sha:
            raise self._error("the index checksum does not match")
        try:
            doc = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise self._error("the index is not JSON") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("entries"), list):
            raise self._error("the index has no entry list")
        info = doc.get("info")
        self.info: dict[str, Any] = info if isinstance(info, dict) else {}
        rows: dict[str, dict[str, Any]] = {}
        for i, row in enumerate(doc["entries"]):
            if not isinstance(row, dict) or not is_entry_key(row.get("key")):
                raise self._error(f"index row {i} has no valid key")
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
                raise self._error(f"index row {i} ({row['key'][:16]}) has a bad offset/size/sha256")
            problem = entry_problem(row.get("kind"), row.get("meta"))
            if problem is not None:
                raise self._error(f"entry {row['key'][:16]}: {problem}")
            rows[row["key"]] = row
        return rows

    def _check(self, key: str) -> bytes:
        row = self._rows[key]
        payload = self._map[row["offset"] : row["offset"] + row["size"]]
        if key not in self._verified:
            if _sha256(payload).hex() != row["sha256"]:
                raise self._error(f"entry {key[:16]} ({row['kind']}) fails its SHA-256 check")
            self._verified.add(key)
        return payload

    # -- Store --------------------------------------------------------------------

    def get(self, key: str, *, kind: str | None = None) -> Entry | None:
        row = self._rows.get(key)
        if row is None or (kind is not None and row["kind"] != kind):
            self.misses += 1
            return None
        payload = self._check(key)
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
        """Unmap the file (entries already returned stay valid: they are copies)."""
        self._map.close()

    def __repr__(self) -> str:
        return f"BundleStore({self.path!r}, {len(self._rows)} entries)"
