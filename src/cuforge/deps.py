"""Which files a compilation reads, and what they contain.

* :func:`file_digest` -- a file's SHA-256, memoized per process by (mtime_ns, size, inode)
  so that re-checking unchanged headers costs one ``stat`` each.
* :func:`parse_depfile` -- the Make-style dependency file nvcc and gcc write with ``-MD -MF``.
* :func:`scan_includes` -- cuforge's own include scanner, for compilers that report no
  dependencies (NVRTC 13). It over-approximates: every ``#include`` line counts, whatever
  ``#if`` it sits under, and includes it cannot resolve are recorded as such.

Headers under a *system* root (the CUDA toolkit's include directories) are not hashed:
the compiler identity in the key covers them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence

from cuforge.key import bytes_digest

__all__ = [
    "file_digest",
    "stat_signature",
    "settled",
    "parse_depfile",
    "scan_includes",
    "IncludeScan",
]

#: A file changed less than this long ago may change again within the same timestamp tick
#: (file systems stamp with a coarse clock), so its stat signature is not trusted yet.
SETTLE_NS = 2_000_000_000

# path -> ((mtime_ns, size, inode, ctime_ns), digest)
_digest_memo: dict[str, tuple[tuple[int, int, int, int], str]] = {}


def stat_signature(path: str) -> tuple[int, int, int, int] | None:
    """(mtime_ns, size, inode, ctime_ns) of ``path``, or None when it does not exist."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino, st.st_ctime_ns)


def settled(sig: tuple[int, int, int, int]) -> bool:
    """True when the file last changed long enough ago that an unchanged signature means
    unchanged content (as ccache's "file too new" rule)."""
    return time.time_ns() - max(sig[0], sig[3]) > SETTLE_NS


def file_digest(path: str) -> str | None:
    """SHA-256 of the file's bytes, or None when it cannot be read.

    Memoized by the file's stat signature: a touched-but-unchanged file is re-hashed once
    and gives the same digest; an unchanged one is not read at all. A file that changed in
    the last two seconds is re-hashed on every call until it settles.
    """
    sig = stat_signature(path)
    if sig is None:
        _digest_memo.pop(path, None)
        return None
    memo = _digest_memo.get(path)
    if memo is not None and memo[0] == sig:
        return memo[1]
    try:
        with open(path, "rb") as f:
            digest = bytes_digest(f.read())
    except OSError:
        return None
    if settled(sig):
        _digest_memo[path] = (sig, digest)
    else:
        _digest_memo.pop(path, None)
    return digest


def parse_depfile(text: str) -> list[str]:
    """The prerequisites of a Make-style depfile (``target: a.h b.h \\`` ...), in order,
    without duplicates. Handles escaped spaces and line continuations."""
    body = text.replace("\\\r\n", " ").replace("\\\n", " ")
    deps: list[str] = []
    seen: set[str] = set()
    for rule in body.splitlines():
        if ":" not in rule:
            continue
        # the first unescaped ': ' ends the targets (a Windows drive letter has no space after it)
        idx = rule.find(": ")
        if idx < 0 and rule.rstrip().endswith(":"):
            continue
        prereqs = rule[idx + 2 :] if idx >= 0 else ""
        token = ""
        i = 0
        while i < len(prereqs):
            ch = prereqs[i]
            if ch == "\\" and i + 1 < len(prereqs) and prereqs[i + 1] == " ":
                token += " "
                i += 2
                continue
            if ch.isspace():
                if token and token not in seen:
                    seen.add(token)
                    deps.append(token)
                token = ""
            else:
                token += ch
            i += 1
        if token and token not in seen:
            seen.add(token)
            deps.append(token)
    return deps


class IncludeScan:
    """What :func:`scan_includes` found.

    ``headers``: user headers read, absolute paths in discovery order.
    ``unresolved``: include names found nowhere (left to the compiler, e.g. headers NVRTC
    supplies itself); they stay in the key by name.
    ``probes``: paths tried *before* a header was found. If one of them appears later, the
    header would resolve differently, so the pipeline keys on their absence too.
    ``computed``: True when an ``#include MACRO`` was seen; the scan cannot follow it, so
    the pipeline keys on every file under the user include directories instead.
    """

    __slots__ = ("headers", "unresolved", "probes", "computed")

    def __init__(self) -> None:
        self.headers: list[str] = []
        self.unresolved: list[str] = []
        self.probes: list[str] = []
        self.computed = False


def _include_directives(text: str) -> Iterable[tuple[str, str]]:
    """(delimiter, name) for every ``#include`` line; delimiter is '"', '<' or '' (computed)."""
    for raw in text.splitlines():
        line = raw.lstrip()
        if not line.startswith("#"):
            continue
        line = line[1:].lstrip()
        if not line.startswith("include"):
            continue
        rest = line[7:].lstrip()
        if rest.startswith("_next"):
            rest = rest[5:].lstrip()
        if rest.startswith('"'):
            end = rest.find('"', 1)
            if end > 1:
                yield '"', rest[1:end]
        elif rest.startswith("<"):
            end = rest.find(">", 1)
            if end > 1:
                yield "<", rest[1:end]
        elif rest and not rest.startswith("/"):
            yield "", rest.split()[0]


def _under(path: str, roots: Sequence[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip(os.sep) + os.sep) for r in roots)


def scan_includes(
    source: str,
    *,
    source_dir: str | None,
    include_dirs: Sequence[str],
    system_dirs: Sequence[str] = (),
    max_files: int = 10_000,
) -> IncludeScan:
    """Follow ``#include`` lines from ``source`` through ``include_dirs``.

    ``source_dir`` is where quoted includes of the main source are looked for first (the
    directory of a compiled file; None for a string source). A quoted include inside a
    header is looked for first in that header's directory. Files found under
    ``system_dirs`` (the toolkit's include roots) are not followed or hashed.
    """
    scan = IncludeScan()
    user_dirs = [os.path.abspath(d) for d in include_dirs]
    system_roots = [os.path.abspath(d) for d in system_dirs]
    seen: set[str] = set()
    unresolved: set[str] = set()
    stack: list[tuple[str, str | None]] = [(source, source_dir)]
    while stack and len(seen) < max_files:
        text, here = stack.pop()
        for delim, name in _include_directives(text):
            if delim == "":
                scan.computed = True
                continue
            candidates: list[str] = []
            if os.path.isabs(name):
                candidates.append(name)
            else:
                if delim == '"' and here is not None:
                    candidates.append(os.path.join(here, name))
                candidates.extend(os.path.join(d, name) for d in user_dirs)
                candidates.extend(os.path.join(d, name) for d in system_roots)
            found = None
            tried: list[str] = []
            for cand in candidates:
                cand = os.path.normpath(cand)
                if os.path.isfile(cand):
                    found = cand
                    break
                tried.append(cand)
            if found is None:
                if name not in unresolved:
                    unresolved.add(name)
                    scan.unresolved.append(name)
                continue
            if _under(found, system_roots) and not _under(found, user_dirs):
                continue
            scan.probes.extend(p for p in tried if p not in scan.probes)
            if found in seen:
                continue
            seen.add(found)
            scan.headers.append(found)
            try:
                with open(found, encoding="utf-8", errors="surrogateescape") as f:
                    stack.append((f.read(), os.path.dirname(found)))
            except OSError:
                continue
    return scan
