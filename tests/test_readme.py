"""README.md's Python blocks run as written: a README edit that breaks one fails `make test`.

Each block runs in a fresh interpreter in an empty directory, against the test's cache dir.
Blocks whose first line is ``# needs a GPU`` run under ``pytest -m gpu``. A block that
starts with ``# setup.py`` is a setup.py file: it is written next to a copy of the sample
extension's sources (as ``csrc/``) and built with ``python setup.py build_ext --inplace``
(a real extension build: marked slow).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import ROOT, child_env

README = os.path.join(ROOT, "README.md")


def python_blocks() -> list[tuple[int, str]]:
    """(line number, code) of every ```python block, indented ones (in lists) included."""
    with open(README, encoding="utf-8") as f:
        text = f.read()
    blocks = []
    for m in re.finditer(r"^( *)```python\n(.*?)^\1```$", text, re.M | re.S):
        line = text.count("\n", 0, m.start()) + 1
        blocks.append((line, textwrap.dedent(m.group(2))))
    return blocks


def _params():
    params = []
    for line, code in python_blocks():
        first = code.lstrip().splitlines()[0] if code.strip() else ""
        marks = []
        if first.startswith("# needs a GPU"):
            marks.append(pytest.mark.gpu)
        if first.startswith("# setup.py"):
            marks.append(pytest.mark.slow)
        params.append(pytest.param(code, id=f"README.md:{line}", marks=marks))
    return params


def test_readme_has_python_blocks():
    assert len(python_blocks()) >= 5


@pytest.mark.parametrize("code", _params())
def test_readme_block_runs(code, tmp_path):
    env = child_env()
    if code.lstrip().startswith("# setup.py"):
        from cuforge.samples.torch_ext import SAMPLE_DIR

        shutil.copytree(os.path.join(SAMPLE_DIR, "fast"), tmp_path / "csrc")
        (tmp_path / "setup.py").write_text(code)
        argv = [sys.executable, "setup.py", "build_ext", "--inplace"]
    else:
        argv = [sys.executable, "-c", code]
    done = subprocess.run(
        argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900, check=False
    )
    assert done.returncode == 0, f"this README block failed:\n{code}\n{done.stdout}\n{done.stderr}"
