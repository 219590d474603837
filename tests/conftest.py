"""Shared fixtures. Every test runs against its own cache directory: nothing touches the
user's real cache, and a test never sees another test's entries."""

from __future__ import annotations

import ctypes
import os

import pytest

# real redis-server / nginx / misbehaving servers for the remote-cache tests
pytest_plugins = ("tests.remote_servers",)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "src")


def _cleared() -> tuple[str, ...]:
    """Every variable cuforge reads that a developer's shell may have set: all the
    ``CUFORGE_*`` ones and the codegen / arch variables (from config, not a copied list), so
    that an exported ``CUFORGE_REMOTE`` never points the suite at a real team cache."""
    from cuforge.base.config import CODEGEN_ENV_VARS, SETTING_VARS

    names = {v for v in SETTING_VARS if v.startswith("CUFORGE_")}
    names.update(CODEGEN_ENV_VARS)
    names.add("TORCH_CUDA_ARCH_LIST")
    names.update(v for v in os.environ if v.startswith("CUFORGE_"))
    return tuple(sorted(names))


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
    """A fresh cache per test: ``CUFORGE_CACHE_DIR`` names a new dir (so the default cache,
    its memos and counters are new too; no module global is reset), a pinned arch when no
    GPU is visible, no other cuforge knob. Yields the dir."""
    for name in _cleared():
        monkeypatch.delenv(name, raising=False)
    cache_dir = tmp_path / "cuforge-cache"
    monkeypatch.setenv("CUFORGE_CACHE_DIR", str(cache_dir))
    if not GPU_VISIBLE:
        monkeypatch.setenv("CUFORGE_ARCH", "sm_90")
    yield cache_dir


@pytest.fixture
def cache(isolated_cache):
    """A :class:`cuforge.Cache` of its own (``<tmp>/own-cache``), for tests that pass one."""
    import cuforge

    return cuforge.Cache(isolated_cache.parent / "own-cache")


# the one child-process runner lives in tests/child.py; re-exported for the tests' imports
from tests.child import child_env, run_python  # noqa: E402,F401
