"""What every ``cuforge`` command shares: ``--cache-dir DIR``.

:func:`_cache_dir` is the one place that reads the flag. Commands whose library function
takes a directory pass it down (``cuforge cache ...``: ``DiskStore(dir)``); for the
others (``compile``, ``build``, ``bundle install``, ``doctor``, ``env``), whose library
reads :func:`cuforge.base.config.settings`, :func:`apply_cache_dir` hands it to them through
``CUFORGE_CACHE_DIR`` in this process (the command line's own, never the library's), until
they take a cache object.
"""

from __future__ import annotations

import argparse
import os

from cuforge.base.config import settings

__all__ = ["_cache_dir", "cache_root", "apply_cache_dir"]


def _cache_dir(args: argparse.Namespace) -> str | None:
    """The cache dir ``--cache-dir`` names (absolute), or None when it was not given."""
    value = getattr(args, "cache_dir", None)
    if not value:
        return None
    return os.path.abspath(os.path.expanduser(value))


def cache_root(args: argparse.Namespace) -> str:
    """The cache dir the command operates on: ``--cache-dir``, else the configured one."""
    chosen = _cache_dir(args)
    if chosen is not None:
        return chosen

    return settings().cache_dir


def apply_cache_dir(args: argparse.Namespace) -> None:
    """Point the library's settings at ``--cache-dir`` for the rest of this command."""
    chosen = _cache_dir(args)
    if chosen is not None:
        os.environ["CUFORGE_CACHE_DIR"] = chosen
