"""cuforge.cuda_core on the real cuda.core (NVRTC compiles cubin here with no GPU)."""

from __future__ import annotations

import inspect
import os

import pytest

import cuforge
from tests.child import child_env, run_python

ARCH = "sm_90"
TEMPLATE = '#include "val.h"\ntemplate<class T> __global__ void add(T* a) { a[0] += VAL; }\n'
PLAIN = [f'extern "C" __global__ void k{i}(int* a) {{ *a = {i}; }}' for i in range(2)]


def _opts():
    from cuda.core import ProgramOptions

    return ProgramOptions(arch=ARCH)


# -- the contract with cuda.core: the hook exists with the signature cuforge expects -----


def test_contract_with_the_installed_cuda_core():
    import cuda.core
    from cuda.core import Program
    from cuda.core.utils import ProgramCacheResource, make_program_cache_key

    import cuforge.cuda_core as cc

    version = tuple(int(p) for p in cuda.core.__version__.split(".")[:2])
    assert version in cc.SUPPORTED, f"cuda.core {cuda.core.__version__} is not in SUPPORTED"
    assert ProgramCacheResource.__abstractmethods__ == {
        "__getitem__",
        "__setitem__",
        "__delitem__",
        "__len__",
        "clear",
    }
    assert issubclass(cc.ProgramCache, ProgramCacheResource)
    assert "cache" in Program.compile.__doc__ or "cache" in str(inspect.signature(Program.compile))
    params = inspect.signature(make_program_cache_key).parameters
    assert {
        "code",
        "code_type",
        "options",
        "target_type",
        "name_expressions",
        "extra_digest",
    } <= set(params)
    import cuda.core._program as program

    assert callable(program._program_compile_uncached)  # the spy the tests count with


def test_schema_knows_the_kind():
    from cuforge.store.schema import KINDS, entry_problem

    assert "cuda-core" in KINDS
    assert entry_problem("cuda-core", {"output": "cubin", "name": "p"}) is None
    assert "meta.output" in entry_problem("cuda-core", {"output": "python"})


def test_enable_says_there_is_no_global_hook():
    import cuforge.cuda_core as cc

    with pytest.raises(NotImplementedError, match="cache=cuforge.cuda_core.ProgramCache"):
        cc.enable()


# -- ProgramCache: a ProgramCacheResource over a cuforge.Cache ----------------------------


def test_program_cache_hits_through_program_compile(cache, nvrtc_calls):
    from cuda.core import Program

    from cuforge.cuda_core import ProgramCache

    pc = ProgramCache(cache)
    first = Program(PLAIN[0], "c++", _opts()).compile("cubin", cache=pc)
    again = Program(PLAIN[0], "c++", _opts()).compile("cubin", cache=pc)
    assert nvrtc_calls == ["cubin"]
    assert bytes(again.code) == bytes(first.code) and len(pc) == 1
    kinds = {info.kind for info in cache.iterate()}
    assert kinds == {"cuda-core"}
    key = b"some-key"
    pc[key] = b"\x7fELF-bytes"
    assert pc[key] == b"\x7fELF-bytes" and pc.get(b"nope") is None and len(pc) == 2
    del pc[key]
    with pytest.raises(KeyError):
        del pc[key]
    pc.clear()
    assert len(pc) == 0
    Program(PLAIN[0], "c++", _opts()).compile("cubin", cache=pc)
    assert nvrtc_calls == ["cubin", "cubin"]


def test_a_damaged_entry_is_compiled_again(cache, nvrtc_calls, caplog):
    from cuda.core import Program
    from cuda.core.utils import make_program_cache_key

    from cuforge.cuda_core import KIND, ProgramCache
    from cuforge.store.base import Entry

    pc = ProgramCache(cache)
    good = Program(PLAIN[1], "c++", _opts()).compile("cubin", cache=pc)
    ckey = make_program_cache_key(
        code=PLAIN[1], code_type="c++", options=_opts(), target_type="cubin"
    )
    cache.put(Entry(pc.entry_key(ckey), KIND, b"not a blob set", {"backend": KIND}))
    again = Program(PLAIN[1], "c++", _opts()).compile("cubin", cache=pc)
    assert nvrtc_calls == ["cubin", "cubin"] and bytes(again.code) == bytes(good.code)
    assert "deleted and compiled again" in caplog.text
    assert pc[ckey] == bytes(good.code)  # rewritten


# -- compile(): headers in the key, symbol_mapping kept --------------------------------


def test_header_edit_misses_touch_hits_symbol_mapping_kept(
    cache, nvrtc_calls, tmp_path, monkeypatch
):
    from cuforge.cuda_core import compile_result

    monkeypatch.chdir(tmp_path)  # NVRTC finds "val.h" in the working directory
    header = tmp_path / "val.h"
    header.write_text("#define VAL 1\n")

    def build():
        return compile_result(
            TEMPLATE, options=_opts(), name_expressions=["add<float>"], cache=cache
        )

    first = build()
    assert first.source_of_result == "compiled"
    mapping = dict(first.value.symbol_mapping)
    assert mapping == {"add<float>": b"_Z3addIfEvPT_"}
    cache.clear_memos()
    fresh = compile_result(
        TEMPLATE,
        options=_opts(),
        name_expressions=["add<float>"],
        cache=cache.replace(memory=False),
    )
    assert fresh.hit and dict(fresh.value.symbol_mapping) == mapping
    assert bytes(fresh.value.code) == bytes(first.value.code)
    st = header.stat()
    os.utime(header, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))  # touch
    assert build().hit and nvrtc_calls == ["cubin"]
    header.write_text("#define VAL 2\n")  # an edit
    edited = build()
    assert edited.source_of_result == "compiled" and nvrtc_calls == ["cubin", "cubin"]
    assert bytes(edited.value.code) != bytes(first.value.code)
    header.write_text("#define VAL 1\n")  # back: the first entry again
    assert build().hit and len(nvrtc_calls) == 2


def test_include_path_headers_are_keyed_where_cuda_core_refuses(cache, nvrtc_calls, tmp_path):
    from cuda.core import Program, ProgramOptions

    from cuforge.cuda_core import ProgramCache, compile_result

    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "val.h").write_text("#define VAL 3\n")
    opts = ProgramOptions(arch=ARCH, include_path=[str(inc)])
    with pytest.raises(ValueError, match="extra_digest"):
        Program(TEMPLATE, "c++", opts).compile("cubin", cache=ProgramCache(cache))
    nvrtc_calls.clear()
    assert (
        compile_result(
            TEMPLATE, options=opts, name_expressions=["add<int>"], cache=cache
        ).source_of_result
        == "compiled"
    )
    assert compile_result(TEMPLATE, options=opts, name_expressions=["add<int>"], cache=cache).hit
    (inc / "val.h").write_text("#define VAL 4\n")
    assert not compile_result(
        TEMPLATE, options=opts, name_expressions=["add<int>"], cache=cache
    ).hit
    assert len(nvrtc_calls) == 2


def _digest(code, include_path, cwd):
    from cuda.core import ProgramOptions

    from cuforge.cuda_core import header_digest

    digest, why = header_digest(
        code, ProgramOptions(arch=ARCH, include_path=include_path), cwd=str(cwd)
    )
    assert why is None
    return digest


def test_installed_header_roots_are_keyed_by_their_release_not_walked(tmp_path):
    # an include dir of an installed package (CCCL's wheel) holding a release's version
    # file is a system root: its headers are not followed or hashed (CCCL's ~430 headers
    # cost ~0.25 s to scan in a fresh process); its version file is
    user = tmp_path / "inc"
    user.mkdir()
    (user / "val.h").write_text("#define VAL 1\n")
    root = tmp_path / "venv" / "site-packages" / "cuda" / "include"
    (root / "cub").mkdir(parents=True)
    (root / "cub" / "version.cuh").write_text("#define CUB_VERSION 300100\n")
    (root / "cub" / "block.cuh").write_text('#include "detail.cuh"\n')
    (root / "cub" / "detail.cuh").write_text("// detail\n")
    code = '#include "val.h"\n#include <cub/block.cuh>\n' + TEMPLATE
    dirs = [str(user), str(root)]
    first = _digest(code, dirs, tmp_path)
    (root / "cub" / "detail.cuh").write_text("// an edit inside the release: not looked at\n")
    assert _digest(code, dirs, tmp_path) == first
    (root / "cub" / "version.cuh").write_text("#define CUB_VERSION 300200\n")  # an upgrade
    upgraded = _digest(code, dirs, tmp_path)
    assert upgraded != first
    (user / "val.h").write_text("#define VAL 2\n")  # a user header: by content
    assert _digest(code, dirs, tmp_path) not in (first, upgraded)
    # the same layout elsewhere (another checkout, another venv) hits: no paths in the key
    other = tmp_path / "other"
    import shutil

    shutil.copytree(tmp_path / "inc", other / "inc")
    shutil.copytree(tmp_path / "venv", other / "venv")
    moved = [str(other / "inc"), str(other / "venv" / "site-packages" / "cuda" / "include")]
    assert _digest(code, moved, other) == _digest(code, dirs, tmp_path)
    # a directory outside the toolkit and installed packages is a user dir, even with a
    # version file: every header it gives is hashed
    vendored = tmp_path / "vendored"
    shutil.copytree(root, vendored)
    before = _digest(code, [str(user), str(vendored)], tmp_path)
    (vendored / "cub" / "detail.cuh").write_text("// a vendored edit\n")
    assert _digest(code, [str(user), str(vendored)], tmp_path) != before


def test_repeated_digest_sees_a_shadowing_header_and_a_nested_edit(tmp_path):
    # header_digest is memoized per process; the memo re-checks the headers it read and
    # the paths whose appearance would change what an include finds
    first_dir, second_dir = tmp_path / "a", tmp_path / "b"
    first_dir.mkdir()
    second_dir.mkdir()
    (second_dir / "val.h").write_text('#include "more.h"\n')
    (second_dir / "more.h").write_text("#define VAL 1\n")
    dirs = [str(first_dir), str(second_dir)]
    d1 = _digest(TEMPLATE, dirs, tmp_path)
    assert _digest(TEMPLATE, dirs, tmp_path) == d1
    (second_dir / "more.h").write_text("#define VAL 2\n")  # a header's header
    d2 = _digest(TEMPLATE, dirs, tmp_path)
    assert d2 != d1
    (first_dir / "val.h").write_text("#define VAL 3\n")  # now found first: shadows b/val.h
    d3 = _digest(TEMPLATE, dirs, tmp_path)
    assert d3 not in (d1, d2)


def test_pch_options_compile_uncached(cache, nvrtc_calls, tmp_path, caplog):
    from cuda.core import ProgramOptions

    from cuforge.cuda_core import compile_result

    opts = ProgramOptions(arch=ARCH, pch_dir=str(tmp_path))
    r = compile_result(PLAIN[0], options=opts, cache=cache)
    assert r.source_of_result == "uncached" and "pch_dir" in r.reason


# -- process B gets every program from the remote: 0 NVRTC calls ------------------------

CHILD = r"""
import json, os
import cuda.core._program as program
calls = []
real = program._program_compile_uncached
def spy(prog, target_type, *rest):
    calls.append(target_type)
    return real(prog, target_type, *rest)
program._program_compile_uncached = spy
from cuda.core import Program, ProgramOptions
from cuforge.cuda_core import ProgramCache, compile_result
opts = ProgramOptions(arch="sm_90")
plain = %(plain)r
template = %(template)r
pc = ProgramCache()
codes = [bytes(Program(s, "c++", opts).compile("cubin", cache=pc).code).hex() for s in plain]
r = compile_result(template, options=opts, name_expressions=["add<float>", "add<double>"])
print(json.dumps({
    "calls": len(calls), "codes": codes, "source": r.source_of_result,
    "mapping": {k: v.decode() for k, v in r.value.symbol_mapping.items()},
    "template": bytes(r.value.code).hex(),
}))
"""


def test_process_b_gets_every_program_from_the_remote(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()  # a file:// remote is a directory that exists
    work = tmp_path / "work"
    work.mkdir()
    (work / "val.h").write_text("#define VAL 5\n")
    code = CHILD % {"plain": PLAIN, "template": TEMPLATE}
    a = run_python(
        code,
        child_env(CUFORGE_CACHE_DIR=str(tmp_path / "a"), CUFORGE_REMOTE=f"file://{shared}"),
        cwd=str(work),
    )
    assert a["calls"] == 3 and a["source"] == "compiled"
    b = run_python(
        code,
        child_env(CUFORGE_CACHE_DIR=str(tmp_path / "b"), CUFORGE_REMOTE=f"file://{shared}"),
        cwd=str(work),
    )
    assert b["calls"] == 0 and b["source"] == "remote"
    assert b["codes"] == a["codes"] and b["template"] == a["template"]
    assert (
        b["mapping"]
        == a["mapping"]
        == {
            "add<float>": "_Z3addIfEvPT_",
            "add<double>": "_Z3addIdEvPT_",
        }
    )


def _parity_caches(tmp_path):
    """(cuda.core's cache, cuforge's) of the same class of cache, each capped at 300 bytes."""
    from cuda.core.utils import FileStreamProgramCache, InMemoryProgramCache

    from cuforge.cuda_core import ProgramCache

    return [
        (FileStreamProgramCache(tmp_path / "theirs", max_size_bytes=300), "file stream"),
        (InMemoryProgramCache(max_size_bytes=300), "in memory"),
        (ProgramCache(cuforge.Cache(tmp_path / "ours", memory=False), max_size_bytes=300), "ours"),
    ]


def test_code_written_for_cuda_cores_caches_ports_by_changing_the_class(tmp_path):
    """max_size_bytes caps the entries (the least recently used go first), and the same
    wrong values raise cuda.core's own errors, with its messages."""
    import re

    from cuda.core import ObjectCode

    gone = tmp_path / "gone.cubin"
    gone.write_bytes(b"\x7fELF")
    path_backed = ObjectCode.from_cubin(str(gone))
    gone.unlink()
    outcomes = []
    for cache, label in _parity_caches(tmp_path):
        for i in range(4):  # 4 x 100 bytes against a 300-byte cap: the first goes
            cache[f"k{i}".encode()] = bytes([i]) * 100
        kept = [cache.get(f"k{i}".encode()) is not None for i in range(4)]
        errors = []
        for bad in (path_backed, 12345, "text"):
            with pytest.raises((FileNotFoundError, TypeError)) as info:
                cache[b"bad"] = bad
            # the path differs per run: compare the message with it taken out
            errors.append((type(info.value).__name__, re.sub(r"/\S+", "PATH", str(info.value))))
        with pytest.raises(TypeError) as info:
            cache[3.5] = b"x"
        errors.append((type(info.value).__name__, str(info.value)))
        outcomes.append((label, kept, errors))
    (_, kept0, errors0), *rest = outcomes
    assert kept0 == [False, True, True, True]
    for label, kept, errors in rest:
        assert kept == kept0, label
        assert errors == errors0, label


def test_max_size_bytes_is_checked_as_cuda_core_checks_it(tmp_path):
    from cuforge.cuda_core import ProgramCache

    with pytest.raises(ValueError, match="max_size_bytes must be positive or None"):
        ProgramCache(cuforge.Cache(tmp_path / "c"), max_size_bytes=0)
    with pytest.raises(TypeError, match="max_size_bytes must be an int or None, not str"):
        ProgramCache(cuforge.Cache(tmp_path / "c"), max_size_bytes="1M")
