"""The disk tier: the embedded, persistent default.

Paths come from a :class:`cuforge.base.layout.CacheLayout` (created with mode 0700)::

    layout.entries/ab/cd/<key>   one file per entry (:mod:`cuforge.store.entry_codec`)
    layout.journal               append-only index (:mod:`cuforge.store.journal`)
    layout.index_lock            flock: shared by appenders, exclusive for compaction
    layout.evict_lock            flock: one evicting / pruning process at a time
    layout.locks                 compile locks (:mod:`cuforge.store.single_flight`)
    layout.telemetry             hit / miss counters (see :mod:`cuforge.store.telemetry`)

The tier is three objects: the entry codec (one entry file's bytes: header, checksum,
metadata, payload), the :class:`~cuforge.store.journal.Journal` (the index of the
entries, its lock and its format) and :class:`DiskStore`, which reads and writes entries,
keeps the journal in step and rebuilds it from a scan when it is missing or damaged.
Upkeep (eviction, ``prune``, ``clear``, ``verify``) is :mod:`cuforge.store.upkeep`.

The size the tier reports (``stats().bytes``, :meth:`DiskStore.total_bytes`) and holds to
``max_bytes`` is its entries plus the torch extension dirs (``layout.torch_builds``,
``layout.torch_modules``: counted by :meth:`cuforge.store.upkeep.Evictor.count_torch_dirs` on a
put or ``total_bytes()`` at most once a minute, and by every eviction and ``stats()``), so that the cap bounds
what cuforge keeps under the dir; ``stats().extra["dir_bytes"]`` is all of the dir, as
``du -sb`` counts it.

Every read checks an entry file's magic, version, lengths, digest and metadata's shape
(:mod:`cuforge.store.schema`); a damaged or malformed entry is a miss: it is deleted, a
warning is logged to the ``cuforge`` logger, and the caller rebuilds it.

Files are opened through :mod:`cuforge.base._fs`: symlinks are never followed and anything
but a regular file (a FIFO, a directory, a device) in place of an entry counts as a
damaged entry, so nothing under the cache dir can make a read hang.

Writes go through :func:`cuforge.base._fs.atomic_write` (a temp file in the entry's own
directory, then ``os.replace``), so readers see the old entry or the new one, never part
of one. Entries with a payload are ``fsync``\\ ed; payload-less ones (direct-mode
manifests: a lost one costs one compile) are not. A hit refreshes the file's mtime,
which is the entry's "last used" time.

A journal that is missing, not a regular file, of an older version, or damaged is
rebuilt from a scan of the entries (which indexes damaged entry files too, so their
bytes count), so a zeroed or garbled journal can never switch the size cap off.

A directory that cannot be created or written turns the tier into a no-op for writes
(``disabled`` becomes True) after ONE warning that names the directory and the fix.
A full disk (``ENOSPC``, ``EDQUOT``) disables writes for a back-off period
(:data:`FULL_DISK_BACKOFF` seconds, doubling up to :data:`FULL_DISK_BACKOFF_MAX`),
after which the next put tries again. Reads of what is there still work.

Import cost matters here (a warm hit in a fresh process must take well under a
millisecond): this module imports only builtin modules at load time; ``json`` (which
pulls in ``re``), ``fcntl``, ``logging`` and :mod:`cuforge.store.upkeep` are imported
where needed.
"""

from __future__ import annotations

import os
from time import monotonic, time

from cuforge.base import _fs
from cuforge.base.layout import CacheLayout, is_entry_key
from cuforge.store import telemetry as _telemetry
from cuforge.store.base import Entry, EntryInfo, Store, StoreStats
from cuforge.store.entry_codec import (
    DISK_FORMAT_VERSION,
    CorruptEntry,
    decode_entry,
    encode_entry,
    read_all,
    read_info,
    remove_path,
)
from cuforge.store.entry_codec import not_regular as _not_regular
from cuforge.store.journal import JOURNAL_VERSION, Journal, index_info, put_record
from cuforge.store.schema import entry_problem

TYPE_CHECKING = False  # not `typing.TYPE_CHECKING`: importing typing costs ~10 ms
if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable, Iterator
    from typing import Any

    from cuforge.store.upkeep import Evictor, VerifyReport


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

#: seconds writes stay off after a full disk, doubling on each failed retry ...
FULL_DISK_BACKOFF = 5.0
#: ... up to this
FULL_DISK_BACKOFF_MAX = 300.0


def __getattr__(name: str) -> Any:
    # VerifyReport lives with verify in cuforge.store.upkeep, which the hit path never loads
    if name == "VerifyReport":
        from cuforge.store.upkeep import VerifyReport

        return VerifyReport
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# Roots this process has already warned about: one warning per directory and topic.
_warned: set[str] = set()


def _logger():
    import logging

    return logging.getLogger("cuforge")


class DiskStore(Store):
    """A persistent, size-capped, checksummed, multi-process-safe tier. See the module doc.

    ``root``: the cache dir, as a path or a :class:`~cuforge.base.layout.CacheLayout`
    (``layout`` then holds every path the tier uses)."""

    tier = "disk"

    def __init__(
        self, root: str | os.PathLike[str] | CacheLayout, max_bytes: int, *, telemetry: bool = True
    ) -> None:
        layout = root if isinstance(root, CacheLayout) else CacheLayout(root)
        self.layout = layout
        self.root = layout.root
        self.max_bytes = int(max_bytes)
        self.telemetry = telemetry
        self.disabled = False
        self.disabled_reason: str | None = None
        # full disk: when the next put may try again, and the back-off after that
        self._retry_at: float | None = None
        self._backoff = FULL_DISK_BACKOFF
        self.journal = Journal(layout)
        # live temp files' bytes, as last counted (they count toward the cap)
        self.tmp_bytes = 0
        self.tmp_checked = 0.0
        # the torch extension dirs' bytes, as last counted (they count toward the cap);
        # when they were counted (0: not yet in this process)
        self.torch_bytes = 0
        self.torch_checked = 0.0
        # torch dirs removed by eviction, prune and clear in this process
        self.dirs_removed = 0
        self._evictor: Evictor | None = None
        # this process's counters (stats() reports shared telemetry when it is on)
        self.hits = self.misses = self.puts = self.evictions = self.corrupt = 0
        self.journal_rebuilds = 0
        # fan-out dirs that passed the trust rule in this process (see _dir_trusted)
        self._trusted_dirs: set[str] = set()
        # inside bulk(): the journal records and entry files of the batch so far (None: no
        # batch open)
        self._batch: list[str] | None = None
        self._batch_files: list[str] = []
        self._batch_bytes = 0
        if not os.path.isdir(layout.index):  # one stat when the cache exists
            try:
                if not os.path.isdir(self.root):
                    os.makedirs(self.root, mode=0o700, exist_ok=True)
                    os.chmod(self.root, 0o700)
                os.makedirs(layout.entries, mode=0o700, exist_ok=True)
                os.makedirs(layout.index, mode=0o700, exist_ok=True)
            except OSError as exc:
                self._disable(exc, "cannot create")

    # ------------------------------------------------------------------ paths
    def path_for(self, key: str) -> str:
        """The entry file's path (``layout.entry_path``); ValueError for a non-key."""
        return self.layout.entry_path(key)

    def _dir_trusted(self, path: str) -> bool:
        """Whether every directory from the cache root to ``path``'s (the entry's fan-out
        dirs ``ab/cd`` included) passes the cache dir's trust rule. Checked once per
        fan-out dir per process: a directory that is ours and not writable by others
        stays so (only its owner or root can change that). An untrusted one is a miss,
        warned about once with the fix: its entry may have been planted."""
        directory = os.path.dirname(path)
        trusted = self._trusted_dirs
        if directory in trusted:
            return True
        # the directories between the nearest one checked before and the entry's
        unchecked = [directory]
        parent = os.path.dirname(directory)
        while parent not in trusted and parent != self.layout.root and len(unchecked) < 8:
            unchecked.append(parent)
            parent = os.path.dirname(parent)
        if parent in trusted:
            problem = None
            for d in reversed(unchecked):
                problem = self.layout._problem(d, create=False)
                if problem is not None:
                    problem = self.layout._with_recursive_fix(problem)
                    break
        else:
            problem = self.layout.trust_problem(path)
        if problem is None:
            if os.path.isdir(directory):
                trusted.update(unchecked)
                trusted.add(parent)
            elif parent == self.layout.root and os.path.isdir(self.layout.entries):
                # a fan-out dir not made yet (a fresh cache, a prefetch): the entries dir
                # passed with the rest of the path, so the next new fan-out dir checks only
                # its own two levels (two lstats), not the whole path again
                trusted.add(self.layout.entries)
            return True
        if problem not in _warned:
            _warned.add(problem)
            _logger().warning(
                "cuforge: not reading or writing %s: %s. Whoever can write a directory of "
                "the cache can make this process run their code.",
                directory,
                problem,
            )
        return False

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
        if not self._dir_trusted(path):
            self.misses += 1
            return None
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
            data = read_all(fd)
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
        removed = remove_path(path)
        if removed:
            self.journal_append([f"D\t{key}"])
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
        problem = entry_problem(entry.kind, entry.meta)
        if problem is not None:
            # it would read back as damaged (and be deleted): refuse it now, saying why
            where = f"{entry.kind}:{problem}"
            if where not in _warned:
                _warned.add(where)
                _logger().warning(
                    "cuforge: not storing a %r entry (%s): %s", entry.kind, entry.key[:16], problem
                )
            return False
        path = self.path_for(entry.key)
        if not self._dir_trusted(path):
            return False
        data = encode_entry(entry)
        # An entry without a payload (a direct-mode manifest) is a hint: losing it to a
        # crash costs one compile and the checksum catches a torn one, so it skips fsync.
        durable = durable and bool(entry.payload)
        batch = self._batch
        for attempt in (0, 1):
            try:
                # in a batch, made durable once when it ends (bulk())
                _fs.atomic_write(path, data, durable=durable and batch is None)
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
                    if remove_path(path):
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
        record = put_record(entry.key, len(data), time(), entry.kind, name, entry.meta.get("arch"))
        self._record("put", entry.kind, name, len(entry.payload))
        if batch is not None:  # appended, and the cap enforced, when the batch ends ...
            batch.append(record)
            if durable:
                self._batch_files.append(path)
            self._batch_bytes += len(data)
            # ... or every 256 entries or eighth of the cap (a pull bigger than the cap)
            if len(batch) >= 256 or (0 <= self.max_bytes < self._batch_bytes * 8):
                self._batch, self._batch_bytes = [], 0
                self.journal_append(batch)
                if self.max_bytes >= 0:
                    self._maybe_evict()
            return True
        self.journal_append([record])
        if self.max_bytes >= 0:
            self._maybe_evict()
        return True

    def bulk(self, *, durable: bool = True) -> _Bulk:
        """``with disk.bulk():`` a batch of puts (``cuforge prefetch``, ``cuforge cache
        pull``) made durable at its end instead of entry by entry.

        Inside the block each put is written as always (temp file, then an atomic rename:
        a reader sees the old entry or the new one, never part of one) but not ``fsync``\\ ed;
        its journal record is held back and the cap is checked every 256 entries (or eighth
        of the cap) only. When the block ends (normally or not) the records are appended as
        ONE journal batch, the cap is enforced, and, when ``durable``, every entry file written with a payload, then each
        directory holding one, is ``fsync``\\ ed once. (``os.sync()`` / ``syncfs`` measured
        cheaper on this CPU machine, ~22 ms against ~54 ms for 125 entries, but they also wait
        for every other writer's dirty pages, say a service downloading its weights while it
        prefetches: this cost is bounded by the batch's own files.) A crash inside the block
        can leave an entry torn or missing: every read checks the checksum, so that is a miss
        (fetched again), never wrong code. Batches do not nest: an inner ``bulk()`` joins the
        outer one."""
        return _Bulk(self, durable)

    def _end_batch(self, durable: bool) -> None:
        records, files = self._batch or [], self._batch_files
        self._batch, self._batch_files, self._batch_bytes = None, [], 0
        if records:
            self.journal_append(records)
        if durable and files:
            _fsync_all(files)
        if records and self.max_bytes >= 0:
            self._maybe_evict()

    def _maybe_evict(self) -> None:
        self.load_index(copy=False)
        self._count_torch_dirs_once()
        used, cap = self.journal.bytes + self.torch_bytes, self.max_bytes
        if used * 2 > cap or used + self.tmp_bytes > cap or self.journal.needs_compaction():
            self.evictor.maybe_evict()

    def _count_torch_dirs_once(self) -> None:
        """Count the torch dirs when this process has not in the last minute (one stat
        when there are none)."""
        if self.torch_checked and monotonic() - self.torch_checked < 60.0:
            return
        if os.path.isdir(self.layout.torch):
            self.evictor.count_torch_dirs()
        else:
            self.torch_checked = monotonic()

    def touch(self, key: str) -> bool:
        """Count a hit on ``key`` and refresh its last use without reading its payload,
        for a caller that serves a copy of the payload it checked another way (a torch
        warm load checks the module file's digest). Reads the entry's header only: the
        hit is credited with the entry's build seconds (``compile_seconds``). False when
        there is no well-formed entry under ``key``."""
        found = self._header(key)
        if found is None:
            return False
        path, size, info = found
        try:
            os.utime(path)  # "last used", for LRU eviction
        except OSError:
            pass  # a read-only cache still serves hits
        meta = info.get("meta") or {}
        self.hits += 1
        self._record(
            "hit", info.get("kind", ""), meta.get("name"), size, meta.get("compile_seconds", 0)
        )
        return True

    def has(self, key: str) -> bool:
        """Whether a well-formed entry is stored under ``key`` (its header and metadata are
        checked, not its checksum; nothing is counted or refreshed)."""
        return self._header(key) is not None

    def _header(self, key: str) -> tuple[str, int, dict] | None:
        """(path, file size, header object) of the well-formed entry under ``key``."""
        path = self.path_for(key)
        try:
            size = os.lstat(path).st_size
        except OSError:
            return None
        info = read_info(path, size)
        return (path, size, info) if info is not None and info.get("key") == key else None

    def delete(self, key: str) -> bool:
        if remove_path(self.path_for(key)):
            self.journal_append([f"D\t{key}"])
            return True
        return False

    # ------------------------------------------------------------------ index
    def journal_append(self, bodies: list[str]) -> None:
        """Append index records to the journal; a missing journal is rebuilt by a scan
        (which sees them)."""
        if self.journal.append(bodies):
            self.rebuild_index()

    def load_index(self, *, rebuild: bool = True, copy: bool = True) -> dict[str, tuple]:
        """Bring the in-memory copy of the journal up to date (reads only what is new).
        A damaged journal is rebuilt from the entries. Returns a copy (other threads may
        update the live one) unless ``copy`` is False."""
        journal = self.journal
        for attempt in (0, 1):
            try:
                fd = _fs.open_regular(journal.path)
            except FileNotFoundError:
                if not rebuild or attempt or self.rebuild_index() is None:
                    return self._scan_index()
                continue
            except OSError as exc:
                if _not_regular(exc) and rebuild and not attempt:
                    self._journal_damaged("it is not a regular file")
                    remove_path(journal.path)
                    if self.rebuild_index() is not None:
                        continue
                return self._scan_index()
            try:
                with journal.mutex:
                    damage = journal.read_new(fd)
                    if damage is None:
                        return dict(journal.idx) if copy else journal.idx
                    journal.reset()
            finally:
                os.close(fd)
            if not rebuild or attempt:
                return self._scan_index()
            if damage:
                self._journal_damaged(damage)
            if self.rebuild_index() is None:
                return self._scan_index()
        return self._scan_index()  # pragma: no cover - the loop always returns

    def _journal_damaged(self, why: str) -> None:
        self.journal_rebuilds += 1
        topic = f"journal:{self.root}"
        if topic in _warned:
            return
        _warned.add(topic)
        _logger().warning(
            "cuforge: the cache index %s was damaged (%s); rebuilt it from the entries",
            self.journal.path,
            why,
        )

    def check_journal(self) -> str | None:
        """Why the journal is damaged, or None when it is sound (or missing)."""
        return self.journal.check()

    def _scan_index(self) -> dict[str, tuple]:
        """An index built by reading every entry's header (no journal: read-only cache)."""
        idx: dict[str, tuple] = {}
        total = 0
        for key, path, st in self.walk():
            info = index_info(path, st)
            if info is None:
                continue
            idx[key] = info
            total += st.st_size
        with self.journal.mutex:
            self.journal.reset(idx, total)
        return idx

    def rebuild_index(self) -> int | None:
        """Rewrite the journal from a scan of the entries (what verify's repair does, and
        what happens to a missing or damaged journal). Returns the number of entries, or
        None when the index could not be written."""
        try:
            with self.journal.locked():
                rows: list[tuple[str, tuple]] = []
                tmp_bytes: list[int] = []
                for key, path, st in self.walk(tmp_bytes):
                    info = index_info(path, st)
                    if info is not None:
                        rows.append((key, info))
                self.tmp_bytes = sum(tmp_bytes)
                self.journal.write(rows)
                return len(rows)
        except OSError:
            return None

    def index_drift(self) -> str | None:
        """Why the index does not list the entry files on disk, or None. Cheap: a fan-out
        dir (``ab/cd``) changed since the journal was last written (its ctime, which
        copying or removing a file there sets and which no one can set back, is later than
        the journal's mtime: cuforge writes the journal after each change it makes there)
        is listed, and the entry files in it are counted against the index's records for
        it; the others cost one stat each (100,000 entries: ~0.45 s). A fan-out dir removed
        since, that the index has records for, is drift too. Names only: no stat and no read per entry; a name that is not an
        entry key, or not in its key's dir, is never an entry and not counted."""
        idx = self.load_index()
        try:
            since = os.stat(self.journal.path).st_mtime_ns
        except OSError:
            return None  # no journal: the index was read from the entries themselves
        listed: dict[str, int] = {}
        for key in idx:
            if is_entry_key(key):  # a stray name is never an entry (eviction drops it)
                shard = key[:4]
                listed[shard] = listed.get(shard, 0) + 1
        present: set[str] = set()
        changed: set[str] = set()  # first-level dirs changed (a fan-out dir added, removed)
        differ: dict[str, int] = {}  # changed fan-out dir -> entry files in it
        try:
            top = os.stat(self.layout.entries).st_ctime_ns > since
            level1 = list(os.scandir(self.layout.entries))
        except OSError:
            top, level1 = True, []
        for d1 in level1:
            try:
                if not d1.is_dir(follow_symlinks=False):
                    continue
                whole = d1.stat(follow_symlinks=False).st_ctime_ns > since
                if whole:
                    changed.add(d1.name)
                level2 = list(os.scandir(d1.path))
            except OSError:
                continue
            for d2 in level2:
                shard = d1.name + d2.name
                try:
                    if not d2.is_dir(follow_symlinks=False):
                        continue
                    present.add(shard)
                    if not whole and d2.stat(follow_symlinks=False).st_ctime_ns <= since:
                        continue  # unchanged since the journal was written
                    with os.scandir(d2.path) as it:
                        # an entry's file: a regular file named by its key, in its own dir
                        n = sum(
                            1
                            for f in it
                            if f.name.startswith(shard)
                            and is_entry_key(f.name)
                            and f.is_file(follow_symlinks=False)
                        )
                except OSError:
                    continue
                if n != listed.get(shard, 0):
                    differ[shard] = n
        for shard in listed:
            if shard not in present and (top or shard[:2] in changed):
                differ[shard] = 0  # removed behind the index's back
        if not differ:
            return None
        on_disk = sum(differ.values())
        in_index = sum(listed.get(shard, 0) for shard in differ)
        dirs = len(differ)
        return (
            f"{dirs} fan-out dir{'s' if dirs != 1 else ''} changed behind it: "
            f"{on_disk} entry file{'s' if on_disk != 1 else ''} there, "
            f"the index lists {in_index}"
        )

    def sync_index(self) -> str | None:
        """Rebuild the index from a walk of the entries when it is out of date with them
        (:meth:`index_drift`); returns why it was rebuilt, or None when it was not."""
        why = self.index_drift()
        if why is None:
            return None
        self.journal_rebuilds += 1
        if self.rebuild_index() is None:  # cannot write it (read-only): index from the walk
            self._scan_index()
        else:
            self.load_index(copy=False)
        return why

    def _compact_journal(self) -> None:
        """Rewrite the journal as one line per live entry (when it is mostly dead lines)."""
        try:
            with self.journal.locked(blocking=False) as held:
                if not held:
                    return  # someone else holds it; they may be compacting
                idx = self.load_index(rebuild=False)  # all of it: no one appends now
                self.journal.write(idx)
        except OSError:
            return

    def maybe_compact(self) -> None:
        """Compact the journal when it holds many more records than live entries."""
        if self.journal.needs_compaction():
            self._compact_journal()

    def index(self) -> dict[str, tuple]:
        """key -> (file size, created, kind, name, arch), from the index (no stat per entry)."""
        idx = self.load_index()
        self.maybe_compact()
        return idx

    def total_bytes(self) -> int:
        """What the cap holds: bytes of all entry files, from the index (no stat per
        entry), plus the live temp files and the torch dirs as last counted."""
        self.load_index(copy=False)
        self._count_torch_dirs_once()
        return self.journal.bytes + self.tmp_bytes + self.torch_bytes

    # ------------------------------------------------------------------ upkeep
    @property
    def evictor(self) -> Evictor:
        """This tier's :class:`~cuforge.store.upkeep.Evictor` (made on first use: the hit
        path never imports upkeep)."""
        evictor = self._evictor
        if evictor is None:
            from cuforge.store.upkeep import Evictor

            evictor = self._evictor = Evictor(self)
        return evictor

    def prune(
        self,
        *,
        max_bytes: int | None = None,
        older_than: float | None = None,
    ) -> tuple[int, int]:
        """Remove entries and torch dirs not used for ``older_than`` seconds, then
        least-recently-used ones until the tier holds at most ``max_bytes``; also module
        dirs whose module entry is gone, stale temp files and unheld compile lock files.
        Returns (entries removed, bytes freed). See :mod:`cuforge.store.upkeep`."""

        return self.evictor.prune(max_bytes=max_bytes, older_than=older_than)

    def clear(self) -> int:
        """Remove every entry, every torch dir not being built in, every temp file and
        every unheld compile lock file. Returns how many entries were removed."""

        return self.evictor.clear()

    def verify(
        self,
        *,
        repair: bool = False,
        quick: bool = False,
        progress: Callable[[int], Any] | None = None,
    ) -> VerifyReport:
        """Re-check every entry and the journal (:meth:`cuforge.store.upkeep.Evictor.verify`);
        ``repair``: remove the damage and rebuild the index. ``progress``: called with
        the number of entries checked so far (the total to expect is ``stats().entries``)."""

        return self.evictor.verify(repair=repair, quick=quick, progress=progress)

    # ------------------------------------------------------------------ scans
    def walk(self, tmp_bytes: list[int] | None = None) -> Iterator[tuple[str, str, Any]]:
        """(key, path, lstat) of everything in an entry's place (temp files skipped; their
        sizes are appended to ``tmp_bytes`` when given). Includes non-regular files: those
        are damage (``verify`` reports them, readers skip them)."""
        try:
            level1 = list(os.scandir(self.layout.entries))
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

    def iterate(self) -> Iterator[EntryInfo]:
        """Every well-formed entry, read from its header (meta includes name, arch, log...)."""
        for key, path, st in self.walk():
            info = read_info(path, st.st_size)
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
            except (OSError, ValueError):  # gone, or a stray file's name: not an entry
                continue
            yield EntryInfo(key, kind, size, created, mtime, {"name": name, "arch": arch})

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
        if not found and is_entry_key(prefix) and os.path.lexists(self.path_for(prefix)):
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
        layout = self.layout
        removed = []
        for path in (layout.telemetry, layout.explain, layout.toolchain_memo):
            if remove_path(path):
                removed.append(os.path.basename(path))
        return removed

    # ------------------------------------------------------------------ stats
    def stats(self) -> StoreStats:
        from cuforge.store import upkeep

        # what is on disk, not only what was journaled (entries copied in by hand)
        drift = self.sync_index()
        idx = self.load_index()
        self.maybe_compact()
        torch_dirs = self.evictor.count_torch_dirs()
        layout = self.layout
        other = upkeep.tree_bytes(
            self.root, skip=(layout.entries, layout.torch_builds, layout.torch_modules)
        )
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
            from cuforge.base.config import settings

            if settings().telemetry:
                row = _telemetry.summary(self.root)["tiers"].get("disk", {})
                # hits: the lookups this tier answered (telemetry.tally); misses: the
                # lookups that reached it and that it did not have
                shared = {**row, "misses": row.get("not_found", 0)}
        counters = process if shared is None else shared
        entry_bytes = sum(row["bytes"] for row in kinds.values())
        outside = {
            "torch build dirs": {"dirs": 0, "bytes": 0},
            "torch module dirs": {"dirs": 0, "bytes": 0},
        }
        for unit in torch_dirs:
            row = outside[f"torch {unit.kind} dirs"]
            row["dirs"] += 1
            row["bytes"] += unit.bytes
        return StoreStats(
            "disk",
            entries=len(idx),
            bytes=entry_bytes + self.torch_bytes,
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
                "entry_bytes": entry_bytes,
                "outside": outside,
                "other_bytes": other,
                "dir_bytes": entry_bytes + self.tmp_bytes + self.torch_bytes + other,
                "dirs_removed": self.dirs_removed,
                "temp_bytes": self.tmp_bytes,
                "journal_rebuilds": self.journal_rebuilds,
                # why the index was out of date with the entry files, and rebuilt (or None)
                "index_rebuilt": drift,
                "process": process,
                "counters": "shared" if shared is not None else "process",
            },
        )

    def __repr__(self) -> str:
        state = " disabled" if self.disabled else ""
        return f"DiskStore({self.root!r}, max_bytes={self.max_bytes}{state})"


# ---------------------------------------------------------------------- filters
def _fsync_all(paths: list[str]) -> None:
    """``fsync`` each file of ``paths``, then each directory holding one, once each (best
    effort, :func:`cuforge.base._fs.sync`: correctness rests on the checksums)."""
    for path in paths:
        _fs.sync(path)
    for directory in dict.fromkeys(os.path.dirname(path) for path in paths):
        _fs.sync(directory, directory=True)


class _Bulk:
    """The context manager :meth:`DiskStore.bulk` returns."""

    __slots__ = ("store", "durable", "outer")

    def __init__(self, store: DiskStore, durable: bool) -> None:
        self.store, self.durable, self.outer = store, durable, False

    def __enter__(self) -> DiskStore:
        store = self.store
        self.outer = store._batch is None
        if self.outer:
            store._batch, store._batch_files, store._batch_bytes = [], [], 0
        return store

    def __exit__(self, *exc: object) -> None:
        if self.outer:
            self.store._end_batch(self.durable)


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

    from cuforge.base.arch import normalize_arch

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
