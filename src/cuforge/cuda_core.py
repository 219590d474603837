"""``cuforge.cuda_core``, the public path of :mod:`cuforge.adapters.cuda_core` (one module under
both names, so settings and patches made through either are the same)."""

import sys

import cuforge.adapters.cuda_core as _adapter

sys.modules[__name__] = _adapter
