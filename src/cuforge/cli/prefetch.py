"""``cuforge prefetch cuforge.lock``: pull exactly the lockfile's entries from the remote
tiers (``CUFORGE_REMOTE``) into the local cache before serving, with progress; what no
tier has is listed, and the exit code is 1 then.

``cuforge prefetch cuforge.lock -- serve.py ARGS`` (or ``-- -m package.serve ARGS``) runs
the service in this process instead, as ``python serve.py ARGS`` would, while the pull runs
in a thread (:func:`cuforge.prefetch` with ``background=True``): one interpreter, the pull
overlapping the service's start-up, its builds waiting for the pull, and no change to the
service's code. The exit code is the service's."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from cuforge.base.config import settings
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
    p.add_argument(
        "service",
        # not REMAINDER: that would swallow `--cache-dir D` after LOCK as a service script;
        # "*" leaves options before `--` to the parser and takes what follows `--` verbatim
        nargs="*",
        metavar="-- SCRIPT [ARGS] | -- -m MODULE [ARGS]",
        help="run this Python service in this process while the pull runs in the background "
        "(as `python SCRIPT ARGS` / `python -m MODULE ARGS` would run it)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cuforge.core.prefetch import prefetch

    service = list(args.service)
    if service and service[0] == "--":
        service = service[1:]
    if args.service:
        return _serve(args.lock, service)
    remote = settings().remote
    if not remote:
        output.warn(
            "no remote cache is configured (CUFORGE_REMOTE is unset): nothing can be "
            "fetched; only entries already local or in an installed bundle count as present"
        )

    with output.progress("prefetching", enabled=output.fancy(sys.stderr)) as bar:

        def on_entry(done: int, total: int, where: str, label: str) -> None:
            bar.set_total(total)
            bar.advance(description=f"prefetching: {label} ({where})")

        # this process ends here: filling its memory tier would be wasted work
        report = prefetch(args.lock, progress=on_entry, memory=False)
    for line in report.missing:
        output.error(f"missing: {line}")
    if args.json:
        output.emit_json(
            {"command": "prefetch", "remote_configured": bool(remote), **report.as_dict()}
        )
        return 0 if report.ok else 1
    rows = [
        ("lock", args.lock),
        ("already local", report.copied),
        ("fetched from the remote", report.fetched),
        ("missing", len(report.missing)),
    ]
    output.table(("prefetch", "result"), rows, title="cuforge prefetch")
    return 0 if report.ok else 1


def _serve(lock: str, service: list[str]) -> int:
    """Pull ``lock`` in the background and run ``service`` (``[script, *args]`` or ``["-m",
    module, *args]``) here, as ``python`` would; its exit code."""
    import os
    import runpy

    from cuforge.core.prefetch import prefetch

    if not service or (service[0] == "-m" and len(service) < 2):
        raise output.UsageError(
            "after --, name the service: a script (cuforge prefetch cuforge.lock -- serve.py "
            "ARGS) or a module (-- -m package.serve ARGS)"
        )
    if service[0] != "-m" and not os.path.isfile(service[0]):
        raise output.UsageError(f"the service script {service[0]!r} is not a file")
    if service[0] == "-m":
        from importlib.util import find_spec

        if os.getcwd() not in sys.path:  # found as `python -m` finds it: the cwd first
            sys.path.insert(0, os.getcwd())
        try:
            found = find_spec(service[1]) is not None
        except (ImportError, ValueError):  # a parent package missing, or an odd name
            found = False
        if not found:
            raise output.UsageError(f"the service module {service[1]!r} cannot be found")
    prefetch(lock, background=True)  # a bad lockfile fails here, before the service starts
    try:
        if service[0] == "-m":
            sys.argv = [service[1], *service[2:]]
            sys.path[0] = os.getcwd()  # as `python -m` puts it first
            runpy.run_module(service[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(service)
            sys.path[0] = os.path.dirname(os.path.abspath(service[0]))  # as `python x.py`
            runpy.run_path(service[0], run_name="__main__")
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException as exc:  # noqa: BLE001 - the service's own failure, shown as python shows it
        import traceback

        traceback.print_exc()
        return 130 if isinstance(exc, KeyboardInterrupt) else 1
    return 0
