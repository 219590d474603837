"""Every file the compiler can read is in the key, however it is reached.

Each case compiles a kernel whose binary depends on a header, in a fresh process; the
header is edited; a second fresh process must compile again (one compile, new bytes), and
a third must hit (no compile). All cases run in the same three processes, so the suite
pays three interpreter starts, not three per case.
"""

from __future__ import annotations

import json
import os

import pytest

from tests.conftest import child_env, run_python

KERNEL = 'extern "C" __global__ void k(int* out) { *out = VALUE; }\n'

#: case -> (source text, compile kwargs as JSON-able dict, env overrides, files to create)
#: "{d}" in any string is replaced by the case's directory; the edited header is inc/h.h
#: (or the file named by "edit"). "dirs": directories to create; "links": symlinks to
#: create (path -> target, both relative to the case's directory); "cwd": the directory
#: (relative to the case's) the compile runs in.
CASES: dict[str, dict] = {
    "include_dirs": {"src": '#include "h.h"\n' + KERNEL, "kw": {"include_dirs": ["{d}/inc"]}},
    "option -Idir": {"src": '#include "h.h"\n' + KERNEL, "kw": {"options": ["-I{d}/inc"]}},
    "option -I dir": {"src": '#include "h.h"\n' + KERNEL, "kw": {"options": ["-I", "{d}/inc"]}},
    "option -I=dir": {"src": '#include "h.h"\n' + KERNEL, "kw": {"options": ["-I={d}/inc"]}},
    "option --include-path=": {
        "src": '#include "h.h"\n' + KERNEL,
        "kw": {"options": ["--include-path={d}/inc"]},
    },
    "option --include-path dir": {
        "src": "#include <h.h>\n" + KERNEL,
        "kw": {"options": ["--include-path", "{d}/inc"]},
    },
    "relative -I from the cwd": {
        "src": '#include "h.h"\n' + KERNEL,
        "kw": {"options": ["-Iinc"]},
        "chdir": True,
    },
    "CUFORGE_EXTRA_OPTIONS": {
        "src": '#include "h.h"\n' + KERNEL,
        "kw": {},
        "env": {"CUFORGE_EXTRA_OPTIONS": "-I{d}/inc"},
    },
    "--pre-include=": {
        "src": KERNEL,
        "kw": {"options": ["--pre-include={d}/inc/h.h"]},
    },
    "-include name via -I": {
        "src": KERNEL,
        "kw": {"options": ["-I{d}/inc", "-include", "h.h"]},
    },
    "comment inside the directive": {
        "src": '#include /* a comment */ "h.h" // and another\n' + KERNEL,
        "kw": {"include_dirs": ["{d}/inc"]},
    },
    "comment before include": {
        "src": '# /* c */ include "h.h"\n' + KERNEL,
        "kw": {"include_dirs": ["{d}/inc"]},
    },
    "backslash-newline splice": {
        "src": '#inc\\\nlude \\\n"h.h"\n' + KERNEL,
        "kw": {"include_dirs": ["{d}/inc"]},
    },
    "string source, quoted include next to the cwd": {
        "src": '#include "inc/h.h"\n' + KERNEL,
        "kw": {},
        "chdir": True,
    },
    "computed include": {
        "src": '#define HEADER "h.h"\n#include HEADER\n' + KERNEL,
        "kw": {"include_dirs": ["{d}/inc"]},
    },
    "__has_include": {
        "src": '#if __has_include("h.h")\n#include "h.h"\n#else\n#define VALUE 0\n#endif\n'
        + KERNEL,
        "kw": {"include_dirs": ["{d}/inc"]},
    },
    # issue 20, item 4: the spellings that served a stale binary
    "option '-I dir' as one string (NVRTC strips the blank)": {
        "src": '#include "h.h"\n' + KERNEL,
        "kw": {"options": ["-I {d}/inc"]},
    },
    "quoted include through a symlinked dir and ..": {
        "src": '#include "lnk/../h.h"\n' + KERNEL,
        "kw": {"include_dirs": ["{d}/top"]},
        "dirs": ["inc/sub", "top"],
        "links": {"top/lnk": "inc/sub"},
    },
    "-I dir through a symlinked dir and ..": {
        "src": '#include "h.h"\n' + KERNEL,
        "kw": {"options": ["-I{d}/top/lnk/.."]},
        "dirs": ["inc/sub", "top"],
        "links": {"top/lnk": "inc/sub"},
    },
    "computed include, absolute path from defines=": {
        "src": "#include HEADER\n" + KERNEL,
        "kw": {"defines": {"HEADER": '"{d}/inc/h.h"'}},
        "dirs": ["work"],
        "cwd": "work",
    },
    "computed include, ../ path from defines=": {
        "src": "#include HEADER\n" + KERNEL,
        "kw": {"defines": {"HEADER": '"../inc/h.h"'}},
        "dirs": ["work"],
        "cwd": "work",
    },
    "computed include, path from -D in options, through another macro": {
        "src": "#include HEADER\n" + KERNEL,
        "kw": {"options": ["-DHEADER=PATH", "-D PATH=<{d}/inc/h.h>"]},
        "dirs": ["work"],
        "cwd": "work",
    },
    "nested header": {
        "src": '#include "outer.h"\n' + KERNEL,
        "kw": {"include_dirs": ["{d}/inc"]},
        "files": {"inc/outer.h": '#pragma once\n#include "h.h"\n'},
    },
}

CHILD = r"""
import hashlib, json, os, sys
import cuforge
from cuforge.core.pipeline import counters
cases = json.loads(sys.argv[1]) if len(sys.argv) > 1 else json.loads(os.environ["CASES"])
out = {}
for name, case in cases.items():
    os.chdir(case["cwd"] or (case["dir"] if case.get("chdir") else case["root"]))
    saved = {k: os.environ.get(k) for k in case.get("env", {})}
    os.environ.update(case.get("env", {}))
    before = counters["compiles"]
    prog = cuforge.compile(case["src"], name="k.cu", arch="sm_90", **case["kw"])
    out[name] = [counters["compiles"] - before, hashlib.sha256(prog.binary).hexdigest()]
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
print(json.dumps(out))
"""


def _fill(value, d: str):
    if isinstance(value, str):
        return value.replace("{d}", d)
    if isinstance(value, list):
        return [_fill(v, d) for v in value]
    if isinstance(value, dict):
        return {k: _fill(v, d) for k, v in value.items()}
    return value


def _write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def _run(cases: dict) -> dict:
    return run_python(CHILD, env=child_env(CASES=json.dumps(cases)))


def test_every_spelling_of_an_include_is_keyed(tmp_path):
    cases = {}
    for i, (name, spec) in enumerate(CASES.items()):
        d = str(tmp_path / f"case{i}")
        _write(os.path.join(d, "inc", "h.h"), "#pragma once\n#define VALUE 1\n")
        for rel, text in spec.get("files", {}).items():
            _write(os.path.join(d, rel), text)
        for rel in spec.get("dirs", ()):
            os.makedirs(os.path.join(d, rel), exist_ok=True)
        for rel, target in spec.get("links", {}).items():
            os.symlink(os.path.join(d, target), os.path.join(d, rel))
        cases[name] = {
            "dir": d,
            "cwd": os.path.join(d, spec["cwd"]) if "cwd" in spec else None,
            "root": str(tmp_path),
            "chdir": spec.get("chdir", False),
            # a per-case comment keeps each case's source (and so its key) distinct
            "src": f"// case {i}\n" + spec["src"],
            "kw": _fill(spec["kw"], d),
            "env": _fill(spec.get("env", {}), d),
        }
    first = _run(cases)
    assert all(n == 1 for n, _ in first.values()), first
    for case in cases.values():
        _write(os.path.join(case["dir"], "inc", "h.h"), "#pragma once\n#define VALUE 2\n")
    second = _run(cases)
    stale = [name for name in cases if second[name][0] != 1 or second[name][1] == first[name][1]]
    assert not stale, f"a header edit was not noticed in a fresh process for: {stale}"
    third = _run(cases)
    recompiled = [name for name in cases if third[name] != [0, second[name][1]]]
    assert not recompiled, f"an unchanged compile missed the cache for: {recompiled}"


def test_nul_byte_in_source_is_an_error():
    import cuforge

    with pytest.raises(ValueError, match=r"NUL byte at offset 27 \(line 2\)"):
        cuforge.compile('extern "C" __global__ void\n\0k(){}', name="nul.cu")


def test_lone_surrogate_in_source_is_an_error():
    import cuforge

    with pytest.raises(ValueError, match="lone surrogate"):
        cuforge.compile('extern "C" __global__ void k(){} // \udcff', name="s.cu")


def test_non_utf8_file_names_file_and_offset(tmp_path):
    import cuforge

    path = tmp_path / "latin1.cu"
    path.write_bytes(b'// caf\xe9\nextern "C" __global__ void k(){}\n')
    with pytest.raises(
        ValueError, match=r"latin1.cu: not UTF-8 text: byte 0xe9 at offset 6 \(line 1\)"
    ):
        cuforge.compile_file(path)


def test_computed_include_over_too_many_files_is_compiled_uncached(tmp_path, caplog):
    import cuforge
    from cuforge.core import pipeline
    from cuforge.core.pipeline import counters

    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "h.h").write_text("#define VALUE 1\n")
    for i in range(pipeline.MAX_FILES_FOR_COMPUTED_INCLUDES + 1):
        (inc / f"f{i}.h").write_text("")
    src = '#define HEADER "h.h"\n#include HEADER\n' + KERNEL
    with caplog.at_level("WARNING", logger="cuforge"):
        cuforge.compile(src, include_dirs=[str(inc)])
        cuforge.compile(src, include_dirs=[str(inc)])
    assert counters["compiles"] == 2
    assert "computed #include" in caplog.text and "not cached" in caplog.text
