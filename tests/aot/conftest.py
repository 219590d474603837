"""Fixtures for the ahead-of-time build tests: a small project (a templated NVRTC kernel,
a header under include/) and helpers that run cuforge in a fresh process, in the
project's directory, against the test's cache dir."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import child_env

RED = r"""
#include "tile.cuh"
template <int BLOCK, typename T>
__global__ void blk(T* out, const T* in) {
    out[threadIdx.x] = in[threadIdx.x] * (T)(Tile<BLOCK>::n + TILE);
}
"""

TILE_H = "#pragma once\ntemplate <int B> struct Tile { static constexpr int n = B; };\n"

MANIFEST = """\
arch = ["sm_80", "sm_90"]                 # default for every entry

[[kernel]]
source = "red.cu"                         # relative to the manifest
include_dirs = ["include"]
name_expressions = ["blk<{BLOCK}, {T}>"]  # {NAME} expands over [kernel.grid]
defines = { TILE = "{BLOCK}" }            # placeholders work in defines and options too
[kernel.grid]
BLOCK = [128, 256]
T = ["float", "double"]
"""


@pytest.fixture
def project(tmp_path):
    """A project dir with red.cu, include/tile.cuh and the issue's cuforge.toml."""
    root = tmp_path / "proj"
    (root / "include").mkdir(parents=True)
    (root / "red.cu").write_text(RED)
    (root / "include" / "tile.cuh").write_text(TILE_H)
    (root / "cuforge.toml").write_text(MANIFEST)
    return root


def cli(cwd, *args: str, **env: str) -> subprocess.CompletedProcess:
    """``python -m cuforge ARGS`` in ``cwd`` (a fresh process, the test's cache dir)."""
    return subprocess.run(
        [sys.executable, "-m", "cuforge", *args],
        cwd=str(cwd),
        env=child_env(CI="true", **env),
        capture_output=True,
        text=True,
        input="",
        timeout=300,
        check=False,
    )


def python_in(cwd, code: str, **env: str) -> dict:
    """Run ``code`` in a fresh interpreter in ``cwd``; it prints one JSON line last."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=str(cwd),
        env=child_env(**env),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"child failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


#: a child that makes every JIT call of ``CALLS`` (a JSON list of compile_file kwargs with
#: "path") and prints the compile counters and where each result came from
JIT_CALLS = """
import json, os, sys
import cuforge
from cuforge.core.pipeline import counters
calls = json.loads(os.environ["CALLS"])
bundle = os.environ.get("BUNDLE")
if bundle:
    cuforge.load_bundle(bundle)
sources, errors = [], []
for c in calls:
    path = c.pop("path")
    try:
        sources.append(cuforge.compile_file(path, **c).source_of_result)
    except cuforge.CuforgeError as exc:
        errors.append(type(exc).__name__ + ": " + str(exc))
print(json.dumps({"counters": dict(counters), "sources": sources, "errors": errors}))
"""


def jit_calls(cwd, calls: list[dict], **env: str) -> dict:
    return python_in(cwd, JIT_CALLS, CALLS=json.dumps(calls), **env)


def variant_calls(blocks, types, archs) -> list[dict]:
    """The compile_file calls a user makes for the variants of MANIFEST-like manifests."""
    return [
        {
            "path": "red.cu",
            "include_dirs": ["include"],
            "arch": arch,
            "name_expressions": [f"blk<{b}, {t}>"],
            "defines": {"TILE": str(b)},
        }
        for b in blocks
        for t in types
        for arch in archs
    ]


__all__ = ["cli", "python_in", "jit_calls", "variant_calls", "os"]
