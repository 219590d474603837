"""``cuforge.jax``, the public path of :mod:`cuforge.adapters.jax` (one module under
both names, so settings and patches made through either are the same)."""

import sys

import cuforge.adapters.jax as _adapter

sys.modules[__name__] = _adapter
