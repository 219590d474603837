"""CUDA 12: NVRTC 12 from the pip wheels of ``cuforge[cu12]`` compiles real kernels.

Runs in the second virtual environment ``.venv-cu12`` (``make test-cu12``); in the main
suite, whose NVRTC is 13, the NVRTC 12 tests skip and say so. No CUDA 12 toolkit is needed:
NVRTC and its headers are the ``nvidia-cuda-nvrtc-cu12`` / ``-runtime-cu12`` /
``-cccl-cu12`` wheels. The CUDA 13 toolkit at /usr/local/cuda stays visible in most tests on
purpose: cuforge must not mix its headers with NVRTC 12. One test hides it for real (a mount
namespace, as in tests/test_pip_only.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from cuforge.toolchain import (
    header_cuda_version,
    nvrtc_library_major,
    nvrtc_version_tuple,
)
from tests.conftest import ROOT, child_env

NVRTC = nvrtc_version_tuple()
_RUNNING = "not found" if NVRTC is None else f"{NVRTC[0]}.{NVRTC[1]}"
needs_nvrtc12 = pytest.mark.skipif(
    NVRTC is None or NVRTC[0] != 12,
    reason=f"the running NVRTC is {_RUNNING}, not 12: run `make test-cu12` "
    "(a .venv-cu12 with cuforge[cu12])",
)
ARCHS = ("sm_90", "sm_80")

# compiles saxpy, a cuda_fp16 / cuda_bf16 kernel and the CUB block_reduce sample for both
# archs; prints what it saw as one JSON line
COMPILE = r"""
import json, os, sys
import cuforge
from cuforge.samples import SAMPLES_DIR
from cuforge.toolchain import compiler_identity, toolkit_include_dirs, toolkit_root
calls = []
import cuforge.compiler.nvrtc as nvrtc_mod
real = nvrtc_mod.compile_nvrtc
def counted(*a, **k):
    calls.append(1)
    return real(*a, **k)
nvrtc_mod.compile_nvrtc = counted
HALF = ('#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n'
        'extern "C" __global__ void h(__half* x, __nv_bfloat16* y, int n) {'
        ' int i = blockIdx.x * blockDim.x + threadIdx.x;'
        ' if (i < n) { x[i] = __hadd(x[i], __float2half(1.f)); y[i] = __float2bfloat16(2.f); } }')
out = {"sources": [], "keys": {}, "sizes": []}
for arch in sys.argv[1].split(","):
    progs = {
        "saxpy": cuforge.compile_file(os.path.join(SAMPLES_DIR, "saxpy.cu"), arch=arch),
        "half": cuforge.compile(HALF, name="half.cu", arch=arch),
        "cub": cuforge.compile_file(os.path.join(SAMPLES_DIR, "block_reduce.cu"),
                                    name_expressions=["block_sum<256, float>"], arch=arch),
    }
    for name, prog in progs.items():
        out["sources"].append(prog.source_of_result)
        out["keys"][f"{name}@{arch}"] = prog.key
        out["sizes"].append(len(prog.binary))
out["compiles"] = len(calls)
out["identity"] = compiler_identity("nvrtc")
out["include"] = toolkit_include_dirs()
out["toolkit"] = toolkit_root()
print(json.dumps(out))
"""


def _compile(archs=ARCHS, python=sys.executable, **env) -> dict:
    script = os.path.join(str(env.pop("workdir")), "compile.py")
    with open(script, "w") as f:
        f.write(COMPILE)
    done = subprocess.run(
        [python, script, ",".join(archs)],
        env=child_env(**env),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_versions_from_names_and_headers(tmp_path):
    """The CUDA major of an NVRTC file name and of a header's CUDA_VERSION, as 12 and 13
    spell them; these choose the headers that go with NVRTC."""
    assert nvrtc_library_major("/x/nvidia/cuda_nvrtc/lib/libnvrtc.so.12") == 12
    assert nvrtc_library_major("/x/nvidia/cu13/lib/libnvrtc.so.13.0.88") == 13
    assert nvrtc_library_major("nvrtc64_120_0.dll") == 12
    assert nvrtc_library_major("libfoo.so") is None
    (tmp_path / "cuda.h").write_text("/* x */\n#define CUDA_VERSION 12090\n")
    assert header_cuda_version(str(tmp_path)) == (12, 9)
    (tmp_path / "cuda.h").write_text("#define CUDA_VERSION 13000\n")
    assert header_cuda_version(str(tmp_path)) == (13, 0)
    assert header_cuda_version(str(tmp_path / "absent")) is None


@needs_nvrtc12
def test_nvrtc12_compiles_and_a_second_process_hits(tmp_path):
    first = _compile(workdir=tmp_path)
    ident = first["identity"]
    assert ident["version"].startswith("12."), ident
    assert os.path.basename(ident["library"]).startswith("libnvrtc.so.12"), ident
    # NVRTC 12 compiles against the cu12 header wheels, even with a CUDA 13 toolkit visible
    assert "CUDA_VERSION=12" in ident["headers"], ident["headers"]
    for d in first["include"]:
        version = header_cuda_version(d)  # None for the CCCL dir, which has no cuda.h
        assert version is None or version[0] == 12, (d, version)
        if first["toolkit"]:
            assert not d.startswith(first["toolkit"]), (d, first["toolkit"])
    assert first["compiles"] == 3 * len(ARCHS), first
    assert all(size > 0 for size in first["sizes"]), first
    assert len(set(first["keys"].values())) == 3 * len(ARCHS)

    second = _compile(workdir=tmp_path)
    assert second["compiles"] == 0, second
    assert set(second["sources"]) <= {"disk", "memory"}, second["sources"]
    assert second["keys"] == first["keys"]


@needs_nvrtc12
def test_nvrtc12_with_the_toolkit_hidden(tmp_path):
    """The CUDA 13 toolkit hidden for real: NVRTC 12 and the wheels' headers suffice."""
    if os.geteuid() != 0:
        pytest.skip("hiding the toolkit needs a mount namespace (root)")
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    empty = tmp_path / "empty"
    empty.mkdir()
    dirs = []
    for d in ("/usr/local/cuda", os.path.realpath("/usr/local/cuda")):
        if os.path.isdir(d) and d not in dirs:
            dirs.append(d)
    script = tmp_path / "compile.py"
    script.write_text(COMPILE)
    mounts = "".join(f"mount --bind {empty} {d} && " for d in dirs)
    done = subprocess.run(
        ["unshare", "-m", "sh", "-c", f"{mounts}exec {sys.executable} {script} sm_90"],
        env=child_env(PATH="/usr/bin:/bin", CUDA_HOME="", CUDA_PATH=""),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0 and "unshare failed" in done.stderr:
        pytest.skip(f"no mount namespaces here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stdout + done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["toolkit"] is None, out["toolkit"]
    assert out["identity"]["version"].startswith("12."), out["identity"]
    assert all(size > 0 for size in out["sizes"]), out


@needs_nvrtc12
def test_nvrtc_12_and_13_give_two_keys(tmp_path):
    """The key holds NVRTC's major.minor: the same source, arch and options compiled by
    NVRTC 12 (this venv) and NVRTC 13 (the main .venv) are two entries of one cache."""
    main = os.path.join(ROOT, ".venv", "bin", "python")
    if not os.path.isfile(main):
        pytest.skip(f"no main venv at {main} to compare with (run `make test` once)")
    cu12 = _compile(archs=("sm_90",), workdir=tmp_path)
    cu13 = _compile(archs=("sm_90",), python=main, workdir=tmp_path)
    if not cu13["identity"]["version"].startswith("13."):
        pytest.skip(f"the main venv's NVRTC is {cu13['identity']['version']}, not 13")
    assert cu13["compiles"] == 3, "NVRTC 13 must not reuse NVRTC 12's entries"
    for name, key in cu12["keys"].items():
        assert cu13["keys"][name] != key, name
