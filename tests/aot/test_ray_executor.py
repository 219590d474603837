"""Issue 13, section 5: the Ray executor. Each variant is a Ray task, its files travel by
content, results come back as they finish, failures (a compile error, a changed file, a
killed worker) are results, and the entries are byte for byte those of the local executor.

One local Ray (2 CPUs, no dashboard) serves the module; the test marked slow starts a
second node on this host with ``ray start``. Everything started here is shut down."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'cuforge[ray]')")
from ray import cloudpickle  # noqa: E402 - after the skip

from cuforge.aot import ray_executor  # noqa: E402 - after the skip: it needs ray
from cuforge.aot.executor import LocalExecutor  # noqa: E402
from cuforge.aot.manifest import load_manifest  # noqa: E402
from cuforge.aot.ray_executor import RayExecutor  # noqa: E402
from cuforge.aot.tasks import store_entries  # noqa: E402
from tests.aot.conftest import cli, jit_calls, variant_calls  # noqa: E402
from tests.conftest import GPU_VISIBLE, child_env  # noqa: E402


@pytest.fixture(scope="module")
def local_ray(tmp_path_factory):
    """One local Ray for the module. Its workers inherit the environment at start, so it
    starts with a cache dir of its own (never the user's) and the test arch."""
    saved = {k: os.environ.get(k) for k in ("CUFORGE_CACHE_DIR", "CUFORGE_ARCH")}
    os.environ["CUFORGE_CACHE_DIR"] = str(tmp_path_factory.mktemp("ray-worker-cache"))
    if not GPU_VISIBLE:
        os.environ["CUFORGE_ARCH"] = "sm_90"
    try:
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    yield ray
    ray.shutdown()


def use_cache(monkeypatch, path) -> None:
    """Point this process at the cache dir ``path`` (a new default cache: fresh store,
    call memo and counters)."""
    monkeypatch.setenv("CUFORGE_CACHE_DIR", str(path))


def cache_contents(path) -> dict[tuple[str, str], bytes]:
    """(kind, key) -> payload of every entry in the disk cache at ``path``."""
    from cuforge.store.disk import DiskStore

    store = DiskStore(str(path), 2**40, telemetry=False)
    out = {}
    for info in store.iterate():
        entry = store.get(info.key)
        assert entry is not None, info
        out[(entry.kind, entry.key)] = bytes(entry.payload)
    return out


def by_label(results) -> dict:
    results = list(results)
    labels = [r.label for r in results]
    assert len(labels) == len(set(labels)), labels
    return {r.label: r for r in results}


def test_ray_makes_the_same_entries_as_the_local_executor(
    project, local_ray, tmp_path, monkeypatch
):
    m = load_manifest(str(project / "cuforge.toml"))
    assert len(m.tasks) == 8

    use_cache(monkeypatch, tmp_path / "local")
    local = by_label(LocalExecutor(1).run(m.tasks, m.root))
    assert all(r.ok and not r.hit for r in local.values()), [r.log for r in local.values()]
    local_entries = cache_contents(tmp_path / "local")

    use_cache(monkeypatch, tmp_path / "ray")
    executor = RayExecutor()
    results = by_label(executor.run(m.tasks, m.root))
    executor.close()  # joined a running Ray: leaves it up
    assert ray.is_initialized()
    assert set(results) == set(local)
    for r in results.values():
        assert r.ok and not r.hit, r.log
        assert r.task in m.tasks  # the driver's own task object comes back
        assert r.entries, r.label  # collected on the worker, sent back
    assert store_entries(results.values()) == sum(len(r.entries) for r in results.values())
    ray_entries = cache_contents(tmp_path / "ray")

    assert {k for k in local_entries if k[0] == "kernel"}  # there is something to compare
    assert ray_entries == local_entries  # same keys, same kinds, same bytes

    # and they are exactly the entries a user's later JIT calls hit
    out = jit_calls(
        project,
        variant_calls((128, 256), ("float", "double"), ("sm_80", "sm_90")),
        CUFORGE_CACHE_DIR=str(tmp_path / "ray"),
    )
    assert out["errors"] == []
    assert out["counters"]["compiles"] == 0
    assert out["sources"] == ["disk"] * 8


def test_each_distinct_file_content_is_put_once(project, local_ray, tmp_path, monkeypatch):
    (project / "include" / "copy.cuh").write_text((project / "include" / "tile.cuh").read_text())
    m = load_manifest(str(project / "cuforge.toml"))
    puts: list[int] = []
    real_put = ray.put

    def counting_put(value, *args, **kwargs):
        puts.append(len(value))
        return real_put(value, *args, **kwargs)

    monkeypatch.setattr(ray, "put", counting_put)
    use_cache(monkeypatch, tmp_path / "c")
    results = list(RayExecutor().run(m.tasks, m.root))
    assert all(r.ok for r in results), [r.log for r in results]
    distinct = {sha for t in m.tasks for sha in t.files.values()}
    assert len(distinct) == 2  # red.cu and tile.cuh, shared by all 8 variants
    assert len(puts) == 2


def test_a_failing_variant_is_a_result_and_the_others_build(
    project, local_ray, tmp_path, monkeypatch
):
    text = (project / "cuforge.toml").read_text().replace('"double"]', '"no_such_type"]')
    (project / "cuforge.toml").write_text(text)
    m = load_manifest(str(project / "cuforge.toml"))
    use_cache(monkeypatch, tmp_path / "c")
    results = by_label(RayExecutor().run(m.tasks, m.root))
    assert len(results) == 8
    bad = {label for label, r in results.items() if not r.ok}
    assert bad == {label for label in results if "no_such_type" in label}
    assert len(bad) == 4
    for label in bad:
        assert "no_such_type" in results[label].log  # the compiler's own log
        assert "on Ray node" in results[label].log  # and where it ran
        assert results[label].entries is None
    assert all(results[label].entries for label in set(results) - bad)


def test_a_file_changed_after_expansion_fails_its_variants_only(
    project, local_ray, tmp_path, monkeypatch
):
    m = load_manifest(str(project / "cuforge.toml"))
    (project / "red.cu").write_text((project / "red.cu").read_text() + "\n// edited\n")
    use_cache(monkeypatch, tmp_path / "c")
    results = list(RayExecutor().run(m.tasks, m.root))
    assert len(results) == 8
    assert all(not r.ok and "changed since the manifest was expanded" in r.log for r in results)


def _crash_on_double(task, *args):
    """A worker body that kills its worker process for the ``double`` variants."""
    if "double" in task.label:
        os._exit(1)
    from cuforge.aot import ray_executor as real

    return real._build_on_worker(task, *args)


def test_a_lost_worker_is_a_failed_result_not_an_exception(
    project, local_ray, tmp_path, monkeypatch
):
    m = load_manifest(str(project / "cuforge.toml"))
    use_cache(monkeypatch, tmp_path / "c")
    monkeypatch.setattr(ray_executor, "_build_on_worker", _crash_on_double)
    module = sys.modules[__name__]
    cloudpickle.register_pickle_by_value(module)  # the workers cannot import tests/
    try:
        results = by_label(RayExecutor(max_retries=0).run(m.tasks, m.root))
    finally:
        cloudpickle.unregister_pickle_by_value(module)
    assert len(results) == 8
    for label, r in results.items():
        if "double" in label:
            assert not r.ok and "died" in r.log, r.log
        else:
            assert r.ok and r.entries, r.log


def _wait_for_marker(task, *args):
    """A worker body that holds the ``256, double`` variants until the test has received
    the other results (a file appears), then builds as usual. The marker's path is in the
    worker's environment (the forwarded variables reach it through Ray's runtime_env)."""
    if "256, double" in task.label:
        deadline = time.monotonic() + 60
        while not os.path.exists(os.environ["CUFORGE_TEST_MARKER"]):
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
    from cuforge.aot import ray_executor as real

    return real._build_on_worker(task, *args)


def test_results_come_back_as_they_finish(project, local_ray, tmp_path, monkeypatch):
    marker = tmp_path / "go"
    m = load_manifest(str(project / "cuforge.toml"))
    use_cache(monkeypatch, tmp_path / "c")
    # the marker's path reaches the held tasks through the forwarded environment
    monkeypatch.setattr(
        ray_executor, "FORWARDED_ENV", (*ray_executor.FORWARDED_ENV, "CUFORGE_TEST_MARKER")
    )
    monkeypatch.setenv("CUFORGE_TEST_MARKER", str(marker))
    monkeypatch.setattr(ray_executor, "_build_on_worker", _wait_for_marker)
    module = sys.modules[__name__]
    cloudpickle.register_pickle_by_value(module)
    order = []
    try:
        # 0.5 CPU a task: 4 run at once on 2 CPUs, so 2 held tasks block nothing
        for result in RayExecutor(num_cpus=0.5).run(m.tasks, m.root):
            order.append(result.label)
            assert result.ok, result.log
            if len(order) == 6:
                marker.write_text("go")  # only now may the held variants finish
    finally:
        marker.write_text("go")
        cloudpickle.unregister_pickle_by_value(module)
    assert len(order) == 8
    assert all("256, double" not in label for label in order[:6])
    assert all("256, double" in label for label in order[6:])


def test_a_remote_tier_takes_the_entries_from_the_workers(
    project, local_ray, tmp_path, monkeypatch
):
    remote = tmp_path / "remote"
    remote.mkdir(mode=0o700)
    url = f"file://{remote}"
    monkeypatch.setenv("CUFORGE_REMOTE", url)
    m = load_manifest(str(project / "cuforge.toml"))
    use_cache(monkeypatch, tmp_path / "driver")
    results = list(RayExecutor().run(m.tasks, m.root))
    assert all(r.ok for r in results), [r.log for r in results]
    # each worker wrote the remote and read it back: no payload came to the driver
    assert all(r.entries is None for r in results)
    assert cache_contents(tmp_path / "driver") == {}

    out = jit_calls(
        project,
        variant_calls((128, 256), ("float", "double"), ("sm_80", "sm_90")),
        CUFORGE_CACHE_DIR=str(tmp_path / "fresh"),
        CUFORGE_REMOTE=url,
    )
    assert out["errors"] == []
    assert out["counters"]["compiles"] == 0
    assert out["sources"] == ["remote"] * 8


def test_a_worker_that_cannot_sign_sends_its_entries_back(
    project, local_ray, tmp_path, monkeypatch
):
    remote = tmp_path / "remote"
    remote.mkdir(mode=0o700)
    monkeypatch.setenv("CUFORGE_REMOTE", f"file://{remote}")
    monkeypatch.setenv("CUFORGE_REMOTE_KEY", "driver-only-secret")  # never sent to workers
    m = load_manifest(str(project / "cuforge.toml"))
    use_cache(monkeypatch, tmp_path / "driver")
    results = list(RayExecutor().run(m.tasks, m.root))
    assert all(r.ok and r.entries for r in results), [r.log for r in results]
    # the workers wrote nothing the remote would refuse
    assert [p for p in remote.rglob("*") if p.is_file()] == []
    stored = store_entries(results)  # the driver signs and writes them
    assert stored == sum(len(r.entries) for r in results)
    assert [p for p in remote.rglob("*") if p.is_file()]  # now the remote has them, signed
    out = jit_calls(
        project,
        variant_calls((128, 256), ("float", "double"), ("sm_80", "sm_90")),
        CUFORGE_CACHE_DIR=str(tmp_path / "fresh"),
        CUFORGE_REMOTE=f"file://{remote}",
        CUFORGE_REMOTE_KEY="driver-only-secret",
    )
    assert out["errors"] == [] and out["counters"]["compiles"] == 0
    assert out["sources"] == ["remote"] * 8


def test_a_worker_with_another_compiler_refuses_to_build():
    from cuforge.toolchain.identity import compiler_identity

    mine = compiler_identity("nvrtc")
    assert ray_executor._identity_problem({"nvrtc": mine}) is None
    other = dict(mine, version="99.9")
    problem = ray_executor._identity_problem({"nvrtc": other})
    assert problem is not None
    assert "version: driver '99.9'" in problem and "same CUDA toolkit" in problem


def test_cuforge_build_executor_ray_reports_a_failure_and_builds_the_rest(project):
    """The command of the issue, end to end in a fresh process that starts its own Ray:
    exit code 1, each failure's log, the other variants built and then hit."""
    text = (project / "cuforge.toml").read_text().replace('"double"]', '"no_such_type"]')
    (project / "cuforge.toml").write_text(text)
    done = cli(project, "build", "--executor", "ray", "--json", RAY_ADDRESS="")
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["executor"] == "ray"
    assert report["total"] == 8 and report["built"] == 4 and report["failed"] == 4
    for r in report["results"]:
        if "no_such_type" in r["label"]:
            assert not r["ok"] and "no_such_type" in r["log"]
        else:
            assert r["ok"] and not r["hit"]
    out = jit_calls(project, variant_calls((128, 256), ("float",), ("sm_80", "sm_90")))
    assert out["errors"] == [] and out["counters"]["compiles"] == 0


# -- two nodes on this host ---------------------------------------------------------------

DRIVER = """
import json, os
from cuforge.aot.build import build
report = build(os.environ["MANIFEST"], executor="ray")  # joins RAY_ADDRESS, leaves it after
print(json.dumps({
    "ok": report.ok,
    "executor": report.executor,
    "results": [[r.label, r.ok, r.hit, r.log[-500:]] for r in report.results],
}))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(proc: subprocess.Popen) -> None:
    """Stop a ``ray start --block`` we started (it takes its Ray processes down with it)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: only what it started
        proc.wait(10)


@pytest.mark.slow
def test_a_second_node_started_with_ray_start(project, tmp_path):
    """A head node with no CPUs and a worker node with 2, both on this host: every
    variant must run on the second node, its files shipped there through Ray's object
    store; the driver joins with RAY_ADDRESS, as on a cluster."""
    exe = os.path.join(os.path.dirname(sys.executable), "ray")
    if not os.path.exists(exe):
        pytest.skip(f"no `ray` command next to {sys.executable}")
    temp = tempfile.mkdtemp(prefix="cfray")  # short: Ray's socket paths must fit 107 bytes
    port = _free_port()
    env = child_env(RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")
    env.pop("RAY_ADDRESS", None)
    common = ["--block", "--disable-usage-stats"]
    procs: list[subprocess.Popen] = []
    try:
        head = subprocess.Popen(
            [exe, "start", "--head", f"--port={port}", "--num-cpus=0", "--temp-dir", temp]
            + ["--include-dashboard=false", *common],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        procs.append(head)
        address = _wait_for_head(exe, port, env, head)
        node = subprocess.Popen(
            [exe, "start", f"--address={address}", "--num-cpus=2", *common],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        procs.append(node)
        _wait_for_nodes(exe, address, env, 2, node)
        done = subprocess.run(
            [sys.executable, "-c", DRIVER],
            cwd=str(project),
            env=dict(env, RAY_ADDRESS=address, MANIFEST=str(project / "cuforge.toml")),
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        out = json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        for proc in reversed(procs):
            _stop(proc)
        shutil.rmtree(temp, ignore_errors=True)
    assert out["ok"] and out["executor"] == "ray", out["results"]
    assert len(out["results"]) == 8 and all(ok and not hit for _, ok, hit, _ in out["results"])
    # the driver stored what the second node built: later JIT calls compile nothing
    calls = jit_calls(project, variant_calls((128, 256), ("float", "double"), ("sm_80", "sm_90")))
    assert calls["counters"]["compiles"] == 0 and calls["errors"] == []


def _wait_for_head(exe: str, port: int, env: dict, head: subprocess.Popen) -> str:
    deadline = time.monotonic() + 90
    address = f"127.0.0.1:{port}"
    while time.monotonic() < deadline:
        if head.poll() is not None:
            pytest.skip(f"`ray start --head` could not start here: {head.stdout.read()[-2000:]!r}")
        probe = subprocess.run(
            [exe, "status", f"--address={address}"], env=env, capture_output=True, check=False
        )
        if probe.returncode == 0:
            return address
        time.sleep(1)
    pytest.skip("`ray start --head` did not answer within 90 s on this machine")


def _wait_for_nodes(exe: str, address: str, env: dict, count: int, node: subprocess.Popen) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if node.poll() is not None:
            pytest.skip(
                f"`ray start --address` could not start here: {node.stdout.read()[-2000:]!r}"
            )
        probe = subprocess.run(
            [exe, "status", f"--address={address}"],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if probe.stdout.count("node_") >= count:
            return
        time.sleep(1)
    pytest.skip("the second Ray node did not join within 90 s on this machine")
