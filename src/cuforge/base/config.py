"""cuforge's settings: every ``CUFORGE_*`` environment variable, read in one place.

The bottom layer. It imports only :mod:`cuforge.base.errors` from the rest of cuforge, and that
only with the first :class:`ConfigError` it raises.

Settings are live: :func:`settings` notices when the environment changes (a test's
``monkeypatch.setenv``, a user's ``os.environ[...] = ...``) and re-reads it. It costs a
fraction of a microsecond when nothing changed, because the compile hot path calls it.

========================== ============================================================
variable                   meaning
========================== ============================================================
CUFORGE_CACHE_DIR          root of the disk cache (default: platformdirs' user cache dir);
                           it must be owned by you and not writable by group or others
CUFORGE_DISABLE_CACHE      ``1``: never look up or store anything; always compile
CUFORGE_DISABLE_FILE_CACHE ``1``: memory tier only, nothing written to disk
CUFORGE_CACHE_MAX_BYTES    disk-tier cap; least recently used entries go first (5 GiB)
CUFORGE_MEMORY_MAX_BYTES   in-process tier cap (256 MiB)
CUFORGE_VERBOSE            ``1``: one line per compile or hit, with timings, on stderr
CUFORGE_EXPLAIN            ``1``: on a miss, say which key field changed (on stderr)
CUFORGE_ARCH               target arch when no GPU is visible (``sm_90``, ``9.0`` or ``90``)
CUFORGE_EXTRA_OPTIONS      options appended to every kernel compile (part of the key)
CUFORGE_NVCC               the nvcc executable to use (default: the toolkit's)
CUFORGE_LOCK_TIMEOUT       seconds a process waits for another's compile (default 600);
                           ``0``: never wait, ``inf``: wait as long as it takes
CUFORGE_TELEMETRY          ``0``: record no hit/miss statistics (default ``1``)
CUFORGE_FAST_LAUNCH        ``python``: never build or use the C launch helper (default ``c``)
CUFORGE_TORCH_LAUNCHER     ``ccache`` / ``sccache`` / ``auto`` (or a launcher program):
                           compiler launcher for torch builds; ``0``/``off``/``none``: none
CUFORGE_TORCH_SPLIT        ``0`` / ``1``: force nvcc's parallel host/device pipelines off / on
CUFORGE_TORCH_OP_SHIM      ``0``: ``cuforge.torch.custom_op`` never uses its C++ op shim (no
                           C++ CUDA kernel, no eager entry; docs/custom_ops.md; default ``1``)
CUFORGE_DEBUG              ``1``: the CLI shows tracebacks
CUFORGE_PROGRESS           ``1`` / ``0``: force progress output on / off (default: on a
                           terminal, off under ``CI=true`` or when stderr is not a terminal)
CUFORGE_BASE_DIR           paths under it enter keys relative to it (default: the working
                           directory), so checkouts at different paths share entries
CUFORGE_REMOTE             remote cache tiers, comma-separated, tried in order:
                           ``redis://[:pw@]host:port/db``, ``rediss://``, ``http(s)://host/prefix``,
                           ``file:///shared/dir``
CUFORGE_REMOTE_BACKEND     ``module:Class``: a plug-in backend, used for the CUFORGE_REMOTE URLs
                           whose scheme it lists in ``schemes``
CUFORGE_REMOTE_KEY         HMAC-SHA256 key: sign remote entries, refuse unsigned ones (set
                           but empty is an error: an unexpanded CI secret must not mean "none")
CUFORGE_REMOTE_KEY_FILE    a file holding that key (instead of the variable)
CUFORGE_SIGNING_KEY        a private key file (``cuforge keys generate``): sign remote entries
                           and bundles with Ed25519 (writers, e.g. CI)
CUFORGE_TRUSTED_KEYS       a keyring file of ``NAME ed25519:HEX`` lines: accept only remote
                           entries and bundles signed by one of these keys (readers)
CUFORGE_REMOTE_READONLY    ``1``: read remote tiers, never write them
CUFORGE_REMOTE_NATIVE      ``allow``: serve native host code (torch extension objects and
                           modules, the op shim, Triton's C modules) from a remote tier that
                           checks no signature; default ``refuse`` (built locally instead)
CUFORGE_REMOTE_CONNECT_TIMEOUT  seconds to connect to a remote (default 0.1)
CUFORGE_REMOTE_TIMEOUT     seconds for one remote get or put, all of it (default 1)
CUFORGE_REMOTE_MAX_BYTES   the largest remote value read or written (128 MiB); a larger
                           one is refused unread and counts as a failure of that remote
CUFORGE_REMOTE_TTL         seconds a remote entry lives where the backend supports expiry
                           (default 0: no expiry)
CUFORGE_LEASE_TTL          seconds a build lease on a redis:// or file:// remote lives without
                           renewal (default 30): N machines that miss one key build it once
CUFORGE_OFFLINE            ``1``: strict production mode: a kernel not in the cache or a
                           loaded bundle raises ``OfflineMissError``; nothing is compiled
CUFORGE_FENCE              ``warn`` / ``error``: the compile fence (``cuforge.fence``): any
                           build after it is reported once per key, or raises
                           ``CompileAfterFenceError`` (nothing is compiled); ``off``: none
CUFORGE_RECORD             a path: write every cache key this process asks for to that
                           lockfile at exit (``cuforge.record``; ``cuforge build --lock``)
CUFORGE_ENABLE             ``all`` or a comma list (``triton,torch_compile``): every Python
                           process of an environment with cuforge installed enables those
                           systems' caches (``cuforge.enable``; docs/run.md); unset: none
========================== ============================================================

Accepted values, and what an out-of-range one does (always a :class:`ConfigError`, a
``ValueError``, that names the variable and what it accepts; nothing is silently ignored):

* switches (``CUFORGE_DISABLE_CACHE``, ``CUFORGE_DISABLE_FILE_CACHE``, ``CUFORGE_VERBOSE``,
  ``CUFORGE_EXPLAIN``, ``CUFORGE_TELEMETRY``, ``CUFORGE_TORCH_SPLIT``, ``CUFORGE_DEBUG``,
  ``CUFORGE_PROGRESS``, ``CUFORGE_REMOTE_READONLY``, ``CUFORGE_OFFLINE``):
  ``1``/``true``/``yes``/``on`` or ``0``/``false``/``no``/``off`` (any case); empty means
  the default;
* sizes: bytes or a number with a unit (``512M``, ``5G``, ``5GiB``, ``1.5T``), from 0 to
  2**63 - 1 bytes (``0`` is a cap of zero bytes, not "no cap"). Negative, ``nan``, ``inf`` and
  overflowing values (``1e400``) are errors;
* ``CUFORGE_LOCK_TIMEOUT``: seconds, ``0`` or more; ``inf`` waits forever (in practice
  ``threading.TIMEOUT_MAX``, about 292 years). Negative, ``nan`` and overflowing values
  (``1e400``) are errors;
* the remote timeouts and TTLs (``CUFORGE_REMOTE_CONNECT_TIMEOUT``,
  ``CUFORGE_REMOTE_TIMEOUT``, ``CUFORGE_REMOTE_TTL``, ``CUFORGE_LEASE_TTL``): finite
  seconds, ``0`` or more; ``inf``, ``1e400``, negative and ``nan`` are errors (a remote
  never costs more than its timeout);
* ``CUFORGE_FAST_LAUNCH``: ``c`` or ``python``; anything else is an error.
* ``CUFORGE_FENCE``: ``off``, ``warn`` or ``error`` (any case); anything else is an error.
* ``CUFORGE_REMOTE_NATIVE``: ``refuse`` or ``allow`` (any case); anything else is an error.

* ``CUFORGE_ENABLE``: parsed here into lower-case names (``all`` included); the names are
  checked by :mod:`cuforge.adapters.switch` (the registry lives there, in layer 5), which
  prints one line naming the variable and the valid names for an unknown one.
"""

from __future__ import annotations

import _thread
import os
import sys

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: see docs/architecture.md, the warm path
if TYPE_CHECKING:  # pragma: no cover
    from cuforge.base.errors import ConfigError

__all__ = [
    "ConfigError",
    "CODEGEN_ENV_VARS",
    "Settings",
    "settings",
    "codegen_environment",
    "result_environment",
    "memo_environment",
    "SETTING_VARS",
    "parse_size",
    "raw_env_get",
    "raw_env_key",
]

DEFAULT_CACHE_MAX_BYTES = 5 * 1024**3
DEFAULT_MEMORY_MAX_BYTES = 256 * 1024**2
DEFAULT_LOCK_TIMEOUT = 600.0
#: seconds a fleet build lease lives unless its holder renews it (a dead holder's expires)
DEFAULT_LEASE_TTL = 30.0
DEFAULT_REMOTE_CONNECT_TIMEOUT = 0.1
DEFAULT_REMOTE_TIMEOUT = 1.0
#: the largest remote value (envelope) read or written: above the largest real entries
DEFAULT_REMOTE_MAX_BYTES = 128 * 1024**2

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
    "CUFORGE_FAST_LAUNCH",
    "CUFORGE_TORCH_LAUNCHER",
    "CUFORGE_TORCH_SPLIT",
    "CUFORGE_TORCH_OP_SHIM",
    "CUFORGE_DEBUG",
    "CUFORGE_PROGRESS",
    "CI",
    "CUFORGE_BASE_DIR",
    "CUFORGE_REMOTE",
    "CUFORGE_REMOTE_BACKEND",
    "CUFORGE_REMOTE_KEY",
    "CUFORGE_REMOTE_KEY_FILE",
    "CUFORGE_SIGNING_KEY",
    "CUFORGE_TRUSTED_KEYS",
    "CUFORGE_REMOTE_READONLY",
    "CUFORGE_REMOTE_NATIVE",
    "CUFORGE_REMOTE_CONNECT_TIMEOUT",
    "CUFORGE_REMOTE_TIMEOUT",
    "CUFORGE_REMOTE_TTL",
    "CUFORGE_REMOTE_MAX_BYTES",
    "CUFORGE_LEASE_TTL",
    "CUFORGE_OFFLINE",
    "CUFORGE_FENCE",
    "CUFORGE_RECORD",
    "CUFORGE_ENABLE",
    "TORCH_CUDA_ARCH_LIST",
    "XDG_CACHE_HOME",
    "HOME",
)
_WATCHED = _SETTING_VARS + CODEGEN_ENV_VARS
#: Every environment variable cuforge reads (the tests clear the ``CUFORGE_*`` ones).
SETTING_VARS: tuple[str, ...] = _WATCHED
#: The variables that can change what an identical compile() call returns.
_RESULT_VARS = ("CUFORGE_DISABLE_CACHE", "CUFORGE_ARCH", "TORCH_CUDA_ARCH_LIST") + CODEGEN_ENV_VARS
#: Those, plus what picks the default cache: the call memo of the default caches keys on them.
_MEMO_VARS = _RESULT_VARS + ("CUFORGE_CACHE_DIR", "CUFORGE_DISABLE_FILE_CACHE")

# os.environ keeps its real data in a plain dict; reading it directly is what makes the
# change check cheap enough for the hot path. Fall back to the public mapping elsewhere.
_environ_data = getattr(os.environ, "_data", None)
if os.name == "posix" and isinstance(_environ_data, dict):
    raw_env_get = _environ_data.get

    def raw_env_key(name: str) -> object:
        """The key :func:`raw_env_get` takes for the variable ``name``."""
        return os.fsencode(name)

else:  # pragma: no cover - non-posix
    raw_env_get = os.environ.get

    def raw_env_key(name: str) -> object:
        return name


#: ``raw_env_get(raw_env_key(name))``: the variable's raw value (bytes on POSIX) or None,
#: in well under a microsecond. For change detection only; read values through Settings.
_WATCHED_KEYS: tuple = tuple(map(raw_env_key, _WATCHED))
_RESULT_KEYS: tuple = tuple(map(raw_env_key, _RESULT_VARS))
_MEMO_KEYS: tuple = tuple(map(raw_env_key, _MEMO_VARS))
_env_get = raw_env_get


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
        "fast_launch",
        "torch_launcher",
        "torch_split",
        "torch_op_shim",
        "debug",
        "progress",
        "base_dir",
        "remote",
        "remote_backend",
        "remote_key",
        "remote_key_file",
        "signing_key",
        "trusted_keys",
        "remote_readonly",
        "remote_native",
        "remote_connect_timeout",
        "remote_timeout",
        "remote_ttl",
        "remote_max_bytes",
        "lease_ttl",
        "offline",
        "fence",
        "record",
        "enable",
    )

    def __init__(self, env: dict[str, str]) -> None:
        get = env.get
        self.cache_dir: str = os.path.abspath(
            os.path.expanduser(get("CUFORGE_CACHE_DIR") or _default_cache_dir())
        )
        self.disable_cache: bool = _switch(get, "CUFORGE_DISABLE_CACHE", False)
        self.disable_file_cache: bool = _switch(get, "CUFORGE_DISABLE_FILE_CACHE", False)
        self.cache_max_bytes: int = _size(get, "CUFORGE_CACHE_MAX_BYTES", DEFAULT_CACHE_MAX_BYTES)
        self.memory_max_bytes: int = _size(
            get, "CUFORGE_MEMORY_MAX_BYTES", DEFAULT_MEMORY_MAX_BYTES
        )
        self.verbose: bool = _switch(get, "CUFORGE_VERBOSE", False)
        self.explain: bool = _switch(get, "CUFORGE_EXPLAIN", False)
        self.arch: str | None = get("CUFORGE_ARCH") or None
        self.torch_arch_list: str | None = get("TORCH_CUDA_ARCH_LIST") or None
        #: seconds; ``inf`` is stored as ``_thread.TIMEOUT_MAX`` (locks accept no larger)
        self.lock_timeout: float = _seconds(
            get, "CUFORGE_LOCK_TIMEOUT", DEFAULT_LOCK_TIMEOUT, forever=True
        )
        self.telemetry: bool = _switch(get, "CUFORGE_TELEMETRY", True)
        self.extra_options: tuple[str, ...] = tuple((get("CUFORGE_EXTRA_OPTIONS") or "").split())
        self.nvcc: str | None = get("CUFORGE_NVCC") or None
        #: (name, value) for every allow-listed codegen variable, set or not.
        self.codegen_env: tuple[tuple[str, str], ...] = tuple(
            (k, get(k) or "") for k in CODEGEN_ENV_VARS
        )
        #: "python": never build or use the C launch helper; "" (unset or ``c``) otherwise.
        fast = _choice(get, "CUFORGE_FAST_LAUNCH", ("c", "python"), "c")
        self.fast_launch: str = "" if fast == "c" else fast
        #: "ccache" / "sccache" / "auto" / a launcher program, or "" (none): the torch
        #: build's compiler launcher (a program name keeps its case).
        launcher = (get("CUFORGE_TORCH_LAUNCHER") or "").strip()
        if launcher.lower() in ("ccache", "sccache", "auto", "0", "off", "none", "no"):
            launcher = launcher.lower()
        self.torch_launcher: str = "" if launcher in ("0", "off", "none", "no") else launcher
        #: True / False forces nvcc's split host/device pipelines; None: decide per file.
        self.torch_split: bool | None = _switch(get, "CUFORGE_TORCH_SPLIT", None)
        #: False: custom ops never use their C++ CUDA kernel (cuforge.torch.opshim);
        #: "experimental" is the last release's spelling of 1
        self.torch_op_shim: bool = (
            _choice(get, "CUFORGE_TORCH_OP_SHIM", ("0", "1", "experimental"), "1") != "0"
        )
        self.debug: bool = _switch(get, "CUFORGE_DEBUG", False)
        #: show progress (a spinner for a compile over a second, torch build progress):
        #: True / False forced by CUFORGE_PROGRESS, else only on a terminal outside CI
        self.progress: bool | None = _switch(get, "CUFORGE_PROGRESS", None)
        if self.progress is None and (get("CI") or "").strip().lower() in _TRUE:
            self.progress = False
        #: paths under this dir enter cache keys relative to it ("": the working directory
        #: of each call), so two checkouts of a project at different paths share entries
        base = (get("CUFORGE_BASE_DIR") or "").strip()
        self.base_dir: str = os.path.abspath(os.path.expanduser(base)) if base else ""
        #: remote cache tiers, tried in order: redis://, rediss://, http(s)://, file://
        self.remote: tuple[str, ...] = tuple(
            u.strip() for u in (get("CUFORGE_REMOTE") or "").split(",") if u.strip()
        )
        #: "module:Class": a plug-in remote backend, used for the CUFORGE_REMOTE URLs whose
        #: scheme it lists in its ``schemes``
        self.remote_backend: str = (get("CUFORGE_REMOTE_BACKEND") or "").strip()
        #: the HMAC-SHA256 signing key (entries are signed when written and refused unsigned
        #: or badly signed when read); CUFORGE_REMOTE_KEY_FILE names a file holding it
        self.remote_key: str = get("CUFORGE_REMOTE_KEY") or ""
        if not self.remote_key.strip() and get("CUFORGE_REMOTE_KEY") is not None:
            raise _error(
                "CUFORGE_REMOTE_KEY is set but empty (a CI secret that did not expand?); "
                "an empty key would silently mean unsigned entries. Set it to the shared key, "
                "or unset it (unset CUFORGE_REMOTE_KEY) to use unsigned entries"
            )
        self.remote_key_file: str = (get("CUFORGE_REMOTE_KEY_FILE") or "").strip()
        #: a private key file: sign remote entries and bundles (Ed25519, cuforge.base.signing)
        self.signing_key: str = (get("CUFORGE_SIGNING_KEY") or "").strip()
        #: a keyring file: accept only entries and bundles signed by its keys
        self.trusted_keys: str = (get("CUFORGE_TRUSTED_KEYS") or "").strip()
        self.remote_readonly: bool = _switch(get, "CUFORGE_REMOTE_READONLY", False)
        #: True: native host code entries are served by remote tiers that check no
        #: signature (``CUFORGE_REMOTE_NATIVE=allow``); False (default): refused, a miss
        self.remote_native: bool = (
            _choice(get, "CUFORGE_REMOTE_NATIVE", ("refuse", "allow"), "refuse") == "allow"
        )
        self.remote_connect_timeout: float = _seconds(
            get, "CUFORGE_REMOTE_CONNECT_TIMEOUT", DEFAULT_REMOTE_CONNECT_TIMEOUT
        )
        self.remote_timeout: float = _seconds(get, "CUFORGE_REMOTE_TIMEOUT", DEFAULT_REMOTE_TIMEOUT)
        #: seconds an entry lives in a remote that supports expiry (0: no expiry)
        self.remote_ttl: float = _seconds(get, "CUFORGE_REMOTE_TTL", 0.0)
        #: seconds a fleet build lease lives without renewal (its holder renews it)
        self.lease_ttl: float = _seconds(get, "CUFORGE_LEASE_TTL", DEFAULT_LEASE_TTL)
        #: the largest remote value read or written (bytes); larger ones are refused unread
        self.remote_max_bytes: int = _size(
            get, "CUFORGE_REMOTE_MAX_BYTES", DEFAULT_REMOTE_MAX_BYTES
        )
        #: strict production mode: any kernel miss raises instead of compiling
        self.offline: bool = _switch(get, "CUFORGE_OFFLINE", False)
        #: the compile fence: "warn" / "error", or "" (off)
        fence = _choice(get, "CUFORGE_FENCE", ("off", "warn", "error"), "off")
        self.fence: str = "" if fence == "off" else fence
        #: the lockfile a recording of this process writes at exit ("": no recording)
        self.record: str = (get("CUFORGE_RECORD") or "").strip()
        #: the systems every process enables at start (cuforge.adapters.switch checks the
        #: names): ``("all",)``, a few names, or () when unset
        self.enable: tuple[str, ...] = tuple(
            n.strip().lower() for n in (get("CUFORGE_ENABLE") or "").split(",") if n.strip()
        )

    def remote_shape(self) -> tuple:
        """The settings that decide which remote tiers exist and how they behave: two
        snapshots with equal shapes open the same remotes."""
        return (
            self.remote,
            self.remote_backend,
            self.remote_key,
            self.remote_key_file,
            self.signing_key,
            self.trusted_keys,
            self.remote_readonly,
            self.remote_connect_timeout,
            self.remote_timeout,
            self.remote_ttl,
            self.remote_max_bytes,
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


def memo_environment() -> tuple:
    """:func:`result_environment` plus the raw values that pick the default cache
    (``CUFORGE_CACHE_DIR``, ``CUFORGE_DISABLE_FILE_CACHE``): the call memo's environment."""
    return tuple(map(_env_get, _MEMO_KEYS))


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


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _switch(get, name: str, default):
    """A yes/no variable: ``1``/``true``/``yes``/``on`` or ``0``/``false``/``no``/``off``;
    unset or empty gives ``default``; anything else is a :class:`ConfigError`."""
    value = get(name)
    text = (value or "").strip().lower()
    if not text:
        return default
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise _error(
        f"{name}={value!r} is not a switch: use 1 (or true/yes/on) to turn it on, "
        f"0 (or false/no/off) to turn it off, or unset it"
    )


def _choice(get, name: str, accepted: tuple[str, ...], default: str) -> str:
    """One of ``accepted`` (any case); unset or empty gives ``default``."""
    value = get(name)
    text = (value or "").strip().lower()
    if not text:
        return default
    if text not in accepted:
        raise _error(
            f"{name}={value!r} is not one of {', '.join(accepted)} (default {default}); "
            f"set one of those or unset it"
        )
    return text


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


#: The largest size accepted (bytes): what a signed 64-bit file offset holds.
MAX_SIZE = 2**63 - 1


def parse_size(text: str) -> int:
    """``"5GiB"``, ``"512m"``, ``"1.5G"``, ``"1000000"`` -> bytes, from 0 to
    :data:`MAX_SIZE`. Raises :class:`ConfigError` (a ``ValueError``) saying what is
    accepted: for an unreadable text, a negative, ``nan`` or ``inf`` number, or an
    overflowing one (``1e400``)."""
    raw = text.strip().lower().replace(" ", "")
    number = raw.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = raw[len(number) :]
    if not number or unit not in _SIZE_UNITS:
        raise _error(f"cannot read size {text!r}: use bytes or a unit such as 512M, 5G, 5GiB")
    try:
        # whole numbers stay exact (a float would round 2**63 - 1 up past the range)
        value = (
            int(number) * _SIZE_UNITS[unit]
            if number.isdigit()
            else float(number) * _SIZE_UNITS[unit]
        )
    except ValueError:
        raise _error(
            f"cannot read size {text!r}: use bytes or a unit such as 512M, 5G, 5GiB"
        ) from None
    if value != value or not 0 <= value <= MAX_SIZE:  # nan, negative, inf, overflow
        raise _error(f"size {text!r} is out of range: use 0 to {MAX_SIZE} bytes (e.g. 512M, 5GiB)")
    return int(value)


def _size(get, name: str, default: int) -> int:
    value = get(name)
    if not value:
        return default
    try:
        return parse_size(value)
    except ValueError as exc:
        raise _error(f"{name}={value!r}: {exc}") from None


#: how ``inf`` may be spelled where it means "wait forever" (``float`` reads these)
_FOREVER = ("inf", "+inf", "infinity", "+infinity")


def _seconds(get, name: str, default: float, *, forever: bool = False) -> float:
    """Seconds, 0 or more and finite. With ``forever`` (``CUFORGE_LOCK_TIMEOUT``), ``inf``
    spelled out means no limit (stored as ``_thread.TIMEOUT_MAX``); a number too large for
    a float (``1e400``) is an error everywhere, not "forever"."""
    value = get(name)
    if not value:
        return default
    accepts = (
        "use 0 or more (e.g. 600), or inf to wait forever"
        if forever
        else "use a finite number, 0 or more (e.g. 1)"
    )
    try:
        seconds = float(value)
    except ValueError:
        raise _error(f"{name}={value!r} is not a number of seconds: {accepts}") from None
    if seconds != seconds or seconds < 0:  # nan, negative
        raise _error(f"{name}={value!r} is out of range: {accepts} seconds")
    if seconds == float("inf"):
        if not (forever and value.strip().lower() in _FOREVER):
            raise _error(
                f"{name}={value!r} is not a finite number of seconds (read as infinite, "
                f"it would never time out): {accepts}"
            )
    return min(seconds, _thread.TIMEOUT_MAX)


def _error(message: str) -> ConfigError:
    """A :class:`~cuforge.base.errors.ConfigError` saying ``message``. The errors module is
    imported with the first one: a process whose settings are sound (every cache hit) never
    loads it."""
    from cuforge.base.errors import ConfigError

    return ConfigError(message)


def __getattr__(name: str):
    # ConfigError, a name of this module's API, loads on first use (see _error)
    if name == "ConfigError":
        from cuforge.base.errors import ConfigError

        return ConfigError
    raise AttributeError(f"module 'cuforge.base.config' has no attribute {name!r}")
