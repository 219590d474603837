"""Reading kernel declarations from CUDA source (no GPU needed)."""

from __future__ import annotations

import pytest

from cuforge.runtime.signature import (
    find_kernel,
    kernel_names,
    parse_kernels,
    parse_param,
    split_name_expression,
)
from cuforge.samples import sample_path


def _types(params):
    return [(p.name, p.type, p.kind, p.code) for p in params]


def test_samples():
    src = open(sample_path("saxpy.cu")).read()
    assert kernel_names(src) == ["saxpy", "saxpy_half"]
    decl, params = find_kernel(src, "saxpy")
    assert decl.extern_c and not decl.is_template
    assert _types(params) == [
        ("y", "float*", "pointer", "f"),
        ("x", "const float*", "pointer", "f"),
        ("a", "float", "scalar", "f"),
        ("n", "int", "scalar", "i"),
    ]
    _, params = find_kernel(src, "saxpy_half")
    assert params[0].code == "e" and params[0].base == "__half"


def test_template_instance_substitutes_arguments():
    src = open(sample_path("block_reduce.cu")).read()
    assert kernel_names(src) == ["block_sum<BLOCK, T>"]
    decl, params = find_kernel(src, "block_sum<256, float>")
    assert decl.is_template
    assert _types(params) == [
        ("in", "const float*", "pointer", "f"),
        ("out", "float*", "pointer", "f"),
        ("n", "int", "scalar", "i"),
    ]
    _, params = find_kernel(src, "block_sum< 128 , double >")
    assert [p.type for p in params] == ["const double*", "double*", "int"]
    # a template without arguments cannot be instantiated
    decl, params = find_kernel(src, "block_sum")
    assert decl.is_template and params is None


def test_template_defaults_and_namespaces():
    src = """
    namespace ops {
    template <typename T, typename Acc = float, int N = 4>
    __global__ void __launch_bounds__(256, 2) scale(T* __restrict__ out, const T* in, Acc s) {}
    }
    """
    _, params = find_kernel(src, "ops::scale<__half>")
    assert [p.type for p in params] == ["__half*", "const __half*", "float"]
    _, params = find_kernel(src, "&ops::scale<double, double, 8>")
    assert [p.code for p in params] == ["d", "d", "d"]


def test_extern_c_block_comments_and_attributes():
    src = """
    #include <cuda_fp16.h>
    #define WIDTH 4   // a macro line is skipped
    /* __global__ void commented_out(int x) {} */
    extern "C" {
    // __global__ void also_commented(float y);
    __global__ void
    __launch_bounds__(128)
    k1(const float* __restrict__ a, unsigned long long n, size_t m,
       struct Params p, int arr[4], float2 v, __grid_constant__ const Params q) { }
    __global__ void k2(void) {}
    __global__ void k3(float*, int);
    }
    __global__ void cxx_kernel(double* d, long long x = 3) {}
    """
    names = kernel_names(src)
    assert names == ["k1", "k2", "k3", "cxx_kernel"]
    decls = {d.name: d for d in parse_kernels(src)}
    assert decls["k1"].extern_c and decls["k3"].extern_c and not decls["cxx_kernel"].extern_c
    _, params = find_kernel(src, "k1")
    assert _types(params) == [
        ("a", "const float*", "pointer", "f"),
        ("n", "unsigned long long", "scalar", "Q"),
        ("m", "size_t", "scalar", "Q"),
        ("p", "struct Params", "struct", None),
        ("arr", "int*", "pointer", "i"),
        ("v", "float2", "struct", None),
        ("q", "const Params", "struct", None),
    ]
    assert find_kernel(src, "k2")[1] == []
    assert _types(find_kernel(src, "k3")[1]) == [
        (None, "float*", "pointer", "f"),
        (None, "int", "scalar", "i"),
    ]
    assert _types(find_kernel(src, "cxx_kernel")[1]) == [
        ("d", "double*", "pointer", "d"),
        ("x", "long long", "scalar", "q"),
    ]


@pytest.mark.parametrize(
    "text,expected",
    [
        ("int n", ("n", "int", "scalar", "i", 4)),
        ("unsigned n", ("n", "unsigned", "scalar", "I", 4)),
        ("unsigned int", (None, "unsigned int", "scalar", "I", 4)),
        ("const int64_t count", ("count", "const int64_t", "scalar", "q", 8)),
        ("std::uint32_t u", ("u", "std::uint32_t", "scalar", "I", 4)),
        ("bool flag", ("flag", "bool", "scalar", "?", 1)),
        ("__nv_bfloat16 b", ("b", "__nv_bfloat16", "scalar", "bf16", 2)),
        ("signed char c", ("c", "signed char", "scalar", "b", 1)),
        ("short s", ("s", "short", "scalar", "h", 2)),
        ("void* p", ("p", "void*", "pointer", None, 8)),
        ("float** pp", ("pp", "float**", "pointer", None, 8)),
        (
            "volatile unsigned char* __restrict__ buf",
            ("buf", "volatile unsigned char*", "pointer", "B", 8),
        ),
        ("MyStruct s", ("s", "MyStruct", "struct", None, None)),
        ("cuda::std::size_t n", ("n", "cuda::std::size_t", "scalar", "Q", 8)),
    ],
)
def test_parse_param(text, expected):
    p = parse_param(0, text)
    assert (p.name, p.type, p.kind, p.code, p.size) == expected


def test_split_name_expression():
    assert split_name_expression("block_sum<256, float>") == ("block_sum", ["256", "float"])
    assert split_name_expression("&ns::f<Pair<int, int>, 3>") == ("f", ["Pair<int, int>", "3"])
    assert split_name_expression("saxpy") == ("saxpy", None)


def test_no_kernel_and_no_source():
    assert find_kernel("__device__ int f(int x) { return x; }", "f") == (None, None)
    assert find_kernel(None, "f") == (None, None)
    assert kernel_names("") == []
