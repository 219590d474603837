"""Kernel signatures from CUDA source: which parameters a kernel takes, and their C types.

The runtime packs arguments by the declared type of each parameter, so it reads the
kernel's declaration once, when the :class:`~cuforge.runtime.kernel.Kernel` is made:

* ``extern "C" __global__ void saxpy(float* y, const float* x, float a, int n)``
  -> ``float*``, ``float*``, ``float``, ``int``;
* a template instance named by a name expression, ``block_sum<256, float>`` for
  ``template <int BLOCK, typename T> __global__ void block_sum(const T* in, T* out, int n)``
  -> ``float*``, ``float*``, ``int`` (template arguments substituted, defaults applied).

This is a small declaration reader, not a C++ parser: comments, ``__launch_bounds__`` and
friends, qualifiers, default arguments and ``extern "C" { ... }`` blocks are understood;
macros are not expanded. When it cannot read a declaration the runtime falls back to the
parameter sizes the driver reports (``cuFuncGetParamInfo``) and packs by argument kind.
"""

from __future__ import annotations

import re

from cuforge.base.scalar_types import BY_C_NAME, SCALAR_TYPES

__all__ = [
    "Param",
    "KernelDecl",
    "SCALAR_CODES",
    "parse_kernels",
    "find_kernel",
    "kernel_names",
    "global_names",
    "split_name_expression",
    "parse_param",
    "strip_comments",
    "normalize_type",
]

#: canonical scalar code -> (struct format character, size in bytes)
SCALAR_CODES: dict[str, tuple[str, int]] = {t.code: (t.fmt, t.size) for t in SCALAR_TYPES}

#: every C spelling of a scalar parameter -> its code
_SCALAR_NAMES = {name: t.code for name, t in BY_C_NAME.items()}

_QUALIFIERS = {
    "const",
    "volatile",
    "__restrict__",
    "__restrict",
    "restrict",
    "__grid_constant__",
    "struct",
    "class",
    "typename",
    "enum",
    "union",
    "register",
}
_BUILTIN_WORDS = {
    "int",
    "unsigned",
    "signed",
    "long",
    "short",
    "char",
    "float",
    "double",
    "bool",
    "void",
}
_ATTRIBUTE_CALLS = {
    "__launch_bounds__",
    "__cluster_dims__",
    "__maxnreg__",
    "__attribute__",
    "__declspec",
    "__block_size__",
}
_TOKEN = re.compile(r"[A-Za-z_]\w*|::|\d[\w.]*|\S")
_IDENT = re.compile(r"[A-Za-z_]\w*\Z")


class Param:
    """One kernel parameter.

    ``kind`` is "pointer", "scalar" or "struct" (anything else passed by value);
    ``base`` the type without qualifiers (for pointers: the pointee, ``"float"``);
    ``code`` the canonical scalar code (``"f"``, ``"i"``, ``"bf16"``; for pointers, the
    pointee's, or None for ``void*`` and structs); ``size`` in bytes (None for a struct until
    the driver reports it).
    """

    __slots__ = ("index", "name", "type", "kind", "base", "code", "size")

    def __init__(self, index, name, ctype, kind, base, code, size):
        self.index = index
        self.name = name
        self.type = ctype
        self.kind = kind
        self.base = base
        self.code = code
        self.size = size

    @property
    def label(self) -> str:
        """How errors name the parameter: ``'y' (float*, #0)``."""
        name = self.name or f"#{self.index}"
        return f"parameter {name!r} ({self.type}, argument {self.index})"

    def __repr__(self) -> str:
        return f"Param({self.index}, {self.name!r}, {self.type!r}, {self.kind})"

    def __eq__(self, other) -> bool:
        return isinstance(other, Param) and all(
            getattr(self, s) == getattr(other, s) for s in self.__slots__
        )


class KernelDecl:
    """A ``__global__`` function's declaration: name, parameters, template parameters."""

    __slots__ = ("name", "params", "extern_c", "template_params", "param_text")

    def __init__(self, name, params, extern_c, template_params, param_text):
        self.name = name
        self.params = params
        self.extern_c = extern_c
        self.template_params = template_params
        self.param_text = param_text

    @property
    def is_template(self) -> bool:
        return self.template_params is not None

    @property
    def display(self) -> str:
        if self.template_params is not None:
            names = ", ".join(p[1] for p in self.template_params)
            return f"{self.name}<{names}>"
        return self.name

    def __repr__(self) -> str:
        return f"KernelDecl({self.display!r}, {self.params!r})"


# -- text helpers ------------------------------------------------------------------------


def strip_comments(source: str) -> str:
    """Source without comments and preprocessor lines; string literals kept."""
    out: list[str] = []
    i, n = 0, len(source)
    at_line_start = True
    while i < n:
        c = source[i]
        if at_line_start and c == "#":
            # a preprocessor line (with continuations)
            while i < n and source[i] != "\n":
                if source[i] == "\\" and i + 1 < n and source[i + 1] == "\n":
                    i += 2
                    continue
                i += 1
            continue
        if c == "/" and i + 1 < n and source[i + 1] == "/":
            while i < n and source[i] != "\n":
                i += 1
            continue
        if c == "/" and i + 1 < n and source[i + 1] == "*":
            end = source.find("*/", i + 2)
            i = n if end < 0 else end + 2
            out.append(" ")
            continue
        if c in "\"'":
            j = i + 1
            while j < n and source[j] != c:
                j += 2 if source[j] == "\\" else 1
            out.append(source[i : j + 1])
            i = j + 1
            at_line_start = False
            continue
        out.append(c)
        if c == "\n":
            at_line_start = True
        elif not c.isspace():
            at_line_start = False
        i += 1
    return "".join(out)


def _match(text: str, start: int, open_c: str, close_c: str) -> int:
    """Index just past the bracket closing the one at ``start``; -1 if unbalanced."""
    depth = 0
    for i in range(start, len(text)):
        c = text[i]
        if c == open_c:
            depth += 1
        elif c == close_c:
            depth -= 1
            if depth == 0:
                return i + 1
    return -1


def split_top(text: str, sep: str = ",") -> list[str]:
    """Split at ``sep`` outside (), [], {} and <>."""
    parts: list[str] = []
    depth = 0
    start = 0
    for i, c in enumerate(text):
        if c in "([{<":
            depth += 1
        elif c in ")]}>":
            depth = max(0, depth - 1)
        elif c == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    tail = text[start:]
    if tail.strip() or parts:
        parts.append(tail)
    return [p.strip() for p in parts]


def _extern_c_spans(text: str) -> list[tuple[int, int]]:
    spans = []
    for m in re.finditer(r'\bextern\s*"C"\s*\{', text):
        end = _match(text, m.end() - 1, "{", "}")
        spans.append((m.start(), end if end > 0 else len(text)))
    return spans


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i


# -- types -------------------------------------------------------------------------------


def normalize_type(tokens: list[str]) -> tuple[str, str, int]:
    """Type tokens -> (display type, base type without qualifiers, pointer depth)."""
    depth = sum(1 for t in tokens if t in ("*", "[]"))
    base_tokens = [t for t in tokens if t not in _QUALIFIERS and t not in ("*", "&", "[]")]
    base = " ".join(base_tokens).replace(" :: ", "::").replace(":: ", "::").replace(" ::", "::")
    base = base.replace(" <", "<").replace("< ", "<").replace(" >", ">").replace(" ,", ",")
    for prefix in ("::", "cuda::std::", "std::"):
        if base.startswith(prefix):
            base = base[len(prefix) :]
    display_parts = [
        t
        for t in tokens
        if t not in ("__restrict__", "__restrict", "restrict", "__grid_constant__")
    ]
    display = " ".join(display_parts).replace("[]", "*").replace(" *", "*").replace(" :: ", "::")
    display = display.replace(" <", "<").replace("< ", "<").replace(" >", ">").replace(" ,", ",")
    return display, base, depth


def _scalar_code(base: str) -> str | None:
    return _SCALAR_NAMES.get(base)


def parse_param(index: int, text: str, subst: dict[str, str] | None = None) -> Param:
    """One parameter declaration (``const float* __restrict__ x``) -> :class:`Param`."""
    text = re.sub(r"\[\[.*?\]\]", " ", text)
    parts = split_top(text, "=")
    text = parts[0] if parts else text
    tokens = _TOKEN.findall(text)
    # array parameters decay to pointers: float x[4] -> float* x
    fixed: list[str] = []
    i = 0
    while i < len(tokens):
        if tokens[i] == "[":
            j = i
            while j < len(tokens) and tokens[j] != "]":
                j += 1
            fixed.append("[]")
            i = j + 1
            continue
        fixed.append(tokens[i])
        i += 1
    tokens = fixed
    name = None
    array_name = None
    if "[]" in tokens:
        k = tokens.index("[]")
        if k > 0 and _IDENT.match(tokens[k - 1]) and tokens[k - 1] not in _BUILTIN_WORDS:
            array_name = tokens.pop(k - 1)
    if array_name is None and len(tokens) >= 2 and _IDENT.match(tokens[-1]):
        last = tokens[-1]
        before = [t for t in tokens[:-1] if t not in _QUALIFIERS]
        if last not in _BUILTIN_WORDS and last not in _QUALIFIERS and before:
            if not (before[-1] == "::" or before[-1] == "<"):
                name = tokens.pop()
    name = name or array_name
    if subst:
        expanded: list[str] = []
        for t in tokens:
            if t in subst:
                expanded.extend(_TOKEN.findall(subst[t]))
            else:
                expanded.append(t)
        tokens = expanded
    display, base, depth = normalize_type(tokens)
    if depth:
        code = _scalar_code(base)
        if depth > 1:
            code = None
        return Param(index, name, display, "pointer", base, code, 8)
    code = _scalar_code(base)
    if code is not None:
        return Param(index, name, display, "scalar", base, code, SCALAR_CODES[code][1])
    return Param(index, name, display, "struct", base, None, None)


def _parse_template_params(text: str) -> list[tuple[str, str, str | None]]:
    """``int BLOCK, typename T = float`` -> [("int", "BLOCK", None), ("typename", "T", "float")]."""
    out = []
    for part in split_top(text):
        if not part:
            continue
        pieces = split_top(part, "=")
        decl = pieces[0]
        default = pieces[1] if len(pieces) > 1 else None
        tokens = _TOKEN.findall(decl)
        if not tokens:
            continue
        name = tokens[-1] if _IDENT.match(tokens[-1]) and len(tokens) > 1 else ""
        kind = " ".join(tokens[:-1]) if name else " ".join(tokens)
        out.append((kind, name, default))
    return out


# -- declarations ------------------------------------------------------------------------


def parse_kernels(source: str) -> list[KernelDecl]:
    """Every ``__global__`` function declared in ``source`` (definitions and declarations),
    with raw parameter text; template parameters are not substituted here."""
    text = strip_comments(source)
    spans = _extern_c_spans(text)
    found: list[KernelDecl] = []
    seen: set[tuple[str, bool]] = set()
    for m in re.finditer(r"\b__global__\b", text):
        decl = _parse_one(text, m.start(), m.end(), spans)
        if decl is None:
            continue
        key = (decl.name, decl.template_params is not None)
        if key in seen:
            # keep the first; a later definition after a declaration has the same params
            continue
        seen.add(key)
        found.append(decl)
    return found


def _parse_one(text: str, start: int, end: int, spans) -> KernelDecl | None:
    # what precedes: back to the previous ; { } (the declaration's start)
    i = start - 1
    depth = 0
    while i >= 0:
        c = text[i]
        if c in ">)":
            depth += 1
        elif c in "<(":
            depth -= 1
        elif depth <= 0 and c in ";{}":
            break
        i -= 1
    prefix = text[i + 1 : start]
    extern_c = bool(re.search(r'\bextern\s*"C"', prefix)) or any(a <= start < b for a, b in spans)
    template_params = None
    tm = re.search(r"\btemplate\s*<", prefix)
    if tm:
        open_at = i + 1 + tm.end() - 1
        close = _match(text, open_at, "<", ">")
        if close < 0:
            return None
        inner = text[open_at + 1 : close - 1]
        if not inner.strip():
            return None  # an explicit specialization: template <> ...
        template_params = _parse_template_params(inner)
    # after __global__: return type, attributes, the name, then (params)
    j = end
    name = None
    while j < len(text):
        j = _skip_ws(text, j)
        if j >= len(text):
            return None
        m = re.compile(r"[A-Za-z_][\w:]*").match(text, j)
        if m:
            word = m.group(0)
            k = _skip_ws(text, m.end())
            if word in _ATTRIBUTE_CALLS and k < len(text) and text[k] == "(":
                j = _match(text, k, "(", ")")
                if j < 0:
                    return None
                continue
            if k < len(text) and text[k] == "(":
                name = word
                j = k
                break
            if k < len(text) and text[k] == "<":
                return None  # an explicit specialization name<...>(...)
            j = m.end()
            continue
        if text.startswith("[[", j):
            close = text.find("]]", j)
            if close < 0:
                return None
            j = close + 2
            continue
        if text[j] in "*&":
            j += 1
            continue
        return None
    if name is None:
        return None
    close = _match(text, j, "(", ")")
    if close < 0:
        return None
    param_text = text[j + 1 : close - 1]
    short = name.split("::")[-1]
    return KernelDecl(short, None, extern_c, template_params, param_text)


def split_name_expression(expr: str) -> tuple[str, list[str] | None]:
    """``"ns::block_sum<256, float>"`` -> (``"block_sum"``, ``["256", "float"]``);
    a plain name -> (name, None)."""
    expr = expr.strip().lstrip("&").strip()
    lt = expr.find("<")
    if lt < 0:
        return expr.split("::")[-1].strip(), None
    base = expr[:lt].strip().split("::")[-1]
    gt = expr.rfind(">")
    inner = expr[lt + 1 : gt] if gt > lt else expr[lt + 1 :]
    return base, split_top(inner)


def instantiate(decl: KernelDecl, template_args: list[str] | None) -> list[Param] | None:
    """The parameters of ``decl``, with template arguments substituted (None when the
    declaration cannot be read)."""
    subst: dict[str, str] = {}
    if decl.template_params is not None:
        if template_args is None:
            return None
        for k, (kind, pname, default) in enumerate(decl.template_params):
            if kind.endswith("...") or pname.startswith("..."):
                return None  # variadic templates: not attempted
            if k < len(template_args):
                value = template_args[k]
            elif default is not None:
                value = default
            else:
                return None
            if pname:
                subst[pname] = value
    try:
        parts = split_top(decl.param_text)
        if parts == ["void"] or parts == []:
            return []
        return [parse_param(i, p, subst) for i, p in enumerate(parts)]
    except Exception:  # noqa: BLE001 - an unreadable declaration falls back to driver sizes
        return None


def find_kernel(source: str | None, name: str) -> tuple[KernelDecl | None, list[Param] | None]:
    """The declaration named by ``name`` (an ``extern "C"`` name or a name expression) and
    its instantiated parameters. (None, None) when the source has no such kernel."""
    if not source:
        return None, None
    base, args = split_name_expression(name)
    decls = [d for d in parse_kernels(source) if d.name == base]
    if not decls:
        return None, None
    if args is not None:
        decls.sort(key=lambda d: not d.is_template)
    else:
        decls.sort(key=lambda d: d.is_template)
    decl = decls[0]
    return decl, instantiate(decl, args)


def kernel_names(source: str | None) -> list[str]:
    """Display names of the kernels in ``source``: ``saxpy``, ``block_sum<BLOCK, T>``."""
    if not source:
        return []
    return [d.display for d in parse_kernels(source)]


_GLOBAL_SPACES = ("__device__", "__constant__", "__managed__")


def global_names(source: str | None) -> list[str]:
    """The ``__device__`` / ``__constant__`` / ``__managed__`` variables declared in
    ``source`` (functions and ``__shared__`` variables are not globals), in order.

    A declaration reader like the kernel one: macros are not expanded; variables declared
    in a namespace are listed by their plain name."""
    if not source:
        return []
    text = strip_comments(source)
    found: list[str] = []
    for m in re.finditer(r"\b(?:__device__|__constant__|__managed__)\b", text):
        # the statement from here to its ';': a variable when no '(' comes before its
        # first '=' (a function declaration or definition has one)
        end = text.find(";", m.end())
        statement = text[m.end() : end if end >= 0 else len(text)]
        head = re.split(r"[={]", statement, maxsplit=1)[0]
        if "(" in head or re.search(r"\b__shared__\b|\btypedef\b|\busing\b", head):
            continue
        # a type then declarators: int a[4] = {...}, b  ->  a, b
        for declarator in split_top(statement):
            left = declarator.split("=", 1)[0].split("[", 1)[0]
            names = [t for t in _TOKEN.findall(left) if _IDENT.match(t)]
            names = [n for n in names if n not in _QUALIFIERS and n not in _BUILTIN_WORDS]
            names = [n for n in names if n not in _GLOBAL_SPACES and not n.startswith("__")]
            if names and names[-1] not in found:
                found.append(names[-1])
    return found
