"""The peer rows every launch bench reports (issue 25's Benchmark section), shared by
bench/custom_op_overhead.py and bench/jit_overhead.py (bench/launch_overhead.py has the
same rows and more).

One reference kernel, ``saxpy(float* y, const float* x, float a, int n)`` (2 pointers + 2
scalars, a 1x32 launch so the GPU is never the bottleneck), launched by:

* raw ``cuda.bindings`` ``cuLaunchKernel`` with pre-packed parameters -- the anchor every
  "× raw" ratio is taken against, measured in the same process and the same rounds;
* the raw METH_FASTCALL C floor (a C function straight to ``cuLaunchKernel`` and to
  ``cuLaunchKernelEx``, pre-packed parameters);
* cuforge ``k[1, 32](y, x, a, n)`` with torch tensors;
* cuda.core ``launch()``; CuPy ``RawKernel``; a torch op (``torch.add(..., out=y)``); Triton.

A row whose package (cuda.bindings, cuda.core, CuPy, Triton) or compiler is missing is
skipped with a note. :func:`measure` interleaves every row round by round and gives the
median of the rounds.
"""

from __future__ import annotations

import ctypes
import os
import statistics
import struct
import subprocess
import sys
import sysconfig
import tempfile
import time

from launch_overhead import C_LAUNCHER, SRC

#: the anchor's label (its median is the "× raw" denominator)
RAW = "raw cuda.bindings `cuLaunchKernel`, pre-packed (anchor)"
#: the floor rows' labels
FLOOR = "raw METH_FASTCALL C -> `cuLaunchKernel`, pre-packed"
FLOOR_EX = "raw METH_FASTCALL C -> `cuLaunchKernelEx`, pre-packed"


def measure(rows, launches: int, repeats: int, sync) -> dict[str, list[float]]:
    """Host microseconds per call for each ``(label, fn)`` row: ``launches`` back-to-back
    calls timed (the loop only; the GPU drains between samples), rows interleaved round by
    round so that clock drift hits every row alike. The median of a row's list is its
    figure."""
    for _label, fn in rows:
        for _ in range(200):
            fn()
    sync()
    samples: dict[str, list[float]] = {label: [] for label, _ in rows}
    for _ in range(repeats):
        for label, fn in rows:
            sync()
            t0 = time.perf_counter_ns()
            for _ in range(launches):
                fn()
            t1 = time.perf_counter_ns()
            sync()
            samples[label].append((t1 - t0) / launches / 1e3)
    return samples


def medians(samples: dict[str, list[float]]) -> dict[str, float]:
    return {label: statistics.median(v) for label, v in samples.items()}


def _claunch(d):
    """The METH_FASTCALL C launcher of bench/launch_overhead.py, compiled here (gcc)."""
    tmp = tempfile.mkdtemp(prefix="cuforge-bench-")
    csrc = os.path.join(tmp, "claunch.c")
    with open(csrc, "w") as f:
        f.write(C_LAUNCHER)
    so = os.path.join(tmp, "claunch" + sysconfig.get_config_var("EXT_SUFFIX"))
    include = "-I" + sysconfig.get_paths()["include"]
    subprocess.run(
        ["gcc", "-O2", "-shared", "-fPIC", include, csrc, "-o", so], check=True, capture_output=True
    )
    sys.path.insert(0, tmp)
    import claunch

    claunch.set_fn(ctypes.cast(d.pydll.cuLaunchKernel, ctypes.c_void_p).value)
    claunch.set_fn_ex(ctypes.cast(d.pydll.cuLaunchKernelEx, ctypes.c_void_p).value)
    return claunch


def peer_rows(torch, cuforge) -> tuple[list, dict[str, str]]:
    """``(rows, notes)``: the peer rows as ``(label, fn)`` (each called once and checked to
    run), and a note per skipped row."""
    import numpy as np

    from cuforge.runtime import driver as drv_mod

    n, a = 32, 2.0
    y = torch.randn(n, device="cuda")
    x = torch.randn(n, device="cuda")
    rows: list = []
    notes: dict[str, str] = {}

    def add(label, fn):
        try:
            fn()
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - a failing row is reported, not fatal
            notes[label] = f"failed: {type(exc).__name__}: {str(exc)[:160]}"
            return
        rows.append((label, fn))

    prog = cuforge.compile(SRC, name="bench_saxpy.cu")
    k = prog.kernel("saxpy")
    k[1, 32](y, x, a, n)
    torch.cuda.synchronize()
    func = k._devices[torch.cuda.current_device()].func
    d = drv_mod.driver()
    stream = torch.cuda.current_stream().cuda_stream
    buf = ctypes.create_string_buffer(24)
    base = ctypes.addressof(buf)
    struct.pack_into("<QQfi", buf, 0, y.data_ptr(), x.data_ptr(), a, n)
    arr = (ctypes.c_void_p * 4)(base, base + 8, base + 16, base + 20)
    params = ctypes.addressof(arr)
    keep = (buf, arr)  # the packed parameters live as long as the rows

    try:
        from cuda.bindings import driver as cbd

        cf, cs = cbd.CUfunction(func), cbd.CUstream(stream)

        def raw(keep=keep):  # keep: the packed parameters live as long as the row
            cbd.cuLaunchKernel(cf, 1, 1, 1, 32, 1, 1, 0, cs, params, 0)

        add(RAW, raw)
    except ImportError as exc:
        notes[RAW] = f"skipped: {exc} (no anchor: no ratios)"
    try:
        cl = _claunch(d)
        launch, launch_ex = cl.launch, cl.launch_ex
        add(FLOOR, lambda keep=keep: launch(func, 1, 1, 1, 32, 1, 1, 0, stream, params))
        add(FLOOR_EX, lambda keep=keep: launch_ex(func, 1, 1, 1, 32, 1, 1, 0, stream, params))
    except Exception as exc:  # noqa: BLE001
        notes["raw METH_FASTCALL floor"] = f"skipped: {type(exc).__name__}: {exc}"
    add("cuforge `k[1, 32](y, x, a, n)`", lambda: k[1, 32](y, x, a, n))
    bound = k[1, 32]
    add("cuforge, launcher bound once", lambda: bound(y, x, a, n))
    try:
        try:
            from cuda.core import Device, LaunchConfig, ObjectCode
            from cuda.core import launch as cc_launch
        except ImportError:
            from cuda.core.experimental import Device, LaunchConfig, ObjectCode
            from cuda.core.experimental import launch as cc_launch
        cdev = Device()
        cdev.set_current()
        ck = ObjectCode.from_cubin(prog.binary).get_kernel("saxpy")
        cstream = cdev.create_stream()
        cfg = LaunchConfig(grid=1, block=32)
        yp, xp, af, ni = y.data_ptr(), x.data_ptr(), np.float32(a), np.int32(n)
        add(
            "cuda.core `launch()` (own stream)", lambda: cc_launch(cstream, cfg, ck, yp, xp, af, ni)
        )
    except Exception as exc:  # noqa: BLE001
        notes["cuda.core"] = f"skipped: {type(exc).__name__}: {str(exc)[:160]}"
    try:
        import cupy

        rk = cupy.RawKernel(SRC, "saxpy")
        yc, xc = cupy.asarray(y), cupy.asarray(x)
        af32, ni32 = np.float32(a), np.int32(n)
        add("CuPy `RawKernel`", lambda: rk((1,), (32,), (yc, xc, af32, ni32)))
    except Exception as exc:  # noqa: BLE001
        notes["CuPy"] = f"skipped: {type(exc).__name__}: {str(exc)[:160]}"
    add("torch op `torch.add(y, x, alpha=a, out=y)`", lambda: torch.add(y, x, alpha=a, out=y))
    try:
        import triton
        import triton.language as tl

        @triton.jit
        def tsaxpy(y_ptr, x_ptr, a, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            yv = tl.load(y_ptr + offs, mask=mask)
            tl.store(y_ptr + offs, a * tl.load(x_ptr + offs, mask=mask) + yv, mask=mask)

        add(
            "Triton `kernel[(1,)](y, x, a, n, BLOCK=32)`",
            lambda: tsaxpy[(1,)](y, x, a, n, BLOCK=32),
        )
    except Exception as exc:  # noqa: BLE001
        notes["Triton"] = f"skipped: {type(exc).__name__}: {str(exc)[:160]}"
    return rows, notes


def ratio(t: float | None, raw: float | None) -> str:
    return f"{t / raw:.2f}×" if t is not None and raw else "-"
