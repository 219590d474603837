"""Bundles: prebuilt variants in one versioned, checksummed file (``.cfb``).

* :func:`write_bundle` -- what ``cuforge build --bundle FILE`` writes: the entries plus an
  index (variants, archs, cuforge version, toolchain).
* :func:`install_bundle` -- ``cuforge bundle install FILE``: verify, then add every entry
  to the cache dir.
* :func:`load_bundle` -- ``cuforge.load_bundle(path)``: serve the bundle as a read-only
  tier at runtime, memory-mapped, without copying it into the cache; a damaged bundle
  raises :class:`~cuforge.store.bundle.BundleError` naming the file.
* :func:`bundle_summary` -- ``cuforge bundle ls FILE``.

The file format lives in :mod:`cuforge.store.bundle`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from typing import Any

from cuforge.caching import Cache, resolve
from cuforge.store.base import Entry, Store
from cuforge.store.bundle import BundleError, BundleStore, write_bundle_file

__all__ = [
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
    the cache's own tiers, memory-mapped, nothing copied into the cache dir. ``verify``
    (default): check every entry's SHA-256 now (a 100 MB bundle costs ~0.1 s); False: check
    each entry the first time it is served. Loading the same file twice returns the tier
    already loaded. Returns the tier (a read-only view of the
    :class:`~cuforge.store.bundle.BundleStore`: ``path``, ``info``, ``entries()``).

    Raises :class:`BundleError` (naming the file) for a missing, damaged or foreign file.

    Combine with ``CUFORGE_OFFLINE=1`` for production: every kernel comes from the bundle
    or the cache, and a kernel the bundle lacks raises ``OfflineMissError`` instead of
    compiling."""
    return resolve(cache).add_bundle(path, verify=verify)


def unload_bundle(bundle: Store, *, cache: Cache | None = None) -> bool:
    """Stop serving ``bundle`` (the tier :func:`load_bundle` returned) and unmap it; True
    when it was loaded."""
    removed = resolve(cache).remove_bundle(bundle)
    if removed:
        bundle.close()
    return removed


def _toolchain() -> dict[str, Any]:
    out: dict[str, Any] = {}
    from cuforge.errors import CuforgeError
    from cuforge.toolchain.identity import nvcc_version, nvrtc_version

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
    from cuforge._version import __version__

    info = {
        "cuforge_version": __version__,
        "toolchain": _toolchain(),
        "created": time.time(),
        "variants": list(variants),
        "archs": list(archs),
        "manifest": manifest,
    }
    return write_bundle_file(os.fspath(path), entries, info)


def install_bundle(path: str | os.PathLike[str], *, cache: Cache | None = None) -> dict[str, int]:
    """Verify the bundle at ``path`` (every checksum) and put each entry into ``cache``'s
    writable tiers (default: the default cache). Returns ``{"entries", "bytes",
    "stored"}``. Raises :class:`BundleError` for a damaged bundle (then nothing is
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
    stored = sum(1 for e in entries if store.put(e))
    return {
        "entries": len(entries),
        "bytes": sum(len(e.payload) for e in entries),
        "stored": stored,
    }


def bundle_summary(path: str | os.PathLike[str], *, verify: bool = False) -> dict[str, Any]:
    """What ``cuforge bundle ls`` shows: the index's info and one row per entry (key,
    kind, name, arch, size). ``verify``: check every payload too."""
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
            "entries": rows,
            "verified": verify,
        }
    finally:
        bundle.close()
