"""Safe file primitives: the one home for how cuforge opens, writes, appends and locks files.

Every file cuforge writes under the cache dir (and the build files it writes elsewhere)
goes through these functions, so one rule applies everywhere:

* **No symlinks are followed when writing.** Opens use ``O_NOFOLLOW``; a temp file is
  created with ``O_EXCL`` and renamed over the target, which replaces a planted link
  instead of writing through it.
* **Only regular files are used.** Opens are non-blocking and checked with ``fstat``: a
  FIFO, socket, device or directory in place of a file raises :class:`NotRegularFile`
  (an ``OSError``) instead of hanging or being read.
* **Readers see the old file or the new one, never part of one:** :func:`atomic_write`
  writes a temp file in the same directory, optionally ``fsync``s it, then ``os.replace``s
  it into place. Temp files are named ``.tmp.<name>.<pid>.<thread>.<n>`` so that cleaners
  (``cuforge cache prune``) recognize them (:data:`TMP_PREFIX`).
* **Appends of one line never interleave:** :func:`append_line` is a single ``write`` on an
  ``O_APPEND`` descriptor.

Not guaranteed: atomicity and ``flock`` semantics on network filesystems (NFS, SMB) are
whatever that filesystem provides.

The bottom layer: imports only the standard library, and nothing costly at import time.
"""

from __future__ import annotations

import os
import stat as _stat
from _thread import get_ident

__all__ = [
    "TMP_PREFIX",
    "NotRegularFile",
    "open_regular",
    "read_bytes",
    "atomic_write",
    "write_if_changed",
    "append_line",
    "locked",
    "temp_path",
    "create_temp",
    "write_all",
    "unlink",
    "trust_problem",
    "file_trust_problem",
    "destination_problem",
]

#: Every temp file this module creates starts with this prefix.
TMP_PREFIX = ".tmp."

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_SAFE = _O_CLOEXEC | _O_NOFOLLOW | _O_NONBLOCK

_counter = [0]


class NotRegularFile(OSError):
    """A path that should be a regular file is something else (FIFO, directory, device...)."""


def open_regular(
    path: str, flags: int = os.O_RDONLY, mode: int = 0o600, *, follow: bool = False
) -> int:
    """``os.open`` that refuses anything but a regular file (:class:`NotRegularFile`)
    without ever blocking on a FIFO, and refuses symlinks (``ELOOP``) unless ``follow``
    (reading a user's header, which may be a link). Returns the descriptor."""
    fd = os.open(path, flags | (_SAFE if not follow else _O_CLOEXEC | _O_NONBLOCK), mode)
    try:
        if not _stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFile(f"{path} is not a regular file")
        if _O_NONBLOCK and flags & (os.O_WRONLY | os.O_RDWR):
            # regular files ignore O_NONBLOCK, but clear it so that writes behave normally
            # (reads skip these two calls: the disk-hit path)
            import fcntl  # fcntl: only for writes and locks (not on the disk-hit read)

            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~_O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_bytes(path: str, max_bytes: int | None = None, *, follow: bool = False) -> bytes:
    """The whole content of the regular file ``path`` (see :func:`open_regular` for
    ``follow``). Raises ``OSError`` (including :class:`NotRegularFile`, and ``EFBIG``
    past ``max_bytes``)."""
    fd = open_regular(path, follow=follow)
    try:
        size = os.fstat(fd).st_size
        if max_bytes is not None and size > max_bytes:
            import errno  # errno: only on the error path

            raise OSError(errno.EFBIG, f"{path} is {size} bytes, over the {max_bytes}-byte cap")
        chunks = []
        total = 0
        # the file's size and one byte more (to see its end, or that it grew); never more
        # than one byte past the cap (a buffer of the cap's size costs a large malloc)
        limit = None if max_bytes is None else max_bytes + 1
        while True:
            want = max(size + 1 - total, 1 << 16)
            if limit is not None:
                want = min(want, limit - total)
            if want <= 0:
                break
            chunk = os.read(fd, want)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        if max_bytes is not None and len(data) > max_bytes:
            import errno

            raise OSError(errno.EFBIG, f"{path} grew over the {max_bytes}-byte cap")
        return data
    finally:
        os.close(fd)


def makedirs_private(directory: str) -> None:
    """``os.makedirs(directory, exist_ok=True)`` with every directory it creates at mode
    0700, not only the last (``os.makedirs`` gives the intermediate ones the umask's mode)."""
    if os.path.isdir(directory):
        return
    parent = os.path.dirname(directory)
    if parent and parent != directory:
        makedirs_private(parent)
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass


def temp_path(path: str) -> str:
    """A unique temp file name beside ``path`` (same directory, so a rename is atomic)."""
    _counter[0] += 1
    directory, base = os.path.split(path)
    return os.path.join(directory, f"{TMP_PREFIX}{base}.{os.getpid()}.{get_ident()}.{_counter[0]}")


def create_temp(path: str, mode: int = 0o600) -> tuple[int, str]:
    """Create a new temp file beside ``path`` (``O_EXCL | O_NOFOLLOW``); returns its
    descriptor, open for writing, and its name. The caller writes, then ``os.replace``s it
    onto ``path`` (or :func:`unlink`s it on failure)."""
    tmp = temp_path(path)
    return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_CLOEXEC | _O_NOFOLLOW, mode), tmp


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` (``os.write`` may write less than asked)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def unlink(path: str) -> bool:
    """Remove ``path`` (a link is removed, never followed); False when it was not there."""
    try:
        os.unlink(path)
        return True
    except OSError:
        return False


def atomic_write(
    path: str,
    data: bytes | str,
    *,
    durable: bool = False,
    mode: int = 0o600,
    makedirs: bool = True,
) -> None:
    """Replace ``path`` with ``data`` atomically (temp file + ``os.replace``).

    ``durable``: ``fsync`` the file and then its directory, so the content survives a power
    loss. ``makedirs``: create missing parent directories (mode 0700). A symlink at ``path``
    is replaced, not followed. Raises ``OSError``; the temp file never outlives a failure.
    """
    if isinstance(data, str):
        data = data.encode("utf-8")
    directory = os.path.dirname(path) or "."
    if makedirs:
        makedirs_private(directory)
    fd, tmp = create_temp(path, mode)
    try:
        try:
            write_all(fd, data)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        unlink(tmp)
        raise
    if durable:
        sync(directory, directory=True)


def sync(path: str, *, directory: bool = False) -> None:
    """``fsync`` ``path``, best effort: a regular file (not through a symlink) or, with
    ``directory``, a directory. A path gone since, or a filesystem that cannot sync a
    directory, is skipped: durability is best effort, correctness rests on checksums."""
    try:
        if directory:
            fd = os.open(path, os.O_RDONLY | _O_CLOEXEC)
        else:
            fd = open_regular(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # e.g. a filesystem that cannot fsync a directory
    finally:
        os.close(fd)


def write_if_changed(path: str, data: bytes | str, *, mode: int = 0o600) -> bool:
    """:func:`atomic_write` unless ``path`` already holds exactly ``data`` (keeps its mtime,
    so build tools such as ninja see nothing new). Returns True when it wrote."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    try:
        if read_bytes(path, max_bytes=len(data)) == data:
            return False
    except OSError:
        pass  # missing, too big, not a regular file: (re)write it
    atomic_write(path, data, mode=mode)
    return True


def append_line(path: str, line: bytes | str, *, create: bool = True, mode: int = 0o600) -> int:
    """Append ``line`` with one ``write`` on an ``O_APPEND`` descriptor, so concurrent
    appenders never interleave within a line; returns the file's new size.

    ``create``: create the file (and its directory) when missing; otherwise a missing file
    raises ``FileNotFoundError``. Refuses symlinks and non-regular files (``OSError``).
    """
    if isinstance(line, str):
        line = line.encode("utf-8", "surrogateescape")
    flags = os.O_WRONLY | os.O_APPEND | (os.O_CREAT if create else 0)
    try:
        fd = open_regular(path, flags, mode)
    except FileNotFoundError:
        if not create:
            raise
        makedirs_private(os.path.dirname(path) or ".")
        fd = open_regular(path, flags, mode)
    try:
        os.write(fd, line)
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


# Not filelock.FileLock: measured here (filelock 4.2, 2 cores), ``import filelock`` costs
# 48 ms (the whole warm-hit budget is ~15 ms) and an acquire + release 194 us against
# 7.4 us for this class; it also has no shared (reader) mode, which the journal needs.
class locked:
    """``with locked(path, shared=False, blocking=True) as held:`` -- an ``flock`` on the lock
    file ``path`` (created, mode 0600; its directory too). ``held`` is True when the lock
    was taken; with ``blocking=False`` it is False when another process holds it. The lock
    is released when the block ends (or the process dies). Raises ``OSError`` when the lock
    file cannot be opened, is a symlink or is not a regular file.

    ``fd`` is the open lock file's descriptor while the block runs; :meth:`relock` changes
    the lock's kind in place and :meth:`release` drops it early.
    """

    __slots__ = ("path", "shared", "blocking", "fd", "held")

    def __init__(self, path: str, *, shared: bool = False, blocking: bool = True) -> None:
        self.path, self.shared, self.blocking = path, shared, blocking
        self.fd = -1
        self.held = False

    def __enter__(self) -> bool:
        import fcntl  # fcntl: only when a lock is taken

        flags = os.O_RDWR | os.O_CREAT
        try:
            self.fd = open_regular(self.path, flags)
        except FileNotFoundError:
            makedirs_private(os.path.dirname(self.path) or ".")
            self.fd = open_regular(self.path, flags)
        op = fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX
        try:
            fcntl.flock(self.fd, op | (0 if self.blocking else fcntl.LOCK_NB))
            self.held = True
        except BlockingIOError:
            self.held = False
        except BaseException:
            os.close(self.fd)
            self.fd = -1
            raise
        return self.held

    def relock(self, *, shared: bool, blocking: bool = True) -> bool:
        """Change the held lock to shared or exclusive; returns whether it is held now."""
        import fcntl

        op = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
        try:
            fcntl.flock(self.fd, op | (0 if blocking else fcntl.LOCK_NB))
            self.held, self.shared = True, shared
        except BlockingIOError:
            pass
        return self.held

    def release(self) -> None:
        """Drop the lock early, keeping the file open until the block ends."""
        import fcntl

        if self.held:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            self.held = False

    def __exit__(self, *exc: object) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing drops the flock too
            self.fd = -1
            self.held = False


def trust_problem(path: str) -> str | None:
    """Why the directory ``path`` cannot be trusted to hold code this process will run, or
    None when it can (or does not exist yet: cuforge then creates it with mode 0700).

    The rule is ssh's StrictModes: the directory must be owned by the current user and
    must not be writable by group or others. Whoever can write a cache dir can make every
    process that uses it run their code. The message names the fix."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{path} cannot be checked ({exc.strerror})"
    return dir_stat_problem(path, st)


def dir_stat_problem(path: str, st: os.stat_result) -> str | None:
    """:func:`trust_problem` for a directory whose ``stat`` the caller already has."""
    if not _stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    return _owner_mode_problem(path, st, shared_ok=False)


def _owner_mode_problem(path: str, st: os.stat_result, *, shared_ok: bool) -> str | None:
    """The owner and mode half of the trust rule: owned by the current user (``shared_ok``:
    or root), not writable by group or others (``shared_ok``: unless a sticky directory,
    whose entries only their owners can replace)."""
    if st.st_uid != os.geteuid() and not (shared_ok and st.st_uid == 0):
        import pwd  # pwd: only to name the owner in an error

        try:
            owner = pwd.getpwuid(st.st_uid).pw_name
        except KeyError:
            owner = str(st.st_uid)
        if shared_ok:
            return (
                f"{path} is owned by {owner}, not by the current user or root; "
                f"`chown $(id -un) {path}` if you trust it, or use one of your own"
            )
        return (
            f"{path} is owned by {owner}, not by the current user; use a cache dir of your "
            f"own (export CUFORGE_CACHE_DIR=~/.cache/cuforge) or `chown -R $(id -un) {path}`"
        )
    sticky = shared_ok and _stat.S_ISDIR(st.st_mode) and st.st_mode & _stat.S_ISVTX
    if st.st_mode & 0o022 and not sticky:
        who = " and ".join(
            w for w, bit in (("group", 0o020), ("others", 0o002)) if st.st_mode & bit
        )
        return f"{path} is writable by {who}; fix it with `chmod go-w {path}`"
    return None


def file_trust_problem(path: str) -> str | None:
    """Why the file ``path`` (a keyring, a private key) cannot be trusted, or None when it
    can (or is missing: reading it then says so). The cache dir's rule, for one file that
    may live in a shared place such as ``/etc``: the file is no symlink (a link can be
    re-pointed by whoever owns it), it and every directory above it (on the path as given
    and on the resolved one) are owned by the current user or root, and none of them is
    writable by group or others, unless it is a sticky directory (``/tmp``). The message
    names the fix."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{path} cannot be checked ({exc.strerror})"
    if _stat.S_ISLNK(st.st_mode):
        return (
            f"{path} is a symlink; name the file itself (`realpath {path}`): whoever can "
            "re-point a link chooses what is read"
        )
    if not _stat.S_ISREG(st.st_mode):
        return f"{path} is not a regular file"
    problem = _owner_mode_problem(path, st, shared_ok=True)
    if problem is not None:
        return problem
    full = os.path.abspath(path)
    dirs: dict[str, None] = {}
    for start in (os.path.dirname(full), os.path.dirname(os.path.realpath(full))):
        current = start
        while True:
            dirs[current] = None
            parent = os.path.dirname(current)
            if parent == current:
                break
            current = parent
    for directory in dirs:
        try:
            st = os.stat(directory)
        except OSError as exc:
            return f"{directory} cannot be checked ({exc.strerror})"
        problem = _owner_mode_problem(directory, st, shared_ok=True)
        if problem is not None:
            return f"{problem} (it holds {full})"
    return None


def destination_problem(path: str) -> str | None:
    """Why a file written with :func:`atomic_write` (a rename) must not land on ``path``:
    it exists and is not a regular file (a symlink, a device such as /dev/null, a FIFO, a
    socket, a directory), which the rename would replace. None when ``path`` is missing or
    a regular file. For files written where the user says (exports, bundles); the message
    names the fix."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return None  # missing (or unreachable: the write itself then says why)
    if _stat.S_ISREG(mode):
        return None
    what = (
        "a symlink"
        if _stat.S_ISLNK(mode)
        else "a directory"
        if _stat.S_ISDIR(mode)
        else "a device, FIFO or socket"
    )
    return (
        f"it exists and is {what}, not a regular file; cuforge does not replace it: "
        "remove it or give another file name"
    )


#: The largest CUDA source file cuforge reads (far above any real one; a bigger "source" is
#: a mistake, e.g. a device node, and would only exhaust memory).
MAX_SOURCE_BYTES = 64 << 20


def read_source(path: str | os.PathLike[str]) -> str:
    """The text of a CUDA source file (UTF-8). It must be a regular file (a FIFO or a
    device is refused without blocking) of at most :data:`MAX_SOURCE_BYTES`; a symlink to
    one is fine (the user's own file). Raises FileNotFoundError / ValueError naming the
    file and what is wrong."""
    path = os.fspath(path)
    try:
        raw = read_bytes(path, MAX_SOURCE_BYTES, follow=True)
    except NotRegularFile:
        raise FileNotFoundError(
            f"cannot read CUDA source {path!r}: it is not a regular file (a FIFO, device or "
            "directory); pass the path of a .cu file"
        ) from None
    except OSError as exc:
        raise FileNotFoundError(
            f"cannot read CUDA source {path!r}: {exc.strerror or exc}"
        ) from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ValueError(
            f"{path}: not UTF-8 text: byte 0x{raw[exc.start]:02x} at offset {exc.start} "
            f"(line {line}) cannot be decoded. Save the file as UTF-8."
        ) from None
