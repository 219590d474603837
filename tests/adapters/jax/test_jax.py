"""cuforge.jax on the real JAX (CPU backend): JAX's own monitoring events count."""

from __future__ import annotations

import inspect

import pytest

from tests.child import child_env, run_python

pytest.importorskip(
    "jax", reason="jax is not installed: `make test-jax` (or 'cuforge[jax]' 'jax[cpu]')"
)

#: a child: enable cuforge's cache, run one jitted function, report JAX's cache events
CHILD = r"""
import json, logging
import jax, jax.numpy as jnp
from jax import monitoring
events = {}
def listen(name, **kw):
    if name.startswith("/jax/compilation_cache/"):
        events[name.rsplit("/", 1)[1]] = events.get(name.rsplit("/", 1)[1], 0) + 1
monitoring.register_event_listener(listen)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
import cuforge, cuforge.jax as cj
enabled = cj.enable()
f = jax.jit(lambda x: jnp.sin(x) * 2 + x @ x.T)
out = f(jnp.arange(16.0).reshape(4, 4))
print(json.dumps({
    "enabled": enabled, "hits": events.get("cache_hits", 0),
    "misses": events.get("cache_misses", 0), "out": out.tolist(),
    "counters": dict(cuforge.default_cache().counters),
}))
"""


def test_contract_with_the_installed_jax():
    import jax
    from jax._src import compilation_cache as cc
    from jax._src.compilation_cache_interface import CacheInterface

    import cuforge.jax as cj

    assert cj.hook_problem() is None, f"jax {jax.__version__}: {cj.hook_problem()}"
    assert hasattr(cc, "_cache") and callable(cc._get_cache)
    assert CacheInterface.__abstractmethods__ == frozenset({"get", "put"})
    assert list(inspect.signature(CacheInterface.get).parameters) == ["self", "key"]
    assert list(inspect.signature(CacheInterface.put).parameters) == ["self", "key", "value"]


def test_enable_disable_and_an_unknown_version(monkeypatch, caplog, cache):
    from jax._src import compilation_cache as cc

    import cuforge.jax as cj

    before = cc._cache
    assert cj.enable(cache) and cj.is_enabled()
    assert type(cc._cache).__name__ == "CuforgeJaxCache"
    cj.disable()
    assert cc._cache is before and not cj.is_enabled()
    # outside the tested window: probed, not switched off (the probe passes here)...
    from cuforge.adapters import common

    monkeypatch.setattr(cj, "SUPPORTED", ((0, 0, 1), (0, 0, 2)))
    monkeypatch.setattr(common, "_probed", {})
    assert cj.enable(cache) and type(cc._cache).__name__ == "CuforgeJaxCache"
    assert "contract probe passed" in caplog.text
    cj.disable()
    # ...and a failing probe keeps JAX's own cache, saying what is missing
    monkeypatch.setattr(common, "_probed", {})
    monkeypatch.setattr(cj, "_probe", lambda: "no CacheInterface round trip")
    assert cj.enable(cache) is False and cc._cache is before
    assert "contract probe failed: no CacheInterface round trip" in caplog.text


def test_adapter_round_trip_and_corruption(cache, caplog):
    import cuforge.jax as cj
    from cuforge.store.base import Entry

    cj.enable(cache)
    try:
        from jax._src import compilation_cache as cc

        adapter = cc._cache
        adapter.put("jit_f-abc", b"serialized")
        assert adapter.get("jit_f-abc") == b"serialized"
        assert {i.kind for i in cache.iterate()} == {"jax"}
        cache.put(Entry(adapter.entry_key("jit_f-abc"), "jax", b"garbage", {"backend": "jax"}))
        cache.clear_memos()
        assert adapter.get("jit_f-abc") is None  # JAX compiles; nothing crashes
        assert "deleted and compiled again" in caplog.text
        assert cache.get(adapter.entry_key("jit_f-abc")) is None
    finally:
        cj.disable()


def test_process_b_restores_the_executable_from_the_remote(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    remote = f"file://{shared}"
    a = run_python(CHILD, child_env(CUFORGE_CACHE_DIR=str(tmp_path / "a"), CUFORGE_REMOTE=remote))
    assert a["enabled"] and a["misses"] >= 1 and a["hits"] == 0
    b = run_python(CHILD, child_env(CUFORGE_CACHE_DIR=str(tmp_path / "b"), CUFORGE_REMOTE=remote))
    assert b["enabled"] and b["misses"] == 0 and b["hits"] == a["misses"]
    assert b["out"] == a["out"]
    assert b["counters"].get("jax:hit") == b["hits"]


#: a child: a warm replay under fence("error") trips nothing; a new function raises
#: CompileAfterFenceError before JAX compiles it; warn mode reports a key once
FENCED = r"""
import json, os
import jax, jax.numpy as jnp
from jax._src import compiler
compiles = []
# XLA's compile itself (a hit deserializes instead); JAX < 0.5 names it backend_compile
name = "backend_compile_and_load" if hasattr(compiler, "backend_compile_and_load") else "backend_compile"
real_compile = getattr(compiler, name)
def counted(*args, **kwargs):
    compiles.append(1)
    return real_compile(*args, **kwargs)
setattr(compiler, name, counted)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
import cuforge, cuforge.jax as cj
assert cj.enable()
x = jnp.arange(16.0).reshape(4, 4)
seen = jax.jit(lambda x: jnp.sin(x) * 2 + x @ x.T)
if os.environ["STEP"] == "record":
    print(json.dumps({"out": seen(x).tolist(), "compiles": len(compiles)}))
    raise SystemExit
out = {}
with cuforge.fence("error"):
    out["out"] = seen(x).tolist()
    out["replay_compiles"] = len(compiles)
    def brand_new(x):
        return jnp.cos(x) - 3
    try:
        jax.jit(brand_new)(x)
        out["raised"] = None
    except cuforge.CompileAfterFenceError as exc:
        out["raised"] = {"system": exc.system, "name": exc.name, "key": exc.key,
                         "message": str(exc)}
    out["new_compiles"] = len(compiles) - out["replay_compiles"]
with cuforge.fence("warn"):
    for _ in range(2):
        jax.jit(lambda x: jnp.tanh(x) + 7)(x)
out["reports"] = [(r["system"], r["name"], r["mode"]) for r in cuforge.core.fencing.reports()]
print(json.dumps(out))
"""


def test_fence_catches_a_new_jax_compile_and_never_a_hit(tmp_path):
    first = run_python(FENCED, child_env(CUFORGE_CACHE_DIR=str(tmp_path / "c"), STEP="record"))
    assert first["compiles"] >= 1
    out = run_python(FENCED, child_env(CUFORGE_CACHE_DIR=str(tmp_path / "c"), STEP="replay"))
    assert out["out"] == first["out"] and out["replay_compiles"] == 0  # a hit: no trip
    raised = out["raised"]
    assert raised is not None, out
    assert raised["system"] == "jax" and "brand_new" in raised["name"]
    assert raised["key"] in raised["message"] or raised["key"][:16] in raised["message"]
    assert out["new_compiles"] == 0  # nothing was compiled
    warned = [r for r in out["reports"] if r[2] == "warn"]
    assert len(warned) == 1 and warned[0][0] == "jax"  # the same key twice: reported once
