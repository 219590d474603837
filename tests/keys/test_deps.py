"""Header discovery: depfile parsing, the include scanner, and the stat-memoized digest."""

from __future__ import annotations

import os

from cuforge.keys import deps
from cuforge.keys.deps import file_digest, parse_depfile, scan_includes


def test_parse_depfile_handles_continuations_and_escaped_spaces():
    text = "out.o: a.cu /inc/b.h \\\n  /inc/dir\\ with\\ space/c.h \\\n /inc/b.h\n/inc/b.h:\n"
    assert parse_depfile(text) == ["a.cu", "/inc/b.h", "/inc/dir with space/c.h"]


def test_scan_follows_quoted_angle_nested_and_relative_includes(tmp_path):
    inc, sysinc = tmp_path / "inc", tmp_path / "sys"
    (inc / "sub").mkdir(parents=True)
    sysinc.mkdir()
    (inc / "a.cuh").write_text('#include "sub/b.cuh"\n')
    (inc / "sub" / "b.cuh").write_text('#include "c.cuh"\n')  # relative to sub/
    (inc / "sub" / "c.cuh").write_text("#if 0\n#include <d.cuh>\n#endif\n")  # counted anyway
    (inc / "d.cuh").write_text("")
    (sysinc / "toolkit.h").write_text('#include "never_followed.h"\n')
    src = '#include "a.cuh"\n  #  include <toolkit.h>\n#include <cuda_fp16.h>\n#include MACRO_HEADER\n'
    scan = scan_includes(src, source_dir=None, include_dirs=[str(inc)], system_dirs=[str(sysinc)])
    names = [os.path.relpath(h, inc) for h in scan.headers]
    assert names == ["a.cuh", "sub/b.cuh", "sub/c.cuh", "d.cuh"]
    assert "cuda_fp16.h" in scan.unresolved
    assert scan.computed
    # the system header is listed where it is included directly, not followed
    assert scan.system == [str(sysinc / "toolkit.h")]


def test_scan_records_shadowing_probes(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    (second / "v.cuh").write_text("")
    scan = scan_includes(
        '#include "v.cuh"\n', source_dir=None, include_dirs=[str(first), str(second)]
    )
    assert scan.headers == [str(second / "v.cuh")]
    assert str(first / "v.cuh") in scan.probes


def test_file_digest_memo_rehashes_only_on_change(tmp_path, monkeypatch):
    monkeypatch.setattr(deps, "SETTLE_NS", 0)  # treat every file as settled
    path = tmp_path / "h.cuh"
    path.write_text("one")
    first = file_digest(str(path))
    reads = []
    real_digest = deps.file_digest_of  # the one place deps reads a file to hash it
    monkeypatch.setattr(deps, "file_digest_of", lambda p: reads.append(p) or real_digest(p))
    assert file_digest(str(path)) == first
    assert reads == []  # unchanged stat: not read again
    monkeypatch.undo()
    path.write_text("two")
    assert file_digest(str(path)) != first
    assert file_digest(str(tmp_path / "missing.cuh")) is None


def test_recently_changed_file_is_rehashed_every_time(tmp_path, monkeypatch):
    path = tmp_path / "h.cuh"
    path.write_text("one")
    file_digest(str(path))
    assert str(path) not in deps._digest_memo  # changed within the settle window
