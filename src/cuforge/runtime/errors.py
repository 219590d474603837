"""The errors the launch runtime raises.

Every one is a :class:`LaunchError` (itself a :class:`cuforge.CuforgeError`), and also the
built-in exception a Python user would reach for: a wrong argument type is a ``TypeError``,
a value out of range a ``ValueError``, a kernel name that does not exist a ``LookupError``.
"""

from __future__ import annotations

from cuforge.base.errors import CuforgeError

__all__ = [
    "LaunchError",
    "ArgumentError",
    "ArgumentValueError",
    "ArgumentCountError",
    "KernelNotFoundError",
    "GlobalNotFoundError",
    "CudaDriverError",
]


class LaunchError(CuforgeError):
    """A kernel could not be loaded or launched, or its arguments were wrong."""


class ArgumentError(LaunchError, TypeError):
    """An argument of the wrong kind for its parameter (a CPU tensor for ``float*``, a float
    for ``int``, a float16 tensor for ``float*``...). The message names the parameter."""


class ArgumentValueError(LaunchError, ValueError):
    """An argument of the right kind with a bad value: a scalar that overflows its C type, a
    struct of the wrong size, a non-contiguous array, a tensor on another device."""


class ArgumentCountError(ArgumentError):
    """The number of arguments differs from the kernel's parameter count."""


class KernelNotFoundError(LaunchError, LookupError):
    """No kernel of that name in the program. The message lists the kernels that exist."""

    def __str__(self) -> str:  # LookupError would quote the message like a dict key
        return str(self.args[0]) if self.args else ""


class GlobalNotFoundError(LaunchError, LookupError):
    """No ``__device__`` / ``__constant__`` variable of that name in the program. The message
    lists the ones declared in the source (or says that there is no source to list them from)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class CudaDriverError(LaunchError):
    """A CUDA driver call failed. ``code`` is the CUresult, ``name`` its symbolic name."""

    def __init__(self, message: str, code: int = 0, name: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.name = name
