"""Remote cache tiers, shared between machines: :func:`open_remotes` builds them.

Modules: :mod:`~cuforge.store.remote.base` (the backend interface),
:mod:`~cuforge.store.remote.tier` (:class:`RemoteStore`, the tier over a backend),
:mod:`~cuforge.store.remote.envelope` (the checked, signed value format),
:mod:`~cuforge.store.remote.breaker` (the circuit breaker),
:mod:`~cuforge.store.remote.file` (``file://``), ``redis`` (``redis://``, ``rediss://``),
``http`` (``http://``, ``https://``), ``s3`` (``s3://bucket/prefix``), :mod:`~cuforge.store.remote.plugin` (loading
``CUFORGE_REMOTE_BACKEND``). Nothing is imported until :func:`open_remotes` runs.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not `typing.TYPE_CHECKING`: importing typing costs ~10 ms
if TYPE_CHECKING:  # pragma: no cover
    from cuforge.base.config import Settings
    from cuforge.store.base import Store
    from cuforge.store.remote.base import RemoteBackend

__all__ = ["open_remotes", "read_secret", "namespace", "BUILTIN"]

#: scheme -> "module:Class" of the backends that ship with cuforge
BUILTIN = {
    "file": "cuforge.store.remote.file:FileBackend",
    "redis": "cuforge.store.remote.redis:RedisBackend",
    "rediss": "cuforge.store.remote.redis:RedisBackend",
    "http": "cuforge.store.remote.http:HttpBackend",
    "https": "cuforge.store.remote.http:HttpBackend",
    "s3": "cuforge.store.remote.s3:S3Backend",
}
#: what to install when a built-in backend's dependency is missing (the extra's name)
_EXTRAS = {"s3": "s3"}  # Redis needs none: cuforge speaks its protocol itself
#: the module an extra provides, where its name differs
_EXTRA_MODULE = {"s3": "boto3"}

# key file path -> its contents (read once per process)
_secrets: dict[str, bytes] = {}
# URLs already warned about (a skipped tier), once per process
_warned: set[str] = set()


def namespace() -> str:
    """``"cuforge-<version>-k<key schema>"``: writers of another namespace never share
    entries (a backend keeps namespaces apart; the envelope checks it again)."""
    from cuforge._version import __version__
    from cuforge.keys.key import SCHEMA_VERSION

    return f"cuforge-{__version__}-k{SCHEMA_VERSION}"


def read_secret(current: Settings) -> bytes | None:
    """The HMAC key: ``CUFORGE_REMOTE_KEY``, else the stripped contents of
    ``CUFORGE_REMOTE_KEY_FILE`` (read once per process), else None. Raises
    :class:`~cuforge.base.errors.ConfigError` for a key file that cannot be read or is empty."""
    if current.remote_key:
        return current.remote_key.encode()
    path = current.remote_key_file
    if not path:
        return None
    secret = _secrets.get(path)
    if secret is None:
        import os

        from cuforge.base import _fs
        from cuforge.base.errors import ConfigError

        try:
            secret = _fs.read_bytes(os.path.expanduser(path), max_bytes=1 << 16, follow=True)
        except OSError as exc:
            raise ConfigError(
                f"CUFORGE_REMOTE_KEY_FILE={path!r} cannot be read ({exc.strerror or exc}); "
                "point it at a readable regular file holding the shared key, or unset it"
            ) from None
        secret = secret.strip()
        if not secret:
            raise ConfigError(
                f"CUFORGE_REMOTE_KEY_FILE={path!r} is empty; put the shared key in it, or unset it"
            )
        _secrets[path] = secret
    return secret


def _load(spec: str):
    module_name, _, attr = spec.partition(":")
    # __import__, not importlib.import_module: importing importlib (and warnings) costs
    # ~0.8 ms, paid by every process that has a remote configured
    return getattr(__import__(module_name, fromlist=(attr,)), attr)


def _skip(url: str, why: str, fix: str) -> None:
    from cuforge.store.remote.base import redact

    shown = redact(url)
    if shown in _warned:
        return
    _warned.add(shown)
    import logging

    logging.getLogger("cuforge").warning(
        "cuforge: not using remote cache %s: %s. Fix: %s. Compiles and the local cache work "
        "without it.",
        shown,
        why,
        fix,
    )


def scheme_of(url: str) -> str:
    """``url``'s scheme, lowercase (``""`` when it has none)."""
    return url.partition("://")[0].lower() if "://" in url else ""


def backend_class(url: str, plugin: str = "") -> type[RemoteBackend] | None:
    """The backend class serving ``url``: the plug-in (``plugin``, ``"module:Class"``)
    when it lists the URL's scheme, else the built-in one; None (after one warning) when a
    built-in backend cannot be imported. Raises :class:`~cuforge.base.errors.ConfigError` for a
    scheme nothing serves, or a plug-in that is not one."""
    scheme = scheme_of(url)
    if plugin:
        from cuforge.store.remote.plugin import load_backend_class

        cls = load_backend_class(plugin)
        if scheme in cls.schemes:
            return cls
    spec = BUILTIN.get(scheme)
    if spec is None:
        from cuforge.base.errors import ConfigError
        from cuforge.store.remote.base import redact

        raise ConfigError(
            f"CUFORGE_REMOTE: no backend serves {redact(url)!r} (scheme {scheme!r}). Built in: "
            "file://, redis://, rediss://, http://, https://, s3://; for another scheme set "
            "CUFORGE_REMOTE_BACKEND=module:Class to a RemoteBackend subclass whose `schemes` "
            f"lists {scheme!r}"
            + (f" (CUFORGE_REMOTE_BACKEND={plugin!r} does not)" if plugin else "")
        )
    try:
        return _load(spec)
    except ImportError as exc:
        _skip(url, f"{spec} cannot be imported ({exc})", _install_fix(scheme))
        return None


def _missing_extra(scheme: str) -> bool:
    """Whether the package a built-in backend of ``scheme`` needs is not installed."""
    extra = _EXTRAS.get(scheme)
    if extra is None:
        return False
    from importlib.util import find_spec

    return find_spec(_EXTRA_MODULE.get(extra, extra)) is None


def _install_fix(scheme: str) -> str:
    extra = _EXTRAS.get(scheme)
    if extra:
        return f"pip install 'cuforge[{extra}]'"
    return "reinstall cuforge (a module of it is missing)"


def open_remotes(current: Settings, *, telemetry_root: str | None = None) -> list[Store]:
    """One :class:`~cuforge.store.remote.tier.RemoteStore` per URL of ``CUFORGE_REMOTE``
    (``current.remote``), in order, configured from ``current``: the HMAC key
    (:func:`read_secret`), read-only mode, the timeouts, the TTL and the size cap. ``telemetry_root``:
    the local cache dir whose telemetry records the remote tiers' events.

    Scheme dispatch: ``file`` -> :class:`~cuforge.store.remote.file.FileBackend`;
    ``redis``/``rediss`` -> ``cuforge.store.remote.redis:RedisBackend``;
    ``http``/``https`` -> ``cuforge.store.remote.http:HttpBackend``; ``s3`` ->
    ``cuforge.store.remote.s3:S3Backend`` (boto3); any other scheme
    (or one of those, to replace the built-in backend) -> the plug-in named by
    ``CUFORGE_REMOTE_BACKEND=module:Class``. A built-in backend whose module or
    dependency is missing is skipped with one warning naming the URL and the fix
    (``pip install 'cuforge[s3]'``). A backend whose constructor fails with anything
    but a :class:`~cuforge.base.errors.ConfigError` is skipped with one warning.

    Raises :class:`~cuforge.base.errors.ConfigError` for a scheme nothing serves, a plug-in that
    cannot be imported or is not a :class:`~cuforge.store.remote.base.RemoteBackend`
    subclass listing the scheme, or an unreadable ``CUFORGE_REMOTE_KEY_FILE``.

    A plug-in, e.g. ``mycache.py`` (``CUFORGE_REMOTE=mem://team``,
    ``CUFORGE_REMOTE_BACKEND=mycache:DictBackend``)::

        from cuforge.store.remote.base import RemoteBackend, RemoteError

        _DATA: dict[tuple[str, str, str], bytes] = {}


        class DictBackend(RemoteBackend):
            \"\"\"A toy remote: one dict per process. A real one talks to a server,
            honouring self.connect_timeout and self.timeout on every call.\"\"\"

            schemes = ("mem",)

            def get(self, kind: str, key: str) -> bytes | None:
                return _DATA.get((self.namespace, kind, key))

            def put(self, kind: str, key: str, data: bytes) -> None:
                if len(_DATA) > 10_000:
                    raise RemoteError("full")  # any exception: counted, never fatal
                _DATA[(self.namespace, kind, key)] = data

    The backend moves opaque bytes only: cuforge wraps each value in a checked (and, with
    ``CUFORGE_REMOTE_KEY``, signed) envelope, retries nothing, and skips the backend for a
    while after a timeout or three failures in a row.
    """
    urls = current.remote
    if not urls:
        return []
    from cuforge.store.remote.tier import RemoteStore

    secret = read_secret(current)
    signer = keyring = None
    if current.signing_key or current.trusted_keys:
        from cuforge.base.signing import configured

        signer, keyring = configured(current)
    ns = namespace()
    tiers: list[Store] = []
    for url in urls:
        cls = backend_class(url, current.remote_backend)
        if cls is None:
            continue
        try:
            backend = cls(
                url,
                namespace=ns,
                connect_timeout=current.remote_connect_timeout,
                timeout=current.remote_timeout,
                ttl=current.remote_ttl,
                max_bytes=current.remote_max_bytes,
            )
        except ImportError as exc:  # a backend importing its client library lazily
            _skip(
                url, f"{cls.__name__} needs a missing module ({exc})", _install_fix(scheme_of(url))
            )
            continue
        except Exception as exc:  # noqa: BLE001 - a remote (or plug-in) may raise anything; a remote never fails a compile
            # (imported here, not for every tier built: a sound URL raises nothing)
            from cuforge.base.errors import ConfigError

            if isinstance(exc, ConfigError):
                raise
            _skip(
                url,
                f"{cls.__name__} could not be set up ({type(exc).__name__}: {exc})",
                _install_fix(scheme_of(url))
                if _missing_extra(scheme_of(url))
                else "check the URL in CUFORGE_REMOTE",
            )
            continue
        tiers.append(
            RemoteStore(
                backend,
                secret=secret,
                readonly=current.remote_readonly,
                telemetry_root=telemetry_root,
                signer=signer,
                keyring=keyring,
            )
        )
    return tiers
