"""[[extension]] entries: torch extensions built by ``cuforge build`` (through
cuforge.torch's build), hit by the same ``cuforge.torch.load`` call later, and carried by
bundles (``cuforge bundle install``)."""

from __future__ import annotations

import json

import pytest

from tests.aot.conftest import cli, python_in

pytestmark = pytest.mark.slow  # builds real (small, Python-only) extension modules

FAST = r"""
#include <Python.h>
static PyObject* answer(PyObject*, PyObject*) { return PyLong_FromLong(ANSWER); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, "the answer"}, {nullptr}};
static PyModuleDef def = {PyModuleDef_HEAD_INIT, MODNAME, nullptr, -1, methods};
#define INIT2(n) PyInit_##n
#define INIT(n) INIT2(n)
PyMODINIT_FUNC INIT(EXTNAME)() { return PyModule_Create(&def); }
"""

MANIFEST = """\
[[extension]]
name = "aot_ext_{A}"
sources = ["fast.cpp"]
extra_cflags = ["-DANSWER={A}", "-DEXTNAME=aot_ext_{A}", "-DMODNAME=\\"aot_ext_{A}\\""]
[extension.grid]
A = [1, 2]
"""

LOAD = """
import json
from cuforge.torch.build import BuildSpec, build
from cuforge.torch import load
out = []
for a in (1, 2):
    flags = [f"-DANSWER={a}", f"-DEXTNAME=aot_ext_{a}", f'-DMODNAME="aot_ext_{a}"']
    r = build(BuildSpec(f"aot_ext_{a}", ["fast.cpp"], extra_cflags=flags))
    m = load(f"aot_ext_{a}", ["fast.cpp"], extra_cflags=flags)
    out.append({"compiled": r.compiled, "linked": r.linked, "answer": m.answer()})
print(json.dumps(out))
"""


def test_extensions_build_hit_and_travel_in_a_bundle(tmp_path):
    root = tmp_path / "ext"
    root.mkdir()
    (root / "fast.cpp").write_text(FAST)
    (root / "cuforge.toml").write_text(MANIFEST)
    bundle = tmp_path / "ext.cfb"
    done = cli(root, "build", "--jobs", "2", "--bundle", str(bundle), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["built"] == 2 and report["bundle_entries"] >= 4

    out = python_in(root, LOAD)
    assert [o["answer"] for o in out] == [1, 2]
    assert all(o["compiled"] == [] and not o["linked"] for o in out)

    again = json.loads(cli(root, "build", "--json").stdout)
    assert again["hits"] == 2 and again["built"] == 0

    other = str(tmp_path / "other-cache")
    assert cli(root, "bundle", "install", str(bundle), CUFORGE_CACHE_DIR=other).returncode == 0
    out = python_in(root, LOAD, CUFORGE_CACHE_DIR=other)
    assert [o["answer"] for o in out] == [1, 2]
    assert all(o["compiled"] == [] and not o["linked"] for o in out)


STRICT = """
import json, os
import cuforge
from cuforge.core.pipeline import OfflineMissError
from cuforge.torch import load
if os.environ.get("BUNDLE"):
    cuforge.load_bundle(os.environ["BUNDLE"])
out = []
for a in (1, 2):
    flags = [f"-DANSWER={a}", f"-DEXTNAME=aot_ext_s{a}", f'-DMODNAME="aot_ext_s{a}"']
    try:
        out.append(load(f"aot_ext_s{a}", ["fast.cpp"], extra_cflags=flags).answer())
    except OfflineMissError as exc:
        out.append(str(exc))
print(json.dumps(out))
"""


def test_strict_mode_refuses_to_build_an_extension_and_a_loaded_bundle_serves_it(tmp_path):
    """CUFORGE_OFFLINE=1: a missing extension raises (naming it and the [[extension]]
    entry to add), and compiles nothing; the same call served by cuforge.load_bundle."""
    root = tmp_path / "ext"
    root.mkdir()
    (root / "fast.cpp").write_text(FAST)
    (root / "cuforge.toml").write_text(MANIFEST.replace("aot_ext_{A}", "aot_ext_s{A}"))
    empty = str(tmp_path / "empty-cache")
    out = python_in(root, STRICT, CUFORGE_OFFLINE="1", CUFORGE_CACHE_DIR=empty)
    for a, message in zip((1, 2), out, strict=True):
        assert f"aot_ext_s{a}" in message and "[[extension]]" in message
        assert "nothing was compiled" in message
    assert not any(n.endswith(".so") for _, _, files in __import__("os").walk(empty) for n in files)

    bundle = tmp_path / "ext.cfb"
    built = cli(root, "build", "--jobs", "2", "--bundle", str(bundle), "--json")
    assert built.returncode == 0, built.stdout + built.stderr
    other = str(tmp_path / "prod-cache")
    out = python_in(root, STRICT, CUFORGE_OFFLINE="1", CUFORGE_CACHE_DIR=other, BUNDLE=str(bundle))
    assert out == [1, 2]
