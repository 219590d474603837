"""``cuforge prefetch cuforge.lock``: pull exactly the lockfile's entries from the remote
tiers (``CUFORGE_REMOTE``) into the local cache before serving, with progress; what no
tier has is listed, and the exit code is 1 then."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from cuforge.cli import output

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any, common: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser(
        "prefetch",
        parents=[common],
        help="pull a lockfile's entries from the remote into the local cache",
        description="Pull exactly the entries a lockfile (cuforge.record / CUFORGE_RECORD) "
        "lists from the remote tiers (CUFORGE_REMOTE) into the local cache, and report what "
        "is missing everywhere.",
    )
    p.add_argument("lock", help="the lockfile (cuforge.lock)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cuforge.aot.lock import prefetch

    with output.progress("prefetching", enabled=output.fancy(sys.stderr)) as bar:

        def on_entry(done: int, total: int, where: str, label: str) -> None:
            bar.set_total(total)
            bar.advance(description=f"prefetching: {label} ({where})")

        # this process ends here: filling its memory tier would be wasted work
        report = prefetch(args.lock, progress=on_entry, memory=False)
    for line in report.missing:
        output.error(f"missing: {line}")
    if args.json:
        output.emit_json({"command": "prefetch", **report.as_dict()})
        return 0 if report.ok else 1
    rows = [
        ("lock", args.lock),
        ("already local", report.copied),
        ("fetched from the remote", report.fetched),
        ("missing", len(report.missing)),
    ]
    output.table(("prefetch", "result"), rows, title="cuforge prefetch")
    return 0 if report.ok else 1
