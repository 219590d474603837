"""PyTorch extension build times: torch's load() vs cuforge.torch.load().

    python bench/build_extension.py                 # quick rows, classic layout
    python bench/build_extension.py --rows all --layout fast --png bench/out/build.png

A thin wrapper over ``cuforge bench-build`` (same options) that also writes the JSON
document to ``bench/out/build_extension-<layout>.json``. The quick rows take ~8 minutes on
2 cores; ``--rows all`` ~30 (torch's all-arch build alone is ~6 minutes).
"""

from __future__ import annotations

import argparse
import os
import sys

from cuforge.cli import bench_build


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="build_extension.py")
    bench_build.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench-build", *(sys.argv[1:] if argv is None else argv)])
    if not args.json_out:
        out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")
        os.makedirs(out, exist_ok=True)
        args.json_out = os.path.join(out, f"build_extension-{args.layout}.json")
    return bench_build.run(args)


if __name__ == "__main__":
    sys.exit(main())
