"""The main job (``make demo``): compile the bundled samples cold, then warm in a fresh
process; edit a header and show the explained miss; run the kernels when a GPU is there.

    python -m cuforge.demo [--cache-dir DIR] [--arch sm_90]

By default it uses a new temporary cache directory so that "cold" really is cold.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from cuforge.samples import SAMPLES_DIR

#: (label, file, backend, name_expressions, defines)
SAMPLES = (
    ('saxpy (extern "C")', "saxpy.cu", "nvrtc", (), {}),
    ("block_sum<256, float> (CUB)", "block_reduce.cu", "nvrtc", ("block_sum<256, float>",), {}),
    ("matmul (TILE=16)", "matmul.cu", "nvrtc", (), {"SAMPLE_TILE": 16}),
    ("saxpy via nvcc", "saxpy.cu", "nvcc", (), {}),
)


def _compile_samples(samples_dir: str, arch: str | None) -> list[dict]:
    """Runs in a child process: compile every sample, report timings as JSON."""
    import_started = time.perf_counter()
    import cuforge

    import_seconds = time.perf_counter() - import_started
    rows = []
    for label, filename, backend, exprs, defines in SAMPLES:
        started = time.perf_counter()
        prog = cuforge.compile_file(
            os.path.join(samples_dir, filename),
            backend=backend,
            name_expressions=exprs,
            defines=defines,
            arch=arch,
        )
        rows.append(
            {
                "label": label,
                "seconds": time.perf_counter() - started,
                "source": prog.source_of_result,
                "bytes": len(prog.binary),
                "key": prog.key,
                "arch": prog.arch,
                "lowered": prog.lowered_names,
            }
        )
    return [{"import_seconds": import_seconds}, *rows]


def _child(phase_args: list[str], env: dict[str, str]) -> list[dict]:
    cmd = [sys.executable, "-m", "cuforge.demo", *phase_args]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        raise SystemExit(f"demo step failed: {' '.join(cmd)}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _print_table(title: str, rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    table.add_column("kernel")
    table.add_column("time", justify="right")
    table.add_column("from")
    table.add_column("bytes", justify="right")
    for row in rows:
        secs = row["seconds"]
        shown = f"{secs * 1e3:.2f} ms" if secs < 1 else f"{secs:.2f} s"
        table.add_row(row["label"], shown, row["source"], str(row["bytes"]))
    Console().print(table)


def _explained_miss(cache_env: dict[str, str], arch: str | None) -> None:
    """Copy the samples, edit the copy's header, recompile: the miss says why."""
    work = tempfile.mkdtemp(prefix="cuforge-demo-src-")
    try:
        shutil.copytree(
            SAMPLES_DIR,
            work,
            dirs_exist_ok=True,
            ignore=shutil.ignore_patterns("__pycache__", "*.py"),
        )
        env = dict(cache_env, CUFORGE_EXPLAIN="1")
        code = (
            "import cuforge, sys, json\n"
            f"p = cuforge.compile_file({os.path.join(work, 'saxpy.cu')!r}, arch={arch!r})\n"
            "print(json.dumps(p.source_of_result))\n"
        )
        run = lambda: subprocess.run(  # noqa: E731
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        run()  # the copy's first compile
        header = os.path.join(work, "include", "sample_common.cuh")
        with open(header, "a", encoding="utf-8") as f:
            f.write("\n// edited by the demo\n")
        second = run()
        print(
            f"\nedited {os.path.relpath(header, work)} in a copy of the samples and compiled saxpy.cu again:"
        )
        print("  result from:", json.loads(second.stdout))
        for line in second.stderr.splitlines():
            if line.startswith("cuforge: miss"):
                print("  " + line)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run_on_gpu(env: dict[str, str], arch: str | None) -> None:
    from cuforge.toolchain import visible_gpu_archs

    if not visible_gpu_archs():
        print("\nno GPU visible: compiled and cached only (kernels not run).")
        return
    done = subprocess.run(
        [sys.executable, "-m", "cuforge.demo", "--phase", "run"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    sys.stdout.write(done.stdout)
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        raise SystemExit("running the samples on the GPU failed")


def _run_samples() -> None:
    """Runs in a child process on a GPU machine: launch each sample and check it."""
    from cuforge.runtime.selfcheck import run_samples

    for line in run_samples(SAMPLES_DIR):
        print("  " + line)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cuforge.demo", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--cache-dir", help="use this cache dir instead of a new temporary one")
    parser.add_argument(
        "--arch", help="target arch when no GPU is visible (default: CUFORGE_ARCH or sm_90)"
    )
    parser.add_argument("--phase", choices=("compile", "run"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.phase == "compile":
        print(json.dumps(_compile_samples(SAMPLES_DIR, args.arch)))
        return 0
    if args.phase == "run":
        _run_samples()
        return 0

    from cuforge.toolchain import visible_gpu_archs

    gpu = visible_gpu_archs()
    arch = args.arch or (None if gpu else os.environ.get("CUFORGE_ARCH") or "sm_90")
    cache_dir = args.cache_dir or tempfile.mkdtemp(prefix="cuforge-demo-cache-")
    env = dict(os.environ, CUFORGE_CACHE_DIR=cache_dir)
    env.pop("CUFORGE_DISABLE_CACHE", None)
    env.pop("CUFORGE_DISABLE_FILE_CACHE", None)
    target = gpu[0] if gpu and not args.arch else arch
    print(f"cuforge demo: cache {cache_dir}, arch {target}" + ("" if gpu else " (no GPU visible)"))
    phase = ["--phase", "compile"] + (["--arch", arch] if arch else [])
    try:
        cold = _child(phase, env)
        warm = _child(phase, env)
        _print_table("cold: first compile (new process)", cold[1:])
        _print_table(
            f"warm: a fresh process (import cuforge took {warm[0]['import_seconds'] * 1e3:.1f} ms)",
            warm[1:],
        )
        for row in cold[1:]:
            if row["lowered"]:
                for expr, mangled in row["lowered"].items():
                    print(f"name expression {expr!r} -> {mangled}")
        _explained_miss(env, arch)
        _run_on_gpu(env, arch)
    finally:
        if not args.cache_dir:
            shutil.rmtree(cache_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
