"""PyTorch extension build times: torch's load() vs cuforge.torch.load().

    python bench/build_extension.py                          # quick: torch tuned + cuforge cold/edit/revert/warm
    python bench/build_extension.py --rows all --png b.png   # every row
    python bench/build_extension.py --layout fast            # the fast-edit layout of the sample
    python bench/build_extension.py --sources a.cu b.cpp --edit a.cu --json

Writes the JSON document to ``bench/out/build_extension-<layout>.json`` too (``--json-out``
elsewhere). The quick rows take ~8 minutes on 2 cores; ``--rows all`` ~30 (torch's
all-arch build alone is ~6 minutes). Exit status 1 when a row failed.

How long does building a PyTorch extension take on this machine, with torch's ``load()``
and with :func:`cuforge.torch.load`? :func:`bench_build` measures it.

**What is measured.** For each *row* (a way of building, see :data:`ROW_HELP`), a fresh
Python process imports torch, then calls ``load()`` on a fresh copy of the sources; the
time of that ``load()`` call alone is recorded (``import torch`` is left out: it is the
same for every row). The sources are the bundled sample extension
(:mod:`cuforge.samples.torch_ext`, layout ``classic``: one ``.cu`` that includes torch's
headers, or ``fast``: the kernels in a ``.cu`` without torch headers plus a binding
``.cpp``), or your own files. With ``repeat`` > 1 every row runs that many times and the
median is reported.

The cuforge rows follow a user's edit loop on one cache: ``cuforge_cold`` (empty cache),
``cuforge_edit`` (after a one-line edit of one source), ``cuforge_revert`` (after undoing
that edit), ``cuforge_warm`` (nothing changed, a new process).

**How to read the result.** :class:`BenchResult` holds one entry per row: ``seconds``
(median wall time of the ``load()`` call), ``vs_default`` (that time divided by
``torch_default``'s: torch out of the box) and ``vs_tuned`` (divided by ``torch_jobs``'s:
torch with one pinned arch and ``MAX_JOBS`` = cores, the fair baseline). Below 1 means
faster than that baseline: 0.02 is 50 times faster. For a cuforge row, ``runs[i]
["compiled"]`` says which sources were compiled (the rest came from the cache). A row
that could not run has a ``note`` instead (e.g. ccache not installed), and a row that
failed keeps the last lines of its output there.

torch rows get ``CUDA_HOME`` set to the real toolkit and the pip CUDA include dirs as
``extra_include_paths``: without them torch guesses ``CUDA_HOME=/usr/local`` on machines
whose ``nvcc`` is a wrapper and fails (``cusparse.h: No such file``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

__all__ = ["ROWS", "ROW_SETS", "ROW_HELP", "TUNED", "BenchResult", "bench_build", "pick_rows"]

#: What each row builds with.
ROW_HELP = {
    "torch_default": "torch's load(), all of the wheel's archs (what torch does with no GPU "
    "visible), ninja",
    "torch_ninja": "the same configuration as torch_default (torch 2.14 refuses to build "
    "without ninja), so it reports torch_default's runs when both are asked for",
    "torch_arch": "+ one pinned arch (TORCH_CUDA_ARCH_LIST=<arch>)",
    "torch_jobs": "+ MAX_JOBS=<cores> (torch tuned: the baseline of vs_tuned)",
    "torch_threads": "+ nvcc --threads <cores>, all archs (--threads only helps with several)",
    "torch_ccache": "+ ccache as the PYTORCH_NVCC launcher (skipped unless ccache is installed)",
    "torch_warm": "torch's load() again in a fresh process, nothing changed (it still runs ninja)",
    "cuforge_cold": "cuforge.torch.load(), empty cache",
    "cuforge_edit": "after a one-line edit of one source (a fresh process)",
    "cuforge_revert": "after undoing that edit (a fresh process)",
    "cuforge_warm": "cuforge.torch.load() in a fresh process, nothing changed",
}
ROWS = tuple(ROW_HELP)
ROW_SETS = {
    "quick": (
        "torch_jobs",
        "torch_warm",
        "cuforge_cold",
        "cuforge_edit",
        "cuforge_revert",
        "cuforge_warm",
    ),
    "cuforge": ("cuforge_cold", "cuforge_edit", "cuforge_revert", "cuforge_warm"),
    "all": ROWS,
}
#: The row ``vs_tuned`` divides by.
TUNED = "torch_jobs"

_CHILD = r"""
import json, os, sys, time
cfg = json.loads(sys.argv[1])
import torch  # not timed: the same for every row
if cfg["tool"] == "torch":
    from torch.utils.cpp_extension import load
    kwargs = {}
else:
    from cuforge.torch import load
    kwargs = {"preset": cfg["preset"]} if cfg.get("preset") else {}
t0 = time.perf_counter()
load(cfg["name"], cfg["sources"], extra_cuda_cflags=cfg["cuda_flags"],
     extra_include_paths=cfg["include"], build_directory=cfg["build_dir"], **kwargs)
seconds = time.perf_counter() - t0
extra = {}
if cfg["tool"] == "cuforge":
    from cuforge.torch.build import last_build
    extra = {"compiled": last_build.get("compiled"), "source": last_build.get("source")}
print(json.dumps({"seconds": seconds, **extra}))
"""


def pick_rows(text: str) -> list[str]:
    """Row names from ``"quick"``, ``"all"``, ``"torch_jobs,cuforge"`` (sets and rows,
    comma-separated, in order, without repeats). Raises ValueError naming an unknown row."""
    rows: list[str] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        for name in ROW_SETS.get(part, (part,)):
            if name not in ROWS:
                raise ValueError(
                    f"unknown row {name!r}; rows: {', '.join(ROWS)}; sets: {', '.join(ROW_SETS)}"
                )
            if name not in rows:
                rows.append(name)
    return rows


class BenchResult:
    """What :func:`bench_build` measured (see the module docstring for how to read it).

    ``rows``: one dict per row, in order: ``row``, ``runs`` (each run's ``seconds`` and,
    for cuforge rows, ``compiled`` and ``source``), then ``seconds`` (median),
    ``vs_default`` and ``vs_tuned`` (None when that baseline was not run), or ``note``
    when the row did not produce a time. Also ``sources``, ``layout``, ``edited`` (the file
    the edit rows change), ``arch``, ``cores``, ``machine``, ``time`` and ``workdir``
    (where the sources, builds and caches are kept)."""

    __slots__ = ("doc",)

    SCHEMA = "cuforge.bench-build/1"

    def __init__(self, doc: dict) -> None:
        self.doc = doc

    @property
    def rows(self) -> list[dict]:
        return self.doc["rows"]

    def seconds(self, row: str) -> float | None:
        """The median seconds of ``row``, or None when it has no time."""
        return next((r.get("seconds") for r in self.rows if r["row"] == row), None)

    @property
    def failed(self) -> list[str]:
        """Rows that were asked for and neither ran nor were skipped for a stated reason."""
        return [
            r["row"]
            for r in self.rows
            if "seconds" not in r and "skipped" not in str(r.get("runs"))
        ]

    def as_dict(self) -> dict:
        """The JSON document (schema :attr:`SCHEMA`)."""
        return self.doc

    def table(self) -> str:
        """A text table: one line per row with seconds, vs default, vs tuned and a note."""
        return format_table(self.doc)

    def plot(self, path: str) -> str | None:
        """Write a bar chart PNG to ``path``. Returns None, or why nothing was written
        (matplotlib is not installed)."""
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            return "matplotlib is not installed (pip install matplotlib); no PNG written"
        rows = [r for r in self.rows if "seconds" in r]
        fig, ax = plt.subplots(figsize=(8, 0.45 * len(rows) + 1.2))
        names = [r["row"] for r in rows]
        secs = [r["seconds"] for r in rows]
        colors = ["#4c72b0" if n.startswith("torch") else "#dd8452" for n in names]
        ax.barh(names[::-1], secs[::-1], color=colors[::-1])
        ax.set_xlabel("wall seconds (load() call, median)")
        ax.set_title(f"extension build, {self.doc['cores']} cores, {self.doc['arch']}")
        for i, s in enumerate(secs[::-1]):
            ax.text(s, i, f" {s:.2f}s", va="center", fontsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        return None

    def __repr__(self) -> str:
        return f"BenchResult({[(r['row'], r.get('seconds')) for r in self.rows]})"


def format_table(doc: dict) -> str:
    """The text table of a bench-build JSON document (:meth:`BenchResult.table`)."""
    lines = [
        f"sources: {', '.join(doc['sources'])} (layout {doc['layout']}), arch {doc['arch']}, "
        f"{doc['cores']} cores; edit rows change {doc['edited']}",
        f"{'row':<16} {'seconds':>9} {'vs default':>11} {'vs tuned':>9}  note",
    ]
    for r in doc["rows"]:
        if "seconds" in r:
            d = f"{r['vs_default']:.3f}x" if r.get("vs_default") else "-"
            t = f"{r['vs_tuned']:.3f}x" if r.get("vs_tuned") else "-"
            note = ""
            last = r["runs"][-1] if r["runs"] else {}
            if last.get("compiled") is not None:
                note = f"compiled: {', '.join(last['compiled']) or 'nothing'}"
            elif last.get("same_as"):
                note = f"= {last['same_as']} (torch 2.14 always uses ninja)"
            lines.append(f"{r['row']:<16} {r['seconds']:>9.3f} {d:>11} {t:>9}  {note}")
        else:
            note = str(r.get("note", "")).strip().splitlines()
            lines.append(f"{r['row']:<16} {'-':>9} {'-':>11} {'-':>9}  {note[-1] if note else ''}")
    return "\n".join(lines)


def _default_arch(arch: str | None) -> str:
    from cuforge.base.errors import CuforgeError
    from cuforge.toolchain import resolve_archs

    if arch:
        return resolve_archs(arch, allow_many=False)[0]
    try:
        return resolve_archs(None, allow_many=False)[0]
    except CuforgeError:
        return "sm_90"  # no GPU and no CUFORGE_ARCH: the arch of the H100/H200 machines


def _all_torch_archs() -> list[str]:
    code = "import torch, json; print(json.dumps(torch.cuda.get_arch_list()))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    try:
        archs = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        archs = []
    return [a for a in archs if a.startswith("sm_")] or ["sm_75", "sm_80", "sm_86", "sm_90"]


class _Bench:
    """One measurement: the copied sources, the child processes, the edit."""

    def __init__(self, *, workdir, layout, sources, edit, arch, preset) -> None:
        from cuforge import toolchain
        from cuforge.torch.flags import build_env

        self.workdir = workdir
        self.preset = preset
        self.arch = _default_arch(arch)
        self.cores = os.cpu_count() or 1
        self.include = list(build_env().nvidia_include)
        self.toolkit = toolchain.toolkit_root() or ""
        self.src_dir = os.path.join(workdir, "src")
        if sources:
            os.makedirs(self.src_dir, exist_ok=True)
            self.sources = []
            for s in sources:
                dst = os.path.join(self.src_dir, os.path.basename(s))
                shutil.copy2(s, dst)
                self.sources.append(dst)
            self.name = "bench_user_ext"
        else:
            from cuforge.samples import torch_ext

            shutil.copytree(torch_ext.SAMPLE_DIR, self.src_dir, dirs_exist_ok=True)
            self.sources = torch_ext.sources(layout, root=self.src_dir)
            self.name = f"bench_{layout}_ext"
        if edit:
            target = os.path.join(self.src_dir, os.path.basename(edit))
        else:
            target = next((s for s in self.sources if s.endswith(".cu")), self.sources[0])
        self.edit_target = target
        with open(target, encoding="utf-8") as f:
            self.original = f.read()
        self.counter = 0

    def child(self, tool: str, env_over: dict, build_dir: str, cuda_flags=(), cache=None) -> dict:
        cfg = {
            "tool": tool,
            "name": self.name,
            "sources": self.sources,
            "cuda_flags": list(cuda_flags),
            "include": self.include if tool == "torch" else [],
            "build_dir": build_dir,
            "preset": self.preset,
        }
        env = dict(os.environ)
        for k in ("TORCH_CUDA_ARCH_LIST", "MAX_JOBS", "PYTORCH_NVCC", "CUFORGE_ARCH"):
            env.pop(k, None)
        if tool == "torch" and self.toolkit:
            env["CUDA_HOME"] = self.toolkit
        if cache:
            env["CUFORGE_CACHE_DIR"] = cache
            env["CUFORGE_ARCH"] = self.arch
        env.update(env_over)
        os.makedirs(build_dir, exist_ok=True)
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, json.dumps(cfg)],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).splitlines()[-25:])
            return {"error": tail}
        return json.loads(done.stdout.strip().splitlines()[-1])

    def fresh(self, label: str) -> str:
        self.counter += 1
        return os.path.join(self.workdir, f"{self.counter:02d}-{label}")

    def set_edit(self, edited: bool) -> None:
        text = self.original + ("\n// cuforge bench-build: an edit\n" if edited else "")
        with open(self.edit_target, "w", encoding="utf-8") as f:
            f.write(text)

    def torch_row(self, row: str) -> dict:
        from cuforge.base.arch import torch_arch_list

        env: dict[str, str] = {"TORCH_CUDA_ARCH_LIST": torch_arch_list(_all_torch_archs())}
        flags: list[str] = []
        if row in ("torch_arch", "torch_jobs", "torch_ccache"):
            env["TORCH_CUDA_ARCH_LIST"] = torch_arch_list([self.arch])
        if row in ("torch_jobs", "torch_threads", "torch_ccache"):
            env["MAX_JOBS"] = str(self.cores)
        if row == "torch_threads":
            flags = ["--threads", str(self.cores)]
        if row == "torch_ccache":
            ccache = shutil.which("ccache")
            if ccache is None:
                return {"skipped": "ccache is not installed"}
            env["PYTORCH_NVCC"] = f"{ccache} {os.path.join(self.toolkit, 'bin', 'nvcc')}"
            env["CCACHE_DIR"] = self.fresh("ccache")
        self.set_edit(False)
        return self.child("torch", env, self.fresh(row), flags)

    def torch_warm(self) -> dict:
        from cuforge.base.arch import torch_arch_list

        env = {"TORCH_CUDA_ARCH_LIST": torch_arch_list([self.arch]), "MAX_JOBS": str(self.cores)}
        self.set_edit(False)
        bdir = self.fresh("torch_warm")
        first = self.child("torch", env, bdir)
        if "error" in first:
            return first
        return self.child("torch", env, bdir)

    def cuforge_rows(self, rows: list[str]) -> dict[str, dict]:
        out: dict[str, dict] = {}
        cache = self.fresh("cuforge-cache")
        bdir = self.fresh("cuforge-build")
        self.set_edit(False)
        cold = self.child("cuforge", {}, bdir, cache=cache)
        out["cuforge_cold"] = cold
        if "error" in cold:
            return out
        if "cuforge_edit" in rows or "cuforge_revert" in rows:
            self.set_edit(True)
            out["cuforge_edit"] = self.child("cuforge", {}, bdir, cache=cache)
            self.set_edit(False)
            out["cuforge_revert"] = self.child("cuforge", {}, bdir, cache=cache)
        out["cuforge_warm"] = self.child("cuforge", {}, bdir, cache=cache)
        return {k: v for k, v in out.items() if k in rows}


def bench_build(
    rows: str | list[str] = "quick",
    *,
    layout: str = "classic",
    sources: list[str] | None = None,
    edit: str | None = None,
    arch: str | None = None,
    repeat: int = 1,
    preset: str | None = None,
    workdir: str | None = None,
) -> BenchResult:
    """Time extension builds on this machine (see the module docstring).

    ``rows``: row and set names (a comma-separated string or a list; default ``quick``:
    torch tuned + the cuforge edit loop). ``layout``: the bundled sample's ``classic`` or
    ``fast`` layout, unless ``sources`` names your own files; ``edit``: which source the
    edit rows change (default the first ``.cu``). ``arch``: the pinned arch (default the
    visible GPU, else ``CUFORGE_ARCH``, else sm_90). ``repeat``: runs per row (the median
    is reported). ``preset``: cuforge's flag preset. ``workdir``: where the copies,
    builds and caches go (default a new temp dir; it is kept for inspection).

    Raises ValueError for an unknown row or layout. A row that fails does not raise: its
    entry carries the failure's last lines as ``note`` (see :attr:`BenchResult.failed`).
    """
    names = pick_rows(rows if isinstance(rows, str) else ",".join(rows))
    if layout not in ("classic", "fast"):
        raise ValueError(f"layout must be 'classic' or 'fast', not {layout!r}")
    workdir = workdir or tempfile.mkdtemp(prefix="cuforge-bench-build-")
    os.makedirs(workdir, exist_ok=True)
    bench = _Bench(
        workdir=workdir, layout=layout, sources=sources, edit=edit, arch=arch, preset=preset
    )
    runs: dict[str, list[dict]] = {r: [] for r in names}
    for _ in range(max(1, repeat)):
        for row in names:
            if row == "torch_ninja" and "torch_default" in names:
                continue  # the same configuration: torch 2.14 refuses to build without ninja
            if row.startswith("torch_") and row != "torch_warm":
                runs[row].append(bench.torch_row(row))
            elif row == "torch_warm":
                runs[row].append(bench.torch_warm())
        cf = [r for r in names if r.startswith("cuforge_")]
        if cf:
            for row, res in bench.cuforge_rows(cf).items():
                runs[row].append(res)
    bench.set_edit(False)
    if "torch_ninja" in names and "torch_default" in names:
        runs["torch_ninja"] = [dict(r, same_as="torch_default") for r in runs["torch_default"]]
    results = []
    for row in names:
        ok = [r["seconds"] for r in runs[row] if "seconds" in r]
        entry: dict = {"row": row, "runs": runs[row]}
        if ok:
            entry["seconds"] = statistics.median(ok)
        else:
            first = runs[row][0] if runs[row] else {}
            entry["note"] = first.get("skipped") or first.get("error", "not run")
        results.append(entry)
    base = next((r.get("seconds") for r in results if r["row"] == "torch_default"), None)
    tuned = next((r.get("seconds") for r in results if r["row"] == TUNED), None)
    for r in results:
        if "seconds" in r:
            r["vs_default"] = r["seconds"] / base if base else None
            r["vs_tuned"] = r["seconds"] / tuned if tuned else None
    import platform

    return BenchResult(
        {
            "schema": BenchResult.SCHEMA,
            "layout": None if sources else layout,
            "sources": [os.path.basename(s) for s in bench.sources],
            "edited": os.path.basename(bench.edit_target),
            "arch": bench.arch,
            "cores": bench.cores,
            "machine": platform.node(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "workdir": workdir,
            "rows": results,
        }
    )


# -- the command line --------------------------------------------------------------


_EPILOG = (
    "Each row is a fresh Python process on a fresh copy of the sources; only the load() call "
    "is timed (import torch is not). 'seconds' is the median over --repeat runs; 'vs "
    "default' divides by torch_default (torch out of the box), 'vs tuned' by torch_jobs "
    "(torch with one arch and MAX_JOBS=cores): below 1 is faster, 0.020x is 50 times "
    "faster. For cuforge rows the note says which sources were compiled; the others came "
    "from the cache.\n\nrows:\n"
    + "\n".join(f"  {name:<15} {text}" for name, text in ROW_HELP.items())
    + "\n\nsets:\n"
    + "\n".join(
        f"  {name:<15} {', '.join(rows)}" for name, rows in ROW_SETS.items() if name != "all"
    )
    + "\n  all             every row"
)


def _rows(text: str) -> list[str]:
    try:
        return pick_rows(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="build_extension.py",
        description="Time PyTorch extension builds on this machine: torch's load() (default, "
        "pinned arch, MAX_JOBS, --threads, ccache) against cuforge.torch.load() (cold, after "
        "a kernel edit, after a revert, warm in a fresh process).",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--rows",
        type=_rows,
        default="quick",
        help="comma-separated rows, or a set: quick (default: torch tuned + cuforge), "
        f"cuforge, all. Rows: {', '.join(ROWS)}",
    )
    p.add_argument(
        "--layout",
        choices=("classic", "fast"),
        default="classic",
        help="sample layout: classic (.cu with torch headers) or fast (kernels .cu without)",
    )
    p.add_argument("--sources", nargs="+", help="your own extension sources instead of the sample")
    p.add_argument("--edit", help="the source the edit rows change (default: the first .cu)")
    p.add_argument(
        "--arch", help="the pinned arch (default: the visible GPU, else CUFORGE_ARCH, else sm_90)"
    )
    p.add_argument("--repeat", type=int, default=1, help="runs per row; the median is reported")
    p.add_argument("--preset", default=None, help="cuforge flag preset (release, torch, debug)")
    p.add_argument("--json", action="store_true", help="print the results as one JSON document")
    p.add_argument("--json-out", help="also write the JSON document to this file")
    p.add_argument("--png", help="write a bar chart (needs matplotlib)")
    p.add_argument(
        "--workdir", help="keep the sources, builds and caches here (default: a temp dir)"
    )
    return p


def run(args) -> int:
    """Run the benchmark of ``args``; print the table (or JSON). Exit status 1 when a row
    failed (its note holds the failure's last lines)."""
    rows = args.rows if isinstance(args.rows, list) else pick_rows(args.rows)
    result = bench_build(
        rows,
        layout=args.layout,
        sources=args.sources,
        edit=args.edit,
        arch=args.arch,
        repeat=args.repeat,
        preset=args.preset,
        workdir=args.workdir,
    )
    doc = result.as_dict()
    if args.json_out:
        from cuforge.base._fs import atomic_write

        atomic_write(args.json_out, json.dumps(doc, indent=1), mode=0o644)
    if args.png:
        problem = result.plot(args.png)
        if problem:
            print(f"build_extension.py: {problem}", file=sys.stderr)
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(result.table())
    return 1 if result.failed else 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.json_out:
        out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")
        os.makedirs(out, exist_ok=True)
        args.json_out = os.path.join(out, f"build_extension-{args.layout}.json")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
