"""The doctor's human report: 80 columns, wrapped details, whole fix commands."""

from __future__ import annotations

import re
import textwrap

from cuforge.cli import output
from cuforge.cli.doctor.base import Check

__all__ = ["layout", "render", "TITLE_WIDTH"]

#: the title column of the full report: its widest title (the header compile's). A
#: ``--check`` report uses it too, so that its rows line up as in the full report.
TITLE_WIDTH = len("fp16/bf16/CUB compile")


_COLORS = {"PASS": "green", "WARN": "yellow", "FAIL": "bold red", "SKIP": "dim"}


#: doctor's output fits this many columns (a terminal's or not): details wrap with a
#: hanging indent, and a fix command is never split (see :func:`layout`)
_COLUMNS = 80


#: where ``fix: COMMAND`` goes when it does not fit under the detail: under the title
_FIX_INDENT = 0


#: first words that make a fix a shell command (kept whole) rather than prose (wrapped)
_COMMAND_WORDS = frozenset(
    {
        "export", "unset", "pip", "pip3", "python", "python3", "uv", "conda", "apt-get",
        "apt", "sudo", "chmod", "chown", "rm", "mkdir", "ln", "mv", "cuforge", "eval",
    }
)  # fmt: skip


def _split_fix(fix: str) -> tuple[str, str]:
    """(the command to copy, a note after it): ``"pip install x  (or apt-get ...)"`` ->
    ``("pip install x", "(or apt-get ...)")``. Fixes write a note after two spaces."""
    command, sep, note = fix.partition("  (")
    return (command.strip(), "(" + note.strip()) if sep else (fix.strip(), "")


def _is_command(text: str) -> bool:
    return (text.split() or [""])[0] in _COMMAND_WORDS


def _wrap(text: str, room: int) -> list[str]:
    """Word-wrap ``text`` to ``room`` columns, never inside a `backquoted command` nor
    inside a word (a long path stays whole on its own line)."""

    glue = "\x00"
    joined = re.sub(r"`[^`]*`", lambda m: m.group(0).replace(" ", glue), text)
    lines = textwrap.wrap(joined, room, break_on_hyphens=False, break_long_words=False)
    return [line.replace(glue, " ") for line in lines] or [""]


def layout(
    rows: list[Check], columns: int = _COLUMNS, title_width: int | None = None
) -> list[tuple[str | None, str]]:
    """The report as (status or None, text) lines, each within ``columns`` once the
    6-column status head (``"FAIL  "``) is added, except a fix command or a path longer
    than a line: those stay whole (copy-paste must work) on lines of their own.

    * a row: ``TITLE  detail...``, the detail wrapped at word boundaries, its continuation
      lines indented under the detail's first column;
    * a WARN or FAIL row's fix, when it is a shell command: ``fix: COMMAND`` under the
      detail when it fits there, else ``fix: COMMAND`` on its own line under the title
      column, whole; a note after the command (``"  (or ...)"``) wraps on lines indented
      under the command. A prose fix wraps like a detail, never inside `backquotes`.
    * no line ever continues at column 0.

    The title column is as wide as the widest title (at most 28), or ``title_width``."""
    head = len("PASS  ")
    width = min(max((len(r.title) for r in rows), default=0), 28)
    if title_width is not None:
        width = title_width
    lines: list[tuple[str | None, str]] = []
    for r in rows:
        column = width + 2  # where the detail starts (after the status head)
        room = max(24, columns - head - column)
        if len(r.title) > width:  # a long title gets a line of its own
            lines.append((r.status, r.title))
            first: tuple[str | None, str] = (None, " " * width)
        else:
            first = (r.status, r.title.ljust(width))
        detail = _wrap(r.detail, room)
        lines.append((first[0], f"{first[1]}  {detail[0]}"))
        lines.extend((None, f"{' ' * column}{line}") for line in detail[1:])
        if not (r.fix and r.status in ("WARN", "FAIL")):
            continue
        command, note = _split_fix(r.fix)
        if not _is_command(command):
            fix = _wrap(r.fix, room - len("fix: "))
            lines.append((None, f"{' ' * column}fix: {fix[0]}"))
            lines.extend((None, f"{' ' * (column + 5)}{line}") for line in fix[1:])
            continue
        indent = column if head + column + 5 + len(command) <= columns else _FIX_INDENT
        lines.append((None, f"{' ' * indent}fix: {command}"))
        if note:
            lines.extend(
                (None, f"{' ' * (indent + 5)}{line}")
                for line in _wrap(note, max(24, columns - head - indent - 5))
            )
    return lines


def render(
    rows: list[Check],
    summary: dict[str, int],
    skipped: list[str],
    title_width: int | None = None,
) -> None:
    """One block per check (status, title, wrapped detail), a ``fix:`` under each problem
    (see :func:`layout`), and a summary line. Colored on a terminal, plain otherwise; 80
    columns either way."""
    if output.fancy():
        from rich.console import Console
        from rich.markup import escape

        # soft_wrap: never let rich re-wrap a line (a fix command must stay whole)
        console = Console(highlight=False, soft_wrap=True)

        def say(status: str | None, text: str) -> None:
            head = f"[{_COLORS[status]}]{status}[/]" if status else "    "
            console.print(f"{head}  {escape(text)}")
    else:

        def say(status: str | None, text: str) -> None:
            print(f"{status or '    '}  {text}".rstrip())

    for status, text in layout(rows, title_width=title_width):
        say(status, text)
    line = (
        f"{summary['pass']} passed, {output.plural(summary['warn'], 'warning')}, "
        f"{summary['fail']} failed, "
        f"{summary['skip']} skipped"
    )
    if skipped:
        line += f" ({', '.join(skipped)})"
    print(f"\n{line}")  # one line, always last: scripts read it
