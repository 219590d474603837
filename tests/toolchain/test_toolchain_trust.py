"""The toolchain memo is a cache of probe results, never a list of things to load.

Issue 9 §2: whoever can write the cache dir must not be able to run code in a cuforge
process. Real files and real child processes; the "planted" library is a real shared
object whose constructor leaves a mark when anything loads it."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess

import pytest

from tests.conftest import child_env, run_python

PLANTED_C = r"""
#include <stdio.h>
__attribute__((constructor)) static void planted(void) {
    FILE *f = fopen(MARK, "w");
    if (f) { fputs("loaded", f); fclose(f); }
}
int nvrtcVersion(int *major, int *minor) { *major = 66; *minor = 6; return 0; }
int nvrtcGetNumSupportedArchs(int *n) { *n = 1; return 0; }
int nvrtcGetSupportedArchs(int *a) { a[0] = 666; return 0; }
"""

CHILD = """
import json
from cuforge import toolchain
out = {"identity": toolchain.compiler_identity("nvrtc"),
       "archs": toolchain.supported_archs("nvrtc"),
       "path": toolchain.nvrtc_library_path()}
with open("/proc/self/maps") as f:
    out["maps"] = f.read()
print(json.dumps(out))
"""


def _build_planted(tmp_path) -> tuple[str, str]:
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        pytest.skip("no C compiler to build the planted library with")
    mark = tmp_path / "planted-was-loaded"
    src = tmp_path / "planted.c"
    src.write_text(PLANTED_C)
    lib = tmp_path / "evil" / "libnvrtc.so.13"
    lib.parent.mkdir()
    subprocess.run(
        [gcc, "-shared", "-fPIC", f'-DMARK="{mark}"', "-o", str(lib), str(src)], check=True
    )
    return str(lib), str(mark)


def test_a_library_path_planted_in_the_memo_is_never_loaded(isolated_cache, tmp_path):
    env = child_env()
    cold = run_python(CHILD, env)  # writes toolchain.json with the real location
    real = cold["path"]
    assert os.path.isfile(real)
    assert cold["identity"]["library"] == os.path.basename(real)  # the key holds no path
    planted, mark = _build_planted(tmp_path)

    memo_path = isolated_cache / "toolchain.json"
    memo = json.loads(memo_path.read_text())
    (entry,) = memo["locate"].values()
    entry["path"] = planted  # what an attacker who can write the cache dir would do
    memo_path.write_text(json.dumps(memo))

    warm = run_python(CHILD, env)
    assert not os.path.exists(mark), "the planted library was loaded"
    assert planted not in warm["maps"]
    # what is loaded, and what the key records once a probe ran, is what this process found
    assert warm["identity"] == cold["identity"]
    assert warm["archs"] == cold["archs"] and "sm_666" not in warm["archs"]
    assert warm["path"] == real
    # and the memo is repaired: the next process is told the real location again
    (entry,) = json.loads(memo_path.read_text())["locate"].values()
    assert entry["path"] == real


FAKE_NVCC = """#!/bin/sh
if [ "$1" = "--version" ]; then
  echo "Cuda compilation tools, release 12.9, V12.9.41"
  exit 0
fi
exit 1
"""

NVCC_CHILD = """
import json
from cuforge.toolchain import compiler_identity
print(json.dumps(compiler_identity("nvcc")))
"""


def _plant_nvcc_probe(cache_dir, nvcc: str) -> None:
    """A memo that says the nvcc at ``nvcc`` (same stat) is version 6.6.6."""
    st = os.stat(nvcc)
    memo = {
        "schema": 1,
        "probes": {
            f"nvcc|{nvcc}": {
                "sig": [st.st_size, st.st_mtime_ns],
                "data": {"version": "6.6.6", "version_output": "planted"},
            }
        },
    }
    (cache_dir / "toolchain.json").write_text(json.dumps(memo))


def _fake_nvcc(tmp_path) -> str:
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text(FAKE_NVCC)
    nvcc.chmod(0o755)
    return str(nvcc)


def test_the_memo_of_a_trusted_dir_is_read(isolated_cache, tmp_path):
    nvcc = _fake_nvcc(tmp_path)
    isolated_cache.mkdir(mode=0o700)
    _plant_nvcc_probe(isolated_cache, nvcc)
    got = run_python(NVCC_CHILD, child_env(CUFORGE_NVCC=nvcc))
    assert got["version"] == "6.6.6"  # the control: a trusted memo answers


def test_the_memo_of_a_group_or_world_writable_dir_is_ignored(isolated_cache, tmp_path):
    nvcc = _fake_nvcc(tmp_path)
    isolated_cache.mkdir(mode=0o700)
    os.chmod(isolated_cache, 0o777)
    _plant_nvcc_probe(isolated_cache, nvcc)
    before = (isolated_cache / "toolchain.json").read_bytes()
    got = run_python(NVCC_CHILD, child_env(CUFORGE_NVCC=nvcc))
    assert got["version"] == "12.9.41"  # probed, not read from the planted memo
    assert (isolated_cache / "toolchain.json").read_bytes() == before  # nor written


def test_the_memo_of_a_dir_owned_by_another_user_is_ignored(isolated_cache, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to chown a directory to another user")
    nvcc = _fake_nvcc(tmp_path)
    isolated_cache.mkdir(mode=0o755)
    _plant_nvcc_probe(isolated_cache, nvcc)
    os.chown(isolated_cache, 65534, 65534)
    got = run_python(NVCC_CHILD, child_env(CUFORGE_NVCC=nvcc))
    assert got["version"] == "12.9.41"


def test_a_fifo_in_place_of_the_memo_does_not_hang(isolated_cache, tmp_path):
    nvcc = _fake_nvcc(tmp_path)
    isolated_cache.mkdir(mode=0o700)
    os.mkfifo(isolated_cache / "toolchain.json")
    got = run_python(NVCC_CHILD, child_env(CUFORGE_NVCC=nvcc), timeout=60)
    assert got["version"] == "12.9.41"
    # the FIFO was replaced by a real memo (a rename never opens what it replaces)
    assert stat.S_ISREG(os.lstat(isolated_cache / "toolchain.json").st_mode)


CHECK_CHILD = """
import json, sys
from cuforge.base.errors import ToolchainError
from cuforge.toolchain import identity, locate
locate._nvrtc_path_memo[locate._nvrtc_locate_key()] = sys.argv[1]  # keyed, as a memo says
try:
    identity.check_loaded_nvrtc()
    out = {"raised": None}
except ToolchainError as exc:
    out = {"raised": str(exc)}
with open("/proc/self/maps") as f:
    out["maps"] = f.read()
out["path"] = locate.nvrtc_library_path()
print(json.dumps(out))
"""


def test_checking_the_loaded_nvrtc_never_loads_the_keyed_one(isolated_cache, tmp_path):
    """The compile path's check compares the NVRTC cuda-bindings loaded with the keyed one,
    whose path may come from the memo: that one is compared by content (read), never
    loaded, and a different library stops the compile."""
    planted, mark = _build_planted(tmp_path)
    code = f"import sys; sys.argv = ['c', {planted!r}]\n" + CHECK_CHILD
    out = run_python(code, child_env())
    assert not os.path.exists(mark), "the keyed library was loaded"
    assert planted not in out["maps"]
    assert out["raised"] and "cuda-bindings loaded" in out["raised"]
    assert out["path"] != planted  # repaired: the loaded one is keyed from now on


VERSION_CHILD = """
import json, sys
from cuforge.toolchain.identity import version_output
print(json.dumps({"out": version_output(sys.argv[1])}))
"""


def test_a_tools_version_is_probed_once_per_machine_and_again_when_it_changes(
    isolated_cache, tmp_path
):
    log = tmp_path / "runs.log"
    tool = tmp_path / "fakecc"
    tool.write_text(f'#!/bin/sh\necho run >> "{log}"\necho "fakecc 1.0"\n')
    tool.chmod(0o755)
    code = VERSION_CHILD.replace("sys.argv[1]", repr(str(tool)))

    def probe() -> str:
        return run_python(code, child_env())["out"]

    def runs() -> int:
        return len(log.read_text().splitlines()) if log.exists() else 0

    assert probe() == "fakecc 1.0\n" and runs() == 1
    assert probe() == "fakecc 1.0\n" and runs() == 1  # a fresh process: from the memo
    # a same-size edit (the stat's ctime changes): probed again, the new text
    tool.write_text(tool.read_text().replace("1.0", "2.0"))
    assert probe() == "fakecc 2.0\n" and runs() == 2
