"""Bundles: prebuilt variants in one versioned, checksummed file (``.cfb``).

* :func:`write_bundle` -- what ``cuforge build --bundle FILE`` writes: the entries plus an
  index (variants, archs, cuforge version, toolchain).
* :func:`install_bundle` -- ``cuforge bundle install FILE``: verify, then add every entry
  to the cache dir.
* :func:`load_bundle` -- ``cuforge.load_bundle(path)``: serve the bundle as a read-only
  tier at runtime, read in place, without copying it into the cache; a damaged bundle,
  or one this user should not trust (another user's, group- or world-writable), raises
  :class:`~cuforge.store.bundle.BundleError` naming the file.
* :func:`bundle_summary` -- ``cuforge bundle ls FILE``.
* :func:`export_bundle` / :func:`import_bundle` -- ``cuforge cache export FILE`` /
  ``cuforge cache import FILE``: move disk-cache entries between machines as a bundle.

The file format lives in :mod:`cuforge.store.bundle`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from cuforge._version import __version__
from cuforge.base._fs import destination_problem
from cuforge.base.errors import CuforgeError
from cuforge.core.caching import Cache, resolve
from cuforge.keys.key import SCHEMA_VERSION
from cuforge.store.base import Entry, EntryInfo, Store
from cuforge.store.bundle import BundleError, BundleStore, write_bundle_file
from cuforge.toolchain.identity import nvcc_version, nvrtc_version

if TYPE_CHECKING:
    from cuforge.store.disk import DiskStore

__all__ = [
    "export_bundle",
    "import_bundle",
    "load_bundle",
    "unload_bundle",
    "install_bundle",
    "write_bundle",
    "bundle_summary",
    "BundleError",
    "BundleStore",
]


def load_bundle(
    path: str | os.PathLike[str], *, verify: bool = True, cache: Cache | None = None
) -> Store:
    """Serve the bundle at ``path`` to every later lookup of ``cache`` (default: the
    default cache, i.e. every call that passes no ``cache=``): a read-only tier asked after
    the cache's own tiers, read in place, nothing copied into the cache dir. Every entry
    is copied out of the file and its SHA-256 checked each time it is served (a bundle
    changed after loading is refused, never served). ``verify`` (default): also check
    every entry now (a 100 MB bundle costs ~0.1 s), so a damaged bundle fails here, not at
    its first use. The file must be owned by you or root and not be group- or
    world-writable (a bundle is code); loading it through a symlink logs a warning.
    Loading the same file twice returns the tier already loaded. Returns the tier (a read-only view of the
    :class:`~cuforge.store.bundle.BundleStore`: ``path``, ``info``, ``entries()``).

    Raises :class:`BundleError` (naming the file) for a missing, damaged, foreign or
    untrusted file.

    Combine with ``CUFORGE_OFFLINE=1`` for production: every kernel comes from the bundle
    or the cache, and a kernel the bundle lacks raises ``OfflineMissError`` instead of
    compiling."""
    if not isinstance(path, (str, os.PathLike)) and not callable(getattr(path, "get", None)):
        raise TypeError(f"path must be the bundle file's path (str or os.PathLike), not {path!r}")
    return resolve(cache).add_bundle(path, verify=verify)


def unload_bundle(bundle: Store, *, cache: Cache | None = None) -> bool:
    """Stop serving ``bundle`` (the tier :func:`load_bundle` returned) and close its
    file; True when it was loaded."""
    removed = resolve(cache).remove_bundle(bundle)
    if removed:
        bundle.close()
    return removed


def _toolchain() -> dict[str, Any]:
    out: dict[str, Any] = {}

    for name, probe in (("nvrtc", nvrtc_version), ("nvcc", nvcc_version)):
        try:
            out[name] = probe()
        except (CuforgeError, OSError) as exc:
            out[name] = f"unavailable: {exc}"
    return out


def write_bundle(
    path: str | os.PathLike[str],
    entries: Iterable[Entry],
    *,
    variants: Iterable[str] = (),
    archs: Iterable[str] = (),
    manifest: str = "",
) -> int:
    """Write ``entries`` as a bundle at ``path`` with the index cuforge reads back in
    ``cuforge bundle ls``: ``variants`` (labels), ``archs``, the cuforge version, the
    toolchain (NVRTC / nvcc versions) and the manifest it came from. Returns the size."""

    info = {
        "cuforge_version": __version__,
        "key_schema": SCHEMA_VERSION,
        "toolchain": _toolchain(),
        "created": time.time(),
        "variants": list(variants),
        "archs": list(archs),
        "manifest": manifest,
    }
    return write_bundle_file(os.fspath(path), entries, info)


def install_bundle(path: str | os.PathLike[str], *, cache: Cache | None = None) -> dict[str, int]:
    """Verify the bundle at ``path`` (every checksum) and put each entry into ``cache``'s
    writable tiers (default: the default cache). An entry the cache's disk tier already
    holds (well formed) is left as it is. Returns ``{"entries", "bytes", "stored",
    "already_present"}``: ``stored`` counts the entries new to the cache, so a second
    install of the same bundle stores 0 and finds them all present. Raises :class:`BundleError` for a damaged bundle (then nothing is
    installed), ``ValueError`` when the cache is disabled."""
    store = resolve(cache).store
    if store is None:
        raise ValueError(
            "the cache is disabled (CUFORGE_DISABLE_CACHE=1): there is nowhere to install "
            "the bundle; unset it, or load the bundle at runtime with cuforge.load_bundle"
        )
    bundle = BundleStore(path, verify=True)
    try:
        entries = list(bundle.entries())
    finally:
        bundle.close()
    # the tiers that can say "I hold this" without counting a lookup (the disk tier)
    holders = [t.has for t in getattr(store, "tiers", [store]) if hasattr(t, "has")]
    stored = present = 0
    for e in entries:
        if holders and all(has(e.key) for has in holders):
            present += 1
        elif store.put(e):
            stored += 1
    return {
        "entries": len(entries),
        "bytes": sum(len(e.payload) for e in entries),
        "stored": stored,
        "already_present": present,
    }


def _writable_destination(path: str) -> None:
    """Refuse a destination a bundle must not be written to: one whose directory is
    missing, or something other than a regular file (a symlink, a device such as
    /dev/null, a directory) that a rename would replace."""

    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        raise FileNotFoundError(
            f"cannot write {path}: the directory {directory} does not exist (create it first)"
        )
    problem = destination_problem(path)
    if problem is not None:
        raise ValueError(f"cannot write {path}: {problem}")


def export_bundle(
    store: DiskStore,
    path: str | os.PathLike[str],
    *,
    select: Callable[[EntryInfo], bool] | None = None,
    progress: Callable[[int, int | None], Any] | None = None,
) -> dict[str, Any]:
    """Write the disk cache's entries that ``select`` accepts (all by default, manifests
    included) as a bundle at ``path`` (written whole, then renamed: never half a bundle).
    Damaged entries are skipped, never exported. ``progress(done, total)`` is called after
    each entry. Returns ``{"path", "entries", "skipped", "bytes", "file_bytes"}``. Raises
    ``OSError`` / ``ValueError`` naming ``path`` or its directory when it cannot be
    written there (see :func:`_writable_destination`)."""
    path = os.path.abspath(os.fspath(path))
    _writable_destination(path)
    infos = [i for i in store.iterate_index() if select is None or select(i)]
    entries: list[Entry] = []
    archs: set[str] = set()
    skipped = 0
    for done, info in enumerate(infos, 1):
        entry = store.peek(info.key)
        if progress is not None:
            progress(done, len(infos))
        if entry is None:
            skipped += 1  # damaged or removed meanwhile: never export damage
            continue
        meta = dict(entry.meta)
        for added in ("size", "created", "last_used"):  # peek's, not the entry's
            meta.pop(added, None)
        arch = meta.get("arch")
        archs.update(arch if isinstance(arch, list) else [arch] if arch else [])
        entries.append(Entry(entry.key, entry.kind, entry.payload, meta))
    try:
        size = write_bundle(path, entries, archs=sorted(str(a) for a in archs))
    except OSError as exc:
        raise OSError(exc.errno, f"cannot write {path}: {exc.strerror or exc}") from None
    return {
        "path": path,
        "entries": len(entries),
        "skipped": skipped,
        "bytes": sum(len(e.payload) for e in entries),
        "file_bytes": size,
    }


def _import_warnings(bundle: BundleStore) -> list[str]:
    """Refuse a bundle whose entries can never hit here; warnings for one that may not."""

    info = bundle.info
    schema = info.get("key_schema", SCHEMA_VERSION)
    if schema != SCHEMA_VERSION:
        raise BundleError(
            f"bundle {bundle.path} holds entries made with cache-key schema {schema}, but this "
            f"cuforge ({__version__}) uses key schema {SCHEMA_VERSION}: none of them could "
            f"ever be a hit. Export it again with this cuforge version"
        )
    made_by = info.get("cuforge_version")
    if made_by != __version__:
        return [
            f"the bundle was made by cuforge {made_by}, this is {__version__}: cache keys "
            "include cuforge's version, so its kernel entries hit only for that version"
        ]
    return []


def import_bundle(
    store: DiskStore,
    path: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    max_entry_bytes: int | None = None,
    progress: Callable[[int, int | None], Any] | None = None,
) -> dict[str, Any]:
    """Add the entries of the bundle at ``path`` to the disk cache ``store``, each
    checked first: the bundle's header, index and every row's key, kind and metadata when
    it is opened (:class:`BundleStore`; a damaged index refuses the whole bundle), then
    each payload's SHA-256 before it is stored (a damaged entry is rejected, the others
    are stored). ``overwrite``: replace entries already present; ``max_entry_bytes``:
    reject larger payloads. Returns ``{"path", "info", "imported", "bytes", "present",
    "rejected": [{"key", "reason"}], "warnings", "ok"}``. Raises ``FileNotFoundError``
    when there is no bundle, :class:`BundleError` for one that cannot be used at all."""
    path = os.path.abspath(os.fspath(path))
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no such bundle: {path}")
    bundle = BundleStore(path, verify=False)
    try:
        result: dict[str, Any] = {
            "path": path,
            "info": bundle.info,
            "imported": 0,
            "bytes": 0,
            "present": 0,
            "rejected": [],
            "warnings": _import_warnings(bundle),
        }
        rejected = result["rejected"]
        total = len(bundle)
        for done, info in enumerate(bundle.iterate(), 1):
            key = info.key
            if max_entry_bytes is not None and info.size > max_entry_bytes:
                rejected.append(
                    {
                        "key": key,
                        "reason": f"its payload is {info.size} bytes, over the "
                        f"{max_entry_bytes}-byte cap (raise it if the bundle is trusted)",
                    }
                )
            elif not overwrite and store.has(key):
                result["present"] += 1
            else:
                try:
                    entry = bundle.get(key)
                except BundleError as exc:
                    rejected.append({"key": key, "reason": str(exc)})
                    entry = None
                if entry is not None:
                    if store.put(entry):
                        result["imported"] += 1
                        result["bytes"] += len(entry.payload)
                    else:
                        reason = store.disabled_reason or "the cache could not store it"
                        rejected.append({"key": key, "reason": reason})
            if progress is not None:
                progress(done, total)
    finally:
        bundle.close()
    result["ok"] = not rejected
    return result


def bundle_summary(path: str | os.PathLike[str], *, verify: bool = False) -> dict[str, Any]:
    """What ``cuforge bundle ls`` shows: the index's info (as written: its fields may have
    any JSON type; ``info_problem`` says when it is not an object) and one row per entry
    (key, kind, name, arch, size). ``verify``: check every payload too."""
    bundle = BundleStore(path, verify=verify)
    try:
        rows = [
            {
                "key": info.key,
                "kind": info.kind,
                "name": info.meta.get("name", ""),
                "arch": info.meta.get("arch", ""),
                "lowered_names": sorted(info.meta.get("lowered_names", {}) or {}),
                "size": info.size,
            }
            for info in bundle.iterate()
        ]
        return {
            "path": bundle.path,
            "size": os.path.getsize(bundle.path),
            "info": bundle.info,
            "info_problem": bundle.info_problem,
            "entries": rows,
            "verified": verify,
        }
    finally:
        bundle.close()
