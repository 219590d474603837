"""bench/signing.py runs (as a real process, a few entries) and reports what issue 35 asks:
cuforge's verify path against the raw primitive in the same run, and a local hit of an
entry that arrived signed against an unsigned one, with no verification. The figures
themselves are docs/benchmarks.md's (no wall-clock assertion here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, SRC

pytest.importorskip("cryptography", reason="pip install 'cuforge[sign]' (cryptography)")


def test_the_signing_bench_reports_the_cost_over_the_primitive_and_the_local_hit(tmp_path):
    out = tmp_path / "signing.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, ROOT])}
    done = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "bench", "signing.py"),
            "--n",
            "20",
            "--local",
            "20",
            "--size",
            "4096",
            "--json",
            str(out),
        ],  # fmt: skip
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert "verify path" in done.stdout and "local disk hit" in done.stdout, done.stdout
    figures = json.loads(out.read_text())
    path, local = figures["verify_path"], figures["local_hit"]
    assert path["raw_us"] > 0 and path["cuforge_us"] > 0 and path["own_work_us"] > 0
    assert path["ratio"] == pytest.approx(path["cuforge_us"] / path["raw_us"])
    assert local["verifications"] == 0  # a local hit of a signed entry verifies nothing
    assert local["unsigned_us"] > 0 and local["signed_us"] > 0
