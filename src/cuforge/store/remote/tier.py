"""The remote tier: a :class:`~cuforge.store.base.Store` over one
:class:`~cuforge.store.remote.base.RemoteBackend`, safe to use and fast to give up on.

What it adds to the backend, in one place:

* **The envelope** (:mod:`cuforge.store.remote.envelope`): every value carries the
  namespace, kind, key and SHA-256 of the entry (and an HMAC-SHA256 signature when a key
  is set); all of it, and the entry's own checksum and schema, are checked before use.
* **Addressing**: entries are found by ``(kind, key)``; :meth:`RemoteStore.get` without a
  ``kind`` answers None without asking the backend.
* **Fail open**: any exception of the backend is counted (``errors``) and the call becomes a
  miss (get) or a dropped write (put); a remote never fails a compile. A value that is not
  a sound envelope (over the size cap, bad magic, bad digest) is counted as an error, a
  failure toward the circuit breaker, and a miss (a warning, once per remote and
  process); one that fails a trust check (another namespace, unsigned while a key is set,
  a bad signature) is counted as ``rejected`` and a miss (a warning naming the reason,
  once per remote and process).
* **The circuit breaker** (:mod:`cuforge.store.remote.breaker`): after a few consecutive
  failures, one timeout, or calls that are steadily slower than half the timeout, the
  remote is skipped entirely (no call at all) until a probe after a back-off succeeds.
* **Untrusted shares**: with no signing key, a backend that can tell that anyone may have
  written a value (a ``file://`` share writable by others or by its group,
  :meth:`~cuforge.store.remote.base.RemoteBackend.trust_problem`) gets one warning.
* **No native code unsigned**: with no signing key (neither ``secret`` nor ``keyring``),
  an entry of native host code (:func:`cuforge.store.schema.is_native`: torch objects and
  modules, the op shim, Triton's C modules; the process would ``dlopen`` it) is refused:
  a miss, counted as ``rejected`` and ``refused_native``, one warning per tier, a line per
  refusal under ``CUFORGE_VERBOSE`` / ``CUFORGE_EXPLAIN``; the caller builds it locally.
  ``CUFORGE_REMOTE_NATIVE=allow`` serves them anyway. Signed tiers serve them.
* **One signature per direct-mode hit**: a manifest this tier signs carries ``sealed``, the
  SHA-256 of the entry bytes of each variant's target this tier sealed (or read and
  verified) in this process; once a manifest's signature is verified with the keyring, a
  target whose bytes have exactly that digest is covered by it and not verified again
  (counted as ``vouched``; ``verified`` counts the signatures checked). Bytes with any
  other digest are checked as usual. ``sealed`` is dropped from the meta a reader returns.
* **Lazy**: building the tier checks the URL only; the backend imports its client library
  and connects on the first ``get`` / ``put`` (a process that hits a local tier never
  pays for the remote). A client library found missing or broken then
  (:class:`~cuforge.store.remote.base.RemoteUnavailable`) turns the tier off for the rest
  of the process, with one warning naming the fix.
* **Writes** are synchronous and bounded by the backend's timeouts (``connect_timeout`` +
  ``timeout``): when ``put`` returns, the entry is published (so a process that exits
  right after a compile has shared it). ``readonly``: nothing is ever written.
* **Stats and telemetry**: hits, misses, puts, errors, rejected in :meth:`stats`; the
  same events are recorded in the local telemetry (tier ``"remote"``) when a telemetry
  root is given, so ``cuforge cache stats`` shows them.

``delete`` does nothing (a shared cache is not one process's to delete from) and
``iterate`` yields nothing (remotes are not listed).
"""

from __future__ import annotations

from time import monotonic

from cuforge.base.config import settings as _settings
from cuforge.store import telemetry as _telemetry
from cuforge.store.base import ENTRY_KINDS, Entry, Store, StoreStats
from cuforge.store.remote.base import DEFAULT_MAX_BYTES, RemoteUnavailable
from cuforge.store.remote.breaker import CircuitBreaker
from cuforge.store.schema import is_native as _is_native

TYPE_CHECKING = False  # not `typing.TYPE_CHECKING`: importing typing costs ~10 ms
if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Iterator

    from cuforge.base.signing import Keyring, SigningKey
    from cuforge.store.base import EntryInfo
    from cuforge.store.remote.base import RemoteBackend


__all__ = ["RemoteStore"]


def _check_head(head, total: int, kind: str, key: str, max_bytes: int) -> int:
    """:func:`cuforge.store.remote.envelope.check_head`, imported on first use (building a
    tier imports no envelope code)."""
    from cuforge.store.remote.envelope import check_head

    return check_head(head, total, kind, key, max_bytes)


class RemoteStore(Store):
    """One remote cache as a tier. ``secret``: the HMAC key (sign writes, refuse unsigned
    reads); ``readonly``: never write; ``telemetry_root``: the local cache dir whose
    telemetry records this tier's events (None: none recorded)."""

    tier = "remote"
    #: not a tier that records shared telemetry under a ``root`` of its own (TieredStore)
    telemetry = False

    def __init__(
        self,
        backend: RemoteBackend,
        *,
        secret: bytes | None = None,
        readonly: bool = False,
        telemetry_root: str | None = None,
        signer: SigningKey | None = None,
        keyring: Keyring | None = None,
    ) -> None:
        self.backend = backend
        #: the private key writes are signed with (Ed25519), or None
        self.signer = signer
        #: the trusted public keys reads must be signed by, or None (any signature)
        self.keyring = keyring
        self.url = backend.describe()
        self.namespace = backend.namespace
        self.secret = secret or None
        self.readonly = bool(readonly)
        self.telemetry_root = telemetry_root
        self.breaker = CircuitBreaker(self.url, getattr(backend, "timeout", None))
        #: the largest value read or written (the backend's cap, CUFORGE_REMOTE_MAX_BYTES)
        self.max_bytes: int = getattr(backend, "max_bytes", DEFAULT_MAX_BYTES)
        #: no more trust checks once one warned (one warning per process is the point)
        self._trust_warned = False
        #: categories already warned about by this tier (once per tier, not per process)
        self._warned: set[str] = set()
        if getattr(backend, "head_check", False) is None:
            # the backend checks a value's envelope header before transferring the rest
            backend.head_check = _check_head
        self.hits = self.misses = self.puts = 0
        self.errors = self.rejected = 0
        #: native host code entries refused because this tier checks no signature
        self.refused_native = 0
        #: Ed25519 signatures verified (one per checked value), and values a verified
        #: manifest's signature covered (no second verification: see _vouch)
        self.verified = self.vouched = 0
        #: key -> SHA-256 of envelope bytes known good here: sealed by this tier's signing
        #: key, or read and checked with its keyring (what a manifest it signs may name)
        self._digests: dict[str, str] = {}
        #: key -> (SHA-256, signer name, kid) named by a manifest verified with the keyring
        self._vouches: dict[str, tuple[str, str, str]] = {}
        #: calls not made because the breaker was open
        self.skipped = 0
        self.last_error: str | None = None
        #: why the backend cannot work in this process (RemoteUnavailable), or None
        self.unavailable: str | None = None

    # ------------------------------------------------------------------ helpers
    def _warn_once(self, remote: str, category: str, message: str, *args) -> None:
        if category in self._warned:
            return
        self._warned.add(category)
        import logging

        logging.getLogger("cuforge").warning(message, *args)

    def _record(self, event: str, kind: str = "", name=None, nbytes: int = 0, seconds=0.0):
        root = self.telemetry_root
        if root is not None:
            _telemetry.record(
                root,
                event,
                tier="remote",
                kind=kind,
                name=name,
                nbytes=nbytes,
                seconds_saved=seconds,
            )

    def _failed(self, what: str, exc: BaseException) -> None:
        error = f"{what}: {type(exc).__name__}: {exc}"
        self.errors += 1
        self.last_error = error
        self._record("error")
        if isinstance(exc, RemoteUnavailable):
            self.unavailable = str(exc)
            self._warn_once(
                self.url,
                "unavailable",
                "cuforge: not using remote cache %s in this process: %s. Compiles and the "
                "local cache work without it.",
                self.url,
                exc,
            )
            return
        self.breaker.failure(error, timed_out=isinstance(exc, TimeoutError))

    def _allow(self) -> bool:
        """Whether a call may go to the backend now (usable, breaker closed or probing)."""
        if self.unavailable is None and self.breaker.allow():
            return True
        self.skipped += 1
        return False

    def _miss(self) -> None:
        self.misses += 1
        self._record("miss")

    # ------------------------------------------------------------------ Store
    def get(self, key: str, *, kind: str | None = None) -> Entry | None:
        """The entry stored under ``(kind, key)``, checked; None on a miss, without a
        ``kind`` (or with one not in :data:`~cuforge.store.base.ENTRY_KINDS`), while the breaker is open, on any failure and for any value that fails
        a check. Never raises."""
        if kind is None or kind not in ENTRY_KINDS:
            return None  # a remote addresses entries by (kind, key): nothing to ask
        if not self._allow():
            self._miss()
            return None
        start = monotonic()
        try:
            data = self.backend.get(kind, key)
        except Exception as exc:  # noqa: BLE001 - a remote (or plug-in) may raise anything; a remote never fails a compile
            self._failed("get", exc)
            self._miss()
            return None
        return self._opened(kind, key, data, monotonic() - start)

    def get_many(self, items: list[tuple[str, str]]) -> list[Entry | None]:
        """The entries stored under ``items`` (``(kind, key)`` pairs), in order, each
        checked as :meth:`get` checks it (None for a miss or a value that fails a check),
        read through the backend's batch (:meth:`RemoteBackend.get_many
        <cuforge.store.remote.base.RemoteBackend.get_many>`: Redis, 64 a round trip). A
        failure of the batch makes every item a miss, counted once. Never raises."""
        out: list[Entry | None] = [None] * len(items)
        asked = [i for i, (kind, _) in enumerate(items) if kind in ENTRY_KINDS]
        if not asked:
            return out
        if not self._allow():
            for _ in asked:
                self._miss()
            return out
        start = monotonic()
        try:
            values = self.backend.get_many([items[i] for i in asked])
            if len(values) != len(asked):
                raise ValueError(f"get_many answered {len(values)} values for {len(asked)} keys")
        except Exception as exc:  # noqa: BLE001 - a remote (or plug-in) may raise anything; a remote never fails a compile
            self._failed("get", exc)
            for _ in asked:
                self._miss()
            return out
        seconds = (monotonic() - start) / len(asked)
        for i, data in zip(asked, values, strict=True):
            kind, key = items[i]
            out[i] = self._opened(kind, key, data, seconds)
        return out

    def _opened(self, kind: str, key: str, data, seconds: float) -> Entry | None:
        """The entry in ``data`` (what the backend answered for ``(kind, key)`` after
        ``seconds``), checked; None on a miss or a value that fails a check."""
        if data is None:
            self.breaker.success(seconds)
            self._miss()
            return None
        from cuforge.store.remote.envelope import Rejected, open_envelope

        keyring = self.keyring
        seen: dict = {}
        try:
            obj, payload = open_envelope(
                data,
                ns=self.namespace,
                kind=kind,
                key=key,
                secret=self.secret,
                max_bytes=self.max_bytes,
                keyring=keyring,
                vouched=self._vouches.get(key) if keyring is not None else None,
                seen=seen,
            )
            meta = obj["meta"]
        except Rejected as exc:
            self._refused(kind, key, exc, seconds)
            self._miss()
            return None
        except Exception as exc:  # noqa: BLE001 - garbage from a remote must never fail a compile
            self._refused(kind, key, Rejected(f"{type(exc).__name__}: {exc}"), seconds)
            self._miss()
            return None
        finally:
            del data  # the remote's buffer: the payload is a copy
        self.breaker.success(seconds)
        sealed = meta.pop("sealed", None) if kind == "manifest" else None
        if keyring is not None:
            if seen.get("verified"):
                self.verified += 1
            else:
                self.vouched += 1
            if self.signer is not None:  # (only a manifest this tier signs names it)
                _remember(self._digests, key, seen["sha256"])
            if sealed is not None:
                self._vouch(sealed, meta)
        if self.secret is None and self.keyring is None:
            if _is_native(kind, meta) and not _settings().remote_native:
                self._refused_native(kind, key, meta)
                self._miss()
                return None
            if not self._trust_warned:
                self._check_trust(kind, key)
        self.hits += 1
        self._record("hit", kind, meta.get("name"), len(payload), meta.get("compile_seconds", 0.0))
        return Entry(key, kind, payload, meta)

    def _vouch(self, sealed: object, meta: dict) -> None:
        """Remember what the verified manifest whose meta is ``meta`` vouches for:
        ``sealed`` maps an entry key to the SHA-256 of its envelope's entry bytes; a later
        read of one of those keys whose bytes have that digest is covered by the manifest's
        signature (one verification per direct-mode hit, not two). Malformed: ignored."""
        if not isinstance(sealed, dict) or len(sealed) > _MAX_SEALED:
            return
        signer, kid = meta.get("signer"), meta.get("signer_kid")
        if not isinstance(signer, str) or not isinstance(kid, str):
            return
        for target, digest in sealed.items():
            if isinstance(target, str) and isinstance(digest, str) and len(digest) == 64:
                _remember(self._vouches, target, (digest, signer, kid))

    def _sealed_manifest(self, entry: Entry) -> Entry:
        """``entry`` (a manifest this tier signs) with ``meta["sealed"]``: the digest of
        each variant's target this tier knows the good bytes of (a copy; the local tiers
        keep the manifest as written)."""
        variants = entry.meta.get("variants")
        if not isinstance(variants, list) or not self._digests:
            return entry
        known = self._digests
        sealed = {}
        for v in variants[:_MAX_SEALED]:
            target = v.get("for") if isinstance(v, dict) else None
            if isinstance(target, str) and target in known:
                sealed[target] = known[target]
        if not sealed:
            return entry
        return Entry(entry.key, entry.kind, entry.payload, {**entry.meta, "sealed": sealed})

    def _refused_native(self, kind: str, key: str, meta: dict) -> None:
        """An entry of native host code from this unsigned tier: not served (the caller
        builds it), counted as ``rejected`` and ``refused_native``, warned about once per
        tier, and named on stderr each time under ``CUFORGE_VERBOSE`` / ``CUFORGE_EXPLAIN``."""
        self.rejected += 1
        self.refused_native += 1
        self._record("rejected")
        name = meta.get("name") if isinstance(meta.get("name"), str) else "?"
        line = (
            f"cuforge: remote cache {self.url}: refused {kind} {name!r} (key {key[:16]}...): "
            "native host code from a remote that checks no signature; it counts as a miss "
            "and is built here"
        )
        current = _settings()
        if current.verbose or current.explain:
            import sys

            print(line, file=sys.stderr)
        self._warn_once(
            self.url,
            "native",
            "%s. Anyone who can write to that remote could make this process load their "
            "code. Sign the remote's entries (CUFORGE_SIGNING_KEY on writers and "
            "CUFORGE_TRUSTED_KEYS on readers, or one CUFORGE_REMOTE_KEY everywhere), or "
            "accept the risk with CUFORGE_REMOTE_NATIVE=allow. Shown once per process.",
            line,
        )

    def _check_trust(self, kind: str, key: str) -> None:
        """Warn once when an unsigned value came from where anyone may write."""
        try:
            problem = self.backend.trust_problem(kind, key)
        except Exception:  # noqa: BLE001 - a plug-in's check may raise anything; no answer is no warning
            return
        if problem is None:
            return
        self._trust_warned = True
        self._warn_once(
            self.url,
            "untrusted",
            "cuforge: remote cache %s: %s, and CUFORGE_REMOTE_KEY is not set, so anyone who "
            "can write there can make this process run their code. Set the same "
            "CUFORGE_REMOTE_KEY (or CUFORGE_REMOTE_KEY_FILE) on writers and readers, or "
            "restrict the directory's mode (chmod -R o-w; g-w for a group). Native host code "
            "from it is refused (CUFORGE_REMOTE_NATIVE=allow serves it). Shown once per "
            "process.",
            self.url,
            problem,
        )

    def _refused(self, kind: str, key: str, exc, seconds: float = 0.0) -> None:
        if exc.trust:
            self.breaker.success(seconds)  # the remote works; the value is not ours to use
            self.rejected += 1
            self._record("rejected")
            self._warn_once(
                self.url,
                "rejected",
                "cuforge: refused an entry of remote cache %s (%s %s...): %s. It counts as a "
                "miss; writers must sign with a key the readers trust (CUFORGE_REMOTE_KEY: the "
                "same shared key; CUFORGE_SIGNING_KEY: a key in the readers' "
                "CUFORGE_TRUSTED_KEYS). Shown once per process.",
                self.url,
                kind,
                key[:16],
                exc.reason,
            )
        else:
            self.errors += 1
            self.last_error = f"bad value: {exc.reason}"
            self._record("error")
            # a remote that answers garbage is as useless as one that is down
            self.breaker.failure(self.last_error)
            self._warn_once(
                self.url,
                "garbage",
                "cuforge: remote cache %s returned a damaged value for %s %s...: %s. It "
                "counts as a miss (and an error). Shown once per process.",
                self.url,
                kind,
                key[:16],
                exc.reason,
            )

    def put(self, entry: Entry, *, durable: bool = True) -> bool:
        """Publish ``entry`` (signed when a key is set). False when read-only, with a
        keyring but no signing key (every reader holding the keyring would refuse it), while the
        breaker is open, for a value over the size cap, or when the backend failed (counted
        as an error). Returns within the backend's timeouts; never raises."""
        if self.readonly or (self.keyring is not None and self.signer is None):
            return False  # (a keyring without a signing key: readers would refuse it)
        if not self._allow():
            return False
        from cuforge.store.remote.envelope import seal_with_digest

        signer = self.signer
        if signer is not None and entry.kind == "manifest":
            entry = self._sealed_manifest(entry)
        try:
            data, digest = seal_with_digest(entry, self.namespace, self.secret, signer)
        except (TypeError, ValueError) as exc:  # meta that is not JSON: the disk tier's bug too
            self._failed("put", exc)
            return False
        if len(data) > self.max_bytes:
            return False  # no reader would accept it (CUFORGE_REMOTE_MAX_BYTES)
        start = monotonic()
        try:
            self.backend.put(entry.kind, entry.key, data)
        except Exception as exc:  # noqa: BLE001 - a remote (or plug-in) may raise anything; a remote never fails a compile
            self._failed("put", exc)
            return False
        self.breaker.success(monotonic() - start)
        self.puts += 1
        if signer is not None:
            _remember(self._digests, entry.key, digest)
        self._record("put", entry.kind, entry.meta.get("name"), len(entry.payload))
        return True

    def contains(self, key: str, *, kind: str | None = None) -> bool:
        return self.get(key, kind=kind) is not None

    # ------------------------------------------------------------------ build leases
    @property
    def leases(self) -> bool:
        """Whether this tier can hand out build leases: its backend supports them, it is
        writable (a read-only reader never publishes, so it never builds for others) and
        usable in this process."""
        return (
            bool(getattr(self.backend, "supports_leases", False))
            and not self.readonly
            and self.unavailable is None
        )

    def lease(self, key: str, ttl: float, holder: str) -> tuple[str, int | str | None]:
        """Try the build lease of ``key``: ``("taken", token)``, ``("held", who)`` while
        another holds it, or ``("off", None)`` when no lease can be had (no support, the
        breaker is open, the backend failed: counted, then local single flight only).
        Never raises."""
        if not self.leases or not self._allow():
            return "off", None
        start = monotonic()
        try:
            token, who = self.backend.lease("build", key, ttl, holder)
        except Exception as exc:  # noqa: BLE001 - a remote (or plug-in) may raise anything; a remote never fails a compile
            self._failed("lease", exc)
            return "off", None
        self.breaker.success(monotonic() - start)
        return ("taken", token) if token is not None else ("held", who)

    def renew(self, key: str, token: int, ttl: float) -> bool:
        """Extend the lease ``token`` holds; False when lost or on any failure. Never raises."""
        try:
            return bool(self.backend.renew("build", key, token, ttl))
        except Exception:  # noqa: BLE001 - a lost renewal costs at worst a second build elsewhere
            return False

    def release(self, key: str, token: int) -> None:
        """Drop the lease ``token`` holds (best effort: an unreleased lease expires)."""
        try:
            self.backend.release("build", key, token)
        except Exception:  # noqa: BLE001 - an unreleased lease expires by itself
            pass

    def delete(self, key: str) -> bool:
        """Nothing: a shared cache is not one process's to delete from (False)."""
        return False

    def iterate(self) -> Iterator[EntryInfo]:
        """Nothing: remotes are not listed."""
        return iter(())

    def stats(self) -> StoreStats:
        """This process's counters; ``extra``: ``url`` (redacted), ``backend`` (class
        name), ``namespace``, ``signed``, ``readonly``, ``breaker`` ("open"/"closed"),
        ``skipped`` (calls the open breaker or an unavailable backend saved),
        ``last_error``, ``unavailable`` (why the backend cannot work in this process, or
        None). Never contacts the remote."""
        return StoreStats(
            "remote",
            hits=self.hits,
            misses=self.misses,
            puts=self.puts,
            errors=self.errors,
            rejected=self.rejected,
            extra={
                "url": self.url,
                "backend": type(self.backend).__name__,
                "namespace": self.namespace,
                "signed": self.secret is not None,
                "signing_key": self.signer.name if self.signer is not None else None,
                "trusted_keys": len(self.keyring) if self.keyring is not None else None,
                "readonly": self.readonly,
                "breaker": self.breaker.state(),
                "skipped": self.skipped,
                "refused_native": self.refused_native,
                "verified": self.verified,
                "vouched": self.vouched,
                "last_error": self.last_error,
                "unavailable": self.unavailable,
            },
        )

    def close(self) -> None:
        """Close the backend's connections (never raises)."""
        try:
            self.backend.close()
        except Exception:  # noqa: BLE001 - a remote (or plug-in) may raise anything; closing is best effort
            pass

    def __repr__(self) -> str:
        return f"RemoteStore({self.url!r}{', read-only' if self.readonly else ''})"


#: the most targets a manifest's ``sealed`` map names (a manifest has at most 8 variants)
_MAX_SEALED = 64
#: entries remembered per map (_digests, _vouches) before it starts over
_REMEMBERED = 16384


def _remember(table: dict, key: str, value) -> None:
    if len(table) >= _REMEMBERED and key not in table:
        table.clear()
    table[key] = value
