"""The one small interface every remote cache backend implements.

Modeled on Triton's ``RemoteCacheBackend`` / ``CacheManager`` and cuda.core's program-cache
ABC: a backend moves opaque bytes by ``(kind, key)`` and knows nothing of entries, keys,
signing or retries. Everything that makes a remote safe and fast to use sits above it, in
one place (:mod:`cuforge.store.remote.tier`): the envelope (integrity digest, schema
namespace, optional HMAC signature), timeouts that fail open, the circuit breaker, read-only
mode and statistics. A new backend (S3, GCS, memcached...) is one subclass of
:class:`RemoteBackend`; ``CUFORGE_REMOTE_BACKEND=module:Class`` plugs one in without changing
cuforge.

Guaranteed by every backend:

* ``get`` returns exactly the bytes a ``put`` of the same ``(kind, key)`` stored, or None;
  a torn or partial value is never returned as a whole one (the envelope's digest would
  catch it anyway).
* No call blocks longer than ``connect_timeout`` + ``timeout``: ``timeout`` bounds the
  whole ``get`` / ``put`` (a deadline), not each ``recv``, so a large value or a server
  that trickles bytes cannot stretch a call.
* ``get`` never buffers a value larger than ``max_bytes`` (the built-in backends learn the
  size first: ``Content-Length``, ``STRLEN``, ``fstat``) and, under a tier, reads the
  first bytes before the rest and asks :meth:`RemoteBackend.check_head` (the tier
  installs the envelope's check, :attr:`RemoteBackend.head_check`); either refusal is a
  :class:`DamagedValue`, which counts toward the circuit breaker.
* Failures raise :class:`RemoteError` (or any exception; the tier counts it and fails open);
  a timeout raises :class:`RemoteTimeout` (or any ``TimeoutError``), which opens the
  tier's circuit breaker at once.

Not guaranteed: that a ``put`` is visible to other machines at once (eventual), that an
entry survives (a remote may evict or expire it), ordering between writers of one key (last
write wins; both are valid entries).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

__all__ = [
    "RemoteBackend",
    "RemoteError",
    "RemoteTimeout",
    "RemoteUnavailable",
    "DamagedValue",
    "DEFAULT_MAX_BYTES",
    "UrlParts",
    "split_url",
    "redact",
]


class RemoteError(OSError):
    """A remote cache could not be reached, timed out, refused a request or answered garbage."""


class RemoteTimeout(RemoteError, TimeoutError):
    """A remote cache did not connect or answer within its timeout. The tier stops asking
    it at once (one timeout costs the caller the whole budget; a second would double it)."""


class RemoteUnavailable(RemoteError):
    """A backend that cannot work in this process at all (its client library is missing or
    broken). The tier turns itself off for the rest of the process, with one warning that
    names the fix, instead of asking again after every back-off."""


class DamagedValue(RemoteError):
    """A remote answered a value that cannot be a cuforge entry: over ``max_bytes``, bad
    magic, a garbled header. Refused before the rest is transferred; a failure of the
    remote like any other (it counts toward the circuit breaker)."""


#: the default cap on one remote value (``CUFORGE_REMOTE_MAX_BYTES``), bytes
DEFAULT_MAX_BYTES = 128 * 1024**2


class UrlParts:
    """A remote URL split into its parts, as :func:`urllib.parse.urlsplit` splits it
    (``hostname`` lowercase, ``port`` an int or None), by :func:`split_url`."""

    __slots__ = ("scheme", "username", "password", "hostname", "port", "path", "query", "fragment")

    def __init__(self, **parts: object) -> None:
        for name in self.__slots__:
            setattr(self, name, parts[name])


def split_url(url: str) -> UrlParts:
    """``url``'s parts, without importing :mod:`urllib.parse` (a backend is built by every
    process that has ``CUFORGE_REMOTE`` set, even one that never uses it). Raises
    ValueError for a port that is not a number in 0-65535 or an unclosed ``[`` IPv6 host.
    ``username`` / ``password`` are still percent-encoded (None when absent)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    end = len(rest)
    for c in "/?#":
        i = rest.find(c)
        if i != -1 and i < end:
            end = i
    netloc, rest = rest[:end], rest[end:]
    rest, _, fragment = rest.partition("#")
    path, _, query = rest.partition("?")
    userinfo, at, hostport = netloc.rpartition("@")
    username = password = None
    if at:
        username, colon, pw = userinfo.partition(":")
        password = pw if colon else None
    if hostport.startswith("["):
        host, bracket, after = hostport[1:].partition("]")
        if not bracket:
            raise ValueError(f"Invalid IPv6 URL: {redact(url)!r}")
        port_text = after[1:] if after.startswith(":") else ""
    else:
        host, _, port_text = hostport.partition(":")
    port = None
    if port_text:
        # the text itself is not shown: it may be part of a password with a raw '/'
        if not port_text.isdigit() or not port_text.isascii():
            raise ValueError(
                "the port is not a number (a password holding '/', '?', '#' or '@' must be "
                "percent-encoded: %2F, %3F, %23, %40)"
            )
        port = int(port_text)
        if port > 65535:
            raise ValueError("Port out of range 0-65535")
    return UrlParts(
        scheme=scheme.lower(),
        username=username,
        password=password,
        hostname=host.lower() or None,
        port=port,
        path=path,
        query=query,
        fragment=fragment,
    )


def redact(url: str) -> str:
    """``url`` without its password (``redis://:secret@host`` -> ``redis://:***@host``;
    a user name alone, often a token, is hidden too: ``https://***@host``), for messages,
    ``describe()`` and ``cuforge cache stats``. A password holding a raw ``/``, ``?`` or
    ``#`` (which ends the host part, so the URL does not parse as meant) is still hidden:
    everything up to the last ``@`` is."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    end = len(rest)
    for c in "/?#":
        i = rest.find(c)
        if i != -1 and i < end:
            end = i
    authority, tail = rest[:end], rest[end:]
    if "@" in authority:
        creds, _, host = authority.rpartition("@")
        user, colon, _ = creds.partition(":")
        shown = f"{user}:***" if colon else "***"
        return f"{scheme}://{shown}@{host}{tail}"
    if ":" in authority or scheme.lower() in ("redis", "rediss"):
        # an '@' past a '/', '?' or '#': a password with one of them in it, unencoded
        return f"{scheme}://***@{rest[rest.rfind('@') + 1 :]}"
    return url


class RemoteBackend(ABC):
    """One remote cache, addressed by a URL. Subclasses set :attr:`schemes` and implement
    :meth:`get` and :meth:`put` (and :meth:`contains` when the server can answer it more
    cheaply than a ``get``).

    ``namespace`` separates incompatible writers (cuforge's version and key schema): a
    backend must keep different namespaces apart (e.g. as a path or key prefix).
    ``ttl`` is seconds an entry should live (0: no expiry), honoured where the server can.
    ``max_bytes``: the largest value a ``get`` may buffer (``CUFORGE_REMOTE_MAX_BYTES``).
    """

    #: URL schemes this backend serves (``("redis", "rediss")``)
    schemes: tuple[str, ...] = ()
    #: how many first bytes of a value :meth:`check_head` wants before the rest is read
    head_bytes = 9
    #: ``check(head, total, kind, key, max_bytes) -> end``: the tier's check of a value's first bytes
    #: (:func:`cuforge.store.remote.envelope.check_head`), installed by the tier; None: the
    #: backend moves opaque bytes (only the size cap applies)
    head_check = None

    def __init__(
        self,
        url: str,
        *,
        namespace: str,
        connect_timeout: float,
        timeout: float,
        ttl: float = 0.0,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        self.url = url
        self.namespace = namespace
        self.connect_timeout = connect_timeout
        self.timeout = timeout
        self.ttl = ttl
        self.max_bytes = max_bytes
        self.setup()

    def setup(self) -> None:  # noqa: B027 - optional hook: a backend may need no setup
        """Read and check :attr:`url` (never connect, and never import a client library:
        the first ``get`` / ``put`` / ``contains`` does, so a process that hits its local
        cache pays nothing for the remote). Called at the end of the constructor, so a
        backend overrides this instead of restating the constructor's keywords. Raises
        :class:`RemoteError` (or ValueError) for a URL it cannot use. A client library
        found missing on first use raises :class:`RemoteUnavailable`."""

    @abstractmethod
    def get(self, kind: str, key: str) -> bytes | None:
        """The bytes stored under ``(kind, key)``, or None when there are none."""

    @abstractmethod
    def put(self, kind: str, key: str, data: bytes) -> None:
        """Store ``data`` under ``(kind, key)`` (replacing what was there)."""

    def get_many(self, items: list[tuple[str, str]]) -> list[bytes | None]:
        """The bytes stored under each ``(kind, key)`` of ``items``, in order (None where
        there are none): ``cuforge prefetch``'s batch. Default: one :meth:`get` each; a
        backend that can batch round trips overrides it (Redis: 64 keys a round trip).
        Each round trip is bounded as a ``get`` is; a failure fails the whole batch."""
        return [self.get(kind, key) for kind, key in items]

    def contains(self, kind: str, key: str) -> bool:
        """Whether ``(kind, key)`` is stored (default: a ``get``)."""
        return self.get(kind, key) is not None

    def check_head(self, head, total: int, kind: str, key: str) -> int:
        """For a ``get`` that knows a value's size (``total``, or ``max_bytes`` when it
        does not) and has read its first bytes (``head``: at least :attr:`head_bytes`, or
        the whole value), before it reads the rest: raises :class:`DamagedValue` for a
        value over ``max_bytes`` or one the tier's :attr:`head_check` refuses. Returns
        how many bytes the check would like to see next time (the header's end), or 0."""
        if total > self.max_bytes:
            raise DamagedValue(
                f"remote cache {self.describe()}: {kind}/{key[:16]} is {total} bytes, over "
                f"the {self.max_bytes}-byte cap (CUFORGE_REMOTE_MAX_BYTES)"
            )
        check = self.head_check
        if check is None:
            return 0
        try:
            return check(head, total, kind, key, self.max_bytes)
        except DamagedValue as exc:
            raise DamagedValue(f"remote cache {self.describe()}: {exc}") from None

    #: whether :meth:`lease` / :meth:`renew` / :meth:`release` work (fleet-wide single
    #: flight); a backend without them (HTTP, S3, most plug-ins) gets local single flight only
    supports_leases = False

    def lease(self, kind: str, key: str, ttl: float, holder: str) -> tuple[int | None, str]:
        """Try to take the build lease of ``(kind, key)`` for ``ttl`` seconds, as
        ``holder`` (``"host X pid N"``). Returns ``(token, holder)``: a fencing token (an
        int that grows with every attempt) and ``holder`` when this call took it; ``(None,
        who)`` while another holds it (``who``: what that holder recorded, ``""`` when
        unknown). An expired lease is taken over. Optional (default: not supported, see
        :attr:`supports_leases`)."""
        raise NotImplementedError(f"{type(self).__name__} has no build leases")

    def renew(self, kind: str, key: str, token: int, ttl: float) -> bool:
        """Extend the lease ``token`` holds to ``ttl`` seconds from now; False when it is no
        longer held by ``token`` (it expired and was taken over)."""
        raise NotImplementedError(f"{type(self).__name__} has no build leases")

    def release(self, kind: str, key: str, token: int) -> None:
        """Drop the lease of ``(kind, key)`` when ``token`` still holds it (never another's)."""
        raise NotImplementedError(f"{type(self).__name__} has no build leases")

    def trust_problem(self, kind: str, key: str) -> str | None:
        """Why an unsigned value read for ``(kind, key)`` cannot be trusted (anyone may
        have written it: a world-writable shared directory), or None (default: the
        backend cannot tell). Asked by the tier only when no signing key is set."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook: most backends hold nothing
        """Release connections (default: nothing to release)."""

    def describe(self) -> str:
        """The URL without its password."""
        return redact(self.url)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.describe()!r})"
