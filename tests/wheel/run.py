"""``make test-wheel``: the wheel ``make wheel`` built, installed alone into a fresh venv
whose ``PATH`` holds no C compiler, runs what the README promises ``pip install cuforge``
gives.

    python tests/wheel/run.py [--dist dist] [--keep DIR]

1. the wheel for this interpreter's CPython is picked from ``--dist`` (``make wheel``
   first), a venv is made from this interpreter, and ``PATH`` becomes that venv's bin dir
   alone: ``python`` and ``pip``, no ``cc``, ``gcc``, ``clang``, ``nvcc`` (checked; and that
   ``python`` there is the venv's); ``pip install --only-binary :all:`` installs the wheel and its dependencies
   (nothing is built from source; pip's cache serves what it downloaded before);
2. in that venv, from an empty directory with no ``PYTHONPATH``: ``cuforge`` is the
   installed one, its launcher is the wheel's compiled extension (``fastlaunch.status()``
   is ``installed``: no compiler needed at run time), ``cuforge-enable.pth`` is at the root
   of site-packages, and ``cuforge --version`` runs;
3. every README Python block that runs without a GPU and names no extra (``# needs
   cuforge[...]``, tests/test_readme.py) runs as written, each in its own empty directory
   against a fresh cache dir: the blocks a plain ``pip install cuforge`` must run (one that
   says ``# needs nvcc`` gets this process's PATH too: nvcc runs the host compiler).

Exits non-zero, saying which step and why, on the first failure.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from tests.test_readme import _leading_comments, block_extras, python_blocks  # noqa: E402
from tests.wheel.build import version  # noqa: E402

#: what must not be on the install's PATH
COMPILERS = ("cc", "gcc", "clang", "c++", "g++", "nvcc")

CHECK = r"""
import json, os, site, subprocess, sys
import cuforge
from cuforge.runtime import fastlaunch
sp = [p for p in site.getsitepackages() if os.path.isdir(p)]
pth = [os.path.join(p, "cuforge-enable.pth") for p in sp]
cli = subprocess.run([os.path.join(sys.prefix, "bin", "cuforge"), "--version"],
                     capture_output=True, text=True)
print(json.dumps({"file": cuforge.__file__, "version": cuforge.__version__,
                  "launcher": fastlaunch.status(), "pth": any(map(os.path.exists, pth)),
                  "cli": cli.stdout.strip() or cli.stderr.strip()}))
"""


class WheelTestError(RuntimeError):
    """A step of the installed-wheel test failed; the message says which and why."""


def pick_wheel(dist: str) -> str:
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    pattern = os.path.join(dist, f"cuforge-{version()}-{tag}-{tag}-manylinux*.whl")
    found = sorted(glob.glob(pattern))
    if len(found) != 1:
        raise WheelTestError(f"expected one wheel {pattern} (run `make wheel`), found {found}")
    return found[0]


def bare_path(venv: str) -> str:
    """The install's PATH: the venv's own bin dir alone (python, pip; after the install
    cuforge and ninja), after checking that no compiler is found there. Its python is the
    venv's (a symlink to it elsewhere would not be: Python finds pyvenv.cfg beside the path
    it was started by, and pip would install into the base interpreter)."""
    where = os.path.join(venv, "bin")
    found = [c for c in COMPILERS if shutil.which(c, path=where)]
    if found:
        raise WheelTestError(f"the bare PATH {where} still finds {found}")
    return where


def check_prefix(env: dict[str, str], venv: str) -> None:
    """``python`` on the install's PATH is the venv's, not its base interpreter."""
    done = run(["python", "-c", "import sys; print(sys.prefix)"], "python's prefix", env=env)
    if os.path.realpath(done.stdout.strip()) != os.path.realpath(venv):
        raise WheelTestError(f"python on {env['PATH']} is {done.stdout.strip()}, not {venv}")


def env_for(path: str, home: str, cache: str) -> dict[str, str]:
    """The install's environment: no PYTHONPATH, no CUFORGE_* but the cache dir, no CC."""
    keep = ("HOME", "LANG", "LC_ALL", "TMPDIR", "PIP_CACHE_DIR", "XDG_CACHE_HOME")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env.setdefault("HOME", home)
    env.update(PATH=path, CUFORGE_CACHE_DIR=cache, PIP_DISABLE_PIP_VERSION_CHECK="1")
    return env


def run(cmd: list[str], what: str, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, **kwargs)
    if done.returncode != 0:
        raise WheelTestError(
            f"{what} failed ({' '.join(cmd)}):\n{(done.stdout + done.stderr)[-6000:]}"
        )
    return done


def readme_blocks() -> list[tuple[int, str]]:
    """The README blocks a plain install must run: no GPU, no setup.py, no extra named."""
    chosen = []
    for line, code in python_blocks():
        first = code.lstrip().splitlines()[0] if code.strip() else ""
        if first.startswith(("# needs a GPU", "# setup.py")) or block_extras(code):
            continue
        chosen.append((line, code))
    return chosen


def needs_nvcc(code: str) -> bool:
    """A block whose leading comment says ``# needs nvcc``: a CUDA toolkit and the host
    compiler nvcc runs, which the bare PATH leaves out."""
    return any(line.startswith("# needs nvcc") for line in _leading_comments(code))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dist", default=os.path.join(ROOT, "dist"))
    ap.add_argument("--keep", help="make the venv here and keep it (default: a temp dir)")
    opts = ap.parse_args()
    started = time.monotonic()
    tmp = opts.keep or tempfile.mkdtemp(prefix="cuforge-wheel-test-")
    try:
        wheel = pick_wheel(os.path.abspath(opts.dist))
        venv = os.path.join(tmp, "venv")
        run([sys.executable, "-m", "venv", venv], "making the venv")
        env = env_for(bare_path(venv), tmp, os.path.join(tmp, "cache"))
        check_prefix(env, venv)
        t0 = time.monotonic()
        install = ["python", "-m", "pip", "install", "-q", "--only-binary", ":all:", wheel]
        run(install, "installing the wheel", env=env, cwd=tmp)
        print(f"installed {os.path.basename(wheel)} in {time.monotonic() - t0:.0f} s", flush=True)

        empty = os.path.join(tmp, "empty")
        os.makedirs(empty)
        done = run(["python", "-c", CHECK], "the installed-package check", env=env, cwd=empty)
        import json

        report = json.loads(done.stdout.strip().splitlines()[-1])
        site_dir = os.path.realpath(venv)
        problems = []
        if not os.path.realpath(report["file"]).startswith(site_dir):
            problems.append(f"cuforge came from {report['file']}, not the venv")
        if report["version"] != version():
            problems.append(f"version {report['version']}, expected {version()}")
        if report["launcher"][0] != "installed":
            problems.append(f"the launch path is {report['launcher']}, not the wheel's extension")
        if not report["pth"]:
            problems.append("cuforge-enable.pth is not at the root of site-packages")
        if report["cli"] != f"cuforge {version()}":
            problems.append(f"`cuforge --version` said {report['cli']!r}")
        if problems:
            raise WheelTestError("the installed package: " + "; ".join(problems))
        print(f"installed package: {report['file']}, launcher {report['launcher'][0]}")

        blocks = readme_blocks()
        if len(blocks) < 4:
            raise WheelTestError(f"only {len(blocks)} README blocks need no extra and no GPU")
        for line, code in blocks:
            where = os.path.join(tmp, f"readme-{line}")
            os.makedirs(where)
            block_env = dict(env, CUFORGE_CACHE_DIR=os.path.join(where, ".cache"))
            if needs_nvcc(code):  # nvcc runs the host compiler: this block gets the PATH
                block_env["PATH"] = os.pathsep.join([env["PATH"], os.environ.get("PATH", "")])
            t0 = time.monotonic()
            try:
                run(["python", "-c", code], f"README.md:{line}", env=block_env, cwd=where)
            except WheelTestError as exc:
                raise WheelTestError(f"{exc}\nthe block:\n{code}") from None
            print(f"README.md:{line} ran in {time.monotonic() - t0:.1f} s", flush=True)
    except WheelTestError as exc:
        print(f"make test-wheel: {exc}", file=sys.stderr)
        return 1
    finally:
        if not opts.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"make test-wheel: passed in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
