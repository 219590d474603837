"""Issue 36, item 4: the doctor's own costs and its cache-dir and CUDA_HOME findings.

* the fp16/bf16/CUB probe kernels go through the cache the doctor reports on: a second
  ``cuforge doctor`` compiles nothing (counted by the pipeline's compile counter in the
  doctor's own process, run twice as a child);
* ``cache.dir`` FAILs, with the fix, for a dir that cannot be created;
* ``cuda_home`` WARNs when torch would guess a CUDA_HOME without include/cuda_runtime.h;
* ``doctor --help`` lists the check ids.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from cuforge.cli import doctor
from tests.cli.conftest import base_env

#: Runs `cuforge doctor` in this (child) process and prints its JSON document with the
#: number of NVRTC compiles made in the process (the real backend, counted on the way in).
DOCTOR_COUNTING = """
import contextlib, io, json, sys
from cuforge.cli.main import main
from cuforge.compiler.nvrtc import NvrtcBackend
calls = []
real = NvrtcBackend.compile
def counting(self, job, **kw):
    calls.append(job)
    return real(self, job, **kw)
NvrtcBackend.compile = counting
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    rc = main(sys.argv[1:])
print(json.dumps({"rc": rc, "doc": json.loads(buf.getvalue()), "compiles": len(calls)}))
"""


def _doctor(cache_dir: str, *args: str, env: dict[str, str] | None = None) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", DOCTOR_COUNTING, "doctor", "--json", *args],
        env=base_env(cache_dir, **(env or {})),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _row(doc: dict, row_id: str) -> dict:
    return next(c for c in doc["checks"] if c["id"] == row_id)


def test_a_second_doctor_compiles_nothing(tmp_path):
    cache_dir = str(tmp_path / "cache")
    first = _doctor(cache_dir, "--check", "nvrtc.headers_compile")
    row = _row(first["doc"], "nvrtc.headers_compile")
    assert row["status"] == "PASS", row
    assert first["compiles"] == 3, first  # fp16, bf16, CUB: compiled once, into the cache
    assert set(row["data"]["sources"].values()) == {"compiled"}

    second = _doctor(cache_dir, "--check", "nvrtc.headers_compile")
    row = _row(second["doc"], "nvrtc.headers_compile")
    assert row["status"] == "PASS", row
    assert second["compiles"] == 0, second
    assert set(row["data"]["sources"].values()) == {"disk"}
    assert "3 of 3 from the cache" in row["detail"]

    # the entries are in the cache the doctor reports on, under their names
    done = subprocess.run(
        [sys.executable, "-m", "cuforge", "cache", "ls", "--name", "doctor_*", "--json"],
        env=base_env(cache_dir),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert json.loads(done.stdout)["matched"] == 3, done.stdout


def test_a_second_full_doctor_compiles_nothing_with_cache_dir_flag(tmp_path):
    # --cache-dir is the cache the doctor reports on: the probes go there, not to the env's
    env_dir, flag_dir = str(tmp_path / "env-cache"), str(tmp_path / "flag-cache")
    first = _doctor(env_dir, "--cache-dir", flag_dir)
    assert first["compiles"] == 3, first
    second = _doctor(env_dir, "--cache-dir", flag_dir)
    assert second["compiles"] == 0, second
    assert _row(second["doc"], "cache.dir")["data"]["path"] == flag_dir
    assert not os.path.exists(env_dir)


def _cache_dir_row(path: str) -> dict:
    return _doctor(str(path), "--check", "cache.dir")["doc"]


@pytest.mark.parametrize("where", ["under_a_file", "is_a_file"])
def test_cache_dir_fails_when_it_cannot_be_created_under_a_file(tmp_path, where):
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    blocker.chmod(0o755)  # even an executable file is no directory
    path = blocker / "cache" if where == "under_a_file" else blocker
    doc = _cache_dir_row(str(path))
    row = _row(doc, "cache.dir")
    assert row["status"] == "FAIL" and doc["ok"] is False, row
    assert "cannot be created" in row["detail"] and str(blocker) in row["detail"]
    assert row["fix"] == "export CUFORGE_CACHE_DIR=<a writable directory>"


def test_cache_dir_fails_when_its_parent_is_not_writable(tmp_path):
    if os.geteuid() == 0:
        parent = "/proc"  # root writes any mode; /proc takes no new files, even from root
    else:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        parent = str(locked)
    row = _row(_cache_dir_row(os.path.join(parent, "cuforge-cache")), "cache.dir")
    assert row["status"] == "FAIL", row
    assert f"{parent} is not writable" in row["detail"], row
    assert row["fix"]


def test_cache_dir_passes_when_it_can_be_created(tmp_path):
    row = _row(_cache_dir_row(str(tmp_path / "a" / "b" / "cache")), "cache.dir")
    assert row["status"] == "PASS", row


def _fake_nvcc_dir(tmp_path) -> str:
    """A `bin/nvcc` wrapper whose parent dir is no toolkit root for torch: no include/."""
    root = tmp_path / "wrapper"
    (root / "bin").mkdir(parents=True)
    nvcc = root / "bin" / "nvcc"
    real = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")
    nvcc.write_text(f'#!/bin/sh\nexec {real} "$@"\n')
    nvcc.chmod(0o755)
    return str(root)


def test_cuda_home_warns_when_torch_would_guess_a_root_without_cuda_runtime_h(tmp_path):
    from cuforge import toolchain

    real = toolchain.toolkit_root()
    if real is None or not os.path.isfile(os.path.join(real, "include", "cuda_runtime.h")):
        pytest.skip("needs a CUDA toolkit with include/cuda_runtime.h")
    wrapper = _fake_nvcc_dir(tmp_path)
    env = base_env(str(tmp_path / "cache"))
    env.pop("CUDA_HOME", None)
    env.pop("CUDA_PATH", None)
    env["PATH"] = os.path.join(wrapper, "bin") + os.pathsep + env["PATH"]
    done = subprocess.run(
        [sys.executable, "-m", "cuforge", "doctor", "--check", "cuda_home", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    row = _row(json.loads(done.stdout), "cuda_home")
    # torch's _find_cuda_home: CUDA_HOME unset -> dirname(dirname(which nvcc)) = the wrapper
    assert row["data"]["torch_cuda_home"] == wrapper, row
    assert row["status"] == "WARN", row
    assert "include/cuda_runtime.h" in row["detail"]
    assert row["fix"] == f"export CUDA_HOME={os.path.realpath(real)}"


def test_cuda_home_warns_when_cuda_home_lacks_cuda_runtime_h(tmp_path):
    wrapper = _fake_nvcc_dir(tmp_path)
    env = {"CUDA_HOME": wrapper}
    row = _row(
        _doctor(str(tmp_path / "cache"), "--check", "cuda_home", env=env)["doc"], "cuda_home"
    )
    assert row["status"] == "WARN", row
    assert "has no include/cuda_runtime.h" in row["detail"]
    assert row["fix"].startswith("export CUDA_HOME=")


def test_doctor_help_lists_the_check_ids(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "cuforge", "doctor", "--help"],
        env=base_env(str(tmp_path / "cache"), COLUMNS="200"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    for row_id in doctor.check_ids():
        assert row_id in text, row_id
    assert "check ids (for --check):" in text
