"""The second key: an operator the pre-build key cannot fingerprint is traced to its LTO-IR
and keyed on it, so a fresh process compiles the operator but builds no algorithm.

The operator closes over a lock (no stable value: the fingerprint refuses it) that its
device code never reads (the branch is removed by CPython's compiler), so numba-cuda-mlir
compiles it. Process A builds; process B, fresh, against the same cache dir, is served by
the IR key with no algorithm build (the real build, cuda.compute's
``_cccl_interop.call_compile``, is wrapped and counted), then calls a changed operator body
(a miss) and an uncached call; ``cuforge cache stats`` counts the three ways."""

from __future__ import annotations

import functools
import importlib.util
import subprocess
import sys

import pytest

from tests.cccl.conftest import run_child
from tests.conftest import child_env

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("numba_cuda_mlir") is None,
    reason="numba-cuda-mlir (cuda.compute's Python-operator compiler) is not installed",
)

#: what both processes run first: the unkeyable operator, and a build counter
SETUP = """
    import hashlib, threading
    from cuda.compute import _cccl_interop
    from cuforge import default_cache
    from cuforge.store import telemetry

    builds = []
    _real_compile = _cccl_interop.call_compile
    def _counted(*args, **kwargs):
        builds.append(1)
        return _real_compile(*args, **kwargs)
    _cccl_interop.call_compile = _counted          # every algorithm build, at module level

    def make(body):
        lock = threading.Lock()                     # the fingerprint refuses a lock
        if body == "plus":
            def op(a, b):
                if False:
                    return lock                     # never compiled: CPython drops it
                return a + b
        else:
            def op(a, b):
                if False:
                    return lock
                return a + b + 1
        return op

    def call(op):
        r = cccl.make_reduce_into(**reduce_args(op=op))
        out = last()
        out["ir"] = cccl.last_result().fields.get("ir")
        out["blob"] = hashlib.sha256(cc.serialize(r)).hexdigest()
        out["builds"] = len(builds)
        out["compiled"] = blobcache.counters.get("cccl:compiled", 0)
        return out

    def served():
        telemetry.flush()
        return telemetry.summary(os.environ["CUFORGE_CACHE_DIR"])["served"].get("cccl")
"""

FIRST = """
    op = make("plus")
    a = call(op)
    again = call(op)                                # cuda.compute's own cache, recognized
    emit({"first": a, "again": again, "served": served()})
"""

FRESH = """
    pre = call(None)                                # OpKind.PLUS: the pre-build key
    hit = call(make("plus"))
    changed = call(make("plus_one"))
    from cuda.compute import _caching
    _caching._BACKEND_SERIALIZES_BUILD_RESULTS = False   # as HostJIT: uncached
    unc = call(None)
    emit({"pre": pre, "hit": hit, "changed": changed, "uncached": unc, "served": served()})
"""


@pytest.fixture(scope="module")
def two_processes(cuda_env, tmp_path_factory) -> tuple[dict, dict, str]:
    cache_dir = str(tmp_path_factory.mktemp("cccl-ir"))
    run = functools.partial(run_child, cuda_env=cuda_env, cache_dir=cache_dir)
    a = run(SETUP + FIRST)
    b = run(SETUP + FRESH)
    return a, b, cache_dir


def test_a_fresh_process_is_served_by_the_ir_key_without_building(two_processes):
    a, b, _ = two_processes
    first, hit = a["first"], b["hit"]
    assert first["source"] == "compiled" and first["builds"] == 1
    assert first["ir"] and "op.<closure lock>" in first["reason"]  # the blocker is named
    assert a["again"]["source"] == "memory" and a["again"]["builds"] == 1
    # the fresh process: traced (the operator compiled), no algorithm built
    assert hit["source"] == "disk"
    assert hit["builds"] == b["pre"]["builds"] == 1  # the only build: OpKind.PLUS, before
    assert hit["compiled"] == b["pre"]["compiled"]
    assert hit["key"] == first["key"] and hit["ir"] == first["ir"]
    assert hit["blob"] == first["blob"]  # the same algorithm, device code and all
    # said once per kernel, naming the blocker
    warned = "make_reduce_into cannot be keyed before building"
    assert a["_stderr"].count(warned) == 1 and b["_stderr"].count(warned) == 1
    assert "op.<closure lock>" in b["_stderr"]


def test_a_changed_operator_body_misses_the_ir_key(two_processes):
    a, b, _ = two_processes
    changed = b["changed"]
    assert changed["source"] == "compiled" and changed["builds"] == b["hit"]["builds"] + 1
    assert changed["ir"] != a["first"]["ir"] and changed["key"] != a["first"]["key"]


def test_stats_count_calls_by_the_key_that_served_them(two_processes):
    a, b, cache_dir = two_processes
    assert b["pre"]["source"] == "compiled" and b["pre"]["ir"] is None  # the pre-build key
    assert b["uncached"]["source"] == "uncached" and "HostJIT" in b["uncached"]["reason"]
    assert a["served"] == {"pretrace": 0, "ir": 2, "uncached": 0}
    # the cache dir's counts, both processes: B added 1 pre-build, 2 IR (the hit, the
    # changed body), 1 uncached
    assert b["served"] == {"pretrace": 1, "ir": 4, "uncached": 1}
    stats = subprocess.run(
        [sys.executable, "-m", "cuforge", "cache", "stats"],
        env=child_env(CUFORGE_CACHE_DIR=cache_dir),
        capture_output=True,
        text=True,
        check=False,
    )
    assert stats.returncode == 0, stats.stderr
    assert "cccl: 1 by the pre-trace key, 4 by the IR key" in stats.stdout, stats.stdout
    assert "1 uncached" in stats.stdout
