"""Issue 20 (attack pass), items 7, 8 and 13: a bundle is code, so it is served only as
checked, from a file this user trusts, and writing one never replaces what is not a
regular file. Real files, real processes: a bundle rewritten or cut short in place after
it was loaded, one owned by another user, group-writable or reached through a symlink,
hand-written hostile indexes (duplicate keys, an empty kernel, odd ``info`` fields, a
deep index, overlapping rows) and FIFO / symlink / directory destinations."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import stat
import subprocess
import sys
import textwrap

import pytest

import cuforge
from cuforge.aot.bundle import load_bundle
from cuforge.store.base import Entry
from cuforge.store.bundle import BundleError, BundleStore, write_bundle_file
from tests.aot.conftest import cli
from tests.bundle_files import raw_bundle as write_raw_bundle
from tests.conftest import child_env

META = {"name": "k.cu", "arch": "sm_90", "backend": "nvrtc", "output": "cubin"}
SIZE = 4096  # each payload fills a page: a truncation leaves the later ones unmapped


def key_of(i: int) -> str:
    return hashlib.sha256(str(i).encode()).hexdigest()


def good_bundle(path, n: int = 3) -> list[Entry]:
    """``n`` kernels of SIZE bytes each (entry i holds the byte i + 1), written by cuforge."""
    entries = [
        Entry(key_of(i), "kernel", bytes([i + 1]) * SIZE, {**META, "name": f"k{i}.cu"})
        for i in range(n)
    ]
    write_bundle_file(str(path), entries, {"cuforge_version": cuforge.__version__})
    return entries


def raw_bundle(path, rows: list[dict], body: bytes, info=None, index: bytes | None = None):
    """:func:`tests.bundle_files.raw_bundle`, each row a kernel with META unless it says."""
    rows = [{"kind": "kernel", "meta": META, **row} for row in rows]
    write_raw_bundle(path, rows, body, info=info, index=index)


def entry_files(cache_dir: str) -> list[str]:
    return [f for _, _, files in os.walk(os.path.join(cache_dir, "v1", "entries")) for f in files]


# -- item 8: served bytes are checked bytes; a shrunk file is an error, not a SIGBUS ------


@pytest.mark.parametrize("verify", [True, False])
def test_an_entry_rewritten_in_place_after_loading_is_refused_never_served(tmp_path, verify):
    path = tmp_path / "app.cfb"
    entries = good_bundle(path)
    tier = load_bundle(path, verify=verify, cache=cuforge.Cache(directory=str(tmp_path / "c")))
    assert tier.get(entries[0].key).payload == entries[0].payload  # served (and checked) once
    with open(path, "r+b") as f:  # same size, other bytes: entries 0 and 1
        f.seek(96)
        f.write(b"\xcc" * (2 * SIZE))
    for entry in entries[:2]:  # the one served before and one never served
        with pytest.raises(BundleError, match="fails its SHA-256 check") as caught:
            tier.get(entry.key)
        assert str(path) in str(caught.value)
    assert tier.get(entries[2].key).payload == entries[2].payload  # untouched: still served


def test_a_bundle_cut_short_in_place_is_an_error_naming_it_never_a_sigbus(tmp_path):
    path = tmp_path / "app.cfb"
    entries = good_bundle(path)
    code = f"""
        import json, os
        from cuforge.store.bundle import BundleError, BundleStore
        store = BundleStore({str(path)!r})
        os.truncate({str(path)!r}, 100)
        try:
            store.get({entries[2].key!r})
            print(json.dumps({{"served": True}}))
        except BundleError as exc:
            print(json.dumps({{"error": str(exc)}}))
    """
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode != -signal.SIGBUS, "the process died of SIGBUS"
    assert done.returncode == 0, done.stderr
    error = json.loads(done.stdout)["error"]
    assert str(path) in error and "cut short" in error and "now 100 bytes" in error


# -- item 13: trust, symlinks, a damaged or hostile index ---------------------------------


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_a_bundle_owned_by_another_user_is_refused(tmp_path):
    path = tmp_path / "app.cfb"
    good_bundle(path)
    os.chown(path, 65534, 65534)
    with pytest.raises(BundleError) as caught:
        BundleStore(path)
    text = str(caught.value)
    assert str(path) in text and "owned by" in text and "chown" in text and "cp " in text
    done = cli(tmp_path, "bundle", "install", str(path))  # the CLI refuses it, installs nothing
    assert done.returncode == 1 and "owned by" in done.stderr and "Traceback" not in done.stderr
    assert entry_files(os.environ["CUFORGE_CACHE_DIR"]) == []


@pytest.mark.parametrize(("mode", "who"), [(0o664, "group"), (0o646, "others")])
def test_a_group_or_world_writable_bundle_is_refused(tmp_path, mode, who):
    path = tmp_path / "app.cfb"
    good_bundle(path)
    os.chmod(path, mode)
    with pytest.raises(BundleError) as caught:
        load_bundle(path, cache=cuforge.Cache(directory=str(tmp_path / "c")))
    text = str(caught.value)
    assert str(path) in text and f"writable by {who}" in text and "chmod go-w" in text


def test_a_bundle_reached_through_a_symlink_loads_with_one_warning(tmp_path, caplog):
    import pwd

    path = tmp_path / "real.cfb"
    entries = good_bundle(path)
    link = tmp_path / "link.cfb"
    link.symlink_to(path)
    with caplog.at_level(logging.WARNING, logger="cuforge"):
        for n in range(2):  # two caches, two loads: one warning
            cache = cuforge.Cache(directory=str(tmp_path / f"c{n}"), bundles=[link])
            (tier,) = cache.bundles
            assert tier.path == str(path)
            assert tier.get(entries[0].key).payload == entries[0].payload
    warnings = [r.getMessage() for r in caplog.records if "symlink" in r.getMessage()]
    assert len(warnings) == 1
    owner = pwd.getpwuid(os.geteuid()).pw_name
    assert str(link) in warnings[0] and str(path) in warnings[0] and owner in warnings[0]


def test_a_bundle_with_a_key_twice_is_refused(tmp_path):
    path = tmp_path / "dup.cfb"
    rows = [{"key": key_of(1), "at": 0, "size": 10}, {"key": key_of(1), "at": 10, "size": 10}]
    raw_bundle(path, rows, os.urandom(20))
    with pytest.raises(BundleError, match="rows 0 and 1 have the same key"):
        BundleStore(path)


def test_an_empty_kernel_is_refused_an_empty_manifest_is_not(tmp_path):
    path = tmp_path / "empty.cfb"
    raw_bundle(path, [{"key": key_of(1), "at": 0, "size": 0}], b"")
    with pytest.raises(BundleError, match="kernel with an empty payload"):
        BundleStore(path)
    raw_bundle(path, [{"key": key_of(1), "kind": "manifest", "meta": {}, "at": 0, "size": 0}], b"")
    assert BundleStore(path).get(key_of(1)).payload == b""
    with pytest.raises(ValueError, match="kernel with an empty payload"):
        write_bundle_file(str(tmp_path / "w.cfb"), [Entry(key_of(1), "kernel", b"", META)], {})


def test_bundle_ls_shows_odd_info_fields_as_written(tmp_path):
    path = tmp_path / "odd.cfb"
    row = [{"key": key_of(1), "at": 0, "size": 8}]
    info = {
        "toolchain": "nvcc 12.4",
        "archs": "sm_90",
        "variants": 3,
        "created": "yesterday",
        "cuforge_version": [1, 2],
    }
    raw_bundle(path, [dict(r) for r in row], b"12345678", info=info)
    done = cli(tmp_path, "bundle", "ls", str(path))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    for shown in ("nvcc 12.4", "sm_90", "yesterday", "[1, 2]"):
        assert shown in done.stdout
    raw_bundle(path, [dict(r) for r in row], b"12345678", info=["not", "an", "object"])
    done = cli(tmp_path, "bundle", "ls", str(path))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "info is a list, not an object" in done.stdout
    raw_bundle(path, [dict(r) for r in row], b"12345678", info={"created": 1e300})
    assert cli(tmp_path, "bundle", "ls", str(path)).returncode == 0


@pytest.mark.parametrize("depth", [100, 200_000])
def test_a_deeply_nested_index_is_a_damaged_bundle(tmp_path, depth):
    path = tmp_path / "deep.cfb"
    deep = "[" * depth + "]" * depth
    index = ('{"format": 1, "entries": [], "info": {"x": ' + deep + "}}").encode()
    raw_bundle(path, [], b"", index=index)
    with pytest.raises(BundleError, match="nests") as caught:
        BundleStore(path)
    assert str(path) in str(caught.value)
    done = cli(tmp_path, "bundle", "ls", str(path), "--json")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert json.loads(done.stdout)["error"]["kind"] == "BundleError"


def test_overlapping_rows_are_refused_and_install_amplifies_nothing(tmp_path):
    path = tmp_path / "overlap.cfb"
    body = os.urandom(64 * 1024)
    rows = [{"key": key_of(i), "at": 0, "size": len(body)} for i in range(50)]  # 50 x the body
    raw_bundle(path, rows, body)
    with pytest.raises(BundleError, match="overlap"):
        BundleStore(path)
    done = cli(tmp_path, "bundle", "install", str(path))
    assert done.returncode == 1 and "overlap" in done.stderr
    assert entry_files(os.environ["CUFORGE_CACHE_DIR"]) == []
    # a partial overlap too
    raw_bundle(
        path,
        [{"key": key_of(1), "at": 0, "size": 100}, {"key": key_of(2), "at": 50, "size": 100}],
        body,
    )
    with pytest.raises(BundleError, match="overlap"):
        BundleStore(path)


# -- item 7: writing a bundle never replaces what is not a regular file ------------------


def _destinations(tmp_path):
    """A FIFO (stands in for a device such as /dev/null: safe if the check regresses), a
    symlink to a file that must keep its bytes, and a directory."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    keep = tmp_path / "keep.txt"
    keep.write_bytes(b"keep me")
    link = tmp_path / "link.cfb"
    link.symlink_to(keep)
    directory = tmp_path / "dir.cfb"
    directory.mkdir()
    return fifo, link, directory, keep


def _untouched(fifo, link, directory, keep) -> None:
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert link.is_symlink() and keep.read_bytes() == b"keep me"
    assert directory.is_dir()


def test_write_bundle_file_never_replaces_what_is_not_a_regular_file(tmp_path):
    places = _destinations(tmp_path)
    entries = [Entry(key_of(1), "kernel", b"x" * 10, META)]
    for place in places[:3]:
        with pytest.raises(ValueError, match="not a regular file") as caught:
            write_bundle_file(str(place), entries, {})
        assert str(place) in str(caught.value)
    _untouched(*places)


def test_build_bundle_refuses_a_non_regular_destination_before_building(project, tmp_path):
    places = _destinations(tmp_path)
    for place in places[:3]:
        done = cli(project, "build", "--jobs", "1", "--bundle", str(place))
        assert done.returncode == 1, done.stderr
        assert str(place) in done.stderr and "not a regular file" in done.stderr
    _untouched(*places)
    assert entry_files(os.environ["CUFORGE_CACHE_DIR"]) == []  # nothing was built
