"""``load()`` and ``load_inline()``: torch.utils.cpp_extension's signatures and return
values, cuforge's build (see :mod:`cuforge.torch.build`)."""

from __future__ import annotations

import os

from cuforge.base._fs import write_if_changed
from cuforge.torch.build import BuildSpec, build, default_build_directory, warn_ignored

__all__ = ["load", "load_inline", "import_module"]

# (path, is_python_module) -> what was returned (one import per module file per process)
_imported: dict[tuple[str, bool], object] = {}


def import_module(name: str, path: str, is_python_module: bool):
    """torch's ``_import_module_from_library``: the module, or (library) the path after
    ``torch.ops.load_library``."""
    found = _imported.get((path, is_python_module))
    if found is not None:
        return found
    if is_python_module:
        import importlib.util

        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot import extension {name} from {path}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        result: object = module
    else:
        import torch

        torch.ops.load_library(path)
        result = path
    _imported[(path, is_python_module)] = result
    return result


def load(
    name,
    sources,
    extra_cflags=None,
    extra_cuda_cflags=None,
    extra_sycl_cflags=None,
    extra_ldflags=None,
    extra_include_paths=None,
    build_directory=None,
    verbose=False,
    with_cuda=None,
    with_sycl=None,
    is_python_module=True,
    is_standalone=False,
    keep_intermediates=True,
    *,
    arch=None,
    preset="release",
    fast_math=False,
    launcher=None,
    split=None,
    cache=None,
):
    """Drop-in for ``torch.utils.cpp_extension.load``: same arguments, same return value.

    Returns the extension module (``is_python_module=True``); else, for a library that
    registers ops with ``TORCH_LIBRARY``, loads it with ``torch.ops.load_library`` and
    returns its path; with ``is_standalone=True``, the path of the built executable.

    cuforge's own keyword-only knobs: ``arch`` (``"sm_90"``, ``"9.0"``, a list; default
    the visible GPU, else ``CUFORGE_ARCH`` / ``TORCH_CUDA_ARCH_LIST``), ``preset``
    (``"release"``: -O3 + -lineinfo; ``"torch"``: torch's flags; ``"debug"``),
    ``fast_math`` (adds ``--use_fast_math``) and ``launcher`` (``"ccache"``,
    ``"sccache"``, ``"auto"``; default ``CUFORGE_TORCH_LAUNCHER``) and ``split`` (run
    nvcc's host and device pipelines in parallel; default: for a ``.cu`` that includes
    torch's headers when 2+ jobs run, or ``CUFORGE_TORCH_SPLIT=0/1``) and ``cache``
    (the :class:`cuforge.Cache` that holds the objects, the module and the build dir;
    default :func:`cuforge.default_cache`).

    Build directory, highest precedence first (as torch's): ``build_directory``, else
    ``$TORCH_EXTENSIONS_DIR/<name>`` when that variable is set and not empty, else
    ``<cache_dir>/torch/build/<name>`` (torch's default would be a per-user dir under
    ``~/.cache/torch_extensions``). In a build directory the user chose (the first two),
    the module also appears as torch names it, ``<name>.so`` (a hard link to the checked
    module file, or a copy), even when it came from the cache.

    ``keep_intermediates=False`` is accepted and ignored (with a warning, once per cache): it only
    matters for torch's ROCm hipify step, and cuforge keeps its objects in the build dir
    and its cache.
    """
    if not keep_intermediates:
        _warn_keep_intermediates(cache)
    if extra_sycl_cflags or with_sycl:
        raise NotImplementedError("cuforge.torch builds CUDA and C++ extensions, not SYCL")
    spec = BuildSpec(
        name,
        sources,
        extra_cflags,
        extra_cuda_cflags,
        extra_ldflags,
        extra_include_paths,
        build_directory,
        verbose,
        with_cuda,
        is_python_module,
        is_standalone,
        arch=arch,
        preset=preset,
        fast_math=fast_math,
        launcher=launcher,
        split=split,
        cache=cache,
    )
    result = build(spec)
    if is_standalone:
        return result.path
    return import_module(name, result.path, is_python_module)


def _warn_keep_intermediates(cache) -> None:
    warn_ignored(
        "keep_intermediates=False",
        "it only affects torch's ROCm hipify step; cuforge keeps its build files in the "
        "build directory and its objects in the cache",
        cache,
    )


def _write_source(path: str, text: str) -> None:
    """Write only when the content differs (keeps the stat memo and ninja's view of the
    file unchanged), atomically."""
    write_if_changed(path, text, mode=0o644)


def load_inline(
    name,
    cpp_sources,
    cuda_sources=None,
    sycl_sources=None,
    functions=None,
    extra_cflags=None,
    extra_cuda_cflags=None,
    extra_sycl_cflags=None,
    extra_ldflags=None,
    extra_include_paths=None,
    build_directory=None,
    verbose=False,
    with_cuda=None,
    with_sycl=None,
    is_python_module=True,
    with_pytorch_error_handling=True,
    keep_intermediates=True,
    use_pch=False,
    no_implicit_headers=False,
    *,
    arch=None,
    preset="release",
    fast_math=False,
    launcher=None,
    split=None,
    cache=None,
):
    """Drop-in for ``torch.utils.cpp_extension.load_inline`` (same sources written the
    same way: ``main.cpp`` with ``#include <torch/extension.h>`` and the generated
    ``PYBIND11_MODULE`` for ``functions``, ``cuda.cu`` with torch's implicit headers).
    ``use_pch=True`` is accepted and ignored (with a warning, once per cache): the object
    cache makes a rebuilt binding rare, and a precompiled header did not pay for itself on
    2 cores (see docs/benchmarks.md); ``keep_intermediates=False`` likewise (see
    :func:`load`). The build directory is chosen as in :func:`load`."""
    if use_pch:
        warn_ignored(
            "use_pch=True",
            "cuforge serves the binding's object from its cache instead of a precompiled "
            "header (a PCH did not pay for itself; see docs/benchmarks.md)",
            cache,
        )
    if not keep_intermediates:
        _warn_keep_intermediates(cache)
    if sycl_sources or extra_sycl_cflags or with_sycl:
        raise NotImplementedError("cuforge.torch builds CUDA and C++ extensions, not SYCL")
    build_directory = os.path.abspath(build_directory or default_build_directory(name, cache))
    os.makedirs(build_directory, exist_ok=True)
    cpp_sources = [cpp_sources] if isinstance(cpp_sources, str) else list(cpp_sources)
    cuda_sources = cuda_sources or []
    cuda_sources = [cuda_sources] if isinstance(cuda_sources, str) else list(cuda_sources)
    if not no_implicit_headers:
        cpp_sources.insert(0, "#include <torch/extension.h>")
    if functions is not None:
        module_def = ["PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {"]
        if isinstance(functions, str):
            functions = [functions]
        if isinstance(functions, list):
            functions = {f: f for f in functions}
        elif not isinstance(functions, dict):
            raise ValueError(
                f"Expected 'functions' to be a list or dict, but was {type(functions)}"
            )
        for fn, doc in functions.items():
            if with_pytorch_error_handling:
                module_def.append(f'm.def("{fn}", torch::wrap_pybind_function({fn}), "{doc}");')
            else:
                module_def.append(f'm.def("{fn}", {fn}, "{doc}");')
        module_def.append("}")
        cpp_sources += module_def
    cpp_path = os.path.join(build_directory, "main.cpp")
    _write_source(cpp_path, "\n".join(cpp_sources))
    sources = [cpp_path]
    if cuda_sources:
        if not no_implicit_headers:
            cuda_sources[:0] = [
                "#include <torch/types.h>",
                "#include <cuda.h>",
                "#include <cuda_runtime.h>",
            ]
        cuda_path = os.path.join(build_directory, "cuda.cu")
        _write_source(cuda_path, "\n".join(cuda_sources))
        sources.append(cuda_path)
    return load(
        name,
        sources,
        extra_cflags,
        extra_cuda_cflags,
        None,
        extra_ldflags,
        extra_include_paths,
        build_directory,
        verbose,
        with_cuda,
        None,
        is_python_module,
        False,
        arch=arch,
        preset=preset,
        fast_math=fast_math,
        launcher=launcher,
        split=split,
        cache=cache,
    )
