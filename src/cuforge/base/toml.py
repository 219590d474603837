"""Reading TOML (manifests, lockfiles): ``tomllib`` from Python 3.11, ``tomli`` on 3.10.

Imported only by the readers that need it; it imports nothing of cuforge's but the errors."""

from __future__ import annotations

from cuforge.base.errors import CuforgeError

TYPE_CHECKING = False  # lockfiles are read at a service's start (prefetch): no typing import
if TYPE_CHECKING:
    from typing import Any


def loads(text: str) -> tuple[dict[str, Any], type[Exception]]:
    """``(data, DecodeError)``: the parsed document and the parser's error class (whose
    message says "(at line N, column M)"). On Python 3.10 without tomli, a
    :class:`CuforgeError` says what to install."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ImportError:
            raise CuforgeError(
                "reading TOML on Python 3.10 needs tomli: pip install tomli "
                "(Python 3.11+ has tomllib built in)"
            ) from None
    return tomllib.loads(text), tomllib.TOMLDecodeError
