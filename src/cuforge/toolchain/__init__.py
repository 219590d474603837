"""Where the CUDA toolchain is, what it is, and which GPU archs to build for.

The bottom layer beside :mod:`cuforge.base.config`: it imports only config, arch, errors and
:mod:`cuforge.base._fs`, and nothing expensive at import time (no ``cuda.*``, ``subprocess``,
``ctypes``, ``shutil`` or ``json``). One job per module:

* :mod:`~cuforge.toolchain.locate` -- finding things: :func:`toolkit_root`,
  :func:`nvcc_path`, :func:`nvrtc_library_path` (identity) / :func:`find_nvrtc_library`
  (what is loaded), :func:`toolkit_include_dirs`, :func:`is_toolkit`, :func:`which`.
* :mod:`~cuforge.toolchain.identity` -- what the toolchain is: :func:`compiler_identity`
  (what the cache key says about the compiler), :func:`nvcc_version`,
  :func:`nvrtc_version`, :func:`nvrtc_version_tuple`, :func:`nvrtc_header_version`,
  :func:`cuda_bindings_version`, :func:`nvrtc_header_mismatch` (for ``cuforge doctor``),
  :func:`supported_archs`.
* :mod:`~cuforge.toolchain.gpu` -- the one ``libcuda`` probe: :func:`libcuda`,
  :func:`driver_version`, :func:`visible_gpu_archs`, :func:`~cuforge.toolchain.gpu.devices`.
* :mod:`~cuforge.toolchain.targets` -- :func:`resolve_archs`: the arch a compile targets.
* :mod:`~cuforge.toolchain.facts` -- what ``cuforge doctor`` / ``cuforge env`` report
  about the toolchain (the library headers torch needs, the display driver's version).
* :mod:`~cuforge.toolchain.memo` -- the on-disk memo ``<cache_dir>/toolchain.json``, which
  caches probe results keyed by a file's stat and never decides which file is loaded;
  :func:`file_stat_key` and :func:`write_json_atomic` serve other memos too.
* :mod:`~cuforge.toolchain.installed` -- installed Python distributions: finding them,
  reading their ``RECORD`` and checking an installed file's contents against it.
"""

from __future__ import annotations

from cuforge.toolchain.gpu import driver_version, libcuda, visible_gpu_archs
from cuforge.toolchain.identity import (
    check_loaded_nvrtc,
    check_nvrtc_headers,
    compiler_identity,
    cuda_bindings_version,
    nvcc_supported_archs,
    nvcc_version,
    nvrtc_header_mismatch,
    nvrtc_header_version,
    nvrtc_supported_archs,
    nvrtc_version,
    nvrtc_version_tuple,
    supported_archs,
)
from cuforge.toolchain.locate import (
    find_nvrtc_library,
    header_cuda_version,
    is_toolkit,
    nvcc_path,
    nvrtc_library_major,
    nvrtc_library_path,
    toolkit_include_dirs,
    toolkit_root,
    which,
)
from cuforge.toolchain.memo import file_stat_key, write_json_atomic
from cuforge.toolchain.targets import resolve_archs

__all__ = [
    "toolkit_root",
    "nvcc_path",
    "nvrtc_library_path",
    "find_nvrtc_library",
    "toolkit_include_dirs",
    "is_toolkit",
    "which",
    "compiler_identity",
    "check_loaded_nvrtc",
    "check_nvrtc_headers",
    "nvcc_version",
    "nvrtc_version",
    "nvrtc_version_tuple",
    "nvrtc_header_version",
    "nvrtc_header_mismatch",
    "cuda_bindings_version",
    "header_cuda_version",
    "nvrtc_library_major",
    "supported_archs",
    "nvrtc_supported_archs",
    "nvcc_supported_archs",
    "libcuda",
    "driver_version",
    "visible_gpu_archs",
    "resolve_archs",
    "file_stat_key",
    "write_json_atomic",
]
