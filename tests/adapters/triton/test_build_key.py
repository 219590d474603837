"""cuforge.triton.build_key: the Triton build identified from pip's RECORD instead of
Triton's ``triton_key()`` (which hashes Triton's installed files in every process).
Calls of Triton's real ``triton_key`` are counted in real child processes."""

from __future__ import annotations

import os
import shutil

import pytest

pytest.importorskip("triton", reason="Triton is not installed (pip install cuforge[triton])")

import cuforge.triton as ct  # noqa: E402
from tests.child import ROOT, child_env, run_python  # noqa: E402

if not ct.supported():  # pragma: no cover - another Triton
    pytest.skip(f"this Triton is outside {ct.SUPPORTED}", allow_module_level=True)

# counts calls of Triton's real triton_key (get_cache_key reads it from its module), then
# compiles add_kernel through cuforge; NO_RECORD points cuforge at a dist-info without RECORD
CHILD = f"""
import json, sys
sys.path.insert(0, {ROOT!r})
import triton.runtime.cache as tcache
real, calls = tcache.triton_key, [0]
def counting():
    calls[0] += 1
    return real()
tcache.triton_key = counting
import cuforge, cuforge.triton as ct
if NO_RECORD:
    ct._triton_dist_info = lambda site: NO_RECORD
from tests.adapters.triton.kernels import CompileCounter, compile_kernel, cubin_digest
counter = CompileCounter().install()
assert ct.enable()
digest = cubin_digest(compile_kernel())
keys = sorted(i.key for i in cuforge.default_cache().iterate() if i.meta.get("name") == "add_kernel")
print(json.dumps({{"triton_key_calls": calls[0], "source": ct.build_key_source(),
                  "compiles": counter.compiles, "hits": counter.hits, "digest": digest,
                  "keys": keys}}))
"""


def _child(tmp_path, label: str, cuforge_dir, no_record: str | None = None) -> dict:
    home = tmp_path / label
    home.mkdir(parents=True, exist_ok=True)
    env = child_env(
        CUFORGE_CACHE_DIR=str(cuforge_dir),
        TRITON_CACHE_DIR=str(home / "triton"),
        TRITON_HOME=str(home),
    )
    env.pop("CUFORGE_REMOTE", None)
    return run_python(f"NO_RECORD = {no_record!r}\n" + CHILD, env, timeout=240, cwd=str(home))


def test_with_record_two_processes_share_kernels_and_never_hash_tritons_files(tmp_path):
    if ct.build_key_source() != "record":
        pytest.skip(f"this Triton install has no usable RECORD: {ct.build_key_source()}")
    shared = tmp_path / "cuforge"
    a = _child(tmp_path, "a", shared)
    b = _child(tmp_path, "b", shared)
    assert a["source"] == b["source"] == "record"
    assert a["triton_key_calls"] == b["triton_key_calls"] == 0
    assert (a["compiles"], b["compiles"], b["hits"]) == (1, 0, 1)
    assert a["digest"] == b["digest"] and a["keys"] == b["keys"]


def test_without_record_tritons_own_key_is_used_and_kernels_still_hit(tmp_path):
    empty = tmp_path / "triton-0.dist-info"
    empty.mkdir()
    shared = tmp_path / "cuforge"
    a = _child(tmp_path, "a", shared, no_record=str(empty))
    b = _child(tmp_path, "b", shared, no_record=str(empty))
    assert a["source"].startswith("the RECORD of triton-0.dist-info cannot be read"), a
    assert a["triton_key_calls"] >= 1 and b["triton_key_calls"] >= 1
    assert (a["compiles"], b["compiles"], b["hits"]) == (1, 0, 1)
    assert a["keys"] == b["keys"]


def _fake_dist_info(tmp_path, edit=None):
    """A copy of the installed Triton's dist-info, its RECORD lines passed through ``edit``."""
    site = os.path.dirname(ct._triton_root())
    real = ct._triton_dist_info(site)
    if real is None:
        pytest.skip("the installed Triton has no dist-info")
    fake = tmp_path / os.path.basename(real)
    shutil.copytree(real, fake)
    lines = (fake / "RECORD").read_text().splitlines()
    (fake / "RECORD").write_text("\n".join(edit(lines) if edit else lines) + "\n")
    return str(fake)


def _edit_line(path: str, change):
    def edit(lines):
        out = [change(line) if line.startswith(path + ",") else line for line in lines]
        assert out != lines, f"RECORD does not list {path}"
        return out

    return edit


def test_the_record_key_follows_records_hashes_and_sizes(tmp_path):
    same, why = ct._record_build_key(_fake_dist_info(tmp_path / "same"))
    if same is None:
        pytest.skip(f"this Triton install has no usable RECORD: {why}")
    assert same == ct.build_key() and why == "record"
    assert same.startswith(ct.triton.__version__ + "-record-") and os.sep not in same

    # a file triton_key hashes, with another sha256 in RECORD: another key
    core = "triton/language/core.py"
    other = _edit_line(core, lambda line: line.replace("sha256=", "sha256=X", 1))
    changed, why = ct._record_build_key(_fake_dist_info(tmp_path / "hash", other))
    assert why == "record" and changed not in (None, same)

    # RECORD's size differs from the file's (edited after install): Triton's own key
    bigger = _edit_line(core, lambda line: line.rsplit(",", 1)[0] + ",1")
    key, why = ct._record_build_key(_fake_dist_info(tmp_path / "size", bigger))
    assert (
        key is None
        and why
        == f"{core} is {os.path.getsize(ct.triton.language.core.__file__)} bytes, RECORD says 1"
    )

    # no hash (as an editable install writes it), or not listed at all: Triton's own key
    unhashed = _edit_line(core, lambda line: line.split(",", 1)[0] + ",,")
    key, why = ct._record_build_key(_fake_dist_info(tmp_path / "nohash", unhashed))
    assert key is None and why == f"RECORD has no sha256 and size of {core}"
    missing = lambda lines: [line for line in lines if not line.startswith(core + ",")]  # noqa: E731
    key, why = ct._record_build_key(_fake_dist_info(tmp_path / "missing", missing))
    assert key is None and why == f"RECORD does not list {core}"


# only TRITON_CACHE_MANAGER: cuforge.triton is imported when Triton first asks for its
# manager, after compile() keyed the first kernel with Triton's own key
ENV_ROUTE = f"""
import json, sys
sys.path.insert(0, {ROOT!r})
from tests.adapters.triton.kernels import CompileCounter, compile_kernel
counter = CompileCounter().install()
compile_kernel()
compile_kernel("mul_kernel")
import cuforge
keys = sorted(i.key for i in cuforge.default_cache().iterate())
print(json.dumps({{"compiles": counter.compiles, "hits": counter.hits, "keys": keys}}))
"""


def test_a_process_that_imports_cuforge_late_keys_kernels_as_enable_does(tmp_path):
    """With only TRITON_CACHE_MANAGER set, the first kernel's key was computed before
    cuforge.triton was imported; it is stored under cuforge's key all the same, so a process
    that ran enable() hits both kernels (and vice versa)."""
    shared = tmp_path / "cuforge"
    home = tmp_path / "a"
    home.mkdir()
    env = child_env(
        CUFORGE_CACHE_DIR=str(shared),
        TRITON_CACHE_DIR=str(home / "triton"),
        TRITON_HOME=str(home),
        TRITON_CACHE_MANAGER="cuforge.triton:CacheManager",
    )
    env.pop("CUFORGE_REMOTE", None)
    a = run_python(ENV_ROUTE, env, timeout=240, cwd=str(home))
    assert (a["compiles"], a["hits"]) == (2, 0)
    b = _child(tmp_path, "b", shared)
    assert (b["compiles"], b["hits"]) == (0, 1)
    assert set(b["keys"]) <= set(a["keys"])
    home_c = tmp_path / "c"
    home_c.mkdir()
    env.update(TRITON_CACHE_DIR=str(home_c / "triton"), TRITON_HOME=str(home_c))
    c = run_python(ENV_ROUTE, env, timeout=240, cwd=str(home_c))
    assert (c["compiles"], c["hits"]) == (0, 2)


def _mirror_triton(tmp_path) -> str:
    """A ``triton`` package dir under ``tmp_path`` whose files are symlinks to the installed
    Triton's (the same contents, nothing copied), real directories where its key walks."""
    real = ct._triton_root()
    root = tmp_path / "site" / "triton"
    for sub in ("compiler", "backends", "language"):
        for directory, dirs, names in os.walk(os.path.join(real, sub)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            here = root / os.path.relpath(directory, real)
            here.mkdir(parents=True, exist_ok=True)
            for name in names:
                (here / name).symlink_to(os.path.join(directory, name))
    for rel in ("runtime/cache.py", *(f"_C/{n}" for n in os.listdir(os.path.join(real, "_C")))):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        if not (root / rel).exists():
            (root / rel).symlink_to(os.path.join(real, rel))
    return str(root)


def test_a_same_size_edit_of_a_covered_file_changes_cuforges_build_key(tmp_path, monkeypatch):
    """Issue 35 item 1: a one-digit edit of ``backends/nvidia/compiler.py`` keeps its size
    (and ``touch -r`` its mtime): RECORD's size check passes, but the file is no longer the
    one RECORD lists, so cuforge's build key changes (Triton's own triton_key did)."""
    site = os.path.dirname(ct._triton_root())
    dist = ct._triton_dist_info(site)
    real_key, why = ct._record_build_key(dist)
    if real_key is None:
        pytest.skip(f"this Triton install has no usable RECORD: {why}")
    root = _mirror_triton(tmp_path)
    monkeypatch.setattr(ct, "_triton_root", lambda: root)
    assert ct._record_build_key(dist) == (real_key, "record")  # the same files: the same key

    rel = "backends/nvidia/compiler.py"
    target = os.path.join(root, rel)
    data = open(os.path.realpath(target), "rb").read()
    stat = os.stat(target)
    at = next(i for i, byte in enumerate(data) if chr(byte).isdigit())
    edited = data[:at] + (b"7" if data[at : at + 1] != b"7" else b"8") + data[at + 1 :]
    os.unlink(target)
    with open(target, "wb") as f:
        f.write(edited)
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # touch -r
    assert os.path.getsize(target) == len(data)
    changed, why = ct._record_build_key(dist)
    assert why == "record" and changed not in (None, real_key)
    assert changed.startswith(ct.triton.__version__ + "-record-")


def _triton_key_files(root: str) -> list[str]:
    """The files Triton's own ``triton_key()`` hashes, in its order, found as it finds them
    (``pkgutil.walk_packages`` and each module's spec)."""
    import pkgutil
    import sysconfig

    ext = sysconfig.get_config_var("EXT_SUFFIX").split(".")[-1]
    files = ["triton/runtime/cache.py"]
    for sub in ("compiler", "backends", "language"):
        if sub == "language":
            files.append(f"triton/_C/libtriton.{ext}")
        for lib in pkgutil.walk_packages([os.path.join(root, sub)], prefix=f"triton.{sub}."):
            origin = lib.module_finder.find_spec(lib.name).origin
            files.append("triton/" + os.path.relpath(origin, root).replace(os.sep, "/"))
    return files


def test_the_covered_files_are_exactly_the_files_triton_key_hashes():
    """Not a superset: the libraries under ``backends/*/lib`` (the AMD codegen library,
    CUPTI), the headers and ``ptxas`` are not modules of a package, so ``triton_key()``
    does not hash them, and neither does cuforge (a fresh machine's first process hashes
    what Triton's own first process hashes, ~500 MB on 3.9, not 680 MB)."""
    root = ct._triton_root()
    covered = ct._covered_files(root)
    assert covered == _triton_key_files(root)
    assert not [f for f in covered if "/lib/" in f or "/include/" in f or "/bin/" in f]


def test_the_walk_reads_packages_as_pkgutil_does(tmp_path):
    """A fake tree: a package's modules and subpackages are walked, a dir without
    ``__init__`` is not (its .so files and modules are not Triton's to hash), a module
    name with a dot is skipped, an extension module wins over a same-named source file,
    and a package wins over a same-named module."""
    import sysconfig

    ext = sysconfig.get_config_var("EXT_SUFFIX")
    top = tmp_path / "backends"
    for rel in (
        "compiler.py",
        "a.b.py",
        "nvidia/__init__.py",
        "nvidia/driver.py",
        "nvidia/lib/libcupti.so",
        "nvidia/lib/helper.py",
        "nvidia/include/cuda.h",
        "nvidia/sub/__init__.py",
        "nvidia/sub/x.py",
        f"nvidia/fast{ext}",
        "nvidia/fast.py",
        "pkg/__init__.py",
        "pkg.py",
        "notes.txt",
    ):
        (top / rel).parent.mkdir(parents=True, exist_ok=True)
        (top / rel).write_text("")
    got = [os.path.relpath(p, top) for p in ct._walked_origins(str(top))]
    assert got == [
        "compiler.py",
        "nvidia/__init__.py",
        "nvidia/driver.py",
        f"nvidia/fast{ext}",
        "nvidia/sub/__init__.py",
        "nvidia/sub/x.py",
        "pkg/__init__.py",
    ]


def test_an_edit_of_a_file_triton_key_ignores_keeps_cuforges_build_key(tmp_path, monkeypatch):
    """A library under ``backends/*/lib`` changed in place (contents and size): Triton's own
    key does not change, and cuforge's does not either."""
    site = os.path.dirname(ct._triton_root())
    dist = ct._triton_dist_info(site)
    real_key, why = ct._record_build_key(dist)
    if real_key is None:
        pytest.skip(f"this Triton install has no usable RECORD: {why}")
    root = _mirror_triton(tmp_path)
    libs = sorted(
        (os.path.getsize(os.path.join(d, n)), os.path.join(d, n))
        for d, _dirs, names in os.walk(os.path.join(root, "backends"))
        if os.sep + "lib" in d
        for n in names
    )
    if not libs:
        pytest.skip("this Triton has no libraries under backends/*/lib")
    monkeypatch.setattr(ct, "_triton_root", lambda: root)
    target = libs[0][1]
    os.unlink(target)
    with open(target, "wb") as f:
        f.write(b"not the library pip installed")
    assert ct._record_build_key(dist) == (real_key, "record")


WARM = f"""
import json, sys, time
sys.path.insert(0, {ROOT!r})
from cuforge.toolchain import installed
real, hashed = installed.hash_file, []
installed.hash_file = lambda p: hashed.append(p) or real(p)
import cuforge.triton as ct
start = time.perf_counter()
key = ct.build_key()
print(json.dumps({{"key": key, "source": ct.build_key_source(), "hashed": len(hashed),
                  "ms": (time.perf_counter() - start) * 1e3}}))
"""


def test_a_fresh_process_on_a_warm_cache_dir_hashes_none_of_tritons_files(tmp_path):
    """Checking the files against RECORD reads them once per cache dir (and version of the
    files); a second process stats them and reads the digests from the toolchain memo."""
    if ct.build_key_source() != "record":
        pytest.skip(f"this Triton install has no usable RECORD: {ct.build_key_source()}")
    env = child_env(CUFORGE_CACHE_DIR=str(tmp_path / "cuforge"))
    cold = run_python(WARM, env, timeout=240, cwd=str(tmp_path))
    warm = run_python(WARM, env, timeout=240, cwd=str(tmp_path))
    assert cold["source"] == warm["source"] == "record" and cold["key"] == warm["key"]
    assert cold["key"] == ct.build_key()
    assert cold["hashed"] > 10 and warm["hashed"] == 0, (cold, warm)
