"""The parts every doctor check shares: a report row (:class:`Check`), the row maker
(:func:`row_maker`), the facts several checks ask for (:class:`Probe`) and a subprocess runner."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from typing import Any

from cuforge.toolchain import gpu
from cuforge.torch.jobs import machine_resources

__all__ = ["Check", "STATUSES", "Probe", "row_maker", "run_command"]


STATUSES = ("PASS", "WARN", "FAIL", "SKIP")


class Check:
    """One row of the report."""

    __slots__ = ("id", "title", "status", "detail", "fix", "data")

    def __init__(
        self,
        id: str,
        title: str,
        status: str,
        detail: str,
        fix: str | None = None,
        data: dict[str, Any] | None = None,
    ) -> None:
        assert status in STATUSES, status
        self.id, self.title, self.status, self.detail = id, title, status, detail
        self.fix, self.data = fix, data or {}

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


def row_maker(id: str, title: str) -> Callable[..., Check]:
    """``row(status, detail, fix=None, **data)`` making Checks of one id and title."""

    def row(status: str, detail: str, fix: str | None = None, **data: Any) -> Check:
        return Check(id, title, status, detail, fix, data)

    return row


def run_command(cmd: list[str], timeout: float = 20) -> tuple[int, str]:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return -1, str(exc)
    return proc.returncode, (proc.stdout + proc.stderr).strip()


class Probe:
    """Facts several checks share, each found once."""

    def __init__(self) -> None:
        self.resources = machine_resources()
        self._gpus: tuple[list[dict[str, Any]], str | None] | None = None
        self._memo: dict[str, Any] = {}

    def once(self, name: str, fn: Callable[[], Any]) -> Any:
        if name not in self._memo:
            try:
                self._memo[name] = (fn(), None)
            except Exception as exc:  # noqa: BLE001 - kept and re-raised to each asker
                self._memo[name] = (None, exc)
        value, exc = self._memo[name]
        if exc is not None:
            raise exc
        return value

    def gpus(self) -> tuple[list[dict[str, Any]], str | None]:
        """([{"index", "name", "arch", "memory_bytes"}], None) or ([], why there are none),
        through the driver API (:func:`cuforge.toolchain.gpu.devices`)."""
        if self._gpus is None:
            self._gpus = gpu.devices()
        return self._gpus
