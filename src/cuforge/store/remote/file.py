"""``file:///shared/dir``: a remote tier in a directory shared between machines (NFS-style).

Layout: ``<dir>/<namespace>/<kind>/<key[:2]>/<key>``, one file per entry (an envelope,
:mod:`cuforge.store.remote.envelope`).

* Publishing takes no lock (``flock`` is unreliable on network file systems): the value is
  written to a uniquely named temp file in the target directory, then renamed onto its
  content address (:func:`cuforge.base._fs.atomic_write`, which never follows a symlink). A
  reader sees the old file or the new one, never part of one; two writers of one key both
  publish a valid entry and the last rename wins.
* Reads open regular files only, never through a symlink, and refuse a file over
  ``max_bytes`` (``CUFORGE_REMOTE_MAX_BYTES``) from its size (``fstat``), unread, and one
  whose envelope header is wrong after reading just the header; the rest is read into one
  buffer, in chunks, each started before the deadline (``timeout``).
* Trust: with no signing key, an entry read from a share that anyone may write to (the
  share or a directory under it writable by others, or by its group) is code anyone
  could have planted: :meth:`FileBackend.trust_problem` says so (the tier warns once; it
  refuses native host code from an unsigned share anyway), and
  :meth:`FileBackend.share_problem` checks the whole share for ``cuforge doctor``.
* Build leases (fleet-wide single flight, :meth:`FileBackend.lease`):
  ``<dir>/<namespace>/.leases/<kind>/<key[:2]>/<key>``, created with ``O_EXCL``, holding
  ``"<token> <ttl ms> <holder>"``; it expires ``ttl`` after its mtime (the holder renews it
  with ``utime``), so the clocks of the machines must agree to within a fraction of the
  TTL. A reader counts a lease's TTL for at most its own (``CUFORGE_LEASE_TTL``) and reads
  a mtime more than :data:`CLOCK_SKEW` seconds in the future as expired, so a planted
  lease holds one TTL at most. An expired lease is renamed away and checked before it is dropped: two machines
  taking over one expired lease at once cost at worst one extra build, never a wrong entry.
* TTL: ignored (a shared directory has no expiry; prune it with ``find -mtime``).
* Timeouts: local and network file systems block in the kernel; cuforge cannot bound a
  hung NFS mount from here (mount it ``soft`` with a ``timeo``).
"""

from __future__ import annotations

import os
import stat
import time

from cuforge.store.remote.base import RemoteBackend, RemoteError, RemoteTimeout

#: bytes read per ``os.readinto`` (the deadline is checked between chunks)
_CHUNK = 4 << 20

__all__ = ["FileBackend"]


def _path_of(url: str) -> str:
    """The directory a ``file://`` URL names (``file:///abs`` or ``file://localhost/abs``)."""
    if url[:8].lower() == "file:///" and not any(c in url for c in "%?#\t\r\n"):
        # the usual form, answered as urlsplit + unquote answer it (no netloc, nothing to
        # decode, no query or fragment) without importing urllib.parse, which brings re,
        # enum and ipaddress (~10 ms in a process that has none of them)
        return url[7:]
    from urllib.parse import unquote, urlsplit

    parts = urlsplit(url)
    if parts.scheme != "file" or parts.netloc not in ("", "localhost") or not parts.path:
        from cuforge.base.errors import ConfigError

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
        #: directories already found not writable by others (each is checked once)
        self._trusted_dirs: set[str] = set()

    def path_for(self, kind: str, key: str) -> str:
        """``<dir>/<namespace>/<kind>/<key[:2]>/<key>``; ValueError for a kind or key that
        is not a plain name."""
        for what, value in (("kind", kind), ("key", key)):
            plain = value.replace("-", "") if what == "kind" else value  # "cuda-core"
            if not plain or not plain.isalnum() or not value.isascii() or value[0] == "-":
                raise ValueError(f"remote {what} {value!r} is not a plain alphanumeric name")
        return os.path.join(self.root, self.namespace, kind, key[:2], key)

    def keys(self) -> list[tuple[str, str]]:
        """Every ``(kind, key)`` stored in this namespace (for ``cuforge cache explain
        --remote``): the file names of ``<dir>/<namespace>/<kind>/<xx>/``; names that are
        not an entry's (temporary files, strays) are left out."""
        from cuforge.base.layout import is_entry_key

        top = os.path.join(self.root, self.namespace)
        found = []
        try:
            kinds = sorted(os.listdir(top))
        except OSError:
            return []
        for kind in kinds:
            try:
                shards = sorted(os.listdir(os.path.join(top, kind)))
            except OSError:
                continue
            for shard in shards:
                try:
                    names = sorted(os.listdir(os.path.join(top, kind, shard)))
                except OSError:
                    continue
                found.extend((kind, n) for n in names if n[:2] == shard and is_entry_key(n))
        return found

    def get(self, kind: str, key: str) -> bytes | None:
        from cuforge.base import _fs

        path = self.path_for(kind, key)
        try:
            fd = _fs.open_regular(path)
        except FileNotFoundError:
            if not os.path.isdir(self.root):
                raise RemoteError(f"shared cache directory {self.root} is missing") from None
            return None
        except OSError as exc:
            raise RemoteError(f"cannot read {path}: {exc.strerror or exc}") from exc
        try:
            return self._read(fd, path, kind, key)
        except OSError as exc:
            if isinstance(exc, RemoteError):
                raise
            raise RemoteError(f"cannot read {path}: {exc.strerror or exc}") from exc
        finally:
            os.close(fd)

    def _read(self, fd: int, path: str, kind: str, key: str) -> bytearray:
        """The file behind ``fd``: its size and first bytes checked (:meth:`check_head`)
        before the rest is read, into one buffer, in chunks started by the deadline."""
        deadline = time.monotonic() + self.timeout
        size = os.fstat(fd).st_size
        head = os.read(fd, min(size, self.head_bytes))
        first = self.check_head(head, size, kind, key)  # the header's end: read, check again
        data = bytearray(size)
        view = memoryview(data)
        view[: len(head)] = head
        done = len(head)
        while done < size:
            if time.monotonic() > deadline:
                raise RemoteTimeout(
                    f"reading {path} took over {self.timeout:g} s (CUFORGE_REMOTE_TIMEOUT)"
                )
            stop = min(size, done + _CHUNK, first if first > done else size)
            n = os.readv(fd, [view[done:stop]])
            if n == 0:
                raise RemoteError(f"{path} shrank while it was read (being replaced?)")
            done += n
            if first and done >= first:
                self.check_head(view[:done], size, kind, key)
                first = 0
        if os.read(fd, 1):
            raise RemoteError(f"{path} grew while it was read (being replaced?)")
        return data

    def trust_problem(self, kind: str, key: str) -> str | None:
        """Why the entry of ``(kind, key)`` may have been planted: the share, or a
        directory on the way to the entry, is writable by others or by its group (any
        member of the group may have written it; each directory is checked once per
        process); None when none is."""
        directory = self.root
        for part in (self.namespace, kind, key[:2], None):
            if directory not in self._trusted_dirs:
                problem = _world_writable(directory) or _group_writable(directory)
                if problem is not None:
                    return problem
                self._trusted_dirs.add(directory)
            if part is None:
                break
            directory = os.path.join(directory, part)
        return None

    def share_problem(self, limit: int = 10_000) -> str | None:
        """The first directory of the share that others may write to (the share itself,
        then every directory up to the entries' fan-out dirs, at most ``limit`` of them),
        as a sentence, or None."""
        todo = [(self.root, 0)]
        seen = 0
        while todo and seen < limit:
            directory, depth = todo.pop()
            seen += 1
            problem = _world_writable(directory)
            if problem is not None:
                return problem
            if depth >= 3:  # <ns>/<kind>/<xx>: below are the entries
                continue
            try:
                with os.scandir(directory) as it:
                    for item in it:
                        if item.is_dir(follow_symlinks=False):
                            todo.append((item.path, depth + 1))
            except OSError:
                continue
        return None

    def put(self, kind: str, key: str, data: bytes) -> None:
        from cuforge.base import _fs

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

    # ------------------------------------------------------------------ build leases
    supports_leases = True

    def lease_path(self, kind: str, key: str) -> str:
        """``<dir>/<namespace>/.leases/<kind>/<key[:2]>/<key>`` (no kind starts with a dot)."""
        self.path_for(kind, key)  # checks kind and key
        return os.path.join(self.root, self.namespace, ".leases", kind, key[:2], key)

    def _read_lease(self, path: str) -> tuple[int, float, str, float] | None:
        """``(token, ttl seconds, holder, mtime)`` of the lease file, or None when it is
        gone; a garbled one reads as expired at once (token 0, ttl 0)."""
        from cuforge.base import _fs

        try:
            fd = _fs.open_regular(path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise RemoteError(f"cannot read the lease {path}: {exc.strerror or exc}") from exc
        try:
            mtime = os.fstat(fd).st_mtime
            text = os.read(fd, 4096).decode("utf-8", "replace")
        finally:
            os.close(fd)
        token, _, rest = text.strip().partition(" ")
        ttl_ms, _, holder = rest.partition(" ")
        if not (token.isdigit() and ttl_ms.isdigit()):
            return 0, 0.0, "", mtime
        return int(token), int(ttl_ms) / 1000, holder, mtime

    def lease(self, kind: str, key: str, ttl: float, holder: str) -> tuple[int | None, str]:
        """Create the lease file with ``O_EXCL``; while an unexpired one is there, say who
        holds it; an expired one is taken over."""
        if not os.path.isdir(self.root):
            raise RemoteError(f"shared cache directory {self.root} is missing")
        path = self.lease_path(kind, key)
        token = int.from_bytes(os.urandom(7), "big") | 1  # never 0 (a garbled lease's)
        body = f"{token} {max(1, int(ttl * 1000))} {' '.join(holder.split())}\n".encode()
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        try:
            os.makedirs(os.path.dirname(path), mode=0o777, exist_ok=True)
            for _ in range(3):
                try:
                    fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0), 0o644)
                except FileExistsError:
                    info = self._read_lease(path)
                    if info is None:
                        continue  # released meanwhile: try again
                    held, held_ttl, who, mtime = info
                    if _unexpired(mtime, held_ttl, ttl):
                        return None, who
                    self._take_over(path, held)
                    continue
                try:
                    os.write(fd, body)
                finally:
                    os.close(fd)
                return token, holder
        except OSError as exc:
            if isinstance(exc, RemoteError):
                raise
            raise RemoteError(f"cannot take the lease {path}: {exc.strerror or exc}") from exc
        return None, ""

    def _take_over(self, path: str, expired: int) -> None:
        """Drop the expired lease of token ``expired``: rename it away (atomic), and put it
        back if what was renamed is a fresh lease another machine took meanwhile."""
        aside = f"{path}.{os.getpid()}.{os.urandom(4).hex()}.stale"
        try:
            os.rename(path, aside)
        except FileNotFoundError:
            return
        try:
            info = self._read_lease(aside)
            if info is not None and info[0] != expired:
                try:
                    os.link(aside, path)  # a fresh lease: give it back
                except FileExistsError:
                    pass  # a third machine took it meanwhile: at worst one extra build
        finally:
            try:
                os.unlink(aside)
            except FileNotFoundError:
                pass

    def renew(self, kind: str, key: str, token: int, ttl: float) -> bool:
        """Touch the lease file (its mtime starts the TTL again) when ``token`` holds it."""
        path = self.lease_path(kind, key)
        info = self._read_lease(path)
        if info is None or info[0] != token:
            return False
        try:
            os.utime(path, follow_symlinks=False)
        except OSError as exc:
            raise RemoteError(f"cannot renew the lease {path}: {exc.strerror or exc}") from exc
        return True

    def release(self, kind: str, key: str, token: int) -> None:
        """Delete the lease file when ``token`` holds it."""
        path = self.lease_path(kind, key)
        info = self._read_lease(path)
        if info is None or info[0] != token:
            return
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise RemoteError(f"cannot release the lease {path}: {exc.strerror or exc}") from exc

    def contains(self, kind: str, key: str) -> bool:
        try:
            st = os.lstat(self.path_for(kind, key))
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise RemoteError(f"cannot stat an entry in {self.root}: {exc}") from exc
        return stat.S_ISREG(st.st_mode)


def _group_writable(directory: str) -> str | None:
    """``"<dir> is writable by its group <name>"`` when it is (a missing dir is no
    problem). A team share often is; without a signing key, any member of the group can
    plant an entry (``cuforge doctor`` does not fail it: only world-writable shares)."""
    try:
        st = os.lstat(directory)
    except OSError:
        return None
    if not st.st_mode & stat.S_IWGRP:
        return None
    try:
        import grp

        group = grp.getgrgid(st.st_gid).gr_name
    except (ImportError, KeyError):
        group = str(st.st_gid)
    return (
        f"the shared directory {directory} is writable by its group {group} "
        f"(mode {stat.filemode(st.st_mode)}): any member of it may have written this entry"
    )


#: how far in the future a lease file's mtime may be (clock skew between the machines
#: sharing the directory) before the lease reads as expired
CLOCK_SKEW = 2.0


def _unexpired(mtime: float, held_ttl: float, own_ttl: float) -> bool:
    """Whether a lease file touched at ``mtime`` with the TTL ``held_ttl`` it claims still
    holds, for a reader whose own TTL is ``own_ttl``: the claimed TTL counts for at most
    the reader's own (a planted lease claiming a year holds one TTL), and a mtime in the
    future (past the clock skew: a planted one) reads as expired."""
    now = time.time()
    if mtime > now + CLOCK_SKEW:
        return False
    return now < mtime + min(held_ttl, own_ttl)


def _world_writable(directory: str) -> str | None:
    """``"<dir> is writable by others"`` when it is (a missing dir is no problem)."""
    try:
        st = os.lstat(directory)
    except OSError:
        return None
    if st.st_mode & stat.S_IWOTH:
        return f"the shared directory {directory} is writable by others (mode {stat.filemode(st.st_mode)})"
    return None
