"""The one small interface every cache tier implements: get / put / delete / iterate / stats.

A store maps a key (a lowercase hex digest made by :mod:`cuforge.keys.key`) to an
:class:`Entry`: an opaque payload (a cubin, an object file, a shared library, a JSON
manifest) plus JSON-serializable metadata. Stores know nothing of compilers or keys;
they never interpret the payload and never use pickle.

Guarantees every implementation gives (the disk tier documents how):

* ``get`` returns an entry whose payload is byte-identical to what was ``put``, or
  ``None``. A damaged entry is never returned: it is deleted and counted as a miss.
  Entries read from outside the process (the disk tier, an imported bundle) are also
  checked against :mod:`cuforge.store.schema`; a malformed one counts as damaged.
* ``put`` is atomic: a concurrent reader sees the old state or the new entry, never a
  partial one. ``put`` of an existing key replaces it.
* No method raises for an I/O problem of the tier itself (full disk, read-only
  directory, lost server); the tier degrades to a miss / a no-op and warns once.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator

# the one entry-key shape check (64 lowercase hex digits), for a key read from something
# that may be damaged or planted (an index, a bundle, an entry list)
from cuforge.base.layout import is_entry_key

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: see docs/architecture.md, the warm path
if TYPE_CHECKING:
    from typing import Any


__all__ = ["Entry", "EntryInfo", "StoreStats", "Store", "ENTRY_KINDS", "is_entry_key"]

#: What an entry holds. "kernel": a compiled cubin/PTX/fatbin; "manifest": the headers a
#: compile read (the direct-mode lookup); "object": a compiled translation unit;
#: "module": a linked extension module.
ENTRY_KINDS = (
    "kernel",
    "manifest",
    "object",
    "module",
    "cccl",
    "cute",
    "triton",
    "inductor",
    "inductor-cpp",
    "cuda-core",
    "jax",
    "cupy",
    "flashinfer",
)  # = cuforge.store.schema.KINDS


class Entry:
    """A payload plus its metadata. ``meta`` holds only JSON types (str, int, float, bool,
    None, list, dict). Well-known meta fields: ``name`` (source or extension name), ``arch``,
    ``backend``, ``compile_seconds``, ``lowered_names``, ``log``, ``key_fields``."""

    __slots__ = ("key", "kind", "payload", "meta")

    def __init__(
        self, key: str, kind: str, payload: bytes, meta: dict[str, Any] | None = None
    ) -> None:
        self.key = key
        self.kind = kind
        self.payload = payload
        self.meta = meta if meta is not None else {}

    def __repr__(self) -> str:
        return f"Entry(key={self.key[:16]}..., kind={self.kind!r}, {len(self.payload)} bytes)"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Entry) and (self.key, self.kind, self.payload, self.meta) == (
            other.key,
            other.kind,
            other.payload,
            other.meta,
        )


class EntryInfo:
    """What ``iterate`` yields: an entry's description without its payload."""

    __slots__ = ("key", "kind", "size", "created", "last_used", "meta")

    def __init__(
        self, key: str, kind: str, size: int, created: float, last_used: float, meta: dict[str, Any]
    ) -> None:
        self.key, self.kind, self.size = key, kind, size
        self.created, self.last_used, self.meta = created, last_used, meta

    def __repr__(self) -> str:
        return f"EntryInfo(key={self.key[:16]}..., kind={self.kind!r}, size={self.size})"


class StoreStats:
    """Counters of one tier. ``hits``/``misses``/``puts`` count this process unless the
    tier keeps shared telemetry (the disk tier does), ``entries``/``bytes`` describe the
    tier's current contents, and ``extra`` holds tier-specific numbers. ``errors``: calls
    that failed (a remote down, timed out or answering garbage); ``rejected``: entries
    refused by a trust check (a remote's unsigned or badly signed entries)."""

    __slots__ = (
        "tier",
        "entries",
        "bytes",
        "hits",
        "misses",
        "puts",
        "evictions",
        "corrupt",
        "errors",
        "rejected",
        "extra",
    )

    def __init__(
        self,
        tier: str,
        entries: int = 0,
        bytes: int = 0,
        hits: int = 0,
        misses: int = 0,
        puts: int = 0,
        evictions: int = 0,
        corrupt: int = 0,
        extra: dict[str, Any] | None = None,
        errors: int = 0,
        rejected: int = 0,
    ) -> None:
        self.tier, self.entries, self.bytes = tier, entries, bytes
        self.hits, self.misses, self.puts = hits, misses, puts
        self.evictions, self.corrupt = evictions, corrupt
        self.errors, self.rejected = errors, rejected
        self.extra = extra or {}

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}

    def __repr__(self) -> str:
        return f"StoreStats({self.as_dict()})"


class Store(ABC):
    """A cache tier. Implementations: MemoryStore, DiskStore, TieredStore and the remote
    tier (:class:`cuforge.store.remote.tier.RemoteStore`)."""

    #: short tier name used in stats and logs: "memory", "disk", "remote"
    tier: str = "?"

    @abstractmethod
    def get(self, key: str, *, kind: str | None = None) -> Entry | None:
        """The entry for ``key``, or None. Never returns a damaged entry.

        ``kind`` (one of :data:`ENTRY_KINDS`) is a hint for tiers that address entries
        by ``(kind, key)``: the local tiers ignore it, a remote tier asked without one
        answers None (it cannot know where to look) and one asked with the wrong kind
        answers None too (the entry it finds names another kind)."""

    @abstractmethod
    def put(self, entry: Entry, *, durable: bool = True) -> bool:
        """Store ``entry`` atomically. False when the tier could not (it has warned).

        ``durable=False``: the entry is a copy of one held elsewhere (a remote hit copied
        into the local tiers), so a tier may skip the cost of making it survive a power
        loss (the disk tier's fsync): losing it costs one fetch, never a wrong result."""

    @abstractmethod
    def delete(self, key: str) -> bool:
        """Remove ``key``. True when something was removed."""

    @abstractmethod
    def iterate(self) -> Iterator[EntryInfo]:
        """Every entry's description (no payloads), in no particular order."""

    @abstractmethod
    def stats(self) -> StoreStats:
        """Counters and sizes of this tier."""

    def get_with_tier(
        self, key: str, *, kind: str | None = None
    ) -> tuple[Entry | None, str | None]:
        """``(entry, name of the tier that had it)``, or ``(None, None)`` on a miss. A
        single tier answers with its own :attr:`tier`; :class:`TieredStore` names the
        tier that held the entry (``"memory"``, ``"disk"``, ``"remote"``) and copies it
        into every faster tier. ``kind``: as for :meth:`get`."""
        entry = self.get(key, kind=kind)
        return entry, (self.tier if entry is not None else None)

    def contains(self, key: str) -> bool:
        return self.get(key) is not None
