"""A small Redis client: RESP2 over one socket per connection, the few commands the Redis
backend (:mod:`cuforge.store.remote.redis`) sends, pipelined, and a per-backend pool.

**Why not redis-py.** Importing it costs ~85 ms (redis-py 8.1 imports asyncio, its cluster
and observability modules: ``python -X importtime -c "import redis"`` on the 2-core CI
machine, 85 ms of a 260 ms ``cuforge prefetch``), paid by every process on its first remote
lookup and by every ``cuforge prefetch``. The backend already drives the protocol itself
(pipelined ``EXISTS``/``STRLEN``/``GETRANGE``, a watchdog that cuts the socket at its
deadline) and uses nothing else of redis-py's: this module is that part, over ``socket``
(~5 ms to import, measured the same way) and, for ``rediss://`` only, ``ssl`` (~15 ms).

What it guarantees:

* **Options** come from the backend's URL (:func:`cuforge.store.remote.redis.parse_url`):
  host, port, db, user, password, TLS (verified by default) and its files.
* **Connecting** takes at most ``connect_timeout``; each ``recv`` at most ``timeout``
  (the backend's watchdog bounds a whole call). ``AUTH`` and ``SELECT`` are sent, in one
  round trip, only when the URL asks for them; nothing else is sent on connect.
* **Bounded replies**: every read says how much it asked for (a ``GETRANGE``'s range,
  :data:`SMALL` for an integer); a bulk announcing more, never more than the cap
  (``CUFORGE_REMOTE_MAX_BYTES``), is refused before a byte of it is read or allocated;
  arrays nest at most :data:`MAX_DEPTH` deep and hold at most :data:`MAX_ITEMS`.
* **Errors**: a server error reply (``-ERR ...``) raises :class:`ReplyError` once the
  line is read (the rest of a pipeline's replies is not); a malformed reply (a length
  that is no number, a bulk not followed by CRLF, too long, too deep) raises
  :class:`ProtocolError` saying what was wrong; socket and TLS
  failures raise what ``socket`` / ``ssl`` raise (``OSError``). After any of these a
  connection's place in a pipeline is unknown: the caller closes it.
* **The pool** hands each thread a connection of its own and takes it back; a forked child
  never reuses its parent's sockets (the pool checks the pid).
"""

from __future__ import annotations

import os
import socket
from _thread import allocate_lock

from cuforge.store.remote.base import DEFAULT_MAX_BYTES, RemoteError

__all__ = ["Connection", "Pool", "ReplyError", "ProtocolError", "SMALL", "MAX_DEPTH", "MAX_ITEMS"]

_CRLF = b"\r\n"
#: the ``limit`` of a reply that should be an integer or a status: a bulk in its place
#: may hold this many bytes at most
SMALL = 64
#: the deepest nesting of arrays a reply may have (SCAN's is 2)
MAX_DEPTH = 4
#: the most elements one array of a reply may have
MAX_ITEMS = 1 << 16
_DIGITS = frozenset(b"0123456789")


def _number(rest: bytes, line: bytes) -> int:
    """The decimal integer ``rest`` of a reply ``line`` (``-`` then 1-19 ASCII digits: a
    64-bit integer); ProtocolError for anything else."""
    digits = rest[1:] if rest[:1] == b"-" else rest
    if not digits or len(digits) > 19 or not _DIGITS.issuperset(digits):
        raise ProtocolError(f"a reply's length or number that is not one: {line[:64]!r}")
    return int(rest)


class ReplyError(RemoteError):
    """The server answered an error reply (``-WRONGTYPE ...``, ``-OOM ...``, ``-NOAUTH ...``)."""


class ProtocolError(RemoteError):
    """The server's reply is not RESP2 (a proxy, another protocol, a torn stream)."""


def _tls_context(opts: dict):
    import ssl

    ctx = ssl.create_default_context(cafile=opts.get("ssl_ca_certs") or None)
    reqs = opts["ssl_cert_reqs"]
    ctx.check_hostname = reqs != "none" and opts.get("ssl_check_hostname", True)
    ctx.verify_mode = {
        "none": ssl.CERT_NONE,
        "optional": ssl.CERT_OPTIONAL,
        "required": ssl.CERT_REQUIRED,
    }[reqs]
    if opts.get("ssl_certfile"):
        ctx.load_cert_chain(opts["ssl_certfile"], opts.get("ssl_keyfile") or None)
    return ctx


def pack(*commands: tuple) -> bytes:
    """``commands`` (each a tuple of str / bytes / int arguments) as RESP2 arrays."""
    out: list[bytes] = []
    for command in commands:
        out.append(b"*%d\r\n" % len(command))
        for arg in command:
            if isinstance(arg, str):
                arg = arg.encode("utf-8")
            elif isinstance(arg, int):
                arg = b"%d" % arg
            out.append(b"$%d\r\n" % len(arg))
            out.append(bytes(arg))
            out.append(_CRLF)
    return b"".join(out)


class Connection:
    """One connection to a Redis server, authenticated and on its database."""

    def __init__(
        self, opts: dict, connect_timeout: float, timeout: float, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> None:
        self.pid = os.getpid()
        #: the most bulk data one reply may hold (the backend's CUFORGE_REMOTE_MAX_BYTES)
        self.max_bytes = max_bytes
        where = f"{opts['host']}:{opts['port']}"
        try:
            sock = socket.create_connection((opts["host"], opts["port"]), timeout=connect_timeout)
        except TimeoutError:
            raise TimeoutError(
                f"Timeout connecting to {where} (not accepted within {connect_timeout:g} s)"
            ) from None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if opts["tls"]:
                sock = _tls_context(opts).wrap_socket(sock, server_hostname=opts["host"])
            sock.settimeout(timeout)
        except BaseException:
            sock.close()
            raise
        self._sock = sock  # the backend's watchdog shuts it down at a call's deadline
        self._file = sock.makefile("rb")
        hello: list[tuple] = []
        if opts["password"] is not None:
            user = opts["username"]
            hello.append(("AUTH", user, opts["password"]) if user else ("AUTH", opts["password"]))
        if opts["db"]:
            hello.append(("SELECT", opts["db"]))
        if hello:
            try:
                self.send(*hello)
                for _ in hello:
                    self.read(SMALL)
            except BaseException:
                self.close()
                raise

    def send(self, *commands: tuple) -> None:
        """Send ``commands`` in one write (a pipeline: read one reply per command)."""
        self._sock.sendall(pack(*commands))

    def read(self, limit: int | None = None):
        """The next reply: bytes, int, None (a nil), a list, or ``b"OK"``-like simple
        strings as bytes. ``limit``: the most bytes of bulk data the reply may hold (what
        was asked for: a ``GETRANGE``'s range, :data:`SMALL` for an integer reply), never
        more than the connection's cap; a larger announced length is refused before
        anything of it is read. Raises :class:`ReplyError` for an error reply and
        :class:`ProtocolError`, saying what was wrong, for anything that is not RESP2."""
        budget = self.max_bytes if limit is None else min(limit, self.max_bytes)
        return self._reply([budget], 0)

    def _reply(self, budget: list[int], depth: int):
        line = self._file.readline(65536)
        if not line.endswith(_CRLF):
            if not line:
                raise ConnectionResetError("the server closed the connection")
            raise ProtocolError(f"a reply line without CRLF: {line[:64]!r}")
        tag, rest = line[:1], line[1:-2]
        if tag == b"$":
            size = _number(rest, line)
            if size == -1:
                return None
            if size < -1:
                raise ProtocolError(f"a bulk reply of negative length: {line[:64]!r}")
            if size > budget[0]:
                raise ProtocolError(
                    f"the server announced a {size}-byte bulk reply where at most "
                    f"{budget[0]} bytes were asked for (refused unread)"
                )
            budget[0] -= size
            data = self._file.read(size + 2)
            if len(data) != size + 2:
                raise ConnectionResetError("the server closed the connection mid-reply")
            if data[-2:] != _CRLF:
                raise ProtocolError(
                    f"a {size}-byte bulk reply not followed by CRLF (but {data[-2:]!r})"
                )
            return data[:-2]
        if tag == b":":
            return _number(rest, line)
        if tag == b"+":
            return rest
        if tag == b"*":
            count = _number(rest, line)
            if count == -1:
                return None
            if count < -1:
                raise ProtocolError(f"an array of negative length: {line[:64]!r}")
            if depth >= MAX_DEPTH:
                raise ProtocolError(f"arrays nested deeper than {MAX_DEPTH}")
            if count > MAX_ITEMS or count > budget[0]:
                raise ProtocolError(
                    f"the server announced an array of {count} replies, over the "
                    f"{min(MAX_ITEMS, budget[0])} that could answer what was asked"
                )
            budget[0] -= count  # every element costs at least one byte of the budget
            return [self._reply(budget, depth + 1) for _ in range(count)]
        if tag == b"-":
            raise ReplyError(rest.decode("utf-8", "replace"))
        raise ProtocolError(f"not a RESP2 reply: {line[:64]!r}")

    def close(self) -> None:
        """Close the socket (idempotent)."""
        try:
            self._file.close()
        finally:
            self._sock.close()


class Pool:
    """Connections to one server, reused: :meth:`get` one, :meth:`release` it after a
    call that left it clean, :meth:`discard` it otherwise."""

    def __init__(
        self, opts: dict, connect_timeout: float, timeout: float, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> None:
        self._opts = opts
        self._max_bytes = max_bytes
        self._connect_timeout = connect_timeout
        self._timeout = timeout
        self._idle: list[Connection] = []
        self._lock = allocate_lock()
        self._pid = os.getpid()

    def get(self) -> Connection:
        with self._lock:
            if self._pid != os.getpid():  # a forked child: the parent's sockets are not ours
                self._idle, self._pid = [], os.getpid()
            if self._idle:
                return self._idle.pop()
        return Connection(self._opts, self._connect_timeout, self._timeout, self._max_bytes)

    def release(self, conn: Connection) -> None:
        with self._lock:
            if conn.pid == os.getpid():
                self._idle.append(conn)
                return
        conn.close()

    def discard(self, conn: Connection) -> None:
        conn.close()

    def disconnect(self) -> None:
        """Close every idle connection (a later :meth:`get` connects again)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
