"""single_flight: one compile per key across threads and processes; SIGKILL never blocks."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

from cuforge.store.single_flight import single_flight

from .helpers import child_env, finish, key_of, spawn, wait_for

# A worker: wait for the start signal, take the key's lock, re-check the store, and only
# when the entry is still missing do the "work" (append to a counter file, then put).
WORKER = """
    import json, os, sys, time
    from cuforge.store.disk import DiskStore
    from cuforge.store.base import Entry
    from cuforge.store.single_flight import single_flight
    root, locks, key, counter, go = {root!r}, {locks!r}, {key!r}, {counter!r}, {go!r}
    store = DiskStore(root, 1 << 30)
    while not os.path.exists(go):
        time.sleep(0.001)
    started = time.monotonic()
    with single_flight(locks, key, {timeout}) as acquired:
        entry = store.get(key)
        worked = False
        if entry is None:
            with open(counter, "a") as f:
                f.write(str(os.getpid()) + "\\n")
            if os.environ.get("HOLD"):
                open(os.environ["HOLD"], "w").close()
                time.sleep(float(os.environ.get("HOLD_SECONDS", "3600")))
            time.sleep(0.2)  # the compile
            store.put(Entry(key, "kernel", b"the one binary " * 100, {{"name": "k.cu"}}))
            worked = True
            entry = store.get(key)
    print(json.dumps({{"acquired": acquired, "worked": worked, "payload": entry.payload.hex(),
                      "waited": time.monotonic() - started}}))
"""


def _worker(tmp_path, timeout: float = 60.0) -> tuple[str, str]:
    counter = str(tmp_path / "counter")
    go = str(tmp_path / "go")
    code = WORKER.format(
        root=str(tmp_path / "cache"),
        locks=str(tmp_path / "cache" / "locks"),
        key=key_of("race"),
        counter=counter,
        go=go,
        timeout=timeout,
    )
    return code, counter


def test_eight_processes_race_one_does_the_work(tmp_path):
    code, counter = _worker(tmp_path)
    procs = [spawn(code) for _ in range(8)]
    time.sleep(0.5)  # let them all start and spin on the start signal
    open(tmp_path / "go", "w").close()
    results = [finish(p) for p in procs]
    assert all(r["acquired"] for r in results)
    assert sum(r["worked"] for r in results) == 1
    assert len(open(counter).read().split()) == 1
    assert len({r["payload"] for r in results}) == 1


def test_sigkilled_holder_never_blocks_the_others(tmp_path):
    code, counter = _worker(tmp_path)
    held = str(tmp_path / "held")
    holder = spawn(code, child_env(HOLD=held))
    open(tmp_path / "go", "w").close()
    wait_for(held)  # the holder has the lock and "compiles" forever
    waiters = [spawn(code) for _ in range(3)]
    time.sleep(1.0)
    assert all(w.poll() is None for w in waiters)  # they wait for the holder
    t0 = time.monotonic()
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    results = [finish(w, timeout=60) for w in waiters]
    assert time.monotonic() - t0 < 30  # freed by the kernel, not by the 60 s timeout
    assert all(r["acquired"] for r in results)
    assert sum(r["worked"] for r in results) == 1  # one redoes the work, the rest hit
    assert len(open(counter).read().split()) == 2  # the killed holder's try + that one
    assert len({r["payload"] for r in results}) == 1


def test_timeout_yields_false(tmp_path):
    code, _counter = _worker(tmp_path)
    held = str(tmp_path / "held")
    holder = spawn(code, child_env(HOLD=held))
    open(tmp_path / "go", "w").close()
    try:
        wait_for(held)
        t0 = time.monotonic()
        with single_flight(str(tmp_path / "cache" / "locks"), key_of("race"), 0.5) as acquired:
            waited = time.monotonic() - t0
        assert acquired is False
        assert 0.4 < waited < 5
        # another key is not blocked
        with single_flight(str(tmp_path / "cache" / "locks"), key_of("other"), 0.5) as acquired:
            assert acquired is True
    finally:
        holder.kill()
        holder.wait()


def test_threads_of_one_process_are_serialised(tmp_path):
    locks = str(tmp_path / "locks")
    key = key_of("threads")
    inside = 0
    max_inside = 0
    done: list[bool] = []
    guard = threading.Lock()

    def work() -> None:
        nonlocal inside, max_inside
        with single_flight(locks, key, 30) as acquired:
            with guard:
                inside += 1
                max_inside = max(max_inside, inside)
            time.sleep(0.02)
            with guard:
                inside -= 1
            done.append(acquired)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert max_inside == 1 and done == [True] * 8


def test_thread_timeout_yields_false():
    key = key_of("thread-timeout")
    held = threading.Event()
    release = threading.Event()

    def holder() -> None:
        with single_flight(None, key, 5):
            held.set()
            release.wait(10)

    t = threading.Thread(target=holder)
    t.start()
    held.wait(5)
    try:
        with single_flight(None, key, 0.2) as acquired:
            assert acquired is False
    finally:
        release.set()
        t.join()
    with single_flight(None, key, 0.2) as acquired:
        assert acquired is True


def test_unusable_lock_dir_is_thread_only_with_one_warning(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for bad in (str(blocker / "locks"), f"/proc/cuforge-locks-{os.getpid()}-{tmp_path.name}"):
        with caplog.at_level(logging.WARNING, logger="cuforge"):
            for i in range(3):
                with single_flight(bad, key_of(i), 1.0) as acquired:
                    assert acquired is True
        warned = [r for r in caplog.records if bad in r.getMessage()]
        assert len(warned) == 1, [r.getMessage() for r in caplog.records]
        caplog.clear()


def test_no_lock_dir_is_thread_only():
    with single_flight(None, key_of(1), 1.0) as acquired:
        assert acquired is True


def test_exception_in_body_releases(tmp_path):
    locks = str(tmp_path / "locks")
    try:
        with single_flight(locks, key_of(1), 1.0):
            raise RuntimeError("compile failed")
    except RuntimeError:
        pass
    with single_flight(locks, key_of(1), 0.1) as acquired:
        assert acquired is True
