"""The release tooling's own logic, without building anything: ``make wheel``
(tests/wheel/build.py) and ``make test-wheel`` (tests/wheel/run.py), which CI runs for real.

What they choose is checked here: the one version, the interpreters, the README blocks a
plain install must run, and the errors that say what to do."""

from __future__ import annotations

import os
import subprocess

import pytest

import cuforge
from tests.conftest import ROOT
from tests.test_readme import block_extras, python_blocks
from tests.wheel import build, run


def test_the_version_is_written_once():
    assert build.version() == cuforge.__version__
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: cuforge depends on tomli there
        import tomli as tomllib
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        pyproject = tomllib.load(f)
    assert "version" not in pyproject["project"], "pyproject.toml must not repeat it"
    assert pyproject["project"]["dynamic"] == ["version"]
    dynamic = pyproject["tool"]["setuptools"]["dynamic"]
    assert dynamic["version"] == {"attr": "cuforge._version.__version__"}
    with open(os.path.join(ROOT, "CHANGELOG.md"), encoding="utf-8") as f:
        assert f"\n## {cuforge.__version__} " in f.read()


def test_find_python_returns_only_an_interpreter_of_that_version():
    for minor in build.SUPPORTED:
        python = build.find_python(minor)
        if python is None:
            continue
        done = subprocess.run(
            [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            check=True,
        )
        assert done.stdout.strip() == minor
    assert build.find_python("3.99") is None


def test_the_plain_install_runs_the_blocks_that_need_no_gpu_and_no_extra():
    chosen = run.readme_blocks()
    assert len(chosen) >= 4
    lines = {line for line, _ in chosen}
    for line, code in python_blocks():
        first = code.lstrip().splitlines()[0]
        plain = not first.startswith(("# needs a GPU", "# setup.py")) and not block_extras(code)
        assert (line in lines) == plain, f"README.md:{line}"
    # the tour is one of them; its nvcc line gets the host compiler's PATH
    tour = [code for _, code in chosen if "cuforge.compile(src" in code and "nvcc" in code]
    assert tour and run.needs_nvcc(tour[0])
    assert not run.needs_nvcc("import cuforge\n# needs nvcc\n")


def test_a_missing_wheel_says_to_run_make_wheel(tmp_path):
    with pytest.raises(run.WheelTestError, match="run `make wheel`"):
        run.pick_wheel(str(tmp_path))
    # a linux_* wheel (not repaired) is not picked either
    tag = run.sys.version_info
    name = f"cuforge-{build.version()}-cp{tag.major}{tag.minor}-cp{tag.major}{tag.minor}"
    (tmp_path / f"{name}-linux_x86_64.whl").write_bytes(b"")
    with pytest.raises(run.WheelTestError, match="found \\[\\]"):
        run.pick_wheel(str(tmp_path))
    wheel = tmp_path / f"{name}-manylinux_2_17_x86_64.whl"
    wheel.write_bytes(b"")
    assert run.pick_wheel(str(tmp_path)) == str(wheel)


def test_the_bare_path_holds_no_compiler(tmp_path):
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    assert run.bare_path(str(tmp_path / "venv")) == str(bin_dir)
    cc = bin_dir / "gcc"
    cc.write_text("#!/bin/sh\n")
    cc.chmod(0o755)
    with pytest.raises(run.WheelTestError, match="gcc"):
        run.bare_path(str(tmp_path / "venv"))
