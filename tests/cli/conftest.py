"""Fixtures for the command-line tests: every command runs as a real subprocess against a
real cache that really compiled kernels (NVRTC, no GPU needed).

The kernels are compiled once per session into a template cache; each test gets its own
copy, so tests that corrupt, prune or clear entries never disturb each other.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import SRC

ARCH = "sm_90"

SAXPY = r"""
extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""

FILL = r"""
template <int N, typename T>
__global__ void fill(T* out) { out[threadIdx.x] = T(N); }
"""

SCALE = r"""
#include "scale.cuh"
extern "C" __global__ void scale(float* x) { x[threadIdx.x] *= SCALE_BY; }
"""

SCALE_H = "#define SCALE_BY 3.0f\n"

#: Compiles the kernels through cuforge.compile in a fresh interpreter and prints one
#: JSON line: the keys, where each came from, and the pipeline's compile counter.
COMPILE_SCRIPT = """
import json, sys
import cuforge
from cuforge.core.pipeline import counters
spec = json.loads(sys.argv[1])
out = []
for job in spec:
    prog = cuforge.compile(job["source"], name=job["name"], arch=job.get("arch", "sm_90"),
                           defines=job.get("defines"), include_dirs=job.get("include_dirs", ()),
                           name_expressions=job.get("name_expressions", ()))
    out.append({"name": job["name"], "key": prog.key, "from": prog.source_of_result,
                "lowered": prog.lowered_names})
print(json.dumps({"results": out, "compiles": counters["compiles"]}))
"""


def kernel_jobs(include_dir: str) -> list[dict]:
    """The kernels every CLI test's cache holds (3 kernels, each with its manifest)."""
    return [
        {"name": "saxpy.cu", "source": SAXPY, "arch": ARCH},
        {"name": "fill.cu", "source": FILL, "arch": ARCH, "name_expressions": ["fill<4, float>"]},
        {"name": "scale.cu", "source": SCALE, "arch": ARCH, "include_dirs": [include_dir]},
    ]


def base_env(cache_dir: str, **overrides: str) -> dict[str, str]:
    """A clean environment for a child: no cuforge knobs of the caller, plain output."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("CUFORGE_")
        and k not in ("TORCH_CUDA_ARCH_LIST", "NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "MAX_JOBS")
    }
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    # As in an activated virtual environment: its bin/ (ninja, the cuforge script) on PATH.
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["CUFORGE_CACHE_DIR"] = cache_dir
    env["CI"] = "true"
    env.update(overrides)
    return env


def compile_in_child(cache_dir: str, jobs: list[dict], **env: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(COMPILE_SCRIPT), json.dumps(jobs)],
        env=base_env(cache_dir, **env),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, f"compile child failed:\n{done.stdout}\n{done.stderr}"
    return json.loads(done.stdout.strip().splitlines()[-1])


class Cli:
    """Runs ``python -m cuforge.cli.main ...`` against one cache directory."""

    def __init__(self, cache_dir: str) -> None:
        self.cache_dir = cache_dir

    def __call__(
        self, *args: str, env: dict[str, str] | None = None, input: str | None = None, timeout=300
    ) -> subprocess.CompletedProcess:
        full_env = base_env(self.cache_dir)
        if env:
            full_env.update(env)
        return subprocess.run(
            [sys.executable, "-m", "cuforge.cli.main", *args],
            env=full_env,
            capture_output=True,
            text=True,
            input=input if input is not None else "",
            timeout=timeout,
            check=False,
        )

    def json(self, *args: str, ok: bool = True, **kwargs) -> dict:
        done = self(*args, "--json", **kwargs)
        if ok:
            assert done.returncode == 0, f"{args} failed:\n{done.stdout}\n{done.stderr}"
        doc = json.loads(done.stdout)
        assert doc["schema"] == 1
        doc["_rc"] = done.returncode
        doc["_stderr"] = done.stderr
        return doc


@pytest.fixture(scope="session")
def template_cache(tmp_path_factory) -> dict:
    """A cache filled by really compiling the kernels, then one explained miss."""
    root = tmp_path_factory.mktemp("cli-template")
    include_dir = root / "include"
    include_dir.mkdir()
    (include_dir / "scale.cuh").write_text(SCALE_H)
    cache_dir = str(root / "cache")
    jobs = kernel_jobs(str(include_dir))
    first = compile_in_child(cache_dir, jobs)
    assert first["compiles"] == 3, first
    # A changed define on a known name: an explained miss for `cache explain`.
    miss = compile_in_child(
        cache_dir, [{"name": "saxpy.cu", "source": SAXPY, "arch": ARCH, "defines": {"UNROLL": 4}}]
    )
    assert miss["compiles"] == 1
    return {
        "dir": cache_dir,
        "include_dir": str(include_dir),
        "jobs": jobs,
        "keys": {r["name"]: r["key"] for r in first["results"]},
        "lowered": {r["name"]: r["lowered"] for r in first["results"]},
        "miss_key": miss["results"][0]["key"],
    }


@pytest.fixture
def cache(template_cache, tmp_path) -> dict:
    """This test's own copy of the template cache."""
    cache_dir = str(tmp_path / "cache")
    shutil.copytree(template_cache["dir"], cache_dir, symlinks=True)
    return {**template_cache, "dir": cache_dir}


@pytest.fixture
def cli(cache) -> Cli:
    return Cli(cache["dir"])
