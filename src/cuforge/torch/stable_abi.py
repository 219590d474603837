"""Whether an extension build targets LibTorch's stable ABI, and which ABI version.

An extension built against the stable ABI (``torch/csrc/stable/`` and
``torch/headeronly/``, ops registered with ``STABLE_TORCH_LIBRARY``) compiled with
``-DTORCH_TARGET_VERSION=<v>`` runs on every torch release from ``<v>`` on: torch keeps
that C ABI (the ``aoti_torch`` C shim under it) stable. Such a build is keyed by the
target it declares instead of the exact torch version and git hash, so one build serves
every later release (:mod:`cuforge.torch.build`).

The build counts as stable only when all of these hold, checked before any compiler runs:

* every translation unit's flags define ``TORCH_TARGET_VERSION`` to the same integer
  literal (``0x020a000000000000``, a ``ULL`` suffix allowed), at most the running torch's
  ``major.minor`` (a target newer than the headers it is compiled with is no promise);
* cuforge's include scan (:func:`cuforge.keys.deps.scan_includes`, which over-approximates:
  every ``#include`` counts, whatever ``#if`` it sits under) of every source and the user
  headers it reads finds no torch header outside :data:`STABLE_PREFIXES` (by the path the
  compiler would find it at, symlinks resolved), no unresolved include spelled as torch's
  (``torch/``, ``ATen/``, ``c10/``, ``pybind11/``), no computed include (``#include
  MACRO``), and is not cut short.

What torch's stable headers include in turn is torch's promise, not rescanned on every
load (that costs ~25 ms): they include only stable, header-only and C-shim headers, and
torch's other headers refuse to compile under ``TORCH_TARGET_VERSION`` (``#error``).
pybind11, which sits in torch's include dir but has no such guard, is caught where the
user's code includes it.

Anything else (``<torch/extension.h>``, ``<ATen/...>``, ``<c10/...>``, pybind11, an
unresolvable computed include) keeps the exact-version key.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from cuforge.keys.deps import scan_includes

__all__ = ["STABLE_PREFIXES", "TARGET_DEFINE", "target_of", "parse_target", "stable_target"]

TARGET_DEFINE = "TORCH_TARGET_VERSION"

#: torch headers (relative to torch's include dir) of the stable ABI: the stable C++ API,
#: the header-only core, and the C shim they call
STABLE_PREFIXES = (
    "torch/csrc/stable/",
    "torch/headeronly/",
    "torch/csrc/inductor/aoti_torch/c/",
    "torch/csrc/inductor/aoti_torch/generated/c_shim_",
)

#: the most include files one scan follows (torch's stable headers are ~60)
_MAX_FILES = 2000


def target_of(flags: Sequence[str]) -> str | None:
    """The body of the last ``-DTORCH_TARGET_VERSION=...`` in ``flags`` (also ``-D NAME=v``
    as two arguments); ``""`` when it is defined with no value or undefined again after
    (``-U``); None when not defined."""
    found: str | None = None
    args = list(flags)
    for i, flag in enumerate(args):
        body: str | None = None
        if flag == "-D":
            body = args[i + 1] if i + 1 < len(args) else ""
        elif flag.startswith("-D"):
            body = flag[2:]
        elif flag.startswith("-U") and flag[2:].strip() == TARGET_DEFINE:
            found = ""
            continue
        if body is None:
            continue
        name, sep, value = body.partition("=")
        if name.strip() == TARGET_DEFINE:
            found = value.strip() if sep else ""
    return found


def parse_target(text: str) -> int | None:
    """The ABI version a ``TORCH_TARGET_VERSION`` body names, when it is an integer literal
    (decimal or ``0x`` hex, optional ``u``/``l`` suffixes, optional parentheses); else None
    (an expression cuforge does not evaluate)."""
    body = text.strip()
    while body.startswith("(") and body.endswith(")"):
        body = body[1:-1].strip()
    body = body.rstrip("uUlL")
    try:
        value = int(body, 0)
    except ValueError:
        return None
    return value if 0 < value < 1 << 64 else None


def _major_minor(version: int) -> tuple[int, int]:
    return (version >> 56) & 0xFF, (version >> 48) & 0xFF


def _torch_major_minor(torch_version: str) -> tuple[int, int] | None:
    parts = torch_version.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def _defines(flags: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for flag in flags:
        if flag.startswith("-D") and len(flag) > 2:
            name, _, value = flag[2:].partition("=")
            out[name.strip()] = value
    return out


def _user_include_dirs(flags: Sequence[str]) -> list[str]:
    dirs: list[str] = []
    args = list(flags)
    for i, flag in enumerate(args):
        if flag.startswith("-I") and len(flag) > 2:
            dirs.append(flag[2:])
        elif flag == "-I" and i + 1 < len(args):
            dirs.append(args[i + 1])
    return dirs


#: include names that are torch's whatever resolves them: unresolved, they count as
#: non-stable headers
_TORCH_NAMES = ("torch/", "ATen/", "c10/", "caffe2/", "pybind11/")


def _reads_only_stable(
    source: str,
    flags: Sequence[str],
    torch_include: str,
    torch_dirs: Sequence[str],
    other_system: Sequence[str],
) -> bool:
    try:
        with open(source, encoding="utf-8", errors="surrogateescape") as f:
            text = f.read()
    except OSError:
        return False
    root = torch_include.rstrip(os.sep) + os.sep
    # torch's include dirs as system dirs: searched after the user's, listed where the
    # user's code includes them, not followed
    scan = scan_includes(
        text,
        source_dir=os.path.dirname(source),
        include_dirs=_user_include_dirs(flags),
        system_dirs=[*torch_dirs, *other_system],
        max_files=_MAX_FILES,
        defines=_defines(flags),
    )
    if scan.computed or scan.uncacheable is not None or len(scan.headers) >= _MAX_FILES:
        return False
    if any(name.startswith(_TORCH_NAMES) for name in scan.unresolved):
        return False
    for header in [*scan.headers, *scan.system]:
        real = os.path.realpath(header)
        for path in {header, real}:
            if path.startswith(root) and not path[len(root) :].startswith(STABLE_PREFIXES):
                return False
    return True


def stable_target(
    tus: Sequence[tuple[str, Sequence[str]]],
    *,
    torch_version: str,
    torch_include: str,
    torch_dirs: Sequence[str],
    other_system: Sequence[str],
) -> str | None:
    """The ABI target (``"2.10 (0x020a000000000000)"``) the build of ``tus`` ((source, its
    flags) each) declares, when it is a stable-ABI build by the rules of this module; else
    None. ``torch_include``: torch's include dir (what counts as a torch header);
    ``torch_dirs``: the include dirs under it that the compiler searches; ``other_system``:
    the other system include dirs (the toolkit's, Python's: not followed)."""
    if not tus:
        return None
    bodies = {target_of(flags) for _, flags in tus}
    if len(bodies) != 1:
        return None
    body = bodies.pop()
    if not body:
        return None
    value = parse_target(body)
    running = _torch_major_minor(torch_version)
    if value is None or running is None or _major_minor(value) > running:
        return None
    for source, flags in tus:
        if not _reads_only_stable(source, flags, torch_include, torch_dirs, other_system):
            return None
    major, minor = _major_minor(value)
    return f"{major}.{minor} (0x{value:016x})"
