"""The cached-compile pipeline: joins the key, the store and the bare compilers.

``compile_cached()`` never builds the same thing twice and never serves a stale result.
How a call is answered, fastest first:

1. **This process asked before** (the call memo). The call's arguments and the settings
   snapshot find the earlier result; its headers are re-checked with one ``stat`` each
   (and include paths that did not exist must still not exist). ~1 microsecond.
2. **Direct mode** (as ccache): a *base key* of source + options + arch + toolchain +
   allow-listed env finds the *manifest* of the last compile: the user headers it read,
   by path. Their content digests (memoized by stat) complete the *final key*, which
   finds the entry in the store (memory tier, then disk). No preprocessor, no compiler,
   no CUDA bindings imported.
3. **Compile** under a single-flight lock on the base key (threads and processes), so a
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
from collections.abc import Mapping, Sequence

# The tiers default_store() builds, loaded with this module so the first lookup pays no import.
import cuforge.store.disk  # noqa: F401
import cuforge.store.memory  # noqa: F401
import cuforge.store.tiered  # noqa: F401
from cuforge.compiler.nvcc import compile_nvcc, nvcc_command
from cuforge.compiler.nvrtc import compile_nvrtc, nvrtc_options
from cuforge.compiler.outputs import BACKENDS, OUTPUT_KINDS, Artifact, CompileOutput
from cuforge.config import Settings, result_environment, settings
from cuforge.deps import file_digest, scan_includes, settled, stat_signature
from cuforge.key import KeyBuilder, text_digest
from cuforge.store import default_store, lock_dir
from cuforge.store.base import Entry
from cuforge.store.single_flight import single_flight
from cuforge.toolchain import compiler_identity, resolve_archs, toolkit_include_dirs, toolkit_root

TYPE_CHECKING = False  # typing costs ~15 ms to import; annotations are strings here
if TYPE_CHECKING:
    from typing import Any


__all__ = ["compile_cached", "counters", "reset_memo", "CompileRequest"]

#: What this process did, for tests and ``CUFORGE_VERBOSE``: compiles run, hits per tier.
counters: dict[str, int] = {"compiles": 0, "memory_hits": 0, "disk_hits": 0, "call_memo_hits": 0}

# call memo: request tuple -> (artifact answering "memory", [(path, stat sig)], [absent paths])
_memo: dict[tuple, tuple[Artifact, list[tuple[str, Any]], list[str]]] = {}
_memo_bytes = 0

#: Files a computed ``#include MACRO`` might reach are keyed by listing whole include
#: directories; past this many files cuforge refuses to cache rather than guess.
MAX_FILES_FOR_COMPUTED_INCLUDES = 2000


def reset_memo() -> None:
    """Forget this process's call memo (the memory tier of the store is separate)."""
    global _memo_bytes
    _memo.clear()
    _memo_bytes = 0


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
        self.compiler_options = self._compiler_options()

    def _compiler_options(self) -> tuple[str, ...]:
        if self.backend == "nvrtc":
            return tuple(nvrtc_options(self.options, self.archs[0], self.output))
        return tuple(nvcc_command(self.options, self.archs, self.output))

    def base_key(self) -> KeyBuilder:
        """Every input but the headers' contents."""
        kb = KeyBuilder("kernel")
        kb.text("name", self.name)
        kb.text("source", self.source)
        kb.text("backend", self.backend)
        kb.text("output", self.output)
        kb.text("arch", " ".join(self.archs))
        kb.items("options", self.compiler_options)
        kb.items("name_expressions", self.name_expressions)
        if self.headers:
            kb.mapping("inline_headers", {k: text_digest(v) for k, v in self.headers.items()})
        kb.mapping("compiler", compiler_identity(self.backend))
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
        if self.backend == "nvrtc":
            return compile_nvrtc(
                self.source,
                name=self.name,
                options=self.options,
                arch=self.archs[0],
                output=self.output,
                name_expressions=self.name_expressions,
                headers=self.headers,
            )
        return compile_nvcc(
            self.source,
            name=self.name,
            options=self.options,
            archs=self.archs,
            output=self.output,
            name_expressions=self.name_expressions,
        )


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
) -> Artifact:
    """Compile ``source`` or fetch the result of an identical earlier compile.

    See :func:`cuforge.compile` for the arguments. Returns ``result_type`` (an
    :class:`Artifact` or subclass) whose ``source_of_result`` says where it came from.
    """
    # The hot path: an identical call answered from the call memo. Everything here is
    # cheap on purpose (no settings object, no key hashing): ~1 us plus a stat per header.
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
        result_environment(),
    )
    memo = _memo.get(memo_key)
    if memo is not None and ((not memo[1] and not memo[2]) or _still_valid(memo[1], memo[2])):
        counters["call_memo_hits"] += 1
        return memo[0]
    cfg = settings()
    started = time.perf_counter()
    request = _normalize(
        source,
        name,
        options,
        include_dirs,
        defines,
        arch,
        backend,
        output,
        name_expressions,
        source_dir,
        headers,
        cfg,
    )
    result, header_sigs, probes = _lookup_or_compile(request, cfg, result_type, started)
    if (
        not cfg.disable_cache
        and header_sigs is not None
        and all(settled(sig) for _, sig in header_sigs)
    ):
        # a header edited in the last seconds may change again within one timestamp tick:
        # such calls take the (digest-checking) store path until the header settles
        _remember_call(memo_key, result, header_sigs, probes, cfg)
    return result


def _still_valid(header_sigs: list[tuple[str, Any]], probes: list[str]) -> bool:
    for path, sig in header_sigs:
        if stat_signature(path) != sig:
            return False
    for path in probes:
        if os.path.exists(path):
            return False
    return True


def _remember_call(memo_key: tuple, result: Artifact, header_sigs, probes, cfg: Settings) -> None:
    global _memo_bytes
    size = len(result.binary or b"")
    while _memo and _memo_bytes + size > cfg.memory_max_bytes:
        oldest = next(iter(_memo))
        _memo_bytes -= len(_memo.pop(oldest)[0].binary or b"")
    old = _memo.pop(memo_key, None)
    if old is not None:
        _memo_bytes -= len(old[0].binary or b"")
    _memo[memo_key] = (result.with_source("memory"), header_sigs, probes)
    _memo_bytes += size


def _normalize(
    source,
    name,
    options,
    include_dirs,
    defines,
    arch,
    backend,
    output,
    name_expressions,
    source_dir,
    headers,
    cfg,
) -> CompileRequest:
    if not isinstance(source, str):
        raise TypeError(f"source must be str (CUDA C++ text), not {type(source).__name__}")
    if not source.strip():
        raise ValueError(f"{name}: the source is empty; pass CUDA C++ text (or use compile_file)")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
    if output not in OUTPUT_KINDS:
        raise ValueError(f"output must be one of {', '.join(OUTPUT_KINDS)}, not {output!r}")
    if isinstance(options, str):
        raise TypeError(
            "options must be a sequence of strings, e.g. ('-std=c++17',), not one string"
        )
    archs = resolve_archs(arch, allow_many=(output == "fatbin"))
    if output == "fatbin" and backend != "nvcc":
        raise ValueError("output='fatbin' needs backend='nvcc' (NVRTC builds one arch at a time)")
    if len(archs) > 1 and output != "fatbin":
        raise ValueError(
            f"{len(archs)} archs given ({', '.join(archs)}): use output='fatbin' with backend='nvcc'"
        )
    if headers and backend != "nvrtc":
        raise ValueError("in-memory headers= are supported by backend='nvrtc' only")
    dirs = []
    if source_dir is not None:
        dirs.append(os.path.abspath(source_dir))
    dirs.extend(os.path.abspath(os.fspath(d)) for d in include_dirs)
    expanded = list(options) + list(cfg.extra_options)
    for key, value in (defines or {}).items():
        expanded.append(f"-D{key}" if value is None else f"-D{key}={_define_value(value)}")
    expanded.extend(f"-I{d}" for d in dirs)
    return CompileRequest(
        source,
        name=name,
        backend=backend,
        output=output,
        archs=archs,
        options=tuple(expanded),
        name_expressions=tuple(name_expressions),
        include_dirs=tuple(dirs),
        source_dir=os.path.abspath(source_dir) if source_dir else None,
        headers=headers,
    )


def _define_value(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def _manifest_key(base_digest: str) -> str:
    return KeyBuilder("manifest").text("base", base_digest).hexdigest()


def _final_key(base: KeyBuilder, headers: dict[str, str]) -> KeyBuilder:
    final = base.copy()
    final.mapping("headers", headers)
    return final


def _lookup_or_compile(request: CompileRequest, cfg: Settings, result_type, started: float):
    store = None if cfg.disable_cache else default_store()
    base = request.base_key()
    base_digest = base.hexdigest()
    if store is not None:
        hit = _lookup(store, base, base_digest, result_type, started, request)
        if hit is not None:
            return hit
        with single_flight(lock_dir(), base_digest, cfg.lock_timeout):
            # another thread or process may have compiled it while we waited
            hit = _lookup(store, base, base_digest, result_type, started, request)
            if hit is not None:
                return hit
            return _compile_and_store(request, cfg, store, base, base_digest, result_type, started)
    return _compile_and_store(request, cfg, None, base, base_digest, result_type, started)


def _get(store, key: str) -> tuple[Entry | None, str | None]:
    getter = getattr(store, "get_with_tier", None)
    if getter is not None:
        return getter(key)
    entry = store.get(key)
    return entry, (store.tier if entry is not None else None)


def _lookup(
    store, base: KeyBuilder, base_digest: str, result_type, started: float, request: CompileRequest
):
    manifest, _ = _get(store, _manifest_key(base_digest))
    if manifest is None:
        return None
    recorded: dict[str, str] = manifest.meta.get("headers", {})
    probes: list[str] = manifest.meta.get("probes", [])
    if any(os.path.exists(p) for p in probes):
        return None  # a header would now resolve to a different file
    current, sigs = _digests(recorded)
    if len(current) != len(recorded):
        return None  # a header the last compile read is gone
    final = _final_key(base, current)
    key = final.hexdigest()
    entry, tier = _get(store, key)
    if entry is None:
        return None
    source_of_result = "memory" if tier == "memory" else "disk"
    counters["memory_hits" if source_of_result == "memory" else "disk_hits"] += 1
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
        headers=tuple(meta.get("header_paths", ())),
    )
    _verbose_line(result, f"{source_of_result} hit")
    return result, sigs, probes


def _scan_headers(request: CompileRequest) -> tuple[list[str], list[str]]:
    """Headers the NVRTC compile will read (over-approximated), and paths whose later
    appearance would change what an include resolves to."""
    scan = scan_includes(
        request.source,
        source_dir=request.source_dir,
        include_dirs=request.include_dirs,
        system_dirs=toolkit_include_dirs(),
    )
    headers = list(scan.headers)
    if scan.computed:
        headers.extend(_all_files_under(request.include_dirs, request.name))
    return headers, list(scan.probes)


def _all_files_under(dirs: Sequence[str], name: str) -> list[str]:
    files: list[str] = []
    for root in dirs:
        for dirpath, _, filenames in os.walk(root):
            files.extend(os.path.join(dirpath, f) for f in filenames)
            if len(files) > MAX_FILES_FOR_COMPUTED_INCLUDES:
                raise ValueError(
                    f"{name} has a computed #include (#include MACRO) and its include directories hold over "
                    f"{MAX_FILES_FOR_COMPUTED_INCLUDES} files; cuforge cannot key it safely. Use literal "
                    "#include names, narrower include_dirs, or CUFORGE_DISABLE_CACHE=1."
                )
    return files


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


def _compile_and_store(
    request, cfg: Settings, store, base: KeyBuilder, base_digest, result_type, started
):
    cache_dir = None if (store is None or cfg.disable_file_cache) else cfg.cache_dir
    probes: list[str] = []
    before: dict[str, str] = {}
    if request.backend == "nvrtc":
        paths, probes = _scan_headers(request)
        before, _ = _digests(paths)
    counters["compiles"] += 1
    out = request.compile()
    if out.dependencies is not None:
        paths = _user_dependencies(out.dependencies)
    else:
        paths = list(before)
    headers, sigs = _digests(paths)
    stable = all(before.get(p, headers.get(p)) == headers.get(p) for p in headers)
    final = _final_key(base, headers)
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
    if store is not None:
        from cuforge import explain as _explain  # json + re: only on the compile path

        reasons = _explain.explain(cache_dir, request.name, final.fields)
        if reasons:
            _explain.log_miss(cache_dir, request.name, key, reasons)
            if cfg.explain:
                print(f"cuforge: miss for {request.name}: " + "; ".join(reasons), file=sys.stderr)
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
            store.put(
                Entry(
                    _manifest_key(base_digest),
                    "manifest",
                    b"",
                    {"name": request.name, "headers": headers, "probes": probes, "for": key},
                )
            )
            _explain.remember(cache_dir, request.name, key, final.fields)
        else:
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
