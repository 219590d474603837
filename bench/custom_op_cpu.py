"""The dispatch cost of ``cuforge.torch.custom_op`` against torch's own ``custom_op``, on
the CPU (no GPU needed): the same ops registered for the CPU key over a stand-in kernel
whose launch does nothing, so what is left is torch's dispatch and the op's Python.

    PYTHONPATH=src python3 bench/custom_op_cpu.py [--calls 3000] [--repeats 7]

Rows (median host µs per call over --repeats rounds of --calls calls, rows interleaved):
the body alone (``torch.empty_like`` + the stand-in launch), the body as a
``torch.library.custom_op`` (the registration before issue 25) and as a cuforge op (launcher
mode, kernel mode, in place), each eagerly and inside ``torch.compile(fullgraph=True)``,
and a compiled function that only calls ``torch.empty_like`` (torch.compile's own floor).
The GPU figures come from bench/custom_op_overhead.py.
"""

# no `from __future__ import annotations`: torch.library.custom_op reads the launchers'
# hints, which name a Tensor imported inside main()
import argparse
import platform
import statistics
import time
import uuid

SOURCE = r"""
extern "C" __global__ void muladd(int numel, const float* a, const float* b, float c,
                                  float* result) {}
extern "C" __global__ void saxpy(float* y, const float* x, float a, int n) {}
"""


class StandIn:
    """A kernel for custom_op (its parameters) whose launch does nothing."""

    def __init__(self, kernel) -> None:
        self.params, self.name, self.program = kernel.params, kernel.name, kernel.program

    def __getitem__(self, config):
        return self.launch

    def launch(self, *args) -> None:
        pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--repeats", type=int, default=7)
    opts = ap.parse_args()

    import torch
    from torch import Tensor

    import cuforge
    from cuforge.torch import custom_op

    prog = cuforge.compile(SOURCE, name="custom_op_cpu_bench.cu", arch="sm_90")
    mk, sk = StandIn(prog.kernel("muladd")), StandIn(prog.kernel("saxpy"))
    ns = f"cuforge_cpu_bench_{uuid.uuid4().hex[:8]}"
    grid = lambda numel, a, b, c, result: (numel + 255) // 256  # noqa: E731
    kernel_op = custom_op(
        f"{ns}::muladd", mk, outputs=("result",), out_like="a", grid=grid, block=256,
        device_types="cpu",
    )  # fmt: skip
    inplace_op = custom_op(
        f"{ns}::saxpy", sk, mutates_args=("y",), grid=lambda y, x, a, n: (n + 255) // 256,
        block=256, device_types="cpu",
    )  # fmt: skip

    @custom_op(f"{ns}::muladd_l", out_like="a", device_types="cpu")
    def launcher_op(a: Tensor, b: Tensor, c: float) -> Tensor:
        r = torch.empty_like(a)
        n = a.numel()
        mk[(n + 255) // 256, 256](n, a, b, c, r)
        return r

    @torch.library.custom_op(f"{ns}::muladd_t", mutates_args=(), device_types="cpu")
    def torch_op(a: Tensor, b: Tensor, c: float) -> Tensor:
        r = torch.empty_like(a)
        n = a.numel()
        mk[(n + 255) // 256, 256](n, a, b, c, r)
        return r

    torch_op.register_fake(lambda a, b, c: torch.empty_like(a))

    @torch.library.custom_op(f"{ns}::saxpy_t", mutates_args=("y",), device_types="cpu")
    def torch_inplace(y: Tensor, x: Tensor, a: float, n: int) -> None:
        sk[(n + 255) // 256, 256](y, x, a, n)

    torch_inplace.register_fake(lambda y, x, a, n: None)

    n = 4096
    a, b, out = torch.randn(n), torch.randn(n), torch.empty(n)
    launch = mk[16, 256]

    def body():
        r = torch.empty_like(a)
        launch(n, a, b, 0.5, r)
        return r

    def writes(op):
        def f(y, x):
            op(y, x, 2.0, n)
            return y

        return f

    compiled = {
        "floor": torch.compile(lambda x, y: torch.empty_like(x), fullgraph=True),
        "torch": torch.compile(lambda x, y: torch_op(x, y, 0.5), fullgraph=True),
        "cuforge": torch.compile(lambda x, y: launcher_op(x, y, 0.5), fullgraph=True),
        "torch_inplace": torch.compile(writes(torch_inplace), fullgraph=True),
        "cuforge_inplace": torch.compile(writes(inplace_op), fullgraph=True),
    }
    rows = {
        "the body alone: `torch.empty_like` + the stand-in launch": body,
        "`torch.library.custom_op` over the body (before issue 25)": lambda: torch_op(a, b, 0.5),
        "cuforge op, launcher mode, the same body": lambda: launcher_op(a, b, 0.5),
        "cuforge op, kernel mode (`outputs=`, `out_like=`)": lambda: kernel_op(n, a, b, 0.5),
        "`torch.library.custom_op`, in place": lambda: torch_inplace(out, a, 2.0, n),
        "cuforge op, in place, kernel mode": lambda: inplace_op(out, a, 2.0, n),
        "torch.compile: `torch.empty_like` only (torch.compile's floor)": (
            lambda: compiled["floor"](a, b)
        ),
        "torch.compile: `torch.library.custom_op`": lambda: compiled["torch"](a, b),
        "torch.compile: cuforge op": lambda: compiled["cuforge"](a, b),
        "torch.compile: `torch.library.custom_op`, in place": (
            lambda: compiled["torch_inplace"](out, a)
        ),
        "torch.compile: cuforge op, in place": lambda: compiled["cuforge_inplace"](out, a),
    }
    for fn in rows.values():
        for _ in range(3):
            fn()
    samples: dict[str, list[float]] = {k: [] for k in rows}
    for _ in range(opts.repeats):
        for label, fn in rows.items():
            t0 = time.perf_counter()
            for _ in range(opts.calls):
                fn()
            samples[label].append((time.perf_counter() - t0) / opts.calls * 1e6)
    print(
        f"torch {torch.__version__}, Python {platform.python_version()}, CPU: median of "
        f"{opts.repeats} interleaved rounds of {opts.calls} calls\n"
    )
    print("| call | µs / call |\n|---|---:|")
    for label, v in samples.items():
        print(f"| {label} | {statistics.median(v):.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
