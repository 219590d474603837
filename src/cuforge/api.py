"""The public compile API: :func:`compile`, :func:`compile_file`, :func:`explain_miss`, :func:`cache`."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from cuforge.pipeline import compile_cached
from cuforge.program import Program

TYPE_CHECKING = False  # typing costs ~15 ms to import; annotations are strings here
if TYPE_CHECKING:
    from typing import Any


__all__ = ["compile", "compile_file", "explain_miss", "cache"]


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
) -> Program:
    """Compile CUDA C++ ``source`` (or fetch an identical earlier compile) and return a :class:`Program`.

    Args:
        source: the CUDA C++ text.
        name: the source's name in logs, errors and ``cuforge cache ls`` (and in the key,
            since it shows up in debug line info).
        options: compiler options exactly as the compiler takes them (``"-std=c++17"``).
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

    Raises:
        CompileError: the compiler rejected the source (``str(err)`` has the log with lines).
        ArchError: no arch could be determined, or it could not be read.
        ToolchainError: NVRTC or nvcc could not be found.
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
) -> Program:
    """Compile a ``.cu`` file. Quoted includes resolve relative to the file's directory, as
    when compiled in place. Same arguments as :func:`compile`; the name is the file's name."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise FileNotFoundError(f"cannot read CUDA source {path!r}: {exc.strerror}") from None
    try:
        source = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ValueError(
            f"{path}: not UTF-8 text: byte 0x{raw[exc.start]:02x} at offset {exc.start} "
            f"(line {line}) cannot be decoded. Save the file as UTF-8."
        ) from None
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
    )


def explain_miss(name: str | None = None) -> list[str]:
    """Why the last cache miss in this process (for source ``name``, if given) happened.

    Returns reasons such as ``["header include/common.cuh changed"]``, ``["option -O3 added"]``
    or ``["arch sm_80 -> sm_90"]``; an empty list when there was no explained miss."""
    from cuforge.explain import last_miss

    record = last_miss(name)
    return list(record["reasons"]) if record else []


def cache():
    """The cache in use: a store with get/put/delete/iterate/stats (None when disabled)."""
    from cuforge.store import default_store

    return default_store()
