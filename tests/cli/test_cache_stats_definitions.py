"""``cuforge cache stats`` counts one hit and one size everywhere (issue 36, item 5).

A hit is a lookup answered by a tier, counted once, at the tier that answered it; a miss
is a lookup no tier answered; the total of hits is the sum of the tiers' rows and the hit
rate is hits / (hits + misses). The size is the entry files' sizes (``st_size``, what
``ls -l`` shows), the same in ``cache stats`` and ``cache ls``.
"""

from __future__ import annotations

import os

import cuforge
from cuforge.store import telemetry
from cuforge.store.base import Entry
from tests.cli.conftest import Cli

N_LOCAL, M_REMOTE, K_MISSES = 5, 3, 4


def _key(tag: str, i: int) -> str:
    return (tag.encode().hex() + f"{i:08x}").ljust(64, "0")


def _entry(key: str, i: int) -> Entry:
    return Entry(key, "kernel", b"x" * (100 + i), {"name": f"k{i}.cu", "compile_seconds": 1.0})


def _entries_dir_bytes(cache_dir: str) -> tuple[int, int]:
    """(files, sum of st_size) under the cache's entries dir, as ``ls -l`` shows them."""
    files = size = 0
    for dirpath, _dirs, names in os.walk(os.path.join(cache_dir, "v1", "entries")):
        for name in names:
            files += 1
            size += os.lstat(os.path.join(dirpath, name)).st_size
    return files, size


def test_stats_rows_and_totals_are_n_local_m_remote_and_k_misses(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    remote = f"file://{shared}"
    # another machine's cache fills the remote with M entries this one does not hold
    writer = cuforge.Cache(tmp_path / "writer", remotes=[remote], memory=False)
    for i in range(M_REMOTE):
        assert writer.put(_entry(_key("remote", i), i))
    telemetry.flush(writer.directory)

    reader_dir = str(tmp_path / "reader")
    reader = cuforge.Cache(reader_dir, remotes=[remote], memory=False)
    for i in range(N_LOCAL):
        assert reader.put(_entry(_key("local", i), i))
    for i in range(N_LOCAL):
        assert reader.get_with_tier(_key("local", i), kind="kernel")[1] == "disk"
    for i in range(M_REMOTE):
        # a remote hit, copied down into the (fresh) local disk tier: still one hit, remote's
        assert reader.get_with_tier(_key("remote", i), kind="kernel")[1] == "remote"
    for i in range(K_MISSES):
        assert reader.get_with_tier(_key("absent", i), kind="kernel") == (None, None)
    telemetry.flush(reader_dir)

    cli = Cli(reader_dir)
    doc = cli.json("cache", "stats", env={"CUFORGE_REMOTE": remote})
    tiers = doc["tiers"]
    assert tiers["disk"]["hits"] == N_LOCAL
    assert tiers["remote"]["hits"] == M_REMOTE
    assert sum(t["hits"] for t in tiers.values()) == N_LOCAL + M_REMOTE
    assert doc["lookups"] == {
        "lookups": N_LOCAL + M_REMOTE + K_MISSES,
        "hits": N_LOCAL + M_REMOTE,
        "misses": K_MISSES,
        "builds": N_LOCAL,
    }
    assert doc["hit_rate"] == (N_LOCAL + M_REMOTE) / (N_LOCAL + M_REMOTE + K_MISSES)
    assert doc["seconds_saved"] == float(N_LOCAL + M_REMOTE)  # 1 s per hit, once each

    human = cli("cache", "stats", env={"CUFORGE_REMOTE": remote}).stdout
    rows = {line.split()[0]: line.split() for line in human.splitlines() if line.strip()}
    assert rows["disk"][1] == str(N_LOCAL) and rows["remote"][1] == str(M_REMOTE), human
    assert rows["total"][1] == str(N_LOCAL + M_REMOTE), human
    assert rows["missed"][1] == str(K_MISSES), human
    rate = round(100 * (N_LOCAL + M_REMOTE) / (N_LOCAL + M_REMOTE + K_MISSES))
    assert (
        f"lookups     {N_LOCAL + M_REMOTE + K_MISSES}: {N_LOCAL + M_REMOTE} hits ({rate}%), "
        f"{K_MISSES} misses; {N_LOCAL} builds"
    ) in human, human

    # the report and the doctor count the same (telemetry.tally)
    report = cli.json("cache", "report")
    assert (report["hits"], report["misses"]) == (N_LOCAL + M_REMOTE, K_MISSES)
    assert report["hit_rate"] == doc["hit_rate"]
    kinds = telemetry.kind_totals(reader_dir)
    assert kinds["kernel"]["hits"] == N_LOCAL + M_REMOTE
    assert kinds["kernel"]["misses"] == K_MISSES


def test_stats_size_is_the_sum_of_the_entry_files_st_size(tmp_path):
    cache_dir = str(tmp_path / "cache")
    cache = cuforge.Cache(cache_dir, memory=False)
    for i in range(7):
        assert cache.put(_entry(_key("size", i), 37 * i))
    files, size = _entries_dir_bytes(cache_dir)
    assert files == 7

    cli = Cli(cache_dir)
    doc = cli.json("cache", "stats")
    assert doc["entries"] == files
    assert doc["bytes"] == size  # what `ls -l` shows, summed
    assert sum(k["bytes"] for k in doc["kinds"].values()) == size
    listed = cli.json("cache", "ls", "--kind", "all")
    assert sum(e["size"] for e in listed["entries"]) == listed["bytes"] == size
    human = cli("cache", "stats").stdout
    assert f"({size} bytes: the entry files' sizes" in human, human


def test_a_lookup_a_bundle_answers_is_a_bundle_hit_not_a_miss(tmp_path):
    from cuforge.aot.bundle import write_bundle

    bundle = tmp_path / "app.cfb"
    write_bundle(bundle, [_entry(_key("bundle", i), i) for i in range(2)])
    cache_dir = str(tmp_path / "cache")
    cache = cuforge.Cache(cache_dir, memory=False)
    cache.add_bundle(bundle)
    for i in range(2):
        assert cache.get_with_tier(_key("bundle", i), kind="kernel")[1] == "bundle"
    assert cache.get_with_tier(_key("absent", 0), kind="kernel") == (None, None)
    telemetry.flush(cache_dir)
    doc = Cli(cache_dir).json("cache", "stats")
    assert doc["tiers"]["bundle"]["hits"] == 2, doc["tiers"]
    assert (doc["lookups"]["hits"], doc["lookups"]["misses"]) == (2, 1), doc["lookups"]
