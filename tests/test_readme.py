"""README.md's Python blocks, and those of the docs pages README's text moved to
(:data:`PAGES`), run as written: an edit that breaks one fails `make test`. The pages whose
blocks build torch extensions (:data:`INTEGRATION_PAGES`) run the same way under
`make test-integrations` (tests/test_docs_integrations.py).

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
(tests/wheel/run.py) runs README's blocks of that kind against the wheel installed alone.

The configuration table lives in docs/configuration.md: it is checked against
``cuforge.base.config``'s docstring table here.
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

#: README and the docs pages whose Python blocks `make test` runs (the pages README's text
#: moved to; each block stands alone, as README's do)
PAGES = (
    "README.md",
    "docs/kernels.md",
    "docs/remote.md",
    "docs/cccl.md",
    "docs/cute.md",
    "docs/configuration.md",
    "docs/cli.md",
    "docs/trust.md",
)

#: docs pages whose blocks build torch extensions: run by `make test-integrations`
#: (tests/test_docs_integrations.py), not by `make test`
INTEGRATION_PAGES = ("docs/torch.md",)

CONFIGURATION = os.path.join(ROOT, "docs", "configuration.md")


def python_blocks(path: str = README) -> list[tuple[int, str]]:
    """(line number, code) of every ```python block of ``path`` (README.md, or a page
    relative to the repository root), indented ones (in lists) included."""
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
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


def block_params(pages) -> list:
    """One ``pytest.param`` per Python block of ``pages``, with ids like
    ``docs/kernels.md:123`` (the block's line)."""
    params = []
    for page in pages:
        for line, code in python_blocks(page):
            first = code.lstrip().splitlines()[0] if code.strip() else ""
            marks = []
            if first.startswith("# needs a GPU"):
                marks.append(pytest.mark.gpu)
            if first.startswith("# setup.py"):
                marks.append(pytest.mark.slow)
            params.append(pytest.param(code, id=f"{page}:{line}", marks=marks))
    return params


def test_readme_has_python_blocks():
    assert len(python_blocks()) >= 5
    for page in (*PAGES, *INTEGRATION_PAGES):
        assert os.path.isfile(os.path.join(ROOT, page)), page
    # the moved blocks are still run: launching and jit on a GPU, extensions, custom ops,
    # a remote backend, cuda.compute and the CuTe DSL
    for page in ("docs/kernels.md", "docs/remote.md", "docs/cccl.md", "docs/cute.md"):
        assert python_blocks(page), f"{page} has no Python block"
    assert len(python_blocks("docs/torch.md")) >= 4


def test_the_integration_pages_stay_out_of_make_test():
    """docs/torch.md's blocks build torch extensions: `make test` must not run them, and
    `make test-integrations` must (tests/test_docs_integrations.py is in INTEGRATION_TESTS)."""
    assert not set(PAGES) & set(INTEGRATION_PAGES)
    with open(os.path.join(ROOT, "Makefile"), encoding="utf-8") as f:
        makefile = f.read()
    tests = re.search(r"^INTEGRATION_TESTS := (.*?)(?<!\\)\n", makefile, re.M | re.S)
    assert tests and "tests/test_docs_integrations.py" in tests.group(1).split()
    assert not any("# setup.py" in code for page in PAGES for _, code in python_blocks(page))


def run_block(code: str, tmp_path) -> None:
    """Run one block as pasted into a fresh shell in an empty directory (skipped where an
    extra or optional package it needs is not installed)."""
    extras = missing_extras(code)
    if extras:
        needs = ", ".join(f"cuforge[{e}]" for e in extras)
        pytest.skip(f"this block needs {needs}, which is not installed")
    missing = missing_packages(code)
    if missing:
        pytest.skip(f"this block needs {', '.join(missing)}, which is not installed")
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
    assert done.returncode == 0, f"this block failed:\n{code}\n{done.stdout}\n{done.stderr}"


@pytest.mark.parametrize("code", block_params(PAGES))
def test_readme_block_runs(code, tmp_path):
    run_block(code, tmp_path)


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
    for page in (*PAGES, *INTEGRATION_PAGES):
        for line, code in python_blocks(page):
            named = block_extras(code)
            assert set(named) <= set(EXTRA_MODULES), f"{page}:{line} names an unknown extra"
            for module in _imports(code):
                for prefix, package in _OPTIONAL:
                    if module == prefix or module.startswith(prefix + "."):
                        bringers = _PACKAGE_EXTRAS[package]
                        assert set(bringers) & set(named), (
                            f"{page}:{line} imports {module}: its leading comment must say "
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


def _configuration_names() -> set[str]:
    """Every CUFORGE_* variable named in the first cell of a row of docs/configuration.md's
    tables (the page README's *Configuration* section moved to)."""
    with open(CONFIGURATION, encoding="utf-8") as f:
        text = f.read()
    names: set[str] = set()
    for line in text.splitlines():
        if line.startswith("| `"):
            names |= set(re.findall(r"`(CUFORGE_[A-Z0-9_]+)`", line.split("|")[1]))
    return names


def test_readme_configuration_table_lists_every_variable_config_reads():
    """Issue 36: the configuration table (docs/configuration.md) is derived from config.py's
    docstring table (which tests/base/test_config.py ties to every variable the package
    reads): every name there has a row, and the page lists no variable config does not
    read."""
    documented, page = _config_table_names(), _configuration_names()
    assert len(documented) >= 30
    assert sorted(documented - page) == [], "variables config reads but the table lacks"
    assert sorted(page - documented) == [], "rows for variables config does not read"


def test_readme_points_at_the_configuration_page_and_names_only_real_variables():
    """README keeps a pointer to docs/configuration.md and a few key variables; each
    CUFORGE_* name README mentions is a variable the package reads (a row of the page)."""
    with open(README, encoding="utf-8") as f:
        text = f.read()
    assert "(docs/configuration.md)" in text
    named = set(re.findall(r"\b(CUFORGE_[A-Z0-9_]+)\b", text))
    assert {"CUFORGE_CACHE_DIR", "CUFORGE_ARCH", "CUFORGE_OFFLINE"} <= named
    assert sorted(named - _configuration_names()) == []


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: str) -> set[str]:
    with open(path, encoding="utf-8") as f:
        text = re.sub(r"^ *```.*?^ *```$", "", f.read(), flags=re.M | re.S)
    return {_anchor(m.group(1)) for m in re.finditer(r"^#+ (.*)$", text, re.M)}


@pytest.mark.parametrize("page", [*PAGES, *INTEGRATION_PAGES, "docs/aot.md"])
def test_relative_links_resolve(page):
    """README's links (the Why table's benchmarks.md#anchor of every figure, the page table)
    and the moved pages' links name a file that exists and, with #anchor, one of its
    headings."""
    path = os.path.join(ROOT, page)
    with open(path, encoding="utf-8") as f:
        text = re.sub(r"^ *```.*?^ *```$", "", f.read(), flags=re.M | re.S)
    text = re.sub(r"`[^`\n]*`", "", text)  # code, not links: k[grid, block](*args)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        dest = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
        if not os.path.exists(dest):
            broken.append(target)
        elif anchor and dest.endswith(".md") and anchor not in _anchors(dest):
            broken.append(target)
    assert broken == [], f"{page}: links to no file or heading: {broken}"


def test_every_why_figure_names_its_benchmark_section():
    """Each row of README's *Why cuforge* table that gives a figure links the section of
    docs/benchmarks.md it comes from (the machine is in the row)."""
    with open(README, encoding="utf-8") as f:
        text = f.read()
    start = text.index("\n## Why cuforge\n")
    rows = [r for r in text[start : text.index("\n## ", start + 1)].splitlines()]
    rows = [r for r in rows if r.startswith("| ") and not r.startswith(("| you use", "|---"))]
    assert 5 <= len(rows) <= 14
    for row in rows:
        if re.search(r"\d(\.\d+)?x\b|\d (ms|s|us)\b", row):
            assert "(docs/benchmarks.md#" in row, row
