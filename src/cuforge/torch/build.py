"""Build a PyTorch extension: per-TU object cache, cached link, ninja for the rest.

The pipeline of :func:`build` (what ``load()``, ``load_inline()`` and the setuptools
helper share)::

    plan    sources, flags, archs, toolchain -> the *load key* (no compiler, no subprocess)
    direct  load-key manifest -> re-check its user headers (stat memo) -> module key
            -> the module, materialized at <cache_dir>/torch/modules/<key>/<name>.so and
            checked against its store entry before it is imported (see "modules on disk")
    build   (under the load key's single-flight lock, then the build dir's lock)
            every TU: its own manifest -> object key -> object from the store, or compile
            objects' keys + ldflags -> link key -> module from the store, or link
            ninja runs only the compiles and the link that missed

Keys (all :class:`cuforge.keys.key.KeyBuilder`):

* TU key = source path (relative to the sources' common root) and content, the exact
  flags, compiler identities (nvcc's and the host compiler's), torch version + git hash
  + CUDA version (a stable-ABI build: the ABI target it declares instead of the version
  and git hash, :mod:`cuforge.torch.stable_abi`), the Python ABI, the archs, the allow-listed environment, cuforge's
  version. Object key = TU key + every user header the compiler read (from its depfile)
  by content. System headers (torch's, the toolkit's, Python's, the pip CUDA wheels',
  /usr/include) are covered by those identities instead of being hashed one by one.
* link key = the objects' keys in order + the link flags + the host compiler.
* load key = everything the build depends on except header contents; its manifest maps
  header contents to the link key (a direct-mode manifest, like ccache's: the format of
  :mod:`cuforge.core.direct_mode`, shared with the kernel pipeline; a TU key's manifest maps them
  to the object key the same way).

Paths under the sources' root and the build dir are written as placeholders in every
key, so another checkout or build dir hits the same entries.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import MutableMapping

from cuforge.base._fs import atomic_write, locked, read_bytes, temp_path, unlink, write_if_changed
from cuforge.base.config import settings
from cuforge.base.errors import OfflineMissError
from cuforge.base.layout import is_entry_key as _is_key
from cuforge.core import direct_mode
from cuforge.core.caching import Cache, default_cache, resolve
from cuforge.keys.deps import file_digest, parse_depfile
from cuforge.keys.key import KeyBuilder, bytes_digest
from cuforge.store.base import Entry
from cuforge.store.upkeep import TORCH_BUILD_LOCK
from cuforge.toolchain import compiler_identity, resolve_archs
from cuforge.torch import flags as _flags
from cuforge.torch import ninja_build
from cuforge.torch import stable_abi as _stable_abi
from cuforge.torch.jobs import job_count

__all__ = [
    "BuildSpec",
    "Plan",
    "BuildResult",
    "plan",
    "build",
    "counters",
    "last_build",
    "module_dir",
    "default_build_directory",
    "warn_ignored",
]

#: the counters a build bumps in its cache's ``counters``, as ``"torch:<name>"``
COUNTER_NAMES = ("compiles", "links", "object_hits", "module_hits", "warm")
_LAST_BUILD = "torch:last_build"  # the cache memo that holds what its last build() did


class _DefaultView(MutableMapping):
    """A live view of a mapping of :func:`cuforge.default_cache` (``data(cache)``), its
    keys seen without ``prefix``."""

    def __init__(self, data, prefix: str = "") -> None:
        self._data, self._prefix = data, prefix

    def _map(self) -> dict:
        return self._data(default_cache())

    def __getitem__(self, name: str):
        return self._map()[self._prefix + name]

    def __setitem__(self, name: str, value) -> None:
        self._map()[self._prefix + name] = value

    def __delitem__(self, name: str) -> None:
        del self._map()[self._prefix + name]

    def __iter__(self):
        n = len(self._prefix)
        return iter([k[n:] for k in self._map() if k.startswith(self._prefix)])

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return repr(dict(self.items()))


def _torch_counters(cache: Cache) -> dict:
    for name in COUNTER_NAMES:
        cache.counters.setdefault("torch:" + name, 0)
    return cache.counters


#: the default cache's torch counters (``cache.counters["torch:compiles"]``...): tests and
#: bench/build_extension.py read them; a cuforge.Cache keeps its own
counters = _DefaultView(_torch_counters, "torch:")

#: what the default cache's last build() did (a cache keeps its own: ``cache.memo(...)``)
last_build = _DefaultView(lambda cache: cache.memo(_LAST_BUILD))

_SRC = "${SRC}"
_BUILD = "${BUILD}"


def _verbose(spec) -> bool:
    return bool(spec.verbose) or settings().verbose


def _say(spec, message: str) -> None:
    if _verbose(spec):
        print(f"cuforge.torch: {message}", file=sys.stderr, flush=True)


class BuildSpec:
    """The inputs of one build, as ``load()`` takes them plus cuforge's knobs."""

    def __init__(
        self,
        name: str,
        sources,
        extra_cflags=None,
        extra_cuda_cflags=None,
        extra_ldflags=None,
        extra_include_paths=None,
        build_directory: str | None = None,
        verbose: bool = False,
        with_cuda: bool | None = None,
        is_python_module: bool = True,
        is_standalone: bool = False,
        *,
        arch=None,
        preset: str = _flags.DEFAULT_PRESET,
        fast_math: bool = False,
        launcher: str | None = None,
        split: bool | None = None,
        cache: Cache | None = None,
    ) -> None:
        if is_python_module and is_standalone:
            raise ValueError("`is_python_module` and `is_standalone` are mutually exclusive.")
        if isinstance(sources, (str, os.PathLike)):
            sources = [sources]
        sources = [os.path.abspath(os.fspath(s)) for s in sources]
        if not sources:
            raise ValueError("At least one source is required to build a library")
        for s in sources:
            if not os.path.isfile(s):
                raise FileNotFoundError(f"extension source {s} does not exist")
        self.name = name
        #: the cuforge.Cache the objects, the module and the build dir live in
        self.cache: Cache = resolve(cache)
        self.sources = sources
        self.extra_cflags = list(extra_cflags or ())
        self.extra_cuda_cflags = list(extra_cuda_cflags or ())
        self.extra_ldflags = list(extra_ldflags or ())
        self.extra_include_paths = list(extra_include_paths or ())
        self.build_directory = os.path.abspath(
            build_directory or default_build_directory(name, self.cache)
        )
        self.verbose = verbose
        self.with_cuda = (
            any(map(_flags.is_cuda_file, sources)) if with_cuda is None else bool(with_cuda)
        )
        self.is_python_module = is_python_module
        self.is_standalone = is_standalone
        self.arch = arch
        self.preset = preset
        self.fast_math = fast_math
        self.launcher = launcher
        self.split = split


class TU:
    """One translation unit of a plan."""

    __slots__ = (
        "source",
        "rel",
        "cuda",
        "obj",
        "flags",
        "digest",
        "key",
        "okey",
        "headers",
        "split",
    )

    def __init__(self, source: str, rel: str, cuda: bool, obj: str) -> None:
        self.source, self.rel, self.cuda, self.obj = source, rel, cuda, obj
        self.flags: list[str] = []
        self.digest = ""
        self.key: KeyBuilder | None = None
        self.okey: str | None = None
        self.headers: dict[str, str] = {}
        self.split = False


class Plan:
    """Everything computed before any compiler runs."""

    __slots__ = (
        "spec",
        "env",
        "archs",
        "root",
        "tus",
        "cflags",
        "cuda_flags",
        "ldflags",
        "load_key",
        "load_fields",
        "jobs",
        "jobs_why",
        "target",
        "launcher",
        "abi_target",
    )


class BuildResult:
    """What :func:`build` produced: the module file and where it came from."""

    __slots__ = ("path", "key", "source", "compiled", "reused", "linked", "seconds")

    def __init__(self, path, key, source, compiled=(), reused=(), linked=False, seconds=0.0):
        self.path, self.key, self.source = path, key, source
        self.compiled, self.reused = list(compiled), list(reused)
        self.linked, self.seconds = linked, seconds

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.__slots__}

    def __repr__(self) -> str:
        return f"BuildResult({self.as_dict()})"


# ------------------------------------------------------------------ planning


def _archs(spec: BuildSpec) -> tuple[str, ...]:
    if not spec.with_cuda or _flags.has_arch_flag(spec.extra_cuda_cflags):
        return ()

    if spec.arch is None:
        archs = _torch_visible_archs()
        if archs:
            return archs
    return resolve_archs(spec.arch, allow_many=True)


def _torch_visible_archs() -> tuple[str, ...]:
    """The current device's arch when torch has already initialized CUDA (free then)."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            major, minor = torch.cuda.get_device_capability()
            return (f"sm_{major}{minor}",)
    except Exception:  # noqa: BLE001 - any CUDA trouble: fall back to the driver query
        return ()
    return ()


def _object_name(source: str, cuda: bool, taken: set[str]) -> str:
    stem = os.path.splitext(os.path.basename(source))[0]
    base = f"{stem}.cuda" if cuda else stem
    name, i = f"{base}.o", 1
    while name in taken:
        name, i = f"{base}_{i}.o", i + 1
    taken.add(name)
    return name


def _base_fields(kb: KeyBuilder, p: Plan) -> KeyBuilder:

    kb.text("torch", _torch_field(p))
    kb.text("python_abi", p.env.python_abi)
    kb.text("cxx", _flags.tool_identity(p.env.cxx))
    if p.spec.with_cuda:
        ident = compiler_identity("nvcc")
        kb.text("nvcc", f"{ident['version']} {ident['version_output']}")
        host_cc = os.environ.get("CC") or "gcc"
        kb.text("nvcc_host", _flags.tool_identity(host_cc))
    kb.items("archs", p.archs)
    kb.environment()
    kb.cuforge_version()
    return kb


def _torch_field(p: Plan, *, cuda: bool = True) -> str:
    """What a key records of torch: the stable ABI target a stable-ABI build declares
    (:mod:`cuforge.torch.stable_abi`; the CUDA version too for a CUDA build: the module
    links that runtime), else the exact version and git hash (and torch's CUDA)."""
    env = p.env
    if p.abi_target is not None:
        text = f"stable-abi={p.abi_target}"
        return text + f" cuda={env.torch_cuda}" if p.spec.with_cuda else text
    text = f"{env.torch_version} git={env.torch_git}"
    return text + f" cuda={env.torch_cuda}" if cuda else text


def _abi_target(p: Plan) -> str | None:
    """The stable ABI target of the plan's build, or None (see :mod:`.stable_abi`)."""
    env = p.env
    torch_include = os.path.join(env.torch_dir, "include")
    torch_dirs = [
        d
        for d in env.include_dirs(p.spec.with_cuda)
        if d == torch_include or d.startswith(torch_include + os.sep)
    ]
    return _stable_abi.stable_target(
        [(tu.source, tu.flags) for tu in p.tus],
        torch_version=env.torch_version,
        torch_include=torch_include,
        torch_dirs=torch_dirs,
        other_system=env.system_roots,
    )


def _normalizer(p: Plan):
    env = p.env
    pairs = sorted([(p.root, _SRC), (p.spec.build_directory, _BUILD)], key=lambda x: -len(x[0]))

    def norm(text: str) -> str:
        for prefix, ph in pairs:
            if prefix in text:
                text = text.replace(prefix, ph)
        return env.normalize(text)

    return norm


_NAME_DEFINE = "-DTORCH_EXTENSION_NAME="
_NAME = "${NAME}"


def _unnamed(flag: str, spec: BuildSpec) -> str:
    """A TU key's spelling of ``flag``: the extension-name define written with a
    placeholder, so a TU that does not use the name keys the same in a ``load()`` and a
    ``setup.py`` build of another name (the object key adds the name back for a TU that
    uses it: :func:`_object_key`)."""
    if flag == _NAME_DEFINE + spec.name and not spec.is_standalone:
        return _NAME_DEFINE + _NAME
    return flag


def plan(spec: BuildSpec) -> Plan:
    """Everything but the compiles: flags, archs, TUs and the load key."""
    p = Plan()
    p.spec = spec
    p.env = env = _flags.build_env()
    p.archs = _archs(spec)
    p.launcher = _flags.launcher(spec.launcher)

    p.jobs, p.jobs_why = job_count()
    threads = min(len(p.archs), p.jobs) if len(p.archs) > 1 else 1
    p.cflags, p.cuda_flags = _flags.compile_flags(
        env,
        name=None if spec.is_standalone else spec.name,
        with_cuda=spec.with_cuda,
        extra_cflags=spec.extra_cflags,
        extra_cuda_cflags=spec.extra_cuda_cflags,
        extra_include_paths=spec.extra_include_paths,
        archs=p.archs,
        preset=spec.preset,
        fast_math=spec.fast_math,
        threads=threads,
    )
    p.ldflags = _flags.link_flags(
        env,
        with_cuda=spec.with_cuda,
        extra_ldflags=spec.extra_ldflags,
        is_standalone=spec.is_standalone,
        is_python_module=spec.is_python_module,
    )
    dirs = {os.path.dirname(s) for s in spec.sources}
    p.root = os.path.commonpath(sorted(dirs)) if len(dirs) > 1 else dirs.pop()
    norm = _normalizer(p)
    taken: set[str] = set()
    p.tus = []
    for source in spec.sources:
        cuda = spec.with_cuda and _flags.is_cuda_file(source)
        tu = TU(source, os.path.relpath(source, p.root), cuda, _object_name(source, cuda, taken))
        tu.flags = p.cuda_flags if cuda else p.cflags
        digest = file_digest(source)
        if digest is None:
            raise FileNotFoundError(f"cannot read extension source {source}")
        tu.digest = digest
        p.tus.append(tu)
    p.abi_target = _abi_target(p)
    if p.abi_target is not None:
        _say(spec, f"{spec.name}: stable ABI target {p.abi_target}: keyed by it, not by torch")
    base = _base_fields(KeyBuilder("torch-base"), p)
    for tu in p.tus:
        kb = base.copy()
        kb.text("source", tu.rel + " " + tu.digest, record=tu.rel + " " + tu.digest[:16])
        kb.text("kind", "nvcc" if tu.cuda else "c++")
        kb.items("options", [norm(_unnamed(f, spec)) for f in tu.flags])
        tu.key = kb
    load = base.copy()
    load.text("name", spec.name)
    load.items("sources", [f"{tu.rel}={tu.digest}" for tu in p.tus])
    load.items("cflags", [norm(f) for f in p.cflags])
    load.items("cuda_flags", [norm(f) for f in p.cuda_flags])
    load.items("ldflags", [norm(f) for f in p.ldflags])
    load.text(
        "mode",
        f"cuda={spec.with_cuda} python_module={spec.is_python_module} "
        f"standalone={spec.is_standalone} launcher={bool(p.launcher)}",
    )
    p.load_fields = load.fields
    p.load_key = load.hexdigest()
    p.target = spec.name if spec.is_standalone else spec.name + ".so"
    return p


# ------------------------------------------------------------------ manifests


def _resolve(p: Plan, path: str) -> str:
    """A recorded header path (placeholders for the sources' root and the build dir) on
    this machine."""
    if path.startswith(_SRC):
        return p.root + path[len(_SRC) :]
    if path.startswith(_BUILD):
        return p.spec.build_directory + path[len(_BUILD) :]
    return path


def _match(p: Plan, store, base_digest: str) -> direct_mode.Variant | None:
    """The newest variant of ``base_digest``'s manifest whose headers all still have the
    recorded contents, when its target is a well-formed key."""
    variants = direct_mode.read_variants(store, direct_mode.manifest_key(base_digest))
    found = direct_mode.match(variants, lambda path: _resolve(p, path))
    if found is None or not _is_key(found[0].target):
        return None
    return found[0]


# ------------------------------------------------------------------ modules on disk
#
# Whoever can write the cache dir can make this process run their code (a module file is
# imported, i.e. executed). So a module file is imported from the cache dir only when:
#   * the cache dir and every directory on the way to the module pass the cache's trust
#     check (cuforge.base.layout: owned by this user, not writable by group or others);
#     otherwise modules are written to and imported from a private temp dir of this process;
#   * its path is derived again from the link key (never read from an entry or a memo),
#     and the key is checked to be a key (64 hex digits: no path can hide in it);
#   * it is a regular file (not a symlink), owned by this user, not group/other-writable,
#     and its bytes are those of the store entry it was written from: its SHA-256 is the
#     one the load manifest recorded for that entry's payload (no entry read on a warm
#     load), or else its bytes equal the entry's payload; otherwise it is written again
#     from the entry before it is imported.
# Within a trusted dir only this user can change a file between the check and the import.
# Module files are not fsynced: a torn one fails the check and is written again.

_private: list[str] = []  # this process's private temp dir, made on first use


def _private_dir() -> str:
    """A directory only this process writes (mode 0700, removed at exit)."""
    if not _private:
        path = tempfile.mkdtemp(prefix="cuforge-torch-")
        atexit.register(shutil.rmtree, path, True)
        _private.append(path)
    return _private[0]


def _trusted_dir(cache: Cache, path: str, what: str) -> str:
    """``path`` (under the cache dir) when it and every directory between the cache root
    and it pass the cache's trust check (they are created 0700 on the way); else the same
    place under this process's private temp dir, with a warning once per cache."""
    problem = cache.layout.ensure(path)
    if problem is None:
        return path
    cache.warn_once(
        f"cuforge.torch: not using {cache.directory} for extension builds and modules: "
        f"{problem}. Building and loading from a private temp dir instead (nothing is "
        "reused across processes until this is fixed)."
    )
    return os.path.join(_private_dir(), "torch", what, os.path.basename(path))


def default_build_directory(name: str, cache: Cache | None = None) -> str:
    """Where an extension builds when no ``build_directory`` is given. Precedence, as
    torch's ``_get_build_directory``:

    1. ``$TORCH_EXTENSIONS_DIR/<name>`` when ``TORCH_EXTENSIONS_DIR`` is set and not
       empty (torch also takes it as given, with no per-Python / per-CUDA subfolder);
    2. else ``<cache_dir>/torch/build/<name>`` of ``cache`` (default: the default cache;
       torch's own default is a per-user dir under ``~/.cache/torch_extensions/...``;
       cuforge keeps its builds in its cache dir, where the size cap covers them), or a
       private temp dir when the cache dir cannot be trusted.

    An explicit ``build_directory=`` argument always wins over both."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if root:
        return os.path.join(os.path.abspath(root), name)
    return _cache_build_directory(name, resolve(cache))


def _cache_build_directory(name: str, cache: Cache) -> str:
    return _trusted_dir(cache, cache.layout.torch_build_dir(name), "build")


def module_dir(key: str, cache: Cache | None = None) -> str:
    """The directory of the module built for link key ``key``:
    ``<cache_dir>/torch/modules/<key>``, or under a private temp dir when the cache dir
    cannot be trusted. Raises ValueError when ``key`` is not a key."""
    cache = resolve(cache)
    return _trusted_dir(cache, cache.layout.torch_module_dir(key), "modules")


def _safe_module_bytes(path: str) -> bytes | None:
    """The bytes of ``path`` when it is a regular file (not a symlink) owned by this user
    and not writable by group or others; else None."""

    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        return None
    try:
        return read_bytes(path)
    except OSError:
        return None


def _write_module(path: str, payload: bytes) -> str:
    """Write the module file ``path`` (mode 0755, a planted file or link is replaced);
    where that fails (a read-only or full cache dir), write it in the private temp dir.
    Returns where it was written."""
    try:
        atomic_write(path, payload, mode=0o755)
        return path
    except OSError as exc:
        fallback = os.path.join(_private_dir(), "modules", *path.split(os.sep)[-2:])

        logging.getLogger("cuforge").warning(
            "cuforge.torch: cannot write %s (%s); loading the module from %s",
            path,
            exc.strerror or exc,
            fallback,
        )
        atomic_write(fallback, payload, mode=0o755)
        return fallback


def _materialized(p: Plan, link_key: str, store, digest: str = "") -> str | None:
    """The module file for ``link_key``, checked before it is imported: its SHA-256 must be
    ``digest`` (the digest of the module entry's payload, recorded in the load manifest),
    else its bytes must be the entry's; otherwise it is written again from the entry.
    None when the store has no such entry."""

    path = os.path.join(module_dir(link_key, p.spec.cache), p.target)
    if digest:
        data = _safe_module_bytes(path)
        if data is not None and bytes_digest(data) == digest:
            # the copy of the entry it was written from: no entry read, but its use is
            # the entry's (a hit, the build time it saved, its last use)
            _used(store, link_key, path)
            return path
    if store is None:
        return None
    entry = store.get(link_key, kind="module")  # counts the hit, refreshes its last use
    if entry is None or entry.kind != "module":
        return None
    if _safe_module_bytes(path) == entry.payload:
        _used(None, link_key, path)
        return path
    return _write_module(path, entry.payload)


def _used(store, link_key: str, path: str) -> None:
    """A module served from its file: refresh the last use of its module dir and, without
    reading the payload, of its entry in ``store``'s disk tier (counted as a hit there,
    with the build time it saved). What eviction and ``cuforge cache stats`` go by."""
    try:
        os.utime(os.path.dirname(path))
    except OSError:
        pass  # a read-only cache dir still serves it
    for tier in getattr(store, "tiers", (store,)):
        touch = getattr(tier, "touch", None)
        if touch is not None and touch(link_key):
            return


def direct_lookup(p: Plan) -> tuple[str, str] | None:
    """(module path, link key) when the load key's manifest matches, else None. No
    subprocess, no compiler: stat (and, for changed files, hash) the recorded headers,
    then check the module file (see "modules on disk")."""
    # the cache's writable tiers first, then each bundle (read in place; the module file
    # is written from the bundle's checked entry, as from a cache entry)
    for where in p.spec.cache.chain:
        variant = _match(p, where, p.load_key)
        if variant is None:
            continue
        path = _materialized(p, variant.target, where, variant.digest)
        if path is not None:
            return path, variant.target
    return None


# ------------------------------------------------------------------ building


def build(spec: BuildSpec) -> BuildResult:
    """Build (or find) the module of ``spec``. Raises CompileError / ArchError."""
    start = time.perf_counter()
    p = plan(spec)
    cache = spec.cache
    result = cache.build_once(
        p.load_key,
        what=f"torch extension {spec.name}",
        lookup=lambda: _cached(p),
        build=lambda: _build_locked(p, cache.store),
        offline_error=lambda: _offline_miss(p),
    )
    result.seconds = time.perf_counter() - start
    _say(
        spec,
        f"{spec.name}: {result.source} in {result.seconds:.2f} s "
        f"(compiled {len(result.compiled)}: {' '.join(result.compiled) or '-'}; "
        f"reused {len(result.reused)}; linked {result.linked})",
    )
    _publish(p, result.path)
    _record(cache, result)
    return result


def _offline_miss(p: Plan):
    """The error of strict mode (``CUFORGE_OFFLINE=1``) for an extension that is neither
    in the cache nor in a loaded bundle: it names the extension, its archs and sources,
    and the ``[[extension]]`` manifest entry that would build it."""

    spec = p.spec
    archs = " ".join(map(str, getattr(p, "archs", None) or []))
    sources = [os.path.relpath(s) for s in spec.sources]
    entry = "\n".join(
        [
            "[[extension]]",
            f'name = "{spec.name}"',
            "sources = [" + ", ".join(f'"{s}"' for s in sources) + "]",
        ]
    )
    loaded = spec.cache.bundles
    bundles = ", ".join(str(getattr(b, "path", None) or b) for b in loaded) or "none loaded"
    return OfflineMissError(
        (
            f"strict mode: the torch extension {spec.name} (archs {archs or '?'}; sources "
            f"{', '.join(sources)}) is not in the cache or a loaded bundle (bundles: {bundles})"
            f"; nothing was compiled. To ship it, list it in cuforge.toml:\n\n{entry}\n\nthen "
            "run `cuforge build --bundle app.cfb` and `cuforge bundle install app.cfb` (or "
            "cuforge.load_bundle at import). Unset CUFORGE_OFFLINE to build on a miss."
        ),
        kind="torch",
        name=spec.name,
        key=p.load_key,
        manifest_entry=entry,
        arch=archs,
    )


def _publish(p: Plan, path: str) -> None:
    """Make the built module also appear in a build directory the user chose (an explicit
    ``build_directory`` or ``$TORCH_EXTENSIONS_DIR/<name>``) under torch's name for it
    (``<name>.so``; a standalone executable: ``<name>``): a hard link to the checked
    module file, or a copy (same mtime) where linking fails. Kept as it is when it is
    already that file or a copy of it (same size and mtime). A failure is logged, not
    raised: the module itself was built and is loaded from ``path``."""

    spec = p.spec
    bdir = spec.build_directory
    if bdir == os.path.abspath(_cache_build_directory(spec.name, spec.cache)):
        return  # cuforge's own build dir: nobody looks for the module there
    dest = os.path.join(bdir, p.target)
    if dest == path:
        return
    try:
        src = os.stat(path)
        try:
            have = os.lstat(dest)
        except FileNotFoundError:
            have = None
        if have is not None and stat.S_ISREG(have.st_mode):
            if (have.st_ino, have.st_dev) == (src.st_ino, src.st_dev) or (
                have.st_size == src.st_size and have.st_mtime_ns == src.st_mtime_ns
            ):
                return
        os.makedirs(bdir, exist_ok=True)

        tmp = temp_path(dest)
        try:
            os.link(path, tmp)
        except OSError:  # another file system, or links not allowed: copy
            atomic_write(dest, read_bytes(path), mode=0o755)
            os.utime(dest, ns=(src.st_atime_ns, src.st_mtime_ns), follow_symlinks=False)
            return
        try:
            os.replace(tmp, dest)  # replaces a planted link itself, never its target
        except OSError:
            unlink(tmp)
            raise
    except OSError as exc:
        logging.getLogger("cuforge").warning(
            "cuforge.torch: could not place %s in build_directory %s (%s); the module "
            "was built and is loaded from %s",
            p.target,
            bdir,
            exc.strerror or exc,
            path,
        )


def warn_ignored(argument: str, why: str, cache: Cache | None = None) -> None:
    """Log once per cache (``cache``: default :func:`cuforge.default_cache`) that a torch
    argument is accepted and ignored, and why. Through the ``cuforge`` logger, like the
    module's other warnings."""
    resolve(cache).warn_once(
        f"cuforge.torch: {argument} is accepted for compatibility with torch and ignored: {why}"
    )


def _cached(p: Plan) -> BuildResult | None:
    hit = direct_lookup(p)
    if hit is None:
        return None
    p.spec.cache.count("torch:warm")
    return BuildResult(hit[0], hit[1], "cache", reused=[t.rel for t in p.tus])


def _record(cache: Cache, result: BuildResult) -> None:
    last = cache.memo(_LAST_BUILD)
    last.clear()
    last.update(result.as_dict())


def _build_locked(p: Plan, store) -> BuildResult:
    spec = p.spec
    bdir = spec.build_directory
    os.makedirs(bdir, exist_ok=True)
    with locked(os.path.join(bdir, TORCH_BUILD_LOCK)):
        # eviction may have removed the dir while this build waited for its lock (it
        # takes the lock to remove one); its last use is now
        os.makedirs(bdir, exist_ok=True)
        try:
            os.utime(bdir)
        except OSError:
            pass
        return _build_in_dir(p, store)


def _object_lookup(p: Plan, tu: TU, store) -> bytes | None:
    """The cached object of ``tu``: the newest variant of its TU key's manifest whose
    headers still hold and whose object key is the one this build computes for them
    (with this extension's name when the TU uses ``TORCH_EXTENSION_NAME``, so another
    name's object of such a TU is never served)."""
    if store is None:
        return None
    variants = direct_mode.read_variants(store, direct_mode.manifest_key(tu.key.hexdigest()))
    for variant in variants:
        if not _is_key(variant.target):
            continue
        if direct_mode.match([variant], lambda path: _resolve(p, path)) is None:
            continue
        if _object_key(p, tu, variant.headers).hexdigest() != variant.target:
            continue  # built for another extension name, and this TU uses the name
        entry = store.get(variant.target, kind="object")
        if entry is None or entry.kind != "object":
            return None
        tu.okey = variant.target
        tu.headers = dict(variant.headers)
        return entry.payload
    return None


#: content digest -> whether that text may use TORCH_EXTENSION_NAME
_name_use: dict[str, bool] = {}


def _text_uses_name(path: str, digest: str) -> bool:
    """Whether the file ``path``, expected to have content ``digest``, may expand
    ``TORCH_EXTENSION_NAME``: it spells ``EXTENSION_NAME`` or pastes tokens (``##``,
    which could assemble the name). True when in doubt: the file cannot be read or its
    content is no longer ``digest``."""
    if digest in _name_use:
        if file_digest(path) == digest:
            return _name_use[digest]
        return True

    try:
        data = read_bytes(path)
    except OSError:
        return True
    if bytes_digest(data) != digest:
        return True
    uses = b"EXTENSION_NAME" in data or b"##" in data
    _name_use[digest] = uses
    return uses


def _uses_name(p: Plan, tu: TU, headers: dict[str, str]) -> bool:
    """Whether ``tu`` (its source and the user ``headers`` it read, recorded path ->
    digest) may use ``TORCH_EXTENSION_NAME``. System headers (torch's, the toolkit's)
    do not: torch's define is only read by ``PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)``
    in user code."""
    if _NAME_DEFINE + _NAME not in tu.key.fields.get("options", ()):
        return False  # no name define in this build (a standalone executable)
    if _text_uses_name(tu.source, tu.digest):
        return True
    return any(
        digest == "missing" or _text_uses_name(_resolve(p, path), digest)
        for path, digest in headers.items()
    )


def _object_key(p: Plan, tu: TU, headers: dict[str, str]) -> KeyBuilder:
    """The object key of ``tu`` built with these user ``headers``: the TU key, the
    headers' contents and, only for a TU that uses ``TORCH_EXTENSION_NAME``, the
    extension's name."""
    kb = tu.key.copy()
    kb.mapping("headers", headers)
    if _uses_name(p, tu, headers):
        kb.text("extension_name", p.spec.name)
    return kb


def _link_key(p: Plan) -> str:
    norm = _normalizer(p)
    kb = KeyBuilder("torch-link")
    kb.text("name", p.target)
    kb.items("objects", [t.okey or "" for t in p.tus])
    kb.items("ldflags", [norm(f) for f in p.ldflags])
    kb.text("cxx", _flags.tool_identity(p.env.cxx))
    kb.text("torch", _torch_field(p, cuda=False))
    kb.text("python_abi", p.env.python_abi)
    return kb.hexdigest()


def _build_in_dir(p: Plan, store) -> BuildResult:
    spec = p.spec
    bdir = spec.build_directory
    todo: list[TU] = []
    reused: list[str] = []
    for tu in p.tus:
        data = _object_lookup(p, tu, store)
        obj_path = os.path.join(bdir, tu.obj)
        if data is None:
            todo.append(tu)
            continue
        spec.cache.count("torch:object_hits")
        reused.append(tu.rel)
        write_if_changed(obj_path, data, mode=0o644)
    _say(spec, p.jobs_why)
    link_key = None
    if not todo:
        link_key = _link_key(p)
        path = _materialized(p, link_key, store)
        if path is not None:
            spec.cache.count("torch:module_hits")
            _remember_load(p, store, link_key, _module_digest(path))
            return BuildResult(path, link_key, "objects", reused=reused)

    for tu in todo:
        tu.split = tu.cuda and _split_wanted(spec, p, tu)
    t0 = time.perf_counter()
    ninja_build.run(p, todo)
    seconds = time.perf_counter() - t0
    spec.cache.count("torch:compiles", len(todo))
    spec.cache.count("torch:links")
    for tu in todo:
        _record_object(p, tu, store, seconds / max(1, len(todo)))
    link_key = _link_key(p)
    payload = read_bytes(os.path.join(bdir, p.target))
    path = _write_module(os.path.join(module_dir(link_key, p.spec.cache), p.target), payload)
    if store is not None:
        store.put(
            Entry(
                link_key,
                "module",
                payload,
                {"name": spec.name, "compile_seconds": seconds, "arch": ",".join(p.archs)},
            )
        )

    _remember_load(p, store, link_key, bytes_digest(payload))
    return BuildResult(
        path, link_key, "built", compiled=[t.rel for t in todo], reused=reused, linked=True
    )


def _user_headers(p: Plan, tu: TU, depfile: str) -> dict[str, str]:

    try:
        with open(depfile, encoding="utf-8", errors="surrogateescape") as f:
            deps = parse_depfile(f.read())
    except OSError:
        deps = []
    roots = p.env.system_roots
    norm = _normalizer(p)
    headers: dict[str, str] = {}
    for dep in deps:
        path = os.path.normpath(os.path.join(p.spec.build_directory, dep))
        if path == tu.source or path.startswith(roots):
            continue
        digest = file_digest(path)
        headers[norm(path)] = digest or "missing"
    return headers


def _record_object(p: Plan, tu: TU, store, seconds: float) -> None:
    obj_path = os.path.join(p.spec.build_directory, tu.obj)
    tu.headers = _user_headers(p, tu, obj_path + ".d")
    kb = _object_key(p, tu, tu.headers)
    tu.okey = kb.hexdigest()
    if store is None:
        return

    payload = read_bytes(obj_path)
    store.put(
        Entry(
            tu.okey,
            "object",
            payload,
            {
                "name": tu.rel,
                "compile_seconds": seconds,
                "arch": ",".join(p.archs),
                "key_fields": kb.fields,
            },
        )
    )
    direct_mode.write_variant(
        store,
        direct_mode.manifest_key(tu.key.hexdigest()),
        tu.rel,
        direct_mode.Variant(tu.headers, (), tu.okey),
    )


def _module_digest(path: str) -> str:
    """SHA-256 of the module file just checked against (or written from) its entry."""

    return bytes_digest(read_bytes(path))


def _remember_load(p: Plan, store, link_key: str, digest: str) -> None:
    """Record in the load key's manifest: these headers -> this module (and its digest)."""
    headers: dict[str, str] = {}
    for tu in p.tus:
        headers.update(tu.headers)
    direct_mode.write_variant(
        store,
        direct_mode.manifest_key(p.load_key),
        p.spec.name,
        direct_mode.Variant(headers, (), link_key, digest),
    )


_TORCH_INCLUDES = ("<torch/", "<ATen/", "<c10/", "<pybind11/", '"torch/', '"ATen/')


def _split_wanted(spec: BuildSpec, p: Plan, tu: TU) -> bool:
    """Run nvcc's host and device pipelines in parallel (:mod:`cuforge.torch.nvcc_split`)
    for a .cu that includes torch's headers, when there is a second core for it.
    ``split=`` or ``CUFORGE_TORCH_SPLIT`` (0/1) overrides."""
    choice = spec.split
    if choice is None:
        choice = settings().torch_split
    if choice is not None:
        return bool(choice)
    if p.jobs < 2:
        return False
    try:
        with open(tu.source, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return False
    return any(inc in text for inc in _TORCH_INCLUDES)
