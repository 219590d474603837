"""Two checkouts of one project at different paths share cache entries (issue 10 section 1):
paths under the base dir (CUFORGE_BASE_DIR, else the working directory) enter keys relative
to it. Each compile runs in a fresh process, in its checkout, against one cache."""

from __future__ import annotations

import json
import os

import pytest

from tests.conftest import child_env, run_python

KERNEL = '#include "h.h"\nextern "C" __global__ void k(int* out) { *out = VALUE; }\n'

CHILD = r"""
import json, os, cuforge
from cuforge.core.pipeline import counters
kw = json.loads(os.environ["KW"])
prog = cuforge.compile_file("k.cu", arch="sm_90", **kw)
print(json.dumps({"compiles": counters["compiles"], "source": prog.source_of_result,
                  "headers": list(prog.headers), "why": cuforge.explain_miss("k.cu")}))
"""


def checkout(root, value: int = 1) -> str:
    proj = root / "proj"
    (proj / "include").mkdir(parents=True)
    (proj / "k.cu").write_text(KERNEL)
    (proj / "include" / "h.h").write_text(f"#define VALUE {value}\n")
    return str(proj)


def compile_in(where: str, backend: str = "nvrtc", **env: str) -> dict:
    kw = {"include_dirs": ["include"], "backend": backend}
    code = f"import os; os.chdir({where!r})\n" + CHILD
    return run_python(code, env=child_env(KW=json.dumps(kw), **env))


@pytest.mark.parametrize("backend", ["nvrtc", "nvcc"])
def test_second_checkout_hits(tmp_path, backend):
    a, b = checkout(tmp_path / "a"), checkout(tmp_path / "bb" / "deeper")
    first = compile_in(a, backend)
    second = compile_in(b, backend)
    assert first["compiles"] == 1
    assert (second["compiles"], second["source"], second["why"]) == (0, "disk", [])
    # the hit names this checkout's files, not the first one's
    assert os.path.join(b, "include", "h.h") in second["headers"]
    assert all(h.startswith(b + os.sep) for h in second["headers"]), second["headers"]


def test_edit_in_second_checkout_misses_and_names_the_real_file(tmp_path):
    a, b = checkout(tmp_path / "a"), checkout(tmp_path / "b", value=2)
    assert compile_in(a)["compiles"] == 1
    second = compile_in(b)
    assert second["compiles"] == 1  # h.h differs: no stale hit
    assert second["why"] == ["header include/h.h changed"]


def test_base_dir_setting(tmp_path):
    """With CUFORGE_BASE_DIR, the working directory does not matter."""
    a, b = checkout(tmp_path / "a"), checkout(tmp_path / "b")
    code = (
        "import os, json, cuforge\nfrom cuforge.core.pipeline import counters\n"
        "prog = cuforge.compile_file(os.environ['SRC'], include_dirs=[os.environ['INC']], arch='sm_90')\n"
        "print(json.dumps([counters['compiles'], prog.source_of_result]))"
    )
    for root, expected in ((a, [1, "compiled"]), (b, [0, "disk"])):
        got = run_python(
            code,
            env=child_env(
                CUFORGE_BASE_DIR=os.path.dirname(root),
                SRC=os.path.join(root, "k.cu"),
                INC=os.path.join(root, "include"),
            ),
        )
        assert got == expected


def test_paths_outside_the_base_dir_stay_absolute(tmp_path):
    """Include dirs outside the base dir are keyed by their full path: two different
    outside dirs with equal contents are still two keys (nothing is guessed)."""
    a, b = checkout(tmp_path / "a"), checkout(tmp_path / "b")
    work = tmp_path / "elsewhere"
    work.mkdir()
    code = (
        "import os, json, cuforge\nfrom cuforge.core.pipeline import counters\n"
        "os.chdir(os.environ['WORK'])\n"
        "prog = cuforge.compile(open(os.environ['SRC']).read(), name='k.cu', "
        "include_dirs=[os.environ['INC']], arch='sm_90')\n"
        "print(json.dumps([counters['compiles'], prog.source_of_result]))"
    )
    results = [
        run_python(
            code,
            env=child_env(
                WORK=str(work), SRC=os.path.join(root, "k.cu"), INC=os.path.join(root, "include")
            ),
        )
        for root in (a, b)
    ]
    assert results == [[1, "compiled"], [1, "compiled"]]
