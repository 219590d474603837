"""Fleet-wide single flight: machines (processes with distinct local cache dirs) that miss
one key together build it once, through a build lease on the shared remote."""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time

import pytest

from cuforge.store.remote.envelope import namespace
from cuforge.store.remote.file import FileBackend

from .helpers import child_env, finish, key_of, spawn

KERNEL = r"""
extern "C" __global__ void fleet_scale(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= 3.0f;
}
"""

#: a "machine": waits for the go file, then compiles; the compile itself is slowed by
#: ``stall`` seconds (a real compile of a big kernel), and marks its start in ``marks``
CHILD = """
import json, os, sys, time
import cuforge
from cuforge.core import pipeline

real = pipeline.CompileRequest.compile

def slow(self):
    open(os.path.join({marks!r}, str(os.getpid())), "w").close()
    time.sleep({stall!r})
    return real(self)

pipeline.CompileRequest.compile = slow
while not os.path.exists({go!r}):
    time.sleep(0.01)
started = time.monotonic()
p = cuforge.compile_file({src!r})
print(json.dumps({{
    "compiles": cuforge.default_cache().counters["compiles"],
    "source": p.source_of_result,
    "seconds": time.monotonic() - started,
}}))
"""

_numbers = itertools.count()


def _machines(tmp_path, remote: str, n: int, *, stall: float, ttl: float = 2, timeout=60):
    """Start ``n`` machines (distinct cache dirs, one remote); returns (procs, go, marks)."""
    src = tmp_path / "fleet.cu"
    if not src.exists():
        src.write_text(KERNEL)
    marks = tmp_path / "marks"
    marks.mkdir(exist_ok=True)
    go = tmp_path / "go"
    code = CHILD.format(marks=str(marks), stall=stall, go=str(go), src=str(src))
    procs = []
    for _ in range(n):
        env = child_env(
            CUFORGE_CACHE_DIR=str(tmp_path / f"machine{next(_numbers)}"),
            CUFORGE_REMOTE=remote,
            CUFORGE_ARCH="sm_90",
            CUFORGE_LEASE_TTL=str(ttl),
            CUFORGE_LOCK_TIMEOUT=str(timeout),
            CUFORGE_REMOTE_TIMEOUT="2",
        )
        procs.append(spawn(code, env))
    return procs, go, marks


def _one_compile_among_16(tmp_path, remote: str) -> None:
    procs, go, _ = _machines(tmp_path, remote, 16, stall=1.0)
    go.touch()
    results = [finish(p, timeout=240, stderr_key="stderr") for p in procs]
    assert sum(r["compiles"] for r in results) == 1, [r["stderr"][-500:] for r in results]
    sources = sorted(r["source"] for r in results)
    assert sources.count("compiled") == 1
    assert set(sources) <= {"compiled", "remote"}


def test_sixteen_machines_one_redis_one_compile(tmp_path, redis_server):
    _one_compile_among_16(tmp_path, redis_server.url)
    # the lease was released after the entry was published
    client = redis_server.client()
    assert list(client.scan_iter(match="cuforge:*lease:*")) == []


def test_sixteen_machines_one_shared_dir_one_compile(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    _one_compile_among_16(tmp_path, f"file://{shared}")
    leases = shared / namespace() / ".leases"
    assert [f for _, _, files in os.walk(leases) for f in files] == []


@pytest.mark.parametrize("remote", ["redis", "file"])
def test_killed_holder_its_lease_expires_and_one_other_compiles(tmp_path, remote, request):
    if remote == "redis":
        url = request.getfixturevalue("redis_server").url
    else:
        shared = tmp_path / "shared"
        shared.mkdir(mode=0o755)
        url = f"file://{shared}"
    ttl, timeout = 2.0, 60.0
    # the holder: its compile stalls until it is killed
    (holder,), go, marks = _machines(tmp_path, url, 1, stall=120, ttl=ttl, timeout=timeout)
    go.touch()
    deadline = time.monotonic() + 60
    while not os.listdir(marks):
        assert holder.poll() is None, holder.communicate()
        assert time.monotonic() < deadline, "the holder never started compiling"
        time.sleep(0.02)
    # three more machines miss the same key while the holder compiles: they wait on its lease
    others, _, _ = _machines(tmp_path, url, 3, stall=0.5, ttl=ttl, timeout=timeout)
    time.sleep(ttl)  # they are waiting now (the holder renews its lease meanwhile)
    assert os.listdir(marks) == [str(holder.pid)], "a waiter compiled while the holder lived"
    killed = time.monotonic()
    os.kill(holder.pid, signal.SIGKILL)
    holder.communicate()
    results = [finish(p, timeout=120, stderr_key="stderr") for p in others]
    took = time.monotonic() - killed
    assert sum(r["compiles"] for r in results) == 1, [r["stderr"][-800:] for r in results]
    assert took < ttl + timeout
    # a waiter past NOTICE_AFTER said whom it waits for
    assert any("waiting for host " in r["stderr"] for r in results), results[0]["stderr"]


def test_dead_remote_each_compiles_locally_after_at_most_the_timeout(tmp_path, redis_server):
    url = redis_server.url
    redis_server.kill()
    procs, go, _ = _machines(tmp_path, url, 3, stall=0.2, timeout=60)
    go.touch()
    results = [finish(p, timeout=120, stderr_key="stderr") for p in procs]
    assert [r["compiles"] for r in results] == [1, 1, 1]
    # a dead remote costs at most its timeouts once per process (connect refused: at once)
    assert all(r["seconds"] < 2 + 2 + 30 for r in results), results


def test_file_lease_take_over_and_release(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    b = FileBackend(f"file://{shared}", namespace=namespace(), connect_timeout=0.1, timeout=1)
    key = key_of("lease")
    token, who = b.lease("build", key, 60, "host a pid 1")
    assert token and who == "host a pid 1"
    assert b.lease("build", key, 60, "host b pid 2") == (None, "host a pid 1")
    assert b.renew("build", key, token, 60)
    b.release("build", key, token + 1)  # not the holder's token: nothing happens
    assert b.lease("build", key, 60, "host b pid 2")[0] is None
    # an expired lease is taken over; the old holder can neither renew nor release it
    path = b.lease_path("build", key)
    os.utime(path, (time.time() - 120, time.time() - 120))
    token2, _ = b.lease("build", key, 60, "host b pid 2")
    assert token2 and token2 != token
    assert not b.renew("build", key, token, 60)
    b.release("build", key, token)
    assert os.path.exists(path)
    b.release("build", key, token2)
    assert not os.path.exists(path)


# -- issue 35 item 6: a planted lease stalls nobody for long ---------------------------------


def _file_tier(tmp_path):
    from cuforge.store.remote.tier import RemoteStore

    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755, exist_ok=True)
    b = FileBackend(f"file://{shared}", namespace=namespace(), connect_timeout=0.1, timeout=1)
    return RemoteStore(b)


def _plant_file_lease(tier, key: str, ttl_ms: int, mtime: float | None = None) -> str:
    path = tier.backend.lease_path("build", key)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(f"4242 {ttl_ms} host planted pid 1\n")
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def _acquire(tier, key: str, ttl: float, timeout: float = 20.0):
    from cuforge.store import lease

    started = time.monotonic()
    hit, held = lease.acquire(tier, key, what="k.cu", ttl=ttl, timeout=timeout, lookup=lambda: None)
    assert hit is None
    return held, time.monotonic() - started


@pytest.mark.parametrize("planted", ["claims a year", "mtime in the future"])
def test_a_planted_file_lease_holds_one_ttl_of_the_reader_at_most(tmp_path, planted):
    """The reader trusted the lease's own TTL and the file's mtime: a lease claiming a year
    (or touched in the future) stalled every miss for CUFORGE_LOCK_TIMEOUT."""
    tier = _file_tier(tmp_path)
    key = key_of("planted")
    if planted == "claims a year":
        _plant_file_lease(tier, key, 365 * 86400 * 1000)
    else:
        _plant_file_lease(tier, key, 500, mtime=time.time() + 10**6)
    held, took = _acquire(tier, key, ttl=0.5)
    assert held is not None, "the planted lease was never taken over"
    assert took < 3.0, took
    held.release()


def test_a_file_lease_kept_alive_by_its_planter_is_waited_on_three_ttls(tmp_path, capfd):
    tier = _file_tier(tmp_path)
    key = key_of("renewed")
    path = _plant_file_lease(tier, key, 500)
    stop = threading.Event()

    def keep_touching():
        while not stop.wait(0.05):
            os.utime(path)

    toucher = threading.Thread(target=keep_touching, daemon=True)
    toucher.start()
    try:
        held, took = _acquire(tier, key, ttl=0.5)
    finally:
        stop.set()
        toucher.join()
    assert held is None and 1.4 < took < 4.0, took  # 3 TTLs of 0.5 s, not 20 s
    err = capfd.readouterr().err
    assert "3 lease TTLs on one lease" in err and "CUFORGE_LEASE_TTL=0.5" in err, err


def _redis_tier(url: str):
    from cuforge.store.remote.redis import RedisBackend
    from cuforge.store.remote.tier import RemoteStore

    return RemoteStore(RedisBackend(url, namespace=namespace(), connect_timeout=0.5, timeout=2))


def test_a_redis_lease_set_without_expiry_holds_one_ttl(redis_server):
    tier = _redis_tier(redis_server.url)
    key = key_of("no-expiry")
    client = redis_server.client()
    name = f"cuforge:{namespace()}:lease:build:{key}"
    client.set(name, "4242 host planted pid 1")  # no PX: it would live forever
    held, took = _acquire(tier, key, ttl=0.5)
    assert held is not None and took < 3.0, took
    held.release()
    # one re-set without expiry over and over: waited on for 3 TTLs, then built here
    stop = threading.Event()

    def keep_setting():
        while not stop.wait(0.05):
            client.set(name, "4242 host planted pid 1")

    setter = threading.Thread(target=keep_setting, daemon=True)
    setter.start()
    try:
        time.sleep(0.1)
        held, took = _acquire(tier, key, ttl=0.5)
    finally:
        stop.set()
        setter.join()
    assert held is None and 1.4 < took < 4.0, took
