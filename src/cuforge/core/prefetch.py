"""``cuforge.prefetch`` / ``cuforge prefetch``: a lockfile (:mod:`cuforge.core.recording`)
turned into a warm local cache.

:func:`prefetch` pulls exactly the lock's entries from the remote tiers (and the bundles)
into the local cache (disk, and the memory tier of the cache given); it reports what no
tier has. The disk writes are one batch (:meth:`cuforge.store.disk.DiskStore.bulk`): one
journal append at the end, not one per entry. ``cuforge build --lock``
(:func:`cuforge.aot.build.build_lock`) makes a bundle of the same set.
"""

from __future__ import annotations

import os
from contextlib import nullcontext as _nothing

from cuforge.core.caching import Cache, resolve
from cuforge.core.recording import lock_keys, read_lock

TYPE_CHECKING = False  # `cuforge.prefetch` runs at service start: no typing import
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from cuforge.store.disk import DiskStore

__all__ = ["prefetch", "PrefetchTask", "LockReport"]


class LockReport:
    """What :func:`build_lock` / :func:`prefetch` did: ``copied`` (entries taken from the
    cache, or already local), ``fetched`` (pulled from a remote), ``built`` (variants built
    from a stanza), ``missing`` (``"kind name key"`` lines), ``bundle`` and its size."""

    def __init__(self) -> None:
        self.copied = 0
        self.fetched = 0
        self.built = 0
        self.missing: list[str] = []
        self.failures: list[str] = []
        self.bundle: str | None = None
        self.bundle_bytes = 0
        self.entries = 0

    @property
    def ok(self) -> bool:
        return not self.missing and not self.failures

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items()} | {"ok": self.ok}


def _disk_tier(cache: Cache) -> DiskStore | None:
    """The disk tier of ``cache``'s writable chain, or None (no trusted disk tier)."""
    from cuforge.store.disk import DiskStore

    store = cache.store
    for tier in getattr(store, "tiers", (store,)):
        if isinstance(tier, DiskStore):
            return tier
    return None


def _tiers(cache: Cache) -> list:
    store = cache.store
    return list(getattr(store, "tiers", (store,))) if store is not None else []


def _far_tiers(cache: Cache) -> list:
    """Every remote tier of ``cache`` (opened now: the chain's placeholder stands in for
    all of them but asks the first only), then its bundles."""
    from cuforge.core.caching import _PendingRemotes

    for tier in _tiers(cache):
        if isinstance(tier, _PendingRemotes):
            tier._real()  # puts the real tiers in the chain's list in its place
    far = [t for t in _tiers(cache) if t.tier not in ("memory", "disk")]
    return [t for t in far if not isinstance(t, _PendingRemotes)] + list(cache.bundles)


class PrefetchTask:
    """A :func:`prefetch` running in a background thread (``background=True``).

    While it runs, every build of its cache (:meth:`cuforge.Cache.build_once`, the path of
    every compile, before its first lookup) waits for it to finish: a kernel the lockfile
    names is then a memory hit, never a compile racing the download. ``wait()`` returns
    the :class:`LockReport` (or raises what the prefetch raised); a build that waited for
    a failed prefetch goes on without it, and the cache warns the reason once."""

    def __init__(self, cache: Cache, run: Callable[[], LockReport]) -> None:
        import threading

        self._cache = cache
        self._run = run
        self._done = threading.Event()
        self._report: LockReport | None = None
        self._error: BaseException | None = None
        #: the prefetch's own wall time, seconds (overlapping whatever the process did)
        self.seconds = 0.0
        self._thread = threading.Thread(target=self._main, name="cuforge-prefetch", daemon=True)

    def _start(self) -> PrefetchTask:
        self._cache._prefetching = self
        self._thread.start()
        return self

    def _main(self) -> None:
        from time import perf_counter

        t0 = perf_counter()
        try:
            self._report = self._run()
        except BaseException as exc:  # noqa: BLE001 - kept for wait() and the waiting builds
            self._error = exc
        finally:
            self.seconds = perf_counter() - t0
            # a failure stays for the next build to warn about (settle), however soon it came
            if self._error is None and self._cache._prefetching is self:
                self._cache._prefetching = None
            self._done.set()

    def done(self) -> bool:
        """True once the prefetch has finished (or failed)."""
        return self._done.is_set()

    def settle(self) -> None:
        """Wait for the prefetch to finish; never raises (a failure is warned once by the
        cache: its lookups go on without the prefetch)."""
        import threading

        if threading.current_thread() is self._thread:
            return  # the prefetch itself (never builds; no waiting on itself)
        self._done.wait()
        if self._cache._prefetching is self:
            self._cache._prefetching = None
        if self._error is not None:
            self._cache.warn_once(
                f"cuforge.prefetch (background) failed, lookups go on without it: "
                f"{type(self._error).__name__}: {self._error}"
            )

    def wait(self, timeout: float | None = None) -> LockReport:
        """The prefetch's :class:`LockReport`, once it has finished (``TimeoutError`` after
        ``timeout`` seconds); raises what the prefetch raised."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"cuforge.prefetch has not finished after {timeout} s")
        if self._error is not None:
            raise self._error
        assert self._report is not None
        return self._report


def prefetch(
    lock: str | os.PathLike[str],
    *,
    cache: Cache | None = None,
    progress: Callable[[int, int, str, str], None] | None = None,
    memory: bool = True,
    background: bool = False,
) -> LockReport | PrefetchTask:
    """Pull the entries of ``lock`` (a lockfile written by :func:`cuforge.record`) from the
    remote tiers (and the bundles) of ``cache`` (default: :func:`cuforge.default_cache`)
    into its local ones, before the first kernel::

        report = cuforge.prefetch("cuforge.lock")   # at service start-up
        if not report.ok: ...                       # report.missing: what no tier has

    ``background=True`` returns at once a :class:`PrefetchTask` and pulls in a thread,
    overlapping what the process does next (creating its CUDA context, loading weights);
    the cache's builds wait for it, so no lookup misses what it is still fetching. It
    also settles the NVRTC identity the first key needs (in a fresh cache dir that is
    NVRTC located and probed, ~40 ms, else paid by the first lookup)::

        task = cuforge.prefetch("cuforge.lock", background=True)
        ...                                         # torch.cuda.init(), model loading
        report = task.wait()

    Each entry is read once from the first tier that has it (the remote checks its
    envelope, and its signature when a keyring is set, as every remote read does), then
    written once to the disk tier (one journal batch for the whole set,
    :meth:`cuforge.store.disk.DiskStore.bulk`; not fsynced: like the chain's copy of
    a remote hit, it is a copy of what the remote keeps, and a torn one is a checksum miss
    fetched again) and, when ``memory`` (the default), put in the cache's memory tier, so
    that this process's first lookups are memory hits. An entry already on disk is only
    copied into memory.
    ``progress(done, total, where, label)``: called per entry, ``where`` is ``"local"``,
    ``"remote"`` or ``"missing"``. Torch extensions are never fetched (they are rebuilt
    from their stanza): they are listed in ``report.missing``."""
    cache = resolve(cache)
    records = read_lock(os.fspath(lock))  # a bad lockfile raises here, in the caller
    if background:

        def run() -> LockReport:
            report = _prefetch(cache, records, progress, memory)
            if report.missing:  # no caller looks at the report yet: say it now
                cache.warn_once(
                    f"cuforge.prefetch (background): {len(report.missing)} entries of "
                    f"{os.fspath(lock)} are in no tier (they will be built, or refused under "
                    f"a fence): {', '.join(report.missing[:5])}"
                    + (", ..." if len(report.missing) > 5 else "")
                )
            _settle_nvrtc_identity()
            return report

        return PrefetchTask(cache, run)._start()
    return _prefetch(cache, records, progress, memory)


def _settle_nvrtc_identity() -> None:
    """Compute (and memo) the NVRTC identity every ``cuforge.compile`` key holds, as the
    first lookup would. Where NVRTC is missing or broken the first compile says so itself,
    with its own message; here there is nothing to report it to."""
    from cuforge.base.errors import ToolchainError
    from cuforge.toolchain.identity import compiler_identity

    try:
        compiler_identity("nvrtc")
    except (ToolchainError, OSError):
        pass


def _prefetch(cache: Cache, records: list[dict], progress, memory: bool) -> LockReport:
    wanted = lock_keys(records)
    report = LockReport()
    tiers = _tiers(cache)
    mem = next((t for t in tiers if t.tier == "memory"), None) if memory else None
    disk = _disk_tier(cache)
    total = len(wanted)
    # one journal batch for the whole set, and no fsync: what is written is a copy of what
    # a remote (or bundle) keeps, as the chain's own promotion of a remote hit is; losing it
    # to a power cut costs a fetch (the checksum makes a torn entry a miss), never wrong code
    done = 0

    def step(where: str, kind: str, name: str) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total, where, f"{kind} {name}")

    with disk.bulk(durable=False) if disk is not None else _nothing():
        absent: list[tuple[str, str, str]] = []  # what no local tier has, in lock order
        for kind, key, name in wanted:
            entry = mem.get(key, kind=kind) if mem is not None else None
            if entry is None and disk is not None:
                entry = disk.get(key, kind=kind)
                if entry is not None and mem is not None:
                    mem.put(entry)
            if entry is None:
                absent.append((kind, key, name))
                continue
            report.copied += 1
            step("local", kind, name)
        # the remotes, then the bundles, each asked once for what is still absent (a
        # remote reads its batch in few round trips: Redis, 64 keys each)
        for tier in _far_tiers(cache) if absent else ():
            many = getattr(tier, "get_many", None)
            if many is not None:
                found = many([(kind, key) for kind, key, _ in absent])
            else:
                found = [tier.get(key, kind=kind) for kind, key, _ in absent]
            left = []
            for (kind, key, name), entry in zip(absent, found, strict=True):
                if entry is None:
                    left.append((kind, key, name))
                    continue
                if disk is not None:
                    disk.put(entry, durable=False)
                if mem is not None:
                    mem.put(entry)
                report.fetched += 1
                step("remote", kind, name)
            absent = left
            if not absent:
                break
        for kind, key, name in absent:
            report.missing.append(f"{kind} {name} {key[:16]}")
            step("missing", kind, name)
    for r in records:
        if r["kind"] == "torch":
            report.missing.append(f"{r['system']} {r['name']} (built from its stanza only)")
    return report
