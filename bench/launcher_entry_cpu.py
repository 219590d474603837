"""The C launcher's entry, CPU-side (no GPU): what one ``Launcher(...)`` call costs from
Python to a stand-in ``cuLaunchKernel`` and back.

The kernel is ``saxpy(float* y, const float* x, float a, int n)``; the two "tensors" are
read through a stand-in of torch's C shim (as ``aoti_torch_*`` reads an exact torch.Tensor)
and the driver is a C function that returns 0, so every row is the launcher's own C work:
the call's entry, the checks, the packing and the driver call.

Rows (interleaved round by round; the figure is the median over ``--repeats`` rounds of ns
per call, each round ``--calls`` back-to-back calls):

* ``installed`` -- the extension installed with cuforge (``pip install`` of a wheel, or the
  editable build): what ``cuforge.runtime.fastlaunch`` loads; run this bench in two venvs
  to compare a wheel's launcher with an editable build's (docs/benchmarks.md);
* ``vectorcall`` and ``tp_call`` (``--limited-api``) -- ``_launcher.c`` built here twice
  with the same flags: as it is (the launcher is called through the vectorcall protocol),
  and with the entry the limited API of CPython 3.10 and 3.11 leaves (no vectorcall for an
  extension type before 3.12: ``tp_call``, one argument tuple per call). Their difference is
  the least an ``abi3`` wheel for 3.10+ would add to every launch (setup.py says why the
  wheels are per CPython).

* ``LABEL`` (``--extension LABEL=PATH``, repeatable) -- another build of the extension,
  loaded from its file into this process: e.g. an editable build's beside a wheel's, timed
  round by round in one process (separate processes on a shared machine differ by more
  than the builds do).

    PYTHONPATH=src python3 bench/launcher_entry_cpu.py [--calls 20000] [--repeats 15]
        [--limited-api] [--extension LABEL=PATH ...] [--json out.json]

Needs a C compiler (for the stand-in driver; ``--limited-api`` also for the two builds).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import sysconfig
import tempfile
import time

MOCK = r"""
#include <string.h>
int cuLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                   unsigned bz, unsigned sh, void* s, void** p, void** e) { return 0; }
typedef struct { unsigned long long ptr; int dtype, devtype, devidx; unsigned char contig; } FT;
static FT ft(void* h) { FT f; memcpy(&f, h, sizeof f); return f; }
int fake_dtype(void* h, int* o) { *o = ft(h).dtype; return 0; }
int fake_device_type(void* h, int* o) { *o = ft(h).devtype; return 0; }
int fake_device_index(void* h, int* o) { *o = ft(h).devidx; return 0; }
int fake_is_contiguous(void* h, _Bool* o) { *o = ft(h).contig; return 0; }
int fake_data_ptr(void* h, void** o) { *o = (void*)ft(h).ptr; return 0; }
int fake_stream(int dev, void** o) { *o = (void*)0; return 0; }
"""

#: the entry the limited API of 3.10 / 3.11 allows: tp_call, the arguments in a tuple
TP_CALL = r"""
static PyObject* Launcher_tp_call(PyObject* op, PyObject* args, PyObject* kw) {
    PyObject* a[MAXP];
    Py_ssize_t n = PyTuple_Size(args);
    if (n < 0) return NULL;
    if (n > MAXP || (kw != NULL && PyDict_Size(kw) != 0)) {
        PyErr_SetString(PyExc_TypeError, "at most 64 positional arguments");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) a[i] = PyTuple_GetItem(args, i);
    return Launcher_vectorcall(op, a, (size_t)n, NULL);
}

"""

CUDA, F32 = 1, 6  # the stand-in shim's CUDA device type and float32 code


def _cc() -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise SystemExit("bench/launcher_entry_cpu.py needs a C compiler (cc or gcc, or $CC)")
    return cc


def _compile(cc: str, source: str, out: str, *flags: str) -> None:
    cmd = [cc, "-O2", "-shared", "-fPIC", *flags, "-x", "c", "-", "-o", out]
    done = subprocess.run(cmd, input=source.encode(), capture_output=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr.decode()}")


def _import(name: str, path: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _launcher_builds(cc: str, tmp: str) -> dict[str, object]:
    """``_launcher.c`` as it is and with the limited API's entry, built with one command."""
    from cuforge.runtime import fastlaunch

    src = fastlaunch.source().decode()
    anchor = "/* Launcher(state, cfg, gx, gy, gz, bx, by, bz, shmem, check, stream_or_None) */"
    flags = "Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_HAVE_GC;"
    entry = "LauncherType.tp_call = PyVectorcall_Call;"
    for text in (anchor, f"LauncherType.tp_flags = {flags}", entry):
        if src.count(text) != 1:
            raise SystemExit(f"_launcher.c changed: {text!r} is not there once; update this bench")
    limited = src.replace(anchor, TP_CALL + anchor)
    limited = limited.replace(
        f"LauncherType.tp_flags = {flags}",
        "LauncherType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC;",
    )
    limited = limited.replace(entry, "LauncherType.tp_call = Launcher_tp_call;")
    limited = limited.replace(
        "LauncherType.tp_vectorcall_offset = offsetof(Launcher, vectorcall);", ""
    )
    include = "-I" + sysconfig.get_paths()["include"]
    built = {}
    for row, text in (("vectorcall", src), ("tp_call", limited)):
        path = os.path.join(tmp, f"{row}{sysconfig.get_config_var('EXT_SUFFIX')}")
        _compile(cc, text, path, include)
        built[row] = _import(fastlaunch.MODULE_NAME, path)
    return built


def _launcher(module, mock):
    """A saxpy launcher over the stand-in driver and shim, and its arguments."""
    from cuforge.runtime import fastlaunch
    from cuforge.runtime.args import Layout
    from cuforge.runtime.signature import parse_param

    decls = ["float* y", "const float* x", "float a", "int n"]
    params = [parse_param(i, d) for i, d in enumerate(decls)]
    layout = Layout(params)
    buf, array, params_addr = layout.new_buffers()
    kinds = [fastlaunch.KINDS["ptr" if p.kind == "pointer" else p.code] for p in params]
    state = module.State(
        kinds,
        layout.offsets,
        ctypes.addressof(buf),
        params_addr,
        ctypes.cast(mock.cuLaunchKernel, ctypes.c_void_p).value,
        0,
        lambda cfg, args: "slow",
        lambda code, cfg, args: "failed",
        (buf, array),
    )

    def unused(*args):
        raise AssertionError("the shim reads the stand-in tensors")

    state.set_torch(bytes, [None] * 4, unused, unused, unused, unused, unused, unused)
    names = ("dtype", "device_type", "device_index", "is_contiguous", "data_ptr")
    fns = tuple(ctypes.cast(getattr(mock, f"fake_{n}"), ctypes.c_void_p).value for n in names)
    state.set_torch_abi(bytes.__basicsize__ - 1, fns, CUDA, [F32, F32, -1, -1])
    state.set_torch_stream(ctypes.cast(mock.fake_stream, ctypes.c_void_p).value)
    state.set_device(0, 0x1234, 49152)
    launcher = module.Launcher(state, ("cfg",), 1, 1, 1, 32, 1, 1, 0, 0, None)
    y, x = (struct.pack("<QiiiB3x", p, F32, CUDA, 0, 1) for p in (0x1000, 0x2000))
    args = (y, x, 2.0, 32)
    if launcher(*args) is not None:
        raise SystemExit("the launcher took its general path: the stand-in setup is wrong")
    return launcher, args, state


def _time(launcher, args, calls: int) -> float:
    y, x, a, n = args
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        launcher(y, x, a, n)
    return (time.perf_counter_ns() - t0) / calls


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20000, help="calls per timed sample")
    ap.add_argument("--repeats", type=int, default=15, help="samples (rounds) per row")
    ap.add_argument(
        "--limited-api", action="store_true", help="also the vectorcall and tp_call builds"
    )
    ap.add_argument(
        "--extension",
        action="append",
        default=[],
        metavar="LABEL=PATH",
        help="also time the extension module built at PATH (a row named LABEL)",
    )
    ap.add_argument("--json", help="write the figures here too")
    opts = ap.parse_args()

    import cuforge
    from cuforge.runtime import fastlaunch

    cc = _cc()
    rows: dict[str, tuple] = {}
    with tempfile.TemporaryDirectory(prefix="cuforge-bench-") as tmp:
        so = os.path.join(tmp, "libmock.so")
        _compile(cc, MOCK, so)
        mock = ctypes.CDLL(so)
        installed, why_not = fastlaunch._installed()
        if installed is None:
            print(f"no installed extension: {why_not}", file=sys.stderr)
        else:
            rows["installed"] = _launcher(installed, mock)
        for spec in opts.extension:
            label, sep, path = spec.partition("=")
            if not sep or not os.path.isfile(path):
                raise SystemExit(f"--extension {spec!r}: expected LABEL=PATH of a built module")
            rows[label] = _launcher(_import(fastlaunch.MODULE_NAME, path), mock)
        if opts.limited_api:
            for row, module in _launcher_builds(cc, tmp).items():
                rows[row] = _launcher(module, mock)
        if not rows:
            raise SystemExit("nothing to time")
        samples: dict[str, list[float]] = {row: [] for row in rows}
        for launcher, args, _ in rows.values():  # warm up
            _time(launcher, args, opts.calls)
        for _ in range(opts.repeats):
            for row, (launcher, args, _) in rows.items():
                samples[row].append(_time(launcher, args, opts.calls))
    figures = {row: statistics.median(s) for row, s in samples.items()}
    spread = {row: (min(s), max(s)) for row, s in samples.items()}
    where = os.path.dirname(cuforge.__file__)
    print(f"Python {sys.version.split()[0]}, cuforge {cuforge.__version__} from {where}")
    if installed is not None:
        print(f"installed extension: {installed.__file__}")
    print(f"{'row':<12} {'ns/call':>9} {'min':>8} {'max':>8}")
    for row, ns in figures.items():
        lo, hi = spread[row]
        print(f"{row:<12} {ns:9.1f} {lo:8.1f} {hi:8.1f}")
    if "tp_call" in figures:
        extra = figures["tp_call"] - figures["vectorcall"]
        print(
            f"tp_call - vectorcall: {extra:+.1f} ns/call "
            f"({100 * extra / figures['vectorcall']:+.1f}%)"
        )
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump({"python": sys.version, "ns_per_call": figures, "spread": spread}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
