"""The repository holds only the project's own files (issue 32): no third-party file copied
in, with or without its license header. Code of others that a benchmark runs comes from its
own checkout (``bench/cute_examples.py --cutlass DIR``) or package, at run time.

The markers below are those of third-party license headers (the project's own license is
LICENSE; its files carry no header). Each is spelled in two halves, so that this file does
not match itself.
"""

from __future__ import annotations

import os
import re
import subprocess

from tests.conftest import ROOT

MARKERS = {
    text: re.compile(re.escape(text).encode())
    for text in (
        "NVIDIA CORP" + "ORATION & AFFILIATES",
        "SPDX-Lic" + "ense-Identifier",
        "Redistribution and use" + " in source and binary forms",
        "Permission is hereby granted," + " free of charge",
        "All ri" + "ghts reserved",
    )
}
MARKERS["Copy" + "right (c), or a year"] = re.compile(
    rb"Copy" + rb"right (\([cC]\)|\xc2\xa9|[0-9]{4})"
)

#: the project's own license text
OWN = {"LICENSE"}
#: what a walk of an unpacked sdist (no .git) skips: build outputs and caches
SKIP_DIRS = {"__pycache__", ".git", ".venv", "build", "dist", "out", ".pytest_cache"}


def _files() -> list[str]:
    """The repository's files: ``git ls-files`` in a checkout, else every file of the tree
    (an unpacked sdist) less build outputs."""
    if os.path.isdir(os.path.join(ROOT, ".git")) or os.path.isfile(os.path.join(ROOT, ".git")):
        done = subprocess.run(
            ["git", "-C", ROOT, "ls-files", "-z"],
            capture_output=True,
            check=True,
            timeout=60,
        )
        return [p for p in done.stdout.decode().split("\0") if p]
    found = []
    for top, dirs, names in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info")]
        found += [os.path.relpath(os.path.join(top, n), ROOT) for n in names]
    return found


def test_no_file_carries_a_third_party_license_header():
    files = _files()
    assert "LICENSE" in files and "pyproject.toml" in files  # the repository's root
    hits = []
    for rel in files:
        if rel in OWN:
            continue
        path = os.path.join(ROOT, rel)
        if not os.path.isfile(path):  # deleted in the work tree, not yet committed
            continue
        with open(path, "rb") as f:
            data = f.read()
        hits += [f"{rel}: {text}" for text, marker in MARKERS.items() if marker.search(data)]
    assert not hits, "third-party files in the repository:\n" + "\n".join(hits)


def test_the_cutlass_examples_are_not_kept_here():
    """The CuTe DSL examples of NVIDIA/cutlass run from a CUTLASS checkout: no copy of them
    (nor of their SGEMM under tests/) is in the tree."""
    for rel in ("bench/cute_examples", "tests/cute/sgemm_example.py"):
        assert not os.path.exists(os.path.join(ROOT, rel)), rel
