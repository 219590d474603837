"""cuforge's settings: every ``CUFORGE_*`` environment variable, read in one place.

The bottom layer. It imports nothing from the rest of cuforge.

Settings are live: :func:`settings` notices when the environment changes (a test's
``monkeypatch.setenv``, a user's ``os.environ[...] = ...``) and re-reads it. It costs a
fraction of a microsecond when nothing changed, because the compile hot path calls it.

========================== ============================================================
variable                   meaning
========================== ============================================================
CUFORGE_CACHE_DIR          root of the disk cache (default: platformdirs' user cache dir)
CUFORGE_DISABLE_CACHE      ``1``: never look up or store anything; always compile
CUFORGE_DISABLE_FILE_CACHE ``1``: memory tier only, nothing written to disk
CUFORGE_CACHE_MAX_BYTES    disk-tier cap; least recently used entries go first (5 GiB)
CUFORGE_MEMORY_MAX_BYTES   in-process tier cap (256 MiB)
CUFORGE_VERBOSE            ``1``: one line per compile or hit, with timings, on stderr
CUFORGE_EXPLAIN            ``1``: on a miss, say which key field changed (on stderr)
CUFORGE_ARCH               target arch when no GPU is visible (``sm_90``, ``9.0`` or ``90``)
CUFORGE_EXTRA_OPTIONS      options appended to every kernel compile (part of the key)
CUFORGE_NVCC               the nvcc executable to use (default: the toolkit's)
CUFORGE_LOCK_TIMEOUT       seconds a process waits for another's compile (default 600)
CUFORGE_TELEMETRY          ``0``: record no hit/miss statistics (default ``1``)
CUFORGE_FAST_LAUNCH        ``python``: never build or use the C launch helper
                           (read by :mod:`cuforge.runtime.fastlaunch`)
========================== ============================================================
"""

from __future__ import annotations

import os
import sys

__all__ = [
    "CODEGEN_ENV_VARS",
    "Settings",
    "settings",
    "codegen_environment",
    "result_environment",
    "parse_size",
    "normalize_arch",
    "parse_arch_list",
    "ArchError",
]

DEFAULT_CACHE_MAX_BYTES = 5 * 1024**3
DEFAULT_MEMORY_MAX_BYTES = 256 * 1024**2
DEFAULT_LOCK_TIMEOUT = 600.0

#: Environment variables that change generated code. They are part of every cache key;
#: any other variable may change freely and still hit.
CODEGEN_ENV_VARS: tuple[str, ...] = (
    "NVCC_PREPEND_FLAGS",
    "NVCC_APPEND_FLAGS",
    "CUDA_HOME",
    "CUDA_PATH",
    "CUFORGE_EXTRA_OPTIONS",
    "CUFORGE_NVCC",
)

_SETTING_VARS: tuple[str, ...] = (
    "CUFORGE_CACHE_DIR",
    "CUFORGE_DISABLE_CACHE",
    "CUFORGE_DISABLE_FILE_CACHE",
    "CUFORGE_CACHE_MAX_BYTES",
    "CUFORGE_MEMORY_MAX_BYTES",
    "CUFORGE_VERBOSE",
    "CUFORGE_EXPLAIN",
    "CUFORGE_ARCH",
    "CUFORGE_LOCK_TIMEOUT",
    "CUFORGE_TELEMETRY",
    "TORCH_CUDA_ARCH_LIST",
    "XDG_CACHE_HOME",
    "HOME",
)
_WATCHED = _SETTING_VARS + CODEGEN_ENV_VARS
#: The variables that can change what an identical compile() call returns.
_RESULT_VARS = ("CUFORGE_DISABLE_CACHE", "CUFORGE_ARCH", "TORCH_CUDA_ARCH_LIST") + CODEGEN_ENV_VARS

# os.environ keeps its real data in a plain dict; reading it directly is what makes the
# change check cheap enough for the hot path. Fall back to the public mapping elsewhere.
_environ_data = getattr(os.environ, "_data", None)
if os.name == "posix" and isinstance(_environ_data, dict):
    _WATCHED_KEYS: tuple = tuple(os.fsencode(k) for k in _WATCHED)
    _RESULT_KEYS: tuple = tuple(os.fsencode(k) for k in _RESULT_VARS)
    _env_get = _environ_data.get
else:  # pragma: no cover - non-posix
    _WATCHED_KEYS = _WATCHED
    _RESULT_KEYS = _RESULT_VARS
    _env_get = os.environ.get


class ArchError(ValueError):
    """An arch string cuforge cannot understand, or no arch could be determined."""


class Settings:
    """A snapshot of cuforge's configuration. Read it through :func:`settings`."""

    __slots__ = (
        "cache_dir",
        "disable_cache",
        "disable_file_cache",
        "cache_max_bytes",
        "memory_max_bytes",
        "verbose",
        "explain",
        "arch",
        "torch_arch_list",
        "lock_timeout",
        "telemetry",
        "extra_options",
        "nvcc",
        "codegen_env",
    )

    def __init__(self, env: dict[str, str]) -> None:
        get = env.get
        self.cache_dir: str = os.path.abspath(
            os.path.expanduser(get("CUFORGE_CACHE_DIR") or _default_cache_dir())
        )
        self.disable_cache: bool = _flag(get("CUFORGE_DISABLE_CACHE"))
        self.disable_file_cache: bool = _flag(get("CUFORGE_DISABLE_FILE_CACHE"))
        self.cache_max_bytes: int = _size(get, "CUFORGE_CACHE_MAX_BYTES", DEFAULT_CACHE_MAX_BYTES)
        self.memory_max_bytes: int = _size(
            get, "CUFORGE_MEMORY_MAX_BYTES", DEFAULT_MEMORY_MAX_BYTES
        )
        self.verbose: bool = _flag(get("CUFORGE_VERBOSE"))
        self.explain: bool = _flag(get("CUFORGE_EXPLAIN"))
        self.arch: str | None = get("CUFORGE_ARCH") or None
        self.torch_arch_list: str | None = get("TORCH_CUDA_ARCH_LIST") or None
        self.lock_timeout: float = _float(get, "CUFORGE_LOCK_TIMEOUT", DEFAULT_LOCK_TIMEOUT)
        self.telemetry: bool = get("CUFORGE_TELEMETRY", "1").strip().lower() not in (
            "0",
            "false",
            "no",
            "off",
        )
        self.extra_options: tuple[str, ...] = tuple((get("CUFORGE_EXTRA_OPTIONS") or "").split())
        self.nvcc: str | None = get("CUFORGE_NVCC") or None
        #: (name, value) for every allow-listed codegen variable, set or not.
        self.codegen_env: tuple[tuple[str, str], ...] = tuple(
            (k, get(k) or "") for k in CODEGEN_ENV_VARS
        )

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"Settings({fields})"


_cached: tuple[tuple, Settings] | None = None


def settings() -> Settings:
    """The current settings, re-read whenever a watched environment variable changed."""
    global _cached
    snapshot = tuple(map(_env_get, _WATCHED_KEYS))
    cached = _cached
    if cached is not None and cached[0] == snapshot:
        return cached[1]
    current = Settings({k: v for k in _WATCHED if (v := os.environ.get(k)) is not None})
    _cached = (snapshot, current)
    return current


def result_environment() -> tuple:
    """The raw values of the variables that can change an identical compile's result
    (codegen variables, arch fallbacks, the cache switch): the hot path's memo keys on it."""
    return tuple(map(_env_get, _RESULT_KEYS))


def codegen_environment() -> tuple[tuple[str, str], ...]:
    """The allow-listed environment variables that change generated code, with values."""
    return settings().codegen_env


def _default_cache_dir() -> str:
    # platformdirs costs ~30 ms to import here, so the common answer is computed inline
    # and platformdirs is asked only on platforms where the XDG rule does not apply.
    if sys.platform.startswith("linux"):
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return os.path.join(base, "cuforge")
    import platformdirs  # pragma: no cover - non-linux

    return platformdirs.user_cache_dir("cuforge", appauthor=False)  # pragma: no cover


def _flag(value: str | None) -> bool:
    return value is not None and value.strip().lower() in ("1", "true", "yes", "on")


_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kb": 1024,
    "kib": 1024,
    "m": 1024**2,
    "mb": 1024**2,
    "mib": 1024**2,
    "g": 1024**3,
    "gb": 1024**3,
    "gib": 1024**3,
    "t": 1024**4,
    "tb": 1024**4,
    "tib": 1024**4,
}


def parse_size(text: str) -> int:
    """``"5GiB"``, ``"512m"``, ``"1000000"`` -> bytes. Raises ValueError with the accepted forms."""
    raw = text.strip().lower().replace(" ", "")
    number = raw.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = raw[len(number) :]
    if not number or unit not in _SIZE_UNITS:
        raise ValueError(f"cannot read size {text!r}: use bytes or a unit such as 512M, 5G, 5GiB")
    return int(float(number) * _SIZE_UNITS[unit])


def _size(get, name: str, default: int) -> int:
    value = get(name)
    if not value:
        return default
    try:
        return parse_size(value)
    except ValueError as exc:
        raise ValueError(f"{name}={value!r}: {exc}") from None


def _float(get, name: str, default: float) -> float:
    value = get(name)
    if not value:
        return default
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not a number of seconds") from None


def normalize_arch(arch: str | int) -> str:
    """Any common spelling of an arch -> ``sm_XY`` (or ``compute_XY`` for a virtual arch).

    Accepts ``"sm_90"``, ``"sm_90a"``, ``"compute_90"``, ``"9.0"``, ``"90"``, ``90`` and
    ``"9.0a"``. ``"+PTX"`` suffixes are not accepted here; see :func:`parse_arch_list`.
    """
    text = str(arch).strip().lower()
    original = text
    prefix = "sm_"
    if text.startswith("sm_"):
        text = text[3:]
    elif text.startswith("sm"):
        text = text[2:]
    elif text.startswith("compute_"):
        prefix, text = "compute_", text[8:]
    suffix = ""
    if text and text[-1] in "af" and len(text) > 1:
        suffix, text = text[-1], text[:-1]
    if "." in text:
        major, _, minor = text.partition(".")
        digits = major + minor if major.isdigit() and minor.isdigit() and len(minor) == 1 else ""
    else:
        digits = text if text.isdigit() else ""
    if len(digits) not in (2, 3) or int(digits) < 30:
        raise ArchError(
            f"cannot read arch {original!r}: write it as 'sm_90', '9.0' or '90' "
            "(optionally with an 'a' suffix, e.g. 'sm_90a')"
        )
    return f"{prefix}{digits}{suffix}"


def parse_arch_list(text: str) -> tuple[str, ...]:
    """A ``TORCH_CUDA_ARCH_LIST``-style list (``"8.0;9.0+PTX"``, ``"8.0 9.0"``) -> ``sm_XY``s."""
    parts = [p for p in text.replace(",", ";").replace(" ", ";").split(";") if p.strip()]
    archs: list[str] = []
    for part in parts:
        part = part.strip()
        if part.upper().endswith("+PTX"):
            part = part[:-4]
        arch = normalize_arch(part)
        if arch not in archs:
            archs.append(arch)
    if not archs:
        raise ArchError(f"arch list {text!r} names no arch")
    return tuple(archs)
