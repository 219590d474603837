"""Which files a compilation reads, and what they contain.

* :func:`file_digest` -- a file's SHA-256, memoized per process by (mtime_ns, size, inode)
  so that re-checking unchanged headers costs one ``stat`` each.
* :func:`parse_depfile` -- the Make-style dependency file nvcc and gcc write with ``-MD -MF``.
* :func:`scan_includes` -- cuforge's own include scanner, for compilers that report no
  dependencies (NVRTC 13). It reads directives the way the preprocessor does, after
  translation phases 1-3 (line splices joined, comments replaced by a space, string and
  character literals kept), and over-approximates: every ``#include`` line counts, whatever
  ``#if`` it sits under, and includes it cannot resolve are recorded as such.

Headers under a *system* root (the CUDA toolkit's include directories) are not hashed:
the compiler identity in the key covers them.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Mapping, Sequence

from cuforge.base._fs import NotRegularFile, read_bytes
from cuforge.keys.key import file_digest_of

__all__ = [
    "file_digest",
    "stat_signature",
    "settled",
    "parse_depfile",
    "scan_includes",
    "IncludeScan",
    "directives",
    "join_path",
]

#: A file changed less than this long ago may change again within the same timestamp tick
#: (file systems stamp with a coarse clock), so its stat signature is not trusted yet.
SETTLE_NS = 2_000_000_000

# path -> ((mtime_ns, size, inode, ctime_ns), digest)
_digest_memo: dict[str, tuple[tuple[int, int, int, int], str]] = {}


def stat_signature(path: str) -> tuple[int, int, int, int] | None:
    """(mtime_ns, size, inode, ctime_ns) of ``path``, or None when it does not exist."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino, st.st_ctime_ns)


def settled(sig: tuple[int, int, int, int]) -> bool:
    """True when the file last changed long enough ago that an unchanged signature means
    unchanged content (as ccache's "file too new" rule)."""
    return time.time_ns() - max(sig[0], sig[3]) > SETTLE_NS


def file_digest(path: str) -> str | None:
    """SHA-256 of the file's bytes, or None when it cannot be read.

    Memoized by the file's stat signature: a touched-but-unchanged file is re-hashed once
    and gives the same digest; an unchanged one is not read at all. A file that changed in
    the last two seconds is re-hashed on every call until it settles.
    """
    sig = stat_signature(path)
    if sig is None:
        _digest_memo.pop(path, None)
        return None
    memo = _digest_memo.get(path)
    if memo is not None and memo[0] == sig:
        return memo[1]
    try:
        digest = file_digest_of(path)
    except OSError:
        return None  # vanished, unreadable or not a regular file: not a header we can key
    if settled(sig):
        _digest_memo[path] = (sig, digest)
    else:
        _digest_memo.pop(path, None)
    return digest


def parse_depfile(text: str) -> list[str]:
    """The prerequisites of a Make-style depfile (``target: a.h b.h \\`` ...), in order,
    without duplicates. Handles escaped spaces and line continuations."""
    body = text.replace("\\\r\n", " ").replace("\\\n", " ")
    deps: list[str] = []
    seen: set[str] = set()
    for rule in body.splitlines():
        if ":" not in rule:
            continue
        # the first unescaped ': ' ends the targets (a Windows drive letter has no space after it)
        idx = rule.find(": ")
        if idx < 0 and rule.rstrip().endswith(":"):
            continue
        prereqs = rule[idx + 2 :] if idx >= 0 else ""
        token = ""
        i = 0
        while i < len(prereqs):
            ch = prereqs[i]
            if ch == "\\" and i + 1 < len(prereqs) and prereqs[i + 1] == " ":
                token += " "
                i += 2
                continue
            if ch.isspace():
                if token and token not in seen:
                    seen.add(token)
                    deps.append(token)
                token = ""
            else:
                token += ch
            i += 1
        if token and token not in seen:
            seen.add(token)
            deps.append(token)
    return deps


class IncludeScan:
    """What :func:`scan_includes` found.

    ``headers``: user headers read, absolute paths in discovery order (pre-includes, files
    named by ``__has_include`` and ``#embed`` included).
    ``unresolved``: include names found nowhere (left to the compiler, e.g. headers NVRTC
    supplies itself); they stay in the key by name.
    ``probes``: paths that do not exist now where a file, if created, would change what
    an include or a ``__has_include`` resolves to (the places tried before the header
    found, or every place tried when none was found). The pipeline keys on their absence.
    ``computed``: True when an ``#include MACRO`` (or ``__has_include(MACRO)``) was seen.
    The scan follows a macro defined as a plain header name (``#define H "a.h"`` in a
    scanned file, or ``-DH="a.h"`` on the command line) but cannot know every definition
    the compiler sees, so the pipeline keys on every file under the user include
    directories too.
    ``uncacheable``: why the compile cannot be keyed (None when it can): a computed include
    names a macro the command line defines as something other than a header name.
    ``system``: the files found under a system root that the scanned files include
    directly, in discovery order (not followed, not hashed).
    """

    __slots__ = ("headers", "unresolved", "probes", "computed", "uncacheable", "system")

    def __init__(self) -> None:
        self.headers: list[str] = []
        self.unresolved: list[str] = []
        self.probes: list[str] = []
        self.computed = False
        self.uncacheable: str | None = None
        self.system: list[str] = []

    def __repr__(self) -> str:
        return (
            f"IncludeScan(headers={self.headers!r}, unresolved={self.unresolved!r}, "
            f"probes={self.probes!r}, computed={self.computed!r}, "
            f"uncacheable={self.uncacheable!r}, system={self.system!r})"
        )


# -- reading directives after translation phases 1-3 ------------------------------------

# Compiled on first use (``re`` is not imported on the import or cache-hit path).
_regexes: tuple | None = None
_phase3_variants: dict[tuple[bool, bool], object] = {}

# Phase 3: comments become one space; string and character literals are kept as they are
# (so "//" inside a string is no comment). Every branch starts with a fixed character,
# which lets the regex engine skip plain code quickly; block comments use the unrolled
# loop form. Raw strings (R"d(...)d", any prefix) and pp-numbers holding a digit
# separator (1'000: that quote starts no character literal; the digit must not end an
# identifier such as u8) are rare: their branches are added only for a text that has them.
_COMMENTS = r"//[^\n]*|/\*[^*]*\*+(?:[^/*][^*]*\*+)*/|/\*.*"
_LITERALS = r"\"(?:[^\"\\\n]|\\.)*\"?|'(?:[^'\\\n]|\\.)*'?"
# An angled header name is one token where a directive or __has_include expects it, so
# "//" or "/*" inside it starts no comment (#include <a//b.h>).
_ANGLED = (
    r"(?:\#|%:)[ \t\f\v]*(?:include_next|include|import|embed)[ \t\f\v]*<[^>\n]*>"
    r"|__has_\w+[ \t\f\v]*\([ \t\f\v]*<[^>\n]*>"
)
_RAW_STRING = r'R"(?P<d>[^ ()\\\t\v\f\n"]{0,16})\(.*?(?:\)(?P=d)"|\Z)'
_DIGIT_SEPARATED = r"\d(?<![A-Za-z_]\d)[\w.]*'(?:[\w.]|[eEpP][+-]|'(?=\w))*"
# A directive: ``#`` (or the digraph ``%:``) first on a logical line (the pattern starts at
# the newline before it, a fixed character the engine finds fast), then include,
# include_next, import or embed and the rest of the line; or a define whose body is one
# header name (``#define HEADER "a.h"``), which a computed include may name.
_DIRECTIVE = (
    r"\n[ \t\f\v]*(?:\#|%:)[ \t\f\v]*(?:"
    r"(include_next|include|import|embed)(?!\w)[ \t\f\v]*([^\n]*)"
    r"|define[ \t\f\v]+([A-Za-z_]\w*)[ \t\f\v]+(\"[^\"\n]*\"|<[^>\n]*>)"
    r"[ \t\f\v]*(?://[^\n]*)?$)"
)
_HAS_INCLUDE = (
    r"__has_(include_next|include|embed)(?!\w)\s*\(\s*(\"[^\"\n]*\"|<[^>\n]*>|[A-Za-z_]\w*)?"
)
# A backslash, blanks, then a newline: gcc splices it (with a warning), the standard does not.
_LOOSE_SPLICE = r"\\[ \t\f\v]+\n"
_TRIGRAPHS = {
    "=": "#",
    "/": "\\",
    "'": "^",
    "(": "[",
    ")": "]",
    "!": "|",
    "<": "{",
    ">": "}",
    "-": "~",
}


def _compiled() -> tuple:
    global _regexes
    if _regexes is None:
        import re  # re: ~10 ms to import, only when includes are scanned

        _regexes = (
            re.compile(_DIRECTIVE, re.M),
            re.compile(_HAS_INCLUDE),
            re.compile(_LOOSE_SPLICE),
            re.compile(r"\?\?([=/'()!<>-])"),
            re.compile(r"[A-Za-z_]\w*"),
            re.compile(r"'(?<=\d')\w"),  # a digit separator (starts at a fixed char: fast)
        )
    return _regexes


def _phase3(raw: bool, separators: bool):
    pattern = _phase3_variants.get((raw, separators))
    if pattern is None:
        import re

        keep = [_ANGLED, _LITERALS]
        if raw:
            keep.insert(0, _RAW_STRING)
        if separators:
            keep.insert(0, _DIGIT_SEPARATED)
        pattern = re.compile(f"{_COMMENTS}|({'|'.join(keep)})", re.S)
        _phase3_variants[(raw, separators)] = pattern
    return pattern


def _comment_to_space(m) -> str:
    return m.group(1) or " "


def _logical_text(text: str, *, loose: bool = False, trigraphs: bool = False) -> str:
    """``text`` after phases 1-3: newlines normalized, (trigraphs replaced,) backslash-newline
    splices removed, comments replaced by one space, literals kept.

    A text without block comments keeps its line comments: they can neither hide a line
    nor join two, and the directive parser ignores a trailing ``// ...`` itself, so the
    costly phase-3 pass is skipped."""
    _, _, loose_splice, trigraph, _, digit_quote = _compiled()
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    if trigraphs:
        text = trigraph.sub(lambda m: _TRIGRAPHS[m.group(1)], text)
    if loose:
        text = loose_splice.sub("", text)
    if "\\\n" in text:
        text = text.replace("\\\n", "")
    if "/*" in text:
        raw = 'R"' in text
        separators = "'" in text and digit_quote.search(text) is not None
        text = _phase3(raw, separators).sub(_comment_to_space, text)
    return text


# A directive found: (kind, delimiter, name, is_next). kind is "include", "embed", "has"
# (``__has_include``), "has_embed" or "define" (then ``is_next`` holds the macro's name);
# delimiter is '"', '<' or '' (computed: ``name`` is the macro's name, or '' when it is
# not a plain identifier).
_Directive = tuple


def _directives_of(text: str) -> list[_Directive]:
    directive, has_include, _, _, ident, _ = _compiled()
    found: list[_Directive] = []
    for word, rest, macro, body in directive.findall("\n" + text):
        if not word:
            found.append(("define", body[0], body[1:-1], macro))
            continue
        kind = "embed" if word == "embed" else "include"
        found.append(_operand(kind, rest.strip(), word == "include_next", ident))
    if "__has_" in text:
        for word, arg in has_include.findall(text):
            kind = "has_embed" if word == "embed" else "has"
            found.append(_operand(kind, arg, word == "include_next", ident))
    return [d for d in found if d is not None]


def _operand(kind: str, rest: str, is_next: bool, ident) -> _Directive | None:
    if rest.startswith('"'):
        end = rest.find('"', 1)
        return (kind, '"', rest[1:end], is_next) if end > 1 else None
    if rest.startswith("<"):
        end = rest.find(">", 1)
        return (kind, "<", rest[1:end], is_next) if end > 1 else None
    if rest.startswith("//"):
        rest = ""  # a line comment (left in place when the text has no block comment)
    if not rest:
        return ("has", "", "", is_next) if kind == "has" else None
    m = ident.match(rest)
    plain = m is not None and not rest[m.end() :].lstrip().startswith("(")
    return (kind, "", m.group(0) if plain else "", is_next)


def directives(text: str) -> list[_Directive]:
    """Every include-like directive of ``text`` (see :data:`_Directive`), read after
    translation phases 1-3. Where the compiler's reading is not certain (trigraphs; a
    backslash followed by blanks before the newline), both readings count."""
    found = _directives_of(_logical_text(text))
    extra: list[_Directive] = []
    if "??" in text:
        extra += _directives_of(_logical_text(text, trigraphs=True))
    if "\\" in text and _compiled()[2].search(text):
        extra += _directives_of(_logical_text(text, loose=True))
    if extra:
        known = set(found)
        for d in extra:
            if d not in known:
                known.add(d)
                found.append(d)
    return found


def _read_text(path: str) -> str:
    """The text of the regular file ``path`` (symlinks followed: user headers may be links).
    Raises ``OSError``, also at once for a FIFO or device instead of blocking."""
    return read_bytes(path, follow=True).decode("utf-8", "surrogateescape")


_REGULAR, _MISSING, _OTHER = "regular", "missing", "other"
_FIFO, _DEVICE = "a FIFO", "a device"


def _file_state(path: str) -> str:
    """Whether ``path`` (symlinks followed) is a regular file, missing (a probe: the key
    depends on its absence), a FIFO or a device (which the compiler would open and block
    on, or read without end), or something else it passes over (a directory)."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return _MISSING
    except OSError:
        return _OTHER  # e.g. permission denied: neither readable nor creatable by us
    if stat.S_ISREG(mode):
        return _REGULAR
    if stat.S_ISFIFO(mode):
        return _FIFO
    return _DEVICE if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else _OTHER


def join_path(directory: str, name: str) -> str:
    """``name`` (relative to ``directory``, or absolute) as the OS finds it: normalized
    (``.`` and doubled separators dropped), but every ``..`` is kept. After a symlinked
    directory ``..`` leads up from the link's target, not back along the spelled path
    (``lnk/../x.h``), so only the OS can resolve it; it does so on every ``stat`` and
    open of the kept spelling, again after the link changes, as it does for the compiler."""
    path = os.path.join(directory, name)
    parts = path.split(os.sep)
    if ".." not in parts:
        return os.path.normpath(path)
    kept = [p for p in parts if p not in ("", ".")]
    if path.startswith(os.sep):
        while kept and kept[0] == "..":
            del kept[0]  # "/.." is "/"
        return os.sep + os.sep.join(kept)
    return os.sep.join(kept) or "."


def _resolved(path: str) -> str:
    """``path`` with its ``..`` resolved as the OS does (for telling where it lies)."""
    return os.path.realpath(path) if ".." in path.split(os.sep) else path


def _under(path: str, roots: Sequence[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip(os.sep) + os.sep) for r in roots)


class _Scanner:
    """The state of one :func:`scan_includes` call."""

    def __init__(
        self,
        include_dirs: Sequence[str],
        system_dirs: Sequence[str],
        max_files: int,
        defines: Mapping[str, str] | None = None,
        refuse_special: bool = False,
    ) -> None:
        self.scan = IncludeScan()
        cwd = os.getcwd()
        self.user_dirs = [join_path(cwd, d) for d in include_dirs]
        self.system_roots = [os.path.abspath(d) for d in system_dirs]
        self.max_files = max_files
        self.seen: set[str] = set()
        self.seen_system: set[str] = set()
        self.unresolved: set[str] = set()
        self.probed: set[str] = set()
        self.stack: list[tuple[str, str | None]] = []
        # macro -> [(delimiter, header name)] from ``#define MACRO "x.h"`` lines seen
        self.defines: dict[str, list[tuple[str, str]]] = {}
        # computed includes: (kind, macro, directory of the includer, is_next)
        self.pending: list[tuple[str, str, str | None, bool]] = []
        self.resolved: set[tuple[int, str, str]] = set()
        self.refuse_special = refuse_special
        # the command line's macros (-D): a header name counts as a #define of one; a macro
        # naming another macro is an alias; any other body cannot be followed
        self.aliases: dict[str, str] = {}
        self.opaque: dict[str, str] = {}
        for macro, body in (defines or {}).items():
            body = body.strip()
            if len(body) > 2 and (body[0], body[-1]) in (('"', '"'), ("<", ">")):
                self.defines.setdefault(macro, []).append((body[0], body[1:-1]))
            elif body.isidentifier():
                self.aliases[macro] = body
            else:
                self.opaque[macro] = body

    def candidates(self, delim: str, name: str, here: str | None) -> list[str]:
        """Where the compiler looks for ``name``, in order: a quoted name first in the
        including file's directory, then the -I directories, then the toolkit's."""
        if os.path.isabs(name):
            return [join_path(os.sep, name)]
        dirs = self.user_dirs + self.system_roots
        if delim == '"' and here is not None:
            dirs = [here, *dirs]
        return [join_path(d, name) for d in dirs]

    def probe(self, path: str) -> None:
        if path not in self.probed:
            self.probed.add(path)
            self.scan.probes.append(path)

    def special(self, path: str, state: str, what: str) -> None:
        """A FIFO or device where the compiler looks: it would hang on it (or read without
        end), so with ``refuse_special`` it is an error naming it; otherwise passed over."""
        if self.refuse_special:
            raise NotRegularFile(
                f"{path} ({what}) is {state}, not a regular file: the compiler would "
                f"{'wait on it forever' if state is _FIFO else 'read it without end'}. "
                "Remove it or rename it, or change the include path."
            )

    def header(self, path: str, follow: bool) -> None:
        where = _resolved(path)
        if _under(where, self.system_roots) and not _under(where, self.user_dirs):
            if path not in self.seen_system:
                self.seen_system.add(path)
                self.scan.system.append(path)
            return  # the toolkit: covered by the compiler identity
        if path in self.seen:
            return
        self.seen.add(path)
        self.scan.headers.append(path)
        if follow:
            self.stack.append((path, os.path.dirname(path)))

    def lookup(self, kind: str, delim: str, name: str, here: str | None, is_next: bool) -> None:
        follow = kind in ("include", "has")
        found = False
        for cand in self.candidates(delim, name, here):
            lexical = os.path.normpath(cand)
            if lexical != cand:
                # a ".." kept for the OS (join_path); a compiler that normalizes the path
                # by its spelling would read this file: key it too (over-approximation)
                alt = _file_state(lexical)
                if alt is _REGULAR:
                    self.header(lexical, follow)
                elif alt is _MISSING:
                    self.probe(lexical)
            state = _file_state(cand)
            if state is _MISSING:
                self.probe(cand)
            elif state is _REGULAR:
                found = True
                self.header(cand, follow)
                if not is_next:
                    break
            elif state is not _OTHER:
                close = ">" if delim == "<" else delim
                self.special(cand, state, f"#{kind} {delim}{name}{close}")
            # else: something that is no file (a directory...): the compiler moves on
        # include_next starts after the includer's own directory: every existing candidate
        # may be the one read, so all of them count (over-approximation)
        if not found and kind in ("include", "embed") and name not in self.unresolved:
            self.unresolved.add(name)
            self.scan.unresolved.append(name)

    def visit(self, text: str, here: str | None) -> None:
        for kind, delim, name, extra in directives(text):
            if kind == "define":
                defs = self.defines.setdefault(extra, [])
                if (delim, name) not in defs:
                    defs.append((delim, name))
            elif delim:
                self.lookup(kind, delim, name, here, extra)
            else:
                self.scan.computed = True
                if name:
                    self.pending.append((kind, name, here, extra))

    def drain(self) -> None:
        while self.stack and len(self.seen) < self.max_files:
            path, here = self.stack.pop()
            try:
                text = _read_text(path)
            except OSError:
                continue  # listed as a header; its digest records that it cannot be read
            self.visit(text, here)

    def resolve_macros(self) -> bool:
        """Follow computed includes whose macro was seen defined as a header name (in a
        scanned file or on the command line); True when that found anything new to look
        at. A macro the command line defines as anything else makes the scan
        ``uncacheable``."""
        progress = False
        for i, (kind, first, here, is_next) in enumerate(list(self.pending)):
            macro = first
            chain = {macro}
            while macro in self.aliases and self.aliases[macro] not in chain:
                macro = self.aliases[macro]
                chain.add(macro)
            body = next((self.opaque[m] for m in chain if m in self.opaque), None)
            if body is not None and self.scan.uncacheable is None:
                self.scan.uncacheable = (
                    f"a computed #include names the macro {first}, which the command line "
                    f"defines as {body!r}: cuforge cannot tell which file that names, so the "
                    f'compile is not cached (define it as a header name, "x.h" or <x.h>)'
                )
            defs = [d for m in chain for d in self.defines.get(m, ())]
            for delim, name in defs:
                if (i, delim, name) in self.resolved:
                    continue
                self.resolved.add((i, delim, name))
                progress = True
                self.lookup(kind, delim, name, here, is_next)
        return progress


def scan_includes(
    source: str,
    *,
    source_dir: str | None,
    include_dirs: Sequence[str],
    system_dirs: Sequence[str] = (),
    pre_includes: Sequence[str] = (),
    max_files: int = 10_000,
    defines: Mapping[str, str] | None = None,
    refuse_special: bool = False,
) -> IncludeScan:
    """Follow the include directives of ``source`` through ``include_dirs``.

    Directives are read after translation phases 1-3, so comments inside them and
    backslash-newline splices anywhere in them are no obstacle. A quoted include is
    looked for first in the including file's directory (``source_dir`` for the main
    source: the directory of a compiled file; None for a string source), then in
    ``include_dirs`` in order, then in ``system_dirs``; an angled include skips the first
    step. Files found under ``system_dirs`` (the toolkit's include roots) are not followed
    or hashed. ``__has_include`` names a header where its file is found, and every place
    it would be found if created is a probe. ``pre_includes`` (``--pre-include=``,
    ``-include``) are read before the source: each one found where the compiler may look
    (the working directory, ``source_dir``, ``include_dirs``) is a header and is scanned
    in turn. ``#include MACRO`` sets ``computed``; where the scanned files define MACRO as
    a header name (``#define MACRO "x.h"``), that header is followed too, and so is one
    that ``defines`` (the command line's ``-D``, name -> body) gives as a header name,
    wherever it leads; where ``defines`` gives MACRO another body, the scan is
    ``uncacheable``. A file named by ``#embed`` is a header but is not scanned. At most
    ``max_files`` headers are followed. A ``..`` in a path is kept (:func:`join_path`).
    ``refuse_special``: a FIFO or device where the compiler would look (it would block on
    it, or read without end) raises :class:`cuforge.base._fs.NotRegularFile` naming it,
    instead of being passed over.
    """
    scanner = _Scanner(include_dirs, system_dirs, max_files, defines, refuse_special)
    for pre in pre_includes:
        _pre_include(scanner, pre, source_dir)
    scanner.visit(source, source_dir)
    scanner.drain()
    while scanner.pending and scanner.resolve_macros():
        scanner.drain()
    return scanner.scan


def _pre_include(scanner: _Scanner, name: str, source_dir: str | None) -> None:
    # The search order of a pre-include differs between compilers (gcc: the working
    # directory first; NVRTC: as a quoted include of the source); every existing candidate
    # is a header and every missing one a probe, which covers any order.
    if os.path.isabs(name):
        cands = [join_path(os.sep, name)]
    else:
        cands = [join_path(os.getcwd(), name)]
        cands += [c for c in scanner.candidates('"', name, source_dir) if c not in cands]
    found = False
    for cand in cands:
        state = _file_state(cand)
        if state is _REGULAR:
            found = True
            scanner.header(cand, follow=True)
        elif state is _MISSING:
            scanner.probe(cand)
        elif state is not _OTHER:
            scanner.special(cand, state, f"pre-included {name}")
    if not found and name not in scanner.unresolved:
        scanner.unresolved.add(name)
        scanner.scan.unresolved.append(name)
