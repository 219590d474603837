"""cuforge as Triton's cache: one ``triton`` entry per compiled kernel, in every tier.

Set-up, one line: ``cuforge.triton.enable()`` in code, or for every process of a shell
(Inductor's compile workers included) ``export TRITON_CACHE_MANAGER=cuforge.triton:CacheManager``
(``cuforge env`` prints it).

What happens (see docs/triton.md):

* Triton's ``compile()`` asks its cache manager for the kernel's *group* (metadata JSON,
  cubin, PTX, IRs) under Triton's key (a hash of the Triton build, the kernel's source,
  the target, the options and the cache-invalidating env knobs), the build identified by
  :func:`build_key` (pip's ``RECORD`` of the installed Triton) instead of Triton's
  ``triton_key()``, which re-hashes Triton's installed files in every process. :class:`CacheManager`
  keeps that group as **one** entry of kind ``triton`` in a :class:`cuforge.Cache`: the
  payload is the group's files packed by :func:`cuforge.core.blobcache.pack` (nothing is ever
  unpickled), checksummed, counted against the LRU cap and shared through the remote tiers
  (signed when signing is on, refused unsigned when it is required).
* A lookup asks memory, then disk, then the remotes (the cache's chain): a local hit makes
  no network round trip; a miss asks each remote once.
* Triton needs file paths: a hit is materialized into ``<cache dir>/triton/<key>/`` (a temp
  dir renamed into place: no half-written group is ever handed out) and checked byte for
  byte against the entry before its paths are returned; a wrong or partial copy is replaced.
* A miss takes cuforge's single-flight lock of the key (threads and processes sharing the
  cache dir: one compile, the other ranks wait and then hit), lets Triton compile, and
  stores the group when Triton calls ``put_group``; the miss is explained by labeled fields
  (``cuforge cache explain triton:<kernel>``).
* A corrupt or truncated entry is deleted and the kernel recompiled; never served.
* The native Python modules Triton builds with the C compiler and caches through the same
  manager (its ``cuda_utils`` helper; on Triton <= 3.6 also one ``__triton_launcher`` per
  kernel signature) are entries of kind ``triton`` too, keyed by Triton's key of the C
  source and by the C compiler's, Python's and the platform's identity
  (:func:`native_fields`; on Triton 3.7+ the install's dirs enter Triton's key path-free,
  :func:`path_free_config`): a fresh machine's first launch runs no C compiler. They are
  native code loaded into the process: served only as checksummed entries that say they
  are native (``meta.native_module``), and from a remote tier only when it checks
  signatures (or ``CUFORGE_REMOTE_NATIVE=allow``): from an unsigned remote they are a miss,
  built here (:func:`cuforge.store.schema.is_native`).
* Autotune results (``@triton.autotune(..., cache_results=True)``,
  ``knobs.autotuning.cache``): the ``<kernel>.autotune.json`` file Triton's autotuner puts
  through this manager outside a group is an entry of kind ``triton`` too, keyed by
  Triton's key of it (the build, the target, the kernel, the cache-invalidating env, the
  key arguments' values and dtypes, the configs) plus the GPU model (:func:`gpu_model`):
  a second machine with the same GPU model skips the benchmark sweep; another model
  misses. Clocks, power limits and co-tenants also change timings; they are not keyed.

Supported: the window in :mod:`cuforge.adapters.windows` (Triton 3.6 to 3.9: ``make
test-compat`` runs 3.6.0 and 3.9.0 on the CPU; 3.6.0 runs on an H200). Outside it, the
contract probe decides: :func:`enable` enables when the probe passes and otherwise warns
once and leaves Triton's own cache in place; the ``TRITON_CACHE_MANAGER`` route falls back
to Triton's file cache with the same warning.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import uuid
from typing import TYPE_CHECKING

import triton
from triton.runtime.cache import CacheManager as _TritonCacheManager
from triton.runtime.cache import FileCacheManager as _FileCacheManager

from cuforge.adapters.common import refused, window_verdict
from cuforge.adapters.windows import window
from cuforge.base import _fs
from cuforge.core.blobcache import make_key, offline_error, pack, unpack
from cuforge.core.caching import Cache, Hit, default_cache
from cuforge.store.base import Entry
from cuforge.store.schema import is_native
from cuforge.toolchain import installed

if TYPE_CHECKING:  # pragma: no cover
    from typing import Any

__all__ = [
    "CacheManager",
    "enable",
    "disable",
    "enabled",
    "supported",
    "hook_problem",
    "SUPPORTED",
    "ENV_LINE",
    "prune_materialized",
    "key_of",
    "native_fields",
    "path_free_config",
    "build_key",
    "build_key_source",
    "cache_key",
    "gpu_model",
]

#: the Triton versions whose cache-manager protocol this module was written against
#: (``(low, high)``: low <= version < high)
SUPPORTED = window("triton")  # the tested releases: cuforge/adapters/windows.py
#: the shell line that makes every process use this cache (``cuforge env`` prints it)
ENV_LINE = "TRITON_CACHE_MANAGER=cuforge.triton:CacheManager"
#: the files a launch needs (``binary_only=True`` stores just these)
_BINARY_EXTS = ("json", "cubin", "hsaco", "spv", "zebin")
#: materialized groups whose entry is gone are removed once older than this (seconds)
PRUNE_AFTER = 3600.0

_log = logging.getLogger("cuforge")
_state: dict[str, Any] = {"cache": None, "binary_only": False, "warned": False}
#: Triton's cache key (as the manager receives it) -> labeled fields, for explain
_recent_fields: dict[str, dict[str, str]] = {}
_original_get_cache_key: list = []
#: the file name suffix of the native Python modules Triton builds (``cuda_utils``, launchers)
_EXT_SUFFIX = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
_native_identity: dict[str, str] = {}


def _version() -> tuple[int, ...]:
    parts = []
    for piece in triton.__version__.split(".")[:2]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def hook_problem() -> str | None:
    """Why cuforge cannot be Triton's cache manager here (None when it can): Triton has no
    ``knobs.cache.manager_class``, or it is outside :data:`SUPPORTED` and its contract
    probe fails (:func:`cuforge.adapters.common.window_verdict`)."""
    if _state.get("probing"):
        return None  # the probe's own managers (below)
    knobs = getattr(triton, "knobs", None)
    if not hasattr(getattr(knobs, "cache", None), "manager_class"):
        return refused("triton", f"Triton {triton.__version__} has no knobs.cache.manager_class")
    return window_verdict("triton", "Triton", triton.__version__, SUPPORTED, _probe)


def supported() -> bool:
    """Whether cuforge can be the installed Triton's cache manager (:func:`hook_problem`)."""
    return hook_problem() is None


def _probe() -> str | None:
    """The contract, on a Triton outside :data:`SUPPORTED`: Triton's ``CacheManager``
    protocol has its four methods, and a group put through Triton's own
    ``get_cache_manager`` (with :class:`CacheManager` as ``knobs.cache.manager_class``)
    comes back from a second manager, into a throwaway cache dir."""
    import tempfile

    from triton.runtime import cache as tcache

    for method in ("get_file", "put", "get_group", "put_group"):
        if not callable(getattr(tcache.CacheManager, method, None)):
            return f"triton.runtime.cache.CacheManager has no {method}()"
    getter = getattr(tcache, "get_cache_manager", None)
    if not callable(getter):
        return "triton.runtime.cache has no get_cache_manager(key)"
    knobs = triton.knobs
    saved = dict(_state), knobs.cache.manager_class
    with tempfile.TemporaryDirectory(prefix="cuforge-triton-probe-") as tmp:
        _state.update(cache=Cache(tmp, remotes=(), telemetry=False), probing=True)
        knobs.cache.manager_class = CacheManager
        try:
            import hashlib

            key = hashlib.sha256(b"cuforge contract probe").hexdigest()  # Triton base32s it
            first = getter(key)
            if not isinstance(first, CacheManager):
                return "get_cache_manager(key) does not make a knobs.cache.manager_class"
            if first.get_group("probe.json") is not None:
                return "an empty cache served a group"
            group = {
                "probe.json": first.put('{"name": "probe"}', "probe.json", binary=False),
                "probe.bin": first.put(b"\x7fELF-probe", "probe.bin"),
            }
            first.put_group("probe.json", group)
            again = getter(key).get_group("probe.json")
            if not again or set(again) != set(group):
                return "a group put with put_group was not served back by get_group"
            if _fs.read_bytes(again["probe.bin"]) != b"\x7fELF-probe":
                return "get_group served other bytes than put_group stored"
        finally:
            _state.clear()
            _state.update(saved[0])
            knobs.cache.manager_class = saved[1]
    return None


def _warn_unsupported() -> None:
    if not _state["warned"]:
        _state["warned"] = True
        _log.warning("cuforge: %s", hook_problem() or "cuforge.triton cannot plug in here")


def enable(cache: Cache | None = None, *, binary_only: bool = False) -> bool:
    """Make Triton cache its kernels in ``cache`` (default: :func:`cuforge.default_cache`,
    resolved at each compile). ``binary_only``: store only what a launch needs (the
    metadata JSON and the binary), not the IRs. Returns False (after one warning) on an
    unsupported Triton, which then keeps its own cache. Sets ``triton.knobs.cache.
    manager_class`` for this process; worker processes need ``TRITON_CACHE_MANAGER``."""
    if cache is not None and not isinstance(cache, Cache):
        raise TypeError(f"cache= must be a cuforge.Cache or None, not {type(cache).__name__}")
    if not supported():
        _warn_unsupported()
        return False
    _state["cache"] = cache
    _state["binary_only"] = bool(binary_only)
    _install_key_recorder()
    _install_native_key()
    triton.knobs.cache.manager_class = CacheManager
    return True


def disable() -> None:
    """Give Triton its own cache back (undo :func:`enable`)."""
    if supported() and triton.knobs.cache.manager_class is CacheManager:
        triton.knobs.cache.manager_class = None
    _state["cache"] = None
    _state["binary_only"] = False


def enabled() -> bool:
    """Whether Triton's cache manager is this module's."""
    return supported() and triton.knobs.cache.manager_class is CacheManager


def _cache() -> Cache:
    cache = _state["cache"]
    return cache if cache is not None else default_cache()


# ---------------------------------------------------------------------- explain fields
def _base32(hexdigest: str) -> str:
    return base64.b32encode(bytes.fromhex(hexdigest)).decode("ascii").rstrip("=")


def _active() -> bool:
    """Whether Triton's cache manager is this module's (what the key wrappers dispatch on)."""
    try:
        return triton.knobs.cache.manager_class is CacheManager
    except Exception:  # noqa: BLE001 - a bad TRITON_CACHE_MANAGER: Triton's own key
        return False


def cache_key(src: Any, backend: Any, backend_options: Any, env_vars: Any) -> str:
    """Triton's ``get_cache_key`` with :func:`build_key` in place of ``triton_key()``:
    the same fields in the same format (``triton/runtime/cache.py``, 3.4 to 3.8), the
    build identified without re-hashing Triton's installed files."""
    return (
        f"{build_key()}-{src.hash()}-{backend.hash()}-{backend_options.hash()}-"
        f"{str(sorted(env_vars.items()))}"
    )


def _install_key_recorder() -> None:
    """Wrap Triton's ``get_cache_key`` (every module that bound it: the compiler, the JIT's
    async path, ``triton.runtime.cache``) and the autotuner's ``triton_key``: while this
    cache manager is Triton's, the key is :func:`cache_key` (the build by
    :func:`build_key`), and a miss can be explained by labeled fields; otherwise Triton's
    own functions run unchanged. Installed when this module is imported, so that a process
    that reaches it through ``TRITON_CACHE_MANAGER`` keys its kernels the same way."""
    if _original_get_cache_key or not supported():
        return
    from triton.runtime import cache as _tcache

    original = getattr(_tcache, "get_cache_key", None)
    if original is None:
        return
    _original_get_cache_key.append(original)

    def get_cache_key(src, backend, backend_options, env_vars):
        if not _active():
            return original(src, backend, backend_options, env_vars)
        key = cache_key(src, backend, backend_options, env_vars)
        try:
            fields = _labeled_fields(src, backend, backend_options, env_vars)
            digest = hashlib.sha256(key.encode("utf-8")).hexdigest()
            if len(_recent_fields) > 4096:
                _recent_fields.clear()
            _recent_fields[_base32(digest)] = fields
        except Exception:  # noqa: BLE001 - explain fields are best effort; the key stands
            pass
        return key

    get_cache_key.__wrapped__ = original  # type: ignore[attr-defined]
    for name in (
        "triton.runtime.cache",
        "triton.compiler.compiler",
        "triton.compiler",
        "triton.runtime.jit",
    ):
        module = sys.modules.get(name)
        if module is not None and getattr(module, "get_cache_key", None) is original:
            module.get_cache_key = get_cache_key
    autotuner = sys.modules.get("triton.runtime.autotuner")
    tuner_key = getattr(autotuner, "triton_key", None)
    if tuner_key is not None and not getattr(tuner_key, "_cuforge", False):

        def triton_key():
            return build_key() if _active() else tuner_key()

        triton_key.__wrapped__ = tuner_key  # type: ignore[attr-defined]
        triton_key._cuforge = True  # type: ignore[attr-defined]
        autotuner.triton_key = triton_key


def _rekey_from_compile(key: str) -> str:
    """The key :func:`cache_key` gives the kernel whose manager Triton's ``compile`` is
    making with ``key``, when ``key`` is Triton's own (a process that reached this module
    through ``TRITON_CACHE_MANAGER`` imports it only now, after ``compile`` keyed its first
    kernel, e.g. an Inductor compile worker), so that every process stores and finds that
    kernel under the same key. Read from ``compile``'s frame, and used only when that
    frame's hash is ``key``; anything else (a native module, the autotuner, another
    caller) keeps ``key``."""
    frame = sys._getframe(1)
    for _ in range(6):
        frame = frame.f_back
        if frame is None:
            return key
        code = frame.f_code
        if code.co_name == "compile" and frame.f_globals.get("__name__") == (
            "triton.compiler.compiler"
        ):
            break
    else:
        return key
    local = frame.f_locals
    try:
        if _base32(local["hash"]) != key or not _active():
            return key
        src, backend, options, env = (
            local["src"],
            local["backend"],
            local["options"],
            local["env_vars"],
        )
        ours = cache_key(src, backend, options, env)
        if triton.knobs.runtime.add_stages_inspection_hook is not None:
            ours += local["inspect_stages_key"]
        digest = _base32(hashlib.sha256(ours.encode("utf-8")).hexdigest())
        _recent_fields[digest] = _labeled_fields(src, backend, options, env)
    except Exception:  # noqa: BLE001 - not the frame we know: Triton's key stands
        return key
    return digest


# ---------------------------------------------------------------------- Triton's build key
#: {"key": build key, "source": "record" or why Triton's triton_key() was used}
_build_key_memo: dict[str, str] = {}


def build_key() -> str:
    """The identity of the installed Triton build that cuforge puts where Triton's
    ``get_cache_key`` puts ``triton_key()`` (computed once per process).

    Triton's ``triton_key()`` reads and hashes its own files in every process (its
    ``runtime/cache.py``, every module under ``compiler/``, ``backends/`` and
    ``language/``, and ``_C/libtriton.so``, about 0.4 s). pip wrote a sha256 and the size
    of each of those files into the distribution's ``RECORD`` at install: when ``RECORD``
    lists every one of them with a hash and each size matches the file's, the key is
    ``<version>-record-<sha256 of the version and those RECORD lines>`` (relative paths:
    no path of the install enters it), where a file whose contents no longer hash to its
    RECORD digest (a same-size edit) is keyed by its contents instead. Each file is
    hashed once per version of it (:func:`cuforge.toolchain.installed.file_sha256s`,
    remembered under its size, mtime, ctime and inode): a fresh process stats the files
    and hashes nothing (0.3 ms); the first process on a cache dir hashes them once, the
    ~500 MB ``triton_key()`` hashes too (the covered set is exactly Triton's,
    :func:`_covered_files`). Otherwise (no dist-info or ``RECORD``, an editable or dev
    install, a file ``RECORD`` does not list, a size that differs) it is Triton's own
    ``triton_key()``; :func:`build_key_source` says which and why."""
    key = _build_key_memo.get("key")
    if key is None:
        key, source = _record_build_key()
        if key is None:
            from triton.runtime import cache as _tcache

            key = _tcache.triton_key()
        _build_key_memo.update(key=key, source=source)
    return key


def build_key_source() -> str:
    """``"record"`` when :func:`build_key` comes from pip's ``RECORD``, else the reason it is
    Triton's own ``triton_key()``."""
    build_key()
    return _build_key_memo["source"]


def _triton_root() -> str:
    """The installed ``triton`` package dir, as Triton's ``triton_key`` finds it."""
    from triton.runtime import cache as _tcache

    return os.path.dirname(os.path.dirname(os.path.abspath(_tcache.__file__)))


def _triton_dist_info(site: str) -> str | None:
    """The ``triton-<version>.dist-info`` dir of the installed Triton in ``site``."""
    path = os.path.join(site, f"triton-{triton.__version__}.dist-info")
    if os.path.isdir(path):
        return path
    found = [
        n
        for n in installed.dist_infos(site)
        if installed.split_info_name(n.lower()) == ("triton", triton.__version__.lower())
    ]
    return os.path.join(site, found[0]) if len(found) == 1 else None


def _covered_files(root: str) -> list[str] | str:
    """The files Triton's ``triton_key()`` hashes, exactly, as RECORD names them (``triton/``
    relative paths); a string says why not.

    ``triton_key()`` (``triton/runtime/cache.py``, the same from 3.4 to 3.9) hashes its own
    file, ``_C/libtriton.<ext>`` and the origin of every module ``pkgutil.walk_packages``
    finds under ``compiler/``, ``backends/`` and ``language/`` (not those dirs' own
    ``__init__``). Read here from the file system, as :mod:`pkgutil` and the import
    system's ``FileFinder`` read it (:func:`_walked_origins`), importing nothing: a
    directory without ``__init__`` (``backends/*/lib``, ``include``, ``bin``) is not a
    package, so its files (the AMD codegen library, CUPTI, headers, ``ptxas``) are not
    hashed by Triton, nor here. The one difference: Triton imports each package before it
    walks it and skips one whose import raises ImportError; here its modules are covered."""
    ext = (sysconfig.get_config_var("EXT_SUFFIX") or ".so").split(".")[-1]
    files = ["triton/runtime/cache.py"]
    for sub in ("compiler", "backends", "language"):  # in triton_key()'s order
        if sub == "language":
            files.append(f"triton/_C/libtriton.{ext}")
        top = os.path.join(root, sub)
        if not os.path.isdir(top):
            return f"{top} is not a directory"
        for origin in _walked_origins(top):
            if origin is None:
                return f"a namespace package under {top} has no file (Triton cannot hash it)"
            rel = os.path.relpath(origin, root).replace(os.sep, "/")
            files.append(f"triton/{rel}")
    return files


def _walked_origins(directory: str) -> list[str | None]:
    """The origins (file paths) of the modules ``pkgutil.walk_packages([directory])`` yields,
    in its order, packages walked into (their ``__init__`` is their origin); None for a
    name whose spec has no origin (a namespace package). Mirrors
    ``pkgutil._iter_file_finder_modules`` (sorted names, ``inspect.getmodulename``: the
    longest matching suffix of ``importlib.machinery.all_suffixes()``; a directory is a
    package when it holds an ``__init__`` module; a name with a dot is skipped) and
    ``FileFinder.find_spec`` (a package's ``__init__`` first, then the module file, in the
    loaders' order: extension modules, source, bytecode)."""
    import importlib.machinery as machinery

    suffixes = sorted(machinery.all_suffixes(), key=len, reverse=True)
    loader_order = [
        *machinery.EXTENSION_SUFFIXES,
        *machinery.SOURCE_SUFFIXES,
        *machinery.BYTECODE_SUFFIXES,
    ]

    def modulename(name: str) -> str | None:
        for suffix in suffixes:
            if name.endswith(suffix):
                return name[: -len(suffix)]
        return None

    def origin(where: str, name: str) -> tuple[str | None, bool]:
        # (FileFinder's origin of `name` in `where`, whether it is a package dir)
        base = os.path.join(where, name)
        namespace = False
        if os.path.isdir(base):
            for suffix in loader_order:
                init = os.path.join(base, "__init__" + suffix)
                if os.path.isfile(init):
                    return init, True
            namespace = True
        for suffix in loader_order:
            path = base + suffix
            if os.path.isfile(path):
                return path, False
        return None, namespace

    out: list[str | None] = []
    seen: set[str] = set()

    def walk(where: str) -> None:
        if where in seen:  # walk_packages' `seen`: each path once
            return
        seen.add(where)
        try:
            names = sorted(os.listdir(where))
        except OSError:
            return
        yielded: set[str] = set()
        for fn in names:
            mod = modulename(fn)
            if mod == "__init__" or (mod is not None and mod in yielded):
                continue
            path = os.path.join(where, fn)
            ispkg = False
            if not mod and os.path.isdir(path) and "." not in fn:
                try:
                    inside = os.listdir(path)
                except OSError:
                    inside = []
                if not any(modulename(n) == "__init__" for n in inside):
                    continue  # not a package
                mod, ispkg = fn, True
            if not mod or "." in mod:
                continue
            yielded.add(mod)
            found, is_dir = origin(where, mod)
            out.append(found)
            if ispkg and is_dir:
                walk(os.path.join(where, mod))

    walk(directory)
    return out


def _record_build_key(dist_info: str | None = None) -> tuple[str | None, str]:
    """(:func:`build_key` from ``RECORD``, "record"), or (None, why not). ``dist_info``:
    the dist-info dir to read (default: the installed Triton's)."""
    root = _triton_root()
    if os.path.basename(root) != "triton":
        return None, f"Triton's package dir {root} is not named triton"
    site = os.path.dirname(root)
    dist = dist_info if dist_info is not None else _triton_dist_info(site)
    if dist is None:
        return None, f"no triton-{triton.__version__}.dist-info next to the triton package"
    if not os.path.isfile(os.path.join(dist, "RECORD")):
        return None, f"the RECORD of {os.path.basename(dist)} cannot be read (no such file)"
    wanted = _covered_files(root)
    if isinstance(wanted, str):
        return None, wanted
    table = installed.record(dist)
    lines: dict[str, str] = {}
    for path in wanted:
        entry = table.get(path)
        if entry is None:
            return None, f"RECORD does not list {path}"
        digest, size = entry
        if not digest or not size.isdigit():
            return None, f"RECORD has no sha256 and size of {path}"
        try:
            actual = os.stat(os.path.join(site, path)).st_size
        except OSError as exc:
            return None, f"{path} cannot be read ({exc})"
        if actual != int(size):
            return None, f"{path} is {actual} bytes, RECORD says {size}"
        lines[path] = f"{path},sha256={digest},{size}"  # the RECORD line, as pip wrote it
    # a size can stay the same through an edit: each file's contents against RECORD
    hashes = installed.file_sha256s([os.path.join(site, path) for path in lines])
    for path in lines:
        content = hashes.get(os.path.join(site, path))
        if content is None:
            return None, f"{path} cannot be read"
        recorded = installed.recorded_digest(dist, path)
        if recorded is None or recorded[0] != content:  # edited since install: its contents
            lines[path] = f"{path},content-sha256={content},{table[path][1]}"
    body = "\n".join([triton.__version__, *sorted(lines.values())])
    digest = hashlib.sha256(body.encode("utf-8")).hexdigest()
    return f"{triton.__version__}-record-{digest}", "record"


def _install_native_key() -> None:
    """Triton >= 3.7 keys a native module by its C source *and* the include and library
    dirs it passes, absolute paths of the Triton install and of libcuda: the same module
    would miss from another venv or home dir. While this cache manager is Triton's, wrap
    ``triton.runtime.build._get_cache_manager`` to key those dirs path-free
    (:func:`path_free_config`); Triton <= 3.6 keys the source and platform only."""
    try:
        from triton.runtime import build
    except ImportError:
        return
    original = getattr(build, "_get_cache_manager", None)
    if original is None or getattr(original, "_cuforge_path_free", False):
        return

    def _get_cache_manager(src, config):
        if triton.knobs.cache.manager_class is CacheManager:
            config = path_free_config(config)
        return original(src, config=config)

    _get_cache_manager.__wrapped__ = original  # type: ignore[attr-defined]
    _get_cache_manager._cuforge_path_free = True  # type: ignore[attr-defined]
    build._get_cache_manager = _get_cache_manager


def path_free_config(config: dict) -> dict:
    """Triton's native-module build config with the dirs inside the Triton package written
    ``<triton>/<relative path>`` (their contents are Triton's: ``triton_version`` keys them)
    and libcuda's dirs ``<libcuda>`` (the module links ``libcuda.so.1`` by its soname); any
    other dir stays as it is."""
    import sys as _sys

    root = os.path.dirname(os.path.realpath(triton.__file__))
    libcuda: list[str] = []
    driver = _sys.modules.get("triton.backends.nvidia.driver")
    try:
        if driver is not None:
            libcuda = [os.path.realpath(d) for d in driver.libcuda_dirs()]
    except Exception:  # noqa: BLE001 - no libcuda found: nothing to rewrite
        libcuda = []

    def rewrite(path: str) -> str:
        real = os.path.realpath(path)
        if real == root or real.startswith(root + os.sep):
            return "<triton>/" + os.path.relpath(real, root).replace(os.sep, "/")
        if real in libcuda:
            return "<libcuda>"
        return path

    out = dict(config)
    for name in ("include_dirs", "library_dirs"):
        if out.get(name):
            out[name] = [rewrite(str(d)) for d in out[name]]
    return out


def _labeled_fields(src: Any, backend: Any, options: Any, env_vars: Any) -> dict[str, str]:
    target = backend.target
    fields = {
        "triton_version": triton.__version__,
        "triton_build": hashlib.sha256(build_key().encode("utf-8")).hexdigest()[:16],
        "target": f"{target.backend}:{target.arch}:{target.warp_size}",
        "backend": str(backend.hash()),
        "env": str(sorted(env_vars.items())),
    }
    fn = getattr(src, "fn", None)
    if fn is not None:
        fields["source"] = str(fn.cache_key)
        fields["signature"] = str(sorted(src.signature.items()))
        names = list(getattr(fn, "arg_names", ()))
        for path, value in sorted(src.constants.items(), key=str):
            index = path[0] if isinstance(path, tuple) and len(path) == 1 else None
            label = names[index] if isinstance(index, int) and index < len(names) else path
            fields[f"constexpr:{label}"] = str(value)
        fields["attrs"] = str(src.attrs)
    else:
        fields["source"] = str(src.hash())
    for name, value in sorted(vars(options).items()):
        if name != "extern_libs":  # paths: their contents are in options_hash
            fields[f"option:{name}"] = str(value)
    fields["options_hash"] = str(options.hash())
    return fields


def key_of(
    src: Any, target: Any, options: Any = None, env_vars: dict[str, str] | None = None
) -> tuple[str, dict[str, str]]:
    """(cuforge entry key, labeled key fields) of ``triton.compile(src, target=target,
    options=options)``, computed as a compile under this cache manager keys it and without
    compiling: :func:`cache_key` (Triton's key with the build identified by
    :func:`build_key`: the build, the source, the backend, the options, the
    cache-invalidating environment), hashed and named as Triton names its cache manager,
    under kind ``triton``. ``options``:
    a dict (parsed by the backend, as ``compile`` does) or the backend's parsed options
    object; ``env_vars``: default the cache-invalidating variables set in this process."""
    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.compiler import compiler as _compiler

    _install_key_recorder()
    backend = _compiler.make_backend(target)
    if options is None or isinstance(options, dict):
        options = backend.parse_options(dict(options or {}, **src.parse_options()))
    env = get_cache_invalidating_env_vars() if env_vars is None else env_vars
    digest = hashlib.sha256(cache_key(src, backend, options, env).encode("utf-8")).hexdigest()
    fields = _labeled_fields(src, backend, options, env)
    fields["triton_hash"] = _base32(digest)
    return make_key("triton", {"triton_hash": fields["triton_hash"]})[0], fields


# ---------------------------------------------------------------------- the manager
class CacheManager(_TritonCacheManager):
    """Triton's ``CacheManager`` protocol over a :class:`cuforge.Cache` (module doc).

    Triton makes one per compile with its key; ``override``/``dump`` managers (Triton's
    debugging dirs) and files outside a kernel group are Triton's own file cache."""

    def __init__(self, key: str, override: bool = False, dump: bool = False) -> None:
        self.key = key
        self._files: _FileCacheManager | None = None
        self._direct = bool(override or dump)
        self._override, self._dump = override, dump
        self._flight: Any = None
        self._building: dict[str, bytes] | None = None
        self._dir: str | None = None
        self._group: dict[str, str] = {}
        self._started = 0.0
        self._name = ""
        if self._direct:
            return
        if not supported():
            _warn_unsupported()
            self._direct = True
            return
        _install_key_recorder()
        self.cache = _cache()
        problem = None if self.cache.store is None else self.cache.trust_problem()
        if self.cache.store is None or problem is not None:
            if problem is not None:
                self.cache.warn_once(f"cuforge.triton: {problem}; Triton uses its own cache")
            self._direct = True
            return
        if key not in _recent_fields:
            self.key = key = _rekey_from_compile(key)
        self.ckey, _ = make_key("triton", {"triton_hash": key})

    # Triton's own file cache: debug dirs, other files outside a group
    def _file_cache(self) -> _FileCacheManager:
        if self._files is None:
            self._files = _FileCacheManager(self.key, override=self._override, dump=self._dump)
        return self._files

    def get_file(self, filename: str) -> str | None:
        path = self._group.get(filename)
        if path is not None:
            return path
        if not self._direct and _is_native(filename):
            path = self._single_lookup("native", filename)
            if path is not None:
                return path
        if not self._direct and filename.endswith(_AUTOTUNE_SUFFIX):
            return self._single_lookup("autotune", filename)
        return self._file_cache().get_file(filename)

    def put(self, data: Any, filename: str, binary: bool = True) -> str:
        if self._building is None:
            if not self._direct and _is_native(filename) and isinstance(data, bytes):
                path = self._single_store("native", filename, data)
                if path is not None:
                    return path
            if not self._direct and filename.endswith(_AUTOTUNE_SUFFIX):
                path = self._single_store("autotune", filename, data)
                if path is not None:
                    return path
            return self._file_cache().put(data, filename, binary)
        raw = data if isinstance(data, bytes) else str(data).encode("utf-8")
        _check_filename(filename)
        path = os.path.join(self._dir, filename)
        _fs.atomic_write(path, raw)
        self._building[filename] = raw
        self._group[filename] = path
        return path

    def get_group(self, filename: str) -> dict[str, str] | None:
        if self._direct:
            return self._file_cache().get_group(filename)
        self._name = filename[:-5] if filename.endswith(".json") else filename
        cache = self.cache
        got = cache.begin(
            self.ckey,
            what=f"triton {self._name}",
            lookup=lambda: self._lookup(filename),
            offline_error=lambda: offline_error(
                "triton", self._name, self.ckey, self._fields(), "is not in the cache"
            ),
        )
        if type(got) is Hit:
            return got.value
        # a miss: hold the flight while Triton compiles; put_group (or our end) closes it
        self._flight = got
        self._dir = cache.layout.triton_dir(self.ckey)
        problem = cache.layout.ensure(self._dir)
        if problem is not None:
            self._release()
            raise OSError(f"cuforge.triton: cannot materialize kernels: {problem}")
        self._building = {}
        self._started = time.perf_counter()
        return None

    def put_group(self, filename: str, group: dict[str, str]) -> str | None:
        if self._building is None:
            return self._file_cache().put_group(filename, group)
        try:
            seconds = time.perf_counter() - self._started
            files: dict[str, bytes] = {}
            for name in sorted(group):
                if _state["binary_only"] and name.rsplit(".", 1)[-1] not in _BINARY_EXTS:
                    continue
                data = self._building.get(name)
                if data is None:  # a file Triton wrote itself: read it back
                    data = _fs.read_bytes(group[name])
                files[name] = data
            if filename not in files:
                raise ValueError(f"Triton's group has no metadata file {filename!r}")
            fields = self._fields()
            meta = {
                "name": self._name,
                "backend": "triton",
                "arch": fields.get("target", ""),
                "compile_seconds": seconds,
                "key_fields": fields,
                "files": {f: len(d) for f, d in files.items()},
                "triton_version": triton.__version__,
                "triton_key": self.key,
            }
            entry = Entry(self.ckey, "triton", pack(files), meta)
            flight, self._flight = self._flight, None
            flight.commit(f"triton:{self._name}", fields, [entry])
            self.cache.count("triton:compiled")
            _maybe_prune(self.cache)
        finally:
            self._building = None
            self._release()
        return self._dir

    def _fields(self) -> dict[str, str]:
        fields = dict(_recent_fields.get(self.key) or {})
        fields["triton_hash"] = self.key
        return fields

    def _lookup(self, filename: str) -> dict[str, str] | None:
        cache = self.cache
        entry, tier = cache.get_with_tier(self.ckey, kind="triton")
        if entry is None:
            return None
        source = "remote" if tier and tier.startswith("remote") else tier or "disk"
        try:
            if entry.kind != "triton":
                raise ValueError(f"the entry is of kind {entry.kind!r}, not 'triton'")
            files = unpack(entry.payload)
            if filename not in files:
                raise ValueError(f"the group has no metadata file {filename!r}")
            for name in files:
                _check_filename(name)
            paths = _materialize(cache, self.ckey, files)
        except Exception as exc:  # noqa: BLE001 - stored bytes that do not load: recompile
            cache.count("triton:load_errors")
            _log.warning(
                "cuforge: the cached triton entry %r (key %s, from the %s tier) could not be "
                "loaded (%s: %s); it is deleted and the kernel recompiled",
                self._name,
                self.ckey[:12],
                source,
                type(exc).__name__,
                exc,
            )
            cache.delete(self.ckey)
            return None
        cache.count(f"triton:{source}")
        cache.verbose(f"cuforge: triton {self._name} {source} hit key {self.ckey[:12]}")
        self._group = paths
        return dict(paths)

    # one named file as a triton entry: the native modules Triton builds with the C compiler
    # (cuda_utils, __triton_launcher) and the autotuner's results (<kernel>.autotune.json)
    def _single_key(self, what: str, filename: str) -> tuple[str, dict[str, str]]:
        if what == "native":
            fields = native_fields()
            fields["triton_hash"] = self.key
            fields["module"] = filename
        else:
            fields = {"autotune_hash": self.key, "file": filename, "gpu": gpu_model()}
        return make_key("triton", fields)[0], fields

    def _single_lookup(self, what: str, filename: str) -> str | None:
        """The path of ``filename``, the one file of the ``what`` entry
        (:data:`_SINGLE_FILES`) keyed by it, materialized; None on a miss, or when the
        stored entry does not load (it is deleted: Triton builds or benchmarks again)."""
        cache = self.cache
        noun, redo, _label, _stored = _SINGLE_FILES[what]
        ckey, _ = self._single_key(what, filename)
        entry, tier = cache.get_with_tier(ckey, kind="triton")
        if entry is None:
            cache.count(f"triton:{what}_misses")
            return None
        source = "remote" if tier and tier.startswith("remote") else tier or "disk"
        try:
            if entry.kind != "triton":
                raise ValueError(f"the entry is of kind {entry.kind!r}, not 'triton'")
            if what == "native" and not is_native(entry.kind, entry.meta):
                # a tier that checks no signature refuses native code by this flag: an
                # entry at a native key without it is not what this module stored
                raise ValueError("the entry does not say it holds a native module")
            files = unpack(entry.payload)
            if list(files) != [filename]:
                raise ValueError(f"the entry holds {sorted(files)}, not just {filename!r}")
            path = _materialize(cache, ckey, files)[filename]
        except Exception as exc:  # noqa: BLE001 - stored bytes that do not load: redo
            cache.count("triton:load_errors")
            _log.warning(
                "cuforge: the cached %s %r (key %s, from the %s tier) could not be loaded "
                "(%s: %s); it is deleted and Triton %s",
                noun,
                filename,
                ckey[:12],
                source,
                type(exc).__name__,
                exc,
                redo,
            )
            cache.delete(ckey)
            return None
        cache.count(f"triton:{what}_{source}")
        cache.verbose(f"cuforge: triton {noun} {filename} {source} hit key {ckey[:12]}")
        return path

    def _single_store(self, what: str, filename: str, data: Any) -> str | None:
        """Store ``data`` as the one file ``filename`` of a ``what`` entry and return its
        materialized path; None when it cannot be stored (Triton's own cache keeps it)."""
        cache = self.cache
        noun, _redo, label, stored = _SINGLE_FILES[what]
        raw = data if isinstance(data, bytes) else str(data).encode("utf-8")
        ckey, fields = self._single_key(what, filename)
        if what == "native":
            name = filename[: -len(_EXT_SUFFIX)] if filename.endswith(_EXT_SUFFIX) else filename
            flags: dict[str, Any] = {"native_module": True}
            tail = {"triton_key": self.key}
        else:
            name, flags, tail = filename[: -len(_AUTOTUNE_SUFFIX)], {"autotune": True}, {}
        meta = {
            "name": name,
            "backend": "triton",
            **flags,
            "key_fields": fields,
            "files": {filename: len(raw)},
            "triton_version": triton.__version__,
            **tail,
        }
        try:
            _check_filename(filename)
            cache.record_build(
                f"{label}:{name}",
                ckey,
                fields,
                [Entry(ckey, "triton", pack({filename: raw}), meta)],
            )
            path = _materialize(cache, ckey, {filename: raw})[filename]
        except (OSError, ValueError) as exc:
            _log.warning(
                "cuforge: could not store Triton's %s %r (%s); Triton's own cache keeps it",
                noun,
                filename,
                exc,
            )
            return None
        cache.count(f"triton:{what}_{stored}")
        return path

    def _release(self) -> None:
        flight, self._flight = self._flight, None
        if flight is not None:
            flight.close()

    def __del__(self) -> None:
        # a compile that raised never reached put_group: let the next rank compile
        try:
            self._release()
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass


#: the file name ending of the autotuner's results
_AUTOTUNE_SUFFIX = ".autotune.json"
#: the entries that hold one named file (:meth:`CacheManager._single_lookup`): what ->
#: (what the logs call it, what Triton does when it is not served, the build's label, the
#: counter suffix of a store: ``triton:native_built``, ``triton:autotune_stored``)
_SINGLE_FILES = {
    "native": ("native module", "builds it again", "triton-module", "built"),
    "autotune": ("autotune result", "benchmarks again", "triton-autotune", "stored"),
}
#: a GPU model set by :func:`gpu_model` (tests, a fleet that knows better)
_gpu_override: list[str] = []
_gpu_memo: dict[str, str] = {}


def gpu_model(override: str | None = None) -> str:
    """The GPU model autotune results are keyed by: the name of the first visible GPU
    (the driver's ``cuDeviceGetName``, e.g. ``NVIDIA H200``), ``none`` without one.
    ``override``: use this name from now on in this process (``""`` clears it)."""
    if override is not None:
        _gpu_override[:] = [override] if override else []
    if _gpu_override:
        return _gpu_override[0]
    memo = _gpu_memo.get("gpu")
    if memo is None:
        from cuforge.toolchain import gpu

        try:
            found, _ = gpu.devices()
        except Exception:  # noqa: BLE001 - no driver: results keyed as "none"
            found = []
        memo = str(found[0].get("name")) if found else "none"
        _gpu_memo["gpu"] = memo
    return memo


def _is_native(filename: str) -> bool:
    return filename.endswith(_EXT_SUFFIX) or filename.endswith(".so")


def _compiler_identity() -> str:
    """The C compiler Triton would build with (``CC``, else gcc, else clang, as Triton's
    ``_build`` picks it) and the first line of its ``--version``; a custom
    ``triton.knobs.build.impl`` is named by its qualified name."""
    build = getattr(triton, "knobs", None) and getattr(triton.knobs, "build", None)
    impl = getattr(build, "impl", None) if build is not None else None
    if impl is not None:
        return f"impl:{getattr(impl, '__module__', '?')}.{getattr(impl, '__qualname__', '?')}"
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang") or ""
    if not cc:
        return "none"
    try:
        out = subprocess.run(
            [cc, "--version"], capture_output=True, text=True, timeout=30, check=False
        ).stdout
        version = out.strip().splitlines()[0] if out.strip() else "unknown"
    except (OSError, subprocess.SubprocessError):
        version = "unknown"
    return f"{os.path.basename(cc)}: {version}"


def native_fields() -> dict[str, str]:
    """The labeled key fields of a native module Triton builds, besides Triton's own key of
    its C source (``triton_hash``) and its file name: the C compiler, the Python ABI, the
    platform and C library, and the Triton version (whose headers the source includes).
    No path enters them. Computed once per process (the compiler's ``--version`` is one
    subprocess)."""
    if not _native_identity:
        libc = ""
        try:
            libc = os.confstr("CS_GNU_LIBC_VERSION") or ""
        except (ValueError, OSError, AttributeError):
            pass
        _native_identity.update(
            {
                "cc": _compiler_identity(),
                "python": f"{sys.implementation.cache_tag} {_EXT_SUFFIX}",
                "platform": f"{sys.platform} {os.uname().machine} {libc}".strip(),
                "triton_version": triton.__version__,
            }
        )
    return dict(_native_identity)


def _check_filename(name: str) -> None:
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise ValueError(f"{name!r} is not a plain file name")


def _same_files(directory: str, files: dict[str, bytes]) -> bool:
    for name, data in files.items():
        try:
            if _fs.read_bytes(os.path.join(directory, name)) != data:
                return False
        except OSError:
            return False
    return True


def _materialize(cache: Cache, ckey: str, files: dict[str, bytes]) -> dict[str, str]:
    """Paths of ``files`` in ``<cache dir>/triton/<ckey>/``, written there if they are not
    (a temp dir renamed into place, so a reader never sees part of a group)."""
    layout = cache.layout
    final = layout.triton_dir(ckey)
    paths = {name: os.path.join(final, name) for name in files}
    if _same_files(final, files):
        return paths
    problem = layout.ensure(layout.triton)
    if problem is not None:
        raise OSError(problem)
    tmp = os.path.join(layout.triton, f".tmp-{os.getpid()}-{uuid.uuid4().hex}")
    os.mkdir(tmp, 0o700)
    try:
        for name, data in files.items():
            _fs.atomic_write(os.path.join(tmp, name), data)
        try:
            os.rename(tmp, final)
            return paths
        except OSError:
            pass  # it exists: another rank's copy, or a stale or partial one
        if _same_files(final, files):
            return paths
        trash = os.path.join(layout.triton, f".trash-{os.getpid()}-{uuid.uuid4().hex}")
        os.rename(final, trash)
        os.rename(tmp, final)
        shutil.rmtree(trash, ignore_errors=True)
        return paths
    finally:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)


def prune_materialized(cache: Cache | None = None, *, older_than: float = PRUNE_AFTER) -> int:
    """Remove materialized groups under ``<cache dir>/triton/`` whose entry the disk tier no
    longer holds (evicted under the cap), and leftover temp dirs, once untouched for
    ``older_than`` seconds. Returns how many were removed."""
    cache = cache if cache is not None else _cache()
    layout = cache.layout
    try:
        names = os.listdir(layout.triton)
    except OSError:
        return 0
    now = time.time()
    removed = 0
    for name in names:
        path = os.path.join(layout.triton, name)
        try:
            if now - os.lstat(path).st_mtime < older_than:
                continue
        except OSError:
            continue
        if name.startswith((".tmp-", ".trash-")):
            pass
        elif len(name) == 64 and os.path.exists(layout.entry_path(name)):
            continue
        elif len(name) != 64:
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed += 1
    return removed


def _maybe_prune(cache: Cache) -> None:
    memo = cache.memo("cuforge.triton")
    if memo.get("pruned"):
        return
    memo["pruned"] = True
    try:
        prune_materialized(cache)
    except (OSError, ValueError) as exc:
        _log.debug("cuforge.triton: pruning materialized groups failed: %s", exc)


# before the first compile of a process that reaches this module through TRITON_CACHE_MANAGER
# (or ``import cuforge.triton``): Triton's key functions dispatch on the active manager
_install_key_recorder()
