"""The circuit breaker in front of each remote: a remote that keeps failing costs nothing.

* Closed (normal): every call goes through. :data:`FAILURES_TO_OPEN` consecutive failures
  open it, and so does one timeout: a remote that does not answer costs the caller its
  timeout once, not once per call.
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

import logging
from _thread import allocate_lock
from time import monotonic

__all__ = ["CircuitBreaker", "FAILURES_TO_OPEN", "BACKOFF_START", "BACKOFF_MAX"]

#: consecutive failures that open the breaker
FAILURES_TO_OPEN = 3
#: seconds the first opening lasts before a probe ...
BACKOFF_START = 5.0
#: ... doubling after each failed probe, up to this
BACKOFF_MAX = 300.0

# the remotes whose breaker has opened in this process (warned once each)
_warned: set[str] = set()


class CircuitBreaker:
    """The breaker of the remote named ``name`` (its redacted URL). Thread-safe."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.failures = 0  # consecutive
        self.opened = 0  # times it opened (this process)
        self.is_open = False
        self._retry_at = 0.0
        self._backoff = BACKOFF_START
        self._lock = allocate_lock()

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

    def success(self) -> None:
        """A call completed: close the breaker."""
        if self.failures or self.is_open:
            with self._lock:
                if self.is_open:
                    logging.getLogger("cuforge").info(
                        "cuforge: remote cache %s is answering again", self.name
                    )
                self.failures = 0
                self.is_open = False
                self._backoff = BACKOFF_START

    def failure(self, error: str, *, timed_out: bool = False) -> bool:
        """A call failed with ``error`` (``timed_out``: by a timeout, which opens the breaker
        at once); True when this failure opened the breaker."""
        with self._lock:
            self.failures += 1
            if self.is_open:  # the probe failed: wait longer
                self._backoff = min(self._backoff * 2, BACKOFF_MAX)
                self._retry_at = monotonic() + self._backoff
                return False
            if self.failures < FAILURES_TO_OPEN and not timed_out:
                return False
            self.is_open = True
            self.opened += 1
            self._backoff = BACKOFF_START
            self._retry_at = monotonic() + self._backoff
            first = self.name not in _warned
            _warned.add(self.name)

        log = logging.getLogger("cuforge")
        if first:
            log.warning(
                "cuforge: remote cache %s is failing (%d failure(s) in a row, last: %s); continuing "
                "without it (compiles and the local cache still work) and trying it again after a "
                "back-off. This warning is shown once per process.",
                self.name,
                self.failures,
                error,
            )
        else:
            log.debug("cuforge: remote cache %s is off again: %s", self.name, error)
        return True

    def state(self) -> str:
        return "open" if self.is_open else "closed"
