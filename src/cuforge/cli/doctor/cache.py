"""The cache checks: the cache dir (a trust boundary: FAIL when others can write it),
its size against the cap, the hit rate, a quick integrity pass."""

from __future__ import annotations

import os
import tempfile

from cuforge.base.config import settings
from cuforge.base.layout import CacheLayout
from cuforge.cli import output
from cuforge.cli.doctor.base import Check, Probe, row_maker
from cuforge.store import telemetry
from cuforge.store.disk import DiskStore


def _probe_writable(root: str) -> bool:
    try:
        fd, path = tempfile.mkstemp(prefix=".doctor-", dir=root)
    except OSError:
        return False
    os.close(fd)
    os.unlink(path)
    return True


def _creation_problem(root: str) -> str | None:
    """Why the missing cache dir ``root`` cannot be created, or None when it can: its
    nearest existing ancestor must be a directory this process can really write (a
    probe file is made and removed there, so root and read-only mounts answer truly)."""
    if os.path.lexists(root):
        return f"{root} exists and is not a directory"
    parent = os.path.dirname(root)
    while parent and not os.path.lexists(parent) and parent != os.path.dirname(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        return f"{parent} is a file, not a directory"
    if not _probe_writable(parent):
        return f"{parent} is not writable"
    return None


def _trust_problems(root: str) -> list[tuple[str, str | None]]:
    """(problem, fix) for the cache dir and every directory under it (the fan-out dirs
    of the entries and the torch module dirs included) that fails the cache dir's one
    trust rule (:meth:`cuforge.base.layout.CacheLayout.trust_problem`, as the runtime applies
    it); the fix covers the whole tree."""

    layout = CacheLayout(root)
    return [(problem, layout.fix_command(problem)) for problem in layout.tree_problems()]


def _check_cache_dir(root: str, disabled: str | None) -> list[Check]:
    row = row_maker("cache.dir", "cache dir")
    rows = []
    if disabled:
        rows.append(row("WARN", f"{disabled}=1: nothing is cached on disk", f"unset {disabled}"))
    if not os.path.isdir(root):
        problem = _creation_problem(root)
        if problem is None:
            rows.append(
                row(
                    "PASS", f"{root} (created with mode 0700 on first use)", path=root, exists=False
                )
            )
        else:
            rows.append(
                row(
                    "FAIL",
                    f"{root} cannot be created ({problem}): nothing will be cached",
                    "export CUFORGE_CACHE_DIR=<a writable directory>",
                    path=root,
                    exists=False,
                    problem=problem,
                )
            )
        return rows
    mode = os.stat(root).st_mode & 0o777
    problems = _trust_problems(root)
    if problems:
        fixes = [fix for _, fix in problems if fix]
        rows.append(
            row(
                "FAIL",
                "cuforge will not use this cache dir (whoever can write it can run code in "
                "your processes): " + "; ".join(problem for problem, _ in problems),
                " && ".join(dict.fromkeys(fixes)) or "export CUFORGE_CACHE_DIR=~/.cache/cuforge",
                path=root,
                exists=True,
                mode=oct(mode),
                untrusted=[problem for problem, _ in problems],
            )
        )
        return rows
    writable = _probe_writable(root)
    data = {"path": root, "exists": True, "mode": oct(mode), "writable": writable}
    if not writable:
        rows.append(
            row(
                "FAIL",
                f"{root} is not writable: compiles work but nothing is cached",
                f"chmod u+rwx {root}  (or export CUFORGE_CACHE_DIR=<a writable directory>)",
                **data,
            )
        )
    elif mode & 0o077:
        rows.append(
            row(
                "WARN",
                f"{root} has mode {oct(mode)}: other users can read or plant cached binaries",
                f"chmod 700 {root}",
                **data,
            )
        )
    else:
        rows.append(row("PASS", f"{root} (mode {oct(mode)})", **data))
    return rows


def check_cache(p: Probe) -> list[Check]:
    st = settings()
    root = st.cache_dir
    disabled = (
        "CUFORGE_DISABLE_CACHE"
        if st.disable_cache
        else "CUFORGE_DISABLE_FILE_CACHE"
        if st.disable_file_cache
        else None
    )
    rows = _check_cache_dir(root, disabled)
    if not os.path.isdir(root):
        return rows
    if rows[-1].status == "FAIL" and rows[-1].data.get("untrusted"):
        why = "skipped: the cache dir is not trusted (see cache dir), so nothing is read from it"
        return rows + [
            Check("cache.size", "cache size", "SKIP", why),
            Check("cache.hits", "cache hit rate", "SKIP", why),
            Check("cache.integrity", "cache integrity", "SKIP", why),
        ]

    store = DiskStore(root, st.cache_max_bytes, telemetry=False)
    stats = store.stats()
    cap, used = st.cache_max_bytes, stats.bytes
    row = row_maker("cache.size", "cache size")
    detail = f"{stats.entries} entries, {output.human_bytes(used)}"
    if cap:
        detail += f" of {output.human_bytes(cap)} ({100 * used / cap:.0f}%)"
    data = {"entries": stats.entries, "bytes": used, "max_bytes": cap}
    if cap and used > cap:
        rows.append(
            row(
                "WARN",
                detail + ": over the cap (the next write evicts)",
                "cuforge cache prune",
                **data,
            )
        )
    else:
        rows.append(row("PASS", detail, **data))

    row = row_maker("cache.hits", "cache hit rate")
    summ = telemetry.summary(root)
    # the one definition of a hit, as `cuforge cache stats` counts it (telemetry.tally):
    # once, at the tier that answered it; a miss: no tier answered it
    chain = summ.get("lookups", {})
    hits, misses = chain.get("hits", 0), chain.get("misses", 0)
    lookups = chain.get("lookups", hits + misses)
    data = {"lookups": lookups, "hits": hits, "misses": misses, "builds": chain.get("builds", 0)}
    if not summ.get("enabled", True):
        rows.append(row("PASS", "telemetry is off (CUFORGE_TELEMETRY=0)", enabled=False))
    elif lookups == 0:
        rows.append(row("PASS", "no lookups recorded yet", **data))
    else:
        rate = summ.get("hit_rate") or hits / lookups
        saved = output.human_seconds(summ.get("seconds_saved", 0.0))
        rows.append(
            row(
                "PASS",
                f"{lookups} lookups: {output.plural(hits, 'hit')} ({100 * rate:.0f}%), "
                f"{misses} miss{'es' * (misses != 1)}; {saved} of compiling saved "
                "(as `cuforge cache stats` counts them)",
                hit_rate=rate,
                **data,
            )
        )

    row = row_maker("cache.integrity", "cache integrity")
    report = store.verify(repair=False, quick=True)
    corrupt, checked = len(report.corrupt), report.checked
    if corrupt:
        rows.append(
            row(
                "WARN",
                f"{corrupt} of {checked} entries are damaged (they miss and get rebuilt; "
                "never served)",
                "cuforge cache verify --repair",
                checked=checked,
                corrupt=corrupt,
            )
        )
    else:
        rows.append(
            row(
                "PASS",
                f"{checked} entries checked (quick), none damaged",
                checked=checked,
                corrupt=0,
            )
        )
    return rows


def check_bundle_wheels(p: Probe) -> list[Check]:
    """One row for the installed warm-set wheels (entry point group ``cuforge.bundles``):
    PASS with how many match this process, WARN with one line per wheel that is skipped."""
    from cuforge.core.bundle_wheels import installed, mismatch, skipped

    row = row_maker("bundle_wheels", "bundle wheels")
    found = [(name, mismatch(info)) for name, _, info in installed()]
    usable = [name for name, problem in found if problem is None]
    lines = [f"{name}: {problem}" for name, problem in found if problem is not None]
    lines += [line for line in skipped() if line not in lines]
    if not found and not lines:
        return [row("SKIP", "no bundle wheel installed (cuforge bundle wheel makes one)")]
    if lines:
        return [
            row(
                "WARN",
                f"{len(usable)} usable; skipped: " + "; ".join(lines),
                "install the wheel built for this cuforge and toolkit (cuforge bundle wheel)",
            )
        ]
    return [row("PASS", f"{len(usable)} installed and usable: {', '.join(usable)}")]
