"""What every compiler backend declares: the one place NVRTC and nvcc differ.

A :class:`Backend` knows how its compiler reads options (which spellings name include
dirs and pre-included files), the exact option list its compiler receives (what the key
records), the compiler identity that goes into the key, whether the compiler reports the
files it read, and how to run a compile. The cached-compile pipeline asks the backend and
has no ``if backend == ...`` of its own.

Guaranteed: :meth:`Backend.includes` finds every include dir and pre-included file the
compiler itself would use, in every spelling the compiler accepts (``-Idir``, ``-I dir``,
``-I=dir``, ``--include-path=dir``, ``--include-path dir``, ``"-I dir"`` as one option;
``-include``, ``--pre-include``; nvcc's ``-isystem`` / ``--system-include`` and comma
lists), and the macros ``-D`` / ``-U`` leave defined (a computed ``#include`` may name a
header through one). Paths keep a ``..`` that follows a directory (the OS resolves it,
through a symlinked directory too). Not guaranteed: options passed through to the host
compiler (``-Xcompiler``) are not read.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod

from cuforge.base.paths import keyed_path
from cuforge.keys.deps import join_path

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: see docs/architecture.md, the warm path
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from cuforge.compiler.outputs import CompileOutput

__all__ = ["Backend", "Includes", "CompileJob"]


class Includes:
    """The include search a compile's options set up, with paths made absolute.

    ``dirs``: ``-I`` dirs in order; ``system_dirs``: ``-isystem`` dirs (nvcc);
    ``pre_includes``: files read before the source (``--pre-include``), as given;
    ``defines``: the macros ``-D`` leaves defined (``-U`` applied), name -> body."""

    __slots__ = ("dirs", "system_dirs", "pre_includes", "defines")

    def __init__(
        self,
        dirs: tuple[str, ...] = (),
        system_dirs: tuple[str, ...] = (),
        pre_includes: tuple[str, ...] = (),
        defines: Mapping[str, str] | None = None,
    ) -> None:
        self.dirs, self.system_dirs, self.pre_includes = dirs, system_dirs, pre_includes
        self.defines = dict(defines or {})

    def __repr__(self) -> str:
        return (
            f"Includes(dirs={self.dirs!r}, system_dirs={self.system_dirs!r}, "
            f"pre_includes={self.pre_includes!r}, defines={self.defines!r})"
        )


class CompileJob:
    """One compile, as a backend runs it: everything normalized and validated."""

    __slots__ = ("source", "name", "options", "archs", "output", "name_expressions", "headers")

    def __init__(
        self,
        source: str,
        name: str,
        options: tuple[str, ...],
        archs: tuple[str, ...],
        output: str,
        name_expressions: tuple[str, ...],
        headers: Mapping[str, str] | None,
    ) -> None:
        self.source, self.name, self.options = source, name, options
        self.archs, self.output = archs, output
        self.name_expressions, self.headers = name_expressions, headers


class Backend(ABC):
    """A compiler as the pipeline sees it. Subclasses set the class attributes and
    implement the abstract methods; one instance per compiler is enough (stateless)."""

    #: the ``backend=`` value that selects it
    name: str = ""
    #: the outputs it can produce
    outputs: tuple[str, ...] = ()
    #: True when one compile may target several archs (a fatbin)
    many_archs: bool = False
    #: True when it takes in-memory ``headers=``
    inline_headers: bool = False
    #: True when the compile reports the files it read (nvcc ``-MD``); otherwise the
    #: pipeline lists them with cuforge's include scanner before compiling
    reports_dependencies: bool = False

    #: option spellings that take a value: flag -> what it names ("include", "system",
    #: "pre_include"); written ``-Ix``, ``-I x``, ``-I=x``, ``--include-path=x`` and so on
    _VALUE_FLAGS: dict[str, str] = {}
    #: True when one option may carry a comma-separated list of values (nvcc)
    _COMMA_LISTS: bool = False
    #: True when the compiler reads each option without its leading and trailing blanks
    #: and a short flag's joined value without its leading ones (NVRTC: ``"-I dir"``)
    _STRIP_BLANKS: bool = False
    #: option spellings that define (``-DNAME=body``) or undefine (``-UNAME``) a macro
    _MACRO_FLAGS: dict[str, str] = {
        "-D": "define",
        "--define-macro": "define",
        "-U": "undefine",
        "--undefine-macro": "undefine",
    }

    @abstractmethod
    def compiler_options(
        self, options: Sequence[str], archs: tuple[str, ...], output: str
    ) -> tuple[str, ...]:
        """The exact options the compiler receives (arch and output flags included): the
        key records exactly these. Raises ValueError / ArchError for what it rejects."""

    @abstractmethod
    def identity(self) -> dict[str, str]:
        """What the key records about the compiler (version, library or executable)."""

    @abstractmethod
    def supported_archs(self) -> list[str]:
        """The real archs (``sm_XY``) this compiler can build for; [] when unavailable."""

    @abstractmethod
    def compile(self, job: CompileJob, *, source_dir: str | None) -> CompileOutput:
        """Run the compiler. Raises CompileError with the log."""

    def check(self, *, archs: tuple[str, ...], output: str, headers: object) -> None:
        """Reject a request this compiler cannot serve, saying what to use instead."""
        if output not in self.outputs:
            raise ValueError(
                f"output={output!r} needs backend='nvcc'"
                if output == "fatbin"
                else f"backend={self.name!r} produces {', '.join(self.outputs)}, not {output!r}"
            )
        if headers and not self.inline_headers:
            raise ValueError(
                f"in-memory headers= are supported by backend='nvrtc' only, not {self.name!r}"
            )

    def _path_options(self, options: Sequence[str]):
        """``(first, last, kind, value, prefix)`` for each option that names a path
        (``first`` and ``last`` are indices into ``options``: one option, or a flag and its
        value; ``prefix`` is the flag as one option spells it, ``-I`` or ``-I=``, None for
        a flag and a separate value)."""
        return self._flag_values(options, self._VALUE_FLAGS)

    def _flag_values(self, options: Sequence[str], flags: Mapping[str, str]):
        """:meth:`_path_options` for the option spellings ``flags``. Where the compiler
        strips blanks (:attr:`_STRIP_BLANKS`), each option is read without its leading and
        trailing blanks and a short flag's joined value without its leading ones
        (``"-I dir"`` names ``dir``), as NVRTC reads them; after ``=`` a blank is kept."""
        strip = self._STRIP_BLANKS
        items = [str(o).strip(" ") if strip else str(o) for o in options]
        i = 0
        while i < len(items):
            opt = items[i]
            first = i
            i += 1
            kind = value = prefix = None
            if opt in flags:  # "-I", "dir"
                kind = flags[opt]
                if i < len(items):
                    value = items[i]
                    i += 1
            else:
                head, eq, rest = opt.partition("=")
                if eq and head in flags:  # --include-path=dir, -I=dir
                    kind, value, prefix = flags[head], rest, head + "="
                else:
                    for flag, what in flags.items():  # -Idir, "-I dir" (short flags only)
                        if not flag.startswith("--") and len(flag) == 2 and opt.startswith(flag):
                            rest = opt[len(flag) :]
                            kind, value, prefix = what, rest.lstrip(" ") if strip else rest, flag
                            break
            if kind is not None and value is not None:
                yield first, i - 1, kind, value, prefix

    def _values(self, value: str) -> list[str]:
        return [v for v in (value.split(",") if self._COMMA_LISTS else [value]) if v]

    def includes(self, options: Sequence[str], cwd: str | None = None) -> Includes:
        """Every include dir and pre-included file ``options`` name, as this compiler reads
        them. Relative paths are relative to ``cwd`` (default: the current directory),
        as they are for the compiler, which runs in it."""
        base = cwd or os.getcwd()
        found: dict[str, list[str]] = {"include": [], "system": [], "pre_include": []}
        for _, _, kind, value, _ in self._path_options(options):
            for v in self._values(value):
                if kind == "pre_include":
                    found[kind].append(v)
                else:
                    found[kind].append(_absolute(v, base))
        # the macros defined on the command line, as the last -D / -U leaves them: a
        # computed #include may name a header through one
        defines: dict[str, str | None] = {}
        for _, _, kind, value, _ in self._flag_values(options, self._MACRO_FLAGS):
            for v in self._values(value):
                macro, eq, body = v.partition("=")
                defines[macro] = None if kind == "undefine" else (body if eq else "1")
        return Includes(
            tuple(dict.fromkeys(found["include"])),
            tuple(dict.fromkeys(found["system"])),
            tuple(found["pre_include"]),
            {k: v for k, v in defines.items() if v is not None},
        )

    def absolute_options(self, options: Sequence[str], cwd: str) -> list[str]:
        """``options`` with every include dir made absolute against ``cwd``, each in its
        own spelling (``-Iinc`` -> ``-I/abs/inc``): the same compile from another working
        directory. Pre-included files keep their names (the compiler finds them on the
        include path). The key is unchanged (:meth:`keyed_options` makes paths absolute)."""
        items = [str(o) for o in options]
        out = list(items)
        for first, last, kind, value, prefix in self._path_options(items):
            if kind == "pre_include":
                continue
            absolute = ",".join(_absolute(v, cwd) for v in self._values(value))
            if prefix is None:  # "-I", "dir"
                out[last] = absolute
            else:  # -Idir, "-I dir", -I=dir, --include-path=dir
                out[first] = prefix + absolute
        return out

    def keyed_options(
        self, options: Sequence[str], base: str, cwd: str | None = None
    ) -> tuple[str, ...]:
        """``options`` as the cache key records them: every path the compiler reads as a
        path (include dirs, pre-included files) made absolute and, under ``base``, relative
        to it (:func:`cuforge.base.paths.keyed_path`), in one spelling per kind
        (``<include>${BASE}/inc``); every other option as it is."""
        here = cwd or os.getcwd()
        items = [str(o) for o in options]
        keyed: list[str] = []
        last = -1
        for first, end, kind, value, _ in self._path_options(items):
            keyed.extend(items[last + 1 : first])
            for v in self._values(value):
                keyed.append(f"<{kind}>{keyed_path(_absolute(v, here), base)}")
            last = end
        keyed.extend(items[last + 1 :])
        return tuple(keyed)


def _absolute(path: str, cwd: str) -> str:
    # ".." after a symlinked directory goes where the OS takes it (join_path keeps it)
    return join_path(cwd, os.path.expanduser(path))
