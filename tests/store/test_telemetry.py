"""Telemetry: recorded by the stores, merged across processes, bounded, can be turned off."""

from __future__ import annotations

import json
import os
import time

from cuforge.store import telemetry
from cuforge.store.base import Entry
from cuforge.store.disk import DiskStore

from .helpers import child_env, finish, key_of, run_child, spawn

CHILD = """
    import json, os
    from cuforge.store.disk import DiskStore
    from cuforge.store.memory import MemoryStore
    from cuforge.store.tiered import TieredStore
    from cuforge.store.base import Entry
    name = os.environ["NAME"]
    store = TieredStore([MemoryStore(1 << 20), DiskStore({root!r}, 1 << 30)])
    key = name.encode().hex().ljust(64, "0")
    store.put(Entry(key, "kernel", b"x" * 1000, {{"name": name, "compile_seconds": 0.5}}))
    store.tiers[0].delete(key)
    for _ in range(3):
        store.get(key)           # 1 disk hit, then 2 memory hits
    store.get("f" * 64)          # a miss in both tiers
    print(json.dumps({{"ok": True}}))
"""  # the counts are flushed at exit


def test_records_from_two_processes_land_in_summary(tmp_path):
    root = str(tmp_path / "cache")
    procs = [spawn(CHILD.format(root=root), child_env(NAME=n)) for n in ("a.cu", "b.cu")]
    for p in procs:
        finish(p)
    s = telemetry.summary(root)
    # hits: once, at the tier that answered; not_found: the lookups that reached a tier
    # and that it did not have (not misses: the miss of "f"*64 is one per process)
    assert s["tiers"]["disk"]["hits"] == 2 and s["tiers"]["disk"]["not_found"] == 2
    assert s["tiers"]["disk"]["puts"] == 2 and s["tiers"]["disk"]["bytes_put"] == 2000
    assert s["tiers"]["memory"]["hits"] == 4 and s["tiers"]["memory"]["not_found"] == 4
    assert s["lookups"] == {"lookups": 8, "hits": 6, "misses": 2, "builds": 2}
    assert s["hit_rate"] == 6 / 8
    assert abs(s["seconds_saved"] - 6 * 0.5) < 1e-6
    top = {(t["name"], t["kind"]): t for t in s["top"]}
    assert top[("a.cu", "kernel")]["hits"] == 3 and top[("b.cu", "kernel")]["hits"] == 3
    assert abs(top[("a.cu", "kernel")]["seconds_saved"] - 1.5) < 1e-6
    assert s["kinds"]["kernel"]["hits"] == 6
    assert s["enabled"] is True and s["since"] is not None
    # the disk tier's stats() reports the shared counters
    st = DiskStore(root, 1 << 30).stats()
    assert (st.hits, st.misses, st.puts) == (2, 2, 2)
    assert st.extra["counters"] == "shared"


def test_disabled_telemetry_writes_nothing(tmp_path):
    root = str(tmp_path / "cache")
    run_child(CHILD.format(root=root), child_env(NAME="a.cu", CUFORGE_TELEMETRY="0"))
    assert os.path.isdir(os.path.join(root, "v1", "entries"))  # the cache itself works
    assert not os.path.exists(telemetry.telemetry_dir(root))


def test_disabled_in_process(tmp_path, monkeypatch):
    monkeypatch.setenv("CUFORGE_TELEMETRY", "0")
    root = str(tmp_path / "cache")
    store = DiskStore(root, 1 << 30)
    store.put(Entry(key_of(1), "kernel", b"x", {"name": "a.cu"}))
    store.get(key_of(1))
    telemetry.flush()
    assert not os.path.exists(telemetry.telemetry_dir(root))
    s = telemetry.summary(root)
    assert s["enabled"] is False and s["tiers"] == {}
    assert store.stats().hits == 1 and store.stats().extra["counters"] == "process"


def test_store_without_telemetry_records_nothing(tmp_path):
    root = str(tmp_path / "cache")
    store = DiskStore(root, 1 << 30, telemetry=False)
    store.put(Entry(key_of(1), "kernel", b"x", {"name": "a.cu"}))
    store.get(key_of(1))
    telemetry.flush()
    assert not os.path.exists(telemetry.telemetry_dir(root))


def test_flush_is_one_appended_line_and_record_stays_bounded(tmp_path, monkeypatch):
    root = str(tmp_path / "cache")
    path = os.path.join(telemetry.telemetry_dir(root), "events.jsonl")
    telemetry.record(root, "hit", tier="disk", kind="kernel", name="a.cu", seconds_saved=1.0)
    telemetry.flush(root)
    telemetry.record(root, "miss", tier="disk", kind="", name=None)
    telemetry.flush(root)
    lines = open(path).read().splitlines()
    assert len(lines) == 2 and all(json.loads(x)["v"] == 1 for x in lines)

    monkeypatch.setattr(telemetry, "MAX_FILE_BYTES", 20_000)
    monkeypatch.setattr(telemetry, "MAX_NAMES", 50)
    for i in range(3000):
        telemetry.record(
            root, "hit", tier="disk", kind="kernel", name=f"k{i}.cu", seconds_saved=i / 1000
        )
        if i % 10 == 0:
            telemetry.flush(root)
    telemetry.flush(root)
    assert os.path.getsize(path) < 40_000  # compacted, not 3000 names' worth of lines
    s = telemetry.summary(root, top=5)
    assert s["tiers"]["disk"]["hits"] == 3001 and s["tiers"]["disk"]["not_found"] == 1
    expected = 1.0 + sum(i / 1000 for i in range(3000))
    assert abs(s["seconds_saved"] - expected) < 1e-3
    assert [t["name"] for t in s["top"]][:3] == ["k2999.cu", "k2998.cu", "k2997.cu"]


def test_torn_lines_are_skipped(tmp_path):
    root = str(tmp_path / "cache")
    telemetry.record(root, "put", tier="disk", kind="kernel", name="a.cu", nbytes=10)
    telemetry.flush(root)
    with open(os.path.join(telemetry.telemetry_dir(root), "events.jsonl"), "a") as f:
        f.write('{"v": 1, "c": [["disk", "hit"')  # a writer died mid-line
    assert telemetry.summary(root)["tiers"]["disk"]["puts"] == 1


# -- planted files: telemetry never writes through a symlink and never blocks on a FIFO --

PLANTED = """
    import json
    from cuforge.store import telemetry
    root = {root!r}
    for i in range(5):
        telemetry.record(root, "hit", tier="disk", kind="kernel", name="a.cu", seconds_saved=1.0)
        telemetry.flush(root)
    s = telemetry.summary(root)
    print(json.dumps({{"hits": s["tiers"].get("disk", {{}}).get("hits", 0)}}))
"""


def test_symlinked_events_file_is_not_written_through(tmp_path):
    root = str(tmp_path / "cache")
    tdir = telemetry.telemetry_dir(root)
    os.makedirs(tdir)
    outside = tmp_path / "outside.txt"
    outside.write_text("precious\n")
    for name in ("events.jsonl", "lock"):
        target = os.path.join(tdir, name)
        if os.path.lexists(target):
            os.unlink(target)
        os.symlink(outside, target)
        out = run_child(PLANTED.format(root=root))
        assert outside.read_text() == "precious\n"
        assert os.path.islink(target)
        assert out["hits"] == 0  # nothing recorded: the link is refused, counts dropped
        os.unlink(target)


def test_fifo_events_file_does_not_hang(tmp_path):
    root = str(tmp_path / "cache")
    tdir = telemetry.telemetry_dir(root)
    os.makedirs(tdir)
    fifo = os.path.join(tdir, "events.jsonl")
    os.mkfifo(fifo)
    out = run_child(PLANTED.format(root=root), timeout=60)  # hung before: blocked on open
    assert out["hits"] == 0  # the FIFO is refused: nothing is recorded, nothing blocks
    s = telemetry.summary(root)  # a reader in this process returns too
    assert s["tiers"] == {} and s["file_bytes"] == 0


def test_one_cold_and_one_warm_process_read_one_hit_in_two_lookups_one_build(tmp_path):
    """Real compiles in real processes: the counts are per lookup and per build, and the
    tiers' hits add up to the hits (a found manifest is not a hit: the kernel it leads to
    is)."""
    import subprocess
    import sys

    from tests.cli.conftest import ARCH, SAXPY, base_env, compile_in_child

    cache_dir = str(tmp_path / "cache")
    job = [{"name": "saxpy.cu", "source": SAXPY, "arch": ARCH}]
    cold = compile_in_child(cache_dir, job)
    assert cold["compiles"] == 1 and cold["results"][0]["from"] == "compiled"
    warm = compile_in_child(cache_dir, job)
    assert warm["compiles"] == 0 and warm["results"][0]["from"] == "disk"

    s = telemetry.summary(cache_dir)
    assert s["lookups"] == {"lookups": 2, "hits": 1, "misses": 1, "builds": 1}
    assert [(t["name"], t["hits"], t["puts"]) for t in s["top"]] == [("saxpy.cu", 1, 1)]
    # the kernel, once, at the tier that answered it (was 2: the manifest counted too)
    assert s["tiers"]["disk"]["hits"] == 1 == s["lookups"]["hits"]

    done = subprocess.run(
        [sys.executable, "-m", "cuforge.cli.main", "cache", "stats", "--json"],
        env=base_env(cache_dir),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["lookups"] == {"lookups": 2, "hits": 1, "misses": 1, "builds": 1}
    human = subprocess.run(
        [sys.executable, "-m", "cuforge.cli.main", "cache", "stats"],
        env=base_env(cache_dir),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert "lookups     2: 1 hit (50%), 1 miss; 1 build" in human.stdout, human.stdout


def test_kind_totals_are_per_kind_and_count_each_lookup_once(tmp_path):
    """What ``cuforge run`` diffs: per kind, the chain's hits / misses / builds and the
    seconds the hits saved (from whichever tier answered), across processes."""
    root = str(tmp_path / "cache")
    procs = [spawn(CHILD.format(root=root), child_env(NAME=n)) for n in ("a.cu", "b.cu")]
    for p in procs:
        finish(p)
    totals = telemetry.kind_totals(root)
    # per child: 3 hits of its kernel (1 disk, 2 memory), 1 build; the miss of "f"*64 had
    # no kind (a lookup by key): it is not any kind's
    assert totals == {"kernel": {"hits": 6, "misses": 0, "builds": 2, "seconds_saved": 3.0}}


POOL_CHILD = """
    import json, multiprocessing, sys


    def work(root):
        from cuforge.store import telemetry
        telemetry.record(root, "hit", tier="lookup", kind="triton", name=None)
        telemetry.record(root, "hit", tier="disk", kind="triton", name="k", seconds_saved=2.5)
        return True


    if __name__ == "__main__":
        ctx = multiprocessing.get_context(sys.argv[2])
        pool = ctx.Pool(1)
        assert pool.apply(work, (sys.argv[1],))
        pool.close()
        pool.join()
        print(json.dumps({"ok": True}))
"""


def test_a_multiprocessing_worker_flushes_its_counts_when_it_ends(tmp_path):
    """Pool workers end with os._exit (no atexit): the counts are flushed by a
    multiprocessing finalizer instead, with spawn and with fork."""
    import subprocess
    import sys
    import textwrap

    script = tmp_path / "pool_child.py"
    script.write_text(textwrap.dedent(POOL_CHILD))
    for method in ("spawn", "fork"):
        root = str(tmp_path / f"cache-{method}")
        done = subprocess.run(
            [sys.executable, str(script), root, method],
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        totals = telemetry.kind_totals(root)
        assert totals == {"triton": {"hits": 1, "misses": 0, "builds": 0, "seconds_saved": 2.5}}


def test_calls_served_per_key_are_counted_per_system_and_kept_out_of_the_tiers(tmp_path):
    import pytest

    import cuforge

    cache = cuforge.Cache(tmp_path / "c")
    for how in ("pretrace", "pretrace", "ir", "uncached"):
        cache.count_served("cute", how)
    with pytest.raises(ValueError, match=r"how='traced'.*pretrace, ir, uncached"):
        cache.count_served("cute", "traced")
    assert cache.counters["cute:served:pretrace"] == 2 and cache.counters["cute:served:ir"] == 1
    telemetry.flush(cache.directory)
    summ = telemetry.summary(cache.directory)
    assert summ["served"] == {"cute": {"pretrace": 2, "ir": 1, "uncached": 1}}
    # not a tier, not an entry kind's hits or evictions
    assert telemetry.SERVED not in summ["tiers"] and "cute" not in summ["kinds"]
    assert "cute" not in telemetry.kind_totals(cache.directory)


def test_compaction_keeps_one_line_per_day_and_the_totals(tmp_path, monkeypatch):
    root = str(tmp_path / "cache")
    now = time.time()
    for back in (0, 1, 1, 3, 200, 300):  # two lines on day 1; 200 and 300 days: "older"
        telemetry._append(
            root,
            {
                "v": 1,
                "t": now - back * telemetry.DAY,
                "pid": 1,
                "c": [["disk", "hit", "kernel", 1, 10, float(back)]],
                "n": [[f"k{back}.cu", "kernel", 1, 0, float(back)]],
            },
        )
    before = telemetry.summary(root)
    monkeypatch.setattr(telemetry, "MAX_FILE_BYTES", 10)
    telemetry.record(root, "miss", tier="disk", kind="", name=None)
    telemetry.flush(root)  # past the cap: compacted
    lines = telemetry.timeline(root)
    days = sorted({int(t // telemetry.DAY) for t, _c in lines})
    assert len(lines) == len(days) == 4  # today, day 1, day 3, and one for the old ones
    day1 = [
        c
        for t, c in lines
        if int(t // telemetry.DAY) == int((now - telemetry.DAY) // telemetry.DAY)
    ]
    assert day1[0][("disk", "hit", "kernel")] == [2, 20, 2.0]
    after = telemetry.summary(root)
    assert after["tiers"]["disk"]["hits"] == before["tiers"]["disk"]["hits"] == 6
    assert after["tiers"]["disk"]["not_found"] == 1
    assert abs(after["seconds_saved"] - before["seconds_saved"]) < 1e-9
    assert {t["name"] for t in after["top"]} == {t["name"] for t in before["top"]}
    assert after["since"] == before["since"]
