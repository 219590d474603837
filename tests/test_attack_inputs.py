"""Issue 20 (attack pass), the input items: a FIFO or device as a source or header fails at
once naming it (never a hang, never a read without end); a stale binary is never served
for a computed include named by a -D define or an include through a symlinked directory
and ``..``; bad arguments raise errors that name the argument and what was expected."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import cuforge
from cuforge.core.pipeline import counters
from tests.conftest import child_env

KERNEL = 'extern "C" __global__ void k(int* out) { *out = VALUE; }\n'

#: a hang fails the test after this many seconds instead of blocking the suite
HANG_S = 60


def _run(args: list[str], cwd: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=HANG_S,  # subprocess.TimeoutExpired: it blocked
        check=False,
    )


# -- item 9: non-regular files --------------------------------------------------------------


@pytest.mark.parametrize("how", ["cli", "compile_file", "jit"])
def test_a_fifo_source_fails_at_once_naming_it(tmp_path, how):
    fifo = tmp_path / "k.cu"
    os.mkfifo(fifo)
    if how == "cli":
        done = _run(["-m", "cuforge", "compile", str(fifo), "--arch", "sm_90"], str(tmp_path))
        out = done.stderr + done.stdout
    else:
        call = (
            f"cuforge.compile_file({str(fifo)!r}, arch='sm_90')"
            if how == "compile_file"
            else f"cuforge.jit(pathlib.Path({str(fifo)!r}), 'k')"
        )
        code = f"import pathlib, cuforge\ntry:\n    {call}\nexcept OSError as e:\n    print(e)\n"
        done = _run(["-c", code], str(tmp_path))
        out = done.stdout + done.stderr
    assert "not a regular file" in out and str(fifo) in out, out


def test_dev_zero_as_a_source_is_refused_without_reading_it(tmp_path):
    done = _run(["-m", "cuforge", "compile", "/dev/zero", "--arch", "sm_90"], str(tmp_path))
    assert done.returncode == 1
    assert "/dev/zero" in done.stderr and "not a regular file" in done.stderr, done.stderr


@pytest.mark.parametrize("where", ["include", "pre-include", "computed"])
def test_a_fifo_header_fails_at_once_naming_it(tmp_path, where):
    """NVRTC itself opens the FIFO and waits for a writer forever: cuforge refuses the
    compile first, naming the file (OSError: cuforge.base._fs.NotRegularFile)."""
    inc = tmp_path / "inc"
    inc.mkdir()
    os.mkfifo(inc / "h.h")
    src, kw = {
        "include": ('#include "h.h"\n', {}),
        "pre-include": ("", {"options": ["-include", "h.h"]}),
        "computed": ("#include HEADER\n", {"defines": {"HEADER": '"h.h"'}}),
    }[where]
    code = (
        "import cuforge\n"
        "try:\n"
        f"    cuforge.compile({src + KERNEL!r}, include_dirs=[{str(inc)!r}], arch='sm_90', "
        f"defines={{'VALUE': 1, **{kw.get('defines', {})!r}}}, options={kw.get('options', [])!r})\n"
        "except OSError as e:\n"
        "    print(type(e).__name__, e)\n"
    )
    done = _run(["-c", code], str(tmp_path))
    assert "NotRegularFile" in done.stdout and str(inc / "h.h") in done.stdout, done
    assert "FIFO" in done.stdout, done.stdout


# -- item 4: the include spellings that served a stale binary (in-process) ---------------------


def test_retargeting_a_symlinked_dir_under_dotdot_recompiles(tmp_path):
    """``#include "lnk/../h.h"`` reads the h.h beside the link's target: pointing the link
    elsewhere changes the header read, so the next call compiles again."""
    for sub, value in (("a", 1), ("b", 2)):
        (tmp_path / sub / "sub").mkdir(parents=True)
        (tmp_path / sub / "h.h").write_text(f"#define VALUE {value}\n")
    top = tmp_path / "top"
    top.mkdir()
    (top / "h.h").write_text("#define VALUE 3\n")  # where the spelled path leads
    os.symlink(tmp_path / "a" / "sub", top / "lnk")
    src = '#include "lnk/../h.h"\n' + KERNEL
    first = cuforge.compile(src, include_dirs=[str(top)], arch="sm_90")
    assert cuforge.compile(src, include_dirs=[str(top)], arch="sm_90").binary == first.binary
    assert counters["compiles"] == 1
    os.unlink(top / "lnk")
    os.symlink(tmp_path / "b" / "sub", top / "lnk")
    second = cuforge.compile(src, include_dirs=[str(top)], arch="sm_90")
    assert counters["compiles"] == 2 and second.binary != first.binary


def test_a_computed_include_through_a_define_it_cannot_follow_is_compiled_uncached(
    tmp_path, caplog
):
    """``-DHEADER=MAKE(...)``: the scan cannot tell which file the macro names, so the
    compile is not cached (a warning says why) instead of keyed on the wrong files."""
    (tmp_path / "h.h").write_text("#define VALUE 1\n")
    src = "#define STR(x) #x\n#define MAKE(x) STR(x)\n#include HEADER\n" + KERNEL
    kw = {"defines": {"HEADER": f"MAKE({tmp_path}/h.h)"}, "arch": "sm_90"}
    with caplog.at_level("WARNING", logger="cuforge"):
        cuforge.compile(src, **kw)
        cuforge.compile(src, **kw)
    assert counters["compiles"] == 2
    assert "macro HEADER" in caplog.text and "not cached" in caplog.text, caplog.text


# -- items 15 and 16: argument errors ------------------------------------------------------


def test_a_nul_in_name_is_refused():
    with pytest.raises(ValueError, match=r"name contains a NUL byte at offset 1"):
        cuforge.compile(KERNEL.replace("VALUE", "1"), name="k\0.cu", arch="sm_90")
    assert counters["compiles"] == 0


@pytest.mark.parametrize(
    "kw, error",
    [
        ({"include_dirs": "/tmp"}, r"include_dirs must be a sequence of paths, not one str: use \['/tmp'\]"),
        ({"name_expressions": "f"}, r"name_expressions must be a sequence of C\+\+ expressions, not one str: use \['f'\]"),
        ({"options": "-O3"}, r"options must be a sequence of option strings, not one str: use \['-O3'\]"),
        ({"headers": {"a.h": 5}}, r"headers\['a.h'\] must be the header's text \(str\), not int"),
        ({"options": ["-O3", 3]}, r"options\[1\] must be a str"),
        ({"include_dirs": [None]}, r"include_dirs\[0\] must be a path"),
        ({"name": 5}, r"name must be a str"),
    ],
)  # fmt: skip
def test_wrong_argument_types_name_the_argument(kw, error):
    with pytest.raises(TypeError, match=error):
        cuforge.compile(KERNEL.replace("VALUE", "1"), arch="sm_90", **kw)
    assert counters["compiles"] == 0


def test_cache_export_into_a_missing_dir_names_the_dir(tmp_path):
    target = tmp_path / "missing" / "x.cfb"
    done = _run(["-m", "cuforge", "cache", "export", str(target)], str(tmp_path))
    assert done.returncode == 1
    assert f"the directory {tmp_path / 'missing'} does not exist" in done.stderr, done.stderr
    assert ".tmp." not in done.stderr, done.stderr
