"""``cute.compile`` with a persistent, shared cache: :func:`compile`, :func:`compile_cached`.

A miss calls the real ``cutlass.cute.compile``, exports the result with
``export_to_c(dir, symbol)`` and stores the object file (host launcher + cubin), its header
and a small JSON record as one ``"cute"`` entry through :mod:`cuforge.core.blobcache` (every tier:
memory, disk, remote; every ``CUFORGE_*`` knob; one build per key across processes). A hit
hands the stored, checksummed object to ``cutlass.cute.runtime.load_module(path)[symbol]``
as an in-memory file (Linux; elsewhere a fresh private temporary directory): no tracing, no
MLIR, no compiler.

The key (:func:`key_fields`) is made of:

* ``dsl``: :func:`cuforge.cute.version.dsl_version` (installed DSL wheels, the contents of
  the DSL's sources and libraries; no absolute path);
* ``arch``: the arch the DSL compiles for (``CUTE_DSL_ARCH``, else the device's);
* ``dsl_settings``: the DSL's own compile-affecting settings (``CUTE_DSL_*``: opt level,
  debug, line info, ...) with library paths reduced to their file names;
* ``options``: the ``options=`` string (and ``is_experimental``);
* ``function``: ``module.qualname`` and ``fingerprint``: :func:`cuforge.keys.fingerprint.fingerprint`
  of the ``@cute.jit`` function -- its code, defaults, closure values and the globals it
  reads, recursively, so every ``@cute.jit`` / ``@cute.kernel`` function it reaches (and
  every constant and helper those read) is in it. The DSL rewrites a function's code when it
  first traces it; the fingerprint is always taken over the original code, so it is the
  same before and after a trace, in every process;
* ``args``: :func:`cuforge.cute.spec.describe_args` -- dtypes, memory spaces, alignment,
  static shapes and strides, which extents are dynamic (``SymInt``, ``mark_*_dynamic``) and
  ``Constexpr`` values; never data or addresses.

Two keys, in order (``CuteResult.served_by``). The key above is made *before tracing*
(``"pretrace"``: a hit traces nothing). When its fingerprint or an argument's spec cannot be
made stable, the call falls back to the key of its *traced module* (``"ir"``, as the DSL's
own cache keys: the module's hash without locations with the DSL's version digest, its
codegen settings and compile options, plus the fields above that are not the fingerprint or
the argument specs, and the function's parameters): it traces (``to_precompiled_mlir``), and
a hit loads the stored object without compiling. The miss compiles (tracing again) and
stores only when both traces agree. A call neither key covers (not a ``@cute.jit`` function,
a file-dump option, an export that fails, a trace that is not deterministic) compiles
*uncached*: the result says ``"uncached"`` with the reason, which is also logged for
``cuforge cache explain``. Each is warned once per kernel with what to do, and counted
(:meth:`cuforge.Cache.count_served`; ``cuforge cache stats``).

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

from cuforge.base._fs import read_bytes
from cuforge.core import blobcache
from cuforge.core.caching import Cache, resolve
from cuforge.cute.spec import UnkeyableArgument, describe_args
from cuforge.cute.version import dsl_version
from cuforge.keys import fingerprint
from cuforge.keys.fingerprint import UNHANDLED, UnstableKeyError

if TYPE_CHECKING:  # pragma: no cover
    from typing import Any

__all__ = [
    "CachedCompile",
    "CuteResult",
    "StaleEntryError",
    "compile",
    "compile_cached",
    "key_fields",
    "clear_memo",
    "counters",
    "disable",
    "enable",
    "enabled",
    "real_compile",
]

KIND = "cute"
#: Bump when what is stored or what the fields mean changes: every old key then misses.
FORMAT = "1"
_OBJECT = "object.o"
_HEADER = "header.h"
_RECORD = "record.json"
_ARTIFACT = "artifact."

#: this process's counts: "compile" (real cute.compile calls), "load" (load_module calls),
#: "trace" (verify traces and IR-key traces), "memo" (in-process memo hits); and per call, the
#: key that served it: "pretrace", "ir" (traced, keyed by the module), "uncached"
counters: dict[str, int] = {
    "compile": 0,
    "load": 0,
    "trace": 0,
    "memo": 0,
    "pretrace": 0,
    "ir": 0,
    "uncached": 0,
}

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
    * ``key``, ``fields``: the key and its labeled fields; ``reason``: why it is not cached
      (``served_by == "ir"``: why the pre-trace key could not be made);
    * ``verified``: True when ``verify="trace"`` checked a hit, else None;
    * ``trace_hash`` / ``dsl_module_hash``: recorded at build time (None when uncached);
    * ``served_by``: which key covered the call: ``"pretrace"`` (the key made before
      tracing: no trace, no compile on a hit), ``"ir"`` (the pre-trace key was blocked: the
      key of the traced module, a trace but no compile on a hit) or ``"uncached"``.
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
        "served_by",
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
        #: which key covered the call: "pretrace" (made before tracing: no trace), "ir" (the
        #: traced module's: a trace, no compile when cached) or "uncached" (neither)
        self.served_by = "uncached" if source == "uncached" else None

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
    """A :func:`cuforge.keys.fingerprint.fingerprint` hook that hashes every ``@cute.jit`` /
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


_FILE_DUMP_HINT = "a cache hit would not write the files it asks for"


def _option_text(option: Any, where: str) -> str:
    """One ``CompileOption`` (object, option class, or a tuple of them) as key text: its
    class and its values (:func:`cuforge.keys.fingerprint.fingerprint` of its attributes)."""
    from cutlass.base_dsl.compiler import (
        BooleanBasedFileDumpOption,
        BooleanCompileOption,
        CompileOption,
    )

    if isinstance(option, tuple):
        return "(" + ",".join(_option_text(o, f"{where}[{i}]") for i, o in enumerate(option)) + ")"
    if isinstance(option, type) and issubclass(option, BooleanCompileOption):
        option = option(True)  # what the DSL does with a bare boolean option class
    if not isinstance(option, CompileOption):
        raise UnkeyableArgument(
            where,
            f"a {type(option).__name__}; cuforge keys an options string or CuTe DSL compile "
            "option objects (cute.OptLevel(2), cute.GenerateLineInfo(True), ...)",
        )
    name = f"{type(option).__module__}.{type(option).__qualname__}"
    if isinstance(option, BooleanBasedFileDumpOption) and option.value:
        raise UnkeyableArgument(where, f"{type(option).__name__}(True): {_FILE_DUMP_HINT}")
    try:
        state = fingerprint.fingerprint(vars(option), what=where, instances=True)
    except UnstableKeyError as exc:
        raise UnkeyableArgument(where, f"{type(option).__name__}: {exc.reason}") from exc
    return f"{name}:{state[:32]}"


#: artifacts a cache hit hands back (``compiled.artifacts.<NAME>`` and the file the DSL
#: writes into the dump dir): the ``options=`` string's ``--keep-cubin`` / ``--keep-ptx``
_KEPT = (("KeepCUBIN", "CUBIN", "cubin"), ("KeepPTX", "PTX", "ptx"))


def _string_options_text(options: str) -> str:
    """An ``options=`` string as key text: split as the DSL splits it, with the
    ``--dump-dir`` value left out (it says where files go, not what is compiled: a hit
    writes the kept artifacts into the caller's dump dir)."""
    from cutlass.base_dsl.compiler import _split_options

    tokens = _split_options(options)
    out = []
    skip = False
    for token in tokens:
        if skip:
            skip = False
            continue
        if token == "--dump-dir":
            skip = True
            token = "--dump-dir=<dir>"
        elif token.startswith("--dump-dir="):
            token = "--dump-dir=<dir>"
        out.append(token)
    import shlex

    return shlex.join(out)


def _kept_artifacts(options: Any) -> tuple[tuple[str, str], ...]:
    """``((artifact attribute, extension), ...)`` the ``options=`` string asks the DSL to
    keep (``--keep-cubin``, ``--keep-ptx``); raises UnkeyableArgument for another file
    dump (``--keep-sass``: a hit would not write it)."""
    if not isinstance(options, str) or "keep" not in options:
        return ()
    from cutlass.base_dsl import compiler

    parsed = compiler._parse_compile_options_from_str(options)
    if parsed.options[compiler.KeepSASS].value:
        raise UnkeyableArgument("options", f"--keep-sass: {_FILE_DUMP_HINT}")
    return tuple(
        (attr, ext) for cls, attr, ext in _KEPT if parsed.options[getattr(compiler, cls)].value
    )


def _dump_dir(options: Any, dsl: Any) -> str:
    """Where the DSL writes kept artifacts for these options (``--dump-dir``, else its
    ``CUTE_DSL_DUMP_DIR`` setting)."""
    from cutlass.base_dsl import compiler

    value = compiler._parse_compile_options_from_str(options).options[compiler.DumpDir].value
    return value or str(dsl.envar.dump_dir)


def _options_field(options: Any, extra: dict, bracket: Any = None) -> str:
    """The ``options=`` value and the ``compile[...]`` options as key text; raises the spec
    module's UnkeyableArgument."""

    if options is None or options == "":
        text = ""
    elif isinstance(options, str):
        text = _string_options_text(options)
    else:  # option objects passed as options= (the DSL 4.8 ignores them; key them anyway)
        text = "objects=" + _option_text(options, "options")
    if bracket is not None:
        text += " |compile[" + _option_text(bracket, "cute.compile[...] options") + "]"
    for k in sorted(extra):
        text += f" |{k}={extra[k]!r}"
    return text


def key_fields(fn: Any, *args: Any, **kwargs: Any) -> dict[str, str]:
    """The labeled fields of the key of ``cute.compile(fn, *args, **kwargs)`` (see the module
    doc). Raises :class:`cuforge.cute.spec.UnkeyableArgument` or
    :class:`cuforge.keys.fingerprint.UnstableKeyError` when something cannot be keyed stably."""
    with _LOCK:
        fields, info = _key_fields(fn, args, dict(kwargs))
    if info["blocked_error"] is not None:
        raise info["blocked_error"]
    return fields


def _target(fn: Any, args: tuple) -> tuple[Any, tuple]:
    """``(function, arguments)`` as the DSL's ``cute.compile`` resolves ``fn``: a function
    as is; a bound method as its function with the instance first; a callable instance as
    its class's ``__call__`` function with the instance first."""
    if type(fn) is types.FunctionType:
        return fn, tuple(args)
    if type(fn) is types.MethodType:
        return fn.__func__, (fn.__self__, *args)
    call = getattr(fn, "__call__", None)  # noqa: B004 - the DSL's own test
    func = getattr(call, "__func__", None)
    if not isinstance(fn, type) and type(func) is types.FunctionType:
        return func, (fn, *args)
    raise UnkeyableArgument(
        "fn",
        f"a {type(fn).__name__}; cuforge keys @cute.jit functions, bound @cute.jit methods "
        "and instances whose __call__ is a @cute.jit method",
    )


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
    """Register the DSL's runtime handle types with the fingerprint (once per process).

    A stream, a context or a device (``cuda.bindings.driver.CUstream`` / ``CUcontext`` /
    ``CUdevice``, the DSL's fake stream) is a runtime handle: a default argument such as the
    examples' ``stream=cuda.CUstream(...)``, or the state of the DSL's own ``HardwareInfo``.
    Its value never changes the generated code (the arch is keyed on its own), and it is an
    address or an ordinal of this process, so it is keyed by its type alone."""
    global _taught
    if _taught:
        return

    from cutlass.runtime import _FakeStream

    handle_types: list[type] = [_FakeStream]
    driver = sys.modules.get("cuda.bindings.driver")
    if driver is not None:
        for name in _DRIVER_HANDLES:
            cls = getattr(driver, name, None)
            if isinstance(cls, type):
                handle_types.append(cls)
    for cls in handle_types:
        fingerprint.register(cls, _handle_type)
    _taught = True


_taught = False
#: the ``cuda.bindings.driver`` handle types keyed by type alone (see _teach_fingerprint)
_DRIVER_HANDLES = ("CUstream", "CUcontext", "CUdevice")


def _handle_type(handle: Any) -> str:
    cls = type(handle)
    kind = "stream" if "Stream" in cls.__qualname__ else "handle"
    return f"{kind}:{cls.__module__}.{cls.__qualname__}"


def _is_driver_handle(value: Any) -> bool:
    cls = type(value)
    return cls.__module__ == "cuda.bindings.driver" and cls.__qualname__ in _DRIVER_HANDLES


#: handle values that mean the same in every process: the null stream / context / device 0,
#: ``CU_STREAM_LEGACY`` (1) and ``CU_STREAM_PER_THREAD`` (2)
_CONSTANT_HANDLES = (0, 1, 2)


def _handle_defaults(func: Any) -> str:
    """The driver-handle defaults of ``func``'s parameters (``stream=cuda.CUstream(0)``) as
    key text ("" when there are none).

    The DSL stores the function's signature, defaults included, in an export: a hit calls
    with the stored default when the stream is left out, so the default's value is keyed
    (handles elsewhere are keyed by type). A default that is an address of this process
    cannot be stored: the call is uncached, naming the parameter."""
    code = func.__dict__.get("_original_code", func.__code__)
    if not isinstance(code, types.CodeType):
        code = func.__code__
    named: list[tuple[str, Any]] = []
    positional = func.__defaults__ or ()
    if positional:
        names = code.co_varnames[: code.co_argcount]
        named.extend(zip(names[len(names) - len(positional) :], positional, strict=True))
    named.extend((func.__kwdefaults__ or {}).items())
    parts = []
    for name, value in named:
        if not _is_driver_handle(value):
            continue
        number = int(value)
        if number not in _CONSTANT_HANDLES:
            raise UnkeyableArgument(
                f"the default of parameter {name!r}",
                f"a {type(value).__name__} with the process-specific value {number:#x}; "
                "cuforge stores defaults of 0, CU_STREAM_LEGACY (1) and CU_STREAM_PER_THREAD (2)",
            )
        parts.append(f"{name}={type(value).__qualname__}({number})")
    return ",".join(parts)


def _is_tvm_ffi(compiled: Any) -> bool:
    """Whether ``compiled`` is a TVM-FFI function (compiled with ``--enable-tvm-ffi``)."""
    return any(c.__name__ == "TVMFFIJitCompiledFunctionBase" for c in type(compiled).__mro__)


class _HandleDefault:
    """Stands in for a constant driver-handle default while the DSL pickles the signature
    into an export: it pickles as ``cls(value)``, so loading the export (in any process,
    without cuforge) rebuilds the very handle."""

    __slots__ = ("cls", "value")

    def __init__(self, cls: type, value: int) -> None:
        self.cls = cls
        self.value = value

    def __reduce__(self) -> tuple:
        return (self.cls, (self.value,))


def _export(compiled: Any, directory: str, symbol: str) -> bytes | None:
    """``compiled.export_to_c(directory, symbol, symbol)`` (returns the header; None when
    only the object could be made) with every constant driver-handle
    default of the exported signature (a Cython object pickle refuses: "no default
    __reduce__ due to non-trivial __cinit__") standing in as a :class:`_HandleDefault`;
    the compiled function's own signature is put back afterwards."""
    args = getattr(compiled, "execution_args", None)
    sig = getattr(args, "signature", None)
    params = list(sig.parameters.values()) if sig is not None else []
    changed = False
    for i, param in enumerate(params):
        value = param.default
        if _is_driver_handle(value) and int(value) in _CONSTANT_HANDLES:
            params[i] = param.replace(default=_HandleDefault(type(value), int(value)))
            changed = True
    if changed:
        args.signature = sig.replace(parameters=params)
    try:
        if _is_tvm_ffi(compiled):
            # a TVM-FFI function (options "--enable-tvm-ffi", as quack compiles): its own
            # export_to_c(object_file_path, function_name), loaded with enable_tvm_ffi=True
            compiled.export_to_c(
                object_file_path=os.path.join(directory, symbol + ".o"), function_name=symbol
            )
            return None
        if getattr(compiled, "c_header_arguments", False) is None:
            # no runtime arguments (the DSL's HardwareInfo probe kernel): the DSL's C header
            # generator fails on it, but the object file, all a hit loads, is made as usual
            obj = compiled.dump_to_object(symbol)
            with open(os.path.join(directory, symbol + ".o"), "wb") as f:
                f.write(obj)
            return None
        compiled.export_to_c(directory, symbol, symbol)
        return _read_regular(os.path.join(directory, symbol + ".h"))
    finally:
        if changed:
            args.signature = sig


def _key_fields(
    fn: Any, args: tuple, kwargs: dict, bracket: Any = None
) -> tuple[dict[str, str], dict]:
    func, full_args = _target(fn, args)
    inner = _unwrap(func)
    if not hasattr(inner, "_dsl_object") and not hasattr(inner, "_dsl_cls"):
        raise UnkeyableArgument("fn", f"{func.__qualname__} is not decorated with @cute.jit")
    fkwargs, options, extra, hooks = _split_kwargs(kwargs)
    _teach_fingerprint()
    dsl = _dsl_of(inner)
    hook = _original_code_hook()
    fields = {
        "format": FORMAT,
        "python": f"{sys.version_info[0]}.{sys.version_info[1]}",
        "function": f"{getattr(func, '__module__', '?')}.{func.__qualname__}",
        "dsl": dsl_version(),
        "arch": str(dsl.envar.arch),
        "dsl_settings": _portable_settings(dsl.envar.cache_key_str()),
        "options": _options_field(options, extra, bracket),
    }
    if func is not fn:
        fields["callable"] = "method" if type(fn) is types.MethodType else "instance.__call__"
    defaults = _handle_defaults(inner)
    if defaults:
        fields["handle_defaults"] = defaults
    info = {
        "options": options,
        "extra": extra,
        "hooks": hooks,
        "fkwargs": fkwargs,
        "bracket": bracket,
        "kept": _kept_artifacts(options),
        "dsl": dsl,
        "blocked": None,
        "blocked_error": None,
    }
    # the pre-trace part: what the function reaches and what it is called with. When it
    # cannot be made stable the call falls back to the key of the traced module (the IR key)
    base = dict(fields)
    try:
        fields["fingerprint"] = fingerprint.fingerprint(
            func, what=f"@cute.jit function {func.__qualname__}", hook=hook
        )
        if hooks is not None:
            fields["trace_finalize_hooks"] = fingerprint.fingerprint(
                hooks, what="trace_finalize_hooks"
            )
        fields["args"] = describe_args(inner, full_args, fkwargs, hook=hook)
    except (UnkeyableArgument, UnstableKeyError) as exc:
        info["blocked"] = str(exc)
        info["blocked_error"] = exc
        base["signature"] = _signature_text(inner)
        return base, info
    return fields, info


def _signature_text(func: Any) -> str:
    """The parameters of ``func`` (names and kinds, in order) as key text: the exported
    function is called through them, so two functions that trace to the same module but
    take their arguments differently are two entries."""
    code = func.__dict__.get("_original_code", func.__code__)
    if not isinstance(code, types.CodeType):
        code = func.__code__
    n = code.co_argcount + code.co_kwonlyargcount
    names = list(code.co_varnames[:n])
    if code.co_flags & 0x04:  # *args
        names.insert(code.co_argcount, "*" + code.co_varnames[n])
        n += 1
    if code.co_flags & 0x08:  # **kwargs
        names.append("**" + code.co_varnames[n])
    return f"{code.co_posonlyargcount}/{code.co_argcount}/{code.co_kwonlyargcount}:" + ",".join(
        names
    )


# --------------------------------------------------------------------------- build / load


#: the DSL's own ``cutlass.cute.compile`` object, saved before cuforge patches it
_REAL: list[Any] = []


def real_compile(bracket: Any = None) -> Any:
    """The DSL's own ``cute.compile`` (the saved original when :func:`enable` patched it),
    subscripted with ``bracket`` options when given. Never cuforge's replacement: cuforge's
    miss path calls this, so a patched ``cute.compile`` never recurses."""
    if not _REAL:
        import cutlass.cute as cute

        current = cute.compile
        if isinstance(current, CachedCompile):
            raise RuntimeError(
                "cutlass.cute.compile was replaced by cuforge's compile without "
                "cuforge.cute.enable(): the DSL's own compile is lost; call enable() instead"
            )
        _REAL.append(current)
    real = _REAL[0]
    return real if bracket is None else real[bracket]


def _symbol_for(key: str) -> str:
    return "cuforge_cute_" + key[:24]


def _trace_hashes(
    owner: Any, module: Any, function_name: str, dsl_hash: bool = True
) -> tuple[str, str | None]:
    """``(portable trace hash, the DSL's own module hash)`` of a traced module. The DSL's
    hash (recorded in a built entry) goes through its ``get_version()``, which hashes the
    DSL's files again in each process: a trace alone (the IR key's lookup) skips it
    (``dsl_hash=False``: None)."""

    # the module as text without locations: the bytecode the DSL hashes carries source file
    # paths, so the same code in another checkout would hash differently
    text = module.operation.get_asm(enable_debug_info=False)
    if isinstance(text, str):
        text = text.encode("utf-8")
    # the DSL's identity as the pre-trace key has it (cuforge's digest of what the DSL's own
    # get_version() covers, memoized by stat): get_version() itself re-hashes the DSL's
    # sources and its 190 MB compiler library in each process, ~44 ms that a trace alone
    # never pays (bench/cute_ir_key_cpu.py)
    h = hashlib.sha256(b"cuforge-cute-trace 2\n")
    h.update(dsl_version().encode())
    h.update(text)
    h.update(_portable_settings(owner.envar.cache_key_str()).encode())
    h.update(owner.compile_options.to_str().encode())
    return h.hexdigest(), owner.get_module_hash(module, function_name) if dsl_hash else None


def _hooks_with(user_hooks: Any, mine: Any) -> list:
    if user_hooks is None:
        return [mine]
    if callable(user_hooks):
        return [user_hooks, mine]
    return [*list(user_hooks), mine]


def _trace(fn: Any, args: tuple, fkwargs: dict, info: dict) -> tuple[str, str | None]:
    """Trace ``fn`` (no compile) and return its portable hash (see :func:`_trace_hashes`;
    the DSL's own hash is not computed: None)."""
    found: list[tuple[str, str | None]] = []

    def hook(owner: Any, module: Any, function_name: str) -> None:
        found.append(_trace_hashes(owner, module, function_name, dsl_hash=False))

    kw = dict(fkwargs)
    if info["options"] is not None:
        kw["options"] = info["options"]
    kw.update(info["extra"])
    kw["trace_finalize_hooks"] = _hooks_with(info["hooks"], hook)
    counters["trace"] += 1
    real_compile(info.get("bracket")).to_precompiled_mlir(fn, *args, **kw)
    if not found:
        raise StaleEntryError("tracing produced no module to hash (the DSL did not call the hook)")
    return found[-1]


def _read_regular(path: str) -> bytes:
    return read_bytes(path)


def _build(
    fn: Any, args: tuple, info: dict, symbol: str, state: dict, export: bool = True
) -> dict[str, bytes]:
    """Compile with the DSL's own ``cute.compile``; with ``export``, export the result.

    Whatever goes wrong after the compile (no trace hook call, ``export_to_c`` or reading
    its files failing in any way) leaves the compiled function in ``state`` and raises
    :class:`_NotExportable` with the reason: the call is then served uncached, never
    failed."""
    found: list[tuple[str, str]] = []

    def hook(owner: Any, module: Any, function_name: str) -> None:
        found.append(_trace_hashes(owner, module, function_name))

    kw = dict(info["fkwargs"])
    if info["options"] is not None:
        kw["options"] = info["options"]
    kw.update(info["extra"])
    kw["trace_finalize_hooks"] = _hooks_with(info["hooks"], hook) if export else info["hooks"]
    if kw["trace_finalize_hooks"] is None:
        del kw["trace_finalize_hooks"]
    real = real_compile(info.get("bracket"))
    adapted = _adapt_arrays(args) if export else None
    counters["compile"] += 1
    if adapted is None:
        compiled = real(fn, *args, **kw)
    else:
        # raw arrays (numpy, torch): the DSL compiles them as the tensors its TensorAdapter
        # makes (``from_dlpack(x).mark_layout_dynamic()``), but cannot export a function
        # compiled from the raw arrays themselves; compile from those very tensors (the
        # same kernel; calls adapt raw arrays either way)
        try:
            compiled = real(fn, *adapted, **kw)
        except Exception as exc:  # noqa: BLE001 - fall back to exactly the user's call
            found.clear()
            counters["compile"] += 1
            state["compiled"] = real(fn, *args, **kw)
            _not_exportable(
                state, f"compiling from the adapted raw arrays failed ({type(exc).__name__})"
            )
    state["compiled"] = compiled
    if not export:
        return {"uncached": b"-"}  # nothing is stored: blobcache wants a non-empty mapping
    if not found:
        _not_exportable(state, "cute.compile did not run cuforge's trace hook")
    tmp = tempfile.mkdtemp(prefix="cuforge-cute-")
    try:
        try:
            header = _export(compiled, tmp, symbol)
            obj = _read_regular(os.path.join(tmp, symbol + ".o"))
        except Exception as exc:  # noqa: BLE001 - any failure: serve the compiled function
            _not_exportable(
                state,
                f"the compiled function cannot be exported ({type(exc).__name__}: "
                f"{_plain_message(exc)})",
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    record = {
        "symbol": symbol,
        "function_name": str(getattr(compiled, "function_name", "")),
        "trace_hash": found[-1][0],
        "dsl_module_hash": found[-1][1],
    }
    if _is_tvm_ffi(compiled):
        record["tvm_ffi"] = True
    files = {_OBJECT: obj}
    if header is not None:
        files[_HEADER] = header
    kept = info.get("kept") or ()
    if kept:
        record["artifacts"] = _store_artifacts(compiled, kept, info, files, state)
    state["record"] = record
    files[_RECORD] = json.dumps(record, sort_keys=True).encode()
    return files


def _store_artifacts(compiled: Any, kept: tuple, info: dict, files: dict, state: dict) -> dict:
    """Put the kept artifacts (``--keep-cubin`` / ``--keep-ptx``) into the entry's
    ``files``; returns ``{extension: the file name the DSL wrote}``."""
    artifacts = getattr(compiled, "artifacts", None)
    names = {}
    directory = _dump_dir(info["options"], info["dsl"])
    for attr, ext in kept:
        data = getattr(artifacts, attr, None)
        if isinstance(data, str):
            data = data.encode("utf-8")
        name = f"{compiled.function_name}.{info['dsl'].envar.arch}.{ext}"
        if not isinstance(data, bytes) or not os.path.isfile(os.path.join(directory, name)):
            _not_exportable(state, f"the kept {attr} was not found where the DSL writes it")
        files[_ARTIFACT + ext] = data
        names[ext] = name
    return names


def _restore_artifacts(value: Any, files: Any, record: dict, info: dict) -> None:
    """A hit on a call that keeps artifacts: write them into this call's dump dir, as the
    DSL would, and hand them back as ``value.artifacts`` (bytes for CUBIN, text for PTX)."""
    from cutlass.base_dsl.jit_executor import JitFunctionArtifacts

    names = record.get("artifacts") or {}
    directory = _dump_dir(info["options"], info["dsl"])
    os.makedirs(directory, exist_ok=True)
    got: dict[str, Any] = {"PTX": None, "CUBIN": None, "SASS": None, "MLIR": None}
    for attr, ext in info["kept"]:
        data = files[_ARTIFACT + ext]
        name = names[ext]
        if os.path.basename(name) != name:
            raise ValueError(f"the entry's {ext} file name {name!r} is not a plain name")
        with open(os.path.join(directory, name), "wb") as f:
            f.write(data)
        got[attr] = data if attr == "CUBIN" else data.decode("utf-8")
    value.artifacts = JitFunctionArtifacts(**got)


def _plain_message(exc: BaseException) -> str:
    """The DSL's error text without colour codes, on one line, at most 400 characters."""
    import re

    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
    text = " ".join(text.split())
    return text if len(text) <= 400 else text[:397] + "..."


def _adapt_arrays(args: tuple) -> tuple | None:
    """``args`` with every raw array (a type the DSL has a ``TensorAdapter`` for) replaced
    by the tensor that adapter makes of it; None when there is none."""
    from cuforge.cute.spec import _adapted_tensor

    out = []
    changed = False
    for value in args:
        tensor = None if isinstance(value, (int, float, str, tuple)) else _adapted_tensor(value)
        changed = changed or tensor is not None
        out.append(value if tensor is None else tensor)
    return tuple(out) if changed else None


def _not_exportable(state: dict, why: str) -> None:
    state["not_exportable"] = why
    raise _NotExportable(why)


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


def _load_object(obj: bytes, symbol: str, tvm_ffi: bool = False) -> Any:
    """Load the stored object ``obj`` with the DSL's ``load_module`` (which reads the file
    at once; ``tvm_ffi``: as a TVM-FFI module, for a function compiled with
    ``--enable-tvm-ffi``).

    On Linux the object is handed over as an anonymous in-memory file (``memfd_create``,
    read through ``/proc/self/fd``): nothing is written to disk and there is nothing to
    clean up. Elsewhere it is written to a fresh private temporary directory (0700,
    ``O_EXCL|O_NOFOLLOW``), removed after the load."""

    from cutlass.cute.runtime import load_module

    counters["load"] += 1
    if _MEMFD is not None:
        fd = _MEMFD("cuforge-cute", os.MFD_CLOEXEC)
        try:
            _write_all(fd, obj)
            path = f"/proc/self/fd/{fd}"
            if tvm_ffi:
                return load_module(path, enable_tvm_ffi=True)[symbol]
            return load_module(path)[symbol]
        finally:
            os.close(fd)
    tmp = tempfile.mkdtemp(prefix="cuforge-cute-")  # 0700, created by us: nothing to follow
    path = os.path.join(tmp, symbol + ".o")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            _write_all(fd, obj)
        finally:
            os.close(fd)
        if tvm_ffi:
            return load_module(path, enable_tvm_ffi=True)[symbol]
        return load_module(path)[symbol]
    finally:
        try:  # the one file we made, then the directory (shutil.rmtree walks: ~0.5 ms)
            os.unlink(path)
            os.rmdir(tmp)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _memfd() -> Any:
    create = getattr(os, "memfd_create", None)
    if create is None or not hasattr(os, "MFD_CLOEXEC") or not os.path.isdir("/proc/self/fd"):
        return None
    return create


#: ``os.memfd_create`` where objects can be handed to the DSL in memory (Linux), else None
_MEMFD = _memfd()


# --------------------------------------------------------------------------- public


def compile_cached(
    fn: Any, *args: Any, verify: str | None = None, cache: Cache | None = None, **kwargs: Any
) -> CuteResult:
    """Like :func:`compile`, but returns a :class:`CuteResult` saying where the function came
    from and why it is not cached, when it is not. ``compile_cached[options](...)`` is not
    offered; use ``compile[options]`` or :meth:`CachedCompile.cached`."""
    return _compile_cached(fn, args, kwargs, verify, cache, None)


def _compile_cached(
    fn: Any, args: tuple, kwargs: dict, verify: str | None, cache: Cache | None, bracket: Any
) -> CuteResult:
    if verify not in (None, "trace"):
        raise ValueError(f"verify={verify!r}: expected None or 'trace'")
    cache = resolve(cache)
    loaded = cache.memo("cute")  # key -> (function, record)

    with _LOCK:
        name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"
        reason = None
        try:
            fields, info = _key_fields(fn, args, dict(kwargs), bracket)
            name = fields["function"]
        except (UnkeyableArgument, UnstableKeyError) as exc:
            reason = str(exc)
            fields = {"format": FORMAT, "function": name, "unkeyable": reason}
            fkwargs, options, extra, hooks = _split_kwargs(kwargs)
            info = {
                "options": options,
                "extra": extra,
                "hooks": hooks,
                "fkwargs": fkwargs,
                "bracket": bracket,
            }
        traced = None
        if reason is None and info.get("blocked"):
            # the pre-trace key is blocked: trace, and key on the traced module (no compile
            # when the module is in the cache)
            _warn_blocked(cache, name, info["blocked"])
            try:
                traced = _trace(fn, args, info["fkwargs"], info)[0]
            except StaleEntryError as exc:
                reason = f"{info['blocked']}; and the trace gave no module to key ({exc})"
                fields = {"format": FORMAT, "function": name, "unkeyable": reason}
            else:
                fields = {**fields, "key": "ir", "ir": traced}
        how = "uncached" if reason is not None else ("ir" if traced is not None else "pretrace")
        key, _recorded = blobcache.make_key(KIND, fields)
        symbol = _symbol_for(key)
        if reason is None and (verify is None or traced is not None) and not info.get("kept"):
            memo = loaded.get(key)
            if memo is not None:
                counters["memo"] += 1
                _served(cache, how)
                verified = True if traced is not None and verify else None
                out = CuteResult(memo[0], "memo", key, fields, verified=verified, record=memo[1])
                out.served_by = how
                if how == "ir":
                    out.reason = info["blocked"]
                return out
        state: dict = {}
        checked: list[bool] = []

        def build() -> dict[str, bytes]:
            # an uncacheable call compiles only: nothing is exported that would be thrown away
            files = _build(fn, args, info, symbol, state, export=reason is None)
            if traced is not None and state.get("record", {}).get("trace_hash") != traced:
                _not_exportable(
                    state,
                    f"{info['blocked']}; and tracing it twice gave two different modules "
                    "(its trace is not deterministic), so the IR key cannot cover it either",
                )
            return files

        def load(files: Any) -> tuple[Any, dict]:
            if "compiled" in state:  # built in this call: the function is in hand
                return state["compiled"], state.get("record", {})
            record = _parse_record(dict(files), symbol)
            if traced is not None:  # keyed by the traced module: verified by construction
                if record["trace_hash"] != traced:
                    raise StaleEntryError(
                        f"the entry of {name} under its IR key was built from module "
                        f"{record['trace_hash'][:16]}, not {traced[:16]}"
                    )
                if verify == "trace":
                    checked.append(True)
            elif verify == "trace":
                now, _ = _trace(fn, args, info["fkwargs"], info)
                if now != record["trace_hash"]:
                    raise StaleEntryError(
                        f"verify='trace': the traced module of {name} has hash {now[:16]}, "
                        f"the entry was built from {record['trace_hash'][:16]}: the cache key "
                        "missed a change (please report it); the entry is rebuilt"
                    )
                checked.append(True)
            value = _load_object(files[_OBJECT], symbol, tvm_ffi=record.get("tvm_ffi") is True)
            if info.get("kept"):
                _restore_artifacts(value, files, record, info)
            return value, record

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
            cache.warn_once(f"cuforge.cute: {name} runs uncached: {why}. {_HINT}")
            if cache.enabled:
                cache.record_build(name, key, fields, uncached=why)
            _served(cache, "uncached")
            return CuteResult(state["compiled"], "uncached", key, fields, reason=why)
        value, record = res.value
        if res.source_of_result != "uncached" and cache.enabled and not info.get("kept"):
            loaded[key] = (value, record)
        how = "uncached" if res.source_of_result == "uncached" else how
        _served(cache, how)
        out = CuteResult(
            value,
            res.source_of_result,
            res.key,
            res.fields,
            reason=res.reason,
            verified=True if checked else None,
            record=record,
        )
        out.served_by = how
        if how == "ir":
            out.reason = info["blocked"]
        return out


#: what to do about a kernel the pre-trace key cannot cover (said with every such warning)
_HINT = (
    "To key it before tracing: give the object a __cuforge_fingerprint__() method returning "
    "plain data (or cuforge.keys.fingerprint.register(its class, fn)), pass the value as a "
    "cutlass.Constexpr argument instead of reading it from a global or closure, or keep "
    "such state out of what the kernel reaches"
)


def _warn_blocked(cache: Cache, name: str, why: str) -> None:
    cache.warn_once(
        f"cuforge.cute: {name} cannot be keyed before tracing ({why}); it is served by the "
        "key of its traced module instead: every call traces it (no compile when cached). " + _HINT
    )


def _served(cache: Cache, how: str) -> None:
    counters[how] += 1
    if cache.enabled:
        cache.count_served(KIND, how)


class CachedCompile:
    """``cuforge.cute.compile``: a drop-in for ``cutlass.cute.compile``, cached.

    ``compile(fn, *args, verify=None, cache=None, **kwargs)`` returns the ready JIT function
    (a hit: the stored export, loaded without tracing). ``fn`` is what ``cute.compile``
    takes: a ``@cute.jit`` function, a bound ``@cute.jit`` method, or an instance whose
    ``__call__`` is one. ``compile[options]`` (option objects, a tuple of them, or a bare
    boolean option class, as the DSL's own ``cute.compile[...]``) returns a compile with
    those options, keyed by their values. ``verify="trace"``: also trace and treat a hit whose
    traced module differs from the one it was built from as a miss. ``cache``: the
    :class:`cuforge.Cache` (default: the one this object was made with, else
    :func:`cuforge.default_cache`)."""

    __slots__ = ("_bracket", "_cache")

    def __init__(self, options: Any = None, cache: Cache | None = None) -> None:
        self._bracket = options
        self._cache = cache

    def __getitem__(self, options: Any) -> CachedCompile:
        real_compile(options)  # the DSL checks the options (an unknown option raises)
        return CachedCompile(options, self._cache)

    def __call__(
        self, fn: Any, *args: Any, verify: str | None = None, cache: Cache | None = None, **kw: Any
    ) -> Any:
        return self.cached(fn, *args, verify=verify, cache=cache, **kw).value

    def cached(
        self, fn: Any, *args: Any, verify: str | None = None, cache: Cache | None = None, **kw: Any
    ) -> CuteResult:
        """Like calling it, but returns the :class:`CuteResult`."""
        return _compile_cached(
            fn, args, kw, verify, cache if cache is not None else self._cache, self._bracket
        )

    def to_precompiled_mlir(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """The DSL's own ``to_precompiled_mlir`` (not cached)."""
        return real_compile(self._bracket).to_precompiled_mlir(fn, *args, **kwargs)

    def compile_to(self, target: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """The DSL's own ``compile_to`` (not cached)."""
        return real_compile(self._bracket).compile_to(target, fn, *args, **kwargs)

    def __repr__(self) -> str:
        opts = "" if self._bracket is None else f"[{self._bracket!r}]"
        return f"<cuforge.cute.compile{opts}>"


compile = CachedCompile()


def enable(cache: Cache | None = None) -> None:
    """Patch ``cutlass.cute.compile`` in place with cuforge's cached compile (through
    ``cache``, default: :func:`cuforge.default_cache` at each call), so that CuTe DSL code
    runs unedited, cached. The DSL's own compile is kept (:func:`real_compile`); cuforge's
    miss path calls it, never the patched attribute. ``cute.compile[...]`` keeps working.
    Calling it again only changes the cache. Undo with :func:`disable`."""
    import cutlass.cute as cute

    with _LOCK:
        real_compile()  # saves the DSL's own compile before it is replaced
        cute.compile = CachedCompile(None, cache)


def disable() -> None:
    """Put the DSL's own ``cutlass.cute.compile`` back (no effect when not enabled)."""
    import cutlass.cute as cute

    with _LOCK:
        if _REAL and isinstance(cute.compile, CachedCompile):
            cute.compile = _REAL[0]


def enabled() -> bool:
    """Whether ``cutlass.cute.compile`` is cuforge's (after :func:`enable`)."""
    cute = sys.modules.get("cutlass.cute")
    return cute is not None and isinstance(getattr(cute, "compile", None), CachedCompile)
