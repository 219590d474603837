"""A lockfile (:mod:`cuforge.recording`) turned into a warm set: ``cuforge build --lock``
and ``cuforge prefetch``.

* :func:`build_lock`: every entry of the lock that the cache (any tier) has is copied into
  the bundle; a kernel or torch extension it lacks is built from its ``cuforge.toml``
  stanza (through :func:`cuforge.aot.build.build`, in parallel, local or Ray); whatever is
  still missing is reported and no bundle is written (a partial warm set would fail in
  production).
* :func:`prefetch`: pulls exactly the lock's entries from the remote tiers into the local
  cache; reports what no tier has. The disk writes are one batch
  (:meth:`cuforge.store.disk.DiskStore.bulk`): one journal append and one round of
  ``fsync`` at the end, not one per entry.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from contextlib import nullcontext as _nothing
from typing import TYPE_CHECKING, Any

from cuforge.caching import Cache, resolve
from cuforge.recording import lock_keys, read_lock
from cuforge.store.base import Entry

if TYPE_CHECKING:
    from cuforge.store.disk import DiskStore

__all__ = ["build_lock", "prefetch", "LockReport"]


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


def _find(cache: Cache, kind: str, key: str) -> Entry | None:
    if kind == "manifest":  # every tier's manifest: the variant may be in any of them
        for where in cache.chain:
            entry = where.get(key, kind="manifest")
            if entry is not None:
                return entry
        return None
    return cache.get(key, kind=kind)


def _kernel_manifest(entry: Entry, target: str) -> Entry:
    """The manifest entry holding only the variant that leads to ``target``."""
    variants = [v for v in entry.meta.get("variants", []) if v.get("for") == target]
    return Entry(entry.key, "manifest", b"", {**entry.meta, "variants": variants[:1] or []})


def _collect(cache: Cache, records: list[dict], entries: dict[str, Entry]) -> list[dict]:
    """Add every entry of ``records`` the cache has; returns the records still lacking."""
    lacking = []
    for r in records:
        if r["kind"] == "torch":
            lacking.append(r)
            continue
        found = []
        for kind, key, _name in lock_keys([r]):
            entry = _find(cache, kind, key)
            if entry is None:
                break
            found.append(_kernel_manifest(entry, r["key"]) if kind == "manifest" else entry)
        else:
            for entry in found:
                entries[entry.key] = entry
            continue
        lacking.append(r)
    return lacking


def build_lock(
    lock: str | os.PathLike[str],
    bundle: str | os.PathLike[str],
    *,
    jobs: int | None = None,
    executor: str = "local",
    cache: Cache | None = None,
    on_result: Callable[[Any, int], None] | None = None,
) -> LockReport:
    """Write ``bundle`` holding exactly the entries of ``lock`` (see the module doc)."""
    from cuforge.aot.build import build
    from cuforge.aot.bundle import write_bundle
    from cuforge.aot.manifest import parse_manifest
    from cuforge.store.bundle import BundleStore

    cache = resolve(cache)
    lock = os.path.abspath(os.fspath(lock))
    records = read_lock(lock)
    report = LockReport()
    entries: dict[str, Entry] = {}
    lacking = _collect(cache, records, entries)
    report.copied = len(entries)
    stanzas = [r for r in lacking if r.get("manifest")]
    if stanzas:
        text = "\n\n".join("\n".join(r["manifest"]) for r in stanzas)
        manifest = parse_manifest(text, lock)
        with tempfile.TemporaryDirectory(prefix="cuforge-lock-") as tmp:
            part = os.path.join(tmp, "part.cfb")
            built = build(
                manifest, jobs=jobs, executor=executor, bundle=part, cache=cache,
                on_result=on_result,
            )  # fmt: skip
            report.built = built.built
            report.failures = [f"{r.label}: {r.log.strip()}" for r in built.failed]
            if built.ok:
                store = BundleStore(part)
                for info in store.iterate():
                    entry = store.get(info.key)
                    if entry is not None:
                        entries.setdefault(entry.key, entry)
                store.close()
    still = _collect(cache, [r for r in lacking if r["kind"] != "torch"], {})
    torch_done = (
        {r["name"] for r in stanzas if r["kind"] == "torch"} if not report.failures else set()
    )
    for r in still + [r for r in lacking if r["kind"] == "torch" and r["name"] not in torch_done]:
        report.missing.append(f"{r['system']} {r['name']} {r['key'][:16]}")
    if not report.ok:
        return report
    archs = sorted({e.meta.get("arch", "") for e in entries.values() if e.meta.get("arch")})
    report.bundle_bytes = write_bundle(
        bundle,
        sorted(entries.values(), key=lambda e: e.key),
        variants=sorted(f"{r['system']}:{r['name']}:{r['key'][:16]}" for r in records),
        archs=archs,
        manifest=os.path.basename(lock),
    )
    report.bundle = os.path.abspath(os.fspath(bundle))
    report.entries = len(entries)
    return report


def _disk_tier(cache: Cache) -> DiskStore | None:
    """The disk tier of ``cache``'s writable chain, or None (no trusted disk tier)."""
    from cuforge.store.disk import DiskStore

    store = cache.store
    for tier in getattr(store, "tiers", (store,)):
        if isinstance(tier, DiskStore):
            return tier
    return None


def prefetch(
    lock: str | os.PathLike[str],
    *,
    cache: Cache | None = None,
    on_entry: Callable[[int, int, str, str], None] | None = None,
) -> LockReport:
    """Pull the entries of ``lock`` from the remote tiers into the local ones (memory and
    disk). ``on_entry(done, total, where, label)``: progress, ``where`` is ``"local"``,
    ``"remote"`` or ``"missing"``."""
    cache = resolve(cache)
    records = read_lock(os.fspath(lock))
    local = cache.replace(remotes=(), bundles=())
    # read past the disk tier: a remote hit would be promoted into it, then put again
    far = cache.replace(disk=False)
    wanted = lock_keys(records)
    report = LockReport()
    disk = _disk_tier(local)
    # one journal batch and one round of fsyncs for the whole set, not one per entry
    with disk.bulk() if disk is not None else _nothing():
        for i, (kind, key, name) in enumerate(wanted, 1):
            where = "local"
            if _find(local, kind, key) is not None:
                report.copied += 1
            else:
                entry = _find(far, kind, key)
                if entry is None:
                    where = "missing"
                    report.missing.append(f"{kind} {name} {key[:16]}")
                else:
                    where = "remote"
                    local.put(entry)
                    report.fetched += 1
            if on_entry is not None:
                on_entry(i, len(wanted), where, f"{kind} {name}")
    skipped = [r for r in records if r["kind"] == "torch"]
    for r in skipped:
        report.missing.append(f"{r['system']} {r['name']} (built from its stanza only)")
    return report
