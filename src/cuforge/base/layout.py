"""The cache dir's layout and its trust rule: every path under a cuforge cache dir.

This is the one module that joins paths under a cache dir. :class:`cuforge.Cache` holds a
:class:`CacheLayout`; the stores, telemetry, the miss history, the toolchain memo, the C
launcher and the torch build are handed the paths they need from it.

::

    <root>/                      0700, yours
      v1/entries/ab/cd/<key>     the disk tier's entries (fanned out by key)
      v1/index/journal           the disk tier's journal (+ lock, evict.lock)
      locks/                     single-flight compile locks
      telemetry/                 hit / miss counters
      explain/names/<digest>.jsonl, explain/misses.jsonl
                                 key histories and the last misses (``cuforge cache explain``)
      toolchain.json             the toolchain probe memo
      runtime/                   the C launcher built for this machine
      torch/build/<name>/        torch extension build dirs (ninja objects, depfiles)
      torch/modules/<key>/       torch extension modules, by link key
      torch/paths.json           the torch build's probe memo (include dirs, compilers)
      triton/<key>/              Triton kernel groups materialized from `triton` entries

**The trust rule** (ssh's StrictModes, applied to every directory on the way): whoever can
write a cache dir can make the processes that use it run their code. So a directory that
cuforge reads code or entries from must be owned by the current user and not writable by
group or others -- and so must every directory between the cache root and it.
:meth:`CacheLayout.trust_problem` is that rule; the runtime and ``cuforge doctor`` both ask
it, and its message names a recursive fix.
"""

from __future__ import annotations

import os
import stat as _stat
from _contextvars import ContextVar  # contextvars re-exports it; one import fewer

from cuforge.base._fs import dir_stat_problem
from cuforge.base._fs import trust_problem as _root_problem

__all__ = ["CacheLayout", "DISK_FORMAT", "is_entry_key", "machine_dir", "MachineDir"]

#: The disk tier's format directory: bump it when the entry format changes (old entries
#: are then simply not seen).
DISK_FORMAT = "v1"

_HEX = frozenset("0123456789abcdef")


#: the cache dir whose machine memos (toolchain.json, runtime/, torch/paths.json) the
#: current context uses: set by :class:`MachineDir` around a :class:`cuforge.Cache`'s work
_machine: ContextVar[str | None] = ContextVar("cuforge_machine_dir", default=None)


def machine_dir() -> str:
    """The cache dir that holds this context's machine memos: that of the
    :class:`cuforge.Cache` doing the work (:class:`MachineDir`), else ``CUFORGE_CACHE_DIR``
    (or its default). A process that passes ``cache=Cache(D)`` keeps them in ``D``."""
    chosen = _machine.get()
    if chosen is not None:
        return chosen
    from cuforge.base.config import settings  # layout stays importable without config

    return settings().cache_dir


class MachineDir:
    """``with MachineDir(cache.directory):`` -- the machine memos of the block go there
    (a context variable: threads and tasks keep their own)."""

    __slots__ = ("_dir", "_token")

    def __init__(self, directory: str) -> None:
        self._dir = directory
        self._token = None

    def __enter__(self) -> str:
        self._token = _machine.set(self._dir)
        return self._dir

    def __exit__(self, *exc: object) -> None:
        _machine.reset(self._token)


def is_entry_key(text: object) -> bool:
    """Whether ``text`` is an entry key: 64 lowercase hex digits (a SHA-256)."""
    return isinstance(text, str) and len(text) == 64 and _HEX.issuperset(text)


class CacheLayout:
    """Every path under one cache dir (see the module doc). Cheap to build: it joins
    strings and touches no file until asked."""

    __slots__ = (
        "root",
        "entries",
        "index",
        "journal",
        "index_lock",
        "evict_lock",
        "locks",
        "telemetry",
        "explain",
        "explain_names",
        "explain_misses",
        "toolchain_memo",
        "runtime",
        "torch",
        "torch_builds",
        "torch_modules",
        "torch_paths_memo",
        "triton",
        "_entry_prefix",
    )

    @classmethod
    def of(cls, root: str | os.PathLike[str]) -> CacheLayout:
        """The layout of ``root``, memoized (callers on the warm path ask per call)."""
        layout = _LAYOUTS.get(root)
        if layout is None:
            layout = _LAYOUTS[root] = cls(root)
        return layout

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.path.abspath(os.path.expanduser(os.fspath(root)))
        join = os.path.join
        fmt = join(self.root, DISK_FORMAT)
        self.entries = join(fmt, "entries")
        self.index = join(fmt, "index")
        self.journal = join(self.index, "journal")
        self.index_lock = join(self.index, "lock")
        self.evict_lock = join(self.index, "evict.lock")
        self.locks = join(self.root, "locks")
        self.telemetry = join(self.root, "telemetry")
        self.explain = join(self.root, "explain")
        self.explain_names = join(self.explain, "names")
        self.explain_misses = join(self.explain, "misses.jsonl")
        self.toolchain_memo = join(self.root, "toolchain.json")
        self.runtime = join(self.root, "runtime")
        self.torch = join(self.root, "torch")
        self.torch_builds = join(self.torch, "build")
        self.torch_modules = join(self.torch, "modules")
        self.torch_paths_memo = join(self.torch, "paths.json")
        self.triton = join(self.root, "triton")
        self._entry_prefix = self.entries + os.sep

    def __repr__(self) -> str:
        return f"CacheLayout({self.root!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CacheLayout) and other.root == self.root

    def __hash__(self) -> int:
        return hash(self.root)

    # ------------------------------------------------------------------ paths
    def entry_path(self, key: str) -> str:
        """``<root>/v1/entries/<key[0:2]>/<key[2:4]>/<key>``. Raises ValueError for
        anything but an entry key (:func:`is_entry_key`)."""
        if not is_entry_key(key):
            raise ValueError(f"not a valid cache key: {key!r}")
        return f"{self._entry_prefix}{key[0:2]}/{key[2:4]}/{key}"

    def explain_names_file(self, digest: str) -> str:
        """The key history of one source name (``digest`` is the name's digest)."""
        return os.path.join(self.explain_names, digest + ".jsonl")

    def torch_build_dir(self, name: str) -> str:
        """``<root>/torch/build/<name>``; ``name`` must be a plain directory name."""
        _check_name(name, "an extension name")
        return os.path.join(self.torch_builds, name)

    def torch_module_dir(self, key: str) -> str:
        """``<root>/torch/modules/<key>``; ``key`` must be an entry key."""
        if not is_entry_key(key):
            raise ValueError(f"{key!r} is not a cuforge key (64 lowercase hex digits)")
        return os.path.join(self.torch_modules, key)

    def triton_dir(self, key: str) -> str:
        """``<root>/triton/<key>``: a Triton kernel group materialized from an entry."""
        if not is_entry_key(key):
            raise ValueError(f"{key!r} is not a cuforge key (64 lowercase hex digits)")
        return os.path.join(self.triton, key)

    def own_dirs(self) -> tuple[str, ...]:
        """The directories cuforge creates directly under the root (checked and created
        0700 by :meth:`ensure`)."""
        return (
            self.root,
            os.path.dirname(self.entries),
            self.entries,
            self.index,
            self.locks,
        )

    def contains(self, path: str) -> bool:
        """Whether ``path`` (absolute) lies under the root."""
        return path == self.root or path.startswith(self.root + os.sep)

    # ------------------------------------------------------------------ trust
    def trust_problem(self, *paths: str) -> str | None:
        """Why the cache dir cannot be trusted to hold code this process will run, or
        None. Checks the root and every directory on the way from it to each of
        ``paths`` (the paths themselves included when they are directories; for a file,
        its parent). With no ``paths``, checks the directories cuforge creates under the
        root (:meth:`own_dirs`). A directory that does not exist yet is no problem
        (cuforge creates it 0700); a symlink below the root is (cuforge never makes one).
        One ``lstat`` per directory. The message names a fix that covers the whole tree."""
        for directory in self._dirs_to_check(paths or self.own_dirs(), not paths):
            problem = self._problem(directory, create=False)
            if problem is not None:
                return self._with_recursive_fix(problem)
        return None

    def _problem(self, directory: str, *, create: bool) -> str | None:
        """The trust problem of one directory (None when it is fine, or missing and not
        to be created); with ``create``, a missing one is made 0700 first."""
        if directory == self.root:  # a symlinked cache root is the user's own choice
            if create:
                try:
                    os.mkdir(directory, 0o700)
                except OSError:
                    pass  # exists (checked next), or cannot be made (reported by its writer)
            return _root_problem(directory)
        try:
            st = os.lstat(directory)
        except FileNotFoundError:
            if not create:
                return None
            try:
                os.mkdir(directory, 0o700)
            except FileExistsError:
                return self._problem(directory, create=False)  # made meanwhile: check it
            except OSError:
                return None  # cannot be made: whoever writes there reports the error
            return None
        except OSError as exc:
            return f"{directory} cannot be checked ({exc.strerror})"
        if _stat.S_ISLNK(st.st_mode):
            return f"{directory} is a symlink; cuforge never creates one inside its cache dir"
        return dir_stat_problem(directory, st)

    def _dirs_to_check(self, paths, are_dirs: bool) -> list[str]:
        """The root, then every directory from it down to each path, in order."""
        seen: dict[str, None] = {self.root: None}
        prefix = self.root + os.sep
        for path in paths:
            if not path.startswith(prefix):
                path = os.path.abspath(path)
                if path == self.root:
                    continue
                if not path.startswith(prefix):
                    raise ValueError(f"{path} is not under the cache dir {self.root}")
            if not are_dirs and not os.path.isdir(path):
                path = os.path.dirname(path)
                if path == self.root:
                    continue
            current = self.root
            for part in path[len(prefix) :].split(os.sep):
                if part:
                    current = current + os.sep + part
                    seen[current] = None
        return list(seen)

    def fix_command(self, problem: str) -> str | None:
        """The shell command that fixes ``problem`` (a :meth:`trust_problem` message) for
        the whole tree, or None when it is not an ownership or mode problem."""
        head = problem.split("; ", 1)[0]
        if "owned by" in head:
            return f"chown -R $(id -un) {self.root} && chmod -R go-w {self.root}"
        if "writable by" in head:
            return f"chmod -R go-w {self.root}"
        return None

    def _with_recursive_fix(self, problem: str) -> str:
        # _fs names a fix for the one directory; any directory may have been replaced by
        # another user, so the fix must cover the whole tree
        head = problem.split("; ", 1)[0]
        command = self.fix_command(problem)
        if command is None:
            return problem
        if "owned by" in head:
            fix = (
                "use a cache dir of your own (export CUFORGE_CACHE_DIR=~/.cache/cuforge), or "
                f"if you trust every file in it: `{command}`"
            )
        else:
            fix = (
                "anyone who could write it may have replaced entries: if you trust every "
                f"file in it, `{command}`; otherwise remove it (`rm -rf {self.root}`) and let "
                "cuforge recreate it"
            )
        return f"{head}; {fix}"

    def tree_problems(self, limit: int = 20) -> list[str]:
        """:meth:`trust_problem` for the root and every directory under it (not following
        links), at most ``limit`` of them: what ``cuforge doctor`` reports."""
        found: list[str] = []
        for dirpath, subdirs, _files in os.walk(self.root):
            problem = self._problem(dirpath, create=False)
            if problem is not None:
                found.append(self._with_recursive_fix(problem))
                if len(found) >= limit:
                    break
            subdirs.sort()
        return found

    def ensure(self, *dirs: str) -> str | None:
        """Create ``dirs`` (default: :meth:`own_dirs`) and every directory between the root
        and them, each 0700, checking each on the way (:meth:`trust_problem`'s rule, one
        ``lstat`` per directory that exists). Returns the problem, or None. A directory
        that cannot be created is no trust problem (nothing can be planted where nothing
        exists): whoever writes there reports the error."""
        parent = os.path.dirname(self.root)
        if not os.path.isdir(parent):
            try:  # the dirs above the root are the user's; the root and below are cuforge's
                os.makedirs(parent, exist_ok=True)
            except OSError:
                return None  # then the root cannot be made either: nothing to check below
        for directory in self._dirs_to_check(dirs or self.own_dirs(), True):
            problem = self._problem(directory, create=True)
            if problem is not None:
                return self._with_recursive_fix(problem)
        return None


#: memoized layouts (CacheLayout.of), by the root as given
_LAYOUTS: dict = {}


def _check_name(name: str, what: str) -> None:
    if (
        not isinstance(name, str)
        or not name
        or name in (".", "..")
        or os.sep in name
        or (os.altsep and os.altsep in name)
        or "\0" in name
    ):
        raise ValueError(f"{name!r} is not usable as {what}: use a plain name (no '/', '..')")
