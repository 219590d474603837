"""Why did a lookup miss? History of key fields per source name, and a log of explained misses.

On every compile, the pipeline remembers the new key's labeled fields under the source's
name. On the next miss for that name, :func:`explain` compares the new fields with the
nearest remembered ones (the fewest differing fields) and says what changed:
"header include/common.cuh changed", "option -O3 added", "define UNROLL changed 4 -> 8",
"include dir include added", "arch sm_80 -> sm_90".

Files (under ``<cache_dir>/explain/``, small and bounded):

* ``names/<sha256(name)[:32]>.jsonl`` -- key records of a name, one per line, newest last;
  the last :data:`HISTORY_PER_NAME` are compared.
* ``misses.jsonl`` -- explained misses, newest last; trimmed to its newest half past
  :data:`MISS_LOG_MAX_BYTES`. ``cuforge cache explain`` reads it.

All writes go through :mod:`cuforge.base._fs`: single appends (or an atomic rewrite when
trimming) that never follow a symlink and never open anything but a regular file (a
planted link or FIFO is refused at once, not written through or waited on). Every I/O
failure here is swallowed after one debug log line: explaining must never make a compile
fail. With file caching off, the history lives in this process only.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import TYPE_CHECKING

from cuforge.base import _fs
from cuforge.base.layout import CacheLayout
from cuforge.base.layout import is_entry_key as _is_digest  # a SHA-256: an entry key's shape
from cuforge.base.paths import BASE
from cuforge.keys.key import diff_fields, text_digest

if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any


__all__ = [
    "remember",
    "explain",
    "log_miss",
    "recent_misses",
    "last_miss",
    "fields_of",
    "nearest_entry",
]

HISTORY_PER_NAME = 8
HISTORY_MAX_BYTES = 256 << 10
MISS_LOG_MAX_BYTES = 1 << 20

_memory_history: dict[str, list[dict[str, Any]]] = {}
_last_misses: list[dict[str, Any]] = []


def _name_file(cache_dir: str, name: str) -> str:
    return CacheLayout.of(cache_dir).explain_names_file(text_digest(name)[:32])


def _read_history(cache_dir: str | None, name: str) -> list[dict[str, Any]]:
    if cache_dir is None:
        return _memory_history.get(name, [])
    try:
        lines = _read_lines(_name_file(cache_dir, name))
    except OSError:
        return _memory_history.get(name, [])
    records = []
    for line in lines[-HISTORY_PER_NAME:]:
        try:
            records.append(json.loads(line))
        except ValueError:
            continue  # a torn line from a crashed writer
    return records


def remember(cache_dir: str | None, name: str, key: str, fields: dict[str, Any]) -> None:
    """Record that ``name`` was built with ``key`` from ``fields`` (one appended line;
    the file is trimmed to its newest records when it grows)."""
    record = {"key": key, "time": time.time(), "fields": fields}
    history = _memory_history.setdefault(name, [])
    history.append(record)
    del history[:-HISTORY_PER_NAME]
    if cache_dir is None:
        return
    path = _name_file(cache_dir, name)
    try:
        size = _fs.append_line(path, json.dumps(record) + "\n")
        if size > HISTORY_MAX_BYTES:
            _trim(path, keep_lines=HISTORY_PER_NAME)
    except OSError as exc:
        _debug(f"could not record key history for {name!r}: {exc}")


def _read_lines(path: str) -> list[str]:
    """The lines of the regular file ``path``. Raises ``OSError``, also when ``path`` is a
    symlink or not a regular file (a planted FIFO must never block a compile)."""
    data = _fs.read_bytes(path)
    return data.decode("utf-8", "surrogateescape").splitlines(keepends=True)


def explain(
    cache_dir: str | None, name: str, fields: dict[str, Any], base: str | None = None
) -> list[str]:
    """Reasons the key built from ``fields`` differs from the nearest earlier key of ``name``,
    each once, paths as people read them (:func:`shown`; ``base``: the base dir the key was
    made against, default ``CUFORGE_BASE_DIR`` or the working directory).

    An empty list means nothing was built under this name before (a first compile)."""
    history = _read_history(cache_dir, name)
    if not history:
        return []
    best: list[str] | None = None
    for record in reversed(history):
        reasons = diff_fields(record.get("fields", {}), fields)
        if best is None or len(reasons) < len(best):
            best = reasons
    if best == []:
        return [
            "an identical key was built before but its entry is gone (evicted, pruned or corrupt)"
        ]
    return shown([_readable(_relative(r, fields)) for r in _worded(best or [])], base)


def shown(reasons: Iterable[str], base: str | None = None) -> list[str]:
    """``reasons`` each once, in order, with the key's path markers spelled as paths: an
    include dir ``<include>DIR`` as ``-IDIR``, ``${BASE}/rel`` as ``rel`` (paths under the
    base dir are shown relative to it, as the other reasons show them) and ``${BASE}``
    alone as the base dir itself (``base``, default ``CUFORGE_BASE_DIR`` or the working
    directory). Also applied by ``cuforge cache explain`` to what older versions logged."""
    if base is None:
        from cuforge.base.config import settings
        from cuforge.base.paths import base_dir

        base = base_dir(settings().base_dir)
    out: list[str] = []
    for reason in reasons:
        text = reason.replace("<include>", "-I")
        text = text.replace(BASE + "/", "").replace(BASE, base)
        if text not in out:
            out.append(text)
    return out


def fields_of(cache_dir: str | None, name: str, key: str) -> dict[str, Any] | None:
    """The labeled fields remembered for ``key`` of ``name`` (the key of a miss), or None
    when they are no longer in the name's history."""
    for record in reversed(_read_history(cache_dir, name)):
        if record.get("key") == key and isinstance(record.get("fields"), dict):
            return record["fields"]
    return None


def nearest_entry(
    name: str,
    fields: dict[str, Any],
    candidates: Iterable[tuple[str, str, dict[str, Any]]],
    *,
    kind: str | None = None,
) -> dict[str, Any] | None:
    """The entry among ``candidates`` (``(key, kind, meta)``, from a remote or a bundle)
    nearest to a local miss of ``name`` built from ``fields``: of the same name (meta
    ``"name"``) and, when given, ``kind``, with the fewest differing labeled fields (meta
    ``"key_fields"``). ``{"key", "kind", "differs": [reasons]}`` (the reasons worded as
    :func:`explain` words them: "arch sm_90 -> sm_90a", "header v.h changed"; an empty
    list: the same fields), or None when no entry of that name carries its fields."""
    best: tuple[str, str, list[str]] | None = None
    for key, entry_kind, meta in candidates:
        if meta.get("name") != name or (kind is not None and entry_kind != kind):
            continue
        recorded = meta.get("key_fields")
        if not isinstance(recorded, dict):
            continue
        reasons = diff_fields(recorded, fields)
        if best is None or len(reasons) < len(best[2]):
            best = (key, entry_kind, reasons)
    if best is None:
        return None
    key, entry_kind, reasons = best
    differs = shown([_readable(_relative(r, fields)) for r in _worded(reasons)])
    return {"key": key, "kind": entry_kind, "differs": differs}


def _worded(reasons: list[str]) -> list[str]:
    """Options that are defines or include dirs, in words: ``option -DUNROLL=8 added``
    becomes ``define UNROLL=8 added``; a define both removed and added,
    ``define UNROLL changed 4 -> 8``; ``option -DUNROLL=4 removed``, ``define UNROLL
    removed``; ``option <include>DIR added``, ``include dir DIR added``. Each stays where
    its first line was."""
    added: dict[str, str] = {}
    removed: dict[str, str] = {}
    for reason in reasons:
        define, verb = _define_change(reason)
        if define is not None:
            name, _, value = define.partition("=")
            (added if verb == "added" else removed)[name] = value
    out: list[str] = []
    said: set[str] = set()
    for reason in reasons:
        define, verb = _define_change(reason)
        if define is None:
            out.append(_include_dir_change(reason))
            continue
        name = define.partition("=")[0]
        if name in said:
            continue
        said.add(name)
        if name in added and name in removed:
            out.append(
                f"define {name} changed {removed[name] or '(empty)'} -> {added[name] or '(empty)'}"
            )
        else:
            out.append(f"define {define if verb == 'added' else name} {verb}")
    return out


def _define_change(reason: str) -> tuple[str | None, str]:
    """(``NAME=VALUE``, "added" or "removed") of an ``option -DNAME=VALUE added`` line."""
    if not reason.startswith("option "):
        return None, ""
    option, _, verb = reason[len("option ") :].rpartition(" ")
    if verb not in ("added", "removed"):
        return None, ""
    for prefix in ("-D", "--define-macro="):
        if option.startswith(prefix) and len(option) > len(prefix):
            return option[len(prefix) :], verb
    return None, ""


def _include_dir_change(reason: str) -> str:
    if reason.startswith("option "):
        option, _, verb = reason[len("option ") :].rpartition(" ")
        if verb in ("added", "removed"):
            for prefix in ("<include>", "-I", "--include-path="):
                if option.startswith(prefix) and len(option) > len(prefix):
                    # (a dir under the base dir, as keyed: shown() spells ${BASE})
                    return f"include dir {option[len(prefix) :]} {verb}"
    return reason


def _readable(reason: str) -> str:
    """Say a digest-valued field changed in words (the integrations' keys: ``arg:op op
    <sha256> -> op <sha256>`` becomes ``arg:op changed (op: its code, a default, ...)``)."""
    label, sep, change = reason.partition(" ")
    before, arrow, after = change.partition(" -> ")
    if not sep or not arrow:
        return reason
    b_kind, _, b_digest = before.rpartition(" ")
    a_kind, _, a_digest = after.rpartition(" ")
    if not (_is_digest(b_digest) and _is_digest(a_digest)):
        return reason
    if b_kind == a_kind == "op":
        return (
            f"{label} changed (the function: its code, a default, a closure value or a "
            "global it reads)"
        )
    return f"{label} changed ({b_kind or 'value'} -> {a_kind or 'value'})"


def _relative(reason: str, fields: dict[str, Any]) -> str:
    """Show a header path relative to the include directory it was found in (the first
    include dir holding it; for compile_file that is the source's directory), else to the
    base dir or the working directory: "header include/common.cuh changed". Keys record
    paths under the base dir as ``${BASE}/...`` (:mod:`cuforge.base.paths`), and include dirs
    as ``<include>DIR``."""
    if not reason.startswith(("header /", "header " + BASE + "/")):
        return reason
    path, _, tail = reason[len("header ") :].rpartition(" ")
    roots = []
    for o in fields.get("options", []):
        if isinstance(o, str):
            if o.startswith("<include>"):
                roots.append(o[len("<include>") :])
            elif o.startswith("-I"):
                roots.append(o[2:])
    for root in [*roots, BASE, os.getcwd()]:
        prefix = root.rstrip(os.sep) + os.sep
        if path.startswith(prefix):
            return f"header {path[len(prefix) :]} {tail}"
    return reason


def log_miss(cache_dir: str | None, name: str, key: str, reasons: list[str]) -> None:
    """Append an explained miss to the bounded miss log (and keep it for :func:`last_miss`)."""
    record = {"time": time.time(), "name": name, "key": key, "reasons": reasons}
    _last_misses.append(record)
    del _last_misses[:-64]
    if cache_dir is None:
        return
    path = CacheLayout.of(cache_dir).explain_misses
    try:
        size = _fs.append_line(path, json.dumps(record) + "\n")
        if size > MISS_LOG_MAX_BYTES:
            _trim(path, keep_lines=None)
    except OSError as exc:
        _debug(f"could not log a cache miss: {exc}")


def _trim(path: str, keep_lines: int | None) -> None:
    """Keep the newest ``keep_lines`` lines (or the newest half of the file)."""
    data = _fs.read_bytes(path)
    if keep_lines is None:
        keep = data[len(data) // 2 :]
        keep = keep[keep.find(b"\n") + 1 :]
    else:
        keep = b"".join(data.splitlines(keepends=True)[-keep_lines:])
    _fs.atomic_write(path, keep, makedirs=False)


def recent_misses(cache_dir: str, limit: int = 20) -> list[dict[str, Any]]:
    """The newest ``limit`` explained misses recorded under ``cache_dir``, oldest first.
    Each is ``{"time", "name", "key", "reasons": [str, ...]}``."""
    path = CacheLayout.of(cache_dir).explain_misses
    try:
        lines = _read_lines(path)
    except OSError:
        return []  # nothing recorded yet, or not a regular file: no history to show
    records = []
    for line in lines[-limit:]:
        try:
            records.append(json.loads(line))
        except ValueError:
            continue  # a torn line from a crashed writer; the rest stay readable
    return records


def last_miss(name: str | None = None) -> dict[str, Any] | None:
    """The last miss this process explained (for ``name``, if given)."""
    for record in reversed(_last_misses):
        if name is None or record["name"] == name:
            return record
    return None


def _debug(message: str) -> None:
    logging.getLogger("cuforge").debug(message)
