"""What the cache did, day by day: the data behind ``cuforge cache report``.

Read from the cache's own records only, never written:

* the telemetry (:func:`cuforge.store.telemetry.timeline`): per flush, hits, misses,
  builds and puts per tier and entry kind, with the compile seconds each hit saved;
* the explained misses (:func:`cuforge.keys.explain.recent_misses`);
* the disk tier's index: the bytes it holds per kind.

A day is a local calendar day. Hits, misses, the hit rate and the seconds saved are
counted by :func:`cuforge.store.telemetry.tally`, as ``cuforge cache stats`` counts them:
a hit once, at the tier that answered it; a miss, a lookup no tier answered (under direct
mode, a cold compile is one manifest miss, a warm one one kernel hit).
Systems are named by the caller (``system_of``: entry kind -> system, such as
``cuforge.adapters.switch.system_of_kind``; this layer does not know the adapters);
cuforge's own kinds are :data:`OWN`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta

from cuforge.keys.explain import recent_misses
from cuforge.store import telemetry
from cuforge.store.disk import DiskStore

__all__ = ["Day", "MissedKernel", "TierBytes", "Report", "build_report", "saved_per_day", "OWN"]

#: the system name of cuforge's own entry kinds (kernels, objects, modules)
OWN = "cuforge"
#: how many explained misses are read (the log keeps its newest ~1 MiB)
MISS_RECORDS = 5000


@dataclass(frozen=True)
class Day:
    """One calendar day: the whole chain's lookups and what the hits saved, per system."""

    date: date
    hits: int = 0
    misses: int = 0
    builds: int = 0
    saved: dict[str, float] = field(default_factory=dict)

    @property
    def seconds_saved(self) -> float:
        return sum(self.saved.values())

    @property
    def hit_rate(self) -> float | None:
        """Hits over lookups, or None when nothing was looked up that day."""
        lookups = self.hits + self.misses
        return self.hits / lookups if lookups else None


@dataclass(frozen=True)
class MissedKernel:
    """A name that missed, by its explained misses in the window (newest reasons)."""

    name: str
    misses: int
    last: float
    reasons: list[str]


@dataclass(frozen=True)
class TierBytes:
    """Bytes of one kind in one tier. ``held``: what the tier holds now (the disk index);
    else what was written to it in the window (the telemetry's puts: a remote is not
    listed)."""

    tier: str
    kind: str
    bytes: int
    entries: int
    held: bool


@dataclass(frozen=True)
class Report:
    cache_dir: str
    generated: float
    days: list[Day]
    systems: list[str]
    missed: list[MissedKernel]
    tier_bytes: list[TierBytes]
    telemetry_enabled: bool

    @property
    def seconds_saved(self) -> float:
        return sum(d.seconds_saved for d in self.days)

    @property
    def hits(self) -> int:
        return sum(d.hits for d in self.days)

    @property
    def misses(self) -> int:
        return sum(d.misses for d in self.days)

    @property
    def builds(self) -> int:
        return sum(d.builds for d in self.days)

    @property
    def hit_rate(self) -> float | None:
        lookups = self.hits + self.misses
        return self.hits / lookups if lookups else None

    @property
    def saved_by_system(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for d in self.days:
            for system, seconds in d.saved.items():
                out[system] = out.get(system, 0.0) + seconds
        return out

    @property
    def empty(self) -> bool:
        """Nothing recorded in the window and nothing held: a page that says so."""
        return (
            not any(d.hits or d.misses or d.builds or d.saved for d in self.days)
            and not self.missed
            and not self.tier_bytes
        )

    def as_dict(self) -> dict:
        """The report as plain data (``--json``)."""
        return {
            "cache_dir": self.cache_dir,
            "generated": self.generated,
            "telemetry_enabled": self.telemetry_enabled,
            "seconds_saved": self.seconds_saved,
            "hits": self.hits,
            "misses": self.misses,
            "builds": self.builds,
            "hit_rate": self.hit_rate,
            "systems": self.systems,
            "days": [
                {
                    "date": d.date.isoformat(),
                    "hits": d.hits,
                    "misses": d.misses,
                    "builds": d.builds,
                    "hit_rate": d.hit_rate,
                    "seconds_saved": d.seconds_saved,
                    "saved": dict(d.saved),
                }
                for d in self.days
            ],
            "missed": [
                {"name": m.name, "misses": m.misses, "last": m.last, "reasons": m.reasons}
                for m in self.missed
            ],
            "bytes": [
                {
                    "tier": b.tier,
                    "kind": b.kind,
                    "bytes": b.bytes,
                    "entries": b.entries,
                    "held": b.held,
                }
                for b in self.tier_bytes
            ],
        }


def _system(kind: str, system_of: Callable[[str], str | None] | None) -> str:
    name = system_of(kind) if system_of is not None else None
    return name or OWN


def _window(days: int, now: float) -> list[date]:
    if days < 1:
        raise ValueError(f"days must be at least 1, not {days}")
    today = datetime.fromtimestamp(now).date()
    return [today - timedelta(days=days - 1 - i) for i in range(days)]


def saved_per_day(cache_dir: str, days: int = 14, *, now: float | None = None) -> list[float]:
    """Compile seconds the hits saved on each of the last ``days`` local days, oldest
    first (today last): ``cuforge cache stats``'s sparkline."""
    now = time.time() if now is None else now
    window = _window(days, now)
    index = {d: i for i, d in enumerate(window)}
    out = [0.0] * days
    for t, counts in telemetry.timeline(cache_dir):
        i = index.get(datetime.fromtimestamp(t).date())
        if i is None:
            continue
        out[i] += telemetry.tally(counts)["seconds_saved"]
    return out


def build_report(
    cache_dir: str,
    *,
    days: int = 14,
    system_of: Callable[[str], str | None] | None = None,
    top: int = 10,
    now: float | None = None,
) -> Report:
    """What the cache at ``cache_dir`` did in the last ``days`` local days (today included).

    ``system_of`` names the system of an entry kind (None: :data:`OWN`); ``top``: how many
    missing names to keep. Raises ``ValueError`` when ``days`` < 1. Reads only."""
    now = time.time() if now is None else now
    window = _window(days, now)
    index = {d: i for i, d in enumerate(window)}
    rows: list[dict] = [{"hits": 0, "misses": 0, "builds": 0, "saved": {}} for _ in window]
    written: dict[tuple[str, str], list[int]] = {}
    systems: dict[str, float] = {}
    for t, counts in telemetry.timeline(cache_dir):
        i = index.get(datetime.fromtimestamp(t).date())
        if i is None:
            continue
        row = rows[i]
        # hits, misses and seconds saved: the one definition (telemetry.tally)
        counted = telemetry.tally(counts)
        row["hits"] += counted["hits"]
        row["misses"] += counted["misses"]
        for kind, hit in counted["kinds"].items():
            seconds = hit["seconds_saved"]
            if seconds > 0:
                system = _system(kind, system_of)
                row["saved"][system] = row["saved"].get(system, 0.0) + seconds
                systems[system] = systems.get(system, 0.0) + seconds
        for (tier, event, kind), (count, nbytes, _seconds) in counts.items():
            if tier == telemetry.CHAIN:
                if event == "build":
                    row["builds"] += count
            elif event == "put" and kind and tier != "memory":
                slot = written.setdefault((tier, kind), [0, 0])
                slot[0] += nbytes
                slot[1] += count

    first = datetime.combine(window[0], datetime.min.time()).timestamp()
    by_name: dict[str, MissedKernel] = {}
    for record in recent_misses(cache_dir, limit=MISS_RECORDS):
        name, when = record.get("name"), record.get("time")
        if not isinstance(name, str) or not isinstance(when, (int, float)) or when < first:
            continue
        reasons = [r for r in record.get("reasons") or [] if isinstance(r, str)]
        seen = by_name.get(name)
        count = 1 if seen is None else seen.misses + 1
        if seen is not None and when < seen.last:
            by_name[name] = MissedKernel(name, count, seen.last, seen.reasons)
        else:
            by_name[name] = MissedKernel(name, count, float(when), reasons)
    missed = sorted(by_name.values(), key=lambda m: (-m.misses, -m.last, m.name))[:top]

    tier_bytes: list[TierBytes] = []
    disk_kinds: dict[str, dict[str, int]] = {}
    if os.path.isdir(cache_dir):  # a cache that never was: nothing held, nothing created
        # telemetry=False: reading the report is not cache traffic; -1: no cap (no put)
        disk_kinds = DiskStore(cache_dir, -1, telemetry=False).stats().extra.get("kinds", {})
    for kind, held in sorted(disk_kinds.items()):
        if held.get("entries"):
            tier_bytes.append(TierBytes("disk", kind, held["bytes"], held["entries"], True))
    for (tier, kind), (nbytes, count) in sorted(written.items()):
        if tier != "disk" and (nbytes or count):
            tier_bytes.append(TierBytes(tier, kind, nbytes, count, False))

    return Report(
        cache_dir=cache_dir,
        generated=now,
        days=[
            Day(d, r["hits"], r["misses"], r["builds"], dict(r["saved"]))
            for d, r in zip(window, rows, strict=True)
        ],
        systems=sorted(systems, key=lambda s: (-systems[s], s)),
        missed=missed,
        tier_bytes=tier_bytes,
        telemetry_enabled=telemetry.summary(cache_dir, top=0)["enabled"],
    )
