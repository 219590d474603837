"""A throwaway virtual environment with cuforge really installed (``pip install -e`` of a
copy of this checkout, as the Makefile does), for the tests of what only an install gives:
the ``cuforge-enable.pth`` hook in site-packages (``CUFORGE_ENABLE``, ``cuforge run``).

The venv sees the running interpreter's packages (Triton, torch, setuptools, pip) through
a path file named to come after cuforge's own, so it needs no network and installs nothing
but cuforge (``--no-deps --no-build-isolation``: the running interpreter's setuptools).
Its children get no ``PYTHONPATH``: cuforge is found only through the install.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from tests.child import ROOT

#: what an install reads from the checkout
_TOP_LEVEL = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "LICENSE", "src")
_OUTPUTS = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "*.o", "*.egg-info", "build")


def missing() -> str | None:
    """Why an installed venv cannot be made here (None: it can)."""
    for name in ("pip", "setuptools", "venv"):
        if importlib.util.find_spec(name) is None:
            return f"needs {name} in the running interpreter"
    return None


class Installed:
    """The venv: ``python`` (its interpreter), ``site`` (its site-packages)."""

    def __init__(self, python: Path, site: Path) -> None:
        self.python = python
        self.site = site

    def env(self, **overrides: str) -> dict[str, str]:
        """The test's environment minus ``PYTHONPATH``, plus ``overrides``."""
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.update(overrides)
        return env

    def run(self, args: list[str], timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(self.python), *args],
            env=self.env(**env),
            capture_output=True,
            text=True,
            timeout=timeout,
        )


def install(where: Path) -> Installed:
    """Make the venv under ``where`` and ``pip install -e`` a copy of the checkout into it."""
    copy = where / "checkout"
    copy.mkdir(parents=True)
    for name in _TOP_LEVEL:
        src = Path(ROOT) / name
        if src.is_dir():
            shutil.copytree(src, copy / name, ignore=_OUTPUTS)
        else:
            shutil.copy2(src, copy / name)
    venv = where / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
    )
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout.strip()
    )
    # after cuforge's own .pth files (sorted by name): the install's cuforge comes first
    (site / "zz-peers.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "-e", str(copy)],
        capture_output=True,
        text=True,
        timeout=600,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return Installed(python, site)
