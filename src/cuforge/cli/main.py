"""The ``cuforge`` command.

::

    cuforge doctor                      check this machine; PASS / WARN / FAIL with fixes
    cuforge env [--shell fish]          tuned build settings: eval "$(cuforge env)"
    cuforge cache stats|ls|show|explain|clear|prune|verify|export|import|push|pull
    cuforge compile FILE...             compile kernels through the cache; says where each came from
    cuforge build [MANIFEST] [--jobs N] build every variant of cuforge.toml ahead of time (--bundle)
    cuforge bundle install|ls FILE      install or list a bundle of prebuilt variants
    cuforge run -- CMD ARGS...          run CMD with cuforge on in all its processes; savings

Every command takes ``--cache-dir DIR``: it operates on the cache in DIR instead of
CUFORGE_CACHE_DIR (:mod:`cuforge.cli.common`).

Every command takes ``--json`` (one JSON document on stdout with a ``"schema"`` field).
Errors go to stderr and give a non-zero exit code: 1 for a failure (or problems found),
2 for a usage error (an unknown flag, a bad flag value). Under ``--json`` every failure,
usage errors included, also prints one JSON error document on stdout (made in one place,
:func:`main`)::

    {"schema": 1, "command": "cache show", "ok": false,
     "error": {"message": "...", "kind": "usage" | "failure" | "<exception class>"}}

Library messages are reworded at this boundary to name the CLI flags (``--arch``), not
the Python keyword arguments (``arch=``): :func:`cuforge.cli.output.cli_wording`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import cuforge
from cuforge._version import __version__
from cuforge.base.arch import normalize_arch
from cuforge.base.config import settings
from cuforge.base.errors import CuforgeError
from cuforge.cli import output
from cuforge.cli.common import apply_cache_dir

__all__ = ["main", "build_parser"]


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--json", action="store_true", help="print one JSON document (stable schema) on stdout"
    )
    common.add_argument(
        "--cache-dir",
        metavar="DIR",
        default=None,
        help="operate on the cache in DIR instead of CUFORGE_CACHE_DIR",
    )
    return common


class _UsageExit(Exception):
    """Raised by :class:`_Parser` instead of printing and exiting, so that :func:`main`
    reports a usage error once, as text or as the JSON error document."""

    def __init__(self, parser: argparse.ArgumentParser, message: str) -> None:
        super().__init__(message)
        self.parser, self.message = parser, message


class _Parser(argparse.ArgumentParser):
    """argparse, with usage errors raised to :func:`main` (exit 2 there)."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        raise _UsageExit(self, message)


#: the commands whose modules :func:`build_parser` can load alone
_COMMANDS = ("doctor", "env", "cache", "compile", "build", "bundle", "prefetch", "keys", "run")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or with ``only`` (a command name) of that one alone:
    ``cuforge prefetch`` at a service's start imports none of the other commands' modules
    (aot, doctor, store upkeep: ~30 ms)."""
    if only not in _COMMANDS:
        only = None
    import importlib

    # the subcommands (aot, store upkeep, doctor) load here, not at `import cuforge.cli.main`
    def add(name: str) -> None:
        if only is None or only == name:
            if name == "compile":
                _add_compile_parser(subparsers, common)
            else:
                importlib.import_module(f"cuforge.cli.{name}").add_parser(subparsers, common)

    parser = _Parser(
        prog="cuforge",
        description="cuforge: compile CUDA once, load in milliseconds, launch in microseconds.",
        epilog="Run 'cuforge COMMAND --help' for a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"cuforge {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    common = _common()
    for name in _COMMANDS:
        add(name)
    return parser


# -- compile --------------------------------------------------------------------------


def _add_compile_parser(subparsers: Any, common: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser(
        "compile",
        parents=[common],
        help="compile .cu files through the cache and say where each result came from",
        description="Compile CUDA files through cuforge's cache (a batch warm-up, e.g. in CI) "
        "and print, for each, where the result came from: memory, disk or compiled.",
    )
    p.add_argument("files", nargs="+", metavar="FILE", help=".cu files")
    p.add_argument(
        "--arch",
        action="append",
        type=output.arg_type(normalize_arch),
        help="target arch (sm_90, 9.0 or 90); repeat for a fatbin with --backend nvcc "
        "(default: the visible GPU, else CUFORGE_ARCH, else TORCH_CUDA_ARCH_LIST)",
    )
    p.add_argument(
        "--backend",
        choices=("nvrtc", "nvcc"),
        default="nvrtc",
        help="the compiler: NVRTC (in process, the default) or the toolkit's nvcc",
    )
    p.add_argument(
        "--output",
        choices=("cubin", "ptx", "fatbin"),
        default="cubin",
        help="what to build: cubin (the default), ptx, or fatbin (nvcc, several --arch)",
    )
    p.add_argument(
        "-I",
        dest="include_dirs",
        action="append",
        default=[],
        metavar="DIR",
        help="an include directory; every header found there is in the key (repeatable)",
    )
    p.add_argument(
        "-D",
        dest="defines",
        action="append",
        default=[],
        metavar="NAME[=VALUE]",
        help="a define, NAME or NAME=VALUE (NAME alone means NAME=1; repeatable)",
    )
    p.add_argument(
        "--option",
        "-X",
        dest="options",
        action="append",
        default=[],
        metavar="OPT",
        help="a compiler option, e.g. --option=-lineinfo (repeatable)",
    )
    p.add_argument(
        "--name-expression",
        dest="name_expressions",
        action="append",
        default=[],
        metavar="EXPR",
        help="a template instance to keep, e.g. 'block_sum<256, float>' (repeatable)",
    )
    p.add_argument(
        "-o",
        "--out",
        metavar="PATH",
        help="write the binary here (a directory when several files are given)",
    )
    p.set_defaults(func=_run_compile)


def _parse_defines(items: list[str]) -> dict[str, str]:
    defines: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not name:
            raise output.UsageError(f"-D {item!r}: expected NAME or NAME=VALUE")
        defines[name] = value if sep else "1"
    return defines


def _run_compile(args: argparse.Namespace) -> int:
    defines = _parse_defines(args.defines)
    arch: Any = None
    if args.arch:
        arch = args.arch[0] if len(args.arch) == 1 else tuple(args.arch)
    out_dir = None
    if args.out and len(args.files) > 1:
        out_dir = args.out
        os.makedirs(out_dir, exist_ok=True)
    results: list[dict[str, Any]] = []
    failed = 0
    with output.progress("compiling", total=len(args.files), enabled=not args.json) as bar:
        for path in args.files:
            bar.describe(f"compiling {os.path.basename(path)}")
            start = time.perf_counter()
            try:
                prog = cuforge.compile_file(
                    path,
                    options=tuple(args.options),
                    include_dirs=tuple(args.include_dirs),
                    defines=defines,
                    arch=arch,
                    backend=args.backend,
                    output=args.output,
                    name_expressions=tuple(args.name_expressions),
                )
            except (CuforgeError, OSError, ValueError) as exc:
                failed += 1
                output.error(f"{path}: {exc}")
                error = {"message": output.cli_wording(str(exc)), "kind": type(exc).__name__}
                results.append({"file": path, "ok": False, "error": error})
                bar.advance()
                continue
            seconds = time.perf_counter() - start
            written = None
            if args.out:
                written = (
                    os.path.join(
                        out_dir,
                        os.path.splitext(os.path.basename(path))[0] + "." + (prog.output or "bin"),
                    )
                    if out_dir
                    else args.out
                )
                try:
                    with open(written, "wb") as f:
                        f.write(prog.binary)
                except OSError as exc:
                    raise OSError(
                        exc.errno, exc.strerror or str(exc), f"cannot write {written}"
                    ) from exc
            results.append(
                {
                    "file": path,
                    "ok": True,
                    "source_of_result": prog.source_of_result,
                    "seconds": round(seconds, 6),
                    "compile_seconds": prog.compile_seconds,
                    "arch": list(prog.arch) if isinstance(prog.arch, (list, tuple)) else prog.arch,
                    "backend": prog.backend,
                    "output": prog.output,
                    "bytes": len(prog.binary or b""),
                    "key": prog.key,
                    "lowered_names": dict(prog.lowered_names or {}),
                    "written": written,
                }
            )
            bar.advance()
    if args.json:
        doc: dict[str, Any] = {
            "command": "compile",
            "ok": failed == 0,
            "failed": failed,
            "results": results,
        }
        if failed:  # the documented failure shape, as every command's: error.message / kind
            first = next(r for r in results if not r["ok"])
            doc["error"] = {
                "message": f"{failed} of {len(results)} failed; {first['file']}: "
                + first["error"]["message"],
                "kind": first["error"]["kind"],
            }
        output.emit_json(doc)
    else:
        rows = [
            (
                r["file"],
                ",".join(r["arch"]) if isinstance(r["arch"], list) else r["arch"],
                r["source_of_result"],
                output.human_seconds(r["seconds"]),
                output.human_seconds(r["compile_seconds"]),
                output.human_bytes(r["bytes"]),
                r["key"][:16],
            )
            for r in results
            if r["ok"]
        ]
        if rows:
            output.table(
                ("file", "arch", "from", "time", "compile cost", "size", "key"),
                rows,
                right=(3, 4, 5),
            )
        if failed:
            print(f"{failed} of {len(results)} failed (errors above)")
    return 1 if failed else 0


# -- entry point ----------------------------------------------------------------------


def _command_of(argv: list[str], args: argparse.Namespace | None = None) -> str | None:
    """``"cache show"``-style name of the command ``argv`` runs (None when none is given)."""
    if args is not None and getattr(args, "command", None):
        sub = getattr(args, "cache_command", None) or getattr(args, "bundle_command", None)
        return f"{args.command} {sub}" if sub else args.command
    words = [a for a in argv if not a.startswith("-")]
    if not words:
        return None
    if words[0] in ("cache", "bundle") and len(words) > 1:
        return f"{words[0]} {words[1]}"
    return words[0]


def _wants_json(argv: list[str]) -> bool:
    return "--json" in argv[: argv.index("--") if "--" in argv else len(argv)]


def main(argv: list[str] | None = None) -> int:
    """Run one command; return its exit code: 0 ok, 1 failure or problems found, 2 usage.

    Under ``--json``, a command that fails without printing its own document gets the
    JSON error document on stdout here, whatever failed (argparse, the command, an
    exception)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    as_json = _wants_json(argv)
    try:
        code, kind = _dispatch(argv, as_json)
    except _UsageExit as exc:
        message = output.cli_wording(exc.message)
        if not as_json:
            exc.parser.print_usage(sys.stderr)
        print(f"{exc.parser.prog}: error: {message}", file=sys.stderr, flush=True)
        if as_json:
            output.emit_error_json(_command_of(argv), message, "usage")
        return 2
    if as_json and code not in (0, 130) and not output.json_emitted():
        reported = output.errors_reported()
        message = "; ".join(reported) if reported else f"the command failed with exit code {code}"
        output.emit_error_json(_command_of(argv), message, kind or "failure")
    return code


def _dispatch(argv: list[str], as_json: bool) -> tuple[int, str | None]:
    """(exit code, error kind or None). Usage errors propagate as :class:`_UsageExit`."""
    # the command named first (no option before it) needs only its own parser
    parser = build_parser(argv[0] if argv and argv[0] in _COMMANDS else None)
    args, extra = parser.parse_known_args(argv)
    if extra:
        # argparse reports a subcommand's unknown flags from the top-level parser (with
        # the top-level usage): report them from the subcommand that was given them
        raise _UsageExit(_subparser_of(parser, args), "unrecognized arguments: " + " ".join(extra))
    func = getattr(args, "func", None)
    if func is None:
        if as_json:
            raise _UsageExit(parser, "no command given: choose one of " + _choices(parser))
        parser.print_help(sys.stderr)
        return 2, "usage"
    apply_cache_dir(args)
    try:
        return int(func(args) or 0), None
    except KeyboardInterrupt:
        output.error("interrupted")
        return 130, "interrupted"
    except BrokenPipeError:
        # `cuforge cache ls | head`: the reader left; that is not an error.
        try:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the exit-time flush
        except OSError:
            pass
        return 0, None
    except output.UsageError as exc:
        raise _UsageExit(_subparser(parser, argv), str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - the command line reports every failure readably
        if isinstance(exc, (CuforgeError, OSError, ValueError)):
            output.error(output.os_error_text(exc))
            return 1, type(exc).__name__

        if settings().debug:
            raise
        output.error(
            f"{type(exc).__name__}: {exc} (this is a bug in cuforge; set CUFORGE_DEBUG=1 "
            "for the traceback)"
        )
        return 1, type(exc).__name__


def _choices(parser: argparse.ArgumentParser) -> str:
    for action in parser._actions:  # noqa: SLF001 - argparse has no public accessor
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            return ", ".join(action.choices)
    return "?"


def _subparser_of(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> argparse.ArgumentParser:
    """The (sub)parser that parsed ``args`` (``cache ls``: the ``ls`` parser)."""
    words = [getattr(args, "command", None)]
    words.append(getattr(args, "cache_command", None) or getattr(args, "bundle_command", None))
    return _subparser(parser, [w for w in words if w])


def _subparser(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.ArgumentParser:
    """The (sub)parser of the command ``argv`` names, for its usage line."""
    current = parser
    for word in (a for a in argv if not a.startswith("-")):
        nxt = None
        for action in current._actions:  # noqa: SLF001 - argparse has no public accessor
            if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
                nxt = action.choices.get(word)
        if nxt is None:
            break
        current = nxt
    return current


if __name__ == "__main__":
    sys.exit(main())
