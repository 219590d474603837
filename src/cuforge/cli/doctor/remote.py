"""The remote cache check: one row per URL in CUFORGE_REMOTE (see the package
docstring)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cuforge.base.config import settings
from cuforge.cli.doctor.base import Check, Probe, row_maker
from cuforge.store.remote import open_remotes, sync


def check_remote(p: Probe) -> list[Check]:
    """One row per URL in CUFORGE_REMOTE (see the module docstring)."""

    row = row_maker("remote", "remote cache")
    st = settings()
    if not st.remote:
        return [row("SKIP", "no remote cache configured (CUFORGE_REMOTE is unset)")]

    try:
        remotes = list(open_remotes(st))
    except Exception as exc:  # noqa: BLE001 - a bad URL or plug-in is this check's answer
        return [
            row(
                "FAIL",
                f"CUFORGE_REMOTE cannot be used: {exc}",
                "fix CUFORGE_REMOTE (redis://host:port/db, http(s)://host/prefix, "
                "file:///dir) or CUFORGE_REMOTE_BACKEND",
            )
        ]
    return [_remote_row(row, sync.probe(remote, st), st, remote) for remote in remotes]


def _share_problem(remote: Any) -> str | None:
    """Why anyone may write the entries of ``remote`` (a world-writable ``file://`` share),
    or None (not a share, or a safe one)."""
    check = getattr(getattr(remote, "backend", None), "share_problem", None)
    if check is None:
        return None
    try:
        return check()
    except OSError:  # an unreadable share: the probe already says what is wrong
        return None


def _remote_row(row: Callable[..., Check], r: Any, st: Any, remote: Any = None) -> Check:
    data = r.as_dict()
    if not r.reachable:
        return row(
            "FAIL",
            f"{r.remote} is unreachable ({_reason(r.error, r.remote)}); compiles go on without it",
            "start the server or fix the URL in CUFORGE_REMOTE (on a slow network, raise "
            "CUFORGE_REMOTE_CONNECT_TIMEOUT)",
            **data,
        )
    status, fix = "PASS", None
    parts = [f"{r.latency_ms:.1f} ms"]
    if r.readonly:
        parts.append("read-only")
    elif r.writable:
        parts.append("writable")
    else:
        status = "FAIL"
        parts.append(f"not writable ({_reason(r.error, r.remote)})")
        fix = (
            "let this user write the remote (permissions, maxmemory, disk space), or "
            "export CUFORGE_REMOTE_READONLY=1"
        )
    if not r.signed:
        parts.append("unsigned (CUFORGE_REMOTE_KEY signs entries)")
        problem = _share_problem(remote)
        if problem is not None:
            # unsigned entries from a share anyone can write: anyone can run code here
            status = "FAIL"
            parts.append(f"{problem}: anyone can plant an entry that this machine runs")
            fix = (
                "set the same CUFORGE_REMOTE_KEY (or CUFORGE_REMOTE_KEY_FILE) on every writer "
                "and reader, or restrict the share's mode (chmod -R o-w on it)"
            )
    elif r.verified is False:
        status = "FAIL"
        parts.append("signed, but the probe entry did not verify")
        fix = "give every machine the same CUFORGE_REMOTE_KEY (or CUFORGE_REMOTE_KEY_FILE)"
    else:
        parts.append("signed, verified" if r.verified else "signed")
    if status == "PASS" and r.latency_ms > st.remote_timeout * 100:  # a tenth, in ms
        status = "WARN"
        fix = "use a closer server, or raise CUFORGE_REMOTE_TIMEOUT"
    return row(status, f"{r.remote}: " + ", ".join(parts), fix, **data)


def _reason(error: str | None, url: str) -> str:
    """A remote's error without the class name and URL the row already shows."""
    text = error or "no reason given"
    for prefix in ("get: ", "put: ", "RemoteError: ", f"remote cache {url}: "):
        if text.startswith(prefix):
            text = text[len(prefix) :]
    return text
