"""Build hook for the one compiled part of cuforge; all metadata lives in pyproject.toml.

Two things are added here:

* ``cuforge-enable.pth`` (``src/cuforge-enable.pth``) goes to the root of site-packages, in
  a wheel (``pip install .``) and in an editable install (``pip install -e .``) alike: its
  one line makes ``CUFORGE_ENABLE`` work in every Python process (docs/run.md). With the
  variable unset it imports nothing.
* the C launcher extension:

The C launch path (``src/cuforge/runtime/_launcher.c``, see ``cuforge.runtime.fastlaunch``)
is built here as the optional extension ``cuforge.runtime._cuforge_fastlaunch``. It needs
only a C compiler and Python's headers -- the CUDA driver's entry points are passed in at
run time, nothing links against libcuda -- and it is ``optional``: without a compiler or
headers the install still succeeds, and cuforge builds the launcher at run time into its
cache dir instead, or uses the pure-Python launch path. ``CUFORGE_REQUIRE_EXTENSION=1``
makes it required: a wheel for an index (``make wheel``, tests/wheel/build.py) fails to
build rather than ship without its launcher.

Why one wheel per CPython (3.10-3.13) and not one ``abi3`` wheel: the limited API of 3.10
and 3.11 has no vectorcall for an extension type (``Py_TPFLAGS_HAVE_VECTORCALL`` and
``PyObject_Vectorcall`` are limited API from 3.12), so every launch would enter through
``tp_call`` with an argument tuple. Measured CPU-side (bench/launcher_entry_cpu.py
--limited-api: the saxpy launcher over a stand-in driver, the same compiler flags; three
runs, docs/benchmarks.md): 61-95 ns per call through vectorcall, 92-141 ns through
``tp_call``: +31 to +46 ns (+48% to +55%) per launch, before the rest the limited API would
cost (the launcher also reads tuples and floats with macros, packs ``__half`` with
``PyFloat_Pack2`` and defines static types). The four wheels are built and tagged
``manylinux`` by ``make wheel``.
"""

from __future__ import annotations

import hashlib
import os

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

RUNTIME = "src/cuforge/runtime"
SOURCE = f"{RUNTIME}/_launcher.c"  # the real launcher, also compiled at run time
WRAPPER = f"{RUNTIME}/_launcher_ext.c"  # includes SOURCE, adds SOURCE_SHA256


def source_sha256() -> str:
    """The SHA-256 of ``_launcher.c``'s bytes: the installed module carries it, and
    ``fastlaunch`` uses the module only while the package's ``_launcher.c`` still matches."""
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, SOURCE), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


PTH = "cuforge-enable.pth"


class build_py_with_pth(build_py):
    """``build_py`` that also puts :data:`PTH` at the root of what is installed.

    A wheel installs ``build_lib`` as site-packages, so the file goes there. An editable
    build (setuptools' ``editable_wheel``, PEP 660) keeps the modules in ``src/`` and
    ignores ``build_lib``; what it does install is its ``install_lib``, the unpacked
    editable wheel (where it writes its own ``__editable__.*.pth``), so the file goes
    there instead."""

    def run(self) -> None:
        super().run()
        here = os.path.dirname(os.path.abspath(__file__))
        source = os.path.join(here, "src", PTH)
        if getattr(self, "editable_mode", False):
            target_dir = self.get_finalized_command("install").install_lib
        else:
            target_dir = self.build_lib
        self.mkpath(target_dir)
        self._pth = os.path.join(target_dir, PTH)
        self.copy_file(source, self._pth, preserve_mode=False)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = list(super().get_outputs(include_bytecode))
        pth = getattr(self, "_pth", None)
        if pth is not None and not getattr(self, "editable_mode", False):
            outputs.append(pth)
        return outputs


setup(
    cmdclass={"build_py": build_py_with_pth},
    ext_modules=[
        Extension(
            "cuforge.runtime._cuforge_fastlaunch",
            sources=[WRAPPER],
            depends=[SOURCE],
            define_macros=[("CUFORGE_LAUNCHER_SHA256", f'"{source_sha256()}"')],
            optional=os.environ.get("CUFORGE_REQUIRE_EXTENSION", "") not in ("1", "true", "yes"),
        )
    ],
)
