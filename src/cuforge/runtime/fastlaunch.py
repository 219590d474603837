"""The optional C fast path: a ~700-line CPython extension, installed with cuforge or built
once per machine.

Pure Python tops out near 1.35-1.45x a raw pre-packed ``cuLaunchKernel`` (through
``cuda.bindings``) for 2 tensors + 2 scalars (H200: 5.3-7.5 us vs 4.0-5.2 us): the ctypes
call itself, eight tensor attribute calls, ``struct.pack_into`` and dispatch. This
extension does the same work as the generated Python fast path -- exact-type tensor check,
dtype identity, ``is_contiguous()``, ``get_device()``, ``data_ptr()`` (for CuPy arrays:
``dtype``, ``_c_contiguous``, ``data.ptr``, ``data.device_id``), scalar range checks,
packing into the kernel's argument buffer, the framework's current stream,
``cuLaunchKernelEx`` -- in C, holding the GIL from the first write to the buffer until the
driver returns (so every thread may use it). ``cuLaunchKernelEx`` takes a ``CUlaunchConfig``
pre-built in each launcher (four arguments instead of eleven; the METH_FASTCALL floor drops
from 0.86x to 0.81x the raw anchor on an H100); a driver without it gets ``cuLaunchKernel``.

Torch tensors are read without calling their methods where torch allows it
(:func:`cuforge.runtime.fastpath.torch_abi`): torch's stable C shim
(``aoti_torch_get_dtype`` / ``_get_device_type`` / ``_get_device_index`` /
``_is_contiguous`` / ``_get_data_ptr``, exported by libtorch) on the ``at::Tensor`` inside
the tensor object, and the current stream through ``aoti_torch_get_current_cuda_stream``.
The tensor object's layout is checked once per process (its size, and the shim's reads of a
few tensors against their methods); anything else keeps the method calls. ``k[grid,
block]`` itself is a C method descriptor (``Subscript``): a hit in the kernel's launcher
cache runs no Python code.

Anything it does not handle exactly (another argument type, a failed check, an error)
goes to the Python general path, which checks again and names the wrong argument.

The C source is ``_launcher.c`` beside this module. It needs only Python's headers: the
driver's launch entry points come in as addresses at run time, nothing links against
libcuda. :func:`load` takes the first of three paths that works, tried once per process
(:func:`status` says which, and why not the ones before it):

1. ``"installed"``: the extension ``cuforge.runtime._cuforge_fastlaunch``, compiled from
   ``_launcher.c`` when cuforge was installed (``setup.py``; optional: an install without a
   C compiler succeeds without it). It is used only while the SHA-256 it was built from
   (its ``SOURCE_SHA256``) equals that of the ``_launcher.c`` beside this module, so an
   editable install whose C source was edited since does not run the old code.
2. ``"built"``: compiled with the system C compiler (``$CC``, ``cc``, ``gcc`` or ``clang``)
   and Python's headers the first time a kernel is made (~0.4 s), into
   ``$CUFORGE_CACHE_DIR/runtime/``, and reused by every later process. The library's file
   name carries a hash of the C source, the Python version and extension ABI, and the
   compiler, so a change to any of them builds a fresh one.
3. ``"python"``: the generated Python fast path (about 1.4x slower launches), when neither
   works or ``CUFORGE_FAST_LAUNCH=python``.

The path in use is said once per process: on stderr with ``CUFORGE_VERBOSE=1``, and as an
INFO record on the ``cuforge`` logger when :mod:`logging` is in use; nothing is printed
otherwise.

Trust: a library in the cache is code this process runs. It is imported only when the
cache dir and its ``runtime/`` dir pass :func:`cuforge.base._fs.trust_problem` (owned by the
current user, not writable by group or others) and the file itself is a regular file (not
a symlink) owned by the current user and not writable by group or others. Its path is
always derived again from the hash, never read from anywhere. A library that fails the
file check is rebuilt in place; when a directory fails, the library is built in a fresh
private temp dir (mode 0700) for this process only, and :func:`notice` says why
(``CUFORGE_VERBOSE=1`` prints it). The installed extension lives in the package itself and
is as trusted as cuforge's own Python files.
"""

from __future__ import annotations

import hashlib
import os
import stat
import sys
import threading
import time

from cuforge.base import _fs
from cuforge.base.config import settings
from cuforge.base.layout import CacheLayout, machine_dir

__all__ = [
    "load",
    "status",
    "error",
    "notice",
    "source",
    "library_name",
    "KINDS",
    "INSTALLED_MODULE",
]

#: parameter kinds understood by the C fast path (scalar code -> kind number)
KINDS = {
    "ptr": 0,
    "f": 1,
    "d": 2,
    "e": 3,
    "b": 4,
    "B": 5,
    "h": 6,
    "H": 7,
    "i": 8,
    "I": 9,
    "q": 10,
    "Q": 11,
}

#: the C source's file name, inside this package
SOURCE_FILE = "_launcher.c"
#: the extension module's name (``PyInit__cuforge_fastlaunch`` in the C source)
MODULE_NAME = "_cuforge_fastlaunch"
#: the extension built when cuforge is installed (setup.py), from the same C source
INSTALLED_MODULE = f"{__package__}.{MODULE_NAME}"

#: Test hook: False skips the installed extension, so :func:`load` goes straight to the
#: runtime build (the tests of that path set it in the process they start). Read once, by
#: the first :func:`load`.
use_installed = True

_lock = threading.Lock()
_module = None
_tried = False
_error: str | None = None
_notice: str | None = None
_private = False
_why_not = "not tried"  # why the installed extension is not used
_path = "python"
_detail = "not loaded yet"


def load():
    """The compiled extension module: the installed one, else one built into the cache
    dir on first use; None when neither can be had here (``error()`` says why) or
    ``CUFORGE_FAST_LAUNCH=python``. Tried once per process; which path is in use is said
    once (on stderr with ``CUFORGE_VERBOSE=1``; see :func:`status`)."""
    global _module, _tried, _error, _path, _detail, _why_not
    if _tried:
        return _module
    with _lock:
        if _tried:
            return _module
        try:
            if settings().fast_launch == "python":
                _error = "CUFORGE_FAST_LAUNCH=python"
            else:
                _module, _why_not = _installed()
                if _module is not None:
                    _path, _detail = "installed", _module.__file__
                else:
                    _module = _build_and_import()
                    _path = "built"
                    where = _module.__file__
                    if _private:  # built in a private temp dir, removed once loaded
                        where = f"{where} (a private build for this process: {_notice})"
                    _detail = f"{where} (installed extension: {_why_not})"
        except Exception as exc:  # noqa: BLE001 - any failure: the Python fast path is used
            _error = f"{type(exc).__name__}: {exc}"
            _module = None
        if _module is None:
            _path = "python"
            _detail = _error
            if _error != "CUFORGE_FAST_LAUNCH=python":
                _detail = f"installed extension: {_why_not}; runtime build: {_error}"
        _tried = True
        _report()
    return _module


def status() -> tuple[str, str]:
    """Which launch path this process uses, loading it first if that was not tried yet
    (which may build the library, ~0.4 s): ``(path, detail)`` where ``path`` is

    * ``"installed"``: the extension installed with cuforge; ``detail`` is its file;
    * ``"built"``: the library built at run time into ``<cache>/runtime/`` (or, when that
      dir is untrusted, a private temp dir: :func:`notice` says why); ``detail`` is its file
      and why the installed extension is not used;
    * ``"python"``: the Python fast path; ``detail`` says why neither C path is used.

    Meant for ``cuforge doctor`` and bug reports."""
    load()
    return _path, _detail


def _installed():
    """``(module, None)`` for a usable installed extension, else ``(None, why not)``."""
    import importlib  # importlib: only while the launcher is first loaded

    if not use_installed:
        return None, "skipped (cuforge.runtime.fastlaunch.use_installed is False)"
    try:
        module = importlib.import_module(INSTALLED_MODULE)
    except ImportError as exc:
        if isinstance(exc, ModuleNotFoundError) and exc.name == INSTALLED_MODULE:
            return None, (
                "not installed (cuforge was installed without a C compiler or Python "
                "headers; reinstall it where both are present to get it)"
            )
        return None, f"{INSTALLED_MODULE} cannot be imported: {exc}"
    except Exception as exc:  # noqa: BLE001 - a failing module init: the next path is tried
        return None, f"{INSTALLED_MODULE} failed to initialize: {type(exc).__name__}: {exc}"

    built_from = getattr(module, "SOURCE_SHA256", None)
    if built_from != hashlib.sha256(source()).hexdigest():
        return None, (
            f"{module.__file__} was built from another {SOURCE_FILE} (edited since the "
            f"install; reinstall cuforge, e.g. `pip install -e .`, to rebuild it)"
        )
    return module, None


def _report() -> None:
    """Say once which path is in use: stderr when verbose, an INFO log record."""
    if _path == "python":
        message = f"C launch path unavailable ({_detail}); using the Python fast path"
        if _error == "CUFORGE_FAST_LAUNCH=python":
            message = "CUFORGE_FAST_LAUNCH=python; using the Python fast path"
    elif _path == "installed":
        message = f"C launch path: the installed extension {_detail}"
    else:  # the notice of a private build was said already: not twice
        where = _module.__file__ + (" (a private build for this process)" if _private else "")
        message = f"C launch path: built at run time: {where} (installed extension: {_why_not})"
    try:
        verbose = _verbose()
    except ValueError:  # a bad CUFORGE_* value (ConfigError): load() recorded it as the error
        verbose = False
    if verbose:
        print(f"cuforge: {message}", file=sys.stderr)
    # INFO only when logging is already in use: a process that never imported logging has
    # no handler that could show it, and importing it here would cost a few ms
    logging = sys.modules.get("logging")
    if logging is not None:
        logging.getLogger("cuforge").info(message)


def error() -> str | None:
    """Why the C fast path is not in use (None when it is)."""
    return _error


def notice() -> str | None:
    """Why the library was not taken from (or put into) the cache's ``runtime/`` dir, when
    it was not: an untrusted directory, a planted or unsafe file. None otherwise."""
    return _notice


def source() -> bytes:
    """The C source of the extension, exactly as it is compiled and hashed: the
    ``_launcher.c`` beside this module."""
    try:
        with open(os.path.join(os.path.dirname(__file__), SOURCE_FILE), "rb") as f:
            return f.read()
    except FileNotFoundError:
        pass  # not a plain directory (a zip, say): ask the package's loader
    from importlib import resources  # ~15 ms to import: only when the plain read fails

    return resources.files(__package__).joinpath(SOURCE_FILE).read_bytes()


def compiler() -> list[str] | None:
    """The C compiler command: ``$CC`` (split on spaces, its program resolved on PATH),
    else the first of ``cc``, ``gcc``, ``clang`` on PATH; None when there is none."""
    import shutil  # shutil, subprocess, sysconfig, tempfile: only to build the launcher

    cc = os.environ.get("CC", "").split()
    if cc:
        found = shutil.which(cc[0])
        return [found or cc[0], *cc[1:]]
    for name in ("cc", "gcc", "clang"):
        found = shutil.which(name)
        if found:
            return [found]
    return None


def library_name(src: bytes, cc: list[str], suffix: str | None = None) -> str:
    """The built library's file name: a hash of the C source ``src``, the Python version,
    the extension suffix (which names the ABI) and the compiler command ``cc``."""

    if suffix is None:
        import importlib.machinery

        suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    h = hashlib.sha256()
    for part in (src, sys.version.encode(), suffix.encode(), "\0".join(cc).encode()):
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return f"{MODULE_NAME}-{h.hexdigest()[:16]}{suffix}"


def file_problem(path: str) -> str | None:
    """Why the library file ``path`` must not be imported, or None when it may: it must be
    a regular file (a symlink is refused, not followed), owned by the current user and not
    writable by group or others. A missing file is a problem too ("missing")."""

    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        return f"{path} cannot be checked ({exc.strerror})"
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symlink"
    if not stat.S_ISREG(st.st_mode):
        return f"{path} is not a regular file"
    if st.st_uid != os.geteuid():
        return f"{path} is not owned by the current user"
    if st.st_mode & 0o022:
        return f"{path} is writable by group or others"
    return None


def _verbose() -> bool:
    return settings().verbose


def _say(message: str) -> None:
    """Record why the cache was not used (once per process), printing it when verbose."""
    global _notice
    _notice = message
    if _verbose():
        print(f"cuforge: C launch path: {message}", file=sys.stderr)


def _runtime_dir() -> tuple[str | None, str | None]:
    """``(<cache>/runtime, None)`` when the library may be kept there, else ``(None, why)``."""

    layout = CacheLayout.of(machine_dir())
    problem = layout.trust_problem(layout.runtime)
    if problem:
        return None, problem
    return layout.runtime, None


def _build(src: bytes, cc: list[str], path: str) -> None:
    """Compile ``src`` into ``path`` (through a temp file beside it, then ``os.replace``:
    a file or symlink at ``path`` is replaced, never written through)."""
    import subprocess
    import sysconfig

    include = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(include, "Python.h")):
        raise RuntimeError(f"no Python.h in {include} (install the Python development headers)")
    tmp = _fs.temp_path(path)
    # the source goes in on stdin: exactly the bytes that were hashed are compiled
    cmd = [*cc, "-O2", "-shared", "-fPIC", "-I" + include, "-x", "c", "-", "-o", tmp]
    t0 = time.perf_counter()
    try:
        try:
            done = subprocess.run(cmd, input=src, capture_output=True, check=False)
        except OSError as exc:  # not a write problem: say which compiler could not run
            raise RuntimeError(
                f"the C compiler {cc[0]} cannot be run ({exc.strerror or exc}); "
                f"install cc, gcc or clang, or set CC to one"
            ) from exc
        if done.returncode != 0:
            stderr = done.stderr.decode("utf-8", "replace").strip()[:500]
            raise RuntimeError(f"{' '.join(cmd)} failed: {stderr}")
        os.chmod(tmp, 0o700)  # the compiler applies the umask; a library must not be g/o-writable
        os.replace(tmp, path)
    except BaseException:
        _fs.unlink(tmp)
        raise
    if _verbose():
        print(
            f"cuforge: built the C launch path in {time.perf_counter() - t0:.2f} s: {path}",
            file=sys.stderr,
        )


def _import(path: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(MODULE_NAME, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _build_and_import():
    src = source()
    cc = compiler()
    if cc is None:
        raise RuntimeError("no C compiler (cc, gcc or clang) on PATH; set CC to use another")
    name = library_name(src, cc)
    runtime, why = _runtime_dir()
    if runtime is not None:
        path = os.path.join(runtime, name)
        problem = file_problem(path)
        if problem is None:
            return _import(path)
        if problem != "missing":
            _say(f"{problem}; not imported, building it again")
        try:
            # each level with mode 0700: makedirs gives the parents it creates the umask's mode
            os.makedirs(os.path.dirname(runtime), mode=0o700, exist_ok=True)
            os.makedirs(runtime, mode=0o700, exist_ok=True)
            why = _runtime_dir()[1]  # created just now, or already there: check it again
            if why is None and not os.access(runtime, os.W_OK):
                why = f"{runtime} is not writable"
            if why is None:
                _build(src, cc, path)
                problem = file_problem(path)
                if problem is None:
                    return _import(path)
                why = f"the library just built is unusable: {problem}"
        except OSError as exc:
            why = f"cannot write {runtime}: {exc.strerror or exc}"
    _say(f"{why}; building it in a private temp dir for this process")
    return _private_build(src, cc, name)


def _private_build(src: bytes, cc: list[str], name: str):
    """Build into a fresh temp dir (mode 0700, removed once the library is loaded)."""
    import shutil
    import tempfile

    global _private
    _private = True

    tmp = tempfile.mkdtemp(prefix="cuforge-launch-")
    try:
        path = os.path.join(tmp, name)
        _build(src, cc, path)
        return _import(path)
    finally:
        # a loaded library stays mapped after its file is removed
        shutil.rmtree(tmp, ignore_errors=True)
