"""Issue 13, sections 2 and 6: ``cuforge build`` makes exactly the entries later JIT calls
hit, skips what is cached, reports failures without stopping the others, and keeps the
CLI's exit-code / JSON contract."""

from __future__ import annotations

import json
import sys

import pytest

from tests.aot.conftest import cli, jit_calls, variant_calls

BLOCKS = (64, 128, 256)
TYPES = ("float", "double", "int", "long")
ARCHS = ("sm_80", "sm_90")

BIG = """\
arch = ["sm_80", "sm_90"]
[[kernel]]
source = "red.cu"
include_dirs = ["include"]
name_expressions = ["blk<{BLOCK}, {T}>"]
defines = { TILE = "{BLOCK}" }
[kernel.grid]
BLOCK = [64, 128, 256]
T = [%s]
"""


def big_manifest(project, types=TYPES) -> None:
    (project / "cuforge.toml").write_text(BIG % ", ".join(f'"{t}"' for t in types))


def doc(done) -> dict:
    assert done.stdout, done.stderr
    return json.loads(done.stdout)


def test_24_variants_with_2_jobs_then_a_fresh_process_compiles_nothing(project):
    big_manifest(project)
    done = cli(project, "build", "--jobs", "2", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    report = doc(done)
    assert report["command"] == "build" and report["ok"] is True
    assert report["total"] == 24 and report["built"] == 24 and report["hits"] == 0
    assert report["failed"] == 0 and report["jobs"] == 2 and report["executor"] == "local"

    # the JIT calls a user makes later, from the project dir, in a fresh process
    out = jit_calls(project, variant_calls(BLOCKS, TYPES, ARCHS))
    assert out["errors"] == []
    assert out["counters"]["compiles"] == 0
    assert out["sources"] == ["disk"] * 24

    # a second build: every variant is a hit, nothing is rebuilt
    again = doc(cli(project, "build", "--jobs", "2", "--json"))
    assert again["hits"] == 24 and again["built"] == 0
    assert all(r["hit"] for r in again["results"])


def test_one_failing_variant_fails_the_build_and_the_others_are_built(project):
    big_manifest(project, types=("float", "no_such_type"))
    done = cli(project, "build", "--jobs", "2")
    assert done.returncode == 1
    # each failure's compiler log is printed (3 blocks x 2 archs fail)
    assert done.stderr.count("no_such_type") >= 6, done.stderr
    assert "failed:" in done.stderr
    assert "failed" in done.stdout  # the summary table

    report = doc(cli(project, "build", "--jobs", "2", "--json"))
    assert report["ok"] is False and report["failed"] == 6 and report["hits"] == 6
    failed = [r for r in report["results"] if not r["ok"]]
    assert all("no_such_type" in r["label"] and r["log"] for r in failed)

    out = jit_calls(project, variant_calls(BLOCKS, ("float",), ARCHS))
    assert out["counters"]["compiles"] == 0 and out["errors"] == []


def test_strict_build_compiles_nothing_and_names_what_is_missing(project):
    done = cli(project, "build", "--strict", "--json")
    assert done.returncode == 1
    report = doc(done)
    assert report["failed"] == 8 and report["built"] == 0
    log = report["results"][0]["log"]
    assert "strict mode" in log and "red.cu" in log and "sm_80" in log
    assert "blk<128, float>" in log and "[[kernel]]" in log
    assert cli(project, "build", "--jobs", "1").returncode == 0
    assert cli(project, "build", "--strict").returncode == 0


def test_plain_progress_lines_when_forced_off_a_terminal(project):
    done = cli(project, "build", "--jobs", "1", CUFORGE_PROGRESS="1")
    assert done.returncode == 0, done.stderr
    assert "[8/8]" in done.stderr and ": built" in done.stderr
    quiet = cli(project, "build", "--jobs", "1")
    assert "[1/8]" not in quiet.stderr  # not a terminal, not forced: no progress


@pytest.mark.parametrize(
    ("args", "code", "kind", "words"),
    [
        (("build", "--jobs", "0"), 2, "usage", "--jobs"),
        (("build", "--jobs", "many"), 2, "usage", "--jobs"),
        (("build", "--executor", "dask"), 2, "usage", "--executor"),
        (("build", "nope/"), 1, "ManifestError", "no such manifest"),
        (("bundle", "ls", "missing.cfb"), 1, "BundleError", "missing.cfb"),
        (("bundle", "install", "missing.cfb"), 1, "BundleError", "missing.cfb"),
    ],
)
def test_cli_errors_keep_the_exit_code_and_json_contract(project, args, code, kind, words):
    done = cli(project, *args, "--json")
    assert done.returncode == code, done.stderr
    out = json.loads(done.stdout)
    assert out["schema"] == 1 and out["ok"] is False
    assert out["error"]["kind"] == kind, out
    assert words in out["error"]["message"]
    assert out["command"] == " ".join(a for a in args[:2] if not a.startswith("-")).replace(
        " nope/", ""
    ).replace(" 0", "")


def test_a_bad_manifest_line_reaches_the_cli(project):
    (project / "cuforge.toml").write_text('[[kernel]]\nsource = "red.cu"\ncolour = 1\n')
    done = cli(project, "build")
    assert done.returncode == 1
    assert "cuforge.toml:3: unknown key 'colour'" in done.stderr


def test_ray_executor_missing_is_a_clear_error(monkeypatch):
    from cuforge.aot.build import make_executor
    from cuforge.base.errors import CuforgeError

    monkeypatch.setitem(sys.modules, "cuforge.aot.ray_executor", None)  # as if not installed
    with pytest.raises(CuforgeError, match=r"pip install 'cuforge\[ray\]'"):
        make_executor("ray", 2)
    with pytest.raises(ValueError, match="'local' or 'ray'"):
        make_executor("dask", 2)


def test_jobs_default_is_what_cuforge_env_recommends(project):
    from cuforge.aot.build import build
    from cuforge.cli.env import recommended_jobs

    report = build(str(project), bundle=None)
    assert report.jobs == recommended_jobs()[0]
    assert "cuforge env" in report.jobs_why
    assert report.built == 8 and report.ok
