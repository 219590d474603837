"""cuforge.Options: typed options give the same cache key as the raw list they spell
(through the real pipeline, NVRTC and nvcc), and bad values fail naming the field."""

from __future__ import annotations

import dataclasses

import pytest

import cuforge
from cuforge.core.pipeline import counters

SRC = 'extern "C" __global__ void k(float* x) { x[threadIdx.x] = __sinf(x[threadIdx.x]); }'

CASES = [
    (cuforge.Options(std="c++17"), ["-std=c++17"]),
    (cuforge.Options(std=17, fast_math=True), ["-std=c++17", "--use_fast_math"]),
    (cuforge.Options(lineinfo=True, max_registers=32), ["-lineinfo", "--maxrregcount=32"]),
    (cuforge.Options(debug=True), ["-G"]),
    (cuforge.Options(rdc=True, extra=("-DX=1",)), ["-rdc=true", "-DX=1"]),
    (
        cuforge.Options(
            std="c++20", fast_math=True, lineinfo=True, max_registers=64, extra=["-DNDEBUG"]
        ),
        ["-std=c++20", "--use_fast_math", "-lineinfo", "--maxrregcount=64", "-DNDEBUG"],
    ),
]


@pytest.mark.parametrize("opts,raw", CASES, ids=[" ".join(r) for _, r in CASES])
def test_same_key_as_the_raw_list_nvrtc(opts, raw):
    typed = cuforge.compile(SRC, options=opts, arch="sm_80")
    cuforge.core.pipeline.reset_memo()  # the raw call must find the entry by key, not by memo
    plain = cuforge.compile(SRC, options=raw, arch="sm_80")
    assert plain.key == typed.key
    assert plain.source_of_result in ("memory", "disk")
    assert counters["compiles"] == 1
    assert list(opts) == raw == opts.as_list("nvrtc") == opts.as_list("nvcc")


def test_same_key_as_the_raw_list_nvcc():
    opts, raw = CASES[-1]
    typed = cuforge.compile(SRC, options=opts, arch="sm_80", backend="nvcc")
    cuforge.core.pipeline.reset_memo()
    plain = cuforge.compile(SRC, options=raw, arch="sm_80", backend="nvcc")
    assert plain.key == typed.key and counters["compiles"] == 1


def test_options_change_the_key_and_the_code():
    base = cuforge.compile(SRC, arch="sm_80")
    debug = cuforge.compile(SRC, options=cuforge.Options(debug=True), arch="sm_80")
    assert base.key != debug.key and base.binary != debug.binary


def test_options_is_a_frozen_dataclass_and_a_sequence():
    opts = cuforge.Options(std="17", fast_math=True)
    assert dataclasses.is_dataclass(opts)
    assert [f.name for f in dataclasses.fields(opts)] == [
        "std",
        "fast_math",
        "lineinfo",
        "debug",
        "max_registers",
        "rdc",
        "extra",
    ]
    assert opts.std == "c++17"
    assert opts == cuforge.Options(std="c++17", fast_math=True)
    assert hash(opts) == hash(cuforge.Options(std="c++17", fast_math=True))
    assert tuple(opts) == ("-std=c++17", "--use_fast_math") and len(opts) == 2
    assert opts[0] == "-std=c++17"
    assert opts + ["-O3"] == ("-std=c++17", "--use_fast_math", "-O3")
    assert ["-O3"] + opts == ("-O3", "-std=c++17", "--use_fast_math")
    assert dataclasses.replace(opts, debug=True).as_list()[-1] == "-G"
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.debug = True


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        ({"std": "c++99"}, ValueError, r"std='c\+\+99'.*c\+\+17"),
        ({"std": True}, TypeError, "std"),
        ({"fast_math": 1}, TypeError, "fast_math.*True or False"),
        ({"max_registers": 0}, ValueError, "max_registers=0.*1 to 255"),
        ({"max_registers": "32"}, TypeError, "max_registers"),
        ({"extra": "-O3"}, TypeError, "extra.*not one string"),
        ({"extra": [3]}, TypeError, "extra.*int"),
    ],
)
def test_bad_values_name_the_field(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        cuforge.Options(**kwargs)


def test_as_list_rejects_an_unknown_backend():
    with pytest.raises(ValueError, match="'nvrtc' or 'nvcc'"):
        cuforge.Options().as_list("clang")
