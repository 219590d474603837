"""What a bare compiler returns, and what the cached-compile pipeline returns."""

from __future__ import annotations

__all__ = ["CompileOutput", "Artifact", "OUTPUT_KINDS", "BACKENDS"]

#: What a compile can produce. "fatbin" (several archs in one file) needs nvcc.
OUTPUT_KINDS = ("cubin", "ptx", "fatbin")
BACKENDS = ("nvrtc", "nvcc")


class CompileOutput:
    """A bare compiler's result (``compile.nvrtc`` / ``compile.nvcc``).

    ``dependencies`` lists the files the compiler reported reading (nvcc ``-MD``), or is
    None when the compiler cannot report them (NVRTC 13): then the pipeline relies on
    cuforge's include scanner.
    """

    __slots__ = ("binary", "log", "lowered_names", "dependencies", "seconds", "options")

    def __init__(
        self,
        binary: bytes,
        log: str,
        lowered_names: dict[str, str],
        dependencies: list[str] | None,
        seconds: float,
        options: tuple[str, ...] = (),
    ) -> None:
        self.binary = binary
        self.log = log
        self.lowered_names = lowered_names
        self.dependencies = dependencies
        self.seconds = seconds
        self.options = options


class Artifact:
    """The cached-compile pipeline's result: one compiled program and where it came from.

    ``source_of_result`` is "memory", "disk", "remote" (a shared tier), "bundle" (a loaded
    bundle, :func:`cuforge.load_bundle`), "loaded" (:func:`cuforge.load_binary`) or
    "compiled". ``key`` is the content key of the entry; ``key_fields`` is the labeled
    inputs of that key (used to explain misses).
    """

    __slots__ = (
        "name",
        "source",
        "binary",
        "output",
        "arch",
        "backend",
        "lowered_names",
        "name_expressions",
        "log",
        "key",
        "key_fields",
        "source_of_result",
        "compile_seconds",
        "lookup_seconds",
        "headers",
    )

    def __init__(self, **fields) -> None:
        for slot in Artifact.__slots__:
            setattr(self, slot, fields.get(slot))

    def with_source(self, source_of_result: str, lookup_seconds: float = 0.0) -> Artifact:
        """A copy that says it came from ``source_of_result``."""
        clone = type(self)(**{slot: getattr(self, slot) for slot in Artifact.__slots__})
        clone.source_of_result = source_of_result
        clone.lookup_seconds = lookup_seconds
        return clone

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.name!r}, {self.output} for {self.arch}, {len(self.binary or b'')} bytes, "
            f"from {self.source_of_result})"
        )
