"""cuforge.jax tests: skip without JAX (``make test-jax`` installs jax[cpu] in .jax-site).
JAX runs on its CPU backend here, persistent compilation cache included."""

from __future__ import annotations
