"""``s3://bucket/prefix``: a remote tier in an S3-compatible object store (AWS S3, MinIO,
Ceph RGW, R2, GCS's XML API...), through boto3 (``pip install 'cuforge[s3]'``).

Why boto3 (not obstore): it reads credentials, region and endpoint from the one chain every
AWS tool and operator already uses (environment, ``~/.aws/config`` profiles, SSO, web
identity in k8s, instance metadata), and it is the client S3-compatible servers test
against. Its import (~0.2 s) is paid on the first remote call of a process, never by a
process that hits its local cache.

* Layout: ``<prefix>/<namespace>/<kind>/<key>`` in ``bucket``.
* Credentials and region: boto3's default chain, never anything under the cache dir.
  The endpoint: ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` (boto3's own variables), or
  ``?endpoint=http://host:port`` in the URL (a MinIO on-prem, a test server); ``?region=``.
* Timeouts: ``connect_timeout`` to connect, ``timeout`` per read *and* as the deadline of
  the whole get: each read of the body gets the time left as its socket timeout, and a
  watchdog shuts the socket down at the deadline (a slow-loris server trickling bytes
  never holds a get past it); boto3's retries are off (one attempt: the tier's circuit breaker
  decides when to try again).
* ``get`` learns the size (``ContentLength``) and checks the envelope's head before the
  rest is transferred; ``put`` is an unconditional PUT (a newly signed entry must be able
  to replace one signed by a revoked key); :meth:`S3Backend.create` is the conditional
  one (``If-None-Match: *``), for writers that must not replace an entry.
* Expiry: S3 has no per-object TTL; ``CUFORGE_REMOTE_TTL`` is not applied. Use a bucket
  lifecycle rule on the prefix (docs/remote.md, "S3").
"""

from __future__ import annotations

import time

from cuforge.store.remote.base import (
    RemoteBackend,
    RemoteError,
    RemoteTimeout,
    RemoteUnavailable,
    redact,
    split_url,
)

__all__ = ["S3Backend"]

_CHUNK = 1 << 20


class S3Backend(RemoteBackend):
    """An S3 bucket (and key prefix) as a remote cache."""

    schemes = ("s3",)

    def setup(self) -> None:
        parts = split_url(self.url)
        if parts.scheme != "s3" or not parts.hostname:
            raise RemoteError(f"bad S3 URL {redact(self.url)!r}: expected s3://bucket/prefix")
        self.bucket = parts.hostname
        self.prefix = parts.path.strip("/")
        self.endpoint: str | None = None
        self.region: str | None = None
        for item in filter(None, parts.query.split("&")):
            name, _, value = item.partition("=")
            if name == "endpoint" and value:
                self.endpoint = value
            elif name == "region" and value:
                self.region = value
            else:
                raise RemoteError(
                    f"S3 URL {redact(self.url)!r}: unknown query {item!r} (endpoint=URL, region=NAME)"
                )
        self._client = None

    def describe(self) -> str:
        where = f" at {self.endpoint}" if self.endpoint else ""
        return f"s3://{self.bucket}/{self.prefix}{where}"

    def object_key(self, kind: str, key: str) -> str:
        """The object name of ``(kind, key)``."""
        parts = (self.prefix, self.namespace, kind, key)
        return "/".join(p for p in parts if p)

    def client(self):
        """The boto3 client (made on first use; RemoteUnavailable when boto3 is missing)."""
        client = self._client
        if client is not None:
            return client
        try:
            import boto3
            from botocore.config import Config
        except ImportError as exc:
            raise RemoteUnavailable(
                f"s3:// needs boto3 ({exc}); pip install 'cuforge[s3]'"
            ) from None
        config = Config(
            connect_timeout=self.connect_timeout,
            read_timeout=self.timeout,
            retries={"total_max_attempts": 1},
            s3={"addressing_style": "path"} if self.endpoint else None,
        )
        session = boto3.session.Session()
        client = session.client(
            "s3", endpoint_url=self.endpoint, region_name=self.region, config=config
        )
        self._client = client
        return client

    def _error(self, what: str, exc: Exception) -> RemoteError:
        """``exc`` of boto3 as a RemoteError (a RemoteTimeout for a timeout)."""
        from botocore.exceptions import ConnectTimeoutError, ReadTimeoutError

        where = self.endpoint or "S3"
        if isinstance(exc, ConnectTimeoutError):
            return RemoteTimeout(
                f"{what} {self.describe()}: no connection within {self.connect_timeout:g} s "
                f"to {where} (CUFORGE_REMOTE_CONNECT_TIMEOUT)"
            )
        if isinstance(exc, (ReadTimeoutError, TimeoutError)):
            return RemoteTimeout(
                f"{what} {self.describe()}: no answer within {self.timeout:g} s from {where} "
                "(CUFORGE_REMOTE_TIMEOUT)"
            )
        return RemoteError(f"{what} {self.describe()} ({where}): {type(exc).__name__}: {exc}")

    @staticmethod
    def _code(exc: Exception) -> str:
        response = getattr(exc, "response", None) or {}
        return str((response.get("Error") or {}).get("Code", ""))

    def get(self, kind: str, key: str) -> bytes | None:
        client = self.client()
        deadline = time.monotonic() + self.timeout
        try:
            answer = client.get_object(Bucket=self.bucket, Key=self.object_key(kind, key))
        except Exception as exc:  # noqa: BLE001 - boto3 raises many types; sorted below
            if self._code(exc) in ("NoSuchKey", "404", "NotFound"):
                return None
            raise self._error("get from", exc) from None
        body = answer["Body"]
        try:
            return self._read(
                body, int(answer.get("ContentLength") or 0), kind, key, deadline=deadline
            )
        except RemoteError:
            raise
        except Exception as exc:  # noqa: BLE001 - a stream error of any kind is a failed get
            raise self._error("get from", exc) from None
        finally:
            body.close()

    def _read(
        self, body, size: int, kind: str, key: str, *, deadline: float | None = None
    ) -> bytes:
        """The ``size`` bytes of ``body`` (a botocore stream), the head checked first, all
        of it by ``deadline`` (default: ``timeout`` from now). Every read is bounded by
        the time left, not only checked between reads: the socket's timeout is set to it
        before each read, and a watchdog shuts the socket down at the deadline (a server
        trickling a byte now and then never holds a get past its timeout)."""
        if deadline is None:
            deadline = time.monotonic() + self.timeout
        sock = _socket_of(body)
        fired: list[bool] = []
        timer = None
        if sock is not None:
            import threading

            timer = threading.Timer(max(0.0, deadline - time.monotonic()), _cut, (sock, fired))
            timer.daemon = True
            timer.start()

        def timed_out() -> RemoteTimeout:
            return RemoteTimeout(
                f"reading {kind}/{key[:16]} from {self.describe()} took over "
                f"{self.timeout:g} s (CUFORGE_REMOTE_TIMEOUT)"
            )

        def take(n: int) -> bytes:
            left = deadline - time.monotonic()
            if left <= 0 or fired:
                raise timed_out()
            if sock is not None:
                sock.settimeout(left)
            try:
                chunk = body.read(n)
            except Exception as exc:  # noqa: BLE001 - urllib3/botocore/socket errors alike
                if fired or time.monotonic() >= deadline:
                    raise timed_out() from exc
                raise
            if fired:  # the watchdog cut the socket: what came back may be short
                raise timed_out()
            return chunk

        try:
            head = take(min(size, self.head_bytes))
            first = self.check_head(head, size, kind, key)
            chunks, done = [head], len(head)
            while done < size:
                want = min(size - done, _CHUNK, first - done if first > done else size - done)
                chunk = take(want)
                if not chunk:
                    raise RemoteError(f"{self.describe()}: {kind}/{key[:16]} was cut short")
                chunks.append(chunk)
                done += len(chunk)
                if first and done >= first:
                    self.check_head(b"".join(chunks), size, kind, key)
                    first = 0
            return b"".join(chunks)
        finally:
            if timer is not None:
                timer.cancel()
            if sock is not None and not fired:
                try:
                    sock.settimeout(self.timeout)  # the pooled connection's usual timeout
                except OSError:
                    pass  # closed meanwhile

    def put(self, kind: str, key: str, data: bytes) -> None:
        try:
            self.client().put_object(
                Bucket=self.bucket, Key=self.object_key(kind, key), Body=bytes(data)
            )
        except RemoteError:
            raise
        except Exception as exc:  # noqa: BLE001 - boto3 raises many types
            raise self._error("put to", exc) from None

    def create(self, kind: str, key: str, data: bytes) -> bool:
        """Store ``data`` only if nothing is stored under ``(kind, key)`` (a conditional
        PUT, ``If-None-Match: *``): True when written, False when an object was there.
        A server without conditional writes (501/NotImplemented) gets a ``contains`` then
        a plain ``put`` (not atomic)."""
        try:
            self.client().put_object(
                Bucket=self.bucket,
                Key=self.object_key(kind, key),
                Body=bytes(data),
                IfNoneMatch="*",
            )
            return True
        except RemoteError:
            raise
        except Exception as exc:  # noqa: BLE001 - boto3 raises many types
            code = self._code(exc)
            if code in ("PreconditionFailed", "412", "ConditionalRequestConflict"):
                return False
            if code not in ("NotImplemented", "501"):
                raise self._error("put to", exc) from None
        if self.contains(kind, key):
            return False
        self.put(kind, key, data)
        return True

    def contains(self, kind: str, key: str) -> bool:
        try:
            self.client().head_object(Bucket=self.bucket, Key=self.object_key(kind, key))
        except Exception as exc:  # noqa: BLE001 - boto3 raises many types
            if self._code(exc) in ("404", "NoSuchKey", "NotFound"):
                return False
            raise self._error("ask", exc) from None
        return True

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.close()


def _socket_of(body):
    """The socket a botocore ``StreamingBody`` reads from (urllib3's connection, or the
    socket under ``http.client``'s file), or None when it cannot be found (then reads are
    bounded by the per-read ``read_timeout`` and the checks between them only)."""
    raw = getattr(body, "_raw_stream", body)
    sock = getattr(getattr(raw, "_connection", None), "sock", None)
    if sock is None:
        fp = getattr(getattr(raw, "_fp", None), "fp", None)
        sock = getattr(getattr(fp, "raw", None), "_sock", None)
    return sock if hasattr(sock, "settimeout") and hasattr(sock, "shutdown") else None


def _cut(sock, fired: list) -> None:
    """The watchdog: the deadline passed, so end the blocked ``recv``."""
    fired.append(True)
    import socket

    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed
