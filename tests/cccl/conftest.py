"""Fixtures of the cuforge.cccl tests: skip without cuda-cccl, a stub libcuda without a
driver, and children that run cuda.compute code against a given cache dir.

Everything that imports cuda.compute runs in a child process: the stub libcuda must be
found at the child's start (``LD_LIBRARY_PATH``), and loading it into the test process
would change what later tests in the same session see of "the driver"."""

from __future__ import annotations

import importlib.util
import textwrap

import pytest

from tests.child import child_env, run_python
from tests.libcuda_stub import child_env_or_skip

if importlib.util.find_spec("cuda") is None or importlib.util.find_spec("cuda.compute") is None:
    pytest.skip(
        "cuda-cccl (cuda.compute) is not installed: pip install 'cuforge[cccl]'",
        allow_module_level=True,
    )

#: the prelude every child runs: imports, and helpers to describe the last cached call
PRELUDE = textwrap.dedent(
    """
    import json, os, sys
    import numpy as np
    import cuda.compute as cc
    import cuforge.cccl as cccl
    from cuforge.core import blobcache

    def reduce_args(dtype=np.int32, cap=90, op=None):
        return dict(d_in=cc.ProxyArray(dtype), d_out=cc.ProxyArray(dtype),
                    op=cc.OpKind.PLUS if op is None else op,
                    h_init=np.zeros(1, dtype), compute_capability=cap)

    def last():
        r = cccl.last_result()
        return {"source": r.source_of_result, "key": r.key, "reason": r.reason}

    def emit(obj):
        print(json.dumps(obj))
    """
)


@pytest.fixture(scope="session")
def cuda_env(tmp_path_factory) -> dict[str, str]:
    """Environment additions a child needs to import cuda.compute here."""
    return child_env_or_skip(tmp_path_factory)


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory) -> str:
    """One cache dir for a whole test module: builds take seconds, so tests that only read
    what an earlier one stored share it (each says so)."""
    return str(tmp_path_factory.mktemp("cccl-cache"))


def run_child(
    code: str, cuda_env: dict, cache_dir: str, *, timeout: float = 600, cwd=None, **env
) -> dict:
    """Run PRELUDE + ``code`` in a fresh interpreter against ``cache_dir``; the code's last
    stdout line is JSON. Returns it, with the child's stderr under ``"_stderr"``."""
    environ = child_env(CUFORGE_CACHE_DIR=cache_dir, **cuda_env, **env)
    environ.pop("CUFORGE_ARCH", None)
    return run_python(
        PRELUDE + textwrap.dedent(code), environ, timeout, cwd=cwd, stderr_key="_stderr"
    )
