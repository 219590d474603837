"""Copy cache entries between the local disk cache and a remote tier: push, pull, probe.

The library half of ``cuforge cache push`` / ``pull`` and of ``cuforge doctor``'s remote
check; the CLI only parses arguments and formats the results returned here.

How pull knows what to fetch
----------------------------
A remote has no listing (:class:`~cuforge.store.remote.base.RemoteBackend` moves bytes by
``(kind, key)`` only, and a Redis or WebDAV listing of a large team cache would be slow and
unbounded). So every :func:`push` also writes one small **index entry** named by
``index`` (default ``"default"``; CI may use one per branch): a JSON list of the
``(kind, key)`` pairs it pushed, merged with what that index already listed (newest first,
at most :data:`MAX_INDEX_ENTRIES`). :func:`pull` reads that index and fetches each entry.

The index is an entry of kind ``"manifest"`` (:data:`INDEX_KIND`: a kind every tier and
the entry schema accept; its payload is the JSON list and its ``meta`` says
``{"name": "push index <name>", "push_index": 1}``) under :func:`index_key`, a key no
compile produces, so no lookup ever reads it as a manifest. It goes through the same remote
tier as every entry: it carries the integrity digest and schema namespace, and is signed
and checked when ``CUFORGE_REMOTE_KEY`` is set. It only
names keys; every entry it names is verified again on its own when pulled (digest, schema,
signature), so a forged index can at worst make a pull fetch nothing useful. Two pushes of
one index at the same moment may drop each other's additions from it (last write wins):
the entries themselves are on the remote and still hit through read-through; push again,
or give concurrent writers their own ``index`` names.

Guarantees:

* Nothing raises for a remote problem: a failed entry is listed in the result's ``failed``
  with the reason, and the rest go on. ``SyncResult.ok`` is False when any entry failed.
* Entries are read locally with ``peek`` (no hit counted, no "last used" refresh) and the
  local metadata fields ``size`` / ``created`` / ``last_used`` are not sent.
* Kernels, objects and modules are copied before the manifests that point at them, so an
  interrupted copy never leaves a manifest that names an entry the other side lacks.
"""

from __future__ import annotations

import os
import time

from cuforge.store.base import ENTRY_KINDS

TYPE_CHECKING = False  # typing costs ~10 ms to import; annotations are strings here
if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable, Sequence
    from typing import Any

    from cuforge.base.config import Settings
    from cuforge.store.base import EntryInfo, Store
    from cuforge.store.disk import DiskStore

__all__ = [
    "INDEX_KIND",
    "DEFAULT_INDEX",
    "MAX_INDEX_ENTRIES",
    "NoRemoteError",
    "PROBE_KEY",
    "SyncResult",
    "ProbeResult",
    "remote_settings",
    "open_targets",
    "describe",
    "index_key",
    "read_index",
    "push",
    "pull",
    "probe",
]

#: the kind of the entries that list what a push wrote (see the module docstring)
INDEX_KIND = "manifest"
DEFAULT_INDEX = "default"
#: an index keeps at most this many (kind, key) pairs (the newest); ~80 bytes each
MAX_INDEX_ENTRIES = 50_000
#: copy order over every entry kind: what manifests point at first, manifests last
_ORDER = {kind: int(kind == "manifest") for kind in ENTRY_KINDS}
#: the entry ``cuforge doctor`` writes and reads back (a key no compile produces)
PROBE_KEY = "c0ffee" + "0" * 58
PROBE_PAYLOAD = b"cuforge doctor probe v1"
#: local bookkeeping fields that peek() adds to meta; not part of the entry
_LOCAL_META = ("size", "created", "last_used")


class NoRemoteError(ValueError):
    """No remote cache is configured (or the one named cannot be used)."""


# -- opening remotes --------------------------------------------------------------------


def remote_settings(urls: Sequence[str] | None = None) -> Settings:
    """The current settings, with ``CUFORGE_REMOTE`` replaced by ``urls`` when given
    (``--remote URL``); every other remote setting (key, read-only, timeouts) is kept."""
    from cuforge.base.config import Settings, settings

    if not urls:
        return settings()
    env = dict(os.environ)
    env["CUFORGE_REMOTE"] = ",".join(urls)
    return Settings(env)


def open_targets(urls: Sequence[str] | None = None) -> list[Store]:
    """The remote tiers to copy to or from: ``urls`` (``--remote``), else every URL in
    ``CUFORGE_REMOTE``. Raises :class:`NoRemoteError` naming both when there is none."""
    st = remote_settings(urls)
    if not st.remote:
        raise NoRemoteError(
            "no remote cache is configured: set CUFORGE_REMOTE (e.g. "
            "CUFORGE_REMOTE=redis://cache.example:6379/0, a comma-separated list) or pass "
            "--remote URL"
        )
    from cuforge.store.remote import open_remotes

    stores = list(open_remotes(st))
    if not stores:
        raise NoRemoteError(
            f"none of the remote caches {', '.join(_redact(u) for u in st.remote)} could be "
            "opened (see the warnings above); check CUFORGE_REMOTE or --remote"
        )
    return stores


def describe(remote: Any) -> str:
    """A remote tier's URL without its password."""
    for attr in ("describe", "url"):
        value = getattr(remote, attr, None)
        if callable(value):
            try:
                return str(value())
            except Exception:  # noqa: BLE001 - a description must never fail
                continue
        if isinstance(value, str):
            return _redact(value)
    backend = getattr(remote, "backend", None)
    if backend is not None and hasattr(backend, "describe"):
        return str(backend.describe())
    return repr(remote)


def _redact(url: str) -> str:
    from cuforge.store.remote.base import redact

    return redact(url)


# -- counters of a remote tier ----------------------------------------------------------


def _problems(remote: Any) -> int:
    """Errors, rejected (trust) and damaged values, and calls an open circuit breaker
    skipped, counted by a remote tier so far (from its stats)."""
    try:
        stats = remote.stats()
    except Exception:  # noqa: BLE001 - stats of a broken tier: count as nothing
        return 0
    total = 0
    for name in ("errors", "corrupt", "rejected", "skipped"):
        value = getattr(stats, name, None)
        if value is None:
            value = (getattr(stats, "extra", None) or {}).get(name, 0)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            total += int(value)
    return total


def _last_error(remote: Any) -> str | None:
    """The reason of the tier's last failure, where it keeps one."""
    for attr in ("last_error", "last_problem"):
        value = getattr(remote, attr, None)
        if value:
            return str(value)
    try:
        extra = remote.stats().extra or {}
    except Exception:  # noqa: BLE001 - stats of a broken tier: no reason known
        return None
    value = extra.get("last_error")
    return str(value) if value else None


def _remote_get(remote: Any, key: str, kind: str):
    return remote.get(key, kind=kind)


# -- the result -------------------------------------------------------------------------


class SyncResult:
    """What a push or pull did. ``copied`` entries (``bytes`` of payload) went across,
    ``present`` were already there (pull: in the local cache), ``missing`` were listed by
    the index but gone from the remote (evicted or expired: not a failure), ``failed``
    lists ``{"kind", "key", "name", "reason"}`` for each entry that could not be copied."""

    __slots__ = (
        "direction",
        "remote",
        "index",
        "selected",
        "copied",
        "present",
        "missing",
        "bytes",
        "failed",
        "seconds",
        "index_written",
    )

    def __init__(self, direction: str, remote: str, index: str) -> None:
        self.direction, self.remote, self.index = direction, remote, index
        self.selected = self.copied = self.present = self.missing = self.bytes = 0
        self.failed: list[dict[str, Any]] = []
        self.seconds = 0.0
        #: push: whether the index entry was written (pull: None)
        self.index_written: bool | None = None

    @property
    def ok(self) -> bool:
        return not self.failed and self.index_written is not False

    def as_dict(self) -> dict[str, Any]:
        doc = {name: getattr(self, name) for name in self.__slots__}
        doc["ok"] = self.ok
        return doc

    def __repr__(self) -> str:
        return (
            f"SyncResult({self.direction} {self.remote}: {self.copied} copied, "
            f"{self.present} present, {self.missing} missing, {len(self.failed)} failed)"
        )


# -- the index --------------------------------------------------------------------------


def index_key(name: str) -> str:
    """The key of the index entry called ``name``: SHA-256 of a label and the name, so it
    can never equal a content key."""
    import hashlib

    return hashlib.sha256(b"cuforge-push-index\0" + name.encode("utf-8")).hexdigest()


def _parse_index(payload: bytes) -> list[tuple[str, str]]:
    import json

    from cuforge.store.base import is_entry_key

    doc = json.loads(payload.decode("utf-8"))
    if not isinstance(doc, dict) or doc.get("format") != 1:
        raise ValueError("not a cuforge push index (format 1)")
    pairs = []
    for item in doc.get("entries", []):
        if (
            isinstance(item, list)
            and len(item) == 2
            and item[0] in _ORDER
            and isinstance(item[1], str)
            and is_entry_key(item[1])
        ):
            pairs.append((item[0], item[1]))
        else:
            raise ValueError(f"malformed index item {str(item)[:80]!r}")
    return pairs


def read_index(remote: Store, name: str = DEFAULT_INDEX) -> list[tuple[str, str]] | None:
    """The ``(kind, key)`` pairs the index ``name`` lists, newest first; None when the
    remote has no such index (or could not be read). Raises ValueError for a damaged one."""
    entry = _remote_get(remote, index_key(name), INDEX_KIND)
    if entry is None:
        return None
    if entry.meta.get("push_index") != 1:
        raise ValueError(f"the entry under the key of index {name!r} is not a push index")
    return _parse_index(entry.payload)


def _write_index(remote: Store, name: str, pairs: list[tuple[str, str]]) -> bool:
    import json

    from cuforge.store.base import Entry

    try:
        old = read_index(remote, name) or []
    except ValueError:
        old = []  # a damaged index is replaced
    seen: set[tuple[str, str]] = set()
    merged: list[list[str]] = []
    for pair in list(pairs) + old:
        if pair not in seen:
            seen.add(pair)
            merged.append(list(pair))
    merged = merged[:MAX_INDEX_ENTRIES]
    payload = json.dumps(
        {"format": 1, "name": name, "updated": int(time.time()), "entries": merged},
        separators=(",", ":"),
    ).encode()
    return bool(
        remote.put(
            Entry(
                index_key(name),
                INDEX_KIND,
                payload,
                {"name": f"push index {name}", "push_index": 1},
            )
        )
    )


# -- push / pull --------------------------------------------------------------------------


def _clean(entry: Any) -> Any:
    from cuforge.store.base import Entry

    meta = {k: v for k, v in entry.meta.items() if k not in _LOCAL_META}
    return Entry(entry.key, entry.kind, entry.payload, meta)


def push(
    local: DiskStore,
    remote: Store,
    *,
    select: Callable[[EntryInfo], bool] | None = None,
    index: str = DEFAULT_INDEX,
    progress: Callable[[int, int], Any] | None = None,
) -> SyncResult:
    """Copy the local entries ``select`` accepts (all by default) to ``remote``, then merge
    their ``(kind, key)`` pairs into the remote index ``index`` (see the module docstring).
    ``progress(done, total)`` is called after each entry. A read-only remote tier
    (``CUFORGE_REMOTE_READONLY=1``) is not written: every entry is reported failed with
    that reason."""
    started = time.perf_counter()
    readonly = bool(getattr(remote, "readonly", False))
    result = SyncResult("push", describe(remote), index)
    infos = [i for i in local.iterate_index() if i.kind in _ORDER and (select is None or select(i))]
    infos.sort(key=lambda i: _ORDER[i.kind])
    result.selected = total = len(infos)
    pushed: list[tuple[str, str]] = []
    for done, info in enumerate(infos, 1):
        name = (info.meta or {}).get("name")
        if readonly:
            reason = "the remote is read-only (CUFORGE_REMOTE_READONLY=1)"
            result.failed.append(
                {"kind": info.kind, "key": info.key, "name": name, "reason": reason}
            )
        else:
            entry = local.peek(info.key)
            if entry is None:
                result.failed.append(
                    {
                        "kind": info.kind,
                        "key": info.key,
                        "name": name,
                        "reason": "the local entry is damaged or vanished "
                        "(`cuforge cache verify --repair`)",
                    }
                )
            else:
                before = _problems(remote)
                ok = _put(remote, _clean(entry))
                if ok and _problems(remote) == before:
                    result.copied += 1
                    result.bytes += len(entry.payload)
                    pushed.append((entry.kind, entry.key))
                else:
                    result.failed.append(
                        {
                            "kind": info.kind,
                            "key": info.key,
                            "name": name,
                            "reason": _last_error(remote) or "the remote refused or lost the write",
                        }
                    )
        if progress is not None:
            progress(done, total)
    if pushed:  # the remote tier's writes are synchronous: every entry is published now
        result.index_written = _write_index(remote, index, pushed)
    result.seconds = time.perf_counter() - started
    return result


def _put(remote: Any, entry: Any) -> bool:
    try:
        return bool(remote.put(entry))
    except Exception:  # noqa: BLE001 - a remote tier should fail open; count it as failed
        return False


def pull(
    local: DiskStore,
    remote: Store,
    *,
    index: str = DEFAULT_INDEX,
    overwrite: bool = False,
    progress: Callable[[int, int], Any] | None = None,
) -> SyncResult:
    """Copy the entries the remote index ``index`` lists into ``local``, each verified by
    the remote tier first (digest, schema namespace, signature when a key is set). Entries
    already in the local cache are skipped (``present``) unless ``overwrite``. A missing
    index is one failure naming the fix (push first)."""
    started = time.perf_counter()
    result = SyncResult("pull", describe(remote), index)
    before = _problems(remote)
    try:
        pairs = read_index(remote, index)
    except ValueError as exc:
        pairs = None
        result.failed.append(
            {"kind": INDEX_KIND, "key": index_key(index), "name": index, "reason": str(exc)}
        )
    if pairs is None:
        if not result.failed:
            reason = (
                (_last_error(remote) or "the remote could not be read")
                if _problems(remote) != before
                else f"the remote has no index {index!r}: run `cuforge cache push` "
                f"(--index {index}) on a machine that has the entries first"
            )
            result.failed.append(
                {"kind": INDEX_KIND, "key": index_key(index), "name": index, "reason": reason}
            )
        result.seconds = time.perf_counter() - started
        return result
    pairs = sorted(pairs, key=lambda p: _ORDER[p[0]])  # stable: newest first within a kind
    result.selected = total = len(pairs)
    # one journal batch and one round of fsyncs at the end, not one per entry (see bulk)
    with local.bulk():
        for done, (kind, key) in enumerate(pairs, 1):
            if not overwrite and local.has(key):
                result.present += 1
            else:
                before = _problems(remote)
                try:
                    entry = _remote_get(remote, key, kind)
                except Exception as exc:  # noqa: BLE001 - a remote tier should fail open
                    entry = None
                    result.failed.append(
                        {"kind": kind, "key": key, "name": None, "reason": str(exc)}
                    )
                else:
                    if entry is None:
                        if _problems(remote) != before:
                            result.failed.append(
                                {
                                    "kind": kind,
                                    "key": key,
                                    "name": None,
                                    "reason": _last_error(remote)
                                    or "the remote failed or the entry did not verify",
                                }
                            )
                        else:
                            result.missing += 1
                    elif entry.key != key or entry.kind != kind:
                        result.failed.append(
                            {
                                "kind": kind,
                                "key": key,
                                "name": None,
                                "reason": "the remote answered another entry",
                            }
                        )
                    elif local.put(_clean(entry)):
                        result.copied += 1
                        result.bytes += len(entry.payload)
                    else:
                        result.failed.append(
                            {
                                "kind": kind,
                                "key": key,
                                "name": entry.meta.get("name"),
                                "reason": f"could not write to the local cache {local.root}",
                            }
                        )
            if progress is not None:
                progress(done, total)
    result.seconds = time.perf_counter() - started
    return result


# -- probe (cuforge doctor) -------------------------------------------------------------


class ProbeResult:
    """What :func:`probe` found out about one remote.

    ``reachable``: a get of a key that does not exist answered (a miss, not an error);
    ``latency_ms``: the median of those round trips; ``writable``: a probe entry was put
    and read back intact (None: not tried, read-only mode or unreachable); ``signed``:
    a signing key is configured; ``verified``: the probe entry came back through the
    signature check (None when not signed or not written); ``error``: the first failure's
    reason."""

    __slots__ = (
        "remote",
        "reachable",
        "latency_ms",
        "writable",
        "readonly",
        "signed",
        "verified",
        "error",
    )

    def __init__(self, remote: str) -> None:
        self.remote = remote
        self.reachable = False
        self.latency_ms: float | None = None
        self.writable: bool | None = None
        self.readonly = False
        self.signed = False
        self.verified: bool | None = None
        self.error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


def _backend_of(remote: Any) -> Any:
    return getattr(remote, "backend", None)


def probe(remote: Store, settings: Settings, *, rounds: int = 5) -> ProbeResult:
    """Check one remote: a get of a random missing key (reachable), ``rounds`` of them
    (latency, the median), a put + get of a small probe entry unless read-only (writable,
    and through the signature check when a key is configured). Never raises."""
    import secrets
    import statistics

    from cuforge.store.base import Entry

    result = ProbeResult(describe(remote))
    result.readonly = bool(settings.remote_readonly)
    result.signed = bool(settings.remote_key or settings.remote_key_file)
    missing = secrets.token_hex(32)
    backend = _backend_of(remote)
    times: list[float] = []
    for _ in range(max(1, rounds)):
        before = _problems(remote)
        start = time.perf_counter()
        try:
            if backend is not None:
                backend.get("kernel", missing)  # raises with the reason when down
            else:
                _remote_get(remote, missing, "kernel")
        except Exception as exc:  # noqa: BLE001 - any failure of the remote is the answer
            result.error = f"{type(exc).__name__}: {exc}".strip()
            return result
        elapsed = time.perf_counter() - start
        if _problems(remote) != before:
            result.error = _last_error(remote) or "the remote failed the request"
            return result
        times.append(elapsed)
    result.reachable = True
    result.latency_ms = statistics.median(times) * 1000
    if result.readonly:
        return result
    # one fixed key and payload: repeated probes (from any machine) overwrite one small
    # entry instead of piling up, and concurrent probes write identical values
    key, payload = PROBE_KEY, PROBE_PAYLOAD
    entry = Entry(key, "kernel", payload, {"name": "cuforge-doctor-probe"})
    before = _problems(remote)
    if not _put(remote, entry) or _problems(remote) != before:
        result.writable = False
        result.error = _last_error(remote) or "the remote refused the probe entry"
        return result
    back = None
    try:
        back = _remote_get(remote, key, "kernel")
    except Exception as exc:  # noqa: BLE001 - reported as the reason
        result.error = f"{type(exc).__name__}: {exc}"
    intact = back is not None and back.payload == payload
    result.writable = intact
    if result.signed:
        result.verified = intact
    if not intact and result.error is None:
        result.error = _last_error(remote) or (
            "the probe entry did not come back"
            + (" (it did not pass the signature check)" if result.signed else "")
        )
    return result
