"""Build a PyTorch extension: per-TU object cache, cached link, ninja for the rest.

The pipeline of :func:`build` (what ``load()``, ``load_inline()`` and the setuptools
helper share)::

    plan    sources, flags, archs, toolchain -> the *load key* (no compiler, no subprocess)
    direct  load-key manifest -> re-check its user headers (stat memo) -> module key
            -> the module, materialized at <cache_dir>/torch/modules/<key>/<name>.so
    build   (under the load key's single-flight lock, then the build dir's lock)
            every TU: its own manifest -> object key -> object from the store, or compile
            objects' keys + ldflags -> link key -> module from the store, or link
            ninja runs only the compiles and the link that missed

Keys (all :class:`cuforge.key.KeyBuilder`):

* TU key = source path (relative to the sources' common root) and content, the exact
  flags, compiler identities (nvcc's and the host compiler's), torch version + git hash
  + CUDA version, the Python ABI, the archs, the allow-listed environment, cuforge's
  version. Object key = TU key + every user header the compiler read (from its depfile)
  by content. System headers (torch's, the toolkit's, Python's, the pip CUDA wheels',
  /usr/include) are covered by those identities instead of being hashed one by one.
* link key = the objects' keys in order + the link flags + the host compiler.
* load key = everything the build depends on except header contents; its manifest maps
  header contents to the link key (a direct-mode manifest, like ccache's).

Paths under the sources' root and the build dir are written as placeholders in every
key, so another checkout or build dir hits the same entries.
"""

from __future__ import annotations

import os
import sys
import time

from cuforge.config import settings
from cuforge.deps import file_digest
from cuforge.key import KeyBuilder
from cuforge.torch import flags as _flags

__all__ = ["BuildSpec", "Plan", "BuildResult", "plan", "build", "counters", "last_build"]

#: how many header variants a manifest remembers (A -> B -> A needs 2)
MAX_VARIANTS = 8

#: process-wide counters (tests and bench-build read them)
counters = {"compiles": 0, "links": 0, "object_hits": 0, "module_hits": 0, "warm": 0}

#: what the last build() of this process did
last_build: dict = {}

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
        self.sources = sources
        self.extra_cflags = list(extra_cflags or ())
        self.extra_cuda_cflags = list(extra_cuda_cflags or ())
        self.extra_ldflags = list(extra_ldflags or ())
        self.extra_include_paths = list(extra_include_paths or ())
        self.build_directory = os.path.abspath(
            build_directory or os.path.join(settings().cache_dir, "torch", "build", name)
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
    from cuforge.toolchain import resolve_archs

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
    from cuforge.toolchain import compiler_identity

    env = p.env
    kb.text("torch", f"{env.torch_version} git={env.torch_git} cuda={env.torch_cuda}")
    kb.text("python_abi", env.python_abi)
    kb.text("cxx", _flags.tool_identity(env.cxx))
    if p.spec.with_cuda:
        ident = compiler_identity("nvcc")
        kb.text("nvcc", f"{ident['version']} {ident['version_output']}")
        host_cc = os.environ.get("CC") or "gcc"
        kb.text("nvcc_host", _flags.tool_identity(host_cc))
    kb.items("archs", p.archs)
    kb.environment()
    kb.cuforge_version()
    return kb


def _normalizer(p: Plan):
    env = p.env
    pairs = sorted([(p.root, _SRC), (p.spec.build_directory, _BUILD)], key=lambda x: -len(x[0]))

    def norm(text: str) -> str:
        for prefix, ph in pairs:
            if prefix in text:
                text = text.replace(prefix, ph)
        return env.normalize(text)

    return norm


def plan(spec: BuildSpec) -> Plan:
    """Everything but the compiles: flags, archs, TUs and the load key."""
    p = Plan()
    p.spec = spec
    p.env = env = _flags.build_env()
    p.archs = _archs(spec)
    from cuforge.torch.jobs import job_count

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
    base = _base_fields(KeyBuilder("torch-base"), p)
    for tu in p.tus:
        kb = base.copy()
        kb.text("source", tu.rel + " " + tu.digest, record=tu.rel + " " + tu.digest[:16])
        kb.text("kind", "nvcc" if tu.cuda else "c++")
        kb.items("options", [norm(f) for f in tu.flags])
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
        f"standalone={spec.is_standalone} launcher={bool(_launcher(spec))}",
    )
    p.load_fields = load.fields
    p.load_key = load.hexdigest()
    p.target = spec.name if spec.is_standalone else spec.name + ".so"
    return p


# ------------------------------------------------------------------ manifests


def _store():
    from cuforge.store import default_store

    return default_store()


def _read_manifest(store, key: str) -> list[dict]:
    if store is None:
        return []
    entry = store.get(key)
    if entry is None:
        return []
    import json

    try:
        data = json.loads(entry.payload)
        variants = data["variants"]
    except (ValueError, KeyError, TypeError):
        return []
    return [v for v in variants if isinstance(v, dict) and isinstance(v.get("headers"), dict)]


def _write_manifest(store, key: str, name: str, variant: dict) -> None:
    if store is None:
        return
    import json

    from cuforge.store.base import Entry

    variants = [v for v in _read_manifest(store, key) if v != variant]
    variants.insert(0, variant)
    payload = json.dumps({"variants": variants[:MAX_VARIANTS]}, sort_keys=True).encode()
    store.put(Entry(key, "manifest", payload, {"name": name}))


def _resolve(p: Plan, path: str) -> str:
    if path.startswith(_SRC):
        return p.root + path[len(_SRC) :]
    if path.startswith(_BUILD):
        return p.spec.build_directory + path[len(_BUILD) :]
    return path


def _match(p: Plan, variants: list[dict]) -> dict | None:
    """The first variant whose headers all still have the recorded contents."""
    for variant in variants:
        for path, digest in variant["headers"].items():
            if file_digest(_resolve(p, path)) != digest:
                break
        else:
            return variant
    return None


# ------------------------------------------------------------------ modules on disk


def module_dir(key: str) -> str:
    return os.path.join(settings().cache_dir, "torch", "modules", key)


def _atomic_write(path: str, data: bytes, mode: int = 0o755) -> None:
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _materialized(p: Plan, link_key: str, store) -> str | None:
    """The module file for ``link_key``: already on disk, or written from the store."""
    path = os.path.join(module_dir(link_key), p.target)
    if os.path.isfile(path):
        return path
    if store is None:
        return None
    entry = store.get(link_key)
    if entry is None:
        return None
    _atomic_write(path, entry.payload)
    return path


def direct_lookup(p: Plan, store=None) -> tuple[str, str] | None:
    """(module path, link key) when the load key's manifest matches, else None. No
    subprocess, no compiler: stat (and, for changed files, hash) the recorded headers."""
    store = _store() if store is None else store
    variant = _match(p, _read_manifest(store, p.load_key))
    if variant is None:
        return None
    link_key = variant.get("module")
    if not isinstance(link_key, str):
        return None
    path = _materialized(p, link_key, store)
    return None if path is None else (path, link_key)


# ------------------------------------------------------------------ building


def build(spec: BuildSpec) -> BuildResult:
    """Build (or find) the module of ``spec``. Raises CompileError / ArchError."""
    start = time.perf_counter()
    p = plan(spec)
    store = _store()
    result = _cached(p, store)
    if result is None:
        from cuforge.store import lock_dir
        from cuforge.store.single_flight import single_flight

        with single_flight(lock_dir(), p.load_key, settings().lock_timeout):
            # re-check: the holder before us may have built it
            result = _cached(p, store) or _build_locked(p, store)
    result.seconds = time.perf_counter() - start
    _say(
        spec,
        f"{spec.name}: {result.source} in {result.seconds:.2f} s "
        f"(compiled {len(result.compiled)}: {' '.join(result.compiled) or '-'}; "
        f"reused {len(result.reused)}; linked {result.linked})",
    )
    _record(result)
    return result


def _cached(p: Plan, store) -> BuildResult | None:
    hit = direct_lookup(p, store)
    if hit is None:
        return None
    counters["warm"] += 1
    return BuildResult(hit[0], hit[1], "cache", reused=[t.rel for t in p.tus])


def _record(result: BuildResult) -> None:
    last_build.clear()
    last_build.update(result.as_dict())


def _build_locked(p: Plan, store) -> BuildResult:
    from filelock import FileLock

    spec = p.spec
    os.makedirs(spec.build_directory, exist_ok=True)
    with FileLock(os.path.join(spec.build_directory, "lock")):
        return _build_in_dir(p, store)


def _object_lookup(p: Plan, tu: TU, store) -> bytes | None:
    variant = _match(p, _read_manifest(store, tu.key.hexdigest()))
    if variant is None or not isinstance(variant.get("object"), str):
        return None
    entry = store.get(variant["object"]) if store is not None else None
    if entry is None:
        return None
    tu.okey = variant["object"]
    tu.headers = variant["headers"]
    return entry.payload


def _link_key(p: Plan) -> str:
    norm = _normalizer(p)
    kb = KeyBuilder("torch-link")
    kb.text("name", p.target)
    kb.items("objects", [t.okey or "" for t in p.tus])
    kb.items("ldflags", [norm(f) for f in p.ldflags])
    kb.text("cxx", _flags.tool_identity(p.env.cxx))
    kb.text("torch", f"{p.env.torch_version} git={p.env.torch_git}")
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
        counters["object_hits"] += 1
        reused.append(tu.rel)
        _write_if_changed(obj_path, data)
    _say(spec, p.jobs_why)
    link_key = None
    if not todo:
        link_key = _link_key(p)
        path = _materialized(p, link_key, store)
        if path is not None:
            counters["module_hits"] += 1
            _remember_load(p, store, link_key)
            return BuildResult(path, link_key, "objects", reused=reused)
    from cuforge.torch import ninja_build

    for tu in todo:
        tu.split = tu.cuda and _split_wanted(spec, p, tu)
    t0 = time.perf_counter()
    ninja_build.run(p, todo)
    seconds = time.perf_counter() - t0
    counters["compiles"] += len(todo)
    counters["links"] += 1
    for tu in todo:
        _record_object(p, tu, store, seconds / max(1, len(todo)))
    link_key = _link_key(p)
    with open(os.path.join(bdir, p.target), "rb") as f:
        payload = f.read()
    path = os.path.join(module_dir(link_key), p.target)
    _atomic_write(path, payload)
    if store is not None:
        from cuforge.store.base import Entry

        store.put(
            Entry(
                link_key,
                "module",
                payload,
                {"name": spec.name, "compile_seconds": seconds, "arch": ",".join(p.archs)},
            )
        )
    _remember_load(p, store, link_key)
    return BuildResult(
        path, link_key, "built", compiled=[t.rel for t in todo], reused=reused, linked=True
    )


def _write_if_changed(path: str, data: bytes) -> None:
    try:
        if os.path.getsize(path) == len(data):
            with open(path, "rb") as f:
                if f.read() == data:
                    return
    except OSError:
        pass
    _atomic_write(path, data, 0o644)


def _user_headers(p: Plan, tu: TU, depfile: str) -> dict[str, str]:
    from cuforge.deps import parse_depfile

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
    kb = tu.key.copy()
    kb.mapping("headers", tu.headers)
    tu.okey = kb.hexdigest()
    if store is None:
        return
    from cuforge.store.base import Entry

    with open(obj_path, "rb") as f:
        payload = f.read()
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
    _write_manifest(store, tu.key.hexdigest(), tu.rel, {"headers": tu.headers, "object": tu.okey})


def _remember_load(p: Plan, store, link_key: str) -> None:
    headers: dict[str, str] = {}
    for tu in p.tus:
        headers.update(tu.headers)
    _write_manifest(store, p.load_key, p.spec.name, {"headers": headers, "module": link_key})


_TORCH_INCLUDES = ("<torch/", "<ATen/", "<c10/", "<pybind11/", '"torch/', '"ATen/')


def _split_wanted(spec: BuildSpec, p: Plan, tu: TU) -> bool:
    """Run nvcc's host and device pipelines in parallel (:mod:`cuforge.torch.nvcc_split`)
    for a .cu that includes torch's headers, when there is a second core for it.
    ``split=`` or ``CUFORGE_TORCH_SPLIT`` (0/1) overrides."""
    choice = spec.split
    if choice is None:
        env = (os.environ.get("CUFORGE_TORCH_SPLIT") or "").strip().lower()
        if env:
            choice = env not in ("0", "off", "no", "false")
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


def _launcher(spec: BuildSpec) -> str | None:
    """The compiler launcher to use: ``launcher=`` or ``CUFORGE_TORCH_LAUNCHER``
    (``ccache``, ``sccache`` or ``auto``), when that program is installed."""
    choice = spec.launcher or os.environ.get("CUFORGE_TORCH_LAUNCHER") or ""
    choice = choice.strip()
    if not choice or choice.lower() in ("0", "off", "none", "no"):
        return None
    candidates = ("sccache", "ccache") if choice.lower() == "auto" else (choice,)
    for c in candidates:
        found = _flags._which(c)
        if found:
            return found
    return None
