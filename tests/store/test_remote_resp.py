"""cuforge's RESP2 client (cuforge.store.remote.resp) against misbehaving servers: real TCP
servers on 127.0.0.1 that announce huge bulks, send garbage, nest arrays without end.
Every malformed reply is a ProtocolError saying what was wrong; nothing announced is read
(or allocated) past what was asked for."""

from __future__ import annotations

import socket
import threading

import pytest

from cuforge.store.remote import resp
from cuforge.store.remote.base import RemoteError
from cuforge.store.remote.redis import RedisBackend, parse_url
from tests.child import run_python
from tests.store.helpers import key_of


def _answering(reply: bytes, then_stream: bool = False):
    """A handler that reads a request and answers ``reply`` (then, with ``then_stream``,
    zeros as fast as the client takes them, until it hangs up)."""

    def handler(conn: socket.socket) -> None:
        conn.recv(65536)
        conn.sendall(reply)
        if then_stream:
            block = bytes(1 << 20)
            while True:
                conn.sendall(block)
        else:
            conn.recv(65536)  # until the client hangs up

    return handler


def _connection(server) -> resp.Connection:
    return resp.Connection(parse_url(server.url("redis").replace("/cache", "/0")), 1.0, 2.0)


GARBAGE = {
    "a doubled minus in a length (was ValueError)": b"$--5\r\n",
    "a 5000-digit integer (was ValueError)": b":" + b"9" * 5000 + b"\r\n",
    "arrays nested 5000 deep (was RecursionError)": b"*1\r\n" * 5000,
    "a bulk whose trailer is not CRLF (was accepted)": b"$3\r\nabcXY",
    "a bulk of length -7 (was a nil)": b"$-7\r\n",
    "an array of length -3 (was a nil)": b"*-3\r\n",
    "a 10^13-byte bulk (was an empty MemoryError)": b"$9999999999999\r\n",
    "a length with a plus sign": b"$+3\r\nabc\r\n",
    "a RESP3 map": b"%1\r\n",
}


@pytest.mark.parametrize("what", sorted(GARBAGE))
def test_every_malformed_reply_is_a_protocol_error(scripted_server, what):
    """Issue 35 item 14: garbage gave ValueError, RecursionError or an empty MemoryError;
    a bulk not followed by CRLF was accepted."""
    server = scripted_server(_answering(GARBAGE[what]))
    conn = _connection(server)
    try:
        conn.send(("GET", "x"))
        with pytest.raises(resp.ProtocolError) as err:
            conn.read()
        assert str(err.value), what  # says what was wrong
    finally:
        conn.close()


def test_a_backend_reports_garbage_as_a_remote_error_naming_it(scripted_server):
    server = scripted_server(_answering(b"*1\r\n" * 5000))
    b = RedisBackend(
        server.url("redis").replace("/cache", "/0"),
        namespace="ns",
        connect_timeout=1.0,
        timeout=2.0,
    )
    with pytest.raises(RemoteError, match="ProtocolError: arrays nested deeper than"):
        b.contains("cubin", key_of(1))


def test_a_bulk_longer_than_asked_is_refused_unread(scripted_server):
    """Issue 35 item 7 (the reader itself): an integer reply of 1 GB, a GETRANGE of more
    than its range."""
    server = scripted_server(_answering(b"$1000000000\r\n", then_stream=True))
    conn = _connection(server)
    try:
        conn.send(("STRLEN", "x"))
        with pytest.raises(resp.ProtocolError, match="1000000000-byte bulk reply where at most 64"):
            conn.read(resp.SMALL)
    finally:
        conn.close()
    server = scripted_server(_answering(b"$11\r\nhello world\r\n"))
    conn = _connection(server)
    try:
        conn.send(("GETRANGE", "x", 0, 9))
        with pytest.raises(resp.ProtocolError, match="at most 10 bytes"):
            conn.read(10)
    finally:
        conn.close()


_MEMORY_CHILD = """
import json, resource, sys
from cuforge.store.remote.redis import RedisBackend
url, reply = sys.argv[1], sys.argv[2]
b = RedisBackend(url, namespace="ns", connect_timeout=1.0, timeout=3.0)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    b.get("cubin", "ab" * 32)
    error = None
except Exception as exc:
    error = f"{type(exc).__name__}: {exc}"
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"error": error, "grew_kib": after - before}))
"""


@pytest.mark.parametrize(
    "reply",
    [
        b"$1500000000\r\n",  # the EXISTS (an integer) answered by a 1.5 GB bulk
        b":1\r\n:1000\r\n$2000000000\r\n",  # a 1000-byte value whose first GETRANGE is 2 GB
    ],
    ids=["integer-as-1.5GB-bulk", "getrange-as-2GB-bulk"],
)
def test_a_fake_servers_huge_bulk_costs_no_memory(scripted_server, reply):
    """Issue 35 item 7: a fake server's 1-2 GB bulks reached 224-670 MB RSS against the
    128 MiB cap. Now refused from the announced length: RSS grows by a few MB at most."""
    server = scripted_server(_answering(reply, then_stream=True))
    url = server.url("redis").replace("/cache", "/0")
    code = _MEMORY_CHILD.replace("sys.argv[1], sys.argv[2]", f"{url!r}, {reply!r}")
    out = run_python(code, timeout=60)
    assert out["error"] is not None and "bulk reply where at most" in out["error"], out
    assert out["grew_kib"] < 16 * 1024, out


def test_a_reply_within_what_was_asked_is_read(scripted_server):
    """The limits refuse nothing real: a SCAN-shaped reply, an integer, a bulk of exactly
    the range."""
    done = threading.Event()

    def handler(conn: socket.socket) -> None:
        conn.recv(65536)
        conn.sendall(b"*2\r\n$1\r\n0\r\n*2\r\n$3\r\nabc\r\n$-1\r\n:42\r\n$10\r\n0123456789\r\n")
        done.wait(5)

    server = scripted_server(handler)
    conn = _connection(server)
    try:
        conn.send(("SCAN", 0))
        assert conn.read(1 << 20) == [b"0", [b"abc", None]]
        assert conn.read(resp.SMALL) == 42
        assert conn.read(10) == b"0123456789"
    finally:
        done.set()
        conn.close()
