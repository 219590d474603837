"""RedisBackend against a real redis-server (started per test on 127.0.0.1, random port).
What every backend does (round trip, empty values, a killed server, one that never answers
or never accepts, bad URLs, close then reuse) is in test_remote_contract.py."""

from __future__ import annotations

import os
import threading
import time

import pytest

from cuforge.store.remote.base import RemoteError
from cuforge.store.remote.redis import RedisBackend
from tests.conftest import child_env, run_python
from tests.store.helpers import key_of


def backend(url: str, ns: str = "ns-test", timeout: float = 1.0, ttl: float = 0.0):
    return RedisBackend(url, namespace=ns, connect_timeout=0.5, timeout=timeout, ttl=ttl)


def test_namespaces_are_apart(redis_server):
    a = backend(redis_server.url, ns="cuforge-1-k1")
    b = backend(redis_server.url, ns="cuforge-2-k1")
    a.put("cubin", key_of(2), b"one")
    assert b.get("cubin", key_of(2)) is None
    assert a.get("cubin", key_of(2)) == b"one"


def test_ttl_is_set_when_asked(redis_server):
    raw = redis_server.client()
    backend(redis_server.url, ttl=30).put("cubin", key_of(3), b"x")
    ttl = raw.ttl(f"cuforge:ns-test:cubin:{key_of(3)}")
    assert 0 < ttl <= 30
    backend(redis_server.url, ttl=0.2).put("cubin", key_of(4), b"x")  # rounded up to 1 s
    assert 0 < raw.ttl(f"cuforge:ns-test:cubin:{key_of(4)}") <= 1
    backend(redis_server.url).put("cubin", key_of(5), b"x")
    assert raw.ttl(f"cuforge:ns-test:cubin:{key_of(5)}") == -1  # no expiry


def test_expired_entry_is_a_miss(redis_server):
    b = backend(redis_server.url, ttl=1)
    b.put("cubin", key_of(6), b"short-lived")
    assert b.get("cubin", key_of(6)) == b"short-lived"
    deadline = time.monotonic() + 10
    while b.get("cubin", key_of(6)) is not None:
        assert time.monotonic() < deadline, "redis never expired the entry"
        time.sleep(0.1)
    assert b.contains("cubin", key_of(6)) is False


def test_password(redis_server_password):
    server = redis_server_password
    b = backend(server.url)
    b.put("cubin", key_of(7), b"secret stuff")
    assert b.get("cubin", key_of(7)) == b"secret stuff"
    assert "s3cret-pw" not in b.describe() and "***" in b.describe()
    assert "s3cret-pw" not in repr(b)

    no_password = backend(server.url.replace(":s3cret-pw@", ""))
    with pytest.raises(RemoteError) as err:
        no_password.get("cubin", key_of(7))
    assert "127.0.0.1" in str(err.value)

    wrong = backend(server.url.replace("s3cret-pw", "wrong-pw"))
    with pytest.raises(RemoteError) as err:
        wrong.put("cubin", key_of(8), b"x")
    assert "wrong-pw" not in str(err.value)  # the URL in messages is redacted


def test_tls(redis_server_tls):
    server = redis_server_tls
    assert server.url.startswith("rediss://")
    # a certificate nobody vouches for is refused: TLS verifies by default
    with pytest.raises(RemoteError, match="certificate verify failed|CERTIFICATE_VERIFY"):
        backend(server.url).get("cubin", key_of(20))
    # told to trust it (a redis-py URL option), the round trip works over TLS
    trusted = backend(f"{server.url}?ssl_ca_certs={server.cert}")
    trusted.put("cubin", key_of(20), b"over tls")
    assert trusted.get("cubin", key_of(20)) == b"over tls"
    assert server.client().get(f"cuforge:ns-test:cubin:{key_of(20)}") == b"over tls"


def test_threads_share_one_client(redis_server):
    raw = redis_server.client()
    before = raw.info("stats")["total_connections_received"]
    b = backend(redis_server.url)
    failures: list[str] = []

    def work(t: int) -> None:
        for i in range(25):
            key = key_of(f"{t}-{i}")
            value = f"{t}:{i}".encode() * (i + 1)
            b.put("cubin", key, value)
            if b.get("cubin", key) != value:
                failures.append(key)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    # one pool: at most a connection per thread, reused across its 50 calls
    assert raw.info("stats")["total_connections_received"] - before <= 8


def test_forked_child_uses_its_own_connection(redis_server):
    b = backend(redis_server.url)
    b.put("cubin", key_of(9), b"before fork")
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit status
        try:
            ok = b.get("cubin", key_of(9)) == b"before fork"
            b.put("cubin", key_of(10), b"from child")
            os._exit(0 if ok else 1)
        except BaseException:  # noqa: BLE001 - any failure in the child is its exit status
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert b.get("cubin", key_of(10)) == b"from child"  # the parent's connection still works


def test_maxmemory_refuses_puts(redis_server):
    raw = redis_server.client()
    b = backend(redis_server.url)
    b.put("cubin", key_of("early"), b"stored before the limit")
    raw.config_set("maxmemory", "1mb")
    raw.config_set("maxmemory-policy", "noeviction")
    with pytest.raises(RemoteError) as err:
        for i in range(200):  # 200 x 64 KiB: far past 1 MiB
            b.put("cubin", key_of(i), os.urandom(64 * 1024))
    assert "OOM" in str(err.value) or "maxmemory" in str(err.value)
    assert b.get("cubin", key_of("early")) == b"stored before the limit"  # reads still work


def test_wrong_type_is_an_error(redis_server):
    redis_server.client().rpush(f"cuforge:ns-test:cubin:{key_of(11)}", b"a", b"b")
    with pytest.raises(RemoteError, match="WRONGTYPE|wrong kind"):
        backend(redis_server.url).get("cubin", key_of(11))


def test_redis_py_is_never_imported(redis_server):
    """cuforge speaks RESP itself: redis-py's import (~85 ms) is not paid, nor needed."""
    out = run_python(
        f"""
        import json, sys
        sys.modules["redis"] = None  # as if the package were not installed
        from cuforge.store.remote.redis import RedisBackend
        b = RedisBackend({redis_server.url!r}, namespace="n", connect_timeout=1, timeout=1)
        b.put("cubin", "k" * 64, b"v")
        print(json.dumps({{"got": b.get("cubin", "k" * 64).decode(),
                          "modules": sorted(m for m in sys.modules if m.startswith("redis"))}}))
        """,
        env=child_env(),
    )
    assert out == {"got": "v", "modules": ["redis"]}  # only the blocked None placeholder


def test_get_many_reads_a_batch_in_order(redis_server):
    raw = redis_server.client()
    b = backend(redis_server.url)
    big = os.urandom(700 * 1024)  # past the first read: the rest comes in GETRANGE chunks
    values = {key_of(f"m{i}"): f"value {i}".encode() for i in range(150)}  # three batches
    for key, value in values.items():
        b.put("cubin", key, value)
    b.put("cubin", key_of("big"), big)
    b.put("cubin", key_of("empty"), b"")
    items = [("cubin", k) for k in values] + [
        ("cubin", key_of("big")),
        ("cubin", key_of("absent")),
        ("cubin", key_of("empty")),
    ]
    calls = raw.info("stats")["total_commands_processed"]
    got = b.get_many(items)
    assert got[: len(values)] == list(values.values())
    assert bytes(got[-3]) == big and got[-2] is None and got[-1] == b""
    # 3 commands a key, pipelined, + the big value's GETRANGEs (+ INFO itself)
    assert raw.info("stats")["total_commands_processed"] - calls <= 3 * len(items) + 4


def test_an_unknown_url_option_is_refused_by_name(redis_server):
    with pytest.raises(RemoteError, match="unknown option 'sockettimeout'"):
        backend(redis_server.url + "?sockettimeout=3")
    with pytest.raises(RemoteError, match="ssl_cert_reqs"):
        backend(redis_server.url + "?ssl_cert_reqs=maybe")


def test_url_options_are_read_as_redis_py_reads_them():
    from cuforge.store.remote.redis import parse_url

    opts = parse_url("rediss://us%40er:p%3Aw@Cache.Example:6380/3?ssl_cert_reqs=none")
    assert (opts["host"], opts["port"], opts["db"]) == ("cache.example", 6380, 3)
    assert (opts["username"], opts["password"], opts["tls"]) == ("us@er", "p:w", True)
    assert opts["ssl_cert_reqs"] == "none"
    plain = parse_url("redis://:secret@127.0.0.1")
    assert (plain["port"], plain["db"], plain["username"], plain["password"]) == (
        6379,
        0,
        None,
        "secret",
    )
    assert plain["tls"] is False and plain["ssl_cert_reqs"] == "required"
    for bad, why in (
        ("redis://h/0?ssl_check_hostname=maybe", "ssl_check_hostname"),
        ("redis://h/x", "database number"),
        ("http://h/0", "redis://"),
    ):
        with pytest.raises(ValueError, match=why):
            parse_url(bad)


# -- issue 35 item 15: passwords never shown; TLS options only on rediss:// ----------------

#: URLs whose password the old redaction showed, whole or in part (the test checks that
#: neither half of the password, "Qx7" / "Zk9", appears)
LEAKY_URLS = [
    "redis://:Qx7/Zk9@127.0.0.1:1/0",  # a raw '/': the URL ends its host at ':Qx7'
    "redis://:Qx7@Zk9@127.0.0.1:1/0",  # a raw '@': the host is after the last one
    "redis://u:Qx7?Zk9@127.0.0.1:1/0",  # a raw '?'
    "redis://:Qx7#Zk9@127.0.0.1:1",  # a raw '#'
    "redis://Qx7Zk9@127.0.0.1:1/0",  # a user name alone (often a token)
    "redis://:Qx7Zk9@127.0.0.1:1/x",  # a bad db: the error shows the URL
    "redis://:Qx7Zk9@127.0.0.1:99999/0",  # a bad port
]


@pytest.mark.parametrize("url", LEAKY_URLS)
def test_a_password_is_never_shown(url, caplog):
    """A password with a raw '/', '?', '#' or '@' leaked into error messages (the port
    error quoted its first part) and describe()."""
    from cuforge.base.config import Settings
    from cuforge.store.remote import open_remotes

    shown = []
    try:
        b = backend(url, timeout=0.2)
    except RemoteError as exc:
        shown.append(str(exc))
    else:
        shown += [b.describe(), repr(b)]
        with pytest.raises(RemoteError) as err:  # nothing listens on port 1
            b.get("cubin", key_of(1))
        shown.append(str(err.value))
    with caplog.at_level("WARNING", logger="cuforge"):
        tiers = open_remotes(Settings({"CUFORGE_REMOTE": url}))
    shown += [t.stats().extra["url"] for t in tiers] + [caplog.text]
    for text in shown:
        assert "Qx7" not in text and "Zk9" not in text, text


@pytest.mark.parametrize(
    "option", ["ssl_ca_certs=/x.pem", "ssl_certfile=/c.pem", "ssl_cert_reqs=none"]
)
def test_tls_options_on_plain_redis_are_refused_by_name(option):
    """They were parsed and ignored: a URL that asked for a CA got no TLS at all."""
    name = option.partition("=")[0]
    with pytest.raises(RemoteError, match=f"'{name}' is a TLS option.*rediss://"):
        backend(f"redis://127.0.0.1:1/0?{option}")
    assert backend(f"rediss://127.0.0.1:1/0?{option}")  # where they mean something
