"""The C++ CUDA kernel of ``cuforge.torch.custom_op`` (``cuforge.torch.opshim``), step by
step, on a GPU: the steps of tests/torch/test_custom_op_gpu.py::
test_cpp_kernel_matches_the_python_kernel, each announced on stdout (flushed) before it
runs, with faulthandler on. A crash in native code then names its step in one run: the
last ``step ...`` line printed is the one that crashed.

Run (on the GPU machine, from the repository root)::

    PYTHONPATH=src python3 -X faulthandler bench/opshim_gpu_steps.py

It ends with ``all steps passed``. Each error case prints three steps (its arguments, the
call, what it raised) and a good call after it. For the native frames of a crash::

    PYTHONPATH=src gdb -q -batch -ex run -ex bt --args python3 bench/opshim_gpu_steps.py

Not a benchmark: a diagnosis script kept next to the custom-op bench
(bench/custom_op_overhead.py) that exercises the same shim.
"""

from __future__ import annotations

import faulthandler
import sys
import uuid

faulthandler.enable()

SOURCE = r"""
extern "C" __global__ void muladd(int numel, const float* a, const float* b, float c,
                                  float* result) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < numel) result[i] = a[i] * b[i] + c;
}
extern "C" __global__ void saxpy(float* y, const float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""


def step(text: str) -> None:
    print(f"step {text}", flush=True)


def main() -> int:
    import torch

    import cuforge
    from cuforge.torch import cdiv_grid, custom_op, opshim

    if not torch.cuda.is_available():
        print("bench/opshim_gpu_steps.py needs a CUDA GPU", file=sys.stderr)
        return 2
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)

    def qual(name: str) -> str:
        return f"cuforge_steps_{uuid.uuid4().hex[:10]}::{name}"

    step("compile the kernels")
    prog = cuforge.compile(SOURCE, name="opshim_gpu_steps.cu")
    step("register muladd: C++ (cpp=True) and Python (cpp=False), grid=cdiv_grid('numel', 256)")
    kw = dict(outputs=("result",), out_like="a", grid=cdiv_grid("numel", 256), block=256)
    fast = custom_op(qual("muladd"), prog.kernel("muladd"), cpp=True, **kw)
    slow = custom_op(qual("muladd"), prog.kernel("muladd"), cpp=False, **kw)
    print(f"  shim: {opshim.shim_info()}, why not: {fast._cuforge_cpp_why}", flush=True)
    if fast._cuforge_cpp_why is not None:
        return 1

    def inputs(n: int, seed: int):
        g = torch.Generator(device="cuda").manual_seed(seed)
        return torch.randn(n, device="cuda", generator=g), torch.randn(
            n, device="cuda", generator=g
        )

    a = b = None
    for n in (1, 255, 256, 4097, 1 << 20):
        a, b = inputs(n, n)
        step(f"n={n}: first C++ call (n=1 loads the kernel through the ctypes callback)")
        got = fast(n, a, b, 0.25)
        torch.cuda.synchronize()
        step(f"n={n}: Python kernel, compare")
        torch.testing.assert_close(got, slow(n, a, b, 0.25), rtol=0, atol=0)
        torch.testing.assert_close(fast(n, a, b, 0.25), a * b + 0.25)
    step(f"calls counted: {opshim.calls(fast)} (expect 10)")
    assert opshim.calls(fast) == 10
    step("zero-size call (empty grid: no launch)")
    assert fast(0, torch.empty(0, device="cuda"), torch.empty(0, device="cuda"), 1.0).numel() == 0
    step("a transposed read-only input (its contiguous copy is packed)")
    m = torch.randn(64, 32, device="cuda").t()
    torch.testing.assert_close(fast(m.numel(), m, m, 1.0), (m * m + 1.0).contiguous())
    step("register saxpy in place, grid=cdiv_grid('n', 128)")
    ikw = dict(mutates_args=("y",), grid=cdiv_grid("n", 128), block=128)
    ifast = custom_op(qual("saxpy"), prog.kernel("saxpy"), cpp=True, **ikw)
    islow = custom_op(qual("saxpy"), prog.kernel("saxpy"), cpp=False, **ikw)
    x = torch.randn(5000, device="cuda")
    y1, y2 = torch.ones(5000, device="cuda"), torch.ones(5000, device="cuda")
    v = y1._version
    step("saxpy in place: C++ then Python, compare, version bumped")
    assert ifast(y1, x, 3.0, 5000) is None
    islow(y2, x, 3.0, 5000)
    torch.testing.assert_close(y1, y2, rtol=0, atol=0)
    assert y1._version == v + 1
    # the error paths: the first C++ exceptions the shim throws in this process. Each case is
    # three steps (its arguments built, the call, what it raised), and each op's dtype error
    # comes on its own (saxpy: an in-place op without outputs; muladd: an op with an output
    # shaped like the wrong-dtype input, and with only its second input wrong), so a native
    # crash names the op, the argument and the phase.
    d8 = a[:8].double()
    errors = [
        (
            "error: a written tensor that is not contiguous (saxpy)",
            "not contiguous",
            ifast,
            lambda: (
                torch.ones(8, 2, device="cuda").t(),
                torch.ones(2, 8, device="cuda"),
                1.0,
                16,
            ),
        ),
        (
            "error: another dtype, a written input (saxpy: float64 y for float*)",
            "expects another dtype",
            ifast,
            lambda: (torch.ones(16, device="cuda", dtype=torch.float64), x[:16], 1.0, 16),
        ),
        (
            "error: another dtype, the second input only (muladd: float64 b for const float*)",
            "expects another dtype",
            fast,
            lambda: (8, a[:8], d8, 1.0),
        ),
        (
            "error: another dtype, the output's model (muladd: float64 a and b for float*)",
            "expects another dtype",
            fast,
            lambda: (8, d8, d8, 1.0),
        ),
        (
            "error: a tensor that requires grad",
            "requires grad",
            fast,
            lambda: (8, a[:8].clone().requires_grad_(), a[:8], 1.0),
        ),
        (
            "error: an int out of range",
            "out of its C type's range",
            fast,
            lambda: (1 << 40, a, b, 1.0),
        ),
    ]
    for text, match, op, make in errors:
        step(f"{text}: the arguments")
        call_args = make()
        shown = [
            f"{tuple(t.shape)}/{t.stride()}/{t.dtype}" if isinstance(t, torch.Tensor) else repr(t)
            for t in call_args
        ]
        print(f"  args: {', '.join(shown)}", flush=True)
        step(f"{text}: the call")
        try:
            op(*call_args)
        except RuntimeError as exc:
            step(f"{text}: raised, the message")
            if match not in str(exc):
                print(f"  unexpected message: {exc}", flush=True)
                return 1
            print(f"  raised: {str(exc).splitlines()[0][:200]}", flush=True)
        else:
            print("  did not raise", flush=True)
            return 1
        del call_args
        step(f"{text}: a good call after it")
        torch.testing.assert_close(fast(4, a[:4], b[:4], 0.0), a[:4] * b[:4])
        torch.cuda.synchronize()
    step("a call after the errors")
    torch.testing.assert_close(fast(4, a[:4], b[:4], 0.0), a[:4] * b[:4])
    torch.cuda.synchronize()
    print("all steps passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
