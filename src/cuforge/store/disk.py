"""The disk tier: the embedded, persistent default.

Layout under ``root`` (created with mode 0700)::

    <root>/v1/entries/ab/cd/<key>   one file per entry
    <root>/v1/index/journal         append-only index: one line per put / delete
    <root>/v1/index/lock            flock: shared by appenders, exclusive for compaction
    <root>/v1/index/evict.lock      flock: one evicting / pruning process at a time
    <root>/telemetry/               hit / miss counters (see :mod:`cuforge.store.telemetry`)

An entry file (format :data:`DISK_FORMAT_VERSION`), all integers little-endian::

    b"CUFG" u32(version) u32(len(meta)) u64(len(payload)) meta payload digest

``meta`` is UTF-8 JSON ``{"key", "kind", "meta", "created"}`` (no pickle anywhere) and
``digest`` is the 32-byte BLAKE2b of everything before it. Every read checks the magic,
the version, the lengths against the file size and the digest; a damaged entry is a
miss: it is deleted and a warning is logged to the ``cuforge`` logger.

Writes go to a temp file in the entry's own directory, are fsynced and then
``os.replace``d into place, so readers see the old entry or the new one, never part of
one. A hit refreshes the file's mtime, which is the entry's "last used" time.

The journal makes ``stats()`` / ``total_bytes()`` cheap on a big cache: it is read
incrementally (only the bytes appended since the last call) and compacted to one line
per live entry when it holds many dead lines. When it is missing it is rebuilt by a scan.

When a put takes the tier over ``max_bytes``, the least recently used entries are removed
until the tier is under 90% of the cap, by one process at a time.

A directory that cannot be created or written, or a full disk, turns the tier into a
no-op for writes (``disabled`` becomes True) after ONE warning that names the directory
and the fix. Reads of what is there still work.

Import cost matters here (a warm hit in a fresh process must take well under a
millisecond): this module imports only builtin modules at load time; ``json`` (which
pulls in ``re``), ``fcntl``, ``filelock`` and ``logging`` are imported where needed.
"""

from __future__ import annotations

import os
from _thread import allocate_lock, get_ident
from time import time

from cuforge._fastjson import loads as _loads
from cuforge.store import telemetry as _telemetry
from cuforge.store.base import Entry, EntryInfo, Store, StoreStats

TYPE_CHECKING = False  # not `typing.TYPE_CHECKING`: importing typing costs ~10 ms
if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Iterator
    from typing import Any


__all__ = ["DiskStore", "VerifyReport", "DISK_FORMAT_VERSION", "encode_entry", "decode_entry"]

#: Version of the entry file format and of the layout. The CLI's export/import checks it.
DISK_FORMAT_VERSION = 1
_MAGIC = b"CUFG"
_HEADER = 20  # magic 4 + version 4 + meta length 4 + payload length 8
_DIGEST = 32
_VERSION_BYTES = DISK_FORMAT_VERSION.to_bytes(4, "little")
#: evict down to this fraction of the cap, so that a full cache does not evict on every put
EVICT_TO = 0.9
#: temp files older than this are debris of a crashed writer
_STALE_TMP_SECONDS = 3600.0

try:
    from _blake2 import blake2b as _blake2b
except ImportError:  # pragma: no cover - a Python without the builtin module
    from hashlib import blake2b as _blake2b


def _digest(data) -> bytes:
    return _blake2b(data, digest_size=_DIGEST).digest()


def _dumps(obj: Any) -> bytes:
    import json

    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=True).encode()


class CorruptEntry(Exception):
    """An entry file that failed its checks (the message says which)."""


def encode_entry(entry: Entry, created: float | None = None) -> bytes:
    """The bytes of an entry file for ``entry`` (used by put and by the CLI's import)."""
    meta = _dumps(
        {
            "key": entry.key,
            "kind": entry.kind,
            "meta": entry.meta,
            "created": time() if created is None else created,
        }
    )
    payload = bytes(entry.payload)
    head = (
        _MAGIC
        + _VERSION_BYTES
        + len(meta).to_bytes(4, "little")
        + len(payload).to_bytes(8, "little")
    )
    body = head + meta + payload
    return body + _digest(body)


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


def _parse_meta(raw: bytes) -> dict:
    try:
        obj = _loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise CorruptEntry(f"bad metadata: {exc}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("meta"), dict):
        raise CorruptEntry("bad metadata")
    return obj


def decode_entry(data: bytes) -> tuple[dict, bytes]:
    """(header object ``{"key","kind","meta","created"}``, payload) of a whole entry file.

    Raises :class:`CorruptEntry` on any damage."""
    meta_len, payload_len = _parse_header(data, len(data))
    view = memoryview(data)
    if _digest(view[:-_DIGEST]) != data[-_DIGEST:]:
        raise CorruptEntry("checksum mismatch")
    end = _HEADER + meta_len
    obj = _parse_meta(data[_HEADER:end])
    return obj, data[end : end + payload_len]


class VerifyReport:
    """What :meth:`DiskStore.verify` found. ``corrupt``: keys (file names) of damaged
    entries; ``repaired``: how many of them were removed (``repair=True``);
    ``index_drift``: entries the index disagreed about (fixed by ``repair=True``)."""

    __slots__ = ("checked", "corrupt", "repaired", "bytes", "index_drift", "stale_temp")

    def __init__(self) -> None:
        self.checked = 0
        self.corrupt: list[str] = []
        self.repaired = 0
        self.bytes = 0
        self.index_drift = 0
        self.stale_temp = 0

    @property
    def ok(self) -> bool:
        return not self.corrupt

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}

    def __repr__(self) -> str:
        return f"VerifyReport({self.as_dict()})"


# Roots this process has already warned about: one warning per directory, ever.
_warned: set[str] = set()


def _logger():
    import logging

    return logging.getLogger("cuforge")


def _is_key(name: str) -> bool:
    return bool(name) and name[0] != "." and "/" not in name and "\0" not in name


class DiskStore(Store):
    """A persistent, size-capped, checksummed, multi-process-safe tier. See the module doc."""

    tier = "disk"

    def __init__(self, root: str, max_bytes: int, *, telemetry: bool = True) -> None:
        self.root = os.path.abspath(os.path.expanduser(root))
        self.max_bytes = int(max_bytes)
        self.telemetry = telemetry
        self.disabled = False
        self.disabled_reason: str | None = None
        base = os.path.join(self.root, f"v{DISK_FORMAT_VERSION}")
        self.entries_dir = os.path.join(base, "entries")
        self.index_dir = os.path.join(base, "index")
        self._prefix = self.entries_dir + "/"
        self._journal = os.path.join(self.index_dir, "journal")
        self._lock = allocate_lock()
        # the journal as read so far
        self._idx: dict[str, tuple] = {}
        self._idx_ino: tuple[int, int] | None = None
        self._idx_off = 0
        self._idx_lines = 0
        self._idx_bytes = 0
        # this process's counters (stats() reports shared telemetry when it is on)
        self.hits = self.misses = self.puts = self.evictions = self.corrupt = 0
        self._tmp_counter = 0
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
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            reason = f"the disk holding {self.root} is full ({exc.strerror})"
            fix = (
                "free space on that disk, lower CUFORGE_CACHE_MAX_BYTES, or set "
                "CUFORGE_CACHE_DIR to a directory on another disk"
            )
        else:
            reason = f"{what} {where}: {exc.strerror or exc}"
            fix = (
                f"make {self.root} writable by this user, or set CUFORGE_CACHE_DIR to a "
                "writable directory"
            )
        self.disabled_reason = reason
        if self.root in _warned:
            return
        _warned.add(self.root)
        _logger().warning(
            "cuforge: disk cache disabled: %s. Compiles still work but their results are not "
            "saved to disk. Fix: %s (or set CUFORGE_DISABLE_FILE_CACHE=1 to cache in memory "
            "only and silence this warning).",
            reason,
            fix,
        )

    def _record(self, event: str, kind: str, name: Any, nbytes: int = 0, seconds: Any = 0.0):
        if self.telemetry:
            _telemetry.record(
                self.root,
                event,
                tier="disk",
                kind=kind,
                name=name if isinstance(name, str) else None,
                nbytes=nbytes,
                seconds_saved=seconds if isinstance(seconds, (int, float)) else 0.0,
            )

    # ------------------------------------------------------------------ get
    def get(self, key: str) -> Entry | None:
        path = self.path_for(key)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
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
        """Like :meth:`get`, without refreshing last-used, counting, or deleting damage."""
        try:
            with open(self.path_for(key), "rb") as f:
                data = f.read()
            obj, payload = decode_entry(data)
        except (OSError, CorruptEntry):
            return None
        meta = obj["meta"]
        meta["size"] = len(payload)
        meta["created"] = obj.get("created")
        try:
            meta["last_used"] = os.stat(self.path_for(key)).st_mtime
        except OSError:
            meta["last_used"] = obj.get("created")
        return Entry(key, obj["kind"], payload, meta)

    def _corrupt(self, key: str, path: str, reason: str) -> None:
        self.misses += 1
        self.corrupt += 1
        removed = _unlink(path)
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
    def put(self, entry: Entry) -> bool:
        if self.disabled:
            return False
        path = self.path_for(entry.key)
        data = encode_entry(entry)
        directory = path[: path.rfind("/")]
        with self._lock:
            self._tmp_counter += 1
            tmp = f"{directory}/.tmp.{entry.key}.{os.getpid()}.{get_ident()}.{self._tmp_counter}"
        # An entry without a payload (a direct-mode manifest) is a hint: losing it to a
        # crash costs one compile and the checksum catches a torn one, so it skips fsync.
        durable = bool(entry.payload)
        for attempt in (0, 1):
            try:
                _write_file(tmp, data, directory, durable=durable)
                os.replace(tmp, path)
                break
            except FileNotFoundError as exc:
                # the shard directory vanished under us (a concurrent clear): once more
                _unlink(tmp)
                if attempt:
                    self._disable(exc, "cannot write to")
                    return False
            except OSError as exc:
                _unlink(tmp)
                self._disable(exc, "cannot write to")
                return False
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

    def delete(self, key: str) -> bool:
        if _unlink(self.path_for(key)):
            self._journal_append(f"D\t{key}\n")
            return True
        return False

    # ------------------------------------------------------------------ index
    def _journal_append(self, text: str) -> None:
        """Append index lines; a missing journal is rebuilt by a scan (which sees them)."""
        import fcntl

        try:
            lock_fd = os.open(
                os.path.join(self.index_dir, "lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600
            )
        except OSError:
            return  # no index dir (read-only cache): stats fall back to a scan
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_SH)
            try:
                fd = os.open(self._journal, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
            except FileNotFoundError:
                fd = -1
            if fd >= 0:
                try:
                    os.write(fd, text.encode("utf-8", "surrogateescape"))
                finally:
                    os.close(fd)
        except OSError:
            return
        finally:
            os.close(lock_fd)  # closing drops the flock too
        if fd < 0:
            self.rebuild_index()

    def _load_index(self, *, rebuild: bool = True, copy: bool = True) -> dict[str, tuple]:
        """Bring the in-memory copy of the journal up to date (reads only what is new).
        Returns a copy (other threads may update the live one) unless ``copy`` is False."""
        try:
            fd = os.open(self._journal, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            if not rebuild or self.rebuild_index() is None:
                return self._scan_index()
            try:
                fd = os.open(self._journal, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return dict(self._idx)
        except OSError:
            return self._scan_index()
        try:
            with self._lock:
                st = os.fstat(fd)
                ident = (st.st_dev, st.st_ino)
                if ident != self._idx_ino or st.st_size < self._idx_off:
                    self._idx, self._idx_ino = {}, ident
                    self._idx_off = self._idx_lines = self._idx_bytes = 0
                if st.st_size > self._idx_off:
                    os.lseek(fd, self._idx_off, 0)
                    data = _read_all(fd)
                    end = data.rfind(b"\n") + 1  # a line being written is not complete yet
                    if end:
                        self._apply(data[:end])
                        self._idx_off += end
                return dict(self._idx) if copy else self._idx
        finally:
            os.close(fd)

    def _apply(self, data: bytes) -> None:
        idx = self._idx
        total = self._idx_bytes
        lines = data.decode("utf-8", "surrogateescape").split("\n")
        lines.pop()  # after the final newline
        for line in lines:
            tag = line[:2]
            if tag == "P\t":
                parts = line.split("\t")
                if len(parts) < 7:
                    continue
                try:
                    size = int(parts[2])
                    created = float(parts[3])
                except ValueError:
                    continue
                old = idx.get(parts[1])
                if old is not None:
                    total -= old[0]
                idx[parts[1]] = (size, created, parts[4], parts[5], parts[6])
                total += size
            elif tag == "D\t":
                old = idx.pop(line[2:], None)
                if old is not None:
                    total -= old[0]
        self._idx_bytes = total
        self._idx_lines += len(lines)

    def _scan_index(self) -> dict[str, tuple]:
        """An index built by reading every entry's header (no journal: read-only cache)."""
        idx: dict[str, tuple] = {}
        total = 0
        for key, path, st in self._walk():
            info = _read_info(path, st.st_size)
            if info is None:
                continue
            idx[key] = _index_tuple(st.st_size, info)
            total += st.st_size
        with self._lock:
            self._idx, self._idx_ino, self._idx_off = idx, None, 0
            self._idx_bytes, self._idx_lines = total, len(idx)
        return idx

    def rebuild_index(self) -> int | None:
        """Rewrite the journal from a scan of the entries (what verify's repair does).
        Returns the number of entries, or None when the index could not be written."""
        import fcntl

        try:
            lock_fd = os.open(
                os.path.join(self.index_dir, "lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600
            )
        except OSError:
            return None
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            lines = ["H\t1\n"]
            for key, path, st in self._walk():
                info = _read_info(path, st.st_size)
                if info is not None:
                    lines.append(_index_line(key, _index_tuple(st.st_size, info)))
            _write_atomic(self._journal, "".join(lines).encode("utf-8", "surrogateescape"))
            return len(lines) - 1
        except OSError:
            return None
        finally:
            os.close(lock_fd)

    def _compact_journal(self) -> None:
        """Rewrite the journal as one line per live entry (when it is mostly dead lines)."""
        import fcntl

        try:
            lock_fd = os.open(
                os.path.join(self.index_dir, "lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600
            )
        except OSError:
            return
        try:
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return  # someone else holds it; they may be compacting
            idx = self._load_index(rebuild=False)  # all of it: no one appends now
            text = "H\t1\n" + "".join(_index_line(k, v) for k, v in idx.items())
            _write_atomic(self._journal, text.encode("utf-8", "surrogateescape"))
        except OSError:
            return
        finally:
            os.close(lock_fd)

    def _index_maybe_compact(self) -> None:
        if self._idx_lines > 2 * len(self._idx) + 4096:
            self._compact_journal()

    def index(self) -> dict[str, tuple]:
        """key -> (file size, created, kind, name, arch), from the index (no stat per entry)."""
        idx = self._load_index()
        self._index_maybe_compact()
        return idx

    def total_bytes(self) -> int:
        """Bytes of all entry files, from the index (no stat per entry)."""
        self._load_index(copy=False)
        return self._idx_bytes

    # ------------------------------------------------------------------ eviction
    def _maybe_evict(self) -> None:
        self._load_index(copy=False)
        if self._idx_bytes > self.max_bytes:
            self._evict(int(self.max_bytes * EVICT_TO), None, blocking=False)
        else:
            self._index_maybe_compact()

    def _evict(
        self, max_bytes: int | None, older_than: float | None, *, blocking: bool
    ) -> tuple[int, int]:
        """Remove entries unused for ``older_than`` seconds, then LRU ones until the tier
        holds at most ``max_bytes``. One process at a time (others skip or wait)."""
        import fcntl

        try:
            lock_fd = os.open(
                os.path.join(self.index_dir, "evict.lock"),
                os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                0o600,
            )
        except OSError:
            return 0, 0
        removed = freed = 0
        try:
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
            except OSError:
                return 0, 0  # another process is evicting right now
            idx = self._load_index()
            total = sum(info[0] for info in idx.values())
            if (max_bytes is None or total <= max_bytes) and older_than is None:
                return 0, 0
            now = time()
            gone: list[str] = []
            candidates: list[tuple[float, str, int]] = []
            for key, info in idx.items():
                try:
                    st = os.stat(self.path_for(key))
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
                if _unlink(self.path_for(key)):
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
        finally:
            os.close(lock_fd)
        return removed, freed

    def prune(
        self, *, max_bytes: int | None = None, older_than: float | None = None
    ) -> tuple[int, int]:
        """Remove entries not used for ``older_than`` seconds, then least-recently-used ones
        until the tier holds at most ``max_bytes``. Returns (entries removed, bytes freed)."""
        self._clean_temp()
        return self._evict(max_bytes, older_than, blocking=True)

    def clear(self) -> int:
        """Remove every entry. Returns how many were removed."""
        import fcntl

        removed = 0
        for _key, path, _st in self._walk():
            if _unlink(path):
                removed += 1
        self._clean_temp(max_age=0.0)
        try:
            lock_fd = os.open(
                os.path.join(self.index_dir, "lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600
            )
        except OSError:
            return removed
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            _write_atomic(self._journal, b"H\t1\n")
        except OSError:
            pass
        finally:
            os.close(lock_fd)
        return removed

    # ------------------------------------------------------------------ scans
    def _walk(self) -> Iterator[tuple[str, str, os.stat_result]]:
        """(key, path, stat) of every entry file (temp files skipped)."""
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
                        continue
                    try:
                        st = f.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    yield f.name, f.path, st

    def _clean_temp(self, max_age: float = _STALE_TMP_SECONDS) -> int:
        """Remove temp files that crashed writers left behind."""
        now = time()
        count = 0
        try:
            level1 = list(os.scandir(self.entries_dir))
        except OSError:
            return 0
        for d1 in level1:
            try:
                for d2 in os.scandir(d1.path):
                    for f in os.scandir(d2.path):
                        if f.name.startswith(".tmp."):
                            try:
                                if now - f.stat().st_mtime > max_age and _unlink(f.path):
                                    count += 1
                            except OSError:
                                pass
            except OSError:
                continue
        return count

    def iterate(self) -> Iterator[EntryInfo]:
        """Every entry, read from its header (meta includes name, arch, log, ...)."""
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
        """Every entry from the index plus one stat (for last used): faster than iterate().
        ``meta`` holds only ``name`` and ``arch``; ``size`` is the entry file's size."""
        for key, (size, created, kind, name, arch) in self.index().items():
            try:
                mtime = os.stat(self.path_for(key)).st_mtime
            except OSError:
                continue
            yield EntryInfo(key, kind, size, created, mtime, {"name": name, "arch": arch})

    def verify(self, *, repair: bool = False, quick: bool = False, progress=None) -> VerifyReport:
        """Re-check every entry (``quick``: header, sizes and metadata, not the checksum).
        ``repair``: delete damaged entries, stale temp files, and rebuild the index.
        ``progress``: called with the number of entries checked so far, after each one
        (the total to expect is ``stats().entries``)."""
        report = VerifyReport()
        seen: dict[str, tuple] = {}
        for key, path, st in self._walk():
            report.checked += 1
            if progress is not None:
                progress(report.checked)
            try:
                if quick:
                    info = _read_info(path, st.st_size, strict=True)
                else:
                    with open(path, "rb") as f:
                        info, _payload = decode_entry(f.read())
                if info.get("key") != key:
                    raise CorruptEntry("entry file holds another key")
            except (OSError, CorruptEntry, KeyError, TypeError):
                report.corrupt.append(key)
                if repair and _unlink(path):
                    report.repaired += 1
                continue
            report.bytes += st.st_size
            seen[key] = _index_tuple(st.st_size, info)
        idx = self._load_index()
        report.index_drift = sum(1 for k in seen if k not in idx) + sum(
            1 for k in idx if k not in seen
        )
        if repair:
            report.stale_temp = self._clean_temp()
            if report.index_drift or report.repaired:
                self.rebuild_index()
            if report.corrupt:
                _logger().warning(
                    "cuforge: verify removed %d damaged cache entries from %s",
                    report.repaired,
                    self.root,
                )
        return report

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
                "process": process,
                "counters": "shared" if shared is not None else "process",
            },
        )

    def __repr__(self) -> str:
        state = " disabled" if self.disabled else ""
        return f"DiskStore({self.root!r}, max_bytes={self.max_bytes}{state})"


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


def _index_line(key: str, t: tuple) -> str:
    return f"P\t{key}\t{t[0]}\t{t[1]:.3f}\t{t[2]}\t{t[3]}\t{t[4]}\n"


def _read_all(fd: int) -> bytes:
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _read_info(path: str, file_size: int, *, strict: bool = False) -> dict | None:
    """The header object of an entry file without its payload; None (or CorruptEntry when
    ``strict``) if the header is damaged."""
    try:
        with open(path, "rb") as f:
            head = f.read(_HEADER)
            meta_len, _ = _parse_header(head, file_size)
            return _parse_meta(f.read(meta_len))
    except (OSError, CorruptEntry):
        if strict:
            raise
        return None


def _write_file(path: str, data: bytes, directory: str, *, durable: bool = True) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except FileNotFoundError:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        fd = os.open(path, flags, 0o600)
    except FileExistsError:  # debris of a dead writer that had our pid and thread id
        os.unlink(path)
        fd = os.open(path, flags, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp.{os.getpid()}.{get_ident()}"
    try:
        _write_file(tmp, data, os.path.dirname(path))
        os.replace(tmp, path)
    except OSError:
        _unlink(tmp)
        raise


def _unlink(path: str) -> bool:
    try:
        os.unlink(path)
        return True
    except OSError:
        return False
