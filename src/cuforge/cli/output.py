"""How the ``cuforge`` command talks: rich on a terminal, plain and quiet elsewhere.

* :func:`fancy` -- True on an interactive terminal, False when piped, under ``CI=true``,
  with ``NO_COLOR`` or ``TERM=dumb``. Everything below follows it.
* :func:`progress` -- a rich progress bar on a terminal; a silent no-op otherwise.
* :func:`table` -- a rich table, or plain aligned columns (stable for scripts and tests).
* :func:`emit_json` -- the ``--json`` output: one JSON document on stdout.
* :func:`error` / :func:`warn` -- messages on stderr, prefixed ``cuforge:``.
* :func:`human_bytes`, :func:`human_age`, :func:`parse_age` -- units both ways.

rich is imported only when it will draw something, so plain and ``--json`` runs stay fast.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TextIO

__all__ = [
    "JSON_SCHEMA",
    "UsageError",
    "plural",
    "count",
    "os_error_text",
    "usage_value",
    "arg_type",
    "cli_wording",
    "fancy",
    "progress",
    "Progress",
    "table",
    "emit_json",
    "error",
    "warn",
    "human_bytes",
    "human_age",
    "human_seconds",
    "human_time",
    "parse_age",
]

#: The version of every ``--json`` document's shape. Bump only on an incompatible change
#: (a field removed or its meaning changed); adding fields keeps it.
JSON_SCHEMA = 1


def fancy(stream: TextIO | None = None) -> bool:
    """Whether to draw colors, tables and progress bars on ``stream`` (stdout by default)."""
    stream = stream or sys.stdout
    if os.environ.get("CI", "").strip().lower() in ("1", "true", "yes"):
        return False
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)


# -- messages -------------------------------------------------------------------------


class UsageError(ValueError):
    """A command-line argument that cannot be used (a bad value, a missing flag): the
    command exits 2, like argparse's own usage errors."""


def usage_value(flag: str, parse: Any, text: str) -> Any:
    """``parse(text)`` for the value of ``flag``; a ValueError becomes a :class:`UsageError`
    naming the flag (exit code 2, not 1)."""
    try:
        return parse(text)
    except ValueError as exc:
        raise UsageError(f"{flag} {text!r}: {exc}") from None


def arg_type(parse: Any) -> Any:
    """An argparse ``type=`` that runs ``parse(text)`` and turns its ValueError into
    argparse's usage error, message kept (``argument --arch: cannot read arch 'hopper'
    ...``): a bad flag value exits 2, as every usage error does."""
    import argparse

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = getattr(parse, "__name__", "value")
    return convert


#: Python keyword arguments of the library (as its errors name them) -> the CLI flags of
#: ``cuforge compile``. The CLI shows flags, never ``arch=``.
_KWARG_FLAGS = (
    ("arch=", "--arch "),
    ("include_dirs=", "-I "),
    ("defines=", "-D "),
    ("options=", "--option "),
    ("name_expressions=", "--name-expression "),
    ("backend=", "--backend "),
    ("output=", "--output "),
)


def cli_wording(message: str) -> str:
    """A library message reworded for the command line: ``arch='sm_90'`` becomes
    ``--arch sm_90``, ``options=...`` ``--option ...``, and "to compile()" is dropped."""

    for kwarg, flag in _KWARG_FLAGS:
        if kwarg not in message:
            continue
        # arch='sm_90' -> --arch sm_90 ; a bare arch= -> --arch
        message = re.sub(
            r"(?<![\w.=/-])" + re.escape(kwarg) + r"(['\"])([^'\"]*)\1",
            lambda m, flag=flag: flag + m.group(2),
            message,
        )
        if kwarg not in ("backend=", "output="):  # common words: only the quoted form
            message = re.sub(r"(?<![\w.=/-])" + re.escape(kwarg), flag, message)
    message = re.sub(r" (to|in) (cuforge\.)?(compile|compile_file)\(\)", "", message)
    message = message.replace("(or a tuple)", "(repeat --arch for several)")
    return message.replace("--arch  ", "--arch ")


_errors: list[str] = []
_json_emitted = False


def error(message: str) -> None:
    """An error line on stderr. The caller returns a non-zero exit code. The message is
    kept: under ``--json`` the entry point turns it into the JSON error document when the
    command printed none."""
    message = cli_wording(message)
    _errors.append(message)
    print(f"cuforge: error: {message}", file=sys.stderr, flush=True)


def errors_reported() -> list[str]:
    """The messages :func:`error` printed in this process, oldest first."""
    return list(_errors)


def json_emitted() -> bool:
    """Whether :func:`emit_json` has printed a document in this process."""
    return _json_emitted


def emit_error_json(command: str | None, message: str, kind: str, **extra: Any) -> None:
    """The ``--json`` error document: ``{"schema": 1, "command", "ok": false,
    "error": {"message", "kind"}}`` (``kind``: "usage", "failure" or an exception's
    class name)."""
    doc: dict[str, Any] = {"command": command, "ok": False}
    doc.update(extra)
    doc["error"] = {"message": message, "kind": kind}
    emit_json(doc)


def warn(message: str) -> None:
    print(f"cuforge: warning: {message}", file=sys.stderr, flush=True)


def emit_json(document: dict[str, Any]) -> None:
    """Print one JSON document on stdout, with the schema version first."""
    global _json_emitted
    _json_emitted = True
    out = {"schema": JSON_SCHEMA}
    out.update(document)
    json.dump(out, sys.stdout, indent=2, sort_keys=False, default=str)
    sys.stdout.write("\n")
    sys.stdout.flush()


# -- progress -------------------------------------------------------------------------


class Progress:
    """What :func:`progress` yields. ``advance()`` after each step; ``total`` may be set
    late (None draws a spinner). A no-op unless drawing on a terminal."""

    def __init__(self, bar: Any = None, task: Any = None) -> None:
        self._bar, self._task = bar, task
        self.done = 0

    def advance(self, steps: int = 1, description: str | None = None) -> None:
        self.done += steps
        if self._bar is not None:
            kwargs = {"description": description} if description else {}
            self._bar.update(self._task, advance=steps, **kwargs)

    def set_total(self, total: int | None) -> None:
        if self._bar is not None:
            self._bar.update(self._task, total=total)

    def describe(self, description: str) -> None:
        if self._bar is not None:
            self._bar.update(self._task, description=description)

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        """Usable as a callback: ``cb()``, ``cb(done, total)`` or ``cb(n=...)``."""
        if len(args) >= 2 and isinstance(args[0], int) and isinstance(args[1], int):
            self.set_total(args[1])
            self.advance(args[0] - self.done)
        else:
            self.advance()


@contextmanager
def progress(
    description: str, total: int | None = None, *, enabled: bool = True
) -> Iterator[Progress]:
    """A progress bar on stderr while the block runs (rich), or nothing at all when stderr
    is not a terminal, under ``CI=true``, or when ``enabled`` is False (``--json``)."""
    if not (enabled and fancy(sys.stderr)):
        yield Progress()
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.progress import Progress as RichProgress

    bar = RichProgress(
        SpinnerColumn(),
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=_console(stderr=True),
        transient=True,
    )
    with bar:
        task = bar.add_task(description, total=total)
        yield Progress(bar, task)


# -- tables ---------------------------------------------------------------------------


def table(
    headers: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    title: str | None = None,
    right: Sequence[int] = (),
) -> None:
    """Print a table on stdout: rich when :func:`fancy`, else plain columns separated by
    two spaces (one row per line, easy to ``grep`` and ``awk``). ``right`` lists the
    columns to right-align (numbers)."""
    cells = [[("" if c is None else str(c)) for c in row] for row in rows]
    if fancy():
        from rich.table import Table

        t = Table(title=title, title_justify="left", header_style="bold")
        for i, h in enumerate(headers):
            t.add_column(h, justify="right" if i in right else "left", overflow="fold")
        for row in cells:
            t.add_row(*row)
        _console().print(t)
        return
    if title:
        print(title)
    widths = [len(h) for h in headers]
    for row in cells:
        for i, c in enumerate(row):
            widths[i] = max(widths[i], len(c))
    lines = [list(headers)] + cells
    for row in lines:
        parts = []
        for i, c in enumerate(row):
            last = i == len(row) - 1
            if i in right:
                parts.append(c.rjust(widths[i]))
            else:
                parts.append(c if last else c.ljust(widths[i]))
        print("  ".join(parts).rstrip())


# -- units ----------------------------------------------------------------------------


def human_bytes(n: int | float | None) -> str:
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def human_seconds(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def human_age(timestamp: float | None, now: float | None = None) -> str:
    """``"3m ago"``-style age of a Unix timestamp."""
    if not timestamp:
        return "-"
    delta = max(0.0, (now or time.time()) - timestamp)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if delta >= size:
            return f"{int(delta // size)}{unit} ago"
    return f"{int(delta)}s ago"


def human_time(timestamp: float | None) -> str:
    if not timestamp:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp))


_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_age(text: str) -> float:
    """``"30d"``, ``"12h"``, ``"90m"``, ``"45s"``, ``"2w"`` or plain seconds -> seconds."""
    raw = text.strip().lower()
    unit = raw[-1:] if raw[-1:] in _AGE_UNITS else ""
    number = raw[: len(raw) - len(unit)] if unit else raw
    try:
        value = float(number)
    except ValueError:
        raise ValueError(
            f"cannot read age {text!r}: write a number with a unit, e.g. 30d, 12h, 90m, 45s, 2w"
        ) from None
    if value < 0:
        raise ValueError(f"age {text!r} is negative")
    return value * _AGE_UNITS.get(unit, 1)


def count(text: str) -> int:
    """A count a flag takes (``--top 5``, ``--limit 0``): a whole number >= 0; else
    ValueError saying so (through :func:`arg_type`, a usage error)."""
    value = text.strip()
    if not (value.isascii() and value.isdigit()):
        raise ValueError(f"expected a whole number >= 0, not {text!r}")
    return int(value)


def os_error_text(exc: BaseException) -> str:
    """An OSError as a sentence (``/x/y.cubin: No such file or directory``), not Python's
    ``[Errno 2] No such file or directory: '/x/y.cubin'``; any other error as it is."""
    if not isinstance(exc, OSError) or not exc.strerror:
        return str(exc)
    if exc.filename is not None and exc.filename2 is not None:
        return f"{exc.filename} -> {exc.filename2}: {exc.strerror}"
    if exc.filename is not None:
        return f"{exc.filename}: {exc.strerror}"
    return exc.strerror


def plural(n: int, word: str) -> str:
    """``"1 warning"``, ``"2 warnings"``, ``"0 warnings"``."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"
