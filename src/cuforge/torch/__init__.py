"""PyTorch extensions, fast: a drop-in ``load()`` / ``load_inline()``.

    from cuforge.torch import load          # instead of torch.utils.cpp_extension.load
    ext = load("my_ext", ["binding.cpp", "kernels.cu"])

Same arguments, same return values as torch's, with the build cuforge does instead:
ninja from the ``ninja`` package, the visible GPU's arch (else ``CUFORGE_ARCH`` /
``TORCH_CUDA_ARCH_LIST``, else a clear error), memory-aware job counts, flag presets,
the CUDA headers found rather than guessed, a per-TU object cache in cuforge's store,
a cached link and a warm load that runs no subprocess.

* :func:`load`, :func:`load_inline` -- the drop-ins
* :class:`BuildExtension`, :func:`CUDAExtension`, :func:`CppExtension` -- ahead-of-time
  builds from ``setup.py`` with the same flags and the same object cache
* :func:`generate_binding` -- writes the torch binding ``.cpp`` for kernels kept in a
  ``.cu`` without torch headers (the fast-edit layout)
* :func:`build_extension` -- the build alone (no import): a :class:`BuildSpec` in, a
  :class:`BuildResult` out
* :func:`custom_op` -- a cuforge kernel (or a Python launcher around kernels) as a torch
  custom op that works under ``torch.compile(fullgraph=True)`` and in CUDA graphs, no C++
  (:func:`derive_schema` shows the schema it derives; errors are :class:`CustomOpError`)
"""

from __future__ import annotations

import importlib

__all__ = [
    "load",
    "load_inline",
    "build_extension",
    "BuildSpec",
    "BuildResult",
    "BuildExtension",
    "CUDAExtension",
    "CppExtension",
    "generate_binding",
    "Op",
    "custom_op",
    "derive_schema",
    "CustomOpError",
    "cdiv_grid",
]

_LAZY = {
    "load": ("cuforge.torch.api", "load"),
    "load_inline": ("cuforge.torch.api", "load_inline"),
    "build_extension": ("cuforge.torch.build", "build"),
    "BuildSpec": ("cuforge.torch.build", "BuildSpec"),
    "BuildResult": ("cuforge.torch.build", "BuildResult"),
    "BuildExtension": ("cuforge.torch.build_ext", "BuildExtension"),
    "CUDAExtension": ("cuforge.torch.build_ext", "CUDAExtension"),
    "CppExtension": ("cuforge.torch.build_ext", "CppExtension"),
    "generate_binding": ("cuforge.torch.binding", "generate_binding"),
    "Op": ("cuforge.torch.binding", "Op"),
    "custom_op": ("cuforge.torch.custom_ops", "custom_op"),
    "derive_schema": ("cuforge.torch.custom_ops", "derive_schema"),
    "CustomOpError": ("cuforge.torch.custom_ops", "CustomOpError"),
    "cdiv_grid": ("cuforge.torch.opshim", "cdiv_grid"),
}


def __getattr__(name: str):
    try:
        module_name, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'cuforge.torch' has no attribute {name!r}") from None

    value = getattr(importlib.import_module(module_name), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
