"""The bare nvcc compiler, for explicit archs (no GPU needed), and the symbol helpers it
uses for name expressions. Real nvcc, no mocks; few compiles (each costs about a second)."""

from __future__ import annotations

import os
import textwrap

import pytest

from cuforge.base.errors import ArchError, CompileError, ToolchainError
from cuforge.compiler.nvcc import compile_nvcc, nvcc_command
from cuforge.compiler.symbols import (
    Symbol,
    elf_symbols,
    embedded_elves,
    entity_name,
    match_name_expressions,
    ptx_symbols,
)
from cuforge.toolchain import nvcc_path

try:
    nvcc_path()
    HAVE_NVCC = True
except ToolchainError:
    HAVE_NVCC = False
needs_nvcc = pytest.mark.skipif(not HAVE_NVCC, reason="no nvcc (CUDA toolkit) found")

KERNEL = textwrap.dedent(
    """\
    #include "local.cuh"
    namespace ops {
    template <int N, typename T>
    __global__ void fill(T* out) { out[threadIdx.x] = T(N) * SCALE; }
    }
    extern "C" __global__ void plain(float* x) { *x = SCALE; }
    __device__ int counter;
    """
)
EXPRS = ("ops::fill<4, float>", "ops::fill< 2,double >", "plain", "&counter")


@pytest.fixture
def project(tmp_path):
    """A source with a relative include (found in its own dir) that includes a header
    found only through -I."""
    src_dir = tmp_path / "src"
    inc = tmp_path / "include"
    src_dir.mkdir()
    inc.mkdir()
    (src_dir / "local.cuh").write_text('#pragma once\n#include "common.cuh"\n')
    (inc / "common.cuh").write_text("#pragma once\n#define SCALE 2\n")
    (src_dir / "fill.cu").write_text(KERNEL)
    return tmp_path


def _compile(project, output, archs, **kw):
    return compile_nvcc(
        KERNEL,
        name=str(project / "src" / "fill.cu"),
        options=(f"-I{project / 'include'}", "-std=c++17"),
        archs=archs,
        output=output,
        name_expressions=kw.pop("name_expressions", EXPRS),
        source_dir=str(project / "src"),
        **kw,
    )


def _check_lowered(lowered, names):
    assert set(lowered) == set(EXPRS)
    assert lowered["ops::fill<4, float>"].startswith("_ZN3ops4fillILi4EfEEv")
    assert lowered["ops::fill< 2,double >"].startswith("_ZN3ops4fillILi2EdEEv")
    assert lowered["plain"] == "plain"
    assert lowered["&counter"] == "counter"
    for mangled in lowered.values():
        assert mangled in names


@needs_nvcc
def test_cubin_with_dependencies_and_name_expressions(project, monkeypatch):
    # a relative -I in options means what it would on the caller's command line
    monkeypatch.chdir(project)
    out = compile_nvcc(
        KERNEL,
        name=str(project / "src" / "fill.cu"),
        options=("-Iinclude", "-std=c++17"),
        archs=["sm_90"],
        name_expressions=EXPRS,
        source_dir=str(project / "src"),
    )
    assert out.binary.startswith(b"\x7fELF")
    assert out.options == nvcc_command(("-Iinclude", "-std=c++17"), ["sm_90"], "cubin")
    deps = out.dependencies
    assert str(project / "src" / "local.cuh") in deps  # the relative include
    assert str(project / "include" / "common.cuh") in deps  # found through -I
    assert all(os.path.isabs(d) for d in deps)
    assert not any("cuforge-nvcc-" in d for d in deps)  # the temp source is dropped
    _check_lowered(out.lowered_names, {s.name for s in elf_symbols(out.binary)})


@needs_nvcc
def test_ptx_with_name_expressions(project):
    out = _compile(project, "ptx", ["sm_90"])
    text = out.binary.decode()
    assert ".entry" in text and ".target sm_90" in text
    _check_lowered(out.lowered_names, {s.name for s in ptx_symbols(text)})


@needs_nvcc
def test_fatbin_for_two_archs(project):
    out = _compile(project, "fatbin", ["sm_80", "sm_90"])
    assert "--threads" in out.options
    assert out.binary[:4] == bytes.fromhex("50ed55ba")  # fatbin magic 0xBA55ED50
    assert len(embedded_elves(out.binary)) == 2
    names = {s.name for img in embedded_elves(out.binary) for s in elf_symbols(img)}
    _check_lowered(out.lowered_names, names)


@needs_nvcc
def test_compile_error_points_at_the_users_file_and_line(tmp_path):
    src = 'extern "C" __global__ void k(float* x) {\n    *x = 1.0f;\n    undefined_thing(x);\n}\n'
    with pytest.raises(CompileError) as info:
        compile_nvcc(src, name="kernels/broken.cu", options=(), archs=["sm_90"])
    err = info.value
    assert err.backend == "nvcc"
    assert "cuforge-nvcc-" not in err.log  # the temp path is gone
    first = err.diagnostics[0]
    assert (first.file, first.line) == ("kernels/broken.cu", 3)
    assert "kernels/broken.cu:3" in str(err)
    assert "undefined_thing(x);" in str(err)
    headline = str(err).splitlines()[0]
    assert headline.startswith("kernels/broken.cu:3: error: ") and "nvcc" in headline
    assert headline.count("broken.cu") == 1, headline


@needs_nvcc
def test_unknown_option_bad_arch_and_empty_source():
    src = 'extern "C" __global__ void k() {}\n'
    with pytest.raises(CompileError) as info:
        compile_nvcc(src, name="k.cu", options=("--no-such-flag",), archs=["sm_90"])
    assert "--no-such-flag" in info.value.summary
    assert str(info.value).splitlines()[0].count("k.cu") == 1, str(info.value)
    with pytest.raises(ArchError, match="sm_99"):
        compile_nvcc(src, name="k.cu", options=(), archs=["sm_99"])
    with pytest.raises(ValueError, match="empty"):
        compile_nvcc("  \n", name="k.cu", options=(), archs=["sm_90"])


def test_nvcc_command_is_exact():
    assert nvcc_command(("-O3",), ["9.0"], "cubin") == ("-cubin", "-arch=sm_90", "-O3")
    assert nvcc_command((), ["sm_90a"], "ptx") == ("-ptx", "-arch=compute_90a")
    assert nvcc_command(("-lineinfo",), ["sm_80", "sm_90", "compute_90"], "fatbin") == (
        "-fatbin",
        "-gencode=arch=compute_80,code=sm_80",
        "-gencode=arch=compute_90,code=sm_90",
        "-gencode=arch=compute_90,code=compute_90",
        "--threads",
        "0",
        "-lineinfo",
    )
    assert "--threads" not in nvcc_command((), ["sm_90"], "fatbin")
    with pytest.raises(ArchError, match="fatbin"):
        nvcc_command((), ["sm_80", "sm_90"], "cubin")
    with pytest.raises(ArchError, match="real arch"):
        nvcc_command((), ["compute_90"], "cubin")
    with pytest.raises(ValueError, match="arch="):
        nvcc_command(("-arch=sm_80",), ["sm_90"], "cubin")
    with pytest.raises(ValueError, match="output"):
        nvcc_command((), ["sm_90"], "exe")


# -- the symbol helpers ---------------------------------------------------------------


def test_entity_name_strips_return_type_and_parameters():
    assert entity_name("void ops::fill<4, float>(float*)") == "ops::fill<4, float>"
    assert entity_name("plain") == "plain"
    assert (
        entity_name("void (anonymous namespace)::k<unsigned int, 3>(float const*, int (*)(int))")
        == "(anonymous namespace)::k<unsigned int, 3>"
    )


def test_match_name_expressions_ignores_whitespace_and_reports_misses():
    symbols = [
        Symbol("_ZN3ops4fillILi4EfEEvPT0_", "func", "global"),
        Symbol("_ZN3ops4fillILi2EdEEvPT0_", "func", "global"),
        Symbol("counter", "object", "local"),
    ]
    found, missing = match_name_expressions(
        ["ops::fill<4,float>", "& ops::fill<2, double>", "&counter", "ops::fill<8, int>"],
        symbols,
    )
    assert found == {
        "ops::fill<4,float>": "_ZN3ops4fillILi4EfEEvPT0_",
        "& ops::fill<2, double>": "_ZN3ops4fillILi2EdEEvPT0_",
        "&counter": "counter",
    }
    assert missing == ["ops::fill<8, int>"]


def test_ptx_symbols_reads_entries_functions_and_variables():
    ptx = textwrap.dedent(
        """\
        .visible .entry _Z4kernPf(
        .visible .func  (.param .b32 func_retval0) _Z3fooi(
        .func _Z3bari(
        .extern .func (.param .b32 func_retval0) vprintf
        .global .align 4 .u32 counter;
        .const .align 4 .b8 table[16];
        """
    )
    names = [s.name for s in ptx_symbols(ptx)]
    assert names == ["_Z4kernPf", "_Z3fooi", "_Z3bari", "vprintf", "counter", "table"]


def test_elf_reader_rejects_non_elf():
    with pytest.raises(ValueError):
        elf_symbols(b"not an elf at all" * 8)
    assert embedded_elves(b"\x7fELF" + b"\0" * 10) == []
