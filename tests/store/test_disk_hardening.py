"""The disk tier under hostile conditions (issue 9): an untrusted cache dir, FIFOs,
directories and symlinks in place of files, malformed entries, a damaged journal, a
full disk, leftover temp and lock files. Real files, real processes, real mounts."""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from cuforge.store import disk as disk_mod
from cuforge.store.base import Entry
from cuforge.store.disk import DiskStore, encode_entry

from .helpers import ROOT, child_env, key_of, mount, umount

KERNEL = 'extern "C" __global__ void k(){}'

META = {
    "name": "k.cu",
    "arch": "sm_90",
    "backend": "nvrtc",
    "output": "cubin",
    "lowered_names": {"k": "k"},
    "log": "",
    "compile_seconds": 0.1,
    "key_fields": {"arch": "sm_90"},
    "header_paths": [],
}


def _entry(i: int, size: int = 1000, **meta) -> Entry:
    return Entry(key_of(i), "kernel", os.urandom(size), {**META, "name": f"k{i}.cu", **meta})


def _plant(store: DiskStore, key: str, kind: str, meta: dict, payload: bytes = b"x") -> str:
    """Write a well-checksummed entry file by hand (what a buggy or hostile writer does)."""
    path = store.path_for(key)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(encode_entry(Entry(key, kind, payload, meta)))
    return path


def _run(code: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    """A fresh interpreter; a hang fails the test after ``timeout`` instead of blocking."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=ROOT,
    )


def _compile_env(cache_dir: str) -> dict[str, str]:
    env = child_env(CUFORGE_CACHE_DIR=cache_dir, CUFORGE_ARCH="sm_90")
    for name in ("CUFORGE_DISABLE_CACHE", "CUFORGE_DISABLE_FILE_CACHE"):
        env.pop(name, None)
    return env


COMPILE_TWICE = f"""
    import json, cuforge, cuforge.store
    from cuforge.core.pipeline import counters
    for i in range(2):
        cuforge.compile({KERNEL!r} + "\\n" * i, name="k.cu", arch="sm_90")
    print(json.dumps({{"compiles": counters["compiles"]}}))
"""

COMPILE_ONCE = f"""
    import json, cuforge
    from cuforge.core.pipeline import counters
    r = cuforge.compile({KERNEL!r}, name="k.cu", arch="sm_90")
    print(json.dumps({{"compiles": counters["compiles"], "from": r.source_of_result}}))
"""


def _compiles(cache_dir: str, code: str = COMPILE_ONCE) -> tuple[dict, str]:
    done = _run(code, _compile_env(cache_dir), timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


# ---------------------------------------------------------------------- §2 trust
@pytest.mark.parametrize("how", ["chmod-0777", "chown-nobody"])
def test_an_untrusted_cache_dir_is_never_read(tmp_path, how):
    cache = tmp_path / "cache"
    first, _ = _compiles(str(cache))
    assert first["compiles"] == 1
    warm, _ = _compiles(str(cache))
    assert warm["compiles"] == 0 and warm["from"] == "disk"  # the planted entry is valid
    if how == "chmod-0777":
        os.chmod(cache, 0o777)
        fix = "chmod -R go-w"  # the fix covers the whole tree
    else:
        if os.geteuid() != 0:
            pytest.skip("chown to another user needs root")
        os.chown(cache, 65534, 65534)
        fix = "chown"
    # Every later compile in the process compiles (nothing is read), and the warning
    # comes once, with the fix.
    got, stderr = _compiles(str(cache), COMPILE_TWICE)
    assert got["compiles"] == 2  # the valid entry is not served
    warnings = [line for line in stderr.splitlines() if "not using the disk cache" in line]
    assert len(warnings) == 1, stderr
    assert fix in warnings[0] and str(cache) in warnings[0]
    # Fixed: the disk tier is back, and the entry (still there) serves again.
    os.chown(cache, os.geteuid(), os.getegid())
    os.chmod(cache, 0o700)
    fixed, stderr = _compiles(str(cache))
    assert fixed["compiles"] == 0 and "not using the disk cache" not in stderr


def test_untrusted_subdir_means_memory_only_at_store_level(tmp_path, monkeypatch, caplog):
    import cuforge
    from cuforge.store.memory import MemoryStore

    cache = tmp_path / "cache"
    planted = DiskStore(str(cache), 1 << 30)
    e = _entry(1)
    assert planted.put(e)
    os.chmod(cache / "v1", 0o777)  # a directory cuforge made, opened up
    monkeypatch.setenv("CUFORGE_CACHE_DIR", str(cache))
    monkeypatch.delenv("CUFORGE_DISABLE_FILE_CACHE", raising=False)
    monkeypatch.delenv("CUFORGE_DISABLE_CACHE", raising=False)
    with caplog.at_level(logging.WARNING, logger="cuforge"):
        cache = cuforge.default_cache()
        store = cache.store
        assert isinstance(store, MemoryStore)
        assert store.get(e.key) is None
        assert cache.lock_dir is None  # no locks in an untrusted dir either
    assert any("not using the disk cache" in r.getMessage() for r in caplog.records)


def test_a_new_cache_dir_is_private(tmp_path):
    cache = tmp_path / "fresh" / "cache"
    DiskStore(str(cache), 1 << 30).put(_entry(1))
    for d in (cache, cache / "v1" / "entries", cache / "v1" / "index"):
        assert os.stat(d).st_mode & 0o077 == 0, d
    import cuforge

    assert cuforge.Cache(cache).trust_problem() is None


# ---------------------------------------------------------------------- §3 odd files
FIFO_CODE = """
    import json
    from cuforge.store.disk import DiskStore
    store = DiskStore({root!r}, 1 << 30, telemetry=False)
    out = {{}}
    out["get"] = store.get({key!r}) is None
    out["stats"] = store.stats().entries
    out["index"] = len(list(store.iterate_index()))
    out["verify"] = store.verify().as_dict()["corrupt"]
    out["prune"] = list(store.prune(max_bytes=1 << 30))
    print(json.dumps(out))
"""


@pytest.mark.parametrize("what", ["fifo", "directory", "symlink"])
def test_a_non_regular_file_in_place_of_an_entry_is_damage(tmp_path, what):
    store = DiskStore(str(tmp_path / "cache"), 1 << 30)
    victim, other = _entry(1), _entry(2)
    store.put(victim)
    store.put(other)
    path = store.path_for(victim.key)
    os.unlink(path)
    target = tmp_path / "target"
    target.write_bytes(b"not yours")
    if what == "fifo":
        os.mkfifo(path)
    elif what == "directory":
        os.mkdir(path)
        os.mkdir(os.path.join(path, "sub"))
    else:
        os.symlink(target, path)
    # verify sees it (in a child: a hang is a failure, not a stuck test run)
    done = _run(
        f"""
        import json
        from cuforge.store.disk import DiskStore
        r = DiskStore({str(tmp_path / "cache")!r}, 1 << 30, telemetry=False).verify()
        print(json.dumps(r.as_dict()))
        """,
        child_env(),
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["corrupt"] == [victim.key] and report["ok"] is False
    # a read counts it as damage and removes it; the target of a link is untouched
    assert store.get(victim.key) is None
    assert not os.path.lexists(path)
    assert target.read_bytes() == b"not yours"
    assert store.get(other.key).payload == other.payload
    # and a put of that key works again (the tier stays on)
    assert store.put(victim) and not store.disabled
    assert store.get(victim.key).payload == victim.payload


@pytest.mark.parametrize("what", ["fifo", "directory"])
def test_verify_repair_removes_non_regular_entries(tmp_path, what):
    store = DiskStore(str(tmp_path / "cache"), 1 << 30)
    e = _entry(1)
    store.put(e)
    path = store.path_for(e.key)
    os.unlink(path)
    if what == "fifo":
        os.mkfifo(path)
    else:
        os.makedirs(os.path.join(path, "nested"))
    report = store.verify(repair=True)
    assert report.corrupt == [e.key] and report.repaired == 1 and report.ok
    assert not os.path.lexists(path)
    assert store.verify().ok


def test_a_directory_in_place_of_an_entry_does_not_turn_off_puts(tmp_path):
    store = DiskStore(str(tmp_path / "cache"), 1 << 30)
    e = _entry(1)
    path = store.path_for(e.key)
    os.makedirs(os.path.join(path, "nested"))
    assert store.put(e) and not store.disabled
    assert store.get(e.key).payload == e.payload


def test_fifos_in_place_of_entry_and_journal_never_hang(tmp_path):
    root = str(tmp_path / "cache")
    store = DiskStore(root, 1 << 30)
    victim = _entry(1)
    for i in range(1, 4):
        store.put(_entry(i) if i > 1 else victim)
    os.unlink(store.path_for(victim.key))
    os.mkfifo(store.path_for(victim.key))
    os.unlink(store.journal.path)
    os.mkfifo(store.journal.path)
    done = _run(FIFO_CODE.format(root=root, key=victim.key), child_env(), timeout=60)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["get"] is True
    assert out["stats"] == 2 and out["index"] == 2
    # the CLI too
    env = child_env(CUFORGE_CACHE_DIR=root)
    os.mkfifo(store.path_for(victim.key))
    for args in (["stats"], ["ls"], ["verify"], ["prune"], ["verify", "--repair"]):
        done = subprocess.run(
            [sys.executable, "-m", "cuforge.cli.main", "cache", *args, "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode in (0, 1), (args, done.stderr)
    assert not os.path.lexists(store.path_for(victim.key))
    assert os.path.isfile(store.journal.path)


def test_compile_does_not_hang_on_fifos_in_place_of_its_entries(tmp_path):
    cache = str(tmp_path / "cache")
    first, _ = _compiles(cache)
    assert first["compiles"] == 1
    store = DiskStore(cache, 1 << 30, telemetry=False)
    for _key, path, _st in list(store.walk()):
        os.unlink(path)
        os.mkfifo(path)
    again, _ = _compiles(cache)  # times out (fails) if a read blocks
    assert again["compiles"] == 1
    third, _ = _compiles(cache)
    assert third["compiles"] == 0 and third["from"] == "disk"


# ---------------------------------------------------------------------- §4 schema
BAD_META = [
    ("lowered_names", ["not", "a", "mapping"]),
    ("lowered_names", {"k": 5}),
    ("compile_seconds", "fast"),
    ("compile_seconds", True),
    ("name", 42),
    ("key_fields", "x"),
    ("header_paths", "/etc/passwd"),
]


@pytest.mark.parametrize(("field", "value"), BAD_META)
def test_a_malformed_entry_is_damage(tmp_path, caplog, field, value):
    store = DiskStore(str(tmp_path / "cache"), 1 << 30)
    key = key_of(1)
    path = _plant(store, key, "kernel", {**META, field: value})
    assert store.peek(key) is None
    report = store.verify()
    assert report.corrupt == [key] and field in report.reasons[key]
    assert store.verify(quick=True).corrupt == [key]
    with caplog.at_level(logging.WARNING, logger="cuforge"):
        assert store.get(key) is None
    assert not os.path.exists(path) and store.corrupt == 1
    assert any(field in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("kind", "meta"),
    [
        ("martian", {"name": "x"}),
        ("manifest", {"name": "x", "headers": ["a.h"]}),
        ("manifest", {"name": "x", "probes": "a.h"}),
        ("manifest", {"name": "x", "variants": [{"headers": {"a.h": 1}}]}),
        ("manifest", {"name": "x", "variants": {"headers": {}}}),
        ("manifest", {"name": "x", "variants": [{"headers": {}, "probes": [], "for": 7}]}),
        ("manifest", {"name": "x", "variants": [{"headers": {}, "for": "k"}]}),
        ("manifest", {"name": "x", "variants": [{"headers": {}, "probes": [], "for": ""}]}),
        ("object", {"name": "x", "compile_seconds": float("nan")}),
    ],
)
def test_malformed_kinds_and_manifests_are_damage(tmp_path, kind, meta):
    store = DiskStore(str(tmp_path / "cache"), 1 << 30)
    _plant(store, key_of(1), kind, meta)
    assert store.get(key_of(1)) is None and store.corrupt == 1


@pytest.mark.parametrize(
    ("kind", "meta"),
    [
        ("manifest", {"name": "x", "headers": {"/a.h": "d"}, "probes": ["/b.h"], "for": "k"}),
        (
            "manifest",
            {"name": "x", "variants": [{"headers": {"/a.h": "d"}, "probes": [], "for": "k"}]},
        ),
        ("manifest", {"name": "x", "variants": [{"headers": {}, "probes": [], "for": "k"}]}),
        (
            "manifest",
            {"name": "x", "variants": [{"headers": {}, "probes": [], "for": "k", "digest": "d"}]},
        ),
        ("manifest", {"name": "x"}),  # the older torch build's (variants in the payload)
        ("module", {"name": "ext", "compile_seconds": 3, "arch": "sm_80,sm_90"}),
        ("object", {"name": "a.cu", "key_fields": {"x": [1, 2]}, "custom": {"any": None}}),
    ],
)
def test_well_formed_entries_of_every_kind_are_served(tmp_path, kind, meta):
    store = DiskStore(str(tmp_path / "cache"), 1 << 30)
    _plant(store, key_of(1), kind, meta)
    got = store.get(key_of(1))
    assert got is not None and got.kind == kind and store.corrupt == 0


def test_cache_show_of_a_malformed_entry_is_a_clear_error(tmp_path):
    root = str(tmp_path / "cache")
    store = DiskStore(root, 1 << 30)
    _plant(store, key_of(1), "kernel", {**META, "compile_seconds": "slow"})
    store.rebuild_index()
    done = subprocess.run(
        [sys.executable, "-m", "cuforge.cli.main", "cache", "show", key_of(1)[:12]],
        env=child_env(CUFORGE_CACHE_DIR=root),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "damaged" in done.stderr and "verify --repair" in done.stderr


def _bundle_with(path: str, entries: list[tuple[dict, bytes]]) -> None:
    """A cache bundle (.cfb) holding ``(row, payload)`` pairs, written by hand
    (:func:`tests.bundle_files.raw_bundle`: ``write_bundle_file`` refuses malformed rows; a
    hostile or buggy writer does not)."""
    from cuforge._version import __version__
    from cuforge.keys.key import SCHEMA_VERSION
    from tests.bundle_files import raw_bundle

    rows, body = [], b""
    for row, payload in entries:
        rows.append({**row, "at": len(body), "size": len(payload)})
        body += payload
    raw_bundle(
        path, rows, body, info={"cuforge_version": __version__, "key_schema": SCHEMA_VERSION}
    )


_GOOD_ROW = {"key": key_of(1), "kind": "kernel", "meta": META}


@pytest.mark.parametrize(
    ("row", "words"),
    [
        ({"key": key_of(2), "kind": "kernel", "meta": {**META, "lowered_names": [1]}}, "lowered"),
        ({"key": key_of(3), "kind": "kernel", "meta": {**META, "compile_seconds": "x"}}, "compile"),
        ({"key": key_of(4), "kind": "martian", "meta": META}, "kind"),
        ({"key": "abcd1234", "kind": "kernel", "meta": META}, "valid key"),
    ],
)
def test_import_refuses_a_bundle_with_malformed_entries(tmp_path, row, words):
    # a malformed row refuses the whole bundle (it is damaged or planted), naming the
    # problem; nothing of it reaches the cache
    from cuforge.aot.bundle import import_bundle
    from cuforge.store.bundle import BundleError

    bundle = str(tmp_path / "a.cfb")
    _bundle_with(bundle, [(_GOOD_ROW, b"payload"), (row, b"payload")])
    store = DiskStore(str(tmp_path / "cache"), 1 << 30, telemetry=False)
    with pytest.raises(BundleError, match=words) as caught:
        import_bundle(store, bundle)
    assert bundle in str(caught.value)
    assert list(store.walk()) == []
    assert store.verify().ok


def test_import_checks_each_payload_and_caps_them(tmp_path):
    from cuforge.aot.bundle import import_bundle

    bundle = str(tmp_path / "big.cfb")
    rows = [
        ({**_GOOD_ROW, "key": key_of(i)}, bytes([i]) * size)
        for i, size in ((1, 3 << 20), (2, 1000), (3, 2000))
    ]
    _bundle_with(bundle, rows)
    with open(bundle, "r+b") as f:  # flip one byte of entry 3's payload
        f.seek(96 + (3 << 20) + 1000 + 5)
        f.write(b"\xff")
    store = DiskStore(str(tmp_path / "cache"), 1 << 40, telemetry=False)
    result = import_bundle(store, bundle, max_entry_bytes=1 << 20)
    reasons = {r["key"]: r["reason"] for r in result["rejected"]}
    assert set(reasons) == {key_of(1), key_of(3)} and not result["ok"]
    assert "cap" in reasons[key_of(1)]  # over the cap: rejected, never stored
    assert "SHA-256" in reasons[key_of(3)]  # damaged: rejected, the others still stored
    assert result["imported"] == 1 and result["bytes"] == 1000
    assert [k for k, _p, _s in store.walk()] == [key_of(2)]
    assert store.verify().ok
    again = import_bundle(store, bundle, max_entry_bytes=1 << 30)
    assert again["present"] == 1 and again["imported"] == 1  # entry 1 within the cap now
    assert len(store.get(key_of(1)).payload) == 3 << 20


# ---------------------------------------------------------------------- §5 journal
def _garble(path: str, how: str) -> None:
    size = os.path.getsize(path)
    if how == "zeroed":
        with open(path, "r+b") as f:
            f.write(bytes(size))
    elif how == "garbled":
        with open(path, "r+b") as f:
            f.seek(size // 3)
            f.write(os.urandom(size // 3))
    elif how == "truncated-to-zero":
        with open(path, "wb"):
            pass
    else:  # a plausible but forged line: right shape, no valid checksum
        with open(path, "ab") as f:
            f.write(f"P\t{key_of(999)}\t1\t1.0\tkernel\tx\tsm_90\tdeadbeef\n".encode())


@pytest.mark.parametrize("how", ["zeroed", "garbled", "truncated-to-zero", "forged"])
def test_a_damaged_journal_is_detected_and_rebuilt(tmp_path, how):
    root = str(tmp_path / "cache")
    store = DiskStore(root, 1 << 30, telemetry=False)
    for i in range(12):
        store.put(_entry(i, 500))
    truth = (store.stats().entries, store.total_bytes())
    _garble(store.journal.path, how)
    report = DiskStore(root, 1 << 30, telemetry=False).verify()
    assert report.journal is not None and not report.ok
    fresh = DiskStore(root, 1 << 30, telemetry=False)
    assert (fresh.stats().entries, fresh.total_bytes()) == truth  # the forged line: unused
    fresh.put(_entry(100, 500))  # an append after the damage: a forged line is found now
    assert fresh.stats().entries == truth[0] + 1
    assert fresh.total_bytes() == _disk_bytes(root)
    assert fresh.journal_rebuilds == 1
    assert DiskStore(root, 1 << 30, telemetry=False).verify().ok  # readers rebuilt it


def test_verify_repair_rebuilds_a_damaged_journal_cli(tmp_path):
    root = str(tmp_path / "cache")
    store = DiskStore(root, 1 << 30, telemetry=False)
    for i in range(5):
        store.put(_entry(i, 500))
    _garble(store.journal.path, "zeroed")
    env = child_env(CUFORGE_CACHE_DIR=root)

    def verify(*extra: str) -> tuple[int, dict]:
        done = subprocess.run(
            [sys.executable, "-m", "cuforge.cli.main", "cache", "verify", "--json", *extra],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        return done.returncode, json.loads(done.stdout)

    rc, doc = verify()
    assert rc == 1 and doc["journal"] and doc["ok"] is False
    rc, doc = verify("--repair")
    assert rc == 0 and doc["journal_rebuilt"] is True and doc["ok"] is True
    rc, doc = verify()
    assert rc == 0 and doc["journal"] is None and doc["checked"] == 5


def _disk_bytes(root: str) -> int:
    return sum(
        os.lstat(os.path.join(d, n)).st_size
        for d, _dirs, files in os.walk(os.path.join(root, "v1", "entries"))
        for n in files
    )


@pytest.mark.parametrize("how", ["zeroed", "garbled"])
def test_the_cap_holds_with_a_damaged_journal(tmp_path, how):
    root = str(tmp_path / "cache")
    cap = 30_000
    store = DiskStore(root, cap, telemetry=False)
    for i in range(4):
        store.put(_entry(i, 5000))
    _garble(store.journal.path, how)
    writer = DiskStore(root, cap, telemetry=False)  # another process, as it were
    for i in range(4, 50):
        writer.put(_entry(i, 2000))
        assert _disk_bytes(root) <= cap, i
    assert _disk_bytes(root) <= cap


# ---------------------------------------------------------------------- §7 full disk
def test_a_full_disk_recovers_after_a_back_off(tmp_path, monkeypatch, caplog):
    mnt = tmp_path / "small"
    mnt.mkdir()
    why = mount(["-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)])
    if why:
        pytest.skip(f"cannot mount a 64k tmpfs to fill (needs CAP_SYS_ADMIN): {why}")
    try:
        monkeypatch.setattr(disk_mod, "FULL_DISK_BACKOFF", 0.0)  # retry on the next put
        store = DiskStore(str(mnt / "cache"), 1 << 30)
        with caplog.at_level(logging.WARNING, logger="cuforge"):
            stored = [i for i in range(20) if store.put(_entry(i, 8000))]
            assert store.disabled and 0 < len(stored) < 20
            assert "full" in store.disabled_reason
            store.clear()  # space again
            assert store.put(_entry(100, 8000))  # the back-off passed: writes are back
            assert not store.disabled and store.disabled_reason is None
            assert store.get(key_of(100)) is not None
        warned = [r for r in caplog.records if "disk cache disabled" in r.getMessage()]
        assert len(warned) == 1
        leftovers = [n for _r, _d, files in os.walk(mnt) for n in files if n.startswith(".tmp")]
        assert not leftovers
    finally:
        umount(str(mnt))


def test_a_full_disk_waits_out_its_back_off(tmp_path, monkeypatch):
    # Simulated ENOSPC (no mount needed): while the back-off runs, puts do not even try.
    store = DiskStore(str(tmp_path / "cache"), 1 << 30)
    calls = []
    real = disk_mod._fs.atomic_write

    def full(path, data, **kw):
        calls.append(path)
        raise OSError(errno.ENOSPC, "No space left on device", path)

    monkeypatch.setattr(disk_mod._fs, "atomic_write", full)
    assert not store.put(_entry(1)) and store.disabled
    assert not store.put(_entry(2)) and len(calls) == 1  # within the back-off: no try
    monkeypatch.setattr(disk_mod._fs, "atomic_write", real)
    store._retry_at = 0.0  # the back-off is over (no waiting in tests)
    assert store.put(_entry(3)) and not store.disabled


# ---------------------------------------------------------------------- §7 leftovers
def test_prune_and_clear_remove_stale_temp_files_and_unheld_locks(tmp_path):
    from cuforge.base import _fs

    root = tmp_path / "cache"
    store = DiskStore(str(root), 1 << 30)
    e = _entry(1)
    store.put(e)
    shard = os.path.dirname(store.path_for(e.key))
    stale = os.path.join(shard, ".tmp.deadbeef.1.2.3")
    fresh = os.path.join(shard, ".tmp.cafe.1.2.3")
    for p in (stale, fresh):
        with open(p, "wb") as f:
            f.write(b"x" * 100)
    old = os.path.getmtime(stale) - 3600
    os.utime(stale, (old, old))
    locks = root / "locks" / "ab"
    locks.mkdir(parents=True)
    (locks / "abc.lock").write_text("")
    held_path = str(locks / "abd.lock")
    with _fs.locked(held_path):
        store.prune(max_bytes=1 << 30)
        assert not os.path.exists(stale) and os.path.exists(fresh)  # a writer's live file
        assert not (locks / "abc.lock").exists()
        assert os.path.exists(held_path)  # someone compiles under it right now
    assert store.get(e.key) is not None
    store.clear()
    assert not os.path.exists(fresh) and not os.path.exists(held_path)


def test_temp_files_count_toward_the_cap(tmp_path):
    root = str(tmp_path / "cache")
    cap = 40_000
    store = DiskStore(root, cap, telemetry=False)
    store.put(_entry(0, 1000))
    shard = os.path.dirname(store.path_for(key_of(0)))
    with open(os.path.join(shard, ".tmp.live.1.2.3"), "wb") as f:  # a writer's live file
        f.write(b"x" * 20_000)
    for i in range(1, 30):
        store.put(_entry(i, 2000))
    on_disk = sum(
        os.lstat(os.path.join(d, n)).st_size
        for d, _dirs, files in os.walk(os.path.join(root, "v1", "entries"))
        for n in files
    )
    assert on_disk <= cap, on_disk


@pytest.mark.parametrize("name", ["journal", "lock", "evict.lock"])
@pytest.mark.parametrize("what", ["fifo", "directory", "symlink"])
def test_odd_files_in_the_index_dir_are_replaced_not_used(tmp_path, name, what):
    root = str(tmp_path / "cache")
    store = DiskStore(root, 20_000, telemetry=False)
    store.put(_entry(0, 1000))
    path = os.path.join(store.layout.index, name)
    os.unlink(path) if os.path.lexists(path) else None
    target = tmp_path / "elsewhere"
    target.write_bytes(b"")
    if what == "fifo":
        os.mkfifo(path)
    elif what == "directory":
        os.makedirs(os.path.join(path, "x"))
    else:
        os.symlink(target, path)
    done = _run(
        f"""
        import json
        from cuforge.store.disk import DiskStore
        from tests.store.test_disk_hardening import _entry
        store = DiskStore({root!r}, 20_000, telemetry=False)
        for i in range(1, 30):
            store.put(_entry(i, 1500))
        print(json.dumps({{"entries": store.stats().entries, "bytes": store.total_bytes()}}))
        """,
        child_env(),
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert 0 < out["entries"] < 30 and out["bytes"] <= 20_000  # the cap held
    assert _disk_bytes(root) <= 20_000
    assert os.path.isfile(path) and not os.path.islink(path)
    assert target.read_bytes() == b""  # nothing was written through the link
    assert DiskStore(root, 20_000, telemetry=False).verify().ok


def test_a_journal_of_the_older_format_is_rebuilt_without_a_warning(tmp_path, caplog):
    root = str(tmp_path / "cache")
    store = DiskStore(root, 1 << 30, telemetry=False)
    for i in range(3):
        store.put(_entry(i, 500))
    with open(store.journal.path, "w") as f:  # what cuforge before issue 9 wrote: no checksums
        f.write("H\t1\n" + "".join(f"P\t{key_of(i)}\t9\t1.0\tkernel\tk.cu\t\n" for i in range(3)))
    with caplog.at_level(logging.WARNING, logger="cuforge"):
        fresh = DiskStore(root, 1 << 30, telemetry=False)
        assert fresh.stats().entries == 3 and fresh.total_bytes() == _disk_bytes(root)
    assert not [r for r in caplog.records if "damaged" in r.getMessage()]
    assert fresh.verify().ok


@pytest.mark.parametrize(("field", "value"), [("lowered_names", ["k"]), ("compile_seconds", "x")])
def test_a_malformed_kernel_entry_is_rebuilt_by_the_next_compile(tmp_path, field, value):
    from cuforge.store.disk import decode_entry

    cache = str(tmp_path / "cache")
    first, _ = _compiles(cache)
    assert first["compiles"] == 1
    store = DiskStore(cache, 1 << 30, telemetry=False)
    kernels = [(k, p) for k, p, _st in store.walk() if store.peek(k).kind == "kernel"]
    assert len(kernels) == 1
    key, path = kernels[0]
    with open(path, "rb") as f:
        header, payload = decode_entry(f.read())
    meta = {**header["meta"], field: value}
    with open(path, "wb") as f:  # well-formed bytes, a valid checksum, the wrong shape
        f.write(encode_entry(Entry(key, "kernel", payload, meta), header["created"]))
    again, stderr = _compiles(cache)
    assert again["compiles"] == 1 and "Traceback" not in stderr
    assert field in stderr  # the warning names what was wrong
    third, _ = _compiles(cache)
    assert third["compiles"] == 0 and third["from"] == "disk"


# ---------------------------------------------------------------------- a real second user
INTRUDER = "cuforge-intruder"


def _intruder() -> tuple[int, int] | None:
    """(uid, gid) of a real second user (made once with useradd), or None when this
    process cannot make or become one (not root)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return None
    import pwd

    try:
        pw = pwd.getpwnam(INTRUDER)
    except KeyError:
        done = subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", INTRUDER],
            capture_output=True,
            check=False,
        )
        if done.returncode != 0:
            return None
        pw = pwd.getpwnam(INTRUDER)
    return pw.pw_uid, pw.pw_gid


PLANT = """
import sys
from cuforge.store.base import Entry
from cuforge.store.entry_codec import encode_entry
path, key = sys.argv[1], sys.argv[2]
import os
os.unlink(path)  # the fan-out dir is world-writable: replace the entry outright
with open(path, "wb") as f:
    f.write(encode_entry(Entry(key, "kernel", b"EVIL" * 64, {"name": "k.cu"})))
"""


def test_a_second_user_cannot_plant_an_entry_through_a_fan_out_dir(tmp_path):
    """Issue 20, item 3: a team dir was `chmod -R 777`, then the old advice (`chmod go-w`
    on the cache dir and the four dirs it checked) was followed, leaving the fan-out dirs
    `v1/entries/ab/cd` world-writable. Another user replaced an entry there. Now every
    directory on the way to an entry is checked: the planted entry is never served."""
    ids = _intruder()
    if ids is None:
        pytest.skip("needs root and setpriv to act as a second, real user")
    import pathlib
    import tempfile

    team = pathlib.Path(tempfile.mkdtemp(prefix="cuforge-team-", dir="/tmp"))  # reachable
    try:
        _plant_through_fan_out(team, ids)
    finally:
        shutil.rmtree(team, ignore_errors=True)


def _plant_through_fan_out(team, ids) -> None:
    cache = team / "cache"
    first, _ = _compiles(str(cache))
    assert first["compiles"] == 1
    subprocess.run(["chmod", "-R", "777", str(team)], check=True)
    for sub in ("", "v1", "v1/entries", "v1/index", "locks"):  # the old, partial advice
        os.chmod(cache / sub if sub else cache, 0o755)
    entries = [
        os.path.join(d, f)
        for d, _, files in os.walk(cache / "v1" / "entries")
        for f in files
        if len(f) == 64
    ]
    kernel = [p for p in entries if b'"kernel"' in open(p, "rb").read(4096)]
    assert kernel, entries
    target = kernel[0]
    uid, gid = ids
    planted = subprocess.run(
        ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", sys.executable,
         "-c", PLANT, target, os.path.basename(target)],
        env=child_env(), capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert planted.returncode == 0, planted.stderr
    assert os.stat(target).st_uid == uid  # the other user's file is in place
    got, stderr = _compiles(str(cache))
    assert got["compiles"] == 1 and got["from"] == "compiled"  # never served
    assert os.path.dirname(target) in stderr and "chmod -R go-w" in stderr
