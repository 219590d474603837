"""The sdist and wheel: ``python -m build`` prints no warning, ``twine check --strict``
passes, and they hold what cuforge needs (the C launcher's source and, where a C compiler
is present, its compiled extension; py.typed; the samples; LICENSE; README).

The builds run on a copy of the checkout in a temp dir, without build isolation (the
running interpreter's setuptools, which must satisfy ``[build-system] requires``), so they
need no network. Skipped when ``build`` or ``twine`` is not importable here.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_python

#: what a build reads from the checkout (everything else, e.g. .venv, stays behind)
TOP_LEVEL = (
    "pyproject.toml",
    "setup.py",
    "MANIFEST.in",
    "README.md",
    "CHANGELOG.md",
    "LICENSE",
    "Makefile",
    "src",
    "tests",
    "docs",
    "bench",
)
BUILD_OUTPUTS = shutil.ignore_patterns(
    "__pycache__", "*.pyc", "*.so", "*.o", "*.egg-info", "build", "dist", "out"
)
EXTENSION = "cuforge/runtime/_cuforge_fastlaunch" + sysconfig.get_config_var("EXT_SUFFIX")


def _importable(name: str) -> bool:
    # a ./build directory would pass for a namespace package: require a real module
    spec = importlib.util.find_spec(name)
    return spec is not None and spec.origin not in (None, "namespace")


pytestmark = pytest.mark.skipif(
    not (_importable("build") and _importable("twine")),
    reason="needs the `build` and `twine` packages (pip install build twine)",
)


def _c_compiler_present() -> bool:
    """What setuptools needs to build the extension: its compiler and Python.h."""
    cc = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    include = sysconfig.get_paths()["include"]
    return shutil.which(cc) is not None and os.path.exists(os.path.join(include, "Python.h"))


def _build(args: list[str], cwd, **env_vars: str) -> str:
    """``python -m build --no-isolation ARGS`` in ``cwd``; its combined output."""
    env = dict(os.environ)
    # byte-compiling is part of a normal build: without it setuptools warns that it is off
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.update(env_vars)
    done = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    return output


def _warnings(output: str) -> list[str]:
    return [
        line
        for line in output.splitlines()
        if "warning" in line.lower() or "deprecat" in line.lower()
    ]


def _source_files(rel: str) -> set[str]:
    """The files under ``ROOT/rel`` a build would ship (no caches or build outputs)."""
    found = set()
    for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, rel)):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for name in filenames:
            if not name.endswith((".pyc", ".so", ".o")):
                found.add(os.path.relpath(os.path.join(dirpath, name), ROOT))
    return found


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    """``python -m build`` (an sdist, then a wheel built from it) of a copy of the checkout:
    (the dist dir, the build's output)."""
    tmp = tmp_path_factory.mktemp("pkg")
    checkout = tmp / "checkout"
    checkout.mkdir()
    for name in TOP_LEVEL:
        src = os.path.join(ROOT, name)
        if os.path.isdir(src):
            shutil.copytree(src, checkout / name, ignore=BUILD_OUTPUTS)
        else:
            shutil.copy2(src, checkout / name)
    out = tmp / "dist"
    output = _build(["--outdir", str(out), str(checkout)], cwd=tmp)
    return out, output


def _one(out, pattern: str):
    found = sorted(out.glob(pattern))
    assert len(found) == 1, f"expected one {pattern} in {out}: {found}"
    return found[0]


def test_build_is_clean_and_twine_check_passes(dist):
    out, output = dist
    assert _warnings(output) == [], output
    files = sorted(str(p) for p in out.iterdir())
    assert len(files) == 2
    done = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *files],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("PASSED") == 2, done.stdout


def test_sdist_holds_the_sources(dist):
    out, _ = dist
    sdist = _one(out, "cuforge-*.tar.gz")
    with tarfile.open(sdist) as tar:
        members = tar.getnames()
        prefix = members[0].split("/")[0]
        names = {m[len(prefix) + 1 :] for m in members if m != prefix}
        pkg_info = tar.extractfile(f"{prefix}/PKG-INFO").read().decode()
    expected = {
        "LICENSE",
        "README.md",
        "CHANGELOG.md",
        "pyproject.toml",
        "setup.py",
        "MANIFEST.in",
        "Makefile",
        "src/cuforge/py.typed",
        "src/cuforge/runtime/_launcher.c",
        "src/cuforge/runtime/_launcher_ext.c",
        "src/cuforge/__main__.py",
        "src/cuforge-enable.pth",
    }
    expected |= _source_files("src/cuforge/samples") | _source_files("tests")
    expected |= _source_files("docs")
    assert expected <= names, sorted(expected - names)
    assert not [n for n in names if "__pycache__" in n or n.endswith((".pyc", ".so", ".o"))]
    assert "License-Expression: Apache-2.0" in pkg_info
    assert "License-File: LICENSE" in pkg_info
    assert "Classifier: License" not in pkg_info  # SPDX expression only, no legacy classifier


def test_wheel_holds_the_package_and_its_extension(dist, tmp_path):
    out, _ = dist
    wheel = _one(out, "cuforge-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        metadata = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        zf.extractall(tmp_path / "site")
    expected = {
        "cuforge/py.typed",
        "cuforge/__main__.py",
        "cuforge/runtime/_launcher.c",
        "cuforge/runtime/fastlaunch.py",
    }
    expected |= {n[len("src/") :] for n in _source_files("src/cuforge/samples")}
    assert expected <= names, sorted(expected - names)
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert not [n for n in names if n.startswith(("tests/", "src/"))]
    assert "License-Expression: Apache-2.0" in metadata
    # CUFORGE_ENABLE's hook, at the root of site-packages once installed (docs/run.md)
    assert "cuforge-enable.pth" in names
    hook = (tmp_path / "site" / "cuforge-enable.pth").read_text()
    assert hook == (Path(ROOT) / "src" / "cuforge-enable.pth").read_text()
    assert hook.startswith("import os; os.environ.get('CUFORGE_ENABLE') and ")
    if not _c_compiler_present():
        pytest.skip("no C compiler or Python.h here: the wheel has no compiled extension")
    assert EXTENSION in names
    # the wheel's own extension is what cuforge uses, built from the C source it ships
    code = """
    import hashlib, json
    from cuforge.runtime import fastlaunch
    m = fastlaunch.load()
    print(json.dumps({"status": fastlaunch.status(), "file": m.__file__,
                      "built_from": m.SOURCE_SHA256}))
    """
    report = run_python(code, dict(os.environ, PYTHONPATH=str(tmp_path / "site")))
    assert report["status"] == ["installed", str(tmp_path / "site" / EXTENSION)]
    source = (tmp_path / "site" / "cuforge/runtime/_launcher.c").read_bytes()
    assert report["built_from"] == hashlib.sha256(source).hexdigest()


def test_wheel_builds_without_a_c_compiler(dist, tmp_path):
    """The extension is optional: with no compiler the wheel is still built (from the sdist
    alone), without it, and cuforge says it is not installed."""
    out, _ = dist
    with tarfile.open(_one(out, "cuforge-*.tar.gz")) as tar:
        if hasattr(tarfile, "data_filter"):  # Python 3.10.12+ / 3.11.4+
            tar.extractall(tmp_path, filter="data")
        else:
            tar.extractall(tmp_path)  # our own sdist, just built
    (unpacked,) = tmp_path.glob("cuforge-*")
    wheels = tmp_path / "wheels"
    missing = str(tmp_path / "no-such-cc")
    output = _build(["--wheel", "--outdir", str(wheels), str(unpacked)], cwd=tmp_path, CC=missing)
    # the one warning: the optional extension was not built
    warnings = _warnings(output)
    assert len(warnings) == 1 and "_cuforge_fastlaunch" in warnings[0], output
    wheel = _one(wheels, "cuforge-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        zf.extractall(tmp_path / "site")
    assert EXTENSION not in names and "cuforge/runtime/_launcher.c" in names
    code = """
    import json
    from cuforge.runtime import fastlaunch
    print(json.dumps({"why": fastlaunch._installed()[1]}))
    """
    report = run_python(code, dict(os.environ, PYTHONPATH=str(tmp_path / "site")))
    assert report["why"].startswith("not installed")
