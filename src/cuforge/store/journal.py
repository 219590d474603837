"""The disk tier's journal: an append-only index of the entries, its lock and its format.

The journal makes ``stats()`` / ``total_bytes()`` cheap on a big cache: it is read
incrementally (only the bytes appended since the last call) and compacted to one line
per live entry when it holds many dead lines. Format (version :data:`JOURNAL_VERSION`):
UTF-8 lines, tab-separated, written in *batches* (one batch per ``write``: a put's line,
an eviction's lines, a whole rebuilt journal), each batch closed by a checksum line
holding the CRC-32 (zlib) of the batch's bytes as 8 hex digits::

    H  2                                      first line of the file (the header)
    P  <key> <file size> <created> <kind> <name> <arch>   put
    D  <key>                                  delete
    C  <crc32 of the lines since the previous C line>      closes a batch

Readers apply only whole, checksummed batches. A journal that is damaged (a batch whose
checksum does not match, a malformed record, NUL bytes, more than :data:`MAX_PENDING`
bytes without a checksum line) is reported as such, and the disk tier rebuilds it from a
scan of the entries. Lines appended by hand without a checksum are never applied.

:class:`Journal` owns the file (``layout.journal``), its lock (``layout.index_lock``:
shared by appenders, exclusive for a rewrite) and the in-memory index read from it. It
knows nothing of the entry files: rebuilding from a scan is the disk tier's job.
"""

from __future__ import annotations

import os
from _thread import allocate_lock

from cuforge.base import _fs
from cuforge.store.entry_codec import read_all, read_info, remove_path

TYPE_CHECKING = False  # not `typing.TYPE_CHECKING`: importing typing costs ~10 ms
if TYPE_CHECKING:  # pragma: no cover
    from typing import Any

    from cuforge.base.layout import CacheLayout

__all__ = ["Journal", "JOURNAL_VERSION", "MAX_PENDING", "locked_file"]

#: Version of the journal's line format (checksummed lines since 2).
JOURNAL_VERSION = 2
#: journal bytes after the last checksum line: a batch being written (one ``write``, which
#: a reader may see in part); more than this is damage
MAX_PENDING = 32 << 20
HEADER = f"H\t{JOURNAL_VERSION}"
_HEADER_BYTES = f"{HEADER}\n".encode()


def locked_file(path: str, *, shared: bool = False, blocking: bool = True) -> _fs.locked:
    """:class:`cuforge.base._fs.locked` on a lock file of the index dir, after removing anything
    but a regular file in its place (damage that would otherwise stop every update)."""
    import stat

    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            remove_path(path)
    except OSError:
        pass  # missing: locked() creates it
    return _fs.locked(path, shared=shared, blocking=blocking)


def batch(bodies: list[str]) -> bytes:
    """Journal records as written: one line per record, then the checksum line
    ``C <CRC-32 of the records' bytes, 8 hex digits>``, in one piece."""
    from zlib import crc32

    text = "".join(f"{body}\n" for body in bodies).encode("utf-8", "surrogateescape")
    return text + f"C\t{crc32(text):08x}\n".encode()


# ---------------------------------------------------------------------- records
def field(value: Any) -> str:
    """``value`` as one tab-free journal field."""
    if value is None:
        return ""
    text = value if isinstance(value, str) else str(value)
    if "\t" in text or "\n" in text or "\r" in text:
        text = text.replace("\t", " ").replace("\n", " ").replace("\r", " ")
    return text


def put_record(key: str, size: int, created: float, kind: Any, name: Any, arch: Any) -> str:
    """The ``P`` record of an entry file of ``size`` bytes."""
    return f"P\t{key}\t{size}\t{created:.3f}\t{field(kind)}\t{field(name)}\t{field(arch)}"


def index_tuple(size: int, info: dict) -> tuple:
    """(file size, created, kind, name, arch) from an entry's header object."""
    meta = info.get("meta") or {}
    return (
        size,
        float(info.get("created") or 0.0),
        field(info.get("kind")),
        field(meta.get("name")),
        field(meta.get("arch")),
    )


def index_info(path: str, st: Any) -> tuple | None:
    """The index tuple of whatever regular file is in an entry's place: damaged and
    malformed ones too (their bytes count toward the cap, and eviction can remove them;
    a read or ``verify`` finds the damage). None for anything but a regular file."""
    import stat

    if not stat.S_ISREG(st.st_mode):
        return None
    info = read_info(path, st.st_size, schema=False)
    if info is None:
        return (st.st_size, float(st.st_mtime), "", "", "")
    return index_tuple(st.st_size, info)


def _body(key: str, t: tuple) -> str:
    return f"P\t{key}\t{t[0]}\t{t[1]:.3f}\t{t[2]}\t{t[3]}\t{t[4]}"


class Journal:
    """The journal of one cache dir (see the module doc). ``idx``: key -> (file size,
    created, kind, name, arch) as read so far; ``bytes``: their total size; ``lines``:
    records read (live and dead). ``mutex`` guards them between threads."""

    __slots__ = ("path", "lock_path", "mutex", "idx", "bytes", "lines", "_ino", "_off")

    def __init__(self, layout: CacheLayout) -> None:
        self.path = layout.journal
        self.lock_path = layout.index_lock
        self.mutex = allocate_lock()
        self.idx: dict[str, tuple] = {}
        self.bytes = 0
        self.lines = 0
        self._ino: tuple[int, int] | None = None
        self._off = 0

    def locked(self, *, shared: bool = False, blocking: bool = True) -> _fs.locked:
        """The journal's lock: shared to append, exclusive to rewrite."""
        return locked_file(self.lock_path, shared=shared, blocking=blocking)

    # ------------------------------------------------------------------ writing
    def append(self, bodies: list[str]) -> bool:
        """Append records (one batch, one ``write``). Returns True when the journal is
        missing (the caller rebuilds it from a scan, which sees the records). One that
        cannot be appended to is removed, so that the next reader rebuilds it."""
        data = batch(bodies)
        missing = False
        try:
            with self.locked(shared=True):
                try:
                    _fs.append_line(self.path, data, create=False)
                except FileNotFoundError:
                    missing = True
                except OSError:
                    # full disk, a FIFO or a directory in its place: never leave a journal
                    # that lacks this line (the cap would undercount); readers rebuild it
                    remove_path(self.path)
        except OSError:
            return False  # no index dir (read-only cache): stats fall back to a scan
        return missing

    def write(self, index: dict[str, tuple] | list[tuple[str, tuple]]) -> None:
        """Replace the journal with one record per entry of ``index`` (key -> index
        tuple), atomically; the caller holds :meth:`locked` exclusively. Raises OSError.

        Not fsynced: the journal is an index of the entries, rebuilt from a scan when it
        is missing, empty or fails its checksums (what a power loss can leave), and the
        appends of every put are not fsynced either. (Two fsyncs here cost ~0.14-0.3 s
        on the first put into an empty cache dir: a fresh process's first remote hit.)"""
        items = index.items() if isinstance(index, dict) else index
        bodies = [HEADER] + [_body(k, v) for k, v in items]
        _fs.atomic_write(self.path, batch(bodies))

    # ------------------------------------------------------------------ reading
    def reset(self, idx: dict[str, tuple] | None = None, total: int = 0) -> None:
        """Forget what was read (``idx``/``total``: an index built by a scan instead);
        the caller holds :attr:`mutex`."""
        self.idx, self._ino, self._off = idx if idx is not None else {}, None, 0
        self.bytes = total
        self.lines = len(self.idx)

    def read_new(self, fd: int) -> str | None:
        """Apply what is new in the journal open on ``fd`` (the caller holds
        :attr:`mutex`). Returns None, or why the journal must be rebuilt ("" for an older
        format: no warning); then the caller resets the index."""
        st = os.fstat(fd)
        ident = (st.st_dev, st.st_ino)
        if ident != self._ino or st.st_size < self._off:
            self.reset()
            self._ino = ident
        if st.st_size <= self._off:
            # a journal is never empty (it is created whole, header first)
            return "it is empty" if st.st_size == 0 else None
        os.lseek(fd, self._off, 0)
        data = read_all(fd)
        if b"\0" in data:
            return "it holds NUL bytes"
        used, damage = self._apply(data, first=self._off == 0)
        self._off += used
        return damage

    def _apply(self, data: bytes, *, first: bool) -> tuple[int, str | None]:
        """Apply the complete, checksummed record batches at the start of ``data`` (the
        journal from ``self._off``; ``first``: from its start). Returns (bytes used,
        None), or (_, why the journal is damaged: "" for an older format) -- the caller
        then drops the partly updated index and rebuilds it."""
        from zlib import crc32

        off = 0
        if first and not data.startswith(_HEADER_BYTES):
            if data.startswith(b"H\t"):
                return 0, ""
            return 0, "its first line is not the header"
        good: list[bytes] = []  # the verified batches' records (one decode, one split)
        damage = None
        find = data.find
        while True:
            i = find(b"\nC\t", off)
            if i < 0:
                break
            j = find(b"\n", i + 1)
            if j < 0:
                break  # its checksum line is still being written
            chunk = data[off : i + 1]
            check = data[i + 3 : j]
            try:
                bad = len(check) != 8 or crc32(chunk) != int(check, 16)
            except ValueError:
                bad = True
            if bad:
                damage = f"the records at byte {self._off + off} fail their checksum"
                break
            good.append(chunk)
            off = j + 1
        if damage is None and len(data) - off > MAX_PENDING:
            damage = f"{len(data) - off} bytes at its end have no checksum"
        if damage is not None:
            return off, damage
        if good:
            text = b"".join(good).decode("utf-8", "surrogateescape")
            if first:
                text = text[len(_HEADER_BYTES) :]
            why = self._apply_lines(text)
            if why is not None:
                return 0, why
        return off, None

    def _apply_lines(self, text: str) -> str | None:
        """Apply checksummed record lines; returns why one is malformed instead."""
        idx = self.idx
        total = self.bytes
        lines = text.split("\n")
        lines.pop()  # after the final newline
        for line in lines:
            tag = line[:2]
            if tag == "P\t":
                parts = line.split("\t")
                if len(parts) != 7:
                    return f"a record has {len(parts)} fields, not 7: {line[:80]!r}"
                try:
                    size = int(parts[2])
                    created = float(parts[3])
                except ValueError:
                    return f"a record has a bad size or time: {line[:80]!r}"
                if size < 0:
                    return f"a record has a negative size: {line[:80]!r}"
                old = idx.get(parts[1])
                if old is not None:
                    total -= old[0]
                idx[parts[1]] = (size, created, parts[4], parts[5], parts[6])
                total += size
            elif tag == "D\t":
                old = idx.pop(line[2:], None)
                if old is not None:
                    total -= old[0]
            else:
                return f"a line is not a record: {line[:80]!r}"
        self.bytes = total
        self.lines += len(lines)
        return None

    def check(self) -> str | None:
        """Why the journal is damaged, or None when it is sound (or missing: a missing
        journal is rebuilt on the next read and is not damage). Reads all of it and
        leaves the index as read so far untouched."""
        from cuforge.store.entry_codec import not_regular

        try:
            data = _fs.read_bytes(self.path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if not_regular(exc):
                return "it is not a regular file"
            return f"it cannot be read ({exc.strerror or exc})"
        if b"\0" in data:
            return "it holds NUL bytes"
        if not data:
            return "it is empty"
        scratch = Journal.__new__(Journal)
        scratch.idx, scratch.bytes, scratch.lines, scratch._off = {}, 0, 0, 0
        used, why = scratch._apply(data, first=True)
        if why == "":
            return "it is of an older format"
        if why is None and used < len(data):
            return f"{len(data) - used} bytes at its end have no checksum"
        return why

    def needs_compaction(self) -> bool:
        """Whether the journal holds many more records than live entries."""
        return self.lines > 2 * len(self.idx) + 4096
