"""The public compile API: :func:`compile`, :func:`compile_file`, :func:`load_binary`,
:func:`explain_miss`, :func:`cache`."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from cuforge.base._fs import read_bytes, read_source
from cuforge.core.caching import Cache, default_cache, resolve
from cuforge.core.pipeline import compile_cached
from cuforge.frontend.program import Program
from cuforge.keys.key import bytes_digest

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: see docs/architecture.md, the warm path
if TYPE_CHECKING:
    from typing import Any


__all__ = ["compile", "compile_file", "load_binary", "explain_miss", "cache", "read_source"]

#: what :func:`load_binary` loads
BINARY_KINDS = ("cubin", "ptx", "fatbin")
_EM_CUDA = 190
_FATBIN_MAGIC = b"\x50\xed\x55\xba"


def compile(
    source: str,
    *,
    name: str = "kernel.cu",
    options: Sequence[str] = (),
    include_dirs: Sequence[str | os.PathLike[str]] = (),
    defines: Mapping[str, Any] | None = None,
    arch: str | int | Sequence[str] | None = None,
    backend: str = "nvrtc",
    output: str = "cubin",
    name_expressions: Sequence[str] = (),
    headers: Mapping[str, str] | None = None,
    strict: bool = False,
    cache: Cache | None = None,
) -> Program:
    """Compile CUDA C++ ``source`` (or fetch an identical earlier compile) and return a :class:`Program`.

    Args:
        source: the CUDA C++ text.
        name: the source's name in logs, errors and ``cuforge cache ls`` (and in the key,
            since it shows up in debug line info).
        options: compiler options exactly as the compiler takes them (``"-std=c++17"``), or a
            :class:`cuforge.Options` (the same key as the raw list it spells).
        include_dirs: directories for ``#include``; every header found there is keyed by content.
        defines: compile-time constants, ``{"TILE": 32}`` -> ``-DTILE=32``; part of the key.
        arch: ``"sm_90"``, ``"9.0"`` or ``"90"``. None: the visible GPU's arch, else
            ``CUFORGE_ARCH``, else ``TORCH_CUDA_ARCH_LIST``, else an :class:`ArchError` saying
            how to set it. A list of archs needs ``output="fatbin"`` and ``backend="nvcc"``.
        backend: ``"nvrtc"`` (in-process, the default) or ``"nvcc"``.
        output: ``"cubin"`` (default), ``"ptx"`` or ``"fatbin"`` (nvcc, several archs).
        name_expressions: C++ template instances to instantiate and keep, e.g.
            ``("block_sum<256, float>",)``; their mangled names are in ``Program.lowered_names``.
        headers: NVRTC only: in-memory headers ``{"tile.cuh": "..."}``, keyed by content.
        strict: never compile (also ``CUFORGE_OFFLINE=1``): a kernel that is neither in the
            cache nor in a loaded bundle raises :class:`OfflineMissError`.
        cache: the :class:`cuforge.Cache` to use (default: :func:`cuforge.default_cache`,
            built from the ``CUFORGE_*`` environment).

    Raises:
        CompileError: the compiler rejected the source (``str(err)`` has the log with lines).
        ArchError: no arch could be determined, or it could not be read.
        ToolchainError: NVRTC or nvcc could not be found.
        OfflineMissError: ``strict`` (or ``CUFORGE_OFFLINE=1``) and the kernel is not cached;
            the message names the kernel, arch and variant, and the manifest entry to add.
    """
    return compile_cached(
        source,
        name=name,
        options=options,
        include_dirs=include_dirs,
        defines=defines,
        arch=arch,
        backend=backend,
        output=output,
        name_expressions=name_expressions,
        headers=headers,
        result_type=Program,
        strict=strict,
        cache=cache,
    )


def compile_file(
    path: str | os.PathLike[str],
    *,
    options: Sequence[str] = (),
    include_dirs: Sequence[str | os.PathLike[str]] = (),
    defines: Mapping[str, Any] | None = None,
    arch: str | int | Sequence[str] | None = None,
    backend: str = "nvrtc",
    output: str = "cubin",
    name_expressions: Sequence[str] = (),
    strict: bool = False,
    cache: Cache | None = None,
) -> Program:
    """Compile a ``.cu`` file. Quoted includes resolve relative to the file's directory, as
    when compiled in place. Same arguments as :func:`compile`; the name is the file's name."""
    path = os.fspath(path)
    source = read_source(path)
    return compile_cached(
        source,
        name=os.path.basename(path),
        options=options,
        include_dirs=include_dirs,
        defines=defines,
        arch=arch,
        backend=backend,
        output=output,
        name_expressions=name_expressions,
        source_dir=os.path.dirname(os.path.abspath(path)),
        result_type=Program,
        strict=strict,
        cache=cache,
    )


def load_binary(
    path_or_bytes: str | os.PathLike[str] | bytes | bytearray | memoryview,
    kind: str | None = None,
    name: str | None = None,
    *,
    source: str | None = None,
    cache: Cache | None = None,
) -> Program:
    """A :class:`Program` from a binary built elsewhere: a cubin, PTX or fatbin file (or its
    bytes), as CuPy's ``RawModule(path=)`` and cuda.core's ``ObjectCode`` load them. Its
    kernels launch like any other (``prog.kernel("saxpy")[grid, block](...)``).

    Args:
        path_or_bytes: the file's path, or its contents.
        kind: ``"cubin"``, ``"ptx"`` or ``"fatbin"``; None: told from the contents (an ELF
            is a cubin, the fatbin magic a fatbin, text with ``.version`` / ``.target`` PTX).
            When given, it is checked against the contents.
        name: the program's name in errors (default: the file's name, else ``"<bytes>"``).
        source: the CUDA source it was built from, if you have it: then kernels know their
            parameter types (otherwise arguments are packed by the sizes the driver reports,
            by each argument's own kind) and ``get_global`` can list the globals.

    The binary is not checked further until a kernel is loaded on a GPU (the driver's error
    then names the program). ``arch`` is read from a cubin's header or PTX's ``.target``
    (None for a fatbin); ``key`` is ``"loaded-<sha256 of the bytes>"``; ``source_of_result``
    is ``"loaded"``. Nothing is stored: the bytes are the caller's. ``cache`` is the
    :class:`cuforge.Cache` the program belongs to (default: :func:`cuforge.default_cache`),
    checked like every entry point's.

    Raises:
        FileNotFoundError: the path cannot be read (or is not a regular file).
        ValueError: the contents are not a cubin, PTX or fatbin, or not the ``kind`` given.
        TypeError: ``path_or_bytes`` is neither a path nor bytes.
    """
    resolve(cache)  # a wrong argument is named now, as for every cached entry point
    if isinstance(path_or_bytes, (bytes, bytearray, memoryview)):
        binary = bytes(path_or_bytes)
        label = name or "<bytes>"
    elif isinstance(path_or_bytes, (str, os.PathLike)):
        path = os.fspath(path_or_bytes)
        try:
            # the caller's own file: a symlink to it is fine, anything but a regular file is not
            binary = read_bytes(path, follow=True)
        except OSError as exc:
            raise FileNotFoundError(
                f"cannot read the binary {path!r}: {exc.strerror or exc}; load_binary takes the "
                "path of a regular cubin, PTX or fatbin file (or its bytes)"
            ) from None
        label = name or os.path.basename(path)
    else:
        raise TypeError(
            f"load_binary takes a path or the binary's bytes, not {type(path_or_bytes).__name__}"
        )
    found, arch = _binary_kind(binary)
    if kind is not None and kind not in BINARY_KINDS:
        raise ValueError(f"load_binary(kind=...) takes {', '.join(BINARY_KINDS)}, not {kind!r}")
    if found is None:
        raise ValueError(
            f"{label}: not a cubin (ELF), PTX (text with .version and .target) or fatbin; "
            f"its first bytes are {binary[:8]!r}"
        )
    if kind is not None and kind != found:
        raise ValueError(f"{label}: kind={kind!r} was given but the contents are a {found}")

    return Program(
        name=label,
        source=source,
        binary=binary,
        output=found,
        arch=arch,
        backend=None,
        lowered_names={},
        name_expressions=(),
        log="",
        key="loaded-" + bytes_digest(binary),
        key_fields=None,
        source_of_result="loaded",
        compile_seconds=0.0,
        lookup_seconds=0.0,
        headers=(),
    )


def _binary_kind(binary: bytes) -> tuple[str | None, str | None]:
    """(kind, arch) of a binary's contents; (None, None) when it is none of the kinds."""
    if binary.startswith(b"\x7fELF"):
        if len(binary) < 52 or binary[4] != 2:
            return None, None  # CUDA cubins are 64-bit ELF
        machine = int.from_bytes(binary[18:20], "little")
        if machine != _EM_CUDA:
            return None, None
        flags = int.from_bytes(binary[48:52], "little")
        # the ELF ABI version: 8 and later keep the SM in bits 8-15, earlier in bits 0-7
        sm = (flags >> 8) & 0xFF if binary[8] >= 8 else flags & 0xFF
        return "cubin", (f"sm_{sm}" if 20 <= sm < 255 else None)
    if binary.startswith(_FATBIN_MAGIC):
        return "fatbin", None
    try:
        text = binary.rstrip(b"\0").decode("ascii")
    except UnicodeDecodeError:
        return None, None
    if ".version" in text and ".target" in text:
        target = text.split(".target", 1)[1].split("\n", 1)[0]
        arch = target.replace(",", " ").split()
        return "ptx", (arch[0] if arch else None)
    return None, None


def explain_miss(name: str | None = None) -> list[str]:
    """Why the last cache miss in this process (for source ``name``, if given) happened.

    Returns reasons such as ``["header include/common.cuh changed"]``, ``["option -O3 added"]``
    or ``["arch sm_80 -> sm_90"]``; an empty list when there was no explained miss."""
    from cuforge.keys.explain import last_miss  # explain: not loaded by `import cuforge`

    record = last_miss(name)
    return list(record["reasons"]) if record else []


def cache() -> Cache:
    """The cache in use: :func:`cuforge.default_cache` (a :class:`cuforge.Cache`, with
    get/put/delete/iterate/stats; its ``store`` is None when caching is disabled)."""
    return default_cache()
