"""A plain `pip install` with no CUDA toolkit compiles kernels that use cuda_fp16.h,
cuda_bf16.h and CUB: the headers come from the nvidia-cuda-runtime and nvidia-cuda-cccl
wheels cuforge depends on. The toolkit is hidden for real: the test re-runs Python in a
new mount namespace with an empty directory bind-mounted over it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import child_env

CODE = r"""
import os, cuforge
from cuforge.samples import SAMPLES_DIR
from cuforge.toolchain import toolkit_root
assert toolkit_root() is None, toolkit_root()
cub = cuforge.compile_file(os.path.join(SAMPLES_DIR, "block_reduce.cu"),
                           name_expressions=["block_sum<256, float>"], arch="sm_90")
half = cuforge.compile(
    '#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n'
    'extern "C" __global__ void k(__half* h, __nv_bfloat16* b) {'
    ' *h = __float2half(1.f); *b = __float2bfloat16(2.f); }', arch="sm_90")
print("compiled", len(cub.binary) > 0, len(half.binary) > 0)
"""


def _toolkit_dirs() -> list[str]:
    dirs = []
    for d in ("/usr/local/cuda", os.path.realpath("/usr/local/cuda")):
        if os.path.isdir(d) and d not in dirs:
            dirs.append(d)
    return dirs


@pytest.mark.skipif(os.geteuid() != 0, reason="hiding the toolkit needs a mount namespace (root)")
@pytest.mark.skipif(shutil.which("unshare") is None, reason="unshare (util-linux) is not installed")
def test_compiles_with_the_toolkit_hidden(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    mounts = " && ".join(f"mount --bind {empty} {d}" for d in _toolkit_dirs())
    env = child_env(PATH="/usr/bin:/bin", CUDA_HOME="", CUDA_PATH="")
    script = tmp_path / "child.py"
    script.write_text(CODE)
    command = f"{mounts + ' && ' if mounts else ''}exec {sys.executable} {script}"
    done = subprocess.run(
        ["unshare", "-m", "sh", "-c", command],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0 and "unshare failed" in done.stderr:
        pytest.skip(f"no mount namespaces here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().endswith("compiled True True")
