"""The Redis backend: ``redis://[user:password@]host:port/db`` and ``rediss://`` (TLS).

Entries live under ``cuforge:{namespace}:{kind}:{key}`` as plain string values, so one Redis
can serve several cuforge versions (and other tenants) without collisions, and an operator
can see, count and drop cuforge's keys with ``SCAN MATCH cuforge:*``.

Talks to Redis through cuforge's own small RESP2 client (:mod:`cuforge.store.remote.resp`:
redis-py's import alone costs ~85 ms, and nothing of it was used beyond sending commands),
connecting on the backend's first ``get`` / ``put`` / ``contains``, never by ``import
cuforge`` nor by building the backend. Guarantees, on top of
:class:`~cuforge.store.remote.base.RemoteBackend`'s:

* one connection pool per backend, shared by every thread (a connection per concurrent
  call); a forked child opens its own connections (the pool checks the pid);
* connecting takes at most ``connect_timeout``, and then a whole ``get`` / ``put`` /
  ``contains`` at most ``timeout`` (a deadline: the socket's timeout bounds each
  ``recv``, so a watchdog shuts the connection's socket down when the deadline passes and
  the call fails with :class:`~cuforge.store.remote.base.RemoteTimeout`);
* a ``get`` asks ``STRLEN`` and the first bytes (``GETRANGE``) in one round trip, refuses a
  value over ``max_bytes`` or with a bad header
  (:meth:`~cuforge.store.remote.base.RemoteBackend.check_head`) before transferring the
  rest, and reads the rest in ``GETRANGE`` chunks into one buffer;
* :meth:`RedisBackend.get_many` reads a batch of entries (``cuforge prefetch``) in one
  round trip per 64 keys;
* nothing retries on its own (the tier's circuit breaker decides when to try again), and
  no extra commands are sent on connect besides ``AUTH`` / ``SELECT`` when the URL asks for
  them (RESP2, no ``CLIENT SETINFO``);
* every failure (refused, timed out, out of memory, wrong type, ...) is a
  :class:`~cuforge.store.remote.base.RemoteError` naming the URL without its password.
"""

from __future__ import annotations

import os
import time
from _thread import allocate_lock

from cuforge.store.remote.base import (
    RemoteBackend,
    RemoteError,
    RemoteTimeout,
    redact,
    split_url,
)

__all__ = ["RedisBackend", "parse_url"]

#: the TLS options a URL may carry (redis-py's names)
_TLS_OPTIONS = (
    "ssl_ca_certs",
    "ssl_certfile",
    "ssl_keyfile",
    "ssl_cert_reqs",
    "ssl_check_hostname",
)

#: bytes a get asks for with STRLEN (most entries: all of them, in one round trip; never
#: more than the cap)
_FIRST = 256 * 1024
#: bytes per GETRANGE after that (a reply is buffered whole: this bounds the extra copy)
_CHUNK = 4 * 1024 * 1024
#: keys per round trip of get_many
_BATCH = 64
#: the most bytes one SCAN reply may hold (names of at most 1000 keys, with room to spare)
_SCAN_REPLY_BYTES = 16 * 1024 * 1024
#: the most bytes a lease's value may hold ("<token> <holder>")
_LEASE_BYTES = 64 * 1024


class RedisBackend(RemoteBackend):
    """A Redis server (or anything speaking its protocol: Valkey, KeyDB, Dragonfly).

    The constructor only checks ``url``; the first ``get`` / ``put`` / ``contains``
    connects, so building a backend is cheap and does not fail for a server that is down.
    The constructor raises :class:`RemoteError` when ``url`` cannot name a Redis database
    (wrong scheme, bad port, a db that is not a number, an unknown query option).
    """

    schemes = ("redis", "rediss")

    def setup(self) -> None:
        try:
            self._opts = parse_url(self.url)
        except ValueError as exc:
            raise RemoteError(f"remote cache {redact(self.url)}: {exc}") from None
        self._prefix = f"cuforge:{self.namespace}:"
        self._resp = None  # cuforge.store.remote.resp, and the pool: on the first call
        self._pool = None
        self._lock = allocate_lock()

    def _connections(self):
        """The pool (built on first use: imports the client, which imports ``socket``)."""
        pool = self._pool
        if pool is None:
            with self._lock:
                if self._pool is None:
                    from cuforge.store.remote import resp

                    self._resp = resp
                    self._pool = resp.Pool(
                        self._opts, self.connect_timeout, self.timeout, self.max_bytes
                    )
                pool = self._pool
        return pool

    def _key(self, kind: str, key: str) -> str:
        return f"{self._prefix}{kind}:{key}"

    def _fail(self, op: str, kind: str, key: str, exc: BaseException) -> RemoteError:
        what = type(exc).__name__
        timed_out = isinstance(exc, TimeoutError)  # socket.timeout is TimeoutError
        return (RemoteTimeout if timed_out else RemoteError)(
            f"remote cache {self.describe()}: {op} {kind}/{key[:16]} failed: {what}: {exc}"
        )

    def _call(self, op: str, kind: str, key: str, work):
        """``work(connection)`` on a connection of the pool, the whole of it within
        ``timeout`` after connecting (a watchdog shuts the socket down at the deadline);
        server, protocol and socket errors become :class:`RemoteError` /
        :class:`RemoteTimeout`."""
        pool = self._connections()
        try:
            conn = pool.get()
        except OSError as exc:
            raise self._fail(op, kind, key, exc) from exc
        import threading

        fired: list[bool] = []
        timer = threading.Timer(self.timeout, _cut, (conn, fired))
        timer.daemon = True
        ok = False
        try:
            timer.start()
            result = work(conn)
            ok = True
            return result
        except self._resp.ReplyError as exc:
            raise RemoteError(
                f"remote cache {self.describe()}: {op} {kind}/{key[:16]} failed: {exc}"
            ) from exc
        except OSError as exc:  # socket, TLS and protocol errors; RemoteError is one too
            if fired and not isinstance(exc, RemoteTimeout):
                raise RemoteTimeout(
                    f"remote cache {self.describe()}: {op} {kind}/{key[:16]}: Timeout: not done "
                    f"within {self.timeout:g} s (CUFORGE_REMOTE_TIMEOUT)"
                ) from exc
            if isinstance(exc, RemoteError) and not isinstance(exc, self._resp.ProtocolError):
                raise
            raise self._fail(op, kind, key, exc) from exc
        finally:
            timer.cancel()
            if ok and not fired:
                pool.release(conn)
            else:  # a reply may be half read, or the socket is shut down
                pool.discard(conn)

    def get(self, kind: str, key: str) -> bytes | bytearray | None:
        """The value of ``cuforge:{namespace}:{kind}:{key}``, or None when it is not set.
        Its size and first bytes are checked before the rest is transferred: a batch of one
        (:meth:`get_many`), one round trip for most entries."""
        return self.get_many([(kind, key)])[0]

    def _rest(self, conn, kind: str, key: str, exists, size, first, first_end: int):
        """The value whose ``EXISTS``, ``STRLEN`` and first ``GETRANGE`` answered
        ``exists``, ``size`` and ``first``: checked, and the rest read on ``conn``."""
        if not isinstance(size, int) or not isinstance(first, bytes):
            raise RemoteError(
                f"remote cache {self.describe()}: GET {kind}/{key[:16]} answered a "
                f"{type(first).__name__}, not bytes"
            )
        if not exists:
            return None
        if size == 0:
            return b""
        end = self.check_head(first, size, kind, key)
        if len(first) >= size:
            return first
        name = self._key(kind, key)
        deadline = time.monotonic() + self.timeout
        data = bytearray(size)
        data[: len(first)] = first
        done = len(first)
        del first
        while done < size:
            if time.monotonic() > deadline:
                raise TimeoutError(f"Timeout: the deadline of {self.timeout:g} s passed")
            stop = min(size, done + _CHUNK)
            conn.send(("GETRANGE", name, done, stop - 1))
            chunk = conn.read(stop - done)
            if not isinstance(chunk, bytes) or len(chunk) != stop - done:
                raise RemoteError(
                    f"remote cache {self.describe()}: GET {kind}/{key[:16]}: the value "
                    "changed while it was read"
                )
            data[done:stop] = chunk
            done = stop
        if end > first_end + 1:  # a header longer than the first read: check it whole now
            self.check_head(memoryview(data)[:end], size, kind, key)
        return data

    def get_many(self, items: list[tuple[str, str]]) -> list[bytes | bytearray | None]:
        """The values of ``items`` (``(kind, key)`` pairs), in order, None for each one not
        set: the first bytes of up to 64 values per round trip (each round trip one call,
        within ``timeout``), the rest of a large one as :meth:`get` reads it. A value that
        fails its checks fails the batch (the tier then counts one error)."""
        first_end = min(_FIRST, self.max_bytes) - 1  # an oversized value costs at most the cap
        out: list[bytes | bytearray | None] = []
        for start in range(0, len(items), _BATCH):
            batch = items[start : start + _BATCH]
            kind0, key0 = batch[0]

            def work(conn, batch=batch):
                # EXISTS tells a missing key from an empty value (STRLEN is 0 for both)
                commands = []
                for kind, key in batch:
                    name = self._key(kind, key)
                    commands += [
                        ("EXISTS", name),
                        ("STRLEN", name),
                        ("GETRANGE", name, 0, first_end),
                    ]
                conn.send(*commands)
                small, first = self._resp.SMALL, first_end + 1
                replies = [conn.read(first if i % 3 == 2 else small) for i in range(len(commands))]
                return [
                    self._rest(conn, kind, key, *replies[3 * i : 3 * i + 3], first_end)
                    for i, (kind, key) in enumerate(batch)
                ]

            out += self._call("GET", kind0, key0, work)
        return out

    def put(self, kind: str, key: str, data: bytes) -> None:
        """``SET`` the value, with ``EX ttl`` (rounded up to whole seconds) when ttl > 0."""
        ex = max(1, -int(-self.ttl // 1)) if self.ttl > 0 else None  # ceil, without math
        args = ("SET", self._key(kind, key), bytes(data)) + (("EX", ex) if ex else ())

        def work(conn):
            conn.send(args)
            return conn.read(self._resp.SMALL)

        self._call("SET", kind, key, work)

    def contains(self, kind: str, key: str) -> bool:
        """``EXISTS``: one round trip, no value transferred."""
        name = self._key(kind, key)

        def work(conn):
            conn.send(("EXISTS", name))
            return bool(conn.read(self._resp.SMALL))

        return self._call("EXISTS", kind, key, work)

    # ------------------------------------------------------------------ build leases
    supports_leases = True

    def scan_keys(self, limit: int | None = None) -> tuple[list[tuple[str, str]], int | None]:
        """``(kind, key)`` of the entries of this namespace, found by ``SCAN MATCH
        cuforge:{namespace}:*`` (``cuforge cache explain --remote``: Redis keeps no index of
        names), looking at ``limit`` keys at most (default :data:`SCAN_LIMIT`); and, when the
        scan stopped at that cap before the end, how many keys it looked at (else None). Leases and names that are not an entry's are left out. The whole
        scan takes at most ``timeout``, like any call."""
        from cuforge.base.layout import is_entry_key
        from cuforge.store.base import ENTRY_KINDS

        limit = SCAN_LIMIT if limit is None else max(1, limit)
        prefix = self._prefix.encode("utf-8")
        pattern = b"".join(b"\\" + bytes([c]) if c in b"*?[]\\" else bytes([c]) for c in prefix)

        def work(conn):
            cursor, seen, found = b"0", 0, []
            while True:
                count = max(1, min(1000, limit - seen))
                conn.send(("SCAN", cursor, "MATCH", pattern + b"*", "COUNT", count))
                reply = conn.read(_SCAN_REPLY_BYTES)
                if not (isinstance(reply, list) and len(reply) == 2):
                    raise RemoteError(f"remote cache {self.describe()}: SCAN answered {reply!r}")
                cursor, names = reply
                for raw in names:
                    seen += 1
                    kind, sep, key = raw[len(prefix) :].decode("utf-8", "replace").partition(":")
                    if sep and kind in ENTRY_KINDS and is_entry_key(key):
                        found.append((kind, key))
                if cursor in (b"0", 0, "0"):
                    return found, None
                if seen >= limit:
                    return found, seen

        return self._call("SCAN", "*", "", work)

    def _lease_key(self, kind: str, key: str) -> str:
        return f"{self._prefix}lease:{kind}:{key}"

    def lease(self, kind: str, key: str, ttl: float, holder: str) -> tuple[int | None, str]:
        """``SET lease:<kind>:<key> "<token> <holder>" NX PX <ttl>``, and when another holds
        it, its value, in one script (one round trip): Redis expires a dead holder's lease
        by itself. A lease another left without expiry, or with more than ``ttl`` to live
        (planted, or re-set without ``PX``), is cut to ``ttl`` by the same script, so it
        holds one TTL of this reader's at most. The token is 56 random bits, which the
        renew and release scripts compare: only the holder can extend or drop its lease.
        (No shared counter: a value anyone can overwrite, e.g. with garbage, must not be
        able to stop every lease.)"""
        name = self._lease_key(kind, key)
        px = max(1, int(ttl * 1000))
        token = int.from_bytes(os.urandom(7), "big") or 1
        value = f"{token} {holder}"

        def work(conn):
            conn.send(("EVAL", _LEASE, 1, name, value, px))
            reply = conn.read(_LEASE_BYTES)
            if not (isinstance(reply, list) and len(reply) == 2):
                raise RemoteError(f"remote cache {self.describe()}: LEASE answered {reply!r}")
            taken, current = reply
            if taken == 1:
                return token, holder
            text = current.decode("utf-8", "replace") if isinstance(current, bytes) else ""
            return None, text.partition(" ")[2]

        return self._call("LEASE", kind, key, work)

    def renew(self, kind: str, key: str, token: int, ttl: float) -> bool:
        """``PEXPIRE`` the lease when ``token`` still holds it (one script, atomic)."""
        return bool(self._script(_RENEW, "RENEW", kind, key, token, max(1, int(ttl * 1000))))

    def release(self, kind: str, key: str, token: int) -> None:
        """``DEL`` the lease when ``token`` still holds it (one script, atomic)."""
        self._script(_RELEASE, "RELEASE", kind, key, token)

    def _script(self, script: str, op: str, kind: str, key: str, token: int, *args):
        name = self._lease_key(kind, key)

        def work(conn):
            conn.send(("EVAL", script, 1, name, f"{token} ", *args))
            return conn.read(self._resp.SMALL)

        return self._call(op, kind, key, work)

    def close(self) -> None:
        """Close the pool's idle connections (idempotent; a later call reconnects)."""
        if self._pool is not None:
            self._pool.disconnect()


#: KEYS[1]: the lease; ARGV[1]: the value "<token> <holder>"; ARGV[2]: the TTL (ms).
#: Returns {1, value} when taken, else {0, the holder's value}, after cutting a lease with
#: no expiry (PTTL -1) or more than ARGV[2] ms to live down to ARGV[2] ms.
_LEASE = (
    "if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then "
    "return {1, ARGV[1]} end "
    "local v = redis.call('GET', KEYS[1]) "
    "local t = redis.call('PTTL', KEYS[1]) "
    "if t == -1 or t > tonumber(ARGV[2]) then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end "
    "return {0, v or ''}"
)
#: KEYS[1]: the lease; ARGV[1]: "<token> " (the value's prefix); ARGV[2]: the new TTL (ms)
_RENEW = (
    "local v = redis.call('GET', KEYS[1]) "
    "if v and string.sub(v, 1, #ARGV[1]) == ARGV[1] then "
    "return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0"
)
_RELEASE = (
    "local v = redis.call('GET', KEYS[1]) "
    "if v and string.sub(v, 1, #ARGV[1]) == ARGV[1] then "
    "return redis.call('DEL', KEYS[1]) end return 0"
)


#: how many keys :meth:`RedisBackend.scan_keys` looks at, at most
SCAN_LIMIT = 5000


def _cut(conn, fired: list) -> None:
    """The watchdog: the deadline passed, so end the call's blocking ``recv`` / ``send``."""
    fired.append(True)
    sock = getattr(conn, "_sock", None)
    if sock is not None:
        import socket

        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already closed


def parse_url(url: str) -> dict:
    """The connection options in ``url``, read as redis-py reads them for what cuforge
    needs: ``redis://[[user]:password@]host[:port][/db]`` and ``rediss://`` (TLS, verified
    by default), user and password percent-decoded, and the TLS options ``ssl_ca_certs``,
    ``ssl_certfile``, ``ssl_keyfile``, ``ssl_cert_reqs`` (``none`` / ``optional`` /
    ``required``) and ``ssl_check_hostname`` (on ``rediss://`` only: on ``redis://`` they
    would be ignored, so they are refused by name). Any other query option is refused by name,
    never ignored; so is what a client would silently misread (a db path that is not a
    number, port 0, no host). Raises ``ValueError`` saying what is wrong (the caller adds
    the redacted URL)."""
    try:
        parts = split_url(url)
    except ValueError as exc:
        raise ValueError(f"bad Redis URL: {exc}") from None
    if parts.scheme not in RedisBackend.schemes:
        raise ValueError(
            f"the Redis backend serves redis:// and rediss:// URLs, not {parts.scheme}://"
        )
    if not parts.hostname:
        raise ValueError("no host; expected redis://[:password@]host:port/db")
    if parts.port == 0:
        raise ValueError("port 0 is not a port")
    db = parts.path.strip("/") or "0"
    if not db.isdigit():
        raise ValueError(
            f"the path must be a database number (redis://host:6379/0), not {parts.path!r}"
        )
    opts: dict = {
        "host": parts.hostname,
        "port": parts.port or 6379,
        "db": int(db),
        "username": _unquote(parts.username) if parts.username else None,
        "password": _unquote(parts.password) if parts.password is not None else None,
        "tls": parts.scheme == "rediss",
    }
    for pair in (parts.query or "").split("&"):
        if not pair:
            continue
        name, _, value = pair.partition("=")
        name, value = _unquote(name), _unquote(value.replace("+", " "))
        if name not in _TLS_OPTIONS:
            raise ValueError(
                f"bad Redis URL: unknown option {name!r} (cuforge's Redis client takes "
                f"{', '.join(_TLS_OPTIONS)}, on rediss:// URLs)"
            )
        if not opts["tls"]:
            raise ValueError(
                f"bad Redis URL: {name!r} is a TLS option, and redis:// does not use TLS "
                "(it would be ignored): use rediss:// for TLS, or drop the option"
            )
        opts[name] = value
    reqs = opts.get("ssl_cert_reqs", "required").lower()
    if reqs not in ("none", "optional", "required"):
        raise ValueError(
            f"bad Redis URL: ssl_cert_reqs must be none, optional or required, not {reqs!r}"
        )
    opts["ssl_cert_reqs"] = reqs
    check = opts.get("ssl_check_hostname")
    if check is not None:  # a bool from here on (None: not given)
        flag = check.lower()
        if flag not in ("true", "false", "1", "0", "yes", "no"):
            raise ValueError(
                f"bad Redis URL: ssl_check_hostname must be true or false, not {check!r}"
            )
        opts["ssl_check_hostname"] = flag in ("true", "1", "yes")
    return opts


def _unquote(text: str) -> str:
    """Percent-decoded ``text``; :mod:`urllib.parse` is imported only when there is a
    ``%`` (a backend is built by every process with ``CUFORGE_REMOTE`` set)."""
    if "%" not in text:
        return text
    from urllib.parse import unquote

    return unquote(text)
