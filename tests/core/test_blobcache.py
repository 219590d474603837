"""cuforge.core.blobcache: the cached "build named blobs" pipeline integrations use."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap

import pytest

from cuforge import default_cache
from cuforge.core import blobcache
from cuforge.core.blobcache import BlobFormatError, get_or_build, pack, unpack
from cuforge.keys.explain import recent_misses
from tests.conftest import child_env, run_python


class Builder:
    """Counts builds; builds two named files from a value."""

    def __init__(self, value: bytes = b"v1"):
        self.value = value
        self.calls = 0

    def __call__(self):
        self.calls += 1
        return {"main.bin": self.value, "extra.txt": b"x" * 10}


def load(files):
    return files["main.bin"].decode()


def entry_files(cache_dir) -> list[str]:
    root = os.path.join(cache_dir, "v1", "entries")
    return [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if not f.startswith(".")]


def test_pack_round_trip_and_malformed_payloads():
    files = {"a": b"", "b.o": bytes(range(256)) * 3, "ü": b"\0"}
    assert unpack(pack(files)) == files
    blob = pack(files)
    for bad in (b"", b"nope", blob[:-1], blob + b"!", blob.replace(b"blobs\0", b"blobz\0")):
        with pytest.raises(BlobFormatError):
            unpack(bad)


def test_miss_then_memory_hit_then_disk_hit_in_a_fresh_process(isolated_cache):
    build = Builder()
    first = get_or_build("cccl", "t/sum", {"dtype": "int32", "cc": "9.0"}, build, load)
    assert (first.value, first.source_of_result, build.calls) == ("v1", "compiled", 1)
    assert first.fields["dtype"] == "int32" and first.reason is None
    again = get_or_build("cccl", "t/sum", {"cc": "9.0", "dtype": "int32"}, build, load)
    assert (again.source_of_result, again.key, build.calls) == ("memory", first.key, 1)
    assert again.hit
    assert len(entry_files(isolated_cache)) == 1

    out = run_python(
        """
        import json
        from cuforge.core.blobcache import get_or_build
        def build():
            raise AssertionError("a hit must never build")
        r = get_or_build("cccl", "t/sum", {"dtype": "int32", "cc": "9.0"}, build,
                         lambda f: f["main.bin"].decode())
        print(json.dumps([r.value, r.source_of_result, r.key]))
        """
    )
    assert out == ["v1", "disk", first.key]


def test_fields_change_the_key_and_explain_says_which(isolated_cache):
    build = Builder()
    a = get_or_build("cccl", "t/sum", {"dtype": "int32"}, build, load)
    b = get_or_build("cccl", "t/sum", {"dtype": "float32"}, build, load)
    assert a.key != b.key and build.calls == 2
    misses = recent_misses(str(isolated_cache))
    assert misses[-1]["name"] == "t/sum"
    assert misses[-1]["reasons"] == ["dtype int32 -> float32"]


def test_kind_is_part_of_the_key():
    build = Builder()
    a = get_or_build("cccl", "t/x", {"f": "1"}, build, load)
    b = get_or_build("cute", "t/x", {"f": "1"}, build, load)
    assert a.key != b.key and build.calls == 2
    with pytest.raises(ValueError, match="unknown entry kind"):
        get_or_build("nope", "t/x", {"f": "1"}, build, load)


def test_a_load_error_deletes_rebuilds_and_overwrites(isolated_cache, caplog):
    good = get_or_build("cccl", "t/sum", {"f": "1"}, Builder(b"good"), load)
    store = default_cache().store
    from cuforge.store.base import Entry

    entry = store.get(good.key)
    store.put(Entry(good.key, "cccl", pack({"main.bin": b"\xff\xfe"}), entry.meta))  # not UTF-8
    rebuild = Builder(b"fixed")
    with caplog.at_level(logging.WARNING, logger="cuforge"):
        fixed = get_or_build("cccl", "t/sum", {"f": "1"}, rebuild, load)
    assert (fixed.value, fixed.source_of_result, rebuild.calls) == ("fixed", "compiled", 1)
    assert "UnicodeDecodeError" in caplog.text and "rebuilt" in caplog.text
    assert blobcache.counters["cccl:load_errors"] >= 1
    # overwritten: the next lookup (from disk, in a fresh process) serves the new bytes
    out = run_python(
        """
        import json
        from cuforge.core.blobcache import get_or_build
        r = get_or_build("cccl", "t/sum", {"f": "1"}, lambda: {"main.bin": b"WRONG"},
                         lambda f: f["main.bin"].decode())
        print(json.dumps([r.value, r.source_of_result]))
        """
    )
    assert out == ["fixed", "disk"]


def test_a_corrupt_file_on_disk_is_rebuilt(isolated_cache):
    first = get_or_build("cccl", "t/sum", {"f": "1"}, Builder(b"good"), load)
    (path,) = entry_files(isolated_cache)
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF
    with open(path, "wb") as f:
        f.write(data)
    out = run_python(
        """
        import json
        from cuforge.core.blobcache import get_or_build
        r = get_or_build("cccl", "t/sum", {"f": "1"}, lambda: {"main.bin": b"again"},
                         lambda f: f["main.bin"].decode())
        print(json.dumps([r.value, r.source_of_result, r.key]))
        """
    )
    assert out == ["again", "compiled", first.key]


def test_a_failing_build_or_load_stores_nothing(isolated_cache):
    def broken():
        raise RuntimeError("compiler exploded")

    with pytest.raises(RuntimeError, match="exploded"):
        get_or_build("cccl", "t/sum", {"f": "1"}, broken, load)

    def unloadable(files):
        raise ValueError("cannot load fresh build")

    with pytest.raises(ValueError, match="fresh build"):
        get_or_build("cccl", "t/sum", {"f": "1"}, Builder(), unloadable)
    assert entry_files(isolated_cache) == []
    with pytest.raises(TypeError, match="expected bytes"):
        get_or_build("cccl", "t/sum", {"f": "1"}, lambda: {"a": "text"}, load)
    with pytest.raises(TypeError, match="must be a str"):
        get_or_build("cccl", "t/sum", {"f": 1}, Builder(), load)


def test_uncacheable_builds_every_time_and_says_why(isolated_cache, caplog):
    build = Builder()
    with caplog.at_level(logging.WARNING, logger="cuforge"):
        for _ in range(2):
            r = get_or_build(
                "cccl", "t/sum", {"f": "1"}, build, load, uncacheable="op holds a lock"
            )
            assert (r.source_of_result, r.reason) == ("uncached", "op holds a lock")
    assert build.calls == 2
    assert caplog.text.count("op holds a lock") == 1  # warned once
    assert entry_files(isolated_cache) == []
    assert recent_misses(str(isolated_cache))[-1]["reasons"] == ["not cached: op holds a lock"]


def test_disable_cache_and_disable_file_cache(isolated_cache, monkeypatch):
    build = Builder()
    monkeypatch.setenv("CUFORGE_DISABLE_CACHE", "1")
    for _ in range(2):
        assert get_or_build("cccl", "t/a", {"f": "1"}, build, load).source_of_result == "compiled"
    assert build.calls == 2 and not os.path.exists(isolated_cache / "v1")
    monkeypatch.delenv("CUFORGE_DISABLE_CACHE")
    monkeypatch.setenv("CUFORGE_DISABLE_FILE_CACHE", "1")
    assert get_or_build("cccl", "t/a", {"f": "1"}, build, load).source_of_result == "compiled"
    assert get_or_build("cccl", "t/a", {"f": "1"}, build, load).source_of_result == "memory"
    assert build.calls == 3 and entry_files(isolated_cache) == []


def test_cache_dir_setting_is_obeyed(tmp_path, monkeypatch):
    other = tmp_path / "elsewhere"
    monkeypatch.setenv("CUFORGE_CACHE_DIR", str(other))
    get_or_build("cute", "t/a", {"f": "1"}, Builder(), load)
    assert len(entry_files(other)) == 1


def test_single_flight_across_processes(isolated_cache, tmp_path):
    """Four processes ask for the same new key at once: exactly one builds."""
    counter = tmp_path / "builds.txt"
    go = tmp_path / "go"
    code = textwrap.dedent(
        f"""
        import json, os, time
        from cuforge.core.blobcache import get_or_build
        while not os.path.exists({str(go)!r}):
            time.sleep(0.005)
        def build():
            with open({str(counter)!r}, "a") as f:
                f.write("x")
            time.sleep(1.0)
            return {{"main.bin": b"shared"}}
        r = get_or_build("cccl", "t/flight", {{"f": "1"}}, build, lambda f: f["main.bin"].decode())
        print(json.dumps([r.value, r.source_of_result]))
        """
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    go.write_text("")
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        results.append(out.strip().splitlines()[-1])
    assert counter.read_text() == "x"
    assert sorted(results).count('["shared", "compiled"]') == 1
    assert sorted(results).count('["shared", "disk"]') == 3


def test_cli_lists_and_explains_the_new_kinds(isolated_cache):
    get_or_build("cccl", "cccl/make_reduce_into", {"compute_capability": "9.0"}, Builder(), load)
    get_or_build("cute", "cute/add", {"arch": "sm_90a"}, Builder(), load)
    env = child_env()
    ls = subprocess.run(
        [sys.executable, "-m", "cuforge", "cache", "ls"], env=env, capture_output=True, text=True
    )
    assert ls.returncode == 0, ls.stderr
    assert "cccl" in ls.stdout and "cccl/make_reduce_into" in ls.stdout
    assert "cute" in ls.stdout and "cute/add" in ls.stdout and "sm_90a" in ls.stdout
    stats = subprocess.run(
        [sys.executable, "-m", "cuforge", "cache", "stats"], env=env, capture_output=True, text=True
    )
    assert stats.returncode == 0, stats.stderr


def test_offline_mode_serves_hits_and_never_builds(isolated_cache, monkeypatch):
    from cuforge.core.blobcache import OfflineBuildError

    build = Builder()
    get_or_build("cccl", "t/a", {"f": "1"}, build, load)
    monkeypatch.setenv("CUFORGE_OFFLINE", "1")
    assert get_or_build("cccl", "t/a", {"f": "1"}, build, load).hit
    with pytest.raises(OfflineBuildError, match="not in the cache") as info:
        get_or_build("cccl", "t/a", {"f": "2"}, build, load)
    assert info.value.fields["f"] == "2" and "t/a" in str(info.value)
    with pytest.raises(OfflineBuildError, match="cannot be cached"):
        get_or_build("cccl", "t/a", {"f": "1"}, build, load, uncacheable="a lock")
    assert build.calls == 1


def test_show_and_explain_speak_of_integration_entries(isolated_cache):
    a = get_or_build("cccl", "cccl/make_x", {"arg:op": "op " + "a" * 64}, Builder(), load)
    get_or_build("cccl", "cccl/make_x", {"arg:op": "op " + "b" * 64}, Builder(), load)
    reasons = recent_misses(str(isolated_cache))[-1]["reasons"]
    assert reasons == [
        "arg:op changed (the function: its code, a default, a closure value or a global it reads)"
    ]
    show = subprocess.run(
        [sys.executable, "-m", "cuforge", "cache", "show", a.key[:16]],
        env=child_env(),
        capture_output=True,
        text=True,
    )
    assert show.returncode == 0, show.stderr
    assert "cccl/make_x" in show.stdout and "key fields:" in show.stdout
    assert "main.bin" in show.stdout  # the files it holds
    assert "compiler log" not in show.stdout  # an integration's build has none
