"""Progress for people at a terminal, silence for logs and CI.

:func:`enabled` says whether to show progress: ``CUFORGE_PROGRESS=1/0`` forces it on or off;
otherwise it is on only when stderr is a terminal and ``CI`` is not set.
:func:`spinner_after` shows a spinner for work that turns out to be slow (a compile that
takes over a second), and nothing at all for work that is fast: the spinner (and ``rich``,
which costs tens of milliseconds to import) only start once the delay has passed.

The bottom layer: imports config; rich only when a spinner is really shown.
"""

from __future__ import annotations

import sys
import threading
from contextlib import contextmanager

from cuforge.base.config import settings

__all__ = ["enabled", "spinner_after"]

#: seconds of work before a spinner appears
DELAY = 1.0


def enabled(stream=None) -> bool:
    """Whether progress output on ``stream`` (default: stderr) is wanted now (see the
    module docstring). Raises :class:`~cuforge.base.errors.ConfigError` for a
    ``CUFORGE_PROGRESS`` that is not a switch."""
    forced = settings().progress
    if forced is not None:
        return forced
    try:
        return (sys.stderr if stream is None else stream).isatty()
    except (AttributeError, ValueError):  # closed or replaced stderr
        return False


@contextmanager
def spinner_after(text: str, delay: float | None = None):
    """Show ``text`` with a spinner on stderr if the block runs longer than ``delay``
    seconds (default :data:`DELAY`; and progress is :func:`enabled`); remove it when the
    block ends."""
    if not enabled():
        yield
        return
    lock = threading.Lock()
    state: dict = {"done": False, "status": None}

    def start() -> None:
        from rich.console import Console

        with lock:
            if state["done"]:
                return
            status = Console(stderr=True).status(text)
            status.start()
            state["status"] = status

    timer = threading.Timer(DELAY if delay is None else delay, start)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        with lock:
            state["done"] = True
            status = state["status"]
        if status is not None:
            status.stop()
