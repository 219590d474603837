"""Launch overhead: cuforge vs the other ways to launch a CUDA kernel from Python.

Runs on a GPU machine. For one kernel, ``saxpy(float* y, const float* x, float a, int n)``
(2 pointers + 2 scalars, a 1x32 launch so the GPU is never the bottleneck), it times
thousands of back-to-back launches per path and reports the median host time per launch
over several rounds (every row once per round, interleaved), and its ratio to a raw
``cuda.bindings`` ``cuLaunchKernel`` call with pre-packed parameters in the same process.

Rows: cuforge ``k[grid, block](...)`` (constant and computed grids, torch tensors and CuPy
arrays), the launcher bound once, the C launcher as before issue 25 (torch tensors read
through four method calls, the stream through a Python call, ``__getitem__`` in Python,
``cuLaunchKernel``), today's C launcher through ``cuLaunchKernel`` instead of
``cuLaunchKernelEx`` (``fastpath.use_launch_ex = False``), the
pure-Python fast path, the raw anchors (cuda.bindings, ctypes, the METH_FASTCALL C
floor, and the driver alone: ten launches per call from a C loop, per launch -- what no
launch path that calls the driver can go below), cuda.core, CuPy, a torch op, a torch C++ extension and Triton. The goals of issue 25
are printed under the table.

    PYTHONPATH=src python3 bench/launch_overhead.py [--launches 500] [--repeats 31]
        [--no-torch-ext] [--json out.json]

With ``PYTHONPATH=src`` (cuforge not installed) the C launcher is built at run time into
the cache dir's ``runtime/`` (``$CUFORGE_CACHE_DIR``, ~0.4 s once); the table's first note
says which launch path ran.

Rows that need a missing package (CuPy, Triton, cuda.core) or a compiler (the torch
extension, the C launcher) are skipped with a note.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time

SRC = r"""
extern "C" __global__ void saxpy(float* y, const float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""

C_LAUNCHER = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
typedef int (*launch_t)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, void*, void**, void**);
static launch_t fn;
static PyObject* set_fn(PyObject* self, PyObject* arg) {
    fn = (launch_t)PyLong_AsVoidPtr(arg);
    Py_RETURN_NONE;
}
static PyObject* launch(PyObject* self, PyObject* const* args, Py_ssize_t n) {
    if (n != 10) { PyErr_SetString(PyExc_TypeError, "launch takes 10 arguments"); return NULL; }
    void* f = PyLong_AsVoidPtr(args[0]);
    unsigned v[7];
    for (int i = 0; i < 7; i++) v[i] = (unsigned)PyLong_AsUnsignedLong(args[1 + i]);
    void* s = PyLong_AsVoidPtr(args[8]);
    void** p = (void**)PyLong_AsVoidPtr(args[9]);
    if (PyErr_Occurred()) return NULL;
    int r = fn(f, v[0], v[1], v[2], v[3], v[4], v[5], v[6], s, p, NULL);
    return PyLong_FromLong(r);
}
typedef struct { unsigned g[7]; void* s; void* a; unsigned n; } Config;
typedef int (*launch_ex_t)(const Config*, void*, void**, void**);
static launch_ex_t fn_ex;
static PyObject* set_fn_ex(PyObject* self, PyObject* arg) {
    fn_ex = (launch_ex_t)PyLong_AsVoidPtr(arg);
    Py_RETURN_NONE;
}
static PyObject* launch_ex(PyObject* self, PyObject* const* args, Py_ssize_t n) {
    if (n != 10) { PyErr_SetString(PyExc_TypeError, "launch_ex takes 10 arguments"); return NULL; }
    void* f = PyLong_AsVoidPtr(args[0]);
    Config c;
    for (int i = 0; i < 7; i++) c.g[i] = (unsigned)PyLong_AsUnsignedLong(args[1 + i]);
    c.s = PyLong_AsVoidPtr(args[8]);
    c.a = NULL;
    c.n = 0;
    void** p = (void**)PyLong_AsVoidPtr(args[9]);
    if (PyErr_Occurred()) return NULL;
    return PyLong_FromLong(fn_ex(&c, f, p, NULL));
}
/* loop(count, f, gx, gy, gz, bx, by, bz, shmem, stream, params): count launches from C, no
   Python between them: the driver's own cost per launch, once divided by count */
static PyObject* loop(PyObject* self, PyObject* const* args, Py_ssize_t n) {
    if (n != 11) { PyErr_SetString(PyExc_TypeError, "loop takes 11 arguments"); return NULL; }
    long count = PyLong_AsLong(args[0]);
    void* f = PyLong_AsVoidPtr(args[1]);
    unsigned v[7];
    for (int i = 0; i < 7; i++) v[i] = (unsigned)PyLong_AsUnsignedLong(args[2 + i]);
    void* s = PyLong_AsVoidPtr(args[9]);
    void** p = (void**)PyLong_AsVoidPtr(args[10]);
    if (PyErr_Occurred()) return NULL;
    int r = 0;
    for (long i = 0; i < count && r == 0; i++)
        r = fn(f, v[0], v[1], v[2], v[3], v[4], v[5], v[6], s, p, NULL);
    return PyLong_FromLong(r);
}
static PyMethodDef M[] = {
    {"set_fn", set_fn, METH_O, ""},
    {"loop", (PyCFunction)(void (*)(void))loop, METH_FASTCALL, ""},
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL, ""},
    {"set_fn_ex", set_fn_ex, METH_O, ""},
    {"launch_ex", (PyCFunction)(void (*)(void))launch_ex, METH_FASTCALL, ""},
    {NULL, NULL, 0, NULL}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "claunch", NULL, -1, M};
PyMODINIT_FUNC PyInit_claunch(void) { return PyModule_Create(&mod); }
"""

TORCH_EXT_CPP = r"""
#include <torch/extension.h>
void saxpy_launch(torch::Tensor y, torch::Tensor x, double a, int64_t n);
void saxpy(torch::Tensor y, torch::Tensor x, double a, int64_t n) { saxpy_launch(y, x, a, n); }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("saxpy", &saxpy); }
"""
TORCH_EXT_CU = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
__global__ void saxpy_k(float* y, const float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
void saxpy_launch(torch::Tensor y, torch::Tensor x, double a, int64_t n) {
    saxpy_k<<<1, 32, 0, c10::cuda::getCurrentCUDAStream()>>>(
        y.data_ptr<float>(), x.data_ptr<float>(), (float)a, (int)n);
}
"""


#: the driver-alone row: LOOP launches per timed call, from C, reported per launch
LOOP = 10
DRIVER_ALONE = "the driver alone: `cuLaunchKernel` in a C loop, pre-packed (per launch)"


def measure(rows, launches: int, repeats: int, sync) -> dict[str, list[float]]:
    """Host microseconds per launch for each row: ``launches`` back-to-back calls timed
    (the loop only; the GPU drains between samples), rows interleaved round by round so
    that clock drift hits every row alike."""
    for _label, fn, _note in rows:
        for _ in range(500):
            fn()
    sync()
    samples: dict[str, list[float]] = {label: [] for label, _, _ in rows}
    for _ in range(repeats):
        for label, fn, _note in rows:
            sync()
            t0 = time.perf_counter_ns()
            for _ in range(launches):
                fn()
            t1 = time.perf_counter_ns()
            sync()
            samples[label].append((t1 - t0) / launches / 1e3)
    return samples


def gpu_time_per_kernel(fn, count: int = 2000) -> float:
    """GPU microseconds per back-to-back kernel: the launches are queued behind a sleep
    kernel, so the events around them time the GPU alone."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    torch.cuda._sleep(50_000_000)
    start.record()
    for _ in range(count):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / count


def breakdown(k, y, x, a, n) -> None:
    """Per-piece host cost of the fast path, in ns (timeit, best of 5)."""
    import timeit

    import torch

    from cuforge.runtime.kernel import _get_ident

    def ns(stmt, number=200000) -> float:
        return min(timeit.repeat(stmt, number=number, repeat=5)) / number * 1e9

    launcher = k[1, 32]
    cfg = launcher.args[0]
    fast = launcher.func
    raw = torch._C._cuda_getCurrentRawStream
    getdev = torch._C._cuda_getDevice
    pack = k._layout.struct.pack_into
    buf = k._buf
    yp, xp = y.data_ptr(), x.data_ptr()
    items = {
        "empty lambda call": lambda: None,
        "k[1, 32] (cached config)": lambda: k[1, 32],
        "type(t) is Tensor": lambda: type(y) is torch.Tensor,
        "t.dtype": lambda: y.dtype,
        "t.is_contiguous()": lambda: y.is_contiguous(),
        "t.get_device()": lambda: y.get_device(),
        "t.data_ptr()": lambda: y.data_ptr(),
        "torch._C._cuda_getDevice()": lambda: getdev(),
        "torch._C._cuda_getCurrentRawStream(0)": lambda: raw(0),
        "threading.get_ident()": lambda: _get_ident(),
        "struct pack_into (4 values)": lambda: pack(buf, 0, yp, xp, a, n),
        "cfg attributes": lambda: (cfg.check, cfg.stream, cfg.lcref),
    }
    print("\nfast-path pieces (ns per call, includes ~lambda overhead):", file=sys.stderr)
    for label, fn in items.items():
        print(f"  {label:<42} {ns(fn):8.1f}", file=sys.stderr)
    sync = torch.cuda.synchronize
    t = ns(lambda: fast(cfg, y, x, a, n), number=20000)
    sync()
    print(f"  {'fast(cfg, y, x, a, n) (whole launch)':<42} {t:8.1f}", file=sys.stderr)
    print("\ngenerated fast path:\n" + getattr(k, "_fast_source", "(none)"), file=sys.stderr)


def python_path_kernel(kernel_mod, d, prog, use_ex: bool, args):
    """A kernel on the pure-Python fast path, as on a machine without a C compiler, its
    fast path built by one launch of ``args``. ``use_ex`` False: built as with a driver
    without ``cuLaunchKernelEx`` (generated Python calling ``cuLaunchKernel``)."""
    saved_build, saved_ex = kernel_mod.Kernel._build_c_fast, d.launch_ex
    kernel_mod.Kernel._build_c_fast = lambda self, *a: False
    if not use_ex:
        d.launch_ex = None
    try:
        kp = kernel_mod.Kernel(prog, "saxpy")
        kp[1, 32](*args)
    finally:
        kernel_mod.Kernel._build_c_fast, d.launch_ex = saved_build, saved_ex
    return kp


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--launches", type=int, default=500, help="launches per timed sample")
    ap.add_argument("--repeats", type=int, default=31, help="samples (rounds) per row")
    ap.add_argument("--no-torch-ext", action="store_true", help="skip the torch C++ extension row")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--breakdown", action="store_true", help="also time the fast path's pieces")
    opts = ap.parse_args()

    import numpy as np
    import torch

    import cuforge
    from cuforge.runtime import driver as drv_mod
    from cuforge.runtime import kernel as kernel_mod

    dev = torch.device("cuda")
    n = 32
    y = torch.randn(n, device=dev)
    x = torch.randn(n, device=dev)
    a = 2.0
    sync = torch.cuda.synchronize
    rows: list[tuple[str, object, str]] = []
    notes: dict[str, str] = {}

    def run(label, fn, note=""):
        """Register a row after one checked call (a failing row is reported, not fatal)."""
        try:
            fn()
            sync()
        except Exception as exc:  # noqa: BLE001
            notes[label] = f"failed: {type(exc).__name__}: {exc}"
            print(f"{label}: FAILED {exc}", file=sys.stderr)
            return
        rows.append((label, fn, note))

    prog = cuforge.compile(SRC, name="bench_saxpy.cu")
    k = prog.kernel("saxpy")
    k[1, 32](y, x, a, n)  # load + build the fast path
    k[1, 32](y, x, a, n)
    sync()
    d = drv_mod.driver()
    func = k._devices[torch.cuda.current_device()].func

    # -- cuforge -----------------------------------------------------------------------------
    from cuforge.runtime import fastlaunch, fastpath

    c_path = k._state is not None
    path, detail = fastlaunch.status()
    torch_read = (
        "torch tensors through torch's C shim"
        if fastpath._abi.get((id(fastlaunch.load()), id(torch)))
        else f"torch tensors through their methods ({fastpath._abi.get('why')})"
    )
    stream_read = (
        "stream through aoti_torch_get_current_cuda_stream"
        if fastpath._abi.get("stream")
        else "stream through torch._C._cuda_getCurrentRawStream"
    )
    run(
        "cuforge `k[1, 32](y, x, a, n)`",
        lambda: k[1, 32](y, x, a, n),
        (
            f"C launcher ({path}): {torch_read}, {stream_read}"
            if c_path
            else f"Python fast path ({fastlaunch.error()})"
        ),
    )
    run("cuforge `k[16, 256](y, x, a, n)`", lambda: k[16, 256](y, x, a, n))
    run(
        "cuforge `k[(n + 255) // 256, 256](y, x, a, n)` (grid computed per launch)",
        lambda: k[(n + 255) // 256, 256](y, x, a, n),
    )
    launcher = k[1, 32]
    run(
        "cuforge, launcher bound once (`f = k[1, 32]; f(y, x, a, n)`)", lambda: launcher(y, x, a, n)
    )
    if c_path:
        # the C launcher as before issue 25: four tensor method calls per tensor, the stream
        # through a Python call, k[grid, block] through a Python __getitem__
        fastpath.use_torch_abi = fastpath.use_launch_ex = False
        try:
            kb = kernel_mod.Kernel(prog, "saxpy")
            kb[1, 32](y, x, a, n)
        finally:
            fastpath.use_torch_abi = fastpath.use_launch_ex = True
        getitem = kernel_mod.Kernel._getitem
        run(
            "cuforge `k[1, 32](...)`, C launcher before issue 25",
            lambda: getitem(kb, (1, 32))(y, x, a, n),
            "torch methods, Python stream getter, Python __getitem__",
        )
        kb_bound = kb[1, 32]
        run("cuforge bound launcher, before issue 25", lambda: kb_bound(y, x, a, n))
        # today's C launcher, but through cuLaunchKernel: what cuLaunchKernelEx saves
        fastpath.use_launch_ex = False
        try:
            kc = kernel_mod.Kernel(prog, "saxpy")
            kc[1, 32](y, x, a, n)
        finally:
            fastpath.use_launch_ex = True
        run(
            "cuforge `k[1, 32](...)` through cuLaunchKernel (no Ex)",
            lambda: kc[1, 32](y, x, a, n),
            "fastpath.use_launch_ex = False",
        )
        kc_bound = kc[1, 32]
        run("cuforge bound launcher through cuLaunchKernel (no Ex)", lambda: kc_bound(y, x, a, n))
    run(
        "cuforge `k(grid=1, block=32, args=(...))`",
        lambda: k(grid=1, block=32, args=(y, x, a, n)),
    )
    py_kernels = {}
    for use_ex in (True, False):
        kp = py_kernels[use_ex] = python_path_kernel(kernel_mod, d, prog, use_ex, (y, x, a, n))
        kp[1, 32](y, x, a, n)
        run(
            f"cuforge `k[1, 32](...)`, pure-Python fast path ({'ex' if use_ex else 'classic'})",
            lambda kp=kp: kp[1, 32](y, x, a, n),
            "cuLaunchKernelEx via ctypes" if use_ex else "cuLaunchKernel via ctypes",
        )

    # -- raw anchors -------------------------------------------------------------------------
    stream_handle = torch.cuda.current_stream().cuda_stream
    buf = ctypes.create_string_buffer(24)
    base = ctypes.addressof(buf)
    import struct

    struct.pack_into("<QQfi", buf, 0, y.data_ptr(), x.data_ptr(), a, n)
    arr = (ctypes.c_void_p * 4)(base, base + 8, base + 16, base + 20)
    params_addr = ctypes.addressof(arr)
    try:
        from cuda.bindings import driver as cbd

        cf = cbd.CUfunction(func)
        cs = cbd.CUstream(stream_handle)

        def raw_cb():
            cbd.cuLaunchKernel(cf, 1, 1, 1, 32, 1, 1, 0, cs, params_addr, 0)

        err = cbd.cuLaunchKernel(cf, 1, 1, 1, 32, 1, 1, 0, cs, params_addr, 0)[0]
        assert int(err) == 0, err
        run("raw cuda.bindings `cuLaunchKernel`, pre-packed params", raw_cb)
    except ImportError as exc:
        notes["raw cuda.bindings"] = f"skipped: {exc}"
    fn_c = ctypes.c_void_p(func)
    st_c = ctypes.c_void_p(stream_handle) if stream_handle else None
    pa_c = ctypes.c_void_p(params_addr)
    launch = d.launch
    run(
        "raw ctypes `cuLaunchKernel` (PyDLL), pre-packed",
        lambda: launch(fn_c, 1, 1, 1, 32, 1, 1, 0, st_c, pa_c, None),
    )
    lc = drv_mod.LaunchConfig(1, 1, 1, 32, 1, 1, 0)
    lc.hStream = stream_handle or None
    lcref = ctypes.byref(lc)
    launch_ex = d.launch_ex
    run(
        "raw ctypes `cuLaunchKernelEx` (PyDLL), pre-packed",
        lambda: launch_ex(lcref, fn_c, pa_c, None),
    )
    # a C launcher: what replacing the ctypes call with a METH_FASTCALL C function gives
    try:
        tmp = tempfile.mkdtemp()
        csrc = os.path.join(tmp, "claunch.c")
        with open(csrc, "w") as f:
            f.write(C_LAUNCHER)
        so = os.path.join(tmp, "claunch" + sysconfig.get_config_var("EXT_SUFFIX"))
        subprocess.run(
            [
                "gcc",
                "-O2",
                "-shared",
                "-fPIC",
                "-I" + sysconfig.get_paths()["include"],
                csrc,
                "-o",
                so,
            ],
            check=True,
            capture_output=True,
        )
        sys.path.insert(0, tmp)
        import claunch

        claunch.set_fn(ctypes.cast(d.pydll.cuLaunchKernel, ctypes.c_void_p).value)
        claunch.launch(func, 1, 1, 1, 32, 1, 1, 0, stream_handle, params_addr)
        cl = claunch.launch
        run(
            "raw C launcher (METH_FASTCALL -> cuLaunchKernel), pre-packed",
            lambda: cl(func, 1, 1, 1, 32, 1, 1, 0, stream_handle, params_addr),
        )
        cloop = claunch.loop
        assert cloop(LOOP, func, 1, 1, 1, 32, 1, 1, 0, stream_handle, params_addr) == 0
        run(
            DRIVER_ALONE,
            lambda: cloop(LOOP, func, 1, 1, 1, 32, 1, 1, 0, stream_handle, params_addr),
            f"{LOOP} launches per call from a C loop, per launch: no Python per launch",
        )
        claunch.set_fn_ex(ctypes.cast(d.pydll.cuLaunchKernelEx, ctypes.c_void_p).value)
        cle = claunch.launch_ex
        run(
            "raw C launcher (METH_FASTCALL -> cuLaunchKernelEx), pre-packed",
            lambda: cle(func, 1, 1, 1, 32, 1, 1, 0, stream_handle, params_addr),
        )
    except Exception as exc:  # noqa: BLE001
        notes["C launcher"] = f"skipped: {exc}"

    # -- other libraries -----------------------------------------------------------------------
    try:
        try:
            from cuda.core import Device, LaunchConfig, ObjectCode
            from cuda.core import launch as cc_launch
        except ImportError:
            from cuda.core.experimental import Device, LaunchConfig, ObjectCode
            from cuda.core.experimental import launch as cc_launch
        cdev = Device()
        cdev.set_current()
        obj = ObjectCode.from_cubin(prog.binary)
        ck = obj.get_kernel("saxpy")
        cstream = cdev.create_stream()
        cfg = LaunchConfig(grid=1, block=32)
        yp, xp, af, ni = y.data_ptr(), x.data_ptr(), np.float32(a), np.int32(n)
        run(
            "cuda.core `launch()`",
            lambda: cc_launch(cstream, cfg, ck, yp, xp, af, ni),
            "own stream",
        )
        cstream.sync()
    except Exception as exc:  # noqa: BLE001
        notes["cuda.core"] = f"skipped: {type(exc).__name__}: {exc}"
    try:
        import cupy

        rk = cupy.RawKernel(SRC, "saxpy")
        yc = cupy.asarray(y)
        xc = cupy.asarray(x)
        af32, ni32 = np.float32(a), np.int32(n)
        rk((1,), (32,), (yc, xc, af32, ni32))
        run(
            "CuPy `RawKernel`",
            lambda: rk((1,), (32,), (yc, xc, af32, ni32)),
            "cupy arrays + numpy scalars",
        )
        run(
            "cuforge `k[1, 32](...)` with CuPy arrays",
            lambda: k[1, 32](yc, xc, a, n),
            "C launcher, CuPy's current stream",
        )
    except Exception as exc:  # noqa: BLE001
        notes["CuPy"] = f"skipped: {type(exc).__name__}: {exc}"
    run("torch op `torch.add(y, x, alpha=a, out=y)`", lambda: torch.add(y, x, alpha=a, out=y))
    if not opts.no_torch_ext:
        try:
            from torch.utils.cpp_extension import load_inline

            major, minor = torch.cuda.get_device_capability()
            os.environ.setdefault("TORCH_CUDA_ARCH_LIST", f"{major}.{minor}")
            t0 = time.perf_counter()
            ext = load_inline(
                "cuforge_bench_saxpy_ext",
                cpp_sources=TORCH_EXT_CPP,
                cuda_sources=TORCH_EXT_CU,
                verbose=False,
                extra_cuda_cflags=["-O2"],
            )
            built = time.perf_counter() - t0
            run("torch C++ extension op", lambda: ext.saxpy(y, x, a, n), f"built in {built:.0f} s")
        except Exception as exc:  # noqa: BLE001
            notes["torch extension"] = f"skipped: {type(exc).__name__}: {str(exc)[:200]}"
    try:
        import triton
        import triton.language as tl

        @triton.jit
        def tsaxpy(y_ptr, x_ptr, a, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            tl.store(
                y_ptr + offs,
                a * tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask),
                mask=mask,
            )

        tsaxpy[(1,)](y, x, a, n, BLOCK=32)
        run("Triton `kernel[grid](...)`", lambda: tsaxpy[(1,)](y, x, a, n, BLOCK=32))
    except Exception as exc:  # noqa: BLE001
        notes["Triton"] = f"skipped: {type(exc).__name__}: {exc}"

    if opts.breakdown:
        breakdown(py_kernels[True], y, x, a, n)

    # -- measure, then the table ------------------------------------------------------------
    samples = measure(rows, opts.launches, opts.repeats, sync)
    if DRIVER_ALONE in samples:
        samples[DRIVER_ALONE] = [t / LOOP for t in samples[DRIVER_ALONE]]
    results = [(label, statistics.median(samples[label]), note) for label, _, note in rows]
    gpu_us = gpu_time_per_kernel(rows[0][1]) if rows else float("nan")
    raw = next((t for label, t, _ in results if label.startswith("raw cuda.bindings")), None)
    gpu = torch.cuda.get_device_name()
    print(
        f"\nLaunch overhead on {gpu}: median host time per launch over {opts.repeats} rounds of "
        f"{opts.launches} back-to-back launches (rows interleaved)"
    )
    print(
        f"(torch {torch.__version__}, Python {sys.version.split()[0]}, driver {d.version}; "
        f"the GPU itself runs one of these kernels every {gpu_us:.2f} us)\n"
    )
    print("| path | µs / launch | × raw cuda.bindings | note |")
    print("|---|---:|---:|---|")
    for label, t, note in results:
        ratio = f"{t / raw:.2f}×" if raw else "-"
        print(f"| {label} | {t:.2f} | {ratio} | {note} |")
    for label, note in notes.items():
        print(f"| {label} | - | - | {note} |")

    def row(prefix):
        return next((t for label, t, _ in results if label.startswith(prefix)), None)

    cf_t = row("cuforge `k[1, 32](y, x, a, n)`")
    bound_t = row("cuforge, launcher bound once")
    floor_t = row("raw C launcher (METH_FASTCALL -> cuLaunchKernel)")
    cupy_t = row("CuPy")
    if raw:
        print()
        for label, t, goal in (
            ("cuforge `k[1, 32](...)`", cf_t, "goal <= 0.85, issue 25"),
            ("cuforge `k[16, 256](...)`", row("cuforge `k[16, 256]"), "goal <= 0.85"),
            ("cuforge bound launcher", bound_t, "goal <= 0.80, issue 25"),
            ("METH_FASTCALL floor", floor_t, "the floor"),
            (
                "METH_FASTCALL floor, cuLaunchKernelEx",
                row("raw C launcher (METH_FASTCALL -> cuLaunchKernelEx)"),
                "the floor of cuforge's C launcher",
            ),
        ):
            if t:
                print(f"{label} / raw = {t / raw:.2f} ({goal})")
    driver_t = row(DRIVER_ALONE)
    if raw and driver_t:
        print(
            f"the driver alone / raw = {driver_t / raw:.2f}: no path that calls the driver once "
            "per launch goes below it on this host"
        )
    if cf_t and cupy_t:
        print(f"CuPy / cuforge = {cupy_t / cf_t:.2f} (goal >= 1.30)")
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(
                {
                    "gpu": gpu,
                    "gpu_us_per_kernel": gpu_us,
                    "rows": results,
                    "samples": samples,
                    "notes": notes,
                },
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
