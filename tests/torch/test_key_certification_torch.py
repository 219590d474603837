"""Certified keys of torch extensions (issue 24, item 3): the rows of
tests/keys/test_key_certification.py's design for ``cuforge.torch`` builds, here because they
import torch (seconds per fresh process), which ``make test-integrations`` runs.

The keys are computed as a build computes them, without compiling: :func:`plan` gives the
load key and each TU's key, a depfile written here stands for the compiler's (so
``_user_headers`` reads it as it reads nvcc's or g++'s), ``_object_key`` adds the headers
and the extension name, ``_link_key`` the objects. :data:`TORCH_MUTATIONS` is the one table:
each row flips one input and names the key field it proves;
:func:`test_every_torch_key_field_has_a_mutation` fails on a field (in the fields, or in
the key builders' source) with no row.
"""

from __future__ import annotations

import copy
import inspect
import os
import re
import shutil
import stat
import tempfile
from typing import Any

import pytest

from cuforge.base.config import CODEGEN_ENV_VARS
from tests.keys.test_key_certification import (
    BlobMutation,
    Call,
    _check_key_row,
    _materialize,
    check_stable,
)

_FILES = {
    "ext.cpp": (
        '#include <torch/extension.h>\n#include "h.h"\n#include <w.h>\n'
        "int f() { return H + W; }\n"
        'PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("f", &f); }\n'
    ),
    "plain.cpp": "int g() { return 1; }\n",
    "k.cu": "__global__ void k(float* x) { x[0] = 1; }\n",
    "h.h": "#define H 1\n",
    "inc/w.h": "#define W 1\n",
}


def _fake_tool(name: str, version: str) -> str:
    """An executable that answers ``--version`` with ``version`` (another compiler)."""
    path = os.path.join(tempfile.mkdtemp(prefix="cuforge-cert-"), name)
    with open(path, "w") as f:
        f.write(f"#!/bin/sh\necho '{version}'\n")
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    return path


def torch_fields(
    root: str,
    *,
    files: dict[str, str] | None = None,
    name: str = "ext",
    sources: tuple[str, ...] = ("ext.cpp", "plain.cpp"),
    write: bool = True,
    **spec_kw: Any,
) -> dict:
    """The labeled key fields of a build of ``sources`` (under ``root``, holding the base
    files and ``files``): the load key's, the object keys' (``object:<file>:<label>``
    where they differ from the load key's) and the link key's ``objects``; ``<key>``: the
    load, object and link keys. ``write``: write the files (False: they are there)."""
    from cuforge.torch import build as B

    if write:
        _materialize(Call(files={**_FILES, **(files or {})}), root)
    spec_kw.setdefault("extra_include_paths", [os.path.join(root, "inc")])
    spec = B.BuildSpec(name, [os.path.join(root, s) for s in sources], **spec_kw)
    p = B.plan(spec)
    fields: dict[str, Any] = dict(p.load_fields)
    keys = [p.load_key]
    torch_header = os.path.join(p.env.torch_dir, "include", "torch", "extension.h")
    # the depfiles in a dir of this process's own: perturbation children run at once and may
    # share a build dir (one child's torch include path must not reach another's key)
    private = tempfile.mkdtemp(prefix="cuforge-depfiles-")
    for tu in p.tus:
        depfile = os.path.join(private, tu.obj + ".d")
        deps = [tu.source, os.path.join(root, "h.h"), os.path.join(root, "inc", "w.h")]
        with open(depfile, "w") as f:
            f.write(f"{tu.obj}: " + " ".join([*deps, torch_header]) + "\n")
        okey = B._object_key(p, tu, B._user_headers(p, tu, depfile))
        tu.okey = okey.hexdigest()
        keys.append(tu.okey)
        for label, value in okey.fields.items():
            if fields.get(label) != value:
                fields[f"object:{os.path.basename(tu.source)}:{label}"] = value
    shutil.rmtree(private, ignore_errors=True)
    fields["objects"] = [t.okey for t in p.tus]
    keys.append(B._link_key(p))
    fields["<key>"] = " ".join(keys)
    return fields


def _pair(mutate: dict[str, Any] | None = None, *, base: dict[str, Any] | None = None):
    """A row's (base, mutated): ``torch_fields(**base)`` and ``torch_fields(**base,
    **mutate)`` in two checkouts."""

    def pair(monkeypatch):
        kw = dict(base or {})
        root = tempfile.mkdtemp(prefix="cuforge-cert-torch-")
        try:
            return (
                torch_fields(os.path.join(root, "a"), **kw),
                torch_fields(os.path.join(root, "b"), **{**kw, **(mutate or {})}),
            )
        finally:
            shutil.rmtree(root, ignore_errors=True)

    return pair


_CUDA = {"sources": ("ext.cpp", "k.cu"), "arch": "sm_90"}


def _env_pair(setenv: dict[str, str], *, build_env: dict[str, str] | None = None, cuda=False):
    """(base, mutated) where the mutated build runs with ``setenv`` set (and, for inputs
    one venv cannot vary, the BuildEnv fields ``build_env`` replaced)."""

    def pair(monkeypatch):
        from cuforge.torch import flags

        kw = _CUDA if cuda else {}
        base = _pair(base=kw)(monkeypatch)[0]
        with monkeypatch.context() as m:
            for var, value in setenv.items():
                m.setenv(var, value)
            if build_env:
                real = flags.build_env()
                other = copy.copy(real)
                for attr, value in build_env.items():
                    setattr(other, attr, value)
                m.setattr(flags, "build_env", lambda: other)
            mutated = _pair(base=kw)(monkeypatch)[1]
        return base, mutated

    return pair


def _version_pair(monkeypatch):
    base = _pair()(monkeypatch)[0]
    with monkeypatch.context() as m:
        m.setattr("cuforge.keys.key.__version__", "999.0.0")
        return base, _pair()(monkeypatch)[1]


def _toolkit_root() -> str:
    from cuforge import toolchain

    return str(toolchain.toolkit_root() or "")


#: each allow-listed codegen variable and a value that must change the key
_ENV_VALUES = {
    "NVCC_PREPEND_FLAGS": lambda: "-lineinfo",
    "NVCC_APPEND_FLAGS": lambda: "-lineinfo",
    "CUDA_HOME": _toolkit_root,
    "CUDA_PATH": _toolkit_root,
    "CUFORGE_EXTRA_OPTIONS": lambda: "-lineinfo",
    "CUFORGE_NVCC": lambda: shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc",
}

TORCH_MUTATIONS: list[BlobMutation] = [
    BlobMutation("torch", "the torch version", _env_pair({}, build_env={"torch_version": "9.9.9"})),
    BlobMutation("torch", "torch's git revision", _env_pair({}, build_env={"torch_git": "0" * 40})),
    BlobMutation("torch", "torch's CUDA", _env_pair({}, build_env={"torch_cuda": "11.8"})),
    BlobMutation("python_abi", "another CPython ABI", _env_pair(
        {}, build_env={"python_abi": "cpython-313 .cpython-313-x86_64-linux-gnu.so"})),
    BlobMutation("cxx", "another C++ compiler (CXX)", lambda mp: _env_pair(
        {"CXX": _fake_tool("c++", "fake-c++ 99.1")})(mp)),
    BlobMutation("nvcc", "another nvcc", lambda mp: _env_pair(
        {"CUFORGE_NVCC": _fake_tool("nvcc", "Cuda compilation tools, release 99.9, V99.9.1")},
        cuda=True)(mp)),
    BlobMutation("nvcc_host", "another host compiler for nvcc (CC)", lambda mp: _env_pair(
        {"CC": _fake_tool("cc", "fake-cc 99.2")}, cuda=True)(mp)),
    BlobMutation("archs", "sm_90 -> sm_80", _pair({"arch": "sm_80"}, base=_CUDA)),
    BlobMutation("archs", "sm_90 -> sm_90 and sm_100", _pair({"arch": ["sm_90", "sm_100"]}, base=_CUDA)),
    *[
        BlobMutation("env", f"{var} set", (lambda v: lambda mp: _env_pair({v: _ENV_VALUES[v]()})(mp))(var))
        for var in _ENV_VALUES
    ],
    BlobMutation("cuforge", "the cuforge version", _version_pair),
    BlobMutation("name", "the extension's name", _pair({"name": "ext2"})),
    BlobMutation("sources", "a source byte", _pair({"files": {"plain.cpp": "int g() { return 2; }\n"}})),
    BlobMutation("object:plain.cpp:source", "a source byte (its object key)", _pair(
        {"files": {"plain.cpp": "int g() { return 2; }\n"}})),
    BlobMutation("object:k.cu:kind", "a .cu compiled by nvcc -> as C++ (with_cuda=False)",
                 _pair({"with_cuda": False}, base=_CUDA)),
    BlobMutation("object:plain.cpp:options", "-O3 (its object key)", _pair({"extra_cflags": ["-O3"]})),
    BlobMutation("object:k.cu:options", "-lineinfo for nvcc (its object key)", _pair(
        {"extra_cuda_cflags": ["-lineinfo"]}, base=_CUDA)),
    BlobMutation("cflags", "-O3", _pair({"extra_cflags": ["-O3"]})),
    BlobMutation("cflags", "another include dir", _pair({"extra_include_paths": ["/opt/inc"]})),
    BlobMutation("cuda_flags", "-lineinfo", _pair({"extra_cuda_cflags": ["-lineinfo"]}, base=_CUDA)),
    BlobMutation("ldflags", "-lm", _pair({"extra_ldflags": ["-lm"]})),
    BlobMutation("mode", "a library, not a Python module", _pair({"is_python_module": False})),
    BlobMutation("mode", "a standalone executable", _pair(
        {"is_standalone": True, "is_python_module": False})),
    BlobMutation("object:plain.cpp:headers", "a header byte via \"h.h\" (the source's dir)",
                 _pair({"files": {"h.h": "#define H 2\n"}})),
    BlobMutation("object:plain.cpp:headers", "a header byte via <w.h> and -I",
                 _pair({"files": {"inc/w.h": "#define W 2\n"}})),
    BlobMutation("object:ext.cpp:extension_name", "the name, in a TU that uses TORCH_EXTENSION_NAME",
                 _pair({"name": "ext2"})),
    BlobMutation("objects", "an object key (a header byte)", _pair({"files": {"h.h": "#define H 3\n"}})),
]  # fmt: skip


@pytest.mark.parametrize(
    "row", TORCH_MUTATIONS, ids=[f"{m.covers}:{m.what}" for m in TORCH_MUTATIONS]
)
def test_torch_key_is_sufficient(row, monkeypatch):
    if (
        row.covers in ("nvcc", "nvcc_host", "archs")
        or "k.cu" in row.covers
        or row.covers == "cuda_flags"
    ):
        try:
            from cuforge.toolchain import compiler_identity

            compiler_identity("nvcc")
        except Exception as exc:  # noqa: BLE001 - no usable nvcc: the CUDA rows cannot run
            pytest.skip(f"nvcc is not usable here ({type(exc).__name__}: {exc})")
    _check_key_row(row, monkeypatch)


def test_a_tu_that_does_not_use_the_name_keys_the_same_under_another_name(monkeypatch):
    """The other direction of the extension_name row: a TU with no use of the name shares
    its object across extensions."""
    base, other = _pair({"name": "ext2"})(monkeypatch)
    assert base["objects"][1] == other["objects"][1]
    assert base["objects"][0] != other["objects"][0]


_LABEL = re.compile(r'\.(?:text|items|mapping)\(\s*"(\w+)"')


def test_every_torch_key_field_has_a_mutation(monkeypatch):
    """A field the torch key builders write (in their source, or in the fields of a CPU
    and a CUDA build) with no row fails."""
    from cuforge.torch import build as B

    covered = {m.covers.rsplit(":", 1)[-1] for m in TORCH_MUTATIONS}
    emitted = {"env", "cuforge"}  # KeyBuilder.environment() and .cuforge_version()
    for fn in (B._base_fields, B.plan, B._object_key, B._link_key):
        emitted |= set(_LABEL.findall(inspect.getsource(fn)))
    assert {"torch", "archs", "headers", "objects"} <= emitted, emitted  # the scan works
    root = tempfile.mkdtemp(prefix="cuforge-cert-torch-")
    try:
        emitted |= set(torch_fields(os.path.join(root, "a"))) - {"<key>"}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    emitted = {label.rsplit(":", 1)[-1] for label in emitted}
    assert emitted <= covered, f"torch key fields with no mutation row: {emitted - covered}"
    env_rows = {m.what.split()[0] for m in TORCH_MUTATIONS if m.covers == "env"}
    assert set(CODEGEN_ENV_VARS) <= env_rows, set(CODEGEN_ENV_VARS) - env_rows


_CHILD = """
from tests.torch.test_key_certification_torch import torch_fields

KEYS = {
    "a": lambda: torch_fields(ROOT, write=False),
    "b": lambda: torch_fields(ROOT, write=False, sources=("ext.cpp", "k.cu"), arch="sm_90"),
}
"""


def test_torch_key_is_stable(tmp_path):
    """The keys and their fields of a CPU and a CUDA build (sources, headers under the
    checkout, the build dir under the cache dir) under each perturbation."""
    from tests.conftest import ROOT

    check_stable(tmp_path, _CHILD, _FILES, pythonpath=ROOT)
