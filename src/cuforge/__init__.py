"""cuforge: compile CUDA once, load in milliseconds, launch in microseconds.

The public API. Names are resolved lazily so that ``import cuforge`` stays cheap and
needs none of torch, CuPy or the CUDA Python bindings:

* :func:`compile`, :func:`compile_file` -> :class:`Program` (cached by content)
* :meth:`Program.kernel` -> :class:`Kernel`, launched as ``k[grid, block](*args)``
* :func:`explain_miss` -- why the last lookup of a source name missed the cache
* :func:`cache` -- the cache tiers in use (memory + disk)
* :mod:`cuforge.torch` -- drop-in ``load()`` / ``load_inline()`` for PyTorch extensions
* errors: :class:`CompileError`, :class:`ArchError`, :class:`ToolchainError`,
  :class:`LaunchError`, :class:`CuforgeError`
"""

from __future__ import annotations

from cuforge._version import __version__

__all__ = [
    "__version__",
    "compile",
    "compile_file",
    "explain_miss",
    "cache",
    "Program",
    "Kernel",
    "Pointer",
    "CompileError",
    "ArchError",
    "ToolchainError",
    "LaunchError",
    "CuforgeError",
]

_LAZY = {
    "compile": ("cuforge.api", "compile"),
    "compile_file": ("cuforge.api", "compile_file"),
    "explain_miss": ("cuforge.api", "explain_miss"),
    "cache": ("cuforge.api", "cache"),
    "Program": ("cuforge.program", "Program"),
    "Kernel": ("cuforge.runtime.kernel", "Kernel"),
    "Pointer": ("cuforge.runtime.args", "Pointer"),
    "LaunchError": ("cuforge.runtime.errors", "LaunchError"),
    "CompileError": ("cuforge.errors", "CompileError"),
    "ArchError": ("cuforge.errors", "ArchError"),
    "ToolchainError": ("cuforge.errors", "ToolchainError"),
    "CuforgeError": ("cuforge.errors", "CuforgeError"),
}


def __getattr__(name: str):
    try:
        module_name, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'cuforge' has no attribute {name!r}") from None
    import importlib

    value = getattr(importlib.import_module(module_name), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
