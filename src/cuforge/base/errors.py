"""The exceptions cuforge raises. Every one is written for the person reading it."""

from __future__ import annotations

__all__ = [
    "CuforgeError",
    "CompileError",
    "ArchError",
    "ConfigError",
    "ToolchainError",
    "CompileAfterFenceError",
    "OfflineMissError",
    "Diagnostic",
]


class CuforgeError(Exception):
    """Base class of cuforge's own errors."""


class ConfigError(CuforgeError, ValueError):
    """A ``CUFORGE_*`` variable has a value cuforge cannot use; the message names the
    variable and the values it accepts."""


class ArchError(CuforgeError, ValueError):
    """An arch string cuforge cannot understand, or no arch could be determined; the message
    says how to set one."""


class ToolchainError(CuforgeError):
    """A compiler or library cuforge needs could not be found or run; the message says how to fix it."""


class OfflineMissError(CuforgeError):
    """Strict mode (``strict=True``, ``Cache(offline=True)`` or ``CUFORGE_OFFLINE=1``) met a
    build that is neither in the cache nor in a loaded bundle; nothing was built. The one
    offline error, for every kind of build.

    Attributes: ``kind`` (``"kernel"``, ``"torch"``, ``"cccl"``, ``"cute"``...), ``name``,
    ``key`` (hex, when known), ``fields`` (the labeled key fields, when known) and
    ``manifest_entry`` (the ``cuforge.toml`` stanza that would build it ahead of time, or
    None). A kernel's error also has ``arch``, ``name_expressions``, ``defines``,
    ``options`` and ``include_dirs``."""

    def __init__(
        self,
        message: str,
        *,
        kind: str,
        name: str,
        key: str = "",
        fields: dict[str, str] | None = None,
        manifest_entry: str | None = None,
        **details: object,
    ) -> None:
        self.kind, self.name, self.key = kind, name, key
        self.fields = dict(fields or {})
        self.manifest_entry = manifest_entry
        for attr, value in details.items():
            setattr(self, attr, value)
        super().__init__(message)


class CompileAfterFenceError(CuforgeError):
    """A build was about to run after the compile fence (``cuforge.fence("error")`` or
    ``CUFORGE_FENCE=error``); nothing was compiled.

    Attributes: ``system`` (``"kernel"``, ``"cuforge.jit"``, ``"torch extension"``,
    ``"cuda.compute"``, ``"CuTe DSL"``, ``"triton"``...), ``kind`` (the entry kind),
    ``name``, ``key`` (the build's key; for a kernel, direct mode's base key, the key
    before its headers are read: ``cuforge cache show KEY`` and ``cuforge cache explain
    KEY`` resolve it to its manifest's variants), ``reasons`` (the labeled key fields that
    missed, as ``cuforge cache explain`` words them), ``manifest_entry`` (the ``cuforge.toml`` stanza that would build
    it ahead of time, or None) and ``stack`` (the caller's frames, innermost last)."""

    def __init__(
        self,
        message: str,
        *,
        system: str,
        kind: str,
        name: str,
        key: str,
        reasons: tuple[str, ...] = (),
        manifest_entry: str | None = None,
        stack: tuple[str, ...] = (),
    ) -> None:
        self.system, self.kind, self.name, self.key = system, kind, name, key
        self.reasons, self.manifest_entry, self.stack = tuple(reasons), manifest_entry, stack
        super().__init__(message)


# nvrtc:  saxpy.cu(3): error: identifier "foo" is undefined
# nvcc:   /tmp/x/saxpy.cu(3): error: identifier "foo" is undefined
# gcc:    binding.cpp:12:5: error: 'foo' was not declared in this scope
_DIAG_PATTERNS = (
    r"^(?P<file>[^\s(][^(]*?)\((?P<line>\d+)\): (?P<severity>error|warning|catastrophic error)[^:]*: (?P<message>.*)$",
    r"^(?P<file>[^\s:][^:]*):(?P<line>\d+):(?:\d+:)? (?P<severity>error|warning|fatal error): (?P<message>.*)$",
)


class Diagnostic:
    """One error or warning line of a compiler log: file, line, severity and message."""

    __slots__ = ("file", "line", "severity", "message")

    def __init__(self, file: str, line: int, severity: str, message: str) -> None:
        self.file, self.line, self.severity, self.message = file, line, severity, message

    def __repr__(self) -> str:
        return f"Diagnostic({self.file!r}, {self.line}, {self.severity!r}, {self.message!r})"

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.severity}: {self.message}"


def parse_diagnostics(log: str) -> list[Diagnostic]:
    """The error and warning lines of an NVRTC, nvcc or host-compiler log."""
    import re  # only on the error path: `re` costs ~10 ms to import

    patterns = [re.compile(p) for p in _DIAG_PATTERNS]
    found: list[Diagnostic] = []
    for line in log.splitlines():
        for pattern in patterns:
            match = pattern.match(line.strip())
            if match:
                found.append(
                    Diagnostic(
                        match["file"],
                        int(match["line"]),
                        match["severity"],
                        match["message"].strip(),
                    )
                )
                break
    return found


class CompileError(CuforgeError):
    """The compiler rejected the source. ``str(err)`` names the failing file and line once,
    in its first line, then shows the compiler's log::

        kernels/broken.cu:3: error: identifier "undefined_thing" is undefined (nvrtc)
        compiler log:
          kernels/broken.cu(3): error: identifier "undefined_thing" is undefined
              undefined_thing(x);
              ^
        options: -arch=sm_90 ...

    Attributes: ``name`` (the source name), ``log`` (the full compiler log), ``backend``,
    ``options`` (as the compiler received them), ``diagnostics`` (parsed error lines),
    ``source`` (the source text, when known, used to quote the offending lines when the log
    does not) and ``summary`` (what failed, in one line, without the source name).
    """

    def __init__(
        self,
        name: str,
        log: str,
        *,
        backend: str = "",
        options: tuple[str, ...] | list[str] = (),
        source: str | None = None,
        summary: str | None = None,
        log_path: str | None = None,
    ) -> None:
        self.name = name
        self.log = log or ""
        self.backend = backend
        self.options = tuple(options)
        self.source = source
        self.log_path = log_path
        self.diagnostics = parse_diagnostics(self.log)
        if summary and summary.startswith(f"{name}: "):
            summary = summary[len(name) + 2 :]  # the headline names the file already
        self._located = not summary and bool(self._errors())
        self.summary = summary or self._default_summary()
        super().__init__(self._render())

    def _errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if "error" in d.severity]

    def _default_summary(self) -> str:
        errors = self._errors()
        if errors:
            first = errors[0]
            more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
            return f"{first.file}:{first.line}: {first.message}{more}"
        return "compilation failed"

    def _headline(self) -> str:
        """The first line: the file and line once, then what went wrong."""
        errors = self._errors()
        tool = self.backend or "the compiler"
        if self._located:
            first = errors[0]
            n = len(errors) - 1
            more = f"; {n} more error{'s' if n > 1 else ''} below" if n else ""
            where = f"{first.file}:{first.line}: {first.severity}: {first.message}"
            if _same_file(first.file, self.name):
                return f"{where} ({tool}{more})"
            return f"{where} (compiling {self.name} with {tool}{more})"
        return f"compiling {self.name} with {tool} failed: {self.summary}"

    def _render(self) -> str:
        parts = [self._headline()]
        quoted = self._quote_source()
        if quoted:
            parts.append(quoted)
        lines = [
            line
            for line in self.log.strip().splitlines()
            # the trailer repeats the file name and says what the log already shows
            if not _is_trailer(line)
        ]
        while lines and not lines[-1].strip():
            lines.pop()
        if lines:
            if len(lines) > 60:
                lines = lines[:60] + [f"... ({len(lines) - 60} more lines)"]
            parts.append("compiler log:\n" + "\n".join("  " + line for line in lines))
        if self.log_path:
            parts.append(f"full log: {self.log_path}")
        if self.options:
            parts.append("options: " + " ".join(self.options))
        return "\n".join(parts)

    def _quote_source(self) -> str:
        """The offending source lines, for logs that do not show them (nvrtc and nvcc
        quote the line under each error; a host compiler's short log may not)."""
        if not self.source:
            return ""
        lines = self.source.splitlines()
        quoted: list[str] = []
        shown: set[int] = set()
        for diag in self.diagnostics[:3]:
            if "error" not in diag.severity or not _same_file(diag.file, self.name):
                continue
            if diag.line in shown or not 1 <= diag.line <= len(lines):
                continue
            text = lines[diag.line - 1]
            if text.strip() and text.strip() in self.log:
                continue
            shown.add(diag.line)
            quoted.append(f"  {diag.line:>5} | {text}")
        return "\n".join(quoted)


def _same_file(path: str, name: str) -> bool:
    """Whether a diagnostic's ``path`` is the source ``name`` (compilers may print a
    longer or a shorter path than the name)."""
    return path == name or path.rsplit("/", 1)[-1] == name.rsplit("/", 1)[-1]


def _is_trailer(line: str) -> bool:
    """``1 error detected in the compilation of "saxpy.cu".`` (nvrtc, nvcc)."""
    words = line.strip().split(" ", 2)
    return (
        len(words) == 3
        and words[0].isdigit()
        and words[1] in ("error", "errors")
        and words[2].startswith("detected in the compilation of")
    )
