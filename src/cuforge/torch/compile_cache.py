"""torch.compile's caches in cuforge: Inductor's remote caches backed by a cuforge.Cache.

Set-up, one line: ``cuforge.torch.compile_cache.enable()`` before the first
``torch.compile``. See docs/torch_compile.md.

**Mechanism** (chosen from torch's source, torch/_inductor/remote_cache.py): Inductor's
FX-graph cache, AOTAutograd cache and autotune caches each have a *remote* tier,
``RemoteFxGraphCache``/``RemoteAOTAutogradCache``/``RemoteAutotuneCache``/
``RemoteBundledAutotuneCache``, whose byte store is pluggable through the class attribute
``backend_override_cls``. :func:`enable` plugs a backend that keeps each value as one
cuforge entry of kind ``inductor`` (every tier: memory, disk, the remotes; checksummed, under
the LRU cap, signed when signing is on), and turns those remote caches on in Inductor's
config. Inductor keeps its own local caches in front; a second machine with an empty
``TORCHINDUCTOR_CACHE_DIR`` gets the FX graph (and the AOTAutograd entry) from cuforge and
runs no Inductor codegen. Mega-Cache (``torch.compiler.save_cache_artifacts``) was not used:
it is one blob per process, to be saved and loaded by hand at the right moment, while the
remote tiers are asked per graph, by Inductor itself, with its own keys.

**Keys**: Inductor's own keys (hashes of the graph, the inputs, the configs and the torch
version), wrapped as ``make_key("inductor", {"cache": ..., "inductor_key": ...})``. They
hold no path or user name that torch does not put there itself (tests/torch/
test_compile_cache.py compiles in another cwd with another Inductor dir and hits).

**Trust**: a value is the JSON document torch would have read from its own remote cache;
for the FX graph and AOTAutograd caches it holds a base64 pickle that torch unpickles, as it
would from its own local or remote cache. cuforge unpickles nothing. Bytes that fail the
entry checksum (or the signature, when required) are a miss: torch recompiles.

**Explain**: the key stays Inductor's, but a stored FX graph or AOTAutograd entry is
recorded with labeled fields for ``cuforge cache explain``: torch's own description of its
key (the ``debug_lines`` that ``compiled_fx_graph_hash`` / ``autograd_cache_key`` return:
one line per component, ``[hash] label: value``; a long, multi-line or path-holding value is
shown by its hash), plus the torch and Triton versions and the CUDA arch when CUDA is up.
An entry's explain name is ``inductor:<FxGraph|AOTAutograd>:<compile id>`` (dynamo's
compile id, e.g. ``0/0``), so the same program's graphs line up across runs (a forward and a
backward graph share a name; explain compares with the nearest earlier key of the name). Autotune
entries carry no fields (torch gives their keys no description), and torch 2.14's
``autograd_cache_key`` returns no debug lines, so an AOTAutograd miss names only the
versions, the arch and ``inductor_key``.

Triton kernels compiled by Inductor go through :mod:`cuforge.triton` (enabled too, when
Triton is installed and supported).

**ptxas**: :func:`enable` makes Inductor's choice of ptxas (torch's own, through
``TRITON_PTXAS_PATH``) at once rather than at Inductor's first async compile, so that every
Triton kernel of the process is keyed with the same ptxas version (see :func:`_pin_ptxas`).

Supported: torch 2.6 to 2.14 (tested on 2.11.0 with CUDA and Triton 3.6.0 on an H100, and on
2.14.1 on the CPU). On another version :func:`enable` warns once
and leaves torch's caches as they are.
"""

from __future__ import annotations

import logging
import re
import sys
from typing import TYPE_CHECKING

from cuforge.adapters.windows import window
from cuforge.core.blobformat import make_key
from cuforge.core.caching import Cache, default_cache
from cuforge.store.base import Entry

if TYPE_CHECKING:  # pragma: no cover
    from typing import Any

__all__ = [
    "enable",
    "disable",
    "supported",
    "hook_problem",
    "SUPPORTED",
    "fields_from_debug_lines",
]

#: ``(low, high)``: the torch versions this module patches (low <= version < high)
SUPPORTED = window("torch_compile")  # the tested releases: cuforge/adapters/windows.py
#: Inductor's remote-cache classes whose byte store cuforge becomes
_CLASSES = (
    "RemoteFxGraphCache",
    "RemoteAOTAutogradCache",
    "RemoteAutotuneCache",
    "RemoteBundledAutotuneCache",
)
#: config module -> the flags that turn those remote caches on
_FLAGS = (
    ("torch._inductor.config", ("fx_graph_remote_cache", "autotune_remote_cache")),
    ("torch._functorch.config", ("enable_remote_autograd_cache",)),
)

#: torch's key functions that also return a description of the key (debug lines)
_HASHERS = (
    ("torch._inductor.codecache", "compiled_fx_graph_hash"),
    ("torch._functorch._aot_autograd.autograd_cache", "autograd_cache_key"),
)
#: the caches whose entries are explained (their keys come from _HASHERS)
_EXPLAINED = {"RemoteFxGraphCache": "FxGraph", "RemoteAOTAutogradCache": "AOTAutograd"}
#: a value longer than this (or multi-line, or holding a path) is shown by its hash
_SHORT = 120
_DEBUG_LINE = re.compile(r"\[([^\]]*)\] ([^:]+): (.*)", re.DOTALL)
_ADDRESS = re.compile(r"0x[0-9a-fA-F]{6,}")
#: the config modules whose flags torch's debug lines list one by one
_CONFIG_MODULES = {
    "inductor_config": "torch._inductor.config",
    "aot_config": "torch._functorch.config",
    "functorch_config": "torch._functorch.config",
}
_CONFIG_PREFIXES = tuple(f"{name}[" for name in _CONFIG_MODULES)

_log = logging.getLogger("cuforge")
_state: dict[str, Any] = {"cache": None, "saved": None, "warned": False}
#: Inductor key -> labeled fields from torch's debug lines (for explain)
_recent_fields: dict[str, dict[str, str]] = {}
#: (module, name, original) of the wrapped key functions
_wrapped: list = []


def _torch_version() -> tuple[int, int]:
    import torch

    parts = torch.__version__.split("+", 1)[0].split(".")
    return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)


def hook_problem() -> str | None:
    """Why cuforge cannot hold torch.compile's caches here (None when it can): a remote-cache
    class without ``backend_override_cls``, or a torch outside :data:`SUPPORTED` whose
    contract probe fails (:func:`cuforge.adapters.common.window_verdict`)."""
    import torch
    from torch._inductor import remote_cache

    from cuforge.adapters.common import refused, window_verdict

    for name in _CLASSES:
        if not hasattr(getattr(remote_cache, name, None), "backend_override_cls"):
            return refused(
                "torch_compile",
                f"torch {torch.__version__}: torch._inductor.remote_cache.{name} has no "
                "backend_override_cls",
            )
    return window_verdict("torch_compile", "torch", torch.__version__, SUPPORTED, _probe)


def supported() -> bool:
    """Whether cuforge can hold the installed torch's compile caches (:func:`hook_problem`)."""
    return hook_problem() is None


def _probe() -> str | None:
    """The contract, on a torch outside :data:`SUPPORTED`: the flags cuforge turns on exist,
    and a value put through torch's own ``RemoteFxGraphCache`` (its backend overridden by
    cuforge's, as :func:`enable` does) comes back from a second instance, into a throwaway
    cache dir."""
    import importlib
    import tempfile

    from torch._inductor import remote_cache

    for module, flags in _FLAGS:
        config = importlib.import_module(module)
        for flag in flags:
            if not hasattr(config, flag):
                return f"{module} has no {flag}"
    cls = remote_cache.RemoteFxGraphCache
    saved = cls.backend_override_cls, _state["cache"]
    with tempfile.TemporaryDirectory(prefix="cuforge-torch-probe-") as tmp:
        _state["cache"] = Cache(tmp, remotes=(), telemetry=False)
        cls.backend_override_cls = _factory("RemoteFxGraphCache")
        try:
            value = {"cuforge": "probe", "n": 1}
            cls("cuforge-probe").put("probe-key", value)
            if cls("cuforge-probe").get("probe-key") != value:
                return "a value put through RemoteFxGraphCache was not served back"
        finally:
            cls.backend_override_cls, _state["cache"] = saved
    return None


def enable(cache: Cache | None = None, *, triton: bool = True) -> bool:
    """Keep torch.compile's FX-graph, AOTAutograd and autotune cache values in ``cache``
    (default: :func:`cuforge.default_cache`, resolved at each lookup); ``triton``: also
    :func:`cuforge.triton.enable` the same cache. Returns False (after one warning) on an
    unsupported torch, whose own caches then stay as they are."""
    if cache is not None and not isinstance(cache, Cache):
        raise TypeError(f"cache= must be a cuforge.Cache or None, not {type(cache).__name__}")
    problem = hook_problem()
    if problem is not None:
        if not _state["warned"]:
            _state["warned"] = True
            _log.warning("cuforge: %s; torch.compile keeps its own caches", problem)
        return False
    import importlib

    from torch._inductor import remote_cache

    _state["cache"] = cache
    if _state["saved"] is None:
        saved: dict[tuple[str, str], Any] = {}
        for name in _CLASSES:
            saved[("class", name)] = getattr(remote_cache, name).backend_override_cls
        for module, flags in _FLAGS:
            config = importlib.import_module(module)
            for flag in flags:
                saved[(module, flag)] = getattr(config, flag)
        _state["saved"] = saved
    for name in _CLASSES:
        getattr(remote_cache, name).backend_override_cls = _factory(name)
    for module, flags in _FLAGS:
        config = importlib.import_module(module)
        for flag in flags:
            setattr(config, flag, True)
    _install_key_recorders()
    _pin_ptxas()
    # Inductor's C++ kernels (its CPU backend) from cuforge's tiers too
    from cuforge.torch import inductor_cpp

    inductor_cpp.install(lambda: _state["cache"] or default_cache())
    if triton:
        try:
            import cuforge.adapters.triton as _triton
        except ImportError:
            pass  # no Triton: nothing to cache there
        else:
            _triton.enable(cache)
    return True


def _pin_ptxas() -> None:
    """Make now the ptxas choice Inductor makes lazily, so that every Triton compile of the
    process (and of its compile workers) uses the same ptxas.

    Inductor points Triton at torch's own ``ptxas`` (``TRITON_PTXAS_PATH``, set by
    ``torch._inductor.runtime.compile_tasks._set_triton_ptxas_path``) only when it starts
    compiling through its async path; kernels Inductor compiles before that (during codegen
    and benchmarking) use Triton's bundled ptxas. Triton's key holds the ptxas version, so
    "machine" A stored kernels under keys that B -- loading the FX graph from the cache,
    which sets torch's ptxas first -- never asks for (seen on torch 2.11 + Triton 3.6: 2
    of 3 kernels recompiled). torch's own function makes the choice; where it is missing
    (another torch) nothing changes. A ``TRITON_PTXAS_PATH`` already set is kept."""
    try:
        from torch._inductor.runtime.compile_tasks import _set_triton_ptxas_path
    except ImportError:
        return
    try:
        _set_triton_ptxas_path()
    except Exception as exc:  # noqa: BLE001 - torch's private helper; its failure is no error
        _log.debug("cuforge: torch's _set_triton_ptxas_path failed: %s", exc)


def disable() -> None:
    """Undo :func:`enable`: torch's remote-cache classes and flags as they were."""
    saved = _state["saved"]
    if saved is None:
        return
    import importlib

    from torch._inductor import remote_cache

    for (where, name), value in saved.items():
        if where == "class":
            getattr(remote_cache, name).backend_override_cls = value
        else:
            setattr(importlib.import_module(where), name, value)
    _state["saved"] = None
    _state["cache"] = None
    from cuforge.torch import inductor_cpp

    inductor_cpp.uninstall()
    while _wrapped:
        module, name, original = _wrapped.pop()
        setattr(module, name, original)


def _install_key_recorders() -> None:
    """Wrap torch's key functions (unchanged keys) to keep their description of each key."""
    if _wrapped:
        return
    import importlib

    for module_name, name in _HASHERS:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        original = getattr(module, name, None)
        if original is None or getattr(original, "_cuforge_recorder", False):
            continue
        _wrapped.append((module, name, original))
        setattr(module, name, _recorder(original))


def _recorder(original: Any) -> Any:
    def hashed(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        try:
            key, lines = result
            if len(_recent_fields) > 1024:
                _recent_fields.clear()
            _recent_fields[str(key)] = fields_from_debug_lines(lines)
        except Exception:  # noqa: BLE001 - explain fields are best effort; the key stands
            pass
        return result

    hashed.__wrapped__ = original  # type: ignore[attr-defined]
    hashed._cuforge_recorder = True  # type: ignore[attr-defined]
    return hashed


def fields_from_debug_lines(lines: Any) -> dict[str, str]:
    """Labeled fields from torch's description of an Inductor key (``[hash] label: value``
    lines): the value where it is short, printable, on one line and holds no path or
    address, else its hash. The config flags (``inductor_config[...]``, hundreds) are one
    ``config`` digest of them all plus each flag whose value is not its default."""
    import hashlib

    fields: dict[str, str] = {}
    config = hashlib.sha256()
    for line in lines or ():
        match = _DEBUG_LINE.fullmatch(str(line))
        if match is None:
            continue
        digest, label, value = match.groups()
        label = label.strip()
        if label.startswith(_CONFIG_PREFIXES):
            config.update(f"{label}={digest};".encode())
            if _is_default(label, value):
                continue
        if (
            len(value) > _SHORT
            or not value.isprintable()
            or "/" in value
            or "\\" in value
            or _ADDRESS.search(value)
        ):
            value = f"hash {digest}"
        fields[label] = value
    if fields:
        fields["config"] = config.hexdigest()[:16]
    return fields


def _is_default(label: str, value: str) -> bool:
    """Whether a ``<config>[flag]`` line shows the flag's default value."""
    import importlib

    prefix, _, rest = label.partition("[")
    module = _CONFIG_MODULES.get(prefix)
    if module is None or not rest.endswith("]"):
        return False
    try:
        entry = importlib.import_module(module)._config.get(rest[:-1])
    except Exception:  # noqa: BLE001 - torch's private config internals: treat as changed
        return False
    return entry is not None and str(entry.default) == value


def _context_fields() -> dict[str, str]:
    """The torch and Triton versions and the CUDA arch (only when CUDA is already up)."""
    import torch

    fields = {"torch_version": torch.__version__}
    triton = sys.modules.get("triton")
    if triton is not None:
        fields["triton_version"] = str(getattr(triton, "__version__", "?"))
    try:
        if torch.cuda.is_initialized():
            major, minor = torch.cuda.get_device_capability()
            fields["cuda_arch"] = f"sm_{major}{minor}"
    except Exception:  # noqa: BLE001 - no device: no arch field
        pass
    return fields


def _explain_name(short: str) -> str:
    try:
        from torch._guards import CompileContext

        compile_id = str(CompileContext.current_compile_id() or "?")
    except Exception:  # noqa: BLE001 - torch's private API; the name falls back
        compile_id = "?"
    return f"inductor:{short}:{compile_id}"


def _factory(class_name: str):
    def make() -> Any:
        return _backend_class()(class_name)

    return make


_made: list = []


def _backend_class():
    """The backend class (built on first use: it subclasses torch's, imported lazily)."""
    if _made:
        return _made[0]
    from torch._inductor.remote_cache import RemoteCacheBackend

    class CuforgeBackend(RemoteCacheBackend):
        """Inductor's bytes by key, as cuforge entries of kind ``inductor``."""

        def __init__(self, class_name: str) -> None:
            super().__init__()
            self.class_name = class_name

        def _cache(self) -> Cache:
            cache = _state["cache"]
            return cache if cache is not None else default_cache()

        def _key(self, key: str) -> str:
            return make_key("inductor", {"cache": self.class_name, "inductor_key": key})[0]

        def _get(self, key: str) -> bytes | None:
            cache = self._cache()
            entry, tier = cache.get_with_tier(self._key(key), kind="inductor")
            if entry is None or entry.kind != "inductor":
                cache.count(f"inductor:{self.class_name}:miss")
                return None
            source = "remote" if tier and tier.startswith("remote") else tier or "disk"
            cache.count(f"inductor:{self.class_name}:{source}")
            return entry.payload

        def _put(self, key: str, data: bytes) -> None:
            cache = self._cache()
            meta = {
                "name": f"{self.class_name}:{key[:48]}",
                "backend": "inductor",
                "cache": self.class_name,
                "arch": "",
            }
            entry = Entry(self._key(key), "inductor", bytes(data), meta)
            short = _EXPLAINED.get(self.class_name)
            if short is None:
                cache.put(entry)
            else:
                # the backend's key is Inductor's with a prefix ("pt2:fx-graph-v1::<key>",
                # ":c1" after it for FX graphs)
                inductor_key = key.rsplit("::", 1)[-1].split(":", 1)[0]
                fields = dict(_recent_fields.get(inductor_key) or {})
                fields.update(_context_fields())
                fields["inductor_key"] = inductor_key
                cache.record_build(_explain_name(short), entry.key, fields, [entry])
            cache.count(f"inductor:{self.class_name}:put")

    _made.append(CuforgeBackend)
    return CuforgeBackend
