"""cuforge.torch: the object cache, locks, failures and the drop-in API, proven by
counting real compiler invocations (wrapped nvcc / c++) and by real child processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.conftest import GPU_VISIBLE, child_env, run_python
from tests.torch.conftest import EXT_NAME


def _build(spec):
    from cuforge.torch import build_extension

    return build_extension(spec)


@pytest.mark.slow
def test_editing_one_tu_recompiles_only_that_tu(ext, torch_env):
    first = _build(ext.spec())
    assert first.source in ("built", "objects")
    torch_env.reset()
    ext.write(ext.kernels, ext.read(ext.kernels).replace("a[i] + b[i]", "b[i] + a[i]"))
    second = _build(ext.spec())
    assert torch_env.compiles("kernels.cu") == 1
    assert torch_env.compiles() == 1  # binding.cpp came from the object cache
    assert torch_env.links() == 1
    assert second.compiled == ["kernels.cu"] and second.reused == ["binding.cpp"]
    assert second.key != first.key


@pytest.mark.slow
def test_header_edit_rebuilds_its_dependents_only(ext, torch_env):
    config = os.path.join(os.path.dirname(ext.kernels), "config.cuh")
    ext.write(config, "#define SAMPLE_BLOCK 256\n")
    ext.write(ext.kernels, '#include "config.cuh"\n' + ext.read(ext.kernels))
    _build(ext.spec())
    torch_env.reset()
    os.utime(config, ns=(time.time_ns(), time.time_ns() + 10**9))  # touched, unchanged
    touched = _build(ext.spec())
    assert torch_env.compiles() == 0 and touched.source == "cache"
    ext.write(config, "#define SAMPLE_BLOCK 128\n")
    edited = _build(ext.spec())
    assert torch_env.compiles() == 1 and torch_env.compiles("kernels.cu") == 1
    assert edited.compiled == ["kernels.cu"]


@pytest.mark.slow
def test_a_flags_change_rebuilds(ext, torch_env):
    _build(ext.spec())
    torch_env.reset()
    result = _build(ext.spec(extra_cuda_cflags=["-DSAMPLE_BLOCK=128"]))
    assert torch_env.compiles("kernels.cu") == 1
    assert torch_env.compiles("binding.cpp") == 0  # its flags did not change
    assert result.compiled == ["kernels.cu"]


@pytest.mark.slow
def test_a_revert_rebuilds_nothing(ext, torch_env):
    original = ext.read(ext.kernels)
    a = _build(ext.spec())
    ext.write(ext.kernels, original.replace("alpha * x[i]", "x[i] * alpha"))
    b = _build(ext.spec())
    assert b.key != a.key
    torch_env.reset()
    ext.write(ext.kernels, original)
    again = _build(ext.spec(build_directory=ext.build_dir + "-elsewhere"))
    assert torch_env.compiles() == 0 and torch_env.links() == 0
    assert again.key == a.key and again.path == a.path


_WARM_CHILD = """
import json, sys
import torch
calls = []
def audit(event, args):
    if event in ("subprocess.Popen", "os.system", "os.posix_spawn", "os.fork", "os.exec",
                 "os.spawn", "os.forkpty"):
        calls.append(event)
sys.addaudithook(audit)
from cuforge.torch import load
m = load(NAME, SOURCES, build_directory=BUILD)
out = m.add(torch.ones(4), torch.full((4,), 2.0)).tolist()
from cuforge.torch.build import last_build
print(json.dumps({"subprocesses": calls, "out": out, "source": last_build["source"]}))
"""


def _child(code: str, **subs: object) -> str:
    code = textwrap.dedent(code)
    for k, v in subs.items():
        code = code.replace(k, json.dumps(v))
    return code


@pytest.mark.slow
def test_a_warm_load_in_a_fresh_process_starts_no_subprocess(ext, torch_env):
    _build(ext.spec())
    torch_env.reset()
    got = run_python(
        _child(_WARM_CHILD, NAME=EXT_NAME, SOURCES=ext.sources, BUILD=ext.build_dir),
        child_env(),
    )
    assert got["subprocesses"] == []
    assert got["source"] == "cache"
    assert got["out"] == [3.0, 3.0, 3.0, 3.0]
    assert torch_env.compiles() == 0 and torch_env.links() == 0


@pytest.mark.slow
def test_load_inline_with_the_same_inputs_does_not_rebuild(tmp_path, torch_env):
    code = """
    import json, ctypes
    from cuforge.torch import load_inline
    path = load_inline("cuforge_inline_test", ["extern \\"C\\" int forty_two() { return 42; }"],
                       no_implicit_headers=True, is_python_module=False,
                       build_directory=BUILD)
    again = load_inline("cuforge_inline_test", ["extern \\"C\\" int forty_two() { return 42; }"],
                        no_implicit_headers=True, is_python_module=False,
                        build_directory=BUILD)
    print(json.dumps({"path": path, "again": again, "value": ctypes.CDLL(path).forty_two()}))
    """
    first = run_python(_child(code, BUILD=str(tmp_path / "inline")), child_env())
    assert first["value"] == 42 and first["path"] == first["again"]
    assert torch_env.compiles() == 1 and torch_env.links() == 1
    second = run_python(_child(code, BUILD=str(tmp_path / "inline2")), child_env())
    assert second["path"] == first["path"]
    assert torch_env.compiles() == 1 and torch_env.links() == 1


_LOAD_CHILD = """
import json, time
import torch
from cuforge.torch import load
t = time.time()
load(NAME, SOURCES, build_directory=BUILD)
from cuforge.torch.build import last_build
print(json.dumps({"source": last_build["source"], "path": last_build["path"]}))
"""


@pytest.mark.slow
def test_four_concurrent_loaders_build_once(ext, torch_env):
    _build(ext.spec())  # the binding is cached; now make a brand-new kernels TU
    ext.append_kernels("// a new variant for four loaders\n")
    torch_env.reset()
    code = _child(_LOAD_CHILD, NAME=EXT_NAME, SOURCES=ext.sources, BUILD=ext.build_dir)
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
    results = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert torch_env.compiles() == 1 and torch_env.links() == 1
    assert len({r["path"] for r in results}) == 1
    assert sorted(r["source"] for r in results).count("built") == 1


@pytest.mark.slow
def test_a_builder_killed_with_sigkill_does_not_block_the_next(ext, torch_env):
    _build(ext.spec())
    ext.append_kernels("// a variant whose first builder dies\n")
    torch_env.reset()
    code = _child(_LOAD_CHILD, NAME=EXT_NAME, SOURCES=ext.sources, BUILD=ext.build_dir)
    victim = subprocess.Popen(
        [sys.executable, "-c", code],
        env=child_env(CUFORGE_TEST_SLEEP="120"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 300
    while torch_env.compiles("kernels.cu") == 0:  # it holds the locks and is compiling
        assert victim.poll() is None, "the builder exited before compiling"
        assert time.monotonic() < deadline, "the builder never started compiling"
        time.sleep(0.2)
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait()
    start = time.monotonic()
    got = run_python(code, child_env())
    assert got["source"] == "built" and os.path.isfile(got["path"])
    assert time.monotonic() - start < 120  # not the victim's 120 s sleep, nor a lock timeout
    assert torch_env.compiles("kernels.cu") == 2


@pytest.mark.slow
def test_a_broken_source_gives_a_clear_error_and_the_fix_works(ext, torch_env):
    from cuforge.base.errors import CompileError

    good = ext.read(ext.kernels)
    ext.write(ext.kernels, good.replace("out[i] = a[i] + b[i];", "out[i] = a[i] + undefined_b[i];"))
    with pytest.raises(CompileError) as info:
        _build(ext.spec())
    err = info.value
    text = str(err)
    assert err.name == "kernels.cu"
    assert "undefined_b" in text and "error" in text
    assert err.log_path and os.path.isfile(err.log_path)
    assert f"full log: {err.log_path}" in text
    assert len(err.log.splitlines()) <= 41
    ext.write(ext.kernels, good)
    fixed = _build(ext.spec())
    assert os.path.isfile(fixed.path)


@pytest.mark.skipif(GPU_VISIBLE, reason="a visible GPU always gives an arch")
def test_no_gpu_and_no_arch_gives_the_clear_error(ext, torch_env, monkeypatch):
    from cuforge.base.errors import ArchError

    monkeypatch.delenv("CUFORGE_ARCH", raising=False)
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    with pytest.raises(ArchError) as info:
        _build(ext.spec())
    assert "CUFORGE_ARCH" in str(info.value) and "TORCH_CUDA_ARCH_LIST" in str(info.value)
    assert torch_env.compiles() == 0


@pytest.mark.slow
def test_a_torch_library_extension_loads_with_is_python_module_false(ext, torch_env):
    code = """
    import json
    import torch
    from cuforge.torch import load
    path = load(NAME, SOURCES, build_directory=BUILD, is_python_module=False)
    ops = torch.ops.cuforge_sample
    out = ops.add(torch.ones(3), torch.ones(3)).tolist()
    print(json.dumps({"path": path, "has": [hasattr(ops, n) for n in ("add", "scale", "relu")],
                      "scaled": ops.scale(torch.ones(2), 3.0).tolist(), "out": out}))
    """
    got = run_python(_child(code, NAME=EXT_NAME, SOURCES=ext.sources, BUILD=ext.build_dir))
    assert isinstance(got["path"], str) and os.path.isfile(got["path"])
    assert got["has"] == [True, True, True]
    assert got["out"] == [2.0, 2.0, 2.0] and got["scaled"] == [3.0, 3.0]


@pytest.mark.slow
def test_the_split_nvcc_pipeline_builds_a_working_module(ext, torch_env):
    """nvcc's host and device lanes run in parallel (forced here on the small kernels TU;
    by default only a .cu that includes torch's headers is split)."""
    ext.append_kernels("// a variant built by the split pipeline\n")
    code = """
    import json
    import torch
    from cuforge.torch import load
    m = load(NAME, SOURCES, build_directory=BUILD, split=True)
    from cuforge.torch.build import last_build
    out = m.relu(torch.tensor([-1.0, 2.0])).tolist()
    print(json.dumps({"compiled": last_build["compiled"], "out": out}))
    """
    got = run_python(_child(code, NAME=EXT_NAME, SOURCES=ext.sources, BUILD=ext.build_dir))
    assert got["compiled"][:1] == ["kernels.cu"] and got["out"] == [0.0, 2.0]
    with open(os.path.join(ext.build_dir, "build.ninja"), encoding="utf-8") as f:
        assert "cuforge.torch.nvcc_split" in f.read()
    assert not os.path.exists(os.path.join(ext.build_dir, "kernels.cuda.o.split"))


_CHECKED_CHILD = """
import json
import torch
from cuforge.torch import load
m = load(NAME, SOURCES, build_directory=BUILD)
from cuforge.torch.build import last_build
out = m.add(torch.ones(4), torch.full((4,), 2.0)).tolist()
print(json.dumps({"source": last_build["source"], "path": last_build["path"], "out": out}))
"""


def _module_entry_payload(key: str) -> bytes:
    from cuforge import default_cache

    entry = default_cache().store.get(key)
    assert entry is not None and entry.kind == "module"
    return entry.payload


@pytest.mark.slow
def test_a_tampered_module_file_is_rewritten_from_the_store_before_import(ext, torch_env):
    built = _build(ext.spec())
    payload = _module_entry_payload(built.key)
    with open(built.path, "rb") as f:
        assert f.read() == payload
    code = _child(_CHECKED_CHILD, NAME=EXT_NAME, SOURCES=ext.sources, BUILD=ext.build_dir)
    # same size, different bytes: garbage in the middle of the ELF file
    middle = len(payload) // 2
    with open(built.path, "r+b") as f:
        f.seek(middle)
        f.write(b"\xcc" * 4096)
    torch_env.reset()
    got = run_python(code, child_env())
    assert got["source"] == "cache" and got["path"] == built.path
    assert got["out"] == [3.0, 3.0, 3.0, 3.0]
    with open(built.path, "rb") as f:
        assert f.read() == payload  # rewritten from the store entry, then imported
    # a symlink planted in its place (to a file of the attacker's choosing) is replaced
    decoy = os.path.join(os.path.dirname(ext.kernels), "decoy.so")
    with open(decoy, "wb") as f:
        f.write(payload[:1024])
    os.unlink(built.path)
    os.symlink(decoy, built.path)
    got = run_python(code, child_env())
    assert got["out"] == [3.0, 3.0, 3.0, 3.0]
    assert not os.path.islink(built.path)
    with open(built.path, "rb") as f:
        assert f.read() == payload
    with open(decoy, "rb") as f:
        assert f.read() == payload[:1024]  # never written through the link
    # group/other-writable: rewritten with a safe mode
    os.chmod(built.path, 0o777)
    got = run_python(code, child_env())
    assert got["out"] == [3.0, 3.0, 3.0, 3.0]
    assert os.stat(built.path).st_mode & 0o022 == 0
    assert torch_env.compiles() == 0 and torch_env.links() == 0  # the store entry was intact


@pytest.mark.slow
def test_modules_load_from_a_private_dir_when_the_modules_dir_is_writable_by_others(ext, torch_env):
    built = _build(ext.spec())
    modules = os.path.dirname(os.path.dirname(built.path))
    assert os.path.basename(modules) == "modules"
    code = _child(_CHECKED_CHILD, NAME=EXT_NAME, SOURCES=ext.sources, BUILD=ext.build_dir)
    mode = os.stat(modules).st_mode & 0o777
    torch_env.reset()
    os.chmod(modules, 0o777)
    try:
        got = run_python(code, child_env())
    finally:
        os.chmod(modules, mode)
    assert got["out"] == [3.0, 3.0, 3.0, 3.0]
    assert got["source"] == "cache"
    assert not got["path"].startswith(modules)  # never imported from the untrusted dir
    assert torch_env.compiles() == 0 and torch_env.links() == 0


@pytest.mark.slow
def test_a_warm_load_refreshes_the_module_entry_and_counts_the_time_it_saved(ext, torch_env):
    from cuforge import default_cache
    from cuforge.store import telemetry
    from cuforge.torch.build import counters

    first = _build(ext.spec())
    cache = default_cache()
    entry = cache.layout.entry_path(first.key)
    month_ago = time.time() - 30 * 86400
    for path in (entry, os.path.dirname(first.path)):
        os.utime(path, (month_ago, month_ago))  # as if built a month ago
    telemetry.flush(cache.directory)
    saved = telemetry.summary(cache.directory)["seconds_saved"]
    warm = counters["warm"]

    again = _build(ext.spec())
    assert again.source == "cache" and counters["warm"] == warm + 1
    assert cache.counters["torch:warm"] == counters["warm"]  # the view is the cache's
    telemetry.flush(cache.directory)
    assert telemetry.summary(cache.directory)["seconds_saved"] > saved  # the build it skipped
    disk = next(t for t in cache.store.tiers if t.tier == "disk")
    disk.prune(older_than=7 * 86400)
    assert os.path.isfile(entry)  # used just now: kept
    assert os.path.isfile(again.path)  # and its module dir
