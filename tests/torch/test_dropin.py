"""torch drop-in gaps (issue 11): TORCH_EXTENSIONS_DIR, the module in a chosen build
directory, warnings for ignored arguments, objects shared between load() and setup.py,
the generated binding's checks, and build progress."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
import textwrap

import pytest

from cuforge.samples import torch_ext
from tests.conftest import child_env
from tests.torch.conftest import EXT_NAME

# ------------------------------------------------------------------ TORCH_EXTENSIONS_DIR


def test_torch_extensions_dir_sets_the_default_build_directory(tmp_path, monkeypatch):
    from cuforge.torch.build import BuildSpec, default_build_directory

    source = tmp_path / "a.cpp"
    source.write_text("int x;\n")
    root = tmp_path / "exts"
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(root))
    assert default_build_directory("my_ext") == str(root / "my_ext")
    assert BuildSpec("my_ext", [str(source)]).build_directory == str(root / "my_ext")
    # an explicit build_directory wins over the variable
    mine = tmp_path / "mine"
    assert BuildSpec("my_ext", [str(source)], build_directory=str(mine)).build_directory == str(
        mine
    )
    # unset or empty: cuforge's cache dir
    cache = os.environ["CUFORGE_CACHE_DIR"]
    for value in (None, ""):
        if value is None:
            monkeypatch.delenv("TORCH_EXTENSIONS_DIR")
        else:
            monkeypatch.setenv("TORCH_EXTENSIONS_DIR", value)
        assert default_build_directory("my_ext").startswith(cache + os.sep)
        assert default_build_directory("my_ext").endswith(os.path.join("torch", "build", "my_ext"))


# ------------------------------------------------------------------ ignored arguments


def _ignored_records(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "accepted for compatibility" in r.message]


def test_ignored_arguments_warn_once_per_argument(tmp_path, caplog, monkeypatch):
    from cuforge.torch import load, load_inline

    # warned once per cache: a fresh default cache has warned about nothing
    monkeypatch.setenv("CUFORGE_CACHE_DIR", str(tmp_path / "fresh-cache"))
    caplog.set_level(logging.WARNING, logger="cuforge")
    missing = str(tmp_path / "missing.cu")
    for _ in range(2):
        with pytest.raises(FileNotFoundError):
            load("x", [missing], keep_intermediates=False)
    for _ in range(2):
        with pytest.raises(NotImplementedError):
            load_inline("x", "", sycl_sources=["s"], use_pch=True, keep_intermediates=False)
    with pytest.raises(FileNotFoundError):
        load("x", [missing])  # defaults: nothing to warn about
    messages = _ignored_records(caplog)
    assert len(messages) == 2, messages
    assert any("keep_intermediates=False" in m for m in messages)
    assert any("use_pch=True" in m and "ignored" in m for m in messages)


def test_build_extension_with_options_warns_and_honours_no_python_abi_suffix(
    tmp_path, caplog, monkeypatch
):
    from setuptools import Distribution

    from cuforge.torch import BuildExtension

    monkeypatch.setenv("CUFORGE_CACHE_DIR", str(tmp_path / "fresh-cache"))
    caplog.set_level(logging.WARNING, logger="cuforge")
    cls = BuildExtension.with_options(use_ninja=True, no_python_abi_suffix=True)
    assert _ignored_records(caplog) == []  # both are honoured
    cmd = cls(Distribution())
    cmd.initialize_options()
    cmd.finalize_options()
    assert cmd.get_ext_filename("pkg._C") == os.path.join("pkg", "_C.so")
    plain = BuildExtension(Distribution())
    plain.initialize_options()
    plain.finalize_options()
    assert plain.get_ext_filename("pkg._C") != os.path.join("pkg", "_C.so")
    for _ in range(2):
        BuildExtension.with_options(use_ninja=False, parallel=4)
    messages = _ignored_records(caplog)
    assert len(messages) == 2, messages
    assert any("use_ninja=False" in m for m in messages)
    assert any("parallel=" in m for m in messages)


# ------------------------------------------------------------------ generated binding


def test_generate_binding_checks_devices_and_shapes():
    from cuforge.torch import Op, generate_binding

    header = os.path.join(torch_ext.SAMPLE_DIR, "fast", "kernels.h")
    text = generate_binding(header, ["add", Op("scale")])
    assert (
        'TORCH_CHECK(b.device() == a.device(), "add: b is on ", b.device(), '
        '" but a is on ", a.device(), "; move both to the same device");'
    ) in text
    assert (
        'TORCH_CHECK(b.sizes() == a.sizes(), "add: b has shape ", b.sizes(), '
        '" but a has shape ", a.sizes(), "; they must have the same shape");'
    ) in text
    assert text.count(".device() == ") == 1  # scale has one input: nothing to compare
    # without an element count the shapes may differ: devices are still checked
    header_text = "void launch_mm(const float* a, const float* b, float* out, cudaStream_t s);"
    mm = generate_binding("mm.h", [Op("mm", launcher="launch_mm")], header_text=header_text)
    assert "b.device() == a.device()" in mm and "b.sizes() == a.sizes()" not in mm
    with pytest.raises(ValueError, match="like='zz' is not an input tensor"):
        generate_binding(
            "mm.h", [Op("mm", launcher="launch_mm", like="zz")], header_text=header_text
        )


# ------------------------------------------------------------------ progress


def test_ninja_status_lines_parse():
    from cuforge.torch.ninja_build import _STATUS
    from cuforge.torch.progress import parse_status

    assert parse_status(_STATUS + "[2/5] c++ -c a.cpp", _STATUS) == (2, 5)
    assert parse_status(_STATUS + "[10/10] link", _STATUS) == (10, 10)
    assert parse_status("[2/5] no marker", _STATUS) is None
    assert parse_status("a.cu(3): warning: x", _STATUS) is None
    assert parse_status(_STATUS + "[a/5] x", _STATUS) is None
    assert parse_status(_STATUS + "[2 5] x", _STATUS) is None
    assert parse_status("[3/4] plain") == (3, 4)


class _Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_progress_shows_on_a_terminal_only_and_obeys_ci_and_the_switch(monkeypatch):
    from cuforge.base._progress import enabled

    def progress_enabled(stream, env):
        for name in ("CI", "CUFORGE_PROGRESS"):
            monkeypatch.delenv(name, raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        return enabled(stream)

    tty, pipe = _Stream(True), _Stream(False)
    assert progress_enabled(tty, {}) is True
    assert progress_enabled(pipe, {}) is False
    assert progress_enabled(tty, {"CI": "true"}) is False
    assert progress_enabled(tty, {"CI": "0"}) is True
    assert progress_enabled(pipe, {"CUFORGE_PROGRESS": "1"}) is True
    assert progress_enabled(pipe, {"CUFORGE_PROGRESS": "1", "CI": "true"}) is True
    assert progress_enabled(tty, {"CUFORGE_PROGRESS": "off"}) is False
    assert progress_enabled(tty, {"CUFORGE_PROGRESS": ""}) is True
    with pytest.raises(ValueError, match="CUFORGE_PROGRESS='maybe' is not a switch"):
        progress_enabled(tty, {"CUFORGE_PROGRESS": "maybe"})


def test_build_progress_counts_cached_objects_as_done():
    from cuforge.torch.progress import BuildProgress

    with BuildProgress("ext", total=3, cached=1, enabled=True) as show:
        progress = show._progress
        show.update(1, 3)  # ninja: 1 of 2 compiles + link done
        task = progress.tasks[0]
        assert (task.completed, task.total) == (2, 3)
        show.update(2, 3)
        assert "linking" in progress.tasks[0].description
    with BuildProgress("ext", total=3, cached=1, enabled=False) as show:
        show.update(1, 3)
        assert show._progress is None


# ------------------------------------------------------------------ shared objects (keys)


def _sample(root: str) -> list[str]:
    import shutil

    shutil.copytree(torch_ext.SAMPLE_DIR, root, ignore=shutil.ignore_patterns("__pycache__"))
    return torch_ext.sources("fast", root=root)


def test_only_tus_that_use_the_extension_name_key_it(tmp_path):
    from cuforge.torch.build import BuildSpec, _object_key, plan

    sources = _sample(str(tmp_path / "src"))
    a = plan(BuildSpec("name_a", sources, build_directory=str(tmp_path / "a")))
    b = plan(BuildSpec("name_b", sources, build_directory=str(tmp_path / "b")))
    by_name = {os.path.basename(t.source): (t, u) for t, u in zip(a.tus, b.tus, strict=True)}
    kernels, binding = by_name["kernels.cu"], by_name["binding.cpp"]
    # the TU keys (and so their manifests) do not depend on the name ...
    for ta, tb in (kernels, binding):
        assert ta.key.hexdigest() == tb.key.hexdigest()
        assert "-DTORCH_EXTENSION_NAME=${NAME}" in ta.key.fields["options"]
    # ... the object key does, for the TU that uses TORCH_EXTENSION_NAME only
    headers = {"${SRC}/fast/kernels.h": "0" * 64}  # a digest that does not match: in doubt
    assert _object_key(a, kernels[0], {}).hexdigest() == _object_key(b, kernels[1], {}).hexdigest()
    assert _object_key(a, binding[0], {}).hexdigest() != _object_key(b, binding[1], {}).hexdigest()
    assert (
        _object_key(a, kernels[0], headers).hexdigest()
        != _object_key(b, kernels[1], headers).hexdigest()
    )
    # the load keys still differ: a module is never shared between names
    assert a.load_key != b.load_key


# ------------------------------------------------------------------ real builds

_BINDING = textwrap.dedent(
    """
    // a Python module named by TORCH_EXTENSION_NAME, without torch's headers (fast)
    #include <Python.h>
    #define CF_CAT2(a, b) a##b
    #define CF_CAT(a, b) CF_CAT2(a, b)
    #define CF_STR2(a) #a
    #define CF_STR(a) CF_STR2(a)
    int answer_from_kernels();
    static PyObject* answer(PyObject*, PyObject*) { return PyLong_FromLong(answer_from_kernels()); }
    static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, "the answer"}, {nullptr}};
    static PyModuleDef def = {PyModuleDef_HEAD_INIT, CF_STR(TORCH_EXTENSION_NAME), nullptr, -1,
                              methods};
    PyMODINIT_FUNC CF_CAT(PyInit_, TORCH_EXTENSION_NAME)() { return PyModule_Create(&def); }
    """
)

_KERNELS = textwrap.dedent(
    """
    // TAG
    __global__ void scale_kernel(float* x, float a) { x[threadIdx.x] *= a; }
    int answer_from_kernels() { return 42; }
    """
)


def _small_extension(root, tag: str) -> list[str]:
    csrc = root / "csrc"
    csrc.mkdir(parents=True)
    (csrc / "binding.cpp").write_text(_BINDING)
    (csrc / "small_kernels.cu").write_text(_KERNELS.replace("TAG", tag))
    return [str(csrc / "binding.cpp"), str(csrc / "small_kernels.cu")]


@pytest.mark.slow
def test_the_module_appears_in_the_chosen_build_directory(tmp_path, torch_env, monkeypatch):
    import uuid

    from cuforge.torch import load

    sources = _small_extension(tmp_path, uuid.uuid4().hex)
    bdir = tmp_path / "build"
    mod = load("cf_small_publish", sources, build_directory=str(bdir))
    assert mod.answer() == 42
    published = bdir / "cf_small_publish.so"
    from cuforge.torch.build import last_build

    assert os.path.samefile(published, last_build["path"])  # a hard link here
    # removed, it comes back on the next load, from the cache (nothing compiled)
    os.unlink(published)
    torch_env.reset()
    other = tmp_path / "build2"
    from cuforge.torch.build import BuildSpec, build

    for d in (bdir, other):
        result = build(BuildSpec("cf_small_publish", sources, build_directory=str(d)))
        assert result.source in ("cache", "objects")
        assert os.path.samefile(d / "cf_small_publish.so", result.path)
    assert torch_env.compiles() == 0 and torch_env.links() == 0
    # TORCH_EXTENSIONS_DIR: the module appears in $TORCH_EXTENSIONS_DIR/<name>
    exts = tmp_path / "exts"
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(exts))
    build(BuildSpec("cf_small_publish", sources))
    assert (exts / "cf_small_publish" / "cf_small_publish.so").is_file()


_SETUP = textwrap.dedent(
    """
    from setuptools import setup
    from cuforge.torch import BuildExtension, CUDAExtension
    setup(
        name="shared_demo",
        ext_modules=[CUDAExtension("shared_demo._C", ["csrc/binding.cpp", "csrc/small_kernels.cu"])],
        cmdclass={"build_ext": BuildExtension},
    )
    """
)


@pytest.mark.slow
def test_load_and_setup_py_share_the_objects_that_do_not_use_the_name(tmp_path, torch_env):
    import uuid

    from cuforge.torch import load

    project = tmp_path / "proj"
    sources = _small_extension(project, uuid.uuid4().hex)
    mod = load("shared_jit", sources, build_directory=str(tmp_path / "jit"))
    assert mod.answer() == 42 and mod.__name__ == "shared_jit"
    assert torch_env.compiles("small_kernels.cu") == 1
    assert torch_env.compiles("binding.cpp") == 1
    torch_env.reset()
    (project / "shared_demo").mkdir()
    (project / "shared_demo" / "__init__.py").write_text("")
    (project / "setup.py").write_text(_SETUP)
    done = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
        cwd=project,
        env=child_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # the kernels' object is reused; the binding, which uses TORCH_EXTENSION_NAME, is not
    assert torch_env.compiles("small_kernels.cu") == 0
    assert torch_env.compiles("binding.cpp") == 1
    check = "import shared_demo._C as m; print(m.answer(), m.__name__)"
    out = subprocess.run(
        [sys.executable, "-c", check], cwd=project, env=child_env(), capture_output=True, text=True
    )
    assert out.stdout.split() == ["42", "shared_demo._C"], out.stderr
    # and back: the JIT build under its own name is still served, not the _C binding
    torch_env.reset()
    from cuforge.torch.build import BuildSpec, build

    again = build(BuildSpec("shared_jit", sources, build_directory=str(tmp_path / "jit2")))
    assert torch_env.compiles() == 0
    assert again.source in ("cache", "objects")


@pytest.mark.slow
def test_a_generated_binding_compiles(ext, torch_env):
    """The generated checks are valid C++ against torch's headers (a GPU test would
    trigger them)."""
    from cuforge.torch import Op, build_extension, generate_binding

    header = os.path.join(os.path.dirname(ext.binding), "kernels.h")
    generate_binding(header, ["add", Op("scale"), "relu"], output=ext.binding)
    result = build_extension(ext.spec())
    assert torch_env.compiles("binding.cpp") == 1
    assert os.path.isfile(result.path)
    assert EXT_NAME in os.path.basename(result.path)
