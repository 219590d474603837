"""``@cuforge.cute.jit``: a ``@cute.jit`` function that compiles through the cache on call.

Calling the decorated function compiles it for the call's argument *specs* (see
:mod:`cuforge.cute.spec`: dtypes, static shapes/strides, dynamic extents, Constexpr values)
with :func:`cuforge.cute.cache.compile_cached` -- a memo hit in the same process, a store hit
(no tracing) in a fresh one -- then runs the compiled function on the same arguments.

Guarantees: the compiled function is the one ``cute.compile`` makes for those arguments (or
its stored export); a call whose arguments cannot be keyed compiles uncached, with a
warning that says why. ``f.compile(*args)`` compiles without running (for ahead-of-time
warm-up with fake tensors), ``f.compile_cached(*args)`` returns the
:class:`~cuforge.cute.cache.CuteResult`, ``f.cute_function`` is the underlying ``@cute.jit``
function.

Layer 5; imports the DSL when a function is decorated.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from cuforge.cute.cache import compile_cached

if TYPE_CHECKING:  # pragma: no cover
    from typing import Any

__all__ = ["jit"]


def _is_cute_function(fn: Any) -> bool:
    inner = fn
    for _ in range(100):
        if hasattr(inner, "_dsl_object") or hasattr(inner, "_dsl_cls"):
            return True
        if not hasattr(inner, "__wrapped__"):
            break
        inner = inner.__wrapped__
    return False


def jit(
    fn: Any = None,
    /,
    *,
    verify: str | None = None,
    options: str | None = None,
    cache: Any = None,
    **jit_kwargs: Any,
) -> Any:
    """Decorate ``fn`` like ``@cute.jit`` (or wrap an existing ``@cute.jit`` function) so
    that each call compiles through cuforge's cache, then runs.

    ``@cuforge.cute.jit`` or ``@cuforge.cute.jit(verify="trace", options="...", cache=...,
    **cute_jit_kwargs)``; ``cache``: the :class:`cuforge.Cache` (default: the default
    cache at each call); ``cute_jit_kwargs`` go to ``cute.jit`` (e.g. ``preprocess=False``)."""
    if verify not in (None, "trace"):
        raise ValueError(f"verify={verify!r}: expected None or 'trace'")

    def wrap(f: Any) -> Any:
        import cutlass.cute as cute

        if _is_cute_function(f):
            if jit_kwargs:
                raise TypeError(
                    f"{f.__qualname__} is already a @cute.jit function; pass the cute.jit "
                    f"arguments {sorted(jit_kwargs)} to cute.jit, not to cuforge.cute.jit"
                )
            decorated = f
        else:
            decorated = cute.jit(**jit_kwargs)(f) if jit_kwargs else cute.jit(f)

        def _compile_kwargs(kwargs: dict) -> dict:
            kw = dict(kwargs)
            if options is not None:
                kw.setdefault("options", options)
            if cache is not None:
                kw["cache"] = cache
            return kw

        @functools.wraps(f)
        def call(*args: Any, **kwargs: Any) -> Any:
            result = compile_cached(decorated, *args, verify=verify, **_compile_kwargs(kwargs))
            return result.value(*args, **kwargs)

        def compile_only(*args: Any, **kwargs: Any) -> Any:
            return compile_cached(decorated, *args, verify=verify, **_compile_kwargs(kwargs)).value

        def cached(*args: Any, **kwargs: Any) -> Any:
            return compile_cached(decorated, *args, verify=verify, **_compile_kwargs(kwargs))

        call.compile = compile_only
        call.compile_cached = cached
        call.cute_function = decorated
        return call

    if fn is None:
        return wrap
    return wrap(fn)
