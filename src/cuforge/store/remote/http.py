"""The HTTP backend: ``http(s)://[user:password@]host[:port]/prefix``.

Plain ``GET`` / ``PUT`` / ``HEAD`` of ``<prefix>/<namespace>/<kind>/<key>``: the protocol of
bazel-remote, nginx's WebDAV module (``dav_methods PUT``), sccache's webdav backend and most
artifact stores, so any of them serves as a cuforge cache. Standard library only
(:mod:`http.client`, :mod:`urllib.parse`), imported by the backend's first request, never by
``import cuforge`` nor by building the backend (a process that hits its local cache imports
neither).

Guarantees, on top of :class:`~cuforge.store.remote.base.RemoteBackend`'s:

* a call connects within ``connect_timeout`` (for https, each step of the TLS handshake
  too), then sends the request and reads the whole answer within ``timeout`` in total: a
  deadline, not a per-``recv`` timeout, so a server that trickles bytes cannot stretch a
  call either;
* one keep-alive connection per thread (and per process: a forked child never shares its
  parent's socket); a kept-alive connection the server has since closed is retried once on
  a fresh connection (that failure is immediate, so the bound above still holds);
* ``200`` is a hit, ``404`` a miss, anything else (redirects included, which are never
  followed) a :class:`~cuforge.store.remote.base.RemoteError` with the status and an
  excerpt of the body; a ``PUT`` succeeds on ``200`` / ``201`` / ``204``;
* a body larger than ``max_bytes`` (``CUFORGE_REMOTE_MAX_BYTES``) is refused before it is
  read (by its ``Content-Length``) or as soon as it grows past the cap; its first bytes are
  checked (:meth:`~cuforge.store.remote.base.RemoteBackend.check_head`: the envelope's
  magic and header, under a tier) before the rest is read, into one buffer; a body shorter
  than its ``Content-Length`` is an error, never a value;
* basic auth from the URL's credentials; https verifies the server against the system's
  certificate authorities (:func:`ssl.create_default_context`);
* ``HTTPS_PROXY`` / ``HTTP_PROXY`` / ``NO_PROXY`` (and their lowercase forms) are honoured
  as urllib3 and requests honour them (:mod:`cuforge.store.remote.proxy`), read at the
  first request: an ``http://`` cache goes to the proxy with the absolute URL, an
  ``https://`` one through a ``CONNECT`` tunnel (TLS end to end, the cache's certificate
  verified); the connect timeout bounds reaching the proxy and the tunnel.

Not bounded: resolving the host name (the operating system's resolver has its own timeout);
use an IP address or a local resolver where that matters.
"""

from __future__ import annotations

import io
import os
import time
from _thread import _local, allocate_lock  # threading.local / Lock, without importing threading

from cuforge.store.remote.base import (
    DamagedValue,
    RemoteBackend,
    RemoteError,
    RemoteTimeout,
    redact,
    split_url,
)

__all__ = ["HttpBackend"]

_EXCERPT = 200
#: error bodies read to keep a connection reusable; a longer one closes the connection
_DRAIN_LIMIT = 64 * 1024
_CHUNK = 1024 * 1024
_PUT_OK = (200, 201, 204)
#: characters a path component keeps unquoted
_SAFE = "-_.~+:="


class HttpBackend(RemoteBackend):
    """A cache served over plain HTTP(S) verbs (bazel-remote, nginx WebDAV, sccache webdav).

    The constructor only parses ``url``; it does not connect, so building a backend for a
    server that is down is cheap and does not fail. It raises :class:`RemoteError` when
    ``url`` is not an http(s) URL with a host, or carries a query or fragment.
    """

    schemes = ("http", "https")

    def setup(self) -> None:
        try:
            parts = split_url(self.url)
        except ValueError as exc:
            raise RemoteError(f"remote cache {redact(self.url)}: bad URL: {exc}") from exc
        if parts.scheme not in self.schemes or not parts.hostname:
            raise RemoteError(
                f"remote cache {redact(self.url)}: expected http(s)://[user:password@]host[:port]/prefix"
            )
        if parts.query or parts.fragment:
            raise RemoteError(
                f"remote cache {redact(self.url)}: a cache URL takes no query or fragment "
                "(?... / #...); entries go under its path"
            )
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._https else 80)
        self._prefix = parts.path.rstrip("/")
        self._check_component(self.namespace, "namespace")
        self._credentials = (
            None
            if parts.username is None and parts.password is None
            else (parts.username or "", parts.password or "")
        )
        # built by the first request (_prepare): urllib.parse is not imported before then
        self._quote = None
        self._ns = ""
        self._headers: dict[str, str] = {}
        self._ssl_context = None
        self._proxy = None  # a Proxy, found by _prepare
        self._absolute = ""  # "http://host:port" before each path, through an http proxy
        self._local = _local()
        self._lock = allocate_lock()
        self._open: set = set()

    def _prepare(self) -> None:
        """What the first request needs: the quoted namespace and the headers."""
        from urllib.parse import quote, unquote

        headers = {"User-Agent": "cuforge"}
        if self._credentials is not None:
            import base64

            user, password = (unquote(c) for c in self._credentials)
            token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
            headers["Authorization"] = f"Basic {token}"
        from cuforge.store.remote.proxy import proxy_for

        proxy = proxy_for("https" if self._https else "http", self._host, self._port)
        if proxy is not None and not self._https:
            host = f"[{self._host}]" if ":" in self._host else self._host
            self._absolute = f"http://{host}" + ("" if self._port == 80 else f":{self._port}")
            if proxy.authorization:
                headers["Proxy-Authorization"] = proxy.authorization
        self._proxy = proxy
        self._headers = headers
        self._ns = quote(self.namespace, safe=_SAFE)
        self._quote = quote

    # -- addressing ---------------------------------------------------------------------

    def _check_component(self, value: str, what: str) -> None:
        if not value or value in (".", "..") or "/" in value:
            raise RemoteError(
                f"remote cache {self.describe()}: the {what} {value!r} cannot be a path "
                "component (empty, '.', '..' or containing '/')"
            )

    def _component(self, value: str, what: str) -> str:
        self._check_component(value, what)
        if self._quote is None:
            self._prepare()
        return self._quote(value, safe=_SAFE)  # type: ignore[misc]

    def _path(self, kind: str, key: str) -> str:
        """The request target: the path, or through an http proxy the absolute URL."""
        kind = self._component(kind, "kind")  # (first: prepares self._ns and the proxy)
        return f"{self._absolute}{self._prefix}/{self._ns}/{kind}/{self._component(key, 'key')}"

    def describe(self) -> str:
        """The URL without its password, and the proxy it goes through, if any."""
        url = super().describe()
        proxy = getattr(self, "_proxy", None)  # (None while setup() is still running)
        return url if proxy is None else f"{url} (through {proxy.describe()})"

    # -- connections --------------------------------------------------------------------

    def _new_connection(self):
        import http.client

        if self._quote is None:
            self._prepare()  # finds the proxy
        proxy = self._proxy
        host, port = (self._host, self._port) if proxy is None else (proxy.host, proxy.port)
        if self._https:
            import ssl

            if self._ssl_context is None:
                self._ssl_context = ssl.create_default_context()
            conn = http.client.HTTPSConnection(
                host, port, timeout=self.connect_timeout, context=self._ssl_context
            )
            if proxy is not None:  # CONNECT, then TLS with the cache itself through it
                tunnel = (
                    {"Proxy-Authorization": proxy.authorization} if proxy.authorization else None
                )
                conn.set_tunnel(self._host, self._port, headers=tunnel)
        else:
            conn = http.client.HTTPConnection(host, port, timeout=self.connect_timeout)
        conn._cuforge_deadline = 0.0
        conn.response_class = _deadline_response_class(conn)
        return conn

    def _connection(self) -> tuple[object, bool]:
        """This thread's connection (opened if needed) and whether it served a request
        before (only a reused connection may turn out stale)."""
        pid = os.getpid()
        conn = getattr(self._local, "conn", None)
        if conn is not None and (getattr(self._local, "pid", pid) != pid or conn.sock is None):
            self._discard(conn)
            conn = None
        if conn is not None:
            return conn, True
        conn = self._new_connection()
        # a proxy's answer to CONNECT is read through the deadline reader too: connect_timeout
        conn._cuforge_deadline = time.monotonic() + self.connect_timeout
        try:
            conn.connect()
        except OSError as exc:
            conn.close()
            if isinstance(exc, TimeoutError):
                raise RemoteTimeout(
                    f"remote cache {self.describe()}: no connection within "
                    f"{self.connect_timeout:g} s (CUFORGE_REMOTE_CONNECT_TIMEOUT)"
                ) from exc
            raise RemoteError(f"remote cache {self.describe()}: cannot connect: {exc}") from exc
        self._local.conn = conn
        self._local.pid = pid
        with self._lock:
            self._open.add(conn)
        return conn, False

    def _discard(self, conn) -> None:
        if getattr(self._local, "conn", None) is conn:
            self._local.conn = None
        with self._lock:
            self._open.discard(conn)
        conn.close()

    # -- one request --------------------------------------------------------------------

    def _request(self, method: str, kind: str, key: str, body: bytes | None = None):
        """Send one request; return ``(status, reason, body)``, the body read in full
        (under the cap; HEAD: empty). Raises RemoteError."""
        import http.client

        path = self._path(kind, key)
        headers = dict(self._headers)
        if body is not None:
            headers["Content-Type"] = "application/octet-stream"
        for attempt in (0, 1):
            conn, reused = self._connection()
            conn._cuforge_deadline = time.monotonic() + self.timeout
            try:
                conn.sock.settimeout(self.timeout)
                conn.request(method, path, body=body, headers=headers)
                resp = conn.getresponse()
                data = self._read_body(conn, resp, method, kind, key)
            except RemoteError:  # (an OSError too: before the handlers below)
                self._discard(conn)
                raise
            except ConnectionError as exc:
                self._discard(conn)
                if reused and attempt == 0:
                    continue  # the server closed a kept-alive connection: once more, fresh
                raise self._fail(method, kind, key, exc) from exc
            except (OSError, http.client.HTTPException) as exc:
                self._discard(conn)
                if isinstance(exc, TimeoutError):
                    raise RemoteTimeout(
                        f"remote cache {self.describe()}: {method} {kind}/{key[:16]}: no "
                        f"answer within {self.timeout:g} s (CUFORGE_REMOTE_TIMEOUT)"
                    ) from exc
                raise self._fail(method, kind, key, exc) from exc
            if resp.will_close:
                self._discard(conn)
            return resp.status, resp.reason, data
        raise AssertionError("unreachable")  # pragma: no cover

    def _read_body(self, conn, resp, method: str, kind: str, key: str):
        """The whole body of a ``GET``'s 200 answer (:meth:`_read_value`); of any other
        answer, up to a short excerpt (the connection is dropped when more is left). A
        body that ends before its ``Content-Length`` raises
        :class:`http.client.IncompleteRead`."""
        import http.client

        if method == "HEAD":
            resp.read()  # no body: marks the response done so the connection is reusable
            return b""
        if method == "GET" and resp.status == 200:
            return self._read_value(resp, kind, key)
        length = resp.length
        if length is not None and length > _DRAIN_LIMIT:
            data = resp.read(_EXCERPT)
            self._discard(conn)
            return data
        data = resp.read(_DRAIN_LIMIT + 1)
        if len(data) > _DRAIN_LIMIT:
            self._discard(conn)
        elif resp.length:  # http.client's read(amt) ends quietly when the server hangs up
            raise http.client.IncompleteRead(data, resp.length)
        return data

    def _read_value(self, resp, kind: str, key: str) -> bytearray:
        """A value: refused by its ``Content-Length`` over the cap, or by its first bytes
        (:meth:`check_head`) before the rest is read; read into one buffer."""
        import http.client

        length = resp.length
        if length is not None and length > self.max_bytes:
            raise DamagedValue(
                f"remote cache {self.describe()}: the server announced {length} bytes, more "
                f"than the {self.max_bytes} a cache entry may have (CUFORGE_REMOTE_MAX_BYTES)"
            )
        head = bytearray(self.head_bytes if length is None else min(length, self.head_bytes))
        got = _fill(resp, memoryview(head))
        if got < len(head) or length == got:  # that was the whole body
            if resp.length:  # http.client's readinto ends quietly when the server hangs up
                raise http.client.IncompleteRead(bytes(head[:got]), resp.length)
            del head[got:]
            resp.read()  # (nothing left) marks the response done: the connection is reusable
            self.check_head(head, got, kind, key)
            return head
        end = self.check_head(head, self.max_bytes if length is None else length, kind, key)
        if length is not None:
            data = bytearray(length)
            data[:got] = head
            done = got + _fill(resp, memoryview(data)[got:])
            if resp.length:
                raise http.client.IncompleteRead(b"", resp.length)
            resp.read()  # (nothing left) marks the response done
        else:  # no Content-Length: grow in chunks up to the cap
            data, done = head, got
            while len(data) == done:
                if done > self.max_bytes:
                    raise DamagedValue(
                        f"remote cache {self.describe()}: the answer grew past the "
                        f"{self.max_bytes} bytes a cache entry may have (CUFORGE_REMOTE_MAX_BYTES)"
                    )
                data.extend(bytes(min(_CHUNK, self.max_bytes + 1 - done)))
                done += _fill(resp, memoryview(data)[done:])
            del data[done:]
        if end > got:  # the whole header has come: check it before the value is used
            self.check_head(memoryview(data)[:done], done, kind, key)
        return data

    def _fail(self, method: str, kind: str, key: str, exc: BaseException) -> RemoteError:
        return RemoteError(
            f"remote cache {self.describe()}: {method} {kind}/{key[:16]} failed: "
            f"{type(exc).__name__}: {exc}"
        )

    def _status_error(
        self, method: str, kind: str, key: str, status: int, reason: str, body: bytes
    ) -> RemoteError:
        excerpt = body[:_EXCERPT].decode("utf-8", "replace")
        excerpt = " ".join(excerpt.split())
        return RemoteError(
            f"remote cache {self.describe()}: {method} {kind}/{key[:16]} answered "
            f"{status} {reason}" + (f": {excerpt}" if excerpt else "")
        )

    # -- the interface ------------------------------------------------------------------

    def get(self, kind: str, key: str) -> bytes | None:
        """``GET``: 200 -> the body, 404 -> None, anything else -> RemoteError."""
        status, reason, data = self._request("GET", kind, key)
        if status == 200:
            return data
        if status == 404:
            return None
        raise self._status_error("GET", kind, key, status, reason, data)

    def put(self, kind: str, key: str, data: bytes) -> None:
        """``PUT`` the bytes; 200 / 201 / 204 is success, anything else RemoteError."""
        status, reason, body = self._request("PUT", kind, key, bytes(data))
        if status not in _PUT_OK:
            raise self._status_error("PUT", kind, key, status, reason, body)

    def contains(self, kind: str, key: str) -> bool:
        """``HEAD``: 200 -> True, 404 -> False, anything else -> RemoteError."""
        status, reason, _ = self._request("HEAD", kind, key)
        if status == 200:
            return True
        if status == 404:
            return False
        raise self._status_error("HEAD", kind, key, status, reason, b"")

    def close(self) -> None:
        """Close every thread's connection (idempotent; a later call reconnects)."""
        with self._lock:
            conns, self._open = self._open, set()
        for conn in conns:
            conn.close()
        self._local = _local()


def _fill(resp, view: memoryview) -> int:
    """Read into ``view`` until it is full or the body ends; how many bytes came."""
    done = 0
    while done < len(view):
        n = resp.readinto(view[done:])
        if not n:
            break
        done += n
    return done


def _deadline_response_class(conn):
    """A ``response_class`` for ``conn`` whose reads all end by ``conn._cuforge_deadline``:
    each ``recv`` gets only the time left, so the status line, the headers and the body
    together take at most the transfer timeout."""
    import http.client

    def response(sock, *args, **kwargs):
        return http.client.HTTPResponse(_DeadlineSocket(sock, conn), *args, **kwargs)

    return response


class _DeadlineSocket:
    """Just enough of a socket for :class:`http.client.HTTPResponse`: ``makefile``."""

    __slots__ = ("_sock", "_conn")

    def __init__(self, sock, conn) -> None:
        self._sock = sock
        self._conn = conn

    def makefile(self, mode: str = "rb", *args, **kwargs) -> io.BufferedReader:
        # socket.SocketIO keeps the socket open while the response reads, even after the
        # connection object drops it (http.client relies on that for ``Connection: close``)
        raw = self._sock.makefile("rb", buffering=0)
        return io.BufferedReader(_DeadlineReader(raw, self._sock, self._conn))


class _DeadlineReader(io.RawIOBase):
    def __init__(self, raw, sock, conn) -> None:
        self._raw = raw
        self._sock = sock
        self._conn = conn

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        left = self._conn._cuforge_deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        self._sock.settimeout(left)
        return self._raw.readinto(buffer)

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
        super().close()
