"""`python -m cuforge` is the `cuforge` command."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import child_env


def test_python_dash_m_cuforge_runs_the_cli():
    done = subprocess.run(
        [sys.executable, "-m", "cuforge", "cache", "stats", "--json"],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["command"] == "cache stats"
