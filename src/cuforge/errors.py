"""The exceptions cuforge raises. Every one is written for the person reading it."""

from __future__ import annotations

__all__ = [
    "CuforgeError",
    "CompileError",
    "ArchError",
    "ConfigError",
    "ToolchainError",
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
    """The compiler rejected the source. ``str(err)`` shows the log with file and line numbers.

    Attributes: ``name`` (the source name), ``log`` (the full compiler log), ``backend``,
    ``options`` (as the compiler received them), ``diagnostics`` (parsed error lines) and
    ``source`` (the source text, when known, used to quote the offending lines).
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
        self.summary = summary or self._default_summary()
        super().__init__(self._render())

    def _default_summary(self) -> str:
        errors = [d for d in self.diagnostics if "error" in d.severity]
        if errors:
            first = errors[0]
            more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
            return f"{self.name}: {first.file}:{first.line}: {first.message}{more}"
        return f"{self.name}: compilation failed"

    def _render(self) -> str:
        tool = f" with {self.backend}" if self.backend else ""
        parts = [f"compiling {self.name}{tool} failed: {self.summary}"]
        quoted = self._quote_source()
        if quoted:
            parts.append(quoted)
        log = self.log.strip()
        if log:
            lines = log.splitlines()
            if len(lines) > 60:
                lines = lines[:60] + [f"... ({len(lines) - 60} more lines)"]
            parts.append("compiler log:\n" + "\n".join("  " + line for line in lines))
        if self.log_path:
            parts.append(f"full log: {self.log_path}")
        if self.options:
            parts.append("options: " + " ".join(self.options))
        return "\n".join(parts)

    def _quote_source(self) -> str:
        if not self.source:
            return ""
        lines = self.source.splitlines()
        base = self.name.rsplit("/", 1)[-1]
        quoted: list[str] = []
        shown: set[int] = set()
        for diag in self.diagnostics[:3]:
            if "error" not in diag.severity or not diag.file.endswith(base) or diag.line in shown:
                continue
            if 1 <= diag.line <= len(lines):
                shown.add(diag.line)
                quoted.append(f"  {diag.line:>5} | {lines[diag.line - 1]}")
        return "\n".join(quoted)
