"""The one table of scalar types: C type <-> struct code <-> dtype <-> torch dtype <-> schema.

Every place that maps between a C type, an array's element type and a torch type derives
its view from :data:`SCALAR_TYPES` (and :data:`ELEMENT_KINDS` for array element kinds):

* :mod:`cuforge.runtime.signature` -- the C spellings a kernel parameter may use -> its code
  and size; :mod:`cuforge.runtime.args` -- the struct format a scalar packs with, the element
  kinds a pointer accepts, the torch / NumPy dtype a pointer takes, DLPack and
  ``__cuda_array_interface__`` kinds;
* :mod:`cuforge.frontend.jitkernel` -- dtype name -> the C++ type a template is specialized with;
* :mod:`cuforge.torch.binding` -- a launcher's pointee type -> the ``torch::k...`` constant it
  checks; :mod:`cuforge.torch.custom_ops` -- a kernel scalar's code -> its schema type.

The bottom layer: imports nothing (torch dtypes are looked up by name, on the torch module
the caller already has).
"""

from __future__ import annotations

import sys

__all__ = [
    "ScalarType",
    "ElementKind",
    "SCALAR_TYPES",
    "ELEMENT_KINDS",
    "BY_CODE",
    "BY_C_NAME",
    "BY_DTYPE",
    "torch_dtype_for",
]


class ElementKind:
    """A family of array element types: ``float``, ``int``, ... An array's element type is
    (kind letter, itemsize): ``("f", 4)`` is float32, ``("bf", 2)`` bfloat16."""

    __slots__ = ("letter", "prefix", "dlpack", "array_char", "torch_cpp")

    def __init__(
        self, letter: str, prefix: str, dlpack: int, array_char: str | None, torch_cpp: str
    ) -> None:
        #: the kind letter in an element type (``"f"``, ``"bf"``, ``"i"``, ``"u"``, ...)
        self.letter = letter
        #: the dtype name prefix: ``float`` + bits is the dtype name (``bool`` has no bits)
        self.prefix = prefix
        #: the DLPack type code (``DLDataTypeCode``)
        self.dlpack = dlpack
        #: the kind character of a ``__cuda_array_interface__`` typestr and of a NumPy dtype
        self.array_char = array_char
        #: the ``torch::k...`` constant prefix in C++ (``Float`` + bits is ``kFloat32``)
        self.torch_cpp = torch_cpp

    def __repr__(self) -> str:
        return f"ElementKind({self.letter!r}, {self.prefix!r})"


#: the element kinds arrays may have (complex has no scalar type of its own here)
ELEMENT_KINDS: tuple[ElementKind, ...] = (
    ElementKind("i", "int", 0, "i", "Int"),
    ElementKind("u", "uint", 1, "u", "UInt"),
    ElementKind("f", "float", 2, "f", "Float"),
    ElementKind("bf", "bfloat", 4, None, "BFloat"),
    ElementKind("c", "complex", 5, "c", "Complex"),
    ElementKind("b", "bool", 6, "b", "Bool"),
)
_KIND = {k.letter: k for k in ELEMENT_KINDS}


class ScalarType:
    """One scalar type a kernel parameter (or a pointer's pointee) can have."""

    __slots__ = (
        "code",
        "fmt",
        "size",
        "kind",
        "dtype",
        "torch_dtype",
        "cxx",
        "cxx_aliases",
        "other_names",
        "aten_names",
        "dtype_aliases",
        "header",
    )

    def __init__(
        self,
        code: str,
        fmt: str,
        size: int,
        kind: str,
        cxx: str,
        *,
        cxx_aliases: tuple[str, ...] = (),
        other_names: tuple[str, ...] = (),
        aten_names: tuple[str, ...] = (),
        dtype_aliases: tuple[str, ...] = (),
        torch_dtype: str | None = None,
        header: str | None = None,
    ) -> None:
        #: the canonical code (:data:`cuforge.runtime.signature.SCALAR_CODES`' keys)
        self.code = code
        #: the ``struct`` format character it is packed with (bfloat16: its bits, ``H``)
        self.fmt = fmt
        #: its size in bytes
        self.size = size
        #: its element kind letter (see :class:`ElementKind`)
        self.kind = kind
        #: the dtype name (torch and NumPy spelling): ``float32``, ``uint16``, ``bool``
        self.dtype = _KIND[kind].prefix if kind == "b" else f"{_KIND[kind].prefix}{size * 8}"
        #: the torch dtype a pointer to it takes: the dtype, or the signed one of its size
        #: where torch has no unsigned dtype of that size (``uint16`` -> ``int16``)
        self.torch_dtype = torch_dtype or self.dtype
        #: the C++ type cuforge specializes templates with
        self.cxx = cxx
        #: other spellings of the same C++ type that a template argument given as text is
        #: rewritten to :attr:`cxx` from (``unsigned`` -> ``unsigned int``)
        self.cxx_aliases = cxx_aliases
        #: the other C spellings a kernel parameter of this type may use, kept as written in
        #: a template argument: longer spellings of the same type (``short int``) and distinct
        #: C++ types of the same size and kind, packed the same way (``char``, ``long``)
        self.other_names = other_names
        #: the ATen / c10 spellings (``at::Half``) a torch launcher declaration may use
        self.aten_names = aten_names
        #: other names of the dtype (``bool_``: NumPy's scalar type)
        self.dtype_aliases = dtype_aliases
        #: the CUDA header that declares the C++ type, when it is not built in
        self.header = header

    @property
    def c_names(self) -> tuple[str, ...]:
        """Every C spelling of a kernel parameter of this type."""
        return (self.cxx, *self.cxx_aliases, *self.other_names)

    @property
    def element_kinds(self) -> frozenset[tuple[str, int]]:
        """The array element types a pointer to this type accepts: a float (or bfloat)
        exactly; an integer any integer of its size, and a 1-byte one a bool too."""
        if self.kind in ("f", "bf"):
            return frozenset({(self.kind, self.size)})
        kinds = {("i", self.size), ("u", self.size)}
        if self.size == 1:
            kinds.add(("b", 1))
        return frozenset(kinds)

    @property
    def schema(self) -> str:
        """The torch op schema type of a scalar argument of this type."""
        if self.kind == "b":
            return "bool"
        return "SymInt" if self.kind in ("i", "u") else "float"

    @property
    def torch_cpp(self) -> str:
        """The ``torch::k...`` constant of :attr:`torch_dtype` (``torch::kFloat32``)."""
        for k in ELEMENT_KINDS:
            if self.torch_dtype.startswith(k.prefix):
                return f"torch::k{k.torch_cpp}{self.torch_dtype[len(k.prefix) :]}"
        raise AssertionError(f"no element kind for torch dtype {self.torch_dtype!r}")

    def __repr__(self) -> str:
        return f"ScalarType({self.code!r}, {self.cxx!r}, {self.dtype})"


#: every scalar type, in the order messages list them
# fmt: off
SCALAR_TYPES: tuple[ScalarType, ...] = (
    #          code    fmt  size kind  C++ type
    ScalarType("e",    "e", 2,   "f",  "__half", cxx_aliases=("half",),
               aten_names=("at::Half", "c10::Half"), header="cuda_fp16.h"),
    ScalarType("bf16", "H", 2,   "bf", "__nv_bfloat16", cxx_aliases=("nv_bfloat16",),
               other_names=("__nv_bfloat16_raw",),
               aten_names=("at::BFloat16", "c10::BFloat16"), header="cuda_bf16.h"),
    ScalarType("f",    "f", 4,   "f",  "float"),
    ScalarType("d",    "d", 8,   "f",  "double"),
    ScalarType("b",    "b", 1,   "i",  "signed char", other_names=("char", "int8_t")),
    ScalarType("h",    "h", 2,   "i",  "short",
               other_names=("short int", "signed short", "signed short int", "int16_t")),
    ScalarType("i",    "i", 4,   "i",  "int", other_names=("signed", "signed int", "int32_t")),
    ScalarType("q",    "q", 8,   "i",  "long long",
               other_names=("long long int", "signed long long", "long", "long int",
                            "signed long", "int64_t", "ptrdiff_t", "intptr_t", "ssize_t")),
    ScalarType("B",    "B", 1,   "u",  "unsigned char", other_names=("uint8_t",)),
    ScalarType("H",    "H", 2,   "u",  "unsigned short",
               other_names=("unsigned short int", "uint16_t"), torch_dtype="int16"),
    ScalarType("I",    "I", 4,   "u",  "unsigned int", cxx_aliases=("unsigned",),
               other_names=("uint32_t",), torch_dtype="int32"),
    ScalarType("Q",    "Q", 8,   "u",  "unsigned long long",
               other_names=("unsigned long long int", "unsigned long", "unsigned long int",
                            "uint64_t", "size_t", "uintptr_t"), torch_dtype="int64"),
    ScalarType("?",    "?", 1,   "b",  "bool", dtype_aliases=("bool_",)),
)
# fmt: on

#: code -> scalar type
BY_CODE: dict[str, ScalarType] = {t.code: t for t in SCALAR_TYPES}
#: every C spelling of a kernel parameter -> scalar type
BY_C_NAME: dict[str, ScalarType] = {name: t for t in SCALAR_TYPES for name in t.c_names}
#: dtype name (and alias) -> scalar type
BY_DTYPE: dict[str, ScalarType] = {
    name: t for t in SCALAR_TYPES for name in (t.dtype, *t.dtype_aliases)
}


def torch_dtype_for(code: str | None, torch=None):
    """The torch dtype a pointer with pointee ``code`` most naturally takes (None if any).
    ``torch``: the torch module to ask (default: the one imported, if any)."""
    if torch is None:
        torch = sys.modules.get("torch")
    if torch is None or code is None:
        return None
    t = BY_CODE.get(code)
    return getattr(torch, t.torch_dtype, None) if t is not None else None
