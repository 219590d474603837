"""cuforge.triton on the real Triton, on the CPU: kernels compiled for an explicit target
(sm_90, no GPU needed), compiles counted with Triton's own compilation listener."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton", reason="Triton is not installed (pip install cuforge[triton])")

import cuforge  # noqa: E402
import cuforge.triton as ct  # noqa: E402
from tests.adapters.triton.kernels import CompileCounter, compile_kernel, cubin_digest  # noqa: E402
from tests.child import ROOT, child_env, finish, run_python, spawn  # noqa: E402

# one "machine": compiles the named kernels through cuforge, reports Triton's own counts
MACHINE = f"""
import json, sys
sys.path.insert(0, {ROOT!r})
import cuforge, cuforge.triton as ct
from tests.adapters.triton.kernels import CompileCounter, compile_kernel, cubin_digest
counter = CompileCounter().install()
assert ct.enable()
digests = {{name: cubin_digest(compile_kernel(name)) for name in NAMES}}
cache = cuforge.default_cache()
remote = cache.store.stats().extra["tiers"].get("remote", {{}})
print(json.dumps({{"compiles": counter.compiles, "hits": counter.hits, "digests": digests,
                  "counters": dict(cache.counters), "remote": remote}}))
"""


def _machine(
    tmp_path, label: str, names: list[str], remote: str | None, _code: str = MACHINE, **env: str
) -> dict:
    home = tmp_path / label
    overrides = {
        "CUFORGE_CACHE_DIR": str(home / "cuforge"),
        "TRITON_CACHE_DIR": str(home / "triton"),
        "TRITON_HOME": str(home),
        **env,
    }
    if remote:
        overrides["CUFORGE_REMOTE"] = remote
    home.mkdir(parents=True, exist_ok=True)
    code = f"NAMES = {names!r}\n" + _code
    return run_python(code, child_env(**overrides), timeout=240, cwd=str(home))


@pytest.fixture
def enabled(cache, tmp_path, monkeypatch):
    """Triton's cache manager is cuforge's, over ``cache``; Triton's own dir is fresh."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-own"))
    counter = CompileCounter().install()
    assert ct.enable(cache)
    yield counter
    ct.disable()
    import triton

    triton.knobs.compilation.listener = None


def _remote_calls(remote: dict) -> int:
    return sum(remote.get(k, 0) for k in ("hits", "misses", "puts", "errors"))


def test_machine_b_compiles_nothing_machine_a_compiled(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    names = ["add_kernel", "mul_kernel"]
    a = _machine(tmp_path, "a", names, f"file://{shared}")
    assert a["compiles"] == 2 and a["hits"] == 0, a
    b = _machine(tmp_path, "b", names, f"file://{shared}")
    assert b["compiles"] == 0 and b["hits"] == 2, b
    assert b["digests"] == a["digests"]
    assert b["counters"].get("triton:remote") == 2, b["counters"]
    # B again (its local tier now holds both): a local hit makes no network round trip
    again = _machine(tmp_path, "b", names, f"file://{shared}")
    assert again["compiles"] == 0 and again["counters"].get("triton:disk") == 2, again
    assert _remote_calls(again["remote"]) == 0, again["remote"]


def test_eight_processes_racing_on_one_kernel_compile_it_once(tmp_path):
    home = tmp_path / "shared-node"
    procs = []
    for rank in range(8):
        env = child_env(
            CUFORGE_CACHE_DIR=str(home / "cuforge"),
            TRITON_CACHE_DIR=str(tmp_path / f"rank{rank}" / "triton"),
        )
        procs.append(spawn('NAMES = ["add_kernel"]\n' + MACHINE, env))
    results = [finish(p, timeout=300) for p in procs]
    assert sum(r["compiles"] for r in results) == 1, results
    assert sum(r["hits"] for r in results) == 7
    assert len({r["digests"]["add_kernel"] for r in results}) == 1


def _entry_key(cache) -> str:
    (info,) = [i for i in cache.iterate() if i.kind == "triton"]
    return info.key


def test_a_corrupt_entry_is_recompiled_with_the_right_bytes(cache, enabled, caplog):
    first = cubin_digest(compile_kernel())
    assert enabled.compiles == 1
    key = _entry_key(cache)
    path = cache.layout.entry_path(key)
    raw = bytearray(open(path, "rb").read())
    raw[len(raw) // 2] ^= 0xFF
    open(path, "wb").write(bytes(raw))

    fresh = cache.replace()  # no memory tier content: the disk entry is read
    ct.enable(fresh)
    with caplog.at_level(logging.WARNING, logger="cuforge"):
        again = cubin_digest(compile_kernel())
    assert enabled.compiles == 2 and again == first
    # stored anew: a third lookup hits
    ct.enable(cache.replace())
    assert cubin_digest(compile_kernel()) == first and enabled.compiles == 2


def test_a_planted_payload_that_does_not_unpack_is_recompiled(cache, enabled, caplog):
    from cuforge.store.base import Entry

    first = cubin_digest(compile_kernel())
    key = _entry_key(cache)
    entry = cache.get(key, kind="triton")
    cache.put(Entry(key, "triton", entry.payload[:-7], dict(entry.meta)))  # truncated, resealed
    ct.enable(cache.replace())
    with caplog.at_level(logging.WARNING, logger="cuforge"):
        assert cubin_digest(compile_kernel()) == first
    assert enabled.compiles == 2
    assert "could not be loaded" in caplog.text


def test_a_damaged_materialized_copy_is_replaced_not_served(cache, enabled):
    first = compile_kernel()
    key = _entry_key(cache)
    cubin = os.path.join(cache.layout.triton_dir(key), "add_kernel.cubin")
    with open(cubin, "r+b") as f:  # same size, wrong bytes
        f.write(b"\0" * 16)
    hit = compile_kernel()
    assert enabled.compiles == 1 and enabled.hits == 1
    assert hit.asm["cubin"] == first.asm["cubin"]
    assert open(cubin, "rb").read() == first.asm["cubin"]


def test_entries_are_evicted_under_the_cap_and_their_copies_pruned(tmp_path, enabled):
    small = cuforge.Cache(tmp_path / "small", max_bytes=1, memory=False)  # a put evicts
    ct.enable(small)
    for block in (64, 128, 256):
        compile_kernel(block=block)
    assert enabled.compiles == 3
    made = os.listdir(small.layout.triton)
    assert len(made) == 3
    kept = [k for k in made if os.path.exists(small.layout.entry_path(k))]
    assert len(kept) <= 1
    removed = ct.prune_materialized(small, older_than=0)
    assert removed >= 2
    assert sorted(os.listdir(small.layout.triton)) == sorted(kept)


def test_a_miss_is_explained_by_labeled_fields(cache, enabled):
    compile_kernel(block=128)
    compile_kernel(block=256)
    reasons = cuforge.explain_miss("triton:add_kernel")
    assert any(r.startswith("constexpr:BLOCK 128 -> 256") for r in reasons), reasons
    (info,) = [i for i in cache.iterate() if i.meta.get("name") == "add_kernel"][:1]
    fields = info.meta["key_fields"]
    for label in ("triton_version", "source", "target", "options_hash", "env", "option:num_warps"):
        assert label in fields
    assert fields["target"] == "cuda:90:32"
    assert not any(os.sep + "home" + os.sep in v for v in fields.values())


def test_key_of_is_the_key_a_compile_stores_under(cache, enabled):
    """cuforge.triton.key_of (what tests/keys/test_key_certification.py certifies) computes the
    entry key and fields a real compile stores, without compiling."""
    from triton.compiler import ASTSource

    from tests.adapters.triton.kernels import KERNELS, SIGNATURE, TARGET

    compile_kernel(block=64)
    (info,) = [i for i in cache.iterate() if i.meta.get("name") == "add_kernel"]
    key, fields = ct.key_of(ASTSource(KERNELS["add_kernel"], SIGNATURE, {"BLOCK": 64}), TARGET)
    assert key == info.key
    assert fields == info.meta["key_fields"]
    assert enabled.compiles == 1


def test_cache_ls_lists_triton_entries_by_kernel_name(cache, enabled):
    compile_kernel("mul_kernel")
    out = subprocess.run(
        [sys.executable, "-m", "cuforge", "cache", "ls", "--cache-dir", str(cache.directory)]
        + ["--kind", "triton"],
        env=child_env(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "mul_kernel" in out and "triton" in out


def test_a_triton_outside_the_window_is_probed_then_enabled_with_one_line(
    monkeypatch, caplog, cache, tmp_path
):
    """A Triton newer (or older) than the tested window is not switched off silently: the
    contract probe (a group through Triton's own get_cache_manager) passes, and the
    adapter is enabled with one line naming the untested version; kernels then cache."""
    import triton

    from cuforge.adapters import common

    monkeypatch.setattr(ct, "SUPPORTED", ((3, 0), (3, 1)))
    monkeypatch.setattr(common, "_probed", {})
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-own"))
    with caplog.at_level(logging.WARNING, logger="cuforge"):
        assert ct.enable(cache) is True
        assert ct.enable(cache) is True
    try:
        assert triton.knobs.cache.manager_class is ct.CacheManager
        assert caplog.text.count("contract probe passed") == 1
        assert f"Triton {triton.__version__} is outside the tested versions" in caplog.text
        assert common.VERDICTS["triton"][0] == "probed"
        counter = CompileCounter().install()
        compile_kernel()
        compile_kernel()
        assert counter.compiles == 1 and cache.counters.get("triton:compiled") == 1
    finally:
        ct.disable()
        triton.knobs.compilation.listener = None


def test_a_failed_probe_keeps_tritons_own_cache_and_says_what_is_missing(
    monkeypatch, caplog, cache
):
    import triton
    from triton.runtime import cache as tcache

    from cuforge.adapters import common

    monkeypatch.setattr(ct, "SUPPORTED", ((99, 0), (99, 1)))
    monkeypatch.setattr(common, "_probed", {})
    monkeypatch.setitem(ct._state, "warned", False)
    monkeypatch.delattr(tcache, "get_cache_manager")
    with caplog.at_level(logging.WARNING, logger="cuforge"):
        assert ct.enable(cache) is False
        assert ct.enable(cache) is False
    assert triton.knobs.cache.manager_class is None
    assert caplog.text.count("contract probe failed") == 1
    assert "has no get_cache_manager(key)" in caplog.text
    assert common.VERDICTS["triton"][0] == "refused"


# -- the native modules Triton builds with the C compiler ---------------------------------------

# a Python C module like the launcher Triton <= 3.6 builds per kernel signature through
# triton.runtime.build.compile_module_from_src (the same call, the same cache manager)
LAUNCHER_SRC = r"""
#include <Python.h>
static PyObject* answer(PyObject* self, PyObject* args) { return PyLong_FromLong(42); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, NULL}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "__triton_launcher", NULL, -1, methods};
PyMODINIT_FUNC PyInit___triton_launcher(void) { return PyModule_Create(&mod); }
"""

# one "machine" of a fresh process: the kernels, Triton's driver helper (cuda_utils, built
# by the driver itself) and a launcher-like module; C compiler builds counted by CC's log
NATIVE_MACHINE = (
    MACHINE.split("cache = cuforge.default_cache()")[0]
    + f"""
import os
from triton.backends.nvidia.driver import CudaUtils
from triton.runtime.build import compile_module_from_src
assert CudaUtils().load_binary is not None
assert compile_module_from_src({LAUNCHER_SRC!r}, "__triton_launcher").answer() == 42
from tests.adapters.triton.kernels import c_builds
cache = cuforge.default_cache()
print(json.dumps({{"compiles": counter.compiles, "hits": counter.hits, "digests": digests,
                  "counters": dict(cache.counters), "c_builds": c_builds(os.environ["CC_LOG"])}}))
"""
)


@pytest.fixture(scope="module")
def c_compiler(tmp_path_factory):
    """A ``CC`` that logs each invocation (to ``$CC_LOG``) and runs the real compiler, and
    what a child needs to load a libcuda (a stub without a driver)."""
    from tests.adapters.triton.kernels import logging_cc
    from tests.libcuda_stub import child_env_or_skip

    try:
        cc = logging_cc(tmp_path_factory.mktemp("cc") / "cc")
    except RuntimeError as exc:
        pytest.skip(str(exc))
    return {"CC": cc, **child_env_or_skip(tmp_path_factory)}


@pytest.mark.parametrize("shared", ["dir", "redis"])
def test_machine_b_builds_nothing_neither_kernels_nor_native_modules(
    tmp_path, request, c_compiler, shared
):
    if shared == "redis":
        remote = request.getfixturevalue("redis_server").url
    else:
        (tmp_path / "shared").mkdir()
        remote = f"file://{tmp_path / 'shared'}"

    def machine(label: str) -> dict:
        home = tmp_path / label
        home.mkdir(parents=True, exist_ok=True)
        # signed: a remote that checks no signature serves no native code (issue 35, item 5)
        env = {**c_compiler, "CC_LOG": str(home / "cc.log"), "CUFORGE_REMOTE_KEY": "team-secret"}
        return _machine(tmp_path, label, ["add_kernel"], remote, **env, _code=NATIVE_MACHINE)

    a = machine("a")
    assert a["compiles"] == 1 and a["c_builds"] == 2, a
    assert a["counters"].get("triton:native_built") == 2, a["counters"]
    b = machine("b")
    assert b["compiles"] == 0 and b["hits"] == 1, b
    assert b["c_builds"] == 0, b
    assert b["counters"].get("triton:native_remote") == 2, b["counters"]
    assert b["digests"] == a["digests"]


def test_a_damaged_native_module_entry_is_rebuilt_not_loaded(
    tmp_path, cache, c_compiler, monkeypatch
):
    """A native module entry whose bytes fail their checksum is deleted and rebuilt by Triton's
    C compiler, never loaded."""
    from triton.runtime.build import compile_module_from_src

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-own"))
    monkeypatch.setenv("CC", c_compiler["CC"])
    monkeypatch.setenv("CC_LOG", str(tmp_path / "cc.log"))
    assert ct.enable(cache)
    try:
        src = LAUNCHER_SRC.replace("42", "43").replace("__triton_launcher", "cuforge_probe")
        assert compile_module_from_src(src, "cuforge_probe").answer() == 43
        (info,) = [i for i in cache.iterate() if i.meta.get("name") == "cuforge_probe"]
        assert info.meta["native_module"] and "cc" in info.meta["key_fields"]
        path = cache.layout.entry_path(info.key)
        raw = bytearray(open(path, "rb").read())
        raw[len(raw) // 2] ^= 0xFF
        open(path, "wb").write(bytes(raw))
        ct.enable(cache.replace())
        assert compile_module_from_src(src, "cuforge_probe").answer() == 43
        from tests.adapters.triton.kernels import c_builds

        assert c_builds(tmp_path / "cc.log") == 2
    finally:
        ct.disable()


def test_native_module_keys_hold_no_path_of_the_triton_install():
    import triton
    from triton.backends.nvidia import driver

    root = os.path.dirname(os.path.realpath(triton.__file__))
    config = {
        "language": ["c"],
        "include_dirs": [os.path.join(root, "backends", "nvidia", "include"), "/opt/custom"],
        "library_dirs": [os.path.join(root, "backends", "nvidia", "lib")],
        "libraries": ["libcuda.so.1"],
        "ccflags": None,
    }
    out = ct.path_free_config(config)
    assert out["include_dirs"] == ["<triton>/backends/nvidia/include", "/opt/custom"]
    assert out["library_dirs"] == ["<triton>/backends/nvidia/lib"]
    assert out["libraries"] == ["libcuda.so.1"] and config["include_dirs"][0].startswith(root)
    assert hasattr(driver, "libcuda_dirs")


def test_an_unsigned_share_serves_no_native_module_it_is_built_here(
    tmp_path, c_compiler, monkeypatch
):
    """Triton's C modules are host code the process loads: from a share that checks no
    signature they are refused (a miss: Triton's C compiler builds them here) unless
    CUFORGE_REMOTE_NATIVE=allow; an entry at a native module's key that hides its
    native_module flag (so the tier would serve it) is not loaded either (issue 35, item 5)."""
    from triton.runtime.build import compile_module_from_src

    from cuforge.store.base import Entry
    from tests.adapters.triton.kernels import c_builds

    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    url = f"file://{shared}"
    log = tmp_path / "cc.log"
    monkeypatch.setenv("CC", c_compiler["CC"])
    monkeypatch.setenv("CC_LOG", str(log))
    src = LAUNCHER_SRC.replace("42", "44").replace("__triton_launcher", "cuforge_unsigned")

    def machine(label: str) -> cuforge.Cache:
        monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / label / "triton"))
        cache = cuforge.Cache(tmp_path / label / "cuforge", remotes=[url])
        assert ct.enable(cache)
        try:
            assert compile_module_from_src(src, "cuforge_unsigned").answer() == 44
        finally:
            ct.disable()
        return cache

    def remote(cache: cuforge.Cache) -> dict:
        return cache.store.stats().extra["tiers"]["remote"]

    a = machine("a")
    assert c_builds(log) == 1 and a.counters.get("triton:native_built") == 1, a.counters
    b = machine("b")  # unsigned: refused, built here
    assert c_builds(log) == 2 and b.counters.get("triton:native_built") == 1, b.counters
    assert "triton:native_remote" not in b.counters
    assert remote(b)["extra"]["refused_native"] == 1, remote(b)
    monkeypatch.setenv("CUFORGE_REMOTE_NATIVE", "allow")
    c = machine("c")  # allowed explicitly: served
    assert c_builds(log) == 2 and c.counters.get("triton:native_remote") == 1, c.counters
    # the entry planted again without its flag: the tier serves it, the loader refuses it
    monkeypatch.delenv("CUFORGE_REMOTE_NATIVE")
    (info,) = [i for i in a.iterate() if i.meta.get("name") == "cuforge_unsigned"]
    entry = a.get(info.key, kind="triton")
    meta = {k: v for k, v in entry.meta.items() if k != "native_module"}
    planter = cuforge.Cache(tmp_path / "planter", remotes=[url])
    assert planter.put(Entry(entry.key, "triton", entry.payload, meta))
    d = machine("d")
    assert c_builds(log) == 3 and d.counters.get("triton:load_errors") == 1, d.counters
    assert d.counters.get("triton:native_built") == 1, d.counters


def test_autotune_results_are_shared_by_gpu_model(tmp_path, monkeypatch):
    """Triton's autotuner stores ``<kernel>.autotune.json`` through
    ``get_cache_manager(key)`` outside a group (``check_disk_cache``): with cuforge's
    manager it is an entry, so machine B (own dirs, one file:// remote) reads A's result;
    another GPU model misses. The result is injected (no GPU benchmark here)."""
    import json

    import triton
    from triton.runtime.cache import get_cache_manager

    import cuforge.triton as ct
    from cuforge.core.caching import Cache

    shared = tmp_path / "shared"
    shared.mkdir()
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-own"))
    key = "c" * 64  # Triton's sha256 of the autotune key parts
    name = "matmul_kernel.autotune.json"
    result = json.dumps({"key": [1024, "torch.float16"], "configs_timings": [[{"a": 1}, [0.5]]]})
    saved = triton.knobs.cache.manager_class
    try:
        ct.gpu_model("NVIDIA H200")
        a = Cache(tmp_path / "a", remotes=[f"file://{shared}"], telemetry=False)
        ct.enable(a)
        first = get_cache_manager(key)
        assert first.get_file(name) is None
        first.put(result, name, binary=False)
        assert a.counters["triton:autotune_stored"] == 1
        b = Cache(tmp_path / "b", remotes=[f"file://{shared}"], telemetry=False)
        ct.enable(b)
        path = get_cache_manager(key).get_file(name)
        assert path is not None and open(path).read() == result
        assert b.counters["triton:autotune_remote"] == 1
        assert not (tmp_path / "triton-own").exists()  # nothing in Triton's own dir
        ct.gpu_model("NVIDIA H100 80GB HBM3")
        assert get_cache_manager(key).get_file(name) is None
        assert b.counters["triton:autotune_misses"] == 1
    finally:
        ct.gpu_model("")
        ct.disable()
        triton.knobs.cache.manager_class = saved
