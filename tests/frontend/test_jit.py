"""cuforge.jit on the CPU (compile only, explicit arch): dtype -> C++ mapping, deduction and
its errors, specialization keys, the per-call lookup table, a second process's disk hit."""

from __future__ import annotations

import os

import numpy as np
import pytest

import cuforge
from cuforge.core.pipeline import counters
from cuforge.frontend.jitkernel import SpecializationError, cxx_type
from tests.conftest import child_env, run_python

torch = pytest.importorskip("torch")

ARCH = "sm_80"

SCALE = r"""
template <typename T, int BLOCK>
__global__ void scale(const T* __restrict__ x, T* out, T alpha, int n) {
    int i = blockIdx.x * BLOCK + threadIdx.x;
    if (i < n) out[i] = x[i] * alpha;
}
"""

MIXED = r"""
template <typename T, typename U, int BLOCK = 128>
__global__ void convert(const T* x, U* y, U bias, int n) {
    int i = blockIdx.x * BLOCK + threadIdx.x;
    if (i < n) y[i] = (U)x[i] + bias;
}
"""

SCALAR_ONLY = r"""
template <typename T>
__global__ void fill(float* out, T value, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = (float)(value * TILE);
}
"""


# -- dtype -> C++ ----------------------------------------------------------------------------

_EXPECTED = {
    "float16": "__half",
    "bfloat16": "__nv_bfloat16",
    "float32": "float",
    "float64": "double",
    "int8": "signed char",
    "int16": "short",
    "int32": "int",
    "int64": "long long",
    "uint8": "unsigned char",
    "uint16": "unsigned short",
    "uint32": "unsigned int",
    "uint64": "unsigned long long",
    "bool": "bool",
}


@pytest.mark.parametrize("name,cxx", sorted(_EXPECTED.items()))
def test_dtype_mapping_every_spelling(name, cxx):
    assert cxx_type(name) == cxx
    tdt = getattr(torch, name, None)
    if tdt is not None:
        assert cxx_type(tdt) == cxx
    if name != "bfloat16":
        assert cxx_type(np.dtype(name)) == cxx
        assert cxx_type(np.dtype(name).type) == cxx  # numpy.float32, the scalar type
    assert cxx_type(cxx) == cxx  # a C++ name maps to itself


@pytest.mark.parametrize(
    "dl,cxx",
    [((2, 16, 1), "__half"), ((4, 16, 1), "__nv_bfloat16"), ((2, 32, 1), "float"),
     ((0, 8, 1), "signed char"), ((1, 64, 1), "unsigned long long"), ((6, 8, 1), "bool")],
)  # fmt: skip
def test_dtype_mapping_dlpack_codes(dl, cxx):
    assert cxx_type(dl) == cxx


def test_dtype_mapping_aliases_and_free_cxx_names():
    assert cxx_type(torch.half) == "__half"
    assert cxx_type(torch.double) == "double"
    assert cxx_type(bool) == "bool"
    assert cxx_type("half") == "__half"
    assert cxx_type("float4") == "float4"  # a C++ type name is kept as it is
    assert cxx_type("unsigned   int") == "unsigned int"


@pytest.mark.parametrize(
    "dtype", [torch.complex64, np.dtype("complex128"), "float8", "complex64", (2, 32, 2)]
)
def test_dtype_without_mapping_is_an_error_naming_it(dtype):
    with pytest.raises(SpecializationError, match=r"no C\+\+ type|DLPack dtype"):
        cxx_type(dtype)


def test_python_number_types_are_refused_with_a_hint():
    with pytest.raises(SpecializationError, match="numpy.float32"):
        cxx_type(float)
    with pytest.raises(SpecializationError, match="not a dtype"):
        cxx_type(object())


# -- deduction -------------------------------------------------------------------------------


def test_deduction_from_every_dtype_gives_one_specialization_each():
    k = cuforge.jit(SCALE, "scale", arch=ARCH)
    seen = {}
    for name, cxx in _EXPECTED.items():
        dt = getattr(torch, name, None)
        if dt is None:
            continue
        x = torch.zeros(2, dtype=dt)
        exe = k.compile(x, x, 1, 2, BLOCK=64)
        assert exe.name == f"scale<{cxx}, 64>"
        assert [p.type for p in exe.params] == [f"const {cxx}*", f"{cxx}*", cxx, "int"]
        seen[cxx] = exe
    assert len({id(e) for e in seen.values()}) == len(seen)
    assert len(k.specializations) == len(seen)


def test_deduction_from_numpy_arrays_and_explicit_types_agree():
    k = cuforge.jit(SCALE, "scale", arch=ARCH)
    a = np.zeros(4, dtype=np.float32)
    exe = k.compile(a, a, 1.0, 4, BLOCK=32)
    assert k.compile(torch.zeros(1), torch.zeros(1), 1.0, 4, BLOCK=32) is exe
    assert k.specialize(T="float", BLOCK=32) is exe
    assert k.specialize(T=torch.float32, BLOCK=32) is exe
    assert k.specialize(T=np.float32, BLOCK=32) is exe
    assert k.specialize(T="float32", BLOCK=32) is exe
    assert counters["compiles"] == 1


def test_deduction_conflict_names_the_parameter_and_both_arguments():
    k = cuforge.jit(SCALE, "scale", arch=ARCH)
    x = torch.zeros(2, dtype=torch.float32)
    y = torch.zeros(2, dtype=torch.float16)
    with pytest.raises(SpecializationError) as err:
        k.compile(x, y, 1.0, 2, BLOCK=64)
    msg = str(err.value)
    assert "template parameter T" in msg and "'x'" in msg and "'out'" in msg
    assert "float" in msg and "__half" in msg
    # an explicit T that an argument contradicts
    with pytest.raises(SpecializationError, match="T is bound to __half by T=.*'x'"):
        k.compile(x, x, 1.0, 2, T="half", BLOCK=64)
    assert counters["compiles"] == 0


def test_two_type_parameters_and_a_trailing_default():
    k = cuforge.jit(MIXED, "convert", arch=ARCH)
    assert k.template_params == ("T", "U", "BLOCK")
    x = torch.zeros(2, dtype=torch.int8)
    y = torch.zeros(2, dtype=torch.float64)
    exe = k.compile(x, y, 0.5, 2)  # BLOCK left to its default: not in the expression
    assert exe.name == "convert<signed char, double>"
    assert k.compile(x, y, 0.5, 2, BLOCK=64).name == "convert<signed char, double, 64>"
    # the scalar U bias does not bind U (the pointer y does): a Python float converts
    assert k.compile(x, y, np.float32(0.5), 2).name == "convert<signed char, double>"


def test_scalar_binds_its_type_only_when_typed():
    k = cuforge.jit(SCALAR_ONLY, "fill", constexpr=("TILE",), arch=ARCH)
    out = torch.zeros(2)
    exe = k.compile(out, np.float64(2.0), 2, TILE=4)
    assert exe.name == "fill<double>"
    with pytest.raises(
        SpecializationError, match="only used by scalar parameter 'value'.*Python float"
    ):
        k.compile(out, 2.0, 2, TILE=4)
    assert k.compile(out, 2.0, 2, T="int", TILE=4).name == "fill<int>"


def test_missing_constexpr_template_parameter_and_define_are_named():
    k = cuforge.jit(SCALE, "scale", arch=ARCH)
    x = torch.zeros(2)
    with pytest.raises(SpecializationError, match="constexpr template parameter int BLOCK.*BLOCK="):
        k.compile(x, x, 1.0, 2)
    f = cuforge.jit(SCALAR_ONLY, "fill", constexpr=("TILE",), arch=ARCH)
    with pytest.raises(SpecializationError, match="constexpr TILE was not given.*-DTILE"):
        f.specialize(T="float")
    assert counters["compiles"] == 0


def test_neither_deducible_nor_given_names_the_parameter():
    k = cuforge.jit(SCALE, "scale", arch=ARCH)
    with pytest.raises(SpecializationError, match="template parameter T is neither deducible"):
        k.specialize(BLOCK=64)
    from cuforge.runtime.args import Pointer

    with pytest.raises(SpecializationError, match="T could not be deduced.*'x'.*Pointer"):
        k.compile(Pointer(0), Pointer(0), 1.0, 2, BLOCK=64)


def test_unmapped_dtype_argument_names_the_parameter():
    k = cuforge.jit(SCALE, "scale", arch=ARCH)
    c = torch.zeros(2, dtype=torch.complex64)
    with pytest.raises(
        SpecializationError, match="argument 'x'.*binds template parameter T.*complex64"
    ):
        k.compile(c, c, 1.0, 2, BLOCK=64)


def test_unknown_keyword_and_wrong_argument_count():
    k = cuforge.jit(SCALE, "scale", arch=ARCH)
    with pytest.raises(SpecializationError, match="unknown keyword 'BLOK'.*T, BLOCK"):
        k.specialize(T="float", BLOK=1)
    with pytest.raises(SpecializationError, match="takes 4 arguments, got 3"):
        k.compile(torch.zeros(1), torch.zeros(1), 1.0, BLOCK=1)
    with pytest.raises(TypeError, match="unexpected keyword 'optoins'"):
        cuforge.jit(SCALE, "scale", optoins=())


def test_jit_errors_at_creation():
    with pytest.raises(SpecializationError, match="no __global__ function 'nope'.*scale<T, BLOCK>"):
        cuforge.jit(SCALE, "nope")
    with pytest.raises(SpecializationError, match="does not match the declaration"):
        cuforge.jit(SCALE, "scale", template=("BLOCK", "T"))
    with pytest.raises(SpecializationError, match="both a template parameter"):
        cuforge.jit(SCALE, "scale", constexpr=("BLOCK",))
    with pytest.raises(SpecializationError, match="in defines= and constexpr="):
        cuforge.jit(SCALAR_ONLY, "fill", constexpr=("TILE",), defines={"TILE": 1})


# -- specialization keys ---------------------------------------------------------------------


def test_specialization_key_is_the_name_expression_and_defines():
    k = cuforge.jit(SCALAR_ONLY, "fill", constexpr={"TILE": 8}, arch=ARCH)
    out = torch.zeros(1)
    a = k.compile(out, np.float32(1), 1)  # TILE from its default
    b = k.compile(out, np.float32(1), 1, TILE=8)
    c = k.compile(out, np.float32(1), 1, TILE=16)
    assert a is b and a is not c
    assert set(k.specializations) == {
        (("float",), (("TILE", "8"),)),
        (("float",), (("TILE", "16"),)),
    }
    assert a.program.key != c.program.key
    assert counters["compiles"] == 2
    # the program is an ordinary cached compile: the same call through cuforge.compile hits
    same = cuforge.compile(
        SCALAR_ONLY,
        name="fill.cu",
        defines={"TILE": "16"},
        name_expressions=("fill<float>",),
        arch=ARCH,
    )
    assert same.key == c.program.key
    assert counters["compiles"] == 2


def test_options_and_compile_kwargs_reach_the_key():
    plain = cuforge.jit(SCALE, "scale", arch=ARCH).specialize(T="float", BLOCK=64)
    fast = cuforge.jit(SCALE, "scale", arch=ARCH, options=cuforge.Options(fast_math=True))
    exe = fast.specialize(T="float", BLOCK=64)
    assert exe.program.key != plain.program.key
    raw = cuforge.jit(SCALE, "scale", arch=ARCH, options=["--use_fast_math"])
    assert raw.specialize(T="float", BLOCK=64).program.key == exe.program.key


def test_half_specialization_pre_includes_the_header_only_when_needed():
    k = cuforge.jit(SCALE, "scale", arch=ARCH)
    half = k.specialize(T="float16", BLOCK=32)
    assert half.program.source_of_result == "compiled"
    assert "cuda_fp16.h" in " ".join(half.program.key_fields.get("options", ""))
    plain = k.specialize(T="float", BLOCK=32)
    assert "cuda_fp16.h" not in " ".join(plain.program.key_fields.get("options", ""))
    with_include = cuforge.jit("#include <cuda_fp16.h>\n" + SCALE, "scale", arch=ARCH)
    exe = with_include.specialize(T="half", BLOCK=32)
    assert "pre-include" not in " ".join(exe.program.key_fields.get("options", ""))


def test_executor_exposes_the_program():
    k = cuforge.jit(SCALE, "scale", arch=ARCH)
    exe = k.specialize(T="double", BLOCK=128)
    assert isinstance(exe, cuforge.Kernel)
    prog = exe.program
    assert isinstance(prog, cuforge.Program)
    assert prog.source_of_result == "compiled" and prog.key and isinstance(prog.log, str)
    assert prog.lowered_names["scale<double, 128>"].startswith("_Z")
    cuforge.core.pipeline.reset_memo()
    again = cuforge.jit(SCALE, "scale", arch=ARCH).specialize(T="double", BLOCK=128)
    assert again.program.source_of_result in ("memory", "disk")
    assert again.program.key == prog.key


def test_jit_from_a_path_resolves_includes_next_to_it(tmp_path):
    (tmp_path / "common.cuh").write_text("#define FACTOR 3\n")
    path = tmp_path / "k.cu"
    path.write_text('#include "common.cuh"\n' + SCALE.replace("* alpha", "* alpha * FACTOR"))
    for spelling in (path, str(path)):
        k = cuforge.jit(spelling, "scale", arch=ARCH)
        exe = k.specialize(T="float", BLOCK=32)
        assert exe.program.name == "k.cu"
    with pytest.raises(FileNotFoundError, match="missing.cu"):
        cuforge.jit(str(tmp_path / "missing.cu"), "scale")


def test_non_template_kernel_with_constexpr_defines():
    src = 'extern "C" __global__ void k(float* out) { out[threadIdx.x] = TILE; }'
    k = cuforge.jit(src, "k", constexpr=("TILE",), arch=ARCH)
    exe = k.compile(torch.zeros(1), TILE=7)
    assert exe.name == "k" and exe.program.lowered_names == {}
    assert k.compile(torch.zeros(1), TILE=7) is exe


def test_macro_declared_kernel_needs_template_and_every_parameter():
    src = r"""
    #define KERNEL(name) template <typename T, int B> __global__ void name(T* p)
    KERNEL(hidden) { p[threadIdx.x] = (T)B; }
    """
    with pytest.raises(SpecializationError, match="template=\\(...\\)"):
        cuforge.jit(src, "hidden")
    k = cuforge.jit(src, "hidden", template=("T", "B"), arch=ARCH)
    exe = k.specialize(T="float", B=3)
    assert exe.name == "hidden<float, 3>"
    with pytest.raises(SpecializationError, match="B was not given"):
        k.specialize(T="float")


# -- the per-call lookup (the launch itself needs a GPU) ---------------------------------------


def test_launcher_table_is_keyed_on_dtypes_and_keywords():
    k = cuforge.jit(SCALE, "scale", arch=ARCH)
    launch = k[4, 64]
    assert k[4, 64] is launch  # one launcher per configuration
    x = torch.zeros(8)
    h = torch.zeros(8, dtype=torch.float16)
    for args, kw in (((x, x, 1.0, 8), {"BLOCK": 64}), ((h, h, 1.0, 8), {"BLOCK": 64})):
        with pytest.raises(cuforge.LaunchError):  # no GPU here: the launch fails, after the lookup
            launch(*args, **kw)
    assert set(launch.table) == {(torch.float32, torch.float32), (torch.float16, torch.float16)}
    assert set(launch.full) == {
        (torch.float32, torch.float32, ("BLOCK", 64)),
        (torch.float16, torch.float16, ("BLOCK", 64)),
    }
    compiles = counters["compiles"]
    assert compiles == 2
    with pytest.raises(cuforge.LaunchError):
        launch(x, x, 2.0, 8, BLOCK=64)  # a table hit: nothing compiled, nothing deduced
    assert counters["compiles"] == compiles
    # other keywords for the same dtypes: the second table, then the fast one again
    with pytest.raises(cuforge.LaunchError):
        launch(x, x, 2.0, 8, BLOCK=32)
    assert counters["compiles"] == compiles + 1
    assert launch.table[(torch.float32, torch.float32)][0] == {"BLOCK": 32}
    with pytest.raises(cuforge.LaunchError):
        launch(x, x, 2.0, 8, BLOCK=64)
    assert counters["compiles"] == compiles + 1
    assert launch.table[(torch.float32, torch.float32)][0] == {"BLOCK": 64}
    # a non-int keyword (an explicit T) is never kept in the fast table
    with pytest.raises(cuforge.LaunchError):
        launch(x, x, 2.0, 8, T="float", BLOCK=64)
    assert launch.table[(torch.float32, torch.float32)][0] == {"BLOCK": 64}
    assert (torch.float32, torch.float32, ("T", "float"), ("BLOCK", 64)) in launch.full
    compiles = counters["compiles"]
    # deduction errors surface from the launch path too, before anything is compiled
    with pytest.raises(SpecializationError, match="bound to float.*__half"):
        launch(x, h, 1.0, 8, BLOCK=64)
    assert counters["compiles"] == compiles


@pytest.mark.parametrize("which", ["c", "python"])
def test_launcher_hit_forwards_positionals_and_a_miss_resolves(which):
    """The C launcher (JitDispatch, where the extension loads) and the generated Python one
    behave alike: a hit calls the table's launcher with the positional arguments only; any
    other call (another keyword set, too few arguments, a dtype conflict) takes the general
    path, which checks and names the problem."""
    from cuforge.runtime import fastlaunch

    k = cuforge.jit(SCALE, "scale", arch=ARCH)
    if which == "c":
        module = fastlaunch.load()
        if module is None or not hasattr(module, "JitDispatch"):
            pytest.skip(f"no C launcher extension here: {fastlaunch.error()}")
        launch = k[2, 32]
        assert type(launch) is module.JitDispatch
        assert isinstance(type(k).__dict__["__getitem__"], module.Subscript)
        assert k[2, 32] is launch and k[[2], 32] is not launch  # a list: built, not cached
        assert launch.config == (2, 32)
    else:
        launch = k._python_make((2, 32))
    x = torch.zeros(8)
    h = torch.zeros(8, dtype=torch.float16)
    block = int("1000")  # equal keyword values below are other int objects
    with pytest.raises(cuforge.LaunchError):  # no GPU here: compiled, then the launch fails
        launch(x, x, 1.0, 8, BLOCK=block)
    compiles = counters["compiles"]
    calls = []

    def record(*args, **kw):
        calls.append((args, kw))
        return "launched"

    key = (torch.float32, torch.float32)
    assert launch.table[key][0] == {"BLOCK": 1000}
    launch.table[key] = (launch.table[key][0], record)
    assert launch(x, x, 2.0, 8, BLOCK=1000) == "launched"
    param = torch.nn.Parameter(torch.zeros(8), requires_grad=False)  # a Tensor subclass
    assert launch(param, x, 3.0, 8, BLOCK=1000) == "launched"
    assert calls == [((x, x, 2.0, 8), {}), ((param, x, 3.0, 8), {})]
    with pytest.raises(cuforge.LaunchError):  # another keyword set: the general path
        launch(x, x, 2.0, 8, T="float", BLOCK=1000)
    with pytest.raises(SpecializationError, match="BLOCK was not given"):
        launch(x, x, 2.0, 8)
    with pytest.raises(SpecializationError, match="unknown keyword 'TILE'"):
        launch(x, x, 2.0, 8, BLOCK=1000, TILE=4)
    with pytest.raises(SpecializationError, match="takes 4 arguments, got 1"):
        launch(x, BLOCK=1000)
    with pytest.raises(SpecializationError, match="bound to float.*__half"):
        launch(x, h, 2.0, 8, BLOCK=1000)
    assert len(calls) == 2
    assert counters["compiles"] == compiles


def test_specialize_in_a_second_process_is_a_disk_hit():
    exe = cuforge.jit(SCALE, "scale", arch=ARCH).specialize(T="float", BLOCK=256)
    assert exe.program.source_of_result == "compiled"
    result = run_python(
        f"""
        import json
        import cuforge
        from cuforge.core.pipeline import counters
        k = cuforge.jit({SCALE!r}, "scale", arch={ARCH!r})
        exe = k.specialize(T="float", BLOCK=256)
        print(json.dumps({{"source": exe.program.source_of_result, "key": exe.program.key,
                          "compiles": counters["compiles"], "name": exe.name}}))
        """,
        env=child_env(CUFORGE_CACHE_DIR=os.environ["CUFORGE_CACHE_DIR"]),
    )
    assert result == {
        "source": "disk",
        "key": exe.program.key,
        "compiles": 0,
        "name": "scale<float, 256>",
    }


class _CAIOnly:
    """An array known only by its __cuda_array_interface__ (no .dtype)."""

    def __init__(self, typestr: str) -> None:
        self.__cuda_array_interface__ = {
            "shape": (4,),
            "typestr": typestr,
            "data": (0, False),
            "version": 3,
        }


class _DLPackOnly:
    """An array known only through __dlpack__ (no .dtype)."""

    def __init__(self, array) -> None:
        self._array = array

    def __dlpack__(self, **kwargs):
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


def test_deduction_from_cuda_array_interface_and_dlpack():
    k = cuforge.jit(SCALE, "scale", arch=ARCH)
    cai = _CAIOnly("<f2")
    assert k.compile(cai, cai, 1.0, 4, BLOCK=32).name == "scale<__half, 32>"
    dl = _DLPackOnly(np.zeros(4, dtype=np.int16))
    assert k.compile(dl, dl, 1, 4, BLOCK=32).name == "scale<short, 32>"
    with pytest.raises(SpecializationError, match="bound to __half.*and to short"):
        k.compile(cai, dl, 1, 4, BLOCK=32)
    bf = _DLPackOnly(torch.zeros(4, dtype=torch.bfloat16))
    assert k.compile(bf, bf, 1.0, 4, BLOCK=32).name == "scale<__nv_bfloat16, 32>"
