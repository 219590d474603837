"""bench/cute_examples.py: CUTLASS's CuTe DSL examples are run from a CUTLASS checkout
(``--cutlass DIR`` or ``CUTLASS_DIR``) at their upstream paths, not from copies here.

The examples themselves need a GPU; these tests run the script (as a real process) against
stand-in checkouts: its errors for a missing checkout or file, and one stand-in example run
cold and warm through the script's real child (which needs the CuTe DSL).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import GPU_VISIBLE, ROOT, SRC

SCRIPT = os.path.join(ROOT, "bench", "cute_examples.py")
COMMIT = "7107b05535f8977f5ecb9d01ee203205b1fd9bc4"
EXAMPLES = os.path.join("examples", "python", "CuTeDSL", "cute")


def _run(*args: str, **env: str) -> subprocess.CompletedProcess:
    full = dict(os.environ)
    full.pop("CUTLASS_DIR", None)
    full["PYTHONPATH"] = os.pathsep.join([SRC, ROOT, full.get("PYTHONPATH", "")])
    if not GPU_VISIBLE:
        full.setdefault("CUTE_DSL_ARCH", "sm_90a")
    full.update(env)
    return subprocess.run(
        [sys.executable, SCRIPT, *args],
        env=full,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=ROOT,
    )


def _checkout(root, *files: str, body: str = "") -> str:
    for rel in files:
        path = root / EXAMPLES / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
    return str(root)


def test_a_checkout_is_required():
    done = _run()
    assert done.returncode == 2, done
    assert "--cutlass DIR (or CUTLASS_DIR) is required" in done.stderr
    assert f"git -C cutlass checkout {COMMIT}" in done.stderr


def test_a_directory_that_is_no_checkout_is_named(tmp_path):
    done = _run("--cutlass", str(tmp_path))
    assert done.returncode != 0
    assert f"{tmp_path / EXAMPLES} is not a directory" in done.stderr, done.stderr
    assert COMMIT in done.stderr


def test_every_missing_file_is_named_with_the_commit_before_anything_runs(tmp_path):
    """rmsnorm.py is there but the reduce.py it imports is not; sgemm.py is missing: both
    paths are named (from CUTLASS_DIR), and no example ran."""
    marker = tmp_path / "ran"
    cutlass = _checkout(
        tmp_path / "cutlass",
        "blackwell/kernel/rmsnorm/rmsnorm.py",
        body=f"open({str(marker)!r}, 'w').close()\n",
    )
    done = _run("--only", "rmsnorm.py", "ampere/kernel/dense_gemm/sgemm.py", CUTLASS_DIR=cutlass)
    assert done.returncode != 0
    root = os.path.join(cutlass, EXAMPLES)
    assert os.path.join(root, "blackwell", "kernel", "reduce", "reduce.py") in done.stderr
    assert os.path.join(root, "ampere", "kernel", "dense_gemm", "sgemm.py") in done.stderr
    assert COMMIT in done.stderr
    assert not marker.exists()


def test_an_unknown_example_is_named():
    done = _run("--only", "nope.py", "--cutlass", ROOT)
    assert done.returncode != 0
    assert "unknown example 'nope.py'" in done.stderr and "sgemm.py" in done.stderr


def test_an_example_runs_from_its_upstream_path_cold_then_warm(tmp_path):
    """A stand-in elementwise_add.py at its upstream path runs twice (cold, warm) as
    ``__main__`` under cuforge.cute.enable(), with the example's own arguments."""
    pytest.importorskip("cutlass.cute", reason="the CuTe DSL is not installed")
    log = tmp_path / "argv.log"
    body = (
        "import json, sys\n"
        "import cuforge.cute.cache\n"
        f"with open({str(log)!r}, 'a') as f:\n"
        "    f.write(json.dumps([__name__, __file__, sys.argv[1:]]) + '\\n')\n"
    )
    cutlass = _checkout(
        tmp_path / "cutlass", "ampere/kernel/elementwise/elementwise_add.py", body=body
    )
    out = tmp_path / "out.json"
    done = _run(
        "--cutlass",
        cutlass,
        "--only",
        "elementwise_add.py",
        "--json",
        str(out),
        "--cache-dir",
        str(tmp_path / "cache"),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    path = os.path.join(cutlass, EXAMPLES, "ampere", "kernel", "elementwise", "elementwise_add.py")
    runs = [json.loads(line) for line in log.read_text().splitlines()]
    args = ["--M", "256", "--N", "256", "--warmup_iterations", "0", "--iterations", "1"]
    assert runs == [["__main__", path, args]] * 2
    result = json.loads(out.read_text())
    (row,) = result["rows"]
    assert row["example"] == "ampere/kernel/elementwise/elementwise_add.py"
    assert row["path"] == path and result["cutlass"] == cutlass
    assert row["cold"]["ok"] and row["warm"]["ok"] and row["warm"]["pipeline"] == 0
