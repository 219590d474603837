"""What the system adapters (:mod:`cuforge.cuda_core`, :mod:`cuforge.jax`,
:mod:`cuforge.cupy`) share: the version gate, one warning per process, and reading and
writing an entry of named files where a damaged entry reads as missing (the system then
compiles again; it never crashes and never loads it)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from cuforge.core import blobcache
from cuforge.store.base import Entry

if TYPE_CHECKING:
    from typing import Any

    from cuforge.core.caching import Cache

_warned: set[str] = set()


def version_tuple(text: str, parts: int = 3) -> tuple[int, ...]:
    """``"0.10.2rc1"`` -> ``(0, 10, 2)``: the leading numbers of a version string."""
    out = []
    for piece in text.split(".")[:parts]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


def warn_once(message: str) -> None:
    """Log ``message`` as a warning once per process."""
    if message not in _warned:
        _warned.add(message)
        logging.getLogger("cuforge").warning(message)


def read_files(cache: Cache, key: str, kind: str, what: str) -> dict[str, bytes] | None:
    """The named files of the ``kind`` entry ``key``, or None: absent, or damaged (then it
    is deleted, counted as ``<kind>:load_errors`` and warned about, naming ``what``)."""
    entry = cache.get(key, kind=kind)
    if entry is None:
        return None
    try:
        if entry.kind != kind:
            raise blobcache.BlobFormatError(f"the entry is of kind {entry.kind!r}")
        return blobcache.unpack(entry.payload)
    except blobcache.BlobFormatError as exc:
        damaged(cache, key, kind, what, exc)
        return None


def damaged(cache: Cache, key: str, kind: str, what: str, exc: BaseException) -> None:
    """Report and delete an entry that cannot be used."""
    cache.count(f"{kind}:load_errors")
    warn_once(
        f"cuforge: the cached {what} (key {key[:12]}) could not be read "
        f"({type(exc).__name__}: {exc}); it is deleted and compiled again"
    )
    cache.delete(key)


def write_files(
    cache: Cache, key: str, kind: str, files: dict[str, bytes], meta: dict[str, Any]
) -> None:
    """Store ``files`` as the ``kind`` entry ``key``."""
    cache.put(Entry(key, kind, blobcache.pack(files), meta))
