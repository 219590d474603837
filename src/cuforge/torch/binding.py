"""Generate the torch binding ``.cpp`` of the fast-edit layout.

Kernels and thin launchers stay in a ``.cu`` that includes no torch header; the launchers
are declared in a plain header (``kernels.h``)::

    void launch_add(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream);

:func:`generate_binding` reads those declarations and writes the torch side: one wrapper
per op (tensor checks, output allocation, the current stream), ``PYBIND11_MODULE`` and,
with ``library=``, ``TORCH_LIBRARY`` registrations. Launcher parameters are mapped by
their type and name:

* ``const T*`` -> an input tensor of T's dtype (float, double, int, int64_t, at::Half,
  at::BFloat16), checked to be CUDA and contiguous, on the same device as ``like`` (the
  first input unless set) and, when the launcher takes the element count, of the same
  shape as ``like`` (every input is read for ``<like>.numel()`` elements);
* ``T*`` named in ``outputs`` -> an output tensor, ``torch::empty_like(<like>)``;
* the integer parameter named ``numel`` (default ``n``) -> ``<like>.numel()``;
* ``cudaStream_t`` -> the current stream of the first input's device;
* any other scalar -> an argument of the op (``float`` is exposed as ``double``).

The binding is compiled once and then served from the object cache: editing the
kernels recompiles only the small ``.cu``.
"""

from __future__ import annotations

import os

from cuforge.base._fs import write_if_changed
from cuforge.base.scalar_types import SCALAR_TYPES
from cuforge.runtime.signature import strip_comments

__all__ = ["Op", "generate_binding", "parse_launchers"]

#: the C pointee spellings whose input tensors get a dtype check (and every ATen spelling,
#: ``at::Half``); tensors for other pointees are passed unchecked
_CHECKED_POINTEES = (
    "float",
    "double",
    "int",
    "int32_t",
    "int64_t",
    "uint8_t",
    "bool",
    "__half",
    "__nv_bfloat16",
)
#: pointee spelling -> the ``torch::k...`` dtype its tensor must have
_DTYPES = {
    name: t.torch_cpp
    for t in SCALAR_TYPES
    for name in (*t.c_names, *t.aten_names)
    if name in _CHECKED_POINTEES or name in t.aten_names
}
_INTS = ("int", "int32_t", "int64_t", "long", "size_t", "unsigned", "uint32_t", "uint64_t")
_SCHEMA_TYPES = {"double": "float", "float": "float", "bool": "bool"}


class Op:
    """One op: its Python name, the launcher it calls, which pointer parameters are
    outputs, which integer is the element count, and which input shapes the outputs."""

    def __init__(
        self,
        name: str,
        launcher: str | None = None,
        outputs=("out",),
        numel: str = "n",
        like: str | None = None,
        doc: str = "",
    ) -> None:
        self.name = name
        self.launcher = launcher or f"launch_{name}"
        self.outputs = tuple(outputs)
        self.numel = numel
        self.like = like
        self.doc = doc or name


def parse_launchers(header_text: str) -> dict[str, list[tuple[str, str]]]:
    """``{launcher name: [(type, parameter name), ...]}`` for each ``void f(...);``."""

    code = strip_comments(header_text).splitlines()
    text = " ".join(" ".join(ln for ln in code if not ln.lstrip().startswith("#")).split())
    found: dict[str, list[tuple[str, str]]] = {}
    for stmt in text.split(";"):
        stmt = stmt.strip()
        if not stmt.startswith("void ") or "(" not in stmt or not stmt.endswith(")"):
            continue
        head, _, params = stmt[5:].partition("(")
        name = head.strip().split()[-1] if head.strip() else ""
        params = params[:-1].strip()
        plist: list[tuple[str, str]] = []
        for raw in [p.strip() for p in params.split(",")] if params and params != "void" else []:
            raw = raw.split("=")[0].strip()
            i = len(raw)
            while i > 0 and (raw[i - 1].isalnum() or raw[i - 1] == "_"):
                i -= 1
            ptype, pname = raw[:i].strip(), raw[i:]
            if not ptype:
                ptype, pname = raw, f"arg{len(plist)}"
            plist.append((ptype, pname))
        if name:
            found[name] = plist
    return found


def _base(ptype: str) -> str:
    t = ptype.replace("const", " ").replace("*", " ").replace("__restrict__", " ")
    return " ".join(t.split())


def _wrapper(op: Op, params: list[tuple[str, str]]) -> tuple[str, str]:
    """(C++ wrapper function, schema argument list)."""
    inputs = [(t, n) for t, n in params if "*" in t and n not in op.outputs]
    like = op.like or (inputs[0][1] if inputs else None)
    if like is None:
        raise ValueError(f"op {op.name}: no input tensor to shape the outputs (set like=)")
    if like not in [n for _, n in inputs]:
        raise ValueError(
            f"op {op.name}: like={like!r} is not an input tensor of {op.launcher} "
            f"(inputs: {', '.join(n for _, n in inputs) or 'none'})"
        )
    elementwise = any(n == op.numel and _base(t) in _INTS for t, n in params)
    sig: list[str] = []
    schema: list[str] = []
    body: list[str] = []
    call: list[str] = []
    for ptype, pname in params:
        base = _base(ptype)
        if "*" in ptype and pname in op.outputs:
            body.append(f"    auto {pname} = torch::empty_like({like});")
            call.append(f"reinterpret_cast<{ptype}>({pname}.data_ptr())")
        elif "*" in ptype:
            sig.append(f"const torch::Tensor& {pname}")
            schema.append(f"Tensor {pname}")
            body.append(f'    TORCH_CHECK({pname}.is_cuda(), "{pname} must be a CUDA tensor");')
            body.append(f'    TORCH_CHECK({pname}.is_contiguous(), "{pname} must be contiguous");')
            dtype = _DTYPES.get(base)
            if dtype:
                body.append(
                    f'    TORCH_CHECK({pname}.scalar_type() == {dtype}, "{pname} must be {base}");'
                )
            if pname != like:
                body.append(
                    f"    TORCH_CHECK({pname}.device() == {like}.device(), "
                    f'"{op.name}: {pname} is on ", {pname}.device(), '
                    f'" but {like} is on ", {like}.device(), '
                    f'"; move both to the same device");'
                )
                if elementwise:
                    body.append(
                        f"    TORCH_CHECK({pname}.sizes() == {like}.sizes(), "
                        f'"{op.name}: {pname} has shape ", {pname}.sizes(), '
                        f'" but {like} has shape ", {like}.sizes(), '
                        f'"; they must have the same shape");'
                    )
            cast = f"reinterpret_cast<{ptype}>({pname}.data_ptr())"
            call.append(cast)
        elif base == "cudaStream_t":
            call.append(f"c10::cuda::getCurrentCUDAStream({like}.device().index()).stream()")
        elif pname == op.numel and base in _INTS:
            call.append(f"{like}.numel()")
        else:
            exposed = "double" if base == "float" else ("int64_t" if base in _INTS else base)
            sig.append(f"{exposed} {pname}")
            schema.append(
                f"{_SCHEMA_TYPES.get(exposed, 'int' if exposed == 'int64_t' else exposed)} {pname}"
            )
            call.append(f"({base}){pname}" if exposed != base else pname)
    outs = [n for _, n in params if n in op.outputs]
    if not outs:
        raise ValueError(f"op {op.name}: launcher {op.launcher} has none of outputs={op.outputs}")
    if len(outs) == 1:
        ret_type, ret = "torch::Tensor", outs[0]
    else:
        ret_type = "std::tuple<" + ", ".join(["torch::Tensor"] * len(outs)) + ">"
        ret = "std::make_tuple(" + ", ".join(outs) + ")"
    body.append(f"    const c10::cuda::CUDAGuard guard({like}.device());")
    lines = [f"{ret_type} {op.name}({', '.join(sig)}) {{", *body]
    lines.append(f"    {op.launcher}({', '.join(call)});")
    lines.append(f"    return {ret};")
    lines.append("}")
    return "\n".join(lines), ", ".join(schema) + (
        " -> Tensor" if len(outs) == 1 else " -> (" + ", ".join(["Tensor"] * len(outs)) + ")"
    )


def generate_binding(
    header: str,
    ops,
    *,
    output: str | None = None,
    library: str | None = None,
    header_text: str | None = None,
) -> str:
    """The binding ``.cpp`` for ``ops`` (:class:`Op` or op names) declared in ``header``.

    ``output``: write it there (only when the text changed, so the object cache and the
    stat memo stay warm) and return the path; else return the text. ``library``: also
    register the ops as ``torch.ops.<library>.<op>`` (CUDA dispatch key).
    """
    if header_text is None:
        with open(header, encoding="utf-8") as f:
            header_text = f.read()
    launchers = parse_launchers(header_text)
    ops = [o if isinstance(o, Op) else Op(o) for o in ops]
    include = (
        os.path.basename(header)
        if output is None
        else os.path.relpath(os.path.abspath(header), os.path.dirname(os.path.abspath(output)))
    )
    parts = [
        "// Generated by cuforge.torch.generate_binding -- edit the kernels, not this file.",
        "#include <torch/extension.h>",
        "#include <c10/cuda/CUDAGuard.h>",
        "#include <c10/cuda/CUDAStream.h>",
        f'#include "{include}"',
        "",
    ]
    schemas: list[tuple[str, str]] = []
    for op in ops:
        if op.launcher not in launchers:
            raise ValueError(
                f"op {op.name}: no declaration of `void {op.launcher}(...)` in {header}"
            )
        code, schema = _wrapper(op, launchers[op.launcher])
        parts += [code, ""]
        schemas.append((op.name, schema))
    parts.append("PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {")
    for op in ops:
        parts.append(f'    m.def("{op.name}", &{op.name}, "{op.doc}");')
    parts.append("}")
    if library:
        parts += ["", f"TORCH_LIBRARY({library}, m) {{"]
        parts += [
            f'    m.def("{name}({schema.split(" -> ")[0]}) -> {schema.split(" -> ")[1]}");'
            for name, schema in schemas
        ]
        parts += ["}", "", f"TORCH_LIBRARY_IMPL({library}, CUDA, m) {{"]
        parts += [f'    m.impl("{op.name}", &{op.name});' for op in ops]
        parts.append("}")
    text = "\n".join(parts) + "\n"
    if output is None:
        return text

    write_if_changed(output, text, mode=0o644)
    return output
