"""CPU time of a fresh process's disk hit against ``import cuforge`` alone.

    python bench/disk_hit_cpu.py [--runs 15] [--base /other/checkout/src] [--json out.json]

For each install shape, in fresh processes (CPU = user + system time of the child, from
``resource.getrusage(RUSAGE_CHILDREN)``; bytecode written, as an installed package has it):

* ``import``: ``python -c "import cuforge"``;
* ``entry``: ``import cuforge`` then the lazy name ``cuforge.compile_file`` (the compile
  path's modules imported, nothing compiled or looked up);
* ``hit``: ``import cuforge`` then one ``compile_file`` of the CUB block-reduce sample that
  is a disk hit (its cache dir warmed before timing), through NVRTC.

Shapes: ``matching`` (NVRTC and the toolkit's headers of one release: whatever this machine
has) and ``mixed`` (a toolkit whose headers are of another release than the pip NVRTC
wheel: a copy of this machine's toolkit include dir made of symlinks whose ``cuda.h`` says
``CUDA_VERSION`` one minor up, named by ``CUDA_HOME``; NVRTC then compiles with its own
release's header wheels, found through cuda-pathfinder). Each child also reports whether
``cuda.pathfinder`` / ``cuda.bindings`` were imported. Runs alternate between the trees and
the two kinds of child, so that they see the same machine load; reported: medians.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
NEW_SRC = os.path.join(os.path.dirname(HERE), "src")

IMPORT_CHILD = "import cuforge"
# ``import cuforge`` loads the compile path on first use (``cuforge.compile_file`` and the rest
# of the kernel API are lazy names): this child loads it without compiling, the part of a hit
# that is the entry point's import rather than the hit's own work
ENTRY_CHILD = "import cuforge; cuforge.compile_file"
HIT_CHILD = textwrap.dedent(
    """
    import sys
    import cuforge
    from cuforge.samples import SAMPLES_DIR
    r = cuforge.compile_file(SAMPLES_DIR + "/block_reduce.cu", arch="sm_90",
                             name_expressions=("block_sum<256, float>",))
    mods = sys.modules
    print(r.source_of_result, int("cuda.pathfinder" in mods), int("cuda.bindings" in mods))
    """
)


def _env(src: str, cache: str, toolkit: str | None) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=src, CUFORGE_CACHE_DIR=cache)
    for name in ("PYTHONDONTWRITEBYTECODE", "CUFORGE_REMOTE", "CUFORGE_OFFLINE"):
        env.pop(name, None)
    env.pop("CUFORGE_DISABLE_CACHE", None)
    env.pop("CUDA_PATH", None)
    if toolkit is None:
        env.pop("CUDA_HOME", None)
    else:
        env["CUDA_HOME"] = toolkit
    return env


def _cpu(code: str, env: dict[str, str]) -> tuple[float, str]:
    """(CPU ms of one child running ``code``, its stdout)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"the child failed:\n{done.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu * 1e3, done.stdout.strip()


def _mixed_toolkit(scratch: str) -> str:
    """A toolkit root whose headers say one CUDA minor up from this machine's toolkit."""
    sys.path.insert(0, NEW_SRC)
    from cuforge.toolchain import header_cuda_version, toolkit_root

    real = toolkit_root()
    if real is None:
        raise SystemExit("no CUDA toolkit here: the mixed shape needs one to copy")
    real_inc = os.path.join(real, "include")
    version = header_cuda_version(real_inc)
    if version is None:
        raise SystemExit(f"{real_inc}/cuda.h has no CUDA_VERSION")
    root = os.path.join(scratch, "toolkit-mixed")
    inc = os.path.join(root, "include")
    os.makedirs(inc)
    for name in os.listdir(real_inc):
        if name != "cuda.h":
            os.symlink(os.path.join(real_inc, name), os.path.join(inc, name))
    want = version[0] * 1000 + version[1] * 10
    with open(os.path.join(real_inc, "cuda.h")) as f:
        text = f.read()
    text = text.replace(f"#define CUDA_VERSION {want}", f"#define CUDA_VERSION {want + 10}")
    with open(os.path.join(inc, "cuda.h"), "w") as f:
        f.write(text)
    return root


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--base", help="another tree's src directory, measured alongside")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    trees = {"new": NEW_SRC}
    if args.base:
        trees["base"] = os.path.abspath(args.base)
    scratch = tempfile.mkdtemp(prefix="cuforge-hitcpu-")
    shapes = {"matching": None, "mixed": _mixed_toolkit(scratch)}
    cells = [(t, s) for t in trees for s in shapes]
    envs = {(t, s): _env(trees[t], os.path.join(scratch, f"{t}-{s}"), shapes[s]) for t, s in cells}
    flags: dict[tuple[str, str], str] = {}
    for cell in cells:  # warm each cache (and each tree's bytecode)
        _cpu(HIT_CHILD, envs[cell])
        _, out = _cpu(HIT_CHILD, envs[cell])
        if not out.startswith("disk"):
            raise SystemExit(f"{cell}: the second compile was not a disk hit ({out})")
        flags[cell] = out
    samples: dict[tuple[str, str, str], list[float]] = {}
    for i in range(args.runs):
        for cell in cells if i % 2 == 0 else reversed(cells):
            for kind, code in (
                ("import", IMPORT_CHILD),
                ("entry", ENTRY_CHILD),
                ("hit", HIT_CHILD),
            ):
                ms, out = _cpu(code, envs[cell])
                samples.setdefault((*cell, kind), []).append(ms)
                if kind == "hit":
                    flags[cell] = out
    result: dict = {}
    print(
        f"{'tree':6}{'shape':10}{'import ms':>11}{'entry ms':>10}{'hit ms':>9}"
        f"{'hit/import':>12}{'hit/entry':>11}  pathfinder bindings"
    )
    for tree, shape in cells:
        imp = statistics.median(samples[(tree, shape, "import")])
        hit = statistics.median(samples[(tree, shape, "hit")])
        entry = statistics.median(samples[(tree, shape, "entry")])
        _, pathfinder, bindings = flags[(tree, shape)].split()
        result[f"{tree}/{shape}"] = {
            "import_cpu_ms": imp,
            "entry_cpu_ms": entry,
            "hit_cpu_ms": hit,
            "ratio": hit / imp,
            "ratio_to_entry": hit / entry,
            "pathfinder_imported": pathfinder == "1",
            "bindings_imported": bindings == "1",
        }
        print(
            f"{tree:6}{shape:10}{imp:11.1f}{entry:10.1f}{hit:9.1f}{hit / imp:12.2f}"
            f"{hit / entry:11.2f}  "
            f"{'yes' if pathfinder == '1' else 'no':10} {'yes' if bindings == '1' else 'no'}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
