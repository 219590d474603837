"""The one runner of child Python processes for the tests.

A child is a fresh interpreter running a code string with this tree's ``src`` first on
``PYTHONPATH``; its last stdout line is one JSON document, which the runner returns. A
child that exits non-zero, or prints no JSON, fails the test with its stdout and stderr.

* :func:`run_python` runs one to the end;
* :func:`spawn` starts one (several run at once), :func:`finish` waits for it;
* :func:`child_env` is the environment they get by default.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "src")

__all__ = ["ROOT", "SRC", "child_env", "python_cmd", "run_python", "spawn", "finish"]


def child_env(**overrides: str) -> dict[str, str]:
    """The current environment (with the test's cache dir) for a child process, this
    tree's ``src`` first on ``PYTHONPATH``, then ``overrides``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    env.update(overrides)
    return env


def python_cmd(code: str) -> list[str]:
    """The command line that runs ``code`` (dedented) in a fresh interpreter."""
    return [sys.executable, "-c", textwrap.dedent(code)]


def spawn(code: str, env: dict[str, str] | None = None, *, cwd: str | None = None):
    """Start ``code`` in a fresh interpreter (stdout and stderr piped); :func:`finish` it."""
    return subprocess.Popen(
        python_cmd(code),
        env=env or child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
    )


def finish(proc: subprocess.Popen, timeout: float = 300, *, stderr_key: str | None = None):
    """Wait for a :func:`spawn`-ed child; return its last stdout line, parsed as JSON.

    A child still running after ``timeout`` seconds is killed and fails the test (a hang);
    so does a non-zero exit. With ``stderr_key``, a dict result also carries the child's
    stderr under that key."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"child still running after {timeout} s:\n{out}\n{err}") from None
    if proc.returncode != 0:
        raise AssertionError(f"child failed ({proc.returncode}):\n{out}\n{err}")
    lines = out.strip().splitlines()
    if not lines:
        raise AssertionError(f"child printed nothing on stdout; its stderr:\n{err}")
    result = json.loads(lines[-1])
    if stderr_key is not None and isinstance(result, dict):
        result[stderr_key] = err
    return result


def run_python(
    code: str,
    env: dict[str, str] | None = None,
    timeout: float = 300,
    *,
    cwd: str | None = None,
    stderr_key: str | None = None,
):
    """Run ``code`` in a fresh interpreter; it must print one JSON line last. Returns it
    (see :func:`finish` for ``timeout`` and ``stderr_key``)."""
    return finish(spawn(code, env, cwd=cwd), timeout, stderr_key=stderr_key)
