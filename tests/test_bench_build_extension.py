"""bench/build_extension.py (was ``cuforge bench-build``): its options, rows and table.

The benchmark itself takes minutes per row; these tests run the script's argument
parsing (as a real process) and its table formatting, not a build.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from tests.conftest import SRC

SCRIPT = os.path.join(os.path.dirname(SRC), "bench", "build_extension.py")


def _script():
    spec = importlib.util.spec_from_file_location("build_extension", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, SCRIPT, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_bench_build_parser_rows_and_table():
    bench = _script()
    parser = bench.build_parser()
    args = parser.parse_args(["--rows", "quick,torch_default", "--json"])
    rows = args.rows
    assert rows == bench.pick_rows("quick,torch_default")
    assert rows[0] == "torch_jobs" and rows[-1] == "torch_default"
    with pytest.raises(ValueError, match="no_such_row"):
        bench.pick_rows("no_such_row")
    # the script, as a process: a bad row is a usage error naming it; --help lists the rows
    done = _run("--rows", "no_such_row")
    assert done.returncode == 2 and "no_such_row" in done.stderr, done.stderr
    helped = _run("--help")
    assert helped.returncode == 0, helped.stderr
    assert all(row in helped.stdout for row in bench.ROWS)
    assert "--layout" in helped.stdout and "--json-out" in helped.stdout
    doc = {
        "sources": ["ops.cu", "binding.cpp"],
        "layout": "classic",
        "arch": "sm_90",
        "cores": 2,
        "edited": "ops.cu",
        "rows": [
            {
                "row": "torch_jobs",
                "seconds": 100.0,
                "vs_default": None,
                "vs_tuned": 1.0,
                "runs": [{"seconds": 100.0}],
            },
            {
                "row": "cuforge_edit",
                "seconds": 2.0,
                "vs_default": None,
                "vs_tuned": 0.02,
                "runs": [{"seconds": 2.0, "compiled": ["ops.cu"]}],
            },
            {"row": "torch_ccache", "note": "ccache is not installed", "runs": []},
        ],
    }
    table = bench.format_table(doc)
    assert "0.020x" in table and "compiled: ops.cu" in table
    assert "ccache is not installed" in table
