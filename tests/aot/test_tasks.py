"""The task contract executors share: content-addressed files that travel, and
``run_task(collect=True)`` handing back exactly the entries a later JIT call hits."""

from __future__ import annotations

import os

import pytest

from cuforge.aot.manifest import load_manifest
from cuforge.aot.tasks import (
    TaskFileError,
    materialize,
    read_blobs,
    run_task,
    store_entries,
    task_entries,
)
from tests.aot.conftest import jit_calls, variant_calls


def test_files_travel_by_content_and_build_the_same_keys_elsewhere(project, tmp_path):
    m = load_manifest(str(project))
    task = m.tasks[0]
    blobs = read_blobs(m.tasks, m.root)
    assert len(blobs) == 2  # red.cu and include/tile.cuh, each once
    elsewhere = tmp_path / "worker"
    elsewhere.mkdir()
    materialize(task, blobs, str(elsewhere))
    assert (elsewhere / "include" / "tile.cuh").read_text() == (
        project / "include" / "tile.cuh"
    ).read_text()
    here = run_task(task, m.root, collect=True)
    there = run_task(task, str(elsewhere), collect=True)
    assert here.ok and there.ok, here.log + there.log
    assert sorted(e[:3] for e in here.entries) == sorted(e[:3] for e in there.entries)
    assert {e[1] for e in here.entries} == {"kernel", "manifest"}


def test_collected_entries_stored_on_the_driver_are_hits(project):
    m = load_manifest(str(project))
    results = [run_task(t, m.root, collect=True) for t in m.tasks[:2]]
    assert all(r.ok and not r.hit and r.entries for r in results)
    assert store_entries(results) == 4
    calls = variant_calls((128,), ("float",), ("sm_80", "sm_90"))
    out = jit_calls(project, calls)
    assert out["counters"]["compiles"] == 0 and out["sources"] == ["disk", "disk"]
    # and the in-place lookup finds the same two entries per variant
    assert {e.kind for e in task_entries(m.tasks[0], m.root)} == {"kernel", "manifest"}


def test_a_changed_file_or_a_bad_path_or_blob_is_refused(project, tmp_path):
    m = load_manifest(str(project))
    task = m.tasks[0]
    blobs = read_blobs([task], m.root)
    (project / "include" / "tile.cuh").write_text("// edited\n")
    with pytest.raises(TaskFileError, match="changed since the manifest was expanded"):
        read_blobs([task], m.root)
    bad_blobs = {sha: b"tampered" for sha in blobs}
    with pytest.raises(TaskFileError, match="wrong sha256"):
        materialize(task, bad_blobs, str(tmp_path / "w1"))
    from dataclasses import replace

    escaping = replace(task, files={"../evil.cuh": next(iter(blobs))})
    with pytest.raises(TaskFileError, match="may not travel"):
        materialize(escaping, blobs, str(tmp_path / "w2"))
    absolute = replace(task, files={"/etc/evil": next(iter(blobs))})
    with pytest.raises(TaskFileError, match="may not travel"):
        materialize(absolute, blobs, str(tmp_path / "w3"))


def test_materialize_never_writes_through_a_symlinked_dir(project, tmp_path):
    m = load_manifest(str(project))
    task = m.tasks[0]
    blobs = read_blobs([task], m.root)
    dest = tmp_path / "w"
    dest.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, dest / "include")
    with pytest.raises(TaskFileError, match="symlink"):
        materialize(task, blobs, str(dest))
    assert list(outside.iterdir()) == []


def test_a_failing_task_reports_its_log(project):
    from dataclasses import replace

    m = load_manifest(str(project))
    bad = replace(m.tasks[0], spec=dict(m.tasks[0].spec, name_expressions=["blk<1, nope_t>"]))
    result = run_task(bad, m.root)
    assert not result.ok and not result.hit and "nope_t" in result.log
    assert os.getcwd() != m.root  # the working directory was restored
