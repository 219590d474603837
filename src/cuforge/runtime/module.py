"""Loaded programs: one ``CUlibrary`` per compiled program per process (context-independent,
so a kernel launched on device 1 gets its function there), or, on drivers before CUDA 12.0,
one ``CUmodule`` per context.

The cache of loaded programs is process-wide and keyed by the program's content key: two
``Program`` objects for the same cached compile share one loaded library. Loaded libraries
stay for the life of the process (they are small; the driver frees them at exit).
"""

from __future__ import annotations

import hashlib
import threading
from ctypes import byref, c_char_p, c_size_t, c_uint, c_uint64, c_void_p

from cuforge.runtime import driver as drv_mod
from cuforge.runtime.errors import (
    CudaDriverError,
    GlobalNotFoundError,
    KernelNotFoundError,
    LaunchError,
)

__all__ = ["LoadedProgram", "loaded_program"]

_NO_BINARY_FOR_GPU = 209
_INVALID_PTX = 218
_UNSUPPORTED_PTX_VERSION = 222
_INVALID_IMAGE = 200


class LoadedProgram:
    """A program's binary loaded into the driver."""

    def __init__(self, program) -> None:
        binary = bytes(program.binary or b"")
        if not binary:
            raise LaunchError(f"program {program.name!r} has no binary to load")
        if program.output == "ptx" and not binary.endswith(b"\0"):
            binary += b"\0"
        self.binary = binary  # kept alive for the driver
        self.name = program.name
        self.arch = program.arch
        self.output = program.output
        self.library = 0
        self.modules: dict[int, int] = {}  # context -> CUmodule (drivers without cuLibrary)
        self.lock = threading.Lock()
        self.use_library = drv_mod.driver().has("cuLibraryLoadData")

    def _explain(self, exc: CudaDriverError, device: int | None) -> LaunchError:
        if exc.code in (_NO_BINARY_FOR_GPU, _INVALID_IMAGE) and device is not None:
            d = drv_mod.driver()
            major = d.device_attribute(drv_mod.ATTR_COMPUTE_CAPABILITY_MAJOR, device)
            minor = d.device_attribute(drv_mod.ATTR_COMPUTE_CAPABILITY_MINOR, device)
            built = f"was built for {self.arch}" if self.arch else "has no code"
            return LaunchError(
                f"{self.name}: the {self.output} {built}, which device {device} "
                f"(sm_{major}{minor}) cannot run ({exc.name}); compile with arch=None (the "
                f"visible GPU) or arch='sm_{major}{minor}'"
            )
        if exc.code in (_INVALID_PTX, _UNSUPPORTED_PTX_VERSION):
            return LaunchError(
                f"{self.name}: the driver cannot JIT this PTX ({exc.name}); the PTX is newer "
                "than the driver supports: update the driver or compile to a cubin for this GPU"
            )
        return exc

    def _load_library(self, device: int | None) -> int:
        if not self.library:
            with self.lock:
                if not self.library:
                    d = drv_mod.driver()
                    lib = c_void_p()
                    code = d.cdll.cuLibraryLoadData(
                        byref(lib),
                        c_char_p(self.binary),
                        None,
                        None,
                        c_uint(0),
                        None,
                        None,
                        c_uint(0),
                    )
                    if code:
                        raise self._explain(d.error(code, f"loading {self.name}"), device)
                    self.library = lib.value
        return self.library

    def _load_module(self, ctx: int, device: int | None) -> int:
        module = self.modules.get(ctx)
        if module is None:
            with self.lock:
                module = self.modules.get(ctx)
                if module is None:
                    d = drv_mod.driver()
                    out = c_void_p()
                    code = d.cdll.cuModuleLoadData(byref(out), c_char_p(self.binary))
                    if code:
                        raise self._explain(d.error(code, f"loading {self.name}"), device)
                    module = self.modules[ctx] = out.value
        return module

    def function(self, symbol: str, device: int) -> tuple[int, int, bool]:
        """(CUfunction for the current context, handle for param info, whether that handle
        is a CUkernel). The current context must be ``device``'s primary context."""
        d = drv_mod.driver()
        name = symbol.encode()
        if self.use_library:
            lib = self._load_library(device)
            kernel = c_void_p()
            code = d.cdll.cuLibraryGetKernel(byref(kernel), c_void_p(lib), c_char_p(name))
            if code:
                raise self._not_found(symbol, code, device)
            func = c_void_p()
            code = d.cdll.cuKernelGetFunction(byref(func), kernel)
            if code:
                raise self._explain(d.error(code, f"loading {symbol} from {self.name}"), device)
            return func.value, kernel.value, True
        module = self._load_module(d.current_context(), device)
        func = c_void_p()
        code = d.cdll.cuModuleGetFunction(byref(func), c_void_p(module), c_char_p(name))
        if code:
            raise self._not_found(symbol, code, device)
        return func.value, func.value, False

    def global_address(self, symbol: str, device: int) -> tuple[int, int]:
        """(device pointer, size in bytes) of the global variable ``symbol`` in ``device``'s
        primary context, which must be current. Raises GlobalNotFoundError (without a
        listing: the caller knows the source) when the binary has no such symbol."""
        d = drv_mod.driver()
        name = c_char_p(symbol.encode())
        address, size = c_uint64(), c_size_t()
        if self.use_library and d.has("cuLibraryGetGlobal"):
            lib = self._load_library(device)
            code = d.cdll.cuLibraryGetGlobal(byref(address), byref(size), c_void_p(lib), name)
        else:
            module = self._load_module(d.current_context(), device)
            getter = d.fn("cuModuleGetGlobal_v2") or d.fn("cuModuleGetGlobal")
            code = getter(byref(address), byref(size), c_void_p(module), name)
        if code == drv_mod.CUDA_ERROR_NOT_FOUND:
            raise GlobalNotFoundError(f"no global {symbol!r} in {self.name}")
        if code:
            raise self._explain(d.error(code, f"finding global {symbol} in {self.name}"), device)
        return address.value or 0, size.value

    def _not_found(self, symbol: str, code: int, device: int | None = None) -> LaunchError:
        d = drv_mod.driver()
        if code != drv_mod.CUDA_ERROR_NOT_FOUND:
            # cuLibraryLoadData defers loading: a binary for another GPU fails here
            return self._explain(d.error(code, f"finding {symbol} in {self.name}"), device)
        names = self.symbols()
        listing = ", ".join(names) if names else "(the driver cannot list them)"
        return KernelNotFoundError(f"no kernel {symbol!r} in {self.name}; it has: {listing}")

    def symbols(self) -> list[str]:
        """The kernel symbols in the loaded binary ([] when the driver cannot enumerate)."""
        d = drv_mod.driver()
        names: list[str] = []
        try:
            if self.use_library:
                lib = self._load_library(None)
                if not (d.has("cuLibraryGetKernelCount") and d.has("cuKernelGetName")):
                    return []
                count = c_uint()
                if d.cdll.cuLibraryGetKernelCount(byref(count), c_void_p(lib)):
                    return []
                handles = (c_void_p * max(count.value, 1))()
                if d.cdll.cuLibraryEnumerateKernels(handles, count, c_void_p(lib)):
                    return []
                getter = d.cdll.cuKernelGetName
            else:
                module = self._load_module(d.current_context(), None)
                if not (d.has("cuModuleGetFunctionCount") and d.has("cuFuncGetName")):
                    return []
                count = c_uint()
                if d.cdll.cuModuleGetFunctionCount(byref(count), c_void_p(module)):
                    return []
                handles = (c_void_p * max(count.value, 1))()
                if d.cdll.cuModuleEnumerateFunctions(handles, count, c_void_p(module)):
                    return []
                getter = d.cdll.cuFuncGetName
            for i in range(count.value):
                out = c_char_p()
                if getter(byref(out), c_void_p(handles[i])) == 0 and out.value:
                    names.append(out.value.decode())
        except LaunchError:
            return []
        return sorted(names)


_LOADED: dict[str, LoadedProgram] = {}
_LOADED_LOCK = threading.Lock()


def loaded_program(program) -> LoadedProgram:
    """The process's :class:`LoadedProgram` for ``program`` (created on first use)."""
    key = program.key or hashlib.sha256(bytes(program.binary or b"")).hexdigest()
    loaded = _LOADED.get(key)
    if loaded is None:
        with _LOADED_LOCK:
            loaded = _LOADED.get(key)
            if loaded is None:
                loaded = _LOADED[key] = LoadedProgram(program)
    return loaded
