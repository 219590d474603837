"""The compile fence: after start-up, a compile is an incident.

``cuforge.fence("warn")`` / ``cuforge.fence("error")`` (or ``CUFORGE_FENCE=warn|error``, or
``with cuforge.fence("error"):`` for a block) puts up the fence for the whole process.
After it, every build any system served by cuforge is about to run is reported:

* **where**: :meth:`cuforge.Cache.build_once` right before ``build()`` runs (after every
  lookup missed, inside the single-flight lock) -- one place for cuforge kernels,
  ``cuforge.jit``, torch extensions, cuda.compute and CuTe DSL builds; blob builds that
  cannot be cached (:mod:`cuforge.core.blobcache`) ask too. A **hit never trips the fence**,
  whatever its tier (memory, disk, remote, bundle), and the fence costs nothing on a hit:
  it is asked on the build path only;
* **Triton**: Triton's own compile hooks (``triton.knobs``), so a Triton kernel compiled
  outside cuforge is caught too. They are installed only while the fence is up, when
  ``triton`` is imported (now, or later: an import hook waits for it; cuforge never
  imports triton itself). ``warn`` uses ``knobs.compilation.listener`` (called after a
  compile, nothing on a launch); ``error`` uses ``knobs.runtime.add_stages_inspection_hook``,
  whose pipeline form Triton calls only on a miss, before any stage runs -- so nothing is
  compiled. (Triton then also calls it, argument-less, once per launch: a Python call.)
* **CuPy and JAX** (when :func:`cuforge.cupy.enable` / :func:`cuforge.jax.enable` made
  cuforge their cache): a miss in cuforge's cache is where the system compiles next, so
  that is where the fence asks (:func:`adapter_miss`); a hit never asks. CuPy's backend
  ``load`` runs before its compile, so ``error`` raises there and nothing is compiled.
  JAX reads its cache inside a ``try`` that turns errors into a warning, so the error is
  held until JAX's ``_cache_read`` returns (cuforge.jax wraps it) and raised there, before
  the compile; on a JAX without ``_cache_read`` it is raised from the read (JAX may then
  warn and compile: ``warn``'s report is all that is certain). A system's compile that
  its cache is never asked about (JAX's own thresholds:
  ``jax_persistent_cache_min_compile_time_secs`` keeps fast compiles out of the cache, so
  they miss in every process -- set it to 0 for a fenced service) is reported as a miss,
  which it is;
* **warn**: each key is reported once per process on stderr: the system, the kernel name,
  the key, the labeled key fields that missed (as ``cuforge cache explain`` words them)
  and the caller's stack (short). The build then runs;
* **error**: :class:`~cuforge.base.errors.CompileAfterFenceError` with the same information;
  nothing is compiled.

:func:`reports` lists what the fence saw in this process (newest last).
"""

from __future__ import annotations

import os
import sys
import threading

from cuforge.base.config import settings
from cuforge.base.errors import CompileAfterFenceError

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable
    from typing import Any

__all__ = ["fence", "mode", "reports", "before_build", "adapter_miss", "CompileAfterFenceError"]

_MODES = ("off", "warn", "error")
#: the mode :func:`fence` set (None: CUFORGE_FENCE decides)
_mode: str | None = None
_lock = threading.Lock()
_reported: set[tuple[str, str, str]] = set()
_reports: list[dict[str, Any]] = []
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # src/cuforge/

#: entry kind -> the system it belongs to, as reports name it
SYSTEMS = {
    "kernel": "kernel",
    "torch": "torch extension",
    "cccl": "cuda.compute",
    "cute": "CuTe DSL",
}


def mode() -> str:
    """The fence now: ``"warn"``, ``"error"`` or ``""`` (no fence)."""
    current = _mode
    if current is None:
        return settings().fence
    return "" if current == "off" else current


class fence:
    """Put up the compile fence: ``cuforge.fence("warn" | "error")`` for the rest of the
    process, or ``with cuforge.fence("error"):`` for a block (the previous fence is back
    after it). ``cuforge.fence("off")`` takes it down (``CUFORGE_FENCE`` is then ignored).
    See the module doc for what it reports."""

    def __init__(self, mode: str = "error") -> None:
        global _mode
        if not isinstance(mode, str) or mode.strip().lower() not in _MODES:
            raise ValueError(f"fence mode must be one of {', '.join(_MODES)}, not {mode!r}")
        self.mode = mode.strip().lower()
        self._previous = _mode
        _mode = self.mode
        if self.mode != "off":
            install_triton_hooks()

    def __enter__(self) -> fence:
        return self

    def __exit__(self, *exc: object) -> None:
        global _mode
        _mode = self._previous

    def __repr__(self) -> str:
        return f"cuforge.fence({self.mode!r})"


def reports() -> list[dict[str, Any]]:
    """What the fence reported in this process: one dict per key (system, kind, name, key,
    reasons, manifest_entry, stack, mode), oldest first."""
    with _lock:
        return [dict(r) for r in _reports]


def reset() -> None:
    """Forget which keys were reported (each is reported again once)."""
    with _lock:
        _reported.clear()
        _reports.clear()


# ---------------------------------------------------------------------- the build path


def before_build(cache: Any, key: str, what: str, offline_error: Callable[[], Any]) -> None:
    """Called by :meth:`cuforge.Cache.build_once` (and uncached blob builds) right before
    a build runs: nothing without a fence; else report it, or raise in ``error`` mode."""
    current = mode()
    if not current:
        return
    install_triton_hooks()
    info = describe(cache, key, what, offline_error)
    _trip(current, info)


def adapter_miss(
    system: str, kind: str, name: str, key: str, reasons: list[str] | tuple[str, ...] = ()
) -> None:
    """Called by a system adapter (:mod:`cuforge.cupy`, :mod:`cuforge.jax`) when cuforge's
    cache missed and the system is about to compile ``name`` (cuforge entry key ``key``):
    nothing without a fence; ``warn``: reported once per key; ``error``: raises
    :class:`~cuforge.base.errors.CompileAfterFenceError` (the caller raises it before the
    system compiles)."""
    current = mode()
    if not current:
        return
    info = {
        "system": system,
        "kind": kind,
        "name": name,
        "key": key,
        "reasons": list(reasons) or [f"not in cuforge's cache ({system})"],
        "manifest_entry": None,
        "stack": caller_stack(),
    }
    _trip(current, info)


def _trip(current: str, info: dict[str, Any]) -> None:
    text = _message(info)
    ident = (current, info["system"], info["key"])
    with _lock:
        first = ident not in _reported
        if first:
            _reported.add(ident)
            _reports.append({**info, "mode": current})
    if current == "error":
        raise CompileAfterFenceError(
            text
            + "\nNothing was compiled. Ship this key in the warm set (record the workload with "
            "cuforge.record / CUFORGE_RECORD, then `cuforge build --lock cuforge.lock --bundle "
            'warm.cfb`), or take the fence down (cuforge.fence("off")).',
            system=info["system"],
            kind=info["kind"],
            name=info["name"],
            key=info["key"],
            reasons=tuple(info["reasons"]),
            manifest_entry=info["manifest_entry"],
            stack=tuple(info["stack"]),
        )
    if first:
        print(f"cuforge: warning: {text}", file=sys.stderr, flush=True)


def describe(cache: Any, key: str, what: str, offline_error: Callable[[], Any]) -> dict:
    """system, kind, name, key, reasons, manifest_entry and stack of a build about to run
    (``offline_error()`` is the build's :class:`~cuforge.base.errors.OfflineMissError`)."""
    try:
        err = offline_error()
    except Exception:  # noqa: BLE001 - a description must never stop the build it describes
        err = None
    kind = getattr(err, "kind", None) or "build"
    name = getattr(err, "name", None) or what
    fields = getattr(err, "fields", None) or {}
    stack = caller_stack()
    system = SYSTEMS.get(kind, kind)
    if kind == "kernel" and any("jitkernel.py" in f for f in _frames_files()):
        system = "cuforge.jit"
    return {
        "system": system,
        "kind": kind,
        "name": name,
        "key": key,
        "reasons": _reasons(cache, name, fields),
        "manifest_entry": getattr(err, "manifest_entry", None),
        "stack": stack,
    }


def _reasons(cache: Any, name: str, fields: dict) -> list[str]:
    if not fields:
        return ["first build of this name (no earlier key recorded)"]
    from cuforge.keys import explain

    try:
        root = cache.explain_root if cache is not None and cache.store is not None else None
        reasons = explain.explain(root, name, fields)
    except Exception:  # noqa: BLE001 - explaining must never stop the build
        return []
    if "headers" not in fields:  # a kernel's base key: header contents are not in it yet
        reasons = [r for r in reasons if not r.startswith("header")]
    return reasons or ["first build of this name (no earlier key recorded)"]


def _frames_files() -> list[str]:
    frame = sys._getframe(1)
    files = []
    while frame is not None:
        files.append(frame.f_code.co_filename)
        frame = frame.f_back
    return files


#: the systems whose own frames a report's stack leaves out (the caller's code is shown)
_SYSTEM_DIRS = tuple(f"{os.sep}{p}{os.sep}" for p in ("triton", "jax", "jaxlib", "cupy"))


def caller_stack(limit: int = 4) -> list[str]:
    """The innermost ``limit`` frames outside cuforge and the systems it serves (Triton,
    JAX, CuPy) (``file:line in func``), outermost first."""
    frame = sys._getframe(1)
    out: list[str] = []
    while frame is not None and len(out) < limit:
        path = frame.f_code.co_filename
        if not path.startswith(_PACKAGE_DIR) and not any(d in path for d in _SYSTEM_DIRS):
            if not path.startswith("<frozen"):
                out.append(f"{os.path.basename(path)}:{frame.f_lineno} in {frame.f_code.co_name}")
        frame = frame.f_back
    return out[::-1]


def _message(info: dict[str, Any]) -> str:
    missed = "; ".join(info["reasons"]) or "?"
    where = " <- ".join(reversed(info["stack"])) or "?"
    if info["kind"] == "kernel":  # build_once's key of a kernel: direct mode's base key
        label = f"base key of direct mode {info['key']}: `cuforge cache show` lists its variants"
    else:
        label = f"key {info['key'][:16]}"
    return (
        f"compile after the fence: {info['system']} {info['name']!r} ({label}) "
        f"missed: {missed}; called from {where}"
    )


# ---------------------------------------------------------------------- Triton

#: the Triton hooks installed: "listener" (warn), "stages" (error)
_triton_installed: set[str] = set()
_finder_installed = False


def install_triton_hooks() -> None:
    """Hook Triton's compiler when ``triton`` is imported, or as soon as it gets imported
    (never imports it)."""
    global _finder_installed
    if len(_triton_installed) == 2 or (mode() != "error" and _triton_installed):
        return
    if "triton" in sys.modules:
        _install_triton()
        return
    if not _finder_installed:
        _finder_installed = True
        sys.meta_path.insert(0, _TritonFinder())


class _TritonFinder:
    """Waits for ``import triton`` and hooks it right after (then steps aside)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != "triton":
            return None
        from importlib.machinery import PathFinder

        spec = PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        loader = spec.loader
        real_exec = loader.exec_module

        def exec_module(module: Any) -> None:
            real_exec(module)
            global _finder_installed
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            _finder_installed = False
            if mode():
                _install_triton()

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _install_triton() -> None:
    """The listener always; the stages hook only for ``error`` (it costs a call per launch)."""
    try:
        from triton import knobs
    except ImportError:  # an old Triton (no knobs): nothing to hook
        return
    previous_listener = knobs.compilation.listener
    previous_stages = knobs.runtime.add_stages_inspection_hook

    def listener(*, src: Any, metadata: Any, metadata_group: Any, times: Any, cache_hit: bool):
        if previous_listener is not None:
            previous_listener(
                src=src,
                metadata=metadata,
                metadata_group=metadata_group,
                times=times,
                cache_hit=cache_hit,
            )
        if not cache_hit and mode() == "warn":
            _trip("warn", _triton_info(getattr(src, "name", "?"), metadata.get("hash", "?")))

    def stages_hook(*args: Any) -> Any:
        if not args:  # the key form: Triton asks on every compile call and launch
            if previous_stages is not None:
                return previous_stages()
            return "", ""
        if previous_stages is not None:
            previous_stages(*args)
        if mode() == "error":  # the pipeline form: only on a miss, before any stage runs
            frame = sys._getframe(1)
            name, key = "?", "?"
            while frame is not None:
                if "hash" in frame.f_locals and "src" in frame.f_locals:
                    name = getattr(frame.f_locals["src"], "name", "?")
                    key = str(frame.f_locals["hash"])
                    break
                frame = frame.f_back
            _trip("error", _triton_info(name, key))
        return None

    with _lock:
        if "listener" not in _triton_installed:
            _triton_installed.add("listener")
            knobs.compilation.listener = listener
        if mode() == "error" and "stages" not in _triton_installed:
            _triton_installed.add("stages")
            knobs.runtime.add_stages_inspection_hook = stages_hook


def _triton_info(name: str, key: str) -> dict[str, Any]:
    return {
        "system": "triton",
        "kind": "triton",
        "name": name,
        "key": key,
        "reasons": ["not in Triton's cache"],
        "manifest_entry": None,
        "stack": caller_stack(),
    }
