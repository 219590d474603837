"""cuforge kernels as torch custom ops: ``torch.compile(fullgraph=True)`` and CUDA graphs
without C++.

Two ways in, both ending in a torch ``CustomOpDef`` (the op is a real
``torch.ops.<namespace>.<name>``, opaque to Dynamo, so it never breaks a graph), registered
with only the dispatcher entries a call needs (``CuforgeOp``: schema, fake, the device
kernel; autograd once ``register_autograd`` is called):

* **a kernel** -- ``custom_op("mylib::saxpy", kernel, mutates_args=("y",), grid=..., block=256)``.
  The schema comes from the kernel's C declaration: ``T*`` -> ``Tensor``, integer scalars ->
  ``SymInt``, ``float`` / ``double`` / ``__half`` / ``__nv_bfloat16`` -> ``float``, ``bool`` ->
  ``bool``. Parameters named in ``outputs=`` are allocated by the op (``out_like=`` or ``fake=``
  says how) and returned instead of taken.
* **a launcher** -- any Python function with type hints that launches one or more kernels
  (``k[grid, block](...)``, a ``cuforge.jit`` kernel, anything). The schema comes from its type
  hints (:func:`torch.library.infer_schema`), or ``schema=``.

(This module is ``custom_ops``, plural, so that importing it never shadows the function
``cuforge.torch.custom_op`` with a submodule of the same name.)

What is guaranteed:

* every launch of a kernel-mode op runs on torch's current stream on the tensors' device, so
  it is ordered with the torch work around it and is captured by ``torch.cuda.graph``;
* an op that returns tensors has a fake (meta) implementation -- ``fake=`` or one built from
  ``out_like=`` -- or registration fails saying so; an op that only mutates gets a fake that
  returns None;
* the schema is checked against the kernel (or the launcher's parameters) before anything is
  registered: a wrong count, a Tensor for a scalar, a ``const`` pointer declared mutated, a
  bad qualname each raise :class:`CustomOpError` naming the argument and what was expected.
"""

from __future__ import annotations

import inspect
import keyword
from typing import TYPE_CHECKING

from cuforge.base.errors import CuforgeError
from cuforge.base.scalar_types import SCALAR_TYPES
from cuforge.runtime.kernel import Kernel
from cuforge.torch.opshim import written_by

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

__all__ = ["custom_op", "derive_schema", "CustomOpError"]

#: namespaces that belong to torch itself
_RESERVED_NAMESPACES = frozenset({"aten", "prim", "prims", "torch", "_refs", "_c10d_functional"})

#: kernel scalar code (see :data:`cuforge.runtime.signature.SCALAR_CODES`) -> schema type
_SCALAR_SCHEMA = {t.code: t.schema for t in SCALAR_TYPES}

#: schema type spelling -> the kind it stands for ("int" and "SymInt" are both integers)
_SCHEMA_KINDS = {
    "Tensor": "Tensor",
    "SymInt": "int",
    "int": "int",
    "float": "float",
    "bool": "bool",
}


class CustomOpError(CuforgeError, ValueError):
    """A custom op cannot be registered as asked: the message names the argument (the
    qualname, a schema argument, a kernel parameter) and says what was expected."""


# -- small pieces --------------------------------------------------------------------------


def _check_qualname(qualname: object) -> tuple[str, str]:
    example = "e.g. 'mylib::saxpy'"
    if not isinstance(qualname, str):
        raise CustomOpError(
            f"custom_op: qualname must be a string 'namespace::name' ({example}), "
            f"got {type(qualname).__name__} {qualname!r}"
        )
    parts = qualname.split("::")
    if len(parts) != 2 or not all(parts):
        raise CustomOpError(
            f"custom_op: qualname must be 'namespace::name' with exactly one '::' ({example}), "
            f"got {qualname!r}"
        )
    namespace, name = parts
    for what, part in (("namespace", namespace), ("name", name)):
        if not part.isidentifier() or not part.isascii():
            raise CustomOpError(
                f"custom_op: the {what} {part!r} in qualname {qualname!r} must be an ASCII "
                f"identifier (letters, digits, underscores; no dots or dashes) -- {example}"
            )
    if namespace in _RESERVED_NAMESPACES:
        raise CustomOpError(
            f"custom_op: the namespace {namespace!r} belongs to torch; use your project's name "
            f"as the namespace ({example})"
        )
    return namespace, name


def _names(value: object, what: str) -> tuple[str, ...]:
    """``mutates_args`` / ``outputs`` as a tuple of names (a single string is one name)."""
    if value is None:
        return ()
    if isinstance(value, str):
        if value == "unknown" and what == "mutates_args":
            raise CustomOpError(
                "custom_op: mutates_args='unknown' is not accepted: name the arguments the op "
                "writes (an empty tuple when it writes none), so torch.compile can reorder it"
            )
        return (value,)
    try:
        names = tuple(value)  # type: ignore[arg-type]
    except TypeError:
        raise CustomOpError(
            f"custom_op: {what} must be a sequence of argument names, got "
            f"{type(value).__name__} {value!r}"
        ) from None
    for n in names:
        if not isinstance(n, str):
            raise CustomOpError(
                f"custom_op: {what} must hold argument names (strings), got {n!r} in {value!r}"
            )
    if len(set(names)) != len(names):
        raise CustomOpError(f"custom_op: {what} names an argument twice: {value!r}")
    return names


def _pointee_const(ctype: str) -> bool:
    """Whether a pointer type's pointee is const: ``const float*``, ``float const*`` (but not
    ``float* const``)."""
    head = ctype.rsplit("*", 1)[0].replace("*", " ")
    return "const" in head.split()


def _param_name(p, index: int) -> str:
    name = p.name or f"arg{index}"
    if keyword.iskeyword(name):
        name += "_"
    return name


class _Arg:
    """One kernel parameter as the op sees it."""

    __slots__ = ("name", "schema_type", "const", "param")

    def __init__(self, name: str, schema_type: str, const: bool, param) -> None:
        self.name = name
        self.schema_type = schema_type
        self.const = const
        self.param = param


def _kernel_args(kernel) -> list[_Arg]:
    params = getattr(kernel, "params", None)
    label = getattr(kernel, "name", None) or repr(kernel)
    if params is None:
        raise CustomOpError(
            f"custom_op: cannot read the declaration of kernel {label!r}, so no schema can be "
            'derived from it; declare it extern "C" (or get it by a name expression) so '
            "cuforge can read its parameters, or wrap the launch in a function with type hints "
            "and pass that function instead"
        )
    args = []
    for i, p in enumerate(params):
        name = _param_name(p, i)
        if p.kind == "pointer":
            args.append(_Arg(name, "Tensor", _pointee_const(p.type or ""), p))
            continue
        schema_type = _SCALAR_SCHEMA.get(p.code) if p.kind == "scalar" else None
        if schema_type is None:
            raise CustomOpError(
                f"custom_op: kernel {label!r} parameter {name!r} ({p.type}, argument {i}) is "
                "passed by value as a struct or an unknown type, which a torch op cannot carry; "
                "torch ops take Tensor, int, float and bool. Wrap the launch in a Python "
                "function with type hints (build the struct there) and pass that function"
            )
        args.append(_Arg(name, schema_type, False, p))
    return args


def _format_schema(inputs: list[_Arg], mutated: set[str], outputs: int) -> str:
    parts = []
    alias = iter("abcdefghijklmnopqrstuvwxyz")
    for a in inputs:
        t = a.schema_type
        if a.name in mutated:
            t = f"Tensor({next(alias)}!)"
        parts.append(f"{t} {a.name}")
    if outputs == 0:
        ret = "()"
    elif outputs == 1:
        ret = "Tensor"
    else:
        ret = "(" + ", ".join(["Tensor"] * outputs) + ")"
    return f"({', '.join(parts)}) -> {ret}"


def _plan(kernel, outputs: tuple[str, ...], mutates: tuple[str, ...]):
    """(kernel args, op inputs, schema) for a kernel-mode op; checks outputs / mutates_args."""
    label = getattr(kernel, "name", None) or repr(kernel)
    args = _kernel_args(kernel)
    by_name = {a.name: a for a in args}
    listing = ", ".join(f"{a.name} ({a.param.type})" for a in args) or "none"
    for what, names in (("outputs", outputs), ("mutates_args", mutates)):
        for n in names:
            a = by_name.get(n)
            if a is None:
                raise CustomOpError(
                    f"custom_op: {what} names {n!r}, which is not a parameter of kernel "
                    f"{label!r} (its parameters: {listing})"
                )
            if a.schema_type != "Tensor":
                raise CustomOpError(
                    f"custom_op: {what} names {n!r}, a {a.param.type} scalar of kernel {label!r}; "
                    f"only pointer parameters (tensors) can be {'outputs' if what == 'outputs' else 'mutated'}"
                )
            if a.const:
                raise CustomOpError(
                    f"custom_op: {what} names {n!r}, but kernel {label!r} declares it "
                    f"{a.param.type}: the kernel cannot write through a pointer to const. Drop "
                    f"the const in the kernel or remove {n!r} from {what}"
                )
    both = set(outputs) & set(mutates)
    if both:
        raise CustomOpError(
            f"custom_op: {sorted(both)} are in both outputs and mutates_args; an output is "
            "allocated by the op (not passed in), a mutated argument is passed in and written: "
            "choose one"
        )
    inputs = [a for a in args if a.name not in outputs]
    return args, inputs, _format_schema(inputs, set(mutates), len(outputs))


def derive_schema(kernel, *, outputs: Iterable[str] = (), mutates_args: Iterable[str] = ()) -> str:
    """The op schema :func:`custom_op` derives from ``kernel``'s C declaration, e.g.
    ``(Tensor(a!) y, Tensor x, float a, SymInt n) -> ()`` for
    ``saxpy(float* y, const float* x, float a, int n)`` with ``mutates_args=("y",)``.

    Raises :class:`CustomOpError` when a parameter cannot be a torch op argument or a name in
    ``outputs`` / ``mutates_args`` is not a writable pointer parameter."""
    return _plan(kernel, _names(outputs, "outputs"), _names(mutates_args, "mutates_args"))[2]


def _parse_schema(schema: object, qualname: str):
    """torch's parsed FunctionSchema of ``schema`` (with or without the op name)."""
    import torch

    if not isinstance(schema, str) or "(" not in schema or "->" not in schema:
        raise CustomOpError(
            f"custom_op({qualname!r}): schema must be a string like "
            f"'(Tensor x, SymInt n) -> Tensor', got {schema!r}"
        )
    text = schema[schema.index("(") :]
    try:
        parsed = torch._C.parse_schema("op" + text)
    except RuntimeError as exc:
        raise CustomOpError(
            f"custom_op({qualname!r}): torch cannot parse schema {schema!r}: "
            f"{str(exc).splitlines()[0]}"
        ) from None
    return text, parsed


def _schema_kind(arg_type) -> str:
    text = str(arg_type)
    return _SCHEMA_KINDS.get(text, text)


def _check_schema_matches_kernel(schema_text: str, parsed, inputs, outputs, label, derived):
    hint = f"the schema derived from the kernel is {derived!r}"
    given = parsed.arguments
    if len(given) != len(inputs):
        raise CustomOpError(
            f"custom_op: schema {schema_text!r} has {len(given)} arguments but kernel {label!r} "
            f"takes {len(inputs)} as op inputs ({', '.join(a.name for a in inputs) or 'none'}"
            f"{'; outputs ' + ', '.join(outputs) if outputs else ''}); {hint}"
        )
    for i, (g, a) in enumerate(zip(given, inputs, strict=True)):
        kind = _schema_kind(g.type)
        want = _SCHEMA_KINDS[a.schema_type]
        if kind != want:
            raise CustomOpError(
                f"custom_op: schema argument {i} {g.name!r} is {g.type} but kernel {label!r} "
                f"parameter {a.name!r} is {a.param.type}, which needs {a.schema_type}; {hint}"
            )
        if g.name != a.name:
            raise CustomOpError(
                f"custom_op: schema argument {i} is named {g.name!r} but kernel {label!r} calls "
                f"that parameter {a.name!r}; use the kernel's names ({hint})"
            )
    returns = parsed.returns
    if len(returns) != len(outputs) or any(_schema_kind(r.type) != "Tensor" for r in returns):
        raise CustomOpError(
            f"custom_op: schema {schema_text!r} returns {len(returns)} value(s) but the op "
            f"returns {len(outputs)} tensor(s) (outputs={tuple(outputs)!r}); {hint}"
        )


def _mutated_in_schema(parsed) -> set[str]:
    return {a.name for a in parsed.arguments if written_by(a)}


def _normalize_dims(value):
    """A grid/block value as a tuple (for the zero-size check); ints stay ints."""
    if type(value) is int:
        return value, value == 0
    try:
        dims = tuple(value)
    except TypeError:
        return value, False
    return dims, any(type(d) is int and d == 0 for d in dims)


def _binder(parsed):
    """A function (args, kwargs) -> list of argument values in schema order."""
    arguments = list(parsed.arguments)
    n = len(arguments)

    def bind(args: tuple, kwargs: dict) -> list:
        if not kwargs and len(args) == n:
            return list(args)
        values = list(args)
        for a in arguments[len(args) :]:
            if a.name in kwargs:
                values.append(kwargs[a.name])
            elif a.has_default_value():
                values.append(a.default_value)
            else:
                raise TypeError(f"missing argument {a.name!r}")
        return values

    return bind


def _out_like_fake(out_like, parsed, qualname: str, returns: int):
    """A fake/allocation function built from ``out_like``: empty tensors (contiguous) shaped
    like the named tensor inputs."""
    import torch

    names = [a.name for a in parsed.arguments]
    tensors = {a.name for a in parsed.arguments if _schema_kind(a.type) == "Tensor"}
    if isinstance(out_like, str):
        like = [out_like] * returns
    else:
        try:
            like = list(out_like)
        except TypeError:
            raise CustomOpError(
                f"custom_op({qualname!r}): out_like must name a tensor argument (or one per "
                f"output), got {type(out_like).__name__} {out_like!r}"
            ) from None
    if len(like) != returns:
        raise CustomOpError(
            f"custom_op({qualname!r}): out_like names {len(like)} argument(s) but the op returns "
            f"{returns} tensor(s); give one name per output, or a single name for all"
        )
    for name in like:
        if name not in tensors:
            raise CustomOpError(
                f"custom_op({qualname!r}): out_like names {name!r}, which is not a Tensor "
                f"argument of the op (Tensor arguments: {', '.join(sorted(tensors)) or 'none'})"
            )
    index = [names.index(name) for name in like]
    bind = _binder(parsed)
    contiguous = torch.contiguous_format
    empty_like = torch.empty_like

    if returns == 1:
        (i0,) = index

        def fake_one(*args, **kwargs):
            return empty_like(bind(args, kwargs)[i0], memory_format=contiguous)

        fake_one._cuforge_like = tuple(index)  # the kernel-mode impl allocates the same itself
        return fake_one

    def fake_many(*args, **kwargs):
        values = bind(args, kwargs)
        return tuple(empty_like(values[i], memory_format=contiguous) for i in index)

    fake_many._cuforge_like = tuple(index)
    return fake_many


def _returns_nothing(*args, **kwargs) -> None:
    return None


# -- the kernel-mode implementation -------------------------------------------------------


def _kernel_impl(kernel, args, inputs, outputs, parsed, alloc, grid, block, shared_mem, mutates):
    """The CUDA implementation of a kernel-mode op."""
    bind = _binder(parsed)
    input_pos = {a.name: i for i, a in enumerate(inputs)}
    plan = []  # per kernel parameter: (True, input index) or (False, output index)
    for a in args:
        if a.name in input_pos:
            plan.append((True, input_pos[a.name]))
        else:
            plan.append((False, outputs.index(a.name)))
    # read-only tensors are made contiguous (a no-op when they are); written ones cannot be
    readonly = [
        i for i, a in enumerate(inputs) if a.schema_type == "Tensor" and a.name not in mutates
    ]
    grid_fn = grid if callable(grid) else None
    block_fn = block if callable(block) else None
    shm_fn = shared_mem if callable(shared_mem) else None
    n_out = len(outputs)
    label = f"custom_op over kernel {getattr(kernel, 'name', kernel)!r}"
    fixed = None if (grid_fn or block_fn or shm_fn) else (grid, block, shared_mem)
    # outputs from out_like: allocated here from the bound values (no second bind, no call)
    like = getattr(alloc, "_cuforge_like", None)
    if like is not None:  # (input position, made contiguous above)
        like = [(i, i in readonly) for i in like]
    n_in = len(inputs)
    if like is not None:
        import torch

        empty_like, contiguous = torch.empty_like, torch.contiguous_format

    def impl(*call_args, **call_kwargs):
        if len(call_args) == n_in and not call_kwargs:
            values = list(call_args)
        else:
            values = bind(call_args, call_kwargs)
        for i in readonly:
            t = values[i]
            if not t.is_contiguous():
                values[i] = t.contiguous()
        if n_out:
            if like is not None:
                # a read-only input is contiguous by now: preserve_format (the default, and
                # faster to ask for) then gives a contiguous output too
                outs = [
                    empty_like(values[i]) if ro else empty_like(values[i], memory_format=contiguous)
                    for i, ro in like
                ]
            else:
                outs = alloc(*call_args, **call_kwargs)
                if n_out == 1:
                    outs = (outs,)
                elif not isinstance(outs, (tuple, list)) or len(outs) != n_out:
                    raise CustomOpError(
                        f"{label}: the fake allocates the outputs {outputs} here, so it must "
                        f"return {n_out} tensors, not {type(outs).__name__} {outs!r}"
                    )
            kargs = [values[j] if is_input else outs[j] for is_input, j in plan]
        else:
            outs = ()
            kargs = values
        if fixed is not None:
            kernel[fixed](*kargs)
        else:
            g = grid_fn(*kargs) if grid_fn else grid
            if type(g) is int:
                empty = g == 0
            else:
                g, empty = _normalize_dims(g)
            if not empty:
                b = block_fn(*kargs) if block_fn else block
                s = shm_fn(*kargs) if shm_fn else shared_mem
                kernel[g, b, s](*kargs)
        if n_out == 0:
            return None
        if n_out == 1:
            return outs[0]
        return tuple(outs)

    names = [a.name for a in inputs]
    if any(a.kwarg_only for a in parsed.arguments) or [a.name for a in parsed.arguments] != names:
        return impl  # a schema= with keyword-only arguments or other names: the general impl
    ns = {
        "_cf_kernel": kernel,
        "_cf_alloc": alloc,
        "_cf_grid": grid,
        "_cf_block": block,
        "_cf_shm": shared_mem,
        "_cf_fixed": fixed,
        "_cf_normalize": _normalize_dims,
        "_cf_error": CustomOpError,
        "_cf_label": label,
        "_cf_outputs": outputs,
    }
    return _generate_impl(ns, names, args, outputs, plan, readonly, like, fixed, n_out) or impl


def _generate_impl(ns, names, args, outputs, plan, readonly, like, fixed, n_out):
    """The kernel-mode implementation as straight-line Python for this op (the general
    ``impl`` with its loops unrolled: ~1 us less per call); None when a name cannot be a
    Python parameter."""
    out_names = [f"_cf_out{j}" for j in range(n_out)]
    if not all(n.isidentifier() and not keyword.iskeyword(n) for n in names):
        return None
    if len(set(names)) != len(names) or any(n.startswith("_cf_") for n in names):
        return None
    lines = [f"def impl({', '.join(names)}):"]
    for i in readonly:
        n = names[i]
        lines.append(f"    if not {n}.is_contiguous(): {n} = {n}.contiguous()")
    if n_out:
        if like is not None:
            import torch

            ns["_cf_empty_like"] = torch.empty_like
            ns["_cf_contiguous"] = torch.contiguous_format
            for j, (i, ro) in enumerate(like):
                fmt = "" if ro else ", memory_format=_cf_contiguous"
                lines.append(f"    {out_names[j]} = _cf_empty_like({names[i]}{fmt})")
        else:
            lines.append(f"    _cf_outs = _cf_alloc({', '.join(names)})")
            if n_out == 1:
                lines.append(f"    {out_names[0]} = _cf_outs")
            else:
                lines.append(
                    f"    if not isinstance(_cf_outs, (tuple, list)) or len(_cf_outs) != {n_out}:"
                )
                lines.append(
                    "        raise _cf_error(f'{_cf_label}: the fake allocates the outputs "
                    "{_cf_outputs} here, so it must return "
                    f"{n_out} tensors, not {{type(_cf_outs).__name__}} {{_cf_outs!r}}')"
                )
                lines.append(f"    {', '.join(out_names)}, = _cf_outs")
    kargs = ", ".join(names[j] if is_input else out_names[j] for is_input, j in plan)
    ret = "None" if n_out == 0 else out_names[0] if n_out == 1 else f"({', '.join(out_names)},)"
    if fixed is not None:
        lines.append(f"    _cf_kernel[_cf_fixed]({kargs})")
    else:
        grid, block, shm = ns["_cf_grid"], ns["_cf_block"], ns["_cf_shm"]
        lines.append(f"    _cf_g = _cf_grid({kargs})" if callable(grid) else "    _cf_g = _cf_grid")
        lines += [
            "    if type(_cf_g) is int:",
            "        if _cf_g == 0:",
            f"            return {ret}",
            "    else:",
            "        _cf_g, _cf_empty = _cf_normalize(_cf_g)",
            "        if _cf_empty:",
            f"            return {ret}",
        ]
        b = f"_cf_block({kargs})" if callable(block) else "_cf_block"
        sh = f"_cf_shm({kargs})" if callable(shm) else "_cf_shm"
        lines.append(f"    _cf_kernel[_cf_g, {b}, {sh}]({kargs})")
    lines.append(f"    return {ret}")
    source = "\n".join(lines) + "\n"
    code = compile(source, f"<cuforge custom_op impl: {ns['_cf_label']}>", "exec")
    exec(code, ns)  # noqa: S102 - our own generated source, names checked above
    impl = ns["impl"]
    impl._cuforge_source = source
    return impl


def _is_kernel(obj) -> bool:
    if isinstance(obj, Kernel):
        return True
    return hasattr(obj, "params") and hasattr(obj, "__getitem__") and hasattr(obj, "program")


# -- the public entry point ---------------------------------------------------------------


def custom_op(
    qualname: str,
    kernel_or_launcher=None,
    *,
    schema: str | None = None,
    mutates_args: Iterable[str] = (),
    fake: Callable | None = None,
    out_like: str | Sequence[str] | None = None,
    outputs: Iterable[str] = (),
    grid=None,
    block=None,
    shared_mem=0,
    device_types: str | Sequence[str] = "cuda",
    tags=None,
    cpp: bool | None = None,
):
    """Register a cuforge kernel, or a Python launcher around kernels, as the torch custom op
    ``torch.ops.<namespace>.<name>``; returns torch's ``CustomOpDef`` (callable like the op;
    ``.register_autograd`` etc. work on it). Without ``kernel_or_launcher`` it is a decorator.

    With a **kernel** (a :class:`cuforge.Kernel`, e.g. ``prog.kernel("saxpy")`` or a
    ``cuforge.jit`` executor): the op's arguments are the kernel's parameters in order, minus
    ``outputs``; the schema is derived from the C declaration (see :func:`derive_schema`) or
    given in ``schema=`` and checked against it. ``grid`` / ``block`` / ``shared_mem``: an int, a
    tuple, or a function of the kernel's arguments (outputs already allocated) returning one;
    a grid with a 0 dimension launches nothing. Outputs are allocated by ``out_like`` (empty
    contiguous tensors like the named input) or else by calling ``fake`` on the real inputs.

    With a **launcher** (any other callable): the schema comes from its type hints or
    ``schema=``; the launcher runs as the op's CUDA implementation.

    ``mutates_args``: the arguments the op writes (exact: torch.compile relies on it).
    ``fake``: the fake (meta) implementation, taking the op's arguments; required for an op
    that returns tensors unless ``out_like`` says how outputs look. An op that only mutates
    gets a fake returning None. ``device_types``: where the implementation is registered
    ("cuda"; None: every device). ``tags``: torch.Tag values for the op's definition.
    ``cpp``: the CUDA kernel of a kernel-mode op in C++ (:mod:`cuforge.torch.opshim`; ~3-5 us
    less per call): True: try it (even without a GPU); False: never; None (default): when
    torch sees a GPU. ``CUFORGE_TORCH_OP_SHIM=0`` turns it off for the process.
    When it cannot be used the Python kernel stays (``op._cuforge_cpp_why`` says why; with
    ``cpp=True`` a warning does too). ``grid=cuforge.torch.cdiv_grid(param, per)`` is the
    grid form the C++ kernel evaluates itself.

    The op is registered without torch's per-call Python layers (an autograd kernel, an
    ADInplaceOrView kernel, a checking wrapper): the device kernel is the Python
    implementation itself, which bumps the version counters of the tensors it writes.
    ``register_autograd`` adds the autograd kernel when the op needs one.

    Raises :class:`CustomOpError` for a bad qualname, a schema that does not match the kernel
    or launcher, a missing fake, or an op that neither returns nor mutates anything.
    """
    if kernel_or_launcher is None:

        def decorate(fn):
            return custom_op(
                qualname,
                fn,
                schema=schema,
                mutates_args=mutates_args,
                fake=fake,
                out_like=out_like,
                outputs=outputs,
                grid=grid,
                block=block,
                shared_mem=shared_mem,
                device_types=device_types,
                tags=tags,
                cpp=cpp,
            )

        _check_qualname(qualname)
        return decorate

    import torch

    namespace, name = _check_qualname(qualname)
    mutates = _names(mutates_args, "mutates_args")
    outs = _names(outputs, "outputs")
    if fake is not None and not callable(fake):
        raise CustomOpError(
            f"custom_op({qualname!r}): fake must be a function of the op's arguments returning "
            f"empty tensors shaped like the outputs, got {type(fake).__name__} {fake!r}"
        )
    kind = type(kernel_or_launcher).__name__
    if kind == "JitKernel" and not _is_kernel(kernel_or_launcher):
        raise CustomOpError(
            f"custom_op({qualname!r}): got a cuforge.jit kernel, whose types are not fixed yet; "
            "pass an executor (k.compile(...) or k.specialize(...)), or a launcher function "
            "with type hints that calls k[grid, block](...)"
        )

    if _is_kernel(kernel_or_launcher):
        kernel = kernel_or_launcher
        label = getattr(kernel, "name", None) or repr(kernel)
        args, inputs, derived = _plan(kernel, outs, mutates)
        if schema is None:
            schema_text = derived
            _, parsed = _parse_schema(schema_text, qualname)
        else:
            schema_text, parsed = _parse_schema(schema, qualname)
            _check_schema_matches_kernel(schema_text, parsed, inputs, outs, label, derived)
        if grid is None or block is None:
            names = ", ".join(a.name for a in args)
            raise CustomOpError(
                f"custom_op({qualname!r}): a kernel op needs grid= and block=: an int, a tuple, "
                f"or a function of the kernel's arguments ({names}) returning one, e.g. "
                f"grid=lambda {names}: ..."
            )
        impl_fn = None  # built below, once the fake is known
    elif callable(kernel_or_launcher):
        launcher = kernel_or_launcher
        label = getattr(launcher, "__qualname__", None) or repr(launcher)
        if outs:
            raise CustomOpError(
                f"custom_op({qualname!r}): outputs= is for kernels (the op allocates those "
                f"kernel parameters); a launcher {label!r} allocates and returns its own outputs"
            )
        if grid is not None or block is not None:
            raise CustomOpError(
                f"custom_op({qualname!r}): grid= and block= are for kernels; the launcher "
                f"{label!r} chooses its own launch configuration"
            )
        _check_launcher_mutates(launcher, mutates, qualname, label)
        if schema is None:
            try:
                schema_text = torch.library.infer_schema(
                    _with_resolved_hints(launcher, torch), mutates_args=mutates
                )
            except ValueError as exc:
                raise CustomOpError(
                    f"custom_op({qualname!r}): cannot derive a schema from the type hints of "
                    f"launcher {label!r}: {exc}. Annotate every parameter (Tensor, int, float, "
                    "bool, ...) and the return type (Tensor, a tuple of Tensors, or None), or "
                    "pass schema="
                ) from None
            _, parsed = _parse_schema(schema_text, qualname)
        else:
            schema_text, parsed = _parse_schema(schema, qualname)
            _check_schema_matches_launcher(schema_text, parsed, launcher, label)
        for n in mutates:
            if n not in {a.name for a in parsed.arguments}:
                names = ", ".join(a.name for a in parsed.arguments) or "none"
                raise CustomOpError(
                    f"custom_op({qualname!r}): mutates_args names {n!r}, which is not an "
                    f"argument of launcher {label!r} (its arguments: {names})"
                )
        impl_fn = launcher
    else:
        raise CustomOpError(
            f"custom_op({qualname!r}): expected a cuforge Kernel (prog.kernel(name)) or a "
            f"launcher function, got {type(kernel_or_launcher).__name__} {kernel_or_launcher!r}"
        )

    if schema is not None:
        declared = _mutated_in_schema(parsed)
        if declared != set(mutates):
            raise CustomOpError(
                f"custom_op({qualname!r}): schema {schema_text!r} marks {sorted(declared)} as "
                f"written (Tensor(a!)) but mutates_args is {list(mutates)}; make them the same"
            )
    returns = len(parsed.returns)
    if returns == 0 and not mutates:
        raise CustomOpError(
            f"custom_op({qualname!r}): the op returns nothing and mutates nothing, so "
            "torch.compile may drop it: name the tensors it writes in mutates_args (or, for a "
            "kernel, the parameters it fills in outputs=)"
        )

    # the fake (meta) implementation
    if fake is not None:
        fake_fn = fake
        if out_like is not None:
            raise CustomOpError(
                f"custom_op({qualname!r}): give fake= or out_like=, not both (out_like builds "
                "a fake that returns empty tensors like the named input)"
            )
    elif out_like is not None:
        if returns == 0:
            raise CustomOpError(
                f"custom_op({qualname!r}): out_like= describes outputs, but the op returns "
                "nothing (it only mutates); drop out_like"
            )
        if any(_schema_kind(r.type) != "Tensor" for r in parsed.returns):
            raise CustomOpError(
                f"custom_op({qualname!r}): out_like= can only describe Tensor outputs; the "
                f"schema {schema_text!r} returns other values: pass fake= instead"
            )
        fake_fn = _out_like_fake(out_like, parsed, qualname, returns)
    elif returns == 0:
        fake_fn = _returns_nothing
    else:
        what = f"outputs {list(outs)}" if outs else f"{returns} value(s) (schema {schema_text!r})"
        first = next((a.name for a in parsed.arguments if _schema_kind(a.type) == "Tensor"), "x")
        raise CustomOpError(
            f"custom_op({qualname!r}): the op returns {what}, so torch.compile needs a fake "
            f"implementation that says their shapes and dtypes: pass out_like={first!r} (empty "
            f"tensors like that input) or fake=lambda ...: torch.empty_like({first})"
        )

    cpp_plan = "launcher mode (the launcher is Python)"
    if impl_fn is None:
        from cuforge.torch import opshim

        py_grid = grid
        if isinstance(grid, opshim.CdivGrid):
            try:
                py_grid = opshim._bind_grid(
                    grid, [a.name for a in args], f"custom_op({qualname!r})"
                )[0]
            except ValueError as exc:
                raise CustomOpError(str(exc)) from None
        cpp_plan = opshim.enabled(cpp)
        if cpp_plan is None:
            cpp_plan = opshim.plan(
                kernel_or_launcher,
                args,
                inputs,
                outs,
                parsed,
                fake_fn,
                grid,
                block,
                shared_mem,
                set(mutates),
            )
        impl_fn = _kernel_impl(
            kernel_or_launcher,
            args,
            inputs,
            outs,
            parsed,
            fake_fn,
            py_grid,
            block,
            shared_mem,
            set(mutates),
        )
        impl_fn.__name__ = name
        impl_fn.__qualname__ = name
        impl_fn.__module__ = getattr(kernel_or_launcher, "__module__", __name__)

    op_type = _op_type()
    try:
        keys = _dispatch_keys(device_types)
        op = op_type(namespace, name, schema_text, impl_fn, _tags(tags, qualname))
        op._abstract_fn = fake_fn
        if isinstance(cpp_plan, str):
            why = cpp_plan
        else:
            from cuforge.torch import opshim

            why = opshim.register(op, kernel_or_launcher, *cpp_plan)
        op._cuforge_cpp_why = why
        if why is None:
            keys = [k for k in keys if k != "CUDA"]  # the C++ kernel is the CUDA one
        elif cpp:
            import warnings

            warnings.warn(f"custom_op({qualname!r}): the Python kernel stays: {why}", stacklevel=2)
        if keys:
            op._register_backend(impl_fn, keys, parsed)
            if len(keys) == 1 and op._cuforge_fast is None:
                from cuforge.torch import opshim

                # eagerly, a plain call runs the Python kernel without the dispatcher's round
                # trip (the C++ kernel's entry does the same for its kernel); the entry
                # checks Dynamo's frame hook itself (_dynamo_disabled's check, one layer less)
                op._cuforge_entry_why = opshim.python_entry(op, impl_fn, parsed, keys[0], cpp)
    except (RuntimeError, ValueError, NotImplementedError) as exc:
        raise CustomOpError(
            f"custom_op({qualname!r}): torch refused to register the op with schema "
            f"{schema_text!r}: {str(exc).splitlines()[0] if str(exc) else exc!r}"
        ) from exc
    return op


def _tags(tags, qualname: str) -> tuple:
    import torch

    if tags is None:
        return ()
    if isinstance(tags, torch.Tag):
        return (tags,)
    try:
        found = tuple(tags)
    except TypeError:
        found = (tags,)
    for t in found:
        if not isinstance(t, torch.Tag):
            raise CustomOpError(
                f"custom_op({qualname!r}): tags must be torch.Tag values (e.g. "
                f"torch.Tag.needs_fixed_stride_order), got {type(t).__name__} {t!r}"
            )
    return found


def _dispatch_keys(device_types) -> list[str]:
    """The dispatcher keys of ``device_types`` ("cuda" -> "CUDA"; None: every device, as
    torch.library.custom_op does: CompositeExplicitAutograd)."""
    import torch

    if device_types is None:
        return ["CompositeExplicitAutograd"]
    names = [device_types] if isinstance(device_types, str) else list(device_types)
    keys = []
    for dt in names:
        try:
            keys.append(torch._C._dispatch_key_for_device(dt))
        except (RuntimeError, TypeError) as exc:
            raise ValueError(f"device_types: {dt!r} is not a torch device type ({exc})") from None
    return keys


def _dynamo_disabled(fn, torch):
    """``fn`` run with Dynamo off, as torch's own custom_op runs its kernels: a kernel called
    eagerly while a compiled region's frame hook is active (a graph break) is never traced.

    ``torch.compiler.disable(fn, recursive=True)`` costs about 1 us per call, so it is used
    only while Dynamo's hook is set (``get_eval_frame_callback()``, a C call of ~20 ns); in
    plain eager code, and inside compiled graphs (run-only), ``fn`` is called directly.
    torch._dynamo is imported on the first such call (it is heavy), not at registration."""
    try:
        hook = torch._C._dynamo.eval_frame.get_eval_frame_callback
    except AttributeError:  # another torch: always through the wrapper
        hook = None
    wrapped = None

    def run(*args, **kwargs):
        nonlocal wrapped
        if hook is not None:
            active = hook()
            if active is None or active is False:
                return fn(*args, **kwargs)
        if wrapped is None:
            wrapped = torch.compiler.disable(fn, recursive=True)
        return wrapped(*args, **kwargs)

    return run


_OP_TYPE = None


def _op_type():
    """:class:`CuforgeOp`, made once torch is imported: torch's ``CustomOpDef`` with a lean
    registration (see :meth:`CuforgeOp._register_to_dispatcher`)."""
    global _OP_TYPE
    if _OP_TYPE is not None:
        return _OP_TYPE
    import torch
    from torch._library import autograd as torch_autograd
    from torch._library.custom_ops import CustomOpDef

    # one Python call (is_compiling() makes two); Dynamo folds it to True. torch.export's
    # non-strict tracing is not Dynamo: its fake and proxy modes send the eager entry to
    # the OpOverload anyway
    from torch.compiler import is_dynamo_compiling

    class CuforgeOp(CustomOpDef):
        """A torch custom op registered the cheap way (docs/custom_ops.md, "Cost per call").

        It *is* a ``CustomOpDef`` (``torch.library.opcheck``, ``register_fake``,
        ``register_autograd``, ``register_vmap``, ... work on it), but its dispatcher entries
        are only the ones a call needs: the schema, the fake, and the device kernel itself
        -- the Python function, registered directly for the device's dispatch key, which
        bumps the version counter of each tensor it writes. torch's own ``custom_op`` adds a
        Python autograd kernel, a Python ADInplaceOrView kernel (for mutating ops) and a
        checking wrapper around the device kernel: three Python layers per call (about
        4.5 us more CPU time per call on the dev machine: bench/custom_op_cpu.py). Here the
        autograd kernel is registered only by :meth:`register_autograd`; until then an op
        that returns tensors raises at the call when grad mode is on and a Tensor input
        requires grad (torch's autograd fallback would only warn at backward and leave the
        gradient out)."""

        #: the eager entry (cuforge.torch.opshim), when the op has one: to its C++ kernel,
        #: or (_cuforge_py_entry, the same object) to its Python one
        _cuforge_fast = None
        _cuforge_py_entry = None
        _cuforge_entry_key = None
        #: why the op has no eager entry to its Python kernel (None: it has one, or its
        #: kernel is C++)
        _cuforge_entry_why = None

        def __call__(self, *args, **kwargs):
            # eagerly, the C++ kernel's own entry: it takes a plain call itself and hands
            # any other (a mode, a subclass, grad, the profiler) to the OpOverload; under
            # torch.compile the OpOverload, as torch's
            fast = self._cuforge_fast
            if fast is None or kwargs or is_dynamo_compiling():
                return self._opoverload(*args, **kwargs)
            return fast(*args)

        def _register_to_dispatcher(self, tags=()) -> None:
            tags = [t for t in tags or () if t is not torch.Tag.pt2_compliant_tag]
            self._lib.define(self._name + self._schema, tags=[torch.Tag.pt2_compliant_tag, *tags])
            self._opoverload = getattr(getattr(torch.ops, self._namespace), self._name).default
            self._cuforge_autograd = False

            def fake_impl(*args, **kwargs):
                fn = self._abstract_fn
                if fn is None:
                    raise RuntimeError(f"custom_op {self._qualname}: no fake implementation")
                return fn(*args, **kwargs)

            self._lib._register_fake(self._name, fake_impl)

        def register_autograd(self, backward, /, *, setup_context=None) -> None:
            super().register_autograd(backward, setup_context=setup_context)
            if not self._cuforge_autograd:
                kernel = torch_autograd.make_autograd_impl(self._opoverload, self)
                self._lib.impl(self._name, kernel, "Autograd", with_keyset=True)
                self._cuforge_autograd = True

        def _register_backend(self, fn, keys: list[str], parsed) -> None:
            """Register ``fn`` as the op's kernel for the dispatch ``keys`` (see
            :meth:`_device_kernel`)."""
            run = _dynamo_disabled(self._device_kernel(fn, parsed), torch)
            for key in keys:
                self._lib.impl(self._name, run, key)

        def register_kernel(self, device_types, fn=None, /):
            """torch's ``register_kernel`` (e.g. a CPU kernel beside cuforge's CUDA one),
            with what torch's own layers would do around it (:meth:`_device_kernel`)."""
            parsed = self._opoverload._schema

            def inner(f):
                CustomOpDef.register_kernel(self, device_types, self._device_kernel(f, parsed))
                entry = self._cuforge_py_entry
                if entry is not None and self._cuforge_entry_key in _dispatch_keys(device_types):
                    # a new kernel for the entry's device: the entry would call the old one
                    self._cuforge_fast = self._cuforge_py_entry = None
                    self._cuforge_entry_why = "register_kernel replaced the kernel"
                return f

            return inner if fn is None else inner(fn)

        def _device_kernel(self, fn, parsed):
            """``fn`` as the op's device kernel, doing what torch's autograd and
            ADInplaceOrView kernels (which this op does not register) would around it:

            * grad mode on and a Tensor input requiring grad reach a device kernel only
              when no autograd kernel is registered (one registered by
              :meth:`register_autograd` runs the kernel with grad mode off). Then an op that
              returns tensors raises (torch's autograd fallback would only warn at backward
              and leave the gradient out), and one that only mutates runs ``fn`` below
              autograd, as torch's custom_op does: the torch ops inside ``fn`` neither
              record a graph nor refuse (``torch.add(a, b, out=out)``);
            * the version counter of every tensor the schema marks written is bumped."""
            names = tuple(a.name for a in parsed.arguments)
            mutated = tuple(i for i, a in enumerate(parsed.arguments) if written_by(a))
            tensors = tuple(i for i, a in enumerate(parsed.arguments) if str(a.type) == "Tensor")
            returns = bool(parsed.returns)
            bump = torch._C._increment_version
            grad_enabled = torch.is_grad_enabled
            below_autograd = torch._C._AutoDispatchBelowAutograd
            qualname = self._qualname

            # the tensors a call writes, to bump: one as a 1-tuple (0.14 us here, against
            # 0.38 us through a generator), several as a list
            if len(mutated) == 1:
                (m0,) = mutated

                def written(args, kwargs, n):
                    return (args[m0],) if m0 < n else (kwargs[names[m0]],)

            else:

                def written(args, kwargs, n):
                    return [args[i] if i < n else kwargs[names[i]] for i in mutated]

            def bumped(args, kwargs, result):
                bump(written(args, kwargs, len(args)))
                return result

            def needs_grad(i, args, kwargs):  # the rare call: an input that requires grad
                if returns:
                    raise RuntimeError(
                        f"custom op {qualname}: argument {names[i]!r} requires grad but the "
                        "op has no autograd formula; register one with "
                        "op.register_autograd(backward, setup_context=...), or call it under "
                        "torch.no_grad() / on .detach()ed tensors"
                    )
                with below_autograd():
                    result = fn(*args, **kwargs)
                return bumped(args, kwargs, result) if mutated else result

            # the common call costs a grad-mode check and a loop (no generator: ~0.4 us
            # more per call on the dev machine, bench/custom_op_cpu.py)
            if mutated:

                def run(*args, **kwargs):
                    n = len(args)
                    if grad_enabled():
                        for i in tensors:
                            if i < n and args[i].requires_grad:
                                return needs_grad(i, args, kwargs)
                    result = fn(*args, **kwargs)
                    bump(written(args, kwargs, n))
                    return result

            else:

                def run(*args, **kwargs):
                    if grad_enabled():
                        n = len(args)
                        for i in tensors:
                            if i < n and args[i].requires_grad:
                                return needs_grad(i, args, kwargs)
                    return fn(*args, **kwargs)

            if not tensors and not mutated:
                return fn
            return run

    _OP_TYPE = CuforgeOp
    return CuforgeOp


def _check_schema_matches_launcher(schema_text: str, parsed, launcher, label: str) -> None:
    try:
        sig = inspect.signature(launcher)
    except (TypeError, ValueError):
        return  # a builtin or C callable: nothing to compare against
    params = list(sig.parameters.values())
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
        return
    want = [p.name for p in params]
    given = [a.name for a in parsed.arguments]
    if want != given:
        raise CustomOpError(
            f"custom_op: schema {schema_text!r} has arguments ({', '.join(given)}) but launcher "
            f"{label!r} takes ({', '.join(want)}); the schema must list the launcher's "
            "parameters in order, with the same names"
        )


def _check_launcher_mutates(launcher, mutates: tuple[str, ...], qualname: str, label: str) -> None:
    try:
        names = list(inspect.signature(launcher).parameters)
    except (TypeError, ValueError):
        return
    for n in mutates:
        if n not in names:
            raise CustomOpError(
                f"custom_op({qualname!r}): mutates_args names {n!r}, which is not a parameter "
                f"of launcher {label!r} (its parameters: {', '.join(names) or 'none'})"
            )


def _with_resolved_hints(fn, torch):
    """``fn``, or a stand-in whose signature has ``fn``'s string annotations (``from
    __future__ import annotations``) evaluated: in ``fn``'s globals and closure, else with
    ``Tensor`` meaning ``torch.Tensor`` (a launcher defined in a function that imports
    ``Tensor`` locally otherwise fails in torch, whose resolution sees module globals only).
    When an annotation cannot be evaluated, ``fn`` itself, so torch reports it."""

    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return fn
    hints = [p.annotation for p in sig.parameters.values()] + [sig.return_annotation]
    if not any(isinstance(h, str) for h in hints):
        return fn
    namespace = {"Tensor": torch.Tensor, "torch": torch}
    namespace.update(getattr(fn, "__globals__", {}))
    try:
        namespace.update(inspect.getclosurevars(fn).nonlocals)
    except (TypeError, ValueError):
        pass

    def resolve(hint):
        if not isinstance(hint, str):
            return hint
        return eval(hint, namespace)  # noqa: S307 - the user's own annotation, as torch does

    try:
        params = [p.replace(annotation=resolve(p.annotation)) for p in sig.parameters.values()]
        resolved = sig.replace(parameters=params, return_annotation=resolve(sig.return_annotation))
    except Exception:  # noqa: BLE001 - unresolvable: torch evaluates it and says why
        return fn

    def stand_in(*args, **kwargs):
        return fn(*args, **kwargs)

    stand_in.__signature__ = resolved  # type: ignore[attr-defined]
    stand_in.__name__ = getattr(fn, "__name__", "launcher")
    return stand_in
