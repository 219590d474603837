"""The remote tier's limits (issue 20, items 6, 11 and 12), against real servers on 127.0.0.1:
a size cap (``CUFORGE_REMOTE_MAX_BYTES``) enforced before a value is transferred, the
envelope's first bytes checked before the rest, a deadline for a whole call, damaged
values and sustained slowness opening the circuit breaker, the trust check of a
``file://`` share, and the empty ``CUFORGE_REMOTE_KEY`` error.

Sizes are small multiples of a small configured cap, so the tests stay fast.
"""

from __future__ import annotations

import logging
import os
import socket
import time

import pytest

from cuforge.base.config import DEFAULT_REMOTE_MAX_BYTES, settings
from cuforge.base.errors import ConfigError
from cuforge.store.base import Entry
from cuforge.store.remote import breaker as breaker_mod
from cuforge.store.remote import open_remotes
from cuforge.store.remote.base import RemoteError, RemoteTimeout
from cuforge.store.remote.envelope import namespace
from cuforge.store.remote.file import FileBackend
from cuforge.store.remote.http import HttpBackend
from cuforge.store.remote.tier import RemoteStore
from tests.remote_servers import read_request

from .helpers import key_of

CAP = 64 * 1024


def _entry(i: int, size: int = 3000) -> Entry:
    return Entry(key_of(i), "kernel", os.urandom(size), {"name": f"k{i}.cu"})


def _tier(monkeypatch, url: str, **env: str) -> RemoteStore:
    """The tier ``open_remotes`` builds for ``url`` under the environment ``env``."""
    monkeypatch.setenv("CUFORGE_REMOTE", url)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    (tier,) = open_remotes(settings())
    return tier


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


# -- the setting ------------------------------------------------------------------------


def test_max_bytes_setting(monkeypatch):
    assert settings().remote_max_bytes == DEFAULT_REMOTE_MAX_BYTES == 128 * 1024**2
    monkeypatch.setenv("CUFORGE_REMOTE_MAX_BYTES", "64K")
    assert settings().remote_max_bytes == CAP
    monkeypatch.setenv("CUFORGE_REMOTE_MAX_BYTES", "lots")
    with pytest.raises(ConfigError, match="CUFORGE_REMOTE_MAX_BYTES"):
        settings()


def test_set_but_empty_remote_key_is_an_error(monkeypatch):
    """A CI secret that did not expand must not silently mean "accept unsigned entries"."""
    for empty in ("", "  "):
        monkeypatch.setenv("CUFORGE_REMOTE_KEY", empty)
        with pytest.raises(ConfigError, match="CUFORGE_REMOTE_KEY is set but empty"):
            settings()
    monkeypatch.delenv("CUFORGE_REMOTE_KEY")
    assert settings().remote_key == ""  # unset: no key, no error


# -- item 6: the size cap, the header first, damaged values count ----------------------


def test_http_value_over_the_cap_is_refused_by_its_length_and_opens_the_breaker(
    nginx_server, monkeypatch
):
    writer = _tier(monkeypatch, nginx_server.url, CUFORGE_REMOTE_MAX_BYTES="1M")
    entries = [_entry(i, 3 * CAP) for i in range(1, 5)]
    assert all(writer.put(e) for e in entries)
    reader = _tier(monkeypatch, nginx_server.url, CUFORGE_REMOTE_MAX_BYTES="64K")
    assert reader.backend.max_bytes == CAP
    for e in entries[:3]:
        assert reader.get(e.key, kind="kernel") is None
    st = reader.stats()
    assert st.hits == 0 and st.errors == 3
    assert "CUFORGE_REMOTE_MAX_BYTES" in st.extra["last_error"]
    assert st.extra["breaker"] == "open"  # three damaged answers in a row
    asked = len(nginx_server.requests())
    assert reader.get(entries[3].key, kind="kernel") is None
    assert reader.stats().extra["skipped"] == 1 and len(nginx_server.requests()) == asked
    # under the writer's cap the same entries are hits
    assert writer.get(entries[3].key, kind="kernel").payload == entries[3].payload


def test_http_garbage_is_refused_after_its_first_bytes(scripted_server):
    """A server announcing 10 MB of garbage: the client reads the first bytes, sees no
    cuforge envelope and hangs up, without waiting for (or buffering) the rest."""
    seen: dict[str, bool] = {}

    def garbage(conn: socket.socket) -> None:
        read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 10000000\r\n\r\nNOT-CUFORGE")
        seen["hung_up"] = conn.recv(1) == b""  # the client closes instead of reading on

    server = scripted_server(garbage)
    tier = RemoteStore(
        HttpBackend(server.url(), namespace=namespace(), connect_timeout=1.0, timeout=5.0)
    )
    assert tier.get(key_of(1), kind="kernel") is None
    st = tier.stats()
    assert st.errors == 1 and "bad magic" in st.extra["last_error"], st.extra["last_error"]
    deadline = time.monotonic() + 5
    while "hung_up" not in seen and time.monotonic() < deadline:
        time.sleep(0.01)
    assert seen == {"hung_up": True}


def _net_output(client) -> int:
    return int(client.info("stats")["total_net_output_bytes"])


def test_redis_value_over_the_cap_is_never_transferred(redis_server, monkeypatch):
    writer = _tier(monkeypatch, redis_server.url, CUFORGE_REMOTE_MAX_BYTES="1M")
    big, small = _entry(1, 3 * CAP), _entry(2)
    assert writer.put(big) and writer.put(small)
    reader = _tier(monkeypatch, redis_server.url, CUFORGE_REMOTE_MAX_BYTES="64K")
    client = redis_server.client()
    before = _net_output(client)
    assert reader.get(big.key, kind="kernel") is None
    sent = _net_output(client) - before
    # its first bytes (at most the cap) came, not the 3 x CAP of the value
    assert sent < CAP + 4096, f"redis sent {sent} bytes for a value over the {CAP}-byte cap"
    st = reader.stats()
    assert st.errors == 1 and "cap" in st.extra["last_error"]
    assert reader.get(small.key, kind="kernel").payload == small.payload
    # a value under the cap with a bad header is refused from its first bytes
    client.set(f"cuforge:{namespace()}:kernel:{key_of(3)}", b"JUNK" + b"\0" * (CAP // 2))
    assert reader.get(key_of(3), kind="kernel") is None
    assert "bad magic" in reader.stats().extra["last_error"]


def test_file_damaged_values_count_toward_the_breaker(tmp_path, monkeypatch):
    """Oversized, bad magic, bad digest: three damaged values in a row open the breaker
    (before, a damaged value counted as an answer and the breaker stayed closed)."""
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    url = f"file://{shared}"
    writer = _tier(monkeypatch, url, CUFORGE_REMOTE_MAX_BYTES="1M")
    big, torn, fine = _entry(1, 3 * CAP), _entry(2), _entry(3)
    assert writer.put(big) and writer.put(torn) and writer.put(fine)
    backend = writer.backend
    os.makedirs(os.path.dirname(backend.path_for("kernel", key_of(4))))
    with open(backend.path_for("kernel", key_of(4)), "wb") as f:
        f.write(b"JUNK" * 100)
    path = backend.path_for("kernel", torn.key)
    data = bytearray(open(path, "rb").read())
    data[-100] ^= 0xFF
    with open(path, "wb") as f:
        f.write(data)
    reader = _tier(monkeypatch, url, CUFORGE_REMOTE_MAX_BYTES="64K")
    for key in (big.key, key_of(4), torn.key):
        assert reader.get(key, kind="kernel") is None
    st = reader.stats()
    assert st.errors == 3 and st.extra["breaker"] == "open", st
    assert reader.get(fine.key, kind="kernel") is None  # skipped while open
    assert reader.stats().extra["skipped"] == 1


# -- item 6: a deadline for the whole call -----------------------------------------------


def test_redis_timeout_bounds_the_whole_get_not_each_recv(scripted_server):
    """A Redis-speaking server that trickles its answer, one byte well inside each
    ``recv`` timeout: redis-py alone would wait for all of it (about 1.5 s against a
    0.3 s timeout); the deadline ends the call."""
    from cuforge.store.remote.redis import RedisBackend

    def trickle(conn: socket.socket) -> None:
        conn.recv(65536)
        for byte in b"$40\r\n" + b"x" * 40 + b"\r\n":
            conn.sendall(bytes((byte,)))
            time.sleep(0.03)

    server = scripted_server(trickle)
    b = RedisBackend(server.url("redis").replace("/cache", "/0"), namespace="ns",
                     connect_timeout=1.0, timeout=0.3)  # fmt: skip
    with pytest.raises(RemoteTimeout, match="0.3 s"):  # before: the 40 bytes, after ~1.5 s
        b.get("kernel", key_of(1))


def test_redis_garbage_reply_is_a_remote_error(scripted_server):
    """A server that answers a length that is not a number (not RESP): a RemoteError naming
    the call, never a bare ValueError from parsing it."""
    from cuforge.store.remote.redis import RedisBackend

    def garbage(conn: socket.socket) -> None:
        conn.recv(65536)
        conn.sendall(b":1\r\n:abc\r\n")

    server = scripted_server(garbage)
    b = RedisBackend(server.url("redis").replace("/cache", "/0"), namespace="ns",
                     connect_timeout=1.0, timeout=1.0)  # fmt: skip
    with pytest.raises(RemoteError, match="GET kernel/.*length or number that is not one"):
        b.get("kernel", key_of(2))


# -- item 11: sustained slowness opens the breaker ----------------------------------------


def _slow_http(delay: float, served: list):
    """An HTTP server answering every request with 404 after ``delay`` seconds."""

    def handler(conn: socket.socket) -> None:
        while read_request(conn):
            served.append(1)
            time.sleep(delay)
            conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")

    return handler


def test_a_remote_answering_just_under_its_timeout_is_skipped(scripted_server, caplog):
    served: list = []
    server = scripted_server(_slow_http(0.3, served))
    tier = RemoteStore(
        HttpBackend(server.url(), namespace=namespace(), connect_timeout=1.0, timeout=0.5)
    )
    for i in range(8):
        assert tier.get(key_of(i), kind="kernel") is None
    st = tier.stats()
    assert len(served) == breaker_mod.SLOW_WINDOW == 5  # then no call at all
    assert st.errors == 0 and st.extra["breaker"] == "open" and st.extra["skipped"] == 3
    (warning,) = _warnings(caplog)
    assert "too slow" in warning and "CUFORGE_REMOTE_TIMEOUT" in warning


def test_a_fast_remote_stays_in_use(nginx_server):
    tier = RemoteStore(
        HttpBackend(nginx_server.url, namespace=namespace(), connect_timeout=1.0, timeout=2.0)
    )
    for i in range(12):
        assert tier.get(key_of(i), kind="kernel") is None
    assert tier.stats().extra["breaker"] == "closed"
    assert len([r for r in nginx_server.requests() if r[1] == "GET"]) == 12


# -- item 12: the trust rule for a file:// share -------------------------------------------


def test_world_writable_share_warns_once_when_entries_are_unsigned(tmp_path, monkeypatch, caplog):
    shared = tmp_path / "shared"
    shared.mkdir()
    url = f"file://{shared}"
    writer = _tier(monkeypatch, url)
    e1, e2 = _entry(1), _entry(2)
    assert writer.put(e1) and writer.put(e2)
    assert writer.get(e1.key, kind="kernel") is not None and _warnings(caplog) == []
    # a directory under the share that anyone may write: anyone may have planted entries
    kind_dir = os.path.dirname(os.path.dirname(writer.backend.path_for("kernel", e1.key)))
    os.chmod(kind_dir, 0o777)
    reader = _tier(monkeypatch, url)
    assert reader.get(e1.key, kind="kernel").payload == e1.payload  # still a hit ...
    assert reader.get(e2.key, kind="kernel").payload == e2.payload
    (warning,) = _warnings(caplog)  # ... with one warning, once
    assert kind_dir in warning and "writable by others" in warning
    assert "CUFORGE_REMOTE_KEY" in warning and "chmod" in warning


def test_world_writable_share_with_a_key_gives_no_warning(tmp_path, monkeypatch, caplog):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    tier = _tier(monkeypatch, f"file://{shared}", CUFORGE_REMOTE_KEY="team-secret")
    e = _entry(1)
    assert tier.put(e) and tier.get(e.key, kind="kernel").payload == e.payload
    assert _warnings(caplog) == []


def test_doctor_does_not_pass_a_world_writable_unsigned_share(tmp_path):
    from tests.cli.conftest import Cli

    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    cli = Cli(str(tmp_path / "cache"))
    env = {"CUFORGE_REMOTE": f"file://{shared}"}
    doc = cli.json("doctor", "--check", "remote", ok=False, env=env)
    (row,) = [c for c in doc["checks"] if c["id"] == "remote"]
    assert row["status"] == "FAIL", row
    assert "writable by others" in row["detail"]
    assert "CUFORGE_REMOTE_KEY" in row["fix"] and "chmod" in row["fix"]
    signed = cli.json(
        "doctor", "--check", "remote", ok=False, env={**env, "CUFORGE_REMOTE_KEY": "k"}
    )
    (row,) = [c for c in signed["checks"] if c["id"] == "remote"]
    assert row["status"] == "PASS", row
    os.chmod(shared, 0o755)
    for sub, _dirs, _files in os.walk(shared):
        os.chmod(sub, 0o755)
    doc = cli.json("doctor", "--check", "remote", ok=False, env=env)
    (row,) = [c for c in doc["checks"] if c["id"] == "remote"]
    assert row["status"] == "PASS", row


def test_file_backend_share_problem_looks_below_the_share(tmp_path):
    shared = tmp_path / "shared"
    deep = shared / namespace() / "kernel" / "ab"
    deep.mkdir(parents=True)
    for d in (shared, shared / namespace(), shared / namespace() / "kernel", deep):
        os.chmod(d, 0o755)
    b = FileBackend(f"file://{shared}", namespace=namespace(), connect_timeout=0.1, timeout=1)
    assert b.share_problem() is None
    os.chmod(deep, 0o777)
    assert str(deep) in b.share_problem()
