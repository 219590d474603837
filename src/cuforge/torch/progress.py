"""A one-line progress display for extension builds: objects done out of total.

Ninja prints a status line per finished edge; cuforge sets ``NINJA_STATUS`` so that each
starts with a marker and ``[finished/total]`` (:func:`parse_status` reads it). On a
terminal the build shows ``<name>: 3/5 objects`` (cached objects count as done), then
``linking``, through ``rich``. Whether to show it is :func:`cuforge.base._progress.enabled`
(a terminal, not under CI; ``CUFORGE_PROGRESS=1`` / ``0`` forces it on / off); a verbose
build prints ninja's own lines instead.
"""

from __future__ import annotations

__all__ = ["parse_status", "BuildProgress"]


def parse_status(line: str, marker: str = "") -> tuple[int, int] | None:
    """``(finished, total)`` from a ninja status line ``<marker>[f/t] ...``; None for any
    other line (compiler output, ninja's own messages)."""
    if not line.startswith(marker):
        return None
    rest = line[len(marker) :]
    if not rest.startswith("["):
        return None
    inside, sep, _ = rest[1:].partition("]")
    done, slash, total = inside.partition("/")
    if not sep or not slash or not done.isdigit() or not total.isdigit():
        return None
    return int(done), int(total)


class BuildProgress:
    """``with BuildProgress(name, total, cached, enabled) as show: show.update(f, t)``:
    one transient line on stderr; does nothing when not ``enabled``."""

    def __init__(self, name: str, total: int, cached: int, enabled: bool) -> None:
        self.name, self.total, self.cached, self.enabled = name, total, cached, enabled
        self._progress = None
        self._task = None

    def __enter__(self) -> BuildProgress:
        if not self.enabled:
            return self
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self._progress = Progress(
            TextColumn("cuforge.torch: {task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total} objects"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=True,
        )
        self._progress.start()
        self._task = self._progress.add_task(
            f"building {self.name}", total=self.total, completed=self.cached
        )
        return self

    def update(self, finished: int, edges: int) -> None:
        """Ninja finished ``finished`` of its ``edges`` (the compiles that missed the
        cache, then the link)."""
        if self._progress is None:
            return
        compiles = max(0, edges - 1)
        done = self.cached + min(finished, compiles)
        what = f"linking {self.name}" if finished >= compiles else f"building {self.name}"
        self._progress.update(self._task, completed=done, description=what)

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
