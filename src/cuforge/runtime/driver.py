"""The CUDA driver API through ``ctypes`` -- no ``cuda.bindings`` import on any path.

Why ctypes and not ``cuda.bindings``: importing ``cuda.bindings.driver`` costs ~100 ms, and
a launch through it builds a result tuple and an enum member every call. The launch path
here calls ``cuLaunchKernel`` / ``cuLaunchKernelEx`` through a :class:`ctypes.PyDLL`
handle: no ``argtypes`` (whose per-argument ``from_param`` calls triple the call cost) and
the GIL held for the ~2 us the driver takes to enqueue (the GIL release/re-acquire would
cost more than it saves; pybind11 extension ops hold it too). Holding the GIL is also what
makes the per-kernel argument buffer safe to share between threads: no other thread can
repack it while the driver copies the values.

Everything that may take long (loading a module, JIT-compiling PTX) goes through a
:class:`ctypes.CDLL` handle, which releases the GIL.
"""

from __future__ import annotations

import ctypes
import threading
from ctypes import byref, c_char_p, c_int, c_size_t, c_uint, c_void_p

from cuforge.runtime.errors import CudaDriverError, LaunchError
from cuforge.toolchain import gpu  # the one place libcuda is loaded

__all__ = [
    "CUDA_SUCCESS",
    "driver",
    "Driver",
    "LaunchConfig",
    "LaunchAttribute",
]

CUDA_SUCCESS = 0
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_NOT_INITIALIZED = 3
CUDA_ERROR_INVALID_CONTEXT = 201
CUDA_ERROR_INVALID_HANDLE = 400
CUDA_ERROR_NOT_FOUND = 500

# CUdevice_attribute
ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97
ATTR_COMPUTE_CAPABILITY_MAJOR = 75
ATTR_COMPUTE_CAPABILITY_MINOR = 76
ATTR_COOPERATIVE_LAUNCH = 95
# CUfunction_attribute
FUNC_MAX_THREADS_PER_BLOCK = 0
FUNC_SHARED_SIZE_BYTES = 1
FUNC_NUM_REGS = 4
FUNC_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
FUNC_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 16
FUNC_ATTRIBUTES = {
    "max_threads_per_block": 0,
    "shared_size_bytes": 1,
    "const_size_bytes": 2,
    "local_size_bytes": 3,
    "num_regs": 4,
    "ptx_version": 5,
    "binary_version": 6,
    "max_dynamic_shared_size_bytes": 8,
}
# CUpointer_attribute
POINTER_ATTR_MEMORY_TYPE = 2
POINTER_ATTR_DEVICE_ORDINAL = 9
MEMORYTYPE_HOST = 1
MEMORYTYPE_DEVICE = 2
MEMORYTYPE_UNIFIED = 4
# CUlaunchAttributeID
LAUNCH_ATTRIBUTE_COOPERATIVE = 2
LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4


class LaunchConfig(ctypes.Structure):
    """``CUlaunchConfig`` for ``cuLaunchKernelEx``."""

    _fields_ = [
        ("gridDimX", c_uint),
        ("gridDimY", c_uint),
        ("gridDimZ", c_uint),
        ("blockDimX", c_uint),
        ("blockDimY", c_uint),
        ("blockDimZ", c_uint),
        ("sharedMemBytes", c_uint),
        ("hStream", c_void_p),
        ("attrs", c_void_p),
        ("numAttrs", c_uint),
    ]


class LaunchAttribute(ctypes.Structure):
    """``CUlaunchAttribute``: an id, padding to 8 bytes, and a 64-byte value union."""

    _fields_ = [("id", c_int), ("pad", ctypes.c_char * 4), ("value", c_uint * 16)]


_OPTIONAL = (
    "cuLibraryLoadData",
    "cuLibraryGetKernel",
    "cuLibraryGetKernelCount",
    "cuLibraryEnumerateKernels",
    "cuKernelGetFunction",
    "cuKernelGetName",
    "cuKernelGetParamInfo",
    "cuFuncGetParamInfo",
    "cuFuncGetName",
    "cuModuleGetFunctionCount",
    "cuModuleEnumerateFunctions",
    "cuLaunchKernelEx",
    "cuLaunchCooperativeKernel",
)


class Driver:
    """libcuda, loaded once per process. Attribute names are the C entry points."""

    def __init__(self) -> None:
        cdll, pydll = gpu.libcuda(), gpu.libcuda_pydll()
        if cdll is None or pydll is None:
            raise LaunchError(
                "cannot load the CUDA driver (libcuda.so.1): no NVIDIA driver on this machine, or "
                f"it is not on the loader path ({gpu.libcuda_error()}). Launching kernels needs "
                "a GPU; compiling does not."
            )
        self.cdll, self.pydll = cdll, pydll
        for fn in ("cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel"):
            f = getattr(self.pydll, fn, None)
            if f is not None:
                f.restype = c_int
        self.launch = self.pydll.cuLaunchKernel
        self.launch_ex = getattr(self.pydll, "cuLaunchKernelEx", None)
        self._lock = threading.Lock()
        self._initialized = False
        self._primary: dict[int, int] = {}
        self.version = 0

    def fn(self, name: str, gil: bool = False):
        """The C entry point ``name`` (None when this driver lacks it)."""
        lib = self.pydll if gil else self.cdll
        f = getattr(lib, name, None)
        if f is not None:
            f.restype = c_int
        return f

    def has(self, name: str) -> bool:
        return getattr(self.cdll, name, None) is not None

    # -- errors -------------------------------------------------------------------------

    def error_text(self, code: int) -> tuple[str, str]:
        name_p, text_p = c_char_p(), c_char_p()
        self.cdll.cuGetErrorName(c_int(code), byref(name_p))
        self.cdll.cuGetErrorString(c_int(code), byref(text_p))
        name = name_p.value.decode() if name_p.value else f"CUresult {code}"
        text = text_p.value.decode() if text_p.value else "unknown error"
        return name, text

    def check(self, code: int, what: str) -> None:
        if code != CUDA_SUCCESS:
            raise self.error(code, what)

    def error(self, code: int, what: str) -> CudaDriverError:
        name, text = self.error_text(code)
        return CudaDriverError(f"{what} failed: {name} ({text})", code, name)

    def call(self, name: str, *args, what: str | None = None) -> None:
        self.check(getattr(self.cdll, name)(*args), what or name)

    # -- devices and contexts -----------------------------------------------------------

    def init(self) -> None:
        if self._initialized:
            return
        with self._lock:
            if self._initialized:
                return
            code = self.cdll.cuInit(c_uint(0))
            if code != CUDA_SUCCESS:
                name, text = self.error_text(code)
                raise CudaDriverError(
                    f"the CUDA driver did not initialize: {name} ({text}); is a GPU visible "
                    "(CUDA_VISIBLE_DEVICES)?",
                    code,
                    name,
                )
            v = c_int()
            self.cdll.cuDriverGetVersion(byref(v))
            self.version = v.value
            self._initialized = True

    def device_count(self) -> int:
        self.init()
        n = c_int()
        self.call("cuDeviceGetCount", byref(n))
        return n.value

    def device_attribute(self, attrib: int, device: int) -> int:
        self.init()
        out = c_int()
        self.call("cuDeviceGetAttribute", byref(out), c_int(attrib), c_int(device))
        return out.value

    def primary_context(self, device: int) -> int:
        """The primary context of ``device`` -- the one torch and CuPy use -- retained once
        for the life of the process."""
        ctx = self._primary.get(device)
        if ctx is None:
            self.init()
            count = self.device_count()
            if not 0 <= device < count:
                raise LaunchError(f"no CUDA device {device}: this process sees {count}")
            dev, out = c_int(), c_void_p()
            self.call("cuDeviceGet", byref(dev), c_int(device))
            self.call("cuDevicePrimaryCtxRetain", byref(out), dev)
            ctx = self._primary[device] = out.value
        return ctx

    def current_context(self) -> int:
        self.init()
        out = c_void_p()
        self.call("cuCtxGetCurrent", byref(out))
        return out.value or 0

    def set_current_context(self, ctx: int) -> None:
        self.call("cuCtxSetCurrent", c_void_p(ctx))

    def context_device(self) -> int:
        """The device of the current context (a context must be current)."""
        out = c_int()
        self.call("cuCtxGetDevice", byref(out))
        return out.value

    def current_device(self) -> int:
        """The device of the current context; when none is current, make device 0's primary
        context current (what torch and CuPy do on first use) and return 0."""
        if not self.current_context():
            self.set_current_context(self.primary_context(0))
            return 0
        return self.context_device()

    def use_device(self, device: int) -> int:
        """Make ``device``'s primary context current (kernels are loaded there). Returns the
        previously current context (0 for none) so the caller can restore it."""
        primary = self.primary_context(device)
        previous = self.current_context()
        if previous != primary:
            self.set_current_context(primary)
        return previous

    # -- pointers -----------------------------------------------------------------------

    def pointer_info(self, address: int) -> tuple[int, int]:
        """(memory type, device ordinal) of a pointer; memory type 0 when the driver does not
        know the address (plain host memory)."""
        self.init()
        mtype = c_uint()
        code = self.cdll.cuPointerGetAttribute(
            byref(mtype), c_int(POINTER_ATTR_MEMORY_TYPE), ctypes.c_uint64(address)
        )
        if code != CUDA_SUCCESS:
            return 0, -1
        ordinal = c_int(-1)
        self.cdll.cuPointerGetAttribute(
            byref(ordinal), c_int(POINTER_ATTR_DEVICE_ORDINAL), ctypes.c_uint64(address)
        )
        return mtype.value, ordinal.value

    # -- functions ----------------------------------------------------------------------

    def param_info(self, handle: int, is_kernel: bool) -> list[tuple[int, int]] | None:
        """[(offset, size)] of each parameter, or None when the driver cannot say."""
        f = getattr(self.cdll, "cuKernelGetParamInfo" if is_kernel else "cuFuncGetParamInfo", None)
        if f is None:
            return None
        f.restype = c_int
        out: list[tuple[int, int]] = []
        offset, size = c_size_t(), c_size_t()
        for index in range(4096):
            code = f(c_void_p(handle), c_size_t(index), byref(offset), byref(size))
            if code != CUDA_SUCCESS:
                if index == 0 and code != CUDA_ERROR_INVALID_VALUE:
                    return None
                break
            out.append((offset.value, size.value))
        return out

    def func_attribute(self, func: int, attrib: int) -> int:
        out = c_int()
        self.call("cuFuncGetAttribute", byref(out), c_int(attrib), c_void_p(func))
        return out.value

    def set_func_attribute(self, func: int, attrib: int, value: int) -> None:
        self.call(
            "cuFuncSetAttribute",
            c_void_p(func),
            c_int(attrib),
            c_int(value),
            what=f"cuFuncSetAttribute({attrib}, {value})",
        )


_driver: Driver | None = None
_driver_lock = threading.Lock()


def driver() -> Driver:
    """The process's :class:`Driver` (loaded and initialized on first use)."""
    global _driver
    d = _driver
    if d is None:
        with _driver_lock:
            if _driver is None:
                d = Driver()
                d.init()
                _driver = d
            d = _driver
    return d
