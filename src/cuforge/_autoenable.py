"""``CUFORGE_ENABLE`` at interpreter start: imported by the ``cuforge-enable.pth`` hook
that the package installs into site-packages, in every Python process of the environment
(children included) where the variable is set. With it unset the hook imports nothing.

It arms :func:`cuforge.adapters.switch.arm`: each named system (``all``: every one) is
enabled right after its peer is first imported. Nothing here may raise: a bad name, a bad
setting or a failing adapter is one line on stderr, and the process goes on.
"""

from __future__ import annotations

import sys


def _report(line: str) -> None:
    try:
        sys.stderr.write(f"cuforge: CUFORGE_ENABLE: {line}\n")
    except (OSError, AttributeError, ValueError):
        pass  # no usable stderr (a closed or missing stream): nothing to tell


def _start() -> None:
    from cuforge.adapters import switch
    from cuforge.base.config import settings

    wanted = settings().enable
    if not wanted or wanted in (("0",), ("off",), ("none",)):
        return
    chosen, bad = switch.parse(wanted)
    if bad:
        _report(
            f"{switch._unknown(bad)} (ignored; CUFORGE_ENABLE is 'all' or a comma list of "
            "those names)"
        )
    switch.arm(chosen, explicit="all" not in wanted, report=_report)


try:
    _start()
except Exception as exc:  # noqa: BLE001 - a .pth hook must never stop an interpreter's start
    _report(f"not applied: {type(exc).__name__}: {exc}")
