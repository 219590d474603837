"""``CUFORGE_ENABLE`` and ``cuforge run``, in a venv where cuforge is really installed
(``pip install -e``; tests/installed.py): the ``cuforge-enable.pth`` hook enables the
adapters in every Python process, children included, that never import cuforge
themselves; unset, it imports nothing; ``cuforge run`` passes exit codes and signals
through and sums up the cache's own telemetry of the run on stderr."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests import installed

pytestmark = pytest.mark.skipif(installed.missing() is not None, reason=str(installed.missing()))

#: a child that compiles one Triton kernel for sm_90 (no GPU needed) and never imports
#: cuforge: it reads cuforge's state from sys.modules, where the hook put it
TRITON_CHILD = """
import json, sys
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


@triton.jit
def add_kernel(x, y, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=mask) + tl.load(y + offs, mask=mask), mask=mask)


def state():
    adapter = sys.modules.get("cuforge.adapters.triton")
    return {"enabled": adapter is not None and adapter.enabled()}


def compile_one():
    signature = {"x": "*fp32", "y": "*fp32", "out": "*fp32", "n": "i32"}
    triton.compile(ASTSource(add_kernel, signature, {"BLOCK": 128}), target=GPUTarget("cuda", 90, 32))
    return state()


if __name__ == "__main__":
    import multiprocessing

    pool = multiprocessing.get_context("spawn").Pool(1)
    spawned = pool.apply(compile_one)
    pool.close()  # (not terminate: a worker killed by a signal flushes no counts)
    pool.join()
    print(json.dumps({"main": state(), "spawned": spawned}))
"""


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    return installed.install(tmp_path_factory.mktemp("installed"))


@pytest.fixture
def triton_child(tmp_path):
    pytest.importorskip("triton")
    path = tmp_path / "child.py"
    path.write_text(TRITON_CHILD)
    return path


def _last_json(out: str) -> dict:
    """The child's own one-line JSON report (the first line of JSON it printed)."""
    return json.loads(next(line for line in out.splitlines() if line.startswith('{"')))


def _run_doc(out: str) -> dict:
    """``cuforge run --json``'s document: it follows whatever the command printed."""
    return json.loads(out[out.index('{\n  "schema"') :])


# -- the hook --------------------------------------------------------------------------


def test_the_install_puts_the_hook_in_site_packages(venv):
    hook = venv.site / "cuforge-enable.pth"
    assert hook.is_file()
    done = venv.run(["-m", "cuforge", "run", "--json", "--", str(venv.python), "-c", "pass"])
    assert done.returncode == 0, done.stderr
    assert _run_doc(done.stdout)["hook"] == str(hook)


def test_enable_all_enables_triton_in_processes_that_never_import_cuforge(venv, triton_child):
    """The main process and a multiprocessing spawn child: neither names cuforge."""
    done = venv.run([str(triton_child)], CUFORGE_ENABLE="all")
    assert done.returncode == 0, done.stderr
    assert _last_json(done.stdout) == {"main": {"enabled": True}, "spawned": {"enabled": True}}
    assert "Traceback" not in done.stderr


def test_torch_compile_is_enabled_when_inductor_is_imported_not_before(venv):
    """``import torch`` alone stays cheap; ``torch._inductor`` (what torch.compile imports)
    gets cuforge's remote-cache classes and Triton's cache manager right after it loads."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    code = textwrap.dedent(
        """
        import json, sys
        import torch
        before = "cuforge.torch.compile_cache" in sys.modules
        import torch._inductor
        import torch._inductor.config as config
        cc = sys.modules["cuforge.torch.compile_cache"]
        print(json.dumps({"before": before, "patched": cc._state["saved"] is not None,
                          "fx_graph_remote_cache": config.fx_graph_remote_cache,
                          "triton": sys.modules["cuforge.adapters.triton"].enabled()}))
        """
    )
    done = venv.run(["-c", code], CUFORGE_ENABLE="torch_compile")
    assert done.returncode == 0, done.stderr
    assert _last_json(done.stdout) == {
        "before": False,
        "patched": True,
        "fx_graph_remote_cache": True,
        "triton": True,
    }


def test_without_the_variable_nothing_is_enabled(venv, triton_child):
    done = venv.run([str(triton_child)])
    assert done.returncode == 0, done.stderr
    assert _last_json(done.stdout) == {"main": {"enabled": False}, "spawned": {"enabled": False}}


def test_unset_the_hook_imports_no_cuforge_module(venv):
    done = venv.run(["-X", "importtime", "-c", "pass"])
    assert done.returncode == 0, done.stderr
    modules = [line.split("|")[-1].strip() for line in done.stderr.splitlines() if "|" in line]
    assert "site" in modules  # (the import-time report is really there)
    assert not [m for m in modules if m.startswith("cuforge")], modules
    # set, it does import cuforge (so the check above means something)
    done = venv.run(["-X", "importtime", "-c", "pass"], CUFORGE_ENABLE="triton")
    assert "cuforge._autoenable" in done.stderr


def test_the_hook_does_not_import_the_peers(venv):
    code = "import sys, json; print(json.dumps(sorted(m for m in ('torch', 'triton', 'cutlass', 'cuda.compute') if m in sys.modules)))"
    done = venv.run(["-c", code], CUFORGE_ENABLE="all")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


def test_a_bad_name_is_one_line_naming_the_variable_and_the_process_goes_on(venv):
    code = "import triton, sys; print(sys.modules['cuforge.adapters.triton'].enabled())"
    done = venv.run(["-c", code], CUFORGE_ENABLE="trtion,triton")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"  # the valid name is still enabled
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "CUFORGE_ENABLE" in lines[0] and "'trtion'" in lines[0]
    assert "triton, torch_compile, jax, cupy, cuda_core, cute, cccl" in lines[0]


def test_a_failure_at_start_is_one_line_and_the_process_goes_on(venv):
    # a broken setting (an empty CUFORGE_REMOTE_KEY is refused) fails the hook's start
    done = venv.run(["-c", "print('ran')"], CUFORGE_ENABLE="all", CUFORGE_REMOTE_KEY="")
    assert done.returncode == 0 and done.stdout.strip() == "ran"
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "CUFORGE_ENABLE" in lines[0] and "CUFORGE_REMOTE_KEY" in lines[0]
    assert "Traceback" not in done.stderr


def test_naming_cuda_core_says_why_it_has_no_switch_once_it_is_imported(venv):
    pytest.importorskip("cuda.core")
    assert venv.run(["-c", "pass"], CUFORGE_ENABLE="cuda_core").stderr == ""
    done = venv.run(["-c", "import cuda.core"], CUFORGE_ENABLE="cuda_core")
    assert done.returncode == 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "cuda_core" in lines[0] and "no global" in lines[0]
    # under all it is left alone quietly
    assert venv.run(["-c", "import cuda.core"], CUFORGE_ENABLE="all").stderr == ""


# -- cuforge run -----------------------------------------------------------------------


def _cuforge_run(venv, *args: str, timeout: float = 300, **env: str):
    return venv.run(["-m", "cuforge", "run", *args], timeout=timeout, **env)


def test_run_enables_the_children_and_sums_up_the_run(venv, triton_child, tmp_path):
    cache_dir = tmp_path / "run-cache"
    first = _cuforge_run(
        venv, "--cache-dir", str(cache_dir), "--", str(venv.python), str(triton_child)
    )
    assert first.returncode == 0, first.stderr
    assert _last_json(first.stdout) == {"main": {"enabled": True}, "spawned": {"enabled": True}}
    summary = [line for line in first.stderr.splitlines() if "triton" in line]
    assert "cuforge run: exit code 0" in first.stderr
    assert len(summary) == 1 and "0 hits, 1 misses, 1 builds" in summary[0], first.stderr
    # the second run compiles nothing: one hit, and the first compile's seconds are saved
    second = _cuforge_run(
        venv, "--json", "--cache-dir", str(cache_dir), "--", str(venv.python), str(triton_child)
    )
    assert second.returncode == 0, second.stderr
    doc = _run_doc(second.stdout)
    assert doc["command"] == "run" and doc["enable"] == "all"
    assert doc["cache_dir"] == str(cache_dir)
    row = doc["systems"]["triton"]
    assert (row["hits"], row["misses"], row["builds"]) == (1, 0, 0)
    assert row["seconds_saved"] > 0 and doc["seconds_saved"] == row["seconds_saved"]


def test_run_passes_the_exit_code_through(venv):
    done = _cuforge_run(venv, "--", str(venv.python), "-c", "import sys; sys.exit(3)")
    assert done.returncode == 3
    assert "cuforge run: exit code 3" in done.stderr
    assert "no cache lookups recorded" in done.stderr


def test_a_command_killed_by_a_signal_gives_128_plus_n(venv):
    code = "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"
    done = _cuforge_run(venv, "--", str(venv.python), "-c", code)
    assert done.returncode == 128 + signal.SIGTERM


def test_sigterm_to_run_reaches_the_command(venv, tmp_path):
    ready = tmp_path / "ready"
    code = textwrap.dedent(
        f"""
        import signal, sys, time
        signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))
        open({str(ready)!r}, "w").close()
        time.sleep(120)
        """
    )
    proc = subprocess.Popen(
        [str(venv.python), "-m", "cuforge", "run", "--", str(venv.python), "-c", code],
        env=venv.env(),
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not ready.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the command never started"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 7, err  # the command's own handler ran: its code came back
    assert "cuforge run: exit code 7" in err


def test_run_keeps_the_users_choice_of_systems(venv):
    code = "import os; print(os.environ['CUFORGE_ENABLE'])"
    done = _cuforge_run(venv, "--", str(venv.python), "-c", code, CUFORGE_ENABLE="triton")
    assert done.returncode == 0 and done.stdout.strip() == "triton"


def test_run_of_a_missing_command_is_127_and_no_command_is_a_usage_error(venv):
    done = _cuforge_run(venv, "--", "no-such-command-cuforge-test")
    assert done.returncode == 127
    assert "no-such-command-cuforge-test: command not found" in done.stderr
    done = _cuforge_run(venv)
    assert done.returncode == 2 and "no command given" in done.stderr


def test_without_the_hook_the_summary_says_so(tmp_path):
    """This tree on PYTHONPATH of an interpreter with no cuforge-enable.pth in its site
    dirs: the run still works, and the summary names what it could not do."""
    from tests.child import child_env

    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "from cuforge.cli.run import hook_installed; print(hook_installed())",
        ],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    if probe.stdout.strip() != "None":
        pytest.skip(f"this interpreter has the hook installed ({probe.stdout.strip()})")
    done = subprocess.run(
        [sys.executable, "-m", "cuforge", "run", "--", sys.executable, "-c", "pass"],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "cuforge-enable.pth is not in this interpreter's site-packages" in done.stderr
    assert os.path.basename(sys.executable) in done.stderr
