"""``cuforge bench-build``: time PyTorch extension builds on this machine.

Reproduces the seed guide's comparison for the bundled sample extension
(:mod:`cuforge.samples.torch_ext`, ``--layout classic|fast``) or your own sources
(``--sources a.cu b.cpp --edit a.cu``). Every row runs in a fresh Python process on a
fresh copy of the sources and times the ``load()`` call alone (``import torch`` is
excluded; it is the same for every row). Rows (``--rows`` picks, default ``quick``):

=================  ==========================================================================
torch_default      torch's load(), the arch list torch uses when no GPU is visible (all of
                   the wheel's arches), ninja (torch 2.14 refuses to build without it)
torch_ninja        the same configuration (torch 2.14 refuses to build without ninja), so
                   it reports torch_default's runs when both are asked for
torch_arch         + pinned arch (TORCH_CUDA_ARCH_LIST=<one arch>)
torch_jobs         + MAX_JOBS=<cores>          ("torch tuned": the anchor of the goals)
torch_threads      + nvcc --threads <cores> (all arches: --threads only helps with several)
torch_ccache       + ccache as PYTORCH_NVCC launcher (skipped unless ccache is installed)
torch_warm         torch's load() again in a fresh process (it still runs ninja)
cuforge_cold       cuforge.torch.load(), empty cache
cuforge_edit       after editing one kernel (a fresh process)
cuforge_revert     after reverting that edit (a fresh process)
cuforge_warm       cuforge.torch.load() in a fresh process, nothing changed
=================  ==========================================================================

torch rows get ``CUDA_HOME`` set to the real toolkit and the pip CUDA include dirs as
``extra_include_paths``: without them torch guesses ``CUDA_HOME=/usr/local`` here and
fails (``cusparse.h: No such file``).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

__all__ = ["add_parser", "run", "ROWS", "measure"]

ROWS = (
    "torch_default",
    "torch_ninja",
    "torch_arch",
    "torch_jobs",
    "torch_threads",
    "torch_ccache",
    "torch_warm",
    "cuforge_cold",
    "cuforge_edit",
    "cuforge_revert",
    "cuforge_warm",
)
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


def add_parser(subparsers) -> None:
    """Register ``bench-build`` on an argparse subparsers object."""
    p = subparsers.add_parser(
        "bench-build",
        help="time PyTorch extension builds: torch's load() vs cuforge (cold/edit/revert/warm)",
        description="Time PyTorch extension builds on this machine: torch's load() (default, "
        "pinned arch, MAX_JOBS, --threads, ccache) against cuforge.torch.load() (cold, after "
        "a kernel edit, after a revert, warm in a fresh process). Each row is a fresh process "
        "on a fresh copy of the sources; the load() call is timed.",
    )
    p.add_argument(
        "--rows",
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
        "--arch", help="the pinned arch (default: the visible GPU, else CUFORGE_ARCH/9.0)"
    )
    p.add_argument("--repeat", type=int, default=1, help="runs per row; the median is reported")
    p.add_argument("--preset", default=None, help="cuforge flag preset (release, torch, debug)")
    p.add_argument("--json", action="store_true", help="print the results as one JSON document")
    p.add_argument("--json-out", help="also write the JSON document to this file")
    p.add_argument("--png", help="write a bar chart (needs matplotlib)")
    p.add_argument(
        "--workdir", help="keep the sources, builds and caches here (default: a temp dir)"
    )
    p.set_defaults(func=run)


def _pick_rows(text: str) -> list[str]:
    rows: list[str] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        names = ROW_SETS.get(part, (part,))
        for name in names:
            if name not in ROWS:
                raise SystemExit(f"unknown row {name!r}; rows: {', '.join(ROWS)}")
            if name not in rows:
                rows.append(name)
    return rows


def _default_arch(arch: str | None) -> str:
    from cuforge.toolchain import resolve_archs

    if arch:
        return resolve_archs(arch, allow_many=False)[0]
    try:
        return resolve_archs(None, allow_many=False)[0]
    except Exception:  # noqa: BLE001 - no GPU and no env: the machines' H100/H200 arch
        return "sm_90"


def _torch_arch_list(archs) -> str:
    out = []
    for a in archs:
        num = a.split("_", 1)[1]
        out.append(f"{num[:-1]}.{num[-1]}")
    return ";".join(out)


def _all_torch_archs() -> list[str]:
    code = "import torch, json; print(json.dumps(torch.cuda.get_arch_list()))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    try:
        archs = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        archs = []
    return [a for a in archs if a.startswith("sm_")] or ["sm_75", "sm_80", "sm_86", "sm_90"]


class Bench:
    def __init__(self, args, workdir: str) -> None:
        from cuforge import toolchain
        from cuforge.torch.flags import build_env

        self.args = args
        self.workdir = workdir
        self.arch = _default_arch(args.arch)
        self.cores = os.cpu_count() or 1
        env = build_env()
        self.include = list(env.nvidia_include)
        self.toolkit = toolchain.toolkit_root() or ""
        self.src_dir = os.path.join(workdir, "src")
        if args.sources:
            os.makedirs(self.src_dir, exist_ok=True)
            self.sources = []
            for s in args.sources:
                dst = os.path.join(self.src_dir, os.path.basename(s))
                shutil.copy2(s, dst)
                self.sources.append(dst)
            self.name = "bench_user_ext"
        else:
            from cuforge.samples import torch_ext

            shutil.copytree(torch_ext.SAMPLE_DIR, self.src_dir, dirs_exist_ok=True)
            self.sources = torch_ext.sources(args.layout, root=self.src_dir)
            self.name = f"bench_{args.layout}_ext"
        edit = args.edit
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
            "preset": self.args.preset,
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
        one = _torch_arch_list([self.arch])
        every = _torch_arch_list(_all_torch_archs())
        env: dict[str, str] = {"TORCH_CUDA_ARCH_LIST": every}
        flags: list[str] = []
        if row in ("torch_arch", "torch_jobs", "torch_ccache"):
            env["TORCH_CUDA_ARCH_LIST"] = one
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
        env = {"TORCH_CUDA_ARCH_LIST": _torch_arch_list([self.arch]), "MAX_JOBS": str(self.cores)}
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


def measure(args) -> dict:
    rows = _pick_rows(args.rows)
    workdir = args.workdir or tempfile.mkdtemp(prefix="cuforge-bench-build-")
    os.makedirs(workdir, exist_ok=True)
    bench = Bench(args, workdir)
    runs: dict[str, list[dict]] = {r: [] for r in rows}
    for _ in range(max(1, args.repeat)):
        for row in rows:
            if row == "torch_ninja" and "torch_default" in rows:
                continue  # the same configuration: torch 2.14 refuses to build without ninja
            if row.startswith("torch_") and row != "torch_warm":
                runs[row].append(bench.torch_row(row))
            elif row == "torch_warm":
                runs[row].append(bench.torch_warm())
        cf = [r for r in rows if r.startswith("cuforge_")]
        if cf:
            for row, res in bench.cuforge_rows(cf).items():
                runs[row].append(res)
    bench.set_edit(False)
    if "torch_ninja" in rows and "torch_default" in rows:
        runs["torch_ninja"] = [dict(r, same_as="torch_default") for r in runs["torch_default"]]
    results = []
    for row in rows:
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

    return {
        "schema": "cuforge.bench-build/1",
        "layout": None if args.sources else args.layout,
        "sources": [os.path.basename(s) for s in bench.sources],
        "edited": os.path.basename(bench.edit_target),
        "arch": bench.arch,
        "cores": bench.cores,
        "machine": platform.node(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "workdir": workdir,
        "rows": results,
    }


def format_table(doc: dict) -> str:
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


def _png(doc: dict, path: str) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib); no PNG written"
    rows = [r for r in doc["rows"] if "seconds" in r]
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(rows) + 1.2))
    names = [r["row"] for r in rows]
    secs = [r["seconds"] for r in rows]
    colors = ["#4c72b0" if n.startswith("torch") else "#dd8452" for n in names]
    ax.barh(names[::-1], secs[::-1], color=colors[::-1])
    ax.set_xlabel("wall seconds (load() call, median)")
    ax.set_title(f"extension build, {doc['cores']} cores, {doc['arch']}")
    for i, s in enumerate(secs[::-1]):
        ax.text(s, i, f" {s:.2f}s", va="center", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return None


def run(args) -> int:
    doc = measure(args)
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1)
    if args.png:
        problem = _png(doc, args.png)
        if problem:
            print(f"cuforge bench-build: {problem}", file=sys.stderr)
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        print(format_table(doc))
    failed = [r for r in doc["rows"] if "seconds" not in r and "skipped" not in str(r.get("runs"))]
    return 1 if failed else 0
