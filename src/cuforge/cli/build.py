"""``cuforge build [MANIFEST] [--jobs N] [--bundle FILE] [--executor local|ray] [--strict]``.

A thin command over :func:`cuforge.aot.build.build`: a progress bar (done / total, hits,
failures, ETA) on a terminal, a summary table at the end, each failure's compiler log on
stderr. Exit code 0 when every variant is built or cached, 1 when any failed (the others
are still built), 2 for a usage error. ``--json``: one document with every variant.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from cuforge.base._fs import destination_problem
from cuforge.base.config import settings
from cuforge.cli import output

__all__ = ["add_parser", "run"]


def _jobs(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError("must be 1 or more")
    return value


#: ``cuforge build --help``'s manifest primer (the wheel ships no docs/ directory).
_MANIFEST_HELP = """\
a manifest (cuforge.toml, or [tool.cuforge] in pyproject.toml):

  arch = ["sm_80", "sm_90"]                 # default for every entry

  [[kernel]]                                # a cuforge.compile_file call
  source = "red.cu"                         # relative to the manifest
  include_dirs = ["include"]
  name_expressions = ["blk<{BLOCK}, {T}>"]  # {NAME} expands over [kernel.grid]
  defines = { TILE = "{BLOCK}" }            # also: options, arch, backend, output
  [kernel.grid]
  BLOCK = [128, 256]
  T = ["float", "double"]

  [[extension]]                             # a cuforge.torch.load call
  name = "my_ext"
  sources = ["ext.cpp", "ext_kernel.cu"]    # also: extra_cflags, extra_cuda_cflags, ...

  [[python]]                                # a function making cuforge.cccl / cuforge.cute calls
  call = "kernels:build_reduce"             # module:function, next to the manifest

Every variant is exactly the cache entry the same JIT call makes, so the call hits later.
"""


def add_parser(subparsers: Any, common: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser(
        "build",
        parents=[common],
        epilog=_MANIFEST_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        help="build every variant a manifest (cuforge.toml) lists, in parallel",
        description="Build every kernel / extension / python variant of a manifest (cuforge.toml, or "
        "[tool.cuforge] in pyproject.toml) ahead of time. Variants already in the cache count "
        "as hits and are not rebuilt.",
    )
    p.add_argument(
        "manifest",
        nargs="?",
        default=None,
        help="the manifest file or its directory (default: the working directory)",
    )
    p.add_argument(
        "--jobs",
        "-j",
        metavar="N",
        default=None,
        help="parallel build processes (default: the count `cuforge env` recommends)",
    )
    p.add_argument("--bundle", metavar="FILE", help="also write every variant into this bundle")
    p.add_argument(
        "--lock",
        metavar="LOCKFILE",
        help="build exactly the keys of this lockfile (cuforge.record / CUFORGE_RECORD): "
        "entries the cache has are copied, the others built from their stanzas; needs --bundle",
    )
    p.add_argument(
        "--executor",
        choices=("local", "ray"),
        default="local",
        help="where variants build: local processes (default) or Ray tasks "
        "(ray.init(); RAY_ADDRESS for a cluster)",
    )
    p.add_argument(
        "--strict",
        action="store_true",
        help="compile nothing: fail for every variant not already in the cache",
    )
    p.set_defaults(func=run)


def _progress_wanted(as_json: bool) -> tuple[bool, bool]:
    """(draw a rich bar, print plain progress lines)."""

    forced = settings().progress
    if as_json or forced is False:
        return False, False
    if output.fancy(sys.stderr):
        return True, False
    return False, forced is True


def run(args: argparse.Namespace) -> int:
    jobs = output.usage_value("--jobs", _jobs, args.jobs) if args.jobs is not None else None
    if args.bundle:  # refused before anything is built, not after
        problem = destination_problem(os.path.abspath(args.bundle))
        if problem is not None:
            raise ValueError(f"--bundle {args.bundle}: cannot write the bundle there: {problem}")
    if args.lock:
        return _run_lock(args, jobs)
    rich, plain = _progress_wanted(args.json)
    counts = {"done": 0, "hits": 0, "failed": 0}

    with output.progress("building", enabled=rich) as bar:

        def on_result(result, total: int) -> None:
            counts["done"] += 1
            counts["hits"] += int(result.ok and result.hit)
            counts["failed"] += int(not result.ok)
            bar.set_total(total)
            bar.advance(description=f"building: {counts['hits']} hits, {counts['failed']} failed")
            if plain:
                state = "hit" if result.hit else ("built" if result.ok else "FAILED")
                print(
                    f"[{counts['done']}/{total}] {result.label}: {state} "
                    f"({output.human_seconds(result.seconds)})",
                    file=sys.stderr,
                    flush=True,
                )

        from cuforge.aot.build import build  # ~45 ms (executors): not for other commands

        report = build(
            args.manifest,
            jobs=jobs,
            executor=args.executor,
            bundle=args.bundle,
            strict=args.strict,
            on_result=on_result,
        )
    for failure in report.failed:
        output.error(f"{failure.label} failed:\n{failure.log.rstrip()}")
    if args.bundle and report.failed:
        output.error(
            f"bundle {args.bundle} not written: {len(report.failed)} variant(s) failed "
            "(a partial bundle would fail later, in production)"
        )
    if args.json:
        output.emit_json({"command": "build", "ok": report.ok, **report.as_dict()})
        return 0 if report.ok else 1
    rate = f"{report.total / report.seconds:.1f}/s" if report.seconds else "-"
    rows = [
        ("manifest", report.manifest),
        ("variants", report.total),
        ("hits (cached)", report.hits),
        ("built", report.built),
        ("failed", len(report.failed)),
        ("time", f"{output.human_seconds(report.seconds)} ({rate})"),
        (
            "executor",
            f"{report.executor}, "
            + ("" if report.executor == "ray" else "jobs ")
            + report.jobs_why,
        ),
    ]
    if report.bundle:
        rows.append(
            (
                "bundle",
                f"{report.bundle} ({report.bundle_entries} entries, "
                f"{output.human_bytes(report.bundle_bytes)})",
            )
        )
    output.table(("build", "result"), rows, title="cuforge build")
    return 0 if report.ok else 1


def _run_lock(args: argparse.Namespace, jobs: int | None) -> int:
    from cuforge.aot.build import build_lock

    if not args.bundle or args.manifest:
        raise ValueError(
            "--lock builds a warm set into a bundle: pass --bundle FILE and no manifest, e.g. "
            "cuforge build --lock cuforge.lock --bundle warm.cfb"
        )
    report = build_lock(args.lock, args.bundle, jobs=jobs, executor=args.executor)
    for line in report.failures:
        output.error(f"failed: {line}")
    for line in report.missing:
        output.error(f"missing (not in the cache and no stanza builds it): {line}")
    if args.json:
        output.emit_json({"command": "build", **report.as_dict()})
        return 0 if report.ok else 1
    rows = [
        ("lock", args.lock),
        ("copied from the cache", report.copied),
        ("built from stanzas", report.built),
        ("missing", len(report.missing) + len(report.failures)),
    ]
    if report.bundle:
        rows.append(
            ("bundle", f"{report.bundle} ({report.entries} entries, "
             f"{output.human_bytes(report.bundle_bytes)})")
        )  # fmt: skip
    else:
        rows.append(("bundle", "not written (a partial warm set would fail in production)"))
    output.table(("build --lock", "result"), rows, title="cuforge build --lock")
    return 0 if report.ok else 1
