"""The cached-compile pipeline: proven by counting compiler invocations, never by timing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import cuforge
from cuforge.core.pipeline import counters
from tests.conftest import child_env, run_python

KERNEL = textwrap.dedent(
    """
    #include "common.cuh"
    extern "C" __global__ void scale(float* x, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) x[i] *= SCALE;
    }
    """
)

TEMPLATE = textwrap.dedent(
    """
    template <int N, typename T>
    __global__ void fill(T* out) { out[threadIdx.x] = T(N); }
    """
)


@pytest.fixture
def project(tmp_path):
    """A kernel file including a header through -I, which includes a nested header."""
    inc = tmp_path / "include"
    inc.mkdir()
    (inc / "common.cuh").write_text('#pragma once\n#include "nested.cuh"\n#define SCALE FACTOR\n')
    (inc / "nested.cuh").write_text("#pragma once\n#define FACTOR 2.0f\n")
    src = tmp_path / "scale.cu"
    src.write_text(KERNEL)
    return tmp_path


def _age(path, seconds: float = 10.0) -> None:
    """Make a file look older, as an unedited header in a real project is."""
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns - int(seconds * 1e9)))


def compile_project(project, **kw):
    return cuforge.compile_file(project / "scale.cu", include_dirs=[project / "include"], **kw)


CHILD = """
import json, cuforge
from cuforge.core.pipeline import counters
p = cuforge.compile_file({src!r}, include_dirs=[{inc!r}], backend={backend!r})
print(json.dumps({{"compiles": counters["compiles"], "source": p.source_of_result,
                  "sha": __import__("hashlib").sha256(p.binary).hexdigest()}}))
"""


def child_compile(project, backend="nvrtc", env=None):
    code = CHILD.format(
        src=str(project / "scale.cu"), inc=str(project / "include"), backend=backend
    )
    return run_python(code, env)


@pytest.mark.parametrize("backend", ["nvrtc", "nvcc"])
def test_second_process_does_not_compile(project, backend):
    first = child_compile(project, backend)
    second = child_compile(project, backend)
    assert first["compiles"] == 1 and first["source"] == "compiled"
    assert second["compiles"] == 0 and second["source"] == "disk"
    assert second["sha"] == first["sha"]


def test_repeat_in_process_is_a_memory_hit(project):
    first = compile_project(project)
    second = compile_project(project)
    assert first.source_of_result == "compiled"
    assert second.source_of_result == "memory"
    assert second.binary == first.binary
    assert counters["compiles"] == 1


@pytest.mark.parametrize("backend", ["nvrtc", "nvcc"])
def test_header_edit_recompiles_and_touch_does_not(project, backend):
    nested = project / "include" / "nested.cuh"
    first = child_compile(project, backend)
    os.utime(nested)  # touched, content unchanged
    assert child_compile(project, backend)["compiles"] == 0
    nested.write_text("#pragma once\n#define FACTOR 3.0f\n")  # a nested header, found via -I
    edited = child_compile(project, backend)
    assert edited["compiles"] == 1
    assert edited["sha"] != first["sha"]
    assert child_compile(project, backend)["compiles"] == 0


def test_header_edit_noticed_in_process(project):
    """The in-process fast path re-checks headers through the stat memo."""
    for header in (project / "include").iterdir():
        _age(header)
    compile_project(project)
    assert compile_project(project).source_of_result == "memory"
    nested = project / "include" / "nested.cuh"
    nested.write_text("#pragma once\n#define FACTOR 5.0f\n")
    again = compile_project(project)
    assert again.source_of_result == "compiled"
    assert counters["compiles"] == 2


def test_relative_include_is_keyed(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "k.cuh").write_text("#define V 1\n")
    src = tmp_path / "k.cu"
    src.write_text('#include "sub/k.cuh"\nextern "C" __global__ void k(int* x) { *x = V; }\n')
    a = cuforge.compile_file(src)
    (tmp_path / "sub" / "k.cuh").write_text("#define V 2\n")
    b = cuforge.compile_file(src)
    assert (a.source_of_result, b.source_of_result) == ("compiled", "compiled")
    assert a.key != b.key


def test_new_header_shadowing_an_include_path_misses(tmp_path):
    """A header that appears earlier in the search path changes what the include means."""
    first_dir, second_dir = tmp_path / "a", tmp_path / "b"
    first_dir.mkdir()
    second_dir.mkdir()
    (second_dir / "v.cuh").write_text("#define V 1\n")
    src = '#include "v.cuh"\nextern "C" __global__ void k(int* x) { *x = V; }\n'
    cuforge.compile(src, name="shadow.cu", include_dirs=[first_dir, second_dir])
    (first_dir / "v.cuh").write_text("#define V 2\n")
    again = cuforge.compile(src, name="shadow.cu", include_dirs=[first_dir, second_dir])
    assert again.source_of_result == "compiled"


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"options": ("-lineinfo",)}, "option -lineinfo added"),
        ({"defines": {"EXTRA": 1}}, "define EXTRA=1 added"),
        ({"arch": "sm_80"}, "arch sm_90 -> sm_80"),
    ],
)
def test_input_changes_miss_and_are_explained(project, change, reason):
    base = compile_project(project, arch="sm_90")
    kw = {"arch": "sm_90", **change}
    changed = compile_project(project, **kw)
    assert changed.source_of_result == "compiled"
    assert changed.key != base.key
    assert reason in cuforge.explain_miss("scale.cu")
    assert compile_project(project, **kw).source_of_result == "memory"


def test_name_expression_change_misses():
    a = cuforge.compile(TEMPLATE, name="fill.cu", name_expressions=["fill<1, float>"])
    b = cuforge.compile(TEMPLATE, name="fill.cu", name_expressions=["fill<2, float>"])
    assert b.source_of_result == "compiled" and a.key != b.key
    assert "name expression fill<2, float> added" in cuforge.explain_miss("fill.cu")


def test_header_edit_is_explained(project, monkeypatch):
    compile_project(project)
    (project / "include" / "common.cuh").write_text(
        '#pragma once\n#include "nested.cuh"\n#define SCALE 1.5f\n'
    )
    compile_project(project)
    reasons = cuforge.explain_miss("scale.cu")
    assert any(r.startswith("header ") and r.endswith("common.cuh changed") for r in reasons), (
        reasons
    )


def test_explain_env_var_prints_reason(project):
    child_compile(project)
    (project / "include" / "nested.cuh").write_text("#pragma once\n#define FACTOR 4.0f\n")
    code = CHILD.format(
        src=str(project / "scale.cu"), inc=str(project / "include"), backend="nvrtc"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=child_env(CUFORGE_EXPLAIN="1"),
        capture_output=True,
        text=True,
        check=True,
    )
    assert (
        "cuforge: miss for scale.cu: header" in done.stderr and "nested.cuh changed" in done.stderr
    )


def test_allow_listed_env_var_misses_and_unrelated_hits(project):
    first = child_compile(project, "nvcc")
    assert child_compile(project, "nvcc", child_env(SOME_UNRELATED_VAR="x"))["compiles"] == 0
    changed = child_compile(project, "nvcc", child_env(NVCC_APPEND_FLAGS="-lineinfo"))
    assert changed["compiles"] == 1
    assert first["compiles"] == 1


def test_disable_cache_always_compiles(project, monkeypatch):
    monkeypatch.setenv("CUFORGE_DISABLE_CACHE", "1")
    compile_project(project)
    compile_project(project)
    assert counters["compiles"] == 2


def test_disable_file_cache_keeps_memory_only(project, isolated_cache):
    env = child_env(CUFORGE_DISABLE_FILE_CACHE="1")
    assert child_compile(project, env=env)["compiles"] == 1
    assert child_compile(project, env=env)["compiles"] == 1
    assert not (isolated_cache / "v1").exists()


def _entry_path(key: str) -> str:
    from cuforge.store.disk import DiskStore

    store = DiskStore(os.environ["CUFORGE_CACHE_DIR"], 1 << 30)
    return store.path_for(key)


@pytest.mark.parametrize("damage", ["truncate", "bitflip"])
def test_corrupt_entry_is_rebuilt_with_a_warning(project, damage):
    first = child_compile(project)
    from cuforge.store.disk import DiskStore

    keys = [
        info.key
        for info in DiskStore(os.environ["CUFORGE_CACHE_DIR"], 1 << 30).iterate()
        if info.kind == "kernel"
    ]
    assert len(keys) == 1
    path = _entry_path(keys[0])
    data = bytearray(open(path, "rb").read())
    if damage == "truncate":
        data = data[: len(data) // 2]
    else:
        data[len(data) - 40] ^= 0x10
    with open(path, "wb") as f:
        f.write(data)
    code = CHILD.format(
        src=str(project / "scale.cu"), inc=str(project / "include"), backend="nvrtc"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=child_env(), capture_output=True, text=True, check=True
    )
    rebuilt = json.loads(done.stdout.strip().splitlines()[-1])
    assert rebuilt["compiles"] == 1
    assert rebuilt["sha"] == first["sha"]
    assert "corrupt" in done.stderr.lower() or "checksum" in done.stderr.lower()
    assert child_compile(project)["compiles"] == 0


RACER = """
import hashlib, json, os, sys, time
while not os.path.exists({go!r}):
    time.sleep(0.005)
import cuforge
from cuforge.core.pipeline import counters
p = cuforge.compile({src!r}, name="race.cu")
print(json.dumps({{"compiles": counters["compiles"], "sha": hashlib.sha256(p.binary).hexdigest()}}))
"""


def test_eight_processes_race_one_compile(tmp_path):
    go = tmp_path / "go"
    src = 'extern "C" __global__ void race(float* x) { x[threadIdx.x] += 1.0f; }\n'
    code = RACER.format(go=str(go), src=src)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code], env=child_env(), stdout=subprocess.PIPE, text=True
        )
        for _ in range(8)
    ]
    time.sleep(1.0)  # let all eight import and wait at the start line
    go.write_text("go")
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert sum(r["compiles"] for r in results) == 1
    assert len({r["sha"] for r in results}) == 1


SLOW_NVCC = """#!/bin/sh
touch {started}
while [ -f {hold} ]; do sleep 0.1; done
exec {nvcc} "$@"
"""


def test_killed_lock_holder_does_not_block(tmp_path):
    from cuforge.toolchain import nvcc_path

    started, hold = tmp_path / "started", tmp_path / "hold"
    wrapper = tmp_path / "nvcc"
    wrapper.write_text(SLOW_NVCC.format(started=started, hold=hold, nvcc=nvcc_path()))
    wrapper.chmod(0o755)
    env = child_env(CUFORGE_NVCC=str(wrapper))
    src = 'extern "C" __global__ void held(float* x) { x[0] = 1.0f; }\n'
    code = f"""
import json, cuforge
from cuforge.core.pipeline import counters
p = cuforge.compile({src!r}, name="held.cu", backend="nvcc")
print(json.dumps({{"compiles": counters["compiles"], "n": len(p.binary)}}))
"""
    hold.write_text("")
    holder = subprocess.Popen(
        [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True
    )
    deadline = time.time() + 120
    while not started.exists():
        assert time.time() < deadline, "the holder never reached the compiler"
        time.sleep(0.05)
    waiters = [
        subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    time.sleep(1.0)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    hold.unlink()
    results = []
    for proc in waiters:
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert sum(r["compiles"] for r in results) == 1
    assert all(r["n"] > 0 for r in results)


@pytest.mark.parametrize("where", ["/proc/cuforge-cannot-exist", "file-as-parent"])
def test_unusable_cache_dir_works_uncached(project, tmp_path, where):
    if where == "file-as-parent":
        blocker = tmp_path / "blocker"
        blocker.write_text("not a directory")
        where = str(blocker / "cache")
    env = child_env(CUFORGE_CACHE_DIR=where)
    code = CHILD.format(
        src=str(project / "scale.cu"), inc=str(project / "include"), backend="nvrtc"
    )
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout.strip().splitlines()[-1])["compiles"] == 1
        assert "cuforge" in done.stderr.lower() and where.split("/")[1] in done.stderr


def test_eviction_keeps_disk_under_cap(monkeypatch, isolated_cache):
    from cuforge.store.disk import DiskStore

    sizes = []
    for i in range(6):
        p = cuforge.compile(
            f'extern "C" __global__ void k{i}(float* x) {{ x[{i}] = {i}.0f; }}\n', name=f"k{i}.cu"
        )
        sizes.append(len(p.binary))
    cap = int(sum(sizes) * 0.6)
    monkeypatch.setenv("CUFORGE_CACHE_MAX_BYTES", str(cap))
    last = cuforge.compile(
        'extern "C" __global__ void k_last(float* x) { x[0] = 9.0f; }\n', name="klast.cu"
    )
    store = DiskStore(str(isolated_cache), cap)
    assert store.total_bytes() <= cap
    kept = {info.key for info in store.iterate()}
    assert last.key in kept


def test_name_expressions_resolve_after_disk_hit():
    code = f"""
import json, cuforge
from cuforge.core.pipeline import counters
p = cuforge.compile({TEMPLATE!r}, name="fill.cu", name_expressions=["fill<7, float>", "fill<3, int>"])
print(json.dumps({{"compiles": counters["compiles"], "source": p.source_of_result, "lowered": p.lowered_names}}))
"""
    first = run_python(code)
    second = run_python(code)
    assert second["compiles"] == 0 and second["source"] == "disk"
    assert second["lowered"] == first["lowered"]
    assert set(second["lowered"]) == {"fill<7, float>", "fill<3, int>"}
    assert all(v.startswith("_Z") for v in second["lowered"].values())


def test_compile_error_names_file_and_line():
    bad = 'extern "C" __global__ void broken(float* x) {\n  x[0] = undefined_thing;\n}\n'
    with pytest.raises(cuforge.CompileError) as info:
        cuforge.compile(bad, name="broken.cu")
    text = str(info.value)
    assert "broken.cu" in text and "2" in text and "undefined_thing" in text
    assert info.value.diagnostics and info.value.diagnostics[0].line == 2


def test_empty_source_and_bad_arch_are_clear():
    with pytest.raises(ValueError, match="empty"):
        cuforge.compile("   \n", name="empty.cu")
    with pytest.raises(cuforge.ArchError, match="sm_90"):
        cuforge.compile('extern "C" __global__ void k() {}', arch="hopper")


def test_no_arch_anywhere_says_how_to_set_it(monkeypatch):
    from tests.conftest import GPU_VISIBLE

    if GPU_VISIBLE:
        pytest.skip("a GPU supplies the arch")
    monkeypatch.delenv("CUFORGE_ARCH")
    with pytest.raises(cuforge.ArchError, match="CUFORGE_ARCH"):
        cuforge.compile('extern "C" __global__ void k() {}')


def test_inline_headers_are_keyed():
    src = '#include "tile.cuh"\nextern "C" __global__ void k(int* x) { *x = TILE; }\n'
    a = cuforge.compile(src, name="inl.cu", headers={"tile.cuh": "#define TILE 8\n"})
    b = cuforge.compile(src, name="inl.cu", headers={"tile.cuh": "#define TILE 16\n"})
    assert a.key != b.key and b.source_of_result == "compiled"


def test_fatbin_for_two_archs_with_nvcc():
    p = cuforge.compile(
        'extern "C" __global__ void k(float* x) { x[0] = 1.0f; }\n',
        name="fat.cu",
        backend="nvcc",
        output="fatbin",
        arch=["sm_80", "sm_90"],
    )
    assert p.source_of_result == "compiled" and len(p.binary) > 0
    assert p.arch == ("sm_80", "sm_90")
