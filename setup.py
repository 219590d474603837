"""Build hook for the one compiled part of cuforge; all metadata lives in pyproject.toml.

The C launch path (``src/cuforge/runtime/_launcher.c``, see ``cuforge.runtime.fastlaunch``)
is built here as the optional extension ``cuforge.runtime._cuforge_fastlaunch``. It needs
only a C compiler and Python's headers -- the CUDA driver's entry points are passed in at
run time, nothing links against libcuda -- and it is ``optional``: without a compiler or
headers the install still succeeds, and cuforge builds the launcher at run time into its
cache dir instead, or uses the pure-Python launch path.
"""

from __future__ import annotations

import hashlib
import os

from setuptools import Extension, setup

RUNTIME = "src/cuforge/runtime"
SOURCE = f"{RUNTIME}/_launcher.c"  # the real launcher, also compiled at run time
WRAPPER = f"{RUNTIME}/_launcher_ext.c"  # includes SOURCE, adds SOURCE_SHA256


def source_sha256() -> str:
    """The SHA-256 of ``_launcher.c``'s bytes: the installed module carries it, and
    ``fastlaunch`` uses the module only while the package's ``_launcher.c`` still matches."""
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, SOURCE), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


setup(
    ext_modules=[
        Extension(
            "cuforge.runtime._cuforge_fastlaunch",
            sources=[WRAPPER],
            depends=[SOURCE],
            define_macros=[("CUFORGE_LAUNCHER_SHA256", f'"{source_sha256()}"')],
            optional=True,
        )
    ]
)
