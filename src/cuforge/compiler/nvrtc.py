"""The bare NVRTC compiler: CUDA C++ source -> cubin or PTX, in-process.

Through ``cuda.bindings.nvrtc`` (imported lazily, on the first compile). Measured here
(2 cores, no GPU), the bindings beat ``cuda.core``'s ``Program``: ``import
cuda.bindings.nvrtc`` costs ~160-210 ms against ~400-600 ms for ``cuda.core``, and a compile
costs the same through both (NVRTC does the work), so the thin layer wins.

Knows nothing of keys or stores. :func:`nvrtc_options` is the exact option list NVRTC
receives; the pipeline puts exactly that in the cache key.

NVRTC 12 and 13 have no dependency output (``-MD`` is rejected), so ``dependencies`` is None and
the pipeline's include scanner lists the headers.
"""

from __future__ import annotations

import _thread
import time

from cuforge.base.arch import normalize_arch
from cuforge.base.errors import ArchError, CompileError, ToolchainError
from cuforge.compiler.base import Backend, CompileJob
from cuforge.compiler.outputs import CompileOutput
from cuforge.toolchain import (
    check_loaded_nvrtc,
    check_nvrtc_headers,
    compiler_identity,
    nvrtc_library_path,
    nvrtc_supported_archs,
    toolkit_include_dirs,
)

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: see docs/architecture.md, the warm path
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

__all__ = ["nvrtc_options", "compile_nvrtc", "NvrtcBackend"]

_ARCH_FLAGS = ("-arch", "--gpu-architecture")

_module = None
_module_lock = _thread.allocate_lock()


def _nvrtc():
    """``cuda.bindings.nvrtc``, imported once; ToolchainError saying how to fix it."""
    global _module
    if _module is not None:
        return _module
    with _module_lock:
        if _module is None:
            nvrtc_library_path()  # a clear ToolchainError when NVRTC itself is missing
            try:
                from cuda.bindings import nvrtc
            except ImportError as exc:
                raise ToolchainError(
                    f"cuda-bindings is not importable ({exc}). Install it with "
                    "`pip install 'cuforge[cu13]'` (or 'cuforge[cu12]' for CUDA 12)."
                ) from None
            # the NVRTC cuda-bindings loads is the one the keys name (a replayed search
            # stands in for cuda-pathfinder's where it can: this checks it, once)
            check_loaded_nvrtc()
            _module = nvrtc
    return _module


def nvrtc_options(options: Sequence[str], arch: str, output: str) -> tuple[str, ...]:
    """The exact option list passed to NVRTC: the user's options, then ``-arch=sm_XY``
    (cubin) or ``-arch=compute_XY`` (ptx), then ``-I`` for each toolkit include dir."""
    if output not in ("cubin", "ptx"):
        raise ValueError(
            f"NVRTC produces 'cubin' or 'ptx', not {output!r}; "
            "use backend='nvcc' for a fatbin of several archs"
        )
    if not isinstance(arch, (str, int)):
        raise ArchError(f"NVRTC compiles for one arch at a time; got {arch!r}")
    norm = normalize_arch(arch)
    digits = norm.split("_", 1)[1]
    if output == "cubin":
        if norm.startswith("compute_"):
            raise ArchError(
                f"a cubin needs a real arch such as 'sm_{digits}', not the virtual {norm!r}; "
                "use output='ptx' for virtual-arch code"
            )
        arch_flag = f"-arch=sm_{digits}"
    else:
        arch_flag = f"-arch=compute_{digits}"
    opts: list[str] = []
    for opt in options:
        opt = str(opt)
        if opt.split("=", 1)[0] in _ARCH_FLAGS:
            raise ValueError(
                f"option {opt!r}: give the arch through arch= (e.g. arch='sm_90'), not in options"
            )
        opts.append(opt)
    opts.append(arch_flag)
    opts.extend(f"-I{d}" for d in toolkit_include_dirs())
    return tuple(opts)


class NvrtcBackend(Backend):
    """NVRTC in-process: one arch, cubin or PTX, in-memory headers. It reports no
    dependencies, so the pipeline's include scanner lists them."""

    name = "nvrtc"
    outputs = ("cubin", "ptx")
    inline_headers = True
    # NVRTC takes -Idir, -I dir, -I=dir, --include-path=dir and --include-path dir, and
    # -include / --pre-include in the same forms; no comma lists. It reads each option
    # without its leading and trailing blanks and "-I dir" (one option) as -Idir, but keeps
    # a blank after "=" ("-I= dir" names " dir"). Checked with NVRTC 13.0.
    _STRIP_BLANKS = True
    _VALUE_FLAGS = {
        "-I": "include",
        "--include-path": "include",
        "-include": "pre_include",
        "--pre-include": "pre_include",
    }

    def compiler_options(self, options, archs, output):
        return nvrtc_options(options, archs[0], output)

    def identity(self) -> dict[str, str]:
        return compiler_identity("nvrtc")

    def supported_archs(self) -> list[str]:
        return nvrtc_supported_archs()

    def compile(self, job: CompileJob, *, source_dir: str | None) -> CompileOutput:
        return compile_nvrtc(
            job.source,
            name=job.name,
            options=job.options,
            arch=job.archs[0],
            output=job.output,
            name_expressions=job.name_expressions,
            headers=job.headers,
        )


def _text(raw: bytes | bytearray) -> str:
    return bytes(raw).rstrip(b"\0").decode("utf-8", "replace")


def _check(nvrtc, result, what: str) -> None:
    err = result[0] if isinstance(result, tuple) else result
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, message = nvrtc.nvrtcGetErrorString(err)
        raise ToolchainError(f"NVRTC {what} failed: {_text(message)}")


def compile_nvrtc(
    source: str,
    *,
    name: str,
    options: Sequence[str],
    arch: str,
    output: str = "cubin",
    name_expressions: Sequence[str] = (),
    headers: Mapping[str, str] | None = None,
) -> CompileOutput:
    """Compile ``source`` with NVRTC for one ``arch``. Thread-safe.

    ``headers`` maps include names to contents (NVRTC's in-memory headers).
    ``name_expressions`` (``"block_sum<256, float>"``) come back as ``lowered_names``.
    Raises :class:`CompileError` (with the log) when NVRTC rejects the source or an
    option, :class:`ArchError` for an arch NVRTC does not know, ValueError for an empty
    source.
    """
    if not isinstance(source, str):
        raise TypeError(f"{name}: source must be str, not {type(source).__name__}")
    if not source.strip():
        raise ValueError(f"{name}: the source is empty; there is nothing to compile")
    opts = nvrtc_options(options, arch, output)
    nvrtc = _nvrtc()
    # header dirs the key took from the toolchain memo are the ones pathfinder finds
    check_nvrtc_headers()
    ok = nvrtc.nvrtcResult.NVRTC_SUCCESS
    header_names = [k.encode() for k in (headers or {})]
    header_texts = [v.encode("utf-8", "surrogateescape") for v in (headers or {}).values()]
    start = time.perf_counter()
    err, prog = nvrtc.nvrtcCreateProgram(
        source.encode("utf-8", "surrogateescape"),
        name.encode(),
        len(header_names),
        header_texts,
        header_names,
    )
    if err != ok:
        _check(nvrtc, err, "nvrtcCreateProgram")
    try:
        for expr in name_expressions:
            _check(nvrtc, nvrtc.nvrtcAddNameExpression(prog, expr.encode()), "AddNameExpression")
        encoded = [o.encode() for o in opts]
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(encoded), encoded)
        log = _program_log(nvrtc, prog)
        if result != ok:
            _raise_compile_error(nvrtc, result, log, name, opts, source, arch)
        if output == "cubin":
            err, size = nvrtc.nvrtcGetCUBINSize(prog)
            _check(nvrtc, err, "nvrtcGetCUBINSize")
            buf = bytearray(size)
            _check(nvrtc, nvrtc.nvrtcGetCUBIN(prog, buf), "nvrtcGetCUBIN")
            binary = bytes(buf)
        else:
            err, size = nvrtc.nvrtcGetPTXSize(prog)
            _check(nvrtc, err, "nvrtcGetPTXSize")
            buf = bytearray(size)
            _check(nvrtc, nvrtc.nvrtcGetPTX(prog, buf), "nvrtcGetPTX")
            binary = bytes(buf).rstrip(b"\0")
        lowered: dict[str, str] = {}
        for expr in name_expressions:
            err, mangled = nvrtc.nvrtcGetLoweredName(prog, expr.encode())
            if err != ok:
                raise CompileError(
                    name,
                    log,
                    backend="nvrtc",
                    options=opts,
                    source=source,
                    summary=f"{name}: name expression {expr!r} has no lowered name",
                )
            lowered[expr] = _text(mangled)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    seconds = time.perf_counter() - start
    return CompileOutput(binary, log, lowered, None, seconds, opts)


def _program_log(nvrtc, prog) -> str:
    err, size = nvrtc.nvrtcGetProgramLogSize(prog)
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS or size <= 1:
        return ""
    buf = bytearray(size)
    nvrtc.nvrtcGetProgramLog(prog, buf)
    return _text(buf)


def _raise_compile_error(nvrtc, result, log, name, opts, source, arch) -> None:
    if result == nvrtc.nvrtcResult.NVRTC_ERROR_INVALID_OPTION:
        text = log.strip()
        if "gpu-architecture" in text or "-arch" in text:
            known = ", ".join(nvrtc_supported_archs()) or "unknown"
            raise ArchError(
                f"{name}: NVRTC cannot compile for arch {arch!r} ({text or 'invalid arch'}). "
                f"This NVRTC supports: {known} (an 'a' or 'f' suffix, e.g. sm_90a, selects "
                "arch-specific features)."
            )
        rejected = ""
        marker = "unrecognized option "
        idx = text.find(marker)
        if idx >= 0:
            rejected = text[idx + len(marker) :].split(" found")[0].strip()
        summary = (
            f"{name}: NVRTC rejected option {rejected!r}"
            if rejected
            else f"{name}: NVRTC rejected an option ({text or 'invalid option'})"
        )
        raise CompileError(name, log, backend="nvrtc", options=opts, source=source, summary=summary)
    if result == nvrtc.nvrtcResult.NVRTC_ERROR_COMPILATION or log:
        raise CompileError(name, log, backend="nvrtc", options=opts, source=source)
    _, message = nvrtc.nvrtcGetErrorString(result)
    raise CompileError(
        name,
        log,
        backend="nvrtc",
        options=opts,
        source=source,
        summary=f"{name}: NVRTC failed: {_text(message)}",
    )
