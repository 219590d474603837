"""The bare NVRTC compiler, for an explicit arch (no GPU needed). Real NVRTC, no mocks."""

from __future__ import annotations

import textwrap
import threading

import pytest

from cuforge.base.errors import ArchError, CompileError
from cuforge.compiler.nvrtc import compile_nvrtc, nvrtc_options
from cuforge.compiler.symbols import elf_symbols, ptx_symbols
from cuforge.toolchain import toolkit_include_dirs

SAXPY = textwrap.dedent(
    """
    extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) y[i] = a * x[i] + y[i];
    }
    """
)

TEMPLATE = textwrap.dedent(
    """
    namespace ops {
    template <int N, typename T>
    __global__ void fill(T* out) { out[threadIdx.x] = T(N); }
    }
    __device__ int counter;
    """
)

CUB = textwrap.dedent(
    """
    #include <cub/block/block_reduce.cuh>
    #include <cuda_fp16.h>
    template <int BLOCK, typename T>
    __global__ void block_sum(const T* in, T* out, int n) {
        using Reduce = cub::BlockReduce<T, BLOCK>;
        __shared__ typename Reduce::TempStorage tmp;
        T v = threadIdx.x < n ? in[threadIdx.x] : T(0);
        T s = Reduce(tmp).Sum(v);
        if (threadIdx.x == 0) *out = s;
    }
    """
)


def test_extern_c_kernel_to_cubin():
    out = compile_nvrtc(SAXPY, name="saxpy.cu", options=("-std=c++17",), arch="sm_90")
    assert out.binary.startswith(b"\x7fELF")
    assert "saxpy" in [s.name for s in elf_symbols(out.binary)]
    assert out.lowered_names == {}
    assert out.dependencies is None  # NVRTC 13 reports none: the pipeline scans includes
    assert out.options == nvrtc_options(("-std=c++17",), "sm_90", "cubin")
    assert out.seconds > 0


def test_ptx_output():
    out = compile_nvrtc(SAXPY, name="saxpy.cu", options=(), arch="9.0", output="ptx")
    text = out.binary.decode()
    assert text.startswith("//")
    assert ".target sm_90" in text
    assert "saxpy" in [s.name for s in ptx_symbols(text)]
    assert not out.binary.endswith(b"\0")


def test_name_expressions_give_lowered_names():
    # as with NVRTC itself, a variable's expression takes its address
    exprs = ("ops::fill<4, float>", "&ops::fill<2, double>", "&counter")
    out = compile_nvrtc(
        TEMPLATE, name="fill.cu", options=("-std=c++17",), arch="sm_90", name_expressions=exprs
    )
    assert set(out.lowered_names) == set(exprs)
    assert out.lowered_names["ops::fill<4, float>"].startswith("_ZN3ops4fill")
    assert out.lowered_names["&counter"] == "counter"
    names = {s.name for s in elf_symbols(out.binary)}
    assert out.lowered_names["ops::fill<4, float>"] in names
    assert out.lowered_names["&ops::fill<2, double>"] in names


def test_cub_and_toolkit_headers_compile():
    out = compile_nvrtc(
        CUB,
        name="block_sum.cu",
        options=("-std=c++17",),
        arch="sm_90",
        name_expressions=("block_sum<256, float>",),
    )
    assert out.binary.startswith(b"\x7fELF")
    assert out.lowered_names["block_sum<256, float>"].startswith("_Z9block_sum")


def test_in_memory_headers():
    src = '#include "scale.cuh"\nextern "C" __global__ void k(float* x) { *x *= SCALE; }\n'
    out = compile_nvrtc(
        src, name="k.cu", options=(), arch="sm_90", headers={"scale.cuh": "#define SCALE 3.0f\n"}
    )
    assert out.binary.startswith(b"\x7fELF")


def test_syntax_error_names_file_and_line():
    src = 'extern "C" __global__ void k(float* x) {\n    *x = 1.0f;\n    undefined_thing(x);\n}\n'
    with pytest.raises(CompileError) as info:
        compile_nvrtc(src, name="kernels/broken.cu", options=(), arch="sm_90")
    err = info.value
    assert err.backend == "nvrtc"
    assert err.name == "kernels/broken.cu"
    assert "undefined_thing" in err.log
    first = err.diagnostics[0]
    assert first.file == "kernels/broken.cu" and first.line == 3
    text = str(err)
    assert "kernels/broken.cu:3" in text
    assert "undefined_thing(x);" in text  # the offending line is quoted
    assert err.options and "-arch=sm_90" in err.options


def test_compile_error_names_the_file_once_in_its_headline():
    src = 'extern "C" __global__ void k(float* x) {\n    *x = 1.0f;\n    undefined_thing(x);\n}\n'
    with pytest.raises(CompileError) as info:
        compile_nvrtc(src, name="kernels/broken.cu", options=(), arch="sm_90")
    text = str(info.value)
    headline = text.splitlines()[0]
    assert headline.startswith("kernels/broken.cu:3: error: "), headline
    assert "undefined_thing" in headline and "nvrtc" in headline
    assert headline.count("broken.cu") == 1, headline
    # the log follows, with each error's file and line as the compiler wrote them, and
    # without the "1 error detected in the compilation of ..." trailer
    assert "kernels/broken.cu(3): error:" in text
    assert "detected in the compilation" not in text
    assert text.count("broken.cu") == 2, text
    # two errors: the headline counts the others
    two = src.replace("*x = 1.0f;", "other_thing(x);")
    with pytest.raises(CompileError) as info:
        compile_nvrtc(two, name="kernels/broken.cu", options=(), arch="sm_90")
    headline = str(info.value).splitlines()[0]
    assert headline.startswith("kernels/broken.cu:2: error: ") and "1 more error below" in headline
    assert headline.count("broken.cu") == 1, headline


def test_compile_error_in_a_header_names_the_header_and_the_source_once():
    src = '#include "scale.cuh"\nextern "C" __global__ void k(float* x) { *x *= SCALE; }\n'
    with pytest.raises(CompileError) as info:
        compile_nvrtc(
            src,
            name="k.cu",
            options=(),
            arch="sm_90",
            headers={"scale.cuh": "#define SCALE 3.0f\n__device__ int broken = missing_name;\n"},
        )
    headline = str(info.value).splitlines()[0]
    assert headline.startswith("scale.cuh:2: error: "), headline
    assert headline.count("k.cu") == 1 and headline.endswith("(compiling k.cu with nvrtc)")


def test_empty_source():
    for src in ("", "   \n\t\n"):
        with pytest.raises(ValueError, match="empty"):
            compile_nvrtc(src, name="empty.cu", options=(), arch="sm_90")


def test_unknown_option_names_the_option():
    with pytest.raises(CompileError) as info:
        compile_nvrtc(SAXPY, name="saxpy.cu", options=("--no-such-flag",), arch="sm_90")
    assert "--no-such-flag" in info.value.summary
    assert "rejected" in info.value.summary
    headline = str(info.value).splitlines()[0]
    assert headline.startswith("compiling saxpy.cu with nvrtc failed: NVRTC rejected option")
    assert headline.count("saxpy.cu") == 1, headline


def test_bad_arch():
    with pytest.raises(ArchError, match="sm_99"):
        compile_nvrtc(SAXPY, name="saxpy.cu", options=(), arch="sm_99")
    with pytest.raises(ArchError, match="sm_9x"):
        compile_nvrtc(SAXPY, name="saxpy.cu", options=(), arch="sm_9x")
    with pytest.raises(ArchError, match="real arch"):
        compile_nvrtc(SAXPY, name="saxpy.cu", options=(), arch="compute_90")


def test_option_list_is_exact():
    opts = nvrtc_options(("-std=c++17", "-DTILE=32"), "9.0", "cubin")
    assert opts[:3] == ("-std=c++17", "-DTILE=32", "-arch=sm_90")
    assert opts[3:] == tuple(f"-I{d}" for d in toolkit_include_dirs())
    assert nvrtc_options((), "sm_90a", "ptx")[0] == "-arch=compute_90a"
    with pytest.raises(ValueError, match="arch="):
        nvrtc_options(("-arch=sm_80",), "sm_90", "cubin")
    with pytest.raises(ValueError, match="nvcc"):
        nvrtc_options((), "sm_90", "fatbin")


def test_concurrent_compiles_from_threads():
    results: dict[int, bytes] = {}
    errors: list[BaseException] = []

    def work(i: int) -> None:
        src = f'extern "C" __global__ void k{i}(int* x) {{ *x = {i}; }}\n'
        try:
            results[i] = compile_nvrtc(src, name=f"k{i}.cu", options=(), arch="sm_90").binary
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for i, binary in results.items():
        assert f"k{i}" in {s.name for s in elf_symbols(binary)}
