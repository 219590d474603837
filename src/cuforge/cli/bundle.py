"""``cuforge bundle install FILE`` / ``cuforge bundle ls FILE [--verify]`` / ``cuforge bundle
wheel FILE --name N --version V``.

A thin command over :mod:`cuforge.aot.bundle`. ``install`` verifies every checksum before
adding anything to the cache dir (a damaged bundle installs nothing, exit 1); ``ls``
shows the index (cuforge version, toolchain, archs, variants) and the entries.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from cuforge.aot.bundle import bundle_summary, install_bundle
from cuforge.aot.wheel import check_name, check_version
from cuforge.cli import output
from cuforge.cli.common import cache_root

__all__ = ["add_parser"]


def add_parser(subparsers: Any, common: argparse.ArgumentParser) -> None:
    bundle = subparsers.add_parser(
        "bundle",
        help="install or list a bundle of prebuilt variants (.cfb, from cuforge build --bundle)",
        description="Bundles hold prebuilt cache entries in one checksummed file. Every "
        "subcommand takes --json.",
    )
    sub = bundle.add_subparsers(dest="bundle_command", metavar="SUBCOMMAND")

    def _no_subcommand(args: argparse.Namespace) -> int:
        bundle.print_help(sys.stderr)
        return 2

    bundle.set_defaults(func=_no_subcommand)
    p = sub.add_parser(
        "install", parents=[common], help="verify a bundle and add its entries to the cache dir"
    )
    p.add_argument("file", help="the bundle (.cfb)")
    p.set_defaults(func=run_install)
    p = sub.add_parser("ls", parents=[common], help="list a bundle's index and entries")
    p.add_argument("file", help="the bundle (.cfb)")
    p.add_argument("--verify", action="store_true", help="also check every entry's checksum")
    p.set_defaults(func=run_ls)
    p = sub.add_parser(
        "wheel",
        parents=[common],
        help="write a pip-installable wheel serving a bundle (loaded on the first miss)",
    )
    p.add_argument("file", help="the bundle (.cfb)")
    p.add_argument(
        "--name",
        required=True,
        type=output.arg_type(check_name),
        help="the distribution name (mymodel-kernels)",
    )
    p.add_argument(
        "--version",
        required=True,
        type=output.arg_type(check_version),
        help="the distribution version (1.0)",
    )
    p.add_argument("--out", default=".", help="the directory to write the wheel into (.)")
    p.set_defaults(func=run_wheel)


def run_wheel(args: argparse.Namespace) -> int:
    from cuforge.aot.wheel import build_wheel

    path = build_wheel(args.file, name=args.name, version=args.version, out_dir=args.out)
    if args.json:
        output.emit_json({"command": "bundle wheel", "ok": True, "file": args.file, "wheel": path})
        return 0
    print(f"wrote {path} (pip install it; cuforge serves it on the first cache miss)")
    return 0


def run_install(args: argparse.Namespace) -> int:
    done = install_bundle(args.file)
    if args.json:
        output.emit_json(
            {
                "command": "bundle install",
                "ok": True,
                "file": args.file,
                "cache_dir": cache_root(args),
                **done,
            }
        )
        return 0
    entries = f"{done['entries']} {'entry' if done['entries'] == 1 else 'entries'}"
    print(
        f"installed {done['stored']} new, {done['already_present']} already present, of "
        f"{entries} "
        f"({output.human_bytes(done['bytes'])}) from {args.file} into {cache_root(args)}"
    )
    return 0


def run_ls(args: argparse.Namespace) -> int:
    summary = bundle_summary(args.file, verify=args.verify)
    if args.json:
        output.emit_json({"command": "bundle ls", "ok": True, **summary})
        return 0
    info = summary["info"]
    toolchain = info.get("toolchain")
    if isinstance(toolchain, dict):
        toolchain = ", ".join(f"{k} {_shown(v)}" for k, v in toolchain.items()) or None
    archs = info.get("archs")
    if isinstance(archs, list):
        archs = ", ".join(_shown(a) for a in archs) or "-"
    variants = info.get("variants")
    rows = [
        ("file", f"{summary['path']} ({output.human_bytes(summary['size'])})"),
        ("cuforge", _shown(info.get("cuforge_version"))),
        ("toolchain", _shown(toolchain)),
        ("created", _when(info.get("created"))),
        ("archs", "-" if archs is None else _shown(archs)),
        ("variants", len(variants) if isinstance(variants, list) else _shown(variants)),
        ("entries", len(summary["entries"])),
        ("checksums", "verified" if summary["verified"] else "not checked (--verify)"),
    ]
    if summary.get("info_problem"):
        rows.insert(1, ("index", summary["info_problem"]))
    output.table(("bundle", ""), rows)
    entries = [
        (
            e["key"][:16],
            e["kind"],
            e["name"],
            e["arch"],
            ", ".join(e["lowered_names"]),
            output.human_bytes(e["size"]),
        )
        for e in summary["entries"]
        if e["kind"] != "manifest"
    ]
    if entries:
        print()
        output.table(("key", "kind", "name", "arch", "variant", "size"), entries, right=(5,))
    return 0


def _shown(value: Any) -> str:
    """An index field as text, whatever JSON type the writer gave it ("?" when absent)."""
    if value is None:
        return "?"
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _when(value: Any) -> str:
    """The index's ``created`` field: a time when it is a timestamp, else as written."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return output.human_time(value)
        except (OverflowError, ValueError, OSError):
            pass  # not a time this machine can show (1e300, NaN)
    return _shown(value)
