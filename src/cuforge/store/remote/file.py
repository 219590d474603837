"""``file:///shared/dir``: a remote tier in a directory shared between machines (NFS-style).

Layout: ``<dir>/<namespace>/<kind>/<key[:2]>/<key>``, one file per entry (an envelope,
:mod:`cuforge.store.remote.envelope`).

* Publishing takes no lock (``flock`` is unreliable on network file systems): the value is
  written to a uniquely named temp file in the target directory, then renamed onto its
  content address (:func:`cuforge._fs.atomic_write`, which never follows a symlink). A
  reader sees the old file or the new one, never part of one; two writers of one key both
  publish a valid entry and the last rename wins.
* Reads open regular files only, never through a symlink, and refuse a file over
  :data:`~cuforge.store.remote.envelope.MAX_VALUE_BYTES` from its size, unread.
* TTL: ignored (a shared directory has no expiry; prune it with ``find -mtime``).
* Timeouts: local and network file systems block in the kernel; cuforge cannot bound a
  hung NFS mount from here (mount it ``soft`` with a ``timeo``).
"""

from __future__ import annotations

import os
import stat
from urllib.parse import unquote, urlsplit

from cuforge import _fs
from cuforge.errors import ConfigError
from cuforge.store.remote import envelope
from cuforge.store.remote.base import RemoteBackend, RemoteError

__all__ = ["FileBackend"]


def _path_of(url: str) -> str:
    """The directory a ``file://`` URL names (``file:///abs`` or ``file://localhost/abs``)."""

    parts = urlsplit(url)
    if parts.scheme != "file" or parts.netloc not in ("", "localhost") or not parts.path:
        raise ConfigError(
            f"CUFORGE_REMOTE: {url!r} is not a file URL of a local path; expected "
            "file:///absolute/path/to/shared/dir"
        )
    return unquote(parts.path)


class FileBackend(RemoteBackend):
    """A shared directory. See the module doc."""

    schemes = ("file",)

    def setup(self) -> None:
        self.root = _path_of(self.url)
        if "/" in self.namespace or self.namespace in ("", ".", ".."):
            raise ValueError(f"namespace {self.namespace!r} cannot be a directory name")

    def path_for(self, kind: str, key: str) -> str:
        """``<dir>/<namespace>/<kind>/<key[:2]>/<key>``; ValueError for a kind or key that
        is not a plain name."""
        for what, value in (("kind", kind), ("key", key)):
            if not value or not value.isalnum() or not value.isascii():
                raise ValueError(f"remote {what} {value!r} is not a plain alphanumeric name")
        return os.path.join(self.root, self.namespace, kind, key[:2], key)

    def get(self, kind: str, key: str) -> bytes | None:
        path = self.path_for(kind, key)
        try:
            return _fs.read_bytes(path, max_bytes=envelope.MAX_VALUE_BYTES)
        except FileNotFoundError:
            if not os.path.isdir(self.root):
                raise RemoteError(f"shared cache directory {self.root} is missing") from None
            return None
        except OSError as exc:
            raise RemoteError(f"cannot read {path}: {exc.strerror or exc}") from exc

    def put(self, kind: str, key: str, data: bytes) -> None:
        if not os.path.isdir(self.root):
            # the share itself must exist (an unmounted NFS path must not fill the local disk)
            raise RemoteError(f"shared cache directory {self.root} is missing")
        path = self.path_for(kind, key)
        try:
            # directories by the umask (a team share needs them group-readable), not 0700
            os.makedirs(os.path.dirname(path), mode=0o777, exist_ok=True)
            _fs.atomic_write(path, data, mode=0o644, makedirs=False)
        except OSError as exc:
            raise RemoteError(f"cannot write {path}: {exc.strerror or exc}") from exc

    def contains(self, kind: str, key: str) -> bool:
        try:
            st = os.lstat(self.path_for(kind, key))
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise RemoteError(f"cannot stat an entry in {self.root}: {exc}") from exc

        return stat.S_ISREG(st.st_mode)
