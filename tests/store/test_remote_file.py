"""The file:// remote: a directory shared between machines, used by real processes."""

from __future__ import annotations

import os
import stat

import pytest

from cuforge.store.remote.base import RemoteError
from cuforge.store.remote.envelope import namespace
from cuforge.store.remote.file import FileBackend

from .helpers import child_env, finish, key_of, run_child, spawn


def _backend(shared) -> FileBackend:
    return FileBackend(f"file://{shared}", namespace=namespace(), connect_timeout=0.1, timeout=1)


def test_layout_and_atomic_publish(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    b = _backend(shared)
    key = key_of(1)
    b.put("kernel", key, b"value-1")
    path = shared / namespace() / "kernel" / key[:2] / key
    assert path.read_bytes() == b"value-1" and b.get("kernel", key) == b"value-1"
    assert b.contains("kernel", key) and not b.contains("object", key)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    b.put("kernel", key, b"value-2")  # replaced by a rename, no temp file left behind
    assert b.get("kernel", key) == b"value-2"
    assert os.listdir(path.parent) == [key]
    assert b.get("kernel", key_of(2)) is None


def test_refuses_symlinks_non_files_and_oversize(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    b = _backend(shared)
    secret = tmp_path / "secret"
    secret.write_bytes(b"not yours")
    key = key_of(1)
    path = b.path_for("kernel", key)
    os.makedirs(os.path.dirname(path))
    os.symlink(secret, path)
    with pytest.raises(RemoteError):
        b.get("kernel", key)
    os.unlink(path)
    os.mkfifo(path)  # a FIFO must not hang the read
    with pytest.raises(RemoteError):
        b.get("kernel", key)
    os.unlink(path)
    with open(path, "wb") as f:
        f.write(b"x" * 100)
    b.max_bytes = 99  # (CUFORGE_REMOTE_MAX_BYTES)
    with pytest.raises(RemoteError, match="cap"):
        b.get("kernel", key)
    with pytest.raises(ValueError):
        b.path_for("kernel", "../../etc")


def test_missing_share_is_an_error_not_a_local_write(tmp_path):
    b = _backend(tmp_path / "not-mounted")
    with pytest.raises(RemoteError, match="missing"):
        b.put("kernel", key_of(1), b"x")
    with pytest.raises(RemoteError, match="missing"):
        b.get("kernel", key_of(1))
    assert not (tmp_path / "not-mounted").exists()


STORE_CHILD = """
import json, os
from cuforge import default_cache
from cuforge.store.base import Entry
s = default_cache().store
key = {key!r}
if {write!r}:
    s.put(Entry(key, "kernel", b"payload-" + key.encode(), {{"name": "k.cu"}}))
    print(json.dumps({{"tiers": [t.tier for t in s.tiers]}}))
else:
    e, tier = s.get_with_tier(key, kind="kernel")
    print(json.dumps({{"tier": tier, "payload": e.payload.decode() if e else None}}))
"""


def test_two_processes_share_through_the_directory(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    key = key_of(7)
    common = {"CUFORGE_REMOTE": f"file://{shared}", "CUFORGE_REMOTE_KEY": "k"}
    a = run_child(
        STORE_CHILD.format(key=key, write=True),
        child_env(CUFORGE_CACHE_DIR=str(tmp_path / "a"), **common),
    )
    assert a["tiers"] == ["memory", "disk", "remote"]
    b = run_child(
        STORE_CHILD.format(key=key, write=False),
        child_env(CUFORGE_CACHE_DIR=str(tmp_path / "b"), **common),
    )
    assert b == {"tier": "remote", "payload": "payload-" + key}
    # a reader with another key refuses it
    c = run_child(
        STORE_CHILD.format(key=key, write=False),
        child_env(CUFORGE_CACHE_DIR=str(tmp_path / "c"), **{**common, "CUFORGE_REMOTE_KEY": "x"}),
    )
    assert c == {"tier": None, "payload": None}


def test_concurrent_writers_of_one_key(tmp_path):
    """Many processes publishing the same key at once: readers only ever see whole values."""
    shared = tmp_path / "shared"
    shared.mkdir()
    key = key_of(8)
    code = """
    import json
    from cuforge.store.remote.envelope import namespace
    from cuforge.store.remote.file import FileBackend
    from cuforge.store.remote.tier import RemoteStore
    from cuforge.store.base import Entry
    t = RemoteStore(FileBackend({url!r}, namespace=namespace(), connect_timeout=0.1, timeout=1))
    seen = set()
    for i in range(50):
        t.put(Entry({key!r}, "kernel", bytes([{n}]) * 100000, {{"name": "k.cu"}}))
        e = t.get({key!r}, kind="kernel")
        seen.add(None if e is None else (len(e.payload), len(set(e.payload))))
    print(json.dumps({{"seen": sorted(map(str, seen)), "errors": t.stats().errors}}))
    """
    env = child_env(CUFORGE_CACHE_DIR=str(tmp_path / "c"))
    procs = [spawn(code.format(url=f"file://{shared}", key=key, n=n), env) for n in range(4)]
    for p in procs:
        out = finish(p)
        assert out == {"seen": [str((100000, 1))], "errors": 0}
    leftovers = [n for n in os.listdir(os.path.dirname(_backend(shared).path_for("kernel", key)))]
    assert leftovers == [key]


KERNEL = r"""
extern "C" __global__ void scale(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= 2.0f;
}
"""

COMPILE_CHILD = """
import json, cuforge
from cuforge.core.pipeline import counters
p = cuforge.compile_file({src!r})
print(json.dumps({{"compiles": counters["compiles"], "source": p.source_of_result}}))
"""


def test_two_machines_one_shared_dir_compile_nothing(tmp_path):
    """Two machines (two local cache dirs), one file:// remote: B compiles nothing."""
    shared = tmp_path / "shared"
    shared.mkdir()
    src = tmp_path / "scale.cu"
    src.write_text(KERNEL)
    code = COMPILE_CHILD.format(src=str(src))
    common = {"CUFORGE_REMOTE": f"file://{shared}", "CUFORGE_ARCH": "sm_90"}
    a = run_child(code, child_env(CUFORGE_CACHE_DIR=str(tmp_path / "a"), **common))
    assert a == {"compiles": 1, "source": "compiled"}
    b = run_child(code, child_env(CUFORGE_CACHE_DIR=str(tmp_path / "b"), **common))
    assert b == {"compiles": 0, "source": "remote"}
