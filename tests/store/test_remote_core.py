"""The remote tier: envelope, signing, read-only mode, circuit breaker, plug-ins, wiring.

Backends here are real: the file backend on a real directory, and plug-in backends
loaded through ``CUFORGE_REMOTE_BACKEND`` (the real plug-in mechanism) from a module
written into the test's directory.
"""

from __future__ import annotations

import logging
import os
import sys
import textwrap

import pytest

import cuforge
from cuforge.base.config import settings
from cuforge.base.errors import ConfigError
from cuforge.store.base import Entry
from cuforge.store.remote import breaker as breaker_mod
from cuforge.store.remote import envelope, open_remotes
from cuforge.store.remote.envelope import Rejected, namespace, open_envelope, seal
from cuforge.store.remote.file import FileBackend
from cuforge.store.remote.tier import RemoteStore

from .helpers import key_of

KEY = b"team-secret"


def _entry(i: int = 1, kind: str = "kernel") -> Entry:
    return Entry(key_of(i), kind, os.urandom(3000), {"name": f"k{i}.cu", "compile_seconds": 0.5})


def _file_tier(tmp_path, **kw) -> RemoteStore:
    backend = FileBackend(
        f"file://{tmp_path / 'shared'}", namespace=namespace(), connect_timeout=0.1, timeout=1.0
    )
    (tmp_path / "shared").mkdir(exist_ok=True)
    return RemoteStore(backend, **kw)


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


# ---------------------------------------------------------------- envelope
def test_envelope_round_trip_signed_and_unsigned():
    e = _entry()
    ns = namespace()
    for secret in (None, KEY):
        obj, payload = open_envelope(seal(e, ns, secret), ns=ns, kind="kernel", key=e.key)
        assert payload == e.payload and obj["meta"]["name"] == "k1.cu"
    # a reader with the key accepts the signed value
    obj, payload = open_envelope(seal(e, ns, KEY), ns=ns, kind="kernel", key=e.key, secret=KEY)
    assert payload == e.payload
    assert ns.startswith("cuforge-") and "-k" in ns


def test_envelope_every_tampered_byte_is_rejected():
    e = _entry()
    ns = namespace()
    data = seal(e, ns, KEY)
    # every byte of the header and a spread of the body
    positions = list(range(0, 200)) + list(range(200, len(data), 97)) + [len(data) - 1]
    for pos in positions:
        bad = bytearray(data)
        bad[pos] ^= 0x01
        with pytest.raises(Rejected):
            open_envelope(bytes(bad), ns=ns, kind="kernel", key=e.key, secret=KEY)
    with pytest.raises(Rejected):
        open_envelope(data[:-1], ns=ns, kind="kernel", key=e.key)
    with pytest.raises(Rejected):
        open_envelope(b"garbage", ns=ns, kind="kernel", key=e.key)


def test_envelope_checks_namespace_kind_key_and_schema():
    e = _entry()
    ns = namespace()
    data = seal(e, ns)
    with pytest.raises(Rejected) as info:
        open_envelope(data, ns="cuforge-9.9.9-k9", kind="kernel", key=e.key)
    assert info.value.trust and "namespace" in info.value.reason
    with pytest.raises(Rejected):
        open_envelope(data, ns=ns, kind="object", key=e.key)
    with pytest.raises(Rejected):
        open_envelope(data, ns=ns, kind="kernel", key=key_of(2))
    # a well-digested, well-signed entry whose metadata breaks the schema
    bad = Entry(key_of(3), "kernel", b"x", {"compile_seconds": -1})
    with pytest.raises(Rejected) as info:
        open_envelope(seal(bad, ns, KEY), ns=ns, kind="kernel", key=bad.key, secret=KEY)
    assert "compile_seconds" in info.value.reason


def test_envelope_size_cap(monkeypatch):
    e = _entry()
    data = seal(e, namespace())
    monkeypatch.setattr(envelope, "MAX_VALUE_BYTES", len(data) - 1)
    with pytest.raises(Rejected) as info:
        open_envelope(data, ns=namespace(), kind="kernel", key=e.key)
    assert "cap" in info.value.reason


# ---------------------------------------------------------------- the tier, signing
def test_tier_round_trip_and_kind_hint(tmp_path):
    tier = _file_tier(tmp_path)
    e = _entry()
    assert tier.put(e)
    assert tier.get(e.key) is None  # no kind: a remote cannot look
    got = tier.get(e.key, kind="kernel")
    assert got == Entry(e.key, "kernel", e.payload, got.meta) and got.meta["name"] == "k1.cu"
    assert tier.get(e.key, kind="object") is None  # another kind's address
    assert tier.get(key_of(2), kind="kernel") is None
    st = tier.stats()
    assert (st.tier, st.hits, st.misses, st.puts, st.errors, st.rejected) == (
        "remote",
        1,
        2,
        1,
        0,
        0,
    )
    assert st.extra["breaker"] == "closed" and st.extra["url"].startswith("file://")


def test_signed_writer_signed_reader_hit(tmp_path):
    writer = _file_tier(tmp_path, secret=KEY)
    reader = _file_tier(tmp_path, secret=KEY)
    e = _entry()
    assert writer.put(e)
    assert reader.get(e.key, kind="kernel").payload == e.payload
    # an unsigned reader accepts the signed entry (digest still checked)
    assert _file_tier(tmp_path).get(e.key, kind="kernel").payload == e.payload


def test_signed_reader_refuses_unsigned_entry_with_one_warning(tmp_path, caplog):
    e1, e2 = _entry(1), _entry(2)
    unsigned = _file_tier(tmp_path)
    assert unsigned.put(e1) and unsigned.put(e2)
    reader = _file_tier(tmp_path, secret=KEY)
    with caplog.at_level(logging.WARNING, logger="cuforge"):
        for _ in range(3):
            assert reader.get(e1.key, kind="kernel") is None
            assert reader.get(e2.key, kind="kernel") is None
    st = reader.stats()
    assert st.rejected == 6 and st.misses == 6 and st.hits == 0 and st.errors == 0
    warned = _warnings(caplog)
    assert len(warned) == 1 and "unsigned" in warned[0] and "CUFORGE_REMOTE_KEY" in warned[0]
    assert reader.stats().extra["breaker"] == "closed"  # a refusal is not an outage


def test_wrong_key_is_refused(tmp_path, caplog):
    e = _entry()
    assert _file_tier(tmp_path, secret=b"other key").put(e)
    reader = _file_tier(tmp_path, secret=KEY)
    with caplog.at_level(logging.WARNING, logger="cuforge"):
        assert reader.get(e.key, kind="kernel") is None
    assert reader.stats().rejected == 1
    assert "bad signature" in _warnings(caplog)[0]


def test_tampered_file_is_an_error_and_a_miss(tmp_path, caplog):
    tier = _file_tier(tmp_path, secret=KEY)
    e = _entry()
    assert tier.put(e)
    path = tier.backend.path_for("kernel", e.key)
    data = bytearray(open(path, "rb").read())
    data[-100] ^= 0xFF
    with open(path, "wb") as f:
        f.write(data)
    with caplog.at_level(logging.WARNING, logger="cuforge"):
        assert tier.get(e.key, kind="kernel") is None
        assert tier.get(e.key, kind="kernel") is None
    st = tier.stats()
    assert st.errors == 2 and st.misses == 2 and st.rejected == 0
    assert len(_warnings(caplog)) == 1 and "damaged" in _warnings(caplog)[0]


def test_wrong_namespace_is_a_miss(tmp_path):
    e = _entry()
    old = FileBackend(
        f"file://{tmp_path / 'shared'}",
        namespace="cuforge-0.0.1-k0",
        connect_timeout=0.1,
        timeout=1.0,
    )
    (tmp_path / "shared").mkdir()
    assert RemoteStore(old).put(e)
    assert _file_tier(tmp_path).get(e.key, kind="kernel") is None
    # and a value of another namespace planted at our address is refused
    ours = _file_tier(tmp_path)
    path = ours.backend.path_for("kernel", e.key)
    os.makedirs(os.path.dirname(path))
    with open(path, "wb") as f:
        f.write(seal(e, "cuforge-0.0.1-k0"))
    assert ours.get(e.key, kind="kernel") is None and ours.stats().rejected == 1


def test_readonly_writes_nothing(tmp_path):
    tier = _file_tier(tmp_path, readonly=True)
    assert not tier.put(_entry())
    assert list((tmp_path / "shared").iterdir()) == []
    assert tier.stats().puts == 0 and tier.stats().extra["readonly"] is True


# ---------------------------------------------------------------- plug-ins and the breaker
PLUGIN = """
from cuforge.store.remote.base import RemoteBackend, RemoteError

CALLS = []
DATA = {}
DOWN = [False]


class Flaky(RemoteBackend):
    schemes = ("flaky",)

    def get(self, kind, key):
        CALLS.append(("get", kind, key))
        if DOWN[0]:
            raise ConnectionRefusedError("connection refused")
        return DATA.get((self.namespace, kind, key))

    def put(self, kind, key, data):
        CALLS.append(("put", kind, key))
        if DOWN[0]:
            raise RemoteError("server down")
        DATA[(self.namespace, kind, key)] = data


class NotABackend:
    schemes = ("flaky",)
"""


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    mod_dir = tmp_path / "plugins"
    mod_dir.mkdir()
    name = f"cuforge_test_plugin_{os.getpid()}_{abs(hash(str(tmp_path)))}"
    (mod_dir / f"{name}.py").write_text(textwrap.dedent(PLUGIN))
    monkeypatch.syspath_prepend(str(mod_dir))
    monkeypatch.setenv("CUFORGE_REMOTE", "flaky://team-cache")
    monkeypatch.setenv("CUFORGE_REMOTE_BACKEND", f"{name}:Flaky")
    yield name
    sys.modules.pop(name, None)


def test_plugin_backend_through_open_remotes(plugin):
    (tier,) = open_remotes(settings())
    module = sys.modules[plugin]
    e = _entry()
    assert tier.put(e) and tier.get(e.key, kind="kernel").payload == e.payload
    assert [c[0] for c in module.CALLS] == ["put", "get"]
    assert type(tier.backend).__name__ == "Flaky" and tier.backend.timeout == 1.0


def test_breaker_opens_warns_once_skips_then_probes_and_closes(plugin, monkeypatch, caplog):
    monkeypatch.setattr(breaker_mod, "BACKOFF_START", 0.2)
    (tier,) = open_remotes(settings())
    module = sys.modules[plugin]
    e = _entry()
    module.DOWN[0] = True
    with caplog.at_level(logging.WARNING, logger="cuforge"):
        for _ in range(3):
            assert tier.get(e.key, kind="kernel") is None
        assert len(module.CALLS) == 3 and tier.breaker.is_open
        for _ in range(1000):  # open: the remote is not called at all
            assert tier.get(e.key, kind="kernel") is None
            assert not tier.put(e)
        assert len(module.CALLS) == 3
    warned = _warnings(caplog)
    assert len(warned) == 1
    assert "flaky://team-cache" in warned[0] and "connection refused" in warned[0]
    assert "continuing without it" in warned[0]
    st = tier.stats()
    assert st.errors == 3 and st.extra["skipped"] == 2000 and st.extra["breaker"] == "open"

    # after the back-off one probe goes through; it fails: the back-off doubles
    import time

    time.sleep(0.25)
    assert tier.get(e.key, kind="kernel") is None
    assert tier.get(e.key, kind="kernel") is None  # refused again, no call
    assert len(module.CALLS) == 4 and tier.breaker.is_open

    # the remote comes back: the next probe succeeds and closes the breaker
    module.DOWN[0] = False
    time.sleep(0.45)
    assert tier.put(e)
    assert not tier.breaker.is_open
    assert tier.get(e.key, kind="kernel").payload == e.payload
    assert len(module.CALLS) == 6
    assert len(_warnings(caplog)) == 1  # still one warning for the whole process


def test_plugin_errors_name_the_variable(plugin, monkeypatch):
    monkeypatch.setenv("CUFORGE_REMOTE_BACKEND", f"{plugin}:NotABackend")
    with pytest.raises(ConfigError, match="CUFORGE_REMOTE_BACKEND.*module:Class"):
        open_remotes(settings())
    monkeypatch.setenv("CUFORGE_REMOTE_BACKEND", "no-colon")
    with pytest.raises(ConfigError, match="CUFORGE_REMOTE_BACKEND"):
        open_remotes(settings())
    monkeypatch.setenv("CUFORGE_REMOTE_BACKEND", "cuforge_no_such_module_x:Cls")
    with pytest.raises(ConfigError, match="cannot import"):
        open_remotes(settings())
    monkeypatch.delenv("CUFORGE_REMOTE_BACKEND")
    with pytest.raises(ConfigError, match="CUFORGE_REMOTE_BACKEND=module:Class"):
        open_remotes(settings())  # flaky:// with no plug-in


def test_key_file(tmp_path, monkeypatch):
    monkeypatch.setenv("CUFORGE_REMOTE", f"file://{tmp_path / 'shared'}")
    (tmp_path / "shared").mkdir()
    keyfile = tmp_path / "key"
    keyfile.write_text("  team-secret\n")
    monkeypatch.setenv("CUFORGE_REMOTE_KEY_FILE", str(keyfile))
    (tier,) = open_remotes(settings())
    assert tier.secret == KEY
    monkeypatch.setenv("CUFORGE_REMOTE_KEY_FILE", str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="CUFORGE_REMOTE_KEY_FILE"):
        open_remotes(settings())


# ---------------------------------------------------------------- wiring
def test_default_store_read_through_and_backfill(tmp_path, monkeypatch):
    from cuforge.store import telemetry
    from cuforge.store.disk import DiskStore
    from cuforge.store.memory import MemoryStore
    from cuforge.store.tiered import TieredStore

    (tmp_path / "shared").mkdir()
    monkeypatch.setenv("CUFORGE_REMOTE", f"file://{tmp_path / 'shared'}")
    monkeypatch.setenv("CUFORGE_CACHE_DIR", str(tmp_path / "a"))
    a = cuforge.default_cache().store
    assert isinstance(a, TieredStore)
    assert [t.tier for t in a.tiers] == ["memory", "disk", "remote"]
    e = _entry()
    assert a.put(e)

    monkeypatch.setenv("CUFORGE_CACHE_DIR", str(tmp_path / "b"))
    b = cuforge.default_cache().store
    assert b is not a
    mem, disk, remote = b.tiers
    assert b.get_with_tier(e.key) == (None, None)  # no kind: the remote is not asked
    got, tier = b.get_with_tier(e.key, kind="kernel")
    assert tier == "remote" and got.payload == e.payload
    assert isinstance(mem, MemoryStore) and e.key in mem  # back-filled
    assert isinstance(disk, DiskStore) and disk.get(e.key).payload == e.payload
    assert b.get_with_tier(e.key, kind="kernel")[1] == "memory"
    st = b.stats()
    assert st.extra["tiers"]["remote"]["hits"] == 1
    assert st.extra["tiers"]["remote"]["extra"]["url"].startswith("file://")
    tiers = telemetry.summary(str(tmp_path / "b"))["tiers"]
    assert tiers["remote"]["hits"] == 1 and tiers["remote"]["not_found"] == 0


def test_default_store_remotes_without_disk(tmp_path, monkeypatch):
    (tmp_path / "shared").mkdir()
    monkeypatch.setenv("CUFORGE_REMOTE", f"file://{tmp_path / 'shared'}")
    monkeypatch.setenv("CUFORGE_DISABLE_FILE_CACHE", "1")
    s = cuforge.default_cache().store
    assert [t.tier for t in s.tiers] == ["memory", "remote"]
    monkeypatch.setenv("CUFORGE_REMOTE_READONLY", "1")
    s = cuforge.default_cache().store
    assert s.tiers[1].readonly and not s.tiers[1].put(_entry())


def test_missing_builtin_backend_is_skipped_with_one_warning(tmp_path, monkeypatch, caplog):
    from cuforge.store import remote

    monkeypatch.setitem(remote.BUILTIN, "redis", "cuforge_no_such_backend_mod:RedisBackend")
    monkeypatch.setattr(remote, "_warned", set())
    monkeypatch.setenv("CUFORGE_REMOTE", "redis://:pw@127.0.0.1:1/0")
    with caplog.at_level(logging.WARNING, logger="cuforge"):
        assert open_remotes(settings()) == []
        assert open_remotes(settings()) == []
    warned = _warnings(caplog)
    # Redis needs no extra (cuforge speaks RESP itself): a missing module is a broken install
    assert len(warned) == 1 and "reinstall cuforge" in warned[0]
    assert "redis://:***@127.0.0.1:1/0" in warned[0] and "pw" not in warned[0]


def test_docstring_plugin_example_works(tmp_path, monkeypatch):
    """The plug-in example in open_remotes' docstring (copied into docs/remote.md) runs as shown."""
    import re

    from cuforge.store import remote

    doc = textwrap.dedent(remote.open_remotes.__doc__.split("::", 1)[1].split("\n\n    The")[0])
    name = f"cuforge_doc_plugin_{os.getpid()}"
    (tmp_path / f"{name}.py").write_text(doc)
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = re.search(r"CUFORGE_REMOTE_BACKEND=mycache:(\w+)", remote.open_remotes.__doc__)
    monkeypatch.setenv("CUFORGE_REMOTE", "mem://team")
    monkeypatch.setenv("CUFORGE_REMOTE_BACKEND", f"{name}:{spec.group(1)}")
    try:
        (tier,) = open_remotes(settings())
        e = _entry()
        assert tier.put(e) and tier.get(e.key, kind="kernel").payload == e.payload
    finally:
        sys.modules.pop(name, None)


# -- laziness: a local hit pays nothing for a configured remote ---------------------------

_LAZY_CHILD = """
    import json, sys
    from cuforge import default_cache
    from cuforge.store.base import Entry
    key, mode = sys.argv[1], sys.argv[2]
    store = default_cache().store
    if mode == "put":
        ok = store.put(Entry(key, "kernel", b"payload" * 100, {{"name": "lazy.cu"}}))
        print(json.dumps({{"ok": ok}}))
    else:
        entry, tier = store.get_with_tier(key, kind="kernel")
        tier_module = "cuforge.store.remote.tier" in sys.modules  # a local hit opens nothing
        store.stats()  # stats of every tier: must not connect either
        heavy = ("redis", "cuforge.store.remote.resp", "http.client", "urllib.parse", "hmac")
        print(json.dumps({{
            "tier": tier,
            "payload_ok": entry is not None and entry.payload == b"payload" * 100,
            "imported": [m for m in heavy if m in sys.modules],
            "tier_module": tier_module,
        }}))
"""


def _lazy_child(key: str, mode: str, env: dict) -> dict:
    import json
    import subprocess

    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_LAZY_CHILD.format()), key, mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_local_hit_with_redis_remote_imports_and_connects_nothing(tmp_path, redis_server):
    """A fresh process whose entry is on local disk gets the disk hit without importing
    the Redis client (or urllib / http.client / hmac) and without connecting to the server; a miss
    still reaches the remote and hits there."""
    pytest.importorskip("redis", reason="the 'redis' package (pip install 'cuforge[redis]')")
    from tests.conftest import child_env

    raw = redis_server.client()
    key = key_of("lazy")
    local = child_env(CUFORGE_CACHE_DIR=str(tmp_path / "a"), CUFORGE_REMOTE="")
    assert _lazy_child(key, "put", local)["ok"]  # on local disk only
    remote = child_env(CUFORGE_CACHE_DIR=str(tmp_path / "a"), CUFORGE_REMOTE=redis_server.url)
    before = raw.info("stats")["total_connections_received"]
    out = _lazy_child(key, "get", remote)
    assert out == {"tier": "disk", "payload_ok": True, "imported": [], "tier_module": False}
    assert raw.info("stats")["total_connections_received"] == before  # never connected

    # the remote still serves a miss: written through by one cache dir, read by another
    other = key_of("lazy-remote")
    assert _lazy_child(other, "put", remote)["ok"]
    fresh = child_env(CUFORGE_CACHE_DIR=str(tmp_path / "b"), CUFORGE_REMOTE=redis_server.url)
    got = _lazy_child(other, "get", fresh)
    assert got["tier"] == "remote" and got["payload_ok"]
    assert "cuforge.store.remote.resp" in got["imported"]  # cuforge's own client ...
    assert "redis" not in got["imported"]  # ... not redis-py
    assert raw.info("stats")["total_connections_received"] > before


def test_bad_redis_url_still_fails_when_the_tier_is_built(monkeypatch, caplog):
    """Checking the URL happens when the tier is built (a warning, the tier skipped), not
    on first use, though nothing is imported or connected then."""
    from cuforge.store import remote

    monkeypatch.setattr(remote, "_warned", set())
    monkeypatch.setenv("CUFORGE_REMOTE", "redis://127.0.0.1:6379/notanumber")
    with caplog.at_level(logging.WARNING, logger="cuforge"):
        assert open_remotes(settings()) == []
    assert any("database number" in w for w in _warnings(caplog))


def test_unimportable_client_turns_the_tier_off_with_one_warning(tmp_path, caplog):
    """A backend whose client library fails on first use (RemoteUnavailable): one warning,
    a miss, and no further calls (no breaker probes)."""
    from cuforge.store.remote.base import RemoteBackend, RemoteUnavailable

    calls = []

    class Broken(RemoteBackend):
        schemes = ("broken",)

        def get(self, kind, key):
            calls.append(key)
            raise RemoteUnavailable("the client library is missing; pip install it")

        def put(self, kind, key, data):
            calls.append(key)
            raise RemoteUnavailable("the client library is missing; pip install it")

    tier = RemoteStore(Broken("broken://x", namespace="n", connect_timeout=1, timeout=1))
    with caplog.at_level(logging.WARNING, logger="cuforge"):
        assert tier.get(key_of(1), kind="kernel") is None
        assert tier.get(key_of(2), kind="kernel") is None
        assert tier.put(_entry(3)) is False
    assert calls == [key_of(1)]
    warned = _warnings(caplog)
    assert len(warned) == 1 and "pip install it" in warned[0]
    st = tier.stats()
    assert st.errors == 1 and st.misses == 2 and "missing" in st.extra["unavailable"]
