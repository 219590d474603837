"""Helpers for the store tests: real child processes, real mounts."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SRC = os.path.join(ROOT, "src")


def key_of(i: int | str) -> str:
    """A realistic key: 64 lowercase hex digits."""
    import hashlib

    return hashlib.sha256(str(i).encode()).hexdigest()


def child_env(**overrides: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    env.update(overrides)
    return env


def python_cmd(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def run_child(code: str, env: dict[str, str] | None = None, timeout: float = 120) -> dict:
    """Run ``code`` in a fresh interpreter; its last stdout line is JSON; returns it."""
    done = subprocess.run(
        python_cmd(code),
        env=env or child_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"child failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def spawn(code: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        python_cmd(code),
        env=env or child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen, timeout: float = 120) -> dict:
    out, err = proc.communicate(timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"child failed ({proc.returncode}):\n{out}\n{err}")
    return json.loads(out.strip().splitlines()[-1])


def wait_for(path: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} never appeared")
        time.sleep(0.01)


def mount(args: list[str]) -> str | None:
    """Run ``mount args``; None on success, else why not (for a skip reason)."""
    if shutil.which("mount") is None:
        return "no mount command"
    done = subprocess.run(["mount", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return f"mount {' '.join(args)} failed: {done.stderr.strip() or done.returncode}"
    return None


def umount(path: str) -> None:
    subprocess.run(["umount", "-l", path], capture_output=True, check=False)
