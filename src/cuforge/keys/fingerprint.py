"""Stable fingerprints of Python objects: the part of a cache key a Python callable makes.

:func:`fingerprint` returns a SHA-256 hex digest that is the same in every process, on every
machine and in every virtual environment for objects that mean the same thing, and that
changes when anything that could change the object's behaviour changes:

* **functions** (and lambdas): the code object -- bytecode, names, constants (nested code
  objects included, recursively), argument layout and flags -- the defaults and keyword
  defaults, the values of the closure cells, the function's attributes (``f.__dict__``) and
  annotations, and every global the code (or a nested code object) loads, resolved in the
  function's globals, then builtins; recursively, with cycles (a recursive function, two
  functions calling each other, a cycle through a set) handled. File names and line
  numbers are *not* part of it: moving a function does not change its fingerprint.
  Nesting deeper than :data:`MAX_DEPTH` raises :class:`UnstableKeyError`.
* **modules** by name and the version of the distribution that installed them, when the
  module's file is one that distribution installed (its wheel's ``RECORD`` lists it and
  its contents hash to the recorded SHA-256 -- a same-size edit is not the wheel's file;
  a distribution without a ``RECORD``: the file lies under the
  ``site-packages`` directory that holds its metadata); stdlib and built-in modules by the
  Python version. Any other module (the user's own, an editable install, a checkout run
  beside an older ``pip install .`` of itself or holding a leftover ``*.egg-info``) by the
  contents of its source files, never their paths. Such a module is keyed by the source
  this process loaded: a source file edited after the module's first fingerprint, while
  the module loaded from it is still in use (not reloaded), raises
  :class:`UnstableKeyError` ("changed since it was imported") rather than key the old code
  by the new text.
* **functions, classes and other objects of an installed module** (stdlib, a wheel) that can
  be found again by ``module.qualname``: by that name plus the module's fingerprint.
* **builtins** by qualified name; **numpy** dtypes, scalar types, scalars and arrays,
  **ctypes** types and instances and :class:`struct.Struct` by their layout (and value).
* **plain data** by value: None, bool, int, float, complex, str, bytes, bytearray, tuple,
  list, dict, set, frozenset, range, slice, Ellipsis, enum members (class name and member
  name), dataclass instances (class and field values), :func:`functools.partial`, bound
  methods (function and ``__self__``), staticmethod / classmethod / property; namedtuples
  (``typing.NamedTuple`` too), :class:`types.SimpleNamespace`, ``OrderedDict``,
  ``defaultdict`` (with its ``default_factory``), ``Fraction``, ``Decimal``, subclasses of
  str and int (type and value), :func:`functools.lru_cache` wrappers (the wrapped function),
  annotations' ``list[int]`` / ``Optional[X]`` / ``TypeVar``. Classes by content, their
  metaclass included; numpy array subclasses by type too (a masked array by its mask).
  Loggers and weak references are refused, with the reason.
* anything with a ``__cuforge_fingerprint__()`` method (it returns plain data to hash), and
  any type an integration registered with :func:`register`.

Anything else raises :class:`UnstableKeyError`, naming the argument (``what``) and the path
to the offending object (``op.__globals__['table'].lock``). There is no fallback to ``id()``
or to a ``repr`` that may hold an address: a key that would differ between processes is
worse than none, and one that ignores a value serves stale code.

Known limits (documented for users): a value reached through an *attribute* of a global
(``cfg.scale`` where ``cfg`` is a module) is covered by the module's fingerprint, not by its
current value: a module attribute changed at run time is not seen.

Imports only the standard library and cuforge's layers 1-2 (no numpy, no ctypes: those are
looked at only when already imported).
"""

from __future__ import annotations

import hashlib
import opcode
import os
import struct
import sys
import types
from typing import TYPE_CHECKING

from cuforge.base.errors import CuforgeError
from cuforge.toolchain import installed as _installed
from cuforge.toolchain import memo as _memo
from cuforge.toolchain.installed import (
    distributions_of,
    installed_version,
    installed_versions,
)

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

__all__ = [
    "UnstableKeyError",
    "fingerprint",
    "register",
    "module_fingerprint",
    "FORMAT_VERSION",
    "UNHANDLED",
    "distributions_of",
    "installed_version",
    "installed_versions",
]

#: What a ``hook`` passed to :func:`fingerprint` returns for an object it leaves to the
#: default rules.
UNHANDLED = object()

#: Bump when the encoding or what is hashed changes: every old fingerprint then differs.
FORMAT_VERSION = 2

#: how deep :func:`fingerprint` follows nested objects before it gives up (an UnstableKeyError,
#: never a RecursionError: the integrations catch the former and run uncached)
MAX_DEPTH = 200

#: the most bytes of local (not installed) module sources hashed for one module
MAX_MODULE_SOURCE_BYTES = 64 << 20
MAX_MODULE_SOURCE_FILES = 4000


class UnstableKeyError(CuforgeError, TypeError):
    """An argument holds something that cannot be keyed the same way in every process.

    ``what`` names the argument (``"op"``, ``"d_in"``), ``path`` the object inside it
    (``op.__globals__['lock']``), ``reason`` why it cannot be keyed."""

    def __init__(self, what: str, path: str, reason: str) -> None:
        self.what = what
        self.path = path
        self.reason = reason
        where = path if path == what else f"{path} (inside {what})"
        super().__init__(
            f"cannot make a stable cache key for {where}: {reason}. Pass plain data "
            "(numbers, strings, tuples, dataclasses, enums, numpy dtypes), functions, or "
            "objects with a __cuforge_fingerprint__() method returning plain data."
        )


_U64 = struct.Struct(">Q").pack
_registry: dict[type, Callable[[Any], Any]] = {}
# module name -> (stat signature or None, fingerprint)
_module_cache: dict[str, tuple[Any, str]] = {}
# code object -> (global names it loads, nested code objects); code objects are immutable
_code_globals: dict[types.CodeType, tuple[str, ...]] = {}


def register(cls: type, fn: Callable[[Any], Any]) -> None:
    """Hash instances of ``cls`` (and its subclasses) as the plain data ``fn(obj)`` returns.

    For integrations whose objects carry their meaning in a few fields (an iterator's value
    type and state, a struct type's fields)."""
    _registry[cls] = fn


def fingerprint(
    obj: Any,
    *,
    what: str,
    hook: Callable[[Any], Any] | None = None,
    instances: bool = False,
) -> str:
    """The stable SHA-256 hex digest of ``obj`` (see the module doc for what is hashed).

    ``what`` names the argument in errors. ``hook`` (optional) is asked first about every
    non-scalar object met on the way: it returns plain data to hash in the object's place,
    or :data:`UNHANDLED`. ``instances=True``: an instance of a class defined in Python
    (every class of its MRO but ``object`` a Python class, no C-level storage: not a
    tensor, a lock, an extension object) that no other rule covers is keyed by its class
    (by content) and its state -- its ``__dict__`` and ``__slots__`` values, recursively by
    the same rules; a slot that is not set is keyed as unset. Raises
    :class:`UnstableKeyError` when ``obj`` holds anything that cannot be keyed the same way
    in every process."""
    hasher = _Hasher(what, hook, instances=instances)
    try:
        hasher.feed(obj, what)
    except RecursionError:
        raise hasher._fail(
            hasher._last,
            "it is nested too deeply to follow (Python's recursion limit was reached)",
        ) from None
    finally:
        if _memo_pending:
            _flush_memo()
    return hasher.hexdigest()


def module_fingerprint(module: types.ModuleType) -> str:
    """What identifies ``module``: ``"name dist==version ..."`` for an installed module,
    ``"name python-X.Y"`` for stdlib / built-in modules, ``"name sha256:<sources>"`` for a
    module no distribution installs. Raises :class:`UnstableKeyError` when a local module's
    sources cannot be read."""
    name = module.__name__
    top = name.partition(".")[0]
    if top in sys.builtin_module_names or top in getattr(sys, "stdlib_module_names", ()):
        return f"{name} python-{sys.version_info[0]}.{sys.version_info[1]}"
    installed = _installed_key(module)
    if installed is not None:
        return installed
    if not isinstance(getattr(module, "__file__", None), str):
        inside = _compiled_submodule_key(module)
        if inside is not None:
            return inside
    return _local_module_fingerprint(module)


def _compiled_submodule_key(module: types.ModuleType) -> str | None:
    """``"name in <installed key of its extension>"`` for a module a compiled extension made
    (a nanobind / pybind11 submodule such as the CuTe DSL's
    ``cutlass._mlir._mlir_libs._cutlass_ir._mlir.ir``: no ``__file__``, no ``__path__``)
    when the nearest enclosing module that has a file is that extension (a ``.so`` /
    ``.pyd``) and an installed distribution's: its classes (``ir.Value``, ``ir.Location``)
    are that distribution's, keyed by its version. None otherwise (the caller refuses it)."""
    if getattr(module, "__path__", None) is not None:
        return None  # a namespace package: directories, not an extension's submodule
    name = module.__name__
    parent = name.rpartition(".")[0]
    while parent:
        owner = sys.modules.get(parent)
        file = getattr(owner, "__file__", None) if owner is not None else None
        if isinstance(file, str):
            if not file.endswith((".so", ".pyd")):
                return None
            installed = _installed_key(owner)
            return None if installed is None else f"{name} in {installed}"
        parent = parent.rpartition(".")[0]
    return None


def _installed_key(module: types.ModuleType) -> str | None:
    """``"name dist==version ..."`` when ``module``'s file is one its distributions installed
    (listed in the wheel's ``RECORD`` with its current contents; for a distribution with no
    ``RECORD``, under the ``site-packages`` directory that holds its metadata), else None:
    the module then is the user's (a checkout beside an older ``pip install .``, a leftover
    ``*.egg-info``) and is keyed by its source."""
    name = module.__name__
    cached = _module_cache.get(name)
    if cached is not None and cached[0] is None:
        return cached[1]
    if name in _not_installed:
        return None
    remembered = _remembered_installed(module)
    if remembered is not None:
        if remembered == _NOT_INSTALLED:
            _not_installed.add(name)
            return None
        _module_cache[name] = (None, remembered)
        return remembered
    versions = []
    infos = []
    for dist in sorted(set(distributions_of(module))):
        if _installed.editable(dist) or not _installed_from(dist, module):
            continue
        version = installed_version(dist)
        if version is not None:
            versions.append(f"{dist}=={version}")
            infos.append(_installed.info_path(dist))
    if not versions:
        _not_installed.add(name)
        _remember_installed(module, _NOT_INSTALLED, [])
        return None
    result = f"{name} " + " ".join(versions)
    _module_cache[name] = (None, result)
    _remember_installed(module, result, infos)
    return result


# A fresh process keys an installed module without finding its distribution again: the
# answer of _installed_key is kept in cuforge's toolchain memo under the stat (size, mtime,
# ctime, inode) of the module's file, with the stat of each RECORD that vouched for it (pip
# rewrites a RECORD on every install, upgrade, reinstall or uninstall of its wheel, and a
# RECORD fixes each file it installed by size and SHA-256; an edit of the file changes its
# ctime, so the answer, from its hashed contents, is found again). Only answers backed by RECORDs
# are kept; none is kept when file caching is off. "No distribution installed it" (your own
# module) is kept under the stat of the module's file and of every sys.path directory that
# holds distributions (installing or removing one changes its directory), for this sys.path.
_MEMO_KIND = "installed-module"
_NOT_INSTALLED = "-"
_memo_pending: dict[str, tuple[list[int], dict]] = {}


#: a file's [size, mtime_ns, ctime_ns, inode]: ctime, which ``touch -r`` / ``cp -p`` cannot
#: put back, makes a same-size edit with its mtime restored a new key
_file_sig = _installed.stat_key
_file_memo_on = _installed.file_memo_on


def _remembered_installed(module: types.ModuleType) -> str | None:
    file = getattr(module, "__file__", None)
    if not isinstance(file, str) or not _file_memo_on():
        return None
    sig = _file_sig(file)
    if sig is None:
        return None
    with _memo.lock:
        memo = _memo.load()
        data = _memo.probed(memo, _MEMO_KIND, _memo_where(module, file), sig)
        if data is None:
            data = _memo.probed(memo, _MEMO_KIND, _memo_where(module, file, sys.path), sig)
    if data is None:
        return None
    key, records = data.get("key"), data.get("records")
    if key == _NOT_INSTALLED:
        dirs = data.get("dirs")
        if not isinstance(dirs, list) or not dirs:
            return None
        for item in dirs:
            if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)):
                return None
            if _memo.file_stat_key(item[0]) != item[1]:
                return None
        return key
    if not isinstance(key, str) or not isinstance(records, list) or not records:
        return None
    for item in records:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)):
            return None
        if _file_sig(item[0]) != item[1]:
            return None
    return key


def _remember_installed(module: types.ModuleType, result: str, infos: list) -> None:
    file = getattr(module, "__file__", None)
    if not isinstance(file, str) or not _file_memo_on():
        return
    sig = _file_sig(file)
    records = []
    if result == _NOT_INSTALLED:
        dirs = [[d, _memo.file_stat_key(d)] for d in _installed.info_dirs()]
        if sig is not None and dirs and all(st is not None for _d, st in dirs):
            where = _memo_where(module, file, sys.path)
            _memo_pending[where] = (sig, {"key": result, "dirs": dirs})
        return
    for info in infos:
        if not (isinstance(info, str) and info.endswith(".dist-info")):
            return  # an egg-info has no RECORD to vouch for the file
        record = os.path.join(info, "RECORD")
        stat = _file_sig(record)
        if stat is None:
            return
        records.append([record, stat])
    if sig is not None:
        _memo_pending[_memo_where(module, file)] = (sig, {"key": result, "records": records})


def _memo_where(module: types.ModuleType, file: str, path: list[str] | None = None) -> str:
    """The memo entry's name: the module and its file; for "not installed", also (a digest
    of) ``path``, the ``sys.path`` it was found on (which directories hold distributions)."""
    if path is None:
        return f"{module.__name__}|{file}"
    digest = hashlib.sha256("\0".join(path).encode("utf-8", "surrogateescape"))
    return f"{module.__name__}|{file}|{digest.hexdigest()[:16]}"


def _flush_memo() -> None:
    """Write the installed-module answers learned since the last flush (one memo write)."""
    if not _memo_pending:
        return
    with _memo.lock:
        pending = dict(_memo_pending)
        _memo_pending.clear()
        memo = _memo.load()
        for where, (sig, data) in pending.items():
            _memo.remember(memo, _MEMO_KIND, where, sig, data)
        _memo.save(memo)


_not_installed: set[str] = set()  # module names whose files no distribution installed


def _installed_from(dist: str, module: types.ModuleType) -> bool:
    """Whether ``dist`` installed ``module``'s file as it is now: its wheel's ``RECORD``
    lists it and its contents hash to the recorded SHA-256 (a same-size edit is not the
    wheel's file); a distribution with no ``RECORD`` (an egg-info): the file lies under the
    site-packages dir that holds its metadata. A namespace package: its directories."""
    info = _installed.info_path(dist)
    if info is None:
        return False
    root = os.path.dirname(info)
    file = getattr(module, "__file__", None)
    if not isinstance(file, str):  # a namespace package: directories only, which no RECORD lists
        paths = [p for p in getattr(module, "__path__", None) or () if isinstance(p, str)]
        if not paths:
            return False
        return all(_under(p, root) for p in paths) and _installed.site_dir(root)
    real = os.path.realpath(file)
    table = _installed.record(info) if info.endswith(".dist-info") else {}
    if not table:  # no RECORD (an egg-info): under the site-packages dir that holds it
        return _installed.site_dir(root) and _under(real, os.path.realpath(root))
    rel = os.path.relpath(real, os.path.realpath(root)).replace(os.sep, "/")
    # hashed once per module file version in this process (a .py: microseconds); a fresh
    # process reads the answer from the memo above, under the file's stat with its ctime
    return _installed.matches_record(real, info, rel, persist=False)


def _under(path: str, root: str) -> bool:
    rel = os.path.relpath(os.path.abspath(path), os.path.abspath(root))
    return rel != ".." and not rel.startswith(".." + os.sep)


def _local_module_fingerprint(module: types.ModuleType) -> str:
    name = module.__name__
    what = f"module {name}"
    file = getattr(module, "__file__", None)
    path = getattr(module, "__path__", None)
    roots: list[str] = []
    if isinstance(file, str):
        if path:
            roots.append(os.path.dirname(file))
    else:
        # a namespace package (a checkout on sys.path with no __init__.py): the .py files
        # under each of its directories, by content
        roots = sorted({p for p in path or () if isinstance(p, str) and os.path.isdir(p)})
        if not roots:
            raise UnstableKeyError(
                what,
                what,
                "it belongs to no installed distribution and has no source file to hash",
            )
    files: list[tuple[str, str]] = []
    if roots:  # a package: every .py file under it (its submodules may be reached by attribute)
        for n, root in enumerate(roots):
            prefix = "" if len(roots) == 1 else f"{n}:"
            for dirpath, subdirs, filenames in os.walk(root):
                subdirs[:] = sorted(
                    d for d in subdirs if d != "__pycache__" and not d.startswith(".")
                )
                for f in sorted(filenames):
                    if f.endswith(".py"):
                        full = os.path.join(dirpath, f)
                        files.append((prefix + os.path.relpath(full, root), full))
    else:
        assert isinstance(file, str)
        files.append((os.path.basename(file), file))
    if len(files) > MAX_MODULE_SOURCE_FILES:
        raise UnstableKeyError(
            what, what, f"it is not installed and has over {MAX_MODULE_SOURCE_FILES} source files"
        )
    sig = []
    for _, full in files:
        try:
            st = os.stat(full)
        except OSError as exc:
            raise UnstableKeyError(what, what, f"its source {full} cannot be read ({exc})") from exc
        sig.append((full, st.st_mtime_ns, st.st_size, st.st_ino))
    cached = _module_cache.get(name)
    if cached is not None and cached[0] == sig:
        return cached[1]
    h = hashlib.sha256()
    total = 0
    for rel, full in files:
        try:
            with open(full, "rb") as f:
                data = f.read(MAX_MODULE_SOURCE_BYTES + 1)
        except OSError as exc:
            raise UnstableKeyError(what, what, f"its source {full} cannot be read ({exc})") from exc
        total += len(data)
        if total > MAX_MODULE_SOURCE_BYTES:
            raise UnstableKeyError(
                what,
                what,
                f"it is not installed and its sources exceed {MAX_MODULE_SOURCE_BYTES} bytes",
            )
        h.update(_enc(rel) + _U64(len(data)) + data)
    result = f"{name} sha256:{h.hexdigest()}"
    if cached is not None and cached[1] != result:
        stale = _stale_source(name, cached[0], sig)
        if stale is not None:
            raise UnstableKeyError(
                what,
                what,
                f"its source {stale} changed since it was imported: this process runs the "
                "code it loaded, not the new text, so the call is not cached (a new process, "
                "or importlib.reload, keys the new text)",
            )
    _module_cache[name] = (sig, result)
    _loaded_specs[name] = _specs_loaded_from(name)
    return result


# local module name -> {source file: the __spec__ of the module loaded from it} at the time
# its fingerprint was first taken (or last taken after a reload): the baseline an edit of
# the file while the process runs is told from
_loaded_specs: dict[str, dict[str, Any]] = {}


def _specs_loaded_from(name: str) -> dict[str, Any]:
    """Source file -> ``__spec__`` of ``name`` and its submodules loaded now."""
    found: dict[str, Any] = {}
    prefix = name + "."
    for modname, mod in list(sys.modules.items()):
        if modname == name or modname.startswith(prefix):
            file = getattr(mod, "__file__", None)
            if isinstance(file, str):
                found[os.path.abspath(file)] = getattr(mod, "__spec__", None)
    return found


def _stale_source(name: str, old_sig: Any, new_sig: list) -> str | None:
    """The first source file of local module ``name`` that changed (or appeared, or went)
    since its fingerprint was first taken while a module loaded from it, not reloaded
    since, is still in use; None when every change is one this process will read (a file
    not imported yet, or a module reloaded since)."""
    before = {entry[0]: entry[1:] for entry in old_sig or ()}
    after = {entry[0]: entry[1:] for entry in new_sig}
    changed = sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))
    baseline = _loaded_specs.get(name, {})
    now = _specs_loaded_from(name)
    for path in changed:
        key = os.path.abspath(path)
        if key not in now:
            continue  # not imported: an import reads the new text
        old_spec = baseline.get(key)
        if old_spec is not None and now[key] is not old_spec:
            continue  # reloaded since the baseline
        return path
    return None


def _enc(text: str) -> bytes:
    raw = text.encode("utf-8", "surrogatepass")
    return _U64(len(raw)) + raw


_GLOBAL_OPS = frozenset({"LOAD_GLOBAL", "STORE_GLOBAL", "DELETE_GLOBAL", "LOAD_NAME"})


def attribute_names(code: types.CodeType) -> frozenset[str]:
    """Every name in ``code``'s ``co_names`` and those of the code objects nested in it (the
    attributes it may read off a module it names)."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= attribute_names(const)
    return frozenset(names)


_MISSING = object()
_PLAIN = (int, float, complex, str, bytes, bool, type(None))


def _is_plain(value: object) -> bool:
    """Plain data (numbers, text, None, and tuples / frozensets of them): the values a
    module attribute holds when code reads it as a setting."""
    if type(value) in _PLAIN:
        return True
    if type(value) in (tuple, frozenset):
        return all(_is_plain(v) for v in value)
    return False


def _global_names(code: types.CodeType) -> tuple[str, ...]:
    """The global names ``code`` and the code objects nested in it load, in first-use order."""
    found = _code_globals.get(code)
    if found is not None:
        return found
    # the raw bytecode, not dis.get_instructions: measured 2,024 instructions of a CuTe GEMM
    # at ~21 ms through dis against ~1 ms here (a fresh process's cache hit recomputes this)

    ops = {opcode.opmap[n] for n in _GLOBAL_OPS if n in opcode.opmap}
    load_global = opcode.opmap["LOAD_GLOBAL"]
    shifted = sys.version_info >= (3, 11)  # LOAD_GLOBAL's arg is (index << 1) | push_null
    extended = opcode.EXTENDED_ARG
    raw, ext = code.co_code, 0  # co_code: the code as compiled (no specialized opcodes)
    names: dict[str, None] = {}
    for i in range(0, len(raw), 2):
        op, arg = raw[i], raw[i + 1] | ext
        if op == extended:
            ext = arg << 8
            continue
        ext = 0
        if op in ops:
            names[code.co_names[arg >> 1 if op == load_global and shifted else arg]] = None
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            for n in _global_names(const):
                names[n] = None
    found = tuple(names)
    _code_globals[code] = found
    return found


def _resolvable(obj: Any) -> types.ModuleType | None:
    """The installed (not local) module that names ``obj`` as ``module.qualname``, or None."""
    modname = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if not isinstance(modname, str) or not isinstance(qualname, str) or "<locals>" in qualname:
        return None
    module = sys.modules.get(modname)
    if module is None:
        return None
    target: Any = module
    for part in qualname.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            return None
    if target is not obj:
        return None
    top = modname.partition(".")[0]
    if top in sys.builtin_module_names or top in getattr(sys, "stdlib_module_names", ()):
        return module
    if modname == "__main__":
        return None
    if _installed_key(module) is None and (
        isinstance(getattr(module, "__file__", None), str)
        or _compiled_submodule_key(module) is None
    ):
        return None
    return module


class _Hasher:
    __slots__ = ("_h", "_hook", "_instances", "_keep", "_last", "_seen", "_stack", "_what")

    def __init__(
        self,
        what: str,
        hook: Callable[[Any], Any] | None = None,
        stack: dict[int, int] | None = None,
        *,
        instances: bool = False,
    ) -> None:
        self._what = what
        self._hook = hook
        self._instances = instances
        # id -> depth of every object being hashed now (shared with the hashers of set
        # items, which start afresh: a set item that refers back to an object being hashed
        # is keyed by that object's depth, so a cycle through a set ends)
        self._stack: dict[int, int] = {} if stack is None else stack
        self._last = what  # the path of the object met last (for a RecursionError)
        self._h = hashlib.sha256(b"cuforge-pyhash" + _U64(FORMAT_VERSION))
        # id -> visit index, for cycles only: what is hashed is the index, never the id;
        # every object in here is alive for the whole call (reachable from the root)
        self._seen: dict[int, int] = {}
        self._keep: list[Any] = []  # keeps temporaries alive, so no id is reused mid-call

    def hexdigest(self) -> str:
        return self._h.hexdigest()

    def _tag(self, tag: str) -> None:
        self._h.update(_enc(tag))

    def _str(self, text: str) -> None:
        self._h.update(_enc(text))

    def _bytes(self, data: bytes) -> None:
        self._h.update(_U64(len(data)) + data)

    def _fail(self, path: str, reason: str) -> UnstableKeyError:
        return UnstableKeyError(self._what, path, reason)

    def _sub_digest(self, obj: Any, path: str) -> str:
        """The digest of ``obj`` on its own (a set item: the set's key sorts them)."""
        sub = _Hasher(self._what, self._hook, self._stack, instances=self._instances)
        try:
            sub.feed(obj, path)
        finally:
            self._last = sub._last
        return sub.hexdigest()

    def feed(self, obj: Any, path: str) -> None:
        t = type(obj)
        # scalars first: the common case, and never cyclic
        if obj is None or obj is Ellipsis or obj is NotImplemented:
            self._tag(repr(obj))
            return
        if t is bool:
            self._tag("bool:" + ("1" if obj else "0"))
            return
        if t is int:
            self._tag("int")
            self._str(str(obj))
            return
        if t is float:
            self._tag("float")
            self._str(obj.hex())
            return
        if t is str:
            self._tag("str")
            self._str(obj)
            return
        if t is bytes:
            self._tag("bytes")
            self._bytes(obj)
            return
        if t is complex:
            self._tag("complex")
            self._str(obj.real.hex() + " " + obj.imag.hex())
            return
        key = id(obj)
        index = self._seen.get(key)
        if index is not None:
            self._tag("ref")
            self._str(str(index))
            return
        stack = self._stack
        depth = stack.get(key)
        if depth is not None:  # met again inside a set item's own hasher
            self._tag("up")
            self._str(str(depth))
            return
        depth = len(stack)
        self._last = path
        if depth >= MAX_DEPTH:
            raise self._fail(path, f"it is nested more than {MAX_DEPTH} levels deep")
        self._seen[key] = len(self._seen)
        self._keep.append(obj)
        stack[key] = depth
        try:
            self._feed_object(obj, t, path)
        finally:
            del stack[key]

    def _feed_object(self, obj: Any, t: type, path: str) -> None:
        if self._hook is not None:
            replaced = self._hook(obj)
            if replaced is not UNHANDLED:
                self._tag("hooked:" + _type_name(t))
                self.feed(replaced, f"{path}<{_type_name(t)}>")
                return
        custom = getattr(t, "__cuforge_fingerprint__", None)
        if custom is not None and not isinstance(obj, type):
            self._tag("custom:" + _type_name(t))
            self.feed(obj.__cuforge_fingerprint__(), f"{path}.__cuforge_fingerprint__()")
            return
        for cls in t.__mro__:
            fn = _registry.get(cls)
            if fn is not None:
                self._tag("registered:" + _type_name(t))
                self.feed(fn(obj), f"{path}<{_type_name(t)}>")
                return
        if t in (tuple, list):
            self._tag(t.__name__)
            self._str(str(len(obj)))
            for i, item in enumerate(obj):
                self.feed(item, f"{path}[{i}]")
            return
        if t is dict:
            self._tag("dict")
            self._items(obj, path)
            return
        if t in (set, frozenset):
            self._tag(t.__name__)
            digests = sorted(self._sub_digest(item, f"{path} item") for item in obj)
            self._str(" ".join(digests))
            return
        if t is bytearray:
            self._tag("bytearray")
            self._bytes(bytes(obj))
            return
        if t is range:
            self._tag(f"range {obj.start} {obj.stop} {obj.step}")
            return
        if t is slice:
            self._tag("slice")
            self.feed((obj.start, obj.stop, obj.step), f"{path}.slice")
            return
        if t is types.FunctionType:
            self._function(obj, path)
            return
        if t is types.CodeType:
            self._code(obj, path)
            return
        if t is types.ModuleType:
            self._tag("module")
            try:
                self._str(module_fingerprint(obj))
            except UnstableKeyError as exc:
                raise self._fail(path, exc.reason) from None
            return
        if t is types.MethodType:
            self._tag("method")
            self.feed(obj.__func__, f"{path}.__func__")
            self.feed(obj.__self__, f"{path}.__self__")
            return
        if t in (staticmethod, classmethod):
            self._tag(t.__name__)
            self.feed(obj.__func__, f"{path}.__func__")
            return
        if t is property:
            self._tag("property")
            for part in ("fget", "fset", "fdel"):
                self.feed(getattr(obj, part), f"{path}.{part}")
            return
        if t is types.CellType:
            self._cell(obj, path)
            return
        if t in (types.MemberDescriptorType, types.GetSetDescriptorType):
            self._tag("descriptor:" + obj.__qualname__)
            return
        if t in (
            types.BuiltinFunctionType,
            types.WrapperDescriptorType,
            types.MethodDescriptorType,
        ):
            self._builtin(obj, path)
            return
        if "numpy" in sys.modules and self._numpy(obj, t, path):
            return
        if "ctypes" in sys.modules and self._ctypes(obj, t, path):
            return
        if isinstance(obj, struct.Struct):
            self._tag("struct.Struct")
            self._str(obj.format)
            return
        if "enum" in sys.modules and isinstance(obj, sys.modules["enum"].Enum):
            self._tag("enum")
            self.feed(t, f"{path}.__class__")
            self._str(obj.name)
            return
        if isinstance(obj, type):
            self._class(obj, path)
            return
        if "functools" in sys.modules and t is sys.modules["functools"].partial:
            self._tag("partial")
            self.feed(obj.func, f"{path}.func")
            self.feed(obj.args, f"{path}.args")
            self.feed(obj.keywords, f"{path}.keywords")
            return
        if self._stdlib_value(obj, t, path):
            return
        fields = getattr(t, "__dataclass_fields__", None)
        if isinstance(fields, dict):
            self._tag("dataclass")
            self.feed(t, f"{path}.__class__")
            for name in fields:  # every field, compared or not: all may change behaviour
                self._str(name)
                self.feed(getattr(obj, name), f"{path}.{name}")
            return
        if _resolvable(obj) is not None:  # e.g. a numpy ufunc, an installed singleton
            self._tag("named")
            self._named(obj)
            return
        if self._instances and _python_instance(t):
            self._instance_state(obj, t, path)
            return
        raise self._fail(
            path,
            f"it is a {_type_name(t)}, which has no stable value (it would be keyed by address)",
        )

    def _instance_state(self, obj: Any, t: type, path: str) -> None:
        """``instances=True``: the class (by content) and every ``__slots__`` and
        ``__dict__`` value (see :func:`fingerprint`)."""
        self._tag("instance")
        self.feed(t, f"{path}.__class__")
        for cls in t.__mro__:
            slots = cls.__dict__.get("__slots__", ())
            for name in (slots,) if isinstance(slots, str) else slots:
                if name in ("__dict__", "__weakref__"):
                    continue
                stored = name
                if name.startswith("__") and not name.endswith("__"):
                    stored = f"_{cls.__name__.lstrip('_')}{name}"  # a mangled private slot
                self._str(f"slot {cls.__qualname__}.{stored}")
                try:
                    value = object.__getattribute__(obj, stored)
                except AttributeError:
                    self._tag("unset")
                    continue
                self.feed(value, f"{path}.{stored}")
        attrs = getattr(obj, "__dict__", None)
        self._tag("attrs")
        self._attrs(attrs if isinstance(attrs, dict) else {}, path)

    def _items(self, obj: Any, path: str) -> None:
        self._str(str(len(obj)))
        for k, v in obj.items():  # insertion order: it is part of the value
            self.feed(k, f"{path} key {k!r}" if _plain_repr(k) else f"{path} key")
            self.feed(v, f"{path}[{k!r}]" if _plain_repr(k) else f"{path}[...]")

    def _attrs(self, attrs: dict, path: str) -> None:
        """An object's ``__dict__``, in name order (the order they were set in is not
        part of the value)."""
        names = sorted(attrs, key=lambda k: (type(k).__name__, str(k)))
        self._str(str(len(names)))
        for name in names:
            self.feed(name, f"{path} attribute")
            self.feed(attrs[name], f"{path}.{name}")

    def _instance_dict(self, obj: Any, path: str) -> None:
        attrs = getattr(obj, "__dict__", None)
        if attrs:
            self._tag("attrs")
            self._attrs(attrs, path)

    def _stdlib_value(self, obj: Any, t: type, path: str) -> bool:
        """The standard library's value types (and subclasses of str and int), by value;
        False for anything else. Refuses loggers and weak references, with the reason."""
        mods = sys.modules
        if isinstance(obj, tuple) and isinstance(getattr(t, "_fields", None), tuple):
            self._tag("namedtuple")  # collections.namedtuple and typing.NamedTuple
            self.feed(t, f"{path}.__class__")
            self._str(str(len(obj)))
            for i, item in enumerate(obj):
                self.feed(item, f"{path}[{i}]")
            self._instance_dict(obj, path)
            return True
        if t is types.SimpleNamespace:
            self._tag("SimpleNamespace")
            self._attrs(vars(obj), path)
            return True
        if isinstance(obj, (str, int)):  # a subclass: the exact types never get here
            self._tag("str-subclass" if isinstance(obj, str) else "int-subclass")
            self.feed(t, f"{path}.__class__")
            self._str(str.__str__(obj) if isinstance(obj, str) else int.__repr__(obj))
            self._instance_dict(obj, path)
            return True
        collections = mods.get("collections")
        if collections is not None:
            if t is collections.OrderedDict:
                self._tag("OrderedDict")
                self._items(obj, path)
                return True
            if t is collections.defaultdict:
                self._tag("defaultdict")
                self.feed(obj.default_factory, f"{path}.default_factory")
                self._items(obj, path)
                return True
            if t is getattr(collections, "_tuplegetter", None):  # a namedtuple's field
                self._tag("tuplegetter")
                self.feed(obj.__reduce__()[1], path)
                return True
        fractions = mods.get("fractions")
        if fractions is not None and t is fractions.Fraction:
            self._tag("Fraction")
            self._str(f"{obj.numerator}/{obj.denominator}")
            return True
        decimal = mods.get("decimal")
        if decimal is not None and t is decimal.Decimal:
            self._tag("Decimal")
            self._str(str(obj))  # keeps the exponent: 1.0 and 1.00 differ
            return True
        functools = mods.get("functools")
        if functools is not None and t is getattr(functools, "_lru_cache_wrapper", None):
            self._tag("lru_cache")
            self.feed(obj.__wrapped__, f"{path}.__wrapped__")
            self.feed(obj.cache_parameters(), f"{path}.cache_parameters()")
            return True
        if t is types.GenericAlias or t is types.UnionType or t.__module__ == "typing":
            origin = getattr(obj, "__origin__", None)
            args = getattr(obj, "__args__", None)
            if origin is not None and isinstance(args, tuple):  # list[int], Optional[X]
                self._tag("generic")
                self.feed(origin, f"{path}.__origin__")
                self.feed(args, f"{path}.__args__")
                return True
            if t is types.UnionType:
                self._tag("union")
                self.feed(obj.__args__, f"{path}.__args__")
                return True
            if type(obj).__name__ == "TypeVar":  # its bound and constraints are not in its repr
                self._tag("TypeVar")
                self._str(obj.__name__)
                self.feed(
                    (obj.__bound__, obj.__constraints__, obj.__covariant__, obj.__contravariant__),
                    f"{path}<TypeVar>",
                )
                return True
            text = repr(obj)  # typing.Any, ForwardRef('X'): no address in them
            if " at 0x" not in text:
                self._tag("typing")
                self._str(text)
                return True
        logging = mods.get("logging")
        if logging is not None and isinstance(obj, (logging.Logger, logging.LoggerAdapter)):
            raise self._fail(
                path,
                "it is a logging.Logger, whose level, handlers and filters are process "
                "state, not a value; keep loggers out of what is keyed (log outside the "
                "function, or pass in the values it decides on)",
            )
        weakref = mods.get("weakref")
        if weakref is not None and isinstance(
            obj, (weakref.ref, weakref.ProxyType, weakref.CallableProxyType)
        ):
            raise self._fail(
                path,
                "it is a weak reference, whose target may be gone or differ in another "
                "process; pass the object itself",
            )
        return False

    def _named(self, obj: Any) -> None:
        module = _resolvable(obj)
        assert module is not None
        qualname = getattr(obj, "__qualname__", None) or obj.__name__
        self._str(f"{module_fingerprint(module)}:{qualname}")

    def _function(self, fn: types.FunctionType, path: str) -> None:
        if _resolvable(fn) is not None:
            self._tag("function:named")
            self._named(fn)
            return
        self._tag("function")
        self._str(fn.__qualname__)
        self._code(fn.__code__, f"{path}.__code__")
        self.feed(fn.__defaults__, f"{path}.__defaults__")
        self.feed(fn.__kwdefaults__, f"{path}.__kwdefaults__")
        if fn.__dict__:  # attributes set on the function: trace-time code may read them
            self._tag("attrs")
            self._attrs(fn.__dict__, f"{path}.__dict__")
        annotations = fn.__annotations__
        if annotations:
            self._tag("annotations")
            self.feed(annotations, f"{path}.__annotations__")
        closure = fn.__closure__ or ()
        self._str(str(len(closure)))
        for name, cell in zip(fn.__code__.co_freevars, closure, strict=False):
            self._cell(cell, f"{path}.<closure {name}>")
        names = _global_names(fn.__code__)
        glb = fn.__globals__
        builtins = glb.get("__builtins__", __builtins__)
        if isinstance(builtins, types.ModuleType):
            builtins = builtins.__dict__
        self._str(str(len(names)))
        for name in names:
            self._str(name)
            if name in glb:
                self._tag("global")
                value = glb[name]
                self.feed(value, f"{path}.__globals__[{name!r}]")
                if isinstance(value, types.ModuleType):
                    self._module_values(value, fn.__code__, f"{path}.__globals__[{name!r}]")
            elif isinstance(builtins, dict) and name in builtins:
                self._tag("builtin")
                self.feed(builtins[name], f"{path}.<builtin {name}>")
            else:
                self._tag("unbound")

    def _module_values(self, module: types.ModuleType, code: types.CodeType, path: str) -> None:
        """The current values of ``module``'s plain-data attributes that ``code`` may read
        (``cfg.TILE``): a module is keyed by its version or source, but code can change its
        attributes at run time (``cfg.TILE = 256`` before a compile)."""
        found = []
        for attr in sorted(attribute_names(code)):
            value = module.__dict__.get(attr, _MISSING)
            if value is not _MISSING and _is_plain(value):
                found.append((attr, value))
        if found:
            self._tag("module-values")
            for attr, value in found:
                self._str(attr)
                self.feed(value, f"{path}.{attr}")

    def _cell(self, cell: types.CellType, path: str) -> None:
        try:
            value = cell.cell_contents
        except ValueError:
            self._tag("cell:empty")
            return
        self._tag("cell")
        self.feed(value, path)

    def _code(self, code: types.CodeType, path: str) -> None:
        self._tag("code")
        self._str(code.co_name)
        self._str(
            f"{code.co_argcount} {code.co_posonlyargcount} {code.co_kwonlyargcount} "
            f"{code.co_nlocals} {code.co_flags}"
        )
        self._bytes(code.co_code)
        for names in (code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars):
            self._str(" ".join(names))
        self._str(str(len(code.co_consts)))
        for i, const in enumerate(code.co_consts):
            self.feed(const, f"{path}.co_consts[{i}]")

    def _builtin(self, obj: Any, path: str) -> None:
        owner = getattr(obj, "__self__", None)
        if owner is None or isinstance(owner, (types.ModuleType, type)):
            modname = getattr(obj, "__module__", None)
            if owner is not None and isinstance(owner, types.ModuleType):
                modname = owner.__name__
            elif isinstance(owner, type):
                modname = owner.__module__
            self._tag("builtin")
            self._str(f"{modname}:{obj.__qualname__}")
            module = sys.modules.get(modname) if isinstance(modname, str) else None
            if module is not None and modname != "builtins":
                try:
                    self._str(module_fingerprint(module))
                except UnstableKeyError as exc:
                    raise self._fail(path, exc.reason) from None
            return
        self._tag("builtin-method")
        self._str(obj.__qualname__)
        self.feed(owner, f"{path}.__self__")

    def _class(self, cls: type, path: str) -> None:
        if "numpy" in sys.modules:
            np = sys.modules["numpy"]
            if issubclass(cls, np.generic):
                self._tag("numpy-type")
                try:
                    self._str(repr(np.dtype(cls)))
                except TypeError:
                    self._str(cls.__qualname__)  # an abstract numpy type (np.number)
                return
        if _resolvable(cls) is not None:
            self._tag("class:named")
            self._named(cls)
            return
        self._tag("class")
        self._str(f"{cls.__module__}.{cls.__qualname__}")
        self._str(str(len(cls.__bases__)))
        for i, base in enumerate(cls.__bases__):
            self.feed(base, f"{path}.__bases__[{i}]")
        if type(cls) is not type:  # its attributes and methods are the class's too
            self._tag("metaclass")
            self.feed(type(cls), f"{path}.__class__")
        skip = set(_CLASS_SKIP)
        fields = cls.__dict__.get("__dataclass_fields__")
        if isinstance(fields, dict):  # the generated methods follow from the fields and params
            skip.update(_DATACLASS_GENERATED)
            self._dataclass_spec(cls, fields, path)
        enum = sys.modules.get("enum")
        is_enum = enum is not None and issubclass(cls, enum.Enum)
        if is_enum:
            self._tag("enum-members")
            for name, member in cls.__members__.items():
                self._str(name)
                self.feed(member.value, f"{path}.{name}.value")
        items = [
            (k, v)
            for k, v in cls.__dict__.items()
            if k not in skip
            and not (is_enum and (k in cls.__members__ or (k[:1] == "_" and k[-1:] == "_")))
        ]
        self._str(str(len(items)))
        for k, v in items:
            self._str(k)
            self.feed(v, f"{path}.{k}")

    def _dataclass_spec(self, cls: type, fields: dict, path: str) -> None:
        self._tag("dataclass-fields")
        params = cls.__dict__.get("__dataclass_params__")
        flags = [
            f"{name}={getattr(params, name, None)!r}"
            for name in ("init", "repr", "eq", "order", "unsafe_hash", "frozen")
        ]
        self._str(" ".join(flags))
        missing = sys.modules["dataclasses"].MISSING
        for name, field in fields.items():
            self._str(name)
            ftype = field.type
            self._str(ftype if isinstance(ftype, str) else getattr(ftype, "__qualname__", "?"))
            default = field.default
            self.feed(None if default is missing else ("default", default), f"{path}.{name}")
            factory = field.default_factory
            self.feed(None if factory is missing else factory, f"{path}.{name}.default_factory")

    def _numpy(self, obj: Any, t: type, path: str) -> bool:
        np = sys.modules["numpy"]
        if isinstance(obj, np.dtype):
            self._tag("numpy-dtype")
            self._str(repr(obj))  # names, formats, offsets, itemsize, alignment: no address
            return True
        if isinstance(obj, np.ndarray):
            self._tag("numpy-array")
            self._str(repr(obj.dtype) + " " + repr(obj.shape))
            if obj.dtype.hasobject:
                self.feed(obj.tolist(), f"{path}.tolist()")
            else:
                self._bytes(np.ascontiguousarray(obj).tobytes())
            if t is not np.ndarray:  # a subclass: its type and its own state
                self.feed(t, f"{path}.__class__")
                ma = sys.modules.get("numpy.ma")
                if ma is not None and isinstance(obj, ma.MaskedArray):
                    self._tag("masked")
                    self.feed(ma.getmaskarray(obj), f"{path}.mask")
                    self.feed(obj.fill_value, f"{path}.fill_value")
                    self._str(str(bool(obj.hardmask)))
                else:
                    self._instance_dict(obj, path)
            return True
        if isinstance(obj, np.generic):
            self._tag("numpy-scalar")
            self._str(repr(obj.dtype))
            if obj.dtype.hasobject:
                self.feed(obj.item(), f"{path}.item()")
            else:
                self._bytes(obj.tobytes())
            return True
        if isinstance(obj, np.ufunc):
            self._tag("numpy-ufunc")
            self._str(f"{module_fingerprint(np)}:{obj.__name__}")
            return True
        return False

    def _ctypes(self, obj: Any, t: type, path: str) -> bool:
        ct = sys.modules["ctypes"]
        bases = (ct._SimpleCData, ct.Structure, ct.Union, ct.Array, ct._Pointer)
        if isinstance(obj, type) and issubclass(obj, bases):
            self._tag("ctypes-type")
            self._ctype_layout(ct, obj, path)
            return True
        if isinstance(obj, bases):
            if isinstance(obj, ct._Pointer):
                raise self._fail(path, "it is a ctypes pointer (an address)")
            self._tag("ctypes-value")
            self._ctype_layout(ct, t, f"{path}.__class__")
            self._bytes(bytes(memoryview(obj).cast("B")))
            return True
        return False

    def _ctype_layout(self, ct: Any, cls: type, path: str) -> None:
        self._str(f"{ct.sizeof(cls)} {ct.alignment(cls)}")
        if issubclass(cls, ct._SimpleCData):
            self._str("simple " + cls._type_)
        elif issubclass(cls, (ct.Structure, ct.Union)):
            kind = "struct" if issubclass(cls, ct.Structure) else "union"
            self._str(f"{kind} pack={getattr(cls, '_pack_', 0)}")
            for field in cls._fields_:
                self._str(field[0])
                self._ctype_layout(ct, field[1], f"{path}.{field[0]}")
                self._str(str(field[2]) if len(field) > 2 else "-")
        elif issubclass(cls, ct.Array):
            self._str(f"array {cls._length_}")
            self._ctype_layout(ct, cls._type_, f"{path}._type_")
        else:
            self._str("pointer")
            self._ctype_layout(ct, cls._type_, f"{path}._type_")


_CLASS_SKIP = (
    "__dict__",
    "__weakref__",
    "__module__",
    "__doc__",
    "__qualname__",
)
_DATACLASS_GENERATED = (
    "__dataclass_params__",
    "__dataclass_fields__",
    "__init__",
    "__repr__",
    "__eq__",
    "__hash__",
    "__match_args__",
    "__setattr__",
    "__delattr__",
    "__lt__",
    "__le__",
    "__gt__",
    "__ge__",
    "__getstate__",
    "__setstate__",
    "__slots__",
)


_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a class statement (or type())
_PTR = struct.calcsize("P")
_EXTENSION_METACLASS = ("pybind11", "nanobind", "Boost.Python", "sip", "shiboken")


def _python_instance(t: type) -> bool:
    """Whether ``t`` is a class defined in Python whose instances hold their state only in
    ``__dict__`` / ``__slots__``: every class of its MRO but ``object`` is a heap type, has
    a ``__dict__`` or ``__slots__``, adds no C-level fields (its size is its base's plus its
    slots, a ``__dict__`` and a weak-reference pointer at most), and has no metaclass from a
    C++ binding library. Locks, tensors, deques, extension objects and a bare ``object()``
    (a sentinel: its identity is its only value) fail this."""
    if t is object:
        return False
    for cls in t.__mro__[:-1]:
        if not cls.__flags__ & _HEAPTYPE:
            return False
        slots = cls.__dict__.get("__slots__")
        if slots is None:
            if cls.__dictoffset__ == 0:
                return False
            own = 0
        else:
            names = (slots,) if isinstance(slots, str) else tuple(slots)
            own = sum(1 for n in names if n not in ("__dict__", "__weakref__"))
        base = cls.__base__ or object
        if cls.__basicsize__ > base.__basicsize__ + _PTR * (own + 2):
            return False
        meta = type(cls)
        if meta is not type and any(
            getattr(m, "__module__", "").startswith(_EXTENSION_METACLASS) for m in meta.__mro__
        ):
            return False
    return t.__mro__[-1] is object


def _plain_repr(key: Any) -> bool:
    return type(key) in (str, int, bool, float) or key is None


def _type_name(t: type) -> str:
    return f"{t.__module__}.{t.__qualname__}"
