"""Feedback for people at a terminal, silence elsewhere (issue 11 section 6): a compile that
takes longer than the delay shows a spinner on a terminal; nothing is printed when stderr is
not a terminal or under CI, and CUFORGE_PROGRESS forces either."""

from __future__ import annotations

import os
import pty
import subprocess
import sys

import pytest

from tests.conftest import child_env

CHILD = r"""
import cuforge, cuforge.base._progress as p
p.DELAY = 0.0  # any compile is "slow"
cuforge.compile('extern "C" __global__ void k(int* o) { *o = 7; }', name="spin.cu", arch="sm_90")
"""


def run_on_a_terminal(**env: str) -> str:
    """Run CHILD with stdin/stdout/stderr on a pseudo-terminal; return what it printed."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD],
        stdin=follower,
        stdout=follower,
        stderr=follower,
        env=child_env(**env),
        close_fds=True,
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 4096)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=120)
    os.close(leader)
    assert proc.returncode == 0, b"".join(chunks).decode(errors="replace")
    return b"".join(chunks).decode(errors="replace")


def test_spinner_on_a_terminal():
    env = {k: "" for k in ("CI", "CUFORGE_PROGRESS")}
    assert "compiling spin.cu" in run_on_a_terminal(**env)


@pytest.mark.parametrize("env", [{"CI": "true"}, {"CUFORGE_PROGRESS": "0"}])
def test_no_spinner_under_ci_or_when_off(env):
    assert "compiling spin.cu" not in run_on_a_terminal(**env)


def test_no_spinner_when_not_a_terminal():
    done = subprocess.run(
        [sys.executable, "-c", CHILD],
        env=child_env(CI="", CUFORGE_PROGRESS=""),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
