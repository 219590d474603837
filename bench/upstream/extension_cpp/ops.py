"""``torch.ops.extension_cpp.*``: extension-cpp's three ops (see :mod:`extension_cpp.define`)."""

from extension_cpp.define import define

__all__ = ["mymuladd", "mymul", "myadd_out"]

mymuladd, mymul, myadd_out = define("extension_cpp")
