"""One switch for every system cuforge caches: :func:`enable` and ``CUFORGE_ENABLE``.

:data:`SYSTEMS` is the registry, the one place that names the systems: what each one's
peer package is, which adapter enables it, and which entry kinds its cache records (for
``cuforge run``'s summary). Adding a system (``flashinfer``) is one :class:`System` here.

* :func:`enable` enables the named systems now (all installed ones when none are named)
  and returns ``{name: "enabled" or why not}``.
* :func:`arm` is what ``CUFORGE_ENABLE`` does at interpreter start
  (:mod:`cuforge._autoenable`, run by the ``cuforge-enable.pth`` hook): it imports no
  peer. Each system is enabled right after its peer module is first imported (a finder on
  ``sys.meta_path`` watches for it), so a process that never imports torch never pays for
  torch, and the peer's own ``.pth`` files (which may come after cuforge's) have run by then.

Whether a system is installed is decided with :func:`importlib.util.find_spec` on the
peer's top-level name, never by importing it.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable, Iterable, Sequence
    from typing import Any

    from cuforge.core.caching import Cache

__all__ = ["System", "SYSTEMS", "enable", "installed", "names", "parse", "arm", "system_of_kind"]

ENABLED = "enabled"


class System:
    """One system cuforge can be the cache of."""

    __slots__ = ("name", "peer", "trigger", "adapter", "kinds", "extra", "hook")

    def __init__(
        self,
        name: str,
        *,
        peer: str,
        adapter: str,
        kinds: tuple[str, ...],
        extra: str,
        trigger: str | None = None,
        hook: bool = True,
    ) -> None:
        #: the name users write (``cuforge.enable("triton")``, ``CUFORGE_ENABLE=triton``)
        self.name = name
        #: the module whose find_spec says "installed" (its parents must be light to import)
        self.peer = peer
        #: the module whose first import enables the system under CUFORGE_ENABLE
        self.trigger = trigger or peer
        #: the module holding ``enable(cache=None)``
        self.adapter = adapter
        #: the cache entry kinds the system's adapter stores (``cuforge run``'s summary)
        self.kinds = kinds
        #: the pip extra that installs the peer (``cuforge[triton]``)
        self.extra = extra
        #: False: the peer has no process-wide hook (``enable`` explains why); CUFORGE_ENABLE
        #: =all leaves it alone, and naming it prints the reason when the peer is imported
        self.hook = hook

    def __repr__(self) -> str:
        return f"System({self.name!r}, peer={self.peer!r}, adapter={self.adapter!r})"


SYSTEMS: dict[str, System] = {
    s.name: s
    for s in (
        System(
            "triton",
            peer="triton",
            adapter="cuforge.adapters.triton",
            kinds=("triton",),
            extra="triton",
        ),
        System(
            "torch_compile",
            peer="torch",
            # not "torch": enabling imports torch._inductor and Triton (~2.5 s), which a
            # process pays only when it compiles (torch.compile imports torch._inductor)
            trigger="torch._inductor",
            adapter="cuforge.torch.compile_cache",
            kinds=("inductor",),
            extra="torch",
        ),
        System("jax", peer="jax", adapter="cuforge.adapters.jax", kinds=("jax",), extra="jax"),
        System("cupy", peer="cupy", adapter="cuforge.adapters.cupy", kinds=("cupy",), extra="cupy"),
        System(
            "cuda_core",
            peer="cuda.core",
            adapter="cuforge.adapters.cuda_core",
            kinds=("cuda-core",),
            extra="cuda-core",
            hook=False,
        ),
        System(
            "cute",
            peer="cutlass",  # find_spec("cutlass.cute") would import cutlass (seconds)
            trigger="cutlass.cute",
            adapter="cuforge.cute.cache",
            kinds=("cute",),
            extra="cute",
        ),
        System("cccl", peer="cuda.compute", adapter="cuforge.cccl", kinds=("cccl",), extra="cccl"),
        System(
            "flashinfer",
            peer="flashinfer",
            adapter="cuforge.adapters.flashinfer",
            kinds=("flashinfer",),
            extra="flashinfer",
        ),
    )
}

#: the last reason each system gave for not enabling (its warning is logged only once)
_reasons: dict[str, str] = {}


def names() -> tuple[str, ...]:
    """The system names, in registry order."""
    return tuple(SYSTEMS)


def system_of_kind(kind: str) -> str | None:
    """The system whose adapter stores entries of ``kind`` (None: cuforge's own kinds)."""
    for system in SYSTEMS.values():
        if kind in system.kinds:
            return system.name
    return None


def _unknown(bad: Sequence[str]) -> str:
    listed = ", ".join(repr(b) for b in bad)
    return f"unknown system {listed}: expected 'all' or some of {', '.join(SYSTEMS)}"


def parse(systems: Iterable[object]) -> tuple[list[str], list[str]]:
    """(known names, in the order given, duplicates dropped; the unknown ones). ``all``
    stands for every system."""
    known: list[str] = []
    bad: list[str] = []
    for item in systems:
        if item == "all":
            known.extend(n for n in SYSTEMS if n not in known)
        elif isinstance(item, str) and item in SYSTEMS:
            if item not in known:
                known.append(item)
        else:
            bad.append(item if isinstance(item, str) else repr(item))
    return known, bad


def installed(name: str) -> bool:
    """Whether ``name``'s peer package can be imported here (found, not imported)."""
    peer = SYSTEMS[name].peer
    if peer in sys.modules:
        return True
    try:
        return importlib.util.find_spec(peer) is not None
    except (ImportError, ValueError):
        return False  # a parent package missing, or a module with no __spec__


def enable(*systems: str, cache: Cache | None = None) -> dict[str, str]:
    """Make cuforge the cache of the named systems (every installed one when none is named)
    in this process; return ``{name: "enabled"}`` or, for each one that is not, why not
    (not installed; a version outside the adapter's window, in the adapter's own words;
    cuda.core's missing global hook; ...). ``cache``: the :class:`cuforge.Cache` they use
    (default: :func:`cuforge.default_cache` at each lookup).

    Names: ``triton``, ``torch_compile``, ``jax``, ``cupy``, ``cuda_core``, ``cute``,
    ``cccl``, ``flashinfer`` (and ``all``). An unknown one raises ``ValueError`` before anything changes;
    the child processes of this one are not affected (``CUFORGE_ENABLE`` / ``cuforge run``
    are)."""
    from cuforge.core.caching import Cache

    if cache is not None and not isinstance(cache, Cache):
        raise TypeError(f"cache= must be a cuforge.Cache or None, not {type(cache).__name__}")
    chosen, bad = parse(systems)
    if bad:
        raise ValueError(f"cuforge.enable: {_unknown(bad)}")
    if not systems:
        chosen = [n for n in SYSTEMS if installed(n)]
    return {name: _enable_one(SYSTEMS[name], cache) for name in chosen}


def _collector() -> Any:
    """A logging handler that collects the adapter's warnings while it runs (they still
    reach the log too). logging is imported here, not at import: ``cuforge run`` reads
    only the registry."""
    import logging

    class _Collect(logging.Handler):
        def __init__(self) -> None:
            super().__init__(logging.WARNING)
            self.messages: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.messages.append(record.getMessage())

    return logging.getLogger("cuforge"), _Collect()


def _enable_one(system: System, cache: Cache | None) -> str:
    if not installed(system.name):
        return f"not installed (no module {system.peer!r}; pip install 'cuforge[{system.extra}]')"
    log, collect = _collector()
    log.addHandler(collect)
    try:
        result = importlib.import_module(system.adapter).enable(cache)
    except NotImplementedError as exc:
        return str(exc)
    except ImportError as exc:
        return f"{system.peer} is installed but cannot be imported: {exc}"
    finally:
        log.removeHandler(collect)
    if result is False:
        if collect.messages:
            _reasons[system.name] = collect.messages[-1]
        return _reasons.get(system.name, f"{system.adapter}.enable() declined (see its log)")
    return ENABLED


# -- CUFORGE_ENABLE: enable each system when its peer is first imported --------------------


def arm(chosen: Sequence[str], *, explicit: bool, report: Callable[[str], None]) -> None:
    """Enable each system of ``chosen`` as soon as its peer module is imported (now, if it
    already is). ``explicit``: the systems were named (not ``all``), so a system without a
    process-wide hook is reported. ``report`` gets one line per failure; nothing raises."""
    for name in chosen:
        system = SYSTEMS[name]
        if not system.hook and not explicit:
            continue
        if system.trigger in sys.modules:
            _enable_at_start(system, report)
        else:
            _hook.watch(system.trigger, lambda system=system: _enable_at_start(system, report))
    if _hook.pending and _hook not in sys.meta_path:
        sys.meta_path.insert(0, _hook)


def _enable_safely(system: System, report: Callable[[str], None]) -> str | None:
    try:
        return _enable_one(system, None)
    except Exception as exc:  # noqa: BLE001 - a failing adapter must not break the user's import
        report(f"{system.name} could not be enabled: {type(exc).__name__}: {exc}")
        return None


def _enable_at_start(system: System, report: Callable[[str], None]) -> None:
    reason = _enable_safely(system, report)
    # an adapter declining (a version outside its window) has logged its own one line; a
    # system with no process-wide hook (named explicitly) says why, once its peer is in use
    if not system.hook and reason is not None and reason != ENABLED:
        report(f"{system.name} is not enabled: {reason}")


class _AfterImport:
    """A ``sys.meta_path`` finder that runs a callback right after a watched module has
    executed. It finds the spec with the other finders and wraps only the loader's
    ``exec_module``; the module gets its real loader back before its code runs."""

    def __init__(self) -> None:
        self.pending: dict[str, list[Callable[[], None]]] = {}

    def watch(self, module: str, callback: Callable[[], None]) -> None:
        self.pending.setdefault(module, []).append(callback)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in self.pending:
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Loader(spec.loader, self, fullname)
        return spec

    def ran(self, fullname: str) -> None:
        callbacks = self.pending.pop(fullname, ())
        if not self.pending and self in sys.meta_path:
            sys.meta_path.remove(self)
        for callback in callbacks:
            callback()

    # importlib.invalidate_caches() calls this on every meta-path finder that has it
    def invalidate_caches(self) -> None:
        pass


class _Loader:
    def __init__(self, real: Any, hook: _AfterImport, fullname: str) -> None:
        self._real = real
        self._hook = hook
        # (not module.__name__ after the fact: cuda.core's __init__ renames its module)
        self._fullname = fullname

    def create_module(self, spec: Any) -> Any:
        create = getattr(self._real, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: Any) -> None:
        real = self._real
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.loader is self:
            spec.loader = real
        if getattr(module, "__loader__", None) is self:
            module.__loader__ = real
        real.exec_module(module)
        self._hook.ran(self._fullname)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


_hook = _AfterImport()
