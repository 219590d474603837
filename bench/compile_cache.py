"""Compile-cache benchmark (issue 2). Runs on the CPU; no GPU needed.

    python bench/compile_cache.py [--runs 7] [--arch sm_90] [--json out.json]

Every figure is the median of ``--runs`` runs and is reported with its anchor measured in
the same run:

1. cold-compile overhead: ``cuforge.compile`` of a kernel the cache has not seen vs the
   bare compiler call (raw ``cuda.bindings.nvrtc`` calls; ``nvcc -cubin`` as a subprocess,
   and ``nvcc -cubin -MD``, which is what cuforge runs to learn the headers). Goal <= 1.05x.
2. warm disk hit in a fresh process: ``import cuforge`` and, after it, the time to have the
   binary. Goals: hit <= 3 ms, import <= 50 ms. Anchor: the same hit through cuda.core's
   ``FileStreamProgramCache`` (import of cuda.core + key + read).
3. in-process repeat of an identical ``compile()``. Goal <= 2 us.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "src"))

from cuforge.samples import SAMPLES_DIR  # noqa: E402

#: (label, file, name_expressions, defines)
KERNELS = (
    ("vec-add (saxpy.cu)", "saxpy.cu", (), {}),
    ("block reduce (CUB)", "block_reduce.cu", ("block_sum<256, float>",), {}),
    ("tiled matmul", "matmul.cu", (), {"SAMPLE_TILE": 16}),
)


def _median(values: list[float]) -> float:
    return statistics.median(values)


def raw_nvrtc(source: str, name: str, options: list[str], exprs: tuple[str, ...]) -> bytes:
    """The anchor: NVRTC through cuda.bindings with no cuforge code in between."""
    from cuda.bindings import nvrtc

    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], [])
    for expr in exprs:
        nvrtc.nvrtcAddNameExpression(prog, expr.encode())
    opts = [o.encode() for o in options]
    (res,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
    if res != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, size = nvrtc.nvrtcGetProgramLogSize(prog)
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, log)
        raise RuntimeError(log.decode())
    for expr in exprs:
        nvrtc.nvrtcGetLoweredName(prog, expr.encode())
    _, size = nvrtc.nvrtcGetCUBINSize(prog)
    cubin = b" " * size
    nvrtc.nvrtcGetCUBIN(prog, cubin)
    nvrtc.nvrtcDestroyProgram(prog)
    return cubin


def bench_cold(arch: str, runs: int) -> list[dict]:
    """A new kernel into an existing cache (the everyday miss): every run compiles a source
    made unique by a trailing comment, through cuforge and through the bare compiler."""
    import cuforge
    from cuforge.compiler.nvrtc import nvrtc_options
    from cuforge.core.pipeline import CompileRequest

    os.environ["CUFORGE_CACHE_DIR"] = tempfile.mkdtemp(prefix="cuforge-bench-cold-")
    rows = []
    stamp = time.time()
    for label, filename, exprs, defines in KERNELS:
        with open(os.path.join(SAMPLES_DIR, filename)) as f:
            source = f.read()
        user_opts = [f"-D{k}={v}" for k, v in defines.items()] + [f"-I{SAMPLES_DIR}"]
        raw_opts = list(nvrtc_options(user_opts, arch, "cubin"))
        unique = (f"{source}\n// bench {stamp} {i}\n" for i in range(10**9))
        raw_nvrtc(next(unique), filename, raw_opts, exprs)  # load the library outside the timings
        cuforge.compile(
            next(unique),
            name=filename,
            include_dirs=[SAMPLES_DIR],
            arch=arch,
            defines=defines,
            name_expressions=exprs,
        )  # and cuforge's own first-use costs
        t_raw, t_forge, t_nvcc, t_nvcc_md, t_forge_nvcc = [], [], [], [], []
        for _ in range(runs):
            src = next(unique)
            started = time.perf_counter()
            raw_nvrtc(src, filename, raw_opts, exprs)
            t_raw.append(time.perf_counter() - started)

            src = next(unique)
            started = time.perf_counter()
            prog = cuforge.compile(
                src,
                name=filename,
                include_dirs=[SAMPLES_DIR],
                arch=arch,
                defines=defines,
                name_expressions=exprs,
            )
            t_forge.append(time.perf_counter() - started)
            assert prog.source_of_result == "compiled"
        if not exprs:
            flags = CompileRequest(
                source,
                name=filename,
                backend="nvcc",
                output="cubin",
                archs=(arch,),
                options=tuple(user_opts),
                name_expressions=(),
                include_dirs=(SAMPLES_DIR,),
                source_dir=None,
                headers=None,
                base_dir=os.getcwd(),
            ).compiler_options
            from cuforge.toolchain import nvcc_path

            with tempfile.TemporaryDirectory() as tmp:
                cu, out = os.path.join(tmp, filename), os.path.join(tmp, "out.cubin")
                for _ in range(runs):
                    for timings, extra in ((t_nvcc, []), (t_nvcc_md, ["-MD", "-MF", cu + ".d"])):
                        with open(cu, "w") as f:
                            f.write(next(unique))
                        started = time.perf_counter()
                        subprocess.run(
                            [nvcc_path(), *flags, *extra, "-o", out, cu],
                            check=True,
                            capture_output=True,
                        )
                        timings.append(time.perf_counter() - started)
                    started = time.perf_counter()
                    cuforge.compile(
                        next(unique),
                        name=filename,
                        include_dirs=[SAMPLES_DIR],
                        arch=arch,
                        backend="nvcc",
                        defines=defines,
                    )
                    t_forge_nvcc.append(time.perf_counter() - started)
        row = {
            "kernel": label,
            "nvrtc_raw_s": _median(t_raw),
            "nvrtc_cuforge_s": _median(t_forge),
            "nvrtc_ratio": _median(t_forge) / _median(t_raw),
        }
        if t_nvcc:
            row.update(
                nvcc_raw_s=_median(t_nvcc),
                nvcc_md_s=_median(t_nvcc_md),
                nvcc_cuforge_s=_median(t_forge_nvcc),
                nvcc_ratio=_median(t_forge_nvcc) / _median(t_nvcc),
                nvcc_md_ratio=_median(t_forge_nvcc) / _median(t_nvcc_md),
            )
        rows.append(row)
    return rows


WARM_CHILD = textwrap.dedent(
    """
    import json, time
    t0 = time.perf_counter()
    import cuforge
    t1 = time.perf_counter()
    p = cuforge.compile_file({path!r}, arch={arch!r}, name_expressions={exprs!r}, defines={defines!r})
    t2 = time.perf_counter()
    assert p.source_of_result == "disk", p.source_of_result
    print(json.dumps({{"import": t1 - t0, "hit": t2 - t1}}))
    """
)

CUDA_CORE_CHILD = textwrap.dedent(
    """
    import json, time
    t0 = time.perf_counter()
    from cuda.core import ProgramOptions
    from cuda.core.utils import FileStreamProgramCache, make_program_cache_key
    t1 = time.perf_counter()
    source = open({path!r}).read()
    key = make_program_cache_key(code=source, code_type="c++", options=ProgramOptions(arch={arch!r}),
                                 target_type="cubin", extra_digest=b"{digest}")
    data = FileStreamProgramCache({cache!r})[key]
    t2 = time.perf_counter()
    assert len(data) > 0
    print(json.dumps({{"import": t1 - t0, "hit": t2 - t1}}))
    """
)


def _child_times(code: str, env: dict[str, str], runs: int) -> tuple[float, float]:
    imports, hits = [], []
    for _ in range(runs):
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        times = json.loads(out.stdout.strip().splitlines()[-1])
        imports.append(times["import"])
        hits.append(times["hit"])
    return _median(imports), _median(hits)


def bench_warm(arch: str, runs: int) -> list[dict]:
    import cuforge

    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # measure with cached bytecode, as users run
    env["PYTHONPATH"] = os.path.join(ROOT, "src")
    rows = []
    for label, filename, exprs, defines in KERNELS:
        path = os.path.join(SAMPLES_DIR, filename)
        env["CUFORGE_CACHE_DIR"] = tempfile.mkdtemp(prefix="cuforge-bench-warm-")
        code = WARM_CHILD.format(path=path, arch=arch, exprs=exprs, defines=defines)
        subprocess.run(
            [sys.executable, "-c", code.replace('"disk"', "p.source_of_result")],
            env=env,
            check=True,
            capture_output=True,
        )
        subprocess.run(
            [sys.executable, "-c", code], env=env, check=True, capture_output=True
        )  # bytecode warm-up
        imp, hit = _child_times(code, env, runs)

        # anchor: cuda.core's own persistent cache, filled with the same cubin
        from cuda.core import ProgramOptions
        from cuda.core.utils import FileStreamProgramCache, make_program_cache_key

        core_dir = tempfile.mkdtemp(prefix="cuda-core-bench-")
        with open(path) as f:
            source = f.read()
        digest = "headers"
        key = make_program_cache_key(
            code=source,
            code_type="c++",
            options=ProgramOptions(arch=arch),
            target_type="cubin",
            extra_digest=digest.encode(),
        )
        os.environ["CUFORGE_CACHE_DIR"] = env["CUFORGE_CACHE_DIR"]
        FileStreamProgramCache(core_dir)[key] = cuforge.compile_file(
            path, arch=arch, name_expressions=exprs, defines=defines
        ).binary
        core_code = CUDA_CORE_CHILD.format(path=path, arch=arch, cache=core_dir, digest=digest)
        subprocess.run([sys.executable, "-c", core_code], env=env, check=True, capture_output=True)
        core_imp, core_hit = _child_times(core_code, env, runs)
        rows.append(
            {
                "kernel": label,
                "cuforge_import_ms": imp * 1e3,
                "cuforge_hit_ms": hit * 1e3,
                "cuda_core_import_ms": core_imp * 1e3,
                "cuda_core_hit_ms": core_hit * 1e3,
                "total_ratio": (imp + hit) / (core_imp + core_hit),
            }
        )
    bare = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
        bare.append(time.perf_counter() - started)
    rows.append({"kernel": "(python -c pass, whole process)", "process_ms": _median(bare) * 1e3})
    return rows


def bench_repeat(arch: str, loops: int = 200_000) -> dict:
    import cuforge

    os.environ["CUFORGE_CACHE_DIR"] = tempfile.mkdtemp(prefix="cuforge-bench-repeat-")
    path = os.path.join(SAMPLES_DIR, "saxpy.cu")
    with open(path) as f:
        source = f.read()
    # the header the source includes must be settled (unchanged for a few seconds), as in a real project
    cuforge.compile(source, name="saxpy.cu", include_dirs=[SAMPLES_DIR], arch=arch)
    assert (
        cuforge.compile(
            source, name="saxpy.cu", include_dirs=[SAMPLES_DIR], arch=arch
        ).source_of_result
        == "memory"
    )
    timings = []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(loops):
            cuforge.compile(source, name="saxpy.cu", include_dirs=[SAMPLES_DIR], arch=arch)
        timings.append((time.perf_counter() - started) / loops)
    anchor = []
    d: dict = {("x",): 1}
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(loops):
            d.get(("x",))
        anchor.append((time.perf_counter() - started) / loops)
    return {"repeat_us": _median(timings) * 1e6, "dict_get_us": _median(anchor) * 1e6}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    os.environ.setdefault("CUFORGE_ARCH", args.arch)

    cold = bench_cold(args.arch, args.runs)
    warm = bench_warm(args.arch, args.runs)
    repeat = bench_repeat(args.arch)

    print(
        f"\n## Cold compile (a new kernel, existing cache): cuforge vs the bare compiler (median of {args.runs}, {args.arch})\n"
    )
    print(
        "| kernel | raw NVRTC | cuforge (NVRTC) | ratio | nvcc -cubin | nvcc -cubin -MD | cuforge (nvcc) | ratio | vs -MD |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in cold:
        nvcc = (
            f"{r['nvcc_raw_s']:.3f} s | {r['nvcc_md_s']:.3f} s | {r['nvcc_cuforge_s']:.3f} s | "
            f"{r['nvcc_ratio']:.3f}x | {r['nvcc_md_ratio']:.3f}x"
            if "nvcc_raw_s" in r
            else "- | - | - | - | -"
        )
        print(
            f"| {r['kernel']} | {r['nvrtc_raw_s']:.3f} s | {r['nvrtc_cuforge_s']:.3f} s | "
            f"{r['nvrtc_ratio']:.3f}x | {nvcc} |"
        )
    print(f"\n## Warm disk hit in a fresh process (median of {args.runs})\n")
    print(
        "| kernel | import cuforge | cuforge hit | cuda.core import | cuda.core hit | total vs cuda.core |"
    )
    print("|---|---|---|---|---|---|")
    for r in warm:
        if "process_ms" in r:
            continue
        print(
            f"| {r['kernel']} | {r['cuforge_import_ms']:.1f} ms | {r['cuforge_hit_ms']:.2f} ms | "
            f"{r['cuda_core_import_ms']:.1f} ms | {r['cuda_core_hit_ms']:.2f} ms | {r['total_ratio']:.3f}x |"
        )
    print(f"\n(python -c pass, whole process: {warm[-1]['process_ms']:.1f} ms)")
    print("\n## In-process repeat of an identical compile()\n")
    print(
        f"{repeat['repeat_us']:.2f} us per call (a bare dict lookup of a tuple key: {repeat['dict_get_us']:.3f} us)"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cold": cold, "warm": warm, "repeat": repeat}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
