"""``cuforge.flashinfer``, the public path of :mod:`cuforge.adapters.flashinfer` (one module under
both names, so settings and patches made through either are the same)."""

import sys

import cuforge.adapters.flashinfer as _adapter

sys.modules[__name__] = _adapter
