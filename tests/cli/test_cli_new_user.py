"""Issue 36, item 5: the command line, consistent, as a new user found it.

Each test runs ``python -m cuforge ...`` in a child process against a real cache (really
compiled with NVRTC: tests/cli/conftest.py), or a fresh dir."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.cli.conftest import SAXPY, base_env, compile_in_child
from tests.conftest import GPU_VISIBLE


def run(
    cache_dir: str, *args: str, cwd: str | None = None, **env: str
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cuforge", *args],
        env=base_env(cache_dir, **env),
        cwd=cwd,
        capture_output=True,
        text=True,
        input="",
        timeout=300,
        check=False,
    )


def _saxpy(tmp_path) -> str:
    src = tmp_path / "saxpy.cu"
    src.write_text(SAXPY)
    return str(src)


# -- a bad flag value is a usage error: exit 2 ----------------------------------------


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (("compile", "{src}", "--arch", "hopper"), "--arch"),
        (("bundle", "wheel", "{src}", "--name", "bad name!", "--version", "1.0"), "--name"),
        (("bundle", "wheel", "{src}", "--name", "ok-name", "--version", "v1"), "--version"),
        (("cache", "stats", "--top", "-1"), "--top"),
        (("cache", "ls", "--limit", "-3"), "--limit"),
        (("cache", "explain", "--limit", "x"), "--limit"),
    ],
)
def test_a_bad_flag_value_exits_2(cache, tmp_path, args, flag):
    src = _saxpy(tmp_path)
    argv = [a.format(src=src) for a in args]
    done = run(cache["dir"], *argv)
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert f"argument {flag}:" in done.stderr and "usage:" in done.stderr, done.stderr
    # under --json: the usage error document
    done = run(cache["dir"], *argv, "--json")
    assert done.returncode == 2
    doc = json.loads(done.stdout)
    assert doc["ok"] is False and doc["error"]["kind"] == "usage", doc
    assert flag in doc["error"]["message"]


def test_compile_arch_spellings_still_work(cache, tmp_path):
    src = _saxpy(tmp_path)
    for spelling in ("sm_90", "9.0", "90"):
        done = run(cache["dir"], "compile", src, "--arch", spelling, "--json")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["results"][0]["arch"] == "sm_90"


# -- compile --json failures: the documented error object ------------------------------


def test_compile_json_failure_has_the_error_object(cache, tmp_path):
    bad = tmp_path / "bad.cu"
    bad.write_text('extern "C" __global__ void k(float* x) { x[0] = }\n')
    good = _saxpy(tmp_path)
    done = run(cache["dir"], "compile", str(bad), good, "--arch", "sm_90", "--json")
    assert done.returncode == 1, done.stderr
    doc = json.loads(done.stdout)
    assert doc["ok"] is False and doc["failed"] == 1
    failed = doc["results"][0]
    assert failed["ok"] is False
    assert set(failed["error"]) == {"message", "kind"}, failed
    assert "bad.cu" in failed["error"]["message"] and failed["error"]["kind"] == "CompileError"
    assert doc["results"][1]["ok"] is True
    # the document as a whole has docs/cli.md's failure shape: {"error": {"message", "kind"}}
    assert set(doc["error"]) == {"message", "kind"}
    assert doc["error"]["kind"] == "CompileError"
    assert doc["error"]["message"].startswith("1 of 2 failed; ")


def test_every_compile_option_has_help_text(cache):
    from cuforge.cli.main import build_parser

    parser = build_parser("compile")
    sub = next(a for a in parser._actions if a.dest == "command").choices["compile"]  # noqa: SLF001
    for action in sub._actions:  # noqa: SLF001
        assert action.help, action.option_strings or action.dest


# -- prefetch: --cache-dir after the lock is an option ---------------------------------


def _lock_of(cache_dir: str, tmp_path) -> str:
    lock = str(tmp_path / "cuforge.lock")
    compile_in_child(
        cache_dir,
        [{"name": "saxpy.cu", "source": SAXPY, "arch": "sm_90"}],
        CUFORGE_RECORD=lock,
    )
    return lock


def test_prefetch_reads_cache_dir_after_the_lock_as_an_option(cache, tmp_path):
    lock = _lock_of(cache["dir"], tmp_path)
    elsewhere = str(tmp_path / "elsewhere")
    # the entries are in cache["dir"]: named by --cache-dir after LOCK, they are local
    done = run(elsewhere, "prefetch", lock, "--cache-dir", cache["dir"], "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert doc["ok"] is True and doc["copied"] == 2 and doc["missing"] == [], doc
    # no remote is configured: it says so (and that nothing can be fetched)
    assert doc["remote_configured"] is False
    assert "no remote cache is configured (CUFORGE_REMOTE is unset)" in done.stderr
    # against an empty cache dir: missing, and still the same sentence
    done = run(elsewhere, "prefetch", lock, "--cache-dir", str(tmp_path / "empty"))
    assert done.returncode == 1
    assert "no remote cache is configured" in done.stderr
    assert "missing: kernel saxpy.cu" in done.stderr


def test_prefetch_service_form_keeps_its_arguments(cache, tmp_path):
    lock = _lock_of(cache["dir"], tmp_path)
    script = tmp_path / "serve.py"
    script.write_text("import sys; print('argv', sys.argv[1:])\n")
    done = run(
        cache["dir"], "prefetch", lock, "--", str(script), "--port", "8000", "--cache-dir", "x"
    )
    assert done.returncode == 0, done.stderr
    assert "argv ['--port', '8000', '--cache-dir', 'x']" in done.stdout


# -- cache explain ------------------------------------------------------------------------


def test_cache_explain_lists_each_reason_once_and_paths_as_paths(tmp_path):
    work = tmp_path / "work"
    (work / "inc").mkdir(parents=True)
    (work / "inc2").mkdir()
    (work / "k.cu").write_text('extern "C" __global__ void k(float* x) { x[0] = 1; }\n')
    cache_dir = str(tmp_path / "cache")

    def compile_(*args: str) -> None:
        done = run(cache_dir, "compile", "k.cu", "--arch", "sm_90", *args, cwd=str(work))
        assert done.returncode == 0, done.stderr

    compile_("-I", "inc")
    compile_("-I", "inc", "-I", "inc2", "-I", "inc2", "--option=-lineinfo", "--option=-lineinfo")
    compile_("-I", "inc2", "-I", "inc", "--option=-lineinfo")  # the same dirs, reordered
    doc = json.loads(run(cache_dir, "cache", "explain", "--json").stdout)
    first, reordered = doc["misses"][-2]["reasons"], doc["misses"][-1]["reasons"]
    assert first == ["option -lineinfo added", "include dir inc2 added"], first
    text = " ".join(reordered)
    assert "${BASE}" not in text and "<include>" not in text, reordered
    assert f"-I{work}" in text and "-Iinc2 -Iinc " in text, reordered
    # the base dir itself is shown as its path
    script = textwrap.dedent(
        """
        import cuforge
        cuforge.compile(open("k.cu").read(), name="k.cu", arch="sm_90", include_dirs=["."])
        cuforge.compile(open("k.cu").read(), name="k.cu", arch="sm_90")
        """
    )
    subprocess.run(
        [sys.executable, "-c", script],
        cwd=str(work),
        env=base_env(cache_dir),
        check=True,
        timeout=300,
        capture_output=True,
    )
    shown = run(cache_dir, "cache", "explain")
    assert "${BASE}" not in shown.stdout, shown.stdout
    assert f"include dir {work} removed" in shown.stdout, shown.stdout


def test_cache_explain_rewords_what_older_versions_logged(tmp_path):
    cache_dir = tmp_path / "cache"
    (cache_dir / "explain").mkdir(parents=True, mode=0o700)
    cache_dir.chmod(0o700)
    record = {
        "time": 1.0,
        "name": "k.cu",
        "key": "ab" * 32,
        "reasons": ["include dir ${BASE} removed", "option -x added", "option -x added"],
    }
    (cache_dir / "explain" / "misses.jsonl").write_text(json.dumps(record) + "\n")
    done = run(str(cache_dir), "cache", "explain", "--json", cwd=str(tmp_path))
    reasons = json.loads(done.stdout)["misses"][0]["reasons"]
    assert reasons == [f"include dir {tmp_path} removed", "option -x added"], reasons


# -- sizes and hits: one definition ------------------------------------------------------


def test_sizes_agree_between_stats_ls_show_and_the_files(cache):
    stats = json.loads(run(cache["dir"], "cache", "stats", "--json").stdout)
    listed = json.loads(run(cache["dir"], "cache", "ls", "--kind", "all", "--json").stdout)
    files = {}
    for dirpath, _, names in os.walk(os.path.join(cache["dir"], "v1", "entries")):
        for name in names:
            files[name] = os.path.getsize(os.path.join(dirpath, name))
    # what `du --apparent-size -b` of the entry files says, ls says per entry, stats in all
    assert {e["key"]: e["size"] for e in listed["entries"]} == files
    assert stats["bytes"] == sum(files.values()) and stats["entries"] == len(files)
    assert sum(k["bytes"] for k in stats["kinds"].values()) == stats["bytes"]
    key = cache["keys"]["saxpy.cu"]
    shown = json.loads(run(cache["dir"], "cache", "show", key, "--json").stdout)
    assert shown["size"] == files[key] == shown["file_size"]
    assert 0 < shown["payload_bytes"] < shown["size"]
    text = run(cache["dir"], "cache", "show", key).stdout
    assert f"({files[key]} bytes on disk;" in text


def test_doctor_counts_hits_as_cache_stats_does(cache):
    # one more process: a warm hit, so there are hits and misses to count
    compile_in_child(cache["dir"], cache["jobs"][:1])
    stats = json.loads(run(cache["dir"], "cache", "stats", "--json").stdout)["lookups"]
    done = run(cache["dir"], "doctor", "--check", "cache.hits", "--json")
    row = json.loads(done.stdout)["checks"][0]
    assert row["id"] == "cache.hits" and row["status"] == "PASS", row
    for field in ("lookups", "hits", "misses", "builds"):
        assert row["data"][field] == stats[field], (field, row, stats)
    assert stats["hits"] >= 1
    assert f"{stats['lookups']} lookups:" in row["detail"]


# -- bundle install twice ----------------------------------------------------------------


def test_a_second_bundle_install_reports_all_already_present(cache, tmp_path):
    bundle = str(tmp_path / "warm.cfb")
    done = run(cache["dir"], "cache", "export", bundle, "--kind", "all")
    assert done.returncode == 0, done.stderr
    target = str(tmp_path / "fresh")
    first = json.loads(run(target, "bundle", "install", bundle, "--json").stdout)
    n = first["entries"]
    assert n > 0 and first["stored"] == n and first["already_present"] == 0, first
    second = json.loads(run(target, "bundle", "install", bundle, "--json").stdout)
    assert second["stored"] == 0 and second["already_present"] == n, second
    text = run(target, "bundle", "install", bundle).stdout
    assert f"installed 0 new, {n} already present, of {n} entries" in text, text


# -- the rest -------------------------------------------------------------------------------


def test_an_uncreatable_cache_dir_warns_once_in_sentences(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    src = _saxpy(tmp_path)
    done = run(str(blocker / "cache"), "compile", src, src, "--arch", "sm_90")
    assert done.returncode == 0, done.stderr
    warnings = [ln for ln in done.stderr.splitlines() if ln.startswith("cuforge:")]
    assert len(warnings) == 1, done.stderr
    assert "disk cache disabled" in warnings[0] and "Fix:" in warnings[0]
    assert "[Errno" not in done.stderr


def test_a_raw_errno_becomes_a_sentence(cache, tmp_path):
    src = _saxpy(tmp_path)
    out = str(tmp_path / "no-such-dir" / "saxpy.cubin")
    done = run(cache["dir"], "compile", src, "--arch", "sm_90", "-o", out)
    assert done.returncode == 1
    assert "[Errno" not in done.stderr, done.stderr
    assert f"cannot write {out}: No such file or directory" in done.stderr


def test_doctor_summary_says_1_warning(capsys, monkeypatch):
    from cuforge.cli import doctor

    monkeypatch.setenv("CI", "true")  # plain output
    rows = [doctor.Check("ninja", "ninja", "WARN", "old", "pip install ninja")]
    doctor.render(rows, {"pass": 0, "warn": 1, "fail": 0, "skip": 0}, [])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == "0 passed, 1 warning, 0 failed, 0 skipped"


@pytest.mark.skipif(GPU_VISIBLE, reason="with a GPU, cuforge env takes the arch from it")
def test_env_prints_the_cuforge_arch_line_without_a_gpu(tmp_path):
    done = run(str(tmp_path / "cache"), "env")
    lines = done.stdout.splitlines()
    arch = [ln for ln in lines if "CUFORGE_ARCH" in ln]
    assert arch and arch[0].startswith("# CUFORGE_ARCH left unset"), done.stdout
    assert "export CUFORGE_ARCH=sm_90" in arch[0]
    # with a setting, the line is the export
    done = run(str(tmp_path / "cache"), "env", CUFORGE_ARCH="9.0")
    assert "export CUFORGE_ARCH=9.0" in done.stdout.splitlines(), done.stdout
