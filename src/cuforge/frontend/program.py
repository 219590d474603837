"""``Program``: what :func:`cuforge.compile` returns. The compiled binary plus the way to
get a launchable kernel out of it.

This module sits above the runtime layer: ``Program.kernel()`` loads the binary through
:mod:`cuforge.runtime`, which is imported only when a kernel is first asked for, so that
compiling (and the warm-cache path) never pays for CUDA driver bindings.
"""

from __future__ import annotations

from cuforge.compiler.outputs import Artifact

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: see docs/architecture.md, the warm path
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

    def get_global(self, name: str, device: int | None = None) -> tuple[int, int]:
        """(device pointer, size in bytes) of the ``__device__`` / ``__constant__`` /
        ``__managed__`` variable ``name``, on ``device`` (default: the current one; each
        device has its own copy). Loads the program there if it is not loaded yet.

        ``name`` is the variable's name, a name expression given at compile time
        (``"ns::table"``, for C++ names in a namespace) or its mangled symbol. Write and read
        it with any copy that takes a device pointer (``cudaMemcpy``, ``cuMemcpyHtoD``).

        Raises:
            GlobalNotFoundError: no such variable; the message lists the ones the source declares.
            LaunchError: no GPU or driver, or the binary cannot be loaded on ``device``.
        """
        if not isinstance(name, str) or not name.strip():
            raise TypeError(f"get_global takes a variable name (a non-empty str), not {name!r}")
        # the runtime (ctypes, libcuda) loads on first use, not at `import cuforge`
        from cuforge.runtime import driver as drv_mod
        from cuforge.runtime.errors import GlobalNotFoundError
        from cuforge.runtime.module import loaded_program

        lowered = self.lowered_names or {}
        symbol = lowered.get(name) or lowered.get("&" + name) or name.strip()
        d = drv_mod.driver()
        target = d.current_device() if device is None else device
        previous = d.use_device(target)
        try:
            return loaded_program(self).global_address(symbol, target)
        except GlobalNotFoundError:
            raise GlobalNotFoundError(self._missing_global(name)) from None
        finally:
            if previous and previous != d.primary_context(target):
                d.set_current_context(previous)

    def _missing_global(self, name: str) -> str:
        from cuforge.runtime.signature import global_names

        if not self.source:
            return (
                f"no global {name!r} in {self.name}; it has no source to list its globals from "
                "(loaded with load_binary: pass source= to list them). A C++ global in a "
                "namespace has a mangled name: compile with name_expressions=('&ns::name',)"
            )
        names = global_names(self.source)
        listing = ", ".join(names) if names else "none declared"
        return (
            f"no global {name!r} in {self.name}; the source declares: {listing}. A global in a "
            "namespace needs its mangled name: compile with name_expressions=('&ns::name',) and "
            "ask for 'ns::name'"
        )

    def kernel(self, name: str) -> Kernel:
        """A launchable kernel: an ``extern "C"`` name, a name expression given at compile
        time (``"block_sum<256, float>"``) or a mangled symbol."""
        kernel = self._kernels.get(name)
        if kernel is None:
            from cuforge.runtime.kernel import Kernel

            kernel = self._kernels[name] = Kernel(self, name)
        return kernel
