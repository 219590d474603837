"""The circuit breaker in front of each remote: a remote that keeps failing costs nothing.

* Closed (normal): every call goes through. :data:`FAILURES_TO_OPEN` consecutive failures
  open it, and so does one timeout: a remote that does not answer costs the caller its
  timeout once, not once per call.
* Slowness opens it too: when the median of the last :data:`SLOW_WINDOW` calls took more
  than :data:`SLOW_FRACTION` of the remote's timeout, the remote is as good as down (a
  remote that always answers just under its timeout would otherwise cost every lookup
  most of a timeout, forever). A probe that answers that slowly fails the probe.
* Open: :meth:`CircuitBreaker.allow` answers False (one clock read) until the back-off
  has passed: :data:`BACKOFF_START` seconds, doubling after each failed probe, at most
  :data:`BACKOFF_MAX`.
* Then one caller gets through (the probe; the others are still refused). Its success
  closes the breaker (and resets the back-off); its failure opens it again.

The first time a remote's breaker opens, ONE warning goes to the ``cuforge`` logger (per
process and remote), naming the redacted URL, the error and that cuforge goes on without
it; later openings are quiet (``logging.DEBUG``).

The constants are read at each use, so tests may shrink them.
"""

from __future__ import annotations

from _thread import allocate_lock
from time import monotonic

__all__ = [
    "CircuitBreaker",
    "FAILURES_TO_OPEN",
    "BACKOFF_START",
    "BACKOFF_MAX",
    "SLOW_WINDOW",
    "SLOW_FRACTION",
]

#: consecutive failures that open the breaker
FAILURES_TO_OPEN = 3
#: seconds the first opening lasts before a probe ...
BACKOFF_START = 5.0
#: ... doubling after each failed probe, up to this
BACKOFF_MAX = 300.0
#: the last this many calls' durations are kept; a full window whose median is ...
SLOW_WINDOW = 5
#: ... above this fraction of the timeout opens the breaker
SLOW_FRACTION = 0.5


class CircuitBreaker:
    """The breaker of the remote named ``name`` (its redacted URL). Thread-safe.
    ``timeout``: the remote's per-call timeout, for the slowness rule (None: no rule)."""

    def __init__(self, name: str, timeout: float | None = None) -> None:
        self.name = name
        self.timeout = timeout
        #: durations (seconds) of the last successful calls, newest last
        self.recent: list[float] = []
        self.failures = 0  # consecutive
        self.opened = 0  # times it opened (this process)
        self.is_open = False
        self._retry_at = 0.0
        self._backoff = BACKOFF_START
        self._lock = allocate_lock()
        self._warned = False  # the first opening is warned about, once per breaker

    def allow(self) -> bool:
        """Whether a call may go to the remote now (closed, or the one probe after the
        back-off)."""
        if not self.is_open:
            return True
        now = monotonic()
        with self._lock:
            if now < self._retry_at:
                return False
            # one probe: the others keep being refused until it reports
            self._retry_at = now + self._backoff
            return True

    def success(self, seconds: float = 0.0) -> None:
        """A call completed in ``seconds``: close the breaker, unless calls have become
        too slow (see the module doc), which opens it like a failure."""
        timeout = self.timeout
        if timeout:
            slow_after = timeout * SLOW_FRACTION
            with self._lock:
                recent = self.recent
                recent.append(seconds)
                if len(recent) > SLOW_WINDOW:
                    del recent[0]
                median = sorted(recent)[len(recent) // 2] if len(recent) >= SLOW_WINDOW else 0.0
                probing = self.is_open
            if (probing and seconds > slow_after) or median > slow_after:
                took = seconds if probing else median
                self.failure(
                    f"too slow: {'the probe' if probing else 'the median of the last calls'} "
                    f"took {took:.3g} s, over {SLOW_FRACTION:g} of the {timeout:g} s timeout "
                    "(CUFORGE_REMOTE_TIMEOUT)",
                    slow=True,
                )
                return
        if self.failures or self.is_open:
            with self._lock:
                if self.is_open:
                    import logging

                    logging.getLogger("cuforge").info(
                        "cuforge: remote cache %s is answering again", self.name
                    )
                self.failures = 0
                self.is_open = False
                self._backoff = BACKOFF_START

    def failure(self, error: str, *, timed_out: bool = False, slow: bool = False) -> bool:
        """A call failed with ``error`` (``timed_out``: by a timeout, ``slow``: calls became
        too slow; both open the breaker at once); True when this failure opened it."""
        with self._lock:
            self.failures += 1
            if self.is_open:  # the probe failed: wait longer
                self._backoff = min(self._backoff * 2, BACKOFF_MAX)
                self._retry_at = monotonic() + self._backoff
                return False
            if self.failures < FAILURES_TO_OPEN and not (timed_out or slow):
                return False
            self.recent.clear()  # a fresh window after the back-off
            self.is_open = True
            self.opened += 1
            self._backoff = BACKOFF_START
            self._retry_at = monotonic() + self._backoff
            first = not self._warned
            self._warned = True
        import logging

        log = logging.getLogger("cuforge")
        if first:
            log.warning(
                "cuforge: remote cache %s is failing (%d failure(s) in a row, last: %s); continuing "
                "without it (compiles and the local cache still work) and trying it again after a "
                "back-off. This warning is shown once per remote tier.",
                self.name,
                self.failures,
                error,
            )
        else:
            log.debug("cuforge: remote cache %s is off again: %s", self.name, error)
        return True

    def state(self) -> str:
        return "open" if self.is_open else "closed"
