"""Single flight: at most one compile of a key at a time, across threads and processes.

    with single_flight(lock_dir(), key, timeout) as acquired:
        entry = store.get(key)          # re-check: the holder before us may have built it
        if entry is None:
            entry = build(); store.put(entry)

Threads of this process wait on a per-key lock; processes on this machine wait on an OS
file lock (``filelock.FileLock`` on ``<lock_dir>/<key[:2]>/<key>.lock``, a ``flock``).
The kernel drops a file lock when its holder dies, even by SIGKILL, so a crashed
compile never blocks anyone. A waiter gives up after ``timeout`` seconds and gets
``False``: it should then compile for itself (and may still put the result).

``lock_dir`` None, or a directory that cannot be created or locked in, gives a
thread-only lock plus ONE warning per directory.
"""

from __future__ import annotations

import os
from _thread import allocate_lock
from contextlib import contextmanager
from time import monotonic

TYPE_CHECKING = False  # not `typing.TYPE_CHECKING`: importing typing costs ~10 ms
if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Iterator


__all__ = ["single_flight"]

#: how often a waiter re-tries the file lock (seconds)
POLL_INTERVAL = 0.01

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
    import logging

    logging.getLogger("cuforge").warning(
        "cuforge: cannot use compile locks in %s (%s); concurrent processes may compile the "
        "same kernel at once (threads of one process are still serialised). Fix: make that "
        "directory writable or set CUFORGE_CACHE_DIR to a writable directory.",
        lock_dir,
        exc,
    )


@contextmanager
def single_flight(lock_dir: str | None, key: str, timeout: float) -> Iterator[bool]:
    """Hold the compile lock of ``key`` for the body. Yields True when acquired, False
    when ``timeout`` seconds passed first (the body then runs without the lock)."""
    deadline = monotonic() + max(0.0, timeout)
    slot = _thread_lock(key)
    tlock = slot[0]
    try:
        got_thread = tlock.acquire(True, max(0.0, timeout)) if timeout > 0 else tlock.acquire(False)
        if not got_thread:
            yield False
            return
        try:
            file_lock = None
            acquired = True
            if lock_dir is not None:
                file_lock, acquired = _acquire_file(lock_dir, key, deadline)
            try:
                yield acquired
            finally:
                if file_lock is not None:
                    try:
                        file_lock.release()
                    except OSError:
                        pass
        finally:
            tlock.release()
    finally:
        _release_thread_lock(key, slot)


def _acquire_file(lock_dir: str, key: str, deadline: float):
    """(held FileLock or None, acquired?) -- None with True when locking is impossible."""
    from filelock import FileLock, Timeout

    shard = os.path.join(lock_dir, key[:2])
    path = os.path.join(shard, f"{key}.lock")
    lock = FileLock(path, thread_local=False)
    for attempt in (0, 1):
        try:
            lock.acquire(timeout=max(0.0, deadline - monotonic()), poll_interval=POLL_INTERVAL)
            return lock, True
        except Timeout:
            return None, False
        except FileNotFoundError as exc:
            if attempt:
                _warn(lock_dir, exc)
                return None, True
            try:
                os.makedirs(shard, mode=0o700, exist_ok=True)
            except OSError as mk_exc:
                _warn(lock_dir, mk_exc)
                return None, True
        except OSError as exc:
            _warn(lock_dir, exc)
            return None, True
    return None, True  # pragma: no cover


class _CallableModule(type(os)):  # type: ignore[misc]
    """Importing this submodule makes ``cuforge.store.single_flight`` (the package attribute)
    name the module, not the function. Making the module callable keeps
    ``from cuforge.store import single_flight; with single_flight(...)`` working either way."""

    def __call__(self, lock_dir: str | None, key: str, timeout: float):
        return single_flight(lock_dir, key, timeout)


import sys as _sys  # noqa: E402

_sys.modules[__name__].__class__ = _CallableModule
