"""cuforge.Cache: the cache as a value. Each test counts compiles on real NVRTC compiles."""

from __future__ import annotations

import os
import pickle
import re
import subprocess
import sys

import pytest

import cuforge
from cuforge.base.errors import OfflineMissError
from cuforge.core.caching import Cache
from tests.conftest import ROOT, child_env
from tests.mixed_toolkit import skip_unless_header_wheels_win, toolkit_of_another_release

SRC = 'extern "C" __global__ void fill(float* x) { x[threadIdx.x] = 2.0f; }'


def test_an_explicit_cache_keeps_its_entries_and_counters_to_itself(tmp_path, isolated_cache):
    own = Cache(tmp_path / "own")
    first = cuforge.compile(SRC, arch="sm_90", cache=own)
    assert first.source_of_result == "compiled" and own.counters["compiles"] == 1
    # nothing went to the default cache (CUFORGE_CACHE_DIR), nor into its counters
    assert not os.path.exists(isolated_cache / "v1")
    assert cuforge.default_cache().counters["compiles"] == 0
    # the call memo is the cache's own: the same call again is a memo hit there...
    assert cuforge.compile(SRC, arch="sm_90", cache=own).source_of_result == "memory"
    assert own.counters["call_memo_hits"] == 1
    # ...and another Cache object on the same dir gets a disk hit, compiling nothing
    other = Cache(tmp_path / "own")
    again = cuforge.compile(SRC, arch="sm_90", cache=other)
    assert again.source_of_result == "disk" and other.counters["compiles"] == 0
    assert again.binary == first.binary
    # while the default cache compiles it once for itself
    assert cuforge.compile(SRC, arch="sm_90").source_of_result == "compiled"
    assert cuforge.default_cache().counters["compiles"] == 1


def test_offline_copy_serves_hits_and_compiles_nothing(tmp_path):
    team = Cache(tmp_path / "c")
    cuforge.compile(SRC, arch="sm_90", cache=team)
    prod = team.replace(offline=True)
    assert prod.directory == team.directory and prod.offline and not team.offline
    assert cuforge.compile(SRC, arch="sm_90", cache=prod).source_of_result == "disk"
    with pytest.raises(OfflineMissError, match="strict mode") as info:
        cuforge.compile(SRC + "\n// new", arch="sm_90", cache=prod)
    assert info.value.kind == "kernel" and "[[kernel]]" in info.value.manifest_entry
    assert prod.counters["compiles"] == 0


def test_bundles_are_read_only_tiers_after_the_others(tmp_path):
    from cuforge.aot.bundle import write_bundle
    from cuforge.core.pipeline import call_entries

    builder = Cache(tmp_path / "builder")
    cuforge.compile(SRC, arch="sm_90", cache=builder)
    entries = call_entries(SRC, name="kernel.cu", arch="sm_90", cache=builder)
    bundle = tmp_path / "app.cfb"
    write_bundle(bundle, entries)
    served = Cache(tmp_path / "empty", bundles=[bundle], offline=True)
    got = cuforge.compile(SRC, arch="sm_90", cache=served)
    assert got.source_of_result == "bundle" and served.counters["compiles"] == 0
    (tier,) = served.bundles
    assert tier.put(entries[0]) is False and tier.delete(entries[0].key) is False
    # served in place: nothing was copied into the cache's own dir
    assert (
        not any(os.scandir(served.layout.entries)) if os.path.isdir(served.layout.entries) else True
    )
    assert served.remove_bundle(tier) and served.bundles == ()


def test_using_sets_the_cache_of_calls_that_pass_none(tmp_path):
    mine = Cache(tmp_path / "mine")
    before = cuforge.default_cache()
    with cuforge.using(mine) as c:
        assert c is mine and cuforge.default_cache() is mine
        assert cuforge.compile(SRC, arch="sm_90").source_of_result == "compiled"
    assert cuforge.default_cache() is before
    assert mine.counters["compiles"] == 1 and before.counters["compiles"] == 0
    with pytest.raises(TypeError, match="cuforge.Cache"):
        cuforge.using("/tmp")  # type: ignore[arg-type]


def test_wrong_arguments_are_named():
    with pytest.raises(TypeError, match="remotes must be a sequence"):
        Cache("/tmp/x", remotes="redis://h:1/0")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_bytes"):
        Cache("/tmp/x", max_bytes=-1)
    with pytest.raises(TypeError, match="cache must be a cuforge.Cache"):
        cuforge.compile(SRC, arch="sm_90", cache="/tmp/x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="unknown arguments"):
        Cache("/tmp/x").replace(colour="red")


def test_a_cache_travels_to_a_worker_as_its_arguments(tmp_path):
    c = Cache(tmp_path / "c", max_bytes=1 << 30, offline=True)
    cuforge.compile  # noqa: B018 - the default cache exists in this process
    back = pickle.loads(pickle.dumps(c))
    assert (back.directory, back.max_bytes, back.offline) == (c.directory, 1 << 30, True)
    assert back is not c and back.counters["compiles"] == 0


def test_the_trust_check_covers_every_directory_on_the_way(tmp_path):
    c = Cache(tmp_path / "c")
    first = cuforge.compile(SRC, arch="sm_90", cache=c)
    entry = c.layout.entry_path(first.key)
    fan_out = os.path.dirname(entry)  # v1/entries/ab/cd
    assert c.trust_problem(entry) is None
    os.chmod(fan_out, 0o777)
    problem = c.trust_problem(entry)
    assert problem is not None and fan_out in problem
    assert f"chmod -R go-w {c.directory}" in problem  # the fix covers the whole tree
    os.chmod(fan_out, 0o700)
    # a new cache dir is private all the way down
    fresh = Cache(tmp_path / "fresh" / "cache")
    cuforge.compile(SRC, arch="sm_90", cache=fresh)
    for d in fresh.layout.own_dirs():
        assert os.stat(d).st_mode & 0o077 == 0, d


def test_aot_writes_no_environment_and_changes_no_directory():
    """aot/ builds against Cache objects: no os.environ write and no chdir anywhere."""
    aot = os.path.join(ROOT, "src", "cuforge", "aot")
    for name in sorted(os.listdir(aot)):
        if name.endswith(".py"):
            text = open(os.path.join(aot, name), encoding="utf-8").read()
            assert not re.search(r"os\.environ\[[^]]+\]\s*=", text), name
            assert "chdir" not in text, name


def test_the_suite_runs_with_no_cuforge_knob_from_the_shell():
    """conftest clears every CUFORGE_* variable (from config's list), so an exported
    CUFORGE_REMOTE never points the suite at a real team cache."""
    allowed = {"CUFORGE_CACHE_DIR", "CUFORGE_ARCH"}
    assert {k for k in os.environ if k.startswith("CUFORGE_")} <= allowed


def _imported(code: str) -> set[str]:
    env = child_env()
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    names = set()
    for line in done.stderr.splitlines()[1:]:
        parts = line.split("|")
        if len(parts) == 3:
            names.add(parts[2].strip())
    return names


#: the light standard-library modules the warm path may import (``import cuforge`` and the
#: compile entry point); nothing else: no typing, json, importlib, redis, torch
WARM_PATH_STDLIB = {
    "itertools", "keyword", "operator", "reprlib", "collections", "collections.abc",
    "atexit", "types", "weakref", "functools", "threading", "contextlib", "hashlib",
    "struct", "errno", "math", "heapq",
}  # fmt: skip
#: the kernel compile path, which ``import cuforge`` leaves to the first compile (the
#: adapters, cuforge.jax / cuforge.triton / ..., never compile a kernel)
COMPILE_PATH = (
    "cuforge.frontend",
    "cuforge.core.pipeline",
    "cuforge.compiler",
    "cuforge.toolchain",
    "cuforge.keys",
)


@pytest.mark.parametrize("code", ["import cuforge", "import cuforge; cuforge.compile"])
def test_import_cuforge_loads_only_the_warm_path(code):
    """``import cuforge``, and the compile entry point it loads on first use, import
    cuforge's warm-path modules and a short allow-list of light standard-library modules,
    nothing else: imports belong inside functions only off the warm path."""
    baseline = _imported("pass")  # the interpreter's and the venv's .pth hooks
    names = _imported(code) - baseline
    foreign = sorted(
        n for n in names if not n.startswith(("cuforge", "_")) and n not in WARM_PATH_STDLIB
    )
    assert not foreign, f"{code} imported {foreign}"
    if code == "import cuforge":
        eager = sorted(n for n in names if n.startswith(COMPILE_PATH))
        assert not eager, f"import cuforge loaded the compile path: {eager}"
    else:
        assert "cuforge.core.pipeline" in names


DISK_HIT_CHILD = f"""
import os, sys
import cuforge
from cuforge.toolchain import toolkit_include_dirs
p = cuforge.compile({SRC!r}, arch="sm_90")
print(p.source_of_result, os.pathsep.join(toolkit_include_dirs()))
"""


def _imported_by(code: str, env: dict[str, str]) -> tuple[str, set[str]]:
    """(stdout, every module imported, exit handlers included) of ``code`` in a fresh
    process."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    names = {
        p[2].strip() for p in (ln.split("|") for ln in done.stderr.splitlines()) if len(p) == 3
    }
    return done.stdout, names


@pytest.mark.parametrize("install", ["matching", "mixed"])
def test_a_fresh_process_disk_hit_imports_only_the_warm_path(tmp_path, isolated_cache, install):
    """A fresh process's disk hit, its exit included, imports nothing that ``import
    cuforge`` and its compile entry point (``cuforge.compile``, loaded on first use: the
    pipeline, the compilers' front ends, the toolchain's identity; light, see
    :func:`test_import_cuforge_loads_only_the_warm_path`) did not but ``fcntl`` (the entry's
    lock): not one more cuforge module, no toolchain probe or compiler module, no
    cuda-pathfinder, no cuda-bindings (the compile is keyed from the toolchain memo), no
    :mod:`json` (the telemetry line). Also when the toolkit's headers are of another
    release than the pip NVRTC wheel (``mixed``: NVRTC takes its own release's header
    wheels, which cuda-pathfinder finds once per machine, not once per process)."""
    from cuforge.toolchain import toolkit_root

    real = toolkit_root()
    if install == "matching":
        if real is None:
            pytest.skip("no CUDA toolkit here")
        toolkit = real
    else:
        toolkit = toolkit_of_another_release(str(tmp_path))
    env = child_env(CUDA_HOME=toolkit)
    env.pop("CUDA_PATH", None)
    out, _ = _imported_by(DISK_HIT_CHILD, env)
    source, include = out.split()
    assert source == "compiled"
    if install == "mixed":
        skip_unless_header_wheels_win(include.split(os.pathsep), toolkit)
    out, names = _imported_by(DISK_HIT_CHILD, env)
    assert out.split() == ["disk", include]  # keyed with the same headers
    assert not {n for n in names if n.startswith(("cuda.pathfinder", "cuda.bindings"))}
    _, baseline = _imported_by("import cuforge; cuforge.compile", env)
    foreign = sorted(n for n in names - baseline if not n.startswith("_"))
    assert foreign in ([], ["fcntl"]), f"a disk hit imported {foreign}"


def test_every_directory_cuforge_creates_is_private(tmp_path):
    """README (and docs/trust.md) promise a cache dir created 0700; the dirs cuforge makes under it (v1, locks,
    explain/names, telemetry, ...) must be 0700 too, whoever creates them first."""
    import stat

    c = Cache(tmp_path / "new" / "cache")
    cuforge.compile(SRC, arch="sm_90", cache=c)
    cuforge.compile(SRC + "\n// 2", arch="sm_90", cache=c)  # a second key: explain records
    for dirpath, _subdirs, _files in os.walk(c.directory):
        mode = stat.S_IMODE(os.stat(dirpath).st_mode)
        assert mode & 0o077 == 0, f"{dirpath} has mode {oct(mode)}"


def test_a_process_that_passes_its_cache_writes_nothing_outside_it(tmp_path):
    """``cache=Cache(D)`` with ``CUFORGE_CACHE_DIR=E``: the entries *and* the machine memos
    (the toolchain probe, ``toolchain.json``) go to D; E is never created."""
    own, env_dir = tmp_path / "D", tmp_path / "E"
    code = (
        "import cuforge, sys\n"
        "own = cuforge.Cache(sys.argv[1])\n"
        f"p = cuforge.compile({SRC!r}, arch='sm_90', cache=own)\n"
        "assert p.source_of_result == 'compiled', p.source_of_result\n"
        f"cuforge.compile({SRC!r} + '//2', arch='sm_90', backend='nvcc', cache=own)\n"
    )
    env = child_env(CUFORGE_CACHE_DIR=str(env_dir))
    done = subprocess.run(
        [sys.executable, "-c", code, str(own)], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert not env_dir.exists(), sorted(p.name for p in env_dir.rglob("*"))
    assert (own / "toolchain.json").is_file() and (own / "v1").is_dir()


def test_threads_using_a_cache_for_the_first_time_at_once_lose_no_write(tmp_path):
    # the tiers are built on first use; a thread arriving while another builds them used
    # to see "built" with no store yet, and its puts did nothing, silently
    import hashlib
    import threading

    from cuforge.store.base import Entry

    threads, per_thread, rounds = 8, 20, 4
    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often: the window is a few bytecodes
    try:
        for round_ in range(rounds):
            cache = Cache(tmp_path / f"c{round_}")
            barrier = threading.Barrier(threads)
            stored: list[bool] = []

            def work(
                n: int,
                cache: Cache = cache,
                barrier: threading.Barrier = barrier,
                stored: list[bool] = stored,
            ) -> None:
                barrier.wait()
                for i in range(per_thread):
                    key = hashlib.sha256(f"{n}/{i}".encode()).hexdigest()
                    stored.append(cache.put(Entry(key, "kernel", b"x" * 64)))

            pool = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
            for t in pool:
                t.start()
            for t in pool:
                t.join()
            assert stored.count(True) == threads * per_thread, f"round {round_}"
            # every entry is there, on disk too (another Cache on the dir sees them all)
            fresh = Cache(tmp_path / f"c{round_}", memory=False)
            assert sum(1 for _ in fresh.iterate()) == threads * per_thread
    finally:
        sys.setswitchinterval(old_interval)
