"""What the system adapters (:mod:`cuforge.triton`, :mod:`cuforge.jax`, :mod:`cuforge.cupy`,
:mod:`cuforge.cuda_core`, :mod:`cuforge.torch.compile_cache`) share: the version window and
its contract probe, one warning per process, and reading and writing an entry of named
files where a damaged entry reads as missing (the system then compiles again; it never
crashes and never loads it).

**The version window** (:func:`window_verdict`, docs/compat.md). Each adapter names the
peer versions it is tested on, ``[low, high)``. Inside, it is enabled. Outside (a release
newer than the window, or an old one), it is never switched off silently: a **contract
probe** runs once per process -- the plug-in points exist with the expected shape, and a
put/get round trip goes through the peer's own hook into a throwaway cache. If the probe
passes, the adapter is enabled with one line naming the untested version; if it fails, one
line says what is missing and the peer's own cache keeps working. :data:`VERDICTS` keeps
each system's outcome for ``cuforge doctor``."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from cuforge.core import blobformat
from cuforge.store.base import Entry

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from cuforge.core.caching import Cache

_warned: set[str] = set()

#: system -> (state, line): ``"tested"``, ``"probed"`` (outside the window, probe passed)
#: or ``"refused"`` (the probe failed, or the hook's shape is wrong), for ``cuforge doctor``
VERDICTS: dict[str, tuple[str, str]] = {}
#: (system, version) -> the probe's answer (None: passed): a probe runs once per process
_probed: dict[tuple[str, str], str | None] = {}


def shown(version: tuple[int, ...]) -> str:
    """``(3, 9)`` -> ``"3.9"``."""
    return ".".join(map(str, version))


def window_verdict(
    system: str,
    peer: str,
    version: str,
    window: tuple[tuple[int, ...], tuple[int, ...]],
    probe: Callable[[], str | None],
) -> str | None:
    """None when ``system`` may plug into ``peer`` at ``version``, else why not (one line).

    Inside ``window`` (``[low, high)``, compared on as many parts as ``low`` has) it may.
    Outside it, ``probe()`` (memoized per version) decides: it returns None when the
    contract holds, else what is missing; a pass is logged once as an untested version."""
    low, high = window
    parts = version_tuple(version, max(len(low), len(high)))
    span = f"{shown(low)} to before {shown(high)}"
    if low <= parts < high:
        VERDICTS[system] = ("tested", f"{peer} {version}: tested ({span})")
        return None
    memo = (system, version)
    if memo not in _probed:
        try:
            _probed[memo] = probe()
        except Exception as exc:  # noqa: BLE001 - any failure of the probe is a "no", said
            _probed[memo] = f"the probe raised {type(exc).__name__}: {exc}"
    problem = _probed[memo]
    if problem is None:
        line = (
            f"cuforge.{system}: {peer} {version} is outside the tested versions ({span}); its "
            f"contract probe passed (the plug-in points and a put/get round trip through "
            f"{peer}'s own hook), so cuforge caches it (untested version)"
        )
        VERDICTS[system] = ("probed", line)
        warn_once(line)
        return None
    line = (
        f"{peer} {version} is outside the versions cuforge.{system} is tested on ({span}), "
        f"and its contract probe failed: {problem}; {peer}'s own cache keeps working"
    )
    VERDICTS[system] = ("refused", line)
    return line


def refused(system: str, line: str) -> str:
    """Record that ``system`` cannot plug in (``line`` says why); returns ``line``."""
    VERDICTS[system] = ("refused", line)
    return line


def version_tuple(text: str, parts: int = 3) -> tuple[int, ...]:
    """``"0.10.2rc1"`` -> ``(0, 10, 2)``: the leading numbers of a version string."""
    out = []
    for piece in text.split(".")[:parts]:
        digits = ""
        for ch in piece:  # the leading digits only: "0+cu132" is 0, "2rc1" is 2
            if not ch.isdigit():
                break
            digits += ch
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
            raise blobformat.BlobFormatError(f"the entry is of kind {entry.kind!r}")
        return blobformat.unpack(entry.payload)
    except blobformat.BlobFormatError as exc:
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
    cache.put(Entry(key, kind, blobformat.pack(files), meta))
