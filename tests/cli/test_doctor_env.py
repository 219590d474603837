"""`cuforge doctor`, `cuforge env`, and the command line's general behavior, as subprocesses;
the doctor's single rows in process (`doctor.run` with `--check`'s selection)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys

import pytest

from cuforge.cli import doctor
from tests.cli.conftest import base_env
from tests.conftest import GPU_VISIBLE

#: Checks that need only the CPU and the Python environment: they pass on CI's box.
CPU_CHECKS = ("ninja", "build_jobs", "nvrtc", "cache.dir", "cache.size", "cache.integrity")


def _rows(doc: dict) -> dict[str, dict]:
    return {c["id"]: c for c in doc["checks"]}


def _bare_path(tmp_path) -> str:
    """A PATH with nothing but an empty directory: no ninja, no nvcc wrapper, no ccache."""
    empty = tmp_path / "bin"
    empty.mkdir(exist_ok=True)
    return str(empty)


def _no_ninja_module(tmp_path) -> str:
    """A PYTHONPATH entry whose `ninja` package cannot be imported (as if not installed)."""
    stub = tmp_path / "stubs" / "ninja"
    stub.mkdir(parents=True, exist_ok=True)
    (stub / "__init__.py").write_text("raise ImportError('ninja is not installed')\n")
    return str(tmp_path / "stubs")


@pytest.fixture
def doctor_env(cache, monkeypatch):
    """This process's environment as the CLI's children get it (:func:`base_env`): none of
    the caller's cuforge or arch knobs, this test's cache."""
    env = base_env(cache["dir"])
    for name in list(os.environ):
        if name not in env:
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return monkeypatch


def _doctor(capsys, *ids: str, json_: bool = True):
    """`cuforge doctor --check ID ... [--json]` in process: the JSON document (with
    ``_rc``) or the printed lines and the exit code."""
    capsys.readouterr()
    rc = doctor.run(argparse.Namespace(json=json_, checks=list(ids)))
    out = capsys.readouterr().out
    if not json_:
        return out, rc
    doc = json.loads(out)
    doc["_rc"] = rc
    return doc


# -- doctor ---------------------------------------------------------------------------


def test_doctor_json_on_this_machine(cli):
    doc = cli.json("doctor", ok=False)
    assert doc["command"] == "doctor"
    rows = _rows(doc)
    statuses = {c["status"] for c in doc["checks"]}
    assert statuses <= {"PASS", "WARN", "FAIL", "SKIP"}
    for check in doc["checks"]:
        assert set(check) == {"id", "title", "status", "detail", "fix", "data"}
        assert "could not run this check" not in check["detail"], check
        if check["status"] in ("WARN", "FAIL"):
            assert check["fix"], check  # every problem comes with a fix
    # The exit code follows the FAIL rule exactly.
    failed = [c for c in doc["checks"] if c["status"] == "FAIL"]
    assert doc["_rc"] == (1 if failed else 0)
    assert doc["ok"] is (not failed)
    assert doc["summary"] == {
        s.lower(): sum(1 for c in doc["checks"] if c["status"] == s)
        for s in ("PASS", "WARN", "FAIL", "SKIP")
    }
    for check_id in CPU_CHECKS:
        assert rows[check_id]["status"] == "PASS", rows[check_id]
    # the cache's 8 entries, and the doctor's probe kernels (a kernel and a manifest each),
    # compiled into it by the nvrtc.headers_compile check that runs before the cache rows
    probes = 2 * len(rows["nvrtc.headers_compile"]["data"].get("sources", {}))
    assert rows["cache.size"]["data"]["entries"] == 8 + probes
    assert rows["cache.integrity"]["data"] == {"checked": 8 + probes, "corrupt": 0}
    if not GPU_VISIBLE:
        assert doc["gpus"] == []
        assert rows["gpu"]["status"] == "SKIP" and "no GPU" in rows["gpu"]["detail"]
        assert {"gpu", "gpu.arch", "gpu.driver"} <= set(doc["skipped"])
        assert rows["gpu.arch"]["status"] == rows["gpu.driver"]["status"] == "SKIP"


def test_doctor_human_output_says_no_gpu_and_what_it_skipped(cli):
    done = cli("doctor")
    assert done.returncode in (0, 1)
    lines = done.stdout.splitlines()
    assert any(line.startswith("PASS  ninja") for line in lines)
    summary = lines[-1]
    assert "passed" in summary and "failed" in summary and "skipped" in summary
    if not GPU_VISIBLE:
        assert "no GPU" in done.stdout
        assert "gpu.arch" in summary and "gpu.driver" in summary
    assert done.returncode == (1 if any(line.startswith("FAIL") for line in lines) else 0)


def test_doctor_reports_damaged_entries(doctor_env, cache, capsys):
    for dirpath, _dirs, files in os.walk(os.path.join(cache["dir"], "v1", "entries")):
        for name in files:
            if name == cache["keys"]["saxpy.cu"]:
                with open(os.path.join(dirpath, name), "r+b") as f:
                    f.truncate(10)
    row = _rows(_doctor(capsys, "cache.integrity"))["cache.integrity"]
    assert row["status"] == "WARN" and row["data"]["corrupt"] == 1
    assert "verify --repair" in row["fix"]


def test_doctor_without_ninja_on_path(cli, tmp_path, doctor_env, capsys):
    # The pip package still has ninja: a WARN that says where and how to put it on PATH.
    doctor_env.setenv("PATH", _bare_path(tmp_path))
    row = _rows(_doctor(capsys, "ninja"))["ninja"]
    assert row["status"] == "WARN" and "not on PATH" in row["detail"]
    assert row["fix"].startswith("export PATH=")
    # No ninja anywhere: a FAIL, and the exit code says so.
    env = {
        "PATH": _bare_path(tmp_path),
        "PYTHONPATH": _no_ninja_module(tmp_path) + os.pathsep + base_env("")["PYTHONPATH"],
    }
    done = cli("doctor", "--check", "ninja", env=env)
    assert done.returncode == 1
    line = next(ln for ln in done.stdout.splitlines() if "ninja" in ln and ln.startswith("FAIL"))
    assert "not installed" in line
    assert "pip install ninja" in done.stdout


@pytest.mark.parametrize(
    ("value", "status", "words"),
    [
        ("banana", "FAIL", "cannot be read"),
        ("3.5", "FAIL", "cannot build sm_35"),
        ("7.5;8.0;8.6;8.9;9.0;10.0", "WARN", "6 archs"),
        ("9.0", "PASS", "9.0"),
    ],
)
def test_doctor_checks_the_arch_list(doctor_env, capsys, value, status, words):
    if GPU_VISIBLE and status == "PASS":
        pytest.skip("on a GPU box 9.0 may not match the visible GPU")
    doctor_env.setenv("TORCH_CUDA_ARCH_LIST", value)
    doc = _doctor(capsys, "arch_list.TORCH_CUDA_ARCH_LIST")
    row = _rows(doc)["arch_list.TORCH_CUDA_ARCH_LIST"]
    assert row["status"] == status, row
    assert words in row["detail"]
    if status == "FAIL":
        assert doc["_rc"] == 1 and row["fix"].startswith("export TORCH_CUDA_ARCH_LIST=")


def test_doctor_human_fail_line_for_a_wrong_arch_list(doctor_env, capsys):
    doctor_env.setenv("TORCH_CUDA_ARCH_LIST", "sm_xx")
    stdout, rc = _doctor(capsys, "arch_list.TORCH_CUDA_ARCH_LIST", json_=False)
    assert rc == 1
    lines = stdout.splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.startswith("FAIL  TORCH_CUDA_ARCH_LIST"))
    assert "cannot be read" in " ".join(ln.strip() for ln in lines[i : i + 3])
    # the row's detail wraps (80 columns); its fix line follows within the row's block
    block = [lines[i]]
    for ln in lines[i + 1 :]:
        if not ln.startswith("    "):
            break
        block.append(ln)
    assert any("fix: export TORCH_CUDA_ARCH_LIST=" in ln for ln in block[1:]), block


def test_doctor_flags_a_wrong_cuda_home_and_bad_max_jobs(doctor_env, capsys, tmp_path):
    doctor_env.setenv("CUDA_HOME", str(tmp_path / "no-cuda"))
    doctor_env.setenv("MAX_JOBS", "512")
    doc = _doctor(capsys, "cuda_home", "build_jobs")
    rows = _rows(doc)
    assert (
        rows["cuda_home"]["status"] == "FAIL"
        and "not a CUDA toolkit" in rows["cuda_home"]["detail"]
    )
    assert rows["build_jobs"]["status"] == "WARN" and "MAX_JOBS=512" in rows["build_jobs"]["detail"]
    assert doc["_rc"] == 1


def test_doctor_works_without_torch(cache):
    # `python -S`: no site-packages, so no torch (nor any other optional package).
    done = subprocess.run(
        [sys.executable, "-S", "-m", "cuforge.cli.main", "doctor", "--json"],
        env=base_env(cache["dir"]),
        capture_output=True,
        text=True,
        check=False,
    )
    doc = json.loads(done.stdout)
    rows = _rows(doc)
    assert rows["torch"]["status"] == "SKIP" and "not installed" in rows["torch"]["detail"]
    # never a FAIL (nor a WARN) without torch: those headers matter only for torch extensions
    assert rows["cuda_headers"]["status"] == "SKIP" and "torch" in rows["cuda_headers"]["detail"]
    assert all("could not run this check" not in c["detail"] for c in doc["checks"])
    assert done.returncode == (1 if doc["summary"]["fail"] else 0)


# -- env ------------------------------------------------------------------------------


def _bash() -> str:
    path = shutil.which("bash")
    if path is None:
        pytest.skip("no bash")
    return path


def test_env_is_evaluable_in_bash(cli, cache):
    cmd = (
        f'eval "$({sys.executable} -m cuforge.cli.main env)" && '
        'echo "MAX_JOBS=$MAX_JOBS" && echo "CACHE=$CUFORGE_CACHE_DIR" && echo "HOME=$CUDA_HOME"'
    )
    done = subprocess.run(
        [_bash(), "-c", cmd],
        env=base_env(cache["dir"]),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = dict(line.split("=", 1) for line in done.stdout.splitlines())
    assert int(out["MAX_JOBS"]) >= 1
    assert out["CACHE"] == cache["dir"]


def test_env_json_and_explain(cli, cache):
    doc = cli.json("env")
    assert doc["command"] == "env"
    assert set(doc["vars"]) >= {
        "TORCH_CUDA_ARCH_LIST",
        "MAX_JOBS",
        "NVCC_THREADS",
        "CUFORGE_CACHE_DIR",
    }
    assert doc["vars"]["CUFORGE_CACHE_DIR"] == cache["dir"]
    assert int(doc["vars"]["MAX_JOBS"]) <= doc["resources"]["cores"]
    assert set(doc["explain"]) == set(doc["vars"])
    assert all(doc["explain"].values())
    explained = cli("env", "--explain")
    assert "# MAX_JOBS: " in explained.stdout and "per compile job" in explained.stdout


def test_env_fish_syntax(cli):
    done = cli("env", "--shell", "fish")
    assert done.returncode == 0
    lines = [ln for ln in done.stdout.splitlines() if not ln.startswith("#")]
    assert lines and all(ln.startswith("set -gx ") and ln.endswith(";") for ln in lines)
    fish = shutil.which("fish")
    if fish:
        check = subprocess.run(
            [fish, "-n"], input=done.stdout, capture_output=True, text=True, check=False
        )
        assert check.returncode == 0, check.stderr


def test_env_without_a_gpu_uses_the_configured_arch(cli):
    if GPU_VISIBLE:
        pytest.skip("a visible GPU decides the arch")
    doc = cli.json("env", env={"TORCH_CUDA_ARCH_LIST": "8.0;9.0"})
    assert doc["vars"]["TORCH_CUDA_ARCH_LIST"] == "8.0;9.0"
    assert doc["vars"]["CUFORGE_ARCH"] == "sm_90"
    assert doc["findings"] == [] or all(f["status"] != "FAIL" for f in doc["findings"])
    nothing = cli.json("env")
    assert nothing["vars"]["TORCH_CUDA_ARCH_LIST"] is None
    assert any(
        "neither CUFORGE_ARCH nor TORCH_CUDA_ARCH_LIST" in f["message"] for f in nothing["findings"]
    )


def test_env_on_a_faked_environment_warns_on_stderr(cli, tmp_path):
    done = cli("env", env={"TORCH_CUDA_ARCH_LIST": "banana", "PATH": _bare_path(tmp_path)})
    # a FAIL finding is a problem found: exit code 1 (issue 11; it was 0), exports still print
    assert done.returncode == 1
    assert "cuforge env: FAIL TORCH_CUDA_ARCH_LIST='banana' cannot be read" in done.stderr
    assert "cuforge env: WARN ninja is not on PATH" in done.stderr
    # stdout stays a clean list of exports: nothing from the warnings leaks into the eval.
    for line in done.stdout.splitlines():
        assert line.startswith(("export ", "# ")), line
    assert "banana" not in done.stdout
    doc = cli.json("env", ok=False, env={"TORCH_CUDA_ARCH_LIST": "banana", "MAX_JOBS": "64"})
    assert doc["_rc"] == 1 and doc["ok"] is False
    statuses = {(f["status"], f["message"].split(" ")[0]) for f in doc["findings"]}
    assert ("FAIL", "TORCH_CUDA_ARCH_LIST='banana'") in statuses
    assert ("WARN", "MAX_JOBS=64") in statuses


# -- the command line in general ------------------------------------------------------


def test_console_script_and_version(cli):
    script = os.path.join(os.path.dirname(sys.executable), "cuforge")
    if not os.path.exists(script):
        pytest.skip("cuforge is not installed as a console script in this environment")
    done = subprocess.run([script, "--version"], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and done.stdout.startswith("cuforge ")


def test_usage_errors_go_to_stderr_with_exit_2(cli):
    done = cli()
    assert done.returncode == 2 and "usage" in done.stderr.lower()
    done = cli("cache")
    assert done.returncode == 2 and "stats" in done.stderr
    done = cli("cache", "frobnicate")
    assert done.returncode == 2 and "invalid choice" in done.stderr


def _run_on_a_terminal(args: list[str], env: dict[str, str]) -> str:
    """Run the CLI with stdout and stderr on a pseudo-terminal; return what it drew."""
    import pty

    pid, fd = pty.fork()
    if pid == 0:  # child
        try:
            os.execve(sys.executable, [sys.executable, "-m", "cuforge.cli.main", *args], env)
        finally:
            os._exit(127)
    chunks = []
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    os.waitpid(pid, 0)
    os.close(fd)
    return b"".join(chunks).decode(errors="replace")


def test_rich_on_a_terminal_plain_under_ci(cache):
    env = base_env(cache["dir"], TERM="xterm-256color", COLUMNS="120")
    env.pop("CI")
    env.pop("NO_COLOR", None)
    drawn = _run_on_a_terminal(["cache", "ls"], env)
    assert "\x1b[" in drawn or "━" in drawn or "┃" in drawn  # a rich table
    env["CI"] = "true"
    plain = _run_on_a_terminal(["cache", "ls"], env)
    assert "\x1b[" not in plain and "┃" not in plain
    assert "saxpy.cu" in plain


def test_json_output_is_one_parseable_document(cli):
    for args in (
        ("cache", "stats"),
        ("cache", "ls"),
        ("cache", "verify"),
        ("env",),
        ("cache", "explain"),
    ):
        done = cli(*args, "--json")
        assert done.returncode == 0, (args, done.stderr)
        assert json.loads(done.stdout)["schema"] == 1


# -- the cache dir is a trust boundary ------------------------------------------------


CACHE_ROWS = ("cache.dir", "cache.size", "cache.hits", "cache.integrity")


def test_doctor_fails_a_group_or_world_writable_cache_dir_and_prints_the_fix(
    doctor_env, capsys, cache
):
    os.chmod(cache["dir"], 0o777)
    doc = _doctor(capsys, *CACHE_ROWS)
    rows = _rows(doc)
    row = rows["cache.dir"]
    assert row["status"] == "FAIL" and doc["_rc"] == 1
    assert "writable by group and others" in row["detail"]
    assert row["fix"] == f"chmod -R go-w {cache['dir']}"  # the fix covers the whole tree
    # nothing is read from an untrusted dir: the checks that would read it are skipped
    for check_id in ("cache.size", "cache.hits", "cache.integrity"):
        assert rows[check_id]["status"] == "SKIP"
    stdout, _ = _doctor(capsys, *CACHE_ROWS, json_=False)
    assert f"fix: chmod -R go-w {cache['dir']}" in stdout
    # the fix works
    os.chmod(cache["dir"], 0o700)
    assert _rows(_doctor(capsys, "cache.dir"))["cache.dir"]["status"] == "PASS"
    # a fan-out dir deep under it is checked too, as the runtime checks it
    deep = os.path.join(cache["dir"], "v1", "entries", "ab", "cd")
    os.makedirs(deep, mode=0o700, exist_ok=True)
    os.chmod(deep, 0o777)
    row = _rows(_doctor(capsys, "cache.dir"))["cache.dir"]
    assert row["status"] == "FAIL" and deep in row["detail"]
    assert row["fix"] == f"chmod -R go-w {cache['dir']}"
    os.chmod(deep, 0o700)


def test_doctor_fails_a_cache_subdir_owned_by_another_user(doctor_env, capsys, cache):
    if os.geteuid() != 0:
        pytest.skip("needs root to chown a directory to another user")
    sub = os.path.join(cache["dir"], "v1")
    assert os.path.isdir(sub)
    os.chown(sub, 65534, 65534)
    row = _rows(_doctor(capsys, "cache.dir"))["cache.dir"]
    assert row["status"] == "FAIL"
    assert sub in row["detail"] and "not by the current user" in row["detail"]
    root = cache["dir"]  # the fix covers the whole tree, sub included
    assert row["fix"] == f"chown -R $(id -un) {root} && chmod -R go-w {root}"
