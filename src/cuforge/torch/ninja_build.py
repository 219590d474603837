"""The build.ninja cuforge writes (only the compiles and the link that missed the cache)
and running it with the ``ninja`` executable of the PyPI ``ninja`` package.

A failed build raises :class:`cuforge.base.errors.CompileError` naming the failing TU, with
that TU's compiler output trimmed to its first errors, and the full log's path.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

from cuforge.base._fs import open_regular, write_if_changed
from cuforge.base._progress import enabled as progress_enabled
from cuforge.base.errors import CompileError, ToolchainError
from cuforge.toolchain import nvcc_path
from cuforge.torch.progress import BuildProgress, parse_status

__all__ = ["ninja_path", "write", "run", "trim_log"]

_STATUS = "@@cuforge-ninja "

#: header -> the pip package that provides it (for "No such file" errors)
_HEADER_PACKAGES = {
    "cusparse": "nvidia-cusparse",
    "cublas": "nvidia-cublas",
    "cublasLt": "nvidia-cublas",
    "cusolver": "nvidia-cusolver",
    "cufft": "nvidia-cufft",
    "curand": "nvidia-curand",
    "nvrtc": "nvidia-cuda-nvrtc",
    "cudnn": "nvidia-cudnn-cu13",
    "nccl": "nvidia-nccl-cu13",
    "nvToolsExt": "nvidia-nvtx",
    "nvtx3": "nvidia-nvtx",
    "cuda_runtime": "nvidia-cuda-runtime",
    "cupti": "nvidia-cuda-cupti",
    "cusparseLt": "nvidia-cusparselt-cu13",
}


def ninja_path() -> str:
    try:
        import ninja
    except ImportError:
        raise ToolchainError(
            "the `ninja` package is not installed; cuforge builds extensions with it. "
            "Install it with `pip install ninja`."
        ) from None
    path = os.path.join(ninja.BIN_DIR, "ninja")
    if not os.path.isfile(path):
        raise ToolchainError(f"the ninja package has no executable at {path}; reinstall it")
    return path


def _q(args) -> str:
    """A shell-quoted command line as the value of a ninja variable."""
    from ninja.ninja_syntax import escape

    for a in args:
        if "\n" in a:
            raise ValueError(f"a build flag holds a newline, which ninja cannot express: {a!r}")
    return " ".join(escape(shlex.quote(a)) for a in args)


def _path(p: str) -> str:
    """A path in a ``build`` line. Not ``ninja.ninja_syntax.escape_path``: it leaves a
    ``$`` that no space follows as it is, so ninja would expand ``$name`` inside a path;
    here every ``$`` is escaped first, then spaces and colons."""
    return p.replace("$", "$$").replace(" ", "$ ").replace(":", "$:")


def write(p, todo) -> str:
    """Write ``<build_dir>/build.ninja`` for the TUs in ``todo`` and the link (only when its
    text changed). Returns its path."""

    spec = p.spec
    pre = [p.launcher] if p.launcher else []
    lines = ["ninja_required_version = 1.3", f"cxx = {_q(pre + [p.env.cxx])}"]
    if spec.with_cuda:
        lines.append(f"nvcc = {_q(pre + [nvcc_path()])}")
        lines.append(f"nvcc_bare = {_q([nvcc_path()])}")
    lines.append(f"cflags = {_q(p.cflags)}")
    if spec.with_cuda:
        lines.append(f"cuda_cflags = {_q(p.cuda_flags)}")
    lines.append(f"ldflags = {_q(p.ldflags)}")
    lines += [
        "",
        "rule compile",
        "  command = $cxx -MD -MF $out.d $cflags -c $in -o $out",
        "",
        "rule cuda_compile",
        "  command = $nvcc -MD -MF $out.d $cuda_cflags -c $in -o $out",
        "",
        "rule cuda_split",
        f"  command = {_q([sys.executable, '-m', 'cuforge.torch.nvcc_split'])} $out.d -- "
        "$nvcc_bare $cuda_cflags -c $in -o $out",
        "",
        "rule link",
        "  command = $cxx $in $ldflags -o $out",
        "",
    ]
    for tu in todo:
        rule = ("cuda_split" if tu.split else "cuda_compile") if tu.cuda else "compile"
        lines.append(f"build {_path(tu.obj)}: {rule} {_path(tu.source)}")
    objects = " ".join(_path(tu.obj) for tu in p.tus)
    lines.append(f"build {_path(p.target)}: link {objects}")
    lines.append(f"default {_path(p.target)}")
    path = os.path.join(spec.build_directory, "build.ninja")
    write_if_changed(path, "\n".join(lines) + "\n", mode=0o644)
    return path


def run(p, todo) -> None:
    """Compile ``todo`` and link, in the build dir. Raises CompileError on failure."""

    spec = p.spec
    bdir = spec.build_directory
    write(p, todo)
    # what ninja must (re)make: delete it, so ninja cannot think a stale file is current
    for name in [tu.obj for tu in todo] + [tu.obj + ".d" for tu in todo] + [p.target]:
        try:
            os.unlink(os.path.join(bdir, name))
        except OSError:
            pass
    cmd = [ninja_path(), "-C", bdir, "-j", str(p.jobs)]
    if spec.verbose:
        cmd.append("-v")
    env = dict(os.environ)
    env["NINJA_STATUS"] = _STATUS + "[%f/%t] "

    show = not spec.verbose and progress_enabled()
    log_path = os.path.join(bdir, "build.log")
    fd = open_regular(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    with (
        os.fdopen(fd, "wb") as log,
        BuildProgress(spec.name, len(p.tus), len(p.tus) - len(todo), show) as progress,
    ):
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
        assert proc.stdout is not None
        chunks: list[bytes] = []
        for line in proc.stdout:
            chunks.append(line)
            log.write(line)
            if spec.verbose:
                sys.stderr.write(line.decode("utf-8", "replace").replace(_STATUS, ""))
            elif show:
                status = parse_status(line.decode("utf-8", "replace"), _STATUS)
                if status is not None:
                    progress.update(*status)
        rc = proc.wait()
    if rc == 0:
        return
    output = b"".join(chunks).decode("utf-8", "replace")
    failed, tool, text = _failure(output, p, todo)
    raise CompileError(
        failed,
        trim_log(text),
        backend=tool,
        summary=_summary(failed, text),
        log_path=log_path,
    )


def _failure(output: str, p, todo) -> tuple[str, str, str]:
    """(failing TU's name, tool, its compiler output) from ninja's output."""
    lines = output.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("FAILED: "):
            continue
        # "FAILED: x.o" (ninja < 1.12) or "FAILED: [code=1] x.o"
        tokens = [t for t in line[len("FAILED: ") :].split() if not t.startswith("[code=")]
        target = tokens[0] if tokens else ""
        body: list[str] = []
        for nxt in lines[i + 2 :]:  # i + 1 is the command line
            if nxt.startswith((_STATUS, "FAILED: ", "ninja: build stopped")):
                break
            body.append(nxt)
        for tu in todo:
            if tu.obj == target:
                return tu.rel, ("nvcc" if tu.cuda else "c++"), "\n".join(body)
        return f"{p.spec.name} (link)", "c++", "\n".join(body)
    return p.spec.name, "ninja", output


def trim_log(text: str, max_errors: int = 3, context: int = 4, max_lines: int = 40) -> str:
    """The log up to a few lines after its ``max_errors``-th error line, at most
    ``max_lines`` lines (the full log is in build.log)."""
    lines = text.splitlines()
    errors = 0
    end = len(lines)
    for i, line in enumerate(lines):
        if "error" in line.lower() and ("error:" in line or "error " in line):
            errors += 1
            if errors >= max_errors:
                end = i + 1 + context
                break
    kept = lines[: min(end, max_lines)]
    if len(kept) < len(lines):
        kept.append(f"... ({len(lines) - len(kept)} more lines in the full log)")
    return "\n".join(kept)


def _summary(failed: str, text: str) -> str | None:
    marker = "No such file or directory"
    for line in text.splitlines():
        if "fatal error" in line and marker in line:
            header = line.split("fatal error:", 1)[1].split(":")[0].strip()
            stem = os.path.splitext(os.path.basename(header))[0]
            package = _HEADER_PACKAGES.get(stem)
            hint = f"; it comes with the pip package `{package}`" if package else ""
            return f"{failed}: header {header} not found{hint}"
    return None
