"""s3:// against a real S3-protocol server process (moto's standalone server on 127.0.0.1,
started per test): what only the S3 backend does. The backend contract (round trip, empty
value, reconnect, server killed) is in test_remote_contract.py. Skips unless boto3 and
moto[server] are installed (``make test-s3``)."""

from __future__ import annotations

import os

import pytest

from cuforge.store.base import Entry
from cuforge.store.remote import open_remotes
from cuforge.store.remote.base import DamagedValue
from cuforge.store.remote.envelope import namespace
from cuforge.store.remote.tier import RemoteStore
from tests.s3_server import BUCKET, s3_server_fixture  # noqa: F401 - the fixture
from tests.store.helpers import key_of


def _backend(server, url: str | None = None, **kw):
    from cuforge.store.remote.s3 import S3Backend

    kw.setdefault("connect_timeout", 0.5)
    kw.setdefault("timeout", 2.0)
    return S3Backend(url or server.url(), namespace=namespace(), **kw)


def _entry(i: int) -> Entry:
    return Entry(key_of(i), "kernel", os.urandom(5000), {"name": f"k{i}.cu"})


def test_two_machines_share_through_the_bucket(s3_server):
    writer, reader = RemoteStore(_backend(s3_server)), RemoteStore(_backend(s3_server))
    e = _entry(1)
    assert writer.put(e)
    got = reader.get(e.key, kind="kernel")
    assert got is not None and got.payload == e.payload
    # where operators find it: <prefix>/<namespace>/<kind>/<key>
    head = s3_server.client().head_object(Bucket=BUCKET, Key=f"team/{namespace()}/kernel/{e.key}")
    assert head["ContentLength"] > len(e.payload)
    assert reader.get(key_of(2), kind="kernel") is None and reader.misses == 1


def test_read_only_and_the_usual_credential_chain(s3_server, monkeypatch, isolated_cache):
    """CUFORGE_REMOTE=s3://... through open_remotes, the endpoint from boto3's own variable
    (AWS_ENDPOINT_URL_S3), the credentials from the environment; read-only never writes."""
    from cuforge.base.config import settings

    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_server.endpoint)
    monkeypatch.setenv("CUFORGE_REMOTE", f"s3://{BUCKET}/ro")
    monkeypatch.setenv("CUFORGE_REMOTE_READONLY", "1")
    (tier,) = open_remotes(settings())
    assert tier.put(_entry(3)) is False
    monkeypatch.setenv("CUFORGE_REMOTE_READONLY", "0")
    (tier,) = open_remotes(settings())
    assert tier.put(_entry(3)) and tier.get(key_of(3), kind="kernel") is not None
    assert s3_server.client().list_objects_v2(Bucket=BUCKET, Prefix="ro/")["KeyCount"] == 1


def test_conditional_create(s3_server):
    b = _backend(s3_server)
    assert b.create("kernel", key_of(4), b"first") is True
    assert b.create("kernel", key_of(4), b"second") is False
    assert b.get("kernel", key_of(4)) == b"first"


def test_garbage_and_oversized_values(s3_server):
    client = s3_server.client()
    tier = RemoteStore(_backend(s3_server))
    client.put_object(Bucket=BUCKET, Key=f"team/{namespace()}/kernel/{key_of(5)}", Body=b"junk" * 9)
    assert tier.get(key_of(5), kind="kernel") is None
    assert tier.errors == 1 and tier.hits == 0
    small = _backend(s3_server, max_bytes=1000)
    client.put_object(
        Bucket=BUCKET, Key=f"team/{namespace()}/kernel/{key_of(6)}", Body=b"CUFR" + b"x" * 5000
    )
    with pytest.raises(DamagedValue, match="over the 1000-byte cap"):
        small.get("kernel", key_of(6))


def test_a_signed_only_reader(s3_server, tmp_path):
    pytest.importorskip("cryptography", reason="pip install 'cuforge[sign]'")
    from cuforge.base import signing

    ci = signing.SigningKey("ci", os.urandom(32))
    keyring = signing.parse_keyring(ci.public_line() + "\n")
    signed, unsigned = _entry(7), _entry(8)
    assert RemoteStore(_backend(s3_server), signer=ci).put(signed)
    assert RemoteStore(_backend(s3_server)).put(unsigned)
    reader = RemoteStore(_backend(s3_server), keyring=keyring)
    assert reader.get(signed.key, kind="kernel").meta["signer"] == "ci"
    assert reader.get(unsigned.key, kind="kernel") is None and reader.rejected == 1


def test_dead_endpoint_fails_open_fast(s3_server):
    tier = RemoteStore(_backend(s3_server, timeout=0.5, connect_timeout=0.2))
    s3_server.kill()
    assert tier.get(key_of(9), kind="kernel") is None
    assert tier.put(_entry(9)) is False  # the breaker is open after the failure
    assert tier.errors >= 1 and "127.0.0.1" in tier.last_error


def test_bad_urls():
    from cuforge.store.remote.base import RemoteError
    from cuforge.store.remote.s3 import S3Backend

    for url in ("s3:///prefix", "s3://bucket/p?color=red"):
        with pytest.raises(RemoteError, match="S3 URL"):
            S3Backend(url, namespace="n", connect_timeout=1, timeout=1)


def test_push_then_pull_through_the_bucket(s3_server, tmp_path):
    from cuforge.store.disk import DiskStore
    from cuforge.store.remote.sync import pull, push

    here, there = DiskStore(str(tmp_path / "a"), 1 << 30), DiskStore(str(tmp_path / "b"), 1 << 30)
    entries = [_entry(i) for i in (10, 11, 12)]
    for e in entries:
        assert here.put(e)
    assert push(here, RemoteStore(_backend(s3_server))).ok
    got = pull(there, RemoteStore(_backend(s3_server)))
    assert got.ok and got.copied == 3
    assert all(there.get(e.key).payload == e.payload for e in entries)


def test_a_slow_loris_endpoint_never_holds_a_get_past_its_timeout(scripted_server, monkeypatch):
    """Issue 35 item 8: the deadline was checked only between reads: an endpoint that
    trickles a byte every 0.05 s (each recv well within the read timeout) held a get 5.4 s
    against a 1 s timeout. Real boto3 against a real TCP server; no moto needed."""
    pytest.importorskip("boto3", reason="boto3 (make test-s3 installs it into .venv-s3)")
    import time

    from cuforge.store.remote.base import RemoteTimeout
    from cuforge.store.remote.s3 import S3Backend

    stop = time.monotonic() + 6

    def slow_loris(conn):
        from tests.remote_servers import read_request

        read_request(conn)
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n"
            b"Content-Type: application/octet-stream\r\n\r\n"
        )
        while time.monotonic() < stop:
            conn.sendall(b"x")
            time.sleep(0.05)

    server = scripted_server(slow_loris)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    b = S3Backend(
        f"s3://bucket/p?endpoint=http://127.0.0.1:{server.port}&region=us-east-1",
        namespace=namespace(),
        connect_timeout=1.0,
        timeout=1.0,
    )
    b.client()  # boto3's import and client setup are not the get
    started = time.monotonic()
    with pytest.raises(RemoteTimeout, match="CUFORGE_REMOTE_TIMEOUT"):
        b.get("kernel", key_of(1))
    took = time.monotonic() - started
    assert took < 1.6, took
