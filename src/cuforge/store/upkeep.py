"""Upkeep of a disk tier: eviction, ``prune``, ``clear`` and ``verify``.

One :class:`Evictor` per :class:`cuforge.store.disk.DiskStore` (its methods of the same names
call them; this module is imported only when upkeep runs, never on the hit path).

**What the cap bounds.** The entries, live temp files, and the torch extension dirs
(``layout.torch_builds/<name>``: ninja objects, depfiles, a copy of the module;
``layout.torch_modules/<key>``: the module imported) -- the bulk of what cuforge keeps
outside its entries. Each torch dir is one unit of eviction whose last use is the dir's
mtime (a build writes into it; a warm load refreshes its module dir). The rest of the dir
(journal, locks, telemetry, miss history, toolchain memo, runtime) is small, not
evictable and reported by ``stats`` but not held against the cap.

When a put takes the tier over ``max_bytes``, the least recently used entries and torch
dirs are removed until the tier is under :data:`EVICT_TO` of the cap, by one process at a
time (``layout.evict_lock``). A torch dir is never removed while in use: a build dir
whose lock (:data:`TORCH_BUILD_LOCK`) a build holds, or a dir used in the last
:data:`IN_USE_SECONDS` (a module being imported; a build about to take its lock). Temp
files a crashed writer left behind (older than :data:`STALE_TMP_SECONDS`) are removed by
eviction, ``prune``, ``clear`` and ``verify --repair``; ``prune`` and ``clear`` also
remove compile lock files nobody holds, and ``prune`` removes module dirs whose module
entry is gone.
"""

from __future__ import annotations

import logging
import os
import stat
from time import monotonic, time

from cuforge.base import _fs
from cuforge.base.layout import is_entry_key
from cuforge.store import telemetry
from cuforge.store.entry_codec import CorruptEntry, decode_entry, read_info, remove_path
from cuforge.store.journal import index_tuple, locked_file

TYPE_CHECKING = False  # not `typing.TYPE_CHECKING`: importing typing costs ~10 ms
if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable, Iterator
    from typing import Any, Protocol

    from cuforge.base.layout import CacheLayout
    from cuforge.store.journal import Journal

    class UpkeepTarget(Protocol):
        """What an :class:`Evictor` reads and updates on its disk tier (the attributes of
        :class:`cuforge.store.disk.DiskStore`, named here so that neither module imports
        the other)."""

        root: str
        layout: CacheLayout
        journal: Journal
        max_bytes: int
        evictions: int
        dirs_removed: int
        tmp_bytes: int
        tmp_checked: float
        torch_bytes: int
        torch_checked: float
        telemetry: Any

        def walk(self, tmp_bytes: list[int] | None = None) -> Iterator[tuple[str, str, Any]]: ...
        def path_for(self, key: str) -> str: ...
        def load_index(self) -> Any: ...
        def rebuild_index(self, *args: Any, **kwargs: Any) -> Any: ...
        def sync_index(self) -> str | None: ...
        def maybe_compact(self, *args: Any, **kwargs: Any) -> Any: ...
        def journal_append(self, *args: Any, **kwargs: Any) -> Any: ...


__all__ = [
    "EVICT_TO",
    "IN_USE_SECONDS",
    "TORCH_BUILD_LOCK",
    "TorchDir",
    "Evictor",
    "tree_bytes",
    "STALE_TMP_SECONDS",
    "VerifyReport",
]

#: evict down to this fraction of the cap, so that a full cache does not evict on every put
EVICT_TO = 0.9
#: temp files older than this are debris of a crashed writer (a put takes milliseconds)
STALE_TMP_SECONDS = 300.0
#: a torch dir used (written, loaded) less than this long ago is in use: never evicted
IN_USE_SECONDS = 60.0
#: the lock file a torch build holds in its build dir while it builds
#: (:func:`cuforge.torch.build._build_locked`)
TORCH_BUILD_LOCK = "lock"


class VerifyReport:
    """What :func:`verify` found.

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


# ---------------------------------------------------------------------- torch dirs
class TorchDir:
    """One torch extension dir under the cache dir: ``kind`` ``"build"`` (a build dir,
    by extension name) or ``"module"`` (a module dir, by link key: ``name``), its
    ``bytes`` and its last use (the dir's mtime)."""

    __slots__ = ("path", "kind", "name", "bytes", "last_used")

    def __init__(self, path: str, kind: str, name: str, nbytes: int, last_used: float) -> None:
        self.path, self.kind, self.name = path, kind, name
        self.bytes, self.last_used = nbytes, last_used

    def __repr__(self) -> str:
        return f"TorchDir({self.kind} {self.path!r}, {self.bytes} bytes)"


def tree_bytes(path: str, skip: tuple[str, ...] = ()) -> int:
    """Bytes of every file under ``path`` (itself, when a file), as ``du -sb`` counts
    files (links not followed, directories' own sizes left out); ``skip``: paths whose
    trees are left out."""
    try:
        st = os.lstat(path)
    except OSError:
        return 0

    if not stat.S_ISDIR(st.st_mode):
        return st.st_size
    total = 0
    stack = [path]
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                children = list(it)
        except OSError:
            continue
        for child in children:
            if child.path in skip:
                continue
            try:
                if child.is_dir(follow_symlinks=False):
                    stack.append(child.path)
                else:
                    total += child.stat(follow_symlinks=False).st_size
            except OSError:
                continue
    return total


def _remove_torch_dir(unit: TorchDir) -> bool:
    """Remove a torch dir unless a build holds its lock (then it is in use). True when
    it was removed."""
    lock = os.path.join(unit.path, TORCH_BUILD_LOCK)
    if unit.kind == "build" and os.path.isfile(lock) and not os.path.islink(lock):
        try:
            with _fs.locked(lock, blocking=False) as held:
                # held: no build can start in it until it is gone (one that waited on
                # this lock re-creates the dir before it writes)
                return held and remove_path(unit.path)
        except OSError:
            pass  # a lock that cannot be taken is damage, not a build
    return remove_path(unit.path)


# ---------------------------------------------------------------------- eviction


class Evictor:
    """The upkeep of one disk tier: eviction, ``prune``, ``clear``, ``verify`` and the
    torch-dir and temp-file counts. :class:`~cuforge.store.disk.DiskStore` makes one and
    calls it (this module never imports the disk tier: the store it is given is anything
    with the tier's attributes, :class:`UpkeepTarget`)."""

    def __init__(self, store: UpkeepTarget) -> None:
        self.store = store

    def torch_dirs(self) -> list[TorchDir]:
        """The torch build dirs and module dirs under the cache dir (anything else found
        there counts too, as a unit of its own)."""
        store = self.store
        layout = store.layout
        found: list[TorchDir] = []
        for kind, parent in (("build", layout.torch_builds), ("module", layout.torch_modules)):
            try:
                with os.scandir(parent) as it:
                    children = list(it)
            except OSError:
                continue
            for child in children:
                try:
                    mtime = child.stat(follow_symlinks=False).st_mtime
                except OSError:
                    continue
                found.append(TorchDir(child.path, kind, child.name, tree_bytes(child.path), mtime))
        return found

    def count_torch_dirs(self) -> list[TorchDir]:
        """:func:`torch_dirs`, their total noted on the store (``torch_bytes``: what the cap
        holds besides the entries and temp files)."""
        store = self.store
        dirs = self.torch_dirs()
        store.torch_bytes = sum(d.bytes for d in dirs)
        store.torch_checked = monotonic()
        return dirs

    def maybe_evict(self) -> None:
        """After a put: evict when the tier (entries, the torch dirs as last counted, temp
        files, cleaned at most once a minute once the tier is half full) is over its cap."""
        store = self.store
        store.load_index(copy=False)
        cap = store.max_bytes
        used = store.journal.bytes + store.torch_bytes
        if used * 2 > cap and monotonic() - store.tmp_checked > 60.0:
            self.clean_temp()
        if used + store.tmp_bytes > cap:
            self.evict(int(cap * EVICT_TO), None, blocking=False)
        else:
            store.maybe_compact()

    def evict(
        self,
        max_bytes: int | None,
        older_than: float | None,
        *,
        blocking: bool,
        orphans: bool = False,
    ) -> tuple[int, int]:
        """Remove entries and torch dirs unused for ``older_than`` seconds, then LRU ones
        until the tier (entries, live temp files, torch dirs) holds at most ``max_bytes``;
        ``orphans``: also module dirs whose module entry is gone (and that are not in use).
        Torch dirs in use are skipped. One process at a time (others skip or wait). Returns
        (entries removed, bytes freed); the torch dirs removed are added to
        ``store.dirs_removed``."""
        store = self.store
        removed = freed = 0
        try:
            with locked_file(store.layout.evict_lock, blocking=blocking) as held:
                if not held:
                    return 0, 0  # another process is evicting right now
                self.clean_temp()
                idx = store.load_index()
                dirs = self.count_torch_dirs()
                total = sum(info[0] for info in idx.values()) + store.tmp_bytes + store.torch_bytes
                if (max_bytes is None or total <= max_bytes) and older_than is None and not orphans:
                    return 0, 0
                now = time()
                gone: list[str] = []
                # (last used, key or path, bytes, the torch dir or None for an entry)
                candidates: list[tuple[float, str, int, TorchDir | None]] = []
                for key, info in idx.items():
                    try:
                        if not is_entry_key(key):
                            raise FileNotFoundError(key)  # never an entry: drop its record
                        st = os.lstat(store.path_for(key))
                    except OSError:
                        gone.append(key)  # vanished behind the index's back
                        total -= info[0]
                        continue
                    candidates.append((st.st_mtime, key, st.st_size, None))
                candidates.extend((d.last_used, d.path, d.bytes, d) for d in dirs)
                candidates.sort(key=lambda c: (c[0], c[1]))
                left: list[TorchDir] = []
                for mtime, key, size, unit in candidates:
                    too_old = older_than is not None and now - mtime > older_than
                    too_big = max_bytes is not None and total > max_bytes
                    if not (too_old or too_big):
                        if unit is not None:
                            left.append(unit)
                        continue
                    if unit is not None:
                        if too_old or now - mtime >= IN_USE_SECONDS:
                            if _remove_torch_dir(unit):
                                store.dirs_removed += 1
                                store.torch_bytes -= size
                                freed += size
                                total -= size
                                continue
                        left.append(unit)
                        continue
                    if remove_path(store.path_for(key)):
                        removed += 1
                        freed += size
                    gone.append(key)
                    total -= size
                if orphans:
                    dead = set(gone)
                    for unit in left:
                        if (
                            unit.kind == "module"
                            and (unit.name not in idx or unit.name in dead)
                            and now - unit.last_used >= IN_USE_SECONDS
                            and remove_path(unit.path)
                        ):
                            store.dirs_removed += 1
                            store.torch_bytes -= unit.bytes
                            freed += unit.bytes
                if gone:
                    store.journal_append([f"D\t{k}" for k in gone])
                store.evictions += removed
                if removed and store.telemetry:
                    telemetry.record(
                        store.root, "evict", tier="disk", kind="", name=None, count=removed
                    )
                store.maybe_compact()
        except OSError:
            return removed, freed
        return removed, freed

    def prune(
        self, *, max_bytes: int | None = None, older_than: float | None = None
    ) -> tuple[int, int]:
        """Remove entries and torch dirs not used for ``older_than`` seconds, then
        least-recently-used ones until the tier holds at most ``max_bytes``; also module dirs
        whose module entry is gone, stale temp files and unheld compile lock files. Returns
        (entries removed, bytes freed). An index out of date with the entry files on disk
        (entries copied in by hand) is rebuilt first: the cap holds what is on disk."""
        self.clean_locks()
        self.store.sync_index()
        return self.evict(max_bytes, older_than, blocking=True, orphans=True)

    def clear(self) -> int:
        """Remove every entry, every torch dir not in use, every temp file and every unheld
        compile lock file. Returns how many entries were removed."""
        store = self.store
        removed = 0
        for _key, path, _st in store.walk():
            if remove_path(path):
                removed += 1
        for unit in self.torch_dirs():
            if _remove_torch_dir(unit):
                store.dirs_removed += 1
        self.count_torch_dirs()
        self.clean_temp(max_age=0.0)
        self.clean_locks()
        try:
            with store.journal.locked():
                store.journal.write({})
        except OSError:
            pass
        return removed

    # ---------------------------------------------------------------------- debris

    def temp_files(self) -> Iterator[str]:
        """Paths of the temp files under the entries and index dirs (never followed)."""
        store = self.store
        layout = store.layout
        dirs = [layout.index]
        try:
            for d1 in os.scandir(layout.entries):
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
                # ".tmp.<name>..." (cuforge.base._fs) and "journal.tmp.<pid>..." (older cuforge)
                if name.startswith(_fs.TMP_PREFIX) or ".tmp." in name:
                    yield os.path.join(d, name)

    def clean_temp(self, max_age: float = STALE_TMP_SECONDS) -> int:
        """Remove temp files older than ``max_age`` (crashed writers' debris); count the
        bytes of the others toward the cap. Returns how many were removed."""
        store = self.store
        now = time()
        count = 0
        live = 0
        for path in self.temp_files():
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if now - st.st_mtime > max_age or max_age <= 0:
                if remove_path(path):
                    count += 1
                    continue
            live += st.st_size
        store.tmp_bytes = live
        store.tmp_checked = monotonic()
        return count

    def clean_locks(self) -> int:
        """Remove compile lock files (``layout.locks``) that no process holds, and anything
        but a regular file there. Returns how many were removed."""
        store = self.store

        count = 0
        try:
            shards = list(os.scandir(store.layout.locks))
        except OSError:
            return 0
        for shard in shards:
            if not shard.is_dir(follow_symlinks=False):
                count += remove_path(shard.path)
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
                    count += remove_path(f.path)
                    continue
                try:
                    with _fs.locked(f.path, blocking=False) as held:
                        if held and remove_path(f.path):
                            count += 1
                except OSError:
                    continue
            try:
                os.rmdir(shard.path)  # only when empty
            except OSError:
                pass
        return count

    # ---------------------------------------------------------------------- verify

    def verify(
        self,
        *,
        repair: bool = False,
        quick: bool = False,
        progress: Callable[[int], Any] | None = None,
    ) -> VerifyReport:
        """Re-check every entry: its checksum (``quick``: header, sizes and metadata only)
        and its metadata's shape; anything but a regular file in an entry's place is damage
        too. Checks the journal's line checksums. ``repair``: remove damaged entries, stale
        temp files and non-regular files in the index dir, and rebuild the index.
        ``progress``: called with the number of entries checked so far, after each one."""
        store = self.store

        report = VerifyReport()
        report.journal = store.journal.check()
        seen: dict[str, tuple] = {}
        for key, path, st in store.walk():
            report.checked += 1
            if progress is not None:
                progress(report.checked)
            try:
                if not stat.S_ISREG(st.st_mode):
                    raise CorruptEntry("not a regular file")
                if quick:
                    info = read_info(path, st.st_size, strict=True)
                else:
                    info, _payload = decode_entry(_fs.read_bytes(path))
                if info.get("key") != key:
                    raise CorruptEntry("entry file holds another key")
            except (OSError, CorruptEntry, KeyError, TypeError) as exc:
                report.corrupt.append(key)
                report.reasons[key] = str(exc) or type(exc).__name__
                if repair and remove_path(path):
                    report.repaired += 1
                continue
            report.bytes += st.st_size
            seen[key] = index_tuple(st.st_size, info)
        if report.journal is None:
            idx = store.load_index()
            damaged = set(report.corrupt)  # indexed or not: readers find the damage
            report.index_drift = sum(1 for k in seen if k not in idx) + sum(
                1 for k in idx if k not in seen and k not in damaged
            )
        if repair:
            report.stale_temp = self.clean_temp()
            layout = store.layout
            for path in (layout.journal, layout.index_lock, layout.evict_lock):
                try:
                    if not stat.S_ISREG(os.lstat(path).st_mode):
                        remove_path(path)
                except OSError:
                    pass
            if report.index_drift or report.repaired or report.journal is not None:
                report.journal_rebuilt = store.rebuild_index() is not None
            if report.corrupt:
                logging.getLogger("cuforge").warning(
                    "cuforge: verify removed %d damaged cache entries from %s",
                    report.repaired,
                    store.root,
                )
        return report
