"""The cached-compile pipeline: joins the key, the store and the bare compilers.

``compile_cached()`` never builds the same thing twice and never serves a stale result.
How a call is answered, fastest first:

1. **This process asked before** (the call memo). The call's arguments and the settings
   snapshot find the earlier result; its headers are re-checked with one ``stat`` each
   (and include paths that did not exist must still not exist). ~1 microsecond.
2. **Direct mode** (as ccache): a *base key* of source + options + arch + toolchain +
   allow-listed env finds the *manifest* (:mod:`cuforge.core.direct_mode`) of the last compiles:
   the user headers each read, by path. The first whose headers still have the recorded
   content digests (memoized by stat) completes the *final key*, which finds the entry in
   the store (memory tier, then disk); so reverting an edit is a hit. No preprocessor, no compiler,
   no CUDA bindings imported.
   Loaded bundles (:func:`cuforge.load_bundle`) are read-only tiers asked after the
   store: their entries are served in place, never copied into the cache.
3. **Strict mode** (``strict=True`` or ``CUFORGE_OFFLINE=1``): a miss raises
   :class:`OfflineMissError` naming the kernel, arch and variant, and what a manifest
   would have to list; nothing is compiled.
4. **Compile** under a single-flight lock on the base key (threads and processes), so a
   key is compiled once while the others wait and then read the result. NVRTC reports no
   dependencies, so cuforge's include scanner lists the headers first; nvcc's ``-MD``
   output lists them after. Header digests are taken before the compile and checked again
   after it: a header edited mid-compile is never stored under the old content.

The final key's labeled fields are remembered per source name, so a miss can say why
(``CUFORGE_EXPLAIN=1``, :func:`cuforge.explain_miss`).
"""

from __future__ import annotations

import os
import sys
import time
from collections import namedtuple
from collections.abc import Mapping, Sequence

# The tiers a Cache builds, loaded with this module so the first lookup pays no import.
import cuforge.store.disk  # noqa: F401
import cuforge.store.memory  # noqa: F401
import cuforge.store.tiered  # noqa: F401
from cuforge.base._progress import spinner_after
from cuforge.base.config import Settings, memo_environment, settings
from cuforge.base.errors import OfflineMissError
from cuforge.base.layout import MachineDir
from cuforge.base.paths import keyed_path, real_path
from cuforge.compiler.base import Backend, CompileJob
from cuforge.compiler.nvcc import NvccBackend
from cuforge.compiler.nvrtc import NvrtcBackend
from cuforge.compiler.outputs import OUTPUT_KINDS, Artifact, CompileOutput
from cuforge.core.caching import DEFAULT_CALL_MEMO, Cache, DefaultCounters, default_cache
from cuforge.core.caching import _override as _cache_override
from cuforge.core.direct_mode import Variant, manifest_key, match, read_variants, write_variant
from cuforge.keys.deps import file_digest, scan_includes, settled, stat_signature
from cuforge.keys.key import KeyBuilder, text_digest
from cuforge.store.base import Entry
from cuforge.toolchain import resolve_archs, toolkit_include_dirs, toolkit_root

_override_get = _cache_override.get  # bound once: the hot path reads it on every call

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: see docs/architecture.md, the warm path
if TYPE_CHECKING:
    from typing import Any


__all__ = [
    "compile_cached",
    "counters",
    "reset_memo",
    "CompileCall",
    "CompileRequest",
    "BACKENDS",
    "OfflineMissError",
    "call_entries",
]

#: The compiler backends, by their ``backend=`` name. A new backend is a
#: :class:`~cuforge.compiler.base.Backend` subclass registered here.
BACKENDS: dict[str, Backend] = {b.name: b for b in (NvrtcBackend(), NvccBackend())}

#: One ``compile_cached`` call exactly as the caller made it (sequences as tuples), plus the
#: environment that can change its answer. It is the call memo's key; :func:`_normalize`
#: turns it into a :class:`CompileRequest`.
CompileCall = namedtuple(
    "CompileCall",
    "source name options include_dirs defines arch backend output name_expressions "
    "source_dir headers result_type environment",
)

#: What the default cache did in this process (a live view of
#: ``cuforge.default_cache().counters``; a :class:`~cuforge.Cache` keeps its own): compiles
#: run, hits per tier, call-memo hits.
counters = DefaultCounters()


def kernel_offline_error(
    name: str,
    arch: str,
    *,
    name_expressions: tuple[str, ...] = (),
    defines: tuple = (),
    options: tuple[str, ...] = (),
    include_dirs: tuple[str, ...] = (),
    backend: str = "nvrtc",
    output: str = "cubin",
    why: str = "",
    bundles: tuple[str, ...] = (),
    key: str = "",
    fields: dict | None = None,
) -> OfflineMissError:
    """The :class:`~cuforge.base.errors.OfflineMissError` of a kernel: it names the kernel, the
    arch, the variant (name expressions, defines, options) and the ``cuforge.toml`` entry
    that would build it. Attributes: ``name``, ``arch``, ``name_expressions``, ``defines``,
    ``options``, ``include_dirs``, ``manifest_entry``."""
    name_expressions = tuple(name_expressions)
    defines_map = dict(defines)
    options = tuple(options)
    entry = _manifest_entry(
        name, arch, name_expressions, defines_map, options, include_dirs, backend, output
    )
    variant = []
    if name_expressions:
        variant.append("name_expressions " + ", ".join(name_expressions))
    if defines_map:
        variant.append(
            "defines " + ", ".join(f"{k}={_define_value(v)}" for k, v in defines_map.items())
        )
    if options:
        variant.append("options " + " ".join(options))
    where = "; ".join(variant) or "no name expressions, defines or options"
    loaded = "loaded bundles: " + ", ".join(bundles) if bundles else "no bundle is loaded"
    return OfflineMissError(
        f"strict mode: {name} for {arch} ({where}) is not in the cache or a loaded "
        f"bundle ({loaded}){why}; nothing was compiled. To ship it, list this entry in "
        f"cuforge.toml (or [tool.cuforge] in pyproject.toml):\n\n{entry}\n\n"
        'then run `cuforge build --bundle app.cfb` and call cuforge.load_bundle("app.cfb") '
        "at import (or `cuforge bundle install app.cfb`). Unset CUFORGE_OFFLINE (or "
        "pass strict=False) to compile on a miss instead.",
        kind="kernel",
        name=name,
        key=key,
        fields=fields,
        manifest_entry=entry,
        arch=arch,
        name_expressions=name_expressions,
        defines=defines_map,
        options=options,
        include_dirs=tuple(include_dirs),
    )


def _toml(value) -> str:
    """A TOML literal of a str, a list of str or a str -> str table."""
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    text = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'


def _manifest_entry(name, arch, exprs, defines, options, include_dirs, backend, output) -> str:
    here = os.getcwd()
    dirs = [os.path.relpath(d, here) if d.startswith(here + os.sep) else d for d in include_dirs]
    lines = ["[[kernel]]", f"source = {_toml(name)}", f"arch = {_toml(arch.split(','))}"]
    if dirs:
        lines.append(f"include_dirs = {_toml(dirs)}")
    if exprs:
        lines.append(f"name_expressions = {_toml(list(exprs))}")
    if defines:
        lines.append(f"defines = {_toml({k: _define_value(v) for k, v in defines.items()})}")
    if options:
        lines.append(f"options = {_toml(list(options))}")
    if backend != "nvrtc":
        lines.append(f"backend = {_toml(backend)}")
    if output != "cubin":
        lines.append(f"output = {_toml(output)}")
    return "\n".join("    " + line for line in lines)


#: Files a computed ``#include MACRO`` might reach are keyed by listing whole include
#: directories; past this many files cuforge refuses to cache rather than guess.
MAX_FILES_FOR_COMPUTED_INCLUDES = 2000


def reset_memo() -> None:
    """Forget the default caches' call memo (the memory tier of the store is separate; a
    :class:`~cuforge.Cache` forgets its own with ``cache.clear_memos()``)."""
    DEFAULT_CALL_MEMO.clear()


class CompileRequest:
    """One compile's inputs, normalized: what the compiler will receive, exactly."""

    __slots__ = (
        "source",
        "name",
        "backend",
        "output",
        "archs",
        "options",
        "compiler_options",
        "name_expressions",
        "include_dirs",
        "source_dir",
        "headers",
        "compiler",
        "base_dir",
        "cache_dir",
    )

    def __init__(
        self,
        source: str,
        *,
        name: str,
        backend: str,
        output: str,
        archs: tuple[str, ...],
        options: tuple[str, ...],
        name_expressions: tuple[str, ...],
        include_dirs: tuple[str, ...],
        source_dir: str | None,
        headers: Mapping[str, str] | None,
        base_dir: str,
        cache_dir: str = "",
    ) -> None:
        self.source = source
        self.name = name
        self.backend = backend
        self.output = output
        self.archs = archs
        self.options = options
        self.name_expressions = name_expressions
        self.include_dirs = include_dirs
        self.source_dir = source_dir
        self.headers = dict(headers) if headers else None
        #: paths under it enter the key relative to it (:mod:`cuforge.base.paths`)
        self.base_dir = base_dir
        #: the cache dir (never keyed as a header dir: a computed include's listing skips it)
        self.cache_dir = cache_dir
        self.compiler: Backend = BACKENDS[backend]
        self.compiler_options = tuple(self.compiler.compiler_options(options, archs, output))

    def base_key(self) -> KeyBuilder:
        """Every input but the headers' contents."""
        kb = KeyBuilder("kernel")
        kb.text("name", self.name)
        kb.text("source", self.source)
        kb.text("backend", self.backend)
        kb.text("output", self.output)
        kb.text("arch", " ".join(self.archs))
        kb.items("options", self.compiler.keyed_options(self.compiler_options, self.base_dir))
        kb.items("name_expressions", self.name_expressions)
        if self.headers:
            kb.mapping("inline_headers", {k: text_digest(v) for k, v in self.headers.items()})
        kb.mapping("compiler", self.compiler.identity())
        kb.cuforge_version()
        kb.environment()
        return kb

    def result(self, result_type: type[Artifact], **fields) -> Artifact:
        """The pipeline's answer for this request; ``fields`` gives what the compile or the
        cache entry supplied (binary, log, key, ...)."""
        return result_type(
            name=self.name,
            source=self.source,
            output=self.output,
            arch=self.archs[0] if len(self.archs) == 1 else self.archs,
            backend=self.backend,
            name_expressions=self.name_expressions,
            **fields,
        )

    def compile(self) -> CompileOutput:
        job = CompileJob(
            self.source,
            self.name,
            self.options,
            self.archs,
            self.output,
            self.name_expressions,
            self.headers,
        )
        return self.compiler.compile(job, source_dir=self.source_dir)


def compile_cached(
    source: str,
    *,
    name: str = "kernel.cu",
    options: Sequence[str] = (),
    include_dirs: Sequence[str] = (),
    defines: Mapping[str, Any] | None = None,
    arch: str | int | Sequence[str] | None = None,
    backend: str = "nvrtc",
    output: str = "cubin",
    name_expressions: Sequence[str] = (),
    source_dir: str | None = None,
    headers: Mapping[str, str] | None = None,
    result_type: type[Artifact] = Artifact,
    strict: bool = False,
    cache: Cache | None = None,
) -> Artifact:
    """Compile ``source`` or fetch the result of an identical earlier compile.

    See :func:`cuforge.compile` for the arguments. Returns ``result_type`` (an
    :class:`Artifact` or subclass) whose ``source_of_result`` says where it came from
    (``"bundle"`` for a loaded bundle).

    ``strict`` (or an offline cache: ``CUFORGE_OFFLINE=1``): never compile; a miss raises
    :class:`OfflineMissError`. Hits are served as usual. ``cache``: the
    :class:`~cuforge.Cache` to use (default: :func:`cuforge.default_cache`).
    """
    # The hot path: an identical call answered from the call memo. Everything here is
    # cheap on purpose (no settings object, no key hashing): ~1 us plus a stat per header.
    # a plain tuple in CompileCall's field order (building the namedtuple itself costs
    # ~0.4 us, a quarter of a memo hit); it becomes a CompileCall only on a miss
    memo_key = (
        source,
        name,
        tuple(options),
        tuple(include_dirs),
        tuple(defines.items()) if defines else (),
        arch if arch is None or arch.__class__ is str or arch.__class__ is int else tuple(arch),
        backend,
        output,
        tuple(name_expressions),
        source_dir,
        tuple(headers.items()) if headers else (),
        result_type,
        memo_environment(),
    )
    # the default caches share one memo table (its keys hold CUFORGE_CACHE_DIR), so a hit
    # needs no cache object: the counters to bump travel with the answer
    if cache is None:
        cache = _override_get()
        table = DEFAULT_CALL_MEMO if cache is None else cache.call_memo
    elif isinstance(cache, Cache):
        table = cache.call_memo
    else:
        raise TypeError(f"cache must be a cuforge.Cache or None, not {type(cache).__name__}")
    memo = table.get(memo_key)
    if memo is not None and ((not memo[1] and not memo[2]) or _still_valid(memo[1], memo[2])):
        memo[3]["call_memo_hits"] += 1
        return memo[0]
    if cache is None:
        cache = default_cache()
    cfg = settings()
    started = time.perf_counter()
    _check_sequences(options=options, include_dirs=include_dirs, name_expressions=name_expressions)
    with MachineDir(cache.directory):  # the toolchain memo goes to this cache's dir
        request = _normalize(CompileCall._make(memo_key), cfg, cache)
        result, header_sigs, probes = _lookup_or_compile(
            request, cache, result_type, started, (strict or cache.offline) and memo_key, memo_key
        )
    if cache.enabled and header_sigs is not None and all(settled(sig) for _, sig in header_sigs):
        # a header edited in the last seconds may change again within one timestamp tick:
        # such calls take the (digest-checking) store path until the header settles
        _remember_call(table, memo_key, result, header_sigs, probes, cache)
    return result


def call_entries(source: str, **kwargs: Any) -> list[Entry]:
    """The store entries that answer :func:`compile_cached` ``(source, **kwargs)`` now:
    the kernel entry, then its direct-mode manifest holding only the variant that matched
    (what a bundle must hold for the call to hit). Compiles nothing: a miss raises
    :class:`OfflineMissError`."""
    cfg = settings()
    cache = kwargs.pop("cache", None) or default_cache()
    result = compile_cached(source, strict=True, cache=cache, **kwargs)
    # the call as compile_cached records it, with compile_cached's own defaults
    a = {**compile_cached.__kwdefaults__, **kwargs}
    arch = a["arch"]
    call = CompileCall(
        source,
        a["name"],
        tuple(a["options"]),
        tuple(a["include_dirs"]),
        tuple(a["defines"].items()) if a["defines"] else (),
        arch if arch is None or isinstance(arch, (str, int)) else tuple(arch),
        a["backend"],
        a["output"],
        tuple(a["name_expressions"]),
        a["source_dir"],
        tuple(a["headers"].items()) if a["headers"] else (),
        a["result_type"],
        None,  # the environment: not read by _normalize
    )
    request = _normalize(call, cfg, cache)
    base_digest = request.base_key().hexdigest()
    mkey = manifest_key(base_digest)
    for where in cache.chain:
        kernel = where.get(result.key, kind="kernel")
        variants = [v for v in read_variants(where, mkey) if v.target == result.key]
        if kernel is not None and variants:
            meta = {"name": request.name, "variants": [variants[0].as_meta()]}
            return [kernel, Entry(mkey, "manifest", b"", meta)]
    raise _offline_miss(request, call, cache, base_digest)


def _still_valid(header_sigs: list[tuple[str, Any]], probes: list[str]) -> bool:
    for path, sig in header_sigs:
        if stat_signature(path) != sig:
            return False
    for path in probes:
        if os.path.exists(path):
            return False
    return True


def _remember_call(
    table, memo_key: tuple, result: Artifact, header_sigs, probes, cache: Cache
) -> None:
    size = len(result.binary or b"")
    while table and table.bytes + size > cache.memory_max_bytes:
        oldest = next(iter(table))
        table.bytes -= len(table.pop(oldest)[0].binary or b"")
    old = table.pop(memo_key, None)
    if old is not None:
        table.bytes -= len(old[0].binary or b"")
    table[memo_key] = (result.with_source("memory"), header_sigs, probes, cache.counters)
    table.bytes += size


def _normalize(call: CompileCall, cfg: Settings, cache: Cache) -> CompileRequest:
    """Check a call's arguments (each error names the argument) and turn it into what the
    compiler will receive."""
    source, name, backend, output = call.source, call.name, call.backend, call.output
    if not isinstance(source, str):
        raise TypeError(f"source must be str (CUDA C++ text), not {type(source).__name__}")
    _check_name(name)
    if not source.strip():
        raise ValueError(f"{name}: the source is empty; pass CUDA C++ text (or use compile_file)")
    _check_text(source, name)
    compiler = BACKENDS.get(backend)
    if compiler is None:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
    if output not in OUTPUT_KINDS:
        raise ValueError(f"output must be one of {', '.join(OUTPUT_KINDS)}, not {output!r}")
    _check_items(call)
    archs = resolve_archs(call.arch, allow_many=(output == "fatbin"))
    compiler.check(archs=archs, output=output, headers=call.headers)
    if len(archs) > 1 and not (compiler.many_archs and output == "fatbin"):
        raise ValueError(
            f"{len(archs)} archs given ({', '.join(archs)}): use output='fatbin' with backend='nvcc'"
        )
    dirs = []
    if call.source_dir is not None:
        dirs.append(os.path.abspath(call.source_dir))
    dirs.extend(os.path.abspath(os.fspath(d)) for d in call.include_dirs)
    expanded = list(call.options) + list(cfg.extra_options)
    for key, value in call.defines:
        expanded.append(f"-D{key}" if value is None else f"-D{key}={_define_value(value)}")
    expanded.extend(f"-I{d}" for d in dirs)
    return CompileRequest(
        source,
        name=name,
        backend=backend,
        output=output,
        archs=archs,
        options=tuple(expanded),
        name_expressions=call.name_expressions,
        include_dirs=tuple(dirs),
        source_dir=os.path.abspath(call.source_dir) if call.source_dir else None,
        headers=dict(call.headers) if call.headers else None,
        base_dir=cache.keyed_base_dir(),
        cache_dir=cache.directory,
    )


#: what each sequence argument holds, for its error message
_SEQUENCES = {
    "options": ("a sequence of option strings", "'-std=c++17'"),
    "include_dirs": ("a sequence of paths", "'include'"),
    "name_expressions": ("a sequence of C++ expressions", "'kernel<float>'"),
}


def _check_sequences(**arguments: Any) -> None:
    """A str where a sequence is expected (``include_dirs="/tmp"``) would be read as its
    characters: a TypeError naming the argument and the fix. Cheap; runs on every miss."""
    for arg, value in arguments.items():
        if isinstance(value, (str, bytes, os.PathLike)):
            what, example = _SEQUENCES[arg]
            fix = [os.fspath(value)] if not isinstance(value, bytes) else None
            raise TypeError(
                f"{arg} must be {what}, not one {type(value).__name__}: use "
                f"{fix!r}" + ("" if fix else f", e.g. [{example}]")
            )


def _check_name(name: Any) -> None:
    """``name`` is text without NUL (it goes into the key, the index and logs)."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a str (the source's file name), not {type(name).__name__}")
    if "\0" in name:
        raise ValueError(
            f"name contains a NUL byte at offset {name.index(chr(0))}: {name!r}; pass a file "
            "name such as 'kernel.cu'"
        )


def _check_items(call: CompileCall) -> None:
    """Each element of the sequence arguments, and each in-memory header, has the type the
    compiler needs: a TypeError naming the argument, the element and what was expected."""
    for arg, ok in (("options", (str, os.PathLike)), ("name_expressions", str)):
        for i, item in enumerate(getattr(call, arg)):
            if not isinstance(item, ok):
                what = _SEQUENCES[arg][0].replace("a sequence of ", "")
                raise TypeError(f"{arg}[{i}] must be a str ({what}), not {type(item).__name__}")
    for i, item in enumerate(call.include_dirs):
        if not isinstance(item, (str, os.PathLike)):
            raise TypeError(f"include_dirs[{i}] must be a path (str), not {type(item).__name__}")
    for key, text in call.headers:
        if not isinstance(key, str):
            raise TypeError(
                f"headers keys must be header names (str), not {type(key).__name__}: {key!r}"
            )
        if not isinstance(text, str):
            raise TypeError(
                f"headers[{key!r}] must be the header's text (str), not {type(text).__name__}"
            )


def _check_text(source: str, name: str) -> None:
    """A NUL byte (the compiler would stop reading there, silently dropping the rest) or a
    lone surrogate (not encodable as UTF-8) is an error naming where it is."""
    nul = source.find("\0")
    if nul >= 0:
        line = source.count("\n", 0, nul) + 1
        raise ValueError(
            f"{name}: the source contains a NUL byte at offset {nul} (line {line}); the "
            "compiler would silently stop reading there. Remove it (binary data does not "
            "belong in CUDA source)."
        )
    try:
        source.encode("utf-8")
    except UnicodeEncodeError as exc:
        line = source.count("\n", 0, exc.start) + 1
        raise ValueError(
            f"{name}: the source is not valid Unicode text: a lone surrogate "
            f"{source[exc.start]!r} at offset {exc.start} (line {line}), usually from text "
            "decoded with errors='surrogateescape'. Decode the file as UTF-8 and fix the "
            "bytes it rejects."
        ) from None


def _define_value(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def _final_key(base: KeyBuilder, headers: dict[str, str]) -> KeyBuilder:
    """The base key plus the headers' contents; ``headers`` maps keyed paths
    (:func:`cuforge.base.paths.keyed_path`) to content digests."""
    final = base.copy()
    final.mapping("headers", headers)
    return final


def _keyed(paths, base: str) -> list[str]:
    return [keyed_path(p, base) for p in paths]


def _lookup_or_compile(
    request: CompileRequest, cache: Cache, result_type, started: float, strict=None, call=None
):
    """``strict``: falsy, or the call's memo key (a miss then raises OfflineMissError);
    ``call``: the call's memo key (the fence and the recorder describe the call with it).
    Returns ``(result, header stat signatures or None, probes)``."""
    base = request.base_key()
    base_digest = base.hexdigest()
    if not cache.enabled:
        if strict:
            raise _offline_miss(
                request, CompileCall._make(strict), cache, base_digest,
                " (CUFORGE_DISABLE_CACHE is set)",
            )  # fmt: skip
        # nothing to look up, but still the one build path: the compile fence and the
        # recorder see a compile whether or not it is cached
        return cache.build_once(
            base_digest,
            what=request.name,
            lookup=lambda: None,
            build=lambda: _compile_and_store(
                request, cache, base, base_digest, result_type, started
            ),
            offline_error=lambda: _offline_miss(
                request,
                CompileCall._make(call),
                cache,
                base_digest,
                " (built with caching off)",
            ),  # fmt: skip
        )
    return cache.build_once(
        base_digest,
        what=request.name,
        lookup=lambda: _lookup(cache, base, base_digest, result_type, started, request),
        build=lambda: _compile_and_store(request, cache, base, base_digest, result_type, started),
        offline_error=lambda: _offline_miss(
            request, CompileCall._make(strict or call), cache, base_digest
        ),
        strict=bool(strict),
    )


def _offline_miss(
    request: CompileRequest, call: CompileCall, cache: Cache, base_digest: str, why: str = ""
) -> OfflineMissError:
    if not why:
        mkey = manifest_key(base_digest)
        if any(read_variants(s, mkey) for s in cache.chain):
            why = (
                " (an entry for this call exists, built from other header contents: a "
                "header changed since it was built)"
            )
    user_dirs = tuple(os.path.abspath(os.fspath(d)) for d in call.include_dirs)
    return kernel_offline_error(
        request.name,
        ",".join(request.archs),
        name_expressions=request.name_expressions,
        defines=call.defines,
        options=tuple(call.options),
        include_dirs=user_dirs,
        backend=request.backend,
        output=request.output,
        why=why,
        bundles=tuple(getattr(b, "path", None) or repr(b) for b in cache.bundles),
        key=base_digest,
        fields=request.base_key().fields,
    )


def _lookup(
    cache: Cache,
    base: KeyBuilder,
    base_digest: str,
    result_type,
    started: float,
    request: CompileRequest,
):
    root = request.base_dir
    mkey = manifest_key(base_digest)
    entry = None
    # the writable chain, then each bundle: a manifest and its entry come from one place
    store = cache.store
    # a bundle's answer is one hit of the bundle, not a miss of the writable tiers before it
    with cache.counted_lookup() as answered:
        for where in cache.chain:
            found = match(read_variants(where, mkey), lambda p: real_path(p, root))
            if found is None:
                continue  # no manifest, or every header set it remembers has changed since
            variant, current, sigs = found
            final = _final_key(base, current)
            key = final.hexdigest()
            entry, tier = where.get_with_tier(key, kind="kernel")
            if entry is not None:
                if where is not store:
                    answered(entry, tier or "bundle")
                break
    if entry is None:
        return None
    probes = [real_path(p, root) for p in variant.probes]
    # "memory", "disk", "remote" (a shared tier; the entry is now in the local tiers too)
    # or "bundle" (a loaded bundle, served in place)
    source_of_result = "remote" if tier and tier.startswith("remote") else tier or "disk"
    cache.count(source_of_result + "_hits")
    meta = entry.meta
    result = request.result(
        result_type,
        binary=entry.payload,
        lowered_names=dict(meta.get("lowered_names", {})),
        log=meta.get("log", ""),
        key=entry.key,
        key_fields=final.fields,
        source_of_result=source_of_result,
        compile_seconds=float(meta.get("compile_seconds", 0.0)),
        lookup_seconds=time.perf_counter() - started,
        headers=tuple(real for real, _ in sigs),
    )
    _verbose_line(result, f"{source_of_result} hit")
    return result, sigs, probes


def _scan_headers(request: CompileRequest) -> tuple[list[str], list[str], str | None]:
    """The headers the compile will read (over-approximated), the paths whose later
    appearance would change what an include resolves to, and why the compile cannot be
    cached (None when it can).

    The include dirs and pre-included files are read from the final options exactly as
    the backend's compiler reads them, so ``-I`` in ``options``, ``--include-path=``,
    ``CUFORGE_EXTRA_OPTIONS`` and ``--pre-include`` all count."""
    includes = request.compiler.includes(request.options)
    # NVRTC looks for a string source's quoted includes next to its name, from the cwd
    here = request.source_dir or os.path.dirname(os.path.abspath(request.name))
    user_dirs = includes.dirs + includes.system_dirs
    scan = scan_includes(
        request.source,
        source_dir=here,
        include_dirs=user_dirs,
        system_dirs=toolkit_include_dirs(),
        pre_includes=includes.pre_includes,
        defines=includes.defines,
        refuse_special=True,  # a FIFO or device header would hang the compiler: an error
    )
    headers, probes = list(scan.headers), list(scan.probes)
    if scan.uncacheable:
        return headers, probes, f"{request.name}: {scan.uncacheable}"
    if scan.computed:
        # an #include MACRO the scan could not follow may name any file in the search
        # path: key every file there, and the absence of each one's would-be shadows
        listed = _all_files_under((here, *user_dirs), skip=request.cache_dir)
        if listed is None:
            return (
                headers,
                probes,
                (
                    f"{request.name} has a computed #include (#include MACRO) and its include "
                    f"directories hold over {MAX_FILES_FOR_COMPUTED_INCLUDES} files, so cuforge "
                    "cannot key every file it might read; it is compiled but not cached "
                    "(use literal #include names or narrower include dirs)"
                ),
            )
        files, shadows = listed
        headers.extend(h for h in files if h not in headers)
        probes.extend(p for p in shadows if p not in probes)
    return headers, probes, None


def _all_files_under(dirs: Sequence[str], skip: str) -> tuple[list[str], list[str]] | None:
    """Every file under ``dirs`` (searched in that order) but those under ``skip`` (the
    cache dir), and every path in an earlier dir that would shadow one of them if it
    appeared; None past :data:`MAX_FILES_FOR_COMPUTED_INCLUDES` files."""
    files: list[str] = []
    shadows: list[str] = []
    roots = list(dict.fromkeys(dirs))
    for i, root in enumerate(roots):
        for dirpath, subdirs, filenames in os.walk(root):
            subdirs[:] = [d for d in subdirs if os.path.join(dirpath, d) != skip]
            for f in filenames:
                path = os.path.join(dirpath, f)
                files.append(path)
                rel = os.path.relpath(path, root)
                shadows.extend(
                    p for p in (os.path.join(r, rel) for r in roots[:i]) if not os.path.lexists(p)
                )
            if len(files) > MAX_FILES_FOR_COMPUTED_INCLUDES:
                return None
    return files, shadows


def _digests(paths: Sequence[str]) -> tuple[dict[str, str], list[tuple[str, Any]]]:
    digests: dict[str, str] = {}
    sigs: list[tuple[str, Any]] = []
    for path in paths:
        sig = stat_signature(path)
        digest = file_digest(path) if sig is not None else None
        if digest is not None:
            digests[path] = digest
            sigs.append((path, sig))
    return digests, sigs


def _system_roots() -> list[str]:
    roots = [os.path.realpath(d) for d in toolkit_include_dirs()]
    root = toolkit_root()
    if root:
        roots.append(os.path.realpath(root))
    roots.extend(["/usr/include", "/usr/lib", "/usr/local/include"])
    return roots


def _user_dependencies(deps: Sequence[str]) -> list[str]:
    """nvcc's dependency list without toolkit and system headers (the toolchain identity covers those)."""
    roots = [r.rstrip(os.sep) + os.sep for r in _system_roots()]
    user = []
    for dep in deps:
        real = os.path.realpath(dep)
        if not any(real.startswith(r) for r in roots):
            user.append(os.path.abspath(dep))
    return user


def _compile_and_store(request, cache: Cache, base: KeyBuilder, base_digest, result_type, started):
    store = cache.store if cache.enabled else None
    probes: list[str] = []
    before: dict[str, str] = {}
    uncacheable = None
    if not request.compiler.reports_dependencies:
        paths, probes, uncacheable = _scan_headers(request)
        before, _ = _digests(paths)
    cache.count("compiles")
    arch = ",".join(request.archs)
    with spinner_after(f"cuforge: compiling {request.name} ({request.backend}, {arch})"):
        out = request.compile()
    if out.dependencies is not None:
        paths = _user_dependencies(out.dependencies)
    else:
        paths = list(before)
    headers, sigs = _digests(paths)
    stable = all(before.get(p, headers.get(p)) == headers.get(p) for p in headers)
    keyed = {keyed_path(p, request.base_dir): d for p, d in headers.items()}
    final = _final_key(base, keyed)
    key = final.hexdigest()
    result = request.result(
        result_type,
        binary=out.binary,
        lowered_names=dict(out.lowered_names),
        log=out.log,
        key=key,
        key_fields=final.fields,
        source_of_result="compiled",
        compile_seconds=out.seconds,
        lookup_seconds=time.perf_counter() - started - out.seconds,
        headers=tuple(headers),
    )
    if uncacheable is not None:
        stable = False  # nothing is remembered: not in the store, not in the call memo
        if store is not None:
            _warn(uncacheable)
    elif store is not None:
        if stable:
            meta = {
                "name": request.name,
                "arch": " ".join(request.archs),
                "backend": request.backend,
                "output": request.output,
                "lowered_names": result.lowered_names,
                "log": out.log,
                "compile_seconds": out.seconds,
                "key_fields": final.fields,
                "header_paths": list(headers),
            }
            store.put(Entry(key, "kernel", out.binary, meta))
            write_variant(
                store,
                manifest_key(base_digest),
                request.name,
                Variant(keyed, _keyed(probes, request.base_dir), key),
            )
            cache.record_build(request.name, key, final.fields)
        else:
            cache.record_build(request.name, key, final.fields, remember=False)
            _warn(
                f"{request.name}: a header changed while it compiled; the result is used but not cached"
            )
    _verbose_line(result, "compiled")
    return result, (sigs if stable else None), probes


def _verbose_line(result: Artifact, what: str) -> None:
    if not settings().verbose:
        return
    if what == "compiled":
        timing = f"in {result.compile_seconds:.3f} s"
    else:
        timing = (
            f"in {result.lookup_seconds * 1e3:.2f} ms (compile was {result.compile_seconds:.3f} s)"
        )
    arch = result.arch if isinstance(result.arch, str) else ",".join(result.arch)
    print(
        f"cuforge: {result.name} [{result.backend} {result.output} {arch}] {what} {timing} key {result.key[:12]}",
        file=sys.stderr,
    )


def _warn(message: str) -> None:
    import logging

    logging.getLogger("cuforge").warning(message)
