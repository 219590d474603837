"""A read-only view of a store (sccache's ``ReadOnlyStorage``): lookups pass through,
writes and deletes are refused. Bundles are served through it, as tiers of a
:class:`cuforge.Cache` after its writable ones."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cuforge.store.base import Entry, EntryInfo, Store, StoreStats

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Iterator

__all__ = ["ReadOnlyStore"]


class ReadOnlyStore(Store):
    """``inner``'s entries, read only. :meth:`put` and :meth:`delete` store and remove
    nothing (they return False); the tier name is the inner store's (``"bundle"``)."""

    read_only = True

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.tier = inner.tier
        #: the bundle's path, where the inner store has one
        self.path = getattr(inner, "path", None)

    def __repr__(self) -> str:
        return f"ReadOnlyStore({self.inner!r})"

    def __getattr__(self, name: str):
        # the inner store's own attributes (a bundle's ``info``, ``hits``...)
        return getattr(self.inner, name)

    def get(self, key: str, *, kind: str | None = None) -> Entry | None:
        return self.inner.get(key, kind=kind)

    def get_with_tier(
        self, key: str, *, kind: str | None = None
    ) -> tuple[Entry | None, str | None]:
        entry = self.inner.get(key, kind=kind)
        return entry, (self.tier if entry is not None else None)

    def put(self, entry: Entry, *, durable: bool = True) -> bool:
        return False

    def delete(self, key: str) -> bool:
        return False

    def iterate(self) -> Iterator[EntryInfo]:
        return self.inner.iterate()

    def stats(self) -> StoreStats:
        return self.inner.stats()

    def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if close is not None:
            close()
