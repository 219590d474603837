"""cuforge: compile CUDA once, load in milliseconds, launch in microseconds.

The public API. ``import cuforge`` loads the cache (:class:`Cache`, :func:`default_cache`,
:func:`using`), nothing heavy (no torch, CuPy, CUDA Python bindings, json or typing). Every
other name loads on first use (the errors with the first one named or raised): the kernel
compile path (:func:`compile`,
:func:`compile_file`, :func:`explain_miss`, :func:`cache`, :class:`Program`: the pipeline,
the compilers' front ends, the toolchain's identity) on the first ``cuforge.compile``, so
that the adapters (``cuforge.jax``, ``cuforge.triton``, ...), which never compile a kernel,
do not pay for it, and a warm cache hit costs that one import and the lookup. The launch
runtime and the torch helpers load on first use too:

* :func:`compile`, :func:`compile_file` -> :class:`Program` (cached by content)
* :meth:`Program.kernel` -> :class:`Kernel`, launched as ``k[grid, block](*args)``
* :func:`explain_miss` -- why the last lookup of a source name missed the cache
* :class:`Cache` -- the cache as a value (dir, tiers, bundles, strict mode); every cached
  entry point takes ``cache=``, default :func:`default_cache` (from ``CUFORGE_*``)
* :func:`cache` -- the cache in use (``default_cache()``)
* :func:`prefetch` -- pull a lockfile's entries (:func:`record`) from the remote into the
  local cache (disk and memory) at service start-up, before the first kernel
* :func:`enable` -- cuforge as the cache of Triton, torch.compile, JAX, CuPy, CuTe DSL and
  cuda.compute in this process (``CUFORGE_ENABLE`` / ``cuforge run``: in every process)
* :mod:`cuforge.torch` -- drop-in ``load()`` / ``load_inline()`` for PyTorch extensions
* errors: :class:`CompileError`, :class:`ArchError`, :class:`ConfigError`, :class:`ToolchainError`,
  :class:`LaunchError`, :class:`CuforgeError`
"""

from __future__ import annotations

from cuforge._version import __version__
from cuforge.core.caching import Cache, default_cache, using

TYPE_CHECKING = False
if TYPE_CHECKING:  # the lazy names below, for type checkers and IDEs
    from cuforge.base.errors import (
        ArchError,
        CompileError,
        ConfigError,
        CuforgeError,
        ToolchainError,
    )
    from cuforge.frontend.api import cache, compile, compile_file, explain_miss
    from cuforge.frontend.program import Program
del TYPE_CHECKING  # not a public name

__all__ = [
    "__version__",
    "compile",
    "compile_file",
    "explain_miss",
    "cache",
    "Cache",
    "default_cache",
    "using",
    "Program",
    "Kernel",
    "Pointer",
    "CompileError",
    "ArchError",
    "ConfigError",
    "ToolchainError",
    "LaunchError",
    "CuforgeError",
    "jit",
    "JitKernel",
    "Options",
    "load_binary",
    "load_bundle",
    "OfflineMissError",
    "SpecializationError",
    "fence",
    "record",
    "prefetch",
    "CompileAfterFenceError",
    "enable",
]

_LAZY = {
    # the kernel compile path (cuforge.frontend.api -> cuforge.core.pipeline -> the
    # compilers and the toolchain): loaded by the first compile, not by `import cuforge`
    "compile": ("cuforge.frontend.api", "compile"),
    "compile_file": ("cuforge.frontend.api", "compile_file"),
    "explain_miss": ("cuforge.frontend.api", "explain_miss"),
    "cache": ("cuforge.frontend.api", "cache"),
    "Program": ("cuforge.frontend.program", "Program"),
    "Kernel": ("cuforge.runtime.kernel", "Kernel"),
    "Pointer": ("cuforge.runtime.args", "Pointer"),
    "LaunchError": ("cuforge.runtime.errors", "LaunchError"),
    "jit": ("cuforge.frontend.jitkernel", "jit"),
    "JitKernel": ("cuforge.frontend.jitkernel", "JitKernel"),
    "Options": ("cuforge.base.options", "Options"),
    "load_binary": ("cuforge.frontend.api", "load_binary"),
    "load_bundle": ("cuforge.aot.bundle", "load_bundle"),
    # the errors: loaded by the first use of one (a cache hit raises none)
    "CuforgeError": ("cuforge.base.errors", "CuforgeError"),
    "CompileError": ("cuforge.base.errors", "CompileError"),
    "ArchError": ("cuforge.base.errors", "ArchError"),
    "ConfigError": ("cuforge.base.errors", "ConfigError"),
    "ToolchainError": ("cuforge.base.errors", "ToolchainError"),
    "OfflineMissError": ("cuforge.base.errors", "OfflineMissError"),
    "SpecializationError": ("cuforge.frontend.jitkernel", "SpecializationError"),
    "fence": ("cuforge.core.fencing", "fence"),
    "record": ("cuforge.core.recording", "record"),
    "prefetch": ("cuforge.core.prefetch", "prefetch"),
    "CompileAfterFenceError": ("cuforge.base.errors", "CompileAfterFenceError"),
    "enable": ("cuforge.adapters.switch", "enable"),
}


#: subpackages reachable as attributes without an explicit import (``cuforge.torch.load``)
_SUBPACKAGES = (
    "torch",
    "runtime",
    "store",
    "cli",
    "cccl",
    "cute",
    "aot",
    "triton",
    "cuda_core",
    "jax",
    "cupy",
)


def __getattr__(name: str):
    # unknown names fail first: `from cuforge import _fs` asks here. __import__ and
    # sys.modules, not importlib.import_module: importlib (with warnings) would add ~1 ms
    # to the first compile, a disk hit's path
    if name in _SUBPACKAGES:
        module_name = f"cuforge.{name}"
    elif name in _LAZY:
        module_name = _LAZY[name][0]
    else:
        raise AttributeError(f"module 'cuforge' has no attribute {name!r}")
    import sys

    __import__(module_name)
    module = sys.modules[module_name]
    if name in _SUBPACKAGES:
        return module
    value = getattr(module, _LAZY[name][1])
    globals()[name] = value
    return value


def _from_environment() -> None:
    # CUFORGE_FENCE / CUFORGE_RECORD act from import on (a dict lookup each when unset)
    from os import environ

    if environ.get("CUFORGE_FENCE", "").strip().lower() in ("warn", "error"):
        from cuforge.core.fencing import install_hooks

        install_hooks()
    path = environ.get("CUFORGE_RECORD", "").strip()
    if path:
        from cuforge.core.recording import start_from_env

        start_from_env(path)


_from_environment()


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
