"""``Program``: what :func:`cuforge.compile` returns. The compiled binary plus the way to
get a launchable kernel out of it.

This module sits above the runtime layer: ``Program.kernel()`` loads the binary through
:mod:`cuforge.runtime`, which is imported only when a kernel is first asked for, so that
compiling (and the warm-cache path) never pays for CUDA driver bindings.
"""

from __future__ import annotations

from cuforge.compiler.outputs import Artifact

TYPE_CHECKING = False  # typing costs ~15 ms to import; annotations are strings here
if TYPE_CHECKING:
    from cuforge.runtime.kernel import Kernel


__all__ = ["Program"]


class Program(Artifact):
    """A compiled program.

    Attributes: ``binary`` (cubin / PTX / fatbin bytes), ``output``, ``arch``, ``backend``,
    ``lowered_names`` (name expression -> mangled name), ``log`` (compiler log), ``key``
    (the content key), ``source_of_result`` ("memory", "disk", "remote" or "compiled"),
    ``compile_seconds`` (what the original compile cost), ``name`` and ``source``.
    """

    __slots__ = ("_kernels",)

    def __init__(self, **fields) -> None:
        super().__init__(**fields)
        self._kernels: dict[str, Kernel] = {}

    def get_lowered_name(self, name_expression: str) -> str:
        """The mangled symbol of a name expression given at compile time."""
        try:
            return self.lowered_names[name_expression]
        except KeyError:
            known = ", ".join(sorted(self.lowered_names)) or "none"
            raise KeyError(
                f"{name_expression!r} was not among the name_expressions of {self.name!r} "
                f"(given: {known}); pass it in compile(..., name_expressions=[...])"
            ) from None

    def kernel(self, name: str) -> Kernel:
        """A launchable kernel: an ``extern "C"`` name, a name expression given at compile
        time (``"block_sum<256, float>"``) or a mangled symbol."""
        kernel = self._kernels.get(name)
        if kernel is None:
            from cuforge.runtime.kernel import Kernel

            kernel = self._kernels[name] = Kernel(self, name)
        return kernel
