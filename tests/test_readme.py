"""README.md's Python blocks run as written: a README edit that breaks one fails `make test`.

Each block runs in a fresh interpreter in an empty directory, against the test's cache dir.
Blocks whose first line is ``# needs a GPU`` run under ``pytest -m gpu``. A block that
starts with ``# setup.py`` is a setup.py file: it is written next to a copy of the sample
extension's sources (as ``csrc/``) and built with ``python setup.py build_ext --inplace``
(a real extension build: marked slow).

Every block must stand alone, as pasted into a fresh shell: the child gets no
``CUFORGE_ARCH`` or ``TORCH_CUDA_ARCH_LIST`` (a block that compiles without a GPU names its
arch). A block names the extra it needs in a leading comment, ``# needs cuforge[torch]``
(or ``# needs a GPU and cuforge[cccl,cupy]``): it is skipped, with that reason, where a
module that extra installs cannot be imported (:data:`EXTRA_MODULES`), as it is when it
imports an optional package this environment lacks (torch, CuPy, cuda.compute, cutlass,
...). A block that names no extra needs only ``pip install cuforge``: ``make test-wheel``
(tests/wheel/run.py) runs those blocks against the wheel installed alone.
"""

from __future__ import annotations

import importlib.util
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


#: modules a README block may import -> the optional package it needs (the first match in
#: this order names it)
_OPTIONAL = (
    ("cuforge.torch", "torch"),
    ("cuforge.cute", "cutlass"),
    ("torch", "torch"),
    ("cupy", "cupy"),
    ("cuda.compute", "cuda.compute"),
    ("cutlass", "cutlass"),
    ("numpy", "numpy"),
    ("triton", "triton"),
    ("ray", "ray"),
)


#: each extra of pyproject.toml a README block may name -> the modules it installs (all
#: must import for the block to run)
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "torch": ("torch",),
    "cupy": ("cupy",),
    "cuda-core": ("cuda.core",),
    "jax": ("jax",),
    "sign": ("cryptography",),
    "s3": ("boto3",),
    "cccl": ("cuda.compute",),
    "cute": ("cutlass",),
    "triton": ("triton",),
    "ray": ("ray",),
    "bench": ("cuda.core", "numpy"),
}

#: an optional package a block imports -> the extras any one of which brings it
_PACKAGE_EXTRAS: dict[str, tuple[str, ...]] = {
    "torch": ("torch",),
    "cutlass": ("cute",),
    "cupy": ("cupy",),
    "cuda.compute": ("cccl",),
    "numpy": ("cccl", "cupy", "bench"),
    "triton": ("triton",),
    "ray": ("ray",),
}


def _leading_comments(code: str) -> list[str]:
    """The comment lines a block opens with (up to its first line of code)."""
    lines = []
    for line in code.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            break
        if line.strip():
            lines.append(line.strip())
    return lines


def block_extras(code: str) -> list[str]:
    """The extras a block names in its leading ``# needs ... cuforge[a,b]`` comments."""
    extras: list[str] = []
    for line in _leading_comments(code):
        if line.startswith("# needs"):
            for group in re.findall(r"cuforge\[([\w,-]+)\]", line):
                extras += [e for e in group.split(",") if e not in extras]
    return extras


def missing_extras(code: str) -> list[str]:
    """The extras the block names whose modules cannot be imported here."""
    return [e for e in block_extras(code) if not all(map(_installed, EXTRA_MODULES[e]))]


def _imports(code: str) -> list[str]:
    """The modules ``code`` imports (``import a.b`` / ``from a.b import c`` lines)."""
    return re.findall(r"^\s*(?:import|from)\s+([A-Za-z_][\w.]*)", code, re.M)


def _installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # a parent package that is missing or broken
        return False


def missing_packages(code: str) -> list[str]:
    """The optional packages ``code`` imports that cannot be imported here."""
    missing: list[str] = []
    for module in _imports(code):
        for prefix, package in _OPTIONAL:
            if module == prefix or module.startswith(prefix + "."):
                if package not in missing and not _installed(package):
                    missing.append(package)
                break
    return missing


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
    extras = missing_extras(code)
    if extras:
        needs = ", ".join(f"cuforge[{e}]" for e in extras)
        pytest.skip(f"this README block needs {needs}, which is not installed")
    missing = missing_packages(code)
    if missing:
        pytest.skip(f"this README block needs {', '.join(missing)}, which is not installed")
    env = child_env()
    # as pasted alone: no arch from the environment (the test session pins one without a GPU)
    for name in ("CUFORGE_ARCH", "TORCH_CUDA_ARCH_LIST"):
        env.pop(name, None)
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


def test_blocks_with_an_absent_optional_package_are_skipped():
    code = "import torch\nimport cuda.compute as cc\nfrom cuforge.cute import jit\nimport os\n"
    assert _imports(code) == ["torch", "cuda.compute", "cuforge.cute", "os"]
    absent = "import no_such_package_xyz\n"
    assert missing_packages(absent) == []  # not an optional package: it would fail loudly
    expected = [p for p in ("torch", "cuda.compute", "cutlass") if not _installed(p)]
    assert missing_packages(code) == expected
    assert not _installed("cuda.no_such_module") and not _installed("no_such_pkg.sub")


def test_block_extras_are_read_from_the_leading_comments():
    code = "# needs a GPU and cuforge[cccl,cupy]\n# needs cuforge[torch]\nimport os\n"
    assert block_extras(code) == ["cccl", "cupy", "torch"]
    assert block_extras("# setup.py\n# needs cuforge[torch]\nx = 1\n") == ["torch"]
    # only the leading comments count, and only lines that say `needs`
    assert block_extras("import os\n# needs cuforge[torch]\n") == []
    assert block_extras("# see cuforge[torch]\nimport os\n") == []
    absent = {e for e, mods in EXTRA_MODULES.items() if not all(map(_installed, mods))}
    assert set(missing_extras(code)) == absent & {"cccl", "cupy", "torch"}


def test_every_block_names_the_extras_it_needs():
    """Each extra a block names is one of pyproject.toml's, and a block that imports an
    optional package names an extra that brings it (the README's own promise, checked)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: cuforge depends on tomli there
        import tomli as tomllib

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        declared = set(tomllib.load(f)["project"]["optional-dependencies"])
    assert set(EXTRA_MODULES) <= declared
    for line, code in python_blocks():
        named = block_extras(code)
        assert set(named) <= set(EXTRA_MODULES), f"README.md:{line} names an unknown extra"
        for module in _imports(code):
            for prefix, package in _OPTIONAL:
                if module == prefix or module.startswith(prefix + "."):
                    bringers = _PACKAGE_EXTRAS[package]
                    assert set(bringers) & set(named), (
                        f"README.md:{line} imports {module}: its leading comment must say "
                        f"# needs cuforge[{bringers[0]}]"
                    )
                    break


def _config_table_names() -> set[str]:
    """The variables of the table in ``cuforge.base.config``'s docstring (one row each)."""
    import cuforge.base.config as config

    doc = config.__doc__ or ""
    rulers = [m.start() for m in re.finditer(r"^=+ =+$", doc, re.M)]
    assert len(rulers) == 3, "config's docstring table: header ruler, header, rows, ruler"
    table = doc[rulers[1] : rulers[2]]
    return set(re.findall(r"^(CUFORGE_[A-Z0-9_]+)\s", table, re.M))


def _readme_configuration_names() -> set[str]:
    """Every CUFORGE_* variable named in the first cell of a row of README's
    *Configuration* section's tables."""
    with open(README, encoding="utf-8") as f:
        text = f.read()
    start = text.index("\n## Configuration\n")
    end = text.index("\n## ", start + 1)
    names: set[str] = set()
    for line in text[start:end].splitlines():
        if line.startswith("| `"):
            names |= set(re.findall(r"`(CUFORGE_[A-Z0-9_]+)`", line.split("|")[1]))
    return names


def test_readme_configuration_table_lists_every_variable_config_reads():
    """Issue 36: README's configuration table is derived from config.py's docstring table
    (which tests/base/test_config.py ties to every variable the package reads): every name
    there has a README row, and README lists no variable config does not read."""
    documented, readme = _config_table_names(), _readme_configuration_names()
    assert len(documented) >= 30
    assert sorted(documented - readme) == [], "variables config reads but README's table lacks"
    assert sorted(readme - documented) == [], "README rows for variables config does not read"
