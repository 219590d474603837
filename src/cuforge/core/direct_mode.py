"""Direct-mode manifests: which headers an earlier compile read, so the next lookup needs
no preprocessor and no compiler (ccache's "direct mode").

One format, shared by the kernel pipeline and the torch extension build. A *base key*
covers everything about a compile except the contents of the headers it reads; its
manifest lists the *variants* seen before, newest first. A variant is one earlier
compile:

* ``headers`` -- every user header it read, path -> content digest (SHA-256 hex);
* ``probes`` -- paths that did not exist and were tried before a header was found: if one
  appears later, an ``#include`` would resolve to a different file;
* ``target`` -- the key of what it produced (a kernel, an object, a module);
* ``digest`` (optional) -- the SHA-256 of that entry's payload, for a caller that keeps a
  copy of the payload outside the store and checks the copy without reading the entry
  (the torch build's module files).

A lookup re-checks the variants in order (one ``stat`` per header when nothing changed,
thanks to :func:`cuforge.keys.deps.file_digest`'s memo) and takes the first that still holds.
Up to :data:`MAX_VARIANTS` variants are remembered, so editing a header and then reverting
the edit hits the entry built before the edit.

Stored as a store entry of kind ``"manifest"`` under :func:`manifest_key`, with an empty
payload and this meta::

    {"name": <source or extension name>,
     "variants": [{"headers": {path: digest}, "probes": [path, ...], "for": target,
                   "digest": payload digest (only when recorded)}, ...]}

A signing remote tier adds ``"sealed": {target: sha256}`` to the copy it signs (the
digest of each target's remote entry, so that one verified signature covers the manifest
and the entry it leads to: :mod:`cuforge.store.remote.tier`); readers drop it.

The meta is validated when read: an entry of any other shape counts as no manifest (a
miss, then a compile that writes a good one), never as an error.

Layer 3 (beside the pipeline): imports key, deps and store.base only.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence

from cuforge.keys.deps import file_digest, stat_signature
from cuforge.keys.key import KeyBuilder
from cuforge.store.base import Entry

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: see docs/architecture.md, the warm path
if TYPE_CHECKING:
    from typing import Any

    from cuforge.store.base import Entry, Store


__all__ = [
    "MAX_VARIANTS",
    "Variant",
    "manifest_key",
    "read_variants",
    "variants_of",
    "write_variant",
    "match",
]

#: How many header variants a manifest remembers per base key (A -> B -> A needs 2).
MAX_VARIANTS = 8

#: The store entry kind manifests are written as.
KIND = "manifest"


def manifest_key(base_digest: str) -> str:
    """The store key of the manifest of the base key ``base_digest``."""
    return KeyBuilder("manifest").text("base", base_digest).hexdigest()


class Variant:
    """One earlier compile: the headers it read (path -> content digest), the paths whose
    later existence would change include resolution, the key it produced and, optionally,
    the SHA-256 of that key's payload (``""``: not recorded).

    Paths are stored as the caller gives them; a caller that writes placeholders (the
    torch build, for path independence) maps them back with ``resolve`` in :func:`match`.
    """

    __slots__ = ("headers", "probes", "target", "digest")

    def __init__(
        self,
        headers: Mapping[str, str],
        probes: Sequence[str] = (),
        target: str = "",
        digest: str = "",
    ) -> None:
        self.headers: dict[str, str] = dict(headers)
        self.probes: list[str] = list(probes)
        self.target: str = target
        self.digest: str = digest

    def as_meta(self) -> dict[str, Any]:
        """The JSON form stored in the manifest entry's meta."""
        meta: dict[str, Any] = {
            "headers": dict(self.headers),
            "probes": list(self.probes),
            "for": self.target,
        }
        if self.digest:
            meta["digest"] = self.digest
        return meta

    def _fields(self) -> tuple:
        return (self.headers, self.probes, self.target, self.digest)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Variant) and self._fields() == other._fields()

    def __repr__(self) -> str:
        return (
            f"Variant({len(self.headers)} headers, {len(self.probes)} probes, "
            f"for={self.target[:16]})"
        )


def _str_map(value: object) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    )


def _str_list(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def variants_of(entry: Entry | None) -> list[Variant]:
    """The variants held by the manifest ``entry`` (None: none). An entry of the wrong
    kind or shape yields ``[]``; this never raises on bad data."""
    if entry is None or entry.kind != KIND:
        return []
    meta = entry.meta
    if not isinstance(meta, dict):
        return []
    raw = meta.get("variants")
    if not isinstance(raw, list):
        return []
    variants: list[Variant] = []
    for item in raw:
        if not isinstance(item, dict):
            return []
        headers, probes, target = item.get("headers"), item.get("probes"), item.get("for")
        digest = item.get("digest", "")
        if not (_str_map(headers) and _str_list(probes) and isinstance(target, str) and target):
            return []
        if not isinstance(digest, str):
            return []
        variants.append(Variant(headers, probes, target, digest))
    return variants[:MAX_VARIANTS]


def read_variants(store: Store | None, key: str) -> list[Variant]:
    """The variants of the manifest stored under ``key``, newest first; ``[]`` when there
    is no store, no entry, or a malformed one (never raises on bad data)."""
    if store is None:
        return []
    return variants_of(store.get(key, kind=KIND))


def write_variant(store: Store | None, key: str, name: str, variant: Variant) -> None:
    """Record ``variant`` first in the manifest under ``key`` (``name``: the source or
    extension name, for ``cuforge cache ls``). An equal earlier variant moves to the front
    instead of being repeated; past :data:`MAX_VARIANTS` the oldest are dropped. A
    concurrent writer of the same key may win (last write wins; both variants are valid)."""
    if store is None:
        return

    variants = [v for v in read_variants(store, key) if v != variant]
    variants.insert(0, variant)
    meta = {"name": name, "variants": [v.as_meta() for v in variants[:MAX_VARIANTS]]}
    store.put(Entry(key, KIND, b"", meta))


def match(
    variants: Sequence[Variant], resolve: Callable[[str], str] | None = None
) -> tuple[Variant, dict[str, str], list[tuple[str, Any]]] | None:
    """The first variant that still holds: none of its probes exists and every header
    still has the recorded digest. Returns ``(variant, {path: digest}, [(real path,
    stat signature)])`` -- the digests keyed by the recorded paths, the signatures by the
    real ones (for a caller's stat-only re-check later) -- or None.

    ``resolve`` maps a recorded path (possibly a placeholder) to the real path; default:
    the path as recorded. A header that cannot be read never matches.
    """
    for variant in variants:
        found = _check(variant, resolve)
        if found is not None:
            return variant, found[0], found[1]
    return None


def _check(
    variant: Variant, resolve: Callable[[str], str] | None
) -> tuple[dict[str, str], list[tuple[str, Any]]] | None:
    for probe in variant.probes:
        if os.path.exists(resolve(probe) if resolve else probe):
            return None  # a header would now resolve to a different file
    digests: dict[str, str] = {}
    sigs: list[tuple[str, Any]] = []
    for path, recorded in variant.headers.items():
        real = resolve(path) if resolve else path
        sig = stat_signature(real)
        if sig is None or file_digest(real) != recorded:
            return None
        digests[path] = recorded
        sigs.append((real, sig))
    return digests, sigs
