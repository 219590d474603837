"""cuforge under FlashInfer's JIT: one ``flashinfer`` entry per built module (its ``.so``).

Set-up, one line: ``cuforge.flashinfer.enable()`` (or ``cuforge.enable("flashinfer")``,
``CUFORGE_ENABLE=flashinfer``). See docs/flashinfer.md.

What happens: FlashInfer builds an nvcc module (``JitSpecNvcc``) by writing a ninja file
into its workspace (``FLASHINFER_WORKSPACE_BASE``) and running ninja. :func:`enable`
replaces ``JitSpecNvcc.build`` (a private hook: FlashInfer has no public one) with
:func:`_build`, which

* lets FlashInfer write its ninja file (``write_ninja``), then keys the module by that
  file made path-free (:func:`module_fields`): every flag, define, include dir and link
  flag FlashInfer passes (so ``FLASHINFER_EXTRA_*FLAGS``, the arch list and the debug
  knobs are in it), the sources by content, FlashInfer's own headers (the package's
  ``data/`` dirs) by FlashInfer's version, any other file or dir the build names
  (generated sources and headers, user include dirs, embedded cubins) by content, nvcc's
  and the C++ compiler's ``--version``, torch's version and C++ ABI, tvm-ffi's version,
  Python's ABI and the platform;
* asks the cache through :meth:`cuforge.Cache.begin` (single flight across processes, the
  fleet lease across machines, the compile fence, recording): a hit writes the ``.so``
  atomically where FlashInfer loads it (``<workspace>/cached_ops/<name>/<name>.so``) and
  runs no compiler; a miss runs FlashInfer's own build (ninja), then stores the ``.so``
  and explains the miss (``cuforge cache explain flashinfer:<name>``).

The entry is native host code (``meta.native_module``; :func:`cuforge.store.schema.is_native`):
an unsigned remote refuses it unless ``CUFORGE_REMOTE_NATIVE=allow``. A damaged entry is
deleted and the module built again. A build cuforge cannot key (a source install whose
version is ``0.0.0+unknown``, a file it cannot read) runs FlashInfer's build uncached,
and the reason is logged once.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import sys
import sysconfig
from typing import TYPE_CHECKING

import flashinfer
from flashinfer.jit import core as _fi_core
from flashinfer.jit import env as _fi_env

from cuforge.adapters.common import refused, warn_once, window_verdict
from cuforge.adapters.windows import window
from cuforge.base import _fs
from cuforge.base.layout import MachineDir
from cuforge.core.blobcache import BlobFormatError, make_key, offline_error, pack, unpack
from cuforge.core.caching import Cache, Hit, default_cache
from cuforge.store.base import Entry
from cuforge.store.schema import is_native

if TYPE_CHECKING:  # pragma: no cover
    from typing import Any

__all__ = [
    "enable",
    "disable",
    "enabled",
    "supported",
    "hook_problem",
    "SUPPORTED",
    "KIND",
    "module_fields",
    "key_of",
    "prebuilt_status",
]

#: the FlashInfer releases this module is tested on (``cuforge/adapters/windows.py``)
SUPPORTED = window("flashinfer")
#: the entry kind of a built FlashInfer module
KIND = "flashinfer"
#: a file or dir the build names outside FlashInfer's package is keyed by content up to this
_MAX_HASHED_BYTES = 256 * 1024 * 1024

_log = logging.getLogger("cuforge")
_state: dict[str, Any] = {"cache": None, "original": None, "first": None}
#: an absolute path in a ninja value: alone, after ``=``, or glued to ``-I`` / ``-L``
_ABS_PATH = re.compile(r"(?:(?<![\w<>$])|(?<=-I)|(?<=-L))/[^\s$:;,'\"]+")


class Uncacheable(Exception):
    """A build cuforge cannot key: FlashInfer builds it uncached (the message says why)."""


# ---------------------------------------------------------------------- the window, the probe
def _version() -> str:
    return str(getattr(flashinfer, "__version__", "0"))


def hook_problem() -> str | None:
    """Why cuforge cannot plug under FlashInfer's JIT here (None when it can)."""
    if _state.get("probing"):
        return None
    spec_cls = getattr(_fi_core, "JitSpecNvcc", None)
    if spec_cls is None:
        return refused("flashinfer", f"FlashInfer {_version()} has no jit.core.JitSpecNvcc")
    return window_verdict("flashinfer", "FlashInfer", _version(), SUPPORTED, _probe)


def supported() -> bool:
    """Whether cuforge can plug under the installed FlashInfer (:func:`hook_problem`)."""
    return hook_problem() is None


def _probe() -> str | None:
    """The contract, on a FlashInfer outside :data:`SUPPORTED`: ``JitSpecNvcc`` has the
    members :func:`_build` uses, FlashInfer writes a ninja file cuforge can key, for a
    throwaway spec (no compiler runs), and a stored module comes back byte for byte."""
    import tempfile

    cls = _fi_core.JitSpecNvcc
    for member in ("build", "write_ninja", "ninja_path", "jit_library_path", "build_dir"):
        if not hasattr(cls, member):
            return f"flashinfer.jit.core.JitSpecNvcc has no {member}"
    for name in ("FLASHINFER_JIT_DIR", "FLASHINFER_WORKSPACE_DIR", "FLASHINFER_INCLUDE_DIR"):
        if not hasattr(_fi_env, name):
            return f"flashinfer.jit.env has no {name}"
    with tempfile.TemporaryDirectory(prefix="cuforge-flashinfer-probe-") as tmp:
        source = os.path.join(tmp, "probe.cu")
        with open(source, "w") as f:
            f.write("// cuforge contract probe\n")
        spec = cls(
            name="cuforge_probe_" + os.urandom(4).hex(),
            sources=[_fi_core.Path(source)],
            extra_cflags=[],
            extra_cuda_cflags=["-DCF_CONTRACT_PROBE"],
            extra_ldflags=None,
            extra_include_dirs=None,
        )
        try:
            spec.write_ninja()
            fields = module_fields(spec)
            key = make_key(KIND, fields)[0]
            if "-DCF_CONTRACT_PROBE" not in fields.get("ninja:cuda_cflags", ""):
                return "FlashInfer's ninja file does not carry the module's nvcc flags"
            cache = Cache(os.path.join(tmp, "cache"), remotes=(), telemetry=False)
            cache.put(_entry(key, spec.name, fields, b"\x7fELF-probe"))
            if _read(cache, key, spec.name) != b"\x7fELF-probe":
                return "a stored module did not come back byte for byte"
        finally:
            import shutil

            shutil.rmtree(str(spec.build_dir), ignore_errors=True)
    return None


# ---------------------------------------------------------------------- enable / disable
def enable(cache: Cache | None = None) -> bool:
    """Make FlashInfer's nvcc JIT builds go through ``cache`` (default:
    :func:`cuforge.default_cache`, resolved at each build). Returns False (after one
    warning) when this FlashInfer cannot be hooked; FlashInfer then builds as before."""
    if cache is not None and not isinstance(cache, Cache):
        raise TypeError(f"cache= must be a cuforge.Cache or None, not {type(cache).__name__}")
    problem = hook_problem()
    if problem is not None:
        warn_once(f"cuforge: {problem}")
        return False
    _state["cache"] = cache
    cls = _fi_core.JitSpecNvcc
    if _state["original"] is None:
        _state["original"] = cls.__dict__["build"]
        _state["first"] = _state["first"] or _state["original"]
        cls.build = _build
    status = prebuilt_status()
    if status is not None:
        warn_once(f"cuforge.flashinfer: {status}")
    return True


def disable() -> None:
    """Give FlashInfer its own build back (undo :func:`enable`)."""
    original = _state["original"]
    if original is not None:
        _fi_core.JitSpecNvcc.build = original
    _state.update(cache=None, original=None)


def enabled() -> bool:
    """Whether FlashInfer's nvcc builds go through cuforge."""
    return _state["original"] is not None


def prebuilt_status() -> str | None:
    """One line on FlashInfer's prebuilt ``flashinfer-jit-cache`` wheel, or None when it is
    not installed. FlashInfer loads a module of a wheel whose version matches its own
    before it builds anything (cuforge is never asked for that module); a wheel of another
    version is ignored by FlashInfer (then cuforge caches every module). cuforge's entries
    are keyed by FlashInfer's version, so no version is ever mixed."""
    if not _fi_env.has_flashinfer_jit_cache():
        return None
    providers = getattr(_fi_env, "FLASHINFER_AOT_PROVIDERS", ())
    if not providers:
        return (
            "flashinfer-jit-cache is installed but FlashInfer ignores it (its version is not "
            f"FlashInfer {_version()}'s): cuforge caches every module FlashInfer builds"
        )
    shown = ", ".join(f"{p.distribution} {p.version}" for p in providers)
    return (
        f"FlashInfer's prebuilt modules ({shown}) are used for the modules they hold; cuforge "
        f"caches only the modules FlashInfer {_version()} builds itself"
    )


def _cache() -> Cache:
    cache = _state["cache"]
    return cache if cache is not None else default_cache()


# ---------------------------------------------------------------------- the key
def _prefixes() -> list[tuple[str, str]]:
    """(absolute dir, placeholder) of the dirs whose paths differ between machines but
    whose contents are keyed otherwise, longest first."""
    out: dict[str, str] = {}

    def add(path: Any, label: str) -> None:
        if path:
            for p in {str(path), os.path.realpath(str(path))}:
                out.setdefault(p.rstrip(os.sep), label)

    add(_fi_env.FLASHINFER_JIT_DIR, "<jit>")
    add(_fi_env.FLASHINFER_GEN_SRC_DIR, "<gen>")
    add(_fi_env.FLASHINFER_WORKSPACE_DIR, "<workspace>")
    add(os.path.dirname(os.path.dirname(os.path.abspath(_fi_env.__file__))), "<flashinfer>")
    try:
        import tvm_ffi

        add(os.path.dirname(os.path.abspath(tvm_ffi.__file__)), "<tvm_ffi>")
    except ImportError:
        pass
    add(sysconfig.get_path("include"), "<python-include>")
    from flashinfer.jit.cpp_ext import get_cuda_path

    add(get_cuda_path(), "<cuda>")
    add(sys.executable, "<python>")
    return sorted(out.items(), key=lambda item: -len(item[0]))


def _tool_identity(command: str, cuda_home: str) -> str:
    """``--version`` of a compiler FlashInfer's ninja file names (path-free), probed once
    per version of the file (:func:`cuforge.toolchain.identity.version_output`: a second
    process on the machine runs neither ``nvcc --version`` nor ``c++ --version``)."""
    path = command.replace("$cuda_home", cuda_home)
    import shutil

    from cuforge.toolchain.identity import version_output

    found = shutil.which(path) or path
    if not os.path.exists(found):
        raise Uncacheable(f"the compiler {path} cannot be found")
    out = version_output(found)
    if out is None:
        raise Uncacheable(f"{path} --version failed")
    lines = [line.strip() for line in out.strip().splitlines() if line.strip()]
    if not lines:
        raise Uncacheable(f"{path} --version printed nothing")
    # nvcc's first line is "nvcc: NVIDIA (R) Cuda compiler driver", the rest its build
    return " | ".join(lines[:6])


def _digest_path(path: str) -> str:
    """``file:<sha256>`` of a file or ``dir:<sha256>`` of a dir's regular files."""
    h = hashlib.sha256()
    if os.path.isfile(path):
        h.update(_fs.read_bytes(path))
        return "file:" + h.hexdigest()
    total = 0
    for directory, dirs, names in os.walk(path):
        dirs.sort()
        for name in sorted(names):
            full = os.path.join(directory, name)
            if not os.path.isfile(full) or name.endswith((".o", ".d", ".so", ".lock")):
                continue
            data = _fs.read_bytes(full)
            total += len(data)
            if total > _MAX_HASHED_BYTES:
                raise Uncacheable(f"{path} holds over {_MAX_HASHED_BYTES >> 20} MiB to key")
            rel = os.path.relpath(full, path).replace(os.sep, "/")
            h.update(f"{rel}\0{len(data)}\0".encode())
            h.update(data)
    return "dir:" + h.hexdigest()


def _ninja_vars(text: str) -> dict[str, str]:
    """The ninja file's lines joined (``$`` continuations), top-level ``var = value``s by
    name and the rules and builds under ``rules`` / ``builds``."""
    joined = re.sub(r" \$\n\s*", " ", text)
    out: dict[str, str] = {}
    rest: list[str] = []
    for line in joined.splitlines():
        m = re.match(r"^([A-Za-z_][\w]*) = ?(.*)$", line)
        if m:
            out[m.group(1)] = m.group(2).strip()
        elif line.strip():
            rest.append(line.rstrip())
    out["rules_and_builds"] = "\n".join(rest)
    return out


def module_fields(spec: Any) -> dict[str, str]:
    """The labeled key fields of building ``spec`` (a ``JitSpecNvcc`` whose ninja file
    FlashInfer has written): module doc. Raises :class:`Uncacheable` with the reason."""
    version = _version()
    if not version or version.startswith("0.0.0"):
        raise Uncacheable(
            f"FlashInfer's version is {version!r} (a source install): its own headers cannot "
            "be keyed by version"
        )
    try:
        text = _fs.read_bytes(str(spec.ninja_path)).decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise Uncacheable(f"FlashInfer's ninja file cannot be read ({exc})") from exc
    from flashinfer.jit.cpp_ext import get_cuda_path

    cuda_home = get_cuda_path()
    variables = _ninja_vars(text)
    fields: dict[str, str] = {
        "flashinfer_version": version,
        "module": str(spec.name),
        "nvcc": _tool_identity(variables.get("nvcc", "$cuda_home/bin/nvcc"), cuda_home),
        "cxx": _tool_identity(variables.get("cxx", "c++"), cuda_home),
        "python": f"{sys.implementation.cache_tag} {sysconfig.get_config_var('EXT_SUFFIX')}",
        "platform": f"{sys.platform} {os.uname().machine}",
    }
    import torch

    fields["torch"] = f"{torch.__version__} cxx11abi={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"
    try:
        import tvm_ffi

        fields["tvm_ffi"] = str(getattr(tvm_ffi, "__version__", "?"))
    except ImportError:
        fields["tvm_ffi"] = "absent"
    prefixes = _prefixes()
    package_dir = dict((label, path) for path, label in prefixes)["<flashinfer>"]
    gen_dir = str(_fi_env.FLASHINFER_GEN_SRC_DIR)
    # the sources by content; a generated source's whole module dir (its headers)
    for source in spec.sources:
        path = os.path.realpath(str(source))
        label = _placeholder(path, prefixes)
        try:
            fields[f"source:{label}"] = _digest_path(path)
            if path.startswith(os.path.realpath(gen_dir) + os.sep):
                fields[f"source-dir:{_placeholder(os.path.dirname(path), prefixes)}"] = (
                    _digest_path(os.path.dirname(path))
                )
        except OSError as exc:
            raise Uncacheable(f"the source {path} cannot be read ({exc})") from exc

    def path_free(value: str) -> str:
        for path, label in prefixes:
            value = value.replace(path + os.sep, label + "/").replace(path, label)

        def by_content(m: re.Match) -> str:
            path = m.group(0)
            if path.startswith((package_dir + os.sep, "/usr/include", "/usr/lib")):
                return path
            if os.path.isfile(path) or os.path.isdir(path):
                try:
                    return f"<{_digest_path(path)[:21]}>"
                except OSError as exc:
                    raise Uncacheable(f"{path} cannot be read ({exc})") from exc
            return path

        return _ABS_PATH.sub(by_content, value)

    for name, value in sorted(variables.items()):
        if name in ("nvcc", "cxx", "cuda_home", "name"):
            continue  # the compilers by identity, the toolkit by nvcc's
        fields[f"ninja:{name}"] = path_free(value)
    return fields


def _placeholder(path: str, prefixes: list[tuple[str, str]]) -> str:
    for prefix, label in prefixes:
        if path == prefix or path.startswith(prefix + os.sep):
            return label + path[len(prefix) :]
    return os.path.basename(path)


def key_of(spec: Any) -> tuple[str, dict[str, str]]:
    """(cuforge entry key, labeled fields) of building ``spec`` (ninja file written).
    The compilers' ``--version`` memo goes to the directory of the cache in use."""
    with MachineDir(_cache().directory):
        return make_key(KIND, module_fields(spec))


# ---------------------------------------------------------------------- entries
def _entry(key: str, name: str, fields: dict[str, str], so: bytes, seconds: float = 0.0) -> Entry:
    meta = {
        "name": name,
        "backend": "flashinfer",
        "native_module": True,
        "key_fields": fields,
        "files": {f"{name}.so": len(so)},
        "flashinfer_version": _version(),
        "compile_seconds": max(0.0, float(seconds)),
    }
    return Entry(key, KIND, pack({f"{name}.so": so}), meta)


def _read(cache: Cache, key: str, name: str) -> bytes | None:
    """The ``.so`` of entry ``key``, or None: absent, or damaged (deleted, warned)."""
    entry, tier = cache.get_with_tier(key, kind=KIND)
    if entry is None:
        return None
    try:
        if entry.kind != KIND:
            raise ValueError(f"the entry is of kind {entry.kind!r}, not {KIND!r}")
        if not is_native(entry.kind, entry.meta):
            raise ValueError("the entry does not say it holds a native module")
        files = unpack(entry.payload)
        if list(files) != [f"{name}.so"]:
            raise ValueError(f"the entry holds {sorted(files)}, not just {name}.so")
        data = files[f"{name}.so"]
        if not data.startswith(b"\x7fELF"):
            raise ValueError("the module is not an ELF shared object")
    except (ValueError, BlobFormatError) as exc:
        cache.count(f"{KIND}:load_errors")
        _log.warning(
            "cuforge: the cached FlashInfer module %r (key %s, from the %s tier) could not be "
            "used (%s); it is deleted and FlashInfer builds it again",
            name,
            key[:12],
            tier or "disk",
            exc,
        )
        cache.delete(key)
        return None
    source = "remote" if tier and tier.startswith("remote") else tier or "disk"
    cache.count(f"{KIND}:{source}")
    cache.verbose(f"cuforge: flashinfer {name} {source} hit key {key[:12]}")
    return data


def _materialize(spec: Any, data: bytes) -> str:
    """Write ``data`` where FlashInfer loads ``spec``'s module (atomically: temp + rename);
    an identical file is left as it is."""
    path = str(spec.jit_library_path)
    try:
        if _fs.read_bytes(path) == data:
            return path
    except OSError:
        pass
    os.makedirs(os.path.dirname(path), exist_ok=True)
    _fs.atomic_write(path, data, mode=0o755)
    return path


# ---------------------------------------------------------------------- the build
def _build(self: Any, verbose: bool | None = None, need_lock: bool = False) -> None:
    """``JitSpecNvcc.build`` through the cache (module doc)."""
    original = _state["original"] or _state["first"]
    if _state["original"] is None or os.environ.get("FLASHINFER_DISABLE_JIT"):
        return original(self, verbose, need_lock)  # FlashInfer's own (it raises when disabled)
    if need_lock:
        from filelock import FileLock

        with FileLock(self.lock_path, thread_local=False):
            _build_cached(self, original, verbose)
    else:
        _build_cached(self, original, verbose)
    return None


def _build_cached(spec: Any, original: Any, verbose: bool | None) -> None:
    cache = _cache()
    name = str(spec.name)
    try:
        if cache.store is None:
            raise Uncacheable("the cache is disabled")
        problem = cache.trust_problem()
        if problem is not None:
            raise Uncacheable(problem)
        spec.write_ninja()
        key, fields = key_of(spec)
    except (Uncacheable, OSError) as exc:
        cache.count(f"{KIND}:uncached")
        warn_once(f"cuforge.flashinfer: module {name} is built uncached: {exc}")
        original(spec, verbose, False)
        return

    def lookup() -> str | None:
        data = _read(cache, key, name)
        return None if data is None else _materialize(spec, data)

    got = cache.begin(
        key,
        what=f"flashinfer {name}",
        lookup=lookup,
        offline_error=lambda: offline_error(KIND, name, key, fields, "is not in the cache"),
    )
    if type(got) is Hit:
        return
    with got:
        original(spec, verbose, False)
        so = _fs.read_bytes(str(spec.jit_library_path))
        seconds = 0.0
        try:
            from time import perf_counter

            seconds = perf_counter() - got.started
        except (AttributeError, TypeError):
            pass
        got.commit(f"flashinfer:{name}", fields, [_entry(key, name, fields, so, seconds)])
        cache.count(f"{KIND}:built")
