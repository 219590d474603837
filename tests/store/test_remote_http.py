"""HttpBackend against a real nginx with WebDAV PUT (started per test on 127.0.0.1), and
against small scripted servers that misbehave on purpose (trickle, cut a body short, drop
kept-alive connections). What every backend does (round trip, empty values, a killed
server, one that never answers or never accepts, bad URLs) is in test_remote_contract.py."""

from __future__ import annotations

import os
import threading
import time

import pytest

from cuforge.store.remote.base import RemoteError
from cuforge.store.remote.http import HttpBackend
from tests.store.helpers import key_of

#: a generous sanity bound for "it returned" (speed is measured in bench/, not asserted)
RETURNS_WITHIN = 5.0
NS = "cuforge-test-k1"


def backend(url: str, timeout: float = 2.0, connect_timeout: float = 0.5) -> HttpBackend:
    return HttpBackend(url, namespace=NS, connect_timeout=connect_timeout, timeout=timeout)


def read_request(conn) -> bytes:
    from tests.remote_servers import read_request

    return read_request(conn)


def test_put_creates_then_overwrites(nginx_server):
    """(The round trip itself: test_remote_contract.py.) nginx answers 201 to the first
    PUT of a key, 204 to an overwrite."""
    b = backend(nginx_server.url)
    b.put("cubin", key_of(1), bytes(range(256)) * 4096)
    b.put("cubin", key_of(1), b"replaced")  # overwrite: nginx answers 204
    assert b.get("cubin", key_of(1)) == b"replaced"
    statuses = [row[3] for row in nginx_server.requests()]
    assert statuses.count(201) == 1 and statuses.count(204) == 1


def test_one_keep_alive_connection_per_thread(nginx_server):
    b = backend(nginx_server.url)
    for i in range(10):
        b.put("cubin", key_of(i), b"x%d" % i)
        assert b.get("cubin", key_of(i)) == b"x%d" % i

    def connections() -> set[int]:  # (not the fixture's readiness probe)
        return {row[0] for row in nginx_server.requests() if row[2].startswith(f"/cache/{NS}")}

    assert len(connections()) == 1  # 20 requests, one connection

    failures: list[int] = []

    def work(t: int) -> None:
        for i in range(10):
            if b.get("cubin", key_of(i)) != b"x%d" % i:
                failures.append(t)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    assert len(connections()) <= 1 + 4
    b.close()
    assert b.get("cubin", key_of(0)) == b"x0"  # reconnects after close


def test_put_refused_is_an_error(nginx_server):
    b = backend(nginx_server.readonly_url)
    with pytest.raises(RemoteError, match="405"):
        b.put("cubin", key_of(3), b"x")
    assert b.get("cubin", key_of(3)) is None  # a miss there is still a 404 -> None
    with pytest.raises(RemoteError, match="405"):
        b.put("cubin", key_of(3), b"y")  # the connection stayed usable


def test_basic_auth(nginx_server):
    good = backend(nginx_server.private_url(nginx_server.user, nginx_server.password))
    good.put("cubin", key_of(4), b"private")
    assert good.get("cubin", key_of(4)) == b"private"
    assert nginx_server.password not in good.describe() and "***" in good.describe()

    anonymous = backend(nginx_server.private_url())
    with pytest.raises(RemoteError, match="401"):
        anonymous.get("cubin", key_of(4))
    wrong = backend(nginx_server.private_url(nginx_server.user, "nope-pw"))
    with pytest.raises(RemoteError, match="401") as err:
        wrong.put("cubin", key_of(4), b"x")
    assert "nope-pw" not in str(err.value)


def test_body_over_the_cap_is_refused(nginx_server):
    b = backend(nginx_server.url)
    b.put("cubin", key_of(5), b"z" * 1000)
    b.max_bytes = 999
    with pytest.raises(RemoteError, match="announced 1000 bytes") as err:
        b.get("cubin", key_of(5))
    assert "RemoteError" not in str(err.value)  # one clear message, not a wrapped one
    b.max_bytes = 1000
    assert b.get("cubin", key_of(5)) == b"z" * 1000


def test_trickling_server_hits_the_deadline(scripted_server):
    """One byte every 50 ms never trips a per-recv timeout; the deadline still ends it."""

    def trickle(conn) -> None:
        read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
        for _ in range(10_000):
            conn.sendall(b"x")
            time.sleep(0.05)

    server = scripted_server(trickle)
    b = backend(server.url(), timeout=0.5)
    start = time.monotonic()
    with pytest.raises(RemoteError, match="no answer within 0.5 s"):
        b.get("cubin", key_of(9))
    assert time.monotonic() - start < RETURNS_WITHIN


def test_short_body_is_an_error_not_a_value(scripted_server):
    def cut_short(conn) -> None:
        read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 50)

    b = backend(scripted_server(cut_short).url())
    with pytest.raises(RemoteError, match="IncompleteRead"):
        b.get("cubin", key_of(10))


def test_unannounced_body_over_the_cap(scripted_server):
    def no_length(conn) -> None:
        read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + b"y" * 5000)

    b = backend(scripted_server(no_length).url())
    b.max_bytes = 4096
    with pytest.raises(RemoteError, match="grew past"):
        b.get("cubin", key_of(11))
    b.max_bytes = 5000
    assert b.get("cubin", key_of(11)) == b"y" * 5000


def test_stale_keep_alive_connection_is_retried_once(scripted_server):
    """A server that closes each connection after one answer without saying so (as after
    its keep-alive timeout): every call still succeeds, on a fresh connection."""

    def once(conn) -> None:
        if read_request(conn):
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            time.sleep(0.05)  # then close, keep-alive notwithstanding

    server = scripted_server(once)
    b = backend(server.url())
    for _ in range(3):
        assert b.get("cubin", key_of(12)) == b"ok"
        time.sleep(0.15)  # let the server close it
    assert server.connections == 3


def test_redirects_are_not_followed(scripted_server):
    def redirect(conn) -> None:
        while read_request(conn):
            conn.sendall(
                b"HTTP/1.1 301 Moved Permanently\r\nLocation: http://example.com/\r\n"
                b"Content-Length: 5\r\n\r\nmoved"
            )

    b = backend(scripted_server(redirect).url())
    with pytest.raises(RemoteError, match="301 Moved Permanently: moved"):
        b.get("cubin", key_of(13))


def test_garbage_status_line(scripted_server):
    def garbage(conn) -> None:
        read_request(conn)
        conn.sendall(b"\x00\xffnot http at all\r\n\r\n")

    with pytest.raises(RemoteError, match="BadStatusLine"):
        backend(scripted_server(garbage).url()).get("cubin", key_of(14))


def test_https(nginx_server_tls, monkeypatch):
    server = nginx_server_tls
    # a certificate nobody vouches for is refused: https verifies by default
    with pytest.raises(RemoteError, match="CERTIFICATE_VERIFY_FAILED"):
        backend(server.https_url).get("cubin", key_of(16))
    # trusted through the usual OpenSSL variable, the round trip works over TLS
    monkeypatch.setenv("SSL_CERT_FILE", server.cert)
    b = backend(server.https_url)
    b.put("cubin", key_of(16), b"over tls")
    assert b.get("cubin", key_of(16)) == b"over tls"
    assert b.contains("cubin", key_of(16)) is True
    with open(os.path.join(server.root, NS, "cubin", key_of(16)), "rb") as f:
        assert f.read() == b"over tls"


def test_https_to_a_plain_server_fails(scripted_server):
    """An https URL speaking to a server that is not TLS fails; it never falls back."""

    def plain(conn) -> None:
        conn.recv(4096)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    b = backend(scripted_server(plain).url("https"))
    with pytest.raises(RemoteError, match="127.0.0.1"):
        b.get("cubin", key_of(15))


def test_path_components_cannot_escape(nginx_server):
    b = backend(nginx_server.url)
    for kind, key in (("..", "k"), ("cubin", ".."), ("cubin", "a/b"), ("", "k")):
        with pytest.raises(RemoteError, match="path component"):
            b.get(kind, key)
    with pytest.raises(RemoteError, match="path component"):
        HttpBackend(nginx_server.url, namespace="..", connect_timeout=1, timeout=1)


# -- HTTPS_PROXY / HTTP_PROXY / NO_PROXY (issue 36, item 6) -----------------------------------

PROXY_VARS = ("http_proxy", "https_proxy", "no_proxy", "all_proxy", "REQUEST_METHOD")


@pytest.fixture
def no_proxy_env(monkeypatch):
    """No proxy variable of the caller's environment leaks into these tests."""
    for name in PROXY_VARS:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    return monkeypatch


def _round_trip(url: str, n: int) -> None:
    b = backend(url)
    b.put("cubin", key_of(n), b"through the proxy %d" % n)
    assert b.get("cubin", key_of(n)) == b"through the proxy %d" % n
    assert b.contains("cubin", key_of(n)) is True
    b.close()


@pytest.mark.parametrize("variable", ["HTTP_PROXY", "http_proxy"])
def test_http_remote_goes_through_http_proxy(
    http_cache_server, forwarding_proxy, no_proxy_env, variable
):
    proxy = forwarding_proxy()
    no_proxy_env.setenv(variable, proxy.url)
    _round_trip(http_cache_server.url, 30)
    target = f"http://127.0.0.1:{http_cache_server.port}/cache/{NS}/cubin/{key_of(30)}"
    # every request went to the proxy, with the absolute URL; the proxy forwarded each
    assert [(m, t) for m, t, _ in proxy.requests] == [
        ("PUT", target),
        ("GET", target),
        ("HEAD", target),
    ]
    assert [m for m, _ in http_cache_server.requests] == ["PUT", "GET", "HEAD"]


def test_lowercase_proxy_variable_wins(http_cache_server, forwarding_proxy, no_proxy_env):
    used, ignored = forwarding_proxy(), forwarding_proxy()
    no_proxy_env.setenv("http_proxy", used.url)
    no_proxy_env.setenv("HTTP_PROXY", ignored.url)
    _round_trip(http_cache_server.url, 31)
    assert len(used.requests) == 3 and ignored.requests == []


def test_https_proxy_does_not_serve_http_urls(http_cache_server, forwarding_proxy, no_proxy_env):
    proxy = forwarding_proxy()
    no_proxy_env.setenv("HTTPS_PROXY", proxy.url)  # for https:// caches only
    _round_trip(http_cache_server.url, 32)
    assert proxy.requests == [] and len(http_cache_server.requests) == 3


def test_uppercase_http_proxy_is_ignored_in_a_cgi_process(
    http_cache_server, forwarding_proxy, no_proxy_env
):
    proxy = forwarding_proxy()
    no_proxy_env.setenv("HTTP_PROXY", proxy.url)
    no_proxy_env.setenv("REQUEST_METHOD", "GET")  # httpoxy: a request's Proxy: header
    _round_trip(http_cache_server.url, 33)
    assert proxy.requests == []


@pytest.mark.parametrize(
    "no_proxy", ["127.0.0.1", "*", "example.com, 127.0.0.1", "127.0.0.1:{port}", " 127.0.0.0/8 "]
)
def test_no_proxy_bypasses_the_proxy(http_cache_server, forwarding_proxy, no_proxy_env, no_proxy):
    proxy = forwarding_proxy()
    no_proxy_env.setenv("HTTP_PROXY", proxy.url)
    no_proxy_env.setenv("NO_PROXY", no_proxy.format(port=http_cache_server.port))
    _round_trip(http_cache_server.url, 34)
    assert proxy.requests == []  # straight to the server
    assert [m for m, _ in http_cache_server.requests] == ["PUT", "GET", "HEAD"]


@pytest.mark.parametrize("no_proxy", ["127.0.0.1:1", "example.com", "10.0.0.0/8"])
def test_no_proxy_that_does_not_match_keeps_the_proxy(
    http_cache_server, forwarding_proxy, no_proxy_env, no_proxy
):
    proxy = forwarding_proxy()
    no_proxy_env.setenv("http_proxy", proxy.url)
    no_proxy_env.setenv("no_proxy", no_proxy)
    _round_trip(http_cache_server.url, 35)
    assert len(proxy.requests) == 3


def test_https_remote_tunnels_through_the_proxy(https_cache_server, forwarding_proxy, no_proxy_env):
    proxy = forwarding_proxy()
    no_proxy_env.setenv("SSL_CERT_FILE", https_cache_server.cert)  # trust the test server
    no_proxy_env.setenv("https_proxy", proxy.url)
    _round_trip(https_cache_server.url, 36)
    # one CONNECT (one kept-alive tunnel), TLS to the cache end to end
    assert proxy.requests == [("CONNECT", f"127.0.0.1:{https_cache_server.port}", None)]
    assert [m for m, _ in https_cache_server.requests] == ["PUT", "GET", "HEAD"]


def test_proxy_credentials_are_sent(
    http_cache_server, https_cache_server, forwarding_proxy, no_proxy_env
):
    proxy = forwarding_proxy("user:p%40ss")  # the proxy wants these, as the URL spells them
    authed = proxy.url.replace("http://", "http://user:p%2540ss@")
    no_proxy_env.setenv("HTTP_PROXY", authed)
    no_proxy_env.setenv("HTTPS_PROXY", authed)
    no_proxy_env.setenv("SSL_CERT_FILE", https_cache_server.cert)
    _round_trip(http_cache_server.url, 37)
    _round_trip(https_cache_server.url, 38)
    assert {auth for _, _, auth in proxy.requests} == {"Basic dXNlcjpwJTQwc3M="}


def test_proxy_refusing_us_is_an_error_naming_the_proxy(
    http_cache_server, https_cache_server, forwarding_proxy, no_proxy_env
):
    proxy = forwarding_proxy("user:right")
    wrong = proxy.url.replace("http://", "http://user:wrong@")
    no_proxy_env.setenv("HTTP_PROXY", wrong)
    with pytest.raises(RemoteError, match="answered 407") as info:
        backend(http_cache_server.url).get("cubin", key_of(39))
    assert f"through the proxy http://user:***@127.0.0.1:{proxy.port}" in str(info.value)
    no_proxy_env.setenv("HTTPS_PROXY", wrong)
    with pytest.raises(RemoteError, match="407") as info:
        backend(https_cache_server.url).get("cubin", key_of(39))
    assert "(from HTTPS_PROXY)" in str(info.value)
    assert http_cache_server.requests == [] and https_cache_server.requests == []


@pytest.mark.parametrize("value", ["https://127.0.0.1:3128", "socks5://127.0.0.1:1080"])
def test_a_proxy_cuforge_cannot_speak_to_is_refused(http_cache_server, no_proxy_env, value):
    no_proxy_env.setenv("HTTP_PROXY", value)
    with pytest.raises(RemoteError, match="HTTP_PROXY=.*http:// proxies only"):
        backend(http_cache_server.url).get("cubin", key_of(40))
    assert http_cache_server.requests == []


def test_a_proxy_without_scheme_is_http(http_cache_server, forwarding_proxy, no_proxy_env):
    proxy = forwarding_proxy()
    no_proxy_env.setenv("HTTP_PROXY", f"127.0.0.1:{proxy.port}")
    _round_trip(http_cache_server.url, 41)
    assert len(proxy.requests) == 3


@pytest.mark.parametrize(
    ("host", "port", "no_proxy", "bypass"),
    [
        ("cache.example.com", 80, "example.com", True),
        ("cache.example.com", 80, ".example.com", True),
        ("example.com", 80, ".example.com", True),
        ("badexample.com", 80, "example.com", False),
        ("CACHE.Example.COM", 80, "example.com", True),
        ("cache.example.com", 8080, "example.com:8080", True),
        ("cache.example.com", 80, "example.com:8080", False),
        ("10.1.2.3", 80, "10.0.0.0/8", True),
        ("11.1.2.3", 80, "10.0.0.0/8", False),
        ("::1", 80, "[::1]", True),
        ("::1", 80, "0:0::1", True),
        ("::1", 443, "[::1]:443", True),
        ("anything", 1, "*", True),
        ("anything", 1, "", False),
        ("anything", 1, " , ,", False),
    ],
)
def test_no_proxy_matching(host, port, no_proxy, bypass):
    from cuforge.store.remote.proxy import bypasses

    assert bypasses(host, port, no_proxy) is bypass
