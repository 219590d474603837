"""The include scanner reads directives after translation phases 1-3: every spelling of an
include the compiler follows puts the header in the scan (and so in the key)."""

from __future__ import annotations

import os

import pytest

from cuforge.keys.deps import directives, file_digest, scan_includes

SPELLINGS = {
    "plain": '#include "a.h"\n',
    "no space": '#include"a.h"\n',
    "comment after hash": '# /* c */ include "a.h"\n',
    "comment before operand": '#include /*x*/ "a.h"\n',
    "comment before hash": '/* c */ #include "a.h"\n',
    "multi-line comment inside": '#include /* one\ntwo */ "a.h"\n',
    "trailing line comment": '#include "a.h" // why\n',
    "splice inside keyword": '#inc\\\nlude "a.h"\n',
    "splice before operand": '#include \\\n "a.h"\n',
    "splice after hash": '#\\\ninclude "a.h"\n',
    "splice with blanks (gcc)": '#include \\  \n"a.h"\n',
    "crlf line ends": 'int x;\r\n#include "a.h"\r\n',
    "crlf splice": '#include \\\r\n"a.h"\r\n',
    "digraph": '%:include "a.h"\n',
    "trigraph": '??=include "a.h"\n',
    "indented with tabs": '\t #\t include\t"a.h"\n',
    "after a string holding comment starts": 'const char* s = "/*";\n#include "a.h"\n// */\n',
    "after a char holding a quote": 'char q = \'"\';\n#include "a.h"\n',
    "after a digit separator": 'x = 1\'0 + f("\'/*");\n#include "a.h"\nint y; // */\n',
    "after a u8 char literal": "auto c = u8'/'; /* x */\n#include \"a.h\"\n",
    "after a raw string": 'auto s = R"x(/* not a comment )x";\n#include "a.h"\n// */\n',
    "after a prefixed raw string": 'auto s = u8R"(")";\n#include "a.h"\n',
    "include_next": '#include_next "a.h"\n',
    "macro defined as the name": '#define HEADER "a.h"\n#include HEADER\n',
    "macro defined as an angled name": "#define HEADER <a.h>\n#include HEADER\n",
    "macro defined in a later header": '#include "defs.h"\n#include MY_HEADER\n',
    "has_include": "#if __has_include(<a.h>)\n#endif\n",
    "has_include quoted": '#if __has_include ( "a.h" )\n#endif\n',
    "has_include_next": "#if __has_include_next(<a.h>)\n#endif\n",
    "embed": '#embed "a.h"\n',
    "angled name holding //": "/* c */\n#include <sub//a.h> // why\n",
    "angled name holding /*": "#include <sub/*/../a.h>\n/* c */\n",
    "has_include angled holding //": "#if __has_include(<sub//a.h>) // c\n#endif\n",
}


@pytest.fixture
def tree(tmp_path):
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "a.h").write_text("int a;\n")
    (inc / "sub").mkdir()
    (inc / "sub" / "a.h").write_text("int a;\n")
    (inc / "defs.h").write_text('#define MY_HEADER "a.h"\n')
    return inc


@pytest.mark.parametrize("name", sorted(SPELLINGS))
def test_every_spelling_reaches_the_header(tree, name):
    scan = scan_includes(SPELLINGS[name], source_dir=None, include_dirs=[str(tree)])
    wanted = tree / "sub" / "a.h" if "<sub/" in SPELLINGS[name] else tree / "a.h"
    assert str(wanted) in scan.headers, scan


@pytest.mark.parametrize(
    "text",
    [
        '// #include "a.h"\n',
        '/* #include "a.h" */\n',
        '/*\n#include "a.h"\n*/\n',
        '// a line comment continued \\\n#include "a.h"\n',
        'int x; /*\n*/ #include "a.h"\n',  # the # is not first on its logical line
        'const char* s = "#include \\"a.h\\"";\n',
    ],
)
def test_what_the_compiler_does_not_read_is_not_a_header(tree, text):
    scan = scan_includes(text, source_dir=None, include_dirs=[str(tree)])
    assert scan.headers == [] and not scan.computed


def test_computed_includes_set_the_flag(tree):
    for text in ("#include MACRO\n", "#include MACRO(x)\n", "#include /* c */ MACRO\n"):
        scan = scan_includes(text, source_dir=None, include_dirs=[str(tree)])
        assert scan.computed and scan.headers == [], text
    scan = scan_includes('#define H "a.h"\n#include H\n', source_dir=None, include_dirs=[str(tree)])
    assert scan.computed  # other definitions may exist (-D, #undef): the flag stays
    assert scan.headers == [str(tree / "a.h")]
    scan = scan_includes("#if __has_include(NAME)\n#endif\n", source_dir=None, include_dirs=[])
    assert scan.computed
    scan = scan_includes('#include "a.h"\n', source_dir=None, include_dirs=[str(tree)])
    assert not scan.computed


def test_has_include_of_a_missing_file_probes_every_place(tmp_path):
    first, second, here = tmp_path / "first", tmp_path / "second", tmp_path / "src"
    for d in (first, second, here):
        d.mkdir()
    scan = scan_includes(
        '#if __has_include("gone.h")\n#endif\n#if __has_include(<other.h>)\n#endif\n',
        source_dir=str(here),
        include_dirs=[str(first), str(second)],
    )
    assert scan.headers == []
    assert set(scan.probes) == {
        str(here / "gone.h"),
        str(first / "gone.h"),
        str(second / "gone.h"),
        str(first / "other.h"),
        str(second / "other.h"),
    }
    assert scan.unresolved == []  # not an include: nothing is left to the compiler


def test_has_include_of_a_present_file_is_a_header_and_is_followed(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    (second / "opt.h").write_text('#include "nested.h"\n')
    (second / "nested.h").write_text("")
    scan = scan_includes(
        "#if __has_include(<opt.h>)\n#endif\n",
        source_dir=None,
        include_dirs=[str(first), str(second)],
    )
    assert scan.headers == [str(second / "opt.h"), str(second / "nested.h")]
    assert str(first / "opt.h") in scan.probes  # created there, it would be found first


def test_pre_includes_are_headers_and_are_scanned(tmp_path, monkeypatch):
    inc, elsewhere = tmp_path / "inc", tmp_path / "cwd"
    inc.mkdir()
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    (inc / "pre.h").write_text('#include "nested.h"\n#include <angled.h>\n')
    (inc / "nested.h").write_text("")
    (inc / "angled.h").write_text("")
    absolute = tmp_path / "abs_pre.h"
    absolute.write_text('# /* spelled oddly */ include "nested.h"\n')
    scan = scan_includes(
        "int x;\n",
        source_dir=None,
        include_dirs=[str(inc)],
        pre_includes=["pre.h", str(absolute), "missing_pre.h"],
    )
    assert set(scan.headers) == {
        str(inc / "pre.h"),
        str(inc / "nested.h"),
        str(inc / "angled.h"),
        str(absolute),
    }
    assert str(elsewhere / "pre.h") in scan.probes  # the working directory is searched too
    assert "missing_pre.h" in scan.unresolved
    assert str(inc / "missing_pre.h") in scan.probes


def test_quoted_searches_the_includer_first_angled_does_not(tmp_path):
    inc, sub = tmp_path / "inc", tmp_path / "inc" / "sub"
    sub.mkdir(parents=True)
    (inc / "x.h").write_text("")
    (inc / "y.h").write_text("")
    (sub / "x.h").write_text("")
    (sub / "y.h").write_text("")
    (sub / "top.h").write_text('#include "x.h"\n#include <y.h>\n')
    scan = scan_includes('#include "sub/top.h"\n', source_dir=None, include_dirs=[str(inc)])
    assert scan.headers == [str(sub / "top.h"), str(sub / "x.h"), str(inc / "y.h")]


def test_include_next_counts_every_later_candidate(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    (first / "w.h").write_text("#include_next <w.h>\n")
    (second / "w.h").write_text("")
    scan = scan_includes(
        "#include <w.h>\n", source_dir=None, include_dirs=[str(first), str(second)]
    )
    assert scan.headers == [str(first / "w.h"), str(second / "w.h")]


def test_unresolved_include_probes_the_user_dirs(tmp_path):
    inc = tmp_path / "inc"
    inc.mkdir()
    scan = scan_includes("#include <cuda_fp16.h>\n", source_dir=None, include_dirs=[str(inc)])
    assert scan.unresolved == ["cuda_fp16.h"]
    assert scan.probes == [str(inc / "cuda_fp16.h")]  # a file made there would shadow it


def test_a_fifo_is_neither_read_nor_hashed(tmp_path):
    inc = tmp_path / "inc"
    inc.mkdir()
    os.mkfifo(inc / "f.h")
    (inc / "real.h").write_text("")
    os.symlink(inc / "real.h", inc / "link.h")
    scan = scan_includes(
        '#include "f.h"\n#include "link.h"\n', source_dir=None, include_dirs=[str(inc)]
    )
    assert scan.headers == [str(inc / "link.h")]  # a symlinked user header is followed
    assert file_digest(str(inc / "f.h")) is None  # returns at once, no hang
    assert file_digest(str(inc / "link.h")) == file_digest(str(inc / "real.h"))


def test_directives_reads_both_readings_where_compilers_differ():
    found = directives('#include \\ \n"a.h"\n')
    assert ("include", '"', "a.h", False) in found


@pytest.mark.parametrize(
    "text",
    [
        '#include "a.h" // only line comments here\n',
        "#include <a.h>// glued\n",
        '#define H "a.h" // the header\n#include H // computed\n',
        '// "a /* b" is no block comment\n#include "a.h"\n',
    ],
)
def test_line_comments_only(tree, text):
    scan = scan_includes(text, source_dir=None, include_dirs=[str(tree)])
    assert scan.headers == [str(tree / "a.h")], scan


def test_include_followed_by_a_line_comment_only_is_not_computed(tree):
    for text in ("#include // nothing\n", "#include /* nothing */\n"):
        scan = scan_includes(text, source_dir=None, include_dirs=[str(tree)])
        assert not scan.computed and scan.headers == [], text
