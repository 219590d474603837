"""cuforge.torch's pieces that need no compiler: flags, jobs, logs, the binding generator."""

from __future__ import annotations

import os

from cuforge.samples import torch_ext


def test_flags_find_the_pip_cuda_headers_and_keep_torchs_order():
    from cuforge.torch.flags import build_env, compile_flags

    env = build_env()
    assert any(os.path.isfile(os.path.join(d, "cusparse.h")) for d in env.include_dirs(True))
    cflags, cuda = compile_flags(
        env,
        name="x",
        with_cuda=True,
        extra_cflags=["-O1"],
        extra_cuda_cflags=["--use_fast_math"],
        extra_include_paths=["inc"],
        archs=("sm_80", "sm_90"),
        threads=2,
    )
    assert cflags[:2] == ["-DTORCH_EXTENSION_NAME=x", "-DTORCH_API_INCLUDE_EXTENSION_H"]
    assert cflags[-1] == "-O1" and "-O3" in cuda  # presets first, the user's flags win
    assert "-gencode=arch=compute_80,code=sm_80" in cuda
    assert "-gencode=arch=compute_90,code=sm_90" in cuda
    assert cuda[-2:] == ["--threads", "2"] and "-lineinfo" in cuda
    assert cuda.index("-O3") < cuda.index("--use_fast_math")
    _, own_arch = compile_flags(
        env,
        name="x",
        with_cuda=True,
        extra_cflags=[],
        extra_cuda_cflags=["-arch=sm_75"],
        extra_include_paths=[],
        archs=("sm_90",),
    )
    assert not any(f.startswith("-gencode") for f in own_arch)
    # keys see placeholders, never this machine's paths
    assert env.normalize(os.path.join(env.torch_dir, "include")) == "${TORCH}/include"


def test_job_count_is_bounded_by_memory(monkeypatch):
    from cuforge.torch import jobs

    monkeypatch.delenv("MAX_JOBS", raising=False)
    monkeypatch.setattr(jobs, "cpu_count", lambda: 64)
    monkeypatch.setattr(jobs, "available_memory", lambda: 5 * 1024**3)
    n, why = jobs.job_count(int(2.5 * 1024**3))
    assert n == 2 and "64 cores" in why
    monkeypatch.setenv("MAX_JOBS", "3")
    assert jobs.job_count()[0] == 3


def test_trim_log_keeps_the_first_errors():
    from cuforge.torch.ninja_build import trim_log

    log = "\n".join(
        [f"k.cu({i}): error: thing {i}" if i % 10 == 0 else f"  detail {i}" for i in range(200)]
    )
    trimmed = trim_log(log)
    lines = trimmed.splitlines()
    assert lines[0] == "k.cu(0): error: thing 0"
    assert "thing 20" in trimmed and "thing 30" not in trimmed
    assert "more lines in the full log" in lines[-1]


def test_generate_binding_maps_launcher_parameters():
    from cuforge.torch import Op, generate_binding

    header = os.path.join(torch_ext.SAMPLE_DIR, "fast", "kernels.h")
    text = generate_binding(header, ["add", Op("scale", doc="alpha * x")], library="demo")
    assert "torch::Tensor add(const torch::Tensor& a, const torch::Tensor& b)" in text
    assert "torch::Tensor scale(const torch::Tensor& x, double alpha)" in text
    assert "auto out = torch::empty_like(a);" in text
    assert "a.numel(), c10::cuda::getCurrentCUDAStream(a.device().index()).stream()" in text
    assert 'm.def("scale(Tensor x, float alpha) -> Tensor");' in text
    assert "TORCH_LIBRARY_IMPL(demo, CUDA, m)" in text


def test_nvcc_split_plans_two_lanes_from_a_dry_run():
    from cuforge.torch.nvcc_split import plan_commands

    lines = [
        "#$ CICC_PATH=/cuda/nvvm/bin",
        '#$ gcc -D__CUDA_ARCH_LIST__=900 -E -x c++ "a.cu" -o "k/a.cpp4.ii"',
        '#$ cudafe++ --gen_module_id_file --module_id_file_name "k/a.module_id" "k/a.cpp4.ii"',
        '#$ gcc -D__CUDA_ARCH__=900 -E -x c++ "a.cu" -o "k/a.cpp1.ii"',
        '#$ "$CICC_PATH/cicc" --module_id_file_name "k/a.module_id" "k/a.cpp1.ii" -o "k/a.ptx"',
        '#$ ptxas -arch=sm_90 "k/a.ptx" -o "k/a.cubin"',
        '#$ fatbinary --create="k/a.fatbin" --embedded-fatbin="k/a.fatbin.c"',
        '#$ gcc -D__CUDA_ARCH__=900 -c -x c++ "k/a.cudafe1.cpp" -o "a.o"',
    ]
    env, host, device, final = plan_commands(lines, {})
    assert env["CICC_PATH"] == "/cuda/nvvm/bin"
    assert [c.split()[0] for c in host] == ["gcc", "cudafe++"]
    assert [c.split()[0] for c in device] == ["gcc", '"$CICC_PATH/cicc"', "ptxas", "fatbinary"]
    assert final.endswith('-o "a.o"')


def test_bench_build_parser_rows_and_table():
    import argparse

    import pytest

    from cuforge.cli import bench_build

    parser = argparse.ArgumentParser()
    bench_build.add_parser(parser.add_subparsers())
    args = parser.parse_args(["bench-build", "--rows", "quick,torch_default", "--json"])
    assert args.func is bench_build.run
    rows = bench_build._pick_rows(args.rows)
    assert rows[0] == "torch_jobs" and rows[-1] == "torch_default"
    with pytest.raises(SystemExit):
        bench_build._pick_rows("no_such_row")
    doc = {
        "sources": ["ops.cu", "binding.cpp"],
        "layout": "classic",
        "arch": "sm_90",
        "cores": 2,
        "edited": "ops.cu",
        "rows": [
            {
                "row": "torch_jobs",
                "seconds": 100.0,
                "vs_default": None,
                "vs_tuned": 1.0,
                "runs": [{"seconds": 100.0}],
            },
            {
                "row": "cuforge_edit",
                "seconds": 2.0,
                "vs_default": None,
                "vs_tuned": 0.02,
                "runs": [{"seconds": 2.0, "compiled": ["ops.cu"]}],
            },
            {"row": "torch_ccache", "note": "ccache is not installed", "runs": []},
        ],
    }
    table = bench_build.format_table(doc)
    assert "0.020x" in table and "compiled: ops.cu" in table
    assert "ccache is not installed" in table
