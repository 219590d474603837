"""One contract over every system adapter (issue 22): cuforge.cuda_core always (it is in
the test extra), cuforge.jax and cuforge.cupy where installed. Each adapter is driven
through the system's own hook object (cuda.core's ProgramCacheResource, JAX's
CacheInterface, CuPy's KernelCacheBackend) over a real cuforge.Cache:

* a corrupt entry reads as missing (the system compiles again), never raises;
* entries count against the one LRU cap: the oldest is evicted, the cap holds;
* a dead remote costs at most its timeout, and the local tiers keep working;
* a reader that requires signatures (CUFORGE_REMOTE_KEY) refuses an unsigned writer's
  entries."""

from __future__ import annotations

import importlib.util
import socket
import time

import pytest

import cuforge
from cuforge.store.base import Entry


class Face:
    """put/get of bytes through the system's hook object; ``key(k)``: the cuforge key."""

    def __init__(self, name, make):
        self.name = name
        self._make = make

    def bind(self, cache):
        hook, put, get, key = self._make(cache)
        self.hook, self.put, self.get, self.key = hook, put, get, key
        return self


def _cuda_core(cache):
    from cuforge.cuda_core import ProgramCache

    pc = ProgramCache(cache)

    def put(k, v):
        pc[k.encode()] = v

    return pc, put, lambda k: pc.get(k.encode()), lambda k: pc.entry_key(k.encode())


def _jax(cache):
    import cuforge.jax as cj

    adapter = cj._adapter_class()(cache)
    return adapter, adapter.put, adapter.get, adapter.entry_key


def _cupy(cache):
    import cuforge.cupy as cc

    b = cc.backend(cache)
    return b, lambda k, v: b.save(k, v, 'extern "C" __global__ void k() {}'), b.load, b.entry_key


def _faces():
    out = []
    if importlib.util.find_spec("cuda") and importlib.util.find_spec("cuda.core"):
        out.append(pytest.param(Face("cuda-core", _cuda_core), id="cuda-core"))
    out.append(
        pytest.param(
            Face("jax", _jax),
            id="jax",
            marks=pytest.mark.skipif(
                not importlib.util.find_spec("jax"), reason="jax is not installed"
            ),
        )
    )
    out.append(
        pytest.param(
            Face("cupy", _cupy),
            id="cupy",
            marks=pytest.mark.skipif(
                not importlib.util.find_spec("cupy"), reason="cupy is not installed"
            ),
        )
    )
    return out


FACES = _faces()


@pytest.mark.parametrize("face", FACES)
def test_round_trip_and_corruption_recompiles(face, tmp_path, caplog):
    cache = cuforge.Cache(tmp_path / "c", memory=False)
    f = face.bind(cache)
    f.put("k1", b"\x7fELF-one")
    assert f.get("k1") == b"\x7fELF-one"
    assert {i.kind for i in cache.iterate()} == {face.name}
    for garbage in (b"", b"not a blob set", b"cuforge-blobs\0\0\0\0\x09"):
        cache.put(Entry(f.key("k1"), face.name, garbage, {"backend": face.name}))
        assert f.get("k1") is None  # the system compiles again
        assert cache.get(f.key("k1")) is None  # and the bad entry is gone
    assert "compiled again" in caplog.text
    f.put("k1", b"\x7fELF-one")
    assert f.get("k1") == b"\x7fELF-one"


@pytest.mark.parametrize("face", FACES)
def test_entries_count_against_the_lru_cap(face, tmp_path):
    cap = 64 * 1024
    cache = cuforge.Cache(tmp_path / "c", memory=False, max_bytes=cap)
    f = face.bind(cache)
    for i in range(12):
        f.put(f"k{i}", bytes([i]) * 16 * 1024)
    assert cache.stats().bytes <= cap
    assert f.get("k0") is None and f.get("k11") == bytes([11]) * 16 * 1024


@pytest.mark.parametrize("face", FACES)
def test_a_dead_remote_is_bounded_by_its_timeout(face, tmp_path, monkeypatch):
    # a server that accepts connections and never answers
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    port = server.getsockname()[1]
    monkeypatch.setenv("CUFORGE_REMOTE_CONNECT_TIMEOUT", "0.2")
    monkeypatch.setenv("CUFORGE_REMOTE_TIMEOUT", "0.3")
    try:
        cache = cuforge.Cache(tmp_path / "c", memory=False, remotes=[f"redis://127.0.0.1:{port}/0"])
        f = face.bind(cache)
        t0 = time.monotonic()
        assert f.get("absent") is None
        f.put("k", b"bytes")
        assert f.get("k") == b"bytes"  # the local tier still serves
        assert time.monotonic() - t0 < 5.0  # a few timeouts at most, never a hang
    finally:
        server.close()


@pytest.mark.parametrize("face", FACES)
def test_a_signed_only_reader_refuses_unsigned_entries(face, tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    remote = [f"file://{shared}"]
    writer = face.bind(cuforge.Cache(tmp_path / "w", memory=False, remotes=remote))
    writer.put("k", b"\x7fELF-unsigned")
    unsigned = face.bind(cuforge.Cache(tmp_path / "u", memory=False, remotes=remote))
    assert unsigned.get("k") == b"\x7fELF-unsigned"  # through the remote
    monkeypatch.setenv("CUFORGE_REMOTE_KEY", "a-team-secret-of-enough-length-0123456789")
    reader = face.bind(cuforge.Cache(tmp_path / "r", memory=False, remotes=remote))
    assert reader.get("k") is None
    signed = face.bind(cuforge.Cache(tmp_path / "s", memory=False, remotes=remote))
    signed.put("k2", b"\x7fELF-signed")
    fresh = face.bind(cuforge.Cache(tmp_path / "r2", memory=False, remotes=remote))
    assert fresh.get("k2") == b"\x7fELF-signed"


@pytest.mark.parametrize(
    "system",
    [
        pytest.param(
            name,
            marks=pytest.mark.skipif(
                not importlib.util.find_spec(name), reason=f"{name} is not installed"
            ),
        )
        for name in ("jax", "cupy")
    ],
)
def test_a_version_outside_the_window_is_probed_not_switched_off(system, monkeypatch, caplog):
    """Outside the tested window the adapter runs its contract probe (a put/get round trip
    through the system's own hook object): passed, it plugs in with one line naming the
    untested version; a failing probe refuses with what is missing."""
    import importlib
    import logging

    from cuforge.adapters import common

    adapter = importlib.import_module(f"cuforge.{system}")
    monkeypatch.setattr(adapter, "SUPPORTED", ((99, 0), (99, 1)))
    monkeypatch.setattr(common, "_probed", {})
    with caplog.at_level(logging.WARNING, logger="cuforge"):
        assert adapter.hook_problem() is None
        assert adapter.hook_problem() is None
    assert caplog.text.count("contract probe passed") == 1
    assert common.VERDICTS[system][0] == "probed"
    monkeypatch.setattr(common, "_probed", {})
    monkeypatch.setattr(adapter, "_probe", lambda: "the hook lost its put()")
    problem = adapter.hook_problem()
    assert problem is not None and "contract probe failed: the hook lost its put()" in problem
    assert common.VERDICTS[system][0] == "refused"


@pytest.mark.skipif(not importlib.util.find_spec("jax"), reason="jax is not installed")
def test_the_jax_cache_object_counts_its_entries(tmp_path):
    """JAX's own tests count the entries of the cache object (``len(cc._cache)``)."""
    import cuforge.jax as cj

    adapter = cj._adapter_class()(cuforge.Cache(tmp_path / "c"))
    assert len(adapter) == 0
    adapter.put("jit_f-1", b"one")
    adapter.put("jit_g-2", b"two")
    assert len(adapter) == 2
    adapter.clear()
    assert len(adapter) == 0
