"""The tiered store, and the default cache's store and lock dir."""

from __future__ import annotations

import logging
import os

import cuforge.store as store_pkg
from cuforge import default_cache
from cuforge.store.base import Entry
from cuforge.store.disk import DiskStore
from cuforge.store.memory import MemoryStore
from cuforge.store.tiered import TieredStore

from .helpers import key_of


def default_store():
    return default_cache().store


def lock_dir():
    return default_cache().lock_dir


def _entry(i: int, size: int = 1000) -> Entry:
    return Entry(
        key_of(i), "kernel", os.urandom(size), {"name": f"k{i}.cu", "compile_seconds": 0.25}
    )


def test_roundtrip_and_promotion(tmp_path):
    mem, disk = MemoryStore(1 << 20), DiskStore(str(tmp_path / "c"), 1 << 30)
    store = TieredStore([mem, disk])
    e = _entry(1)
    assert store.get_with_tier(e.key) == (None, None)
    assert store.put(e)
    assert mem.get(e.key) is not None and disk.get(e.key) is not None
    mem.delete(e.key)

    got, tier = store.get_with_tier(e.key)
    assert tier == "disk" and got.payload == e.payload and got.meta["name"] == "k1.cu"
    assert key_of(1) in mem  # promoted
    got2, tier2 = store.get_with_tier(e.key)
    assert tier2 == "memory" and got2.payload == e.payload
    assert store.get(e.key).payload == e.payload

    st = store.stats()
    assert st.tier == "tiered" and st.hits == 3 and st.misses == 1 and st.puts == 1
    assert st.entries == 1 and st.bytes == disk.total_bytes()
    assert set(st.extra["tiers"]) == {"memory", "disk"}
    assert [s.tier for s in (t.stats() for t in store.tiers)] == ["memory", "disk"]

    assert [i.key for i in store.iterate()] == [e.key]
    assert store.delete(e.key)
    assert store.get(e.key) is None and disk.get(e.key) is None


def test_memory_hits_reach_telemetry(tmp_path):
    from cuforge.store import telemetry

    root = str(tmp_path / "c")
    store = TieredStore([MemoryStore(1 << 20), DiskStore(root, 1 << 30)])
    e = _entry(1)
    store.put(e)
    for _ in range(5):
        store.get(e.key)
    store.get(key_of(99))
    summary = telemetry.summary(root)
    assert summary["tiers"]["memory"]["hits"] == 5
    # the miss of key_of(99) reached both tiers (not_found in each) and is one miss
    assert summary["tiers"]["memory"]["not_found"] == 1
    assert summary["tiers"]["disk"]["not_found"] == 1
    assert summary["lookups"]["hits"] == 5 and summary["lookups"]["misses"] == 1
    assert abs(summary["seconds_saved"] - 5 * 0.25) < 1e-9
    assert summary["top"][0]["name"] == "k1.cu" and summary["top"][0]["hits"] == 5


def test_default_store_follows_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("CUFORGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("CUFORGE_DISABLE_CACHE", raising=False)
    monkeypatch.delenv("CUFORGE_DISABLE_FILE_CACHE", raising=False)
    monkeypatch.setenv("CUFORGE_CACHE_MAX_BYTES", "64M")
    s = default_store()
    assert isinstance(s, TieredStore)
    mem, disk = s.tiers
    assert isinstance(mem, MemoryStore) and isinstance(disk, DiskStore)
    assert disk.root == str(tmp_path / "cache") and disk.max_bytes == 64 << 20
    assert default_store() is s  # memoized
    assert lock_dir() == str(tmp_path / "cache" / "locks")

    monkeypatch.setenv("CUFORGE_VERBOSE", "1")  # does not shape the store: same object
    assert default_store() is s

    monkeypatch.setenv("CUFORGE_DISABLE_FILE_CACHE", "1")
    m = default_store()
    assert isinstance(m, MemoryStore) and lock_dir() is None

    monkeypatch.setenv("CUFORGE_DISABLE_CACHE", "1")
    assert default_store() is None and lock_dir() is None

    monkeypatch.delenv("CUFORGE_DISABLE_CACHE")
    monkeypatch.delenv("CUFORGE_DISABLE_FILE_CACHE")
    monkeypatch.setenv("CUFORGE_CACHE_DIR", str(tmp_path / "other"))
    s2 = default_store()
    assert isinstance(s2, TieredStore) and s2.tiers[1].root == str(tmp_path / "other")


def test_default_store_is_cheap_when_unchanged(tmp_path, monkeypatch):
    import time

    monkeypatch.setenv("CUFORGE_CACHE_DIR", str(tmp_path / "cache"))
    default_store()
    n = 20_000
    t0 = time.perf_counter()
    for _ in range(n):
        default_store()
    per_call = (time.perf_counter() - t0) / n
    assert per_call < 20e-6, per_call  # ~100 ns on a quiet machine; generous for CI noise


def test_default_store_with_unusable_dir_works_in_memory(tmp_path, monkeypatch, caplog):
    bad = f"/proc/cuforge-test-{os.getpid()}-{tmp_path.name}/cache"
    monkeypatch.setenv("CUFORGE_CACHE_DIR", bad)
    with caplog.at_level(logging.WARNING, logger="cuforge"):
        s = default_store()
        e = _entry(1)
        assert s.put(e)  # the memory tier took it
        assert s.get_with_tier(e.key)[1] == "memory"
        s.put(_entry(2))
    warnings = [r for r in caplog.records if "disk cache disabled" in r.getMessage()]
    assert len(warnings) == 1
    assert bad.split("/cache")[0] in warnings[0].getMessage()
    assert "CUFORGE_CACHE_DIR" in warnings[0].getMessage()


def test_lazy_reexports():
    assert store_pkg.MemoryStore is MemoryStore
    assert store_pkg.DiskStore is DiskStore
    assert store_pkg.TieredStore is TieredStore
    assert store_pkg.Entry is Entry
    import types

    # the package attribute is the submodule (the _CallableModule trick is gone, issue 8),
    # before and after the submodule is imported by name
    assert isinstance(store_pkg.single_flight, types.ModuleType)
    from cuforge.store.single_flight import single_flight

    assert store_pkg.single_flight.single_flight is single_flight
    with store_pkg.single_flight.single_flight(None, key_of(1), 1.0) as acquired:
        assert acquired
    with single_flight(None, key_of(1), 1.0) as acquired:
        assert acquired
    assert store_pkg.DISK_FORMAT_VERSION == 1


def test_remote_hit_backfills_local_tiers_only(tmp_path):
    """A hit in the second remote lands in memory and on disk, not in the first remote."""
    from cuforge.store.remote.envelope import namespace
    from cuforge.store.remote.file import FileBackend
    from cuforge.store.remote.tier import RemoteStore

    remotes = []
    for name in ("r1", "r2"):
        (tmp_path / name).mkdir()
        backend = FileBackend(
            f"file://{tmp_path / name}", namespace=namespace(), connect_timeout=0.1, timeout=1
        )
        remotes.append(RemoteStore(backend))
    mem, disk = MemoryStore(1 << 20), DiskStore(str(tmp_path / "c"), 1 << 30)
    store = TieredStore([mem, disk, *remotes])
    e = _entry(1)
    assert remotes[1].put(e)
    assert store.get_with_tier(e.key) == (None, None)  # no kind hint: remotes answer None
    got, tier = store.get_with_tier(e.key, kind="kernel")
    assert tier == "remote" and got.payload == e.payload
    assert e.key in mem and disk.get(e.key).payload == e.payload
    assert remotes[0].get(e.key, kind="kernel") is None  # no remote write on a read
    assert store.get(e.key, kind="kernel") is got  # now a memory hit
    st = store.stats()
    assert list(st.extra["tiers"]) == ["memory", "disk", "remote", "remote#2"]
    assert st.extra["tiers"]["remote#2"]["hits"] == 1
    assert st.entries == 1 and st.bytes == disk.total_bytes()  # the local tiers' size
    assert store.put(_entry(2))
    assert remotes[0].get(key_of(2), kind="kernel") is not None  # puts write through
