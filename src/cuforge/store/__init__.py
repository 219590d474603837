"""cuforge's cache tiers: memory, disk, tiered, single flight and telemetry.

:func:`default_store` builds the store the settings ask for (and memoizes it);
:func:`lock_dir` is where the compile locks live. Everything else is imported lazily,
so ``import cuforge.store`` stays cheap:

* :class:`MemoryStore` (``cuforge.store.memory``), :class:`DiskStore`
  (``cuforge.store.disk``), :class:`TieredStore` (``cuforge.store.tiered``)
* the submodule :mod:`cuforge.store.single_flight` (``single_flight.single_flight``)
* :func:`~cuforge.store.archive.export_archive` / ``import_archive``
  (``cuforge.store.archive``)
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
    "trust_problem",
    "is_untrusted",
    "MemoryStore",
    "DiskStore",
    "TieredStore",
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
    "Entry": "cuforge.store.base",
    "EntryInfo": "cuforge.store.base",
    "StoreStats": "cuforge.store.base",
    "Store": "cuforge.store.base",
}

# (the Settings object it was built for, the fields that shape it, the store)
_memo: tuple[Any, tuple, Any] = (None, (), None)
# cache dirs that failed the trust check (nothing is read from them: no disk tier, no locks)
_untrusted: set[str] = set()
# problems already reported (once per process)
_reported: set[str] = set()

#: the directories under the cache dir that cuforge creates and must be able to trust
_OWN_DIRS = ("", "v1", "v1/entries", "v1/index", "locks")


def trust_problem(cache_dir: str) -> str | None:
    """Why the cache dir cannot be trusted (ssh's StrictModes rule, applied to it and to
    each directory cuforge creates inside it), or None. See :func:`cuforge._fs.trust_problem`."""
    from cuforge._fs import trust_problem as check

    for sub in _OWN_DIRS:
        problem = check(os.path.join(cache_dir, sub) if sub else cache_dir)
        if problem is not None:
            return problem
    return None


def is_untrusted(cache_dir: str) -> bool:
    """Whether :func:`default_store` found ``cache_dir`` untrusted (then nothing may be
    read from or written to it: telemetry, miss history and probe memos included)."""
    return cache_dir in _untrusted


def _report_untrusted(problem: str) -> None:
    if problem in _reported:
        return
    _reported.add(problem)
    import logging

    logging.getLogger("cuforge").warning(
        "cuforge: not using the disk cache: %s. Whoever can write a cache dir can make this "
        "process run their code, so cuforge reads nothing from it and caches in memory only "
        "until it is fixed.",
        problem,
    )


def default_store() -> Store | None:
    """The store the current settings ask for:

    * ``None`` when ``CUFORGE_DISABLE_CACHE`` is set (always compile);
    * a :class:`MemoryStore` when ``CUFORGE_DISABLE_FILE_CACHE`` is set;
    * else ``TieredStore([MemoryStore(memory_max_bytes), DiskStore(cache_dir, cache_max_bytes)])``;
    * but only the :class:`MemoryStore` when the cache dir fails :func:`trust_problem` (it
      or a directory cuforge made in it is owned by another user, or writable by group or
      others): nothing is read from that dir, and a warning says so once per process,
      with the fix;
    * with ``CUFORGE_REMOTE`` set, one remote tier per URL after those
      (:func:`cuforge.store.remote.open_remotes`), in a :class:`TieredStore` (memory +
      remotes when the disk tier is off or untrusted). Remote events are recorded in the
      disk tier's telemetry when there is one.

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
        *current.remote_shape(),
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
        problem = None
        if not current.disable_file_cache:
            try:  # create it (0700) before the check: no window for someone else to
                os.makedirs(current.cache_dir, mode=0o700, exist_ok=True)
            except OSError:
                pass  # the disk tier reports an unusable dir itself
            problem = trust_problem(current.cache_dir)
        if problem is not None:
            _untrusted.add(current.cache_dir)
            _report_untrusted(problem)
        else:
            _untrusted.discard(current.cache_dir)
        local: list = [memory]
        if not current.disable_file_cache and problem is None:
            from cuforge.store.disk import DiskStore

            local.append(DiskStore(current.cache_dir, current.cache_max_bytes))
        remotes: list = []
        if current.remote:
            from cuforge.store.remote import open_remotes

            root = local[1].root if len(local) > 1 else None  # the disk tier's own root
            remotes = open_remotes(current, telemetry_root=root)
        if len(local) + len(remotes) == 1:
            store = memory
        else:
            from cuforge.store.tiered import TieredStore

            store = TieredStore([*local, *remotes])
    _memo = (current, shape, store)
    return store


def lock_dir() -> str | None:
    """``<cache_dir>/locks``, or None when file caching is off or the cache dir is not
    trusted (then locks are per process)."""
    current = settings()
    if current.disable_cache or current.disable_file_cache:
        return None
    if _untrusted and current.cache_dir in _untrusted:
        return None
    return os.path.join(current.cache_dir, "locks")


def reset_default_store() -> None:
    """Forget the memoized store (tests; after changing the cache dir's contents by hand)."""
    global _memo
    _memo = (None, (), None)


def __getattr__(name: str) -> Any:
    # unknown names fail before importlib is imported: `from cuforge.store import telemetry`
    # asks here first, and importlib (with warnings) would add ~1 ms to `import cuforge`
    submodule = name in ("single_flight", "archive", "schema")  # submodules, named as such
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
