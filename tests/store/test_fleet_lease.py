"""Fleet-wide single flight: machines (processes with distinct local cache dirs) that miss
one key together build it once, through a build lease on the shared remote."""

from __future__ import annotations

import itertools
import os
import signal
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
