"""Record -> replay on the CPU machine, end to end in real processes: a workload (a kernel
from a file, a cuforge.compile string, a cuforge.jit specialization) recorded with
CUFORGE_RECORD; the lockfile is deterministic; `cuforge build --lock` makes the warm set
(copied from the cache, or rebuilt from the stanzas with an empty cache); a fresh cache dir
serving that bundle replays it under fence("error") with 0 compiles and the same binaries;
`cuforge prefetch` (and `cuforge.prefetch` in process) pulls exactly the lock's entries
from a file:// remote."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import cuforge
from cuforge.core.recording import lock_keys, read_lock
from tests.child import child_env, finish, spawn

WORKLOAD = r"""
import json, sys, cuforge
SCALE = '''
template <typename T, int BLOCK>
__global__ void scale(const T* __restrict__ x, T* out, T alpha, int n) {
    int i = blockIdx.x * BLOCK + threadIdx.x;
    if (i < n) out[i] = x[i] * alpha;
}
'''
if len(sys.argv) > 1 and sys.argv[1] == "replay":
    cuforge.load_bundle("warm.cfb")
    cuforge.fence("error")
a = cuforge.compile_file("k.cu", defines={"TILE": 4}, arch="sm_90")
b = cuforge.compile('extern "C" __global__ void z(int* p) { *p = 1; }', name="z.cu", arch="sm_90")
j = cuforge.jit(SCALE, "scale", arch="sm_90")
j.specialize(T="float", BLOCK=64)
c = cuforge.default_cache().counters
print(json.dumps({"compiles": c["compiles"], "keys": [a.key, b.key],
                  "binaries": [a.binary.hex()[:64], b.binary.hex()[:64]]}))
"""


def _run(tmp_path, cache_dir, *argv, **env):
    script = tmp_path / "workload.py"
    script.write_text(WORKLOAD)
    environment = child_env(CUFORGE_CACHE_DIR=str(cache_dir), CUFORGE_ARCH="sm_90", **env)
    code = f"import sys; sys.argv = ['w', *{list(argv)!r}]; exec(open({str(script)!r}).read())"
    return finish(spawn(code, environment, cwd=str(tmp_path)))


def _cli(tmp_path, cache_dir, *args, **env):
    environment = child_env(CUFORGE_CACHE_DIR=str(cache_dir), CUFORGE_ARCH="sm_90", **env)
    return subprocess.run(
        [sys.executable, "-m", "cuforge", *args],
        env=environment,
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_record_build_replay_end_to_end(tmp_path, isolated_cache):
    (tmp_path / "k.cu").write_text('extern "C" __global__ void k(float* x) { x[0] = TILE; }\n')
    first = _run(tmp_path, tmp_path / "c1", CUFORGE_RECORD="cuforge.lock")
    assert first["compiles"] == 3
    lock = (tmp_path / "cuforge.lock").read_text()
    records = read_lock(tmp_path / "cuforge.lock")
    assert sorted(r["system"] for r in records) == ["cuforge.jit", "kernel", "kernel"]
    assert str(tmp_path) not in lock and "time" not in lock
    by_name = {r["name"]: r for r in records}
    assert by_name["k.cu"]["manifest"][0] == "[[kernel]]"  # a file: rebuildable
    assert "manifest" not in by_name["z.cu"]  # a string: copied from a cache only
    # the same workload, another cache dir, warm or cold: the same lockfile
    os.rename(tmp_path / "cuforge.lock", tmp_path / "first.lock")
    _run(tmp_path, tmp_path / "c2", CUFORGE_RECORD="cuforge.lock")
    assert (tmp_path / "cuforge.lock").read_text() == lock
    _run(tmp_path, tmp_path / "c2", CUFORGE_RECORD="cuforge.lock")
    assert (tmp_path / "cuforge.lock").read_text() == lock

    built = _cli(
        tmp_path, tmp_path / "c1", "build", "--lock", "cuforge.lock", "--bundle", "warm.cfb"
    )
    assert built.returncode == 0, built.stderr + built.stdout
    replay = _run(tmp_path, tmp_path / "fresh", "replay")
    assert replay["compiles"] == 0
    assert replay["binaries"] == first["binaries"] and replay["keys"] == first["keys"]

    # with an empty cache only the file kernel can be rebuilt: the rest is reported missing
    cold = _cli(
        tmp_path, tmp_path / "empty", "build", "--lock", "cuforge.lock", "--bundle", "x.cfb"
    )
    assert cold.returncode == 1
    assert "z.cu" in cold.stderr and "scale" in cold.stderr and "k.cu" not in cold.stderr
    assert not (tmp_path / "x.cfb").exists()


def test_prefetch_pulls_exactly_the_lock(tmp_path, isolated_cache):
    (tmp_path / "k.cu").write_text('extern "C" __global__ void k(float* x) { x[0] = TILE; }\n')
    remote = tmp_path / "remote"
    remote.mkdir(mode=0o700)
    url = f"file://{remote}"
    _run(tmp_path, tmp_path / "c1", CUFORGE_RECORD="cuforge.lock", CUFORGE_REMOTE=url)
    pulled = _cli(
        tmp_path, tmp_path / "c2", "prefetch", "--json", "cuforge.lock", CUFORGE_REMOTE=url
    )
    assert pulled.returncode == 0, pulled.stderr
    report = json.loads(pulled.stdout)
    assert report["fetched"] == 6 and report["missing"] == []  # 3 kernels + 3 manifests
    again = _cli(
        tmp_path, tmp_path / "c2", "prefetch", "--json", "cuforge.lock", CUFORGE_REMOTE=url
    )
    assert json.loads(again.stdout)["copied"] == 6
    # served offline from the local cache alone
    replay = _run(tmp_path, tmp_path / "c2", CUFORGE_OFFLINE="1")
    assert replay["compiles"] == 0
    missing = _cli(tmp_path, tmp_path / "c3", "prefetch", "cuforge.lock")  # no remote
    assert missing.returncode == 1 and "missing" in missing.stderr

    # in process, as a service at start-up: each entry lands on disk AND in that cache's
    # memory tier, so the service's first lookups are memory hits and nothing compiles
    lock = tmp_path / "cuforge.lock"
    wanted = lock_keys(read_lock(lock))
    svc = cuforge.Cache(str(tmp_path / "c4"), remotes=(url,))
    seen = []
    report = cuforge.prefetch(lock, cache=svc, progress=lambda *a: seen.append(a))
    assert report.ok and report.fetched == 6 and report.copied == 0
    assert [(d, t, w) for d, t, w, _label in seen] == [(i, 6, "remote") for i in range(1, 7)]
    assert all(svc.get_with_tier(key, kind=kind)[1] == "memory" for kind, key, _ in wanted)
    on_disk = cuforge.Cache(str(tmp_path / "c4"), memory=False)
    assert all(on_disk.get_with_tier(key, kind=kind)[1] == "disk" for kind, key, _ in wanted)
    with cuforge.using(svc):
        z = 'extern "C" __global__ void z(int* p) { *p = 1; }'
        cuforge.compile(z, name="z.cu", arch="sm_90")
    assert svc.counters["compiles"] == 0
    # a restart over the same dir, no remote: copied from disk into memory, nothing fetched
    again = cuforge.Cache(str(tmp_path / "c4"))
    report = cuforge.prefetch(str(lock), cache=again)
    assert report.ok and (report.copied, report.fetched) == (6, 0)
    assert all(again.get_with_tier(key, kind=kind)[1] == "memory" for kind, key, _ in wanted)


def test_background_prefetch_holds_builds_until_it_is_done(tmp_path, isolated_cache):
    """cuforge.prefetch(background=True): the pull runs in a thread; a compile asked for
    meanwhile waits for it and is then a hit (0 compiles), never a miss racing it."""
    import threading

    (tmp_path / "k.cu").write_text('extern "C" __global__ void k(float* x) { x[0] = TILE; }\n')
    remote = tmp_path / "remote"
    remote.mkdir(mode=0o700)
    url = f"file://{remote}"
    _run(tmp_path, tmp_path / "c1", CUFORGE_RECORD="cuforge.lock", CUFORGE_REMOTE=url)
    lock = tmp_path / "cuforge.lock"
    wanted = lock_keys(read_lock(lock))
    svc = cuforge.Cache(str(tmp_path / "c2"), remotes=(url,))
    go, first = threading.Event(), threading.Event()

    def progress(done, total, where, label):  # the pull stops after its first entry
        first.set()
        assert go.wait(60)

    task = cuforge.prefetch(lock, cache=svc, progress=progress, background=True)
    assert first.wait(60) and not task.done()
    compiled = []

    def service():  # the service's first kernel, while the pull is still under way
        with cuforge.using(svc):
            z = 'extern "C" __global__ void z(int* p) { *p = 1; }'
            compiled.append(cuforge.compile(z, name="z.cu", arch="sm_90"))

    worker = threading.Thread(target=service)
    worker.start()
    worker.join(0.5)
    assert worker.is_alive() and not compiled  # held: the entry is not fetched yet
    go.set()
    worker.join(60)
    report = task.wait(60)
    assert report.ok and report.fetched == 6 and task.done() and task.seconds > 0
    assert compiled and svc.counters["compiles"] == 0
    assert all(svc.get_with_tier(key, kind=kind)[1] == "memory" for kind, key, _ in wanted)
    assert svc._prefetching is None  # later builds do not wait on anything


def test_background_prefetch_failure_is_warned_and_builds_go_on(tmp_path, caplog):
    """A background prefetch that fails (here: its progress callback raises) raises from
    wait(); a build meanwhile compiles as it would without it, with one warning."""
    lock = tmp_path / "cuforge.lock"
    (tmp_path / "k.cu").write_text('extern "C" __global__ void k(float* x) { x[0] = TILE; }\n')
    _run(tmp_path, tmp_path / "c1", CUFORGE_RECORD="cuforge.lock")
    svc = cuforge.Cache(str(tmp_path / "c2"))

    def broken(*_args):
        raise OSError("the remote went away")

    task = cuforge.prefetch(lock, cache=svc, progress=broken, background=True)
    with cuforge.using(svc), caplog.at_level("WARNING", logger="cuforge"):
        cuforge.compile(
            'extern "C" __global__ void z(int* p) { *p = 1; }', name="z.cu", arch="sm_90"
        )
    assert svc.counters["compiles"] == 1
    assert "the remote went away" in caplog.text and "background" in caplog.text
    try:
        task.wait(60)
    except OSError as exc:
        assert "went away" in str(exc)
    else:
        raise AssertionError("wait() did not raise the prefetch's error")


def test_record_context_manager_sees_memoized_calls(tmp_path, cache):
    src = 'extern "C" __global__ void m(int* p) { *p = 2; }'
    with cuforge.using(cache):
        cuforge.compile(src, name="m.cu")
        with cuforge.record(tmp_path / "a.lock") as rec:
            cuforge.compile(src, name="m.cu")  # a call-memo hit before the recording
    assert [r["name"] for r in rec.records] == ["m.cu"]
    assert read_lock(tmp_path / "a.lock")[0]["key"] == rec.records[0]["key"]


def test_prefetch_from_redis_pulls_the_lock_through_batched_reads(tmp_path, redis_server):
    """`cuforge prefetch` from a real redis-server: every entry of the lock fetched through
    the backend's batched reads (3 pipelined commands a key, on one connection), then a
    fresh process replays with the remote gone and 0 compiles."""
    (tmp_path / "k.cu").write_text('extern "C" __global__ void k(float* x) { x[0] = TILE; }\n')
    _run(tmp_path, tmp_path / "c1", CUFORGE_RECORD="cuforge.lock", CUFORGE_REMOTE=redis_server.url)
    raw = redis_server.client()
    before = raw.info("stats")
    pulled = _cli(
        tmp_path,
        tmp_path / "c2",
        "prefetch",
        "--json",
        "cuforge.lock",
        CUFORGE_REMOTE=redis_server.url,
    )
    assert pulled.returncode == 0, pulled.stderr
    report = json.loads(pulled.stdout)
    assert report["fetched"] == 6 and report["missing"] == []
    after = raw.info("stats")
    assert after["total_connections_received"] - before["total_connections_received"] == 1
    # EXISTS, STRLEN, GETRANGE per key (+ the INFO above): nothing else was asked
    assert after["total_commands_processed"] - before["total_commands_processed"] == 3 * 6 + 1
    replay = _run(tmp_path, tmp_path / "c2", CUFORGE_OFFLINE="1")
    assert replay["compiles"] == 0


def test_prefetch_runs_the_service_in_process_while_it_pulls(tmp_path, isolated_cache):
    """`cuforge prefetch LOCK -- SCRIPT` / `-- -m MODULE`: one process, the pull in the
    background, the service unchanged and under a fence: it compiles nothing (its builds
    wait for the pull, then hit) and its exit code is the command's."""
    (tmp_path / "k.cu").write_text('extern "C" __global__ void k(float* x) { x[0] = TILE; }\n')
    remote = tmp_path / "remote"
    remote.mkdir(mode=0o700)
    url = f"file://{remote}"
    first = _run(tmp_path, tmp_path / "c1", CUFORGE_RECORD="cuforge.lock", CUFORGE_REMOTE=url)
    (tmp_path / "service_mod.py").write_text(WORKLOAD)
    for n, how in enumerate((["workload.py"], ["-m", "service_mod"])):
        served = _cli(
            tmp_path,
            tmp_path / f"fresh{n}",
            "prefetch",
            "cuforge.lock",
            "--",
            *how,
            CUFORGE_REMOTE=url,
            CUFORGE_FENCE="error",
        )
        assert served.returncode == 0, served.stderr
        out = json.loads(served.stdout.strip().splitlines()[-1])
        assert out["compiles"] == 0 and out["binaries"] == first["binaries"]
    (tmp_path / "exits.py").write_text("import sys; print(sys.argv[1:]); sys.exit(3)\n")
    done = _cli(tmp_path, tmp_path / "c3", "prefetch", "cuforge.lock", "--", "exits.py", "a", "-b")
    assert done.returncode == 3 and done.stdout.strip() == "['a', '-b']"
    # nothing to pull it from: the service still runs, and the missing entries are named
    (tmp_path / "quiet.py").write_text("import time; time.sleep(0.5)\n")
    lonely = _cli(tmp_path, tmp_path / "c4", "prefetch", "cuforge.lock", "--", "quiet.py")
    assert lonely.returncode == 0 and "in no tier" in lonely.stderr and "z.cu" in lonely.stderr
    bad = _cli(tmp_path, tmp_path / "c5", "prefetch", "cuforge.lock", "--", "nope.py")
    assert bad.returncode == 2 and "nope.py" in bad.stderr


def test_lockfile_and_load_bundle_errors_name_what_is_wrong(tmp_path):
    """Issue 35 item 16: each wrong lockfile or argument is one error for people that says
    what was expected -- never an AttributeError, nor a traceback."""
    import pytest

    import cuforge
    from cuforge.core.recording import read_lock

    cases = {
        'version = 1\nkey = "x"\n': "key must be an array of tables ([[key]] stanzas), not str ('x')",
        'version = "1"\n': "version must be the integer 1 (version = 1), not '1' (str)",
        "version = true\n": "version must be the integer 1 (version = 1), not True (bool)",
        "version = 2\n": "lockfile version 2, this cuforge reads 1",
        "version = 1\nkey = [1]\n": "key #1 must be a table ([[key]]), not int",
        'version = 1\n[[key]]\nsystem = "s"\nkind = "kernel"\nname = "n"\nkey = "k"\n'
        "manifest = 3\n": "[[key]] #1: manifest must be a list of str lines",
    }
    for n, (text, message) in enumerate(cases.items()):
        lock = tmp_path / f"l{n}.lock"
        lock.write_text(text)
        with pytest.raises(ValueError) as info:
            read_lock(lock)
        assert str(info.value).startswith(f"{lock}: {message}")
        # and the CLI says it in one line, exit 1 or 2 (not a cuforge bug)
        done = _cli(tmp_path, tmp_path / "c", "build", "--lock", str(lock), "--bundle", "w.cfb")
        assert done.returncode in (1, 2), done.stderr
        assert "Traceback" not in done.stderr and "bug" not in done.stderr, done.stderr
        assert message in done.stderr
    with pytest.raises(TypeError, match=r"path must be the bundle file's path .*not 5"):
        cuforge.load_bundle(5)

    good = tmp_path / "ok.lock"
    good.write_text("version = 1\n")
    done = _cli(tmp_path, tmp_path / "c", "prefetch", str(good), "--", "-m", "missing_module")
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "the service module 'missing_module' cannot be found" in done.stderr
    done = _cli(tmp_path, tmp_path / "c", "prefetch", str(good), "--", "-m", "nopkg.sub")
    assert done.returncode == 2 and "'nopkg.sub' cannot be found" in done.stderr


def test_a_lock_written_outside_the_cwd_builds_from_an_empty_cache(tmp_path):
    """Issue 35 item 11: the stanzas' paths were written against the cwd and read against
    the lock's directory: a lock recorded in A but written to B could not build k.cu."""
    a, b = tmp_path / "A", tmp_path / "B"
    (a / "inc").mkdir(parents=True)
    b.mkdir()
    (a / "inc" / "t.cuh").write_text("#define TWICE(x) (2 * (x))\n")
    (a / "k.cu").write_text(
        '#include "t.cuh"\nextern "C" __global__ void k(float* x) { x[0] = TWICE(TILE); }\n'
    )
    (a / "w.py").write_text(
        "import json, os, cuforge\n"
        "r = cuforge.compile_file('k.cu', defines={'TILE': 4}, arch='sm_90',\n"
        "                         include_dirs=[os.path.abspath('inc')])\n"
        "print(json.dumps({'key': r.key, 'binary': r.binary.hex()}))\n"
    )
    lock = b / "x.lock"
    env = child_env(
        CUFORGE_CACHE_DIR=str(tmp_path / "c1"), CUFORGE_ARCH="sm_90", CUFORGE_RECORD=str(lock)
    )
    first = finish(spawn(open(a / "w.py").read(), env, cwd=str(a)))
    text = lock.read_text()
    assert 'root = "../A"' in text and str(tmp_path) not in text  # relative, to the lock
    # from an empty cache, in a third directory: the stanza's paths are found
    built = _cli(tmp_path, tmp_path / "empty", "build", "--lock", "B/x.lock", "--bundle", "w.cfb")
    assert built.returncode == 0, built.stdout + built.stderr
    from cuforge.store.bundle import BundleStore

    store = BundleStore(tmp_path / "w.cfb")
    try:
        entry = store.get(first["key"])
        assert entry is not None and entry.payload.hex() == first["binary"]
    finally:
        store.close()
