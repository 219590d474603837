"""The contract every remote backend keeps, checked once per backend against the real
thing: HttpBackend against a real nginx with WebDAV PUT, RedisBackend against a real
redis-server, S3Backend against a real moto S3 server (all started per test on 127.0.0.1;
s3 skips unless boto3 and moto[server] are installed: ``make test-s3``), FileBackend on a
real directory; and
the network backends against servers that never answer or never accept.

What only one backend does (auth, TLS, keep-alive, TTLs, misbehaving HTTP servers, ...)
is tested in its own file: test_remote_http.py, test_remote_redis.py, test_remote_file.py.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from cuforge.store.remote.base import RemoteError
from tests.s3_server import s3_server_fixture  # noqa: F401 - the fixture
from tests.store.helpers import key_of

#: a generous sanity bound for "it returned" (speed is measured in bench/, not asserted)
RETURNS_WITHIN = 5.0
NS = "cuforge-test-k1"


@dataclass
class Remote:
    """One backend under test, with a view of what its server holds."""

    name: str
    #: a backend of this kind on the test's server: make(timeout=..., connect_timeout=...)
    make: Callable[..., object]
    #: the bytes the server holds for (kind, key), read around the backend; None if none
    stored: Callable[[str, str], bytes | None]
    #: stop the server for good (None: nothing to stop)
    kill: Callable[[], None] | None


def _http(request) -> Remote:
    from cuforge.store.remote.http import HttpBackend

    server = request.getfixturevalue("nginx_server")

    def stored(kind: str, key: str) -> bytes | None:
        # the layout on the server: <prefix>/<namespace>/<kind>/<key>
        path = os.path.join(server.root, NS, kind, key)
        if not os.path.exists(path):
            return None
        with open(path, "rb") as f:
            return f.read()

    def make(timeout: float = 2.0, connect_timeout: float = 0.5):
        return HttpBackend(
            server.url, namespace=NS, connect_timeout=connect_timeout, timeout=timeout
        )

    return Remote("http", make, stored, server.kill)


def _redis(request) -> Remote:
    pytest.importorskip("redis", reason="the 'redis' package (pip install 'cuforge[redis]')")
    from cuforge.store.remote.redis import RedisBackend

    server = request.getfixturevalue("redis_server")

    def stored(kind: str, key: str) -> bytes | None:
        # the key layout operators see: cuforge:{namespace}:{kind}:{key}
        return server.client().get(f"cuforge:{NS}:{kind}:{key}")

    def make(timeout: float = 1.0, connect_timeout: float = 0.5):
        return RedisBackend(
            server.url, namespace=NS, connect_timeout=connect_timeout, timeout=timeout, ttl=0
        )

    return Remote("redis", make, stored, server.kill)


def _file(request) -> Remote:
    from cuforge.store.remote.file import FileBackend

    shared = request.getfixturevalue("tmp_path") / "shared"
    shared.mkdir()

    def make(timeout: float = 1.0, connect_timeout: float = 0.1):
        return FileBackend(
            f"file://{shared}", namespace=NS, connect_timeout=connect_timeout, timeout=timeout
        )

    def stored(kind: str, key: str) -> bytes | None:
        path = make().path_for(kind, key)
        if not os.path.exists(path):
            return None
        with open(path, "rb") as f:
            return f.read()

    return Remote("file", make, stored, None)


def _s3(request) -> Remote:
    server = request.getfixturevalue("s3_server")
    from cuforge.store.remote.s3 import S3Backend

    def make(timeout: float = 2.0, connect_timeout: float = 0.5):
        return S3Backend(
            server.url(), namespace=NS, connect_timeout=connect_timeout, timeout=timeout
        )

    def stored(kind: str, key: str) -> bytes | None:
        # the layout operators see: <prefix>/<namespace>/<kind>/<key> in the bucket
        try:
            got = server.client().get_object(Bucket="cuforge-test", Key=f"team/{NS}/{kind}/{key}")
        except server.client().exceptions.NoSuchKey:
            return None
        return got["Body"].read()

    return Remote("s3", make, stored, server.kill)


@pytest.fixture(autouse=True)
def _aws_credentials(monkeypatch):
    """Credentials of the usual chain for s3 (the test servers accept any; boto3 refuses to
    send a request without some)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")


_BACKENDS = {"http": _http, "redis": _redis, "file": _file, "s3": _s3}


@pytest.fixture(params=sorted(_BACKENDS))
def remote(request) -> Remote:
    """Each backend in turn, on its own fresh server."""
    return _BACKENDS[request.param](request)


@pytest.fixture(params=["http", "redis", "s3"])
def network(request) -> Remote:
    """Each network backend in turn, on its own fresh server."""
    return _BACKENDS[request.param](request)


def _on(url: str, name: str, timeout: float, connect_timeout: float):
    """A backend of kind ``name`` for ``url`` (a black hole's or a tarpit's)."""
    if name == "redis":
        pytest.importorskip("redis", reason="the 'redis' package (pip install 'cuforge[redis]')")
        from cuforge.store.remote.redis import RedisBackend

        return RedisBackend(
            url, namespace=NS, connect_timeout=connect_timeout, timeout=timeout, ttl=0
        )
    if name == "s3":
        from tests.s3_server import available

        if available() is not None:
            pytest.skip(available())
        from cuforge.store.remote.s3 import S3Backend

        # the server's host and port as the endpoint of a bucket
        endpoint = "http://" + url.split("://", 1)[1].split("/", 1)[0]
        return S3Backend(
            f"s3://bucket/p?endpoint={endpoint}&region=us-east-1",
            namespace=NS,
            connect_timeout=connect_timeout,
            timeout=timeout,
        )
    from cuforge.store.remote.http import HttpBackend

    return HttpBackend(url, namespace=NS, connect_timeout=connect_timeout, timeout=timeout)


# ---------------------------------------------------------------- values


def test_round_trip_missing_and_contains(remote):
    b = remote.make()
    key = key_of(1)
    data = bytes(range(256)) * 4096  # every byte value, 1 MiB
    assert b.get("cubin", key) is None
    assert b.contains("cubin", key) is False
    b.put("cubin", key, data)
    assert b.get("cubin", key) == data
    assert b.contains("cubin", key) is True
    assert remote.stored("cubin", key) == data  # where operators expect it
    b.put("cubin", key, b"replaced")  # an overwrite
    assert b.get("cubin", key) == b"replaced"
    assert remote.stored("cubin", key) == b"replaced"
    assert b.get("ptx", key) is None  # kinds are apart


def test_empty_value(remote):
    b = remote.make()
    b.put("cubin", key_of(2), b"")
    assert b.get("cubin", key_of(2)) == b""
    assert b.contains("cubin", key_of(2)) is True


def test_close_then_reuse(remote):
    b = remote.make()
    b.put("cubin", key_of(16), b"x")
    b.close()
    b.close()
    assert b.get("cubin", key_of(16)) == b"x"  # reconnects


# ---------------------------------------------------------------- servers that fail


def test_server_killed(network):
    b = network.make()
    b.put("cubin", key_of(12), b"x")
    network.kill()
    for op in (
        lambda: b.get("cubin", key_of(12)),
        lambda: b.put("cubin", key_of(13), b"y"),
        lambda: b.contains("cubin", key_of(12)),
    ):
        start = time.monotonic()
        with pytest.raises(RemoteError, match="127.0.0.1"):
            op()
        assert time.monotonic() - start < RETURNS_WITHIN


NEVER_ANSWERS = {
    "http": "no answer within 0.2 s",
    "redis": "[Tt]imeout",
    "s3": "no answer within 0.2 s",
}
NEVER_CONNECTS = {
    "http": "no connection within 0.2 s",
    "redis": "[Tt]imeout connecting",
    "s3": "no connection within 0.2 s",
}


@pytest.mark.parametrize("name", sorted(NEVER_ANSWERS))
def test_server_that_never_answers(black_hole, name):
    b = _on(black_hole.url(name), name, timeout=0.2, connect_timeout=0.2)
    for op in (
        lambda: b.get("cubin", key_of(7)),
        lambda: b.put("cubin", key_of(7), b"x" * 100_000),
        lambda: b.contains("cubin", key_of(7)),
    ):
        start = time.monotonic()
        with pytest.raises(RemoteError, match=NEVER_ANSWERS[name]):
            op()
        assert time.monotonic() - start < RETURNS_WITHIN
    assert black_hole.accepted >= 1  # it really connected, then waited for an answer


@pytest.mark.parametrize("name", sorted(NEVER_CONNECTS))
def test_connect_that_never_completes(tarpit, name):
    b = _on(tarpit.url(name), name, timeout=0.2, connect_timeout=0.2)
    start = time.monotonic()
    with pytest.raises(RemoteError, match=NEVER_CONNECTS[name]):
        b.get("cubin", key_of(8))
    assert time.monotonic() - start < RETURNS_WITHIN


@pytest.mark.parametrize("name", ["http", "redis", "s3"])
def test_constructor_does_not_connect(black_hole, name):
    _on(black_hole.url(name), name, timeout=3, connect_timeout=3)
    time.sleep(0.3)  # time for the black hole to accept a connection, had one been made
    assert black_hole.accepted == 0


@pytest.mark.parametrize(
    "name, url, needle",
    [
        ("http", "http:///cache", "expected http"),
        ("http", "ftp://host/cache", "expected http"),
        ("http", "http://host:99999/cache", "bad URL"),
        ("http", "http://host/cache?x=1", "no query"),
        ("redis", "redis://127.0.0.1:6379/notanumber", "database number"),
        ("redis", "redis://127.0.0.1:99999/0", "bad Redis URL"),
        ("redis", "redis:///0", "no host"),
        ("redis", "http://127.0.0.1:6379/0", "not http://"),
    ],
)
def test_bad_urls(name, url, needle):
    with pytest.raises(RemoteError, match=needle):
        _on(url, name, timeout=1.0, connect_timeout=0.5)
