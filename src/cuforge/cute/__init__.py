"""``cuforge.cute``: a persistent, shared cache for the CuTe DSL's ``cute.compile``.

* :func:`enable` / :func:`disable` -- patch ``cutlass.cute.compile`` in place (CuTe DSL
  code runs unedited, cached), and put the DSL's own back;
* :func:`compile` -- a drop-in for ``cutlass.cute.compile(fn, *args, **kwargs)``: a hit
  returns the stored, exported function (``load_module``), without tracing;
  ``compile[options]`` as the DSL's ``cute.compile[options]``;
* :func:`compile_cached` -- the same, returning a :class:`CuteResult` (where the function
  came from, the key, why it is not cached);
* :func:`jit` -- a decorator: ``@cuforge.cute.jit`` functions compile (cached) on call,
  specialized on their arguments' specs, then run;
* :func:`key_fields` -- what the key of a call is made of.

Entries are of kind ``"cute"`` in cuforge's store (``cuforge cache ls / stats / explain``).
Needs ``pip install 'cuforge[cute]'`` (``nvidia-cutlass-dsl``), imported on first call.
"""

from __future__ import annotations

import importlib

__all__ = [
    "compile",
    "compile_cached",
    "enable",
    "disable",
    "enabled",
    "jit",
    "key_fields",
    "clear_memo",
    "CuteResult",
    "StaleEntryError",
]

_LAZY = {
    "compile": "cuforge.cute.cache",
    "compile_cached": "cuforge.cute.cache",
    "enable": "cuforge.cute.cache",
    "disable": "cuforge.cute.cache",
    "enabled": "cuforge.cute.cache",
    "key_fields": "cuforge.cute.cache",
    "clear_memo": "cuforge.cute.cache",
    "CuteResult": "cuforge.cute.cache",
    "StaleEntryError": "cuforge.cute.cache",
    "jit": "cuforge.cute.decorator",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'cuforge.cute' has no attribute {name!r}")

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
