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
* **Triton's C modules** (its ``cuda_utils`` helper, on Triton <= 3.6 one launcher per
  kernel signature: what ``compile_module_from_src`` / ``compile_so_from_src`` build with
  the C compiler when Triton's cache manager -- its own or :mod:`cuforge.triton`'s --
  missed): ``triton.runtime.build._build``, the one function every such build runs
  (Triton 3.4 to 3.8), is wrapped; ``error`` raises before the C compiler runs;
* **torch.compile on Inductor's CPU backend** (its C++ kernels and wrappers, AOTInductor's
  ``.so``): ``torch._inductor.cpp_builder.CppBuilder.build``, the one method that runs the
  host compiler, is wrapped (torch has no public hook); Inductor calls it only when the
  built file is not in its cache dir, so a warm graph never asks. ``error`` raises before
  the compiler runs (torch.compile raises it wrapped in dynamo's ``BackendCompilerFailed``,
  the fence's error its ``__cause__``). Inductor's probe of the CPU's vector ISA (a tiny
  program it builds once per machine and ISA, then keeps in its cache dir) is not asked:
  torch turns any error of it into "this ISA does not work" and would silently generate
  other code. Both wraps (Triton, Inductor) are installed the same way as Triton's hooks,
  stay installed, and act only while a fence is up;
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
from _contextvars import ContextVar

from cuforge.base.config import settings
from cuforge.base.errors import CompileAfterFenceError

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable
    from typing import Any

__all__ = [
    "fence",
    "mode",
    "reports",
    "before_build",
    "adapter_miss",
    "install_hooks",
    "CompileAfterFenceError",
]

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
    "inductor-cpp": "torch.compile",
    "flashinfer": "FlashInfer",
}

#: set while cuforge's Inductor C++ cache (:mod:`cuforge.torch.inductor_cpp`) runs a build
#: it already put before the fence (its ``Cache.begin``): the fence's own wrapper of
#: ``CppBuilder.build`` then does not report it a second time
inductor_asked: ContextVar[bool] = ContextVar("cuforge_inductor_asked", default=False)


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
            install_hooks()

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
    install_hooks()
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
    JAX, CuPy, torch once imported) (``file:line in func``), outermost first."""
    frame = sys._getframe(1)
    out: list[str] = []
    torch_file = getattr(sys.modules.get("torch"), "__file__", None)
    skipped: tuple[str, ...] = (_PACKAGE_DIR,)
    if torch_file:
        skipped += (os.path.dirname(torch_file) + os.sep,)
    while frame is not None and len(out) < limit:
        path = frame.f_code.co_filename
        if not path.startswith(skipped) and not any(d in path for d in _SYSTEM_DIRS):
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


# ---------------------------------------------------------------------- the systems' hooks

#: the hooks installed: "listener" (warn), "stages" (error), "native" (Triton's C module
#: builds), "inductor" (Inductor's C++ builds)
_triton_installed: set[str] = set()
_finder_installed = False
#: the module whose import each system's hooks wait for
_TRITON, _INDUCTOR = "triton", "torch._inductor.cpp_builder"


def _triton_wanted() -> int:
    """How many Triton hooks this mode wants (the stages hook only under ``error``)."""
    return 3 if mode() == "error" else 2


def install_hooks() -> None:
    """Hook the systems cuforge fences that build outside :meth:`cuforge.Cache.build_once`
    (Triton's compiler and its C modules, Inductor's C++ builds): now for those imported,
    or as soon as they get imported (an import hook waits; cuforge never imports them)."""
    global _finder_installed
    installed = _triton_installed
    triton_done = len(installed - {"inductor"}) >= _triton_wanted()
    if triton_done and "inductor" in installed:
        return
    modules = sys.modules
    if not triton_done and _TRITON in modules:
        _install_triton()
    if "inductor" not in installed and _INDUCTOR in modules:
        _install_inductor()
    if not _finder_installed and (_TRITON not in modules or _INDUCTOR not in modules):
        _finder_installed = True
        sys.meta_path.insert(0, _SystemFinder())


#: the name this function had when it hooked Triton alone
install_triton_hooks = install_hooks


class _SystemFinder:
    """Waits for ``import triton`` / ``import torch._inductor.cpp_builder`` and hooks each
    right after it ran (then steps aside, once both were imported)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in (_TRITON, _INDUCTOR):
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
            if _TRITON in sys.modules and _INDUCTOR in sys.modules:
                if self in sys.meta_path:
                    sys.meta_path.remove(self)
                _finder_installed = False
            if mode():
                if fullname == _TRITON:
                    _install_triton()
                else:
                    _install_inductor()

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
        if "native" not in _triton_installed:
            _triton_installed.add("native")
            _wrap_native_build()


def _wrap_native_build() -> None:
    """Wrap ``triton.runtime.build._build`` (the C compiler run of every C module Triton
    builds after its cache missed) to ask the fence first."""
    try:
        from triton.runtime import build
    except ImportError:  # a Triton without it: nothing to hook
        return
    original = getattr(build, "_build", None)
    if original is None or getattr(original, "_cuforge_fence", False):
        return

    def _build(*args: Any, **kwargs: Any) -> Any:
        current = mode()
        if current:
            name = args[0] if args else kwargs.get("name", "?")
            source = args[1] if len(args) > 1 else kwargs.get("src", "")
            _trip(current, _native_info(str(name), _native_key(str(source))))
        return original(*args, **kwargs)

    _build.__wrapped__ = original  # type: ignore[attr-defined]
    _build._cuforge_fence = True  # type: ignore[attr-defined]
    build._build = _build


def _native_key(source: str) -> str:
    """Triton's cache key of the C module being built (its cache manager's ``key``, from
    the frame that made it), else the SHA-256 of the C source file."""
    frame = sys._getframe(2)
    for _ in range(4):
        if frame is None:
            break
        key = getattr(frame.f_locals.get("cache"), "key", None)
        if isinstance(key, str) and key:
            return key
        frame = frame.f_back
    import hashlib

    try:
        with open(source, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return hashlib.sha256(source.encode("utf-8", "replace")).hexdigest()


def _native_info(name: str, key: str) -> dict[str, Any]:
    return {
        "system": "triton",
        "kind": "triton-module",
        "name": name,
        "key": key,
        "reasons": ["a C module not in Triton's cache (built with the C compiler)"],
        "manifest_entry": None,
        "stack": caller_stack(),
    }


# ---------------------------------------------------------------------- Inductor (C++)


def _install_inductor() -> None:
    """Wrap ``CppBuilder.build`` of ``torch._inductor.cpp_builder`` (imported already) to
    ask the fence before the host compiler runs (module doc)."""
    module = sys.modules.get(_INDUCTOR)
    builder = getattr(module, "CppBuilder", None)
    with _lock:
        if "inductor" in _triton_installed:
            return
        _triton_installed.add("inductor")
        original = getattr(builder, "build", None)
        if original is None or getattr(original, "_cuforge_fence", False):
            return  # another torch: nothing we know to hook

        def build(self: Any, *args: Any, **kwargs: Any) -> Any:
            current = mode()
            # cuforge's C++ cache asks the fence itself, on a miss only (never on a hit)
            caching = getattr(original, "_cuforge_cpp_cache", None)
            cached = inductor_asked.get() or (callable(caching) and caching())
            if current and not cached:
                caller = sys._getframe(1).f_globals.get("__name__", "")
                if caller != "torch._inductor.cpu_vec_isa":  # the ISA probe (module doc)
                    _trip(current, _inductor_info(self))
            return original(self, *args, **kwargs)

        build.__wrapped__ = original  # type: ignore[attr-defined]
        build._cuforge_fence = True  # type: ignore[attr-defined]
        builder.build = build


def _inductor_info(builder: Any) -> dict[str, Any]:
    try:
        target = str(builder.get_target_file_path())
    except Exception:  # noqa: BLE001 - torch's private builder; the report names less
        target = str(getattr(builder, "_name", "?"))
    name = os.path.basename(target)
    return {
        "system": "torch.compile",
        "kind": "inductor-cpp",
        "name": name,
        "key": str(getattr(builder, "_name", "") or name),
        "reasons": ["not in Inductor's C++ cache (a C++ build with the host compiler)"],
        "manifest_entry": None,
        "stack": caller_stack(),
    }


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
