"""cuforge.jax tests: skip without JAX (``make test-jax`` installs jax[cpu] in .jax-site).
JAX runs on its CPU backend here, persistent compilation cache included."""

from __future__ import annotations

import importlib.util

import pytest

if importlib.util.find_spec("jax") is None:
    pytest.skip(
        "jax is not installed: `make test-jax` (or pip install 'cuforge[jax]' 'jax[cpu]')",
        allow_module_level=True,
    )
