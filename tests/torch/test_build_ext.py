"""The setup.py helper: same pipeline, same object cache as load()."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import child_env

pytestmark = pytest.mark.slow  # builds a real extension

_MODULE = textwrap.dedent(
    """
    #include <Python.h>
    static PyObject* answer(PyObject*, PyObject*) { return PyLong_FromLong(ANSWER); }
    static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, "the answer"}, {nullptr}};
    static PyModuleDef def = {PyModuleDef_HEAD_INIT, "_fast", nullptr, -1, methods};
    PyMODINIT_FUNC PyInit__fast() { return PyModule_Create(&def); }
    """
)

_SETUP = textwrap.dedent(
    """
    from setuptools import setup
    from cuforge.torch import BuildExtension, CppExtension
    setup(
        name="aot_demo",
        ext_modules=[CppExtension("aot_demo._fast", ["csrc/fast.cpp"],
                                  extra_compile_args={"cxx": ["-DANSWER=42"]})],
        cmdclass={"build_ext": BuildExtension},
    )
    """
)


def _build_ext(project: str) -> None:
    done = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
        cwd=project,
        env=child_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_setup_py_builds_through_the_object_cache(tmp_path, torch_env):
    project = tmp_path / "proj"
    (project / "csrc").mkdir(parents=True)
    (project / "aot_demo").mkdir()
    (project / "aot_demo" / "__init__.py").write_text("")
    (project / "csrc" / "fast.cpp").write_text(_MODULE)
    (project / "setup.py").write_text(_SETUP)
    _build_ext(str(project))
    assert torch_env.compiles("fast.cpp") == 1
    check = "import aot_demo._fast as m; print(m.answer())"
    out = subprocess.run(
        [sys.executable, "-c", check], cwd=project, env=child_env(), capture_output=True, text=True
    )
    assert out.stdout.strip() == "42", out.stderr
    # a fresh checkout of the same sources: nothing is compiled or linked again
    clone = tmp_path / "clone"
    subprocess.run(["cp", "-r", str(project), str(clone)], check=True)
    subprocess.run(["rm", "-rf", os.path.join(clone, "build")], check=True)
    for name in os.listdir(clone / "aot_demo"):
        if name.endswith(".so"):
            os.unlink(clone / "aot_demo" / name)
    torch_env.reset()
    _build_ext(str(clone))
    assert torch_env.compiles() == 0 and torch_env.links() == 0
    out = subprocess.run(
        [sys.executable, "-c", check], cwd=clone, env=child_env(), capture_output=True, text=True
    )
    assert out.stdout.strip() == "42", out.stderr
