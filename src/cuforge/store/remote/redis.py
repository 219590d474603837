"""The Redis backend: ``redis://[user:password@]host:port/db`` and ``rediss://`` (TLS).

Entries live under ``cuforge:{namespace}:{kind}:{key}`` as plain string values, so one Redis
can serve several cuforge versions (and other tenants) without collisions, and an operator
can see, count and drop cuforge's keys with ``SCAN MATCH cuforge:*``.

Talks to Redis through redis-py (the ``redis`` extra: ``pip install 'cuforge[redis]'``),
imported on the backend's first ``get`` / ``put`` / ``contains``, never by ``import
cuforge`` nor by building the backend: a process that hits its local cache never imports
redis-py (~65 ms) nor connects. Guarantees, on top of
:class:`~cuforge.store.remote.base.RemoteBackend`'s:

* one redis-py client (and connection pool) per backend, shared by every thread; a forked
  child opens its own connections (redis-py checks the pid);
* connecting takes at most ``connect_timeout``, and then a whole ``get`` / ``put`` /
  ``contains`` at most ``timeout`` (a deadline: redis-py's own timeout bounds each
  ``recv``, so a watchdog shuts the connection's socket down when the deadline passes and
  the call fails with :class:`~cuforge.store.remote.base.RemoteTimeout`);
* a ``get`` asks ``STRLEN`` and the first bytes (``GETRANGE``) in one round trip, refuses a
  value over ``max_bytes`` or with a bad header
  (:meth:`~cuforge.store.remote.base.RemoteBackend.check_head`) before transferring the
  rest, and reads the rest in ``GETRANGE`` chunks into one buffer;
* redis-py never retries on its own (the tier's circuit breaker decides when to try again),
  and no extra commands are sent on connect besides ``AUTH`` / ``SELECT`` when the URL asks
  for them (RESP2, no ``CLIENT SETINFO``);
* every failure (refused, timed out, out of memory, wrong type, ...) is a
  :class:`~cuforge.store.remote.base.RemoteError` naming the URL without its password.
"""

from __future__ import annotations

import os
import sys
import time
from _thread import allocate_lock

from cuforge.store.remote.base import (
    RemoteBackend,
    RemoteError,
    RemoteTimeout,
    RemoteUnavailable,
    redact,
    split_url,
)

__all__ = ["RedisBackend"]

_INSTALL_HINT = "pip install 'cuforge[redis]'"
#: bytes a get asks for with STRLEN (most entries: all of them, in one round trip; never
#: more than the cap)
_FIRST = 256 * 1024
#: bytes per GETRANGE after that (redis-py buffers a reply whole: this bounds the extra copy)
_CHUNK = 4 * 1024 * 1024


class RedisBackend(RemoteBackend):
    """A Redis server (or anything speaking its protocol: Valkey, KeyDB, Dragonfly).

    The constructor only checks ``url`` and that redis-py is installed (without importing
    it); the first ``get`` / ``put`` / ``contains`` imports redis-py, builds the client and
    connects, so building a backend is cheap and does not fail for a server that is down.
    The constructor raises :class:`RemoteError` when redis-py is not installed or when
    ``url`` cannot name a Redis database (wrong scheme, bad port, a db that is not a
    number); a redis-py that fails to import on first use raises
    :class:`~cuforge.store.remote.base.RemoteUnavailable`.
    """

    schemes = ("redis", "rediss")

    def setup(self) -> None:
        if _redis_missing():
            raise RemoteError(
                f"remote cache {redact(self.url)}: the Python package 'redis' is not installed; "
                f"install it with: {_INSTALL_HINT}, or remove this URL from CUFORGE_REMOTE"
            )
        _check_url(self.url)
        self._prefix = f"cuforge:{self.namespace}:"
        self._redis = None  # the redis module, once imported
        self._pool = None
        self._client_obj = None
        self._lock = allocate_lock()

    def _client(self):
        """The redis-py client (one per backend, shared by every thread), built on first
        use: imports redis-py."""
        client = self._client_obj
        if client is not None:
            return client
        with self._lock:
            if self._client_obj is None:
                self._build()
            return self._client_obj

    def _build(self) -> None:
        try:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError as exc:
            raise RemoteUnavailable(
                f"remote cache {redact(self.url)}: the Python package 'redis' cannot be "
                f"imported ({exc}); install it with: {_INSTALL_HINT}, or remove this URL from "
                "CUFORGE_REMOTE"
            ) from exc
        try:
            pool = redis.ConnectionPool.from_url(
                self.url,
                socket_connect_timeout=self.connect_timeout,
                socket_timeout=self.timeout,
                retry=Retry(NoBackoff(), 0),
                retry_on_timeout=False,
                health_check_interval=0,
                protocol=2,
                driver_info=None,
            )
        except (ValueError, TypeError, redis.RedisError) as exc:
            raise RemoteUnavailable(
                f"remote cache {redact(self.url)}: not a usable Redis URL ({exc}); expected "
                "redis://[:password@]host:port/db or rediss://..."
            ) from exc
        self._redis = redis
        self._pool = pool
        self._client_obj = redis.Redis(connection_pool=pool)

    def _key(self, kind: str, key: str) -> str:
        return f"{self._prefix}{kind}:{key}"

    def _fail(self, op: str, kind: str, key: str, exc: BaseException) -> RemoteError:
        what = type(exc).__name__
        timed_out = isinstance(exc, (TimeoutError, self._redis.TimeoutError))  # type: ignore[union-attr]
        return (RemoteTimeout if timed_out else RemoteError)(
            f"remote cache {self.describe()}: {op} {kind}/{key[:16]} failed: {what}: {exc}"
        )

    def _call(self, op: str, kind: str, key: str, work):
        """``work(connection)`` on a connection of the pool, the whole of it within
        ``timeout`` after connecting (a watchdog shuts the socket down at the deadline);
        redis-py's and socket errors become :class:`RemoteError` / :class:`RemoteTimeout`."""
        self._client()
        redis, pool = self._redis, self._pool
        try:
            try:
                conn = pool.get_connection()
            except TypeError:  # redis-py < 5.3 wants a command name
                conn = pool.get_connection(op)
        except (redis.RedisError, OSError) as exc:  # type: ignore[union-attr]
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
        except (redis.RedisError, OSError) as exc:  # type: ignore[union-attr]
            if fired and not isinstance(exc, RemoteError):
                raise RemoteTimeout(
                    f"remote cache {self.describe()}: {op} {kind}/{key[:16]}: Timeout: not done "
                    f"within {self.timeout:g} s (CUFORGE_REMOTE_TIMEOUT)"
                ) from exc
            if isinstance(exc, RemoteError):
                raise
            raise self._fail(op, kind, key, exc) from exc
        finally:
            timer.cancel()
            if not ok or fired:  # a reply may be half read, or the socket is shut down
                conn.disconnect()
            pool.release(conn)

    def get(self, kind: str, key: str) -> bytes | bytearray | None:
        """The value of ``cuforge:{namespace}:{kind}:{key}``, or None when it is not set.
        Its size and first bytes are checked before the rest is transferred."""
        name = self._key(kind, key)
        first_end = min(_FIRST, self.max_bytes) - 1  # an oversized value costs at most the cap

        def work(conn):
            # one round trip; EXISTS tells a missing key from an empty value (STRLEN is 0
            # for both)
            conn.send_packed_command(
                conn.pack_commands(
                    [("EXISTS", name), ("STRLEN", name), ("GETRANGE", name, 0, first_end)]
                )
            )
            exists = conn.read_response()
            size = conn.read_response()
            first = conn.read_response()
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
            deadline = time.monotonic() + self.timeout
            data = bytearray(size)
            data[: len(first)] = first
            done = len(first)
            del first
            while done < size:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"Timeout: the deadline of {self.timeout:g} s passed")
                stop = min(size, done + _CHUNK)
                conn.send_command("GETRANGE", name, done, stop - 1)
                chunk = conn.read_response()
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

        return self._call("GET", kind, key, work)

    def put(self, kind: str, key: str, data: bytes) -> None:
        """``SET`` the value, with ``EX ttl`` (rounded up to whole seconds) when ttl > 0."""
        ex = max(1, -int(-self.ttl // 1)) if self.ttl > 0 else None  # ceil, without math
        args = ("SET", self._key(kind, key), bytes(data)) + (("EX", ex) if ex else ())

        def work(conn):
            conn.send_command(*args)
            return conn.read_response()

        self._call("SET", kind, key, work)

    def contains(self, kind: str, key: str) -> bool:
        """``EXISTS``: one round trip, no value transferred."""
        name = self._key(kind, key)

        def work(conn):
            conn.send_command("EXISTS", name)
            return bool(conn.read_response())

        return self._call("EXISTS", kind, key, work)

    # ------------------------------------------------------------------ build leases
    supports_leases = True

    def scan_keys(self, limit: int | None = None) -> tuple[list[tuple[str, str]], int | None]:
        """``(kind, key)`` of the entries of this namespace, found by ``SCAN MATCH
        cuforge:{namespace}:*`` (``cuforge cache explain --remote``: Redis keeps no index of
        names), looking at ``limit`` keys at most (default :data:`SCAN_LIMIT`); and, when the
        scan stopped at that cap before the end, how many keys it looked at (else None). Leases and names that are not an entry's are left out. The whole
        scan takes at most ``timeout``, like any call."""
        from cuforge.layout import is_entry_key
        from cuforge.store.base import ENTRY_KINDS

        limit = SCAN_LIMIT if limit is None else max(1, limit)
        prefix = self._prefix.encode("utf-8")
        pattern = b"".join(b"\\" + bytes([c]) if c in b"*?[]\\" else bytes([c]) for c in prefix)

        def work(conn):
            cursor, seen, found = b"0", 0, []
            while True:
                count = max(1, min(1000, limit - seen))
                conn.send_command("SCAN", cursor, "MATCH", pattern + b"*", "COUNT", count)
                reply = conn.read_response()
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
        """``SET lease:<kind>:<key> "<token> <holder>" NX PX <ttl>`` (and ``GET`` it, in the
        same round trip): Redis expires a dead holder's lease by itself. The token is 56
        random bits, which the renew and release scripts compare: only the holder can
        extend or drop its lease. (No shared counter: a value anyone can overwrite, e.g.
        with garbage, must not be able to stop every lease.)"""
        name = self._lease_key(kind, key)
        px = max(1, int(ttl * 1000))
        token = int.from_bytes(os.urandom(7), "big") or 1
        value = f"{token} {holder}"

        def work(conn):
            conn.send_packed_command(
                conn.pack_commands([("SET", name, value, "NX", "PX", px), ("GET", name)])
            )
            taken = conn.read_response()
            current = conn.read_response()
            if taken:
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
            conn.send_command("EVAL", script, 1, name, f"{token} ", *args)
            return conn.read_response()

        return self._call(op, kind, key, work)

    def close(self) -> None:
        """Close the pool's connections (idempotent; a later call reconnects; nothing to do
        before the first call)."""
        if self._pool is None:
            return
        try:
            self._pool.disconnect()
        except (self._redis.RedisError, OSError) as exc:  # type: ignore[union-attr]
            raise RemoteError(f"remote cache {self.describe()}: closing failed: {exc}") from exc


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


def _redis_missing() -> bool:
    """Whether redis-py is not installed, answered without importing it (~65 ms): a
    ``redis`` package directory on ``sys.path`` settles it with a stat or two; only when
    none is there is the import system asked (a zip, an editable install...)."""
    if "redis" in sys.modules:
        return sys.modules["redis"] is None  # None: imports of it are blocked
    for entry in sys.path:
        if os.path.isfile(os.path.join(entry or os.curdir, "redis", "__init__.py")):
            return False
    from importlib.util import find_spec

    try:
        return find_spec("redis") is None
    except (ImportError, ValueError):
        return True


def _check_url(url: str) -> None:
    """Refuse what redis-py would silently misread: a db path that is not a number, a port
    that is not one, a missing host."""
    try:
        parts = split_url(url)
    except ValueError as exc:
        raise RemoteError(f"remote cache {redact(url)}: bad Redis URL: {exc}") from exc
    port = parts.port
    if parts.scheme not in RedisBackend.schemes:
        raise RemoteError(
            f"remote cache {redact(url)}: the Redis backend serves redis:// and rediss:// "
            f"URLs, not {parts.scheme}://"
        )
    if not parts.hostname:
        raise RemoteError(
            f"remote cache {redact(url)}: no host; expected redis://[:password@]host:port/db"
        )
    if port is not None and port == 0:
        raise RemoteError(f"remote cache {redact(url)}: port 0 is not a port")
    db = parts.path.strip("/")
    if db and not db.isdigit():
        raise RemoteError(
            f"remote cache {redact(url)}: the path must be a database number "
            f"(redis://host:6379/0), not {parts.path!r}"
        )
