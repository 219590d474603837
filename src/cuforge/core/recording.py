"""Record -> replay: the lockfile of every cache key a run asked for.

``with cuforge.record("cuforge.lock"):`` (or ``CUFORGE_RECORD=cuforge.lock`` for the whole
process, written at exit) notes every key :meth:`cuforge.Cache.build_once` serves or builds
-- cuforge kernels, ``cuforge.jit``, torch extensions, cuda.compute, CuTe DSL -- with what
is needed to bring it back:

* the entry key (and, for a kernel, its direct-mode manifest's base key), so
  ``cuforge prefetch cuforge.lock`` can pull exactly those entries from a remote and
  ``cuforge build --lock`` can copy them out of a cache;
* the ``cuforge.toml`` stanza that builds it ahead of time, where one can: a kernel whose
  source is a file (relative to the working directory, with the same text the run
  compiled), a torch extension. ``cuforge build --lock`` builds those it cannot copy.

The file is deterministic: records sorted by system, name and key; no paths outside the
project, times or host names. Two runs of the same workload write the same file.

Recording starts from a clean call memo (identical calls made before it are asked again,
so they are seen). Start it before the workload: a ``cuforge.jit`` specialization already
launched in this process is answered by the kernel object itself and is not seen.
"""

from __future__ import annotations

import os
import threading

from cuforge.core import caching

TYPE_CHECKING = False  # read by cuforge.prefetch at a service's start: no typing import
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

__all__ = ["record", "read_lock", "write_lock", "lock_keys", "LOCK_VERSION"]

LOCK_VERSION = 1
_HEADER = (
    "# cuforge.lock: every cache key a run asked for (cuforge.record / CUFORGE_RECORD).\n"
    "# Build the warm set: cuforge build --lock cuforge.lock --bundle warm.cfb\n"
    "# Pull it from the remote: cuforge prefetch cuforge.lock\n"
)


class Recorder:
    """What one recording saw: build_once key -> record."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.records: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def saw(self, cache: Any, key: str, result: Any, offline_error: Callable[[], Any]) -> None:
        if key in self.records:
            return
        record = describe(key, result, offline_error)
        if record is not None:
            with self._lock:
                self.records.setdefault(key, record)


def describe(key: str, result: Any, offline_error: Callable[[], Any]) -> dict[str, Any] | None:
    """The lock record of a key build_once served: system, kind, name, key, (base),
    (manifest stanza lines)."""
    try:
        err = offline_error()
    except Exception:  # noqa: BLE001 - recording must never fail the call it records
        return None
    kind = getattr(err, "kind", "") or ""
    if not kind:
        return None
    from cuforge.core.fencing import SYSTEMS, _frames_files

    system = SYSTEMS.get(kind, kind)
    record: dict[str, Any] = {"system": system, "kind": kind, "name": err.name}
    if isinstance(result, tuple) and result:  # the kernel pipeline: (artifact, ...)
        result = result[0]
    entry_key = getattr(result, "key", None)
    if kind == "kernel":
        if any("jitkernel.py" in f for f in _frames_files()):
            record["system"] = "cuforge.jit"
        record["key"] = entry_key if isinstance(entry_key, str) else key
        record["base"] = key
        stanza = err.manifest_entry
        if stanza and _is_project_file(err.name, getattr(result, "source", None)):
            record["manifest"] = _lines(stanza)
    elif kind == "torch":
        record["key"] = key
        if err.manifest_entry:
            record["manifest"] = _lines(err.manifest_entry)
    else:
        record["key"] = key
    if "manifest" in record:
        # the stanza's paths are relative to the working directory; the lock records it
        # relative to itself (write_lock), and build --lock reads them against it
        record["root"] = os.getcwd()
    return record


def _lines(stanza: str) -> list[str]:
    return [line.strip() for line in stanza.splitlines() if line.strip()]


def _is_project_file(name: str, source: Any) -> bool:
    """``name`` is a file under the working directory holding ``source`` (so its manifest
    stanza rebuilds the same kernel)."""
    if not isinstance(source, str) or os.path.isabs(name) or name.startswith(".."):
        return False
    try:
        with open(name, encoding="utf-8") as f:
            return f.read() == source
    except (OSError, UnicodeDecodeError):
        return False


def write_lock(path: str | os.PathLike[str], records: Any) -> None:
    """Write ``records`` (lock records) as a lockfile, sorted, atomically."""
    import json

    rows = sorted(
        {json.dumps(r, sort_keys=True): r for r in records}.values(),
        key=lambda r: (r["system"], r["name"], r["key"]),
    )
    path = os.fspath(path)
    here = os.path.dirname(os.path.abspath(path))
    out = [_HEADER, f"version = {LOCK_VERSION}\n"]
    for r in rows:
        out.append("\n[[key]]\n")
        for field in ("system", "kind", "name", "key", "base"):
            if field in r:
                out.append(f"{field} = {json.dumps(r[field])}\n")
        if r.get("root"):
            # where the stanza's relative paths start, relative to the lock's directory
            root = r["root"]
            root = os.path.relpath(root, here) if os.path.isabs(root) else root
            if root != ".":
                out.append(f"root = {json.dumps(root)}\n")
        if r.get("manifest"):
            out.append("manifest = [\n")
            out.extend(f"    {json.dumps(line)},\n" for line in r["manifest"])
            out.append("]\n")
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("".join(out))
    os.replace(tmp, path)


def read_lock(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of a lockfile. A ValueError names the file and what is wrong."""
    path = os.fspath(path)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    from cuforge.base.toml import loads  # tomllib (or tomli on 3.10): only for lockfiles

    try:
        data = loads(text)[0]
    except Exception as exc:  # noqa: BLE001 - tomllib's error type is only known at runtime
        raise ValueError(f"{path}: not a cuforge lockfile ({exc})") from None
    version = data.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise ValueError(
            f"{path}: version must be the integer {LOCK_VERSION} (version = {LOCK_VERSION}), "
            f"not {version!r} ({type(version).__name__})"
        )
    if version != LOCK_VERSION:
        raise ValueError(
            f"{path}: lockfile version {version}, this cuforge reads {LOCK_VERSION}; "
            "record it again with this version"
        )
    rows = data.get("key", [])
    if not isinstance(rows, list):
        raise ValueError(
            f"{path}: key must be an array of tables ([[key]] stanzas), "
            f"not {type(rows).__name__} ({rows!r:.40})"
        )
    for i, r in enumerate(rows):
        if not isinstance(r, dict):
            raise ValueError(
                f"{path}: key #{i + 1} must be a table ([[key]]), not {type(r).__name__}"
            )
        for field in ("system", "kind", "name", "key"):
            if not isinstance(r.get(field), str):
                raise ValueError(f"{path}: [[key]] #{i + 1} has no {field} (a str)")
        for field in ("base", "root"):
            if field in r and not isinstance(r[field], str):
                raise ValueError(f"{path}: [[key]] #{i + 1}: {field} must be a str")
        manifest = r.get("manifest")
        if manifest is not None and not (
            isinstance(manifest, list) and all(isinstance(line, str) for line in manifest)
        ):
            raise ValueError(f"{path}: [[key]] #{i + 1}: manifest must be a list of str lines")
    return rows


def lock_keys(records: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """``(kind, key, name)`` of every store entry the records need (a kernel: its entry and
    its direct-mode manifest); torch extensions are rebuilt from their stanza."""
    from cuforge.core.direct_mode import manifest_key

    out = []
    for r in records:
        if r["kind"] == "torch":
            continue
        out.append((r["kind"], r["key"], r["name"]))
        if r["kind"] == "kernel" and r.get("base"):
            out.append(("manifest", manifest_key(r["base"]), r["name"]))
    return out


class record:
    """``with cuforge.record("cuforge.lock"):`` -- write every cache key asked for in the
    block to that lockfile at its end (see the module doc). ``cuforge.record(path)`` without
    ``with`` records until :meth:`stop` (or process exit)."""

    def __init__(self, path: str | os.PathLike[str] = "cuforge.lock") -> None:
        self.path = os.path.abspath(os.fspath(path))
        self.recorder = Recorder(self.path)
        self._previous = caching._watch
        caching._watch = self.recorder.saw
        # identical calls made before are asked again, so the recording sees them
        caching.DEFAULT_CALL_MEMO.clear()
        override = caching.current_override()
        for cache in (caching._default[2], override):
            if cache is not None:
                cache.clear_memos()
        self._stopped = False

    def __enter__(self) -> record:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> str:
        """Stop recording and write the lockfile; returns its path."""
        if not self._stopped:
            self._stopped = True
            if caching._watch == self.recorder.saw:
                caching._watch = self._previous
            write_lock(self.path, self.recorder.records.values())
        return self.path

    @property
    def records(self) -> list[dict[str, Any]]:
        return list(self.recorder.records.values())


def start_from_env(path: str) -> record:
    """``CUFORGE_RECORD=path``: record the whole process, written at exit."""
    import atexit

    rec = record(path)
    atexit.register(rec.stop)
    return rec
