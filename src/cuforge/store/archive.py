"""Cache archives: move disk-cache entries between machines (``cuforge cache export`` /
``cuforge cache import``), as library functions.

An archive (:data:`ARCHIVE_VERSION` 1) is a tar stream, compressed with gzip (``.tar.gz``,
``.tgz``) or zstd (``.tar.zst``, ``.tzst``; needs the ``zstandard`` module:
``pip install zstandard`` or ``pip install cuforge[zstd]``; Python 3.14's
``compression.zstd`` works too)::

    cuforge-archive.json      {"format": "cuforge-cache-archive", "archive_version": 1,
                               "key_schema", "disk_format_version", "cuforge_version",
                               "created", "entries": <count>}
    entries/<key>.json        {"key", "kind", "size", "sha256", "created", "meta"}
    entries/<key>.bin         the payload
    ...
    cuforge-archive-end.json  {"entries": <count>, "bytes": <payload bytes>}

Guarantees of :func:`import_archive`:

* The header comes first, so a mismatched archive or key-schema version is refused
  before any entry is read.
* Every entry is checked before it is stored: its key, its kind and metadata
  (:mod:`cuforge.store.schema`), its size and its SHA-256. A payload is streamed into
  the cache (never held in memory whole) and renamed into place only when sound; a
  member larger than ``max_member_bytes`` is rejected without being read.
* Nothing is written outside the cache: member names are never used as paths.
* A missing end record means a truncated archive (reported; what came before is kept).
"""

from __future__ import annotations

import os
import time

from cuforge.store.disk import DiskStore

TYPE_CHECKING = False  # not `typing.TYPE_CHECKING`: importing typing costs ~10 ms
if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable, Iterator
    from typing import Any, BinaryIO

    from cuforge.store.base import EntryInfo


__all__ = [
    "ARCHIVE_FORMAT",
    "ARCHIVE_VERSION",
    "FORMATS",
    "MAX_MEMBER_BYTES",
    "ArchiveError",
    "ExportResult",
    "ImportResult",
    "choose_format",
    "detect_format",
    "export_archive",
    "import_archive",
]

ARCHIVE_FORMAT = "cuforge-cache-archive"
ARCHIVE_VERSION = 1
#: the compressions an archive may use: gzip and zstd (no zip, no plain tar)
FORMATS = ("gz", "zstd")
#: the largest payload member :func:`import_archive` accepts by default (1 GiB)
MAX_MEMBER_BYTES = 1 << 30
#: the largest JSON member (header, entry record, end record)
MAX_RECORD_BYTES = 64 << 20
HEADER_NAME = "cuforge-archive.json"
END_NAME = "cuforge-archive-end.json"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_CHUNK = 1 << 20
_ZSTD_MISSING = (
    "the `zstandard` module is not installed: pip install zstandard "
    "(or pip install 'cuforge[zstd]')"
)


class ArchiveError(ValueError):
    """An archive that cannot be used (not an archive, a version this cuforge cannot read,
    a compression whose module is missing). The message says what to do."""


class _Damaged(Exception):
    """The archive could not be read to its end (truncated or corrupt compression)."""


def _as_store(store_or_root: DiskStore | str) -> DiskStore:
    if isinstance(store_or_root, DiskStore):
        return store_or_root
    from cuforge.config import settings

    # telemetry=False: moving entries in and out is not cache traffic
    return DiskStore(str(store_or_root), settings().cache_max_bytes, telemetry=False)


def _zstd_module():
    """(compress(fileobj) -> writer, decompress(fileobj) -> reader) or None."""
    try:
        from compression import zstd  # type: ignore[import-not-found]  # Python 3.14+

        return (
            lambda f: zstd.ZstdFile(f, "w"),
            lambda f: zstd.ZstdFile(f, "r"),
        )
    except ImportError:
        pass
    try:
        import zstandard  # type: ignore[import-not-found]
    except ImportError:
        return None
    return (
        lambda f: zstandard.ZstdCompressor(level=10).stream_writer(f, closefd=False),
        lambda f: zstandard.ZstdDecompressor().stream_reader(f, closefd=False),
    )


def choose_format(path: str, requested: str | None = None) -> str:
    """The compression to write ``path`` with: ``requested`` ("gz" or "zstd"), else the
    file name's suffix (``.tar.zst``/``.tzst``, ``.tar.gz``/``.tgz``), else zstd when its
    module is installed and gzip otherwise. Raises :class:`ArchiveError`."""
    if requested:
        if requested not in FORMATS:
            raise ArchiveError(
                f"archive format {requested!r}: expected one of {', '.join(FORMATS)}"
            )
        fmt = requested
    else:
        lower = path.lower()
        if lower.endswith((".tar.zst", ".tzst", ".zst")):
            fmt = "zstd"
        elif lower.endswith((".tar.gz", ".tgz", ".gz")):
            fmt = "gz"
        elif lower.endswith((".zip", ".tar")):
            raise ArchiveError(
                f"cannot write {path!r}: cache archives are .tar.gz or .tar.zst "
                "(zip and plain tar are not supported); name the file .tar.gz or .tar.zst"
            )
        else:
            fmt = "zstd" if _zstd_module() else "gz"
    if fmt == "zstd" and _zstd_module() is None:
        raise ArchiveError(f"cannot write {path!r} as zstd: {_ZSTD_MISSING}; or name it .tar.gz")
    return fmt


def detect_format(path: str) -> str:
    """ "gz" or "zstd", from the file's first bytes. Raises :class:`ArchiveError` for
    anything else (including zip and plain tar, which older cuforge versions wrote)."""
    from cuforge import _fs

    fd = _fs.open_regular(path)
    try:
        head = os.read(fd, 512)
    finally:
        os.close(fd)
    if head.startswith(_ZSTD_MAGIC):
        return "zstd"
    if head.startswith(b"\x1f\x8b"):
        return "gz"
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")) or (
        len(head) >= 262 and head[257:262] == b"ustar"
    ):
        raise ArchiveError(
            f"{path!r} is a zip or uncompressed tar file; cuforge cache archives are .tar.gz "
            "or .tar.zst: export it again with this cuforge version"
        )
    raise ArchiveError(f"{path!r} is not a cuforge cache archive (not a tar.gz or tar.zst file)")


# ---------------------------------------------------------------------- export
class _Writer:
    def __init__(self, path: str, fmt: str) -> None:
        import tarfile

        self._raw = open(path, "xb")  # noqa: SIM115 - closed in close(); a fresh temp name
        self._zstd = None
        try:
            if fmt == "zstd":
                module = _zstd_module()
                if module is None:
                    raise ArchiveError(f"cannot write {path!r} as zstd: {_ZSTD_MISSING}")
                self._zstd = module[0](self._raw)
                self._tar = tarfile.open(fileobj=self._zstd, mode="w|")
            else:
                self._tar = tarfile.open(fileobj=self._raw, mode="w|gz")
        except BaseException:
            self._raw.close()
            raise

    def add(self, name: str, data: bytes, mtime: float | None = None) -> None:
        import io
        import tarfile

        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mtime = int(mtime or time.time())
        info.mode = 0o600
        self._tar.addfile(info, io.BytesIO(data))

    def close(self) -> None:
        try:
            self._tar.close()
            if self._zstd is not None:
                self._zstd.close()
        finally:
            self._raw.close()


def _dumps(obj: Any) -> bytes:
    import json

    return json.dumps(obj, sort_keys=True, ensure_ascii=False).encode("utf-8")


class ExportResult:
    """What :func:`export_archive` wrote: ``entries`` exported, ``skipped`` (damaged or
    vanished meanwhile: damage is never exported), payload ``bytes``, the archive's
    ``file_bytes``, its ``format`` and ``path``."""

    __slots__ = ("path", "format", "entries", "skipped", "bytes", "file_bytes")

    def __init__(self, path: str, fmt: str) -> None:
        self.path, self.format = path, fmt
        self.entries = self.skipped = self.bytes = self.file_bytes = 0

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


def export_archive(
    store_or_root: DiskStore | str,
    path: str,
    fmt: str | None = None,
    *,
    select: Callable[[EntryInfo], bool] | None = None,
    progress: Callable[[int, int | None], Any] | None = None,
) -> ExportResult:
    """Write the entries ``select`` accepts (all by default, manifests included) to the
    archive ``path`` (written whole to a temp file, then renamed: never half an archive).
    ``fmt``: "gz" or "zstd" (see :func:`choose_format`). ``progress(done, total)`` is
    called after each entry. Raises :class:`ArchiveError` or ``OSError``."""
    from cuforge import _fs
    from cuforge._version import __version__
    from cuforge.key import SCHEMA_VERSION
    from cuforge.store.disk import DISK_FORMAT_VERSION

    store = _as_store(store_or_root)
    fmt = choose_format(path, fmt)
    infos = [i for i in store.iterate_index() if select is None or select(i)]
    result = ExportResult(os.path.abspath(path), fmt)
    tmp = _fs.temp_path(os.path.abspath(path))
    writer = _Writer(tmp, fmt)
    try:
        writer.add(
            HEADER_NAME,
            _dumps(
                {
                    "format": ARCHIVE_FORMAT,
                    "archive_version": ARCHIVE_VERSION,
                    "key_schema": SCHEMA_VERSION,
                    "disk_format_version": DISK_FORMAT_VERSION,
                    "cuforge_version": __version__,
                    "created": time.time(),
                    "entries": len(infos),
                }
            ),
        )
        import hashlib

        for done, info in enumerate(infos, 1):
            entry = store.peek(info.key)
            if progress is not None:
                progress(done, len(infos))
            if entry is None:
                result.skipped += 1  # damaged or removed meanwhile: never export damage
                continue
            meta = dict(entry.meta)
            meta.pop("size", None)
            created = meta.pop("created", None)
            meta.pop("last_used", None)
            payload = entry.payload
            record = {
                "key": entry.key,
                "kind": entry.kind,
                "size": len(payload),
                "sha256": hashlib.sha256(payload).hexdigest(),
                "created": created,
                "meta": meta,
            }
            writer.add(f"entries/{entry.key}.json", _dumps(record), created)
            writer.add(f"entries/{entry.key}.bin", payload, created)
            result.entries += 1
            result.bytes += len(payload)
        writer.add(END_NAME, _dumps({"entries": result.entries, "bytes": result.bytes}))
        writer.close()
        os.replace(tmp, path)
    except BaseException:
        try:
            writer.close()
        except Exception:  # noqa: BLE001 - the first error is the one to report
            pass
        _fs.unlink(tmp)
        raise
    result.file_bytes = os.path.getsize(path)
    return result


# ---------------------------------------------------------------------- import
class ImportResult:
    """What :func:`import_archive` did. ``header``: the archive's header; ``imported`` /
    ``bytes``: entries (payload bytes) stored; ``present``: entries already there (kept
    unless ``overwrite``); ``rejected``: ``[{"key", "reason"}]``; ``truncated``: the
    archive ended early or is damaged; ``warnings``: for people; ``ok``: nothing was
    rejected and the archive was whole."""

    __slots__ = (
        "path",
        "format",
        "header",
        "imported",
        "bytes",
        "present",
        "seen",
        "rejected",
        "truncated",
        "warnings",
    )

    def __init__(self, path: str, fmt: str) -> None:
        self.path, self.format = path, fmt
        self.header: dict[str, Any] = {}
        self.imported = self.bytes = self.present = self.seen = 0
        self.rejected: list[dict[str, str]] = []
        self.truncated = False
        self.warnings: list[str] = []

    @property
    def ok(self) -> bool:
        return not self.rejected and not self.truncated

    def as_dict(self) -> dict[str, Any]:
        doc = {name: getattr(self, name) for name in self.__slots__}
        doc["ok"] = self.ok
        return doc


def _open_stream(raw: BinaryIO, path: str, fmt: str):
    import tarfile

    if fmt == "zstd":
        module = _zstd_module()
        if module is None:
            raise ArchiveError(f"{path!r} is zstd-compressed but {_ZSTD_MISSING}")
        return tarfile.open(fileobj=module[1](raw), mode="r|")
    return tarfile.open(fileobj=raw, mode="r|gz")


def _guarded(it: Iterator[Any]) -> Iterator[Any]:
    """``it`` with any decoder's error turned into :class:`_Damaged`."""
    while True:
        try:
            item = next(it)
        except StopIteration:
            return
        except ArchiveError:
            raise
        except Exception as exc:  # noqa: BLE001 - tar, gzip, zlib and zstd errors all differ
            raise _Damaged(f"{type(exc).__name__}: {exc}") from None
        yield item


def _chunks(f: BinaryIO) -> Iterator[bytes]:
    while True:
        chunk = f.read(_CHUNK)
        if not chunk:
            return
        yield chunk


def _read_small(f: BinaryIO | None, size: int, name: str) -> bytes | None:
    """A JSON member's bytes, or None when it is over :data:`MAX_RECORD_BYTES`."""
    if f is None or size > MAX_RECORD_BYTES:
        return None
    return b"".join(_chunks(f))


def _check_header(header: dict, path: str) -> list[str]:
    """Refuse an archive this cuforge cannot use; return warnings for one it can."""
    from cuforge._version import __version__
    from cuforge.key import SCHEMA_VERSION

    if header.get("format") != ARCHIVE_FORMAT:
        raise ArchiveError(f"{path!r} is not a cuforge cache archive (its header names no format)")
    version = header.get("archive_version")
    if version != ARCHIVE_VERSION:
        newer = isinstance(version, int) and version > ARCHIVE_VERSION
        raise ArchiveError(
            f"{path!r} is a cache archive of format version {version}, but this cuforge "
            f"({__version__}) reads version {ARCHIVE_VERSION}: "
            + (
                "upgrade cuforge to import it"
                if newer
                else f"export it again with cuforge {__version__}"
            )
        )
    schema = header.get("key_schema")
    if schema != SCHEMA_VERSION:
        raise ArchiveError(
            f"{path!r} holds entries made with cache-key schema {schema}, but this cuforge "
            f"({__version__}) uses key schema {SCHEMA_VERSION}: none of them could ever be a "
            f"hit. Rebuild the cache with cuforge {header.get('cuforge_version', '?')} on this "
            "side, or export it again with this cuforge version"
        )
    warnings = []
    if header.get("cuforge_version") != __version__:
        warnings.append(
            f"the archive was made by cuforge {header.get('cuforge_version')}, this is "
            f"{__version__}: cache keys include cuforge's version, so its kernel entries hit "
            "only for that version"
        )
    return warnings


def _parse_header(name: str, data: bytes | None, path: str) -> dict:
    import json

    if name != HEADER_NAME:
        raise ArchiveError(
            f"{path!r} is not a cuforge cache archive (first member {name!r}, "
            f"expected {HEADER_NAME})"
        )
    try:
        header = json.loads(data) if data is not None else None
    except ValueError:
        raise ArchiveError(f"{path!r}: its header is not valid JSON") from None
    if not isinstance(header, dict):
        raise ArchiveError(f"{path!r}: its header is not a JSON object")
    return header


def _record_problem(record: Any, key: str) -> str | None:
    """Why an archived entry's record must be rejected, or None when it is sound."""
    from cuforge.store.schema import entry_problem

    if not isinstance(record, dict):
        return "its record is not a JSON object"
    rkey = record.get("key")
    if not (
        isinstance(rkey, str)
        and 8 <= len(rkey) <= 128
        and all(c in "0123456789abcdef" for c in rkey)
    ):
        return f"bad key {rkey!r}"
    if rkey != key:
        return f"its record names key {rkey!r}"
    why = entry_problem(record.get("kind"), record.get("meta"))
    if why is not None:
        return why
    size = record.get("size")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        return f"bad size {size!r}"
    if not isinstance(record.get("sha256"), str):
        return "no SHA-256"
    created = record.get("created")
    if created is not None and not isinstance(created, (int, float)):
        return f"bad created time {created!r}"
    return None


def import_archive(
    store_or_root: DiskStore | str,
    path: str,
    *,
    overwrite: bool = False,
    progress: Callable[[int, int | None], Any] | None = None,
    max_member_bytes: int = MAX_MEMBER_BYTES,
) -> ImportResult:
    """Add the entries of the archive ``path`` to the disk cache, each checked first (see
    the module doc). ``overwrite``: replace entries already present. ``progress(done,
    total)`` is called after each entry. Raises :class:`ArchiveError` for an archive that
    cannot be used at all, ``FileNotFoundError`` when there is none, ``OSError`` when the
    cache cannot be written; damage inside a usable archive is reported in the result."""
    import json

    if not os.path.isfile(path):
        raise FileNotFoundError(f"no such archive: {path}")
    fmt = detect_format(path)
    store = _as_store(store_or_root)
    result = ImportResult(os.path.abspath(path), fmt)
    records: dict[str, Any] = {}  # key -> its record, until its payload comes
    header: dict | None = None
    end: Any = None
    damaged: str | None = None
    total: int | None = None
    with open(path, "rb") as raw:
        try:
            tar = _open_stream(raw, path, fmt)
            for member in _guarded(iter(tar)):
                if not member.isfile():
                    continue
                name = member.name
                f = _guarded_file(tar, member)
                if header is None:
                    header = _parse_header(name, _read_small(f, member.size, name), path)
                    result.warnings = _check_header(header, path)
                    result.header = header
                    count = header.get("entries")
                    total = count if isinstance(count, int) else None
                elif name == END_NAME:
                    data = _read_small(f, member.size, name)
                    try:
                        end = json.loads(data) if data is not None else {}
                    except ValueError:
                        end = {}
                elif name.startswith("entries/") and name.endswith(".json"):
                    key = name[len("entries/") : -len(".json")]
                    data = _read_small(f, member.size, name)
                    try:
                        records[key] = json.loads(data) if data is not None else None
                    except ValueError:
                        records[key] = None
                elif name.startswith("entries/") and name.endswith(".bin"):
                    key = name[len("entries/") : -len(".bin")]
                    result.seen += 1
                    _import_one(store, result, key, records, member, f, overwrite, max_member_bytes)
                    if progress is not None:
                        progress(result.seen, total)
        except _Damaged as exc:
            if header is None:
                raise ArchiveError(f"{path!r} cannot be read ({exc})") from None
            damaged = str(exc)
    if header is None:
        raise ArchiveError(f"{path!r} is empty or not a cuforge cache archive")
    result.rejected += [{"key": key, "reason": "its payload is missing"} for key in records]
    expected = header.get("entries")
    if damaged is not None:
        result.truncated = True
        result.warnings.append(
            f"the archive is damaged after {result.seen} of {expected} entries ({damaged}); "
            "the entries before that were imported"
        )
    elif not isinstance(end, dict):
        result.truncated = True
        result.warnings.append(
            f"the archive is truncated: {result.seen} of {expected} entries were in it"
        )
    elif end.get("entries") != result.seen:
        result.truncated = True
        result.warnings.append(
            f"the archive's end record counts {end.get('entries')} entries, it held {result.seen}"
        )
    return result


class _GuardedFile:
    """A member's file object whose read errors become :class:`_Damaged`."""

    __slots__ = ("_f",)

    def __init__(self, f: BinaryIO) -> None:
        self._f = f

    def read(self, n: int = -1) -> bytes:
        try:
            return self._f.read(n)
        except Exception as exc:  # noqa: BLE001 - tar, gzip, zlib and zstd errors all differ
            raise _Damaged(f"{type(exc).__name__}: {exc}") from None


def _guarded_file(tar: Any, member: Any) -> _GuardedFile | None:
    try:
        f = tar.extractfile(member)
    except Exception as exc:  # noqa: BLE001 - tar, gzip, zlib and zstd errors all differ
        raise _Damaged(f"{type(exc).__name__}: {exc}") from None
    return None if f is None else _GuardedFile(f)


def _import_one(
    store: DiskStore,
    result: ImportResult,
    key: str,
    records: dict[str, Any],
    member: Any,
    f: _GuardedFile | None,
    overwrite: bool,
    max_member_bytes: int,
) -> None:
    """Check and store one entry whose payload member is ``member`` (read from ``f``)."""
    if key not in records:
        result.rejected.append({"key": key, "reason": "no record precedes it"})
        return
    record = records.pop(key)
    why = _record_problem(record, key)
    if why is None and member.size > max_member_bytes:
        why = (
            f"its payload is {member.size} bytes, over the {max_member_bytes}-byte cap "
            "(raise it with --max-member-bytes if the archive is trusted)"
        )
    if why is None and member.size != record["size"]:
        why = f"size {member.size} != recorded {record['size']} (truncated?)"
    if why is not None:
        result.rejected.append({"key": key, "reason": why})
        return
    if not overwrite and store.has(key):
        result.present += 1
        return
    why = store.put_stream(
        key,
        record["kind"],
        record["meta"],
        record["size"],
        _chunks(f) if f is not None else iter(()),
        sha256=record["sha256"],
        created=record.get("created"),
    )
    if why is not None:
        result.rejected.append({"key": key, "reason": why})
        return
    result.imported += 1
    result.bytes += record["size"]
