"""How file paths enter cache keys: relative to a base dir, so that checkouts of one project
at different paths (two developers, CI and a laptop) share entries, as ccache's
``base_dir`` does.

A path under the base dir is keyed as ``${BASE}/<relative path>``; any other path is keyed
as it is. The base dir is ``CUFORGE_BASE_DIR``, else the working directory of the call.
Only paths the compiler reads *as paths* (include dirs, pre-included files, the headers a
compile read) are rewritten: a path inside a define's value stays as it is, because it can
change the generated code.

Not guaranteed: binaries built with ``-lineinfo`` or ``-G`` embed the header paths of the
checkout that compiled them; another checkout that hits gets those paths in its debug line
tables (the code is the same).

The bottom layer: imports only the standard library.
"""

from __future__ import annotations

import os

#: the names of the directories pip installs distributions into (site-packages on most
#: Pythons, dist-packages on Debian's); :mod:`cuforge.toolchain.installed` re-exports it
SITE_DIR_NAMES = ("site-packages", "dist-packages")

__all__ = ["BASE", "base_dir", "keyed_path", "real_path"]

#: What stands for the base dir in a keyed path.
BASE = "${BASE}"


def base_dir(configured: str) -> str:
    """The base dir for a call: ``configured`` (CUFORGE_BASE_DIR, already absolute) or the
    working directory."""
    return configured or os.getcwd()


def keyed_path(path: str, base: str) -> str:
    """``path`` (absolute) as the key records it: ``${BASE}/rel`` when under ``base``."""
    root = base.rstrip(os.sep)
    if path.startswith(root + os.sep):
        return BASE + "/" + path[len(root) + 1 :]
    if path == root:
        return BASE
    return path


def real_path(keyed: str, base: str) -> str:
    """The inverse of :func:`keyed_path` for this process's ``base``."""
    if keyed.startswith(BASE + "/"):
        return os.path.join(base, keyed[len(BASE) + 1 :])
    if keyed == BASE:
        return base
    return keyed
