"""Kernel and variable symbols of compiled CUDA code, and matching them to C++ names.

nvcc has no API for NVRTC's name expressions, so :mod:`cuforge.compiler.nvcc` lists the
symbols of what it built and matches the demangled names against the expressions:

* :func:`elf_symbols` -- a small pure-Python ELF64 ``.symtab`` reader (cubins);
* :func:`embedded_elves` -- the cubins inside an uncompressed fatbin;
* :func:`ptx_symbols` -- ``.entry`` / ``.func`` / ``.global`` / ``.const`` names of PTX;
* :func:`demangle` -- through binutils' ``c++filt`` (the toolkit ships no ``cu++filt``);
* :func:`match_name_expressions` -- expression -> mangled name, ignoring whitespace.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
from typing import TYPE_CHECKING

from cuforge.base.errors import ToolchainError
from cuforge.toolchain import toolkit_root

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

__all__ = [
    "Symbol",
    "elf_symbols",
    "embedded_elves",
    "ptx_symbols",
    "binary_symbols",
    "demangle",
    "entity_name",
    "match_name_expressions",
]

STT_OBJECT, STT_FUNC = 1, 2
STB_LOCAL, STB_GLOBAL, STB_WEAK = 0, 1, 2
SHT_SYMTAB = 2


class Symbol:
    """One symbol: ``name`` (as in the binary), ``kind`` ("func" / "object"), ``binding``
    ("global" / "local" / "weak")."""

    __slots__ = ("name", "kind", "binding")

    def __init__(self, name: str, kind: str, binding: str) -> None:
        self.name, self.kind, self.binding = name, kind, binding

    def __repr__(self) -> str:
        return f"Symbol({self.name!r}, {self.kind}, {self.binding})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Symbol) and (self.name, self.kind, self.binding) == (
            other.name,
            other.kind,
            other.binding,
        )

    def __hash__(self) -> int:
        return hash((self.name, self.kind, self.binding))


_BINDINGS = {STB_LOCAL: "local", STB_GLOBAL: "global", STB_WEAK: "weak"}


def elf_symbols(data: bytes) -> list[Symbol]:
    """The named FUNC and OBJECT symbols of a little-endian ELF64 image (a cubin).

    Raises ValueError when ``data`` is not such an image."""
    if len(data) < 64 or data[:4] != b"\x7fELF":
        raise ValueError("not an ELF image")
    if data[4] != 2 or data[5] != 1:
        raise ValueError("only little-endian ELF64 images are supported")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    if shoff == 0 or shentsize < 64 or shoff + shnum * shentsize > len(data):
        raise ValueError("truncated ELF image")
    sections = []
    for i in range(shnum):
        base = shoff + i * shentsize
        _name, sh_type, _flags, _addr, offset, size, link, _info, _align, entsize = (
            struct.unpack_from("<IIQQQQIIQQ", data, base)
        )
        sections.append((sh_type, offset, size, link, entsize))
    found: list[Symbol] = []
    for sh_type, offset, size, link, entsize in sections:
        if sh_type != SHT_SYMTAB or link >= len(sections):
            continue
        entsize = entsize or 24
        _, str_off, str_size, _, _ = sections[link]
        strtab = data[str_off : str_off + str_size]
        for pos in range(offset, min(offset + size, len(data)) - entsize + 1, entsize):
            st_name, st_info, _other, _shndx, _value, _size = struct.unpack_from(
                "<IBBHQQ", data, pos
            )
            sym_type, bind = st_info & 0xF, st_info >> 4
            if sym_type not in (STT_FUNC, STT_OBJECT) or not st_name:
                continue
            end = strtab.find(b"\0", st_name)
            name = strtab[st_name : end if end >= 0 else len(strtab)].decode("utf-8", "replace")
            if name:
                found.append(
                    Symbol(
                        name,
                        "func" if sym_type == STT_FUNC else "object",
                        _BINDINGS.get(bind, "other"),
                    )
                )
    return found


def embedded_elves(data: bytes) -> list[bytes]:
    """The ELF images embedded uncompressed in a fatbin (or any container), in order."""
    images: list[bytes] = []
    start = 0
    while True:
        pos = data.find(b"\x7fELF", start)
        if pos < 0:
            return images
        start = pos + 4
        image = data[pos:]
        try:
            elf_symbols(image)
        except (ValueError, struct.error):
            continue
        images.append(image)


def ptx_symbols(ptx: str | bytes) -> list[Symbol]:
    """Kernel (``.entry``), device function (``.func``) and variable names of PTX."""
    if isinstance(ptx, bytes):
        ptx = ptx.decode("utf-8", "replace")
    found: list[Symbol] = []
    for raw in ptx.splitlines():
        line = raw.strip()
        if not line.startswith("."):
            continue
        words = line.split()
        visible = ".visible" in words or ".extern" in words or ".weak" in words
        binding = "global" if visible else "local"
        if ".entry" in words or ".func" in words:
            keyword = ".entry" if ".entry" in words else ".func"
            rest = line[line.index(keyword) + len(keyword) :].lstrip()
            if rest.startswith("("):  # .func (.param .b32 func_retval0) name(
                close = rest.find(")")
                rest = rest[close + 1 :].lstrip() if close >= 0 else ""
            name = rest.split("(")[0].split(";")[0].strip()
            name = name.split()[0] if name else ""
            if name:
                found.append(Symbol(name, "func", binding))
        elif words[0] in (".global", ".const") or (
            len(words) > 1 and words[1] in (".global", ".const")
        ):
            last = line.rstrip(";").split("=")[0].strip().split()[-1]
            name = last.split("[")[0]
            if name and not name.startswith("."):
                found.append(Symbol(name, "object", binding))
    return found


def binary_symbols(binary: bytes, output: str) -> list[Symbol]:
    """Symbols of a compile result: ``output`` is "cubin", "ptx" or "fatbin"."""
    if output == "ptx":
        return ptx_symbols(binary)
    if output == "cubin":
        return elf_symbols(binary)
    seen: dict[Symbol, None] = {}
    for image in embedded_elves(binary):
        for sym in elf_symbols(image):
            seen.setdefault(sym, None)
    return list(seen)


def _cxxfilt() -> str:
    found = shutil.which("c++filt")
    if found:
        return found
    root = toolkit_root()
    if root:
        found = shutil.which("cu++filt", path=os.path.join(root, "bin"))
        if found:
            return found
    raise ToolchainError(
        "c++filt was not found; nvcc name expressions need it to demangle kernel names. "
        "Install binutils (e.g. `apt-get install binutils`), or use backend='nvrtc'."
    )


def demangle(names: Iterable[str]) -> dict[str, str]:
    """Mangled name -> demangled C++ name (unmangled names map to themselves)."""
    names = list(dict.fromkeys(names))
    mangled = [n for n in names if n.startswith("_Z")]
    result = {n: n for n in names}
    if not mangled:
        return result

    proc = subprocess.run(
        [_cxxfilt()],
        input="\n".join(mangled) + "\n",
        capture_output=True,
        text=True,
        check=False,
    )
    lines = proc.stdout.splitlines()
    if proc.returncode != 0 or len(lines) != len(mangled):
        raise ToolchainError(f"c++filt failed (exit {proc.returncode}): {proc.stderr.strip()}")
    result.update(zip(mangled, lines, strict=True))
    return result


def _squash(text: str) -> str:
    return "".join(text.split())


def entity_name(demangled: str) -> str:
    """``"void ns::k<256, float>(float const*, int)"`` -> ``"ns::k<256, float>"``: the
    qualified name with template arguments, without return type or parameters."""
    text = demangled.strip()
    # drop a trailing parameter list (and cv/ref qualifiers after it)
    if text.endswith(")") or text.endswith(") const"):
        end = text.rfind(")")
        depth = 0
        for i in range(end, -1, -1):
            ch = text[i]
            if ch == ")":
                depth += 1
            elif ch == "(":
                depth -= 1
                if depth == 0:
                    text = text[:i]
                    break
    # drop a leading return type: the last top-level space separates it
    depth = 0
    cut = -1
    for i, ch in enumerate(text):
        if ch in "<([":
            depth += 1
        elif ch in ">)]":
            depth -= 1
        elif ch == " " and depth == 0:
            cut = i
    return text[cut + 1 :].strip() if cut >= 0 else text.strip()


def _base(name: str) -> str:
    return _squash(name).split("<", 1)[0]


def match_name_expressions(
    expressions: Sequence[str], symbols: Sequence[Symbol]
) -> tuple[dict[str, str], list[str]]:
    """Match C++ name expressions (``"block_sum<256, float>"``, ``"&ns::fill<double>"``)
    to symbols. Returns (expression -> mangled name, expressions left unmatched).

    The match compares the demangled qualified name with template arguments, ignoring
    whitespace. When that finds nothing, a unique symbol with the same name before the
    template arguments is taken."""
    ordered = sorted(
        symbols,
        key=lambda s: (s.kind != "func", s.binding != "global"),
    )
    demangled = demangle(s.name for s in ordered)
    entities = [(s, _squash(entity_name(demangled[s.name]))) for s in ordered]
    found: dict[str, str] = {}
    missing: list[str] = []
    for expr in expressions:
        want = _squash(expr).lstrip("&")
        if want.startswith("::"):
            want = want[2:]
        if want.startswith("(") and want.endswith(")"):
            want = want[1:-1]
        exact = [s for s, ent in entities if ent == want]
        if exact:
            found[expr] = exact[0].name
            continue
        base = want.split("<", 1)[0]
        loose = {s.name for s, ent in entities if ent.split("<", 1)[0] == base}
        if len(loose) == 1:
            found[expr] = loose.pop()
        else:
            missing.append(expr)
    return found, missing
