"""Warm sets installed as wheels (``cuforge bundle wheel``): found through the entry point
group ``cuforge.bundles`` and served as read-only bundle tiers of the default cache.

A bundle wheel holds one package: the bundle (``bundle.cfb``) and ``cuforge-bundle.json``
(the archs, toolchain, cuforge version and key schema it serves). Its entry point names
that package; cuforge finds the package's directory without importing it (no code of the
wheel runs).

When: on the FIRST MISS of the default cache (:meth:`cuforge.Cache.build_once`), never on
``import cuforge`` nor on a hit (a process whose local cache is warm never looks at
installed distributions). A wheel that cannot serve this process (another cuforge version
or key schema, another NVRTC) is skipped; :func:`skipped` lists why, one line each, for
``cuforge doctor``.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs ~10 ms
if TYPE_CHECKING:  # pragma: no cover
    from typing import Protocol

    class BundleTarget(Protocol):
        """What :func:`load_into` is given: a cache that takes read-only bundle tiers
        (:meth:`cuforge.Cache.add_bundle`); this module never imports the cache."""

        def add_bundle(self, path: str) -> object: ...


__all__ = [
    "GROUP",
    "INFO_FILE",
    "BUNDLE_FILE",
    "installed",
    "package_dirs",
    "entry_points",
    "load_into",
    "skipped",
    "mismatch",
]

#: the entry point group a bundle wheel registers in
GROUP = "cuforge.bundles"
#: the description of the warm set, in the wheel's package
INFO_FILE = "cuforge-bundle.json"
#: the bundle file, in the wheel's package
BUNDLE_FILE = "bundle.cfb"

# "name: why" for each installed bundle wheel found unusable in this process
_skipped: list[str] = []


def installed() -> list[tuple[str, str, dict]]:
    """``(entry point name, bundle path, info)`` of every installed bundle wheel whose
    package has a readable description (one that has none is skipped with a reason)."""
    found = []
    points = entry_points()
    if not points:
        return found
    import json

    for name, value in points:
        module = value.partition(":")[0].strip()
        if not all(part.isidentifier() for part in module.split(".")):
            _skip(f"{name}: its package {module!r} is not a dotted name of identifiers")
            continue
        dirs = package_dirs(module)
        if not dirs:
            _skip(f"{name}: its package {module!r} is not installed as a directory")
            continue
        # a namespace package's description is in one of its portions
        home = next((d for d in dirs if os.path.isfile(os.path.join(d, INFO_FILE))), dirs[0])
        info_path = os.path.join(home, INFO_FILE)
        try:
            with open(info_path, encoding="utf-8") as f:
                info = json.load(f)
        except (OSError, ValueError) as exc:
            _skip(f"{name}: cannot read {info_path} ({exc})")
            continue
        if not isinstance(info, dict):
            _skip(f"{name}: {info_path} is not a JSON object")
            continue
        found.append((name, os.path.join(home, BUNDLE_FILE), info))
    return found


def package_dirs(module: str, path: list[str] | None = None) -> list[str]:
    """The directories of package ``module`` (dotted) as the import system finds them on
    ``path`` (default ``sys.path``), found WITHOUT importing anything: no ``__init__`` of
    the package or of a parent runs (``importlib.util.find_spec("a.b")`` imports ``a``).
    Each level is looked up in its parent's directories, in order, as the path finder
    does: the first directory ``name/`` with an ``__init__`` is a regular package (only
    that one); a plain module ``name.py`` (or bytecode, extension) there means it is not a
    package; ``name/`` directories without one before that are the portions of a
    namespace package. An empty list when it is not a package there."""
    import sys
    from importlib.machinery import all_suffixes

    suffixes = all_suffixes()
    where = list(sys.path if path is None else path)
    for part in module.split("."):
        portions: list[str] = []
        regular = None
        for d in where:
            candidate = os.path.join(d or ".", part)
            is_dir = os.path.isdir(candidate)
            if is_dir and any(
                os.path.isfile(os.path.join(candidate, "__init__" + sfx)) for sfx in suffixes
            ):
                regular = candidate
                break
            if any(os.path.isfile(candidate + sfx) for sfx in suffixes):
                return []  # a module, not a package: it has no directory
            if is_dir:
                portions.append(candidate)
        where = [regular] if regular is not None else portions
        if not where:
            return []
    return [os.path.abspath(d) for d in where]


def entry_points(path: list[str] | None = None) -> list[tuple[str, str]]:
    """``(name, value)`` of every entry point in the :data:`GROUP` group, as
    ``importlib.metadata.entry_points(group=GROUP)`` gives them (the first distribution of
    a name on ``sys.path`` wins), read directly: each ``*.dist-info`` / ``*.egg-info``
    directory's ``entry_points.txt`` is read only when it mentions the group, and nothing
    else of the distribution (``importlib.metadata`` parses every distribution's metadata:
    measured 20-80 ms in a venv of ~200 distributions, against a few ms here). A
    ``sys.path`` entry that is not a directory (a zip) falls back to ``importlib.metadata``."""
    import sys

    dirs = sys.path if path is None else path
    if any(d and not os.path.isdir(d) and os.path.exists(d) for d in dirs):
        from importlib.metadata import entry_points as _eps

        return [(ep.name, ep.value) for ep in _eps(group=GROUP)]
    seen: set[str] = set()
    points: list[tuple[str, str]] = []
    marker = f"[{GROUP}]".encode()
    for d in dirs:
        try:
            names = os.listdir(d or ".")
        except OSError:
            continue
        for meta in sorted(names):
            stem, dot, ext = meta.rpartition(".")
            if not dot or ext not in ("dist-info", "egg-info"):
                continue
            # the distribution's normalized name: importlib.metadata's dedupe key
            words = stem.partition("-")[0].lower().replace("-", "_").replace(".", "_")
            dist = "_".join(w for w in words.split("_") if w)
            if dist in seen:
                continue
            seen.add(dist)
            try:
                with open(os.path.join(d or ".", meta, "entry_points.txt"), "rb") as f:
                    text = f.read()
            except OSError:
                continue
            if marker in text:
                points.extend(_group(text.decode("utf-8", "replace")))
    return points


def _group(text: str) -> list[tuple[str, str]]:
    """The ``name = value`` lines of the :data:`GROUP` section of an ``entry_points.txt``."""
    out, inside = [], False
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            inside = line[1:-1].strip() == GROUP
        elif inside and "=" in line:
            name, _, value = line.partition("=")
            out.append((name.strip(), value.strip()))
    return out


def mismatch(info: dict) -> str | None:
    """Why a warm set described by ``info`` cannot serve this process, or None."""
    from cuforge._version import __version__
    from cuforge.keys.key import SCHEMA_VERSION

    made_by = info.get("cuforge_version")
    if made_by != __version__:
        return f"built for cuforge {made_by}, this is cuforge {__version__}"
    if info.get("key_schema") != SCHEMA_VERSION:
        return f"built with key schema {info.get('key_schema')}, this cuforge uses {SCHEMA_VERSION}"
    wanted = (info.get("toolchain") or {}).get("nvrtc")
    if isinstance(wanted, str) and not wanted.startswith("unavailable"):
        from cuforge.base.errors import CuforgeError
        from cuforge.toolchain.identity import nvrtc_version

        try:
            here = nvrtc_version()
        except (CuforgeError, OSError) as exc:
            return f"built with NVRTC {wanted}, and NVRTC is unavailable here ({exc})"
        if here != wanted:
            return f"built with NVRTC {wanted}, this process has NVRTC {here}"
    return None


def load_into(cache: BundleTarget) -> int:
    """Serve every installed bundle wheel that matches this process as a read-only tier
    of ``cache``; returns how many were added. Mismatching or broken ones are skipped
    (:func:`skipped`), never an error."""
    from cuforge.base.errors import CuforgeError

    added = 0
    for name, path, info in installed():
        problem = mismatch(info)
        if problem is not None:
            _skip(f"{name}: {problem}")
            continue
        try:
            cache.add_bundle(path)
        except (CuforgeError, OSError) as exc:
            _skip(f"{name}: its bundle cannot be loaded ({exc})")
            continue
        added += 1
    return added


def skipped() -> list[str]:
    """One line per installed bundle wheel skipped in this process, and why."""
    return list(_skipped)


def _skip(line: str) -> None:
    if line not in _skipped:
        _skipped.append(line)
