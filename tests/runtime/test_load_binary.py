"""cuforge.load_binary: nvcc-built cubin, PTX and fatbin files become Programs (CPU: kinds,
archs, errors; GPU: their kernels launch like any other)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

import cuforge
from cuforge.toolchain import nvcc_path

SAXPY = r"""
extern "C" __global__ void saxpy(float* y, const float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""


def _nvcc() -> str:
    try:
        path = nvcc_path()
    except Exception:  # noqa: BLE001 - no nvcc: these tests cannot build their inputs
        path = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not os.path.exists(path):
        pytest.skip("nvcc is needed to build the binaries")
    return path


def _build(tmp_path, kind: str, arch: str) -> str:
    src = tmp_path / "saxpy.cu"
    src.write_text(SAXPY)
    out = tmp_path / f"saxpy_{arch}.{kind}"
    digits = arch.split("_")[1]
    flags = {
        "cubin": ["-cubin", f"-arch=sm_{digits}"],
        "ptx": ["-ptx", f"-arch=compute_{digits}"],
        "fatbin": [
            "-fatbin",
            "-gencode",
            f"arch=compute_{digits},code=[sm_{digits},compute_{digits}]",
        ],
    }[kind]
    subprocess.run([_nvcc(), *flags, "-o", str(out), str(src)], check=True, capture_output=True)
    return str(out)


@pytest.mark.parametrize(
    "kind,arch", [("cubin", "sm_80"), ("cubin", "sm_90"), ("ptx", "sm_80"), ("fatbin", None)]
)
def test_kind_and_arch_are_read_from_the_contents(tmp_path, kind, arch):
    path = _build(tmp_path, kind, "sm_80" if arch is None else arch)
    for given in (None, kind):
        prog = cuforge.load_binary(path, kind=given)
        assert isinstance(prog, cuforge.Program)
        assert prog.output == kind and prog.arch == arch
        assert prog.name == os.path.basename(path)
        assert prog.source_of_result == "loaded" and prog.key.startswith("loaded-")
    with open(path, "rb") as f:
        data = f.read()
    from_bytes = cuforge.load_binary(data)
    assert from_bytes.name == "<bytes>" and from_bytes.key == prog.key
    assert cuforge.load_binary(bytearray(data), name="mine").name == "mine"


def test_kernels_of_a_loaded_binary_know_their_params_from_the_source(tmp_path):
    path = _build(tmp_path, "cubin", "sm_80")
    bare = cuforge.load_binary(path).kernel("saxpy")
    assert bare.params is None  # packed by the driver's sizes at load
    typed = cuforge.load_binary(path, source=SAXPY).kernel("saxpy")
    assert typed.signature == "saxpy(float* y, const float* x, float a, int n)"


def test_a_symlink_to_the_binary_is_followed(tmp_path):
    path = _build(tmp_path, "cubin", "sm_80")
    link = tmp_path / "link.cubin"
    link.symlink_to(path)
    assert cuforge.load_binary(link).output == "cubin"


def test_errors_name_the_file_and_what_was_expected(tmp_path):
    path = _build(tmp_path, "cubin", "sm_80")
    with pytest.raises(ValueError, match="kind='ptx' was given but the contents are a cubin"):
        cuforge.load_binary(path, kind="ptx")
    with pytest.raises(ValueError, match="kind=.*cubin, ptx, fatbin.*'elf'"):
        cuforge.load_binary(path, kind="elf")
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"\x00\x01garbage")
    with pytest.raises(ValueError, match="junk.bin: not a cubin"):
        cuforge.load_binary(junk)
    with pytest.raises(FileNotFoundError, match="missing.cubin"):
        cuforge.load_binary(tmp_path / "missing.cubin")
    with pytest.raises(FileNotFoundError, match="regular"):
        cuforge.load_binary(tmp_path)  # a directory
    with pytest.raises(TypeError, match="path or the binary's bytes"):
        cuforge.load_binary(42)
    host_elf = shutil.which("true") or "/bin/true"
    with pytest.raises(ValueError, match="not a cubin"):
        cuforge.load_binary(host_elf)  # an ELF, but not for the GPU


# -- GPU ---------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["cubin", "ptx", "fatbin"])
@pytest.mark.parametrize("with_source", [False, True])
def test_loaded_binary_launches(tmp_path, kind, with_source):
    torch = pytest.importorskip("torch")
    major, minor = torch.cuda.get_device_capability()
    path = _build(tmp_path, kind, f"sm_{major}{minor}")
    prog = cuforge.load_binary(path, source=SAXPY if with_source else None)
    k = prog.kernel("saxpy")
    n = 1000
    x = torch.randn(n, device="cuda")
    y = torch.randn(n, device="cuda")
    ref = 2.5 * x + y
    k[(n + 255) // 256, 256](y, x, 2.5, n)
    torch.cuda.synchronize()
    assert torch.allclose(y, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
def test_a_cubin_for_another_gpu_fails_saying_so(tmp_path):
    torch = pytest.importorskip("torch")
    major, _ = torch.cuda.get_device_capability()
    other = "sm_75" if major >= 8 else "sm_90"
    prog = cuforge.load_binary(_build(tmp_path, "cubin", other))
    x = torch.zeros(4, device="cuda")
    with pytest.raises(cuforge.LaunchError, match=f"built for {other}"):
        prog.kernel("saxpy")[1, 32](x, x, 1.0, 4)
