"""``cuforge run [--cache-dir D] -- CMD ARGS...``: run a command with cuforge as the cache
of every system it uses, in every Python process it starts, and say what it saved.

* The command runs with ``CUFORGE_ENABLE=all`` (unless the variable is already set: the
  user's choice wins) and, with ``--cache-dir D``, ``CUFORGE_CACHE_DIR=D``. Every Python
  process of an environment where cuforge is installed reads ``CUFORGE_ENABLE`` at start
  (the ``cuforge-enable.pth`` hook, :mod:`cuforge._autoenable`): torchrun ranks,
  multiprocessing workers, Ray and vLLM workers, with no line added to their code.
* The exit code is the command's; killed by signal N, it is 128 + N (as a shell says).
  SIGTERM and SIGHUP sent to ``cuforge run`` are passed on to the command; SIGINT is
  ignored here (Ctrl-C reaches the command from the terminal, once).
* At the end one summary goes to stderr (``--json``: a JSON document on stdout): per
  system, the lookups that hit, missed and the compile seconds the hits saved, counted by
  the cache's own telemetry (``<cache>/telemetry/``) across all the processes, taken as
  the difference between a snapshot before and one after the command.

.pth files are read only in site-packages: an interpreter where cuforge is only on
``PYTHONPATH`` never runs the hook, and the summary says so.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from typing import Any

from cuforge.cli import output

__all__ = ["add_parser", "run", "hook_installed", "PTH"]

#: the hook's file name in site-packages (setup.py installs it)
PTH = "cuforge-enable.pth"
#: the signals passed on to the command (SIGINT is ignored: the terminal sends it to the
#: whole foreground process group, the command included)
_FORWARDED = ("SIGTERM", "SIGHUP")


def add_parser(subparsers: Any, common: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser(
        "run",
        parents=[common],
        help="run a command with cuforge enabled in all its Python processes; print savings",
        description="Run CMD with CUFORGE_ENABLE=all (unless set) so that every Python process "
        "it starts uses cuforge's cache for Triton, torch.compile, JAX, CuPy, CuTe DSL and "
        "cuda.compute; at exit print per system the hits, misses and compile seconds saved. "
        "The exit code is CMD's (128+N when a signal N killed it).",
    )
    p.add_argument(
        "cmd",
        nargs=argparse.REMAINDER,
        metavar="-- CMD [ARGS]",
        help="the command to run (after --)",
    )
    p.set_defaults(func=run)


def hook_installed() -> str | None:
    """The path of the ``cuforge-enable.pth`` hook in this interpreter's site dirs, or None."""
    import site

    dirs = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
    user = site.getusersitepackages() if site.ENABLE_USER_SITE else None
    if user:
        dirs.append(user)
    for d in dirs:
        path = os.path.join(d, PTH)
        if os.path.isfile(path):
            return path
    return None


def run(args: argparse.Namespace) -> int:
    from cuforge.base.config import settings
    from cuforge.store import telemetry

    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise output.UsageError("no command given: cuforge run [--cache-dir DIR] -- CMD [ARGS]")
    env = dict(os.environ)  # --cache-dir is in os.environ already (apply_cache_dir)
    env.setdefault("CUFORGE_ENABLE", "all")
    st = settings()
    root = st.cache_dir
    before = telemetry.kind_totals(root)
    try:
        proc = subprocess.Popen(cmd, env=env)
    except FileNotFoundError:
        output.error(f"cuforge run: {cmd[0]}: command not found")
        return 127
    except PermissionError as exc:
        output.error(f"cuforge run: {cmd[0]}: cannot run it: {exc}")
        return 126
    previous = _forward_signals(proc)
    try:
        code = proc.wait()
    finally:
        for name, handler in previous.items():
            signal.signal(getattr(signal, name), handler)
    after = telemetry.kind_totals(root)
    rows = _difference(before, after)
    exit_code = 128 - code if code < 0 else code
    hook = hook_installed()
    doc = {
        "command": "run",
        "cmd": cmd,
        "exit_code": exit_code,
        "cache_dir": root,
        "enable": env["CUFORGE_ENABLE"],
        "telemetry": st.telemetry,
        "hook": hook,
        "systems": rows,
        "seconds_saved": round(sum(r["seconds_saved"] for r in rows.values()), 6),
    }
    if args.json:
        output.emit_json(doc)
    else:
        _print_summary(doc)
    return exit_code


def _forward_signals(proc: subprocess.Popen) -> dict[str, Any]:
    """Pass SIGTERM / SIGHUP on to ``proc`` and ignore SIGINT; the handlers replaced."""

    def forward(signum: int, _frame: Any) -> None:
        try:
            proc.send_signal(signum)
        except ProcessLookupError:
            pass  # it has just ended: its exit code says what happened

    previous: dict[str, Any] = {}
    for name in _FORWARDED:
        signum = getattr(signal, name, None)
        if signum is not None:
            previous[name] = signal.signal(signum, forward)
    previous["SIGINT"] = signal.signal(signal.SIGINT, signal.SIG_IGN)
    return previous


def _difference(before: dict, after: dict) -> dict[str, dict[str, Any]]:
    """Per system (or cuforge's own entry kind), what happened between the snapshots."""
    from cuforge.adapters.switch import system_of_kind

    rows: dict[str, dict[str, Any]] = {}
    for kind, now in after.items():
        then = before.get(kind, {})
        delta = {k: now[k] - then.get(k, 0) for k in ("hits", "misses", "builds", "seconds_saved")}
        if not any(delta[k] for k in ("hits", "misses", "builds")):
            continue
        name = system_of_kind(kind) or kind
        row = rows.setdefault(
            name, {"hits": 0, "misses": 0, "builds": 0, "seconds_saved": 0.0, "kinds": []}
        )
        for k, v in delta.items():
            row[k] += v
        row["kinds"].append(kind)
    for row in rows.values():
        row["seconds_saved"] = round(row["seconds_saved"], 6)
    return rows


def _print_summary(doc: dict[str, Any]) -> None:
    lines = []
    code = doc["exit_code"]
    head = f"cuforge run: exit code {code}; cache {doc['cache_dir']}"
    if not doc["telemetry"]:
        lines.append(f"{head}: telemetry is off (CUFORGE_TELEMETRY=0), nothing was counted")
    elif not doc["systems"]:
        lines.append(f"{head}: no cache lookups recorded")
    else:
        saved = output.human_seconds(doc["seconds_saved"])
        lines.append(f"{head}: {saved} of compiling saved")
        width = max(len(n) for n in doc["systems"])
        for name, row in sorted(doc["systems"].items(), key=lambda kv: -kv[1]["seconds_saved"]):
            lines.append(
                f"  {name:<{width}}  {row['hits']} hits, {row['misses']} misses, "
                f"{row['builds']} builds, {output.human_seconds(row['seconds_saved'])} saved"
            )
    if doc["hook"] is None:
        lines.append(
            f"  note: {PTH} is not in this interpreter's site-packages ({sys.executable}): "
            "Python processes that do not import cuforge themselves were not enabled "
            "(pip install cuforge into that environment)"
        )
    sys.stderr.write("\n".join(lines) + "\n")
    sys.stderr.flush()
