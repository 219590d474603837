"""``cuforge.jit``: kernels that specialize themselves, and explicit executors.

::

    src = '''
    template <typename T, int BLOCK>
    __global__ void scale(const T* x, T* out, T alpha, int n) { ... }
    '''
    k = cuforge.jit(src, "scale")
    k[grid, 256](x, out, 2.0, n, BLOCK=256)      # T from x's dtype; compiled on first use
    exe = k.compile(x, out, 2.0, n, BLOCK=256)   # a Kernel: no lookup per call
    exe[grid, 256](x, out, 2.0, n)
    exe.program.source_of_result                 # "compiled", "memory", "disk", ...
    k.specialize(T="float", BLOCK=256)           # the same, without arrays

How template parameters are bound
---------------------------------
The kernel's declaration is read from the source (:mod:`cuforge.runtime.signature`):

* a **type** parameter (``typename T``) is deduced from the element dtype of the array passed
  for a ``T*`` / ``const T*`` parameter, or given as a keyword: ``T="float"``, ``T=torch.half``,
  ``T=numpy.int8``. A scalar parameter declared ``T`` binds ``T`` only when no pointer
  parameter does, and only from a typed scalar (``numpy.float32(2)``): a Python ``float``
  says nothing about the C type and is converted to ``T`` as C++ would;
* a **non-type** parameter (``int BLOCK``) is a Constexpr: given as a keyword, ``BLOCK=256``;
* ``constexpr=("TILE",)`` names constants passed as defines, ``TILE=32`` -> ``-DTILE=32``
  (a mapping gives defaults: ``constexpr={"TILE": 32}``).

dtype -> C++: float16 ``__half``, bfloat16 ``__nv_bfloat16``, float32 ``float``, float64
``double``, int8..int64 ``signed char`` / ``short`` / ``int`` / ``long long``, uint8..uint64
the ``unsigned`` ones, bool ``bool``; from torch and NumPy / CuPy dtypes, DLPack and
``__cuda_array_interface__`` arrays. A specialization that uses ``__half`` or
``__nv_bfloat16`` pre-includes ``cuda_fp16.h`` / ``cuda_bf16.h`` when the source does not
mention them.

Each specialization is an ordinary cached compile (name expression ``scale<float, 256>`` plus
the defines), so it is compiled once per machine: another process gets it from the disk tier.

The per-call lookup
-------------------
``k[grid, block]`` returns a launcher for that configuration (cached like ``Kernel``'s). Its
call builds one tuple -- the ``.dtype`` of each argument that binds a type parameter -- looks
it up in the configuration's table, and compares the keywords with the ones stored there
(one dict ``==``); a hit calls the executor's launcher directly. No string is formatted and
nothing is compiled or checked on a hit. Other keywords for the same dtypes (alternating
``BLOCK`` values, a ``T=`` given explicitly) are found by a second dict keyed on the dtypes
and the keyword items, still without deduction. Arguments without a ``.dtype`` (DLPack-only or
``__cuda_array_interface__``-only objects, ``cuforge.Pointer``) take the general path on every
call: correct, but slower.

Where the C launcher extension loads (:mod:`cuforge.runtime.fastlaunch`), both steps run in C:
``k[grid, block]`` is the extension's ``Subscript`` (a hit in the JitKernel's launcher cache runs
no Python code) and the launcher is its ``JitDispatch``: the same table and the same keyword
comparison, the dtype of an exact ``torch.Tensor`` read through torch's C shim (as the
executor's launcher reads it), the executor's launcher vectorcalled with the positional
arguments (no ``*args`` / ``**kwargs`` re-packing). A miss calls the same Python general path.
Without the extension the launcher is generated Python doing the same lookup
(``bench/jit_dispatch_cpu.py`` measures both steps without a GPU).
"""

from __future__ import annotations

import numbers
import os
import sys
import threading
from collections.abc import Mapping, Sequence

from cuforge.base._fs import read_source
from cuforge.base.errors import CuforgeError
from cuforge.base.scalar_types import ELEMENT_KINDS, SCALAR_TYPES
from cuforge.core.caching import resolve
from cuforge.core.pipeline import compile_cached
from cuforge.frontend.program import Program
from cuforge.runtime.args import dlpack_dtype
from cuforge.runtime.signature import kernel_names, parse_kernels, parse_param, split_top

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: see docs/architecture.md, the warm path
if TYPE_CHECKING:
    from typing import Any

    from cuforge.frontend.program import Program
    from cuforge.runtime.kernel import Kernel


__all__ = ["jit", "JitKernel", "SpecializationError", "cxx_type", "COMPILE_KWARGS"]


class SpecializationError(CuforgeError, TypeError):
    """A kernel could not be specialized from the arguments given: a deduction conflict, a
    missing Constexpr, a dtype with no C++ type, a template parameter neither deducible nor
    given, an unknown keyword. The message names the parameter."""


#: keywords of :func:`jit` passed to the cached compile
COMPILE_KWARGS = (
    "options",
    "include_dirs",
    "defines",
    "arch",
    "backend",
    "output",
    "headers",
    "source_name",
    "cache",
)

# -- dtype -> C++ ---------------------------------------------------------------------------

#: dtype names (torch, NumPy, DLPack-derived) and C++ spellings -> the C++ type cuforge uses
_CXX = {
    name: t.cxx for t in SCALAR_TYPES for name in (t.dtype, *t.dtype_aliases, t.cxx, *t.cxx_aliases)
}
_SUPPORTED = ", ".join(t.dtype for t in SCALAR_TYPES)
# DLPack type codes and __cuda_array_interface__ kinds -> dtype name prefix
_DL_PREFIX = {k.dlpack: k.prefix for k in ELEMENT_KINDS}
_TYPESTR_PREFIX = {k.array_char: k.prefix for k in ELEMENT_KINDS if k.array_char}
_HEADER_FOR = {t.cxx: t.header for t in SCALAR_TYPES if t.header}


def _dtype_name(dtype) -> str | None:
    """The plain name of a dtype-like object (``"float32"``), None when it is not one."""
    if isinstance(dtype, str):
        return dtype.strip()
    if isinstance(dtype, tuple) and len(dtype) == 3 and all(isinstance(v, int) for v in dtype):
        code, bits, lanes = dtype  # a DLPack (code, bits, lanes)
        prefix = _DL_PREFIX.get(code)
        if prefix is None or lanes != 1:
            return f"DLPack dtype (code {code}, {bits} bits, {lanes} lanes)"
        return "bool" if prefix == "bool" else f"{prefix}{bits}"
    if dtype is bool:
        return "bool"
    module = type(dtype).__module__ or ""
    if module.startswith("torch"):
        text = str(dtype)
        return text[6:] if text.startswith("torch.") else text
    if isinstance(dtype, type):  # numpy scalar types: numpy.float32
        name = getattr(dtype, "__name__", "")
        if (getattr(dtype, "__module__", "") or "").startswith(("numpy", "ml_dtypes", "cupy")):
            return name
        return None
    name = getattr(dtype, "name", None)  # numpy / cupy dtypes
    return name if isinstance(name, str) else None


def cxx_type(dtype) -> str:
    """The C++ type cuforge uses for ``dtype``: a torch or NumPy dtype, a NumPy scalar type, a
    DLPack ``(code, bits, lanes)`` tuple, a dtype name (``"float32"``) or a C++ type name
    (``"float"``, ``"__half"``; any other C++ type name such as ``"float4"`` is kept as is).

    Raises:
        SpecializationError: a dtype with no C++ mapping (complex, float8, ...).
    """
    name = _dtype_name(dtype)
    if name is None:
        if dtype is float or dtype is int:
            raise SpecializationError(
                f"the Python type {dtype.__name__} does not fix a C type; give a dtype "
                f"(numpy.{'float32' if dtype is float else 'int32'}) or a C++ type name"
            )
        raise SpecializationError(
            f"{dtype!r} ({type(dtype).__name__}) is not a dtype; give a torch or NumPy dtype, "
            "a dtype name such as 'float32', or a C++ type name such as 'float'"
        )
    cxx = _CXX.get(name)
    if cxx is not None:
        return cxx
    if isinstance(dtype, str) and _looks_like_cxx_type(name) and not _is_dtype_name(name):
        return " ".join(name.split())
    raise SpecializationError(
        f"dtype {name} has no C++ type in cuforge's mapping (supported: {_SUPPORTED}); give "
        "the template parameter explicitly as a C++ type name"
    )


def _is_dtype_name(name: str) -> bool:
    """``float16``, ``int8``, ``complex64``, ``float8_e4m3fn``: a dtype name, not a C++ type."""
    for prefix in ("bfloat", "float", "uint", "int", "complex"):
        if name.startswith(prefix):
            bits = name[len(prefix) :].split("_", 1)[0]
            return bits in ("8", "16", "32", "64", "128")
    return False


def _looks_like_cxx_type(text: str) -> bool:
    allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_:<>, *&")
    return bool(text) and (text[0].isalpha() or text[0] in "_:") and set(text) <= allowed


def _arg_dtype(arg) -> tuple[str | None, str]:
    """(C++ element type or None when the argument has no dtype, how to describe it)."""
    what = _describe(arg)
    dtype = getattr(arg, "dtype", None)
    if dtype is None:
        cai = getattr(arg, "__cuda_array_interface__", None)
        if isinstance(cai, Mapping) and isinstance(cai.get("typestr"), str):
            typestr = cai["typestr"]
            prefix = _TYPESTR_PREFIX.get(typestr[1:2])
            size = typestr[2:]
            if prefix is None or not size.isdigit():
                dtype = f"typestr {typestr}"
            else:
                dtype = "bool" if prefix == "bool" else f"{prefix}{int(size) * 8}"
        elif hasattr(arg, "__dlpack__"):
            dtype = dlpack_dtype(arg)
    if dtype is None:
        return None, what
    return cxx_type(dtype), what


def _describe(arg) -> str:
    dtype = getattr(arg, "dtype", None)
    kind = type(arg).__name__
    module = (type(arg).__module__ or "").split(".")[0]
    if dtype is not None:
        name = _dtype_name(dtype) or str(dtype)
        if module == "torch":
            return f"a torch.{name} tensor"
        if getattr(arg, "ndim", 1) == 0 and module == "numpy":
            return f"a numpy.{name} scalar"
        return f"a {module}.{kind} of {name}" if module else f"a {kind} of {name}"
    return f"a {kind}"


# -- the declaration --------------------------------------------------------------------------


class _TemplateParam:
    __slots__ = ("name", "kind", "is_type", "default", "is_bool")

    def __init__(self, name: str, kind: str, default: str | None) -> None:
        self.name, self.kind, self.default = name, kind, default
        self.is_type = kind in ("typename", "class") or kind.endswith(("typename", "class"))
        self.is_bool = kind == "bool"


def _read_declaration(source: str, name: str, template: Sequence[str] | None):
    """(template params, kernel params without substitution, extern "C") of kernel ``name``."""

    base = name.split("::")[-1].strip()
    decls = [d for d in parse_kernels(source) if d.name == base]
    decls.sort(key=lambda d: not d.is_template)
    if not decls:
        if template is None:
            names = ", ".join(kernel_names(source)) or "none found"
            raise SpecializationError(
                f"no __global__ function {name!r} in the source (kernels there: {names}); if it "
                "is declared through a macro, pass template=(...) with its template parameter "
                "names and give every one of them when calling"
            )
        return [_TemplateParam(t, "", None) for t in template], None, False
    decl = decls[0]
    tparams = []
    for kind, pname, default in decl.template_params or []:
        if kind.endswith("...") or pname.startswith("...") or not pname:
            raise SpecializationError(
                f"{name}: template parameter {kind} {pname} (variadic or unnamed) is not "
                "supported by cuforge.jit; compile the instances with cuforge.compile("
                "name_expressions=...)"
            )
        tparams.append(_TemplateParam(pname, kind, default))
    if template is not None:
        declared = [t.name for t in tparams]
        if list(template) != declared:
            raise SpecializationError(
                f"{name}: template={tuple(template)!r} does not match the declaration's template "
                f"parameters {tuple(declared)!r}; pass them in declaration order (or leave "
                "template= out: it is read from the source)"
            )
    try:
        parts = split_top(decl.param_text)
        params = [] if parts in ([], ["void"]) else [parse_param(i, p) for i, p in enumerate(parts)]
    except Exception:  # noqa: BLE001 - an unreadable parameter list: no deduction, say so later
        params = None
    return tparams, params, decl.extern_c


# -- the JIT kernel ---------------------------------------------------------------------------


class JitKernel:
    """A kernel template that specializes itself: see :func:`jit`.

    Attributes: ``name`` (the kernel), ``template_params`` (their names, in order),
    ``constexprs`` (the define names), ``params`` (the kernel parameters as declared, with
    template types unsubstituted; None when unreadable), ``specializations`` (the compiled
    executors by name expression and defines).
    """

    def __init__(
        self,
        source: str,
        name: str,
        *,
        source_dir: str | None,
        source_name: str,
        template: Sequence[str] | None,
        constexpr: Sequence[str] | Mapping[str, Any],
        compile_kwargs: dict[str, Any],
    ) -> None:
        if not isinstance(name, str) or not name.strip():
            raise SpecializationError(f"the kernel name must be a non-empty string, not {name!r}")
        self.name = name.strip()
        self.source = source
        self._source_dir = source_dir
        self._source_name = source_name
        tparams, params, extern_c = _read_declaration(source, self.name, template)
        self._tparams = tparams
        self._by_name = {t.name: t for t in tparams}
        self.params = params
        self._extern_c = extern_c
        if isinstance(constexpr, str):
            raise TypeError(
                f"constexpr must be a sequence of names, e.g. ({constexpr!r},), not one string"
            )
        if isinstance(constexpr, Mapping):
            self._constexpr_defaults = {str(k): v for k, v in constexpr.items()}
        else:
            self._constexpr_defaults = {str(k): _NO_DEFAULT for k in constexpr}
        for c in self._constexpr_defaults:
            if not c.isidentifier():
                raise SpecializationError(f"constexpr name {c!r} is not a C identifier")
            if c in self._by_name:
                raise SpecializationError(
                    f"{c!r} is both a template parameter of {self.name} and a constexpr; "
                    "a template parameter is given as a keyword already: drop it from constexpr="
                )
        defines = dict(compile_kwargs.pop("defines", None) or {})
        clash = sorted(set(defines) & set(self._constexpr_defaults))
        if clash:
            raise SpecializationError(
                f"{', '.join(clash)} given both in defines= and constexpr=; keep one"
            )
        self._defines = defines
        options = compile_kwargs.pop("options", ())
        if isinstance(options, str):
            raise TypeError("options must be a sequence of strings, e.g. ('-std=c++17',)")
        self._options = tuple(options)
        self._compile_kwargs = compile_kwargs
        self.constexprs = tuple(self._constexpr_defaults)
        self.template_params = tuple(t.name for t in tparams)
        # which arguments bind which type parameter
        self._pointer_binders: list[tuple[int, str]] = []
        self._scalar_binders: list[tuple[int, str]] = []
        type_names = {t.name for t in tparams if t.is_type}
        for p in params or []:
            if p.base in type_names:
                if p.kind == "pointer" and p.type.count("*") == 1:
                    self._pointer_binders.append((p.index, p.base))
                elif p.kind == "struct" and "*" not in p.type:
                    self._scalar_binders.append((p.index, p.base))
        pointer_bound = {t for _, t in self._pointer_binders}
        self._scalar_binders = [(i, t) for i, t in self._scalar_binders if t not in pointer_bound]
        self._lock = threading.RLock()
        self._specs: dict[tuple, Kernel] = {}
        self._configs: dict = {}
        self._make_launcher = self._build_fast_path()

    # -- public ----------------------------------------------------------------------------

    def __getitem__(self, config):
        """``k[grid, block]`` (``[grid, block, shared_mem]``, ``[grid, block, shared_mem,
        stream]``): a launcher; call it with the kernel's arguments and the Constexprs as
        keywords."""
        # replaced by the C extension's Subscript (the same lookup, no Python frame) once
        # that is loaded: see _c_dispatch
        return self._getitem(config)

    def _getitem(self, config):
        try:
            return self._configs[config]
        except KeyError:
            pass
        except TypeError:  # unhashable parts (lists): build, don't cache
            return self._make_launcher(config)
        launcher = self._make_launcher(config)
        if len(self._configs) > 1024:
            self._configs.clear()
        self._configs[config] = launcher
        return launcher

    def compile(self, *args, **constexprs) -> Kernel:
        """The executor for these arguments and Constexprs: a :class:`~cuforge.Kernel` with
        no specialization lookup per call (``exe.program`` is the cached Program). The
        arrays only lend their dtypes: they may be on the CPU, nothing is launched."""
        return self._executor(self._spec_key(args, constexprs, check_count=True))

    def specialize(self, **given) -> Kernel:
        """The executor for template parameters and Constexprs given by name:
        ``k.specialize(T="float", BLOCK=256)``."""
        return self._executor(self._spec_key((), given, check_count=False))

    @property
    def specializations(self) -> dict[tuple, Kernel]:
        """The compiled executors: ``{(name expression, ((define, value), ...)): Kernel}``."""
        with self._lock:
            return dict(self._specs)

    def __repr__(self) -> str:
        tp = ", ".join(self.template_params)
        return f"<cuforge.JitKernel {self.name}<{tp}> ({len(self._specs)} specializations)>"

    # -- the hot path ---------------------------------------------------------------------------

    def _build_fast_path(self):
        """Generate ``make(config) -> launcher`` (see the module docstring): the launcher
        looks up the ``.dtype`` of each binding argument in its table, which holds the
        keywords last used with those dtypes and the executor's launcher for them; equal
        keywords (one dict comparison, no tuple of items built) launch at once."""
        parts = [f"args[{i}].dtype" for i, _ in self._pointer_binders]
        parts += [f'getattr(args[{i}], "dtype", None)' for i, _ in self._scalar_binders]
        key = "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"
        code = (
            "def make(config):\n"
            "    table = {}\n"
            "    full = {}\n"
            "    def launch(*args, **kw):\n"
            "        try:\n"
            f"            kwd, f = table[{key}]\n"
            "        except (LookupError, AttributeError, TypeError):\n"
            "            return resolve(table, full, config, args, kw)\n"
            "        if kw == kwd:\n"
            "            return f(*args)\n"
            "        return resolve(table, full, config, args, kw)\n"
            "    launch.table = table\n"
            "    launch.full = full\n"
            "    return launch\n"
        )
        namespace: dict[str, Any] = {"resolve": self._resolve}
        exec(compile(code, f"<cuforge.jit {self.name}>", "exec"), namespace)  # noqa: S102 - our own generated code
        self._fast_source = code
        python_make = self._python_make = namespace["make"]
        binders = tuple(i for i, _ in self._pointer_binders + self._scalar_binders)
        optional = (False,) * len(self._pointer_binders) + (True,) * len(self._scalar_binders)
        resolve = self._resolve

        def make(config):
            # the same launcher in C (_launcher.c, JitDispatch) when the extension loads
            dispatch = _c_dispatch()
            if dispatch is None:
                return python_make(config)
            launcher = dispatch(binders, optional, {}, {}, config, resolve)
            torch_abi = _torch_dtype_shim()
            if torch_abi is not None:
                launcher.set_torch(*torch_abi)
            return launcher

        return make

    def _dtype_key(self, args: tuple) -> tuple | None:
        """The fast table's key for these arguments (None when it cannot be built)."""
        try:
            key = tuple(args[i].dtype for i, _ in self._pointer_binders) + tuple(
                getattr(args[i], "dtype", None) for i, _ in self._scalar_binders
            )
            hash(key)
        except (LookupError, AttributeError, TypeError):
            return None
        return key

    def _resolve(self, table: dict, full: dict, config, args: tuple, kw: dict):
        """The general path: find the executor by dtypes and keyword items (else specialize,
        compiling on first use), remember it for this call's key, launch.

        The fast table keeps keywords only when every value is an int or bool: they are
        compared with ``==``, which for other objects (a NumPy dtype equals the string
        ``"float"``, say) could match a different specialization."""
        dkey = self._dtype_key(args)
        fkey = None
        if dkey is not None:
            try:
                fkey = (*dkey, *kw.items())
                hash(fkey)
            except TypeError:  # an unhashable keyword value
                fkey = None
        exe = full.get(fkey) if fkey is not None else None
        if exe is None:
            exe = self._executor(self._spec_key(args, kw, check_count=True))
            if fkey is not None:
                if len(full) > 4096:
                    full.clear()
                full[fkey] = exe
        launcher = exe[config]
        fast = dkey is not None and all(v.__class__ in (int, bool) for v in kw.values())
        if not fast:
            return launcher(*args)
        if len(table) > 4096:
            table.clear()
        table[dkey] = (dict(kw), launcher)
        result = launcher(*args)
        # the first launch loads the kernel, which may rebuild its fast path (new argument
        # offsets from the driver): keep the launcher the Kernel hands out now
        table[dkey] = (dict(kw), exe[config])
        return result

    # -- specialization -------------------------------------------------------------------------

    def _signature(self) -> str:
        if self.params is None:
            return f"{self.name}(...)"
        return f"{self.name}({', '.join(p.type + (' ' + p.name if p.name else '') for p in self.params)})"

    def _spec_key(self, args: tuple, given: dict, *, check_count: bool) -> tuple:
        """(template arguments as C++ text, ((define, value), ...)): the specialization."""
        accepted = set(self._by_name) | set(self._constexpr_defaults)
        unknown = [k for k in given if k not in accepted]
        if unknown:
            tp = ", ".join(self.template_params) or "none"
            cx = ", ".join(self.constexprs) or "none"
            raise SpecializationError(
                f"{self.name}: unknown keyword {unknown[0]!r}; it takes template parameters "
                f"({tp}) and constexprs ({cx}) as keywords"
            )
        if check_count and self.params is not None and len(args) != len(self.params):
            raise SpecializationError(
                f"{self._signature()} takes {len(self.params)} arguments, got {len(args)}"
            )
        bound: dict[str, tuple[str, str]] = {}  # type param -> (C++ type, why)
        for tname, value in given.items():
            t = self._by_name.get(tname)
            if t is not None and (t.is_type or (t.kind == "" and _is_type_value(value))):
                try:
                    bound[tname] = (cxx_type(value), f"{tname}={value!r}")
                except SpecializationError as exc:
                    raise SpecializationError(
                        f"{self.name}: template parameter {tname}: {exc}"
                    ) from None
        self._deduce(args, bound)
        template_args: list[str | None] = []
        for t in self._tparams:
            if t.is_type or (t.kind == "" and t.name in bound):
                if t.name in bound:
                    template_args.append(bound[t.name][0])
                elif t.default is not None:
                    template_args.append(None)
                else:
                    template_args.append(self._undeducible(t, args))
                continue
            if t.name in given:
                template_args.append(_non_type_text(self.name, t, given[t.name]))
            elif t.default is not None:
                template_args.append(None)
            else:
                raise SpecializationError(
                    f"{self.name}: the constexpr template parameter {t.kind + ' ' if t.kind else ''}"
                    f"{t.name} was not given; pass {t.name}=... as a keyword"
                )
        # defaults: only trailing ones can be left to the declaration
        while template_args and template_args[-1] is None:
            template_args.pop()
        for t, a in zip(self._tparams, template_args, strict=False):
            if a is None:
                raise SpecializationError(
                    f"{self.name}: give {t.name}=... explicitly: its default ({t.default}) can "
                    "only be used when no later template parameter is given"
                )
        defines = []
        for cname, default in self._constexpr_defaults.items():
            if cname in given:
                value = given[cname]
            elif default is not _NO_DEFAULT:
                value = default
            else:
                raise SpecializationError(
                    f"{self.name}: constexpr {cname} was not given; pass {cname}=... (it becomes "
                    f"-D{cname}=...)"
                )
            defines.append((cname, _define_text(cname, value)))
        return tuple(template_args), tuple(defines)

    def _deduce(self, args: tuple, bound: dict[str, tuple[str, str]]) -> None:
        binders = list(self._pointer_binders) + list(self._scalar_binders)
        for index, tname in binders:
            if index >= len(args):
                continue
            arg = args[index]
            if index in dict(self._scalar_binders) and getattr(arg, "dtype", None) is None:
                continue  # a Python scalar fixes no C type
            p = self.params[index]
            try:
                cxx, what = _arg_dtype(arg)
            except SpecializationError as exc:
                raise SpecializationError(
                    f"{self.name}: argument {p.name or index!r} ({p.type}, argument {index}) "
                    f"binds template parameter {tname}: {exc}"
                ) from None
            if cxx is None:
                continue  # no element type (None, cuforge.Pointer): binds nothing
            why = f"argument {p.name or index!r} ({what}, argument {index})"
            previous = bound.get(tname)
            if previous is None:
                bound[tname] = (cxx, why)
            elif previous[0] != cxx:
                raise SpecializationError(
                    f"{self.name}: template parameter {tname} is bound to {previous[0]} by "
                    f"{previous[1]} and to {cxx} by {why}; pass arrays of one dtype, or "
                    f"convert them"
                )

    def _undeducible(self, t: _TemplateParam, args: tuple) -> str:
        scalars = [i for i, name in self._scalar_binders if name == t.name and i < len(args)]
        if scalars:
            p = self.params[scalars[0]]
            raise SpecializationError(
                f"{self.name}: template parameter {t.name} is only used by scalar parameter "
                f"{p.name!r}, and a Python {type(args[scalars[0]]).__name__} fixes no C type; pass "
                f"a typed scalar (numpy.float32(...)) or {t.name}=... (a dtype or C++ type name)"
            )
        users = [i for i, name in self._pointer_binders if name == t.name]
        if users and args:
            p = self.params[users[0]]
            raise SpecializationError(
                f"{self.name}: template parameter {t.name} could not be deduced: argument "
                f"{p.name!r} ({_describe(args[users[0]])}) has no element type; pass "
                f"{t.name}=... (a dtype or C++ type name)"
            )
        raise SpecializationError(
            f"{self.name}: template parameter {t.name} is neither deducible "
            f"{'from the arguments' if args else '(no arguments given)'} nor given; pass "
            f"{t.name}=... (a dtype such as torch.float32, or a C++ type name such as 'float')"
        )

    def _executor(self, spec: tuple) -> Kernel:
        exe = self._specs.get(spec)
        if exe is not None:
            return exe
        with self._lock:
            exe = self._specs.get(spec)
            if exe is None:
                exe = self._specs[spec] = self._build(spec)
        return exe

    def _build(self, spec: tuple) -> Kernel:
        template_args, defines = spec
        if self._tparams:
            expression = f"{self.name}<{', '.join(template_args)}>"
            name_expressions: tuple[str, ...] = (expression,)
        else:
            expression = self.name
            name_expressions = () if self._extern_c else (expression,)
        options = list(self._options)
        for cxx, header in _HEADER_FOR.items():
            if cxx in template_args and header.split(".")[0] not in self.source:
                options.append(f"--pre-include={header}")
        merged = dict(self._defines)
        merged.update(defines)
        kwargs = dict(self._compile_kwargs)
        program: Program = compile_cached(
            self.source,
            name=self._source_name,
            options=tuple(options),
            defines=merged,
            name_expressions=name_expressions,
            source_dir=self._source_dir,
            result_type=Program,
            **kwargs,
        )
        return program.kernel(expression)


_NO_DEFAULT = object()
_dispatch_type: list = []  # [the C JitDispatch type, or None], once per process


def _c_dispatch():
    """The C extension's ``JitDispatch`` type (None without the extension). The first call
    also makes ``JitKernel.__getitem__`` the extension's ``Subscript`` (a hit in
    ``_configs`` runs no Python code), as :class:`~cuforge.runtime.kernel.Kernel` does."""
    if _dispatch_type:
        return _dispatch_type[0]
    from cuforge.runtime import fastlaunch

    module = fastlaunch.load()
    dispatch = getattr(module, "JitDispatch", None) if module is not None else None
    if dispatch is not None and not isinstance(JitKernel.__dict__["__getitem__"], module.Subscript):
        JitKernel.__getitem__ = module.Subscript("_configs", JitKernel._getitem)
    _dispatch_type.append(dispatch)
    return dispatch


_torch_shim: dict = {}  # id(torch) -> the arguments of JitDispatch.set_torch, or None
#: the torch dtypes JitDispatch reads through the shim (others: through ``.dtype``)
_TORCH_DTYPES = (
    "float16 bfloat16 float32 float64 int8 int16 int32 int64 uint8 uint16 uint32 uint64 bool "
    "complex64 complex128"
).split()


def _torch_dtype_shim():
    """``(torch.Tensor, offset, aoti_torch_get_dtype address, dtypes by shim code)`` for
    ``JitDispatch.set_torch`` when torch is imported and its tensors pass the launcher's
    layout check (:func:`cuforge.runtime.fastpath.torch_abi`); else None."""
    torch = sys.modules.get("torch")
    if torch is None or not _dispatch_type or _dispatch_type[0] is None:
        return None
    found = _torch_shim.get(id(torch), False)
    if found is not False:
        return found
    from cuforge.runtime import fastlaunch, fastpath

    found = None
    abi = fastpath.torch_abi(fastlaunch.load(), torch)
    if abi is not None:
        offset, fns, _cuda, dtype_code = abi
        by_code: dict[int, object] = {}
        for name in _TORCH_DTYPES:
            dtype = getattr(torch, name, None)
            if dtype is None:
                continue
            try:
                by_code[dtype_code(dtype)] = dtype
            except (RuntimeError, TypeError, ValueError):  # a dtype this torch cannot make
                continue
        if by_code and min(by_code) >= 0 and max(by_code) < 256:
            table = tuple(by_code.get(c) for c in range(max(by_code) + 1))
            found = (torch.Tensor, offset, fns[0], table)
    _torch_shim[id(torch)] = found
    return found


def _is_type_value(value) -> bool:
    try:
        cxx_type(value)
    except SpecializationError:
        return False
    return not isinstance(value, (bool, int))


def _non_type_text(kernel: str, t: _TemplateParam, value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        if t.is_bool and value in (0, 1):
            return "true" if value else "false"
        return str(value)

    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, str) and value.strip():
        return value.strip()
    raise SpecializationError(
        f"{kernel}: template parameter {t.kind} {t.name} takes an int or bool (or C++ text), "
        f"not {type(value).__name__} {value!r}"
    )


def _define_text(name: str, value) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (int, float, str)):
        text = str(value)
        if "\n" in text:
            raise SpecializationError(
                f"constexpr {name}: the value must be one line, not {value!r}"
            )
        return text

    if isinstance(value, numbers.Number):
        return str(value.item() if hasattr(value, "item") else value)
    raise SpecializationError(
        f"constexpr {name} takes an int, float, bool or str value, not {type(value).__name__}"
    )


def jit(
    source_or_path: str | os.PathLike[str],
    name: str,
    *,
    template: Sequence[str] | None = None,
    constexpr: Sequence[str] | Mapping[str, Any] = (),
    **compile_kwargs: Any,
) -> JitKernel:
    """A kernel template that specializes itself on first use.

    Args:
        source_or_path: CUDA C++ source text, or the path of a ``.cu`` file (a path-like, or a
            one-line string naming an existing file or ending in ``.cu`` / ``.cuh``). The file
            is read once, now; its quoted includes resolve next to it.
        name: the ``__global__`` function (a template or not).
        template: the template parameter names in declaration order. Default: read from the
            declaration; when given, it must match it. Needed only when the declaration
            cannot be read (a macro): then every parameter is given as a keyword.
        constexpr: names of constants passed as defines (``-DTILE=32``) rather than template
            arguments; a mapping gives default values.
        compile_kwargs: ``options`` (a list or :class:`cuforge.Options`), ``include_dirs``,
            ``defines``, ``arch``, ``backend``, ``output``, ``headers`` -- as for
            :func:`cuforge.compile` -- ``source_name`` (the source's name in logs and the
            key; default ``<name>.cu``, or the file's name) and ``cache`` (the
            :class:`cuforge.Cache` its specializations are compiled through; default
            :func:`cuforge.default_cache`).

    Returns:
        A :class:`JitKernel`: ``k[grid, block](*args, **constexprs)`` launches,
        ``k.compile(*args, **constexprs)`` / ``k.specialize(**given)`` return the executor.

    Raises:
        SpecializationError: the kernel is not in the source, ``template=`` does not match
            its declaration, or a constexpr name is not an identifier.
        TypeError: an unknown keyword.
    """
    unknown = sorted(set(compile_kwargs) - set(COMPILE_KWARGS))
    if unknown:
        raise TypeError(
            f"cuforge.jit() got an unexpected keyword {unknown[0]!r}; it takes template=, "
            f"constexpr= and the compile keywords {', '.join(COMPILE_KWARGS)}"
        )
    if compile_kwargs.get("cache") is not None:
        resolve(compile_kwargs["cache"])  # a wrong argument is named now, not at launch
    source, source_dir, default_name = _source_of(source_or_path, name)
    source_name = compile_kwargs.pop("source_name", None) or default_name
    return JitKernel(
        source,
        name,
        source_dir=source_dir,
        source_name=source_name,
        template=tuple(template) if template is not None else None,
        constexpr=constexpr,
        compile_kwargs=compile_kwargs,
    )


def _source_of(source_or_path, name: str) -> tuple[str, str | None, str]:
    """(source text, the dir its quoted includes resolve in, its name)."""

    is_path = isinstance(source_or_path, os.PathLike)
    if isinstance(source_or_path, str) and "\n" not in source_or_path:
        text = source_or_path.strip()
        is_path = text.endswith((".cu", ".cuh", ".cuda")) or (
            "__global__" not in text and os.path.isfile(text)
        )
    elif not isinstance(source_or_path, (str, os.PathLike)):
        raise TypeError(
            f"source_or_path must be CUDA source text or a path, not {type(source_or_path).__name__}"
        )
    if is_path:
        path = os.fspath(source_or_path)
        source = read_source(path)
        return source, os.path.dirname(os.path.abspath(path)), os.path.basename(path)
    if "__global__" not in source_or_path:
        raise SpecializationError(
            f"source_or_path is neither CUDA source with a __global__ function nor an existing "
            f"file: {source_or_path[:80]!r}"
        )
    base = str(name).split("::")[-1].strip() or "kernel"
    return source_or_path, None, f"{base}.cu"
