"""``make test-compat``: every adapter against the newest and the oldest release of its peer
that cuforge claims, each peer release in its own folder (``pip install --target``, put
first on ``PYTHONPATH`` for that run only, shadowing the test venv's copy).

    python tests/compat/run.py [--only LABEL ...] [--list]

Each row below names the release, the interpreter (JAX 0.11 and later need Python >= 3.12),
what pip installs into ``.compat/<label>`` (once: a folder with ``.installed`` is reused)
and the tests it runs (each adapter's contract and two-machine tests). pip runs with
``PIP_CONFIG_FILE=/dev/null``: a machine whose pip configuration caps torch at the release
on local disk still gets today's release from the index. docs/compat.md has the window of
each peer and how to add the next release (one row here, one bump of ``SUPPORTED``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMPAT = os.path.join(ROOT, ".compat")

TRITON_TESTS = [
    "tests/adapters/triton/test_triton_cache.py",
    "tests/adapters/triton/test_build_key.py",
]
TORCH_TESTS = ["tests/torch/test_compile_cache.py"]
JAX_TESTS = ["tests/adapters/jax", "tests/adapters/test_contract.py"]
CUPY_TESTS = ["tests/adapters/cupy", "tests/adapters/test_contract.py"]
CUDA_CORE_TESTS = ["tests/adapters/cuda_core", "tests/adapters/test_contract.py"]
CCCL_TESTS = ["tests/cccl/test_cccl.py"]
CUTE_TESTS = ["tests/cute/test_cute_keying.py"]
#: what the Python 3.12 folders need besides the peer (the test venv is Python 3.11)
PY312_BASE = ["pytest>=8", "platformdirs>=3", "rich>=13", "numpy>=1.24"]

#: (label, python, pip arguments, tests). "venv": the test venv's interpreter; "3.12": a
#: Python 3.12 found on PATH or under pyenv. ``--no-deps`` rows reuse the venv's own
#: dependencies (the NVIDIA libraries, numpy); the others bring theirs.
ROWS: list[tuple[str, str, list[str], list[str]]] = [
    ("triton-3.9.0", "venv", ["--no-deps", "triton==3.9.0"], TRITON_TESTS),
    ("triton-3.6.0", "venv", ["--no-deps", "triton==3.6.0"], TRITON_TESTS),
    # torch 2.15 is a CUDA 13.2 build: its own Triton and the two NVIDIA libraries whose
    # version it needs exactly; the venv's other CUDA 13 libraries serve the CPU tests
    (
        "torch-2.15.0",
        "venv",
        [
            "--no-deps",
            "torch==2.15.0",
            "triton==3.9.0",
            "nvidia-nvshmem-cu13==3.7.2",
            "nvidia-cudnn-cu13==9.26.0.51",
        ],
        TORCH_TESTS,
    ),
    # torch 2.6 is a CUDA 12 build: it brings its whole stack (~5 GB installed)
    ("torch-2.6.0", "venv", ["torch==2.6.0"], TORCH_TESTS),
    ("jax-0.12.0.1", "3.12", ["jax[cpu]==0.12.0.1", *PY312_BASE], JAX_TESTS),
    ("jax-0.4.36", "venv", ["jax[cpu]==0.4.36"], JAX_TESTS),
    ("cupy-14.2.0", "venv", ["--no-deps", "cupy-cuda13x==14.2.0"], CUPY_TESTS),
    ("cupy-14.1.0", "venv", ["--no-deps", "cupy-cuda13x==14.1.0"], CUPY_TESTS),
    ("cuda-core-1.2.2", "venv", ["--no-deps", "cuda-core==1.2.2"], CUDA_CORE_TESTS),
    ("cuda-core-1.2.0", "venv", ["--no-deps", "cuda-core==1.2.0"], CUDA_CORE_TESTS),
    ("cccl-1.2.1", "venv", ["--no-deps", "cuda-cccl==1.2.1"], CCCL_TESTS),
    ("cccl-1.2.0", "venv", ["--no-deps", "cuda-cccl==1.2.0"], CCCL_TESTS),
    ("cute-4.8.1", "venv", ["--no-deps", "nvidia-cutlass-dsl==4.8.1"], CUTE_TESTS),
]


def python_312() -> str | None:
    """A Python 3.12 interpreter that runs (tests/wheel/build.py's finder: pyenv, then PATH)."""
    import importlib.util

    path = os.path.join(ROOT, "tests", "wheel", "build.py")  # not PyPI's `build`
    spec = importlib.util.spec_from_file_location("cuforge_wheel_build", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.find_python("3.12")


def interpreter(which: str) -> str | None:
    return sys.executable if which == "venv" else python_312()


def install(label: str, python: str, args: list[str]) -> None:
    """``pip install --target .compat/<label> ARGS`` once (``.installed`` marks it done)."""
    target = os.path.join(COMPAT, label)
    stamp = os.path.join(target, ".installed")
    if os.path.exists(stamp):
        return
    shutil.rmtree(target, ignore_errors=True)
    env = dict(os.environ, PIP_CONFIG_FILE=os.devnull)
    cmd = [python, "-m", "pip", "--disable-pip-version-check", "-q", "install", "--target"]
    subprocess.run([*cmd, target, *args], env=env, check=True)
    with open(stamp, "w", encoding="utf-8") as f:
        f.write(" ".join(args) + "\n")


def run(label: str, python: str, tests: list[str], extra: list[str]) -> int:
    env = dict(os.environ)
    paths = [os.path.join(COMPAT, label), os.path.join(ROOT, "src"), ROOT]
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    cmd = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests, *extra]
    return subprocess.run(cmd, env=env, cwd=ROOT, check=False).returncode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", help="row labels to run (default: all)")
    ap.add_argument("--list", action="store_true", help="list the rows and exit")
    ap.add_argument("pytest_args", nargs="*", help="passed to pytest (after --)")
    args = ap.parse_args()
    labels = [r[0] for r in ROWS]
    if args.list:
        for label, python, pip_args, tests in ROWS:
            print(
                f"{label:18} python {python:5} pip: {' '.join(pip_args)}  tests: {' '.join(tests)}"
            )
        return 0
    unknown = sorted(set(args.only or ()) - set(labels))
    if unknown:
        ap.error(f"unknown rows {unknown}; the rows are: {', '.join(labels)}")
    results: list[tuple[str, str, float]] = []
    for label, which, pip_args, tests in ROWS:
        if args.only and label not in args.only:
            continue
        python = interpreter(which)
        if python is None:
            results.append((label, "FAILED: no Python 3.12 on PATH or under pyenv", 0.0))
            continue
        started = time.monotonic()
        print(f"== {label}: installing ({' '.join(pip_args)})", flush=True)
        try:
            install(label, python, pip_args)
        except subprocess.CalledProcessError as exc:
            results.append((label, f"FAILED: pip install exited {exc.returncode}", 0.0))
            continue
        print(f"== {label}: {' '.join(tests)}", flush=True)
        code = run(label, python, tests, args.pytest_args)
        # pytest's 5: no test ran (every test of the row skipped itself as not applicable)
        verdict = "ok" if code in (0, 5) else f"FAILED: pytest exited {code}"
        results.append((label, verdict, time.monotonic() - started))
    print("\nmake test-compat:")
    for label, verdict, seconds in results:
        print(f"  {label:18} {verdict} ({seconds:.0f} s)")
    failed = [r for r in results if r[1] != "ok"]
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
