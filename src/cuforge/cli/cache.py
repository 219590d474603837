"""``cuforge cache``: look into, trim, check and move the disk cache.

=========================== ===========================================================
``stats``                   entries, bytes, hits/misses per tier, compile time saved, top
``ls``                      entries, filtered by name, arch, kind and age
``show KEY``                one entry: metadata, compiler log, lowered names, key fields
``explain``                 the last cache misses and why they missed
``clear``                   remove every entry (asks, or ``--yes``)
``prune``                   ``--max-bytes 1G --older-than 30d``
``verify [--repair]``       re-check every checksum; ``--repair`` removes damaged entries
``export FILE``             a portable, versioned archive of entries
``import FILE``             add an archive's entries, each verified first
=========================== ===========================================================

Everything reads the index the disk tier keeps (no stat of every entry for ``stats``),
opens entries with ``peek`` (no "last used" refresh, no hit counted) and never counts its
own reads in the telemetry.

The archive (:data:`ARCHIVE_VERSION` 1) is a tar (zstd- or gzip-compressed) or a zip::

    cuforge-archive.json      {"format": "cuforge-cache-archive", "archive_version": 1,
                               "key_schema", "disk_format_version", "cuforge_version",
                               "created", "entries": <count>}
    entries/<key>.json        {"key", "kind", "size", "sha256", "created", "meta"}
    entries/<key>.bin         the payload
    ...
    cuforge-archive-end.json  {"entries": <count>, "bytes": <payload bytes>}

The header comes first, so ``import`` refuses a mismatched version before reading any
entry; every entry is checked against its own size and SHA-256 before it is stored; a
missing end record means a truncated archive.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

from cuforge.cli import output

__all__ = ["add_parser", "ARCHIVE_VERSION", "ARCHIVE_FORMAT"]

ARCHIVE_FORMAT = "cuforge-cache-archive"
ARCHIVE_VERSION = 1
_HEADER_NAME = "cuforge-archive.json"
_END_NAME = "cuforge-archive-end.json"
_KINDS = ("kernel", "manifest", "object", "module")
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def _store():
    from cuforge.config import settings
    from cuforge.store.disk import DiskStore

    st = settings()
    # telemetry=False: the CLI's own reads and writes are not cache traffic.
    return DiskStore(st.cache_dir, st.cache_max_bytes, telemetry=False)


def _with_progress(fn, bar: output.Progress, **kwargs):
    """Call a store method, handing it the progress bar when it accepts one."""
    import inspect

    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}
    if "progress" in params:
        kwargs["progress"] = bar
    return fn(**kwargs)


# -- filters --------------------------------------------------------------------------


def _add_filters(p: argparse.ArgumentParser, *, hide_manifests: bool) -> None:
    """The entry filters ``ls`` and ``export`` share. ``hide_manifests``: without
    ``--kind``, leave out the direct-mode manifests (``ls``; ``export`` keeps them)."""
    p.set_defaults(hide_manifests=hide_manifests)
    p.add_argument("--name", help="entries whose name contains this (or matches a glob: '*.cu')")
    p.add_argument("--arch", help="entries built for this arch (sm_90, 9.0 or 90)")
    p.add_argument(
        "--kind",
        choices=_KINDS + ("all",),
        default=None,
        help="entry kind"
        + (" (default: all but manifest, the direct-mode lookups)" if hide_manifests else ""),
    )
    p.add_argument("--older-than", metavar="AGE", help="last used more than AGE ago (30d, 12h)")
    p.add_argument("--newer-than", metavar="AGE", help="last used less than AGE ago")


def _matcher(args: argparse.Namespace):
    import fnmatch

    from cuforge.config import normalize_arch

    arch = normalize_arch(args.arch) if args.arch else None
    kind = args.kind
    hide_manifests = args.hide_manifests and kind is None
    older = output.parse_age(args.older_than) if args.older_than else None
    newer = output.parse_age(args.newer_than) if args.newer_than else None
    name = args.name
    glob = name is not None and any(c in name for c in "*?[")
    now = time.time()

    def match(info) -> bool:
        if kind and kind != "all":
            if info.kind != kind:
                return False
        elif hide_manifests and info.kind == "manifest":
            return False
        meta = info.meta or {}
        if name is not None:
            entry_name = str(meta.get("name") or "")
            if not (fnmatch.fnmatch(entry_name, name) if glob else name in entry_name):
                return False
        if arch is not None:
            entry_arch = meta.get("arch") or ""
            if isinstance(entry_arch, (list, tuple)):
                entry_arch = " ".join(str(a) for a in entry_arch)
            # one arch, or several ("sm_80 sm_90") for a fatbin
            if arch not in str(entry_arch).replace(",", " ").split():
                return False
        age = now - (info.last_used or 0)
        if older is not None and age <= older:
            return False
        return not (newer is not None and age >= newer)

    return match


def _arch_text(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value) if value else "-"


# -- stats ----------------------------------------------------------------------------


def run_stats(args: argparse.Namespace) -> int:
    from cuforge.store import telemetry

    store = _store()
    stats = store.stats()
    summ = telemetry.summary(store.root, top=args.top)
    kinds = stats.extra.get("kinds", {})
    doc = {
        "command": "cache stats",
        "cache_dir": store.root,
        "format_version": stats.extra.get("format_version"),
        "entries": stats.entries,
        "bytes": stats.bytes,
        "max_bytes": store.max_bytes,
        "kinds": kinds,
        "tiers": summ.get("tiers", {}),
        "seconds_saved": summ.get("seconds_saved", 0.0),
        "top": summ.get("top", []),
        "telemetry": {
            "enabled": summ.get("enabled", True),
            "since": summ.get("since"),
            "file": summ.get("file"),
            "file_bytes": summ.get("file_bytes", 0),
        },
    }
    if args.json:
        output.emit_json(doc)
        return 0
    cap = store.max_bytes
    share = f" ({100 * stats.bytes / cap:.1f}% of {output.human_bytes(cap)})" if cap > 0 else ""
    by_kind = ", ".join(
        f"{k} {v['entries']}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]["entries"])
    )
    print(f"cache dir   {store.root}")
    print(f"entries     {stats.entries}" + (f" ({by_kind})" if by_kind else ""))
    print(f"size        {output.human_bytes(stats.bytes)}{share}")
    print(f"time saved  {output.human_seconds(doc['seconds_saved'])} of compiling")
    if not doc["telemetry"]["enabled"]:
        print("telemetry   off (CUFORGE_TELEMETRY=0): no hit/miss counts are recorded")
    elif doc["telemetry"]["since"]:
        print(f"counting    since {output.human_time(doc['telemetry']['since'])}")
    tiers = doc["tiers"]
    if tiers:
        rows = []
        for tier in sorted(
            tiers,
            key=lambda t: (
                ("memory", "disk", "remote").index(t) if t in ("memory", "disk", "remote") else 9
            ),
        ):
            t = tiers[tier]
            lookups = t.get("hits", 0) + t.get("misses", 0)
            rate = f"{100 * t.get('hits', 0) / lookups:.0f}%" if lookups else "-"
            rows.append(
                (
                    tier,
                    t.get("hits", 0),
                    t.get("misses", 0),
                    rate,
                    t.get("puts", 0),
                    t.get("evictions", 0),
                    t.get("corrupt", 0),
                    output.human_seconds(t.get("seconds_saved", 0.0)),
                )
            )
        print()
        output.table(
            ("tier", "hits", "misses", "hit rate", "puts", "evicted", "corrupt", "saved"),
            rows,
            right=(1, 2, 3, 4, 5, 6, 7),
        )
    if doc["top"]:
        print()
        output.table(
            ("top by time saved", "kind", "hits", "builds", "saved"),
            [
                (
                    t["name"],
                    t["kind"],
                    t["hits"],
                    t["puts"],
                    output.human_seconds(t["seconds_saved"]),
                )
                for t in doc["top"]
            ],
            right=(2, 3, 4),
        )
    return 0


# -- ls -------------------------------------------------------------------------------


_SORTS = {
    "last-used": lambda i: -(i.last_used or 0),
    "created": lambda i: -(i.created or 0),
    "size": lambda i: -i.size,
    "name": lambda i: str((i.meta or {}).get("name") or ""),
    "kind": lambda i: i.kind,
}


def run_ls(args: argparse.Namespace) -> int:
    store = _store()
    match = _matcher(args)
    items = [i for i in store.iterate_index() if match(i)]
    items.sort(key=_SORTS[args.sort])
    total = len(items)
    if args.limit and args.limit > 0:
        items = items[: args.limit]
    if args.json:
        output.emit_json(
            {
                "command": "cache ls",
                "cache_dir": store.root,
                "matched": total,
                "entries": [
                    {
                        "key": i.key,
                        "kind": i.kind,
                        "name": (i.meta or {}).get("name"),
                        "arch": (i.meta or {}).get("arch"),
                        "size": i.size,
                        "created": i.created,
                        "last_used": i.last_used,
                    }
                    for i in items
                ],
            }
        )
        return 0
    if not items:
        print("no entries match" if store.total_bytes() else "the cache is empty")
        return 0
    now = time.time()
    output.table(
        ("key", "kind", "name", "arch", "size", "last used"),
        [
            (
                i.key if args.full_keys else i.key[:16],
                i.kind,
                (i.meta or {}).get("name") or "-",
                _arch_text((i.meta or {}).get("arch")),
                output.human_bytes(i.size),
                output.human_age(i.last_used, now),
            )
            for i in items
        ],
        right=(4,),
    )
    if total > len(items):
        print(f"... {total - len(items)} more (use --limit 0 for all)")
    return 0


# -- show -----------------------------------------------------------------------------


def _resolve_key(store, prefix: str) -> str:
    prefix = prefix.strip().lower()
    if not prefix:
        raise ValueError("give a key or a unique key prefix (see `cuforge cache ls`)")
    keys = store.index()
    if prefix in keys:
        return prefix
    found = [k for k in keys if k.startswith(prefix)]
    if not found and os.path.exists(store.path_for(prefix)):
        return prefix  # present but not indexed yet
    if not found:
        raise LookupError(f"no cache entry with key {prefix!r} (see `cuforge cache ls`)")
    if len(found) > 1:
        raise LookupError(
            f"key prefix {prefix!r} is ambiguous: {len(found)} entries match "
            f"({', '.join(sorted(found)[:4])}...); give more characters"
        )
    return found[0]


def run_show(args: argparse.Namespace) -> int:
    store = _store()
    try:
        key = _resolve_key(store, args.key)
    except LookupError as exc:
        output.error(str(exc))
        return 1
    entry = store.peek(key)
    path = store.path_for(key)
    if entry is None:
        output.error(
            f"entry {key} is damaged or vanished ({path}); `cuforge cache verify --repair` "
            "removes damaged entries"
        )
        return 1
    meta = dict(entry.meta)
    size = meta.pop("size", len(entry.payload))
    created = meta.pop("created", None)
    last_used = meta.pop("last_used", None)
    if args.payload:
        with open(args.payload, "wb") as f:
            f.write(entry.payload)
    if args.json:
        output.emit_json(
            {
                "command": "cache show",
                "key": key,
                "kind": entry.kind,
                "path": path,
                "size": size,
                "file_size": _file_size(path),
                "created": created,
                "last_used": last_used,
                "meta": meta,
            }
        )
        return 0
    rows = [
        ("key", key),
        ("kind", entry.kind),
        ("name", meta.get("name", "-")),
        ("arch", _arch_text(meta.get("arch"))),
        ("backend", meta.get("backend", "-")),
        ("output", meta.get("output", "-")),
        ("size", f"{output.human_bytes(size)} ({size} bytes)"),
        ("compile time", output.human_seconds(meta.get("compile_seconds"))),
        ("created", output.human_time(created)),
        ("last used", f"{output.human_time(last_used)} ({output.human_age(last_used)})"),
        ("path", path),
    ]
    width = max(len(r[0]) for r in rows)
    for label, value in rows:
        print(f"{label.ljust(width)}  {value}")
    known = {
        "name",
        "arch",
        "backend",
        "output",
        "compile_seconds",
        "lowered_names",
        "log",
        "key_fields",
    }
    for label in sorted(k for k in meta if k not in known):
        print(f"{label.ljust(width)}  {_short_json(meta[label])}")
    lowered = meta.get("lowered_names") or {}
    if lowered:
        print("\nlowered names:")
        for expr, mangled in lowered.items():
            print(f"  {expr}  ->  {mangled}")
    fields = meta.get("key_fields") or {}
    if fields:
        print("\nkey fields:")
        for label, value in fields.items():
            print(f"  {label}: {_short_json(value, 400)}")
    log = (meta.get("log") or "").strip()
    print("\ncompiler log:" + ("" if log else " (empty)"))
    for line in log.splitlines():
        print(f"  {line}")
    if args.payload:
        print(f"\npayload written to {args.payload}")
    return 0


def _short_json(value: Any, limit: int = 200) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _file_size(path: str) -> int | None:
    try:
        return os.stat(path).st_size
    except OSError:
        return None


# -- explain --------------------------------------------------------------------------


def run_explain(args: argparse.Namespace) -> int:
    from cuforge.config import settings
    from cuforge.explain import recent_misses

    root = settings().cache_dir
    misses = recent_misses(root, limit=args.limit)
    if args.name:
        misses = [m for m in misses if args.name in str(m.get("name", ""))]
    if args.json:
        output.emit_json({"command": "cache explain", "cache_dir": root, "misses": misses})
        return 0
    if not misses:
        print(
            "no explained misses recorded yet (every compile miss is recorded with its reasons; "
            "CUFORGE_EXPLAIN=1 also prints them as they happen)"
        )
        return 0
    for m in misses:
        reasons = m.get("reasons") or ["first compile of this name (nothing to compare with)"]
        print(
            f"{output.human_time(m.get('time'))}  {m.get('name', '?')}  "
            f"{str(m.get('key', ''))[:16]}"
        )
        for r in reasons:
            print(f"    {r}")
    return 0


# -- clear / prune / verify -----------------------------------------------------------


def run_clear(args: argparse.Namespace) -> int:
    import shutil

    store = _store()
    stats = store.stats()
    what = f"{stats.entries} entries ({output.human_bytes(stats.bytes)}) from {store.root}"
    if not args.yes:
        if not sys.stdin.isatty():
            output.error(f"refusing to remove {what} without confirmation: pass --yes")
            return 1
        answer = input(f"Remove {what}? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            print("nothing removed")
            return 1
    removed = store.clear()
    extra = []
    if args.all:
        for sub in ("telemetry", "explain", "toolchain.json"):
            path = os.path.join(store.root, sub)
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
                extra.append(sub)
            elif os.path.exists(path):
                try:
                    os.unlink(path)
                    extra.append(sub)
                except OSError:
                    pass
    if args.json:
        output.emit_json(
            {"command": "cache clear", "removed": removed, "bytes": stats.bytes, "also": extra}
        )
    else:
        print(f"removed {removed} entries ({output.human_bytes(stats.bytes)}) from {store.root}")
        if extra:
            print(f"also removed: {', '.join(extra)}")
    return 0


def run_prune(args: argparse.Namespace) -> int:
    from cuforge.config import parse_size

    store = _store()
    max_bytes = parse_size(args.max_bytes) if args.max_bytes is not None else None
    older = output.parse_age(args.older_than) if args.older_than else None
    if max_bytes is None and older is None:
        max_bytes = store.max_bytes  # trim to the configured cap
    before = store.stats()
    with output.progress("pruning", enabled=not args.json) as bar:
        removed, freed = _with_progress(store.prune, bar, max_bytes=max_bytes, older_than=older)
    after = store.stats()
    doc = {
        "command": "cache prune",
        "max_bytes": max_bytes,
        "older_than_seconds": older,
        "removed": removed,
        "freed_bytes": freed,
        "entries_before": before.entries,
        "bytes_before": before.bytes,
        "entries": after.entries,
        "bytes": after.bytes,
    }
    if args.json:
        output.emit_json(doc)
    else:
        limits = []
        if max_bytes is not None:
            limits.append(f"at most {output.human_bytes(max_bytes)}")
        if older is not None:
            limits.append(f"nothing unused for {args.older_than}")
        print(
            f"removed {removed} entries ({output.human_bytes(freed)}); the cache now holds "
            f"{after.entries} entries, {output.human_bytes(after.bytes)} ({' and '.join(limits)})"
        )
    return 0


def run_verify(args: argparse.Namespace) -> int:
    store = _store()
    label = "verifying (quick)" if args.quick else "verifying checksums"
    with output.progress(label, enabled=not args.json) as bar:
        report = _with_progress(store.verify, bar, repair=args.repair, quick=args.quick)
    corrupt = list(report.corrupt)
    remaining = len(corrupt) - (report.repaired if args.repair else 0)
    if args.json:
        doc = {"command": "cache verify", "quick": args.quick, "repair": args.repair}
        doc.update(report.as_dict())
        doc["ok"] = remaining == 0
        output.emit_json(doc)
    else:
        print(
            f"checked {report.checked} entries ({output.human_bytes(report.bytes)})"
            + (" (quick: headers and sizes, not checksums)" if args.quick else "")
        )
        if corrupt:
            print(f"{len(corrupt)} damaged:")
            for key in corrupt[:50]:
                print(f"  {key}")
            if len(corrupt) > 50:
                print(f"  ... {len(corrupt) - 50} more")
            if args.repair:
                print(f"removed {report.repaired} damaged entries")
            else:
                print(
                    "damaged entries are never served (they miss and are rebuilt); "
                    "`cuforge cache verify --repair` removes them now"
                )
        else:
            print("no damaged entries")
        if getattr(report, "index_drift", 0):
            print(
                f"index: {report.index_drift} entries out of date"
                + (" (rebuilt)" if args.repair else " (--repair rebuilds it)")
            )
    return 1 if remaining else 0


# -- export / import ------------------------------------------------------------------


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


def _choose_format(path: str, requested: str | None) -> str:
    if requested:
        fmt = requested
    else:
        lower = path.lower()
        if lower.endswith((".tar.zst", ".tzst", ".zst")):
            fmt = "zstd"
        elif lower.endswith((".tar.gz", ".tgz", ".gz")):
            fmt = "gz"
        elif lower.endswith(".zip"):
            fmt = "zip"
        elif lower.endswith(".tar"):
            fmt = "tar"
        else:
            fmt = "zstd" if _zstd_module() else "gz"
    if fmt == "zstd" and _zstd_module() is None:
        raise ValueError(
            f"cannot write {path!r} as zstd: the `zstandard` module is not installed "
            "(pip install zstandard), or name the file .tar.gz or .zip"
        )
    return fmt


class _ArchiveWriter:
    def __init__(self, path: str, fmt: str) -> None:
        import tarfile
        import zipfile

        self.fmt = fmt
        self._raw = open(path, "wb")  # noqa: SIM115 - closed in close()
        self._zstd = None
        self._zip = None
        self._tar = None
        if fmt == "zip":
            self._zip = zipfile.ZipFile(self._raw, "w", compression=zipfile.ZIP_DEFLATED)
        elif fmt == "zstd":
            compress, _ = _zstd_module()  # type: ignore[misc]
            self._zstd = compress(self._raw)
            self._tar = tarfile.open(fileobj=self._zstd, mode="w|")
        elif fmt == "gz":
            self._tar = tarfile.open(fileobj=self._raw, mode="w|gz")
        else:
            self._tar = tarfile.open(fileobj=self._raw, mode="w|")

    def add(self, name: str, data: bytes, mtime: float | None = None) -> None:
        if self._zip is not None:
            self._zip.writestr(name, data)
            return
        import tarfile

        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mtime = int(mtime or time.time())
        info.mode = 0o600
        self._tar.addfile(info, io.BytesIO(data))

    def close(self) -> None:
        if self._zip is not None:
            self._zip.close()
        if self._tar is not None:
            self._tar.close()
        if self._zstd is not None:
            self._zstd.close()
        self._raw.close()


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False).encode("utf-8")


def run_export(args: argparse.Namespace) -> int:
    from cuforge._version import __version__
    from cuforge.key import SCHEMA_VERSION
    from cuforge.store.disk import DISK_FORMAT_VERSION

    store = _store()
    fmt = _choose_format(args.file, args.format)
    match = _matcher(args)
    infos = [i for i in store.iterate_index() if match(i)]
    tmp = f"{args.file}.tmp.{os.getpid()}"
    writer = _ArchiveWriter(tmp, fmt)
    exported = skipped = 0
    total_bytes = 0
    try:
        writer.add(
            _HEADER_NAME,
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
        with output.progress("exporting", total=len(infos), enabled=not args.json) as bar:
            for info in infos:
                entry = store.peek(info.key)
                bar.advance()
                if entry is None:
                    skipped += 1  # damaged or removed meanwhile: never export damage
                    continue
                meta = dict(entry.meta)
                meta.pop("size", None)
                created = meta.pop("created", None)
                meta.pop("last_used", None)
                payload = bytes(entry.payload)
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
                exported += 1
                total_bytes += len(payload)
        writer.add(_END_NAME, _dumps({"entries": exported, "bytes": total_bytes}))
        writer.close()
        os.replace(tmp, args.file)
    except BaseException:
        try:
            writer.close()
        except Exception:  # noqa: BLE001 - the first error is the one to report
            pass
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    size = os.path.getsize(args.file)
    if args.json:
        output.emit_json(
            {
                "command": "cache export",
                "file": os.path.abspath(args.file),
                "format": fmt,
                "archive_version": ARCHIVE_VERSION,
                "entries": exported,
                "skipped_damaged": skipped,
                "bytes": total_bytes,
                "file_bytes": size,
            }
        )
    else:
        print(
            f"exported {exported} entries ({output.human_bytes(total_bytes)}) to {args.file} "
            f"[{fmt}, {output.human_bytes(size)}]"
            + (f"; skipped {skipped} damaged" if skipped else "")
        )
    return 0


def _detect_format(path: str) -> str:
    with open(path, "rb") as f:
        head = f.read(512)
    if head.startswith(_ZSTD_MAGIC):
        return "zstd"
    if head.startswith(b"\x1f\x8b"):
        return "gz"
    if head.startswith(b"PK\x03\x04") or head.startswith(b"PK\x05\x06"):
        return "zip"
    if len(head) >= 262 and head[257:262] == b"ustar":
        return "tar"
    raise ValueError(
        f"{path!r} is not a cuforge cache archive (not a tar, tar.gz, tar.zst or zip file)"
    )


def _members(path: str, fmt: str) -> Iterator[tuple[str, bytes]]:
    """(name, data) of every member, in archive order, streaming."""
    import tarfile
    import zipfile

    if fmt == "zip":
        with zipfile.ZipFile(path) as z:
            for name in z.namelist():
                yield name, z.read(name)
        return
    with open(path, "rb") as raw:
        if fmt == "zstd":
            module = _zstd_module()
            if module is None:
                raise ValueError(
                    f"{path!r} is zstd-compressed but the `zstandard` module is not installed: "
                    "pip install zstandard (or export again as .tar.gz or .zip)"
                )
            stream = module[1](raw)
            mode = "r|"
        else:
            stream = raw
            mode = "r|gz" if fmt == "gz" else "r|"
        with tarfile.open(fileobj=stream, mode=mode) as tar:
            for member in tar:
                if not member.isfile():
                    continue
                f = tar.extractfile(member)
                yield member.name, f.read() if f is not None else b""


def _check_header(header: dict, path: str) -> list[str]:
    """Refuse an archive this cuforge cannot use; return warnings for one it can."""
    from cuforge._version import __version__
    from cuforge.key import SCHEMA_VERSION

    if header.get("format") != ARCHIVE_FORMAT:
        raise ValueError(f"{path!r} is not a cuforge cache archive (its header names no format)")
    version = header.get("archive_version")
    if version != ARCHIVE_VERSION:
        newer = isinstance(version, int) and version > ARCHIVE_VERSION
        raise ValueError(
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
        raise ValueError(
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


def _check_record(record: Any, payload: bytes) -> str | None:
    """Why an archived entry must be rejected, or None when it is sound."""
    if not isinstance(record, dict):
        return "its record is not a JSON object"
    key = record.get("key")
    if not (
        isinstance(key, str) and 8 <= len(key) <= 128 and all(c in "0123456789abcdef" for c in key)
    ):
        return f"bad key {key!r}"
    if record.get("kind") not in _KINDS:
        return f"unknown kind {record.get('kind')!r}"
    if not isinstance(record.get("meta"), dict):
        return "its metadata is not a JSON object"
    if record.get("size") != len(payload):
        return f"size {len(payload)} != recorded {record.get('size')} (truncated?)"
    if hashlib.sha256(payload).hexdigest() != record.get("sha256"):
        return "SHA-256 mismatch (damaged)"
    return None


class _Damaged(Exception):
    """The archive could not be read to its end (truncated or corrupt compression)."""


def _read_members(path: str, fmt: str) -> Iterator[tuple[str, bytes]]:
    """:func:`_members`, with any decoder's error turned into :class:`_Damaged`."""
    members = _members(path, fmt)
    while True:
        try:
            item = next(members)
        except StopIteration:
            return
        except ValueError:
            raise  # ours: a clear message already (e.g. zstandard missing)
        except Exception as exc:  # noqa: BLE001 - tar, gzip, zlib, zip and zstd all differ
            raise _Damaged(f"{type(exc).__name__}: {exc}") from None
        yield item


class _Importer:
    """Stores an archive's entries one by one, each checked first."""

    def __init__(self, store, overwrite: bool) -> None:
        self.store = store
        self.overwrite = overwrite
        self.existing = store.index()
        self.imported = self.present = self.bytes = self.seen = 0
        self.rejected: list[dict[str, str]] = []
        self.records: dict[str, Any] = {}  # key -> its record, until its payload comes

    def record(self, key: str, data: bytes) -> None:
        try:
            self.records[key] = json.loads(data)
        except ValueError:
            self.records[key] = None

    def payload(self, key: str, data: bytes) -> None:
        from cuforge.store.base import Entry

        self.seen += 1
        record = self.records.pop(key, None)
        why = _check_record(record, data) if record is not None else "no record precedes it"
        if why is None and record["key"] != key:
            why = f"its record names key {record['key']!r}"
        if why is not None:
            self.rejected.append({"key": key, "reason": why})
            return
        if key in self.existing and not self.overwrite and self.store.peek(key) is not None:
            self.present += 1
            return
        if not self.store.put(Entry(key, record["kind"], data, record["meta"])):
            reason = self.store.disabled_reason
            raise OSError(
                f"cannot write to the cache at {self.store.root}"
                + (f": {reason}" if reason else "")
            )
        self.imported += 1
        self.bytes += len(data)


def run_import(args: argparse.Namespace) -> int:
    path = args.file
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no such archive: {path}")
    fmt = _detect_format(path)
    importer = _Importer(_store(), args.overwrite)
    header: dict | None = None
    end: dict | None = None
    warnings: list[str] = []
    damaged = None
    with output.progress("importing", enabled=not args.json) as bar:
        try:
            for name, data in _read_members(path, fmt):
                if header is None:
                    header = _read_header(name, data, path)
                    warnings = _check_header(header, path)
                    bar.set_total(header.get("entries"))
                elif name == _END_NAME:
                    try:
                        end = json.loads(data)
                    except ValueError:
                        end = {}
                elif name.startswith("entries/") and name.endswith(".json"):
                    importer.record(name[len("entries/") : -len(".json")], data)
                elif name.startswith("entries/") and name.endswith(".bin"):
                    importer.payload(name[len("entries/") : -len(".bin")], data)
                    bar.advance()
        except _Damaged as exc:
            if header is None:
                raise ValueError(f"{path!r} cannot be read ({exc})") from None
            damaged = str(exc)
    if header is None:
        raise ValueError(f"{path!r} is empty or not a cuforge cache archive")
    rejected = importer.rejected + [
        {"key": key, "reason": "its payload is missing"} for key in importer.records
    ]
    truncated = damaged is not None or end is None or end.get("entries") != importer.seen
    if truncated:
        if damaged is not None:
            warnings.append(
                f"the archive is damaged after {importer.seen} of {header.get('entries')} "
                f"entries ({damaged}); the entries before that were imported"
            )
        elif end is None:
            warnings.append(
                f"the archive is truncated: {importer.seen} of {header.get('entries')} entries "
                "were in it"
            )
        else:
            warnings.append(
                f"the archive's end record counts {end.get('entries')} entries, it held "
                f"{importer.seen}"
            )
    ok = not rejected and not truncated
    if args.json:
        output.emit_json(
            {
                "command": "cache import",
                "file": os.path.abspath(path),
                "format": fmt,
                "archive": header,
                "ok": ok,
                "imported": importer.imported,
                "bytes": importer.bytes,
                "already_present": importer.present,
                "rejected": rejected,
                "truncated": truncated,
                "warnings": warnings,
            }
        )
    else:
        for w in warnings:
            output.warn(w)
        for r in rejected[:50]:
            output.error(f"rejected entry {r['key']}: {r['reason']}")
        print(
            f"imported {importer.imported} entries ({output.human_bytes(importer.bytes)}) into "
            f"{importer.store.root}; {importer.present} already present, "
            f"{len(rejected)} rejected"
        )
    return 0 if ok else 1


def _read_header(name: str, data: bytes, path: str) -> dict:
    if name != _HEADER_NAME:
        raise ValueError(
            f"{path!r} is not a cuforge cache archive (first member {name!r}, "
            f"expected {_HEADER_NAME})"
        )
    try:
        header = json.loads(data)
    except ValueError:
        raise ValueError(f"{path!r}: its header is not valid JSON") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path!r}: its header is not a JSON object")
    return header


# -- the parser -----------------------------------------------------------------------


def add_parser(subparsers: Any, common: argparse.ArgumentParser) -> None:
    cache = subparsers.add_parser(
        "cache",
        help="inspect, trim, verify, export and import the compile cache",
        description="The disk cache at CUFORGE_CACHE_DIR "
        "(default ~/.cache/cuforge). Every subcommand takes --json.",
    )
    sub = cache.add_subparsers(dest="cache_command", metavar="SUBCOMMAND")

    def _no_subcommand(args: argparse.Namespace) -> int:
        cache.print_help(sys.stderr)
        return 2

    cache.set_defaults(func=_no_subcommand)

    p = sub.add_parser("stats", parents=[common], help="sizes, hits and misses, time saved")
    p.add_argument("--top", type=int, default=10, help="how many top entries to list (10)")
    p.set_defaults(func=run_stats)

    p = sub.add_parser("ls", parents=[common], help="list entries")
    _add_filters(p, hide_manifests=True)
    p.add_argument("--sort", choices=sorted(_SORTS), default="last-used")
    p.add_argument("--limit", type=int, default=100, help="show at most N (0: all; default 100)")
    p.add_argument("--full-keys", action="store_true", help="print whole keys")
    p.set_defaults(func=run_ls)

    p = sub.add_parser("show", parents=[common], help="one entry's metadata, log and key fields")
    p.add_argument("key", help="a key or a unique prefix of one")
    p.add_argument("--payload", metavar="FILE", help="also write the entry's binary to FILE")
    p.set_defaults(func=run_show)

    p = sub.add_parser("explain", parents=[common], help="the last misses and why")
    p.add_argument("--limit", type=int, default=20)
    p.add_argument("--name", help="only misses of sources whose name contains this")
    p.set_defaults(func=run_explain)

    p = sub.add_parser("clear", parents=[common], help="remove every entry")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask")
    p.add_argument(
        "--all", action="store_true", help="also remove telemetry, miss history and probe memos"
    )
    p.set_defaults(func=run_clear)

    p = sub.add_parser(
        "prune",
        parents=[common],
        help="trim the cache (least recently used first)",
        description="Remove entries unused for --older-than, then least recently used ones "
        "until the cache holds at most --max-bytes. With neither, trim to "
        "CUFORGE_CACHE_MAX_BYTES.",
    )
    p.add_argument("--max-bytes", metavar="SIZE", help="keep at most this much (500M, 2G, bytes)")
    p.add_argument("--older-than", metavar="AGE", help="remove entries unused for AGE (30d, 12h)")
    p.set_defaults(func=run_prune)

    p = sub.add_parser("verify", parents=[common], help="re-check every entry's checksum")
    p.add_argument("--repair", action="store_true", help="remove damaged entries")
    p.add_argument("--quick", action="store_true", help="headers and sizes only (no checksums)")
    p.set_defaults(func=run_verify)

    p = sub.add_parser(
        "export",
        parents=[common],
        help="write entries to a portable archive",
        description="Write cache entries to a versioned archive: .tar.zst (when the "
        "`zstandard` module is installed), .tar.gz, .tar or .zip, chosen by the file name. "
        "Filters select a subset; by default everything, including the manifests that "
        "make direct-mode hits possible.",
    )
    p.add_argument("file")
    p.add_argument("--format", choices=("zstd", "gz", "zip", "tar"), help="override the file name")
    _add_filters(p, hide_manifests=False)
    p.set_defaults(func=run_export)

    p = sub.add_parser(
        "import",
        parents=[common],
        help="add an archive's entries (each verified first)",
        description="Add the entries of an archive made by `cuforge cache export`. The "
        "archive's format and key-schema versions must match this cuforge; every entry is "
        "checked against its size and SHA-256 before it is stored. Exit code 1 when any "
        "entry was rejected or the archive is truncated.",
    )
    p.add_argument("file")
    p.add_argument("--overwrite", action="store_true", help="replace entries already present")
    p.set_defaults(func=run_import)
