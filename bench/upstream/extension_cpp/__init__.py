"""pytorch/extension-cpp's ``extension_cpp`` package, rewritten the way a cuforge user would
write it: no C++, no setup.py; the CUDA kernels compiled by cuforge and registered with
:func:`cuforge.torch.custom_op` (docs/custom_ops.md, "extension-cpp's mymuladd, without
C++"). Used to run extension-cpp's own test suite, unmodified, against cuforge: see
``bench/upstream/run_extension_cpp.sh``."""

from extension_cpp import ops  # noqa: F401 - registers torch.ops.extension_cpp.*
