"""The bare nvcc compiler: CUDA C++ source -> cubin, PTX or fatbin, as a subprocess.

Knows nothing of keys or stores. :func:`nvcc_command` gives the exact flags (without file
names); the pipeline keys on them.

* The source is written to a temp dir under its own basename and compiled with
  ``-I <source_dir>`` so that quoted relative includes resolve as if compiled in place.
* ``-MD -MF`` lists the files the compile read (absolute paths, the temp source dropped).
* Errors come back as :class:`~cuforge.base.errors.CompileError` with the temp path in the log
  replaced by the source's name, so ``file(line)`` points at the user's file.
* Name expressions: nvcc has no API for them. Each expression's address is taken in a
  generated host function appended to the source (which makes nvcc instantiate the kernel
  template), then the mangled name is found among the binary's symbols
  (:mod:`cuforge.compiler.symbols`) by demangling with ``c++filt``.
"""

from __future__ import annotations

import os
import time

from cuforge.base.arch import nvcc_arch_flags
from cuforge.base.errors import ArchError, CompileError, ToolchainError
from cuforge.compiler.base import Backend, CompileJob
from cuforge.compiler.outputs import CompileOutput
from cuforge.keys.deps import parse_depfile
from cuforge.toolchain import compiler_identity, nvcc_path, nvcc_supported_archs

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: see docs/architecture.md, the warm path
if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["nvcc_command", "compile_nvcc", "name_expression_code", "NvccBackend"]

_OUTPUT_FLAGS = {"cubin": "-cubin", "ptx": "-ptx", "fatbin": "-fatbin"}
_RESERVED = (
    "-arch",
    "--gpu-architecture",
    "-gencode",
    "--generate-code",
    "-code",
    "--gpu-code",
    "-cubin",
    "--cubin",
    "-ptx",
    "--ptx",
    "-fatbin",
    "--fatbin",
    "-o",
    "--output-file",
    "-c",
    "--compile",
)
_NE_MARKER = "<cuforge name expressions>"


def nvcc_command(options: Sequence[str], archs: Sequence[str], output: str) -> tuple[str, ...]:
    """The exact nvcc flags, without file names: the output kind, the arch flags
    (:func:`cuforge.base.arch.nvcc_arch_flags`: ``-arch=sm_XY`` for one cubin,
    ``-arch=compute_XY`` for PTX, one ``-gencode`` per arch plus ``--threads 0`` for a
    fatbin of several), then the user's options."""
    if output not in _OUTPUT_FLAGS:
        raise ValueError(f"nvcc output must be one of {sorted(_OUTPUT_FLAGS)}, not {output!r}")
    flags: list[str] = [_OUTPUT_FLAGS[output], *nvcc_arch_flags(archs, output)]
    for opt in options:
        opt = str(opt)
        head = opt.split("=", 1)[0]
        if head in _RESERVED:
            raise ValueError(
                f"option {opt!r} is set by cuforge: give archs through arch= and the output "
                "kind through output="
            )
        flags.append(opt)
    return tuple(flags)


class NvccBackend(Backend):
    """nvcc as a subprocess: cubin, PTX or a fatbin of several archs; ``-MD`` reports the
    files it read."""

    name = "nvcc"
    outputs = ("cubin", "ptx", "fatbin")
    many_archs = True
    reports_dependencies = True
    _VALUE_FLAGS = {
        "-I": "include",
        "--include-path": "include",
        "-isystem": "system",
        "--system-include": "system",
        "-include": "pre_include",
        "--pre-include": "pre_include",
    }
    _COMMA_LISTS = True
    # nvcc reads "-I dir" (one argument) as -Idir too (checked with nvcc 13.0); its
    # dependency file, not the key's spelling of the dir, lists the headers it read
    _STRIP_BLANKS = True

    def compiler_options(self, options, archs, output):
        return nvcc_command(options, archs, output)

    def identity(self) -> dict[str, str]:
        return compiler_identity("nvcc")

    def supported_archs(self) -> list[str]:
        return nvcc_supported_archs()

    def compile(self, job: CompileJob, *, source_dir: str | None) -> CompileOutput:
        return compile_nvcc(
            job.source,
            name=job.name,
            options=job.options,
            archs=job.archs,
            output=job.output,
            name_expressions=job.name_expressions,
        )


def name_expression_code(name_expressions: Sequence[str]) -> str:
    """Code appended to the source so that nvcc instantiates every name expression.

    Taking a kernel template's address in host code instantiates it on the device side
    too. A non-static function draws no "declared but never referenced" warning."""
    if not name_expressions:
        return ""
    lines = ["", f'#line 1 "{_NE_MARKER}"', "void __cuforge_name_expressions(void** out) {"]
    for i, expr in enumerate(name_expressions):
        target = expr.strip()
        if not target.startswith("&"):
            target = "&" + target
        lines.append(f"  out[{i}] = (void*)({target});")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _c_string(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")


def _file_name(name: str) -> str:
    base = os.path.basename(name) or "source.cu"
    base = "".join(c if c.isalnum() or c in "._-+" else "_" for c in base)
    return base if base.endswith(".cu") else base + ".cu"


def compile_nvcc(
    source: str,
    *,
    name: str,
    options: Sequence[str],
    archs: Sequence[str],
    output: str = "cubin",
    name_expressions: Sequence[str] = (),
    source_dir: str | None = None,
) -> CompileOutput:
    """Compile ``source`` with nvcc. ``source_dir``: where the source lives (its quoted
    relative includes are looked for there). Raises :class:`CompileError` with the log,
    :class:`ArchError` for an arch nvcc does not support, ValueError for an empty source,
    :class:`~cuforge.base.errors.ToolchainError` when nvcc is missing."""
    if not isinstance(source, str):
        raise TypeError(f"{name}: source must be str, not {type(source).__name__}")
    if not source.strip():
        raise ValueError(f"{name}: the source is empty; there is nothing to compile")
    import shutil  # these three only on a miss (an nvcc run)
    import subprocess
    import tempfile

    flags = nvcc_command(options, archs, output)
    nvcc = nvcc_path()
    tmp = tempfile.mkdtemp(prefix="cuforge-nvcc-")
    try:
        src_path = os.path.join(tmp, _file_name(name))
        out_path = os.path.join(tmp, "out." + output)
        dep_path = os.path.join(tmp, "out.d")
        with open(src_path, "w", encoding="utf-8", errors="surrogateescape") as f:
            # diagnostics, __FILE__ and -lineinfo debug info name the user's file, not
            # the temp copy (and the output does not depend on the temp dir's name)
            f.write(f'#line 1 "{_c_string(name)}"\n')
            f.write(source)
            if not source.endswith("\n"):
                f.write("\n")
            f.write(name_expression_code(name_expressions))
        include: list[str] = []
        if source_dir:
            include = ["-I", os.path.abspath(source_dir)]
        argv = [nvcc, *flags, *include, "-MD", "-MF", dep_path, "-o", out_path, src_path]
        start = time.perf_counter()
        try:
            # run in the caller's cwd: relative paths in options (-Iinclude) mean what they
            # would on the caller's own command line
            proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        except OSError as exc:
            raise ToolchainError(
                f"cannot run nvcc ({nvcc}): {exc}. Check the CUDA toolkit install or CUFORGE_NVCC."
            ) from None
        seconds = time.perf_counter() - start
        log = _clean_log(proc.stdout + proc.stderr, src_path, tmp, name)
        if proc.returncode != 0 or not os.path.isfile(out_path):
            _raise(log, name, flags, source, archs)
        with open(out_path, "rb") as f:
            binary = f.read()
        dependencies = _dependencies(dep_path, src_path, os.getcwd())
        lowered: dict[str, str] = {}
        if name_expressions:
            lowered = _lower(binary, output, name_expressions, name, log, flags, source)
        return CompileOutput(binary, log, lowered, dependencies, seconds, flags)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _clean_log(log: str, src_path: str, tmp: str, name: str) -> str:
    return log.replace(src_path, name).replace(tmp + os.sep, "").strip()


def _dependencies(dep_path: str, src_path: str, cwd: str) -> list[str]:
    try:
        with open(dep_path, encoding="utf-8", errors="surrogateescape") as f:
            text = f.read()
    except OSError:
        return []
    deps: list[str] = []
    src_real = os.path.realpath(src_path)
    for dep in parse_depfile(text):
        path = os.path.normpath(os.path.join(cwd, dep))
        if path == src_path or os.path.realpath(path) == src_real:
            continue
        if path not in deps:
            deps.append(path)
    return deps


def _raise(log: str, name: str, flags, source: str, archs) -> None:
    text = log.strip()
    lowered = text.lower()
    if "unsupported gpu architecture" in lowered or "is not defined for option 'gpu-" in lowered:
        known = ", ".join(nvcc_supported_archs()) or "unknown"
        raise ArchError(
            f"{name}: nvcc cannot compile for {list(archs)!r} ({text.splitlines()[0]}). "
            f"This nvcc supports: {known}."
        )
    summary = None
    for line in text.splitlines():
        if line.startswith("nvcc fatal") or line.startswith("nvcc error"):
            detail = line.split(":", 1)[1].strip() if ":" in line else line
            if "unknown option" in detail.lower():
                summary = f"{name}: nvcc rejected option: {detail}"
            else:
                summary = f"{name}: nvcc: {detail}"
            break
    raise CompileError(name, log, backend="nvcc", options=flags, source=source, summary=summary)


def _lower(binary, output, name_expressions, name, log, flags, source) -> dict[str, str]:
    # symbols: only after an nvcc run
    from cuforge.compiler.symbols import binary_symbols, match_name_expressions

    try:
        symbols = binary_symbols(binary, output)
    except ValueError as exc:
        raise CompileError(
            name,
            log,
            backend="nvcc",
            options=flags,
            source=source,
            summary=f"{name}: cannot read the symbols of the {output} ({exc})",
        ) from None
    found, missing = match_name_expressions(list(name_expressions), symbols)
    if missing:
        hint = ""
        if output == "fatbin" and not symbols:
            hint = " (the fatbin is compressed; name expressions need an uncompressed one)"
        raise CompileError(
            name,
            log,
            backend="nvcc",
            options=flags,
            source=source,
            summary=(
                f"{name}: no symbol in the {output} matches name expression(s) "
                + ", ".join(repr(m) for m in missing)
                + hint
            ),
        )
    return {expr: found[expr] for expr in name_expressions}
