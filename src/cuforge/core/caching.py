"""``cuforge.Cache``: the cache as a value you construct and pass.

Every cached entry point (``cuforge.compile``, ``compile_file``, ``load_binary``, ``jit``,
``cuforge.torch.load``, ``cuforge.cccl``, ``cuforge.cute``) takes ``cache=``; without it
they use :func:`default_cache`, which builds one from the ``CUFORGE_*`` environment.

A :class:`Cache` owns, for its directory:

* **the layout** (:class:`cuforge.base.layout.CacheLayout`): every path under the dir;
* **the trust check**: the dir and every directory cuforge opens under it must be yours and
  not writable by group or others; otherwise nothing is read from or written to it (the
  cache then works in memory only, and says so once, with a recursive fix);
* **the tier chain**: memory -> disk -> remotes -> bundles. Remotes are opened lazily (a
  local hit imports no client and opens no connection). Bundles are read-only tiers
  (:class:`cuforge.store.readonly.ReadOnlyStore`), served in place and never written;
* **one build protocol**, :meth:`Cache.build_once`: lookup, strict mode, single flight,
  re-lookup, build -- and :meth:`Cache.record_build` for what a build leaves behind (the
  entries, the explain record, the verbose line);
* its **counters, memos and warn-once sets**, per instance.

What is guaranteed (as cuda.core's ``ProgramCache`` and diskcache state theirs):

* a hit returns bytes that were stored under that key by a build of the same inputs, and
  checksummed on the way (disk, remote envelope, bundle);
* a build runs once per key at a time across threads and processes sharing the dir;
* a damaged entry is a miss (and is rebuilt), never an error or wrong code;
* a ``Cache`` is safe to share between threads. Two ``Cache`` objects on one dir see each
  other's entries (the disk tier is shared), but not each other's memory tier or memos.

What is not: entries may be evicted at any time (the size cap); a remote may be
unreachable (then it is skipped, bounded by its timeouts); the memory tier is per object.
"""

from __future__ import annotations

import contextlib
import os
import sys
from _contextvars import ContextVar
from _thread import allocate_lock
from time import perf_counter

from cuforge.base.config import (
    DEFAULT_CACHE_MAX_BYTES,
    DEFAULT_LEASE_TTL,
    DEFAULT_LOCK_TIMEOUT,
    DEFAULT_MEMORY_MAX_BYTES,
    settings,
)
from cuforge.base.layout import CacheLayout, MachineDir

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: see docs/architecture.md, the warm path
if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable, Iterable, Iterator, Sequence
    from typing import Any, TypeVar

    from cuforge.base.config import Settings
    from cuforge.store.base import Entry, EntryInfo, Store, StoreStats

    R = TypeVar("R")

__all__ = ["Cache", "CallMemo", "Hit", "Flight", "default_cache", "using", "DefaultCounters"]

#: ``watch(cache, key, result, offline_error)``, called for every key :meth:`Cache.build_once`
#: serves or builds while a recording is on (:mod:`cuforge.core.recording`); None otherwise
_watch: Any = None

#: The counters every cache starts with (what ``CUFORGE_VERBOSE`` and the tests read).
#: Integrations add ``"<kind>:<source_of_result>"`` and ``"<kind>:load_errors"``.
_COUNTER_NAMES = (
    "compiles",
    "memory_hits",
    "disk_hits",
    "remote_hits",
    "bundle_hits",
    "call_memo_hits",
)


class CallMemo(dict):
    """The in-process answers of identical calls (the pipeline's call memo), bounded in
    bytes: ``bytes`` is what the answers hold."""

    __slots__ = ("bytes",)

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0

    def clear(self) -> None:
        super().clear()
        self.bytes = 0


#: The call memo of the default caches. Its keys hold the raw CUFORGE_CACHE_DIR value, so
#: caches of different dirs never answer for each other; one table lets the hot path find
#: it without building the default cache (1 us budget).
DEFAULT_CALL_MEMO = CallMemo()


class Cache:
    """A cuforge cache: memory -> disk -> remotes -> bundles (see the module doc).

    ``directory``: the cache dir (created 0700; default: ``CUFORGE_CACHE_DIR`` or the
    platform's user cache dir). ``disk=False``: no disk tier (memory and remotes only).
    ``max_bytes``: the cap of everything cuforge keeps under the dir (LRU). ``memory``:
    keep an in-process tier of ``memory_max_bytes``. ``remotes``: URLs (``redis://``,
    ``http(s)://``, ``file://``, a plug-in's scheme) or :class:`~cuforge.store.base.Store`
    objects, tried in order after the disk; URLs use the signing key and timeouts of the
    remote settings of the environment (key, timeouts). ``read_only``: never write the remotes. ``base_dir``:
    paths under it enter keys relative to it (default: the working directory of each
    call). ``offline``: strict mode, a miss raises :class:`~cuforge.base.errors.OfflineMissError`
    and nothing is built. ``bundles``: paths of ``.cfb`` bundles (or loaded
    :class:`~cuforge.store.bundle.BundleStore` objects) served as read-only tiers after
    the others. ``enabled=False``: no tiers at all (every call builds).
    ``lock_timeout``: seconds a process waits for another's build of the same key (on
    this machine, or on another one holding the remote's build lease). ``lease_ttl``:
    seconds a build lease on a ``redis://`` or ``file://`` remote lives unless its holder
    renews it (a dead holder's expires; 0: no fleet leases, local single flight only).
    ``telemetry``: record hit / miss counters under the dir (``cuforge cache stats``).

    Construction touches no file; the tiers are built on first use.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        *,
        max_bytes: int = DEFAULT_CACHE_MAX_BYTES,
        memory: bool = True,
        memory_max_bytes: int = DEFAULT_MEMORY_MAX_BYTES,
        disk: bool = True,
        remotes: Sequence[str | Store] = (),
        read_only: bool = False,
        base_dir: str | os.PathLike[str] | None = None,
        offline: bool = False,
        bundles: Sequence[str | os.PathLike[str] | Store] = (),
        enabled: bool = True,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
        telemetry: bool = True,
        lease_ttl: float = DEFAULT_LEASE_TTL,
    ) -> None:
        if directory is None:
            directory = settings().cache_dir
        #: the constructor's arguments (:meth:`replace` starts from them)
        self._args = {
            "directory": directory,
            "max_bytes": max_bytes,
            "memory": memory,
            "memory_max_bytes": memory_max_bytes,
            "disk": disk,
            "remotes": remotes,
            "read_only": read_only,
            "base_dir": base_dir,
            "offline": offline,
            "bundles": bundles,
            "enabled": enabled,
            "lock_timeout": lock_timeout,
            "telemetry": telemetry,
            "lease_ttl": lease_ttl,
        }
        if isinstance(remotes, str):
            raise TypeError(
                "remotes must be a sequence of URLs or stores, e.g. ['redis://host:6379/0'], "
                "not one string"
            )
        _check_size("max_bytes", max_bytes)
        _check_size("memory_max_bytes", memory_max_bytes)
        if not (isinstance(lock_timeout, (int, float)) and lock_timeout >= 0):
            raise ValueError(f"lock_timeout must be seconds >= 0, not {lock_timeout!r}")
        if not (isinstance(lease_ttl, (int, float)) and lease_ttl >= 0):
            raise ValueError(f"lease_ttl must be seconds >= 0, not {lease_ttl!r}")
        self.layout = CacheLayout(directory)
        self.directory: str = self.layout.root
        self.max_bytes = int(max_bytes)
        self.memory = bool(memory)
        self.memory_max_bytes = int(memory_max_bytes)
        self.disk = bool(disk)
        self.remote_specs: tuple = tuple(remotes)
        self.read_only = bool(read_only)
        self.base_dir: str | None = (
            os.path.abspath(os.path.expanduser(os.fspath(base_dir))) if base_dir else None
        )
        self.offline = bool(offline)
        self.enabled = bool(enabled)
        self.lock_timeout = float(lock_timeout)
        self.lease_ttl = float(lease_ttl)
        self.telemetry = bool(telemetry)
        #: this cache's outcomes (see :data:`_COUNTER_NAMES`)
        self.counters: dict[str, int] = dict.fromkeys(_COUNTER_NAMES, 0)
        #: the pipeline's call memo (default caches share :data:`DEFAULT_CALL_MEMO`)
        self.call_memo = CallMemo()
        #: in-process memos of integrations, by name (``cache.memo("cccl")``)
        self._memos: dict[str, dict] = {}
        self._warned: set[str] = set()
        self._store: Any = None
        self._built = False  # set last, after _store: the lock-free check in .store
        self._build_lock = allocate_lock()
        self._trust: str | None = None
        #: why the disk tier is left out although the dir is trusted (it cannot be created)
        self._absent: str | None = None
        self._bundles: list[Store] = []
        self._settings: Settings | None = None  # the remote options (default caches)
        #: bundles looked for on the first miss, once: ``source(cache) -> how many it added``
        #: (the default cache is given :func:`cuforge.core.bundle_wheels.load_into`; this
        #: class never imports it)
        self._first_miss_bundles: Callable[[Cache], int] | None = None
        #: a background cuforge.prefetch still running (cuforge.core.prefetch.PrefetchTask)
        self._prefetching: Any = None
        for bundle in bundles:
            self.add_bundle(bundle)

    def __repr__(self) -> str:
        tiers = []
        if self.enabled:
            tiers += ["memory"] if self.memory else []
            tiers += ["disk"] if self.disk else []
            tiers += [f"remote:{_describe(r)}" for r in self.remote_specs]
            tiers += [f"bundle:{getattr(b, 'path', b)}" for b in self._bundles]
        return f"Cache({self.directory!r}, tiers={tiers or 'none'})"

    def replace(self, **changes: Any) -> Cache:
        """A new cache with the same arguments but ``changes`` (e.g. ``offline=True``, or
        another ``directory``): its own memory tier, memos and counters; the bundles it
        serves are the same objects."""
        unknown = set(changes) - set(self._args)
        if unknown:
            raise TypeError(
                f"Cache.replace() got unknown arguments {', '.join(sorted(unknown))}; "
                f"it takes {', '.join(self._args)}"
            )
        args = {**self._args, "bundles": self._bundles, **changes}
        directory = args.pop("directory")
        new = Cache(directory, **args)
        new._settings = self._settings
        return new

    def __reduce__(self):
        # another process (a build worker) gets a cache of the same arguments: its own
        # tiers over the same dir; bundles travel as their paths
        args = dict(self._args)
        args["bundles"] = tuple(
            getattr(b, "path", None) for b in self._bundles if getattr(b, "path", None)
        )
        args["remotes"] = tuple(r for r in self._args["remotes"] if isinstance(r, str))
        return (_rebuild, (args,))

    # ------------------------------------------------------------------ tiers
    @property
    def store(self) -> Store | None:
        """The writable chain (memory -> disk -> remotes) as one store, or None when the
        cache is disabled. Built on first use; checks the dir's trust then."""
        if not self._built:
            self._build_tiers()
        return self._store

    @property
    def chain(self) -> tuple[Store, ...]:
        """Every tier group to ask, in order: the writable chain, then each bundle
        (read-only). Lookups that must find a manifest and its entry in the same place
        walk this; a plain lookup is :meth:`get_with_tier`."""
        store = self.store
        if store is None:  # disabled: nothing is looked up, bundles included
            return ()
        return (store, *self._bundles) if self._bundles else (store,)

    @property
    def bundles(self) -> tuple[Store, ...]:
        """The bundles served as read-only tiers, in lookup order."""
        return tuple(self._bundles)

    def add_bundle(self, bundle: str | os.PathLike[str] | Store, *, verify: bool = True) -> Store:
        """Serve ``bundle`` (a path to a ``.cfb`` bundle, or a loaded store) as a read-only
        tier after the others. Returns the tier. Adding the same bundle file twice serves
        it once."""
        from cuforge.store.readonly import ReadOnlyStore

        if isinstance(bundle, (str, os.PathLike)):
            from cuforge.store.bundle import BundleStore

            real = os.path.realpath(os.fspath(bundle))
            for loaded in self._bundles:
                if getattr(loaded, "path", None) == real:
                    return loaded
            bundle = BundleStore(bundle, verify=verify)  # warns for a link
        for loaded in self._bundles:
            if loaded is bundle or getattr(loaded, "inner", None) is bundle:
                return loaded
        tier = bundle if getattr(bundle, "read_only", False) else ReadOnlyStore(bundle)
        self._bundles.append(tier)
        self.clear_memos()  # answers given before must not hide the new tier's entries
        return tier

    def remove_bundle(self, bundle: Store) -> bool:
        """Stop serving ``bundle`` (the tier :meth:`add_bundle` returned, or the store it
        wraps). True when it was served."""
        for loaded in self._bundles:
            if loaded is bundle or getattr(loaded, "inner", None) is bundle:
                self._bundles.remove(loaded)
                self.clear_memos()  # answers it gave must not outlive it
                return True
        return False

    def _build_tiers(self) -> None:
        # called under _build_lock; _built is published after _store (a thread that sees
        # _built without the lock must see the store too), and also when this raises, as
        # before (a failed build is not retried on every call)
        try:
            self._store = self._make_store()
        finally:
            self._built = True

    def _make_store(self) -> Any:
        if not self.enabled:
            return None
        from cuforge.store.memory import MemoryStore

        tiers: list = []
        if self.memory:
            tiers.append(MemoryStore(self.memory_max_bytes))
        disk_root = None
        if self.disk:
            problem = self.layout.ensure()
            self._trust = problem
            if problem is None:
                from cuforge.store.disk import DiskStore

                disk = DiskStore(self.layout, self.max_bytes, telemetry=self.telemetry)
                if disk.disabled and not os.path.isdir(disk.root):
                    # the dir cannot be created: the disk tier gave its one warning (with
                    # the fix); without a dir there are no locks, miss logs or entries
                    # either, so nothing else warns about it again
                    self._absent = disk.disabled_reason or "the cache dir cannot be created"
                else:
                    tiers.append(disk)
                    disk_root = disk.root
            else:
                self.warn_once(
                    f"cuforge: not using the disk cache: {problem}. Whoever can write a cache "
                    "dir can make this process run their code, so cuforge reads nothing from "
                    "it and caches in memory only until it is fixed."
                )
        pending = None
        if self.remote_specs:
            # opened on first use: a local hit imports no remote module and opens nothing
            pending = _PendingRemotes(lambda: self._open_remotes(disk_root))
            tiers.append(pending)
        if not tiers:
            return None
        if len(tiers) == 1 and self.memory:
            return tiers[0]
        from cuforge.store.tiered import TieredStore

        store = TieredStore(tiers)
        if pending is not None:
            pending.owner = store.tiers
        return store

    def _open_remotes(self, telemetry_root: str | None) -> list:
        urls = [r for r in self.remote_specs if isinstance(r, str)]
        stores = [r for r in self.remote_specs if not isinstance(r, str)]
        opened: list = []
        if urls:
            from cuforge.base.config import Settings
            from cuforge.store.remote import open_remotes

            base = self._settings or settings()
            cfg = Settings.__new__(Settings)  # a copy without importing copy (~0.8 ms)
            for name in Settings.__slots__:
                setattr(cfg, name, getattr(base, name))
            cfg.remote = tuple(urls)
            cfg.remote_readonly = self.read_only or cfg.remote_readonly
            opened = list(open_remotes(cfg, telemetry_root=telemetry_root))
        return [*opened, *stores]

    # ------------------------------------------------------------------ trust
    def trust_problem(self, *paths: str) -> str | None:
        """Why this cache's dir (and every directory on the way to ``paths`` under it)
        cannot be trusted, or None. See :meth:`cuforge.base.layout.CacheLayout.trust_problem`."""
        if not paths and self._built and self._trust is not None:
            return self._trust
        return self.layout.trust_problem(*paths)

    @property
    def trusted(self) -> bool:
        """Whether the disk tier is in use (the dir passed the trust check)."""
        self.store  # noqa: B018 - builds the tiers, which runs the check
        return self.disk and self.enabled and self._trust is None and self._absent is None

    @property
    def lock_dir(self) -> str | None:
        """Where compile locks live, or None (per-process locks) when there is no trusted
        disk tier."""
        return self.layout.locks if self.trusted else None

    @property
    def explain_root(self) -> str | None:
        """The dir the miss history is written under, or None when nothing may be."""
        return self.directory if self.trusted else None

    def keyed_base_dir(self) -> str:
        """The base dir of keyed paths for a call made now."""
        from cuforge.base.paths import base_dir

        return self.base_dir or base_dir(settings().base_dir)

    # ------------------------------------------------------------------ the Store face
    def get_with_tier(
        self, key: str, *, kind: str | None = None
    ) -> tuple[Entry | None, str | None]:
        """``(entry, tier name)`` from the first tier that has ``key``: ``"memory"``,
        ``"disk"``, ``"remote"`` (or ``"remote#2"``...), ``"bundle"``; ``(None, None)``."""
        store = self.store
        if store is None:
            return None, None
        if not self._bundles:
            return store.get_with_tier(key, kind=kind)
        with self.counted_lookup() as answered:
            entry, tier = store.get_with_tier(key, kind=kind)
            if entry is not None:
                return entry, tier
            for bundle in self._bundles:
                entry, tier = bundle.get_with_tier(key, kind=kind)
                if entry is not None:
                    answered(entry, tier or "bundle")
                    return entry, tier
        return None, None

    @contextlib.contextmanager
    def counted_lookup(self) -> Iterator[Callable[[Entry, str], None]]:
        """A lookup that walks :attr:`chain` past the writable tiers: the writable chain's
        misses wait, and a bundle's answer (reported through the function it yields, with
        ``(entry, tier name)``) is one hit of that tier instead of a miss; with no answer,
        the misses count (``cuforge cache stats``: one definition of a hit)."""
        held = getattr(self.store, "misses_held", None)
        if not self._bundles or held is None:
            yield lambda entry, tier: None
            return
        with held() as answered:
            yield answered

    def get(self, key: str, *, kind: str | None = None) -> Entry | None:
        return self.get_with_tier(key, kind=kind)[0]

    def put(self, entry: Entry, *, durable: bool = True) -> bool:
        """Store ``entry`` in the writable tiers (never in a bundle)."""
        store = self.store
        return store.put(entry, durable=durable) if store is not None else False

    def delete(self, key: str) -> bool:
        """Delete ``key`` from the writable tiers."""
        store = self.store
        return store.delete(key) if store is not None else False

    def iterate(self) -> Iterator[EntryInfo]:
        store = self.store
        return iter(()) if store is None else store.iterate()

    def stats(self) -> StoreStats:
        from cuforge.store.base import StoreStats

        store = self.store
        return store.stats() if store is not None else StoreStats(tier="none")

    # ------------------------------------------------------------------ per-instance state
    def memo(self, name: str) -> dict:
        """An in-process memo of this cache, by name (integrations keep their answered
        calls here, so a memo never outlives or crosses its cache)."""
        memo = self._memos.get(name)
        if memo is None:
            memo = self._memos[name] = {}
        return memo

    def clear_memos(self) -> None:
        """Forget this cache's in-process answers (the call memo and the integrations');
        the tiers keep their entries."""
        self.call_memo.clear()
        for memo in self._memos.values():
            memo.clear()

    def count(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n

    def count_served(self, kind: str, how: str) -> None:
        """Count one call of the ``kind`` integration by what served it (``how``: one of
        :data:`cuforge.store.telemetry.SERVED_EVENTS`: ``"pretrace"``, ``"ir"``,
        ``"uncached"``): in :attr:`counters` as ``"<kind>:served:<how>"`` and, with a
        trusted disk tier and telemetry on, in the cache dir's telemetry (``cuforge cache
        stats``: ``served``)."""
        from cuforge.store import telemetry

        if how not in telemetry.SERVED_EVENTS:
            raise ValueError(
                f"count_served(how={how!r}): expected one of {', '.join(telemetry.SERVED_EVENTS)}"
            )
        self.count(f"{kind}:served:{how}")
        if self.telemetry and self.disk and self.store is not None and self.trusted:
            telemetry.record(self.directory, how, tier=telemetry.SERVED, kind=kind, name=None)

    def warn_once(self, message: str) -> None:
        """Log ``message`` as a warning, once per cache."""
        if message in self._warned:
            return
        self._warned.add(message)
        import logging

        logging.getLogger("cuforge").warning(message)

    # ------------------------------------------------------------------ the build protocol
    def build_once(
        self,
        key: str,
        *,
        what: str,
        lookup: Callable[[], R | None],
        build: Callable[[], R],
        offline_error: Callable[[], BaseException],
        strict: bool = False,
    ) -> R:
        """The one protocol every cached build follows (:meth:`begin`, then ``build()``):

        1. ``lookup()`` -- a hit is returned as is;
        2. strict mode (``strict`` or the cache's ``offline``): raise ``offline_error()``,
           nothing is built;
        3. take the single-flight lock of ``key`` (threads and processes sharing the dir;
           ``what`` names the build to a process waiting behind this one);
        4. ``lookup()`` again -- another thread or process may have built it meanwhile;
        5. with a remote that has build leases (``redis://``, ``file://``; see
           :mod:`cuforge.store.lease`): take the fleet lease of ``key``, or, while another
           machine holds it, poll ``lookup()`` until its entry appears (returned), the
           lease expires (taken) or ``lock_timeout`` passes (built anyway);
        6. the compile fence (:func:`cuforge.fence`) is asked;
        7. ``build()``, which builds, stores (:meth:`record_build`) and returns (then the
           lease and the lock are released).

        With the cache disabled there is no lock and nothing to look up: it builds. While a
        background :func:`cuforge.prefetch` runs, this first waits for it."""
        with MachineDir(self.directory):  # machine memos made meanwhile go to this dir
            got = self.begin(
                key, what=what, lookup=lookup, offline_error=offline_error, strict=strict
            )
            if type(got) is Hit:
                return got.value
            with got:
                built = build()
            if _watch is not None:  # a recording (cuforge.record) is on
                _watch(self, key, built, offline_error)
            return built

    def begin(
        self,
        key: str,
        *,
        what: str,
        lookup: Callable[[], R | None],
        offline_error: Callable[[], BaseException],
        strict: bool = False,
    ) -> Hit | Flight:
        """The two-phase form of :meth:`build_once`, for a system that builds between two
        of its own calls (Triton: ``get_group`` misses, Triton compiles, ``put_group``).

        Returns a :class:`Hit` (steps 1-5 found the value) or a :class:`Flight`: this
        process builds, holding the key's single-flight lock and fleet lease until
        :meth:`Flight.commit` stores the entries (or :meth:`Flight.close` gives up). There
        is no way to store a build without holding its flight, so no caller can write
        the racy "look up, build, put" by hand. Not guaranteed: a flight that is never
        closed holds its lock until the process exits (the lock is an OS lock: another
        process takes it then); waiters give up after ``lock_timeout`` and build
        themselves."""
        if self._prefetching is not None:
            self._prefetching.settle()
        hit = lookup()
        if hit is None and self._first_miss_bundles is not None:
            hit = self._load_first_miss_bundles(lookup)
        if hit is not None:
            return self._hit(key, hit, offline_error)
        if strict or self.offline:
            raise offline_error()
        from cuforge.core.fencing import before_build  # the fence: asked on the build path only

        if self.store is None:
            before_build(self, key, what, offline_error)
            return Flight(self, key, what, offline_error, None, None)
        from cuforge.store.single_flight import single_flight

        lock = single_flight(self.lock_dir, key, self.lock_timeout, what=what)
        lock.__enter__()
        flight = Flight(self, key, what, offline_error, lock, None)
        try:
            hit = lookup()
            if hit is None:
                tier = self._lease_tier()
                if tier is not None:
                    from cuforge.store import lease as _lease

                    hit, flight._lease = _lease.acquire(
                        tier,
                        key,
                        what=what,
                        ttl=self.lease_ttl,
                        timeout=self.lock_timeout,
                        lookup=lookup,
                    )
            if hit is not None:
                flight.close()
                return self._hit(key, hit, offline_error)
            before_build(self, key, what, offline_error)
        except BaseException:
            flight.close()
            raise
        return flight

    def _hit(self, key: str, value: Any, offline_error: Callable[[], BaseException]) -> Hit:
        if _watch is not None:  # a recording (cuforge.record) is on
            _watch(self, key, value, offline_error)
        return Hit(value)

    def _load_first_miss_bundles(self, lookup: Callable[[], R | None]) -> R | None:
        """The first miss: add the bundles this cache was given to look for then (the
        default cache: the installed bundle wheels) and look again when any was added."""
        source, self._first_miss_bundles = self._first_miss_bundles, None
        if self.store is None or source is None:
            return None
        return lookup() if source(self) else None

    def _lease_tier(self):
        """The first remote tier that hands out build leases (opening the remotes: this
        is a miss path), or None: no remote, none with leases, ``lease_ttl`` 0."""
        if not self.remote_specs or self.lease_ttl <= 0:
            return None
        for tier in list(getattr(self._store, "tiers", ())):
            found = tier._real() if isinstance(tier, _PendingRemotes) else (tier,)
            for one in found:
                if getattr(one, "leases", False) is True:
                    return one
        return None

    def record_build(
        self,
        name: str,
        key: str,
        fields: dict[str, str],
        entries: Iterable[Entry] = (),
        *,
        uncached: str | None = None,
        remember: bool = True,
    ) -> None:
        """What a build leaves behind: ``entries`` stored in the writable tiers, the miss
        explained (``CUFORGE_EXPLAIN`` / ``cuforge cache explain``: which labeled field
        changed since the last key of ``name``) and the key remembered. ``uncached``: the
        build could not be cached, and why (logged as a miss; nothing is stored).
        ``remember=False``: explain the miss but neither store nor remember the key (a
        build whose inputs changed while it ran)."""
        from cuforge.keys import explain as _explain

        root = self.explain_root if self.store is not None else None
        if uncached is not None:
            _explain.log_miss(root, name, key, [f"not cached: {uncached}"])
            if settings().explain:
                print(f"cuforge: {name} not cached: {uncached}", file=sys.stderr)
            return
        reasons = _explain.explain(root, name, fields, self.keyed_base_dir())
        if reasons:
            _explain.log_miss(root, name, key, reasons)
            if settings().explain:
                print(f"cuforge: miss for {name}: " + "; ".join(reasons), file=sys.stderr)
        if not remember:
            return
        for entry in entries:
            self.put(entry)
        _explain.remember(root, name, key, fields)

    @staticmethod
    def verbose(line: str) -> None:
        """Print ``line`` on stderr when ``CUFORGE_VERBOSE`` is on."""
        if settings().verbose:
            print(line, file=sys.stderr)


class Hit:
    """:meth:`Cache.begin` found the value (``value``): nothing is to be built."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


class Flight:
    """:meth:`Cache.begin` missed: this process builds ``key``. It holds the key's
    single-flight lock (and the fleet lease, with a remote that has leases) until
    :meth:`commit` or :meth:`close`; as a context manager it closes on exit.

    ``commit(name, fields, entries)`` stores the entries, explains the miss
    (:meth:`Cache.record_build`) and then releases; a build that failed just closes, and
    the next waiter builds."""

    __slots__ = ("cache", "key", "what", "_offline_error", "_lock", "_lease", "started")

    def __init__(self, cache: Cache, key: str, what: str, offline_error, lock, lease) -> None:
        self.cache = cache
        self.key = key
        self.what = what
        self._offline_error = offline_error
        self._lock = lock
        self._lease = lease
        #: when the build started (``time.perf_counter()``): its compile seconds
        self.started = perf_counter()

    def commit(
        self, name: str, fields: dict[str, str], entries: Iterable[Entry], **record: Any
    ) -> None:
        """Store ``entries`` as the build of ``key`` (:meth:`Cache.record_build` with
        ``name``, ``fields`` and ``record``'s options), then release the flight."""
        try:
            self.cache.record_build(name, self.key, fields, entries, **record)
        finally:
            self.close()

    def close(self) -> None:
        """Release the lease, then the lock (again: nothing)."""
        lease, self._lease = self._lease, None
        lock, self._lock = self._lock, None
        try:
            if lease is not None:
                lease.release()
        finally:
            if lock is not None:
                lock.__exit__(None, None, None)

    @property
    def open(self) -> bool:
        """Whether the flight still holds its lock."""
        return self._lock is not None

    def __enter__(self) -> Flight:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _PendingRemotes:
    """The remote tiers of a cache before their first use. On the first call of any
    method it opens them (:func:`cuforge.store.remote.open_remotes`: the client modules,
    the URL checks) and puts them in its place in the chain's tier list, so the chain
    goes on with the real tiers; until then a local hit pays nothing for a configured
    remote (no import, no connection)."""

    tier = "remote"
    telemetry = False  # the chain records remote events (as for a RemoteStore)

    def __init__(self, open_all: Callable[[], list]) -> None:
        self._open_all = open_all
        self._opened: list | None = None
        #: the chain's tier list this placeholder stands in (set by the cache)
        self.owner: list | None = None

    def _real(self) -> list:
        if self._opened is None:
            self._opened = list(self._open_all())
            owner = self.owner
            if owner is not None:
                for i, tier in enumerate(owner):
                    if tier is self:
                        owner[i : i + 1] = self._opened
                        break
            if self._opened:
                self.tier = self._opened[0].tier
        return self._opened

    def get(self, key: str, *, kind: str | None = None):
        real = self._real()
        return real[0].get(key, kind=kind) if real else None

    def get_with_tier(self, key: str, *, kind: str | None = None):
        real = self._real()
        return real[0].get_with_tier(key, kind=kind) if real else (None, None)

    def put(self, entry, *, durable: bool = True) -> bool:
        real = self._real()
        return real[0].put(entry, durable=durable) if real else False

    def delete(self, key: str) -> bool:
        real = self._real()
        return real[0].delete(key) if real else False

    def contains(self, key: str, *, kind: str | None = None) -> bool:
        real = self._real()
        return bool(real) and real[0].contains(key, kind=kind)

    def iterate(self):
        real = self._real()
        return real[0].iterate() if real else iter(())

    def stats(self):
        from cuforge.store.base import StoreStats

        real = self._real()
        return real[0].stats() if real else StoreStats(tier="remote")

    def __getattr__(self, name: str):
        real = self._real()
        if not real:
            raise AttributeError(name)
        return getattr(real[0], name)


def _check_size(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a number of bytes >= 0, not {value!r}")


def _describe(remote: object) -> str:
    if isinstance(remote, str):
        return remote.split("@")[-1]  # no password in a repr
    return getattr(remote, "tier", type(remote).__name__)


# caches rebuilt from their arguments in this process (a build worker is sent the same
# cache with every task: it opens its tiers, and reads the disk tier's journal, once)
_rebuilt: dict[tuple, Cache] = {}


def _rebuild(args: dict) -> Cache:
    key = tuple(sorted((name, os.fspath(v) if isinstance(v, os.PathLike) else v)
                       for name, v in args.items()))  # fmt: skip
    cache = _rebuilt.get(key)
    if cache is None:
        rest = dict(args)
        cache = _rebuilt[key] = Cache(rest.pop("directory"), **rest)
    return cache


# ---------------------------------------------------------------------- the default cache

# (the Settings object it was built for, the fields that shape it, the cache)
_default: tuple[Any, tuple, Cache | None] = (None, (), None)
_override: ContextVar[Cache | None] = ContextVar("cuforge_cache", default=None)


def default_cache() -> Cache:
    """The cache the ``CUFORGE_*`` environment describes (inside :func:`using`, the cache
    given there). Memoized on the settings snapshot: while the environment is unchanged
    this is one identity check; when it changes, a new cache is built only if a setting
    that shapes it changed (so an unrelated one, e.g. ``CUFORGE_VERBOSE``, keeps the
    memory tier and the counters)."""
    override = _override.get()
    if override is not None:
        return override
    global _default
    current = settings()
    memo = _default
    if memo[0] is current and memo[2] is not None:
        return memo[2]
    shape = (
        current.disable_cache,
        current.disable_file_cache,
        current.cache_dir,
        current.memory_max_bytes,
        current.cache_max_bytes,
        current.base_dir,
        current.offline,
        current.lock_timeout,
        current.lease_ttl,
        current.telemetry,
        *current.remote_shape(),
    )
    if memo[1] == shape and memo[2] is not None:
        _default = (current, shape, memo[2])
        return memo[2]
    cache = Cache(
        current.cache_dir,
        max_bytes=current.cache_max_bytes,
        memory_max_bytes=current.memory_max_bytes,
        disk=not current.disable_file_cache,
        remotes=current.remote,
        read_only=current.remote_readonly,
        base_dir=current.base_dir or None,
        offline=current.offline,
        enabled=not current.disable_cache,
        lock_timeout=current.lock_timeout,
        telemetry=current.telemetry,
        lease_ttl=current.lease_ttl,
    )
    cache._settings = current
    cache._first_miss_bundles = _installed_bundle_wheels  # added on the first miss
    cache.call_memo = DEFAULT_CALL_MEMO
    _default = (current, shape, cache)
    return cache


def _installed_bundle_wheels(cache: Cache) -> int:
    """The default cache's first-miss bundles: the installed bundle wheels
    (:func:`cuforge.core.bundle_wheels.load_into`, imported here: never on a hit)."""
    from cuforge.core.bundle_wheels import load_into

    return load_into(cache)


def current_override() -> Cache | None:
    """The cache :func:`using` set for this context, or None."""
    return _override.get()


class using:
    """``with cuforge.using(cache):`` -- calls that pass no ``cache=`` use ``cache`` in this
    block (this thread / asyncio task only; restored after). For code you do not control,
    e.g. a project function that calls ``cuforge.cute.compile`` without ``cache=``."""

    def __init__(self, cache: Cache) -> None:
        if not isinstance(cache, Cache):
            raise TypeError(f"cache must be a cuforge.Cache, not {type(cache).__name__}")
        self.cache = cache
        self._token: Any = None

    def __enter__(self) -> Cache:
        self._token = _override.set(self.cache)
        return self.cache

    def __exit__(self, *exc: object) -> None:
        _override.reset(self._token)


def resolve(cache: Cache | None) -> Cache:
    """``cache``, or :func:`default_cache` when it is None; a TypeError names the argument
    when it is something else."""
    if cache is None:
        return default_cache()
    if isinstance(cache, Cache):
        return cache
    raise TypeError(f"cache must be a cuforge.Cache or None, not {type(cache).__name__}")


class DefaultCounters:
    """A live view of :func:`default_cache`'s counters (``cuforge.core.pipeline.counters``):
    what the default cache did in this process."""

    def _data(self) -> dict[str, int]:
        return default_cache().counters

    def __getitem__(self, name: str) -> int:
        return self._data().get(name, 0)

    def __setitem__(self, name: str, value: int) -> None:
        self._data()[name] = value

    def get(self, name: str, default: int = 0) -> int:
        return self._data().get(name, default)

    def items(self):
        return self._data().items()

    def keys(self):
        return self._data().keys()

    def values(self):
        return self._data().values()

    def __iter__(self):
        return iter(self._data())

    def __contains__(self, name: object) -> bool:
        return name in self._data()

    def __len__(self) -> int:
        return len(self._data())

    def __repr__(self) -> str:
        return f"DefaultCounters({self._data()!r})"
