"""The file:// remote: a directory shared between machines, used by real processes."""

from __future__ import annotations

import os
import stat

import pytest

from cuforge import Cache
from cuforge.store.base import Entry
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


LOOKUP_CHILD = """
import sys
before = set(sys.modules)
import cuforge
cache = cuforge.Cache({cache_dir!r}, remotes=[{url!r}])
e, tier = cache.get_with_tier({key!r}, kind="kernel")
again, local = cache.replace().get_with_tier({key!r}, kind="kernel")  # the copy on disk
new = sorted(set(sys.modules) - before)
import json
print(json.dumps({{"tier": tier, "local": local, "payload": e.payload.decode() if e else None,
                  "new": new}}))
"""

#: what a file:// lookup has no use for: the other backends and their helpers, signing
#: (no key is configured), and the standard-library modules they, a URL parser or
#: :mod:`json` would bring (urllib.parse, re, json, hmac: ~10-20 ms where none is loaded)
NOT_FOR_FILE = (
    "cuforge.store.remote.http",
    "cuforge.store.remote.redis",
    "cuforge.store.remote.resp",
    "cuforge.store.remote.s3",
    "cuforge.store.remote.proxy",
    "cuforge.store.remote.sync",
    "cuforge.store.remote.plugin",
    "cuforge.base.signing",
    "cuforge.base.errors",  # nothing is raised: the errors load with the first one
    "cryptography",
    "redis",
    "boto3",
    "http.client",
    "urllib.parse",
    "re",
    "json",
    "hmac",
)


def test_a_file_remote_lookup_imports_no_other_backend(tmp_path):
    """A fresh process with a fresh cache dir and a file:// remote: its first lookup (a
    remote hit, copied to the disk) and a lookup from the disk copy import no other
    backend's module (http, redis, s3, the plug-in loader), no signing module (no key is
    configured), not the errors and none of urllib.parse, re, json, hmac (``sys.modules``
    before ``import cuforge`` against after the lookups)."""
    shared = tmp_path / "shared"
    shared.mkdir()
    key = key_of("file-lookup")
    url = f"file://{shared}"
    writer = Cache(tmp_path / "a", remotes=[url])
    assert writer.put(Entry(key, "kernel", b"payload-" + key.encode(), {"name": "k.cu"}))
    out = run_child(LOOKUP_CHILD.format(cache_dir=str(tmp_path / "b"), url=url, key=key))
    assert (out["tier"], out["local"], out["payload"]) == ("remote", "disk", "payload-" + key)
    assert "cuforge.store.remote.file" in out["new"]  # it did open the file:// backend
    assert not [m for m in NOT_FOR_FILE if m in out["new"]]


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


# -- native host code from an unsigned share (issue 35, item 5) -------------------------------

#: one entry of each kind of native host code, and a Triton kernel group (device code)
_NATIVE = [
    ("module", {"name": "ext_mod"}),
    ("object", {"name": "ext.o"}),
    ("triton", {"name": "cuda_utils", "native_module": True, "backend": "triton"}),
]


def _planted(shared, **kw):
    """A tier over ``shared`` (RemoteStore keyword arguments ``kw``) and the entries an
    earlier writer with the same signing planted there: the native ones, then a kernel
    group."""
    from cuforge.store.base import Entry
    from cuforge.store.remote.tier import RemoteStore

    entries = [Entry(key_of(f"n{i}"), kind, os.urandom(500), meta) for i, (kind, meta) in
               enumerate(_NATIVE)]  # fmt: skip
    entries.append(Entry(key_of("group"), "triton", os.urandom(500), {"name": "add_kernel"}))
    writer = RemoteStore(_backend(shared), **kw)
    for e in entries:
        assert writer.put(e)
    return RemoteStore(_backend(shared), **kw), entries


def test_an_unsigned_share_serves_no_native_host_code(tmp_path, caplog, capsys, monkeypatch):
    import logging

    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    reader, entries = _planted(shared)
    *native, group = entries
    monkeypatch.setenv("CUFORGE_VERBOSE", "1")
    with caplog.at_level(logging.WARNING, logger="cuforge"):
        for e in native:
            assert reader.get(e.key, kind=e.kind) is None  # a miss: built locally
        assert reader.get_many([(e.kind, e.key) for e in native]) == [None] * 3
        assert reader.get(group.key, kind="triton").payload == group.payload  # device code
    stats = reader.stats()
    assert stats.rejected == 6 and stats.extra["refused_native"] == 6 and stats.hits == 1
    warnings = [r.getMessage() for r in caplog.records if "native host code" in r.getMessage()]
    assert len(warnings) == 1 and "CUFORGE_REMOTE_NATIVE=allow" in warnings[0]
    err = capsys.readouterr().err
    assert err.count("refused") == 6 and "refused triton 'cuda_utils'" in err
    # the setting allows them, explicitly
    monkeypatch.setenv("CUFORGE_REMOTE_NATIVE", "allow")
    for e in native:
        assert reader.get(e.key, kind=e.kind).payload == e.payload
    monkeypatch.setenv("CUFORGE_REMOTE_NATIVE", "sometimes")
    from cuforge.base.config import settings
    from cuforge.base.errors import ConfigError

    with pytest.raises(ConfigError, match="CUFORGE_REMOTE_NATIVE"):
        settings()


def test_a_signed_share_serves_native_host_code(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    reader, entries = _planted(shared, secret=b"team-secret")
    for e in entries:
        assert reader.get(e.key, kind=e.kind).payload == e.payload
    assert reader.stats().extra["refused_native"] == 0 and reader.stats().rejected == 0


def test_a_group_writable_share_warns_once(tmp_path, caplog):
    import logging

    from cuforge.store.base import Entry
    from cuforge.store.remote.tier import RemoteStore

    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o775)  # a team share: the group writes, others do not
    writer = RemoteStore(_backend(shared))
    e1 = Entry(key_of(1), "kernel", b"one", {"name": "k.cu"})
    e2 = Entry(key_of(2), "kernel", b"two", {"name": "k.cu"})
    assert writer.put(e1) and writer.put(e2)
    reader = RemoteStore(_backend(shared))
    with caplog.at_level(logging.WARNING, logger="cuforge"):
        assert reader.get(e1.key, kind="kernel").payload == b"one"
        assert reader.get(e2.key, kind="kernel").payload == b"two"
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert str(shared) in warning and "writable by its group" in warning
    assert "chmod" in warning and "CUFORGE_REMOTE_KEY" in warning
    assert reader.backend.share_problem() is None  # doctor fails only world-writable shares
