"""cuforge.flashinfer: FlashInfer's JIT builds through the cache, on two "machines" (own
workspace, own cuforge dir, one ``file://`` remote), counted by logging nvcc / c++
wrappers. Real builds of FlashInfer's ``cascade`` module for sm_90a with the toolkit here
(about 25 s each on 2 cores; norm and sampling need cuBLAS / cuRAND headers that a bare
toolkit lacks). Each machine is a real process: FlashInfer reads its workspace at import."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.libcuda_stub import build_stub

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
_CUDA = os.environ.get("CUDA_HOME") or "/usr/local/cuda"


def _flashinfer_site() -> str | None:
    spec = importlib.util.find_spec("flashinfer")
    if spec is None or not spec.origin:
        return None
    return os.path.dirname(os.path.dirname(spec.origin))


_SITE = _flashinfer_site()
_NVCC = os.path.join(_CUDA, "bin", "nvcc")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        _SITE is None,
        reason="flashinfer-python is not installed (make test-integrations installs it into "
        ".flashinfer-site)",
    ),
    pytest.mark.skipif(
        importlib.util.find_spec("tvm_ffi") is None, reason="apache-tvm-ffi is not installed"
    ),
    pytest.mark.skipif(not os.path.isfile(_NVCC), reason=f"no nvcc at {_NVCC}"),
]

_CHILD = r"""
import hashlib, json, os, sys
import cuforge
from cuforge.core.caching import Cache
import cuforge.flashinfer as cf
cache = Cache(os.environ["T_CACHE"], remotes=[os.environ["T_REMOTE"]], telemetry=False)
assert cf.enable(cache), cf.hook_problem()
import flashinfer.jit.cascade as cascade
spec = cascade.gen_cascade_module()
if os.environ.get("T_KEY_ONLY"):
    spec.write_ninja()
    print("RESULT " + json.dumps({"key": cf.key_of(spec)[0]}))
    sys.exit(0)
module = spec.build_and_load()
data = open(spec.jit_library_path, "rb").read()
print("RESULT " + json.dumps({
    "sha": hashlib.sha256(data).hexdigest(),
    "key": cf.key_of(spec)[0],
    "loaded": type(module).__name__,
    "counters": {k: v for k, v in cache.counters.items() if k.startswith("flashinfer")},
}))
"""


def _wrapper(path: str, real: str) -> str:
    with open(path, "w") as f:
        f.write(f'#!/bin/sh\necho "$(basename "$0") $@" >> "$CC_LOG"\nexec {real} "$@"\n')
    os.chmod(path, 0o755)
    return path


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("fi")
    tools = root / "bin"
    tools.mkdir()
    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    _wrapper(str(tools / "nvcc"), _NVCC)
    _wrapper(str(tools / "c++"), cxx)
    stub = build_stub(str(root / "stub"))
    (root / "shared").mkdir()
    (root / "empty").mkdir()
    return {"root": root, "tools": str(tools), "stub": stub, "remote": f"file://{root / 'shared'}"}


def _machine(world, name: str, **extra: str) -> dict:
    root = world["root"] / name
    root.mkdir(exist_ok=True)
    log = root / "cc.log"
    if log.exists():
        log.unlink()  # count this process's compiler calls only
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join([os.path.join(_REPO, "src"), _REPO, _SITE]),
        CUDA_HOME=_CUDA,
        FLASHINFER_NVCC=os.path.join(world["tools"], "nvcc"),
        CXX=os.path.join(world["tools"], "c++"),
        PATH=world["tools"] + os.pathsep + env.get("PATH", ""),
        FLASHINFER_WORKSPACE_BASE=str(root / "ws"),
        FLASHINFER_CUDA_ARCH_LIST="9.0",
        TORCH_CUDA_ARCH_LIST="9.0",
        FLASHINFER_EXTRA_LDFLAGS=f"-L{world['stub']}",
        LD_LIBRARY_PATH=os.pathsep.join([world["stub"], os.path.join(_CUDA, "lib64")]),
        CC_LOG=str(log),
        T_CACHE=str(root / "cuforge"),
        # the default cache dir: a process that passes cache=Cache(T_CACHE) writes nothing here
        CUFORGE_CACHE_DIR=str(root / "home-cache"),
        T_REMOTE=world["remote"],
        # the remote is unsigned: native modules from it need the explicit yes
        CUFORGE_REMOTE_NATIVE="allow",
    )
    env.update(extra)
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")][-1]
    out = json.loads(line[len("RESULT ") :])
    calls = log.read_text().splitlines() if log.exists() else []
    out["compiles"] = sum(1 for c in calls if c.startswith("nvcc ") and " -c " in c)
    out["links"] = sum(1 for c in calls if c.startswith("c++ ") and "-shared" in c.split())
    out["probes"] = sum(1 for c in calls if c.split()[1:] == ["--version"])
    out["log"] = proc.stderr
    out["so"] = root / "ws"
    return out


def test_the_entry_is_native_code():
    from cuforge.store.schema import entry_problem, is_native

    assert is_native("flashinfer", {})
    assert entry_problem("flashinfer", {"name": "cascade", "native_module": True}) is None
    assert "native_module" in entry_problem("flashinfer", {"name": "cascade"})


def test_second_machine_builds_nothing_and_loads_the_same_bytes(world):
    a = _machine(world, "a")
    assert a["compiles"] == 2 and a["links"] == 1, a
    assert a["counters"].get("flashinfer:built") == 1
    b = _machine(world, "b")
    assert b["compiles"] == 0 and b["links"] == 0, b["log"]
    assert b["sha"] == a["sha"] and b["key"] == a["key"]
    assert b["loaded"] == a["loaded"]
    assert b["counters"].get("flashinfer:remote") == 1
    # a second process on B: its own disk tier (and the workspace copy), still no compiler
    again = _machine(world, "b")
    assert again["compiles"] == 0 and again["sha"] == a["sha"]
    assert again["counters"].get("flashinfer:disk") == 1
    # the compilers' --version: once per machine (B's first process), kept in B's cache dir
    assert b["probes"] == 2, b["log"]
    assert again["probes"] == 0, again["log"]
    assert not os.path.exists(world["root"] / "b" / "home-cache"), "a memo left the cache dir"


def test_an_edited_flag_or_source_changes_the_key(world, tmp_path):
    base = _machine(world, "k1", T_KEY_ONLY="1")["key"]
    assert _machine(world, "k2", T_KEY_ONLY="1")["key"] == base  # path-free
    flagged = _machine(world, "k3", T_KEY_ONLY="1", FLASHINFER_EXTRA_CUDAFLAGS="-DCUFORGE_EDIT")
    assert flagged["key"] != base
    debug = _machine(world, "k4", T_KEY_ONLY="1", FLASHINFER_JIT_DEBUG="1")
    assert debug["key"] != base
    arch = _machine(world, "k5", T_KEY_ONLY="1", FLASHINFER_CUDA_ARCH_LIST="10.0")
    assert arch["key"] != base
    # a user include dir is keyed by its contents, not its path
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "user.h").write_text("#define USER 1\n")
    one = _machine(world, "k6", T_KEY_ONLY="1", FLASHINFER_EXTRA_CUDAFLAGS=f"-I{inc}")["key"]
    moved = tmp_path / "moved"
    shutil.copytree(inc, moved)
    assert (
        _machine(world, "k7", T_KEY_ONLY="1", FLASHINFER_EXTRA_CUDAFLAGS=f"-I{moved}")["key"] == one
    )
    (moved / "user.h").write_text("#define USER 2\n")
    edited = _machine(world, "k8", T_KEY_ONLY="1", FLASHINFER_EXTRA_CUDAFLAGS=f"-I{moved}")
    assert edited["key"] != one


def test_a_generated_source_is_keyed_by_content(world, tmp_path):
    """A module whose sources FlashInfer generated into its workspace: an edit misses."""
    script = r"""
import json, os
from cuforge.core.caching import Cache
import cuforge.flashinfer as cf
from flashinfer.jit import env as jit_env
from flashinfer.jit.core import gen_jit_spec
gen = jit_env.FLASHINFER_GEN_SRC_DIR / "cuforge_gen"
gen.mkdir(parents=True, exist_ok=True)
(gen / "k.cu").write_text('#include "k_config.inc"\nint f() { return VALUE; }\n')
(gen / "k_config.inc").write_text(os.environ["T_VALUE"])
spec = gen_jit_spec("cuforge_gen", [gen / "k.cu"])
spec.write_ninja()
print("RESULT " + json.dumps({"key": cf.key_of(spec)[0]}))
"""
    keys = []
    for i, value in enumerate(["#define VALUE 1\n", "#define VALUE 1\n", "#define VALUE 2\n"]):
        root = tmp_path / f"g{i}"
        env = dict(os.environ)
        env.update(
            PYTHONPATH=os.pathsep.join([os.path.join(_REPO, "src"), _REPO, _SITE]),
            CUDA_HOME=_CUDA,
            FLASHINFER_WORKSPACE_BASE=str(root),
            FLASHINFER_CUDA_ARCH_LIST="9.0",
            T_VALUE=value,
        )
        proc = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")][-1]
        keys.append(json.loads(line[7:])["key"])
    assert keys[0] == keys[1]  # another workspace path, the same contents
    assert keys[2] != keys[0]  # the generated header changed


def test_a_corrupt_entry_is_rebuilt(world):
    first = _machine(world, "c")
    entries = world["root"] / "c" / "cuforge"
    from cuforge.base.layout import CacheLayout

    path = CacheLayout(str(entries)).entry_path(first["key"])
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF
    with open(path, "wb") as f:
        f.write(data)
    shutil.rmtree(first["so"])  # the workspace too: only the cache could serve it
    # the remote still holds a good copy: take it out of the picture
    again = _machine(world, "c", T_REMOTE=f"file://{world['root'] / 'empty'}")
    assert again["compiles"] == 2, again["log"]
    assert again["counters"].get("flashinfer:built") == 1
    assert again["sha"]  # it loads
