"""Remote chaos through the whole compile path: ``cuforge.compile(..., arch="sm_90")`` in
fresh processes with ``CUFORGE_REMOTE`` pointing at a real redis-server or nginx (or at a
socket that never answers), while the remote is killed, hangs, answers garbage, is full, or
holds entries a signed reader must refuse. The promise checked every time: *each compile
returns the right bytes*, and the remote costs at most its timeout a few times before the
circuit breaker keeps it out. Plus "two machines, one cache": a second machine (its own
cache dir and working directory) compiles nothing the first one compiled.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import child_env

pytestmark = pytest.mark.chaos

KERNELS = 6
#: a generous sanity bound for a whole child run (speed is measured in bench/, not asserted)
CHILD_TIMEOUT = 240


def _wired() -> str | None:
    try:
        from cuforge.store.remote import open_remotes  # noqa: F401
    except ImportError as exc:
        return f"CUFORGE_REMOTE is not wired into default_store yet ({exc})"
    return None


if _wired():  # pragma: no cover - only while the remote tier is being written
    pytest.skip(_wired(), allow_module_level=True)


def kernel_source(i: int) -> str:
    return f'extern "C" __global__ void r{i}(int* out) {{ *out = {i * 104729}; }}\n'


@pytest.fixture(scope="module")
def reference() -> dict[str, str]:
    """sha256 of each kernel's cubin, compiled with the cache off."""
    import cuforge

    os.environ["CUFORGE_DISABLE_CACHE"] = "1"
    try:
        return {
            f"r{i}.cu": hashlib.sha256(
                cuforge.compile(kernel_source(i), name=f"r{i}.cu", arch="sm_90").binary
            ).hexdigest()
            for i in range(KERNELS)
        }
    finally:
        del os.environ["CUFORGE_DISABLE_CACHE"]


#: Compiles every kernel once, printing "DONE name" after each (so the parent can strike
#: mid-run), then one JSON line: per-kernel [name, right bytes?, source_of_result], the
#: compile counter, and each remote tier's stats.
WORKER = r"""
import hashlib, json, os, time
import cuforge
from cuforge.core import pipeline
from cuforge import default_cache

expected = json.loads(os.environ["CHAOS_EXPECTED"])
pause = float(os.environ.get("CHAOS_PAUSE", "0"))
results = []
for name in sorted(expected):
    i = int(name[1:-3])
    src = 'extern "C" __global__ void r%d(int* out) { *out = %d; }\n' % (i, i * 104729)
    prog = cuforge.compile(src, name=name, arch="sm_90")
    ok = hashlib.sha256(prog.binary).hexdigest() == expected[name]
    results.append([name, ok, prog.source_of_result])
    print("DONE " + name, flush=True)
    time.sleep(pause)
store = default_cache().store
remotes = []
for tier in getattr(store, "tiers", [store]):
    if tier.tier == "remote":
        s = tier.stats()
        remotes.append(dict(hits=s.hits, misses=s.misses, puts=s.puts, errors=s.errors,
                            rejected=s.rejected, breaker=s.extra.get("breaker"),
                            skipped=s.extra.get("skipped", 0)))
print(json.dumps({"results": results, "compiles": pipeline.counters["compiles"],
                  "remote": remotes}), flush=True)
"""


class Machine:
    """One "machine": its own cache dir and working directory, the remote settings given."""

    def __init__(self, tmp_path, name: str, reference: dict[str, str], **env: str) -> None:
        self.dir = tmp_path / name
        (self.dir / "checkout").mkdir(parents=True, exist_ok=True)
        self.env = child_env(
            CUFORGE_CACHE_DIR=str(self.dir / "cache"),
            CHAOS_EXPECTED=json.dumps(reference),
            **env,
        )
        for var in ("CUFORGE_REMOTE_KEY", "CUFORGE_REMOTE_KEY_FILE", "CUFORGE_REMOTE_READONLY"):
            if var not in env:
                self.env.pop(var, None)

    def start(self, **env: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(WORKER)],
            env={**self.env, **env},
            cwd=self.dir / "checkout",
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    @staticmethod
    def finish(proc: subprocess.Popen) -> dict:
        out, err = proc.communicate(timeout=CHILD_TIMEOUT)
        if proc.returncode != 0:
            raise AssertionError(f"child failed ({proc.returncode}):\n{out}\n{err}")
        report = json.loads(out.strip().splitlines()[-1])
        report["stderr"] = err
        return report

    def run(self, **env: str) -> dict:
        return self.finish(self.start(**env))


def assert_all_right(report: dict) -> None:
    wrong = [name for name, ok, _ in report["results"] if not ok]
    assert not wrong, f"wrong bytes for {wrong}"
    assert len(report["results"]) == KERNELS


def sources(report: dict) -> set[str]:
    return {source for _, _, source in report["results"]}


def fast_fail_env(url: str) -> dict[str, str]:
    return {
        "CUFORGE_REMOTE": url,
        "CUFORGE_REMOTE_CONNECT_TIMEOUT": "0.2",
        "CUFORGE_REMOTE_TIMEOUT": "0.2",
    }


# -- two machines, one cache ------------------------------------------------------------------


@pytest.mark.parametrize("server", ["redis_server", "nginx_server"])
def test_two_machines_one_remote(server, request, tmp_path, reference):
    remote = request.getfixturevalue(server)
    a = Machine(tmp_path, "a", reference, CUFORGE_REMOTE=remote.url).run()
    assert_all_right(a)
    assert a["compiles"] == KERNELS
    assert a["remote"][0]["puts"] >= KERNELS and a["remote"][0]["errors"] == 0

    b = Machine(tmp_path, "b", reference, CUFORGE_REMOTE=remote.url).run()
    assert_all_right(b)
    assert b["compiles"] == 0
    assert sources(b) == {"remote"}
    assert b["remote"][0]["hits"] >= KERNELS

    # read-through: B's local cache now holds them; without the remote it still compiles
    # nothing
    local = Machine(tmp_path, "b", reference, CUFORGE_REMOTE="").run()
    assert local["compiles"] == 0 and sources(local) == {"disk"}


# -- chaos ------------------------------------------------------------------------------------


def test_redis_killed_mid_run(redis_server, tmp_path, reference):
    machine = Machine(tmp_path, "a", reference, **fast_fail_env(redis_server.url))
    proc = machine.start(CHAOS_PAUSE="0.05")
    done = 0
    for line in proc.stdout:
        if line.startswith("DONE "):
            done += 1
            if done == 2:
                redis_server.kill()
                break
    report = machine.finish(proc)
    assert not redis_server.alive
    assert_all_right(report)
    assert report["compiles"] == KERNELS
    remote = report["remote"][0]
    assert remote["puts"] >= 2  # it was working before the kill
    assert remote["errors"] >= 1  # and noticed


@pytest.mark.parametrize("scheme", ["redis", "http"])
def test_server_that_never_answers(scheme, black_hole, tmp_path, reference):
    report = Machine(tmp_path, "a", reference, **fast_fail_env(black_hole.url(scheme))).run()
    assert_all_right(report)
    assert report["compiles"] == KERNELS
    remote = report["remote"][0]
    # the first timeout opened the breaker: the remote cost its timeout once, and was kept
    # out after that (+ at most two probes, 5 s and 15 s after it opened, on a slow machine)
    assert 1 <= remote["errors"] <= 3
    assert remote["skipped"] >= KERNELS - 3
    assert remote["breaker"] == "open"
    assert black_hole.accepted >= 1
    # one warning, then quiet
    assert report["stderr"].count(f"127.0.0.1:{black_hole.port}") <= 2, report["stderr"]


def _fill_redis_with_garbage(redis_server) -> int:
    raw = redis_server.client()
    keys = list(raw.scan_iter(match="cuforge:*"))
    for n, key in enumerate(keys):
        garbage = [b"", b"\x00garbage", os.urandom(4096), raw.get(key)[:-7] or b"?"][n % 4]
        raw.set(key, garbage)
    return len(keys)


def _fill_nginx_with_garbage(nginx_server) -> int:
    n = 0
    for dirpath, _, files in os.walk(nginx_server.root):
        for name in files:
            path = os.path.join(dirpath, name)
            with open(path, "r+b") as f:
                data = f.read()
                f.seek(0)
                f.truncate()
                f.write([b"", b"{not json", os.urandom(512), data[: len(data) // 2]][n % 4])
            n += 1
    return n


@pytest.mark.parametrize("server", ["redis_server", "nginx_server"])
def test_garbage_values(server, request, tmp_path, reference):
    remote = request.getfixturevalue(server)
    first = Machine(tmp_path, "a", reference, CUFORGE_REMOTE=remote.url).run()
    assert first["remote"][0]["puts"] >= KERNELS
    fill = _fill_redis_with_garbage if server == "redis_server" else _fill_nginx_with_garbage
    assert fill(remote) >= KERNELS

    b = Machine(tmp_path, "b", reference, CUFORGE_REMOTE=remote.url).run()
    assert_all_right(b)
    assert b["compiles"] == KERNELS  # every garbage value was refused: compiled instead
    assert "remote" not in sources(b)
    assert b["remote"][0]["errors"] >= 1 and b["remote"][0]["hits"] == 0

    # B's compiles wrote good entries over the garbage: a third machine hits them
    c = Machine(tmp_path, "c", reference, CUFORGE_REMOTE=remote.url).run()
    assert_all_right(c)
    assert c["compiles"] == 0 and sources(c) == {"remote"}


def test_redis_at_maxmemory(redis_server, tmp_path, reference):
    import redis

    raw = redis_server.client()
    raw.config_set("maxmemory-policy", "noeviction")
    raw.config_set("maxmemory", "1mb")
    filler = os.urandom(16 * 1024)
    with pytest.raises(redis.ResponseError, match="maxmemory"):
        for i in range(1000):  # fill it (if the baseline did not already)
            raw.set(f"filler:{i}", filler)
    # full, and kept full: the limit is also pinned below what is in use, or memory freed
    # after the refused command (its query buffer) would let one small write through
    raw.config_set("maxmemory", str(raw.info("memory")["used_memory"] // 2))

    report = Machine(tmp_path, "a", reference, **fast_fail_env(redis_server.url)).run()
    assert_all_right(report)
    assert report["compiles"] == KERNELS
    remote = report["remote"][0]
    assert remote["puts"] == 0 and remote["errors"] >= 1


def test_signed_reader_meets_unsigned_entries(redis_server, tmp_path, reference):
    unsigned = Machine(tmp_path, "a", reference, CUFORGE_REMOTE=redis_server.url).run()
    assert unsigned["remote"][0]["puts"] >= KERNELS

    signed = {"CUFORGE_REMOTE": redis_server.url, "CUFORGE_REMOTE_KEY": "k"}
    reader = Machine(tmp_path, "b", reference, **signed).run()
    assert_all_right(reader)
    assert reader["compiles"] == KERNELS  # refused every unsigned entry
    assert "remote" not in sources(reader)
    assert reader["remote"][0]["rejected"] >= KERNELS and reader["remote"][0]["hits"] == 0

    # the reader's own writes are signed: another holder of the key hits them ...
    peer = Machine(tmp_path, "c", reference, **signed).run()
    assert peer["compiles"] == 0 and sources(peer) == {"remote"}
    # ... and a holder of another key refuses them
    other = {"CUFORGE_REMOTE": redis_server.url, "CUFORGE_REMOTE_KEY": "not-k"}
    stranger = Machine(tmp_path, "d", reference, **other).run()
    assert_all_right(stranger)
    assert stranger["compiles"] == KERNELS and stranger["remote"][0]["rejected"] >= KERNELS
