"""cuforge's cache tiers: memory, disk, tiered, read-only, single flight and telemetry.

The tiers are composed by :class:`cuforge.Cache` (``cuforge.core.caching``), which owns the
cache dir's layout, its trust check and the tier chain. Everything here is imported
lazily, so ``import cuforge.store`` stays cheap:

* :class:`MemoryStore` (``cuforge.store.memory``), :class:`DiskStore`
  (``cuforge.store.disk``), :class:`TieredStore` (``cuforge.store.tiered``)
* the submodule :mod:`cuforge.store.single_flight` (``single_flight.single_flight``)
* :class:`ReadOnlyStore` (``cuforge.store.readonly``): a read-only view (bundles)
* :class:`Entry`, :class:`EntryInfo`, :class:`StoreStats`, :class:`Store` (``cuforge.store.base``)
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: see docs/architecture.md, the warm path
if TYPE_CHECKING:  # pragma: no cover
    from typing import Any


__all__ = [
    "MemoryStore",
    "DiskStore",
    "TieredStore",
    "ReadOnlyStore",
    "VerifyReport",
    "DISK_FORMAT_VERSION",
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
    "ReadOnlyStore": "cuforge.store.readonly",
    "Entry": "cuforge.store.base",
    "EntryInfo": "cuforge.store.base",
    "StoreStats": "cuforge.store.base",
    "Store": "cuforge.store.base",
}


def __getattr__(name: str) -> Any:
    # unknown names fail before importlib is imported: `from cuforge.store import telemetry`
    # asks here first, and importlib (with warnings) would add ~1 ms to `import cuforge`
    submodule = name in ("single_flight", "schema")  # submodules, named as such
    module_name = _LAZY.get(name)
    if not submodule and module_name is None:
        raise AttributeError(f"module 'cuforge.store' has no attribute {name!r}")
    import importlib

    if submodule:
        return importlib.import_module(f"cuforge.store.{name}")
    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
