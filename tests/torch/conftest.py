"""Fixtures of the torch-extension tests.

Builds are the expensive part of this suite (the binding TU parses torch's headers:
~60 s on 2 cores), so every test here shares ONE session cache: the binding is compiled
once and then served from the object cache, exactly as in a user's edit loop. Each test
works on its own copy of the fast-layout sample and makes its kernels TU unique, so what
a test counts is its own.

Compiler invocations are counted by wrapping the real compilers: ``CUFORGE_NVCC`` and
``CXX`` point at small scripts that append one line per call to ``$CUFORGE_TEST_COUNT``
(``compile <source>`` or ``link``) and can sleep before compiling (``$CUFORGE_TEST_SLEEP``,
for the SIGKILL test). The counts cover child processes too.
"""

from __future__ import annotations

import os
import shutil
import stat
import uuid

import pytest

pytest.importorskip("torch")

from cuforge.samples import torch_ext  # noqa: E402

EXT_NAME = "cuforge_test_ext"

_WRAPPER = """#!/bin/sh
kind=link
src=
prev=
for a in "$@"; do
  [ "$a" = "--version" ] && kind=version
  [ "$prev" = "-c" ] && { kind=compile; src=$(basename "$a"); }
  prev=$a
done
if [ -n "$CUFORGE_TEST_COUNT" ] && [ "$kind" != version ]; then
  echo "$kind {tool} $src" >> "$CUFORGE_TEST_COUNT"
fi
if [ "$kind" = compile ] && [ -n "$CUFORGE_TEST_SLEEP" ]; then
  sleep "$CUFORGE_TEST_SLEEP"
fi
exec {real} "$@"
"""


def _write_wrapper(path: str, tool: str, real: str) -> str:
    with open(path, "w", encoding="utf-8") as f:
        f.write(_WRAPPER.replace("{tool}", tool).replace("{real}", real))
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


@pytest.fixture(scope="session")
def torch_session(tmp_path_factory):
    """(shared cache dir, nvcc wrapper, c++ wrapper) for the whole session."""
    from cuforge.toolchain import nvcc_path

    base = tmp_path_factory.mktemp("torch-ext")
    real_nvcc = nvcc_path()
    real_cxx = shutil.which(os.environ.get("CXX") or "c++")
    assert real_cxx, "no C++ compiler on PATH"
    tools = base / "tools"
    tools.mkdir()
    nvcc = _write_wrapper(str(tools / "nvcc"), "nvcc", real_nvcc)
    cxx = _write_wrapper(str(tools / "c++"), "c++", real_cxx)
    return str(base / "cache"), nvcc, cxx


class Counter:
    """Reads the wrapper's log: compiles per tool and source, links."""

    def __init__(self, path: str) -> None:
        self.path = path

    def lines(self) -> list[list[str]]:
        try:
            with open(self.path, encoding="utf-8") as f:
                return [line.split() for line in f if line.strip()]
        except FileNotFoundError:
            return []

    def compiles(self, source: str | None = None) -> int:
        return sum(
            1 for p in self.lines() if p[0] == "compile" and (source is None or p[2] == source)
        )

    def links(self) -> int:
        return sum(1 for p in self.lines() if p[0] == "link")

    def reset(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


@pytest.fixture(autouse=True)
def torch_env(torch_session, tmp_path, monkeypatch):
    cache, nvcc, cxx = torch_session
    monkeypatch.setenv("CUFORGE_CACHE_DIR", cache)
    monkeypatch.setenv("CUFORGE_NVCC", nvcc)
    monkeypatch.setenv("CXX", cxx)
    monkeypatch.delenv("CUFORGE_TEST_SLEEP", raising=False)
    monkeypatch.delenv("MAX_JOBS", raising=False)
    monkeypatch.delenv("CUFORGE_TORCH_LAUNCHER", raising=False)
    count = str(tmp_path / "compiler-calls.log")
    monkeypatch.setenv("CUFORGE_TEST_COUNT", count)
    return Counter(count)


class Ext:
    """A private copy of the fast-layout sample with a unique kernels TU."""

    def __init__(self, root: str) -> None:
        self.root = root
        shutil.copytree(torch_ext.SAMPLE_DIR, root, ignore=shutil.ignore_patterns("__pycache__"))
        self.sources = torch_ext.sources("fast", root=root)
        self.kernels, self.binding = self.sources
        self.tag = uuid.uuid4().hex[:12]
        self.append_kernels(f"// test extension {self.tag}\n")
        self.build_dir = os.path.join(root, "build")

    def read(self, path: str) -> str:
        with open(path, encoding="utf-8") as f:
            return f.read()

    def write(self, path: str, text: str) -> None:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)

    def append_kernels(self, text: str) -> None:
        self.write(self.kernels, self.read(self.kernels) + text)

    def spec(self, **kwargs):
        from cuforge.torch import BuildSpec

        kwargs.setdefault("build_directory", self.build_dir)
        return BuildSpec(EXT_NAME, self.sources, **kwargs)


@pytest.fixture
def ext(tmp_path):
    return Ext(str(tmp_path / "ext"))
