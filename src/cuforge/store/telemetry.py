"""Local cache telemetry: hits, misses, puts, bytes and compile seconds saved.

Counted per tier, per entry kind and per entry name, by the stores themselves. Nothing
ever leaves the machine: the record is a file under ``<cache root>/telemetry/``.

What is recorded, and how it is counted:

* **Per tier** (tier ``"memory"``, ``"disk"``, ``"remote"``...): each tier records the
  lookups that reached it (a ``hit`` when it had the entry, a ``miss`` when not) and
  what was stored in it (a ``put`` in each tier an entry is stored in).
* **The whole chain** (tier :data:`CHAIN`, recorded by
  :class:`~cuforge.store.tiered.TieredStore`): one ``miss`` per lookup every tier missed,
  one ``build`` per entry built and stored, whatever the number of tiers (and a ``hit``
  per lookup some tier answered, kept for older readers of the record).

Every reader counts hits and misses through :func:`tally`, the one definition: a hit is
a lookup answered by a tier, counted once at the tier that answered it (the first one
that had it); a miss is a lookup no tier answered; the total of hits is the sum of the
tiers' hits and the hit rate is hits / (hits + misses). A tier's own ``miss`` events
(``not_found`` in :func:`summary`) are not misses of the cache. The names' ``puts``
(``builds`` in ``cuforge cache stats``) count builds.

How it stays cheap and safe:

* :func:`record` only bumps counters in memory (about a microsecond of work).
* Every :data:`FLUSH_EVERY` events, after :data:`FLUSH_SECONDS` (checked every 64 events)
  and at exit, the deltas
  of this process are appended to ``events.jsonl`` as ONE line written with ONE
  ``O_APPEND`` write, so many processes can flush at once without mixing their lines.
  Appenders hold a shared ``flock`` on ``telemetry/lock``.
* When the file grows past :data:`MAX_FILE_BYTES`, the flushing process takes that lock
  exclusively and folds the lines into one per day (UTC) for the last :data:`KEEP_DAYS`
  days and one for everything older (the counts only; the names go on the newest line,
  keeping the :data:`MAX_NAMES` names that saved the most time; the rest is summed into
  ``"(other)"``), so the record stays bounded and :func:`timeline` still has its days.
* ``CUFORGE_TELEMETRY=0`` (``config.settings().telemetry`` False) records nothing and
  writes nothing. Reading a summary never writes either.

The line format (version 1)::

    {"v": 1, "t": <unix time>, "pid": <pid>,
     "c": [[tier, event, kind, count, nbytes, seconds_saved], ...],
     "n": [[name, kind, hits, builds, seconds_saved], ...]}
"""

from __future__ import annotations

import atexit
import os
import sys
import weakref
from _thread import allocate_lock
from time import monotonic, time

from cuforge.base import _fs
from cuforge.base._fastjson import dumps
from cuforge.base.config import settings
from cuforge.base.layout import CacheLayout

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: see docs/architecture.md, the warm path
if TYPE_CHECKING:  # pragma: no cover
    from typing import Any


__all__ = [
    "record",
    "summary",
    "kind_totals",
    "tally",
    "timeline",
    "flush",
    "telemetry_dir",
    "CHAIN",
    "SERVED",
    "SERVED_EVENTS",
    "FLUSH_EVERY",
    "MAX_FILE_BYTES",
]

FORMAT_VERSION = 1
FLUSH_EVERY = 1024
FLUSH_SECONDS = 10.0
MAX_FILE_BYTES = 1 << 20
MAX_NAMES = 1000
#: compaction keeps one line per day (UTC) for this many days, then one for the rest
KEEP_DAYS = 92
DAY = 86400
TOP = 20
#: ``error``: a remote call failed (down, timed out, garbage); ``rejected``: a remote entry
#: refused by the trust checks (unsigned or badly signed, wrong namespace)
EVENTS = ("hit", "miss", "put", "corrupt", "evict", "error", "rejected", "build")
#: the tier name of the whole-chain counts (hits, misses and builds once per lookup/build)
CHAIN = "lookup"
#: the tier name of "which key served a call" counts, per system (an integration's entry
#: kind): events :data:`SERVED_EVENTS` (``cuforge cache stats``: ``served``)
SERVED = "served"
#: ``pretrace``: the key made before tracing (no trace, no compile); ``ir``: the key of the
#: traced module (a trace, no compile); ``uncached``: neither key could cover the call
SERVED_EVENTS = ("pretrace", "ir", "uncached")
#: the name under which compaction sums the names it drops (never in ``top``)
OTHER = "(other)"

_lock = allocate_lock()
# root -> [counts: {(tier, event, kind): [count, nbytes, seconds]},
#          names: {(name, kind): [hits, puts, seconds]}, events, last_flush]
_pending: dict[str, list] = {}
_dead_roots: set[str] = set()
_atexit_registered = False
# callables that push buffered counts into record() (TieredStore's memory hits); weak
_drains: list = []


def add_drain(fn) -> None:
    """Register a bound method that hands buffered counts to :func:`record`; it is called
    before every flush and summary. Held weakly: a dead store's drain just disappears."""
    _drains.append(weakref.WeakMethod(fn))
    _register_atexit()


_draining = False


def _drain_all() -> None:
    global _draining
    _draining = True
    try:
        _run_drains()
    finally:
        _draining = False


def _run_drains() -> None:
    alive = []
    for ref in list(_drains):
        fn = ref()
        if fn is not None:
            alive.append(ref)
            try:
                fn()
            except Exception:  # noqa: BLE001 - telemetry never breaks the caller
                pass
    _drains[:] = alive


def telemetry_dir(root: str) -> str:
    """The telemetry dir of the cache dir ``root`` (``CacheLayout(root).telemetry``)."""

    return CacheLayout.of(root).telemetry


def record(
    root: str,
    event: str,
    *,
    tier: str,
    kind: str,
    name: object,
    nbytes: int = 0,
    seconds_saved: object = 0.0,
    count: int = 1,
) -> None:
    """Count ``count`` events (one of :data:`EVENTS`) of ``tier``.

    ``name`` and ``seconds_saved`` may come straight from an entry's meta: a name that is
    not a string counts as no name, and seconds that are not a number as 0.

    Only bumps counters in memory (about a microsecond): whether telemetry is enabled is
    checked when the counts are flushed, and nothing is written when it is not."""
    if not isinstance(name, str):
        name = None
    if not isinstance(seconds_saved, (int, float)):
        seconds_saved = 0.0
    with _lock:
        agg = _pending.get(root)
        if agg is None:
            agg = _pending[root] = [{}, {}, 0, monotonic()]
            _register_atexit()
        counts = agg[0]
        slot = counts.get((tier, event, kind))
        if slot is None:
            counts[(tier, event, kind)] = [count, nbytes, seconds_saved]
        else:
            slot[0] += count
            slot[1] += nbytes
            slot[2] += seconds_saved
        # per name: hits where a tier answered (one tier per lookup), builds once each; not
        # manifests (the index a compile reads on its way to the entry that counts)
        if (
            name is not None
            and kind != "manifest"
            and ((event == "hit" and tier != CHAIN) or event == "build")
        ):
            names = agg[1]
            nslot = names.get((name, kind))
            if nslot is None:
                nslot = names[(name, kind)] = [0, 0, 0.0]
            if event == "hit":
                nslot[0] += count
                nslot[2] += seconds_saved
            else:
                nslot[1] += count
        agg[2] += 1
        if agg[2] < FLUSH_EVERY and (agg[2] & 63 or monotonic() - agg[3] < FLUSH_SECONDS):
            return
    flush(root)


#: the process whose multiprocessing finalizer is registered (0: none)
_finalizer_pid = 0


def _register_atexit() -> None:
    """Flush at exit. A multiprocessing worker ends with ``os._exit`` after running only
    multiprocessing's own finalizers (no ``atexit``), so in a process where multiprocessing
    is loaded the flush is also one of those, registered once per process (a forked
    worker starts with an empty registry)."""
    global _atexit_registered, _finalizer_pid
    if not _atexit_registered:
        atexit.register(flush)
        _atexit_registered = True
    if _finalizer_pid != os.getpid():
        mp_util = sys.modules.get("multiprocessing.util")
        if mp_util is not None:
            _finalizer_pid = os.getpid()
            mp_util.Finalize(None, flush, exitpriority=0)


def _take(root: str) -> list | None:
    with _lock:
        agg = _pending.pop(root, None)
    if agg is None or agg[2] == 0:
        return None
    return agg


def flush(root: str | None = None) -> None:
    """Append this process's pending counts (of ``root``, or of every root) to the record."""
    if _drains and not _draining:
        _drain_all()
    roots = [root] if root is not None else list(_pending)
    for r in roots:
        agg = _take(r)
        if agg is None or r in _dead_roots or not settings().telemetry:
            continue
        line = {
            "v": FORMAT_VERSION,
            "t": round(time(), 3),
            "pid": os.getpid(),
            "c": [[t, e, k, c[0], c[1], round(c[2], 6)] for (t, e, k), c in agg[0].items()],
            "n": [[n, k, s[0], s[1], round(s[2], 6)] for (n, k), s in agg[1].items()],
        }
        try:
            _append(r, line)
        except OSError:
            # A telemetry problem must never disturb a compile; the disk tier warns about
            # an unusable cache dir itself. Stop trying for this root in this process.
            _dead_roots.add(r)


def _dumps(obj: Any) -> str:
    # not json: its import (~7 ms, re included) was most of a fresh process's disk hit,
    # paid at its exit (bench/disk_hit_cpu.py)
    return dumps(obj)


def _append(root: str, line: dict) -> None:
    """Append one line to ``events.jsonl`` under a shared lock; compact past the cap.
    Raises ``OSError`` (a symlink or anything but a regular file there included: such a
    file is never written through)."""
    tdir = telemetry_dir(root)
    data = (_dumps(line) + "\n").encode()
    lock = _fs.locked(os.path.join(tdir, "lock"), shared=True)
    with lock:
        size = _fs.append_line(os.path.join(tdir, "events.jsonl"), data)
        lock.release()
        if size > MAX_FILE_BYTES:
            _compact(tdir, lock)


def _compact(tdir: str, lock: _fs.locked) -> None:
    if not lock.relock(shared=False, blocking=False):
        return  # another process is compacting
    try:
        path = os.path.join(tdir, "events.jsonl")
        if os.path.getsize(path) <= MAX_FILE_BYTES:
            return
        _counts, names, _since = _read(path)
        names = _bound_names(names, MAX_NAMES)
        # one line per UTC day of the last KEEP_DAYS days, one for all before: the totals
        # stay exact and the days stay days (cuforge cache report)
        oldest_day = int(time() // DAY) - KEEP_DAYS
        groups: dict[int, list] = {}  # day (or -1: older) -> [first time, counts]
        for t, counts in _lines(path):
            day = max(int(t // DAY), oldest_day - 1)
            group = groups.get(day)
            if group is None:
                groups[day] = [t, dict(counts)]
                continue
            group[0] = min(group[0], t)
            for k, c in counts.items():
                _merge(group[1], k, c)
        days = sorted(groups)
        out = []
        for i, day in enumerate(days):
            first, counts = groups[day]
            out.append(
                {
                    "v": FORMAT_VERSION,
                    "t": first,
                    "pid": 0,
                    "c": [[t, e, k, c[0], c[1], round(c[2], 6)] for (t, e, k), c in counts.items()],
                    "n": [[n, k, s[0], s[1], round(s[2], 6)] for (n, k), s in names.items()]
                    if i == len(days) - 1
                    else [],
                }
            )
        if not out:
            out.append({"v": FORMAT_VERSION, "t": round(time(), 3), "pid": 0, "c": [], "n": []})
        _fs.atomic_write(path, "".join(_dumps(line) + "\n" for line in out), makedirs=False)
    finally:
        lock.release()


def _bound_names(names: dict, limit: int) -> dict:
    if len(names) <= limit:
        return names
    ranked = sorted(names.items(), key=lambda kv: (kv[1][2], kv[1][0]), reverse=True)
    kept = dict(ranked[: limit - 1])
    other = [0, 0, 0.0]
    for _, s in ranked[limit - 1 :]:
        other[0] += s[0]
        other[1] += s[1]
        other[2] += s[2]
    kept[(OTHER, "")] = other
    return kept


def _read(path: str) -> tuple[dict, dict, float | None]:
    counts: dict = {}
    names: dict = {}
    since: float | None = None
    for t, line_counts, line_names in _parsed(path):
        for k, c in line_counts.items():
            _merge(counts, k, c)
        for k, s in line_names.items():
            _merge(names, k, s)
        if since is None or t < since:
            since = t
    return counts, names, since


def _lines(path: str) -> list[tuple[float, dict]]:
    """``(time, counts)`` of every readable line of the record at ``path``, in file order."""
    return [(t, c) for t, c, _n in _parsed(path)]


def _parsed(path: str) -> list[tuple[float, dict, dict]]:
    """``(time, counts, names)`` of every line of version :data:`FORMAT_VERSION` with a
    time; torn or foreign lines are skipped. Nothing (a missing record, or not a regular
    file) is an empty list."""
    import json

    try:
        raw = _fs.read_bytes(path)
    except OSError:
        return []  # missing, or not a regular file: nothing recorded
    out = []
    for text in raw.split(b"\n"):
        if not text:
            continue
        counts: dict = {}
        names: dict = {}
        try:
            line = json.loads(text)
            if line.get("v") != FORMAT_VERSION:
                continue
            t = line.get("t")
            if not isinstance(t, (int, float)) or isinstance(t, bool):
                continue
            for tier, event, kind, count, nbytes, seconds in line.get("c", ()):
                _merge(counts, (tier, event, kind), (count, nbytes, seconds))
            for name, kind, hits, puts, seconds in line.get("n", ()):
                _merge(names, (name, kind), (hits, puts, seconds))
        except (ValueError, TypeError, AttributeError):
            continue  # a torn or foreign line: skip it
        out.append((float(t), counts, names))
    return out


def timeline(root: str) -> list[tuple[float, dict[tuple[str, str, str], list]]]:
    """Everything recorded under ``root``, flush by flush: ``[(unix time, {(tier, event,
    kind): [count, nbytes, seconds_saved]}), ...]`` in file order, this process's unflushed
    counts last (at the current time). A compacted record has one line per day (UTC) of
    the last :data:`KEEP_DAYS` days and one for all before. Reads only; never writes."""
    if _drains and not _draining:
        _drain_all()
    out = _lines(os.path.join(telemetry_dir(root), "events.jsonl"))
    if settings().telemetry:
        with _lock:
            agg = _pending.get(root)
            if agg is not None and agg[0]:
                out.append((time(), {k: list(c) for k, c in agg[0].items()}))
    return out


def _merge(into: dict, key: tuple, values) -> None:
    slot = into.get(key)
    if slot is None:
        into[key] = list(values)
    else:
        for i, v in enumerate(values):
            slot[i] += v


def summary(root: str, *, top: int = TOP) -> dict:
    """Everything recorded under ``root`` (all processes, plus this one's unflushed counts).

    ``{"tiers": {tier: {"hits", "not_found", "puts", "corrupt", "evictions", "errors",
    "rejected", "bytes_hit", "bytes_put", "seconds_saved"}}, "kinds": {kind: {...same...,
    "misses"}}, "lookups": {"lookups", "hits", "misses", "builds"}, "hit_rate": float or
    None, "served": {kind: {"pretrace", "ir", "uncached"}} (calls of an integration by the
    key that served them), "seconds_saved": float, "top": [{"name", "kind", "hits", "puts",
    "seconds_saved"}, ...], "since": unix time or None, "enabled": bool, "file": path,
    "file_bytes": int}``.

    Hits, misses, the hit rate and the seconds saved are :func:`tally`'s (the one
    definition): a tier's ``hits`` are the lookups it answered, ``lookups["hits"]`` is the
    sum of the tiers' hits and ``lookups["misses"]`` the lookups no tier answered. A
    tier's ``not_found`` counts the lookups that reached it and that it did not have (a
    lookup answered by a slower tier included): not misses of the cache. ``puts`` are per
    tier (an entry stored in two tiers is a put in each); ``lookups["builds"]`` and
    ``top``'s ``puts`` count each build once.
    """
    if _drains and not _draining:
        _drain_all()
    path = os.path.join(telemetry_dir(root), "events.jsonl")
    counts, names, since = _read(path)
    enabled = settings().telemetry
    with _lock:
        agg = _pending.get(root) if enabled else None
        if agg is not None:
            for k, c in agg[0].items():
                _merge(counts, k, c)
            for k, s in agg[1].items():
                _merge(names, k, s)
    counted = tally(counts)
    tiers: dict[str, dict] = {}
    kinds: dict[str, dict] = {}
    builds = 0
    # the events that are not hits or misses, per tier and per kind
    field = {
        "miss": "not_found",
        "put": "puts",
        "corrupt": "corrupt",
        "error": "errors",
        "rejected": "rejected",
        "evict": "evictions",
    }
    served: dict[str, dict[str, int]] = {}

    def row_of(table: dict, name: str) -> dict:
        row = table.get(name)
        if row is None:
            row = table[name] = {
                "hits": 0,
                "not_found": 0,
                "puts": 0,
                "corrupt": 0,
                "evictions": 0,
                "errors": 0,
                "rejected": 0,
                "bytes_hit": 0,
                "bytes_put": 0,
                "seconds_saved": 0.0,
            }
        return row

    for (tier, event, kind), (count, nbytes, _seconds) in counts.items():
        if tier == CHAIN:
            if event == "build":
                builds += count
            continue
        if tier == SERVED:
            if event in SERVED_EVENTS and kind:
                srow = served.setdefault(kind, dict.fromkeys(SERVED_EVENTS, 0))
                srow[event] += count
            continue
        slot = field.get(event)
        if slot is None and event != "hit":
            slot = "evictions"  # an event of a newer version: as before
        for table, name in ((tiers, tier), (kinds, kind)):
            if table is kinds and not kind:
                continue
            row = row_of(table, name)
            if slot is not None:
                row[slot] += count
            if event == "put":
                row["bytes_put"] += nbytes
    for tier, hit in counted["tiers"].items():
        row_of(tiers, tier).update(hit)
    for kind, hit in counted["kinds"].items():
        if kind:
            row = row_of(kinds, kind)
            row["hits"] = hit["hits"]
            row["seconds_saved"] = hit["seconds_saved"]
            row["misses"] = hit["misses"]
    for row in kinds.values():
        row.setdefault("misses", 0)
    ranked = sorted(
        (kv for kv in names.items() if kv[0][0] != OTHER),
        key=lambda kv: (kv[1][2], kv[1][0]),
        reverse=True,
    )
    try:
        file_bytes = os.path.getsize(path)
    except OSError:
        file_bytes = 0
    return {
        "tiers": tiers,
        "kinds": kinds,
        "lookups": {
            "lookups": counted["lookups"],
            "hits": counted["hits"],
            "misses": counted["misses"],
            "builds": builds,
        },
        "hit_rate": counted["hit_rate"],
        "served": served,
        "seconds_saved": counted["seconds_saved"],
        "top": [
            {"name": n, "kind": k, "hits": s[0], "puts": s[1], "seconds_saved": s[2]}
            for (n, k), s in ranked[:top]
        ],
        "since": since,
        "enabled": enabled,
        "file": path,
        "file_bytes": file_bytes,
    }


def tally(counts: dict) -> dict:
    """THE one definition of a hit and of a miss, for every reader of the record:
    ``cuforge cache stats`` (text and ``--json``), :func:`summary`, :func:`kind_totals`
    (``cuforge run``), ``cuforge cache report`` and ``cuforge doctor`` all count through
    this function, and nothing else counts them.

    * A **hit** is a lookup answered by a tier, counted once, at the tier that answered it:
      the first tier that had the entry (a tier is asked only after every faster one did
      not have it, and copying a remote hit down into the local tiers is a put there, not
      a hit). A found direct-mode manifest is not a hit: it leads to the lookup of the
      entry it names, and that lookup is the one that counts.
    * A **miss** is a lookup no tier answered (the chain's ``miss``, :data:`CHAIN`, once
      per lookup, whatever the number of tiers).

    ``counts``: ``{(tier, event, kind): [count, nbytes, seconds_saved]}`` (one flush line
    of :func:`timeline`, or everything). Returns ``{"tiers": {tier: {"hits", "bytes_hit",
    "seconds_saved"}}, "kinds": {kind: {"hits", "misses", "seconds_saved"}}, "hits",
    "misses", "lookups", "hit_rate", "seconds_saved"}``: ``hits`` is the sum of the tiers'
    rows, ``lookups`` is ``hits + misses`` and ``hit_rate`` ``hits / lookups`` (None
    without lookups); ``seconds_saved`` are the compile seconds of the hits counted."""
    tiers: dict[str, dict] = {}
    kinds: dict[str, dict] = {}
    misses = 0
    for (tier, event, kind), (count, nbytes, seconds) in counts.items():
        if tier == CHAIN:
            if event == "miss":
                misses += count
                row = kinds.get(kind)
                if row is None:
                    row = kinds[kind] = {"hits": 0, "misses": 0, "seconds_saved": 0.0}
                row["misses"] += count
            continue
        if event != "hit" or tier == SERVED or kind == "manifest":
            continue
        row = tiers.get(tier)
        if row is None:
            row = tiers[tier] = {"hits": 0, "bytes_hit": 0, "seconds_saved": 0.0}
        row["hits"] += count
        row["bytes_hit"] += nbytes
        row["seconds_saved"] += seconds
        row = kinds.get(kind)
        if row is None:
            row = kinds[kind] = {"hits": 0, "misses": 0, "seconds_saved": 0.0}
        row["hits"] += count
        row["seconds_saved"] += seconds
    hits = sum(row["hits"] for row in tiers.values())
    lookups = hits + misses
    return {
        "tiers": tiers,
        "kinds": kinds,
        "hits": hits,
        "misses": misses,
        "lookups": lookups,
        "hit_rate": hits / lookups if lookups else None,
        "seconds_saved": float(sum(row["seconds_saved"] for row in tiers.values())),
    }


def kind_totals(root: str) -> dict[str, dict[str, float]]:
    """Per entry kind, everything recorded under ``root`` so far (all processes, flushed):
    ``{kind: {"hits", "misses", "builds", "seconds_saved"}}``. Hits, misses and seconds
    saved are :func:`tally`'s (a hit once, at the tier that answered it; a miss: no tier
    answered); builds are the chain's, once each. Manifests and lookups of no kind are
    left out. Two calls around a run give what the run did (``cuforge run``). Reads only;
    never writes."""
    counts, _names, _since = _read(os.path.join(telemetry_dir(root), "events.jsonl"))
    totals: dict[str, dict[str, float]] = {}

    def row_of(kind: str) -> dict[str, float]:
        return totals.setdefault(kind, {"hits": 0, "misses": 0, "builds": 0, "seconds_saved": 0.0})

    for kind, row in tally(counts)["kinds"].items():
        if kind and kind != "manifest":
            out = row_of(kind)
            out["hits"] = row["hits"]
            out["misses"] = row["misses"]
            out["seconds_saved"] = row["seconds_saved"]
    for (tier, event, kind), (count, _nbytes, _seconds) in counts.items():
        if tier == CHAIN and event == "build" and kind and kind != "manifest":
            row_of(kind)["builds"] += count
    return totals


def _after_fork_in_child() -> None:
    # The parent's unflushed counts are the parent's to flush: never count them twice.
    global _lock
    _lock = allocate_lock()
    _pending.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
