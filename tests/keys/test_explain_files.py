"""explain's history and miss log never write through a planted symlink or block on a FIFO."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from cuforge.keys import explain
from tests.conftest import SRC

CHILD = """
import json, sys
from cuforge.keys import explain
cache = sys.argv[1]
fields = {"source": "sha256:1", "options": ["-O3"]}
for i in range(3):
    explain.remember(cache, "k.cu", "key%d" % i, fields)
reasons = explain.explain(cache, "k.cu", {"source": "sha256:1", "options": []})
explain.log_miss(cache, "k.cu", "key9", reasons)
print(json.dumps({"reasons": reasons, "recent": explain.recent_misses(cache)}))
"""


def _run(cache: str) -> dict:
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run(
        [sys.executable, "-c", CHILD, cache],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,  # a FIFO used to block here forever
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _planted_paths(cache: str) -> list[str]:
    return [explain._name_file(cache, "k.cu"), os.path.join(cache, "explain", "misses.jsonl")]


def test_history_and_miss_log_work(tmp_path):
    cache = str(tmp_path / "cache")
    out = _run(cache)
    assert out["reasons"] == ["option -O3 removed"]
    assert [r["name"] for r in out["recent"]] == ["k.cu"]
    assert explain.recent_misses(cache)[0]["reasons"] == ["option -O3 removed"]


def test_symlinks_are_not_written_through(tmp_path):
    cache = str(tmp_path / "cache")
    outside = tmp_path / "outside.txt"
    outside.write_text("precious\n")
    for path in _planted_paths(cache):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.symlink(outside, path)
    out = _run(cache)
    assert outside.read_text() == "precious\n"
    assert all(os.path.islink(p) for p in _planted_paths(cache))
    assert out["reasons"] == ["option -O3 removed"]  # from this process's memory
    assert out["recent"] == []  # a link is not read as a log either


def test_fifos_do_not_hang(tmp_path):
    cache = str(tmp_path / "cache")
    for path in _planted_paths(cache):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.mkfifo(path)
    out = _run(cache)
    assert out["reasons"] == ["option -O3 removed"]
    assert out["recent"] == []
    assert explain.recent_misses(cache) == []


def test_trim_keeps_newest_records_atomically(tmp_path, monkeypatch):
    cache = str(tmp_path / "cache")
    monkeypatch.setattr(explain, "HISTORY_MAX_BYTES", 600)
    for i in range(40):
        explain.remember(cache, "t.cu", f"key{i}", {"n": str(i)})
    path = explain._name_file(cache, "t.cu")
    with open(path) as f:
        keys = [json.loads(line)["key"] for line in f]
    assert keys[-1] == "key39" and len(keys) <= explain.HISTORY_PER_NAME + 3
    assert not [n for n in os.listdir(os.path.dirname(path)) if n.startswith(".tmp.")]


def test_defines_and_include_dirs_are_worded_as_the_readme_says(tmp_path):
    """docs/cli.md: "define UNROLL added"-style reasons, not the raw option."""
    cache = str(tmp_path / "cache")
    base = {"source": "sha256:1", "options": ["-O3", "-DUNROLL=4", "-DKEEP=1", "-DGONE"]}
    explain.remember(cache, "d.cu", "key0", base)
    changed = {"source": "sha256:1", "options": ["-O3", "-DUNROLL=8", "-DKEEP=1", "-DNEW=2"]}
    assert explain.explain(cache, "d.cu", changed) == [
        "define UNROLL changed 4 -> 8",
        "define NEW=2 added",
        "define GONE removed",
    ]
    explain.remember(cache, "i.cu", "key1", {"source": "sha256:1", "options": ["-O3"]})
    with_dir = {"source": "sha256:1", "options": ["-O3", "<include>/opt/inc"]}
    assert explain.explain(cache, "i.cu", with_dir) == ["include dir /opt/inc added"]
