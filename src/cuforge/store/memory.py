"""The in-process tier: an LRU bounded by bytes.

A lookup is one dict access under a lock (about a microsecond). Sizes count the payload
plus a rough estimate of the metadata, so a cache of many tiny entries is bounded too.
Entries are shared, not copied: callers must treat ``entry.meta`` as read-only.
"""

from __future__ import annotations

from _thread import allocate_lock
from time import time

from cuforge.store.base import Entry, EntryInfo, Store, StoreStats

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: see docs/architecture.md, the warm path
if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Iterator
    from typing import Any


__all__ = ["MemoryStore", "entry_cost"]

#: fixed per-entry overhead added to every size estimate (the Entry, the dict slot, the key)
_OVERHEAD = 256


def entry_cost(entry: Entry) -> int:
    """Rough bytes an entry costs in memory: payload + metadata + a fixed overhead."""
    return _OVERHEAD + len(entry.key) + len(entry.payload) + _meta_cost(entry.meta)


def _meta_cost(value: Any) -> int:
    if isinstance(value, (str, bytes)):
        return len(value) + 8
    if isinstance(value, dict):
        return 64 + sum(len(k) + _meta_cost(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return 56 + sum(_meta_cost(v) for v in value)
    return 16


class MemoryStore(Store):
    """An LRU of entries bounded by ``max_bytes`` (payload plus rough metadata size).

    Thread-safe. ``put`` of an entry larger than the whole cap stores nothing and
    returns False (no warning: that is not a fault of the tier).
    """

    tier = "memory"

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = int(max_bytes)
        # key -> (entry, cost, created, last_used)
        self._data: dict[str, list] = {}  # insertion order = recency order
        self._bytes = 0
        self._lock = allocate_lock()
        self.hits = self.misses = self.puts = self.evictions = 0

    def get(self, key: str, *, kind: str | None = None) -> Entry | None:
        """The entry for ``key`` (``kind`` is ignored: keys are unique across kinds)."""
        with self._lock:
            slot = self._data.pop(key, None)
            if slot is None:
                self.misses += 1
                return None
            self._data[key] = slot  # now the most recent
            slot[3] = time()
            self.hits += 1
            return slot[0]

    def peek(self, key: str) -> Entry | None:
        """The entry without counting a hit or refreshing its recency."""
        slot = self._data.get(key)
        return None if slot is None else slot[0]

    def put(self, entry: Entry, *, durable: bool = True) -> bool:
        cost = entry_cost(entry)
        if cost > self.max_bytes:
            return False
        now = time()
        with self._lock:
            old = self._data.pop(entry.key, None)
            if old is not None:
                self._bytes -= old[1]
            self._data[entry.key] = [entry, cost, now, now]
            self._bytes += cost
            self.puts += 1
            data = self._data
            while self._bytes > self.max_bytes and data:
                victim = data.pop(next(iter(data)))  # the least recently used
                self._bytes -= victim[1]
                self.evictions += 1
        return True

    def delete(self, key: str) -> bool:
        with self._lock:
            old = self._data.pop(key, None)
            if old is None:
                return False
            self._bytes -= old[1]
            return True

    def clear(self) -> int:
        with self._lock:
            n = len(self._data)
            self._data.clear()
            self._bytes = 0
            return n

    def iterate(self) -> Iterator[EntryInfo]:
        with self._lock:
            slots = list(self._data.values())
        for entry, _cost, created, last_used in slots:
            yield EntryInfo(
                entry.key, entry.kind, len(entry.payload), created, last_used, dict(entry.meta)
            )

    def total_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def stats(self) -> StoreStats:
        with self._lock:
            return StoreStats(
                "memory",
                entries=len(self._data),
                bytes=self._bytes,
                hits=self.hits,
                misses=self.misses,
                puts=self.puts,
                evictions=self.evictions,
                extra={"max_bytes": self.max_bytes},
            )

    def __repr__(self) -> str:
        return f"MemoryStore({len(self._data)} entries, {self._bytes}/{self.max_bytes} bytes)"
