"""``cuforge bench-build``: how long PyTorch extension builds take on this machine, torch's
``load()`` against ``cuforge.torch.load()``.

A thin command over :func:`cuforge.torch.bench.bench_build` (what is measured and how to
read the table are explained there and in ``cuforge bench-build --help``)::

    cuforge bench-build                          # quick: torch tuned + cuforge cold/edit/revert/warm
    cuforge bench-build --rows all --png b.png   # every row
    cuforge bench-build --layout fast            # the fast-edit layout of the sample
    cuforge bench-build --sources a.cu b.cpp --edit a.cu --json
"""

from __future__ import annotations

import argparse
import sys

from cuforge.torch.bench import ROW_HELP, ROW_SETS, ROWS, pick_rows

__all__ = ["add_parser", "run"]

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


def add_parser(subparsers) -> None:
    """Register ``bench-build`` on an argparse subparsers object."""
    p = subparsers.add_parser(
        "bench-build",
        help="time PyTorch extension builds: torch's load() vs cuforge (cold/edit/revert/warm)",
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
    p.set_defaults(func=run)


def run(args) -> int:
    """Run the benchmark of ``args``; print the table (or JSON). Exit status 1 when a row
    failed (its note holds the failure's last lines)."""
    import json

    from cuforge.torch.bench import bench_build

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
        from cuforge._fs import atomic_write

        atomic_write(args.json_out, json.dumps(doc, indent=1), mode=0o644)
    if args.png:
        problem = result.plot(args.png)
        if problem:
            print(f"cuforge bench-build: {problem}", file=sys.stderr)
    if args.json:
        from cuforge.cli import output

        # through output.emit_json, so that cli.main knows a document was printed (the
        # doc's own "schema" value, cuforge.bench-build/1, stays)
        output.emit_json(doc)
    else:
        print(result.table())
    return 1 if result.failed else 0
