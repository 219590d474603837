"""The disk tier: real files, real processes, real (tmpfs / read-only) mounts."""

from __future__ import annotations

import logging
import os
import stat
import time

import pytest

from cuforge.store.base import Entry
from cuforge.store.disk import DISK_FORMAT_VERSION, DiskStore, decode_entry, encode_entry

from .helpers import child_env, finish, key_of, mount, run_child, spawn, umount

META = {
    "name": "saxpy.cu",
    "arch": "sm_90",
    "backend": "nvrtc",
    "lowered_names": {"block_sum<256, float>": "_Z9block_sumILi256EfEvPf"},
    "log": "warning: something\n",
    "key_fields": {"source": "abc", "arch": "sm_90"},  # KeyBuilder.fields: a dict
    "compile_seconds": 0.2,
}


def _entry(i: int, size: int = 1000, kind: str = "kernel", **meta) -> Entry:
    return Entry(key_of(i), kind, os.urandom(size), {**META, "name": f"k{i}.cu", **meta})


def _files(store: DiskStore) -> dict[str, int]:
    return {k: st.st_size for k, _path, st in store.walk()}


def _set_last_used(store: DiskStore, key: str, when: float) -> None:
    os.utime(store.path_for(key), (when, when))


def _cuforge_warnings(caplog, text: str) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name == "cuforge" and text in r.getMessage()
    ]


# ---------------------------------------------------------------------- basics
def test_roundtrip_layout_and_mode(tmp_path):
    root = tmp_path / "cache"
    store = DiskStore(str(root), 1 << 30)
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o700
    e = _entry(1, 5000)
    assert store.get(e.key) is None
    assert store.put(e)
    path = store.path_for(e.key)
    assert path == str(root / "v1" / "entries" / e.key[:2] / e.key[2:4] / e.key)
    assert os.path.isfile(path)
    assert not [n for n in os.listdir(os.path.dirname(path)) if n.startswith(".tmp")]

    got = store.get(e.key)
    assert got.key == e.key and got.kind == "kernel" and got.payload == e.payload
    for field, value in e.meta.items():
        assert got.meta[field] == value
    assert got.meta["size"] == 5000
    assert got.meta["created"] <= got.meta["last_used"] <= time.time()

    # a fresh instance (another process, in effect) sees it too
    again = DiskStore(str(root), 1 << 30).get(e.key)
    assert again.payload == e.payload and again.meta["lowered_names"] == META["lowered_names"]

    assert store.delete(e.key) and not store.delete(e.key)
    assert store.get(e.key) is None and not os.path.exists(path)


def test_entry_file_format_is_versioned_and_has_no_pickle(tmp_path):
    store = DiskStore(str(tmp_path), 1 << 30)
    e = _entry(1)
    store.put(e)
    raw = open(store.path_for(e.key), "rb").read()
    assert raw[:4] == b"CUFG" and int.from_bytes(raw[4:8], "little") == DISK_FORMAT_VERSION
    assert b'"lowered_names"' in raw and b"\x80\x04" not in raw[:64]  # JSON, no pickle
    header, payload = decode_entry(raw)
    assert header["key"] == e.key and payload == e.payload
    assert decode_entry(encode_entry(e))[1] == e.payload


def test_put_replaces_and_index_tracks_it(tmp_path):
    store = DiskStore(str(tmp_path), 1 << 30)
    store.put(_entry(1, 100))
    store.put(Entry(key_of(1), "kernel", b"z" * 7000, {"name": "k1.cu"}))
    assert store.get(key_of(1)).payload == b"z" * 7000
    assert store.total_bytes() == sum(_files(store).values())
    assert store.stats().entries == 1


def test_hit_refreshes_last_used(tmp_path):
    store = DiskStore(str(tmp_path), 1 << 30)
    e = _entry(1)
    store.put(e)
    _set_last_used(store, e.key, 1_000_000.0)
    store.get(e.key)
    assert os.stat(store.path_for(e.key)).st_mtime > time.time() - 60
    # peek does not count as a use
    _set_last_used(store, e.key, 1_000_000.0)
    assert store.peek(e.key).payload == e.payload
    assert os.stat(store.path_for(e.key)).st_mtime == 1_000_000.0


def test_invalid_key_is_rejected(tmp_path):
    store = DiskStore(str(tmp_path), 1 << 30)
    for bad in ("", "../../etc", ".hidden", "a/b"):
        with pytest.raises(ValueError):
            store.path_for(bad)


# ---------------------------------------------------------------------- damage
@pytest.mark.parametrize(
    "damage",
    ["truncate", "truncate_header", "flip_payload", "flip_meta", "flip_checksum", "empty", "junk"],
)
def test_damaged_entry_is_a_miss_deleted_and_warned(tmp_path, caplog, damage):
    store = DiskStore(str(tmp_path), 1 << 30)
    e = _entry(1, 4000)
    store.put(e)
    path = store.path_for(e.key)
    raw = bytearray(open(path, "rb").read())
    if damage == "truncate":
        raw = raw[: len(raw) // 2]
    elif damage == "truncate_header":
        raw = raw[:10]
    elif damage == "flip_payload":
        raw[-100] ^= 0x01
    elif damage == "flip_meta":
        raw[25] ^= 0x20
    elif damage == "flip_checksum":
        raw[-1] ^= 0xFF
    elif damage == "empty":
        raw = bytearray()
    elif damage == "junk":
        raw = bytearray(os.urandom(len(raw)))
    with open(path, "wb") as f:
        f.write(raw)

    with caplog.at_level(logging.WARNING, logger="cuforge"):
        assert store.get(e.key) is None
    assert not os.path.exists(path)
    warned = _cuforge_warnings(caplog, "damaged")
    assert len(warned) == 1 and e.key in warned[0]
    assert store.stats().corrupt == 1
    assert store.stats().entries == 0  # the index forgot it too
    # and it is simply rebuilt
    assert store.put(e) and store.get(e.key).payload == e.payload


def test_entry_under_the_wrong_name_is_not_served(tmp_path, caplog):
    store = DiskStore(str(tmp_path), 1 << 30)
    a, b = _entry(1), _entry(2)
    store.put(a)
    os.makedirs(os.path.dirname(store.path_for(b.key)), exist_ok=True)
    os.replace(store.path_for(a.key), store.path_for(b.key))
    with caplog.at_level(logging.WARNING, logger="cuforge"):
        assert store.get(b.key) is None
    assert _cuforge_warnings(caplog, "another key")


def test_verify_finds_and_repairs(tmp_path, caplog):
    store = DiskStore(str(tmp_path), 1 << 30)
    entries = [_entry(i) for i in range(6)]
    for e in entries:
        store.put(e)
    flipped, truncated = entries[1].key, entries[4].key
    with open(store.path_for(flipped), "r+b") as f:
        f.seek(-50, os.SEEK_END)
        byte = f.read(1)
        f.seek(-50, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0x10]))
    with open(store.path_for(truncated), "r+b") as f:
        f.truncate(100)

    quick = store.verify(quick=True)  # header/size/meta only: finds the truncation
    assert quick.checked == 6 and quick.corrupt == [truncated]
    report = store.verify()
    assert report.checked == 6 and sorted(report.corrupt) == sorted([flipped, truncated])
    assert report.repaired == 0 and os.path.exists(store.path_for(flipped))  # report only

    repaired = store.verify(repair=True)
    assert sorted(repaired.corrupt) == sorted([flipped, truncated]) and repaired.repaired == 2
    assert not os.path.exists(store.path_for(flipped))
    assert not os.path.exists(store.path_for(truncated))
    clean = store.verify()
    assert clean.checked == 4 and clean.corrupt == [] and clean.index_drift == 0
    assert store.stats().entries == 4 and store.total_bytes() == sum(_files(store).values())


# ---------------------------------------------------------------------- index / stats
def test_stats_come_from_the_index(tmp_path):
    store = DiskStore(str(tmp_path), 1 << 30)
    for i in range(20):
        store.put(_entry(i, 100 * (i + 1), kind="kernel" if i % 2 else "manifest"))
    for i in range(5):
        store.delete(key_of(i))
    st = store.stats()
    files = _files(store)
    assert st.entries == len(files) == 15
    assert st.bytes == sum(files.values()) == store.total_bytes()
    assert st.extra["kinds"]["kernel"]["entries"] + st.extra["kinds"]["manifest"]["entries"] == 15
    assert st.extra["format_version"] == DISK_FORMAT_VERSION
    assert st.puts == 20 and st.misses == 0
    # another instance (as another process would) reads the same index
    other = DiskStore(str(tmp_path), 1 << 30)
    assert other.stats().entries == 15 and other.total_bytes() == st.bytes


def test_index_is_rebuilt_when_missing(tmp_path):
    store = DiskStore(str(tmp_path), 1 << 30)
    for i in range(10):
        store.put(_entry(i))
    os.unlink(store.journal.path)
    fresh = DiskStore(str(tmp_path), 1 << 30)
    assert fresh.stats().entries == 10
    assert fresh.total_bytes() == sum(_files(fresh).values())
    fresh.put(_entry(10))  # appends to the rebuilt journal
    assert DiskStore(str(tmp_path), 1 << 30).stats().entries == 11


def test_index_is_compacted(tmp_path):
    store = DiskStore(str(tmp_path), 1 << 30)
    e = Entry(key_of(1), "kernel", b"x" * 10, {"name": "a.cu"})
    line = f"P\t{e.key}\t99\t1.0\tkernel\ta.cu\t"  # as put() writes it
    store.put(e)
    store.journal_append([line] * 5000)  # 5000 dead lines for one live entry
    store.put(e)
    assert store.stats().entries == 1
    with open(store.journal.path) as f:
        lines = f.read().splitlines()
    assert len(lines) <= 3, lines[:5]
    assert store.total_bytes() == sum(_files(store).values())


def test_many_processes_put_and_get(tmp_path):
    root = str(tmp_path / "cache")
    code = f"""
        import json, os, sys, hashlib
        from cuforge.store.disk import DiskStore
        from cuforge.store.base import Entry
        store = DiskStore({root!r}, 1 << 30)
        me = int(sys.argv[1]) if len(sys.argv) > 1 else int(os.environ["WORKER"])
        bad = 0
        for i in range(60):
            shared = i % 10                      # keys every worker writes
            own = 1000 * (me + 1) + i            # keys only this worker writes
            for n in (shared, own):
                key = hashlib.sha256(str(n).encode()).hexdigest()
                payload = hashlib.sha512(str(n).encode()).digest() * (50 + n % 7)
                store.put(Entry(key, "kernel", payload, {{"name": f"k{{n}}.cu"}}))
                got = store.get(key)
                if got is None or got.payload != payload:
                    bad += 1
        print(json.dumps({{"bad": bad}}))
    """
    procs = [spawn(code, child_env(WORKER=str(w))) for w in range(6)]
    results = [finish(p) for p in procs]
    assert all(r["bad"] == 0 for r in results), results
    store = DiskStore(root, 1 << 30)
    report = store.verify()
    assert report.corrupt == [] and report.checked == 10 + 6 * 60
    assert report.index_drift == 0
    assert store.stats().entries == 10 + 6 * 60
    assert store.total_bytes() == sum(_files(store).values())
    leftovers = [n for n in os.listdir(os.path.dirname(store.journal.path)) if ".tmp" in n]
    assert not leftovers


# ---------------------------------------------------------------------- eviction / prune
def test_eviction_keeps_tier_under_cap_removing_lru_first(tmp_path):
    probe = DiskStore(str(tmp_path / "probe"), 1 << 30)
    probe.put(_entry(0, 10_000))
    size = probe.total_bytes()  # one entry file's size

    cap = size * 10 + size // 2  # room for 10 entries
    store = DiskStore(str(tmp_path / "cache"), cap)
    base = time.time() - 10_000
    for i in range(10):
        assert store.put(_entry(i, 10_000))
        _set_last_used(store, key_of(i), base + i)  # 0 oldest ... 9 newest
    _set_last_used(store, key_of(0), base + 100)  # 0 was used recently: now the newest
    assert store.total_bytes() <= cap

    store.put(_entry(10, 10_000))  # over the cap: evict to 90% of it
    left = set(_files(store))
    assert store.total_bytes() <= cap * 0.9
    assert sum(_files(store).values()) == store.total_bytes()
    gone = {key_of(i) for i in range(11)} - left
    assert gone == {key_of(1), key_of(2)}  # the least recently used, and only those
    assert key_of(0) in left and key_of(10) in left
    assert store.stats().evictions == 2


def test_eviction_from_another_process_respects_cap(tmp_path):
    root = str(tmp_path / "cache")
    cap = 200_000
    code = f"""
        import json, os
        from cuforge.store.disk import DiskStore
        from cuforge.store.base import Entry
        import hashlib
        store = DiskStore({root!r}, {cap})
        w = os.environ["WORKER"]
        for i in range(40):
            key = hashlib.sha256(f"{{w}}-{{i}}".encode()).hexdigest()
            store.put(Entry(key, "kernel", os.urandom(5000), {{}}))
        print(json.dumps({{"total": store.total_bytes()}}))
    """
    procs = [spawn(code, child_env(WORKER=str(w))) for w in range(4)]
    for p in procs:
        finish(p)
    store = DiskStore(root, cap)
    actual = sum(_files(store).values())
    assert actual <= cap
    assert store.total_bytes() == actual


def test_prune_older_than_and_max_bytes(tmp_path):
    store = DiskStore(str(tmp_path), 1 << 30)
    now = time.time()
    for i in range(10):
        store.put(_entry(i, 2000))
    for i in range(3):
        _set_last_used(store, key_of(i), now - 40 * 86400)  # unused for 40 days
    for i in range(3, 10):
        _set_last_used(store, key_of(i), now - 100 + i)

    removed, freed = store.prune(older_than=30 * 86400)
    assert removed == 3 and freed > 6000
    assert {key_of(i) for i in range(3)}.isdisjoint(_files(store))

    sizes = _files(store)
    newest4 = sum(sizes[key_of(i)] for i in range(6, 10))
    removed, freed = store.prune(max_bytes=newest4)
    assert removed == 3 and store.total_bytes() == newest4
    assert set(_files(store)) == {key_of(i) for i in range(6, 10)}  # the newest stay
    assert store.prune(max_bytes=1 << 30, older_than=30 * 86400) == (0, 0)


def _copy_entries_in(source: DiskStore, target: DiskStore) -> None:
    """Copy ``source``'s entry files into ``target``'s entries dir as ``cp -a`` would
    (times kept), behind ``target``'s index."""
    import shutil

    shutil.copytree(source.layout.entries, target.layout.entries, dirs_exist_ok=True)


def test_entries_copied_in_by_hand_are_counted_by_stats_and_capped_by_prune(tmp_path):
    # issue 35 item 10: 100,000 entries copied into v1/entries/ were "2 entries, 4.6 KiB",
    # and `prune --max-bytes 1M` removed nothing: both read the journal only
    store = DiskStore(str(tmp_path / "c"), 1 << 30)
    for i in range(2):
        store.put(_entry(i, 1000))
    donor = DiskStore(str(tmp_path / "donor"), 1 << 30)
    with donor.bulk(durable=False):
        for i in range(2, 302):
            donor.put(_entry(i, 1000))
    time.sleep(0.05)  # past the file times' tick after the last journal write
    _copy_entries_in(donor, store)
    on_disk = _files(store)
    assert len(on_disk) == 302

    fresh = DiskStore(str(tmp_path / "c"), 1 << 30)  # another process: reads the journal
    st = fresh.stats()
    assert st.entries == 302 and st.bytes == sum(on_disk.values())
    shards = {k[:4] for k in on_disk if k not in (key_of(0), key_of(1))}
    there = sum(1 for k in on_disk if k[:4] in shards)
    listed = sum(1 for k in (key_of(0), key_of(1)) if k[:4] in shards)
    assert st.extra["index_rebuilt"] == (
        f"{len(shards)} fan-out dirs changed behind it: {there} entry files there, "
        f"the index lists {listed}"
    )
    # rebuilt once: the journal now lists them, and the next stats says nothing
    again = DiskStore(str(tmp_path / "c"), 1 << 30)
    assert again.index_drift() is None
    assert again.stats().extra["index_rebuilt"] is None and again.stats().entries == 302

    # prune enforces the cap on what is on disk, also straight after a copy
    _copy_entries_in(donor, DiskStore(str(tmp_path / "d"), 1 << 30))
    pruner = DiskStore(str(tmp_path / "d"), 1 << 30)  # no stats first: prune alone
    cap = 50 * max(on_disk.values())
    removed, freed = pruner.prune(max_bytes=cap)
    left = _files(pruner)
    assert removed == 300 - len(left) and removed >= 250
    assert sum(left.values()) <= cap and freed > 0
    assert pruner.stats().entries == len(left)


def test_index_drift_ignores_what_is_never_an_entry(tmp_path):
    store = DiskStore(str(tmp_path), 1 << 30)
    store.put(_entry(1))
    shard = os.path.dirname(store.path_for(key_of(1)))
    (tmp_path / "v1" / "entries" / "zz" / "zz").mkdir(parents=True)
    (tmp_path / "v1" / "entries" / "zz" / "zz" / "notes.txt").write_text("x")
    open(os.path.join(shard, key_of(2)), "w").close()  # a key in another key's dir
    os.makedirs(os.path.dirname(store.path_for(key_of(3))))
    os.mkfifo(store.path_for(key_of(3)))  # not a regular file: damage, not an entry
    assert store.index_drift() is None
    time.sleep(0.05)  # past the file times' tick (a kernel tick: up to 10 ms)
    os.unlink(store.path_for(key_of(1)))  # removed behind the index's back
    assert store.index_drift() == (
        "1 fan-out dir changed behind it: 0 entry files there, the index lists 1"
    )
    store.rebuild_index()
    assert store.index_drift() is None
    # a fan-out dir removed whole, and an entry copied into a dir that has one already
    os.unlink(os.path.join(shard, key_of(2)))
    store.put(_entry(1))
    store.put(_entry(4))
    time.sleep(0.05)
    import shutil

    shutil.rmtree(os.path.dirname(store.path_for(key_of(4))))
    twin = key_of(1)[:4] + "f" * 60  # a key in entry 1's dir
    shutil.copy2(store.path_for(key_of(1)), os.path.join(shard, twin))
    assert store.index_drift() == (
        "2 fan-out dirs changed behind it: 2 entry files there, the index lists 2"
    )


def test_clear(tmp_path):
    store = DiskStore(str(tmp_path), 1 << 30)
    for i in range(7):
        store.put(_entry(i))
    assert store.clear() == 7
    assert _files(store) == {} and store.stats().entries == 0 and store.total_bytes() == 0
    assert store.put(_entry(1)) and store.stats().entries == 1


def test_iterate(tmp_path):
    store = DiskStore(str(tmp_path), 1 << 30)
    for i in range(4):
        store.put(_entry(i, kind="object" if i == 3 else "kernel"))
    infos = {i.key: i for i in store.iterate()}
    assert set(infos) == {key_of(i) for i in range(4)}
    info = infos[key_of(3)]
    assert info.kind == "object" and info.meta["name"] == "k3.cu" and info.meta["arch"] == "sm_90"
    assert info.size == os.path.getsize(store.path_for(key_of(3)))
    assert info.created <= info.last_used + 1
    fast = {i.key: i for i in store.iterate_index()}
    assert set(fast) == set(infos) and fast[key_of(3)].meta["name"] == "k3.cu"


# ---------------------------------------------------------------------- bad disks
def test_uncreatable_dir_under_proc(tmp_path, caplog):
    root = f"/proc/cuforge-test-{os.getpid()}-{tmp_path.name}"
    with caplog.at_level(logging.WARNING, logger="cuforge"):
        store = DiskStore(root, 1 << 30)
        assert store.disabled
        assert not store.put(_entry(1)) and not store.put(_entry(2))
        assert store.get(key_of(1)) is None
        store.stats()
        store.verify()
        assert store.prune(max_bytes=0) == (0, 0)
        DiskStore(root, 1 << 30).put(_entry(3))  # same dir again: no second warning
    warned = _cuforge_warnings(caplog, "disk cache disabled")
    assert len(warned) == 1
    assert root in warned[0] and "CUFORGE_CACHE_DIR" in warned[0]


def test_parent_is_a_regular_file(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    root = str(blocker / "cache")
    with caplog.at_level(logging.WARNING, logger="cuforge"):
        store = DiskStore(root, 1 << 30)
        assert store.disabled and not store.put(_entry(1)) and store.get(key_of(1)) is None
    assert len(_cuforge_warnings(caplog, "disk cache disabled")) == 1


def test_read_only_cache_dir_serves_hits_and_warns_once(tmp_path, caplog):
    root = tmp_path / "ro"
    root.mkdir()
    store = DiskStore(str(root), 1 << 30)
    e = _entry(1)
    store.put(e)
    why = mount(["--bind", str(root), str(root)])
    if why:
        pytest.skip(f"cannot make a read-only bind mount: {why}")
    try:
        why = mount(["-o", "remount,ro,bind", str(root)])
        if why:
            pytest.skip(f"cannot remount read-only: {why}")
        with pytest.raises(OSError):
            open(root / "probe", "w").close()  # really read-only, even for root
        with caplog.at_level(logging.WARNING, logger="cuforge"):
            ro = DiskStore(str(root), 1 << 30)
            got = ro.get(e.key)  # existing entries still serve
            assert got is not None and got.payload == e.payload
            assert not ro.put(_entry(2))
            assert ro.disabled
            assert not ro.put(_entry(3))
            assert ro.stats().entries == 1
        warned = _cuforge_warnings(caplog, "disk cache disabled")
        assert len(warned) == 1 and str(root) in warned[0]
    finally:
        umount(str(root))


def test_full_disk_warns_once_and_never_crashes(tmp_path, caplog):
    mnt = tmp_path / "small"
    mnt.mkdir()
    why = mount(["-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)])
    if why:
        pytest.skip(f"cannot mount a small tmpfs to fill (needs CAP_SYS_ADMIN): {why}")
    try:
        store = DiskStore(str(mnt / "cache"), 1 << 30)  # the cap is not what stops it
        stored = []
        with caplog.at_level(logging.WARNING, logger="cuforge"):
            for i in range(40):
                e = _entry(i, 20_000)
                if store.put(e):
                    stored.append(e)
        assert store.disabled and 0 < len(stored) < 40
        warned = _cuforge_warnings(caplog, "disk cache disabled")
        assert len(warned) == 1 and "full" in warned[0]
        for e in stored:  # what was stored is intact and served
            assert store.get(e.key).payload == e.payload
        leftovers = [n for _r, _d, files in os.walk(mnt) for n in files if n.startswith(".tmp")]
        assert not leftovers
    finally:
        umount(str(mnt))


# ---------------------------------------------------------------------- hot path
def test_hot_path_imports_nothing_heavy(tmp_path):
    root = str(tmp_path / "cache")
    DiskStore(root, 1 << 30).put(_entry(1, 30_000))
    code = f"""
        import sys, time
        before = set(sys.modules)
        from cuforge.store.disk import DiskStore
        store = DiskStore({root!r}, 1 << 30)
        t0 = time.perf_counter()
        entry = store.get({key_of(1)!r})
        took = time.perf_counter() - t0
        loaded = sorted(set(sys.modules) - before)
        import json
        print(json.dumps({{"hit": entry is not None, "took": took, "loaded": loaded}}))
    """
    best = None
    for _ in range(3):
        r = run_child(code)
        assert r["hit"]
        # (`re` still arrives through `typing`, which store/base.py imports)
        heavy = {"json", "filelock", "sqlite3", "dataclasses", "platformdirs", "logging"}
        assert heavy.isdisjoint(r["loaded"]), sorted(heavy & set(r["loaded"]))
        best = r["took"] if best is None else min(best, r["took"])
    assert best < 1e-3, f"a warm disk hit took {best * 1e3:.2f} ms in a fresh process"


def test_threads_share_one_store(tmp_path):
    import threading

    store = DiskStore(str(tmp_path / "cache"), 1 << 30)
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            for i in range(40):
                n = i % 8 if i % 2 else 100 * (t + 1) + i  # shared and own keys
                payload = key_of(n).encode() * 20
                store.put(Entry(key_of(n), "kernel", payload, {"name": f"k{n}.cu"}))
                got = store.get(key_of(n))
                assert got is not None and got.payload == payload
                if i % 10 == 0:
                    store.stats()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    report = store.verify(progress=lambda n: None)
    assert report.corrupt == [] and report.index_drift == 0
    assert store.stats().entries == len(_files(store)) == 4 + 6 * 20


def test_bulk_puts_append_one_journal_batch_and_sync_once(tmp_path, monkeypatch):
    """A batch of puts (prefetch, pull) is one journal batch, fsyncs each file once at the
    end instead of on every put, and its entries read back (checksummed) like any other."""
    from cuforge.store import disk as disk_mod

    store = DiskStore(str(tmp_path / "c"), 10**9)
    synced: list[list[str]] = []
    real = disk_mod._fsync_all
    monkeypatch.setattr(disk_mod, "_fsync_all", lambda paths: synced.append(paths) or real(paths))
    fsyncs = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: fsyncs.append(fd) or real_fsync(fd))
    entries = [_entry(i) for i in range(5)] + [Entry(key_of("m"), "manifest", b"", {})]
    with store.bulk() as same:
        assert same is store
        for e in entries:
            assert store.put(e)
        assert fsyncs == [] and synced == []  # nothing synced or indexed yet
        with store.bulk():  # nested: joins the outer batch
            assert store.put(_entry(9))
        assert synced == []
    # the 6 payload entries (not the payload-less manifest), then their dirs, once each
    assert len(synced) == 1 and sorted(synced[0]) == sorted(
        store.path_for(e.key) for e in entries[:5] + [_entry(9)]
    )
    dirs = {os.path.dirname(p) for p in synced[0]}
    assert len(fsyncs) == 6 + len(dirs)
    with open(store.journal.path, encoding="utf-8") as f:
        checks = [line for line in f if line.startswith("C\t")]
    assert len(checks) == 1  # one batch for 7 puts (a fresh journal: the scan wrote none)
    assert set(store.index()) == {e.key for e in entries} | {_entry(9).key}
    for e in entries:
        assert store.get(e.key).payload == e.payload


def test_bulk_flushes_the_index_when_the_block_raises(tmp_path):
    store = DiskStore(str(tmp_path / "c"), 10**9)
    with pytest.raises(RuntimeError), store.bulk():
        store.put(_entry(1))
        raise RuntimeError("remote died")
    assert store._batch is None and set(store.index()) == {_entry(1).key}
    assert store.put(_entry(2)) and _entry(2).key in store.index()  # back to one by one


def test_a_bulk_copy_bigger_than_the_cap_is_evicted_as_it_goes(tmp_path):
    """A pull bigger than the cap does not fill the disk first: the batch is indexed and
    the cap enforced every eighth of the cap, not only at the end."""
    store = DiskStore(str(tmp_path / "c"), 40_000)
    with store.bulk():
        for i in range(40):  # 40 entries of 4 KB: 4x the cap
            store.put(_entry(i, size=4000))
            assert sum(_files(store).values()) <= 40_000 + 6 * 4200
    assert store.total_bytes() <= 40_000
    assert _entry(39).key in store.index()


def test_an_entry_its_kind_would_refuse_on_read_is_not_written(tmp_path, caplog):
    """An entry whose meta breaks its kind's schema would read back as damaged (and be
    deleted): the disk tier refuses it at put, with one warning naming the problem."""
    import logging

    from cuforge.store.base import Entry
    from cuforge.store.disk import DiskStore

    store = DiskStore(str(tmp_path / "c"), 1 << 30)
    bad = Entry("ab" * 32, "inductor", b"payload", {"name": "fx"})  # no "cache" field
    with caplog.at_level(logging.WARNING, logger="cuforge"):
        assert store.put(bad) is False
    assert "not storing a 'inductor' entry" in caplog.text and "cache" in caplog.text
    assert store.get(bad.key) is None and store.corrupt == 0
    good = Entry("ab" * 32, "inductor", b"payload", {"name": "fx", "cache": "fx_graph"})
    assert store.put(good) is True
    assert store.get(good.key).payload == b"payload"
