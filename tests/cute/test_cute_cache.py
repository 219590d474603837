"""cuforge.cute without a GPU: real CuTe DSL compiles for an explicit arch (sm_90a), real
exports, real ``load_module`` restores, real child processes.

Every compile here is a small elementwise kernel (well under a second); the cross-process
tests share nothing but the cache dir of the test.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.child import finish, run_python, spawn
from tests.conftest import GPU_VISIBLE, ROOT, SRC  # noqa: E402

if not GPU_VISIBLE:
    # the DSL reads its settings once per process, when it is first imported: set the arch
    # before that (without a GPU, the DSL would otherwise pick its default, sm_100)
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

pytest.importorskip(
    "cutlass.cute", reason="the CuTe DSL is not installed (pip install 'cuforge[cute]')"
)

import cutlass.cute as cute  # noqa: E402

import cuforge.cute as cc  # noqa: E402
from cuforge.cute import cache as cute_cache  # noqa: E402
from tests.cute import kernels as K  # noqa: E402

CHILD = """
import json, os
from tests.cute import kernels as K
import cuforge.cute as cc
from cuforge.cute.cache import counters
if os.environ.get("CF_BLIND"):  # simulate a key that misses a change of the function
    import cuforge.keys.fingerprint
    cuforge.keys.fingerprint.fingerprint = lambda obj, **kw: "blind"
a, b = K.fake_args()
fn = getattr(K, os.environ.get("CF_FN", "scale"))
out = []
for _ in range(int(os.environ.get("CF_CALLS", "1"))):
    r = cc.compile_cached(fn, a, b, verify=os.environ.get("CF_VERIFY") or None)
    out.append(r.source_of_result)
print(json.dumps({"sources": out, "key": r.key, "reason": r.reason, "verified": r.verified,
                  "counters": counters, "fields": r.fields, "type": type(r.value).__name__,
                  "trace_hash": r.trace_hash}))
"""


def _env(**overrides: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([SRC, ROOT, env.get("PYTHONPATH", "")])
    if not GPU_VISIBLE:
        env.setdefault("CUTE_DSL_ARCH", "sm_90a")
    for name in ("CF_SCALE", "CF_OFFSET", "CF_DTYPE", "CF_FN", "CF_VERIFY", "CF_CALLS", "CF_BLIND"):
        env.pop(name, None)
    env.update(overrides)
    return env


def _child(code: str = CHILD, **overrides: str) -> dict:
    """Run ``code`` in a fresh interpreter (in the repository root, for ``tests.cute``);
    its last stdout line as JSON, with its stderr under ``"stderr"``."""
    return run_python(code, _env(**overrides), cwd=ROOT, stderr_key="stderr")


KEY_CHILD = """
import json
from tests.cute import kernels as K
import cuforge.cute as cc
a, b = K.fake_args()
print(json.dumps(cc.key_fields(K.scale, a, b)))
"""


@pytest.fixture(autouse=True)
def _fresh_memo():
    cc.clear_memo()
    yield
    cc.clear_memo()


# ---------------------------------------------------------------- specs (no compile)


def test_specs_distinguish_what_the_dsl_specializes_on():
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_tensor

    from cuforge.cute.spec import UnkeyableArgument, describe_args

    n = cute.sym_int32(divisibility=128)
    same = describe_args(
        K.scale,
        (
            make_fake_compact_tensor(cutlass.Float32, (n,)),
            make_fake_compact_tensor(cutlass.Float32, (n,)),
        ),
        {},
    )
    two = describe_args(K.scale, K.fake_args(), {})
    m = cute.sym_int32(divisibility=128)
    distinct = describe_args(
        K.scale,
        (
            make_fake_compact_tensor(cutlass.Float32, (n,)),
            make_fake_compact_tensor(cutlass.Float32, (m,)),
        ),
        {},
    )
    assert same == two  # SymInts are numbered, never keyed by id()
    assert same != distinct  # one shared extent vs two extents: different kernels
    f16 = describe_args(
        K.scale,
        (
            make_fake_compact_tensor(cutlass.Float16, (n,)),
            make_fake_compact_tensor(cutlass.Float16, (n,)),
        ),
        {},
    )
    assert f16 != same and "Float16" in f16
    static = describe_args(K.scale, K.fake_args(256), {})
    assert static != same and "(256)" in static
    div = describe_args(
        K.scale,
        (
            make_fake_compact_tensor(cutlass.Float32, (cute.sym_int32(divisibility=16),)),
            make_fake_compact_tensor(cutlass.Float32, (cute.sym_int32(divisibility=16),)),
        ),
        {},
    )
    assert "div=16" in div
    strided = describe_args(
        K.scale,
        (
            make_fake_tensor(cutlass.Float32, (n,), (2,)),
            make_fake_compact_tensor(cutlass.Float32, (n,)),
        ),
        {},
    )
    assert strided != same
    aligned = describe_args(
        K.scale,
        (
            make_fake_compact_tensor(cutlass.Float32, (n,), assumed_align=16),
            make_fake_compact_tensor(cutlass.Float32, (n,)),
        ),
        {},
    )
    assert aligned != same
    # Constexpr parameters are keyed by value
    one = describe_args(K.scale_times, K.fake_args(), {})
    three = describe_args(K.scale_times, (*K.fake_args(), 3), {})
    assert one != three and "reps=constexpr:" in three
    with pytest.raises(UnkeyableArgument, match="argument 'b'"):
        describe_args(K.scale, (K.fake_args()[0], object()), {})


def test_dlpack_tensor_specs_follow_dynamic_marks():
    np = pytest.importorskip("numpy")
    from cutlass.cute.runtime import from_dlpack

    from cuforge.cute.spec import describe_args

    x, y = np.zeros(256, np.float32), np.zeros(256, np.float32)
    static = describe_args(K.scale, (from_dlpack(x), from_dlpack(y)), {})
    dynamic = describe_args(
        K.scale, (from_dlpack(x).mark_layout_dynamic(), from_dlpack(y).mark_layout_dynamic()), {}
    )
    other_size = describe_args(
        K.scale,
        (from_dlpack(np.zeros(512, np.float32)), from_dlpack(np.zeros(512, np.float32))),
        {},
    )
    assert static != dynamic
    assert static != other_size  # a static extent is part of the kernel
    # a dynamic extent is not: any size gives the same key
    dyn512 = describe_args(
        K.scale,
        (
            from_dlpack(np.zeros(512, np.float32)).mark_layout_dynamic(),
            from_dlpack(np.zeros(512, np.float32)).mark_layout_dynamic(),
        ),
        {},
    )
    assert dyn512 == dynamic
    assert "0x" not in dynamic  # no addresses


# ---------------------------------------------------------------- the key


def test_key_is_stable_across_processes_and_traces():
    here = cc.key_fields(K.scale, *K.fake_args())
    first = _child(KEY_CHILD)
    second = _child(KEY_CHILD)
    first.pop("stderr"), second.pop("stderr")
    assert first == second == here
    if not GPU_VISIBLE:
        assert here["arch"] == "sm_90a"
    assert "/" not in here["dsl_settings"].replace("'", "").split("shared_libs=")[-1].split(";")[0]
    # the DSL rewrites a function's code when it traces it; the key must not change
    cc.compile(K.scale, *K.fake_args())
    assert cc.key_fields(K.scale, *K.fake_args()) == here


@pytest.mark.parametrize(
    ("env", "field"),
    [
        ({"CF_SCALE": "3.0"}, "fingerprint"),  # a global the kernel reads
        ({"CF_OFFSET": "1.0"}, "fingerprint"),  # a closure value
        ({"CF_DTYPE": "Float16"}, "args"),
        ({"CUTE_DSL_ARCH": "sm_100a"}, "arch"),
        ({"CUTE_DSL_LINEINFO": "1"}, "dsl_settings"),
    ],
)
def test_key_invalidation(env, field):
    base = _child(KEY_CHILD)
    changed = _child(KEY_CHILD, **env)
    base.pop("stderr"), changed.pop("stderr")
    assert base[field] != changed[field], f"{env} must change {field}"
    unchanged = {k for k in base if base[k] == changed.get(k)}
    assert "dsl" in unchanged and "function" in unchanged


def test_key_sees_the_dsl_version(monkeypatch):
    from cuforge.cute import version

    before = cc.key_fields(K.scale, *K.fake_args())
    real = version.dsl_distributions()
    monkeypatch.setattr(
        version, "dsl_distributions", lambda: [d.replace("==", "==999.") for d in real]
    )
    version.reset()
    try:
        after = cc.key_fields(K.scale, *K.fake_args())
    finally:
        monkeypatch.undo()
        version.reset()
    assert before["dsl"] != after["dsl"]
    assert {k for k in before if before[k] != after[k]} == {"dsl"}


def test_options_and_constexpr_enter_the_key():
    a, b = K.fake_args()
    plain = cc.key_fields(K.scale, a, b)
    opt = cc.key_fields(K.scale, a, b, options="--opt-level 2")
    assert plain["options"] != opt["options"]
    assert (
        cc.key_fields(K.scale_times, a, b, 2)["args"]
        != cc.key_fields(K.scale_times, a, b, 3)["args"]
    )


# ---------------------------------------------------------------- build, store, load


def test_round_trip_across_processes():
    first = _child()
    assert first["sources"] == ["compiled"]
    assert first["counters"]["compile"] == 1
    second = _child(CF_CALLS="3")
    # a fresh process: one store hit, restored with load_module, no compile, no trace;
    # then the in-process memo
    assert second["sources"] == ["disk", "memo", "memo"]
    assert second["counters"] == {
        "compile": 0,
        "load": 1,
        "trace": 0,
        "memo": 2,
        "pretrace": 3,
        "ir": 0,
        "uncached": 0,
    }
    assert second["type"] == first["type"] == "CudaDialectJitCompiledFunction"
    assert second["key"] == first["key"]
    assert second["trace_hash"] == first["trace_hash"]


def test_in_process_memo_and_store():
    a, b = K.fake_args()
    first = cc.compile_cached(K.scale, a, b)
    again = cc.compile_cached(K.scale, *K.fake_args())
    assert first.source_of_result == "compiled"
    assert again.source_of_result == "memo" and again.value is first.value
    cc.clear_memo()
    third = cc.compile_cached(K.scale, a, b)
    assert third.source_of_result in ("memory", "disk")
    assert third.hit and third.value is not first.value


def _stored_entry(key: str):
    from cuforge import default_cache

    store = default_cache().store
    entry, _tier = store.get_with_tier(key, kind="cute")
    assert entry is not None
    return store, entry


def test_corrupt_object_is_rebuilt_and_overwritten():
    from cuforge.core import blobcache
    from cuforge.store.base import Entry

    built = _child()
    key = built["key"]
    store, entry = _stored_entry(key)
    files = blobcache.unpack(entry.payload)
    files["object.o"] = b"\x7fELF this is not an object file" + b"\0" * 64
    store.put(Entry(key, "cute", blobcache.pack(files), dict(entry.meta)))
    rebuilt = _child()
    assert rebuilt["sources"] == ["compiled"], rebuilt
    assert "could not be loaded" in rebuilt["stderr"]
    healed = _child()
    assert healed["sources"] == ["disk"]


def test_damaged_file_on_disk_is_rebuilt(isolated_cache):
    built = _child()
    damaged = 0
    for root, _dirs, files in os.walk(isolated_cache):
        for name in files:
            path = os.path.join(root, name)
            if built["key"] in name and os.path.getsize(path) > 4096:
                with open(path, "r+b") as f:
                    f.seek(os.path.getsize(path) // 2)
                    f.write(b"\xff" * 64)
                damaged += 1
    assert damaged >= 1
    again = _child()
    assert again["sources"] == ["compiled"]
    assert _child()["sources"] == ["disk"]


def test_single_flight_across_processes():
    procs = [spawn(CHILD, _env(), cwd=ROOT) for _ in range(3)]
    results = [finish(p) for p in procs]
    sources = sorted(r["sources"][0] for r in results)
    assert sources.count("compiled") == 1, sources
    assert sum(r["counters"]["compile"] for r in results) == 1
    assert len({r["key"] for r in results}) == 1


def test_verify_trace_catches_a_stale_entry():
    # a key that misses a change (here: the fingerprint is blinded) serves stale code ...
    built = _child(CF_BLIND="1")  # SCALE = 2.0
    assert built["sources"] == ["compiled"]
    stale = _child(CF_BLIND="1", CF_SCALE="5.0")
    assert stale["key"] == built["key"]
    assert stale["sources"] == ["disk"]  # the fast key alone cannot see it
    # ... and verify="trace" catches it: reported, deleted, rebuilt
    checked = _child(CF_BLIND="1", CF_SCALE="5.0", CF_VERIFY="trace")
    assert checked["sources"] == ["compiled"], checked
    assert "verify='trace'" in checked["stderr"]
    assert checked["trace_hash"] != built["trace_hash"]
    # the rebuilt entry passes verification
    passed = _child(CF_BLIND="1", CF_SCALE="5.0", CF_VERIFY="trace")
    assert passed["sources"] == ["disk"] and passed["verified"] is True
    assert passed["counters"]["trace"] == 1 and passed["counters"]["compile"] == 0
    assert passed["trace_hash"] == checked["trace_hash"]


def test_entry_under_a_foreign_key_is_not_served():
    from cuforge.store.base import Entry

    good = _child()  # SCALE = 2.0
    other = _child(CF_SCALE="5.0")
    assert other["key"] != good["key"]
    store, entry = _stored_entry(good["key"])
    store.put(Entry(other["key"], "cute", entry.payload, dict(entry.meta)))
    again = _child(CF_SCALE="5.0")
    assert again["sources"] == ["compiled"]  # the record names another key's symbol
    assert "could not be loaded" in again["stderr"]


# ---------------------------------------------------------------- knobs and uncached


def test_disable_cache_compiles_every_time():
    out = _child(CF_CALLS="2", CUFORGE_DISABLE_CACHE="1")
    assert out["sources"] == ["compiled", "compiled"]
    assert out["counters"]["compile"] == 2


def test_disable_file_cache_keeps_nothing_between_processes():
    assert _child(CUFORGE_DISABLE_FILE_CACHE="1")["sources"] == ["compiled"]
    assert _child(CUFORGE_DISABLE_FILE_CACHE="1")["sources"] == ["compiled"]


def test_unkeyable_function_is_served_by_its_ir_key_and_says_why():
    # the pre-trace key is blocked by a global lock: the call traces and is keyed by its
    # traced module; a fresh process traces and loads, never compiles
    out = _child(CF_FN="with_lock", CF_CALLS="2")
    assert out["sources"] == ["compiled", "memo"]
    assert out["counters"]["compile"] == 1 and out["counters"]["ir"] == 2
    assert "LOCK" in out["reason"] and "with_lock" in out["reason"]
    assert "cannot be keyed before tracing" in out["stderr"] and "Constexpr" in out["stderr"]
    again = _child(CF_FN="with_lock")
    assert again["sources"] == ["disk"] and again["counters"]["compile"] == 0
    assert again["counters"]["trace"] == 1 and again["counters"]["ir"] == 1


def test_a_function_neither_key_covers_compiles_uncached_and_says_why():
    # a value that changes at every trace: no stable pre-trace key, no stable module
    out = _child(CF_FN="with_ticks", CF_CALLS="2")
    assert out["sources"] == ["uncached", "uncached"]
    assert out["counters"]["compile"] == 2 and out["counters"]["uncached"] == 2
    assert "TICKS" in out["reason"] and "two different modules" in out["reason"]
    assert out["stderr"].count("runs uncached") == 1  # once per kernel


def test_cache_ls_lists_cute_entries():
    _child()
    done = subprocess.run(
        [sys.executable, "-m", "cuforge", "cache", "ls"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "cute" in done.stdout and "scale" in done.stdout


def test_jit_decorator_compiles_through_the_cache():
    @cc.jit
    def host(a: cute.Tensor, b: cute.Tensor):
        K.scale_kernel(a, b).launch(grid=(a.shape[0] // 128, 1, 1), block=(128, 1, 1))

    first = host.compile_cached(*K.fake_args())
    second = host.compile_cached(*K.fake_args())
    assert first.source_of_result == "compiled"
    assert second.source_of_result == "memo"
    assert host.compile(*K.fake_args()) is first.value
    assert cute_cache.counters["compile"] >= 1


def test_verify_rejects_unknown_modes():
    with pytest.raises(ValueError, match="verify"):
        cc.compile(K.scale, *K.fake_args(), verify="yes")


CHECKOUT_CHILD = """
import json, os
import kmod
import cuforge.cute as cc
r = cc.compile_cached(kmod.scale, *kmod.fake_args(), verify=os.environ.get("CF_VERIFY") or None)
print(json.dumps({"source": r.source_of_result, "key": r.key, "trace_hash": r.trace_hash,
                  "verified": r.verified}))
"""


def test_another_checkout_hits_and_verifies(tmp_path):
    """The same kernel module in two directories (two checkouts, two venvs): one key, and
    the trace hash ignores source locations, so verify="trace" passes too."""
    source = os.path.join(os.path.dirname(__file__), "kernels.py")
    results = []
    for n, verify in ((1, ""), (2, "trace")):
        d = tmp_path / f"checkout{n}"
        d.mkdir()
        with open(source) as f:
            (d / "kmod.py").write_text(f.read())
        env = {**_env(CF_VERIFY=verify), "PYTHONPATH": os.pathsep.join([SRC, str(d)])}
        results.append(run_python(CHECKOUT_CHILD, env, cwd=str(d)))
    first, second = results
    assert first["source"] == "compiled"
    assert second["source"] == "disk" and second["verified"] is True
    assert first["key"] == second["key"] and first["trace_hash"] == second["trace_hash"]


def test_import_is_lazy():
    code = (
        "import sys, cuforge.cute; "
        "assert 'cutlass' not in sys.modules, 'cuforge.cute imported the DSL'; "
        "print('{}')"
    )
    _child(code)


@pytest.mark.slow
def test_gemm_example_round_trip():
    """The project's SIMT GEMM (a class instance behind a plain @cute.jit function, a
    cuda.CUstream default argument): keyed stably, stored, restored in a fresh process."""
    from tests.cute import gemm

    before = cc.key_fields(gemm.sgemm, *gemm.fake_args())
    first = cc.compile_cached(gemm.sgemm, *gemm.fake_args())
    assert first.source_of_result == "compiled", first
    assert cc.key_fields(gemm.sgemm, *gemm.fake_args()) == before  # the trace changed nothing
    code = CHILD.replace("from tests.cute import kernels as K", "from tests.cute import gemm as K")
    code = code.replace('os.environ.get("CF_FN", "scale")', '"sgemm"').replace(
        "a, b = K.fake_args()", "args = K.fake_args()"
    )
    code = code.replace("cc.compile_cached(fn, a, b,", "cc.compile_cached(fn, *args,")
    out = _child(code, CF_VERIFY="trace")
    assert out["sources"] == ["disk"] and out["verified"] is True, out
    assert out["key"] == first.key and out["counters"]["compile"] == 0


def test_a_shared_remote_serves_another_machine(tmp_path):
    """Two "machines" (two cache dirs) sharing a file:// remote: the second gets the first's
    build from the remote tier, without compiling."""
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o700)
    remote = f"file://{shared}"
    first = _child(CUFORGE_CACHE_DIR=str(tmp_path / "a"), CUFORGE_REMOTE=remote)
    assert first["sources"] == ["compiled"]
    second = _child(CUFORGE_CACHE_DIR=str(tmp_path / "b"), CUFORGE_REMOTE=remote)
    assert second["sources"] == ["remote"], second
    assert second["counters"]["compile"] == 0 and second["key"] == first["key"]


def test_dsl_version_is_remembered_under_the_install_signature(monkeypatch):
    """A fresh process reads the DSL version digest from the toolchain memo (keyed by the
    stat of the wheels' RECORDs and the loaded libraries), and computes it again when that
    signature changes."""
    from cuforge.cute import version

    version.reset()
    first = version.dsl_version()  # a fresh cache dir: computed, then remembered

    def must_not_compute(dsl):
        raise AssertionError("the digest was computed, not read from the memo")

    monkeypatch.setattr(version, "_dsl_get_version", must_not_compute)
    version.reset()
    assert version.dsl_version() == first
    real_stat_line = version._stat_line
    monkeypatch.setattr(
        version,
        "_stat_line",
        lambda label, path: (real_stat_line(label, path) or "") + "reinstalled\n",
    )
    version.reset()
    try:
        with pytest.raises(AssertionError, match="computed"):
            version.dsl_version()
    finally:
        monkeypatch.undo()
        version.reset()
    assert version.dsl_version() == first


def test_installed_modules_are_remembered_under_their_record(monkeypatch):
    """The fingerprint's answer for an installed module (the DSL's, here) is kept in the
    toolchain memo under the stat of its file and of the RECORD that vouches for it: a
    fresh process does not look for its distribution again; a rewritten RECORD does."""
    import cutlass.cute.core as core

    from cuforge.keys import fingerprint

    def forget():
        fingerprint._module_cache.pop(core.__name__, None)

    forget()
    first = fingerprint.module_fingerprint(core)
    assert "nvidia-cutlass-dsl" in first
    fingerprint._flush_memo()  # fingerprint() writes what it learned when it returns

    def must_not_look(module):
        raise AssertionError("the distribution was looked up, not read from the memo")

    monkeypatch.setattr(fingerprint, "distributions_of", must_not_look)
    forget()
    assert fingerprint.module_fingerprint(core) == first
    real_stat = fingerprint._file_sig
    monkeypatch.setattr(
        fingerprint,
        "_file_sig",
        lambda path: [0, 0, 0, 0] if path.endswith("RECORD") else real_stat(path),
    )
    forget()
    try:
        with pytest.raises(AssertionError, match="looked up"):
            fingerprint.module_fingerprint(core)
    finally:
        monkeypatch.undo()
        forget()
    assert fingerprint.module_fingerprint(core) == first


def test_local_modules_are_remembered_as_not_installed(monkeypatch):
    """A module no distribution installed (the tests' GEMM, here) is remembered as such
    under its file's stat and the stat of the directories that hold distributions: a fresh
    process does not look for its distribution; a changed directory does."""
    from cuforge.keys import fingerprint
    from tests.cute import gemm

    name = gemm.__name__

    def forget():
        fingerprint._not_installed.discard(name)

    forget()
    assert fingerprint._installed_key(gemm) is None
    fingerprint._flush_memo()

    def must_not_look(module):
        raise AssertionError("the distribution was looked up, not read from the memo")

    monkeypatch.setattr(fingerprint, "distributions_of", must_not_look)
    forget()
    assert fingerprint._installed_key(gemm) is None
    real_stat = fingerprint._memo.file_stat_key
    monkeypatch.setattr(
        fingerprint._memo,
        "file_stat_key",
        lambda path: [0, 0] if os.path.isdir(path) else real_stat(path),
    )
    forget()
    try:
        with pytest.raises(AssertionError, match="looked up"):
            fingerprint._installed_key(gemm)
    finally:
        monkeypatch.undo()
        forget()
    assert fingerprint._installed_key(gemm) is None


def test_a_hit_without_memfd_loads_through_a_private_file_and_removes_it(monkeypatch, tmp_path):
    first = cc.compile_cached(K.scale, *K.fake_args())
    assert first.source_of_result == "compiled"
    cc.clear_memo()
    monkeypatch.setattr(cute_cache, "_MEMFD", None)
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(temp))
    loads = cute_cache.counters["load"]
    again = cc.compile_cached(K.scale, *K.fake_args())
    assert again.source_of_result in ("memory", "disk") and again.key == first.key
    assert cute_cache.counters["load"] == loads + 1
    assert os.listdir(temp) == []  # the private directory is gone
