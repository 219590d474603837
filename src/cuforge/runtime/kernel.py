"""``Kernel``: a compiled kernel you call from Python.

::

    k = cuforge.compile(src, name="saxpy.cu").kernel("saxpy")
    k[blocks, 256](y, x, 2.0, n)                      # grid, block; then the arguments
    k[blocks, 256, shared_mem, stream](y, x, 2.0, n)
    k(grid=(blocks,), block=(256,), args=(y, x, 2.0, n), shared_mem=0, stream=None,
      cooperative=False, cluster=None)

How a launch stays cheap
------------------------
Everything that can be decided once is decided once:

* the parameter types come from the kernel's declaration, read when the Kernel is made,
  and checked against the driver's parameter sizes when it is first loaded;
* ``k[grid, block]`` returns a cached launcher for that configuration, already normalized;
* one argument buffer and one ``void*[]`` array per kernel: a launch writes the new values
  into the buffer's slots and calls the driver with the array's address.

The launcher is, in order of preference:

1. the C fast path (:mod:`cuforge.runtime.fastlaunch`, built once per machine): exact-type
   checks of torch tensors / CuPy arrays and Python scalars, packing, the framework's
   current stream and ``cuLaunchKernelEx`` (``cuLaunchKernel`` on a driver without it), all
   in C -- below the cost of a raw pre-packed ``cuLaunchKernel`` through ``cuda.bindings``;
2. generated Python (no C compiler): one ``type(a) is Tensor`` check, a dtype identity
   check and ``is_contiguous()`` per tensor, one ``struct.pack_into``, torch's raw stream
   from ``torch._C._cuda_getCurrentRawStream``, ``cuLaunchKernelEx`` through ctypes;
3. the general path, for everything else (DLPack, ``__cuda_array_interface__``, Pointer,
   structs, bool/bfloat16 scalars, a first launch on a device, cooperative or cluster
   launches, and every error): it checks every argument and names the one that is wrong.

The fast paths and the records they read (:class:`~cuforge.runtime.fastpath.Config`, one
per launch configuration; :class:`~cuforge.runtime.fastpath.DeviceState`, one per device a
kernel is loaded on) live in :mod:`cuforge.runtime.fastpath`.
"""

from __future__ import annotations

import ctypes
import functools
import operator
import sys
import threading
from ctypes import c_void_p

from cuforge.runtime import args as argmod
from cuforge.runtime import driver as drv_mod
from cuforge.runtime import fastlaunch, fastpath
from cuforge.runtime.errors import (
    ArgumentCountError,
    ArgumentError,
    ArgumentValueError,
    CudaDriverError,
    KernelNotFoundError,
    LaunchError,
)
from cuforge.runtime.fastpath import (
    DEFAULT,
    MAX_DEVICES,
    NOT_LOADED,
    Config,
    DeviceState,
    cstream,
)
from cuforge.runtime.module import loaded_program
from cuforge.runtime.signature import Param, find_kernel, kernel_names
from cuforge.runtime.streams import default_stream, stream_handle

__all__ = ["Kernel"]

_get_ident = threading.get_ident


def _dims(value, what: str) -> tuple[int, int, int]:
    if type(value) is int:
        dims = [value]
    elif hasattr(value, "x") and not isinstance(value, (tuple, list)):
        dims = [value.x, getattr(value, "y", 1), getattr(value, "z", 1)]
    else:
        try:
            dims = list(value)
        except TypeError:
            raise ArgumentError(
                f"{what} must be an int or a tuple of 1 to 3 ints, not {type(value).__name__}"
            ) from None
    if not 1 <= len(dims) <= 3:
        raise ArgumentValueError(f"{what} must have 1 to 3 dimensions, got {len(dims)}: {value!r}")
    out = []
    for d in dims:
        try:
            d = operator.index(d)
        except TypeError:
            raise ArgumentError(
                f"{what} dimensions must be ints, got {type(d).__name__} in {value!r}"
            ) from None
        if not 1 <= d < 1 << 31:
            raise ArgumentValueError(f"{what} dimensions must be >= 1, got {value!r}")
        out.append(d)
    while len(out) < 3:
        out.append(1)
    return out[0], out[1], out[2]


class Kernel:
    """A kernel of a compiled :class:`~cuforge.frontend.program.Program`, ready to launch.

    ``name`` is an ``extern "C"`` name, a name expression given at compile time
    (``"block_sum<256, float>"``) or a mangled symbol. The binary is loaded lazily, once per
    device, on the first launch there.

    Attributes: ``program``, ``name``, ``symbol`` (the symbol in the binary; None for a
    plain C++ name resolved on load), ``params`` (list of
    :class:`~cuforge.runtime.signature.Param`, None when the declaration could not be read).
    """

    def __init__(self, program, name: str) -> None:
        self.program = program
        self.name = name
        self._lock = threading.RLock()
        #: one record per device; NOT_LOADED until the kernel is loaded there
        self._devices: list[DeviceState] = [NOT_LOADED] * MAX_DEVICES
        self._owner: list = [None]
        self._configs: dict = {}
        self._call_configs: dict = {}
        self._fast_torch = False
        self._state = None  # the C fast path's per-kernel state, when it is in use
        self._state_layout = None
        self._state_frameworks: set[str] = set()
        self._gbufs = None  # (layout, buffer, array, address) of the general path
        self._glock = threading.Lock()
        self._fast_cupy = False
        self._loaded = None
        self.symbol, self._decl, self.params = self._resolve(program, name)
        self._layout = None
        self._buf = self._array = self._params_arg = None
        if self.params is not None and all(p.size is not None for p in self.params):
            self._set_layout(argmod.Layout(self.params))
        self._fast = self._generic_entry
        self._build_fast()

    # -- names ---------------------------------------------------------------------------

    @staticmethod
    def _resolve(program, name: str):
        if not isinstance(name, str) or not name.strip():
            raise KernelNotFoundError(f"kernel name must be a non-empty string, got {name!r}")
        lowered = dict(program.lowered_names or {})
        source = program.source
        compact = {k.replace(" ", ""): v for k, v in lowered.items()}
        symbol = lowered.get(name) or compact.get(name.replace(" ", ""))
        if symbol is not None:
            decl, params = find_kernel(source, name)
            return symbol, decl, params
        if name.startswith("_Z"):
            reverse = {v: k for k, v in lowered.items()}
            expression = reverse.get(name)
            if expression is not None:
                decl, params = find_kernel(source, expression)
                return name, decl, params
            return name, None, None
        decl, params = find_kernel(source, name)
        if decl is None:
            if not source:
                return name, None, None  # no source to check against: the load will tell
            raise KernelNotFoundError(Kernel._missing_message(program, name))
        if decl.is_template:
            given = ", ".join(sorted(lowered)) or "none"
            hint = name if "<" in name else f"{decl.name}<...>"
            raise KernelNotFoundError(
                f"{name!r} in {program.name} is a template ({decl.display}); name an instance "
                f"that was compiled: pass name_expressions=({hint!r},) to cuforge.compile() and "
                f"use that name (compiled instances: {given})"
            )
        if decl.extern_c:
            return name, decl, params
        return None, decl, params  # a C++ (mangled) kernel: found by name on load

    @staticmethod
    def _missing_message(program, name: str) -> str:
        names = kernel_names(program.source)
        names += [k for k in (program.lowered_names or {}) if k not in names]
        listing = ", ".join(names) if names else "none found in the source"
        return f"no kernel {name!r} in {program.name}; kernels there: {listing}"

    # -- layout and fast path --------------------------------------------------------------

    def _set_layout(self, layout) -> None:
        self._layout = layout
        self._buf, self._array, self._params_arg = layout.new_buffers()

    def _build_fast(self) -> None:
        """Set up this kernel's fast launch path: the C launcher when it can be built, else
        generated Python (or, when neither applies, the general path)."""
        params = self.params
        torch = sys.modules.get("torch")
        cupy = sys.modules.get("cupy")
        self._fast_torch = torch is not None
        self._fast_cupy = cupy is not None
        usable = (
            (torch is not None or cupy is not None)
            and self._layout is not None
            and params
            and any(p.kind == "pointer" for p in params)
            and all(
                (p.kind == "pointer") or (p.kind == "scalar" and p.code not in ("bf16", "?"))
                for p in params
            )
        )
        d = drv_mod.driver() if usable and _driver_loadable() else None
        if d is not None and self._build_c_fast(torch, cupy, d):
            self._fast = self._generic_entry
            return
        self._configs.clear()
        self._call_configs.clear()
        if self._state is not None:
            self._state.disable()
            self._state = None
        self._fast_cupy = True  # the Python fast path takes torch tensors only: nothing to add
        if not usable or torch is None:
            self._fast = self._generic_entry
            return
        use_ex = d is not None and d.launch_ex is not None
        self._fast, self._fast_source = fastpath.python_launcher(
            self.name,
            params,
            self._layout,
            self._buf,
            self._params_arg,
            self._devices,
            self._owner,
            _get_ident,
            self._generic,
            self._fast_failed,
            torch,
            d,
            use_ex,
            d is not None and d.device_count() > 1,
        )
        self._fast_torch = True

    def _build_c_fast(self, torch, cupy, d) -> bool:
        """Set up (or extend) the C fast path (see :mod:`cuforge.runtime.fastlaunch`).

        One C state per argument layout; torch and CuPy are switched on in it as they appear,
        so launchers made earlier (``f = k[grid, block]``) stay fast. False if unavailable."""

        module = fastlaunch.load()
        if module is None:
            return False
        state = self._state
        if state is None or self._state_layout is not self._layout:
            self._configs.clear()
            self._call_configs.clear()
            if state is not None:
                state.disable()
            state = fastpath.c_state(
                module,
                self.params,
                self._layout,
                self._buf,
                self._array,
                self._params_arg,
                d,
                d.device_count() > 1,
                self._generic,
                self._fast_failed,
                self._devices,
            )
            self._state, self._state_layout = state, self._layout
            self._state_frameworks = set()
            self._launcher_type = module.Launcher
            if not isinstance(Kernel.__dict__["__getitem__"], module.Subscript):
                # k[grid, block] on a hit: a dict lookup in C (a miss: _getitem, as before)
                Kernel.__getitem__ = module.Subscript("_configs", Kernel._getitem)
        if torch is not None and "torch" not in self._state_frameworks:
            fastpath.enable_torch(state, torch, self.params, module)
            self._state_frameworks.add("torch")
        if cupy is not None and "cupy" not in self._state_frameworks:
            fastpath.enable_cupy(state, cupy, self.params)
            self._state_frameworks.add("cupy")
        return True

    def _generic_entry(self, cfg, *args):
        return self._generic(cfg, args)

    def _fast_failed(self, code: int, cfg, args):
        # a context or handle problem (another thread's fresh context, a foreign context):
        # the general path switches to the device's primary context and reports properly
        if code in (drv_mod.CUDA_ERROR_INVALID_CONTEXT, drv_mod.CUDA_ERROR_INVALID_HANDLE, 709):
            return self._generic(cfg, args)
        raise self._launch_error(code, cfg)

    # -- launch configurations -------------------------------------------------------------

    def _config(self, grid, block, shared_mem=0, stream=None, cooperative=False, cluster=None):
        gx, gy, gz = _dims(grid, "grid")
        bx, by, bz = _dims(block, "block")
        try:
            shmem = operator.index(shared_mem)
        except TypeError:
            raise ArgumentError(
                f"shared_mem must be an int (bytes), not {type(shared_mem).__name__}"
            ) from None
        if shmem < 0:
            raise ArgumentValueError(f"shared_mem must be >= 0, got {shmem}")
        if bx * by * bz > 1024:
            raise ArgumentValueError(
                f"block {bx}x{by}x{bz} has {bx * by * bz} threads; CUDA allows at most 1024 per block"
            )
        handle = DEFAULT if stream is None else stream_handle(stream)
        cluster_dims = _dims(cluster, "cluster") if cluster is not None else None
        return Config((gx, gy, gz), (bx, by, bz), shmem, handle, bool(cooperative), cluster_dims)

    def _launcher(self, cfg: Config):
        """A callable that launches with ``cfg``: the C launcher, or a partial of the
        Python fast path."""
        state = self._state
        if state is not None:
            stream = None if cfg.handle is DEFAULT else cfg.handle
            return self._launcher_type(state, cfg, *cfg.dims(), cfg.check, stream)
        return functools.partial(self._fast, cfg)

    def __getitem__(self, key):
        # replaced by the C launcher's Subscript (same lookup, no Python frame) once that is
        # loaded: see _build_c_fast
        return self._getitem(key)

    def _getitem(self, key):
        try:
            return self._configs[key]
        except KeyError:
            pass
        except TypeError:  # unhashable parts (lists): build, don't cache
            return self._launcher(self._config(*self._split_key(key)))
        launcher = self._launcher(self._config(*self._split_key(key)))
        if len(self._configs) > 1024:
            self._configs.clear()
        self._configs[key] = launcher
        return launcher

    @staticmethod
    def _split_key(key):
        if not isinstance(key, tuple) or not 2 <= len(key) <= 4:
            raise ArgumentError(
                "launch configuration: k[grid, block], k[grid, block, shared_mem] or "
                "k[grid, block, shared_mem, stream]"
            )
        return key

    def __call__(
        self,
        grid,
        block,
        args=(),
        shared_mem: int = 0,
        stream=None,
        cooperative: bool = False,
        cluster=None,
    ):
        """Launch: ``k(grid=(g,), block=(256,), args=(y, x, 2.0, n))``."""
        key = (grid, block, shared_mem, stream, cooperative, cluster)
        try:
            launcher = self._call_configs.get(key)
        except TypeError:
            launcher = None
            key = None
        if launcher is None:
            launcher = self._launcher(
                self._config(grid, block, shared_mem, stream, cooperative, cluster)
            )
            if key is not None:
                if len(self._call_configs) > 1024:
                    self._call_configs.clear()
                self._call_configs[key] = launcher
        return launcher(*args)

    launch = __call__

    # -- the general path --------------------------------------------------------------------

    def _generic(self, cfg, args):
        params = self.params
        if params is not None and len(args) != len(params):
            raise ArgumentCountError(
                f"{self._signature()} takes {len(params)} argument{'s' if len(params) != 1 else ''}, "
                f"got {len(args)}"
            )
        # 1. which device: the first argument that lives on one
        device = -1
        framework = None
        values: list = []
        if params is not None and self._layout is not None:
            device, framework, values = self._convert(params, args)
        else:
            device, framework = self._sniff_device(args)
        d = drv_mod.driver()
        if device < 0:
            device = d.current_device()
        # the device's primary context must be current; skip the driver round trips when
        # the framework already says that device is current (a launch that still finds no
        # context current -- a fresh thread -- is retried below after switching)
        switched = not self._devices[device].func or not _framework_on(framework, device)
        previous = d.use_device(device) if switched else 0
        try:
            func = self._devices[device].func or self._load(device)
            if self._owner[0] is None:
                self._owner[0] = _get_ident()
            if (framework == "torch" and not self._fast_torch) or (
                framework == "cupy" and not self._fast_cupy
            ):
                self._build_fast()
            params = self.params
            if len(args) != len(params):
                raise ArgumentCountError(
                    f"{self._signature()} takes {len(params)} arguments, got {len(args)}"
                )
            if not values:
                _, fw, values = self._convert(params, args, device)
                framework = framework or fw
            stream = cfg.handle if cfg.handle is not DEFAULT else default_stream(framework, device)
            if cfg.shmem > self._devices[device].shm_set:
                self._allow_shared_memory(device, func, cfg.shmem)
            layout = self._layout
            if self._gbufs is None or self._gbufs[0] is not layout:
                self._gbufs = (layout, *layout.new_buffers())
            # the general path's own buffer (the fast paths have theirs), one launch at a time
            with self._glock:
                _, buf, _array, params_arg = self._gbufs
                try:
                    layout.struct.pack_into(buf, 0, *values)
                except Exception as exc:  # noqa: BLE001 - converted values should always pack
                    raise ArgumentValueError(
                        f"{self._signature()}: cannot pack arguments: {exc}"
                    ) from None
                code = self._launch_general(d, func, cfg, stream, params_arg)
                if code == drv_mod.CUDA_ERROR_INVALID_CONTEXT and not switched:
                    previous, switched = d.use_device(device), True
                    code = self._launch_general(d, func, cfg, stream, params_arg)
            if code:
                raise self._launch_error(code, cfg)
        finally:
            if switched and previous and previous != d.primary_context(device):
                d.set_current_context(previous)

    def _launch_general(self, d, func: int, cfg: Config, stream: int, params_arg) -> int:
        if cfg.cooperative or cfg.cluster is not None:
            return self._launch_ex(func, cfg, stream, params_arg)
        return d.launch(c_void_p(func), *cfg.dims(), cstream(stream), c_void_p(params_arg), None)

    def _convert(self, params: list[Param], args, device: int = -1):
        values = []
        framework = None
        for p, a in zip(params, args, strict=False):
            kind = p.kind
            if kind == "pointer":
                address, adev, fw = argmod.convert_pointer(p, a)
                if adev >= 0:
                    if device < 0:
                        device = adev
                    elif adev != device:
                        raise ArgumentValueError(
                            f"{p.label}: the array is on cuda:{adev} but the launch is on "
                            f"cuda:{device} (the other arguments' device); move it there"
                        )
                if fw == "torch" or (fw and framework is None):
                    framework = fw
                values.append(address)
            elif kind == "scalar":
                values.append(argmod.convert_scalar(p, a))
            elif kind == "struct":
                values.append(argmod.convert_struct(p, a))
            else:  # raw: type unknown, packed by the argument's kind
                _, data = argmod.convert_raw(p, a)
                if len(data) != p.size:
                    raise ArgumentValueError(
                        f"{p.label}: {len(data)} bytes for a {p.size}-byte parameter"
                    )
                values.append(data)
        return device, framework, values

    @staticmethod
    def _sniff_device(args) -> tuple[int, str | None]:
        torch = sys.modules.get("torch")
        cupy = sys.modules.get("cupy")
        for a in args:
            if torch is not None and isinstance(a, torch.Tensor) and a.is_cuda:
                return a.get_device(), "torch"
            if cupy is not None and isinstance(a, cupy.ndarray):
                return a.data.device_id, "cupy"
        return -1, None

    # -- loading ---------------------------------------------------------------------------

    def _load(self, device: int) -> int:
        """Load into ``device`` (its primary context is current) and return the function."""

        with self._lock:
            if self._devices[device].func:
                return self._devices[device].func
            loaded = self._loaded
            if loaded is None:
                loaded = self._loaded = loaded_program(self.program)
            if self.symbol is None:
                self.symbol = self._find_cxx_symbol(loaded)
            try:
                func, handle, is_kernel = loaded.function(self.symbol, device)
            except KernelNotFoundError:
                raise KernelNotFoundError(self._missing_on_load(loaded)) from None
            d = drv_mod.driver()
            info = d.param_info(handle, is_kernel)
            self._check_layout(info)
            shm = d.func_attribute(func, drv_mod.FUNC_MAX_DYNAMIC_SHARED_SIZE_BYTES)
            fast = self._layout is not None and not self._layout_changed
            # filled in completely before it is published: the fast paths read it unlocked
            self._devices[device] = DeviceState(func, shm if fast else -1, shm)
            if fast and self._state is not None:
                self._state.set_device(device, func, shm)
            return func

    _layout_changed = False

    def _check_layout(self, info) -> None:
        """Reconcile the declared parameters with what the driver says the kernel takes."""
        params = self.params
        if info is None:
            if params is None:
                raise LaunchError(
                    f"cannot tell the parameters of {self.name!r}: its declaration was not found "
                    "in the source and this driver cannot report parameter sizes (CUDA >= 12.4 can)"
                )
            if any(p.size is None for p in params):
                raise LaunchError(
                    f"{self._signature()}: a struct parameter's size needs a driver that reports "
                    "parameter sizes (CUDA >= 12.4)"
                )
            return
        offsets = [o for o, _ in info]
        if params is None or len(params) != len(info):
            if params is not None:
                import warnings  # warnings: only on this mismatch

                warnings.warn(
                    f"cuforge: {self.name}: the declaration read from the source has "
                    f"{len(params)} parameters but the compiled kernel has {len(info)}; packing "
                    "by the driver's parameter sizes instead",
                    stacklevel=4,
                )
            self.params = [
                Param(i, None, f"<{size} bytes>", "raw", None, None, size)
                for i, (_, size) in enumerate(info)
            ]
            self._layout_changed = True
        else:
            new = []
            changed = False
            for p, (_, size) in zip(params, info, strict=False):
                if p.size is None:
                    p = Param(p.index, p.name, p.type, p.kind, p.base, p.code, size)
                    changed = True
                elif p.size != size:
                    p = Param(
                        p.index, p.name, f"{p.type} (<{size} bytes>)", "raw", p.base, None, size
                    )
                    changed = True
                new.append(p)
            self.params = new
            if not changed and self._layout is not None and self._layout.offsets == offsets:
                return
            self._layout_changed = (
                self._layout_changed or changed or any(p.kind == "raw" for p in new)
            )
        self._set_layout(argmod.Layout(self.params, offsets))
        if self._layout_changed:
            self._fast = self._generic_entry
            if self._state is not None:
                self._state.disable()
                self._state = None
            self._configs.clear()
            self._call_configs.clear()
        else:
            self._build_fast()

    def _find_cxx_symbol(self, loaded) -> str:
        prefix = f"_Z{len(self.name)}{self.name}"
        matches = [s for s in loaded.symbols() if s.startswith(prefix)]
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            raise KernelNotFoundError(
                f"{self.name!r} in {self.program.name} is overloaded ({', '.join(matches)}); "
                'name one by its mangled symbol or mark the kernel extern "C"'
            )
        raise KernelNotFoundError(
            f"{self.name!r} in {self.program.name} is a C++ kernel whose symbol is mangled; mark it "
            f'extern "C", or pass name_expressions=({self.name!r},) to cuforge.compile()'
        )

    def _missing_on_load(self, loaded) -> str:
        names = kernel_names(self.program.source)
        symbols = loaded.symbols()
        parts = []
        if names:
            parts.append("in the source: " + ", ".join(names))
        if symbols:
            parts.append("in the binary: " + ", ".join(symbols))
        listing = "; ".join(parts) or "none found"
        return f"no kernel {self.symbol!r} in {self.program.name} ({listing})"

    # -- launch details ----------------------------------------------------------------------

    def _allow_shared_memory(self, device: int, func: int, shmem: int) -> None:
        d = drv_mod.driver()
        static = d.func_attribute(func, drv_mod.FUNC_SHARED_SIZE_BYTES)
        optin = d.device_attribute(drv_mod.ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, device)
        if shmem + static > optin:
            raise ArgumentValueError(
                f"shared_mem={shmem} bytes (+{static} static) exceeds the {optin} bytes a block "
                f"can have on device {device}"
            )
        d.set_func_attribute(func, drv_mod.FUNC_MAX_DYNAMIC_SHARED_SIZE_BYTES, shmem)
        dv = self._devices[device]
        dv.shm_set = shmem
        if dv.shm_fast >= 0:
            dv.shm_fast = shmem
            if self._state is not None:
                self._state.set_device(device, func, shmem)

    def _launch_ex(self, func: int, cfg: Config, stream: int, params_arg) -> int:
        d = drv_mod.driver()
        if d.launch_ex is None:
            if cfg.cluster is not None:
                raise LaunchError("cluster launches need cuLaunchKernelEx (CUDA >= 12.0)")
            f = d.fn("cuLaunchCooperativeKernel", gil=True)
            return f(c_void_p(func), *cfg.dims(), cstream(stream), c_void_p(params_arg))
        gx, gy, gz, bx, by, bz, shmem = cfg.dims()
        lc = drv_mod.LaunchConfig(gx, gy, gz, bx, by, bz, shmem)
        lc.hStream = stream or None
        attrs = (drv_mod.LaunchAttribute * 2)()
        n = 0
        if cfg.cooperative:
            attrs[n].id = drv_mod.LAUNCH_ATTRIBUTE_COOPERATIVE
            attrs[n].value[0] = 1
            n += 1
        if cfg.cluster is not None:
            cx, cy, cz = cfg.cluster
            if gx % cx or gy % cy or gz % cz:
                raise ArgumentValueError(
                    f"grid {gx}x{gy}x{gz} is not a multiple of cluster {cx}x{cy}x{cz}"
                )
            if cx * cy * cz > 8:
                d.set_func_attribute(func, drv_mod.FUNC_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
            attrs[n].id = drv_mod.LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
            attrs[n].value[0], attrs[n].value[1], attrs[n].value[2] = cx, cy, cz
            n += 1
        lc.attrs = ctypes.addressof(attrs)
        lc.numAttrs = n
        return d.launch_ex(ctypes.byref(lc), c_void_p(func), c_void_p(params_arg), None)

    def _launch_error(self, code: int, cfg: Config) -> LaunchError:
        d = drv_mod.driver()
        gx, gy, gz, bx, by, bz, shmem = cfg.dims()
        err = d.error(
            code,
            f"launching {self._signature()} with grid {gx}x{gy}x{gz}, block {bx}x{by}x{bz}, shared_mem {shmem}",
        )
        hints = {
            1: "check the grid, block and shared memory sizes",
            701: "too many resources requested: fewer threads per block or fewer registers",
            720: "a cooperative grid must fit on the GPU at once: use fewer blocks",
            912: "the cluster dimensions are not valid for this kernel or GPU",
        }
        hint = hints.get(code)
        if hint:
            return CudaDriverError(f"{err}; {hint}", err.code, err.name)
        return err

    # -- introspection -----------------------------------------------------------------------

    def _signature(self) -> str:
        if self.params is None:
            return f"{self.name}(?)"
        inner = ", ".join(f"{p.type} {p.name}" if p.name else p.type for p in self.params)
        return f"{self.name}({inner})"

    @property
    def signature(self) -> str:
        """``saxpy(float* y, const float* x, float a, int n)``"""
        return self._signature()

    @property
    def layout(self):
        """The argument-buffer :class:`~cuforge.runtime.args.Layout` (None until known)."""
        return self._layout

    def attributes(self, device: int | None = None) -> dict[str, int]:
        """The function's attributes on ``device`` (loads it there): ``num_regs``,
        ``max_threads_per_block``, ``shared_size_bytes``, ..."""
        d = drv_mod.driver()
        device = d.current_device() if device is None else device
        previous = d.use_device(device)
        try:
            func = self._devices[device].func or self._load(device)
            return {k: d.func_attribute(func, v) for k, v in drv_mod.FUNC_ATTRIBUTES.items()}
        finally:
            if previous and previous != d.primary_context(device):
                d.set_current_context(previous)

    def __repr__(self) -> str:
        return f"<cuforge.Kernel {self._signature()} from {self.program.name}>"


def _framework_on(framework: str | None, device: int) -> bool:
    """Whether ``framework`` says ``device`` is the current device of this thread."""
    try:
        if framework == "torch":
            torch = sys.modules["torch"]
            return (
                getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device
            )() == device
        if framework == "cupy":
            return sys.modules["cupy"].cuda.runtime.getDevice() == device
    except Exception:  # noqa: BLE001 - unsure: switch contexts the safe way
        return False
    return False


def _driver_loadable() -> bool:
    try:
        drv_mod.driver()
        return True
    except LaunchError:
        return False
