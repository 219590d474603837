"""Inductor's compiled C++ kernels (its CPU backend) from cuforge's tiers.

An FX-graph hit (:mod:`cuforge.torch.compile_cache`) gives a second machine the generated
code, not the built kernels: Inductor then runs the host C++ compiler once per kernel
(``torch._inductor.cpp_builder.CppBuilder.build``), about as long as the first machine
did (a CPU model: 217.9 s on B against A's 208.3 s). With :func:`install` (called by
``compile_cache.enable()``), each linked build is an entry of kind ``inductor-cpp`` (native
host code: an unsigned remote refuses it unless ``CUFORGE_REMOTE_NATIVE=allow``):

* **the key** is what determines the ``.so``: the compiler command with the machine's
  paths taken out (the output dir, the Inductor cache dir, torch's and Python's install
  dirs), the content of every source and ``-include`` file it names, the compiler's
  identity (its ``--version`` text), torch's version and git hash, Python's version, and
  **this CPU** (model and flags from ``/proc/cpuinfo``: Inductor builds with
  ``-march=native``, so a kernel built on one CPU model may not run on another);
* **a hit** writes the stored ``.so`` to the path Inductor asked for (atomically) and runs
  no compiler; **a miss** builds through :meth:`cuforge.Cache.begin` (one build per key
  across processes and, with leases, machines; the compile fence is asked there) and
  stores the result.

Every local build is cached: linked modules, objects, the preprocessed text of the C++
wrapper's header (which Inductor hashes) and its precompiled header. The precompiled header
is built only when a build that includes it misses (a ~150 MB file no build needs when
every kernel hits; more than a remote takes). Not cached (Inductor's own
build runs, as without cuforge): remote builds (``use_relative_path``), and a build whose
inputs cannot be read (its reason is logged once). Inductor compiles in its worker processes when
``TORCHINDUCTOR_COMPILE_THREADS`` > 1: there cuforge caches only where it is enabled too
(``CUFORGE_ENABLE`` / ``cuforge run``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING

from cuforge.base import _fs
from cuforge.core.blobcache import make_key, offline_error, pack, unpack
from cuforge.core.caching import Hit
from cuforge.store.base import Entry

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable
    from typing import Any

    from cuforge.core.caching import Cache

__all__ = ["KIND", "install", "uninstall", "key_fields"]

KIND = "inductor-cpp"
_FILE = "output"  # the one file a build writes (a .so, .o, .gch or .i)
_log = logging.getLogger("cuforge")
#: whether the wrapper caches (install() / uninstall() toggle it; the wrapper stays put so
#: that a fence wrapper installed around it keeps working)
_state: dict[str, Any] = {"active": False, "cache": None, "warned": set()}
_compilers: dict[tuple[str, int, int], str] = {}
#: precompiled headers not built yet: header path -> (builder, build, key fields)
_pending: dict[str, tuple[Any, Any, dict[str, str]]] = {}
_pending_lock = threading.Lock()
_cpu: list[str] = []


def install(cache: Callable[[], Cache]) -> bool:
    """Serve Inductor's linked C++ builds from ``cache()`` (called at each build). False
    when this torch has no ``CppBuilder.build`` to wrap (nothing changes then)."""
    try:
        from torch._inductor import cpp_builder
    except ImportError:
        return False
    builder = getattr(cpp_builder, "CppBuilder", None)
    current = getattr(builder, "build", None)
    if current is None:
        return False
    if not getattr(current, "_cuforge_cpp_cache", False):
        builder.build = _wrap(current)
    _state.update(active=True, cache=cache)
    return True


def uninstall() -> None:
    """Stop caching (Inductor's own build runs again)."""
    _state.update(active=False, cache=None)


def _wrap(original: Any) -> Any:
    def build(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not _state["active"] or args or kwargs or not _cacheable(self):
            return original(self, *args, **kwargs)
        try:
            fields = key_fields(self)
        except (OSError, ValueError) as exc:
            _say_once(f"cuforge: an Inductor C++ build is not cached ({exc}); Inductor builds it")
            return original(self)
        if getattr(self, "_precompiling", False):
            return _precompiled_header(self, original, fields)
        return _cached_build(self, original, fields)

    build.__wrapped__ = original  # type: ignore[attr-defined]
    # whether it caches now: the fence's wrapper around it leaves the fence to it then
    build._cuforge_cpp_cache = lambda: bool(_state["active"])  # type: ignore[attr-defined]
    return build


def _precompiled_header(builder: Any, original: Any, fields: dict[str, str]) -> None:
    r"""A precompiled header (``X.h.gch``, ~150 MB: more than a remote takes) is served when
    a tier has it; otherwise it is built only when a build that ``-include``\ s ``X.h``
    misses (:func:`_build_pending_headers`). Until then nothing needs it: gcc reads ``X.h``
    itself when ``X.h.gch`` is absent, and a second machine whose kernels all hit never
    runs the compiler for it."""
    cache = _state["cache"]()
    target = str(builder.get_target_file_path())
    key = make_key(KIND, fields)[0]
    if _serve(cache, key, target):
        return None
    header = target[: -len(".gch")] if target.endswith(".gch") else target
    with _pending_lock:
        _pending[header] = (builder, original, fields)
    return None


def _build_pending_headers(builder: Any) -> None:
    """Build (through the cache) the deferred precompiled headers ``builder`` includes,
    before it compiles: the miss then compiles as fast as Inductor's own build would."""
    if not _pending:
        return
    words = shlex.split(str(builder.get_command_line()))
    for i, word in enumerate(words[:-1]):
        if word != "-include":
            continue
        with _pending_lock:
            deferred = _pending.pop(words[i + 1], None)
        if deferred is not None:
            header, original, fields = deferred
            _cached_build(header, original, fields)


def _cacheable(builder: Any) -> bool:
    """Every local build (a linked module, an object, a precompiled or preprocessed header:
    each writes one target file); not remote builds (``use_relative_path``)."""
    return not getattr(builder, "_use_relative_path", False)


def _cached_build(builder: Any, original: Any, fields: dict[str, str]) -> None:
    from cuforge.core import fencing

    cache = _state["cache"]()
    target = str(builder.get_target_file_path())
    name = os.path.basename(target)
    key = make_key(KIND, fields)[0]
    got = cache.begin(
        key,
        what=f"inductor-cpp {name}",
        lookup=lambda: _serve(cache, key, target),
        offline_error=lambda: offline_error(KIND, name, key, fields, "is not in the cache"),
    )
    if type(got) is Hit:
        return None
    with got:
        _build_pending_headers(builder)  # a miss: the headers it includes, precompiled first
        token = fencing.inductor_asked.set(True)  # the fence was asked by begin()
        try:
            original(builder)
        finally:
            fencing.inductor_asked.reset(token)
        seconds = time.perf_counter() - got.started
        data = _fs.read_bytes(target)
        meta = {
            "name": name,
            "backend": "inductor",
            "compile_seconds": round(seconds, 6),
            "key_fields": fields,
            "files": {_FILE: len(data)},
        }
        got.commit(f"inductor-cpp:{name}", fields, [Entry(key, KIND, pack({_FILE: data}), meta)])
    cache.count("inductor-cpp:built")
    return None


def _serve(cache: Cache, key: str, target: str) -> bool | None:
    """Write the stored ``.so`` of ``key`` to ``target``: True, or None (absent, damaged:
    a damaged entry is deleted and built again)."""
    entry = cache.get(key, kind=KIND)
    if entry is None:
        return None
    try:
        data = unpack(entry.payload)[_FILE]
    except (KeyError, ValueError) as exc:
        cache.count("inductor-cpp:load_errors")
        _say_once(f"cuforge: a cached Inductor C++ kernel could not be read ({exc}); rebuilt")
        cache.delete(key)
        return None
    _fs.atomic_write(target, data, mode=0o755)  # Inductor loads it with ctypes / import
    cache.count("inductor-cpp:hit")
    return True


def key_fields(builder: Any) -> dict[str, str]:
    """The labeled key fields of a linked ``CppBuilder`` build (module doc)."""
    import torch

    command = str(builder.get_command_line())
    target = str(builder.get_target_file_path())
    words = shlex.split(command)
    if not words:
        raise ValueError("an empty compiler command")
    roots = _roots(os.path.dirname(target))
    fields: dict[str, str] = {}
    files: list[str] = []
    for i, word in enumerate(words):
        earlier = words[i - 1] if i else ""
        if earlier == "-include" or word.endswith((".cpp", ".cc", ".c", ".cxx", ".h", ".hpp")):
            files.append(word)
    stem = os.path.basename(target).split(".", 1)[0]
    for n, path in enumerate(files):
        name = _unnamed(_portable(path, roots), stem)
        fields[f"file{n}:{name}"] = _content_digest(path, roots)
    fields["command"] = " ".join(_unnamed(_portable(w, roots), stem) for w in words[1:])
    fields["compiler"] = _compiler_identity(words[0])
    fields["torch"] = f"{torch.__version__} {getattr(torch.version, 'git_version', '')}"
    fields["python"] = sys.version.split()[0]
    fields["cpu"] = _cpu_identity()
    import platform

    fields["libc"] = " ".join(platform.libc_ver())
    return fields


def _roots(out_dir: str) -> list[tuple[str, str]]:
    """(path, placeholder) of the machine's own dirs, longest first."""
    import sysconfig

    import torch

    found = [(out_dir, "${OUT}"), (os.path.dirname(os.path.abspath(torch.__file__)), "${TORCH}")]
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir, default_cache_dir

        found.append((cache_dir(), "${INDUCTOR}"))
        # the precompiled headers live under the default dir (per user), whatever is set
        found.append((default_cache_dir(), "${INDUCTOR_DEFAULT}"))
    except (ImportError, OSError):
        pass
    for name in ("include", "stdlib"):
        path = sysconfig.get_paths().get(name)
        if path:
            found.append((path, f"${{PYTHON_{name.upper()}}}"))
    found.append((sys.base_prefix, "${PYTHON}"))
    return sorted(((os.path.abspath(p), tag) for p, tag in found if p), key=lambda r: -len(r[0]))


#: ``#include "/abs/path"``: torch 2.6 includes its prefix header by its path in the cache dir
_ABS_INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*"(/[^"]+)"', re.MULTILINE)


def _content_digest(path: str, roots: list[tuple[str, str]], seen: set[str] | None = None) -> str:
    """The sha256 of a source file with the machine's dirs taken out of its text, and of
    every file it includes by an absolute path (torch 2.6 writes
    ``#include "<inductor cache dir>/2r/c2r...h"`` into each kernel: the same kernel on
    two machines differs only there)."""
    seen = set() if seen is None else seen
    seen.add(path)
    with open(path, "rb") as f:
        text = f.read()
    included = [m.decode(errors="surrogateescape") for m in _ABS_INCLUDE.findall(text)]
    for root, tag in roots:
        text = text.replace(root.encode(), tag.encode())
    digest = hashlib.sha256(text)
    for header in included:
        if header not in seen and os.path.isfile(header):
            digest.update(b"\0" + _content_digest(header, roots, seen).encode())
    return digest.hexdigest()


def _unnamed(word: str, stem: str) -> str:
    """A path word with the build's own file name (Inductor's hash of the source text,
    machine paths included) as ``${NAME}``: the content is in the key instead. Only path
    words: a ``-D`` that names the module keeps it."""
    if len(stem) < 16 or os.sep not in word:
        return word
    head, _, base = word.rpartition(os.sep)
    if not base.startswith(stem):
        return word
    return f"{head}{os.sep}${{NAME}}{base[len(stem) :]}"


def _portable(word: str, roots: list[tuple[str, str]]) -> str:
    for prefix in ("-I", "-L", ""):
        if not word.startswith(prefix):
            continue
        rest = word[len(prefix) :]
        for path, tag in roots:
            if rest == path or rest.startswith(path + os.sep):
                return prefix + tag + rest[len(path) :]
    return word


def _compiler_identity(compiler: str) -> str:
    """``<version text digest>``: the compiler's ``--version`` output (memoized by the
    resolved binary's stat)."""
    import shutil

    path = shutil.which(compiler) or compiler
    real = os.path.realpath(path)
    st = os.stat(real)
    memo = (real, st.st_size, st.st_mtime_ns)
    if memo not in _compilers:
        done = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=30, check=False
        )
        text = (done.stdout or done.stderr).strip()
        _compilers[memo] = (
            f"{text.splitlines()[0] if text else '?'} ({hashlib.sha256(text.encode()).hexdigest()[:16]})"
        )
    return _compilers[memo]


def _cpu_identity() -> str:
    """The CPU model and its flags (``/proc/cpuinfo``), digested: kernels built with
    ``-march=native`` are for this CPU."""
    if not _cpu:
        model = flags = ""
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                for line in f:
                    name, _, value = line.partition(":")
                    name = name.strip()
                    if name == "model name" and not model:
                        model = value.strip()
                    elif name == "flags" and not flags:
                        flags = " ".join(sorted(value.split()))
                    if model and flags:
                        break
        except OSError:
            import platform

            model = platform.processor() or platform.machine()
        _cpu.append(f"{model} ({hashlib.sha256(flags.encode()).hexdigest()[:16]})")
    return _cpu[0]


def _say_once(line: str) -> None:
    if line not in _state["warned"]:
        _state["warned"].add(line)
        _log.warning(line)
