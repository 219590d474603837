"""Helpers for the store tests: real child processes, real mounts."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

# the one child-process runner (tests/child.py), under the names these tests use
from tests.child import ROOT, child_env, finish, spawn  # noqa: F401
from tests.child import run_python as run_child  # noqa: F401


def key_of(i: int | str) -> str:
    """A realistic key: 64 lowercase hex digits."""
    import hashlib

    return hashlib.sha256(str(i).encode()).hexdigest()


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
