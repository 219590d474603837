"""Several tiers as one store: look up fastest first, back-fill hits, write everywhere."""

from __future__ import annotations

import contextlib
import os
import threading

from cuforge.store import telemetry as _telemetry
from cuforge.store.base import Entry, EntryInfo, Store, StoreStats

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: see docs/architecture.md, the warm path
if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable, Iterator, Sequence


__all__ = ["TieredStore"]


class TieredStore(Store):
    """``tiers`` fastest first (e.g. ``[MemoryStore, DiskStore, RemoteStore...]``).

    * ``get`` / :meth:`get_with_tier` ask each tier in order (passing the ``kind`` hint
      on: remote tiers need it); a hit in a slower tier is put into every faster *local*
      tier (promotion, read-through: a remote hit lands in memory and on disk). A hit in
      a second remote is not written back to the first one (no remote write on a read).
    * ``put`` writes every tier; True when at least one stored it.
    * ``delete`` deletes from every tier.
    * ``stats()`` is the aggregate: ``hits`` counts lookups some tier answered, ``misses``
      lookups no tier answered (this process), ``puts`` this process's puts, ``entries`` /
      ``bytes`` those of the last local tier; ``extra["tiers"]`` holds each tier's own
      ``stats().as_dict()`` by tier name (a second remote is ``"remote#2"``, a third
      ``"remote#3"``...). Per tier: ``[t.stats() for t in store.tiers]``.

    Telemetry: tiers that keep none themselves (the memory tier) are recorded here, under
    the root of the first disk tier, so ``cuforge cache stats`` shows memory hits too.
    So are the whole chain's counts (tier :data:`~cuforge.store.telemetry.CHAIN`), each
    once, whatever the number of tiers:

    * a ``hit`` per lookup some tier answered, a ``miss`` per lookup every tier missed;
      a manifest (the index a compile reads before its kernel) counts only when it misses
      (a found manifest leads to the lookup of the kernel, which counts), and a key that
      already missed in this process and was not stored since does not count again (the
      re-check under the compile lock, the manifest read before it is rewritten);
    * a ``build`` per entry stored through :meth:`put` (manifests, which describe a build,
      are not one).

    So one cold process (compile and store) and one warm one (served from the cache) read
    2 lookups, 1 hit, 1 build.

    Revoked signers: an entry a remote delivered after checking its signature carries the
    signer's key id (``meta["signer_kid"]``) into the local tiers. A hit of such an entry
    in a local tier other than memory (the disk; memory holds only what this process
    already checked) looks the key id up among the keys ``CUFORGE_TRUSTED_KEYS`` revokes
    (read on the first such hit, once per store: no signature is verified); a revoked one
    is refused: deleted from that tier, counted (``refused_revoked``), one warning per key
    and process, and the lookup goes on to the slower tiers (a miss, then a build).
    """

    tier = "tiered"

    def __init__(self, tiers: Sequence[Store]) -> None:
        if not tiers:
            raise ValueError("TieredStore needs at least one tier")
        self.tiers: list[Store] = list(tiers)
        self.hits = self.misses = self.puts = 0
        # the telemetry root: the first tier recording shared telemetry itself
        self._root: str | None = None
        for t in self.tiers:
            if getattr(t, "telemetry", False) is True and isinstance(getattr(t, "root", None), str):
                self._root = t.root  # type: ignore[attr-defined]
                break
        self._unrecorded = tuple(
            (t, t.tier) for t in self.tiers if getattr(t, "telemetry", None) is not True
        )
        # memory-tier hits, buffered (a list append is all a hit costs) and handed to
        # telemetry in bulk: every _BUFFER hits, and whenever telemetry flushes or sums up
        self._mem_hits: list[Entry] = []
        self._mem_misses = 0
        # (kind, key) that missed the whole chain and were not stored since (counted once)
        self._missed: set[tuple[str | None, str]] = set()
        self._pid = os.getpid()
        #: this thread's held misses (:meth:`misses_held`)
        self._hold = threading.local()
        #: per tier: whether its hits are checked against revoked signers (local tiers
        #: that outlive the process: not memory, not a remote, not a bundle)
        self._kept = tuple(t.tier not in ("memory", "remote", "bundle") for t in self.tiers)
        #: kid -> name of the keys the current keyring revokes (None: not read yet)
        self._revoked: dict[str, str] | None = None
        #: local entries refused because their recorded signer is revoked
        self.refused_revoked = 0
        if self._root is not None:
            _telemetry.add_drain(self._drain)

    def get(self, key: str, *, kind: str | None = None) -> Entry | None:
        return self.get_with_tier(key, kind=kind)[0]

    def get_with_tier(
        self, key: str, *, kind: str | None = None
    ) -> tuple[Entry | None, str | None]:
        """(entry, name of the tier that had it) or (None, None). Copies a hit into every
        faster local tier."""
        record = self._root is not None
        tiers = self.tiers
        for i, tier in enumerate(tiers):
            entry = tier.get(key, kind=kind)
            if record and tier.tier == "memory":
                if entry is None:
                    self._mem_misses += 1
                else:
                    hits = self._mem_hits
                    hits.append(entry)
                    if len(hits) >= _BUFFER:
                        self._drain()
            if entry is not None:
                if self._kept[i]:
                    kid = entry.meta.get("signer_kid")
                    if kid is not None and self._refuse(tier, entry, kid):
                        continue  # a copy its signer's revocation took back: a miss here
                # a copy of what a slower tier keeps: losing it costs one fetch, so the
                # disk tier skips fsync (~1 ms of a ~3 ms remote hit)
                for faster in tiers[:i]:
                    if faster.tier != "remote":
                        faster.put(entry, durable=False)
                self.hits += 1
                # (memory hits reach the chain's count with the buffered ones, in _drain)
                if record and tier.tier != "memory" and entry.kind != "manifest":
                    self._chain("hit", entry.kind)
                return entry, tier.tier
        self.misses += 1
        if record:
            self._note_miss(kind, key)
        return None, None

    @contextlib.contextmanager
    def misses_held(self) -> Iterator[Callable[[Entry, str], None]]:
        """Within the block, this thread's misses of this chain are held, not counted: the
        caller asks read-only tiers outside it next (bundles) and calls the function it is
        given with ``(entry, tier name)`` when one answers. At the end that answer is one
        hit of that tier and the held misses are dropped; with no answer, they count (one
        definition of a hit: :func:`cuforge.store.telemetry.tally`)."""
        hold = self._hold
        prior = getattr(hold, "misses", None)
        held: list[tuple[str | None, str]] = []
        hold.misses = held
        answers: list[tuple[Entry, str]] = []
        try:
            yield lambda entry, tier: answers.append((entry, tier))
        finally:
            hold.misses = prior
            root = self._root
            if answers and root is not None:
                entry, tier = answers[0]
                if entry.kind != "manifest":
                    _telemetry.record(
                        root,
                        "hit",
                        tier=tier,
                        kind=entry.kind,
                        name=entry.meta.get("name"),
                        nbytes=len(entry.payload),
                        seconds_saved=entry.meta.get("compile_seconds", 0),
                    )
                    self._chain("hit", entry.kind)
            elif root is not None:
                for kind, key in held:
                    self._note_miss(kind, key)

    def _note_miss(self, kind: str | None, key: str) -> None:
        held = getattr(self._hold, "misses", None)
        if held is not None:
            held.append((kind, key))
            return
        missed = self._missed
        if (kind, key) not in missed:
            if len(missed) >= _MISSED_MAX:
                missed.clear()
            missed.add((kind, key))
            self._chain("miss", kind or "")

    def _refuse(self, tier: Store, entry: Entry, kid: object) -> bool:
        """Whether ``entry``, a hit of the local ``tier``, was signed by a key the current
        keyring revokes (then it is deleted from ``tier`` and warned about once per key).
        A lookup by key id: no signature is verified. Raises ConfigError for a keyring that
        cannot be read or trusted (as a remote or a bundle opened with it would)."""
        revoked = self._revoked
        if revoked is None:
            revoked = self._revoked = _revoked_keys()
        if not revoked or type(kid) is not str or kid not in revoked:
            return False
        tier.delete(entry.key)
        self.refused_revoked += 1
        if self._root is not None:
            _telemetry.record(self._root, "rejected", tier=tier.tier, kind=entry.kind, name=None)
        if kid not in _warned_revoked:
            _warned_revoked.add(kid)
            import logging

            name = entry.meta.get("name")
            logging.getLogger("cuforge").warning(
                "cuforge: refused the local copy of %s %r (key %s...): it was signed by %r "
                "(kid %s), a key CUFORGE_TRUSTED_KEYS revokes; it is deleted and counts as a "
                "miss (rebuilt or fetched again). Entries of that key are refused the same "
                "way; shown once per process.",
                entry.kind,
                name if isinstance(name, str) else "?",
                entry.key[:16],
                revoked[kid],
                kid,
            )
        return True

    def _chain(self, event: str, kind: str, name: object = None) -> None:
        _telemetry.record(
            self._root,  # type: ignore[arg-type]
            event,
            tier=_telemetry.CHAIN,
            kind=kind,
            name=name,
        )

    def put(self, entry: Entry, *, durable: bool = True) -> bool:
        stored = False
        for tier in self.tiers:
            if tier.put(entry, durable=durable):
                stored = True
        if stored:
            self.puts += 1
            root = self._root
            if root is not None:
                self._missed.discard((entry.kind, entry.key))
                if entry.kind != "manifest":
                    self._chain("build", entry.kind, entry.meta.get("name"))
                for _tier, name in self._unrecorded:
                    if name == "memory":
                        _telemetry.record(
                            root,
                            "put",
                            tier="memory",
                            kind=entry.kind,
                            name=entry.meta.get("name"),
                            nbytes=len(entry.payload),
                        )
        return stored

    def delete(self, key: str) -> bool:
        removed = False
        for tier in self.tiers:
            if tier.delete(key):
                removed = True
        return removed

    def iterate(self) -> Iterator[EntryInfo]:
        """Every key once; the slowest (most durable) tier's description wins."""
        seen: set[str] = set()
        for tier in reversed(self.tiers):
            for info in tier.iterate():
                if info.key not in seen:
                    seen.add(info.key)
                    yield info

    def stats(self) -> StoreStats:
        per = [t.stats() for t in self.tiers]
        local = [s for s in per if s.tier != "remote"]
        last = local[-1] if local else per[-1]
        named: dict[str, dict] = {}
        for s in per:
            name, n = s.tier, 1
            while name in named:
                n += 1
                name = f"{s.tier}#{n}"
            named[name] = s.as_dict()
        return StoreStats(
            "tiered",
            entries=last.entries,
            bytes=last.bytes,
            hits=self.hits,
            misses=self.misses,
            puts=self.puts,
            evictions=sum(s.evictions for s in per),
            corrupt=sum(s.corrupt for s in per),
            extra={"tiers": named, "refused_revoked": self.refused_revoked},
        )

    def _drain(self) -> None:
        """Hand the buffered memory-tier hits and misses to telemetry."""
        root = self._root
        hits, self._mem_hits = self._mem_hits, []
        misses, self._mem_misses = self._mem_misses, 0
        if root is None or self._pid != os.getpid():
            self._pid = os.getpid()  # a forked child: those counts were the parent's
            return
        if misses:
            _telemetry.record(root, "miss", tier="memory", kind="", name=None, count=misses)
        grouped: dict[int, list] = {}
        for entry in hits:
            slot = grouped.get(id(entry))
            if slot is None:
                grouped[id(entry)] = [entry, 1]
            else:
                slot[1] += 1
        for entry, count in grouped.values():
            if entry.kind != "manifest":
                _telemetry.record(
                    root, "hit", tier=_telemetry.CHAIN, kind=entry.kind, name=None, count=count
                )
            seconds = entry.meta.get("compile_seconds", 0.0)
            if not isinstance(seconds, (int, float)):
                seconds = 0.0  # (multiplied below, so checked here too)
            _telemetry.record(
                root,
                "hit",
                tier="memory",
                kind=entry.kind,
                name=entry.meta.get("name"),
                nbytes=len(entry.payload) * count,
                seconds_saved=seconds * count,
                count=count,
            )

    def __repr__(self) -> str:
        return f"TieredStore({self.tiers!r})"


#: memory-tier hits buffered before they are handed to telemetry
_BUFFER = 1024
#: missed keys remembered (so a re-check does not count twice) before starting over
_MISSED_MAX = 4096

#: the revoked key ids already warned about in this process
_warned_revoked: set[str] = set()


def _revoked_keys() -> dict[str, str]:
    """kid -> name of every key ``CUFORGE_TRUSTED_KEYS`` revokes ({} when it is unset)."""
    from cuforge.base.config import settings

    path = settings().trusted_keys
    if not path:
        return {}
    from cuforge.base.signing import configured_keyring

    return {k.kid: k.name for k in configured_keyring(path).keys if k.revoked}
