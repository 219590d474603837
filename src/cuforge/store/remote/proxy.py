"""Which HTTP proxy a remote cache URL goes through: ``HTTPS_PROXY`` / ``HTTP_PROXY`` /
``NO_PROXY``, read as urllib3 and requests read them.

* the variable is chosen by the cache URL's scheme: ``https_proxy`` for ``https://``,
  ``http_proxy`` for ``http://``; each also in capitals, the lowercase one winning when both
  are set (urllib's rule). ``HTTP_PROXY`` in capitals is ignored when ``REQUEST_METHOD``
  is set (a CGI process, where a request's ``Proxy:`` header arrives as ``HTTP_PROXY``:
  "httpoxy"), as urllib does;
* a proxy written without a scheme (``proxy:3128``) is ``http://proxy:3128``; credentials in
  it (``http://user:pw@proxy:3128``) become ``Proxy-Authorization: Basic``; only ``http://``
  proxies are spoken to (an ``https://`` or ``socks5://`` proxy is refused with a
  :class:`~cuforge.store.remote.base.RemoteError` naming the variable);
* ``no_proxy`` / ``NO_PROXY`` (lowercase winning): comma-separated entries; ``*`` bypasses
  the proxy for every host; ``example.com`` and ``.example.com`` match that host and every
  host under it (``cache.example.com``), never ``badexample.com``; ``host:port`` matches
  only that port; an IP address matches that address, a CIDR block (``10.0.0.0/8``) every
  address in it; ``[::1]`` is the IPv6 host ``::1``. Matching ignores case.

Standard library only; :mod:`ipaddress` is imported only for an entry that needs it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from cuforge.store.remote.base import RemoteError, redact, split_url

__all__ = ["Proxy", "proxy_for", "bypasses"]


class Proxy:
    """An HTTP proxy: ``host``, ``port``, the ``Proxy-Authorization`` header value (or
    None), the URL (``url``, without its password) and the variable it came from."""

    __slots__ = ("host", "port", "authorization", "url", "variable")

    def __init__(
        self, host: str, port: int, authorization: str | None, url: str, variable: str
    ) -> None:
        self.host, self.port, self.authorization = host, port, authorization
        self.url, self.variable = url, variable

    def describe(self) -> str:
        return f"the proxy {self.url} (from {self.variable})"

    def __repr__(self) -> str:
        return f"Proxy({self.url!r}, variable={self.variable!r})"


def _lookup(environ: Mapping[str, str], name: str) -> tuple[str, str] | None:
    """(variable, value) of ``name`` in lowercase, else in capitals; None when neither is
    set to something."""
    for var in (name.lower(), name.upper()):
        if var == "HTTP_PROXY" and environ.get("REQUEST_METHOD"):
            continue  # httpoxy: in a CGI process HTTP_PROXY is a request header
        value = environ.get(var, "").strip()
        if value:
            return var, value
    return None


def _host_of(entry: str) -> tuple[str, int | None]:
    """A NO_PROXY entry's host (lowercase, without brackets) and port (None: any)."""
    entry = entry.strip().lower()
    if entry.startswith("["):
        host, _, after = entry[1:].partition("]")
        port = after[1:] if after.startswith(":") else ""
    elif entry.count(":") == 1:
        host, _, port = entry.partition(":")
    else:  # a bare IPv6 address (or no port)
        host, port = entry, ""
    return host, (int(port) if port.isdigit() else None)


def _ip(text: str):
    import ipaddress  # only for hosts and entries that are addresses

    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _in_block(host: str, block: str) -> bool:
    import ipaddress  # only for a CIDR entry

    address = _ip(host)
    if address is None:
        return False
    try:
        return address in ipaddress.ip_network(block, strict=False)
    except ValueError:
        return False


def bypasses(host: str, port: int, no_proxy: str) -> bool:
    """Whether ``host:port`` bypasses the proxy by the ``no_proxy`` list (see the module)."""
    host = host.strip().lower().strip("[]")
    for raw in no_proxy.split(","):
        raw = raw.strip()
        if not raw:
            continue
        if raw == "*":
            return True
        if "/" in raw:
            if _in_block(host, raw.lower()):
                return True
            continue
        entry, entry_port = _host_of(raw)
        if entry_port is not None and entry_port != port:
            continue
        entry = entry.lstrip(".")
        if not entry:
            continue
        if host == entry or host.endswith("." + entry):
            return True
        if ":" in host and ":" in entry:  # IPv6: the same address spelled two ways
            ours = _ip(host)
            if ours is not None and ours == _ip(entry):
                return True
    return False


def proxy_for(
    scheme: str, host: str, port: int, environ: Mapping[str, str] | None = None
) -> Proxy | None:
    """The proxy a request to ``scheme://host:port`` goes through, or None (no proxy
    variable, or the host is in ``NO_PROXY``). Raises RemoteError for a proxy URL that
    cannot be used, naming the variable."""
    env = os.environ if environ is None else environ
    found = _lookup(env, f"{scheme}_proxy")
    if found is None:
        return None
    excluded = _lookup(env, "no_proxy")
    if excluded is not None and bypasses(host, port, excluded[1]):
        return None
    variable, value = found
    text = value if "://" in value else "http://" + value
    try:
        parts = split_url(text)
    except ValueError as exc:
        raise RemoteError(f"{variable}={redact(value)!r} is not a proxy URL: {exc}") from exc
    if parts.scheme.lower() != "http":
        raise RemoteError(
            f"{variable}={redact(value)!r}: cuforge's HTTP remote speaks to http:// proxies "
            f"only, not {parts.scheme}:// (unset {variable}, or add the cache's host to NO_PROXY)"
        )
    if not parts.hostname:
        raise RemoteError(f"{variable}={redact(value)!r} names no proxy host")
    authorization = None
    if parts.username is not None or parts.password is not None:
        import base64
        from urllib.parse import unquote

        user, password = unquote(parts.username or ""), unquote(parts.password or "")
        token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
        authorization = f"Basic {token}"
    return Proxy(parts.hostname, parts.port or 80, authorization, redact(text), variable)
