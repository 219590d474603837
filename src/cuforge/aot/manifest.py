"""Build manifests: ``cuforge.toml`` (or ``[tool.cuforge]`` in ``pyproject.toml``), read
and expanded into one :class:`~cuforge.aot.tasks.BuildTask` per variant.

::

    arch = ["sm_80", "sm_90"]                 # default for every entry

    [[kernel]]
    source = "red.cu"                         # relative to the manifest
    include_dirs = ["include"]
    name_expressions = ["blk<{BLOCK}, {T}>"]  # {NAME} expands over [kernel.grid]
    defines = { TILE = "{BLOCK}" }            # placeholders work in defines and options too
    [kernel.grid]
    BLOCK = [128, 256]
    T = ["float", "double"]

    [[extension]]                             # a torch extension (cuforge.torch.load)
    name = "my_ext"
    sources = ["ext.cpp", "ext_kernel.cu"]
    extra_cuda_cflags = ["-DTILE={TILE}"]
    [extension.grid]
    TILE = [16, 32]

    [[python]]                                # a project function making cuforge.cccl /
    call = "kernels:build_reduce"             # cuforge.cute calls (module relative to
    kwargs = { dtype = "{T}" }                # the manifest's dir)
    [python.grid]
    T = ["int32", "float64"]

Guarantees:

* Expansion is the cartesian product grid x arch x name expression: each kernel variant
  has one arch (all of them in one task for ``output = "fatbin"``) and at most one name
  expression; an extension variant builds for every arch at once (a fat module); a python
  variant is one grid point (times its own ``arch`` list, passed as the ``arch`` keyword
  argument; the top-level ``arch`` does not apply to it).
* Each variant's task makes exactly the JIT call written in :mod:`cuforge.aot.tasks`, so
  the same call made later from the manifest's directory is a cache hit.
* A manifest cuforge cannot use raises :class:`ManifestError` naming the file and the line
  (tomllib gives no positions: the line is found by searching the text for the table and
  key): an unknown key, a wrong type, an empty grid, a missing source, an unknown
  placeholder, a grid variable no placeholder uses (its variants would all be the same).
"""

from __future__ import annotations

import itertools
import keyword
import os
import re
from dataclasses import dataclass, field
from typing import Any

from cuforge.aot.tasks import BuildTask, python_files, python_module_files, task_files
from cuforge.base.arch import normalize_arch
from cuforge.base.errors import CuforgeError
from cuforge.base.toml import loads as _toml_loads

__all__ = ["Manifest", "ManifestError", "load_manifest", "parse_manifest", "find_manifest"]

_TOP_KEYS = ("arch", "kernel", "extension", "python")
_KERNEL_KEYS = (
    "source",
    "include_dirs",
    "name_expressions",
    "defines",
    "options",
    "arch",
    "backend",
    "output",
    "grid",
)
_EXTENSION_KEYS = (
    "name",
    "sources",
    "extra_cflags",
    "extra_cuda_cflags",
    "extra_ldflags",
    "extra_include_paths",
    "arch",
    "grid",
)
_PYTHON_KEYS = ("call", "kwargs", "files", "arch", "grid")
_CALL = re.compile(
    r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*"
    r"(?:\.[A-Za-z_][A-Za-z0-9_]*)*"
)
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_SCALARS = (str, int, float, bool)

#: The most variants one manifest may expand to (grid points x archs x name expressions,
#: over all entries): far above any real build; a bigger grid is a mistake that would fill
#: memory before anything is built.
MAX_VARIANTS = 100_000


class ManifestError(CuforgeError, ValueError):
    """A manifest cuforge cannot use. ``path`` and ``line`` (1-based; 0: unknown) say where;
    the message says what was expected and how to fix it."""

    def __init__(self, path: str, line: int, message: str) -> None:
        self.path, self.line = path, line
        where = f"{path}:{line}" if line else path
        super().__init__(f"{where}: {message}")


@dataclass
class Manifest:
    """A read manifest: its file, the directory its paths are relative to, and its tasks."""

    path: str
    root: str
    tasks: list[BuildTask] = field(default_factory=list)
    archs: list[str] = field(default_factory=list)


def find_manifest(start: str | None = None) -> str:
    """The manifest for ``start`` (a file, or a directory: its ``cuforge.toml``, else a
    ``pyproject.toml`` with a ``[tool.cuforge]`` table). Raises :class:`ManifestError`."""
    start = os.path.abspath(start or os.getcwd())
    if os.path.isfile(start):
        return start
    if not os.path.isdir(start):
        raise ManifestError(start, 0, "no such manifest file or directory")
    toml = os.path.join(start, "cuforge.toml")
    if os.path.isfile(toml):
        return toml
    pyproject = os.path.join(start, "pyproject.toml")
    if os.path.isfile(pyproject):
        with open(pyproject, "rb") as f:
            if b"tool.cuforge" in f.read():
                return pyproject
    raise ManifestError(
        start,
        0,
        "no cuforge.toml here (and no pyproject.toml with a [tool.cuforge] table); "
        "write one (`cuforge build --help` shows the format) or name the manifest: "
        "cuforge build path/to/cuforge.toml",
    )


def load_manifest(path: str | None = None, *, with_files: bool = True) -> Manifest:
    """Read and expand the manifest at ``path`` (see :func:`find_manifest`)."""
    path = find_manifest(path)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ManifestError(path, 0, f"cannot read it: {exc}") from None
    return parse_manifest(text, path, with_files=with_files)


def parse_manifest(text: str, path: str, *, with_files: bool = True) -> Manifest:
    """Expand manifest ``text`` (read from ``path``; its directory is the root of relative
    paths). ``with_files=False`` skips hashing the files each task reads."""
    try:
        data, _ = _toml_loads(text)
    except CuforgeError:
        raise
    except ValueError as exc:  # tomllib.TOMLDecodeError says "(at line N, column M)"
        match = re.search(r"line (\d+)", str(exc))
        line = int(match.group(1)) if match else 0
        if not match and "end of document" in str(exc):
            line = len(text.splitlines())
        raise ManifestError(path, line, f"not valid TOML: {exc}") from None
    prefix = ""
    if os.path.basename(path) == "pyproject.toml":
        data = data.get("tool", {}).get("cuforge")
        if data is None:
            raise ManifestError(path, 0, "has no [tool.cuforge] table")
        prefix = "tool.cuforge."
    return _Expander(text, path, prefix, with_files).expand(data)


class _Lines:
    """Finds the line of a table or key in the raw text."""

    _HEADER = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*(\]\]?)")

    def __init__(self, text: str, prefix: str) -> None:
        self.lines = text.splitlines()
        self.prefix = prefix
        self.headers: list[tuple[int, str, bool]] = []  # (line index, dotted name, is array)
        for i, line in enumerate(self.lines):
            m = self._HEADER.match(line)
            if m and not line.lstrip().startswith("#"):
                name = re.sub(r"\s*\.\s*", ".", m.group(2)).replace('"', "")
                self.headers.append((i, name, m.group(1) == "[["))

    def _range(self, start: int) -> tuple[int, int]:
        """Line indexes of the table starting at header line ``start`` (to the next header)."""
        after = [i for i, _, _ in self.headers if i > start]
        return start, (after[0] if after else len(self.lines))

    def top(self) -> tuple[int, int]:
        if self.prefix:
            name = self.prefix.rstrip(".")
            for i, n, _ in self.headers:
                if n == name:
                    return self._range(i)
            return 0, len(self.lines)
        return -1, (self.headers[0][0] if self.headers else len(self.lines))

    def entry(self, kind: str, index: int) -> tuple[int, int]:
        """(first, end) line indexes of the ``index``-th ``[[kind]]`` table, its sub-tables
        included; (-1, -1) when it is not written as ``[[kind]]``."""
        name = self.prefix + kind
        starts = [i for i, n, arr in self.headers if arr and n == name]
        if index >= len(starts):
            return -1, -1
        first = starts[index]
        end = len(self.lines)
        for i, n, _arr in self.headers:
            if i > first and not n.startswith(name + "."):
                end = i
                break
        return first, end

    def find_key(self, key: str, first: int, end: int) -> int:
        pattern = re.compile(r"^\s*(?:" + re.escape(key) + r'|"' + re.escape(key) + r'")\s*=')
        for i in range(max(first, 0), end):
            if pattern.match(self.lines[i]):
                return i + 1
        return 0

    def find_table(self, dotted: str, first: int, end: int) -> int:
        for i, n, _ in self.headers:
            if first <= i < end and n == dotted:
                return i + 1
        return 0

    def key_line(self, key: str, kind: str | None = None, index: int = 0, sub: str = "") -> int:
        """Line (1-based) of ``key`` in the top level or the ``index``-th ``kind`` entry
        (``sub``: inside its ``[kind.sub]`` table); the entry's line, else 0, when not found."""
        if kind is None:
            first, end = self.top()
            return self.find_key(key, first + 1, end) or self.find_key(key, 0, len(self.lines))
        first, end = self.entry(kind, index)
        if first < 0:
            return self.find_key(kind, 0, len(self.lines))
        if sub:
            table = self.find_table(self.prefix + kind + "." + sub, first, end)
            if table:
                tfirst, tend = self._range(table - 1)
                found = self.find_key(key, tfirst + 1, tend)
                if found:
                    return found
            found = self.find_key(sub, first, end)
            return found or table or first + 1
        found = self.find_key(key, first + 1, end)
        if found:
            return found
        return self.find_table(self.prefix + kind + "." + key, first, end) or first + 1


def _type_name(value: Any) -> str:
    return {
        str: "a string",
        int: "an integer",
        float: "a number",
        bool: "a boolean",
        list: "an array",
        dict: "a table",
    }.get(type(value), type(value).__name__)


class _Expander:
    def __init__(self, text: str, path: str, prefix: str, with_files: bool) -> None:
        self.path = os.path.abspath(path)
        self.root = os.path.dirname(self.path)
        self.lines = _Lines(text, prefix)
        self.with_files = with_files
        self._files: dict[tuple, dict[str, str]] = {}
        self._planned = 0  # variants of the entries expanded so far

    def error(self, line: int, message: str) -> ManifestError:
        return ManifestError(self.path, line, message)

    # -- checks ------------------------------------------------------------------

    def _str_list(self, value: Any, what: str, line: int) -> list[str]:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.error(
                line, f'{what} must be an array of strings, e.g. ["a"], not {_type_name(value)}'
            )
        return list(value)

    def _archs(self, value: Any, what: str, line: int) -> list[str]:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
            raise self.error(
                line,
                f'{what} must be an arch or a non-empty array of archs, e.g. ["sm_80", "sm_90"]',
            )
        out = []
        for v in value:
            try:
                out.append(normalize_arch(v))
            except ValueError as exc:
                raise self.error(line, f"{what}: {exc}") from None
        return list(dict.fromkeys(out))

    def _unknown(self, table: dict, allowed: tuple[str, ...], what: str, kind, index) -> None:
        for key in table:
            if key not in allowed:
                line = self.lines.key_line(key, kind, index)
                raise self.error(
                    line, f"unknown key {key!r} in {what}; accepted keys: {', '.join(allowed)}"
                )

    def _grid(self, entry: dict, kind: str, index: int) -> dict[str, list]:
        grid = entry.get("grid")
        if grid is None:
            return {}
        line = self.lines.key_line("grid", kind, index)
        if not isinstance(grid, dict):
            raise self.error(
                line, f"[{kind}.grid] must be a table of arrays, not {_type_name(grid)}"
            )
        if not grid:
            raise self.error(
                line,
                f"[{kind}.grid] is empty: give each placeholder an array of values, e.g. "
                "BLOCK = [128, 256] (or remove the table)",
            )
        for name, values in grid.items():
            vline = self.lines.key_line(name, kind, index, sub="grid")
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise self.error(
                    vline, f"grid variable {name!r} is not a name (letters, digits, _)"
                )
            if not isinstance(values, list) or not all(isinstance(v, _SCALARS) for v in values):
                raise self.error(
                    vline,
                    f"grid variable {name} must be an array of strings or numbers, "
                    f"e.g. {name} = [128, 256], not {_type_name(values)}",
                )
            if not values:
                raise self.error(
                    vline, f"grid variable {name} is an empty array: the grid would have no variant"
                )
        return grid

    # -- placeholders ------------------------------------------------------------

    def _subst(self, text: str, values: dict[str, str], line: int, what: str) -> str:
        def one(m: re.Match) -> str:
            name = m.group(1)
            if name not in values:
                known = ", ".join(values) or "none: this entry has no [grid]"
                raise self.error(
                    line,
                    f"{what}: unknown placeholder {{{name}}}; the grid defines {known}",
                )
            return values[name]

        return _PLACEHOLDER.sub(one, text)

    @staticmethod
    def _render(value: Any) -> str:
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value)

    # -- expansion ---------------------------------------------------------------

    def expand(self, data: dict) -> Manifest:
        if not isinstance(data, dict):
            raise self.error(0, "the manifest must be a TOML table")
        self._unknown(data, _TOP_KEYS, "the manifest", None, 0)
        default_archs: list[str] = []
        if "arch" in data:
            default_archs = self._archs(data["arch"], "arch", self.lines.key_line("arch"))
        manifest = Manifest(self.path, self.root)
        for kind in ("kernel", "extension", "python"):
            entries = data.get(kind, [])
            if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
                raise self.error(
                    self.lines.key_line(kind), f"{kind} must be written as [[{kind}]] tables"
                )
            for index, entry in enumerate(entries):
                if kind == "kernel":
                    manifest.tasks.extend(self._kernel(entry, index, default_archs))
                elif kind == "extension":
                    manifest.tasks.extend(self._extension(entry, index, default_archs))
                else:
                    manifest.tasks.extend(self._python(entry, index))
        if not manifest.tasks:
            raise self.error(
                0, "lists nothing to build: add a [[kernel]] (or [[extension]], [[python]]) table"
            )
        seen: dict[str, BuildTask] = {}
        for task in manifest.tasks:
            if task.label in seen:
                raise self.error(
                    task.line,
                    f"variant {task.label!r} is listed twice (also line {seen[task.label].line})",
                )
            seen[task.label] = task
        archs: list[str] = []
        for task in manifest.tasks:
            arch = task.spec.get("arch")
            for a in [arch] if isinstance(arch, str) else arch or []:
                if a not in archs:
                    archs.append(a)
        manifest.archs = archs
        return manifest

    def _plan(self, grid: dict[str, list], per_point: int, kind: str, index: int, line: int):
        """Count an entry's variants (grid points x ``per_point``) before expanding it: past
        :data:`MAX_VARIANTS` for the manifest, a ManifestError naming the entry and count."""
        count = per_point
        for values in grid.values():
            count *= len(values)
        self._planned += count
        if self._planned > MAX_VARIANTS:
            sizes = " x ".join(f"{len(v)} {n}" for n, v in grid.items()) or "no grid"
            raise self.error(
                line,
                f"[[{kind}]] #{index + 1} expands to {count:,} variants ({sizes} grid values "
                f"x {per_point} archs and name expressions); a manifest may list at most {MAX_VARIANTS:,} "
                f"(this one {self._planned:,} so far): split the grid or narrow it",
            )

    def _combos(self, grid: dict[str, list], used: set[str], kind: str, index: int):
        for _raw, rendered in self._raw_combos(grid, used, kind, index):
            yield rendered

    def _raw_combos(self, grid: dict[str, list], used: set[str], kind: str, index: int):
        """(raw values, rendered values) of every grid point."""
        for name in grid:
            if name not in used:
                raise self.error(
                    self.lines.key_line(name, kind, index, sub="grid"),
                    f"grid variable {name} is used by no placeholder {{{name}}}: every value "
                    "would build the same variant; use it or remove it",
                )
        names = list(grid)
        for combo in itertools.product(*(grid[n] for n in names)):
            raw = dict(zip(names, combo, strict=True))
            yield raw, {n: self._render(v) for n, v in raw.items()}

    def _kernel(self, entry: dict, index: int, default_archs: list[str]) -> list[BuildTask]:
        kl = self.lines.key_line
        self._unknown(entry, _KERNEL_KEYS, "[[kernel]]", "kernel", index)
        entry_line = kl("source", "kernel", index)
        source = entry.get("source")
        if source is None:
            raise self.error(entry_line, 'this [[kernel]] has no source: add source = "file.cu"')
        if not isinstance(source, str) or not source:
            raise self.error(entry_line, f"source must be a file name, not {_type_name(source)}")
        if not os.path.isfile(os.path.join(self.root, source)):
            raise self.error(
                entry_line,
                f"source {source!r} does not exist (looked for {os.path.join(self.root, source)}; "
                "paths are relative to the manifest's directory)",
            )
        include_dirs = self._str_list(
            entry.get("include_dirs", []), "include_dirs", kl("include_dirs", "kernel", index)
        )
        exprs = self._str_list(
            entry.get("name_expressions", []),
            "name_expressions",
            kl("name_expressions", "kernel", index),
        )
        options = self._str_list(
            entry.get("options", []), "options", kl("options", "kernel", index)
        )
        defines = entry.get("defines", {})
        dline = kl("defines", "kernel", index)
        if not isinstance(defines, dict) or not all(
            isinstance(v, _SCALARS) for v in defines.values()
        ):
            raise self.error(dline, 'defines must be a table of values, e.g. { TILE = "{BLOCK}" }')
        backend = entry.get("backend", "nvrtc")
        if backend not in ("nvrtc", "nvcc"):
            raise self.error(
                kl("backend", "kernel", index),
                f'backend must be "nvrtc" or "nvcc", not {backend!r}',
            )
        output = entry.get("output", "cubin")
        if output not in ("cubin", "ptx", "fatbin"):
            raise self.error(
                kl("output", "kernel", index),
                f'output must be "cubin", "ptx" or "fatbin", not {output!r}',
            )
        archs = (
            self._archs(entry["arch"], "arch", kl("arch", "kernel", index))
            if "arch" in entry
            else default_archs
        )
        grid = self._grid(entry, "kernel", index)
        per_point = (1 if output == "fatbin" or not archs else len(archs)) * max(len(exprs), 1)
        self._plan(grid, per_point, "kernel", index, entry_line)
        used = set()
        for text in [*exprs, *options, *include_dirs, *(str(v) for v in defines.values())]:
            used.update(_PLACEHOLDER.findall(text))
        tasks = []
        for values in self._combos(grid, used, "kernel", index):
            sub = self._subst
            v_exprs = [
                sub(e, values, kl("name_expressions", "kernel", index), "name_expressions")
                for e in exprs
            ]
            v_opts = [sub(o, values, kl("options", "kernel", index), "options") for o in options]
            v_dirs = [
                sub(d, values, kl("include_dirs", "kernel", index), "include_dirs")
                for d in include_dirs
            ]
            v_defs = {
                k: sub(self._render(v), values, dline, f"defines.{k}") for k, v in defines.items()
            }
            arch_sets: list[Any] = (
                [archs] if output == "fatbin" and archs else [[a] for a in archs] or [None]
            )
            for arch in arch_sets:
                for expr in list(dict.fromkeys(v_exprs)) or [None]:
                    spec: dict[str, Any] = {
                        "source": source,
                        "include_dirs": v_dirs,
                        "name_expressions": [expr] if expr else [],
                        "defines": v_defs,
                        "options": v_opts,
                        "arch": None if arch is None else (arch if output == "fatbin" else arch[0]),
                        "backend": backend,
                        "output": output,
                    }
                    variant = expr or " ".join(f"{k}={v}" for k, v in values.items())
                    arch_text = "default arch" if arch is None else ",".join(arch)
                    label = "  ".join(p for p in (source, variant, arch_text) if p)
                    tasks.append(self._task(label, "kernel", spec, entry_line))
        return tasks

    def _extension(self, entry: dict, index: int, default_archs: list[str]) -> list[BuildTask]:
        kl = self.lines.key_line
        self._unknown(entry, _EXTENSION_KEYS, "[[extension]]", "extension", index)
        name_line = kl("name", "extension", index)
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise self.error(name_line, 'this [[extension]] needs name = "module_name"')
        sline = kl("sources", "extension", index)
        sources = self._str_list(entry.get("sources", []), "sources", sline)
        if not sources:
            raise self.error(sline, 'this [[extension]] needs sources = ["ext.cpp", ...]')
        for s in sources:
            if not os.path.isfile(os.path.join(self.root, s)):
                raise self.error(
                    sline,
                    f"source {s!r} does not exist (looked for {os.path.join(self.root, s)}; "
                    "paths are relative to the manifest's directory)",
                )
        lists = {
            k: self._str_list(entry.get(k, []), k, kl(k, "extension", index))
            for k in ("extra_cflags", "extra_cuda_cflags", "extra_ldflags", "extra_include_paths")
        }
        archs = (
            self._archs(entry["arch"], "arch", kl("arch", "extension", index))
            if "arch" in entry
            else default_archs
        )
        grid = self._grid(entry, "extension", index)
        self._plan(grid, 1, "extension", index, name_line)
        used = set(_PLACEHOLDER.findall(name))
        for values in lists.values():
            for text in values:
                used.update(_PLACEHOLDER.findall(text))
        tasks = []
        for values in self._combos(grid, used, "extension", index):
            v_name = self._subst(name, values, name_line, "name")
            if not v_name.isidentifier() or keyword.iskeyword(v_name):
                raise self.error(
                    name_line,
                    f"extension name {v_name!r} is not a Python identifier (letters, digits "
                    "and _, not starting with a digit): it names the module and its build "
                    'directory, e.g. name = "my_ext"',
                )
            spec: dict[str, Any] = {"name": v_name, "sources": sources, "arch": archs or None}
            for k, items in lists.items():
                spec[k] = [self._subst(t, values, kl(k, "extension", index), k) for t in items]
            label = "  ".join((v_name, ",".join(archs) or "default arch"))
            tasks.append(self._task(label, "extension", spec, name_line))
        return tasks

    def _python(self, entry: dict, index: int) -> list[BuildTask]:
        kl = self.lines.key_line
        self._unknown(entry, _PYTHON_KEYS, "[[python]]", "python", index)
        call_line = kl("call", "python", index)
        call = entry.get("call")
        if call is None:
            raise self.error(
                call_line,
                'this [[python]] has no call: add call = "module:function" (a module under '
                "the manifest's directory, a function that makes cuforge.cccl / cuforge.cute "
                "calls)",
            )
        if not isinstance(call, str) or not _CALL.fullmatch(call):
            shown = repr(call) if isinstance(call, str) else _type_name(call)
            raise self.error(
                call_line,
                f'call must be "module:function" (e.g. "kernels:build_all" or '
                f'"pkg.kernels:build"), not {shown}',
            )
        fline = kl("files", "python", index)
        files = self._str_list(entry.get("files", []), "files", fline)
        try:
            python_module_files(call.split(":")[0], self.root)
        except ValueError as exc:
            raise self.error(call_line, f"call {call!r}: {exc}") from None
        for pattern in files:
            try:
                python_files({"call": call, "files": [pattern]}, self.root)
            except ValueError as exc:
                raise self.error(fline, f"files: {exc}") from None
        kwline = kl("kwargs", "python", index)
        kwargs = entry.get("kwargs", {})
        if not isinstance(kwargs, dict):
            raise self.error(
                kwline,
                f'kwargs must be a table of keyword arguments, e.g. {{ dtype = "{{T}}" }}, '
                f"not {_type_name(kwargs)}",
            )
        self._json_value(kwargs, "kwargs", kwline)
        archs: list[str] = []
        if "arch" in entry:
            archs = self._archs(entry["arch"], "arch", kl("arch", "python", index))
            if "arch" in kwargs:
                raise self.error(
                    kwline,
                    "kwargs.arch and arch are both given: arch already passes each arch as "
                    "the arch keyword argument; remove one",
                )
        grid = self._grid(entry, "python", index)
        self._plan(grid, max(len(archs), 1), "python", index, call_line)
        used: set[str] = set()
        self._placeholders(kwargs, used)
        tasks = []
        for raw, values in self._raw_combos(grid, used, "python", index):
            v_kwargs = self._subst_value(kwargs, raw, values, kwline, "kwargs")
            for arch in archs or [None]:
                spec: dict[str, Any] = {
                    "call": call,
                    "kwargs": v_kwargs,
                    "arch": arch,
                    "files": files,
                }
                variant = " ".join(f"{k}={v}" for k, v in values.items())
                label = "  ".join(p for p in (call, variant, arch or "") if p)
                tasks.append(self._task(label, "python", spec, call_line))
        return tasks

    def _json_value(self, value: Any, what: str, line: int) -> None:
        """``value`` is made of JSON types (what travels to a worker), else ManifestError."""
        if isinstance(value, dict):
            for k, v in value.items():
                self._json_value(v, f"{what}.{k}", line)
        elif isinstance(value, list):
            for i, v in enumerate(value):
                self._json_value(v, f"{what}[{i}]", line)
        elif not isinstance(value, _SCALARS):
            raise self.error(
                line,
                f"{what} is {_type_name(value)}: keyword arguments must be strings, numbers, "
                "booleans, arrays or tables (write a date or time as a string)",
            )

    def _placeholders(self, value: Any, used: set[str]) -> None:
        if isinstance(value, str):
            used.update(_PLACEHOLDER.findall(value))
        elif isinstance(value, dict):
            for v in value.values():
                self._placeholders(v, used)
        elif isinstance(value, list):
            for v in value:
                self._placeholders(v, used)

    def _subst_value(self, value: Any, raw: dict, values: dict, line: int, what: str) -> Any:
        """``value`` with its placeholders expanded; a string that is exactly one
        placeholder (``"{BLOCK}"``) becomes the grid value itself, type kept (``128``)."""
        if isinstance(value, str):
            m = _PLACEHOLDER.fullmatch(value)
            if m and m.group(1) in raw:
                return raw[m.group(1)]
            return self._subst(value, values, line, what)
        if isinstance(value, dict):
            return {
                k: self._subst_value(v, raw, values, line, f"{what}.{k}") for k, v in value.items()
            }
        if isinstance(value, list):
            return [self._subst_value(v, raw, values, line, what) for v in value]
        return value

    def _task(self, label: str, kind: str, spec: dict, line: int) -> BuildTask:
        files: dict[str, str] = {}
        if self.with_files:
            if kind == "kernel":
                ident = (kind, spec["source"], tuple(spec["include_dirs"]))
            elif kind == "python":
                ident = (kind, spec["call"], tuple(spec["files"]))
            else:
                ident = (kind, tuple(spec["sources"]), tuple(spec["extra_include_paths"]))
            files = self._files.get(ident)  # type: ignore[assignment]
            if files is None:
                try:
                    files = task_files(kind, spec, self.root)
                except (OSError, ValueError) as exc:
                    raise self.error(line, f"{label}: {exc}") from None
                self._files[ident] = files
        return BuildTask(label, kind, spec, dict(files), line=line, manifest=self.path)
