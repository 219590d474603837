"""Shared fixtures. Every test runs against its own cache directory: nothing touches the
user's real cache, and a test never sees another test's entries."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import textwrap

import pytest

# real redis-server / nginx / misbehaving servers for the remote-cache tests
pytest_plugins = ("tests.remote_servers",)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "src")

_CLEARED = (
    "CUFORGE_DISABLE_CACHE",
    "CUFORGE_DISABLE_FILE_CACHE",
    "CUFORGE_CACHE_MAX_BYTES",
    "CUFORGE_MEMORY_MAX_BYTES",
    "CUFORGE_VERBOSE",
    "CUFORGE_EXPLAIN",
    "CUFORGE_EXTRA_OPTIONS",
    "CUFORGE_NVCC",
    "CUFORGE_LOCK_TIMEOUT",
    "CUFORGE_OFFLINE",
    "NVCC_PREPEND_FLAGS",
    "NVCC_APPEND_FLAGS",
    "TORCH_CUDA_ARCH_LIST",
)


def _gpu_visible() -> bool:
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    count = ctypes.c_int(0)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return False
    return count.value > 0


GPU_VISIBLE = _gpu_visible()


def pytest_collection_modifyitems(config, items):
    if GPU_VISIBLE:
        return
    skip = pytest.mark.skip(reason="no CUDA GPU visible (run `pytest -m gpu` on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    """A fresh cache dir per test, a pinned arch when no GPU is visible, no cuforge knobs."""
    for name in _CLEARED:
        monkeypatch.delenv(name, raising=False)
    cache_dir = tmp_path / "cuforge-cache"
    monkeypatch.setenv("CUFORGE_CACHE_DIR", str(cache_dir))
    if not GPU_VISIBLE:
        monkeypatch.setenv("CUFORGE_ARCH", "sm_90")
    from cuforge.pipeline import counters, reset_memo

    reset_memo()
    for k in counters:
        counters[k] = 0
    yield cache_dir
    reset_memo()


def child_env(**overrides: str) -> dict[str, str]:
    """The current environment (with the test's cache dir) for a child process."""
    env = dict(os.environ)
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    env.update(overrides)
    return env


def run_python(code: str, env: dict[str, str] | None = None, timeout: float = 300) -> dict:
    """Run ``code`` in a fresh interpreter; it must print one JSON line last. Returns it."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env or child_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"child failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])
