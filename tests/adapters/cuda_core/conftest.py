"""cuforge.cuda_core tests: skip without cuda.core (``pip install "cuforge[cuda-core]"``).
cuda.core compiles cubin with NVRTC and no GPU, so everything here runs on the CPU."""

from __future__ import annotations

import importlib.util

import pytest

if importlib.util.find_spec("cuda") is None or importlib.util.find_spec("cuda.core") is None:
    # a conftest cannot skip its directory: its tests are left out of collection instead
    # (cuda.core is in the test extra; pip install 'cuforge[cuda-core]')
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture
def nvrtc_calls(monkeypatch):
    """A list that grows by one per NVRTC compile in this process: a spy on
    ``cuda.core._program._program_compile_uncached``, cuda.core's own seam around every
    compile it runs (``Program.compile`` with and without ``cache=``)."""
    import cuda.core._program as program

    calls: list[str] = []
    real = program._program_compile_uncached

    def spy(prog, target_type, *rest):
        calls.append(target_type)
        return real(prog, target_type, *rest)

    monkeypatch.setattr(program, "_program_compile_uncached", spy)
    return calls
