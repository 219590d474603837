"""What bench/cute_examples.py and bench/cute_real_libraries.py share: the child process
that counts the CuTe DSL's own compile pipeline runs, and the runner that starts it and
reads its JSON result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")

#: child code: ``pipeline["n"]`` counts the DSL's outermost ``compile_and_cache`` calls (an
#: override calls its base's through ``super()``), on every DSL class
PIPELINE_COUNTER = r"""
import cutlass.cutlass_dsl  # noqa: F401  (the DSL classes, so that they are all walked)
from cutlass.base_dsl import dsl as _dsl_mod
pipeline = {"n": 0, "depth": 0}
def _count(cls):
    original = cls.__dict__.get("compile_and_cache")
    if original is None:
        return
    def wrapper(self, *a, **k):
        pipeline["depth"] += 1
        if pipeline["depth"] == 1:
            pipeline["n"] += 1
        try:
            return original(self, *a, **k)
        finally:
            pipeline["depth"] -= 1
    cls.compile_and_cache = wrapper
def _walk(cls):
    _count(cls)
    for sub in cls.__subclasses__():
        _walk(sub)
_walk(_dsl_mod.BaseDSL)
"""


def run_child(code: str, args: list[str], env: dict[str, str], timeout: float) -> dict:
    """Run ``code`` in a fresh interpreter with ``args`` and the path of a JSON file it
    writes its result to (last argument); cuforge's ``src`` first on ``PYTHONPATH``, bytecode
    on. The result gets ``returncode``, ``stderr`` (whole) and ``wall_s``; a child that
    wrote nothing or timed out gives ``ok: False`` with the reason."""
    full = dict(os.environ)
    full.pop("PYTHONDONTWRITEBYTECODE", None)
    full.pop("PYTHONPYCACHEPREFIX", None)
    full["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, full.get("PYTHONPATH", "")) if p)
    full.update(env)
    fd, out = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    started = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code, *args, out],
            env=full,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        try:
            with open(out) as f:
                result = json.load(f)
        except (OSError, ValueError):
            result = {"ok": False, "error": f"no result (exit {proc.returncode})"}
        result["returncode"] = proc.returncode
        result["stderr"] = proc.stderr
    except subprocess.TimeoutExpired:
        result = {"ok": False, "error": f"timed out after {timeout:.0f} s", "stderr": ""}
    finally:
        os.unlink(out)
    result["wall_s"] = round(time.perf_counter() - started, 3)
    return result
