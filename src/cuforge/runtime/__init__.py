"""The kernel launch runtime (imported only when a kernel is first asked for).

* :mod:`~cuforge.runtime.kernel` -- :class:`Kernel`: ``k[grid, block](*args)``
* :mod:`~cuforge.runtime.signature` -- parameter types from the kernel's declaration
* :mod:`~cuforge.runtime.args` -- argument conversion, :class:`Pointer`, the packer layout
* :mod:`~cuforge.runtime.streams` -- ``stream=`` objects and the default stream
* :mod:`~cuforge.runtime.module` -- loading binaries (``cuLibraryLoadData``), once per process
* :mod:`~cuforge.runtime.driver` -- the CUDA driver through ctypes
* :mod:`~cuforge.runtime.fastpath` -- the launch-config and per-device records, the generated
  Python fast path and the C launcher's per-kernel state
* :mod:`~cuforge.runtime.fastlaunch` -- builds and imports the optional C fast path
  (its source: ``_launcher.c`` in this package)
* :mod:`~cuforge.runtime.errors` -- :class:`LaunchError` and its kinds
"""
