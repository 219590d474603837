"""The Redis backend: ``redis://[user:password@]host:port/db`` and ``rediss://`` (TLS).

Entries live under ``cuforge:{namespace}:{kind}:{key}`` as plain string values, so one Redis
can serve several cuforge versions (and other tenants) without collisions, and an operator
can see, count and drop cuforge's keys with ``SCAN MATCH cuforge:*``.

Talks to Redis through redis-py (the ``redis`` extra: ``pip install 'cuforge[redis]'``),
imported when the first backend is built, never by ``import cuforge``. Guarantees, on top of
:class:`~cuforge.store.remote.base.RemoteBackend`'s:

* one redis-py client (and connection pool) per backend, shared by every thread; a forked
  child opens its own connections (redis-py checks the pid);
* connecting takes at most ``connect_timeout`` and each command's reply at most ``timeout``;
  redis-py never retries on its own (the tier's circuit breaker decides when to try again),
  and no extra commands are sent on connect besides ``AUTH`` / ``SELECT`` when the URL asks
  for them (RESP2, no ``CLIENT SETINFO``);
* every failure (refused, timed out, out of memory, wrong type, ...) is a
  :class:`~cuforge.store.remote.base.RemoteError` naming the URL without its password.
"""

from __future__ import annotations

import math

from cuforge.store.remote.base import RemoteBackend, RemoteError, RemoteTimeout, redact

__all__ = ["RedisBackend"]

_INSTALL_HINT = "pip install 'cuforge[redis]'"


class RedisBackend(RemoteBackend):
    """A Redis server (or anything speaking its protocol: Valkey, KeyDB, Dragonfly).

    The constructor only parses ``url`` and builds the client; it does not connect (the
    first ``get`` / ``put`` does), so building a backend for a server that is down is cheap
    and does not fail. It raises :class:`RemoteError` when redis-py is not installed or
    when ``url`` cannot name a Redis database (wrong scheme, bad port, a db that is not a
    number).
    """

    schemes = ("redis", "rediss")

    def setup(self) -> None:
        try:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError as exc:
            raise RemoteError(
                f"remote cache {redact(self.url)}: the Python package 'redis' is not installed "
                f"({exc}); install it with: {_INSTALL_HINT}, or remove this URL from "
                "CUFORGE_REMOTE"
            ) from exc
        _check_url(self.url)
        self._redis = redis
        self._prefix = f"cuforge:{self.namespace}:"
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
            raise RemoteError(
                f"remote cache {redact(self.url)}: not a usable Redis URL ({exc}); expected "
                "redis://[:password@]host:port/db or rediss://..."
            ) from exc
        self._pool = pool
        self._client = redis.Redis(connection_pool=pool)

    def _key(self, kind: str, key: str) -> str:
        return f"{self._prefix}{kind}:{key}"

    def _fail(self, op: str, kind: str, key: str, exc: BaseException) -> RemoteError:
        what = type(exc).__name__
        timed_out = isinstance(exc, (TimeoutError, self._redis.TimeoutError))
        return (RemoteTimeout if timed_out else RemoteError)(
            f"remote cache {self.describe()}: {op} {kind}/{key[:16]} failed: {what}: {exc}"
        )

    def get(self, kind: str, key: str) -> bytes | None:
        """The value of ``cuforge:{namespace}:{kind}:{key}``, or None when it is not set."""
        try:
            value = self._client.get(self._key(kind, key))
        except (self._redis.RedisError, OSError) as exc:
            raise self._fail("GET", kind, key, exc) from exc
        if value is None:
            return None
        if not isinstance(value, bytes):
            raise RemoteError(
                f"remote cache {self.describe()}: GET {kind}/{key[:16]} answered a "
                f"{type(value).__name__}, not bytes"
            )
        return value

    def put(self, kind: str, key: str, data: bytes) -> None:
        """``SET`` the value, with ``EX ttl`` (rounded up to whole seconds) when ttl > 0."""
        ex = max(1, math.ceil(self.ttl)) if self.ttl > 0 else None
        try:
            self._client.set(self._key(kind, key), bytes(data), ex=ex)
        except (self._redis.RedisError, OSError) as exc:
            raise self._fail("SET", kind, key, exc) from exc

    def contains(self, kind: str, key: str) -> bool:
        """``EXISTS``: one round trip, no value transferred."""
        try:
            return bool(self._client.exists(self._key(kind, key)))
        except (self._redis.RedisError, OSError) as exc:
            raise self._fail("EXISTS", kind, key, exc) from exc

    def close(self) -> None:
        """Close the pool's connections (idempotent; a later call reconnects)."""
        try:
            self._pool.disconnect()
        except (self._redis.RedisError, OSError) as exc:
            raise RemoteError(f"remote cache {self.describe()}: closing failed: {exc}") from exc


def _check_url(url: str) -> None:
    """Refuse what redis-py would silently misread: a db path that is not a number, a port
    that is not one, a missing host."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise RemoteError(f"remote cache {redact(url)}: bad Redis URL: {exc}") from exc
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
