"""``cuforge cache``: look into, trim, check and move the disk cache.

=========================== ===========================================================
``stats``                   entries, bytes, hits per tier and misses, compile time saved, top
``ls``                      entries, filtered by name, arch, kind and age
``show KEY``                one entry: metadata, compiler log, lowered names, key fields
``explain``                 the last cache misses and why they missed
``report [--html FILE]``    what the cache saved per day and system, hit rate, misses
``clear``                   remove every entry (asks, or ``--yes``)
``prune``                   ``--max-bytes 1G --older-than 30d``
``verify [--repair]``       re-check every entry and the index; ``--repair`` fixes them
``export FILE``             a bundle of entries (.cfb), for another machine's cache
``import FILE``             add a bundle's entries, each verified first
``push [--remote URL]``     copy local entries to the remote caches (CUFORGE_REMOTE)
``pull [--remote URL]``     copy the entries a push listed from a remote into this cache
=========================== ===========================================================

A thin layer: the work is done by :class:`cuforge.store.disk.DiskStore` (index, verify,
prune, clear, key lookup, entry filters), :mod:`cuforge.aot.bundle` (export and import
as bundles, the format of :mod:`cuforge.store.bundle`) and :mod:`cuforge.store.remote.sync`
(push, pull and the push index); this module parses arguments and formats results.

Everything reads the index the disk tier keeps (no stat of every entry for ``stats``),
opens entries with ``peek`` (no "last used" refresh, no hit counted) and never counts its
own reads in the telemetry.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from cuforge.adapters.switch import system_of_kind
from cuforge.aot.bundle import export_bundle, import_bundle
from cuforge.base import _fs
from cuforge.base.config import parse_size, settings
from cuforge.base.layout import CacheLayout
from cuforge.cli import output, report_html
from cuforge.cli.common import cache_root
from cuforge.core.report import build_report, saved_per_day
from cuforge.keys.explain import recent_misses
from cuforge.keys.explain import shown as explain_shown
from cuforge.store import telemetry
from cuforge.store.base import ENTRY_KINDS
from cuforge.store.bundle import FORMAT_VERSION
from cuforge.store.disk import DiskStore, entry_filter
from cuforge.store.remote import sync
from cuforge.store.remote.base import redact

__all__ = ["add_parser"]

#: the days ``cache stats``'s sparkline covers
SPARK_DAYS = 14

# every entry kind, the integrations' included ("cccl": cuda.compute, "cute": CuTe DSL)
_KINDS = ENTRY_KINDS


def _store(args: argparse.Namespace | None = None):
    """The disk store of the cache dir the command operates on (``--cache-dir``, else
    CUFORGE_CACHE_DIR)."""

    st = settings()
    root = cache_root(args) if args is not None else st.cache_dir
    problem = CacheLayout(root).trust_problem()
    if problem is not None:
        output.warn(f"{problem} (until then, compiles do not read or write this cache)")
    # telemetry=False: the CLI's own reads and writes are not cache traffic.
    return DiskStore(root, st.cache_max_bytes, telemetry=False)


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

    return entry_filter(
        name=args.name,
        arch=args.arch,
        kind=args.kind,
        hide_manifests=args.hide_manifests,
        older_than=output.usage_value("--older-than", output.parse_age, args.older_than)
        if args.older_than
        else None,
        newer_than=output.usage_value("--newer-than", output.parse_age, args.newer_than)
        if args.newer_than
        else None,
    )


def _arch_text(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value) if value else "-"


# -- stats ----------------------------------------------------------------------------


def run_stats(args: argparse.Namespace) -> int:

    store = _store(args)
    stats = store.stats()
    summ = telemetry.summary(store.root, top=args.top)
    kinds = stats.extra.get("kinds", {})
    doc = {
        "command": "cache stats",
        "cache_dir": store.root,
        "format_version": stats.extra.get("format_version"),
        "entries": stats.entries,
        # the one size: the bytes of the entry files, each its st_size (what `ls -l` and
        # `cache ls` show), summed; the same in "kinds"
        "bytes": stats.extra.get("entry_bytes", stats.bytes),
        # what the cap holds (the entries and the torch extension dirs)
        "cap_bytes": stats.bytes,
        "max_bytes": store.max_bytes,
        "kinds": kinds,
        # what the cap does not hold, and all of the dir (as `du -sb` counts it)
        "outside": stats.extra.get("outside", {}),
        "other_bytes": stats.extra.get("other_bytes", 0),
        "dir_bytes": stats.extra.get("dir_bytes", stats.bytes),
        # why the index was out of date with the entry files on disk (rebuilt), or None
        "index_rebuilt": stats.extra.get("index_rebuilt"),
        "tiers": summ.get("tiers", {}),
        # the one definition of a hit (telemetry.tally): once, at the tier that answered;
        # lookups["hits"] is the sum of the tiers' hits, lookups["misses"] the lookups no
        # tier answered, hit_rate hits / (hits + misses)
        "lookups": summ.get("lookups", {"lookups": 0, "hits": 0, "misses": 0, "builds": 0}),
        "hit_rate": summ.get("hit_rate"),
        "served": summ.get("served", {}),
        "seconds_saved": summ.get("seconds_saved", 0.0),
        # compile seconds saved on each of the last 14 days, oldest first (today last)
        "saved_per_day": saved_per_day(store.root, SPARK_DAYS),
        "top": summ.get("top", []),
        "telemetry": {
            "enabled": summ.get("enabled", True),
            "since": summ.get("since"),
            "file": summ.get("file"),
            "file_bytes": summ.get("file_bytes", 0),
        },
        "remotes": _configured_remotes(),
    }
    if args.json:
        output.emit_json(doc)
        return 0
    cap = store.max_bytes
    size = doc["bytes"]
    by_kind = ", ".join(
        f"{k} {v['entries']}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]["entries"])
    )
    print(f"cache dir   {store.root}")
    if doc["index_rebuilt"]:
        print(f"index       was out of date ({doc['index_rebuilt']}): rebuilt from the entry files")
    print(f"entries     {stats.entries}" + (f" ({by_kind})" if by_kind else ""))
    print(
        f"size        {output.human_bytes(size)} ({size} bytes: the entry files' sizes, "
        "as `ls -l` and `cuforge cache ls` show them)"
    )
    if cap > 0:
        held = doc["cap_bytes"]
        print(
            f"cap         {output.human_bytes(held)} of {output.human_bytes(cap)} "
            f"({100 * held / cap:.1f}%; the entries and the torch extension dirs)"
        )
    parts = [f"entries {output.human_bytes(size)}"]
    for what, row in doc["outside"].items():
        if row["dirs"]:
            parts.append(f"{what} {output.human_bytes(row['bytes'])} ({row['dirs']})")
    parts.append(f"index, logs and memos {output.human_bytes(doc['other_bytes'])}")
    print(f"dir         {output.human_bytes(doc['dir_bytes'])}: {', '.join(parts)}")
    print(f"time saved  {output.human_seconds(doc['seconds_saved'])} of compiling")
    spark = doc["saved_per_day"]
    print(
        f"last {SPARK_DAYS}d    {report_html.sparkline(spark)} "
        f"{output.human_seconds(sum(spark))} saved (a block a day, today last)"
    )
    for r in doc["remotes"]:
        flags = ", ".join(
            f for f in ("read-only" if r["readonly"] else "", "signed" if r["signed"] else "") if f
        )
        print(f"remote      {r['url']}" + (f" ({flags})" if flags else ""))
    if not doc["telemetry"]["enabled"]:
        print("telemetry   off (CUFORGE_TELEMETRY=0): no hit/miss counts are recorded")
    elif doc["telemetry"]["since"]:
        print(f"counting    since {output.human_time(doc['telemetry']['since'])}")
    chain = doc["lookups"]
    if chain["lookups"] or chain["builds"]:
        # telemetry.tally's counts: a hit once, at the tier that answered; a miss: no tier
        rate = doc["hit_rate"]
        shown = f" ({100 * rate:.0f}%)" if rate is not None else ""
        print(
            f"lookups     {chain['lookups']}: {chain['hits']} hit{'s' * (chain['hits'] != 1)}"
            f"{shown}, {chain['misses']} miss{'es' * (chain['misses'] != 1)}; "
            f"{chain['builds']} build{'s' * (chain['builds'] != 1)}"
        )
    for kind, row in sorted(doc["served"].items()):
        # an integration's calls by the key that served them (cuforge.cute: before tracing,
        # by the traced module, or neither)
        print(
            f"served      {kind}: {row.get('pretrace', 0)} by the pre-trace key, "
            f"{row.get('ir', 0)} by the IR key (traced, not compiled), "
            f"{row.get('uncached', 0)} uncached"
        )
    tiers = doc["tiers"]
    if tiers:
        # the remote tiers count errors (timeouts, damaged values) and rejected entries
        # (unsigned, badly signed, another namespace): shown where a remote is in play
        with_errors = (
            bool(doc["remotes"])
            or any(t.startswith("remote") for t in tiers)
            or any(t.get("errors") or t.get("rejected") for t in tiers.values())
        )
        hits = chain["hits"]
        rows = []
        for tier in sorted(tiers, key=_tier_order):
            t = tiers[tier]
            row = [
                tier,
                t.get("hits", 0),
                f"{100 * t.get('hits', 0) / hits:.0f}%" if hits else "-",
                t.get("puts", 0),
                t.get("evictions", 0),
                t.get("corrupt", 0),
                output.human_seconds(t.get("seconds_saved", 0.0)),
            ]
            if with_errors:
                row[6:6] = [t.get("errors", 0), t.get("rejected", 0)]
            rows.append(tuple(row))
        total = ["total", hits, "100%" if hits else "-", "", "", ""]
        total.append(output.human_seconds(doc["seconds_saved"]))
        if with_errors:
            total[6:6] = ["", ""]
        rows.append(tuple(total))
        miss = ["missed", chain["misses"], "", "", "", "", ""]
        if with_errors:
            miss[6:6] = ["", ""]
        rows.append(tuple(miss))
        headers = ["tier", "hits", "of hits", "puts", "evicted", "corrupt", "saved"]
        if with_errors:
            headers[6:6] = ["errors", "rejected"]
        print()
        print(
            "per tier: a hit counts once, at the tier that answered it; missed: no tier had "
            "it; a put counts in every tier it was stored in"
        )
        output.table(headers, rows, right=tuple(range(1, len(headers))))
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


# -- report ---------------------------------------------------------------------------


def run_report(args: argparse.Namespace) -> int:
    root = cache_root(args)
    problem = CacheLayout(root).trust_problem() if os.path.isdir(root) else None
    if problem is not None:
        output.warn(f"{problem} (until then, compiles do not read or write this cache)")
    report = build_report(root, days=args.days, system_of=system_of_kind)
    written = None
    if args.html:
        path = os.path.abspath(os.path.expanduser(args.html))
        page = report_html.render(report)
        try:
            # a page to pass around: readable by others, as a file the user makes is
            _fs.atomic_write(path, page, mode=0o644, makedirs=False)
        except OSError as exc:
            output.error(f"could not write the report to {path}: {exc.strerror or exc}")
            return 1
        written = path
    if args.json:
        output.emit_json({"command": "cache report", "html": written, **report.as_dict()})
        return 0
    if written is not None:
        print(f"wrote {written} ({'empty cache' if report.empty else 'charts'})")
        return 0
    print(report_html.text_summary(report))
    return 0


def _tier_order(tier: str) -> tuple[int, str]:
    """memory, disk, remote, remote#2, ... (telemetry names a second remote ``remote#2``)."""
    base = tier.partition("#")[0]
    rank = ("memory", "disk", "remote").index(base) if base in ("memory", "disk", "remote") else 9
    return rank, tier.rjust(12)


def _configured_remotes() -> list[dict[str, Any]]:
    """The remote tiers CUFORGE_REMOTE names (redacted), read-only and signing flags. Reads
    settings only: ``cache stats`` never contacts a remote."""

    st = settings()
    signed = bool(st.remote_key or st.remote_key_file)
    return [{"url": redact(u), "readonly": st.remote_readonly, "signed": signed} for u in st.remote]


# -- ls -------------------------------------------------------------------------------


_SORTS = {
    "last-used": lambda i: -(i.last_used or 0),
    "created": lambda i: -(i.created or 0),
    "size": lambda i: -i.size,
    "name": lambda i: str((i.meta or {}).get("name") or ""),
    "kind": lambda i: i.kind,
}


def run_ls(args: argparse.Namespace) -> int:
    store = _store(args)
    match = _matcher(args)
    items = [i for i in store.iterate_index() if match(i)]
    items.sort(key=_SORTS[args.sort])
    total = len(items)
    # the one size (as `cache stats` counts it): the entry files' sizes, summed
    matched_bytes = sum(i.size for i in items)
    if args.limit and args.limit > 0:
        items = items[: args.limit]
    if args.json:
        output.emit_json(
            {
                "command": "cache ls",
                "cache_dir": store.root,
                "matched": total,
                "bytes": matched_bytes,
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
    print(
        f"{total} entr{'ies' if total != 1 else 'y'}, {output.human_bytes(matched_bytes)} "
        "(the entry files' sizes, as `ls -l` shows them and `cache stats` counts them)"
    )
    return 0


# -- show -----------------------------------------------------------------------------


def _direct_mode_variants(store: DiskStore, text: str) -> list[str] | None:
    """The entry keys a direct-mode base key (what the compile fence names) resolves to,
    through its manifest: newest first; None when ``text`` is not the base key of a
    manifest in ``store``."""
    from cuforge.base.layout import is_entry_key
    from cuforge.core.direct_mode import manifest_key, read_variants

    text = text.strip().lower()
    if not is_entry_key(text):
        return None
    variants = read_variants(store, manifest_key(text))
    return [v.target for v in variants] or None


def run_show(args: argparse.Namespace) -> int:
    store = _store(args)
    try:
        key = store.resolve_key(args.key)
    except LookupError as exc:
        variants = _direct_mode_variants(store, args.key)
        if variants is None:
            output.error(str(exc))
            return 1
        # a base key of direct mode (the compile fence names it): show its variants
        note = (
            f"{args.key.strip().lower()} is a base key of direct mode (the key before the "
            f"headers are read); its manifest lists {len(variants)} "
            f"variant{'s' if len(variants) != 1 else ''}"
        )
        print(note, file=sys.stderr)
        code = 0
        for variant in variants:
            code = max(code, run_show(argparse.Namespace(**{**vars(args), "key": variant})))
        return code
    entry = store.peek(key)
    path = store.path_for(key)
    if entry is None:
        output.error(
            f"entry {key} is damaged or vanished ({path}); `cuforge cache verify --repair` "
            "removes damaged entries"
        )
        return 1
    meta = dict(entry.meta)
    payload_bytes = meta.pop("size", len(entry.payload))
    # one definition of an entry's size everywhere (ls, stats, the cap, du): its file's
    file_size = _file_size(path)
    size = payload_bytes if file_size is None else file_size
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
                "file_size": file_size,
                "payload_bytes": payload_bytes,
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
        (
            "size",
            f"{output.human_bytes(size)} ({size} bytes on disk; the binary "
            f"{output.human_bytes(payload_bytes)})",
        ),
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
    if entry.kind in _BLOB_KINDS and not log:
        # an integration's build (cuforge.core.blobcache): named files, no compiler log
        if args.payload:
            print(f"\npayload written to {args.payload}")
        return 0
    print("\ncompiler log:" + ("" if log else " (empty)"))
    for line in log.splitlines():
        print(f"  {line}")
    if args.payload:
        print(f"\npayload written to {args.payload}")
    return 0


#: kinds stored by cuforge.core.blobcache (their payload is a set of named files)
_BLOB_KINDS = ("cccl", "cute", "triton", "cuda-core", "jax", "cupy")


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

    root = cache_root(args)
    names = [n for n in (args.source, args.name) if n]
    # the filter applies before the limit: --limit counts the misses shown
    misses = recent_misses(root, limit=0 if names else args.limit)
    if names:
        # a name, an entry key (or a prefix of one), or a base key of direct mode (what
        # the compile fence names): its variants' misses
        store = _store(args) if os.path.isdir(root) else None
        wanted = {n: set(_direct_mode_variants(store, n) or ()) if store else set() for n in names}

        def matches(m: dict, n: str) -> bool:
            key = str(m.get("key", ""))
            return (
                n in str(m.get("name", ""))
                or key in wanted[n]
                or (len(n) >= 8 and key.startswith(n.strip().lower()))
            )

        misses = [m for m in misses if all(matches(m, n) for n in names)]
        if args.limit and args.limit > 0:
            misses = misses[-args.limit :]
    for m in misses:  # each reason once, paths as paths (also in what older versions logged)
        m["reasons"] = explain_shown(m.get("reasons") or [])
    sources = _explain_sources(args)
    if sources is not None:
        _add_nearest(root, misses, sources)
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
        reasons = m["reasons"] or ["first compile of this name (nothing to compare with)"]
        print(
            f"{output.human_time(m.get('time'))}  {m.get('name', '?')}  "
            f"{str(m.get('key', ''))[:16]}"
        )
        for r in reasons:
            print(f"    {r}")
        for near in m.get("nearest", ()):
            if near.get("note"):
                print(f"    {near['source']}: ({near['note']})")
            if near.get("problem"):
                print(f"    {near['source']}: {near['problem']}")
            elif not near["differs"]:
                print(f"    {near['source']}: the same fields as {near['key'][:16]}")
            else:
                print(f"    {near['source']}: nearest {near['kind']} {near['key'][:16]} differs:")
                for r in near["differs"]:
                    print(f"        {r}")
    return 0


#: (label, entries as (key, kind, meta), why none could be listed or None, a note on how
#: they were listed or None)
_Listed = tuple[str, list[tuple[str, str, dict]], str | None, str | None]


def _explain_sources(args: argparse.Namespace) -> list[_Listed] | None:
    """The remotes (``--remote``) and bundles (``--bundle``) to compare misses with, each
    listed once; None when neither was asked for."""
    if args.remote is None and not args.bundle:
        return None
    from cuforge.store.remote import sync

    listed: list[_Listed] = []
    if args.remote is not None:
        try:
            remotes = sync.open_targets([u for u in args.remote if u] or None)
        except sync.NoRemoteError as exc:
            output.error(str(exc))
            raise SystemExit(2) from None
        listed.extend(_remote_entries(remote) for remote in remotes)
    for path in args.bundle or ():
        listed.append(_bundle_entries(path))
    return listed


def _remote_entries(remote: Any) -> _Listed:
    """A remote's entries with their meta, through its backend's listing (a shared dir's
    files; a Redis ``SCAN`` of the namespace, capped), else the push index `cuforge cache
    push` writes there (HTTP has no listing)."""
    from cuforge.store.remote import sync

    label = sync.describe(remote)
    backend = sync._backend_of(remote)
    lister = getattr(backend, "keys", None)
    scan = getattr(backend, "scan_keys", None)
    note = None
    try:
        if callable(scan):
            pairs, capped = scan()
            if capped is not None:
                note = (
                    f"listed by SCAN, stopped after {capped} keys: a nearer entry may be among "
                    "the keys not scanned"
                )
        elif callable(lister):
            pairs = lister()
        else:
            pairs = sync.read_index(remote)
            if getattr(backend, "schemes", ())[:1] == ("http",):
                note = "HTTP has no listing: candidates come from the push index only"
    except (OSError, ValueError) as exc:
        return label, [], f"cannot be listed: {exc}", note
    if pairs is None:
        return (
            label,
            [],
            (
                "cannot be listed (its backend has no listing, and it holds no push index: "
                "`cuforge cache push` writes one)"
            ),
            note,
        )
    found = []
    for kind, key in pairs:
        entry = remote.get(key, kind=kind)
        if entry is not None and not entry.meta.get("push_index"):
            found.append((key, kind, entry.meta))
    return label, found, None, note


def _bundle_entries(path: str) -> _Listed:
    from cuforge.store.bundle import BundleError, BundleStore

    try:
        bundle = BundleStore(path)
    except (OSError, BundleError) as exc:
        return f"bundle {path}", [], f"cannot be read: {exc}", None
    try:
        return f"bundle {path}", [(i.key, i.kind, i.meta) for i in bundle.iterate()], None, None
    finally:
        bundle.close()


def _add_nearest(root: str, misses: list[dict], sources: list[_Listed]) -> None:
    """Give each miss ``"nearest"``: per source, the nearest entry of the same name and
    the fields that differ from the miss's (or why there is none)."""
    from cuforge.keys.explain import fields_of, nearest_entry

    for m in misses:
        name, key = str(m.get("name", "")), str(m.get("key", ""))
        fields = fields_of(root, name, key)
        rows = []
        for label, entries, problem, note in sources:
            if problem is None and fields is None:
                problem = "the miss's key fields are no longer in this cache's history"
            near = None if problem else nearest_entry(name, fields or {}, entries)
            if problem is None and near is None:
                problem = f"no entry named {name!r} with its key fields"
            rows.append({"source": label, "problem": problem, "note": note, **(near or {})})
        m["nearest"] = rows


# -- clear / prune / verify -----------------------------------------------------------


def run_clear(args: argparse.Namespace) -> int:

    store = _store(args)
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
    extra = store.clear_extras() if args.all else []
    dirs = store.dirs_removed
    if args.json:
        output.emit_json(
            {
                "command": "cache clear",
                "removed": removed,
                "dirs_removed": dirs,
                "bytes": stats.bytes,
                "also": extra,
            }
        )
    else:
        also_dirs = f" and {dirs} torch build / module dirs" if dirs else ""
        print(
            f"removed {removed} entries{also_dirs} ({output.human_bytes(stats.bytes)}) "
            f"from {store.root}"
        )
        if extra:
            print(f"also removed: {', '.join(extra)}")
    return 0


def run_prune(args: argparse.Namespace) -> int:

    store = _store(args)
    max_bytes = (
        output.usage_value("--max-bytes", parse_size, args.max_bytes)
        if args.max_bytes is not None
        else None
    )
    older = (
        output.usage_value("--older-than", output.parse_age, args.older_than)
        if args.older_than
        else None
    )
    if max_bytes is None and older is None:
        max_bytes = store.max_bytes  # trim to the configured cap
    before = store.stats()
    with output.progress("pruning", enabled=not args.json):
        removed, freed = store.prune(max_bytes=max_bytes, older_than=older)
    after = store.stats()
    doc = {
        "command": "cache prune",
        "max_bytes": max_bytes,
        "older_than_seconds": older,
        "removed": removed,
        "dirs_removed": store.dirs_removed,
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
        dirs = store.dirs_removed
        also_dirs = f" and {dirs} torch build / module dirs" if dirs else ""
        print(
            f"removed {removed} entries{also_dirs} ({output.human_bytes(freed)}); the cache now holds "
            f"{after.entries} entries, {output.human_bytes(after.bytes)} ({' and '.join(limits)})"
        )
    return 0


def run_verify(args: argparse.Namespace) -> int:
    store = _store(args)
    label = "verifying (quick)" if args.quick else "verifying checksums"
    with output.progress(label, enabled=not args.json) as bar:
        report = store.verify(repair=args.repair, quick=args.quick, progress=bar)
    if args.json:
        doc = {"command": "cache verify", "quick": args.quick, "repair": args.repair}
        doc.update(report.as_dict())
        output.emit_json(doc)
        return 0 if report.ok else 1
    corrupt = report.corrupt
    print(
        f"checked {report.checked} entries ({output.human_bytes(report.bytes)})"
        + (" (quick: headers, sizes and metadata, not checksums)" if args.quick else "")
    )
    if corrupt:
        print(f"{len(corrupt)} damaged:")
        for key in corrupt[:50]:
            print(f"  {key}  ({report.reasons.get(key, 'damaged')})")
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
    if report.journal is not None:
        print(
            f"index: the journal is damaged ({report.journal})"
            + (
                " (rebuilt from the entries)"
                if report.journal_rebuilt
                else " (--repair rebuilds it; readers rebuild it too)"
            )
        )
    elif report.index_drift:
        print(
            f"index: {report.index_drift} entries out of date"
            + (" (rebuilt)" if args.repair else " (--repair rebuilds it)")
        )
    return 0 if report.ok else 1


# -- export / import ------------------------------------------------------------------


_NOT_BUNDLE_SUFFIXES = (".tar.gz", ".tgz", ".tar.zst", ".tzst", ".zst", ".gz", ".tar", ".zip")


def run_export(args: argparse.Namespace) -> int:

    if args.file.lower().endswith(_NOT_BUNDLE_SUFFIXES):
        raise ValueError(
            f"cannot write {args.file!r}: cache exports are bundles (.cfb; tar, zip and "
            "compressed archives are not written any more); name the file .cfb"
        )
    with output.progress("exporting", enabled=not args.json) as bar:
        result = export_bundle(_store(), args.file, select=_matcher(args), progress=bar)
    if args.json:
        output.emit_json(
            {
                "command": "cache export",
                "file": result["path"],
                "format": "cfb",
                "bundle_version": FORMAT_VERSION,
                "entries": result["entries"],
                "skipped_damaged": result["skipped"],
                "bytes": result["bytes"],
                "file_bytes": result["file_bytes"],
            }
        )
    else:
        print(
            f"exported {result['entries']} entries ({output.human_bytes(result['bytes'])}) to "
            f"{args.file} [bundle, {output.human_bytes(result['file_bytes'])}]"
            + (f"; skipped {result['skipped']} damaged" if result["skipped"] else "")
        )
    return 0


def run_import(args: argparse.Namespace) -> int:

    cap = (
        output.usage_value("--max-member-bytes", parse_size, args.max_member_bytes)
        if args.max_member_bytes
        else None
    )
    store = _store()
    with output.progress("importing", enabled=not args.json) as bar:
        result = import_bundle(
            store, args.file, overwrite=args.overwrite, max_entry_bytes=cap, progress=bar
        )
    if args.json:
        output.emit_json(
            {
                "command": "cache import",
                "file": result["path"],
                "format": "cfb",
                "bundle": result["info"],
                "ok": result["ok"],
                "imported": result["imported"],
                "bytes": result["bytes"],
                "already_present": result["present"],
                "rejected": result["rejected"],
                "warnings": result["warnings"],
            }
        )
    else:
        for w in result["warnings"]:
            output.warn(w)
        for r in result["rejected"][:50]:
            output.error(f"rejected entry {r['key']}: {r['reason']}")
        print(
            f"imported {result['imported']} entries ({output.human_bytes(result['bytes'])}) "
            f"into {store.root}; {result['present']} already present, "
            f"{len(result['rejected'])} rejected"
        )
    return 0 if result["ok"] else 1


# -- push / pull ----------------------------------------------------------------------


def _sync_doc(command: str, results: list[Any]) -> dict[str, Any]:
    return {
        "command": command,
        "ok": all(r.ok for r in results),
        "remotes": [r.as_dict() for r in results],
    }


def _print_sync(results: list[Any], verb: str) -> None:
    for r in results:
        for f in r.failed[:50]:
            what = f"{f['kind']} {f['key'][:16]}" + (f" ({f['name']})" if f.get("name") else "")
            output.error(f"{r.remote}: {what}: {f['reason']}")
        if len(r.failed) > 50:
            output.error(f"{r.remote}: ... {len(r.failed) - 50} more failed")
        parts = [
            f"{verb} {r.copied} of {r.selected} entries ({output.human_bytes(r.bytes)})",
        ]
        if r.present:
            parts.append(f"{r.present} already here")
        if r.missing:
            parts.append(f"{r.missing} gone from the remote (evicted or expired)")
        if r.failed:
            parts.append(f"{len(r.failed)} failed")
        where = "to" if verb == "pushed" else "from"
        print(
            f"{'; '.join(parts)} {where} {r.remote} [index {r.index}, "
            f"{output.human_seconds(r.seconds)}]"
        )
        if r.index_written is False:
            output.error(f"{r.remote}: the push index {r.index!r} could not be written")


def run_push(args: argparse.Namespace) -> int:

    remotes = sync.open_targets(args.remote)
    readonly = sync.remote_settings(args.remote).remote_readonly
    if readonly:
        output.error(
            "the remote caches are read-only here (CUFORGE_REMOTE_READONLY=1): nothing to "
            "push; unset it on the machine that should write (e.g. CI)"
        )
        return 1
    store = _store(args)
    select = _matcher(args)
    results = []
    for remote in remotes:
        with output.progress(f"pushing to {sync.describe(remote)}", enabled=not args.json) as bar:
            results.append(sync.push(store, remote, select=select, index=args.index, progress=bar))
    if args.json:
        output.emit_json(_sync_doc("cache push", results))
    else:
        _print_sync(results, "pushed")
    return 0 if all(r.ok for r in results) else 1


def run_pull(args: argparse.Namespace) -> int:

    remotes = sync.open_targets(args.remote)
    store = _store(args)
    results = []
    for remote in remotes:
        with output.progress(f"pulling from {sync.describe(remote)}", enabled=not args.json) as bar:
            results.append(
                sync.pull(store, remote, index=args.index, overwrite=args.overwrite, progress=bar)
            )
    if args.json:
        output.emit_json(_sync_doc("cache pull", results))
    else:
        _print_sync(results, "pulled")
    return 0 if all(r.ok for r in results) else 1


def _add_remote_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--remote",
        action="append",
        metavar="URL",
        help="a remote cache URL (redis://, http(s)://, file://); repeatable "
        "(default: every URL in CUFORGE_REMOTE)",
    )
    p.add_argument(
        "--index",
        default="default",
        metavar="NAME",
        help="the push index to write or read (default: 'default'; e.g. one per CI branch)",
    )


# -- the parser -----------------------------------------------------------------------


def _positive_days(text: str) -> int:
    try:
        days = int(text)
    except ValueError:
        raise ValueError(f"expected a whole number of days, not {text!r}") from None
    if not 1 <= days <= 3660:
        raise ValueError("expected a number of days from 1 to 3660")
    return days


def add_parser(subparsers: Any, common: argparse.ArgumentParser) -> None:
    cache = subparsers.add_parser(
        "cache",
        help="inspect, trim, verify, export, import, push and pull the compile cache",
        description="The disk cache at CUFORGE_CACHE_DIR "
        "(default ~/.cache/cuforge). Every subcommand takes --json.",
    )
    sub = cache.add_subparsers(dest="cache_command", metavar="SUBCOMMAND")

    def _no_subcommand(args: argparse.Namespace) -> int:
        cache.print_help(sys.stderr)
        return 2

    cache.set_defaults(func=_no_subcommand)

    p = sub.add_parser("stats", parents=[common], help="sizes, hits and misses, time saved")
    p.add_argument(
        "--top",
        type=output.arg_type(output.count),
        default=10,
        metavar="N",
        help="how many top entries to list (10; 0: none)",
    )
    p.set_defaults(func=run_stats)

    p = sub.add_parser(
        "report",
        parents=[common],
        help="compile time saved per day and system, hit rate, misses, bytes (--html: a page)",
        description="What the cache did in the last days, from its own records (telemetry, "
        "explained misses, the disk index). --html FILE writes one self-contained page "
        "(inline SVG and CSS, no script, nothing fetched); without it, a short summary.",
    )
    p.add_argument("--html", metavar="FILE", help="write the page with the charts to FILE")
    p.add_argument(
        "--days",
        type=output.arg_type(_positive_days),
        default=14,
        metavar="N",
        help="how many days back, today included (14)",
    )
    p.set_defaults(func=run_report)

    p = sub.add_parser("ls", parents=[common], help="list entries")
    _add_filters(p, hide_manifests=True)
    p.add_argument("--sort", choices=sorted(_SORTS), default="last-used")
    p.add_argument(
        "--limit",
        type=output.arg_type(output.count),
        default=100,
        metavar="N",
        help="show at most N (0: all; default 100)",
    )
    p.add_argument("--full-keys", action="store_true", help="print whole keys")
    p.set_defaults(func=run_ls)

    p = sub.add_parser("show", parents=[common], help="one entry's metadata, log and key fields")
    p.add_argument("key", help="a key or a unique prefix of one")
    p.add_argument("--payload", metavar="FILE", help="also write the entry's binary to FILE")
    p.set_defaults(func=run_show)

    p = sub.add_parser(
        "explain",
        parents=[common],
        help="the last misses and why",
        description="The last cache misses, each with why it missed: what changed since "
        "the previous compile of the same source or build name (a define, an option, a "
        "header, the toolchain).",
    )
    p.add_argument(
        "source",
        nargs="?",
        metavar="NAME",
        help="only misses of sources or builds whose name contains NAME (saxpy.cu)",
    )
    p.add_argument(
        "--limit",
        type=output.arg_type(output.count),
        default=20,
        metavar="N",
        help="show at most the N most recent misses (0: all; default 20)",
    )
    p.add_argument("--name", help="the same as NAME")
    p.add_argument(
        "--remote",
        action="append",
        nargs="?",
        const="",
        metavar="URL",
        help="also name, for each miss, the fields that differ from the nearest entry of "
        "the same name in this remote (repeatable; no URL: every URL in CUFORGE_REMOTE)",
    )
    p.add_argument(
        "--bundle",
        action="append",
        metavar="FILE",
        help="the same against the entries of this bundle (.cfb; repeatable)",
    )
    p.set_defaults(func=run_explain)

    p = sub.add_parser(
        "clear", parents=[common], help="remove every entry and torch build / module dir"
    )
    p.add_argument("--yes", "-y", action="store_true", help="do not ask")
    p.add_argument(
        "--all", action="store_true", help="also remove telemetry, miss history and probe memos"
    )
    p.set_defaults(func=run_clear)

    p = sub.add_parser(
        "prune",
        parents=[common],
        help="trim the cache (least recently used first)",
        description="Remove entries and torch build / module dirs unused for --older-than, "
        "then least recently used ones until the cache holds at most --max-bytes, and module "
        "dirs whose module entry is gone. With neither, trim to CUFORGE_CACHE_MAX_BYTES. A "
        "build dir a build is using is kept.",
    )
    p.add_argument("--max-bytes", metavar="SIZE", help="keep at most this much (500M, 2G, bytes)")
    p.add_argument("--older-than", metavar="AGE", help="remove entries unused for AGE (30d, 12h)")
    p.set_defaults(func=run_prune)

    p = sub.add_parser(
        "verify", parents=[common], help="re-check every entry's checksum and shape, and the index"
    )
    p.add_argument(
        "--repair",
        action="store_true",
        help="remove damaged entries and stale temp files, rebuild the index",
    )
    p.add_argument(
        "--quick", action="store_true", help="headers, sizes and metadata only (no checksums)"
    )
    p.set_defaults(func=run_verify)

    p = sub.add_parser(
        "export",
        parents=[common],
        help="write entries to a bundle (.cfb)",
        description="Write cache entries to a bundle (.cfb, the format of `cuforge build "
        "--bundle`): one versioned, checksummed file that `cuforge cache import` adds to "
        "another cache dir and `cuforge.load_bundle` serves in place. Filters select a "
        "subset; by default everything, including the manifests that make direct-mode hits "
        "possible. An existing FILE that is not a regular file is never replaced.",
    )
    p.add_argument("file", help="the bundle to write (.cfb)")
    _add_filters(p, hide_manifests=False)
    p.set_defaults(func=run_export)

    p = sub.add_parser(
        "import",
        parents=[common],
        help="add a bundle's entries (each verified first)",
        description="Add the entries of a bundle (.cfb) made by `cuforge cache export` or "
        "`cuforge build --bundle`. The bundle's header, index and every entry's schema are "
        "checked when it is opened (a damaged index refuses the whole bundle); each "
        "entry's SHA-256 is checked before it is stored. Exit code 1 when any entry was "
        "rejected.",
    )
    p.add_argument("file", help="the bundle (.cfb)")
    p.add_argument("--overwrite", action="store_true", help="replace entries already present")
    p.add_argument(
        "--max-member-bytes",
        metavar="SIZE",
        help="reject entries whose payload is larger (default: no limit)",
    )
    p.set_defaults(func=run_import)

    p = sub.add_parser(
        "push",
        parents=[common],
        help="copy local entries to the remote caches",
        description="Copy entries of the local disk cache to each remote cache (--remote, "
        "else every URL in CUFORGE_REMOTE), through the remote tier: with the integrity "
        "digest and schema namespace, signed when CUFORGE_REMOTE_KEY is set. Filters select "
        "a subset (default: everything, manifests included). A push also merges the keys it "
        "wrote into a small index entry on the remote (--index NAME), which `cuforge cache "
        "pull` reads: a remote has no listing. Exit code 1 when any entry failed.",
    )
    _add_remote_options(p)
    _add_filters(p, hide_manifests=False)
    p.set_defaults(func=run_push)

    p = sub.add_parser(
        "pull",
        parents=[common],
        help="copy the entries a push listed from the remote caches into this cache",
        description="Read the push index (--index NAME, written by `cuforge cache push`) "
        "from each remote cache (--remote, else every URL in CUFORGE_REMOTE) and copy the "
        "entries it lists into the local disk cache. Every entry is verified before it is "
        "stored (digest, schema namespace, entry schema, and the signature when "
        "CUFORGE_REMOTE_KEY is set). Entries already here are skipped; entries the remote "
        "has evicted are counted, not failed. Exit code 1 when any entry failed or the "
        "index is missing.",
    )
    _add_remote_options(p)
    p.add_argument("--overwrite", action="store_true", help="replace entries already present")
    p.set_defaults(func=run_pull)
