"""The GPU-dependent rules of `cuforge doctor` and `cuforge env`, in process, with the GPU
facts faked: CI has no GPU, and these rules must still be right when one is there."""

from __future__ import annotations

import pytest

from cuforge import toolchain
from cuforge.base.arch import arch_findings, arch_to_torch
from cuforge.cli import doctor, output
from cuforge.torch.jobs import recommended_jobs

SUPPORTED = [f"sm_{a}" for a in (75, 80, 86, 87, 89, 90, 100, 120)]


@pytest.mark.parametrize(
    ("name", "text", "gpus", "expected"),
    [
        ("TORCH_CUDA_ARCH_LIST", "9.0", ["sm_90"], []),
        # arch-specific sm_90a code runs on any compute capability 9.0 GPU (the GPU image's default)
        ("TORCH_CUDA_ARCH_LIST", "9.0a", ["sm_90"], []),
        ("TORCH_CUDA_ARCH_LIST", "8.0", ["sm_90"], [("FAIL", "no arch for the visible sm_90")]),
        ("TORCH_CUDA_ARCH_LIST", "8.0;9.0", ["sm_90"], [("WARN", "also builds sm_80")]),
        ("TORCH_CUDA_ARCH_LIST", "8.0", ["sm_86"], [("WARN", "only through compatibility")]),
        ("TORCH_CUDA_ARCH_LIST", "8.0+PTX", ["sm_90"], [("WARN", "only through compatibility")]),
        ("TORCH_CUDA_ARCH_LIST", "3.5", [], [("FAIL", "cannot build sm_35")]),
        ("TORCH_CUDA_ARCH_LIST", "nine", [], [("FAIL", "cannot be read")]),
        ("CUFORGE_ARCH", "sm_90", ["sm_90"], []),
        ("CUFORGE_ARCH", "sm_80", ["sm_90"], [("WARN", "ignored while a GPU is visible")]),
        ("CUFORGE_ARCH", "90", [], []),
    ],
)
def test_arch_findings(name, text, gpus, expected):
    found = arch_findings(name, text, gpus, SUPPORTED)
    assert len(found) == len(expected), found
    for (status, message, fix), (want_status, words) in zip(found, expected, strict=True):
        assert status == want_status and words in message and fix


def test_too_many_archs_warn():
    found = arch_findings("TORCH_CUDA_ARCH_LIST", "7.5;8.0;8.6;8.9;9.0;10.0", [], SUPPORTED)
    assert [s for s, _, _ in found] == ["WARN"] and "6 archs" in found[0][1]


def test_arch_to_torch():
    assert arch_to_torch("sm_90") == "9.0"
    assert arch_to_torch("sm_90a") == "9.0a"
    assert arch_to_torch("sm_100") == "10.0"


def test_jobs_are_capped_by_memory():
    gib = 1024**3
    assert recommended_jobs({"cores": 16, "memory_available": 100 * gib})[0] == 16
    assert recommended_jobs({"cores": 16, "memory_available": 10 * gib})[0] == 4
    assert recommended_jobs({"cores": 16, "memory_available": 1 * gib})[0] == 1
    assert recommended_jobs({"cores": 4, "memory_available": None})[0] == 4


class FakeProbe(doctor.Probe):
    def __init__(self, gpus):
        super().__init__()
        self._gpus = (gpus, None if gpus else "no GPU")


H100 = {"index": 0, "name": "NVIDIA H100 80GB HBM3", "arch": "sm_90", "memory_bytes": 80 << 30}


def _fake_toolchain(monkeypatch, *, driver, nvrtc, nvcc, supported=SUPPORTED):
    monkeypatch.setattr(toolchain, "driver_version", lambda: driver)
    monkeypatch.setattr(toolchain, "nvrtc_version", lambda: nvrtc)
    monkeypatch.setattr(toolchain, "nvcc_version", lambda: nvcc)
    monkeypatch.setattr(toolchain, "supported_archs", lambda backend: list(supported))


def _by_id(rows):
    return {r.id: r for r in rows}


def test_gpu_rows_pass_when_driver_and_toolkit_match(monkeypatch):
    _fake_toolchain(monkeypatch, driver=13000, nvrtc="13.0", nvcc="13.0.88")
    rows = _by_id(doctor.check_gpus(FakeProbe([H100])))
    assert (
        rows["gpu"].status == "PASS"
        and "H100" in rows["gpu"].detail
        and "sm_90" in rows["gpu"].detail
    )
    assert "CUDA 13.0" in rows["gpu"].detail
    assert rows["gpu.arch"].status == "PASS"
    assert rows["gpu.driver"].status == "PASS"


def test_old_driver_major_is_a_fail_and_minor_a_warn(monkeypatch):
    _fake_toolchain(monkeypatch, driver=12080, nvrtc="13.0", nvcc="13.0.88")
    row = _by_id(doctor.check_gpus(FakeProbe([H100])))["gpu.driver"]
    assert row.status == "FAIL" and "CUDA_ERROR_UNSUPPORTED_PTX_VERSION" in row.detail and row.fix
    _fake_toolchain(monkeypatch, driver=13000, nvrtc="13.2", nvcc="13.0.88")
    row = _by_id(doctor.check_gpus(FakeProbe([H100])))["gpu.driver"]
    assert row.status == "WARN" and "NVRTC 13.2" in row.detail and "cubin" in row.fix


def test_toolkit_that_cannot_target_the_gpu_fails(monkeypatch):
    _fake_toolchain(monkeypatch, driver=13000, nvrtc="13.0", nvcc="13.0.88", supported=["sm_80"])
    row = _by_id(doctor.check_gpus(FakeProbe([H100])))["gpu.arch"]
    assert row.status == "FAIL" and "cannot build sm_90" in row.detail


def test_no_gpu_skips_and_says_so():
    rows = doctor.check_gpus(FakeProbe([]))
    assert [(r.id, r.status) for r in rows] == [
        ("gpu", "SKIP"),
        ("gpu.arch", "SKIP"),
        ("gpu.driver", "SKIP"),
    ]
    assert "no GPU" in rows[0].detail


def test_arch_list_row_with_a_gpu(monkeypatch):
    monkeypatch.setattr(toolchain, "supported_archs", lambda backend: list(SUPPORTED))
    monkeypatch.delenv("CUFORGE_ARCH", raising=False)
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    row = doctor.check_arch_list(FakeProbe([H100]))[0]
    assert row.status == "WARN" and row.fix == "export TORCH_CUDA_ARCH_LIST='9.0'"
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0")
    row = doctor.check_arch_list(FakeProbe([H100]))[0]
    assert row.status == "FAIL" and row.fix == "export TORCH_CUDA_ARCH_LIST='9.0'"
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    assert doctor.check_arch_list(FakeProbe([H100]))[0].status == "PASS"


def test_torch_major_mismatch_is_a_fail(monkeypatch):
    probe = FakeProbe([])
    probe._memo["torch"] = ({"version": "2.9.0+cu128", "cuda": "12.8", "path": "/x"}, None)
    monkeypatch.setattr(toolchain, "nvcc_version", lambda: "13.0.88")
    row = doctor.check_torch(probe)[0]
    assert row.status == "FAIL" and "12.8" in row.detail and "cu130" in row.fix
    probe._memo["torch"] = ({"version": "2.9.0+cu130", "cuda": "13.0", "path": "/x"}, None)
    assert doctor.check_torch(probe)[0].status == "PASS"
    probe._memo["torch"] = ({"version": "2.9.0+cpu", "cuda": None, "path": "/x"}, None)
    assert doctor.check_torch(probe)[0].status == "WARN"
    probe._memo["torch"] = (None, None)
    assert doctor.check_torch(probe)[0].status == "SKIP"


def test_a_broken_check_becomes_a_warn_not_a_crash(monkeypatch):
    def boom(probe):
        raise RuntimeError("kaboom")

    monkeypatch.setattr(doctor, "CHECKS", (("boom", boom),))
    rows, _ = doctor.collect()
    assert [(r.id, r.status) for r in rows] == [("boom", "WARN")]
    assert "kaboom" in rows[0].detail


def test_run_checks_runs_only_the_named_rows(monkeypatch):
    monkeypatch.setenv("MAX_JOBS", "banana")
    rows = doctor.run_checks(["build_jobs"])
    assert [(r.id, r.status) for r in rows] == [("build_jobs", "FAIL")]
    assert "MAX_JOBS='banana'" in rows[0].detail
    # a check that makes several rows gives only those asked for, in report order
    monkeypatch.delenv("CUFORGE_ARCH", raising=False)
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    rows = doctor.run_checks(["build_jobs", "arch_list.TORCH_CUDA_ARCH_LIST", "ccache"])
    assert [r.id for r in rows] == ["arch_list.TORCH_CUDA_ARCH_LIST", "build_jobs", "ccache"]


def test_every_row_id_is_a_check_id():
    ids = doctor.check_ids()
    assert len(ids) == len(set(ids))
    assert {"nvrtc.headers", "nvrtc.headers_compile", "cache.dir", "remote", "gpu.driver"} <= set(
        ids
    )


def test_an_unknown_check_id_is_a_usage_error_that_lists_the_ids():
    with pytest.raises(output.UsageError) as info:
        doctor.run_checks(["nvrtc", "nope"])
    assert "'nope'" in str(info.value) and "nvrtc.headers_compile" in str(info.value)
    assert "'nvrtc'" not in str(info.value)


def test_a_broken_selected_check_is_still_reported(monkeypatch):
    def boom(probe):
        raise RuntimeError("kaboom")

    monkeypatch.setattr(doctor, "CHECKS", (("torch", boom),))
    rows = doctor.run_checks(["torch"])
    assert [(r.id, r.status) for r in rows] == [("torch", "WARN")] and "kaboom" in rows[0].detail


def test_cuda_headers_is_a_skip_without_torch():
    probe = FakeProbe([])
    probe._memo["torch"] = (None, None)
    (row,) = doctor.check_cuda_headers(probe)
    assert row.status == "SKIP" and "torch is not installed" in row.detail


def _fake_nvrtc_identity(monkeypatch, version, cuda_version, library):
    identity = {"version": version, "headers": f"CUDA_VERSION={cuda_version} CCCL_VERSION=1"}
    monkeypatch.setattr(toolchain, "compiler_identity", lambda backend: dict(identity))
    monkeypatch.setattr(toolchain, "nvrtc_library_path", lambda: str(library))


def _nvrtc_wheel(tmp_path, version):
    """A site-packages with the nvidia-cuda-nvrtc wheel ``version``: its library file and
    its .dist-info (real files; nothing here is loaded)."""
    site = tmp_path / "lib" / "python3" / "site-packages"
    lib = site / "nvidia" / "cu13" / "lib"
    lib.mkdir(parents=True)
    (site / f"nvidia_cuda_nvrtc-{version}.dist-info").mkdir()
    (lib / "libnvrtc.so.13").write_bytes(b"")
    return lib / "libnvrtc.so.13"


def test_nvrtc_newer_than_its_headers_says_to_install_its_release_s_header_wheels(
    monkeypatch, tmp_path
):
    library = _nvrtc_wheel(tmp_path, "13.5.12")
    _fake_nvrtc_identity(monkeypatch, "13.5", 13000, library)
    (row,) = doctor.check_nvrtc_headers(FakeProbe([]))
    assert row.status == "WARN" and "NVRTC 13.5 compiles with CUDA 13.0 headers" in row.detail
    assert row.fix.startswith("pip install 'cuda-toolkit[nvrtc,cudart,cccl]==13.5.*'")
    _fake_nvrtc_identity(monkeypatch, "13.5", 13050, library)
    assert doctor.check_nvrtc_headers(FakeProbe([]))[0].status == "PASS"


def test_nvrtc_of_a_toolkit_is_pointed_at_its_toolkit(monkeypatch, tmp_path):
    root = tmp_path / "cuda-12.8"
    (root / "include").mkdir(parents=True)
    (root / "include" / "cuda_runtime.h").write_text("")
    (root / "lib64").mkdir()
    (root / "lib64" / "libnvrtc.so.12").write_bytes(b"")
    _fake_nvrtc_identity(monkeypatch, "12.8", 13000, root / "lib64" / "libnvrtc.so.12")
    (row,) = doctor.check_nvrtc_headers(FakeProbe([]))
    assert row.status == "WARN" and row.fix.startswith(f"export CUDA_HOME={root}")
