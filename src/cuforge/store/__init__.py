"""cuforge's cache tiers: memory, disk, tiered, single flight and telemetry.

:func:`default_store` builds the store the settings ask for (and memoizes it);
:func:`lock_dir` is where the compile locks live. Everything else is imported lazily,
so ``import cuforge.store`` stays cheap:

* :class:`MemoryStore` (``cuforge.store.memory``), :class:`DiskStore`
  (``cuforge.store.disk``), :class:`TieredStore` (``cuforge.store.tiered``)
* :func:`single_flight` (``cuforge.store.single_flight``)
* :class:`Entry`, :class:`EntryInfo`, :class:`StoreStats`, :class:`Store` (``cuforge.store.base``)
"""

from __future__ import annotations

import os

from cuforge.config import settings

TYPE_CHECKING = False  # not `typing.TYPE_CHECKING`: importing typing costs ~10 ms
if TYPE_CHECKING:  # pragma: no cover
    from typing import Any

    from cuforge.store.base import Store


__all__ = [
    "default_store",
    "lock_dir",
    "MemoryStore",
    "DiskStore",
    "TieredStore",
    "VerifyReport",
    "DISK_FORMAT_VERSION",
    "single_flight",
    "Entry",
    "EntryInfo",
    "StoreStats",
    "Store",
]

_LAZY = {
    "MemoryStore": "cuforge.store.memory",
    "DiskStore": "cuforge.store.disk",
    "VerifyReport": "cuforge.store.disk",
    "DISK_FORMAT_VERSION": "cuforge.store.disk",
    "TieredStore": "cuforge.store.tiered",
    "single_flight": "cuforge.store.single_flight",
    "Entry": "cuforge.store.base",
    "EntryInfo": "cuforge.store.base",
    "StoreStats": "cuforge.store.base",
    "Store": "cuforge.store.base",
}

# (the Settings object it was built for, the fields that shape it, the store)
_memo: tuple[Any, tuple, Any] = (None, (), None)


def default_store() -> Store | None:
    """The store the current settings ask for:

    * ``None`` when ``CUFORGE_DISABLE_CACHE`` is set (always compile);
    * a :class:`MemoryStore` when ``CUFORGE_DISABLE_FILE_CACHE`` is set;
    * else ``TieredStore([MemoryStore(memory_max_bytes), DiskStore(cache_dir, cache_max_bytes)])``.

    Memoized: while the settings object is unchanged this is one identity check. When
    the environment changes, the store is rebuilt only if a field that shapes it changed
    (so an unrelated setting, e.g. ``CUFORGE_VERBOSE``, keeps the memory tier's contents).
    """
    global _memo
    current = settings()
    memo = _memo
    if memo[0] is current:
        return memo[2]
    shape = (
        current.disable_cache,
        current.disable_file_cache,
        current.cache_dir,
        current.memory_max_bytes,
        current.cache_max_bytes,
    )
    if memo[1] == shape:
        _memo = (current, shape, memo[2])
        return memo[2]
    store: Any
    if current.disable_cache:
        store = None
    else:
        from cuforge.store.memory import MemoryStore

        memory = MemoryStore(current.memory_max_bytes)
        if current.disable_file_cache:
            store = memory
        else:
            from cuforge.store.disk import DiskStore
            from cuforge.store.tiered import TieredStore

            store = TieredStore([memory, DiskStore(current.cache_dir, current.cache_max_bytes)])
    _memo = (current, shape, store)
    return store


def lock_dir() -> str | None:
    """``<cache_dir>/locks``, or None when file caching is off (then locks are per process)."""
    current = settings()
    if current.disable_cache or current.disable_file_cache:
        return None
    return os.path.join(current.cache_dir, "locks")


def reset_default_store() -> None:
    """Forget the memoized store (tests; after changing the cache dir's contents by hand)."""
    global _memo
    _memo = (None, (), None)


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'cuforge.store' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
