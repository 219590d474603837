"""A cached "build an opaque blob" pipeline over cuforge's store, for integrations.

The kernel pipeline (:mod:`cuforge.core.pipeline`) knows sources, headers and compilers. An
integration such as :mod:`cuforge.cccl` (a serialized cuda.compute algorithm) or
:mod:`cuforge.cute` (an exported CuTe DSL function) knows none of those: it has a set of
labeled key fields, a function that builds some named files, and a function that turns
those files back into a ready object. :func:`get_or_build` joins them to the store:

* **key**: :class:`cuforge.keys.key.KeyBuilder` over ``kind`` and the fields (each a labeled text
  field, sorted by label), plus this module's blob-format version;
* **lookup** in every tier of the :class:`~cuforge.Cache` (``cache=``, default
  :func:`cuforge.default_cache`): memory, disk, the remote tiers, then the bundles
  (read-only, served in place, a hit says ``"bundle"``); a disabled cache always builds;
* a **hit** unpacks the stored files and calls ``load`` -- never ``build``;
* a **load error** (any exception ``load`` raises on stored bytes, or bytes that do not
  unpack) is reported in one warning naming the exception, the entry is deleted from every
  tier, and it is rebuilt and overwritten;
* a **miss** builds through :meth:`cuforge.Cache.build_once` (one build of a key at a time
  across threads and processes; a waiter re-checks the store and loads the winner's entry), calls ``load`` on the fresh files (an error there propagates and nothing
  is stored), stores the entry and records the key's fields for ``cuforge cache explain``
  (the reasons of the miss, when an earlier key of the same ``name`` differs);
* ``uncacheable=<reason>``: nothing is looked up or stored; ``build`` and ``load`` run every
  time, the result says ``"uncached"`` with the reason, the reason is logged as a miss for
  ``cuforge cache explain`` and warned once per process;
* an offline cache (``CUFORGE_OFFLINE=1``, strict production mode): a hit is served as
  always, anything that would build raises :class:`~cuforge.base.errors.OfflineMissError` naming
  the build (nothing is built).

Telemetry (hits, misses, puts per kind) is recorded by the disk tier itself, as for kernels;
``cache.counters`` counts this process's outcomes per kind.

The payload format (nothing is ever unpickled; file names are data, never paths) and the
key are :mod:`cuforge.core.blobformat`'s, re-exported here: the adapters, which read and
write blob entries without this build protocol, import only that module.
"""

from __future__ import annotations

import logging
import time
import types
from collections.abc import Mapping
from typing import TYPE_CHECKING

from cuforge.base.errors import OfflineMissError
from cuforge.core.blobformat import (  # the payload format and the key: re-exported
    BLOB_FORMAT_VERSION,  # noqa: F401 - a public name here as before
    BlobFormatError,
    make_key,
    pack,
    unpack,
)
from cuforge.core.caching import Cache, DefaultCounters, default_cache
from cuforge.store.base import ENTRY_KINDS, Entry

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any, TypeVar

    T = TypeVar("T")

__all__ = [
    "BlobResult",
    "BlobFormatError",
    "OfflineBuildError",
    "OfflineMissError",
    "get_or_build",
    "fence_uncached",
    "make_key",
    "pack",
    "unpack",
    "counters",
]

#: what the default cache did in this process: "<kind>:<source_of_result>" -> count, and
#: "<kind>:load_errors" (a live view of ``cuforge.default_cache().counters``)
counters = DefaultCounters()


def offline_error(
    kind: str, name: str, key: str, fields: dict[str, str], why: str
) -> OfflineMissError:
    """The :class:`~cuforge.base.errors.OfflineMissError` of a blob build (nothing is built in
    strict mode); ``kind``, ``name``, ``key`` and ``fields`` say which build it is."""
    shown = ", ".join(f"{k}={v}" for k, v in fields.items() if not k.startswith("version:"))
    return OfflineMissError(
        f"strict mode (CUFORGE_OFFLINE=1): the {kind} build {name!r} (key {key[:16]}; "
        f"{shown}) {why}, and nothing may be built in offline mode. Run the same call once "
        "where building is allowed (unset CUFORGE_OFFLINE) against this cache, or bring the "
        "entry here with `cuforge cache export`/`import` or `push`/`pull`.",
        kind=kind,
        name=name,
        key=key,
        fields=fields,
    )


#: The name it had when blob builds had their own offline error: the same class.
OfflineBuildError = OfflineMissError


class BlobResult:
    """What :func:`get_or_build` returns.

    * ``value``: what ``load`` returned;
    * ``source_of_result``: ``"memory"``, ``"disk"``, ``"remote"``, ``"bundle"`` (a hit in
      that tier, or in a loaded bundle),
      ``"compiled"`` (built now and stored, or built with caching off) or ``"uncached"``
      (built now and deliberately not stored: see ``reason``);
    * ``key``: the hex key; ``fields``: the labeled fields it was made of;
    * ``reason``: why the result is not cached (``None`` unless ``"uncached"``);
    * ``build_seconds``: the build's time (for a hit, the time the stored build took);
      ``lookup_seconds``: the time this call spent outside ``build``.
    """

    __slots__ = (
        "value",
        "source_of_result",
        "key",
        "fields",
        "reason",
        "build_seconds",
        "lookup_seconds",
    )

    def __init__(
        self,
        value: Any,
        source_of_result: str,
        key: str,
        fields: dict[str, str],
        reason: str | None = None,
        build_seconds: float = 0.0,
        lookup_seconds: float = 0.0,
    ) -> None:
        self.value = value
        self.source_of_result = source_of_result
        self.key = key
        self.fields = fields
        self.reason = reason
        self.build_seconds = build_seconds
        self.lookup_seconds = lookup_seconds

    def __class_getitem__(cls, item: Any) -> Any:  # BlobResult[T] in annotations
        return types.GenericAlias(cls, item)

    @property
    def hit(self) -> bool:
        """Whether the value came from the cache (no build ran)."""
        return self.source_of_result in ("memory", "disk", "remote", "bundle")

    def __repr__(self) -> str:
        why = f", reason={self.reason!r}" if self.reason else ""
        return f"BlobResult({self.source_of_result}, key={self.key[:12]}{why})"


def _check_files(kind: str, name: str, files: Any) -> dict[str, bytes]:
    if not isinstance(files, Mapping) or not files:
        raise TypeError(
            f"the build function of {kind} {name!r} returned {type(files).__name__}, expected "
            "a non-empty mapping of file name (str) -> contents (bytes)"
        )
    out: dict[str, bytes] = {}
    for fname, data in files.items():
        if not isinstance(fname, str) or not fname:
            raise TypeError(
                f"the build function of {kind} {name!r} returned a file name {fname!r}; expected a non-empty str"
            )
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(
                f"the build function of {kind} {name!r} returned {type(data).__name__} for "
                f"file {fname!r}; expected bytes"
            )
        out[fname] = bytes(data)
    return out


def get_or_build(
    kind: str,
    name: str,
    fields: Mapping[str, str],
    build: Callable[[], Mapping[str, bytes]],
    load: Callable[[Mapping[str, bytes]], T],
    *,
    uncacheable: str | None = None,
    meta: Mapping[str, Any] | None = None,
    cache: Cache | None = None,
) -> BlobResult[T]:
    """The value for ``fields``: loaded from the cache, else built, loaded and stored.

    ``kind``: the entry kind (one of :data:`cuforge.store.base.ENTRY_KINDS`, e.g. ``"cccl"``);
    ``name``: what the entry is called in ``cuforge cache ls`` and ``explain`` (keys of the
    same name are compared to explain a miss); ``fields``: label -> str, everything that
    changes what ``build`` makes. ``meta``: extra JSON fields to store (e.g. ``"arch"``).
    ``cache``: the :class:`~cuforge.Cache` (default: :func:`cuforge.default_cache`).
    See the module doc for the guarantees. Exceptions from ``build`` (and from ``load`` on
    freshly built files) propagate; nothing is stored then."""

    if kind not in ENTRY_KINDS:
        raise ValueError(f"unknown entry kind {kind!r}; expected one of {', '.join(ENTRY_KINDS)}")
    if cache is None:
        cache = default_cache()
    started = time.perf_counter()
    key, recorded = make_key(kind, fields)
    if uncacheable is not None:
        if cache.offline:
            raise offline_error(kind, name, key, recorded, f"cannot be cached ({uncacheable})")
        return _uncached(cache, kind, name, key, recorded, build, load, uncacheable, started)
    if not cache.enabled and not cache.offline:
        _fence(cache, kind, name, key, recorded, "is built with caching off")
        value, seconds = _build_and_load(kind, name, build, load)
        return _done(cache, kind, name, value, "compiled", key, recorded, None, seconds, started)
    return cache.build_once(
        key,
        what=f"{kind} {name}",
        lookup=lambda: _lookup(cache, kind, name, key, recorded, load, started),
        build=lambda: _build_and_store(
            cache, kind, name, key, recorded, build, load, meta, started
        ),
        offline_error=lambda: offline_error(kind, name, key, recorded, "is not in the cache"),
    )


def _lookup(cache: Cache, kind, name, key, recorded, load, started) -> BlobResult | None:
    # every tier: memory, disk, remotes, then the bundles (read-only, served in place)
    entry, tier = cache.get_with_tier(key, kind=kind)
    if entry is None:
        return None
    source = "remote" if tier and tier.startswith("remote") else tier or "disk"
    try:
        if entry.kind != kind:
            raise BlobFormatError(f"the entry is of kind {entry.kind!r}, not {kind!r}")
        value = load(unpack(entry.payload))
    except Exception as exc:  # noqa: BLE001 - any failure to load stored bytes means a bad entry: rebuild
        cache.count(f"{kind}:load_errors")
        _warn(
            f"cuforge: the cached {kind} entry {name!r} (key {key[:12]}, from the {source} tier) "
            f"could not be loaded ({type(exc).__name__}: {exc}); it is deleted and rebuilt"
        )
        cache.delete(key)  # a bundle is read-only: the entry is rebuilt into the cache
        return None
    build_seconds = entry.meta.get("compile_seconds", 0.0)
    if not isinstance(build_seconds, (int, float)):
        build_seconds = 0.0
    return _done(
        cache, kind, name, value, source, key, recorded, None, float(build_seconds), started
    )


def _build_and_load(kind, name, build, load) -> tuple[Any, float]:
    t0 = time.perf_counter()
    files = _check_files(kind, name, build())
    seconds = time.perf_counter() - t0
    return load(files), seconds


def _build_and_store(cache: Cache, kind, name, key, recorded, build, load, meta, started):
    t0 = time.perf_counter()
    files = _check_files(kind, name, build())
    seconds = time.perf_counter() - t0
    value = load(files)  # a build that cannot be loaded is never stored
    entry_meta: dict[str, Any] = {
        "name": name,
        "backend": kind,
        "arch": str(recorded.get("arch", recorded.get("compute_capability", ""))),
        "compile_seconds": seconds,
        "key_fields": recorded,
        "files": {f: len(d) for f, d in files.items()},
    }
    if meta:
        entry_meta.update(meta)
    cache.record_build(name, key, recorded, [Entry(key, kind, pack(files), entry_meta)])
    return _done(cache, kind, name, value, "compiled", key, recorded, None, seconds, started)


def fence_uncached(cache: Cache, kind: str, name: str, fields: dict[str, str], why: str) -> None:
    """Ask the compile fence (:mod:`cuforge.core.fencing`) about a ``kind`` build of ``name``
    that runs outside :func:`get_or_build` (an integration that calls its system directly,
    e.g. with caching off): reported in ``warn`` mode, CompileAfterFenceError in ``error``
    mode (then the caller builds nothing). ``why``: why it is not looked up."""
    key, recorded = make_key(kind, fields)
    _fence(cache, kind, name, key, recorded, why)


def _fence(cache: Cache, kind, name, key, recorded, why: str) -> None:
    # a build outside Cache.build_once asks the compile fence too (cuforge.fence)
    from cuforge.core.fencing import before_build

    before_build(
        cache, key, f"{kind} {name}", lambda: offline_error(kind, name, key, recorded, why)
    )


def _uncached(cache: Cache, kind, name, key, recorded, build, load, reason, started):
    _fence(cache, kind, name, key, recorded, f"cannot be cached ({reason})")
    value, seconds = _build_and_load(kind, name, build, load)
    if cache.enabled:
        cache.record_build(name, key, recorded, uncached=reason)
    cache.warn_once(f"cuforge: {kind} {name!r} is built but not cached: {reason}")
    return _done(cache, kind, name, value, "uncached", key, recorded, reason, seconds, started)


def _done(cache: Cache, kind, name, value, source, key, recorded, reason, seconds, started):
    cache.count(f"{kind}:{source}")
    elapsed = time.perf_counter() - started
    built = source in ("compiled", "uncached")
    result = BlobResult(
        value, source, key, recorded, reason, seconds, elapsed - seconds if built else elapsed
    )
    timing = f"built in {seconds:.3f} s" if built else f"{source} hit in {elapsed * 1e3:.2f} ms"
    cache.verbose(f"cuforge: {kind} {name} {timing} key {key[:12]}")
    return result


def _warn(message: str) -> None:
    logging.getLogger("cuforge").warning(message)
