"""Fleet-wide single flight: N machines that miss one key build it once.

:func:`cuforge.store.single_flight.single_flight` serialises the builds of one key among
the threads and processes sharing a cache dir. Machines do not share a dir; they share a
remote. Under the local lock, :meth:`cuforge.Cache.build_once` asks the first remote tier
that supports build leases (``redis://``: ``SET NX PX`` with a random token that
renew and release check; ``file://``: an ``O_EXCL`` lease file with an expiry) for the lease of the key:

* taken: this process builds, renewing the lease every third of its TTL while it does,
  publishes the entry, then releases the lease;
* held by another machine: it polls the remote for the entry (re-running the lookup),
  backing off from 50 ms to 1 s, until the entry appears (a hit: nothing is built), the
  lease expires (a dead holder: this process takes it and builds) or ``timeout`` seconds
  pass, or one lease is held for :data:`WAIT_TTLS` lease TTLs, whichever is first (it
  builds anyway: a lease anyone can plant and keep renewing must not stall every miss
  for ``CUFORGE_LOCK_TIMEOUT``; a build longer than that is done again by its waiters,
  so raise ``CUFORGE_LEASE_TTL`` for builds of minutes). The backends count a lease's
  TTL for at most the reader's own ``ttl`` (a planted lease claiming a year, or set
  without expiry, holds one TTL), and a new holder restarts the count. After
  :data:`~cuforge.store.single_flight.NOTICE_AFTER` seconds it says once whom it waits
  for: ``cuforge: waiting for host X pid N to compile K, 3 s``;
* no lease to be had (HTTP and S3 remotes have none, the remote is down, its breaker is
  open, it is read-only): local single flight only. A dead remote costs its timeout once
  (then its circuit breaker skips it).

A lost lease (expired while its holder still built, e.g. a stopped process) costs at worst
a second build of the same key elsewhere; both are valid entries.
"""

from __future__ import annotations

import os
from time import monotonic, sleep

from cuforge.store.single_flight import NOTICE_AFTER, _say

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs ~10 ms
if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable

__all__ = ["FleetLease", "acquire", "holder_name", "FIRST_POLL", "LAST_POLL", "WAIT_TTLS"]

#: a waiter waits at most this many lease TTLs for another machine's build
WAIT_TTLS = 3

#: the first and the longest pause between two polls of a waiter (seconds)
FIRST_POLL = 0.05
LAST_POLL = 1.0


def holder_name() -> str:
    """``"host <name> pid <pid>"``: this process, as other machines are told."""
    try:
        host = os.uname().nodename or "?"
    except AttributeError:  # pragma: no cover - Windows
        host = os.environ.get("COMPUTERNAME", "?")
    return f"host {host} pid {os.getpid()}"


class FleetLease:
    """A build lease this process holds on a remote tier; renewed every third of ``ttl``
    by a daemon thread until :meth:`release`."""

    def __init__(self, tier, key: str, token: int, ttl: float) -> None:
        import threading

        self.tier = tier
        self.key = key
        self.token = token
        self.ttl = ttl
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._renew, name=f"cuforge-lease-{key[:12]}", daemon=True
        )
        self._thread.start()

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            if not self.tier.renew(self.key, self.token, self.ttl):
                return  # lost (expired, taken over) or unreachable: the build goes on

    def release(self) -> None:
        """Stop renewing and drop the lease (after the entry was published)."""
        self._stop.set()
        self.tier.release(self.key, self.token)


def acquire(
    tier,
    key: str,
    *,
    what: str,
    ttl: float,
    timeout: float,
    lookup: Callable[[], object | None],
) -> tuple[object | None, FleetLease | None]:
    """The fleet lease of ``key`` on ``tier`` (a remote tier whose ``leases`` is true), or
    the entry another machine built meanwhile: ``(hit, None)`` when ``lookup()`` found it;
    ``(None, lease)`` when this process took the lease and must build (then
    :meth:`FleetLease.release` it); ``(None, None)``: build without one (no lease to be
    had, or ``timeout`` seconds passed waiting, or :data:`WAIT_TTLS` times ``ttl`` on one
    holder's lease)."""
    holder = holder_name()
    start = monotonic()
    deadline = start + max(0.0, timeout)
    per_holder = WAIT_TTLS * max(0.0, ttl)
    current, since = None, start  # the holder waited on, and since when
    delay = FIRST_POLL
    waited = False
    noticed = False
    while True:
        state, value = tier.lease(key, ttl, holder)
        if state == "off":
            return None, None
        if state == "taken":
            if waited:  # the holder may have published and released just now
                hit = lookup()
                if hit is not None:
                    tier.release(key, value)
                    return hit, None
            return None, FleetLease(tier, key, value, ttl)
        who = value or "another host"
        now = monotonic()
        if who != current:  # a new lease (the last one expired or was released)
            current, since = who, now
        stop = min(deadline, since + per_holder)
        if now >= stop:
            if stop == deadline and timeout <= 0:
                return None, None
            why = (
                f"CUFORGE_LOCK_TIMEOUT={timeout:g}"
                if stop == deadline
                else f"{WAIT_TTLS} lease TTLs on one lease; raise CUFORGE_LEASE_TTL={ttl:g} "
                "for longer builds"
            )
            _say(
                f"cuforge: gave up after {now - start:.0f} s ({why}) waiting for {who} to "
                f"compile {what} (lease on {tier.url}); compiling here"
            )
            return None, None
        if not noticed and now - start >= NOTICE_AFTER:
            noticed = True
            _say(
                f"cuforge: waiting for {who} to compile {what}, {now - start:.0f} s "
                f"(lease on {tier.url})"
            )
        sleep(min(delay, stop - now))
        delay = min(delay * 1.5, LAST_POLL, max(FIRST_POLL, ttl / 4))
        waited = True
        hit = lookup()
        if hit is not None:
            return hit, None
