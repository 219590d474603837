"""``CUFORGE_REMOTE_BACKEND=module:Class``: loading a plug-in remote backend.

The class must subclass :class:`cuforge.store.remote.base.RemoteBackend` and list the URL
schemes it serves in ``schemes``. See :func:`cuforge.store.remote.open_remotes` for an
example plug-in.
"""

from __future__ import annotations

from cuforge.base.errors import ConfigError

TYPE_CHECKING = False  # not `typing.TYPE_CHECKING`: importing typing costs ~10 ms
if TYPE_CHECKING:  # pragma: no cover
    from cuforge.store.remote.base import RemoteBackend

__all__ = ["load_backend_class"]

_FORM = (
    "expected CUFORGE_REMOTE_BACKEND=module:Class, naming an importable subclass of "
    "cuforge.store.remote.base.RemoteBackend that lists its URL schemes in `schemes`"
)


def load_backend_class(spec: str) -> type[RemoteBackend]:
    """The class ``spec`` (``"module:Class"``) names. Raises :class:`ConfigError` naming
    ``CUFORGE_REMOTE_BACKEND`` when it is malformed, cannot be imported, or is not a
    :class:`RemoteBackend` subclass with ``schemes``."""
    module_name, sep, attr = spec.strip().partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"CUFORGE_REMOTE_BACKEND={spec!r} is malformed; {_FORM}")
    import importlib

    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - a plug-in's import may raise anything; reported as a config error
        raise ConfigError(
            f"CUFORGE_REMOTE_BACKEND={spec!r}: cannot import {module_name!r} "
            f"({type(exc).__name__}: {exc}); {_FORM}"
        ) from exc
    cls = module
    for part in attr.split("."):
        cls = getattr(cls, part, None)
        if cls is None:
            raise ConfigError(
                f"CUFORGE_REMOTE_BACKEND={spec!r}: module {module_name!r} has no {attr!r}; {_FORM}"
            )
    from cuforge.store.remote.base import RemoteBackend

    if not isinstance(cls, type) or not issubclass(cls, RemoteBackend):
        raise ConfigError(
            f"CUFORGE_REMOTE_BACKEND={spec!r} names {cls!r}, not a RemoteBackend subclass; {_FORM}"
        )
    schemes = getattr(cls, "schemes", ())
    if not isinstance(schemes, (tuple, list)) or not schemes:
        raise ConfigError(
            f"CUFORGE_REMOTE_BACKEND={spec!r}: {cls.__name__}.schemes is empty; {_FORM}"
        )
    return cls
