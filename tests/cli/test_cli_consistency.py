"""Issue 11, section 5: one CLI contract for every command.

* under ``--json`` every failure prints one JSON error document on stdout;
* exit codes: 0 ok, 1 failure or problems found, 2 usage (a bad flag or flag value);
* ``doctor`` fits 80 columns and never splits a ``fix:`` command;
* doctor's new checks (CUFORGE_ARCH vs TORCH_CUDA_ARCH_LIST, NVRTC vs headers, headers
  that compile);
* CLI errors name flags (``--arch``), not Python keyword arguments (``arch=``).

Every command runs as ``python -m cuforge ...`` in a child process against a real cache.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cuforge.cli import doctor, output
from cuforge.toolchain.facts import identity_headers_version
from tests.cli.conftest import SAXPY, base_env
from tests.conftest import GPU_VISIBLE


def run(cache_dir: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cuforge", *args],
        env=base_env(cache_dir, **env),
        capture_output=True,
        text=True,
        input="",
        timeout=300,
        check=False,
    )


def error_doc(done: subprocess.CompletedProcess, command: str | None, kind: str | None = None):
    """stdout is exactly one JSON error document of ``command``."""
    doc = json.loads(done.stdout)
    assert doc["schema"] == 1 and doc["ok"] is False, doc
    assert doc["command"] == command, doc
    assert isinstance(doc["error"]["message"], str) and doc["error"]["message"], doc
    if kind is not None:
        assert doc["error"]["kind"] == kind, doc
    return doc


# -- JSON errors and exit codes -------------------------------------------------------


def test_cache_show_unknown_key_prints_a_json_error(cache):
    done = run(cache["dir"], "cache", "show", "zzz", "--json")
    assert done.returncode == 1, done.stderr
    doc = error_doc(done, "cache show", "failure")
    assert "zzz" in doc["error"]["message"]
    assert "zzz" in done.stderr  # the person reading stderr still sees it


def test_cache_import_of_a_missing_bundle_prints_a_json_error(cache, tmp_path):
    done = run(cache["dir"], "cache", "import", str(tmp_path / "bad"), "--json")
    assert done.returncode == 1, done.stderr
    doc = error_doc(done, "cache import")
    assert "no such bundle" in doc["error"]["message"]


def test_cache_import_of_garbage_prints_a_json_error(cache, tmp_path):
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(b"not an archive at all")
    done = run(cache["dir"], "cache", "import", str(bad), "--json")
    assert done.returncode == 1, done.stderr
    error_doc(done, "cache import")


@pytest.mark.parametrize(
    ("args", "command", "words"),
    [
        (("cache", "prune", "--max-bytes", "5X"), "cache prune", "--max-bytes"),
        (("cache", "prune", "--older-than", "soon"), "cache prune", "--older-than"),
        (("cache", "ls", "--older-than", "soon"), "cache ls", "--older-than"),
        (("cache", "import", "x.tar.gz", "--max-member-bytes", "big"), "cache import", "big"),
        (("cache", "show"), "cache show", "key"),
        (("cache", "nosuch"), "cache nosuch", "invalid choice"),
        (("doctor", "--bogus"), "doctor", "--bogus"),
        (("cache", "ls", "--bogus"), "cache ls", "--bogus"),
        (("build", "--nope"), "build", "--nope"),
        (("compile", "x.cu", "-D", "=1"), "compile", "-D"),
        (("compile", "x.cu", "--backend", "clang"), "compile", "--backend"),
    ],
)
def test_usage_errors_exit_2_with_a_json_document(cache, args, command, words):
    done = run(cache["dir"], *args, "--json")
    assert done.returncode == 2, (done.stdout, done.stderr)
    doc = error_doc(done, command, "usage")
    assert words in doc["error"]["message"], doc
    # without --json: the same exit code, the message on stderr, nothing on stdout
    plain = run(cache["dir"], *args)
    assert plain.returncode == 2 and words in plain.stderr and plain.stdout == ""


@pytest.mark.parametrize(
    ("args", "usage"),
    [
        (("cache", "ls", "--bogus"), "usage: cuforge cache ls "),
        (("cache", "explain", "--bogus"), "usage: cuforge cache explain "),
        (("build", "--nope"), "usage: cuforge build "),
        (("bundle", "ls", "x.cfb", "--nope"), "usage: cuforge bundle ls "),
        (("compile", "x.cu", "--nope"), "usage: cuforge compile "),
    ],
)
def test_an_unknown_flag_prints_the_subcommands_usage(cache, args, usage):
    done = run(cache["dir"], *args)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(usage), done.stderr
    command = usage.removeprefix("usage: ").strip()
    assert f"{command}: error: unrecognized arguments: {args[-1]}" in done.stderr


def test_bench_build_is_no_longer_a_command(cache):
    """The extension-build benchmark is bench/build_extension.py, not part of the CLI."""
    done = run(cache["dir"], "bench-build", "--help")
    assert done.returncode == 2 and "invalid choice: 'bench-build'" in done.stderr
    assert "bench-build" not in run(cache["dir"], "--help").stdout


def test_prune_bad_size_is_usage_not_failure(cache):
    done = run(cache["dir"], "cache", "prune", "--max-bytes", "5X")
    assert done.returncode == 2
    assert "--max-bytes '5X'" in done.stderr and "cannot read size" in done.stderr


def test_env_with_an_unreadable_arch_exits_1_and_stays_evaluable(cache):
    done = run(cache["dir"], "env", CUFORGE_ARCH="bogus")
    assert done.returncode == 1
    assert "FAIL" in done.stderr and "CUFORGE_ARCH" in done.stderr
    assert "export MAX_JOBS=" in done.stdout  # the exports still print
    doc = json.loads(run(cache["dir"], "env", "--json", CUFORGE_ARCH="bogus").stdout)
    assert doc["ok"] is False and any(f["status"] == "FAIL" for f in doc["findings"])
    good = run(cache["dir"], "env", CUFORGE_ARCH="sm_90")
    assert good.returncode == 0, good.stderr


def test_successful_commands_still_exit_0_with_their_documents(cache):
    for args in (("cache", "stats"), ("cache", "ls"), ("env",)):
        done = run(cache["dir"], *args, "--json", CUFORGE_ARCH="sm_90")
        assert done.returncode == 0, done.stderr
        doc = json.loads(done.stdout)
        assert doc["schema"] == 1 and "error" not in doc


def test_a_failing_command_with_its_own_document_prints_only_that(cache, tmp_path):
    # `compile` reports failures per file in its own document: no second document
    done = run(cache["dir"], "compile", str(tmp_path / "none.cu"), "--arch", "sm_90", "--json")
    assert done.returncode == 1
    doc = json.loads(done.stdout)  # exactly one document: json.loads rejects extra data
    assert doc["command"] == "compile" and doc["ok"] is False and doc["failed"] == 1


# -- wording --------------------------------------------------------------------------


@pytest.mark.skipif(GPU_VISIBLE, reason="with a GPU the arch comes from it")
def test_compile_without_an_arch_names_the_flag(cache, tmp_path):
    src = tmp_path / "saxpy.cu"
    src.write_text(SAXPY)
    done = run(cache["dir"], "compile", str(src))
    assert done.returncode == 1
    assert "--arch" in done.stderr, done.stderr
    assert "arch=" not in done.stderr and "compile()" not in done.stderr, done.stderr
    doc = json.loads(run(cache["dir"], "compile", str(src), "--json").stdout)
    message = doc["results"][0]["error"]["message"]
    assert "--arch" in message and "arch=" not in message


def test_cli_wording_maps_keyword_arguments_to_flags():
    text = output.cli_wording(
        "Pass arch='sm_90' (or '9.0', '90') to compile(), or set CUFORGE_ARCH=sm_90; "
        "bad options=('-x',), include_dirs=['a'], defines={} "
        "(-gencode=arch=compute_90 and -arch=sm_90 stay)"
    )
    assert "Pass --arch sm_90 (or '9.0', '90'), or set CUFORGE_ARCH=sm_90" in text
    assert "--option (" in text and "-I [" in text and "-D {" in text
    assert "-gencode=arch=compute_90" in text and "-arch=sm_90" in text
    assert "options=" not in text and "include_dirs=" not in text and "compile()" not in text


# -- doctor layout --------------------------------------------------------------------

LONG_FIX = (
    "pip install --force-reinstall nvidia-cuda-runtime nvidia-cuda-cccl nvidia-cuda-nvrtc  "
    "(cuforge depends on both; or install the CUDA toolkit and export CUDA_HOME=<its root>)"
)


def _render(rows, capsys) -> list[str]:
    summary = {s.lower(): sum(1 for r in rows if r.status == s) for s in doctor.STATUSES}
    doctor.render(rows, summary, [])
    return capsys.readouterr().out.splitlines()


def test_doctor_plain_output_keeps_a_long_fix_whole_and_indented(capsys, monkeypatch):
    monkeypatch.setenv("CI", "true")  # plain output, as when piped
    rows = [
        doctor.Check("ninja", "ninja", "PASS", "ninja 1.11.1 (/usr/bin/ninja)"),
        doctor.Check(
            "nvrtc.headers_compile",
            "fp16/bf16/CUB compile",
            "FAIL",
            "cuda_fp16.h, cuda_bf16.h, CUB kernels do not compile with NVRTC (sm_90): "
            "catastrophic error: cannot open source file cuda_fp16.h, no directories in "
            "search list",
            LONG_FIX,
        ),
        doctor.Check(
            "arch_list.TORCH_CUDA_ARCH_LIST",
            "TORCH_CUDA_ARCH_LIST",
            "FAIL",
            "cannot be read",
            "export TORCH_CUDA_ARCH_LIST='9.0'",
        ),
    ]
    lines = _render(rows, capsys)
    command = LONG_FIX.partition("  (")[0]
    body = [ln for ln in lines if ln and not ln[0].isdigit()]  # all but the summary
    for ln in body:
        assert len(ln) <= 80 or ln.strip() == f"fix: {command}", ln
        # a continuation line never starts at column 0
        assert ln.startswith(("PASS  ", "WARN  ", "FAIL  ", "SKIP  ", "    ")), ln
    # the long command is on one line of its own, indented, whole, after "fix: "
    mine = [ln for ln in lines if command in ln]
    assert len(mine) == 1 and mine[0].strip() == f"fix: {command}", mine
    assert mine[0].startswith("      fix: ")
    i = lines.index(mine[0])
    # its note follows on lines indented under the command, not glued into it
    note_lines = []
    for ln in lines[i + 1 :]:
        if not ln.startswith(" " * 11):
            break
        note_lines.append(ln.strip())
    note = " ".join(note_lines)
    assert note == LONG_FIX.partition("  ")[2], note
    # a short fix stays on the line after its row, "fix: COMMAND", under the detail
    j = next(k for k, ln in enumerate(lines) if ln.startswith("FAIL  TORCH_CUDA_ARCH_LIST"))
    assert lines[j + 1].strip() == "fix: export TORCH_CUDA_ARCH_LIST='9.0'"
    assert lines[j + 1].index("fix:") == lines[j].index("cannot be read")


def test_doctor_layout_never_splits_a_fix_command():
    for fix in (LONG_FIX, "export CUDA_INC_PATH=" + "/very/long/path" * 8, "unset X"):
        rows = [doctor.Check("x", "a title", "WARN", "word " * 40, fix)]
        texts = [text for _, text in doctor.layout(rows)]
        command = fix.partition("  (")[0]
        assert any(t.strip() == f"fix: {command}" for t in texts), texts
        for t in texts:
            assert len(t) + len("WARN  ") <= 80 or t.strip() == f"fix: {command}", t
            assert t.startswith((" ", "fix: ", "a title")), t


def test_doctor_wraps_a_prose_fix_without_splitting_a_backquoted_command():
    fix = (
        "start the server or fix the URL in CUFORGE_REMOTE, then run "
        "`cuforge cache push --remote URL` again (on a slow "
        "network, raise CUFORGE_REMOTE_CONNECT_TIMEOUT)"
    )
    rows = [doctor.Check("remote", "remote cache", "FAIL", "unreachable", fix)]
    texts = [text for _, text in doctor.layout(rows)]
    assert all(len(t) + len("FAIL  ") <= 80 for t in texts), texts
    assert any("`cuforge cache push --remote URL`" in t for t in texts)
    assert " ".join(t.strip() for t in texts[1:]) == f"fix: {fix}"


def test_doctor_output_fits_80_columns(cache):
    done = run(cache["dir"], "doctor", CUFORGE_ARCH="sm_90")
    assert done.returncode in (0, 1)
    lines = done.stdout.splitlines()
    for ln in lines[:-1]:
        # whole fix commands and long paths may pass 80 columns; nothing else does
        assert len(ln) <= 80 or ln.strip().startswith("fix: ") or "/" in ln.split()[-1], ln
        assert not ln or ln.startswith(("PASS  ", "WARN  ", "FAIL  ", "SKIP  ", "    ")), ln


# -- new doctor checks ----------------------------------------------------------------


def _rows(doc: dict) -> dict:
    return {r["id"]: r for r in doc["checks"]}


def _check(monkeypatch, check_id: str, **env: str) -> dict:
    """The rows of one doctor check, run in this process (``--check check_id``) with the
    arch variables set to ``env`` only."""
    for name in ("CUFORGE_ARCH", "TORCH_CUDA_ARCH_LIST"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return {r.id: r.as_dict() for r in doctor.run_checks([check_id])}


def test_doctor_warns_when_cuforge_arch_and_torch_disagree(monkeypatch):
    rows = _check(
        monkeypatch, "arch_list.agreement", CUFORGE_ARCH="sm_80", TORCH_CUDA_ARCH_LIST="9.0"
    )
    row = rows["arch_list.agreement"]
    assert row["status"] == "WARN", row
    assert "CUFORGE_ARCH wins" in row["detail"] and "TORCH_CUDA_ARCH_LIST decides" in row["detail"]
    assert row["data"] == {"CUFORGE_ARCH": ["sm_80"], "TORCH_CUDA_ARCH_LIST": ["sm_90"]}
    same = _check(
        monkeypatch, "arch_list.agreement", CUFORGE_ARCH="sm_90", TORCH_CUDA_ARCH_LIST="9.0"
    )
    assert same["arch_list.agreement"]["status"] == "PASS"
    alone = _check(monkeypatch, "arch_list.agreement", CUFORGE_ARCH="sm_90")
    assert "arch_list.agreement" not in alone


def test_doctor_compares_nvrtc_with_its_headers_and_compiles_them(cache):
    from cuforge import toolchain

    done = run(
        cache["dir"],
        "doctor",
        "--json",
        "--check",
        "nvrtc.headers",
        "--check",
        "nvrtc.headers_compile",
    )
    rows = _rows(json.loads(done.stdout))
    identity = toolchain.compiler_identity("nvrtc")
    headers = identity_headers_version(identity["headers"])
    nvrtc = tuple(int(x) for x in identity["version"].split(".")[:2])
    row = rows["nvrtc.headers"]
    assert row["status"] == ("PASS" if headers == nvrtc else "WARN"), row
    if headers is not None and headers != nvrtc:
        assert row["fix"] and "cuda-toolkit[nvrtc,cudart,cccl]==" in row["fix"]
    compiled = rows["nvrtc.headers_compile"]
    # this machine has the headers (toolkit or pip wheels): the real compiles pass
    assert compiled["status"] == "PASS", compiled
    assert compiled["data"]["failed"] == {}
    assert "cuda_fp16.h" in compiled["detail"] and "CUB" in compiled["detail"]
    # the probe compiles went through the cache the doctor reports on
    assert set(compiled["data"]["sources"]) == {"cuda_fp16.h", "cuda_bf16.h", "CUB"}


def test_headers_cuda_version_reads_the_identity_field():
    field = "/usr/local/cuda/include CUDA_VERSION=12080 CCCL_VERSION=2008000 cuda.h=1:2"
    assert identity_headers_version(field) == (12, 8)
    assert identity_headers_version("none") is None
