"""Ahead-of-time builds from ``setup.py`` / ``pyproject.toml``, with the same flags and
the same object cache as :func:`cuforge.torch.load`::

    from setuptools import setup
    from cuforge.torch import BuildExtension, CUDAExtension

    setup(
        name="my_ext",
        ext_modules=[CUDAExtension("my_ext._C", ["csrc/binding.cpp", "csrc/kernels.cu"],
                                   extra_compile_args={"cxx": [], "nvcc": ["--use_fast_math"]})],
        cmdclass={"build_ext": BuildExtension},
    )

(with ``[build-system] requires = ["setuptools", "cuforge[torch]"]`` in pyproject.toml).
``torch.utils.cpp_extension.CUDAExtension`` objects work too. The arch is the visible
GPU's, else ``CUFORGE_ARCH`` / ``TORCH_CUDA_ARCH_LIST`` (several archs are built with
``nvcc --threads``); a rebuilt wheel recompiles only the TUs that changed.
"""

from __future__ import annotations

import os

from setuptools import Extension
from setuptools.command.build_ext import build_ext

from cuforge.base._fs import atomic_write, read_bytes
from cuforge.torch.build import BuildSpec, build, warn_ignored
from cuforge.torch.flags import is_cuda_file

__all__ = ["BuildExtension", "CUDAExtension", "CppExtension"]


def CppExtension(name: str, sources, *args, **kwargs) -> Extension:
    """A setuptools Extension of C++ sources (torch's arguments: ``extra_compile_args``
    as a list or ``{"cxx": [...]}``, ``include_dirs``, ``extra_link_args``, ...)."""
    kwargs.setdefault("language", "c++")
    ext = Extension(name, list(sources), *args, **kwargs)
    ext.cuforge_with_cuda = False  # type: ignore[attr-defined]
    return ext


def CUDAExtension(name: str, sources, *args, **kwargs) -> Extension:
    """A setuptools Extension with CUDA sources (``extra_compile_args={"cxx": [...],
    "nvcc": [...]}``)."""
    kwargs.setdefault("language", "c++")
    ext = Extension(name, list(sources), *args, **kwargs)
    ext.cuforge_with_cuda = True  # type: ignore[attr-defined]
    return ext


def _split_args(extra) -> tuple[list[str], list[str]]:
    if isinstance(extra, dict):
        return list(extra.get("cxx", [])), list(extra.get("nvcc", []))
    return list(extra or []), []


class BuildExtension(build_ext):
    """``build_ext`` that builds each extension through cuforge's cached pipeline."""

    user_options = build_ext.user_options + [
        ("cuforge-preset=", None, "cuforge flag preset: release (default), torch, debug"),
    ]

    #: torch's ``BuildExtension`` options this class honours (``with_options`` /
    #: constructor keywords): ``no_python_abi_suffix`` names the module ``<name>.so``
    no_python_abi_suffix = False

    @classmethod
    def with_options(cls, **options):
        """torch's ``BuildExtension.with_options(...)``: a subclass with these options.

        ``no_python_abi_suffix=True`` is honoured (``<name>.so``, no ABI tag);
        ``use_ninja`` is accepted (cuforge always builds with ninja: ``use_ninja=False``
        is ignored with a warning); any other key is accepted and ignored with a warning
        (once per process per key), as torch passes it on to setuptools."""

        known: dict = {}
        for key, value in options.items():
            if key == "no_python_abi_suffix":
                known[key] = bool(value)
            elif key == "cuforge_cache":
                known["_cuforge_cache"] = value
            elif key == "use_ninja":
                if not value:
                    warn_ignored(
                        "BuildExtension.with_options(use_ninja=False)",
                        "cuforge always builds with ninja (from the `ninja` package)",
                    )
            else:
                warn_ignored(
                    f"BuildExtension.with_options({key}=...)",
                    "cuforge's BuildExtension knows only no_python_abi_suffix and use_ninja",
                )
        return type(cls.__name__, (cls,), known)

    def initialize_options(self) -> None:
        super().initialize_options()
        self.cuforge_preset = "release"
        #: the cuforge.Cache the build uses (None: cuforge.default_cache());
        #: ``BuildExtension.with_options(cuforge_cache=cuforge.Cache(...))`` sets it
        self.cuforge_cache = getattr(type(self), "_cuforge_cache", None)

    def get_ext_filename(self, ext_name: str) -> str:
        """setuptools' file name, without the Python ABI tag when
        ``no_python_abi_suffix`` (torch's rule: drop the second-to-last dotted part)."""
        filename = super().get_ext_filename(ext_name)
        if self.no_python_abi_suffix:
            parts = filename.split(".")
            if len(parts) > 2:
                filename = ".".join(parts[:-2] + parts[-1:])
        return filename

    def build_extension(self, ext) -> None:
        cflags, nvcc = _split_args(ext.extra_compile_args)
        ldflags = list(ext.extra_link_args or [])
        ldflags += [f"-L{d}" for d in ext.library_dirs or []]
        ldflags += [f"-l{lib}" for lib in ext.libraries or []]
        cflags += [f"-D{k}" if v is None else f"-D{k}={v}" for k, v in ext.define_macros or []]
        with_cuda = getattr(ext, "cuforge_with_cuda", None)
        if with_cuda is None:
            with_cuda = any(map(is_cuda_file, ext.sources))
        short = ext.name.split(".")[-1]
        spec = BuildSpec(
            short,
            [os.path.abspath(s) for s in ext.sources],
            cflags,
            nvcc,
            ldflags,
            ext.include_dirs or [],
            build_directory=os.path.join(os.path.abspath(self.build_temp), "cuforge", short),
            verbose=bool(self.verbose),
            with_cuda=with_cuda,
            is_python_module=True,
            preset=self.cuforge_preset,
            cache=self.cuforge_cache,
        )
        result = build(spec)

        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
        atomic_write(target, read_bytes(result.path), mode=0o755)
