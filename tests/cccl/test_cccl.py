"""cuforge.cccl without a GPU: builds for an explicit compute capability (ProxyArray), with a
stub libcuda when no driver is installed. Each real build takes seconds, so the tests share
one cache dir per module where that is correct (each says which entry it relies on) and
count builds rather than build many specializations."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from tests.cccl.conftest import run_child
from tests.conftest import child_env, run_python

REQUIRED_FACTORIES = {
    "make_reduce_into",
    "make_inclusive_scan",
    "make_exclusive_scan",
    "make_segmented_reduce",
    "make_merge_sort",
    "make_radix_sort",
    "make_unique_by_key",
    "make_unary_transform",
    "make_binary_transform",
    "make_histogram_even",
    "make_select",
}


def test_importing_cuforge_and_cuforge_cccl_does_not_import_cuda_compute():
    out = run_python(
        """
        import json, sys
        import cuforge, cuforge.cccl
        print(json.dumps(sorted(m for m in sys.modules if m.startswith(("cuda", "numpy")))))
        """
    )
    assert out == []


def test_discovery_covers_every_factory_and_one_shot_with_the_same_signatures(cuda_env, tmp_path):
    out = run_child(
        """
        import inspect
        facts = cccl.factory_names()
        shots = cccl.oneshot_names()
        same = all(inspect.signature(getattr(cccl, n)) == inspect.signature(getattr(cc, n))
                   for n in facts + shots)
        discovered = sorted(n for n in cc.__all__ if n.startswith("make_"))
        emit({"factories": facts, "oneshots": shots, "same": same, "discovered": discovered,
              "proxy": cccl.ProxyArray is cc.ProxyArray})
        """,
        cuda_env,
        str(tmp_path),
    )
    assert REQUIRED_FACTORIES <= set(out["factories"])
    assert out["factories"] == out["discovered"]
    assert {"reduce_into", "inclusive_scan", "radix_sort", "select"} <= set(out["oneshots"])
    assert out["same"] and out["proxy"]


def test_explicit_cc_build_then_a_fresh_process_restores_it_without_building(
    cuda_env, shared_cache
):
    """Builds make_reduce_into(int32, OpKind.PLUS, cc 9.0) into the module's shared cache."""
    built = run_child(
        """
        import hashlib
        a = cccl.make_reduce_into(**reduce_args())
        first = last(); fields = cccl.last_result().fields
        b = cccl.make_reduce_into(**reduce_args())
        emit({"first": first, "second": last(), "same": a is b, "type": type(a).__name__,
              "blob": hashlib.sha256(cc.serialize(a)).hexdigest(), "fields": fields})
        """,
        cuda_env,
        shared_cache,
    )
    assert built["first"]["source"] in ("compiled", "disk")  # disk: an earlier test built it
    assert built["second"]["source"] == "memory" and built["same"]
    assert built["type"] == "_Reduce"
    fields = built["fields"]
    assert fields["algorithm"] == "make_reduce_into"
    assert fields["compute_capability"] == "9.0"
    assert fields["python"] == f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert fields["version:cuda-cccl"] not in ("", "absent")
    assert fields["arg:op"] == "enum OpKind.PLUS"
    assert fields["arg:d_in"] == "array dtype('int32')"
    assert fields["arg:h_init"] == "value dtype('int32')"

    restored = run_child(
        """
        import hashlib
        import cuforge.cccl._wrap as w
        def no_build(**kwargs):
            raise AssertionError("a hit must never build")
        w._originals["make_reduce_into"] = no_build
        r = cccl.make_reduce_into(**reduce_args(cap=[90]))   # another spelling of 9.0
        emit({"last": last(), "type": type(r).__name__,
              "blob": hashlib.sha256(cc.serialize(r)).hexdigest(),
              "compiled": blobcache.counters.get("cccl:compiled", 0)})
        """,
        cuda_env,
        shared_cache,
    )
    assert restored["last"]["source"] == "disk"
    assert restored["last"]["key"] == built["first"]["key"]
    assert restored["type"] == "_Reduce" and restored["compiled"] == 0
    assert restored["blob"] == built["blob"]  # the round trip gives back the same algorithm

    ls = subprocess.run(
        [sys.executable, "-m", "cuforge", "cache", "ls", "--kind", "cccl", "--arch", "sm_90"],
        env=child_env(CUFORGE_CACHE_DIR=shared_cache),
        capture_output=True,
        text=True,
        check=False,
    )
    assert ls.returncode == 0, ls.stderr
    assert "cccl/make_reduce_into" in ls.stdout


def test_key_is_stable_across_processes_hash_seeds_and_directories(cuda_env, tmp_path):
    code = """
        from cuda.compute import CountingIterator, TransformIterator, gpu_struct, SortOrder
        P = cc.ProxyArray
        SCALE = 2
        def op(a, b):
            return a * SCALE + b
        def sq(x):
            return x * x
        Pair = gpu_struct({"a": np.int32, "b": np.float32}, name="Pair")
        def pair_add(x, y):
            return Pair(x.a + y.a, x.b + y.b)
        calls = [
            ("make_reduce_into", reduce_args()),
            ("make_reduce_into", reduce_args(op=op)),
            ("make_reduce_into", dict(reduce_args(), d_in=CountingIterator(np.int32(0)))),
            ("make_reduce_into", dict(reduce_args(), d_in=TransformIterator(CountingIterator(np.int32(0)), sq))),
            ("make_reduce_into", dict(d_in=P(Pair.dtype), d_out=P(Pair.dtype), op=pair_add,
                                      h_init=Pair(0, 0.0), compute_capability=90)),
            ("make_unary_transform", dict(d_in=P(np.float32), d_out=P(np.float32), op=sq,
                                          compute_capability=[80, 90])),
            ("make_radix_sort", dict(d_in_keys=P(np.int32), d_out_keys=P(np.int32),
                                     d_in_values=None, d_out_values=None,
                                     order=SortOrder.DESCENDING, compute_capability=90)),
        ]
        emit([cccl.key_of(name, **kw)[0] for name, kw in calls])
        """
    one = run_child(code, cuda_env, str(tmp_path), PYTHONHASHSEED="1")
    (tmp_path / "elsewhere").mkdir()
    two = run_child(
        code, cuda_env, str(tmp_path), PYTHONHASHSEED="2", cwd=str(tmp_path / "elsewhere")
    )
    assert one == two
    assert len(set(one)) == len(one)  # and they all differ from each other


def test_invalidation_global_closure_dtype_arch_and_library_version(cuda_env, tmp_path):
    out = run_child(
        """
        def key(**kw):
            return cccl.key_of("make_reduce_into", **reduce_args(**kw))[0]
        SCALE = 2
        def op(a, b):
            return a * SCALE + b
        def make(v):
            def op(a, b):
                return a + b + v
            return op
        k = {}
        k["base"] = key()
        k["global2"] = key(op=op)
        SCALE = 3                                   # a global the op reads
        k["global3"] = key(op=op)
        k["closure1"] = key(op=make(1))
        k["closure1again"] = key(op=make(1))
        k["closure2"] = key(op=make(2))             # a closure value
        k["float32"] = key(dtype=np.float32)        # a dtype
        k["cc80"] = key(cap=80)                     # the arch
        k["cc80_90"] = key(cap=[90, 80])
        k["cc_spellings"] = [key(cap=c) for c in ((9, 0), "9.0", [90])]
        import cuforge.cccl._key as K
        K._codegen_versions()["version:cuda-cccl"] = "9.9.9"   # the library version
        k["version"] = key()
        emit(k)
        """,
        cuda_env,
        str(tmp_path),
    )
    assert out["global2"] != out["global3"]
    assert out["closure1"] == out["closure1again"] != out["closure2"]
    distinct = [
        out[n]
        for n in (
            "base",
            "global2",
            "global3",
            "closure1",
            "closure2",
            "float32",
            "cc80",
            "cc80_90",
            "version",
        )
    ]
    assert len(set(distinct)) == len(distinct)
    assert out["cc_spellings"] == [out["base"]] * 3


def test_library_version_change_rebuilds_and_explain_says_why(cuda_env, shared_cache):
    out = run_child(
        """
        from cuforge.keys.explain import recent_misses
        cccl.make_reduce_into(**reduce_args())
        first = last()
        cccl.clear_memo()
        import cuforge.cccl._key as K
        real = K._codegen_versions()["version:cuda-cccl"]
        K._codegen_versions()["version:cuda-cccl"] = "9.9.9"   # what the key reads
        cccl.make_reduce_into(**reduce_args())
        emit({"first": first, "second": last(), "real": real,
              "reasons": recent_misses(os.environ["CUFORGE_CACHE_DIR"])[-1]["reasons"]})
        """,
        cuda_env,
        shared_cache,
    )
    assert out["second"]["source"] == "compiled"
    assert out["second"]["key"] != out["first"]["key"]
    assert out["reasons"] == [f"version:cuda-cccl {out['real']} -> 9.9.9"]


def test_a_blob_that_does_not_deserialize_is_rebuilt_and_overwritten(cuda_env, shared_cache):
    out = run_child(
        """
        from cuforge.core.blobcache import pack
        from cuforge import default_cache
        from cuforge.store.base import Entry
        cccl.make_reduce_into(**reduce_args())       # make sure the entry exists
        key = last()["key"]
        store = default_cache().store
        meta = store.get(key).meta
        store.put(Entry(key, "cccl", pack({"algorithm": b"not a cccl blob"}), meta))
        cccl.clear_memo()
        r = cccl.make_reduce_into(**reduce_args())
        emit({"last": last(), "type": type(r).__name__})
        """,
        cuda_env,
        shared_cache,
    )
    assert out["last"]["source"] == "compiled" and out["type"] == "_Reduce"
    assert "could not be loaded" in out["_stderr"] and "rebuilt" in out["_stderr"]
    again = run_child(
        """
        r = cccl.make_reduce_into(**reduce_args())
        emit({"last": last(), "n": int(len(cc.serialize(r)) > 1000)})
        """,
        cuda_env,
        shared_cache,
    )
    assert again["last"]["source"] == "disk" and again["n"] == 1


def test_hostjit_backend_builds_uncached_and_says_why(cuda_env, tmp_path):
    out = run_child(
        """
        from cuda.compute import _caching
        from cuforge.keys.explain import recent_misses
        _caching._BACKEND_SERIALIZES_BUILD_RESULTS = False   # as the v2 (HostJIT) build is
        a = cccl.make_reduce_into(**reduce_args())
        first = last()
        b = cccl.make_reduce_into(**reduce_args())
        from cuforge.store import telemetry
        telemetry.flush()
        emit({"first": first, "second": last(),
              "served": telemetry.summary(os.environ["CUFORGE_CACHE_DIR"])["served"],
              "reasons": recent_misses(os.environ["CUFORGE_CACHE_DIR"])[-1]["reasons"],
              "entries": [f for _, _, fs in os.walk(os.environ["CUFORGE_CACHE_DIR"] + "/v1/entries")
                          for f in fs]})
        """,
        cuda_env,
        str(tmp_path),
    )
    for r in (out["first"], out["second"]):
        assert r["source"] == "uncached" and "HostJIT" in r["reason"]
    assert out["_stderr"].count("HostJIT") == 1  # one warning
    assert "HostJIT" in out["reasons"][0] and out["entries"] == []
    # counted for `cuforge cache stats`: calls by the key that served them
    assert out["served"] == {"cccl": {"pretrace": 0, "ir": 0, "uncached": 2}}


def test_an_unkeyable_argument_is_named(cuda_env, tmp_path):
    out = run_child(
        """
        import threading
        from cuforge.keys.fingerprint import UnstableKeyError
        LOCK = threading.Lock()
        def op(a, b):
            return a + b if LOCK else b
        try:
            cccl.key_of("make_reduce_into", **reduce_args(op=op))
        except UnstableKeyError as exc:
            emit({"what": exc.what, "path": exc.path, "msg": str(exc)})
        """,
        cuda_env,
        str(tmp_path),
    )
    assert out["what"] == "op" and "LOCK" in out["path"]


def test_disable_cache_and_disable_file_cache(cuda_env, tmp_path):
    out = run_child(
        """
        def entries(d):
            return [f for _, _, fs in os.walk(os.path.join(d, "v1", "entries")) for f in fs]
        os.environ["CUFORGE_DISABLE_CACHE"] = "1"
        import cuforge
        with cuforge.fence("error"):  # caching off is no way around the fence
            try:
                cccl.make_reduce_into(**reduce_args())
                fenced = None
            except cuforge.CompileAfterFenceError as exc:
                fenced = [exc.system, exc.name, exc.key]
        cccl.make_reduce_into(**reduce_args())
        off = last()
        del os.environ["CUFORGE_DISABLE_CACHE"]
        os.environ["CUFORGE_DISABLE_FILE_CACHE"] = "1"
        cccl.make_reduce_into(**reduce_args())
        mem1 = last()
        cccl.clear_memo()
        cccl.make_reduce_into(**reduce_args())
        mem2 = last()
        emit({"off": off, "mem1": mem1, "mem2": mem2, "fenced": fenced,
              "entries": entries(os.environ["CUFORGE_CACHE_DIR"])})
        """,
        cuda_env,
        str(tmp_path),
    )
    assert out["fenced"][:2] == ["cuda.compute", "cccl/make_reduce_into"] and out["fenced"][2]
    assert out["off"]["source"] == "compiled"
    assert (out["mem1"]["source"], out["mem2"]["source"]) == ("compiled", "memory")
    assert out["entries"] == []


def test_enable_patches_cuda_compute_in_place_and_disable_restores(cuda_env, shared_cache):
    out = run_child(
        """
        original = cc.make_reduce_into
        cccl.enable(); cccl.enable()                 # idempotent
        from cuda.compute import make_reduce_into   # imported after enable(): cached
        import cuda.compute.algorithms._reduce as mod
        patched = (make_reduce_into is not original, mod.make_reduce_into is make_reduce_into,
                   make_reduce_into.__cuforge_original__ is original, cccl.is_enabled())
        make_reduce_into(**reduce_args())             # the shared cache's entry
        hit = last()
        cccl.disable()
        emit({"patched": patched, "hit": hit,
              "restored": [cc.make_reduce_into is original, mod.make_reduce_into is original,
                           not cccl.is_enabled()]})
        """,
        cuda_env,
        shared_cache,
    )
    assert all(out["patched"]) and all(out["restored"])
    assert out["hit"]["source"] in ("disk", "compiled")


def test_single_flight_across_processes(cuda_env, tmp_path):
    """Three processes ask for the same new algorithm at once: one builds, two wait and load."""
    cache = str(tmp_path / "cache")
    go = tmp_path / "go"
    code = f"""
        import time
        while not os.path.exists({str(go)!r}):
            time.sleep(0.005)
        cccl.make_reduce_into(**reduce_args(dtype=np.uint8))
        emit(last())
        """
    results: list = []
    errors: list = []

    def one():
        try:
            results.append(run_child(code, cuda_env, cache))
        except AssertionError as exc:  # reported below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(3)]
    for t in threads:
        t.start()
    import time

    time.sleep(1.0)  # let all three import cuda.compute and reach the start line
    go.write_text("")
    for t in threads:
        t.join(timeout=600)
    assert not errors, errors[0]
    sources = sorted(r["source"] for r in results)
    assert sources == ["compiled", "disk", "disk"]
    assert len({r["key"] for r in results}) == 1


@pytest.mark.slow
def test_python_operator_round_trip(cuda_env, tmp_path):
    """A Python-lambda operator (compiled by numba-cuda-mlir) is cached and restored."""
    code = """
        OFFSET = 1
        def op(a, b):
            return a + b + OFFSET
        r = cccl.make_reduce_into(**reduce_args(op=op))
        emit({"last": last(), "type": type(r).__name__})
        """
    first = run_child(code, cuda_env, str(tmp_path))
    second = run_child(code, cuda_env, str(tmp_path))
    assert first["last"]["source"] == "compiled"
    assert second["last"]["source"] == "disk"
    assert second["last"]["key"] == first["last"]["key"]


def test_offline_mode_serves_the_cache_and_never_builds(cuda_env, shared_cache):
    cached = run_child(  # make sure the shared entry exists (a build only when run alone)
        "cccl.make_reduce_into(**reduce_args()); emit(last())", cuda_env, shared_cache
    )
    out = run_child(
        """
        from cuforge.core.blobcache import OfflineBuildError
        cccl.make_reduce_into(**reduce_args())
        hit = last()
        try:
            cccl.make_reduce_into(**reduce_args(dtype=np.int16))
            err = None
        except OfflineBuildError as exc:
            err = str(exc)
        emit({"hit": hit, "err": err})
        """,
        cuda_env,
        shared_cache,
        CUFORGE_OFFLINE="1",
    )
    assert out["hit"]["source"] == "disk" and out["hit"]["key"] == cached["key"]
    assert out["err"] and "not in the cache" in out["err"] and "int16" in out["err"]
