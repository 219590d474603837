"""cuforge.cccl on a GPU: a cached reduction, restored in a fresh process, gives the right
result. Run with ``pytest -m gpu tests/cccl`` on a machine with an NVIDIA GPU, cuda-cccl and
cupy or torch."""

from __future__ import annotations

import importlib.util
import textwrap

import pytest

from tests.cccl.conftest import run_child


def gpu_code(body: str) -> str:
    """The array helpers (cupy, else torch) followed by ``body``."""
    return textwrap.dedent(ARRAYS) + textwrap.dedent(body)


pytestmark = pytest.mark.gpu

ARRAYS = """
    from cuda.core import Device
    Device(0).set_current()
    major, minor = Device(0).compute_capability
    try:
        import cupy as xp
        dev, host = xp.asarray, xp.asnumpy
        sync = xp.cuda.runtime.deviceSynchronize
    except ImportError:
        import torch
        dev = lambda a: torch.as_tensor(a, device="cuda")
        host = lambda t: t.cpu().numpy()
        sync = torch.cuda.synchronize

    def run(reducer, d_in, d_out, n, op, h_init):
        nbytes = reducer(temp_storage=None, d_in=d_in, d_out=d_out, num_items=n, op=op,
                         h_init=h_init)
        tmp = dev(np.zeros(max(int(nbytes), 1), np.uint8))
        reducer(temp_storage=tmp, d_in=d_in, d_out=d_out, num_items=n, op=op, h_init=h_init)
        sync()
        return host(d_out)
    """


def test_a_reduction_built_ahead_of_time_is_restored_and_right(cuda_env, tmp_path):
    """Built with ProxyArray for the device's compute capability (as a CI job without data
    would); a fresh process with real arrays and no compute_capability= hits it."""
    cache = str(tmp_path)
    built = run_child(
        gpu_code(
            """
        cccl.make_reduce_into(d_in=cc.ProxyArray(np.int32), d_out=cc.ProxyArray(np.int32),
                              op=cc.OpKind.PLUS, h_init=np.zeros(1, np.int32),
                              compute_capability=major * 10 + minor)
        emit(last())
        """
        ),
        cuda_env,
        cache,
    )
    assert built["source"] == "compiled"
    out = run_child(
        gpu_code(
            """
        n = 1_000_003
        h = (np.arange(n) % 13).astype(np.int32)
        d_in, d_out = dev(h), dev(np.zeros(1, np.int32))
        init = np.full(1, 5, np.int32)
        reducer = cccl.make_reduce_into(d_in=d_in, d_out=d_out, op=cc.OpKind.PLUS, h_init=init)
        hit = last()
        got = int(run(reducer, d_in, d_out, n, cc.OpKind.PLUS, init)[0])
        emit({"hit": hit, "got": got, "want": int(h.astype(np.int64).sum()) + 5})
        """
        ),
        cuda_env,
        cache,
    )
    assert out["hit"]["source"] == "disk"
    assert out["hit"]["key"] == built["key"]
    assert out["got"] == out["want"]


def test_enable_makes_the_one_shot_algorithm_use_the_cache(cuda_env, tmp_path):
    code = gpu_code(
        """
        cccl.enable()
        n = 4096
        h = np.arange(n, dtype=np.int64)
        d_in, d_out = dev(h), dev(np.zeros(1, np.int64))
        cc.reduce_into(d_in=d_in, d_out=d_out, num_items=n, op=cc.OpKind.MAXIMUM,
                       h_init=np.zeros(1, np.int64))
        sync()
        emit({"last": last(), "got": int(host(d_out)[0]), "want": n - 1})
        """
    )
    first = run_child(code, cuda_env, str(tmp_path))
    second = run_child(code, cuda_env, str(tmp_path))
    assert first["last"]["source"] == "compiled" and first["got"] == first["want"]
    assert second["last"]["source"] == "disk" and second["got"] == second["want"]


@pytest.mark.skipif(
    importlib.util.find_spec("numba_cuda_mlir") is None,
    reason="Python-callable operators need numba-cuda-mlir (cuda-cccl[cu13] installs it)",
)
def test_a_python_operator_is_restored_and_right(cuda_env, tmp_path):
    code = gpu_code(
        """
        OFFSET = 2
        def op(a, b):
            return a + b if a > -OFFSET else b
        n = 10_000
        h = np.arange(n, dtype=np.int32)
        d_in, d_out = dev(h), dev(np.zeros(1, np.int32))
        init = np.zeros(1, np.int32)
        reducer = cccl.make_reduce_into(d_in=d_in, d_out=d_out, op=op, h_init=init)
        got = int(run(reducer, d_in, d_out, n, op, init)[0])
        emit({"last": last(), "got": got, "want": int(h.sum())})
        """
    )
    first = run_child(code, cuda_env, str(tmp_path))
    second = run_child(code, cuda_env, str(tmp_path))
    assert first["last"]["source"] == "compiled" and first["got"] == first["want"]
    assert second["last"]["source"] == "disk" and second["got"] == second["want"]
