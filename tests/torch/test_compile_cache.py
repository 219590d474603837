"""torch.compile's caches in cuforge, on the CPU (Inductor's CPU backend uses the same
FX-graph and AOTAutograd caches): a model compiled on "machine" A is compiled on B (fresh
TORCHINDUCTOR_CACHE_DIR, another cwd, the same cuforge remote) with no Inductor codegen,
counted with torch's own counters."""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="torch is not installed")

from tests.child import child_env, run_python  # noqa: E402

MACHINE = """
import json
import torch
import cuforge
from cuforge.torch import compile_cache
assert compile_cache.enable()
from torch._dynamo.utils import counters

torch.manual_seed(0)
# extern kernels only (addmm): no C++ kernel build, so the test stays fast on 2 cores
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 4))
x = torch.randn(8, 16)
with torch.no_grad():
    out = torch.compile(model)(x)
inductor = counters["inductor"]
print(json.dumps({
    "hit": inductor["fxgraph_cache_hit"], "miss": inductor["fxgraph_cache_miss"],
    "out": out.flatten().tolist(),
    "counters": dict(cuforge.default_cache().counters),
}))
"""


def _machine(tmp_path, label: str, remote: str) -> dict:
    home = tmp_path / label / "some" / "checkout"
    home.mkdir(parents=True)
    env = child_env(
        CUFORGE_CACHE_DIR=str(tmp_path / label / "cuforge"),
        CUFORGE_REMOTE=remote,
        TORCHINDUCTOR_CACHE_DIR=str(tmp_path / label / "inductor"),
        TRITON_CACHE_DIR=str(tmp_path / label / "triton"),
        TORCHINDUCTOR_COMPILE_THREADS="1",
        HOME=str(tmp_path / label),
        USER=f"user-{label}",
    )
    return run_python(MACHINE, env, timeout=240, cwd=str(home))


@pytest.mark.slow
def test_a_model_compiled_on_machine_a_is_loaded_on_b_without_codegen(tmp_path, redis_server):
    # A writes to a shared dir and to a real redis-server; one B reads each (3 processes,
    # not 4: torch's import and dynamo are most of each one's time)
    shared = tmp_path / "shared"
    shared.mkdir()
    a = _machine(tmp_path, "a", f"file://{shared},{redis_server.url}")
    assert a["miss"] >= 1 and a["hit"] == 0, a
    for label, remote in (("b-dir", f"file://{shared}"), ("b-redis", redis_server.url)):
        b = _machine(tmp_path, label, remote)
        assert b["miss"] == 0 and b["hit"] == a["miss"], (label, b)
        assert b["out"] == pytest.approx(a["out"])
        assert b["counters"].get("inductor:RemoteFxGraphCache:remote", 0) >= 1, b["counters"]


@pytest.mark.slow
def test_an_fx_graph_miss_is_explained_by_the_field_that_changed(cache, tmp_path, monkeypatch):
    import torch
    import torch._inductor.config as inductor_config

    import cuforge.triton
    from cuforge.keys.explain import last_miss
    from cuforge.torch import compile_cache

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    assert compile_cache.enable(cache)
    try:
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 4))
        with torch.no_grad():
            torch.compile(model)(torch.randn(8, 16))
        torch._dynamo.reset()
        with torch.no_grad(), inductor_config.patch(max_autotune_gemm_backends="ATEN"):
            torch.compile(model)(torch.randn(8, 16))
    finally:
        compile_cache.disable()
        cuforge.triton.disable()
        torch._dynamo.reset()
    record = last_miss("inductor:FxGraph:0/0")
    assert record is not None
    assert "inductor_config[max_autotune_gemm_backends] added" in record["reasons"], record
    (info,) = [i for i in cache.iterate() if i.meta.get("cache") == "RemoteFxGraphCache"][:1]
    fields = compile_cache.fields_from_debug_lines(
        ["[abc] torch_version: \x00\x01", "[def] gm: a\nb", "[ghi] fx_kwargs[x]: 0x7f00aa11bb"]
    )
    assert fields["torch_version"] == "hash abc" and fields["gm"] == "hash def"
    assert fields["fx_kwargs[x]"] == "hash ghi", fields
    assert info.kind == "inductor"


def test_a_torch_outside_the_window_is_probed_then_enabled_or_refused(monkeypatch, caplog):
    """A torch outside the tested window: the contract probe (a value through torch's own
    RemoteFxGraphCache, its backend overridden as enable() does) passes, so it is enabled
    with one line; with a flag torch no longer has, it is refused saying which."""
    import logging

    from cuforge.adapters import common
    from cuforge.torch import compile_cache as cc

    monkeypatch.setattr(cc, "SUPPORTED", ((99, 0), (99, 1)))
    monkeypatch.setattr(common, "_probed", {})
    try:
        with caplog.at_level(logging.WARNING, logger="cuforge"):
            assert cc.enable(triton=False) is True
        assert caplog.text.count("contract probe passed") == 1
        assert common.VERDICTS["torch_compile"][0] == "probed"
    finally:
        cc.disable()
    monkeypatch.setattr(common, "_probed", {})
    monkeypatch.setattr(cc, "_FLAGS", (("torch._inductor.config", ("no_such_flag_in_torch",)),))
    monkeypatch.setitem(cc._state, "warned", False)
    with caplog.at_level(logging.WARNING, logger="cuforge"):
        assert cc.enable(triton=False) is False
    assert "torch._inductor.config has no no_such_flag_in_torch" in caplog.text
    assert common.VERDICTS["torch_compile"][0] == "refused"


def _causes(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        exc = getattr(exc, "inner_exception", None) or exc.__cause__ or exc.__context__
    return seen


def _logging_cxx(tmp_path):
    """(a C++ compiler that logs each command line to ``cxx.log``, the log's path)."""
    import shutil

    real = shutil.which("g++") or shutil.which("clang++")
    if real is None:
        pytest.skip("no C++ compiler for Inductor's CPU backend")
    log = tmp_path / "cxx.log"
    cxx = tmp_path / "cxx"
    cxx.write_text(f'#!/bin/sh\necho "$@" >> "{log}"\nexec {real} "$@"\n')
    cxx.chmod(0o755)
    return cxx, log


@pytest.mark.slow
def test_the_fence_refuses_a_fresh_cpu_graph_after_a_warm_up(tmp_path, monkeypatch, capsys):
    """torch.compile on Inductor's CPU backend builds C++ with the host compiler: after the
    fence, a warm graph runs (no build) and a fresh graph is refused before the compiler
    runs (error), or reported and built (warn). Compiler runs counted by a logging CXX
    (issue 35, item 2)."""

    import torch
    import torch._inductor.config as inductor_config

    import cuforge
    from cuforge.base.errors import CompileAfterFenceError
    from cuforge.core import fencing

    cxx, log = _logging_cxx(tmp_path)

    def builds() -> int:
        if not log.exists():
            return 0
        return sum(1 for line in log.read_text().splitlines() if "-o" in line.split())

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setattr(inductor_config.cpp, "cxx", (None, str(cxx)))
    monkeypatch.setattr(inductor_config, "compile_threads", 1)
    torch._dynamo.reset()
    fencing._mode = None
    fencing.reset()

    def warm(x):
        return (x.sin() + 1) * 2

    def fresh(x):
        return (x.cos() - 3) * x

    x = torch.randn(8)
    try:
        compiled = torch.compile(warm)
        expected = compiled(x)
        built = builds()
        assert built >= 1
        with cuforge.fence("error"):
            assert torch.equal(compiled(x), expected)  # warm: no build, no trip
            with pytest.raises(Exception) as info:  # noqa: B017 - dynamo wraps the error
                torch.compile(fresh)(x)
        (err,) = [e for e in _causes(info.value) if isinstance(e, CompileAfterFenceError)]
        assert err.system == "torch.compile" and err.kind == "inductor-cpp" and err.key
        assert "Nothing was compiled" in str(err)
        assert builds() == built  # the compiler never ran
        torch._dynamo.reset()
        with cuforge.fence("warn"):
            assert torch.allclose(torch.compile(fresh)(x), fresh(x))
        assert builds() > built
        assert "compile after the fence: torch.compile" in capsys.readouterr().err
    finally:
        torch._dynamo.reset()
        fencing._mode = None
        fencing.reset()


CPP_MACHINE = """
import json, sys
import torch
import torch._inductor.config as inductor_config
inductor_config.cpp.cxx = (None, sys.argv[1])
from cuforge.torch import compile_cache
assert compile_cache.enable()
from torch._dynamo.utils import counters

def f(x):
    return (x.sin() + 1) * 2 - x.relu()

x = torch.arange(16, dtype=torch.float32) / 7
out = torch.compile(f)(x)
import cuforge
print(json.dumps({
    "out": out.tolist(),
    "fx_hit": counters["inductor"]["fxgraph_cache_hit"],
    "counters": {k: v for k, v in cuforge.default_cache().counters.items() if "inductor" in k},
}))
"""


@pytest.mark.slow
def test_machine_b_runs_no_cpp_compiler_for_inductors_cpu_kernels(tmp_path):
    """Inductor's CPU backend: B gets the FX graph from the remote and its C++ kernels too
    (entries of kind inductor-cpp), so the host C++ compiler never runs on B; the same
    outputs. C++ compiler runs are counted by a logging CXX (issue 33)."""

    cxx, log = _logging_cxx(tmp_path)

    def runs() -> int:  # compiler processes that build something (not --version probes)
        lines = log.read_text().splitlines() if log.exists() else []
        return sum(1 for line in lines if "-o" in line.split())

    (tmp_path / "share").mkdir(mode=0o700)
    remote = f"file://{tmp_path / 'share'}"
    outs = {}
    for label in ("a", "b"):
        before = runs()
        home = tmp_path / label
        home.mkdir()
        env = child_env(
            CUFORGE_CACHE_DIR=str(home / "cuforge"),
            CUFORGE_REMOTE=remote,
            # an unsigned share serves native host code only when allowed (issue 35.5)
            CUFORGE_REMOTE_NATIVE="allow",
            TORCHINDUCTOR_CACHE_DIR=str(home / "inductor"),
            TORCHINDUCTOR_COMPILE_THREADS="1",
            HOME=str(home),
            USER=f"user-{label}",
        )
        outs[label] = run_python(
            CPP_MACHINE.replace("sys.argv[1]", repr(str(cxx))), env, timeout=400, cwd=str(home)
        )
        outs[label]["cxx_runs"] = runs() - before
    a, b = outs["a"], outs["b"]
    assert a["cxx_runs"] >= 1 and a["counters"].get("inductor-cpp:built", 0) >= 1, a
    assert b["fx_hit"] == 1, b
    assert b["cxx_runs"] == 0, (b, log.read_text())
    assert (
        b["counters"].get("inductor-cpp:hit", 0) >= 1 and "inductor-cpp:built" not in b["counters"]
    )
    assert b["out"] == a["out"]
