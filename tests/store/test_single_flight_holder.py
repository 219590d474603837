"""single_flight names its holder: a waiter behind a stopped process says who it waits for."""

from __future__ import annotations

import os
import signal

from cuforge.store import single_flight as sf
from cuforge.store.single_flight import holder_of, lock_path, single_flight

from .helpers import child_env, key_of, spawn, wait_for

HOLDER = """
    import os, time
    from cuforge.store.single_flight import single_flight
    with single_flight({locks!r}, {key!r}, 60, what="saxpy.cu"):
        open({held!r}, "w").close()
        time.sleep(3600)
"""


def _start_holder(tmp_path, key: str):
    locks = str(tmp_path / "locks")
    held = str(tmp_path / "held")
    proc = spawn(HOLDER.format(locks=locks, key=key, held=held), child_env())
    wait_for(held)
    return proc, locks


def test_waiter_behind_stopped_holder_names_it_once_then_times_out(tmp_path, monkeypatch, capfd):
    key = key_of("stopped")
    holder, locks = _start_holder(tmp_path, key)
    try:
        os.kill(holder.pid, signal.SIGSTOP)
        monkeypatch.setattr(sf, "NOTICE_AFTER", 0.2)
        with single_flight(locks, key, 1.5, what="other.cu") as acquired:
            assert acquired is False
        err = capfd.readouterr().err
        waiting = [line for line in err.splitlines() if line.startswith("cuforge: waiting for")]
        assert waiting == [
            f"cuforge: waiting for pid {holder.pid} compiling saxpy.cu "
            f"(lock {lock_path(locks, key)})"
        ]
        gave_up = [line for line in err.splitlines() if "gave up" in line]
        assert len(gave_up) == 1 and f"pid {holder.pid} compiling saxpy.cu" in gave_up[0]
    finally:
        os.kill(holder.pid, signal.SIGCONT)
        holder.kill()
        holder.wait()
    # the holder is gone: the lock is free again and now records this process
    with single_flight(locks, key, 5, what="mine.cu") as acquired:
        assert acquired is True
        assert holder_of(lock_path(locks, key)) == f"pid {os.getpid()} compiling mine.cu"
    assert holder_of(lock_path(locks, key)) == "an unknown process"  # cleared on release


def test_short_wait_prints_nothing(tmp_path, capfd):
    key = key_of("quiet")
    with single_flight(str(tmp_path / "locks"), key, 5) as acquired:
        assert acquired is True
    assert capfd.readouterr().err == ""


def test_symlinked_lock_file_is_not_followed(tmp_path, caplog):
    locks = tmp_path / "locks"
    key = key_of("link")
    outside = tmp_path / "outside.txt"
    outside.write_text("precious\n")
    path = lock_path(str(locks), key)
    os.makedirs(os.path.dirname(path))
    os.symlink(outside, path)
    with single_flight(str(locks), key, 1.0, what="x.cu") as acquired:
        assert acquired is True  # thread-only lock, with a warning
    assert outside.read_text() == "precious\n"
    assert any("cannot use compile locks" in r.getMessage() for r in caplog.records)
