"""The disk tier: the embedded, persistent default.

Layout under ``root`` (created with mode 0700)::

    <root>/v1/entries/ab/cd/<key>   one file per entry
    <root>/v1/index/journal         append-only index: one checksummed line per put / delete
    <root>/v1/index/lock            flock: shared by appenders, exclusive for compaction
    <root>/v1/index/evict.lock      flock: one evicting / pruning process at a time
    <root>/locks/ab/<key>.lock      compile locks (:mod:`cuforge.store.single_flight`)
    <root>/telemetry/               hit / miss counters (see :mod:`cuforge.store.telemetry`)

An entry file (format :data:`DISK_FORMAT_VERSION`), all integers little-endian::

    b"CUFG" u32(version) u32(len(meta)) u64(len(payload)) meta payload digest

``meta`` is UTF-8 JSON ``{"key", "kind", "meta", "created"}`` (no pickle anywhere) and
``digest`` is the 32-byte BLAKE2b of everything before it. Every read checks the magic,
the version, the lengths against the file size, the digest and the metadata's shape
(:mod:`cuforge.store.schema`); a damaged or malformed entry is a miss: it is deleted, a
warning is logged to the ``cuforge`` logger, and the caller rebuilds it.

Files are opened through :mod:`cuforge._fs`: symlinks are never followed and anything
but a regular file (a FIFO, a directory, a device) in place of an entry counts as a
damaged entry, so nothing under the cache dir can make a read hang.

Writes go through :func:`cuforge._fs.atomic_write` (a temp file in the entry's own
directory, then ``os.replace``), so readers see the old entry or the new one, never part
of one. Entries with a payload are ``fsync``\\ ed; payload-less ones (direct-mode
manifests: a lost one costs one compile) are not. A hit refreshes the file's mtime,
which is the entry's "last used" time.

The journal makes ``stats()`` / ``total_bytes()`` cheap on a big cache: it is read
incrementally (only the bytes appended since the last call) and compacted to one line
per live entry when it holds many dead lines. Journal format (version
:data:`JOURNAL_VERSION`): UTF-8 lines, tab-separated, written in *batches* (one batch
per ``write``: a put's line, an eviction's lines, a whole rebuilt journal), each batch
closed by a checksum line holding the CRC-32 (zlib) of the batch's bytes as 8 hex
digits::

    H  2                                      first line of the file (the header)
    P  <key> <file size> <created> <kind> <name> <arch>   put
    D  <key>                                  delete
    C  <crc32 of the lines since the previous C line>      closes a batch

Readers apply only whole, checksummed batches. A journal that is missing, not a
regular file, of an older version, or damaged (a batch whose checksum does not match,
a malformed record, NUL bytes, more than :data:`_MAX_PENDING` bytes without a checksum
line) is rebuilt from a scan of the entries (which indexes damaged entry files too, so
their bytes count), so a zeroed or garbled journal can never switch the size cap off.
Lines appended by hand without a checksum are never applied, and are found as damage by
the next append.

When a put takes the tier (its entries plus live temp files) over ``max_bytes``, the
least recently used entries are removed until the tier is under 90% of the cap, by one
process at a time. Temp files a crashed writer left behind (older than
:data:`STALE_TMP_SECONDS`) are removed by eviction, ``prune``, ``clear`` and
``verify --repair``; ``prune`` and ``clear`` also remove compile lock files nobody holds.

A directory that cannot be created or written turns the tier into a no-op for writes
(``disabled`` becomes True) after ONE warning that names the directory and the fix.
A full disk (``ENOSPC``, ``EDQUOT``) disables writes for a back-off period
(:data:`FULL_DISK_BACKOFF` seconds, doubling up to :data:`FULL_DISK_BACKOFF_MAX`),
after which the next put tries again. Reads of what is there still work.

Import cost matters here (a warm hit in a fresh process must take well under a
millisecond): this module imports only builtin modules at load time; ``json`` (which
pulls in ``re``), ``fcntl`` and ``logging`` are imported where needed.
"""

from __future__ import annotations

import os
from _thread import allocate_lock
from time import monotonic, time

from cuforge import _fs
from cuforge._fastjson import loads as _loads
from cuforge.store import telemetry as _telemetry
from cuforge.store.base import Entry, EntryInfo, Store, StoreStats
from cuforge.store.schema import entry_problem

TYPE_CHECKING = False  # not `typing.TYPE_CHECKING`: importing typing costs ~10 ms
if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable, Iterator
    from typing import Any


__all__ = [
    "DiskStore",
    "VerifyReport",
    "DISK_FORMAT_VERSION",
    "JOURNAL_VERSION",
    "CorruptEntry",
    "encode_entry",
    "decode_entry",
    "entry_filter",
]

#: Version of the entry file format and of the layout. The archive format checks it.
DISK_FORMAT_VERSION = 1
#: Version of the journal's line format (checksummed lines since 2).
JOURNAL_VERSION = 2
_MAGIC = b"CUFG"
_HEADER = 20  # magic 4 + version 4 + meta length 4 + payload length 8
_DIGEST = 32
_VERSION_BYTES = DISK_FORMAT_VERSION.to_bytes(4, "little")
#: evict down to this fraction of the cap, so that a full cache does not evict on every put
EVICT_TO = 0.9
#: temp files older than this are debris of a crashed writer (a put takes milliseconds)
STALE_TMP_SECONDS = 300.0
#: seconds writes stay off after a full disk, doubling on each failed retry ...
FULL_DISK_BACKOFF = 5.0
#: ... up to this
FULL_DISK_BACKOFF_MAX = 300.0
#: a journal "line" longer than this without a newline is damage, not a line being written
#: journal bytes after the last checksum line: a batch being written (one ``write``, which
#: a reader may see in part); more than this is damage
_MAX_PENDING = 32 << 20
_JOURNAL_HEADER = f"H\t{JOURNAL_VERSION}"
_JOURNAL_HEADER_BYTES = f"{_JOURNAL_HEADER}\n".encode()

try:
    from _blake2 import blake2b as _blake2b
except ImportError:  # pragma: no cover - a Python without the builtin module
    from hashlib import blake2b as _blake2b


def _digest(data) -> bytes:
    return _blake2b(data, digest_size=_DIGEST).digest()


def _batch(bodies: list[str]) -> bytes:
    """Journal records as written: one line per record, then the checksum line
    ``C <CRC-32 of the records' bytes, 8 hex digits>``, in one piece."""
    from zlib import crc32

    text = "".join(f"{body}\n" for body in bodies).encode("utf-8", "surrogateescape")
    return text + f"C\t{crc32(text):08x}\n".encode()


def _dumps(obj: Any) -> bytes:
    import json

    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=True).encode()


class CorruptEntry(Exception):
    """An entry file that failed its checks (the message says which)."""


def encode_entry(entry: Entry, created: float | None = None) -> bytes:
    """The bytes of an entry file for ``entry`` (used by put and by archive import)."""
    meta = _dumps(
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
    h = _blake2b(head, digest_size=_DIGEST)
    h.update(meta)
    h.update(payload)
    return b"".join((head, meta, payload, h.digest()))  # one copy of the payload


def _head(meta_len: int, payload_len: int) -> bytes:
    return (
        _MAGIC + _VERSION_BYTES + meta_len.to_bytes(4, "little") + payload_len.to_bytes(8, "little")
    )


def _parse_header(data: bytes, file_size: int) -> tuple[int, int]:
    if len(data) < _HEADER or data[:4] != _MAGIC:
        raise CorruptEntry("bad magic or truncated header")
    if data[4:8] != _VERSION_BYTES:
        raise CorruptEntry(f"format version {int.from_bytes(data[4:8], 'little')}")
    meta_len = int.from_bytes(data[8:12], "little")
    payload_len = int.from_bytes(data[12:20], "little")
    if _HEADER + meta_len + payload_len + _DIGEST != file_size:
        raise CorruptEntry(
            f"size {file_size} != {_HEADER + meta_len + payload_len + _DIGEST} (truncated?)"
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

    Raises :class:`CorruptEntry` on any damage, including metadata of the wrong shape."""
    meta_len, payload_len = _parse_header(data, len(data))
    view = memoryview(data)
    if _digest(view[:-_DIGEST]) != data[-_DIGEST:]:
        raise CorruptEntry("checksum mismatch")
    end = _HEADER + meta_len
    obj = _parse_meta(data[_HEADER:end])
    return obj, data[end : end + payload_len]


class VerifyReport:
    """What :meth:`DiskStore.verify` found.

    ``corrupt``: keys (file names) of damaged or malformed entries, and of things that
    are not regular files in place of one; ``reasons``: key -> why; ``repaired``: how
    many of them were removed (``repair=True``); ``index_drift``: entries the index
    disagreed about; ``journal``: why the journal is damaged (None when it is sound);
    ``journal_rebuilt``: the index was rebuilt (``repair=True``); ``stale_temp``: temp
    files removed; ``ok``: nothing is left to repair."""

    __slots__ = (
        "checked",
        "corrupt",
        "reasons",
        "repaired",
        "bytes",
        "index_drift",
        "journal",
        "journal_rebuilt",
        "stale_temp",
    )

    def __init__(self) -> None:
        self.checked = 0
        self.corrupt: list[str] = []
        self.reasons: dict[str, str] = {}
        self.repaired = 0
        self.bytes = 0
        self.index_drift = 0
        self.journal: str | None = None
        self.journal_rebuilt = False
        self.stale_temp = 0

    @property
    def remaining(self) -> int:
        """Problems left: damaged entries not removed, plus a damaged journal not rebuilt."""
        left = len(self.corrupt) - self.repaired
        if self.journal is not None and not self.journal_rebuilt:
            left += 1
        return left

    @property
    def ok(self) -> bool:
        return self.remaining == 0

    def as_dict(self) -> dict[str, Any]:
        doc = {name: getattr(self, name) for name in self.__slots__}
        doc["ok"] = self.ok
        return doc

    def __repr__(self) -> str:
        return f"VerifyReport({self.as_dict()})"


# Roots this process has already warned about: one warning per directory and topic.
_warned: set[str] = set()


def _logger():
    import logging

    return logging.getLogger("cuforge")


def _is_key(name: str) -> bool:
    return bool(name) and name[0] != "." and "/" not in name and "\0" not in name


def _not_regular(exc: OSError) -> bool:
    """The open failed because the path is a symlink, a directory, a FIFO, a device..."""
    import errno

    return isinstance(exc, _fs.NotRegularFile) or exc.errno in (errno.ELOOP, errno.EISDIR)


def _remove(path: str) -> bool:
    """Remove whatever is at ``path`` (a file, a link, a FIFO, a directory tree); never
    follows a link. True when something was removed."""
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False
    except OSError:
        import stat

        try:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                return False
        except OSError:
            return False
        import shutil

        shutil.rmtree(path, ignore_errors=True)
        return not os.path.lexists(path)


class DiskStore(Store):
    """A persistent, size-capped, checksummed, multi-process-safe tier. See the module doc."""

    tier = "disk"

    def __init__(self, root: str, max_bytes: int, *, telemetry: bool = True) -> None:
        self.root = os.path.abspath(os.path.expanduser(root))
        self.max_bytes = int(max_bytes)
        self.telemetry = telemetry
        self.disabled = False
        self.disabled_reason: str | None = None
        # full disk: when the next put may try again, and the back-off after that
        self._retry_at: float | None = None
        self._backoff = FULL_DISK_BACKOFF
        base = os.path.join(self.root, f"v{DISK_FORMAT_VERSION}")
        self.entries_dir = os.path.join(base, "entries")
        self.index_dir = os.path.join(base, "index")
        self.locks_dir = os.path.join(self.root, "locks")
        self._prefix = self.entries_dir + "/"
        self._journal = os.path.join(self.index_dir, "journal")
        self._index_lock = os.path.join(self.index_dir, "lock")
        self._evict_lock = os.path.join(self.index_dir, "evict.lock")
        self._lock = allocate_lock()
        # the journal as read so far
        self._idx: dict[str, tuple] = {}
        self._idx_ino: tuple[int, int] | None = None
        self._idx_off = 0
        self._idx_lines = 0
        self._idx_bytes = 0
        # live temp files' bytes, as last counted (they count toward the cap)
        self._tmp_bytes = 0
        self._tmp_checked = 0.0
        # this process's counters (stats() reports shared telemetry when it is on)
        self.hits = self.misses = self.puts = self.evictions = self.corrupt = 0
        self.journal_rebuilds = 0
        if not os.path.isdir(self.index_dir):  # one stat when the cache exists
            try:
                if not os.path.isdir(self.root):
                    os.makedirs(self.root, mode=0o700, exist_ok=True)
                    os.chmod(self.root, 0o700)
                os.makedirs(self.entries_dir, mode=0o700, exist_ok=True)
                os.makedirs(self.index_dir, mode=0o700, exist_ok=True)
            except OSError as exc:
                self._disable(exc, "cannot create")

    # ------------------------------------------------------------------ paths
    def path_for(self, key: str) -> str:
        """The entry file's path: ``<root>/v1/entries/<key[0:2]>/<key[2:4]>/<key>``."""
        if not _is_key(key):
            raise ValueError(f"not a valid cache key: {key!r}")
        k = key if len(key) >= 4 else key + "____"
        return f"{self._prefix}{k[0:2]}/{k[2:4]}/{key}"

    # ------------------------------------------------------------------ warnings
    def _disable(self, exc: OSError, what: str) -> None:
        import errno

        self.disabled = True
        where = getattr(exc, "filename", None) or self.root
        full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
        if full:
            reason = f"the disk holding {self.root} is full ({exc.strerror})"
            fix = (
                "free space on that disk, lower CUFORGE_CACHE_MAX_BYTES, or set "
                "CUFORGE_CACHE_DIR to a directory on another disk"
            )
            self._retry_at = monotonic() + self._backoff
            self._backoff = min(self._backoff * 2, FULL_DISK_BACKOFF_MAX)
        else:
            reason = f"{what} {where}: {exc.strerror or exc}"
            fix = (
                f"make {self.root} writable by this user, or set CUFORGE_CACHE_DIR to a "
                "writable directory"
            )
            self._retry_at = None
        self.disabled_reason = reason
        if self.root in _warned:
            return
        _warned.add(self.root)
        _logger().warning(
            "cuforge: disk cache disabled: %s. Compiles still work but their results are not "
            "saved to disk%s. Fix: %s (or set CUFORGE_DISABLE_FILE_CACHE=1 to cache in memory "
            "only and silence this warning).",
            reason,
            " until there is space again (retried with a back-off)" if full else "",
            fix,
        )

    def _record(self, event: str, kind: str, name: Any, nbytes: int = 0, seconds: Any = 0.0):
        if self.telemetry:
            _telemetry.record(
                self.root,
                event,
                tier="disk",
                kind=kind,
                name=name,
                nbytes=nbytes,
                seconds_saved=seconds,
            )

    # ------------------------------------------------------------------ get
    def get(self, key: str, *, kind: str | None = None) -> Entry | None:
        """The entry for ``key`` (``kind`` is ignored: keys are unique across kinds)."""
        path = self.path_for(key)
        try:
            fd = _fs.open_regular(path)
        except OSError as exc:
            if _not_regular(exc):
                self._corrupt(key, path, "not a regular file")
                return None
            self.misses += 1
            self._record("miss", "", None)
            return None
        try:
            data = _read_all(fd)
            try:
                os.utime(fd)  # "last used", for LRU eviction
            except OSError:
                pass  # a read-only cache still serves hits
        except OSError:
            self.misses += 1
            self._record("miss", "", None)
            return None
        finally:
            os.close(fd)
        try:
            obj, payload = decode_entry(data)
            if obj.get("key") != key:
                raise CorruptEntry("entry file holds another key")
            kind = obj["kind"]
            meta = obj["meta"]
            meta["size"] = len(payload)
            meta["created"] = obj.get("created")
            meta["last_used"] = time()
        except (CorruptEntry, KeyError, TypeError) as exc:
            self._corrupt(key, path, str(exc))
            return None
        self.hits += 1
        self._record("hit", kind, meta.get("name"), len(payload), meta.get("compile_seconds", 0))
        return Entry(key, kind, payload, meta)

    def peek(self, key: str) -> Entry | None:
        """Like :meth:`get`, without refreshing last-used, counting, or deleting damage.
        None when the entry is missing, damaged or malformed."""
        path = self.path_for(key)
        try:
            obj, payload = decode_entry(_fs.read_bytes(path))
            if obj.get("key") != key:
                return None
        except (OSError, CorruptEntry):
            return None
        meta = obj["meta"]
        meta["size"] = len(payload)
        meta["created"] = obj.get("created")
        try:
            meta["last_used"] = os.lstat(path).st_mtime
        except OSError:
            meta["last_used"] = obj.get("created")
        return Entry(key, obj["kind"], payload, meta)

    def _corrupt(self, key: str, path: str, reason: str) -> None:
        self.misses += 1
        self.corrupt += 1
        removed = _remove(path)
        if removed:
            self._journal_append(f"D\t{key}\n")
        _logger().warning(
            "cuforge: cache entry %s in %s was damaged (%s); %s, it will be rebuilt",
            key,
            self.root,
            reason,
            "deleted it" if removed else "could not delete it",
        )
        self._record("corrupt", "", None)
        self._record("miss", "", None)

    # ------------------------------------------------------------------ put
    def put(self, entry: Entry, *, durable: bool = True) -> bool:
        if self.disabled:
            retry_at = self._retry_at
            if retry_at is None or monotonic() < retry_at:
                return False
        path = self.path_for(entry.key)
        data = encode_entry(entry)
        # An entry without a payload (a direct-mode manifest) is a hint: losing it to a
        # crash costs one compile and the checksum catches a torn one, so it skips fsync.
        durable = durable and bool(entry.payload)
        for attempt in (0, 1):
            try:
                _fs.atomic_write(path, data, durable=durable)
                break
            except FileNotFoundError as exc:
                # the shard directory vanished under us (a concurrent clear): once more
                if attempt:
                    self._disable(exc, "cannot write to")
                    return False
            except OSError as exc:
                import errno

                if not attempt and exc.errno in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST):
                    # a directory in place of the entry: damage, removed, then once more
                    if _remove(path):
                        self.corrupt += 1
                        continue
                self._disable(exc, "cannot write to")
                return False
        if self.disabled:  # a retry after a full disk worked: writes are back on
            self.disabled, self.disabled_reason, self._retry_at = False, None, None
            self._backoff = FULL_DISK_BACKOFF
            _logger().info("cuforge: disk cache at %s is writable again", self.root)
        self.puts += 1
        name = entry.meta.get("name")
        arch = entry.meta.get("arch")
        self._journal_append(
            f"P\t{entry.key}\t{len(data)}\t{time():.3f}\t{_field(entry.kind)}\t"
            f"{_field(name)}\t{_field(arch)}\n"
        )
        self._record("put", entry.kind, name, len(entry.payload))
        if self.max_bytes >= 0:
            self._maybe_evict()
        return True

    def put_stream(
        self,
        key: str,
        kind: str,
        meta: dict[str, Any],
        size: int,
        chunks: Iterator[bytes],
        *,
        sha256: str | None = None,
        created: float | None = None,
    ) -> str | None:
        """Store an entry whose ``size``-byte payload arrives as ``chunks`` (an archive
        member) without ever holding it whole: it is written to a temp file while its
        checksums are computed, and renamed into place only when it is sound.

        The entry is checked first (key, :mod:`cuforge.store.schema`); the payload must be
        exactly ``size`` bytes and, when ``sha256`` is given, have that SHA-256. Returns
        None when stored, else why not (then nothing is stored). Raises ``OSError`` when
        the tier cannot write (it has warned); errors raised by ``chunks`` propagate."""
        if not _is_key(key):
            return f"bad key {key!r}"
        why = entry_problem(kind, meta)
        if why is not None:
            return why
        if self.disabled:
            retry_at = self._retry_at
            if retry_at is None or monotonic() < retry_at:
                raise OSError(f"cannot write to the cache at {self.root}: {self.disabled_reason}")
        import hashlib

        raw_meta = _dumps(
            {
                "key": key,
                "kind": kind,
                "meta": meta,
                "created": time() if created is None else created,
            }
        )
        head = _head(len(raw_meta), size) + raw_meta
        check = _blake2b(head, digest_size=_DIGEST)
        sha = hashlib.sha256()
        path = self.path_for(key)
        tmp = None
        done = False
        try:
            try:
                os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
                fd, tmp = _fs.create_temp(path)
            except OSError as exc:
                self._disable(exc, "cannot write to")
                raise
            try:
                _fs.write_all(fd, head)
                n = 0
                for chunk in chunks:
                    n += len(chunk)
                    if n > size:
                        return f"its payload is longer than its recorded size {size}"
                    check.update(chunk)
                    sha.update(chunk)
                    _fs.write_all(fd, chunk)
                if n != size:
                    return f"size {n} != recorded {size} (truncated?)"
                if sha256 is not None and sha.hexdigest() != sha256:
                    return "SHA-256 mismatch (damaged)"
                _fs.write_all(fd, check.digest())
                if size:
                    os.fsync(fd)
            except OSError as exc:
                self._disable(exc, "cannot write to")
                raise
            finally:
                os.close(fd)
            try:
                os.replace(tmp, path)
            except OSError as exc:
                if not _remove(path):
                    self._disable(exc, "cannot write to")
                    raise
                os.replace(tmp, path)  # a directory was in its place: removed
            done = True
        finally:
            if not done and tmp is not None:
                _fs.unlink(tmp)
        self.puts += 1
        self._journal_append(
            f"P\t{key}\t{len(head) + size + _DIGEST}\t{time():.3f}\t{_field(kind)}\t"
            f"{_field(meta.get('name'))}\t{_field(meta.get('arch'))}\n"
        )
        self._record("put", kind, meta.get("name"), size)
        if self.max_bytes >= 0:
            self._maybe_evict()
        return None

    def has(self, key: str) -> bool:
        """Whether a well-formed entry is stored under ``key`` (its header and metadata are
        checked, not its checksum; nothing is counted or refreshed)."""
        path = self.path_for(key)
        try:
            size = os.lstat(path).st_size
        except OSError:
            return False
        info = _read_info(path, size)
        return info is not None and info.get("key") == key

    def delete(self, key: str) -> bool:
        if _remove(self.path_for(key)):
            self._journal_append(f"D\t{key}\n")
            return True
        return False

    # ------------------------------------------------------------------ index
    def _locked(self, path: str, *, shared: bool = False, blocking: bool = True) -> _fs.locked:
        """:class:`cuforge._fs.locked` on one of the index's lock files, after removing
        anything but a regular file in its place (damage that would otherwise stop every
        index update)."""
        import stat

        try:
            if not stat.S_ISREG(os.lstat(path).st_mode):
                _remove(path)
        except OSError:
            pass  # missing: locked() creates it
        return _fs.locked(path, shared=shared, blocking=blocking)

    def _journal_append(self, text: str) -> None:
        """Append index records (``text``: lines; they get one checksum line, and go in
        one ``write``). A missing journal is rebuilt by a scan (which sees them); one that
        cannot be appended to is removed, so that the next reader rebuilds it."""
        lines = text.split("\n")
        if lines and not lines[-1]:
            lines.pop()
        data = _batch(lines)
        missing = False
        try:
            with self._locked(self._index_lock, shared=True):
                try:
                    _fs.append_line(self._journal, data, create=False)
                except FileNotFoundError:
                    missing = True
                except OSError:
                    # full disk, a FIFO or a directory in its place: never leave a journal
                    # that lacks this line (the cap would undercount); readers rebuild it
                    _remove(self._journal)
        except OSError:
            return  # no index dir (read-only cache): stats fall back to a scan
        if missing:
            self.rebuild_index()

    def _load_index(self, *, rebuild: bool = True, copy: bool = True) -> dict[str, tuple]:
        """Bring the in-memory copy of the journal up to date (reads only what is new).
        A damaged journal is rebuilt from the entries. Returns a copy (other threads may
        update the live one) unless ``copy`` is False."""
        for attempt in (0, 1):
            try:
                fd = _fs.open_regular(self._journal)
            except FileNotFoundError:
                if not rebuild or attempt or self.rebuild_index() is None:
                    return self._scan_index()
                continue
            except OSError as exc:
                if _not_regular(exc) and rebuild and not attempt:
                    self._journal_damaged("it is not a regular file")
                    _remove(self._journal)
                    if self.rebuild_index() is not None:
                        continue
                return self._scan_index()
            try:
                with self._lock:
                    damage = self._read_journal(fd)
                    if damage is None:
                        return dict(self._idx) if copy else self._idx
                    self._idx, self._idx_ino = {}, None
                    self._idx_off = self._idx_lines = self._idx_bytes = 0
            finally:
                os.close(fd)
            if not rebuild or attempt:
                return self._scan_index()
            if damage:
                self._journal_damaged(damage)
            if self.rebuild_index() is None:
                return self._scan_index()
        return self._scan_index()  # pragma: no cover - the loop always returns

    def _read_journal(self, fd: int) -> str | None:
        """Apply what is new in the journal open on ``fd`` (under ``self._lock``). Returns
        None, or why the journal must be rebuilt ("" for an old format: no warning)."""
        st = os.fstat(fd)
        ident = (st.st_dev, st.st_ino)
        if ident != self._idx_ino or st.st_size < self._idx_off:
            self._idx, self._idx_ino = {}, ident
            self._idx_off = self._idx_lines = self._idx_bytes = 0
        if st.st_size <= self._idx_off:
            # a journal is never empty (it is created whole, header first)
            return "it is empty" if st.st_size == 0 else None
        os.lseek(fd, self._idx_off, 0)
        data = _read_all(fd)
        if b"\0" in data:
            return "it holds NUL bytes"
        used, damage = self._apply(data, first=self._idx_off == 0)
        self._idx_off += used
        return damage

    def _apply(self, data: bytes, *, first: bool) -> tuple[int, str | None]:
        """Apply the complete, checksummed record batches at the start of ``data`` (the
        journal from ``self._idx_off``; ``first``: from its start). Returns (bytes used,
        None), or (_, why the journal is damaged: "" for an older format) -- the caller
        then drops the partly updated index and rebuilds it."""
        from zlib import crc32

        off = 0
        if first:
            if not data.startswith(_JOURNAL_HEADER_BYTES):
                if data.startswith(b"H\t"):
                    return 0, ""
                return 0, "its first line is not the header"
        good: list[bytes] = []  # the verified batches' records (one decode, one split)
        damage = None
        find = data.find
        while True:
            i = find(b"\nC\t", off)
            if i < 0:
                break
            j = find(b"\n", i + 1)
            if j < 0:
                break  # its checksum line is still being written
            batch = data[off : i + 1]
            check = data[i + 3 : j]
            try:
                bad = len(check) != 8 or crc32(batch) != int(check, 16)
            except ValueError:
                bad = True
            if bad:
                damage = f"the records at byte {self._idx_off + off} fail their checksum"
                break
            good.append(batch)
            off = j + 1
        if damage is None and len(data) - off > _MAX_PENDING:
            damage = f"{len(data) - off} bytes at its end have no checksum"
        if damage is not None:
            return off, damage
        if good:
            text = b"".join(good).decode("utf-8", "surrogateescape")
            if first:
                text = text[len(_JOURNAL_HEADER_BYTES) :]
            why = self._apply_lines(text)
            if why is not None:
                return 0, why
        return off, None

    def _apply_lines(self, text: str) -> str | None:
        """Apply checksummed record lines; returns why one is malformed instead."""
        idx = self._idx
        total = self._idx_bytes
        lines = text.split("\n")
        lines.pop()  # after the final newline
        for line in lines:
            tag = line[:2]
            if tag == "P\t":
                parts = line.split("\t")
                if len(parts) != 7:
                    return f"a record has {len(parts)} fields, not 7: {line[:80]!r}"
                try:
                    size = int(parts[2])
                    created = float(parts[3])
                except ValueError:
                    return f"a record has a bad size or time: {line[:80]!r}"
                if size < 0:
                    return f"a record has a negative size: {line[:80]!r}"
                old = idx.get(parts[1])
                if old is not None:
                    total -= old[0]
                idx[parts[1]] = (size, created, parts[4], parts[5], parts[6])
                total += size
            elif tag == "D\t":
                old = idx.pop(line[2:], None)
                if old is not None:
                    total -= old[0]
            else:
                return f"a line is not a record: {line[:80]!r}"
        self._idx_bytes = total
        self._idx_lines += len(lines)
        return None

    def _journal_damaged(self, why: str) -> None:
        self.journal_rebuilds += 1
        topic = f"journal:{self.root}"
        if topic in _warned:
            return
        _warned.add(topic)
        _logger().warning(
            "cuforge: the cache index %s was damaged (%s); rebuilt it from the entries",
            self._journal,
            why,
        )

    def check_journal(self) -> str | None:
        """Why the journal is damaged, or None when it is sound (or missing: a missing
        journal is rebuilt on the next read and is not damage). Reads all of it."""
        try:
            data = _fs.read_bytes(self._journal)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if _not_regular(exc):
                return "it is not a regular file"
            return f"it cannot be read ({exc.strerror or exc})"
        if b"\0" in data:
            return "it holds NUL bytes"
        if not data:
            return "it is empty"
        saved = (self._idx, self._idx_bytes, self._idx_lines, self._idx_off)
        self._idx, self._idx_bytes, self._idx_lines, self._idx_off = {}, 0, 0, 0
        try:
            used, why = self._apply(data, first=True)
        finally:
            self._idx, self._idx_bytes, self._idx_lines, self._idx_off = saved
        if why == "":
            return "it is of an older format"
        if why is None and used < len(data):
            return f"{len(data) - used} bytes at its end have no checksum"
        return why

    def _scan_index(self) -> dict[str, tuple]:
        """An index built by reading every entry's header (no journal: read-only cache)."""
        idx: dict[str, tuple] = {}
        total = 0
        for key, path, st in self._walk():
            info = _index_info(path, st)
            if info is None:
                continue
            idx[key] = info
            total += st.st_size
        with self._lock:
            self._idx, self._idx_ino, self._idx_off = idx, None, 0
            self._idx_bytes, self._idx_lines = total, len(idx)
        return idx

    def rebuild_index(self) -> int | None:
        """Rewrite the journal from a scan of the entries (what verify's repair does, and
        what happens to a missing or damaged journal). Returns the number of entries, or
        None when the index could not be written."""
        try:
            with self._locked(self._index_lock):
                lines = [_JOURNAL_HEADER]
                tmp_bytes: list[int] = []
                for key, path, st in self._walk(tmp_bytes):
                    info = _index_info(path, st)
                    if info is not None:
                        lines.append(_index_body(key, info))
                self._tmp_bytes = sum(tmp_bytes)
                _write_journal(self._journal, lines)
                return len(lines) - 1
        except OSError:
            return None

    def _compact_journal(self) -> None:
        """Rewrite the journal as one line per live entry (when it is mostly dead lines)."""
        try:
            with self._locked(self._index_lock, blocking=False) as held:
                if not held:
                    return  # someone else holds it; they may be compacting
                idx = self._load_index(rebuild=False)  # all of it: no one appends now
                lines = [_JOURNAL_HEADER] + [_index_body(k, v) for k, v in idx.items()]
                _write_journal(self._journal, lines)
        except OSError:
            return

    def _index_maybe_compact(self) -> None:
        if self._idx_lines > 2 * len(self._idx) + 4096:
            self._compact_journal()

    def index(self) -> dict[str, tuple]:
        """key -> (file size, created, kind, name, arch), from the index (no stat per entry)."""
        idx = self._load_index()
        self._index_maybe_compact()
        return idx

    def total_bytes(self) -> int:
        """Bytes of all entry files, from the index (no stat per entry), plus the live
        temp files as last counted."""
        self._load_index(copy=False)
        return self._idx_bytes + self._tmp_bytes

    # ------------------------------------------------------------------ eviction
    def _maybe_evict(self) -> None:
        self._load_index(copy=False)
        cap = self.max_bytes
        if self._idx_bytes * 2 > cap and monotonic() - self._tmp_checked > 60.0:
            # at least half full: count (and clean) temp files, at most once a minute
            self._clean_temp()
        if self._idx_bytes + self._tmp_bytes > cap:
            self._evict(int(cap * EVICT_TO), None, blocking=False)
        else:
            self._index_maybe_compact()

    def _evict(
        self, max_bytes: int | None, older_than: float | None, *, blocking: bool
    ) -> tuple[int, int]:
        """Remove entries unused for ``older_than`` seconds, then LRU ones until the tier
        (entries plus live temp files) holds at most ``max_bytes``. One process at a time
        (others skip or wait)."""
        removed = freed = 0
        try:
            with self._locked(self._evict_lock, blocking=blocking) as held:
                if not held:
                    return 0, 0  # another process is evicting right now
                self._clean_temp()
                idx = self._load_index()
                total = sum(info[0] for info in idx.values()) + self._tmp_bytes
                if (max_bytes is None or total <= max_bytes) and older_than is None:
                    return 0, 0
                now = time()
                gone: list[str] = []
                candidates: list[tuple[float, str, int]] = []
                for key, info in idx.items():
                    try:
                        st = os.lstat(self.path_for(key))
                    except OSError:
                        gone.append(key)  # vanished behind the index's back
                        total -= info[0]
                        continue
                    candidates.append((st.st_mtime, key, st.st_size))
                candidates.sort()
                for mtime, key, size in candidates:
                    too_old = older_than is not None and now - mtime > older_than
                    too_big = max_bytes is not None and total > max_bytes
                    if not (too_old or too_big):
                        if older_than is None:
                            break
                        continue
                    if _remove(self.path_for(key)):
                        removed += 1
                        freed += size
                    gone.append(key)
                    total -= size
                if gone:
                    self._journal_append("".join(f"D\t{k}\n" for k in gone))
                self.evictions += removed
                if removed and self.telemetry:
                    _telemetry.record(
                        self.root, "evict", tier="disk", kind="", name=None, count=removed
                    )
                self._index_maybe_compact()
        except OSError:
            return removed, freed
        return removed, freed

    def prune(
        self,
        *,
        max_bytes: int | None = None,
        older_than: float | None = None,
    ) -> tuple[int, int]:
        """Remove entries not used for ``older_than`` seconds, then least-recently-used ones
        until the tier holds at most ``max_bytes``; also stale temp files and unheld compile
        lock files. Returns (entries removed, bytes freed)."""
        self._clean_locks()
        return self._evict(max_bytes, older_than, blocking=True)

    def clear(self) -> int:
        """Remove every entry, every temp file and every unheld compile lock file. Returns
        how many entries were removed."""
        removed = 0
        for _key, path, _st in self._walk():
            if _remove(path):
                removed += 1
        self._clean_temp(max_age=0.0)
        self._clean_locks()
        try:
            with self._locked(self._index_lock):
                _write_journal(self._journal, [_JOURNAL_HEADER])
        except OSError:
            pass
        return removed

    # ------------------------------------------------------------------ scans
    def _walk(self, tmp_bytes: list[int] | None = None) -> Iterator[tuple[str, str, Any]]:
        """(key, path, lstat) of everything in an entry's place (temp files skipped; their
        sizes are appended to ``tmp_bytes`` when given). Includes non-regular files: those
        are damage (``verify`` reports them, readers skip them)."""
        try:
            level1 = list(os.scandir(self.entries_dir))
        except OSError:
            return
        for d1 in level1:
            if not d1.is_dir(follow_symlinks=False):
                continue
            try:
                level2 = list(os.scandir(d1.path))
            except OSError:
                continue
            for d2 in level2:
                if not d2.is_dir(follow_symlinks=False):
                    continue
                try:
                    files = list(os.scandir(d2.path))
                except OSError:
                    continue
                for f in files:
                    if f.name[0] == ".":
                        if tmp_bytes is not None and f.name.startswith(_fs.TMP_PREFIX):
                            try:
                                tmp_bytes.append(f.stat(follow_symlinks=False).st_size)
                            except OSError:
                                pass
                        continue
                    try:
                        st = f.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    yield f.name, f.path, st

    def _temp_files(self) -> Iterator[str]:
        """Paths of the temp files under the entries and index dirs (never followed)."""
        dirs = [self.index_dir]
        try:
            for d1 in os.scandir(self.entries_dir):
                if not d1.is_dir(follow_symlinks=False):
                    continue
                try:
                    dirs.extend(
                        d2.path for d2 in os.scandir(d1.path) if d2.is_dir(follow_symlinks=False)
                    )
                except OSError:
                    continue
        except OSError:
            pass
        for d in dirs:
            try:
                names = os.listdir(d)
            except OSError:
                continue
            for name in names:
                # ".tmp.<name>..." (cuforge._fs) and "journal.tmp.<pid>..." (older cuforge)
                if name.startswith(_fs.TMP_PREFIX) or ".tmp." in name:
                    yield os.path.join(d, name)

    def _clean_temp(self, max_age: float = STALE_TMP_SECONDS) -> int:
        """Remove temp files older than ``max_age`` (crashed writers' debris); count the
        bytes of the others toward the cap. Returns how many were removed."""
        now = time()
        count = 0
        live = 0
        for path in self._temp_files():
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if now - st.st_mtime > max_age or max_age <= 0:
                if _remove(path):
                    count += 1
                    continue
            live += st.st_size
        self._tmp_bytes = live
        self._tmp_checked = monotonic()
        return count

    def _clean_locks(self) -> int:
        """Remove compile lock files (``<root>/locks``) that no process holds, and anything
        but a regular file there. Returns how many were removed."""
        import stat

        count = 0
        try:
            shards = list(os.scandir(self.locks_dir))
        except OSError:
            return 0
        for shard in shards:
            if not shard.is_dir(follow_symlinks=False):
                count += _remove(shard.path)
                continue
            try:
                files = list(os.scandir(shard.path))
            except OSError:
                continue
            for f in files:
                try:
                    regular = stat.S_ISREG(f.stat(follow_symlinks=False).st_mode)
                except OSError:
                    continue
                if not regular:
                    count += _remove(f.path)
                    continue
                try:
                    with _fs.locked(f.path, blocking=False) as held:
                        if held and _remove(f.path):
                            count += 1
                except OSError:
                    continue
            try:
                os.rmdir(shard.path)  # only when empty
            except OSError:
                pass
        return count

    def iterate(self) -> Iterator[EntryInfo]:
        """Every well-formed entry, read from its header (meta includes name, arch, log...)."""
        for key, path, st in self._walk():
            info = _read_info(path, st.st_size)
            if info is None:
                continue
            meta = info.get("meta", {})
            yield EntryInfo(
                key,
                info.get("kind", ""),
                st.st_size,
                float(info.get("created") or st.st_mtime),
                st.st_mtime,
                meta,
            )

    def iterate_index(self) -> Iterator[EntryInfo]:
        """Every entry from the index plus one lstat (for last used): faster than iterate().
        ``meta`` holds only ``name`` and ``arch``; ``size`` is the entry file's size."""
        for key, (size, created, kind, name, arch) in self.index().items():
            try:
                mtime = os.lstat(self.path_for(key)).st_mtime
            except OSError:
                continue
            yield EntryInfo(key, kind, size, created, mtime, {"name": name, "arch": arch})

    def verify(
        self,
        *,
        repair: bool = False,
        quick: bool = False,
        progress: Callable[[int], Any] | None = None,
    ) -> VerifyReport:
        """Re-check every entry: its checksum (``quick``: header, sizes and metadata only)
        and its metadata's shape; anything but a regular file in an entry's place is
        damage too. Checks the journal's line checksums. ``repair``: remove damaged
        entries, stale temp files and non-regular files in the index dir, and rebuild the
        index. ``progress``: called with the number of entries checked so far, after each
        one (the total to expect is ``stats().entries``)."""
        import stat

        report = VerifyReport()
        report.journal = self.check_journal()
        seen: dict[str, tuple] = {}
        for key, path, st in self._walk():
            report.checked += 1
            if progress is not None:
                progress(report.checked)
            try:
                if not stat.S_ISREG(st.st_mode):
                    raise CorruptEntry("not a regular file")
                if quick:
                    info = _read_info(path, st.st_size, strict=True)
                else:
                    info, _payload = decode_entry(_fs.read_bytes(path))
                if info.get("key") != key:
                    raise CorruptEntry("entry file holds another key")
            except (OSError, CorruptEntry, KeyError, TypeError) as exc:
                report.corrupt.append(key)
                report.reasons[key] = str(exc) or type(exc).__name__
                if repair and _remove(path):
                    report.repaired += 1
                continue
            report.bytes += st.st_size
            seen[key] = _index_tuple(st.st_size, info)
        if report.journal is None:
            idx = self._load_index()
            damaged = set(report.corrupt)  # indexed or not: readers find the damage
            report.index_drift = sum(1 for k in seen if k not in idx) + sum(
                1 for k in idx if k not in seen and k not in damaged
            )
        if repair:
            report.stale_temp = self._clean_temp()
            for name in ("journal", "lock", "evict.lock"):
                path = os.path.join(self.index_dir, name)
                try:
                    if not stat.S_ISREG(os.lstat(path).st_mode):
                        _remove(path)
                except OSError:
                    pass
            if report.index_drift or report.repaired or report.journal is not None:
                report.journal_rebuilt = self.rebuild_index() is not None
            if report.corrupt:
                _logger().warning(
                    "cuforge: verify removed %d damaged cache entries from %s",
                    report.repaired,
                    self.root,
                )
        return report

    # ------------------------------------------------------------------ lookups for the CLI
    def resolve_key(self, prefix: str) -> str:
        """The key of the one entry whose key starts with ``prefix``. Raises ValueError
        (empty prefix) or LookupError (no entry, or several) with a message for people."""
        prefix = prefix.strip().lower()
        if not prefix:
            raise ValueError("give a key or a unique key prefix (see `cuforge cache ls`)")
        keys = self.index()
        if prefix in keys:
            return prefix
        found = [k for k in keys if k.startswith(prefix)]
        if not found and _is_key(prefix) and os.path.lexists(self.path_for(prefix)):
            return prefix  # present but not indexed yet
        if not found:
            raise LookupError(f"no cache entry with key {prefix!r} (see `cuforge cache ls`)")
        if len(found) > 1:
            raise LookupError(
                f"key prefix {prefix!r} is ambiguous: {len(found)} entries match "
                f"({', '.join(sorted(found)[:4])}...); give more characters"
            )
        return found[0]

    def clear_extras(self) -> list[str]:
        """Remove what ``cuforge cache clear --all`` removes besides the entries: the
        telemetry, the miss history and the toolchain probe memo. Returns what was there."""
        removed = []
        for sub in ("telemetry", "explain", "toolchain.json"):
            if _remove(os.path.join(self.root, sub)):
                removed.append(sub)
        return removed

    # ------------------------------------------------------------------ stats
    def stats(self) -> StoreStats:
        idx = self._load_index()
        self._index_maybe_compact()
        kinds: dict[str, dict[str, int]] = {}
        for size, _created, kind, _name, _arch in idx.values():
            row = kinds.get(kind)
            if row is None:
                row = kinds[kind] = {"entries": 0, "bytes": 0}
            row["entries"] += 1
            row["bytes"] += size
        process = {
            "hits": self.hits,
            "misses": self.misses,
            "puts": self.puts,
            "evictions": self.evictions,
            "corrupt": self.corrupt,
        }
        shared = None
        if self.telemetry:
            from cuforge.config import settings

            if settings().telemetry:
                shared = _telemetry.summary(self.root)["tiers"].get("disk", {})
        counters = process if shared is None else shared
        return StoreStats(
            "disk",
            entries=len(idx),
            bytes=sum(row["bytes"] for row in kinds.values()),
            hits=counters.get("hits", 0),
            misses=counters.get("misses", 0),
            puts=counters.get("puts", 0),
            evictions=counters.get("evictions", 0),
            corrupt=counters.get("corrupt", 0),
            extra={
                "root": self.root,
                "max_bytes": self.max_bytes,
                "disabled": self.disabled,
                "disabled_reason": self.disabled_reason,
                "format_version": DISK_FORMAT_VERSION,
                "kinds": kinds,
                "temp_bytes": self._tmp_bytes,
                "journal_rebuilds": self.journal_rebuilds,
                "process": process,
                "counters": "shared" if shared is not None else "process",
            },
        )

    def __repr__(self) -> str:
        state = " disabled" if self.disabled else ""
        return f"DiskStore({self.root!r}, max_bytes={self.max_bytes}{state})"


# ---------------------------------------------------------------------- filters
def entry_filter(
    *,
    name: str | None = None,
    arch: str | None = None,
    kind: str | None = None,
    hide_manifests: bool = False,
    older_than: float | None = None,
    newer_than: float | None = None,
    now: float | None = None,
) -> Callable[[EntryInfo], bool]:
    """A predicate over :class:`EntryInfo` (what ``cache ls`` and ``cache export`` select).

    ``name``: a substring of the entry's name, or a glob when it holds ``*?[``; ``arch``:
    one arch in any spelling (a fatbin matches each of its archs); ``kind``: one kind or
    "all"; ``hide_manifests``: without ``kind``, leave out manifests; ``older_than`` /
    ``newer_than``: last used more / less than that many seconds ago."""
    import fnmatch

    from cuforge.arch import normalize_arch

    want_arch = normalize_arch(arch) if arch else None
    hide = hide_manifests and kind is None
    glob = name is not None and any(c in name for c in "*?[")
    when = time() if now is None else now

    def match(info: EntryInfo) -> bool:
        if kind and kind != "all":
            if info.kind != kind:
                return False
        elif hide and info.kind == "manifest":
            return False
        meta = info.meta or {}
        if name is not None:
            entry_name = str(meta.get("name") or "")
            if not (fnmatch.fnmatch(entry_name, name) if glob else name in entry_name):
                return False
        if want_arch is not None:
            entry_arch = meta.get("arch") or ""
            if isinstance(entry_arch, (list, tuple)):
                entry_arch = " ".join(str(a) for a in entry_arch)
            # one arch, or several ("sm_80 sm_90") for a fatbin
            if want_arch not in str(entry_arch).replace(",", " ").split():
                return False
        age = when - (info.last_used or 0)
        if older_than is not None and age <= older_than:
            return False
        return not (newer_than is not None and age >= newer_than)

    return match


# ---------------------------------------------------------------------- helpers
def _field(value: Any) -> str:
    if value is None:
        return ""
    text = value if isinstance(value, str) else str(value)
    if "\t" in text or "\n" in text or "\r" in text:
        text = text.replace("\t", " ").replace("\n", " ").replace("\r", " ")
    return text


def _index_tuple(size: int, info: dict) -> tuple:
    meta = info.get("meta") or {}
    return (
        size,
        float(info.get("created") or 0.0),
        _field(info.get("kind")),
        _field(meta.get("name")),
        _field(meta.get("arch")),
    )


def _index_body(key: str, t: tuple) -> str:
    return f"P\t{key}\t{t[0]}\t{t[1]:.3f}\t{t[2]}\t{t[3]}\t{t[4]}"


def _write_journal(path: str, bodies: list[str]) -> None:
    _fs.atomic_write(path, _batch(bodies), durable=True)


def _read_all(fd: int) -> bytes:
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _read_info(
    path: str, file_size: int, *, strict: bool = False, schema: bool = True
) -> dict | None:
    """The header object of an entry file without its payload; None (or CorruptEntry /
    OSError when ``strict``) if the header is damaged or malformed (``schema=False``: its
    meta's shape is not checked) or the path is not a regular file."""
    try:
        fd = _fs.open_regular(path)
        try:
            head = os.read(fd, _HEADER)
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


def _index_info(path: str, st: Any) -> tuple | None:
    """The index tuple of whatever regular file is in an entry's place: damaged and
    malformed ones too (their bytes count toward the cap, and eviction can remove them;
    a read or ``verify`` finds the damage). None for anything but a regular file."""
    import stat

    if not stat.S_ISREG(st.st_mode):
        return None
    info = _read_info(path, st.st_size, schema=False)
    if info is None:
        return (st.st_size, float(st.st_mtime), "", "", "")
    return _index_tuple(st.st_size, info)
