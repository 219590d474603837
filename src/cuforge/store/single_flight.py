"""Single flight: at most one compile of a key at a time, across threads and processes.

    with single_flight(lock_dir(), key, timeout, what="saxpy.cu") as acquired:
        entry = store.get(key)          # re-check: the holder before us may have built it
        if entry is None:
            entry = build(); store.put(entry)

Threads of this process wait on a per-key lock; processes on this machine wait on an OS
file lock (an ``flock`` on ``<lock_dir>/<key[:2]>/<key>.lock``, taken with
:class:`cuforge.base._fs.locked`: no symlink is followed, only a regular file is used).
The kernel drops a file lock when its holder dies, even by SIGKILL, so a crashed
compile never blocks anyone. A waiter gives up after ``timeout`` seconds and gets
``False``: it should then compile for itself (and may still put the result).

The holder writes ``"<pid> <what>"`` into the lock file. A process that has waited
:data:`NOTICE_AFTER` seconds prints ONE line to stderr naming that holder (a stopped or
very slow compile is then visible), and keeps waiting up to ``timeout``; giving up prints
one more line naming the holder.

``lock_dir`` None, or a directory that cannot be created or locked in, gives a
thread-only lock plus ONE warning per directory.

The function is this module's :func:`single_flight`; import it as
``from cuforge.store.single_flight import single_flight``.
"""

from __future__ import annotations

import logging
import os
import sys
from _thread import allocate_lock
from contextlib import contextmanager
from time import monotonic, sleep
from typing import TYPE_CHECKING

from cuforge.base import _fs

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Iterator


__all__ = ["single_flight", "holder_of", "NOTICE_AFTER", "POLL_INTERVAL"]

#: how often a waiter re-tries the file lock (seconds)
POLL_INTERVAL = 0.01
#: after this many seconds of waiting for another process, say once who holds the lock
NOTICE_AFTER = 3.0
#: the most bytes of holder description read back from a lock file
_MAX_HOLDER_BYTES = 4096

_registry_lock = allocate_lock()
# key -> [thread lock, number of users]; entries are dropped when nobody uses them
_thread_locks: dict[str, list] = {}
_warned: set[str] = set()


def _after_fork_in_child() -> None:
    # A lock another thread held at fork time would stay held forever in the child.
    global _registry_lock
    _registry_lock = allocate_lock()
    _thread_locks.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _thread_lock(key: str) -> list:
    with _registry_lock:
        slot = _thread_locks.get(key)
        if slot is None:
            slot = _thread_locks[key] = [allocate_lock(), 0]
        slot[1] += 1
        return slot


def _release_thread_lock(key: str, slot: list) -> None:
    with _registry_lock:
        slot[1] -= 1
        if slot[1] == 0 and _thread_locks.get(key) is slot:
            del _thread_locks[key]


def _warn(lock_dir: str, exc: BaseException) -> None:
    if lock_dir in _warned:
        return
    _warned.add(lock_dir)

    logging.getLogger("cuforge").warning(
        "cuforge: cannot use compile locks in %s (%s); concurrent processes may compile the "
        "same kernel at once (threads of one process are still serialised). Fix: make that "
        "directory writable or set CUFORGE_CACHE_DIR to a writable directory.",
        lock_dir,
        # a sentence, not Python's "[Errno 20] Not a directory: '...'"
        f"{exc.filename}: {exc.strerror}"
        if isinstance(exc, OSError) and exc.strerror and exc.filename
        else (exc.strerror if isinstance(exc, OSError) and exc.strerror else exc),
    )


def _say(line: str) -> None:
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        pass  # no usable stderr (closed, or None under pythonw): the wait goes on silently


@contextmanager
def single_flight(
    lock_dir: str | None, key: str, timeout: float, what: str | None = None
) -> Iterator[bool]:
    """Hold the compile lock of ``key`` for the body. Yields True when acquired, False
    when ``timeout`` seconds passed first (the body then runs without the lock).

    ``what`` (e.g. the kernel's name) is recorded in the lock file with this process's pid,
    so that a process waiting behind this one can say what it waits for."""
    deadline = monotonic() + max(0.0, timeout)
    slot = _thread_lock(key)
    tlock = slot[0]
    try:
        got_thread = tlock.acquire(True, max(0.0, timeout)) if timeout > 0 else tlock.acquire(False)
        if not got_thread:
            yield False
            return
        try:
            held = None
            acquired = True
            if lock_dir is not None:
                held, acquired = _acquire_file(lock_dir, key, deadline, timeout, what)
            try:
                yield acquired
            finally:
                if held is not None:
                    _release_file(held)
        finally:
            tlock.release()
    finally:
        _release_thread_lock(key, slot)


def lock_path(lock_dir: str, key: str) -> str:
    """Where the file lock of ``key`` lives."""
    return os.path.join(lock_dir, key[:2], f"{key}.lock")


def holder_of(path: str) -> str:
    """Who holds the lock file ``path``, as its holder recorded it: ``"pid N compiling X"``
    (or ``"pid N"``), or ``"an unknown process"`` when nothing readable is recorded."""
    try:
        raw = _fs.read_bytes(path, max_bytes=_MAX_HOLDER_BYTES)
    except OSError:
        raw = b""
    text = raw.decode("utf-8", "replace").strip()
    pid, _, what = text.partition(" ")
    if not pid.isdigit():
        return "an unknown process"
    what = " ".join(what.split())  # one line, whatever was recorded
    return f"pid {pid} compiling {what}" if what else f"pid {pid}"


def _acquire_file(lock_dir: str, key: str, deadline: float, timeout: float, what: str | None):
    """(held lock or None, acquired?) -- None with True when locking is impossible."""
    path = lock_path(lock_dir, key)
    held = _fs.locked(path, blocking=False)
    try:
        got = held.__enter__()
    except OSError as exc:
        _warn(lock_dir, exc)
        return None, True
    try:
        started = monotonic()
        noticed = False
        while not got:
            now = monotonic()
            if now >= deadline:
                if timeout > 0:  # with 0 the caller chose not to wait: nothing to report
                    _say(
                        f"cuforge: gave up after {timeout:g} s waiting for {holder_of(path)} "
                        f"(lock {path}); compiling without the lock"
                    )
                held.__exit__(None, None, None)
                return None, False
            if not noticed and now - started >= NOTICE_AFTER:
                noticed = True
                _say(f"cuforge: waiting for {holder_of(path)} (lock {path})")
            sleep(min(POLL_INTERVAL, max(0.0, deadline - now)))
            got = held.relock(shared=False, blocking=False)
    except OSError as exc:
        held.__exit__(None, None, None)
        _warn(lock_dir, exc)
        return None, True
    except BaseException:
        held.__exit__(None, None, None)
        raise
    _record_holder(held.fd, what)
    return held, True


def _record_holder(fd: int, what: str | None) -> None:
    """Write ``"<pid> <what>"`` into the held lock file (best effort: it only feeds the
    waiting notice)."""
    text = str(os.getpid())
    if what:
        text += " " + " ".join(str(what).split())
    data = (text + "\n").encode("utf-8", "replace")[:_MAX_HOLDER_BYTES]
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
    except OSError:
        pass  # a full disk: the lock itself still works, the notice says "unknown process"


def _release_file(held: _fs.locked) -> None:
    try:
        if held.fd >= 0:
            os.ftruncate(held.fd, 0)  # no stale holder shows while the file is unlocked
    except OSError:
        pass  # the lock is dropped below all the same
    held.__exit__(None, None, None)
