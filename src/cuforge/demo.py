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

import cuforge
from cuforge.samples import SAMPLES_DIR
from cuforge.toolchain import visible_gpu_archs

#: (label, file, backend, name_expressions, defines)
SAMPLES = (
    ('saxpy (extern "C")', "saxpy.cu", "nvrtc", (), {}),
    ("block_sum<256, float> (CUB)", "block_reduce.cu", "nvrtc", ("block_sum<256, float>",), {}),
    ("matmul (TILE=16)", "matmul.cu", "nvrtc", (), {"SAMPLE_TILE": 16}),
    ("saxpy via nvcc", "saxpy.cu", "nvcc", (), {}),
)


def _compile_samples(samples_dir: str, arch: str | None, import_seconds: float) -> list[dict]:
    """Runs in a child process: compile every sample, report timings as JSON."""

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


_COMPILE_CHILD = """
import time
started = time.perf_counter()
import cuforge
imported = time.perf_counter() - started
import json
from cuforge.demo import SAMPLES_DIR, _compile_samples
print(json.dumps(_compile_samples(SAMPLES_DIR, {arch!r}, imported)))
"""


def _child(arch: str | None, env: dict[str, str]) -> list[dict]:
    cmd = [sys.executable, "-c", _COMPILE_CHILD.format(arch=arch)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        raise SystemExit("demo step failed: compiling the samples in a child process")
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
    if not visible_gpu_archs():
        print("\nno GPU visible: compiled and cached only (kernels not run).")
        return
    print(f"\nrunning the samples on the GPU ({visible_gpu_archs()[0]}):")
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
    """Runs in a child process on a GPU machine: launch each sample and check it against torch."""
    try:
        import torch
    except ImportError:
        print(
            "  torch is not installed: install it (pip install 'cuforge[torch]') to run the samples"
        )
        return

    path = os.path.join
    dev = torch.device("cuda")
    n = 1 << 20
    saxpy = cuforge.compile_file(path(SAMPLES_DIR, "saxpy.cu")).kernel("saxpy")
    x, y = torch.randn(n, device=dev), torch.randn(n, device=dev)
    expected = 2.5 * x + y
    saxpy[(n + 255) // 256, 256](y, x, 2.5, n)
    _report("saxpy", torch.allclose(y, expected, rtol=1e-5, atol=1e-5))

    reduce = cuforge.compile_file(
        path(SAMPLES_DIR, "block_reduce.cu"), name_expressions=["block_sum<256, float>"]
    )
    block_sum = reduce.kernel("block_sum<256, float>")
    data = torch.randn(256 * 1024, device=dev)
    out = torch.full((1024,), float("nan"), device=dev)
    block_sum[1024, 256](data, out, data.numel())
    _report(
        "block_sum<256, float>",
        torch.allclose(out, data.view(1024, 256).sum(1), rtol=1e-4, atol=1e-3),
    )

    tile = 16
    matmul = cuforge.compile_file(
        path(SAMPLES_DIR, "matmul.cu"), defines={"SAMPLE_TILE": tile}
    ).kernel("matmul")
    m, k, nn = 300, 200, 250
    a, b = torch.randn(m, k, device=dev), torch.randn(k, nn, device=dev)
    c = torch.full((m, nn), float("nan"), device=dev)
    matmul[((nn + tile - 1) // tile, (m + tile - 1) // tile), (tile, tile)](a, b, c, m, nn, k)
    _report("matmul", torch.allclose(c, a @ b, rtol=1e-3, atol=1e-3))
    torch.cuda.synchronize()


def _report(label: str, ok: bool) -> None:
    print(f"  {label}: {'correct' if ok else 'WRONG'}")
    if not ok:
        raise SystemExit(f"{label} gave wrong results")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cuforge.demo", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--cache-dir", help="use this cache dir instead of a new temporary one")
    parser.add_argument(
        "--arch", help="target arch when no GPU is visible (default: CUFORGE_ARCH or sm_90)"
    )
    parser.add_argument("--phase", choices=("run",), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.phase == "run":
        _run_samples()
        return 0

    gpu = visible_gpu_archs()
    arch = args.arch or (None if gpu else os.environ.get("CUFORGE_ARCH") or "sm_90")
    cache_dir = args.cache_dir or tempfile.mkdtemp(prefix="cuforge-demo-cache-")
    env = dict(os.environ, CUFORGE_CACHE_DIR=cache_dir)
    env.pop("CUFORGE_DISABLE_CACHE", None)
    env.pop("CUFORGE_DISABLE_FILE_CACHE", None)
    target = gpu[0] if gpu and not args.arch else arch
    print(f"cuforge demo: cache {cache_dir}, arch {target}" + ("" if gpu else " (no GPU visible)"))
    try:
        cold = _child(arch, env)
        warm = _child(arch, env)
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
