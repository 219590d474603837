"""``cute.compile`` with a persistent, shared cache: :func:`compile`, :func:`compile_cached`.

A miss calls the real ``cutlass.cute.compile``, exports the result with
``export_to_c(dir, symbol)`` and stores the object file (host launcher + cubin), its header
and a small JSON record as one ``"cute"`` entry through :mod:`cuforge.blobcache` (every tier:
memory, disk, remote; every ``CUFORGE_*`` knob; one build per key across processes). A hit
writes the stored, checksummed object to a fresh private temporary directory and returns
``cutlass.cute.runtime.load_module(path)[symbol]``: no tracing, no MLIR, no compiler.

The key (:func:`key_fields`) is made of:

* ``dsl``: :func:`cuforge.cute.version.dsl_version` (installed DSL wheels, the contents of
  the DSL's sources and libraries; no absolute path);
* ``arch``: the arch the DSL compiles for (``CUTE_DSL_ARCH``, else the device's);
* ``dsl_settings``: the DSL's own compile-affecting settings (``CUTE_DSL_*``: opt level,
  debug, line info, ...) with library paths reduced to their file names;
* ``options``: the ``options=`` string (and ``is_experimental``);
* ``function``: ``module.qualname`` and ``fingerprint``: :func:`cuforge.fingerprint.fingerprint`
  of the ``@cute.jit`` function -- its code, defaults, closure values and the globals it
  reads, recursively, so every ``@cute.jit`` / ``@cute.kernel`` function it reaches (and
  every constant and helper those read) is in it. The DSL rewrites a function's code when it
  first traces it; the fingerprint is always taken over the original code, so it is the
  same before and after a trace, in every process;
* ``args``: :func:`cuforge.cute.spec.describe_args` -- dtypes, memory spaces, alignment,
  static shapes and strides, which extents are dynamic (``SymInt``, ``mark_*_dynamic``) and
  ``Constexpr`` values; never data or addresses.

An argument (or a ``trace_finalize_hooks`` / ``options`` value) that cannot be keyed stably
makes the call compile *uncached*: the result says ``"uncached"`` with the reason, which is
also warned once and logged for ``cuforge cache explain``.

``verify="trace"`` also traces the function (no compile) and compares the traced module's
hash with the one recorded when the entry was built; a mismatch means the fast key missed
something: the entry is reported, deleted and rebuilt (the result is then ``"compiled"``).
The hash compared is the DSL's module hash recipe (MLIR bytecode + DSL version digest +
compile settings + compile options) with absolute library paths reduced to file names, so
it agrees across virtual environments; the DSL's own ``get_module_hash`` value is recorded
too (``dsl_module_hash``).

In-process memo: a second call with the same key returns the same loaded function from a
dictionary (the key is still computed: a changed global or closure value is seen).

Layer 5; imports the DSL only when called.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import threading
import types
from typing import TYPE_CHECKING

from cuforge import blobcache, fingerprint
from cuforge._fs import read_bytes
from cuforge.caching import Cache, resolve
from cuforge.cute.spec import UnkeyableArgument, describe_args
from cuforge.cute.version import dsl_version
from cuforge.fingerprint import UNHANDLED, UnstableKeyError

if TYPE_CHECKING:  # pragma: no cover
    from typing import Any

__all__ = [
    "CuteResult",
    "StaleEntryError",
    "compile",
    "compile_cached",
    "key_fields",
    "clear_memo",
    "counters",
]

KIND = "cute"
#: Bump when what is stored or what the fields mean changes: every old key then misses.
FORMAT = "1"
_OBJECT = "object.o"
_HEADER = "header.h"
_RECORD = "record.json"

#: this process's counts: "compile" (real cute.compile calls), "load" (load_module calls),
#: "trace" (verify traces), "memo" (in-process memo hits)
counters: dict[str, int] = {"compile": 0, "load": 0, "trace": 0, "memo": 0}

# the loaded functions live in each cache's memo "cute": key -> (function, record)
# one cuforge.cute compile at a time in a process: the DSL's tracing state is global
_LOCK = threading.RLock()


class StaleEntryError(Exception):
    """``verify="trace"`` found that a stored entry was built from a different module."""


class CuteResult:
    """What :func:`compile_cached` returns.

    * ``value``: the ready JIT function (what ``cute.compile`` returns, or what
      ``load_module(...)[symbol]`` restores);
    * ``source_of_result``: ``"memo"`` (this process's memo), ``"memory"`` / ``"disk"`` /
      ``"remote"`` (a hit in that store tier), ``"compiled"`` or ``"uncached"``;
    * ``key``, ``fields``: the key and its labeled fields; ``reason``: why it is not cached;
    * ``verified``: True when ``verify="trace"`` checked a hit, else None;
    * ``trace_hash`` / ``dsl_module_hash``: recorded at build time (None when uncached).
    """

    __slots__ = (
        "value",
        "source_of_result",
        "key",
        "fields",
        "reason",
        "verified",
        "trace_hash",
        "dsl_module_hash",
    )

    def __init__(
        self,
        value: Any,
        source: str,
        key: str,
        fields: dict[str, str],
        reason: str | None = None,
        verified: bool | None = None,
        record: dict | None = None,
    ) -> None:
        self.value = value
        self.source_of_result = source
        self.key = key
        self.fields = fields
        self.reason = reason
        self.verified = verified
        record = record or {}
        self.trace_hash = record.get("trace_hash")
        self.dsl_module_hash = record.get("dsl_module_hash")

    @property
    def hit(self) -> bool:
        """Whether no compile ran for this call."""
        return self.source_of_result in ("memo", "memory", "disk", "remote", "bundle")

    def __repr__(self) -> str:
        why = f", reason={self.reason!r}" if self.reason else ""
        return f"CuteResult({self.source_of_result}, key={self.key[:12]}{why})"


def clear_memo(cache: Cache | None = None) -> None:
    """Forget the functions loaded through ``cache`` (default: the default cache); the
    store keeps its entries."""
    with _LOCK:
        resolve(cache).memo("cute").clear()


# --------------------------------------------------------------------------- the key


def _dsl_of(inner: Any) -> Any:
    from cutlass.base_dsl.dsl import BaseDSL

    BaseDSL._lazy_initialize_dsl(inner)
    dsl = getattr(inner, "_dsl_object", None)
    if dsl is None:
        from cutlass.cutlass_dsl import CuTeDSL

        dsl = CuTeDSL._get_dsl()
    return dsl


def _portable_settings(text: str) -> str:
    """The DSL's ``cache_key_str()`` with absolute paths reduced to file names."""
    out = []
    for item in text.split(";"):
        if not item:
            continue
        name, sep, value = item.partition("=")
        raw = value.strip("'\"")
        if raw.startswith(os.sep) or (len(raw) > 2 and raw[1] == ":"):
            value = repr(":".join(os.path.basename(p) for p in raw.split(os.pathsep)))
        out.append(f"{name}{sep}{value};")
    return "".join(out)


def _unwrap(fn: Any) -> Any:
    """The ``@cute.jit`` function under ``fn``'s wrappers (``fn`` when there are none)."""
    inner = fn
    seen = 0
    while hasattr(inner, "__wrapped__") and seen < 100:
        inner = inner.__wrapped__
        seen += 1
    return inner


def _original_code_hook() -> Any:
    """A :func:`cuforge.fingerprint.fingerprint` hook that hashes every ``@cute.jit`` /
    ``@cute.kernel`` function as its *original* code.

    The DSL replaces such a function's ``__code__`` with a rewritten one the first time it
    traces it (keeping the original as ``_original_code``), so hashing ``__code__`` would
    give one key before the first trace and another after it. The hook answers for every
    DSL-decorated function (before and after a trace alike) with a stand-in function built
    from the original code and the same globals, closure and defaults; the user's function
    is never modified. One stand-in per function per fingerprint, so cycles (a kernel
    reaching itself through its globals) end as for any function."""

    stand_ins: dict[int, tuple[Any, Any]] = {}

    def hook(obj: Any) -> Any:
        if type(obj) is not types.FunctionType:
            return UNHANDLED
        attrs = obj.__dict__
        if "_decorator_kind" not in attrs and "_original_code" not in attrs:
            return UNHANDLED
        found = stand_ins.get(id(obj))
        if found is not None:
            return found[1]
        code = attrs.get("_original_code")
        if not isinstance(code, types.CodeType):
            code = obj.__code__
        stand_in = types.FunctionType(
            code, obj.__globals__, obj.__name__, obj.__defaults__, obj.__closure__
        )
        stand_in.__kwdefaults__ = obj.__kwdefaults__
        stand_in.__qualname__ = obj.__qualname__
        stand_in.__module__ = obj.__module__
        stand_ins[id(obj)] = (obj, stand_in)  # keeps obj alive: its id stays unique
        return stand_in

    return hook


def _options_field(options: Any, extra: dict) -> str:
    """The ``options=`` value as key text; raises the spec module's UnkeyableArgument."""

    if options is None or options == "":
        text = ""
    elif isinstance(options, str):
        text = " ".join(options.split())
    else:
        raise UnkeyableArgument(
            "options", f"a {type(options).__name__}; cuforge keys the options= string form only"
        )
    for k in sorted(extra):
        text += f" |{k}={extra[k]!r}"
    return text


def key_fields(fn: Any, *args: Any, **kwargs: Any) -> dict[str, str]:
    """The labeled fields of the key of ``cute.compile(fn, *args, **kwargs)`` (see the module
    doc). Raises :class:`cuforge.cute.spec.UnkeyableArgument` or
    :class:`cuforge.fingerprint.UnstableKeyError` when something cannot be keyed stably."""
    with _LOCK:
        fields, _ = _key_fields(fn, args, dict(kwargs))
    return fields


def _split_kwargs(kwargs: dict) -> tuple[dict, Any, dict, Any]:
    """``(function kwargs, options, extra compile kwargs to key, trace hooks)``."""
    kwargs = dict(kwargs)
    options = kwargs.pop("options", None)
    hooks = kwargs.pop("trace_finalize_hooks", None)
    extra = {}
    if "is_experimental" in kwargs:
        extra["is_experimental"] = bool(kwargs.pop("is_experimental"))
    return kwargs, options, extra, hooks


def _teach_fingerprint() -> None:
    """Register the DSL's stream types with the fingerprint (once per process).

    A stream is a runtime handle (a default argument such as the examples'
    ``stream=cuda.CUstream(...)``): its value never changes the generated code, and it is an
    address, so it is keyed by its type alone."""
    global _taught
    if _taught:
        return

    from cutlass.runtime import _FakeStream

    stream_types = [_FakeStream]
    driver = sys.modules.get("cuda.bindings.driver")
    if driver is not None and isinstance(getattr(driver, "CUstream", None), type):
        stream_types.append(driver.CUstream)
    for cls in stream_types:
        fingerprint.register(cls, _stream_type)
    _taught = True


_taught = False


def _stream_type(stream: Any) -> str:
    cls = type(stream)
    return f"stream:{cls.__module__}.{cls.__qualname__}"


def _key_fields(fn: Any, args: tuple, kwargs: dict) -> tuple[dict[str, str], dict]:
    if type(fn) is not types.FunctionType:
        raise UnkeyableArgument(
            "fn",
            f"a {type(fn).__name__}; cuforge keys plain @cute.jit functions (pass the function, "
            "and the instance as its first argument, instead of a bound method or callable object)",
        )
    inner = _unwrap(fn)
    if not hasattr(inner, "_dsl_object") and not hasattr(inner, "_dsl_cls"):
        raise UnkeyableArgument("fn", f"{fn.__qualname__} is not decorated with @cute.jit")
    fkwargs, options, extra, hooks = _split_kwargs(kwargs)
    _teach_fingerprint()
    dsl = _dsl_of(inner)
    fields = {
        "format": FORMAT,
        "python": f"{sys.version_info[0]}.{sys.version_info[1]}",
        "function": f"{getattr(fn, '__module__', '?')}.{fn.__qualname__}",
        "dsl": dsl_version(),
        "arch": str(dsl.envar.arch),
        "dsl_settings": _portable_settings(dsl.envar.cache_key_str()),
        "options": _options_field(options, extra),
    }
    fields["fingerprint"] = fingerprint.fingerprint(
        fn, what=f"@cute.jit function {fn.__qualname__}", hook=_original_code_hook()
    )
    if hooks is not None:
        fields["trace_finalize_hooks"] = fingerprint.fingerprint(hooks, what="trace_finalize_hooks")
    fields["args"] = describe_args(inner, tuple(args), fkwargs)
    return fields, {"options": options, "extra": extra, "hooks": hooks, "fkwargs": fkwargs}


# --------------------------------------------------------------------------- build / load


def _symbol_for(key: str) -> str:
    return "cuforge_cute_" + key[:24]


def _trace_hashes(owner: Any, module: Any, function_name: str) -> tuple[str, str]:
    """``(portable trace hash, the DSL's own module hash)`` of a traced module."""

    # the module as text without locations: the bytecode the DSL hashes carries source file
    # paths, so the same code in another checkout would hash differently
    text = module.operation.get_asm(enable_debug_info=False)
    if isinstance(text, str):
        text = text.encode("utf-8")
    h = hashlib.sha256(b"cuforge-cute-trace 1\n")
    h.update(owner.get_version().digest())
    h.update(text)
    h.update(_portable_settings(owner.envar.cache_key_str()).encode())
    h.update(owner.compile_options.to_str().encode())
    return h.hexdigest(), owner.get_module_hash(module, function_name)


def _hooks_with(user_hooks: Any, mine: Any) -> list:
    if user_hooks is None:
        return [mine]
    if callable(user_hooks):
        return [user_hooks, mine]
    return [*list(user_hooks), mine]


def _trace(fn: Any, args: tuple, fkwargs: dict, info: dict) -> tuple[str, str]:
    """Trace ``fn`` (no compile) and return its hashes (see :func:`_trace_hashes`)."""
    import cutlass.cute as cute

    found: list[tuple[str, str]] = []

    def hook(owner: Any, module: Any, function_name: str) -> None:
        found.append(_trace_hashes(owner, module, function_name))

    kw = dict(fkwargs)
    if info["options"] is not None:
        kw["options"] = info["options"]
    kw.update(info["extra"])
    kw["trace_finalize_hooks"] = _hooks_with(info["hooks"], hook)
    counters["trace"] += 1
    cute.compile.to_precompiled_mlir(fn, *args, **kw)
    if not found:
        raise StaleEntryError("tracing produced no module to hash (the DSL did not call the hook)")
    return found[-1]


def _read_regular(path: str) -> bytes:
    return read_bytes(path)


def _build(fn: Any, args: tuple, info: dict, symbol: str, state: dict) -> dict[str, bytes]:
    import cutlass.cute as cute

    found: list[tuple[str, str]] = []

    def hook(owner: Any, module: Any, function_name: str) -> None:
        found.append(_trace_hashes(owner, module, function_name))

    kw = dict(info["fkwargs"])
    if info["options"] is not None:
        kw["options"] = info["options"]
    kw.update(info["extra"])
    kw["trace_finalize_hooks"] = _hooks_with(info["hooks"], hook)
    counters["compile"] += 1
    compiled = cute.compile(fn, *args, **kw)
    state["compiled"] = compiled
    if not found:
        raise RuntimeError(
            "cute.compile did not run cuforge's trace hook, so the entry cannot be verified "
            "later; this DSL version is not supported by cuforge.cute"
        )
    tmp = tempfile.mkdtemp(prefix="cuforge-cute-")
    try:
        try:
            compiled.export_to_c(tmp, symbol, symbol)
        except NotImplementedError as exc:
            state["not_exportable"] = f"the compiled function cannot be exported ({exc})"
            raise _NotExportable(state["not_exportable"]) from exc
        obj = _read_regular(os.path.join(tmp, symbol + ".o"))
        header = _read_regular(os.path.join(tmp, symbol + ".h"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    record = {
        "symbol": symbol,
        "function_name": str(getattr(compiled, "function_name", "")),
        "trace_hash": found[-1][0],
        "dsl_module_hash": found[-1][1],
    }
    state["record"] = record
    return {_OBJECT: obj, _HEADER: header, _RECORD: json.dumps(record, sort_keys=True).encode()}


class _NotExportable(Exception):
    pass


def _parse_record(files: dict, symbol: str) -> dict:
    for name in (_OBJECT, _RECORD):
        if name not in files:
            raise ValueError(f"the entry has no {name}")
    record = json.loads(files[_RECORD].decode("utf-8"))
    if not isinstance(record, dict) or record.get("symbol") != symbol:
        raise ValueError(
            f"the entry's record names symbol {record.get('symbol')!r}, expected {symbol!r}"
        )
    for field in ("trace_hash", "dsl_module_hash", "function_name"):
        if not isinstance(record.get(field), str):
            raise ValueError(f"the entry's record has no {field}")
    return record


def _load_object(obj: bytes, symbol: str) -> Any:
    """Write ``obj`` to a fresh private directory and load it (the DSL reads it at once)."""

    from cutlass.cute.runtime import load_module

    tmp = tempfile.mkdtemp(prefix="cuforge-cute-")  # 0700, created by us: nothing to follow
    try:
        path = os.path.join(tmp, symbol + ".o")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            view = memoryview(obj)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        counters["load"] += 1
        return load_module(path)[symbol]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --------------------------------------------------------------------------- public


def compile(
    fn: Any, *args: Any, verify: str | None = None, cache: Cache | None = None, **kwargs: Any
) -> Any:
    """Drop-in for ``cutlass.cute.compile(fn, *args, **kwargs)``, cached (see the module doc).

    ``verify="trace"``: also trace and treat a hit whose traced module differs from the one
    it was built from as a miss. ``cache``: the :class:`cuforge.Cache` (default:
    :func:`cuforge.default_cache`). Returns the ready JIT function."""
    return compile_cached(fn, *args, verify=verify, cache=cache, **kwargs).value


def compile_cached(
    fn: Any, *args: Any, verify: str | None = None, cache: Cache | None = None, **kwargs: Any
) -> CuteResult:
    """Like :func:`compile`, but returns a :class:`CuteResult` saying where the function came
    from and why it is not cached, when it is not."""
    if verify not in (None, "trace"):
        raise ValueError(f"verify={verify!r}: expected None or 'trace'")
    cache = resolve(cache)
    loaded = cache.memo("cute")  # key -> (function, record)

    with _LOCK:
        name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"
        reason = None
        try:
            fields, info = _key_fields(fn, args, dict(kwargs))
        except (UnkeyableArgument, UnstableKeyError) as exc:
            reason = str(exc)
            fields = {"format": FORMAT, "function": name, "unkeyable": reason}
            fkwargs, options, extra, hooks = _split_kwargs(kwargs)
            info = {"options": options, "extra": extra, "hooks": hooks, "fkwargs": fkwargs}
        key, _recorded = blobcache.make_key(KIND, fields)
        symbol = _symbol_for(key)
        if reason is None and verify is None:
            memo = loaded.get(key)
            if memo is not None:
                counters["memo"] += 1
                return CuteResult(memo[0], "memo", key, fields, record=memo[1])
        state: dict = {}
        checked: list[bool] = []

        def build() -> dict[str, bytes]:
            return _build(fn, args, info, symbol, state)

        def load(files: Any) -> tuple[Any, dict]:
            if "compiled" in state:  # built in this call: the function is in hand
                return state["compiled"], state.get("record", {})
            record = _parse_record(dict(files), symbol)
            if verify == "trace":
                traced, _ = _trace(fn, args, info["fkwargs"], info)
                if traced != record["trace_hash"]:
                    raise StaleEntryError(
                        f"verify='trace': the traced module of {name} has hash {traced[:16]}, "
                        f"the entry was built from {record['trace_hash'][:16]}: the cache key "
                        "missed a change (please report it); the entry is rebuilt"
                    )
                checked.append(True)
            return _load_object(files[_OBJECT], symbol), record

        try:
            res = blobcache.get_or_build(
                KIND,
                name,
                fields,
                build,
                load,
                uncacheable=reason,
                meta={"symbol": symbol},
                cache=cache,
            )
        except _NotExportable:
            why = state.get("not_exportable", "not exportable")
            return CuteResult(state["compiled"], "uncached", key, fields, reason=why)
        value, record = res.value
        if res.source_of_result != "uncached" and cache.enabled:
            loaded[key] = (value, record)
        return CuteResult(
            value,
            res.source_of_result,
            res.key,
            res.fields,
            reason=res.reason,
            verified=True if checked else None,
            record=record,
        )
