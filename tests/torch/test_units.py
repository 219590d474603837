"""cuforge.torch's pieces that need no compiler: flags, jobs, logs, the binding generator."""

from __future__ import annotations

import os

import pytest

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


def test_ninja_build_lines_keep_paths_with_dollar_space_and_colon(tmp_path):
    import subprocess

    from cuforge.torch.ninja_build import _path, _q, ninja_path

    names = ["plain.o", "a b.o", "c:d.o", "$e.o", "f$ g.o", "h$$i.o"]
    text = ["rule touch", f"  command = {_q(['touch', '--'])} $out", ""]
    text += [f"build {_path(str(tmp_path / n))}: touch" for n in names]
    (tmp_path / "build.ninja").write_text("\n".join(text) + "\n")
    done = subprocess.run(
        [ninja_path(), "-C", str(tmp_path), "-t", "targets", "all"],
        capture_output=True,
        text=True,
        check=True,
    )
    targets = {line.rsplit(": ", 1)[0] for line in done.stdout.splitlines()}
    assert targets == {str(tmp_path / n) for n in names}
    subprocess.run([ninja_path(), "-C", str(tmp_path)], capture_output=True, check=True)
    assert all((tmp_path / n).is_file() for n in names)


def test_parse_launchers_ignores_comments_and_preprocessor_lines():
    from cuforge.torch.binding import parse_launchers

    header = """
    #pragma once
    #define NOT_A_DECL(x) \\
        void launch_fake(int x);
    // void launch_commented(int x);
    /* void launch_blocked(float y); */
    void launch_add(const float* a /* input */, const float* b, // second input
                    float* out, int64_t n, cudaStream_t stream);
    """
    found = parse_launchers(header)
    assert list(found) == ["launch_add"]
    assert found["launch_add"] == [
        ("const float*", "a"),
        ("const float*", "b"),
        ("float*", "out"),
        ("int64_t", "n"),
        ("cudaStream_t", "stream"),
    ]


def test_launcher_comes_from_the_argument_or_the_setting(tmp_path, monkeypatch):
    from cuforge.torch.flags import launcher

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "ccache"
    fake.write_text('#!/bin/sh\nexec "$@"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.delenv("CUFORGE_TORCH_LAUNCHER", raising=False)
    assert launcher() is None
    assert launcher("ccache") == str(fake)
    monkeypatch.setenv("CUFORGE_TORCH_LAUNCHER", "Auto")
    assert launcher() == str(fake)  # sccache is not installed, ccache is
    monkeypatch.setenv("CUFORGE_TORCH_LAUNCHER", "off")
    assert launcher() is None
    monkeypatch.setenv("CUFORGE_TORCH_LAUNCHER", "sccache")
    assert launcher() is None  # asked for, not installed


def test_an_untrusted_cache_dir_is_not_used_for_builds_modules_or_memos(tmp_path, monkeypatch):
    import json

    from cuforge.torch import build, flags

    key = "ab" * 32
    cache = tmp_path / "cache"
    (cache / "torch").mkdir(parents=True)
    cache.chmod(0o700)
    monkeypatch.setenv("CUFORGE_CACHE_DIR", str(cache))
    assert build.module_dir(key) == str(cache / "torch" / "modules" / key)
    assert build.default_build_directory("ext") == str(cache / "torch" / "build" / "ext")
    planted = {"nvidia": {"x": {"include": [str(tmp_path)], "lib": []}}}
    (cache / "torch" / "paths.json").write_text(json.dumps(planted))
    assert flags._load_memo() == planted
    for loose in (cache, cache / "torch"):
        loose.chmod(0o777)  # writable by anyone: whoever writes it could plant a module
        try:
            assert not build.module_dir(key).startswith(str(cache))
            assert build.module_dir(key).endswith(os.path.join("torch", "modules", key))
            assert not build.default_build_directory("ext").startswith(str(cache))
            assert flags._load_memo() == {}  # a planted memo could name the include dirs
        finally:
            loose.chmod(0o700)
    with pytest.raises(ValueError, match="not a cuforge key"):
        build.module_dir("../../etc")


def test_an_inductor_kernel_keys_the_same_on_two_machines_whose_cache_dirs_differ(tmp_path):
    """torch 2.6 writes ``#include "<its cache dir>/2r/c2r...h"`` into each C++ kernel, and
    names the kernel by a hash of that text: the key takes the machine's dirs out of the
    text and the name out of the command, and still follows the included header's content."""
    from cuforge.torch.inductor_cpp import _content_digest, _unnamed

    def machine(label: str, header_text: str) -> str:
        root = tmp_path / label / "inductor"
        (root / "2r").mkdir(parents=True)
        header = root / "2r" / "c2rprefix.h"
        header.write_text(header_text)
        source = root / "4r" / "kernel.cpp"
        source.parent.mkdir()
        source.write_text(f'#include "{header}"\nextern "C" void kernel() {{}}\n')
        return _content_digest(str(source), [(str(root), "${INDUCTOR}")])

    a = machine("a", "#define X 1\n")
    assert machine("b", "#define X 1\n") == a
    assert machine("c", "#define X 2\n") != a
    stem = "c4r3h7sehv4ymvhuk2fh5iyn35dwaqw7mq"
    assert _unnamed(f"${{OUT}}/{stem}.so", stem) == "${OUT}/${NAME}.so"
    assert _unnamed(f"-DNAME={stem}", stem) == f"-DNAME={stem}"  # not a path: kept
