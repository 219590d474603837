"""The disk tier owns its whole dir: torch build dirs and module dirs count toward the
cap, are evicted least recently used first (never one a build holds), pruned when old or
orphaned, cleared; ``stats`` agrees with a walk of the dir. Real files, no torch."""

from __future__ import annotations

import os
import time

from cuforge.base._fs import locked
from cuforge.base.layout import CacheLayout
from cuforge.store.base import Entry
from cuforge.store.disk import DiskStore
from cuforge.store.upkeep import TORCH_BUILD_LOCK

from .helpers import key_of

KIB = 1024


def _walk_bytes(root: str) -> int:
    """Every file under ``root``, as ``du -sb`` counts files."""
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def _age(path: str, when: float) -> None:
    os.utime(path, (when, when))


def _build_dir(layout: CacheLayout, name: str, nbytes: int, when: float) -> str:
    """What a torch build leaves: two objects, their depfiles, the module, the lock."""
    bdir = layout.torch_build_dir(name)
    os.makedirs(bdir)
    for obj in ("kernels.cuda.o", "binding.o"):
        with open(os.path.join(bdir, obj), "wb") as f:
            f.write(os.urandom(nbytes * 2 // 5))
        with open(os.path.join(bdir, obj + ".d"), "w") as f:
            f.write(f"{obj}: kernels.cu\n")
    with open(os.path.join(bdir, name + ".so"), "wb") as f:
        f.write(os.urandom(nbytes // 5))
    open(os.path.join(bdir, TORCH_BUILD_LOCK), "w").close()
    _age(bdir, when)
    return bdir


def _module_dir(layout: CacheLayout, key: str, nbytes: int, when: float) -> str:
    mdir = layout.torch_module_dir(key)
    os.makedirs(mdir)
    with open(os.path.join(mdir, "ext.so"), "wb") as f:
        f.write(os.urandom(nbytes))
    _age(mdir, when)
    return mdir


def test_eviction_bounds_the_whole_dir_and_stats_agree_with_a_walk(tmp_path):
    root = str(tmp_path / "cache")
    layout = CacheLayout(root)
    cap = 2048 * KIB
    old = time.time() - 10_000
    store = DiskStore(root, cap, telemetry=False)
    for i in range(10):
        assert store.put(Entry(key_of(i), "object", os.urandom(20 * KIB), {"name": f"{i}.o"}))
    builds = [_build_dir(layout, f"ext{i}", 400 * KIB, old + i) for i in range(4)]
    modules = [_module_dir(layout, key_of(100 + i), 300 * KIB, old + 10 + i) for i in range(4)]
    assert _walk_bytes(root) > cap + 900 * KIB  # 1.6 MiB of builds, 1.2 of modules

    # the oldest build dir is being built in: its lock is held
    with locked(os.path.join(builds[0], TORCH_BUILD_LOCK)):
        fresh = DiskStore(root, cap, telemetry=False)  # another process: counts on its put
        assert fresh.put(Entry(key_of(50), "kernel", os.urandom(10 * KIB), {}))

    assert _walk_bytes(root) <= cap  # the whole dir, as du counts it
    assert fresh.total_bytes() <= cap * 0.9
    assert os.path.isdir(builds[0])  # in use: kept
    gone = [d for d in builds[1:] + modules if not os.path.exists(d)]
    kept = [d for d in builds[1:] + modules if os.path.exists(d)]
    # least recently used first: every removed dir is older than every kept one
    assert gone and gone == (builds[1:] + modules)[: len(gone)]
    assert kept == (builds[1:] + modules)[len(gone) :]
    assert fresh.dirs_removed == len(gone)
    assert len(fresh.index()) == 11  # the entries, used last, all stay

    walked = _walk_bytes(root)
    stats = DiskStore(root, cap, telemetry=False).stats()
    assert abs(stats.bytes - walked) <= 0.05 * walked
    assert abs(stats.extra["dir_bytes"] - walked) <= 0.01 * walked
    outside = stats.extra["outside"]
    assert outside["torch build dirs"]["dirs"] == 1 + len([d for d in kept if "build" in d])
    assert outside["torch module dirs"]["dirs"] == len([d for d in kept if "modules" in d])


def test_prune_removes_old_and_orphaned_torch_dirs_and_clear_removes_them_all(tmp_path):
    root = str(tmp_path / "cache")
    layout = CacheLayout(root)
    store = DiskStore(root, 1 << 30, telemetry=False)
    now = time.time()
    assert store.put(Entry(key_of(1), "module", os.urandom(50 * KIB), {"name": "ext"}))
    with_entry = _module_dir(layout, key_of(1), 50 * KIB, now - 600)
    orphan = _module_dir(layout, key_of(2), 50 * KIB, now - 600)  # its entry is gone
    just_written = _module_dir(layout, key_of(3), 50 * KIB, now)  # its entry is on the way
    stale_build = _build_dir(layout, "stale", 100 * KIB, now - 40 * 86400)
    recent_build = _build_dir(layout, "recent", 100 * KIB, now - 600)
    assert store.stats().bytes >= 4 * 50 * KIB + 2 * 100 * KIB  # all of them count

    removed, freed = store.prune(older_than=30 * 86400)
    assert removed == 0 and freed >= 150 * KIB
    assert not os.path.exists(orphan) and not os.path.exists(stale_build)
    assert all(map(os.path.isdir, (with_entry, just_written, recent_build)))
    assert store.dirs_removed == 2

    with locked(os.path.join(recent_build, TORCH_BUILD_LOCK)):
        assert store.clear() == 1
    assert os.path.isdir(recent_build)  # a build holds it
    assert not os.path.exists(with_entry) and not os.path.exists(just_written)
    assert store.clear() == 0 and not os.path.exists(recent_build)
    assert store.stats().extra["outside"]["torch build dirs"]["dirs"] == 0
    assert _walk_bytes(root) < 4 * KIB  # the index and lock files


def test_touch_refreshes_last_use_and_counts_a_hit_with_its_build_time(tmp_path):
    store = DiskStore(str(tmp_path / "cache"), 1 << 30, telemetry=False)
    store.put(Entry(key_of(1), "module", b"x" * 1000, {"name": "ext", "compile_seconds": 97.5}))
    path = store.path_for(key_of(1))
    _age(path, time.time() - 40 * 86400)
    assert store.touch(key_of(1))
    assert time.time() - os.lstat(path).st_mtime < 60
    assert store.hits == 1
    assert store.prune(older_than=30 * 86400) == (0, 0)
    assert not store.touch(key_of(2))  # no such entry
