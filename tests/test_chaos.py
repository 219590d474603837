"""The chaos suite: real processes, real files, real kills, real full and read-only disks.

Every test here checks one promise end to end, in fresh processes: *a compile always
returns the right bytes, and nothing hangs*, whatever happens to the cache dir. Bounded to
a few minutes on 2 cores. Set ``CUFORGE_CHAOS_REPORT=<file>`` to append one JSON line per
test (trials, failures) -- docs/reliability.md is made from it.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.chaos_trial import KERNELS, kernel_source, trial
from tests.child import ROOT, child_env, run_python

pytestmark = pytest.mark.chaos

#: a cap small enough that the storm evicts all the time (entries are ~3-5 KiB)
STORM_CAP = 24 * 1024
STORM_SECONDS = float(os.environ.get("CUFORGE_CHAOS_SECONDS", "12"))


@pytest.fixture(scope="module")
def reference() -> dict[str, str]:
    """sha256 of each kernel's cubin, compiled with the cache off."""
    import cuforge

    os.environ["CUFORGE_DISABLE_CACHE"] = "1"
    try:
        return {
            f"k{i}.cu": hashlib.sha256(
                cuforge.compile(kernel_source(i), name=f"k{i}.cu", arch="sm_90").binary
            ).hexdigest()
            for i in range(KERNELS)
        }
    finally:
        del os.environ["CUFORGE_DISABLE_CACHE"]


def report(test: str, **figures) -> None:
    path = os.environ.get("CUFORGE_CHAOS_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"test": test, **figures}) + "\n")


#: A worker: compiles every kernel (in a random order, ``$CHAOS_ROUNDS`` times) and prints
#: one line per result: "OK name source" or "BAD name source". Used by every test below.
WORKER = "from tests.chaos_trial import worker; worker()"


def worker_env(cache_dir, expected: dict, **extra: str) -> dict[str, str]:
    env = child_env(
        CUFORGE_CACHE_DIR=str(cache_dir),
        CHAOS_EXPECTED=json.dumps(expected),
        PYTHONUNBUFFERED="1",
        **extra,
    )
    env["PYTHONPATH"] += os.pathsep + ROOT  # for tests.chaos_trial
    return env


def run_worker(env: dict, timeout: float = 120) -> tuple[list[str], subprocess.CompletedProcess]:
    done = subprocess.run(
        [sys.executable, "-c", WORKER],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return done.stdout.split("\n"), done


def cli(cache_dir, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """``cuforge ARGS`` in a fresh process; a hang fails the test through the timeout."""
    return subprocess.run(
        [sys.executable, "-m", "cuforge.cli.main", *args],
        env=child_env(CUFORGE_CACHE_DIR=str(cache_dir), CI="true"),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def disk_bytes(root) -> int:
    total = 0
    for dirpath, _, files in os.walk(os.path.join(root, "v1", "entries")):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    return total


# --------------------------------------------------------------------------- SIGKILL storm


def test_sigkill_storm_with_eviction_and_prune(tmp_path, reference):
    """Workers compile under a cap that forces eviction while they are SIGKILLed at random
    and `cache prune` runs beside them. No result may be wrong; afterwards the cache
    verifies clean, stays under its cap, and serves every kernel correctly."""
    cache = tmp_path / "cache"
    # no memory tier and no call memo: every compile goes to the disk tier
    env = worker_env(
        cache,
        reference,
        CHAOS_ROUNDS="1000",
        CUFORGE_CACHE_MAX_BYTES=str(STORM_CAP),
        CUFORGE_MEMORY_MAX_BYTES="0",
    )
    rng = random.Random(1234)
    outputs: list[str] = []
    procs: list[subprocess.Popen] = []
    kills = prunes = 0

    def start() -> subprocess.Popen:
        log = open(tmp_path / f"w{len(outputs)}.log", "w+")  # noqa: SIM115 - read back below
        outputs.append(log.name)
        return subprocess.Popen([sys.executable, "-c", WORKER], env=env, stdout=log, stderr=log)

    procs = [start() for _ in range(3)]
    deadline = time.monotonic() + STORM_SECONDS
    while time.monotonic() < deadline:
        time.sleep(rng.uniform(0.2, 0.8))
        victim = rng.randrange(len(procs))
        procs[victim].send_signal(signal.SIGKILL)
        procs[victim].wait()
        kills += 1
        procs[victim] = start()
        if rng.random() < 0.3:
            prune = cli(cache, "cache", "prune", "--max-bytes", str(STORM_CAP // 2))
            assert prune.returncode == 0, prune.stderr
            prunes += 1
    for p in procs:
        p.send_signal(signal.SIGKILL)
        p.wait()
    results = bad = 0
    for name in outputs:
        with open(name) as f:
            for line in f:
                if line.startswith(("OK ", "BAD ")):
                    results += 1
                    bad += line.startswith("BAD ")
                elif "Traceback" in line:
                    pytest.fail(f"a worker crashed:\n{open(name).read()}")
    # afterwards: every kernel right, the cache clean and under its cap
    lines, done = run_worker(worker_env(cache, reference, CUFORGE_CACHE_MAX_BYTES=str(STORM_CAP)))
    assert done.returncode == 0, done.stderr
    after = [line for line in lines if line.startswith(("OK ", "BAD "))]
    verify = cli(cache, "cache", "verify")
    report(
        "sigkill_storm",
        seconds=STORM_SECONDS,
        kills=kills,
        prunes=prunes,
        results=results,
        wrong=bad,
        verify_exit=verify.returncode,
    )
    assert bad == 0
    assert results > 0
    assert len(after) == KERNELS and all(line.startswith("OK ") for line in after), after
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert disk_bytes(cache) <= STORM_CAP + 8 * 1024  # the cap, give or take the entry in flight


# --------------------------------------------------------------------------- corruption fuzzer


def _populate(cache, reference) -> None:
    env = worker_env(cache, reference)
    lines, done = run_worker(env)
    assert done.returncode == 0, done.stderr
    stats = cli(cache, "cache", "stats")  # telemetry flushed, index read
    assert stats.returncode == 0, stats.stderr


def _file_classes(root: str) -> dict[str, str]:
    """One file of each class under the cache dir: class -> path."""
    found: dict[str, str] = {}
    for dirpath, _dirs, files in os.walk(root):
        for f in sorted(files):
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, root)
            parent = os.path.basename(dirpath)
            if rel.startswith(os.path.join("v1", "entries")):
                # manifests have no payload: a few hundred bytes; kernels carry a cubin
                cls = "entry:kernel" if os.path.getsize(path) > 2048 else "entry:manifest"
            elif f.endswith(".lock") or f == "lock":
                cls = "lock:" + (parent if parent in ("index", "telemetry") else "compile")
            elif parent == "names":
                cls = os.path.dirname(rel)  # one miss history per source name
            else:
                cls = rel
            found.setdefault(cls, path)
    return found


MUTATIONS = ("truncate", "zero", "flip", "garbage", "fifo", "directory", "symlink")


def _mutate(path: str, how: str, rng: random.Random, victim: str) -> None:
    size = os.path.getsize(path)
    if how == "truncate":
        os.truncate(path, size // 2)
    elif how == "zero":
        with open(path, "r+b") as f:
            f.write(b"\0" * size)
    elif how == "flip":
        with open(path, "r+b") as f:
            data = bytearray(f.read())
            if data:
                at = rng.randrange(len(data))
                data[at] ^= 0xFF
                f.seek(0)
                f.write(data)
    elif how == "garbage":
        with open(path, "wb") as f:
            f.write(os.urandom(max(size, 64)))
    else:
        os.unlink(path)
        if how == "fifo":
            os.mkfifo(path)
        elif how == "directory":
            os.mkdir(path)
        elif how == "symlink":
            os.symlink(victim, path)


#: damage that could make a careless reader block forever (opening a FIFO; following a
#: symlink): its trials run in a child, so a hang is a timeout, not a stuck test run
MAY_HANG = ("fifo", "symlink")


def _fresh_process(monkeypatch) -> None:
    """Forget what this process remembers of earlier cache dirs, as a new process would:
    the call memo, the toolchain memo and identity, the miss history. (A new cache dir
    is a new default cache: its tiers and counters start empty.)"""
    from cuforge.core.pipeline import reset_memo
    from cuforge.keys import explain
    from cuforge.toolchain import identity
    from cuforge.toolchain import memo as toolchain_memo

    reset_memo()
    monkeypatch.setattr(toolchain_memo, "_cache", None)
    monkeypatch.setattr(identity, "_identity_memo", {})
    monkeypatch.setattr(explain, "_memory_history", {})
    monkeypatch.setattr(explain, "_last_misses", [])


def _trial_in_child(cache, reference, label: str) -> list[str]:
    """:func:`tests.chaos_trial.trial` in a fresh interpreter; a hang fails it by timeout."""
    env = worker_env(cache, reference, CHAOS_LABEL=label)
    try:
        out = run_python("from tests.chaos_trial import trial_main; trial_main()", env, 150)
    except AssertionError as exc:  # a hang (killed at the timeout) or a crash
        return [f"{label}: {str(exc)[-2000:]}"]
    return out["problems"]


def test_corruption_fuzzer_over_every_file_class(tmp_path, reference, monkeypatch):
    """For one file of every class under the cache dir (entries, manifests, the journal and
    its lock, telemetry, the explain history, the toolchain memo, lock files) and every
    kind of damage (truncated, zeroed, a flipped byte, garbage, a FIFO, a directory, a
    symlink to a file outside): compiles still return the right bytes, nothing hangs,
    nothing is written through the symlink, and `verify --repair`, `stats`, `ls` and
    `prune` finish (then `verify` is clean).

    Each trial compiles and runs the commands in one process (tests/chaos_trial.py): this
    one, made to forget earlier cache dirs, or a child for damage that :data:`MAY_HANG`."""
    pristine = tmp_path / "pristine"
    _populate(pristine, reference)
    classes = _file_classes(str(pristine))
    assert {"entry:kernel", "entry:manifest", "v1/index/journal"} <= set(classes), classes
    rng = random.Random(99)
    trials = failures = 0
    problems: list[str] = []
    for cls, path in sorted(classes.items()):
        rel = os.path.relpath(path, pristine)
        for how in MUTATIONS:
            trials += 1
            trial_dir = tmp_path / f"t{trials}"
            cache = trial_dir / "cache"
            shutil.copytree(pristine, cache, symlinks=True)
            victim = trial_dir / "victim.txt"
            victim.write_text("do not touch\n")
            _mutate(str(cache / rel), how, rng, str(victim))
            label = f"{cls} {how}"
            if how in MAY_HANG:
                found = _trial_in_child(cache, reference, label)
            else:
                _fresh_process(monkeypatch)
                monkeypatch.setenv("CUFORGE_CACHE_DIR", str(cache))
                found = trial(reference, label)
            if victim.read_text() != "do not touch\n":
                found.append(f"{label}: wrote through a planted symlink")
            failures += bool(found)
            problems += found
            shutil.rmtree(trial_dir, ignore_errors=True)
    _fresh_process(monkeypatch)
    report(
        "corruption_fuzzer",
        classes=sorted(classes),
        mutations=list(MUTATIONS),
        trials=trials,
        failures=failures,
    )
    assert not problems, "\n\n".join(problems)


# --------------------------------------------------------------------------- full and read-only disks


def _mount_tmpfs(path, size: str) -> None:
    os.makedirs(path, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(
            f"cannot mount a tmpfs here ({done.stderr.strip() or 'not root'}); the store's own tests simulate ENOSPC"
        )


@pytest.fixture
def small_disk(tmp_path):
    mnt = tmp_path / "disk"
    _mount_tmpfs(mnt, "256k")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_full_disk_still_gives_correct_binaries(small_disk, reference):
    cache = small_disk / "cache"
    filler = small_disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass  # ENOSPC: the disk is full
    finally:
        os.close(fd)
    lines, done = run_worker(worker_env(cache, reference, CHAOS_ROUNDS="2"))
    results = [line for line in lines if line.startswith(("OK ", "BAD "))]
    report("full_disk", results=len(results), wrong=sum(r.startswith("BAD") for r in results))
    assert done.returncode == 0, done.stderr
    assert len(results) == 2 * KERNELS and all(r.startswith("OK ") for r in results), results


def test_read_only_disk_still_gives_correct_binaries(small_disk, reference):
    cache = small_disk / "cache"
    _populate(cache, reference)
    ro = subprocess.run(
        ["mount", "-o", "remount,ro", str(small_disk)], capture_output=True, text=True, check=False
    )
    if ro.returncode != 0:
        pytest.skip(f"cannot remount read-only: {ro.stderr.strip()}")
    try:
        lines, done = run_worker(worker_env(cache, reference))
        results = [line for line in lines if line.startswith(("OK ", "BAD "))]
        assert done.returncode == 0, done.stderr
        assert len(results) == KERNELS and all(r.startswith("OK ") for r in results), results
        # the entries written before the disk became read-only are still served
        assert all(r.endswith("disk") for r in results), results
        for args in (("cache", "stats"), ("cache", "ls"), ("cache", "verify")):
            c = cli(cache, *args)
            assert c.returncode in (0, 1) and "Traceback" not in c.stderr, c.stderr
        report("read_only_disk", results=len(results), wrong=0)
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(small_disk)], check=False)


# --------------------------------------------------------------------------- trust


@pytest.mark.skipif(os.geteuid() != 0, reason="making a cache dir owned by another user needs root")
@pytest.mark.parametrize("problem", ["other owner", "group-writable", "world-writable"])
def test_untrusted_cache_dir_is_not_read(tmp_path, reference, problem):
    """A cache dir owned by someone else, or writable by group or others, is never read:
    every compile happens (with the right bytes) and one warning names the fix."""
    cache = tmp_path / "cache"
    _populate(cache, reference)
    if problem == "other owner":
        for dirpath, dirs, files in os.walk(cache):
            for name in dirs + files:
                os.lchown(os.path.join(dirpath, name), 65534, 65534)
        os.chown(cache, 65534, 65534)
    else:
        os.chmod(cache, 0o770 if problem == "group-writable" else 0o777)
    lines, done = run_worker(worker_env(cache, reference))
    results = [line for line in lines if line.startswith(("OK ", "BAD "))]
    assert done.returncode == 0, done.stderr
    assert len(results) == KERNELS and all(r.startswith("OK ") for r in results)
    assert all(r.endswith("compiled") or r.endswith("memory") for r in results), results
    assert done.stderr.count("not using the disk cache") == 1, done.stderr
    assert (
        ("chown" in done.stderr) if problem == "other owner" else ("chmod -R go-w" in done.stderr)
    )
    report("untrusted_cache_dir", problem=problem, served_from_disk=0)


# --------------------------------------------------------------------------- bad settings


BAD_VALUES = {
    "CUFORGE_CACHE_MAX_BYTES": ["1e400", "-5", "nan", "lots"],
    "CUFORGE_MEMORY_MAX_BYTES": ["1e400", "-5", "nan", "lots"],
    # (a lock timeout of 1e400 reads as inf: documented to mean "wait forever")
    "CUFORGE_LOCK_TIMEOUT": ["nan", "-1", "-inf", "soon"],
}


def test_out_of_range_settings_name_the_variable():
    code = textwrap.dedent(
        """
        import json, os, sys
        import cuforge
        out = {}
        for var, values in json.loads(os.environ["BAD"]).items():
            for value in values:
                os.environ[var] = value
                try:
                    # a new source each time: an identical call is answered before settings are read
                    src = 'extern "C" __global__ void k(){} // %s=%s' % (var, value)
                    cuforge.compile(src, arch="sm_90")
                    out[var + "=" + value] = "accepted"
                except Exception as exc:
                    out[var + "=" + value] = type(exc).__name__ + ": " + str(exc)
                del os.environ[var]
        print(json.dumps(out))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=child_env(BAD=json.dumps(BAD_VALUES)),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    wrong = {k: v for k, v in out.items() if k.split("=")[0] not in v}
    report("bad_settings", trials=len(out), failures=len(wrong))
    assert not wrong, wrong
