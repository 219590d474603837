"""The fast launch paths of a :class:`~cuforge.runtime.kernel.Kernel`, and the two records
they read.

* :class:`Config` -- one launch configuration (grid, block, shared memory, stream,
  cooperative, cluster), normalized once by ``k[grid, block, ...]`` and cached;
* :class:`DeviceState` -- what a kernel knows about one device once it is loaded there;
* :func:`python_launcher` -- generates, compiles and returns the pure-Python fast path for
  one kernel (used when the C launcher cannot be built);
* :func:`c_state`, :func:`enable_torch`, :func:`enable_cupy` -- set up the C launcher's
  per-kernel state (:mod:`cuforge.runtime.fastlaunch`).

Both fast paths take only what they handle exactly and hand everything else to the
kernel's general path (``slow(cfg, args)``), which checks again and names the wrong
argument. The generated code reads the records' attributes directly (``__slots__``: one
specialized load each), never a tuple by position.
"""

from __future__ import annotations

import ctypes
from ctypes import c_void_p

from cuforge.runtime import args as argmod
from cuforge.runtime import driver as drv_mod
from cuforge.runtime.fastlaunch import KINDS
from cuforge.runtime.streams import torch_stream_getter

__all__ = [
    "Config",
    "DeviceState",
    "NOT_LOADED",
    "DEFAULT",
    "SPECIAL",
    "MAX_DEVICES",
    "cstream",
    "python_launcher",
    "c_state",
    "c_kind",
    "enable_torch",
    "enable_cupy",
]

MAX_DEVICES = 64
#: ``Config.check`` of configurations the fast paths must not take (cooperative, cluster)
SPECIAL = 1 << 62
#: "no stream given": the default-stream rules apply
DEFAULT = object()

_STREAMS: dict[int, c_void_p] = {}


def cstream(handle: int) -> c_void_p | None:
    """The stream handle as a (cached) ``c_void_p``; None for the legacy default stream 0."""
    if not handle:
        return None
    s = _STREAMS.get(handle)
    if s is None:
        if len(_STREAMS) > 4096:
            _STREAMS.clear()
        s = _STREAMS[handle] = c_void_p(handle)
    return s


class Config:
    """One normalized launch configuration. Immutable by convention once made (the Python
    ``ex`` fast path rewrites ``lc.hStream`` when ``stream`` is :data:`DEFAULT`).

    ``gx, gy, gz`` / ``bx, by, bz``: grid and block, each >= 1. ``shmem``: dynamic shared
    memory bytes. ``check``: what the fast paths compare with a device's
    :attr:`DeviceState.shm_fast` (``shmem``, or :data:`SPECIAL` to keep them off).
    ``handle``: the stream handle (int) or :data:`DEFAULT`. ``stream``: the same as a
    ``c_void_p`` (None for stream 0) or :data:`DEFAULT`. ``lc`` / ``lcref``: a prebuilt
    ``CUlaunchConfig`` and a ``byref`` to it. ``cooperative``: bool. ``cluster``: the
    cluster dims ``(x, y, z)`` or None.
    """

    __slots__ = (
        "gx",
        "gy",
        "gz",
        "bx",
        "by",
        "bz",
        "shmem",
        "check",
        "handle",
        "stream",
        "lc",
        "lcref",
        "cooperative",
        "cluster",
    )

    def __init__(
        self,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shmem: int,
        handle,
        cooperative: bool,
        cluster: tuple[int, int, int] | None,
    ) -> None:
        self.gx, self.gy, self.gz = grid
        self.bx, self.by, self.bz = block
        self.shmem = shmem
        self.handle = handle
        self.cooperative = cooperative
        self.cluster = cluster
        self.check = SPECIAL if cooperative or cluster is not None else shmem
        self.stream = DEFAULT if handle is DEFAULT else cstream(handle)
        lc = drv_mod.LaunchConfig(*grid, *block, shmem)
        if handle is not DEFAULT:
            lc.hStream = handle or None
        self.lc = lc
        self.lcref = ctypes.byref(lc)

    def dims(self) -> tuple[int, int, int, int, int, int, int]:
        """``(gx, gy, gz, bx, by, bz, shmem)``"""
        return self.gx, self.gy, self.gz, self.bx, self.by, self.bz, self.shmem

    def __repr__(self) -> str:
        return (
            f"Config(grid={self.gx}x{self.gy}x{self.gz}, block={self.bx}x{self.by}x{self.bz}, "
            f"shared_mem={self.shmem}, stream={'default' if self.handle is DEFAULT else self.handle}"
            f", cooperative={self.cooperative}, cluster={self.cluster})"
        )


class DeviceState:
    """What a kernel knows about one device: ``func`` (the CUfunction handle; 0 when not
    loaded there), ``cfunc`` (the same as a ``c_void_p``, for the fast path), ``shm_fast``
    (the dynamic shared memory the fast paths may launch with; -1 keeps them off) and
    ``shm_set`` (the ``MAX_DYNAMIC_SHARED_SIZE_BYTES`` value set on the function).

    A kernel's list holds :data:`NOT_LOADED` for every device until it is loaded there;
    the loaded record is filled in completely before it is put in the list."""

    __slots__ = ("func", "cfunc", "shm_fast", "shm_set")

    def __init__(self, func: int = 0, shm_fast: int = -1, shm_set: int = -1) -> None:
        self.func = func
        self.cfunc = c_void_p(func) if func else None
        self.shm_fast = shm_fast
        self.shm_set = shm_set

    def __repr__(self) -> str:
        return f"DeviceState(func={self.func:#x}, shm_fast={self.shm_fast}, shm_set={self.shm_set})"


#: The shared record of a device a kernel is not loaded on (never modified).
NOT_LOADED = DeviceState()


def python_launcher(
    kernel_name: str,
    params: list,
    layout,
    buf,
    params_arg: int,
    devices: list[DeviceState],
    owner: list,
    get_ident,
    slow,
    fail,
    torch,
    d,
    use_ex: bool,
    check_device: bool,
):
    """Generate the pure-Python fast path for one kernel: ``fast(cfg, *args)``.

    It takes contiguous torch tensors of the declared dtype, all on one device the kernel
    is loaded on, and int/float scalars, on the thread ``owner[0]`` that loaded the kernel;
    anything else goes to ``slow(cfg, args)``. A driver error goes to
    ``fail(code, cfg, args)``. ``use_ex``: call ``cuLaunchKernelEx`` with ``cfg.lcref``
    (else ``cuLaunchKernel``). ``check_device``: also check torch's current device (more
    than one GPU). Returns ``(fast, source)``."""
    ns: dict = {
        "Tensor": torch.Tensor,
        "cur_dev": getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device,
        "raw_stream": torch_stream_getter(torch),
        "devices": devices,
        "owner": owner,
        "get_ident": get_ident,
        "pack": layout.struct.pack_into,
        "buf": buf,
        "params": c_void_p(params_arg),
        "slow": slow,
        "fail": fail,
        "DEFAULT": DEFAULT,
        "FLOATS": frozenset({float, int}),
        "cstream": cstream,
        "scache": _STREAMS,
    }
    ns["launch"] = (d.launch_ex if use_ex else d.launch) if d is not None else None
    n = len(params)
    names = [f"a{i}" for i in range(n)]
    lines = [
        "def fast(cfg, *args):",
        f"    if len(args) != {n} or get_ident() != owner[0]:",
        "        return slow(cfg, args)",
        f"    {', '.join(names)}, = args",
    ]
    values = []
    first = True
    scalar_checks = []
    for i, p in enumerate(params):
        a = names[i]
        if p.kind == "pointer":
            dt = argmod.torch_dtype_for(p.code, torch)
            if dt is not None:
                ns[f"dt{i}"] = dt
                dtcheck = f" or {a}.dtype is not dt{i}"
            else:
                dtcheck = ""
            if first:
                lines.append(f"    if type({a}) is not Tensor{dtcheck} or not {a}.is_contiguous():")
                lines.append("        return slow(cfg, args)")
                lines.append(f"    dev = {a}.get_device()")
                first = False
            else:
                lines.append(
                    f"    if type({a}) is not Tensor{dtcheck} or not {a}.is_contiguous() or {a}.get_device() != dev:"
                )
                lines.append("        return slow(cfg, args)")
            values.append(f"{a}.data_ptr()")
        else:
            if p.code in ("f", "d", "e"):
                scalar_checks.append(f"type({a}) not in FLOATS")
            else:
                scalar_checks.append(f"type({a}) is not int")
            values.append(a)
    if scalar_checks:
        lines.append(f"    if {' or '.join(scalar_checks)}:")
        lines.append("        return slow(cfg, args)")
    lines += [
        "    dv = devices[dev]",
        "    if dev < 0 or cfg.check > dv.shm_fast"
        + (" or cur_dev() != dev:" if check_device else ":"),
        "        return slow(cfg, args)",
        "    try:",
        f"        pack(buf, 0, {', '.join(values)})",
        "    except Exception:",
        "        return slow(cfg, args)",
    ]
    if use_ex:
        lines += [
            "    if cfg.stream is DEFAULT:",
            "        cfg.lc.hStream = raw_stream(dev)",
            "    r = launch(cfg.lcref, dv.cfunc, params, None)",
        ]
    else:
        lines += [
            "    stream = cfg.stream",
            "    if stream is DEFAULT:",
            "        s = raw_stream(dev)",
            "        stream = (scache.get(s) or cstream(s)) if s else None",
            "    r = launch(dv.cfunc, cfg.gx, cfg.gy, cfg.gz, cfg.bx, cfg.by, cfg.bz, cfg.shmem,"
            " stream, params, None)",
        ]
    lines += ["    if r:", "        return fail(r, cfg, args)"]
    source = "\n".join(lines) + "\n"
    code = compile(source, f"<cuforge fast launch of {kernel_name}>", "exec")
    exec(code, ns)  # noqa: S102 - our own generated source
    return ns["fast"], source


def c_state(
    module,
    params: list,
    layout,
    buf,
    array,
    params_arg: int,
    d,
    check_device: bool,
    slow,
    fail,
    devices: list[DeviceState],
):
    """A new C launcher state (``module.State``) for one argument layout, with every loaded
    device of ``devices`` registered. It launches through ``cuLaunchKernelEx`` (a
    ``CUlaunchConfig`` pre-built in each launcher: four arguments instead of eleven, ~5% less
    host time per launch) when the driver has it and :data:`use_launch_ex` is true, else
    ``cuLaunchKernel``. ``buf`` and ``array`` are kept alive by the state."""
    state = module.State(
        [c_kind(p) for p in params],
        list(layout.offsets),
        ctypes.addressof(buf),
        params_arg or 0,
        ctypes.cast(d.pydll.cuLaunchKernel, c_void_p).value,
        1 if check_device else 0,
        slow,
        fail,
        (buf, array),
    )
    ex = getattr(d.pydll, "cuLaunchKernelEx", None) if use_launch_ex else None
    if ex is not None:
        state.set_launch_ex(ctypes.cast(ex, c_void_p).value or 0)
    for dev, dv in enumerate(devices):
        if dv.func and dv.shm_fast >= 0:
            state.set_device(dev, dv.func, dv.shm_fast)
    return state


#: Test and bench hook: False makes new C launcher states call ``cuLaunchKernel`` even
#: where the driver has ``cuLaunchKernelEx`` (read when a kernel's state is made)
use_launch_ex = True


def c_kind(p) -> int:
    """The C launcher's kind number for parameter ``p`` (pointer or plain scalar)."""
    return KINDS["ptr" if p.kind == "pointer" else p.code]


def enable_torch(state, torch, params: list, module=None) -> None:
    """Let the C launcher take torch tensors (exact ``torch.Tensor``, declared dtype): read
    through torch's C shim when :func:`torch_abi` vouches for it (``module``: the C launcher
    module, default the loaded one), else through the tensor's methods."""
    t = torch.Tensor
    state.set_torch(
        t,
        [argmod.torch_dtype_for(p.code, torch) if p.kind == "pointer" else None for p in params],
        torch_stream_getter(torch),
        getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device,
        _class_attr(t, "dtype"),
        t.is_contiguous,
        t.get_device,
        t.data_ptr,
    )
    if module is None:
        from cuforge.runtime import fastlaunch

        module = fastlaunch.load()
    abi = torch_abi(module, torch) if use_torch_abi and module is not None else None
    if abi is not None:
        offset, fns, cuda, dtype_code = abi
        dtypes = [
            argmod.torch_dtype_for(p.code, torch) if p.kind == "pointer" else None for p in params
        ]
        state.set_torch_abi(
            offset, fns, cuda, [-1 if dt is None else dtype_code(dt) for dt in dtypes]
        )
        stream = _abi.get("stream")
        if stream is None:
            stream = _abi["stream"] = torch_stream_shim(torch)
        if stream:
            state.set_torch_stream(stream)


#: Test and bench hook: False keeps torch tensors on the method calls (read once per kernel)
use_torch_abi = True
_abi: dict = {}


def torch_abi(module, torch):
    """How the C launcher reads torch tensors without calling their methods, or None.

    ``(offset, fns, cuda_code, dtype_code)``: the ``at::Tensor`` of a tensor object lives at
    ``offset`` (``THPVariable.cdata``, right after the object header); ``fns`` are the
    addresses of torch's stable C shim (``aoti_torch_get_dtype``, ``_get_device_type``,
    ``_get_device_index``, ``_is_contiguous``, ``_get_data_ptr``, exported by libtorch_cpu);
    ``cuda_code`` is the shim's CUDA device type; ``dtype_code(dtype)`` the shim's code of a
    torch dtype.

    Used only when ``torch._C.TensorBase`` has exactly the size of that layout (header +
    ``cdata`` + two hook pointers) and the shim reads, for a few CPU tensors (a plain one,
    a transposed view, an offset view, other dtypes), exactly what ``dtype``,
    ``get_device()``, ``is_contiguous()`` and ``data_ptr()`` say. Checked once per process;
    :data:`_abi` keeps the answer (``"why"``: why not, when not)."""
    key = (id(module), id(torch))
    if key in _abi:
        return _abi[key]
    found = None
    try:
        found = _torch_abi(module, torch)
    except (OSError, AttributeError, ValueError, RuntimeError, TypeError) as exc:
        _abi["why"] = f"{type(exc).__name__}: {exc}"
    _abi[key] = found
    return found


def _torch_abi(module, torch):
    import os

    word = ctypes.sizeof(c_void_p)
    offset = object.__basicsize__
    base = torch._C.TensorBase
    if base.__basicsize__ != offset + 3 * word or base.__itemsize__:
        _abi["why"] = f"torch._C.TensorBase is {base.__basicsize__} bytes, not the known layout"
        return None
    lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
    names = ("dtype", "device_type", "device_index", "is_contiguous", "data_ptr")
    fns = tuple(
        ctypes.cast(
            getattr(lib, f"aoti_torch_{'get_' if n != 'is_contiguous' else ''}{n}"), c_void_p
        ).value
        for n in names
    )

    def code(name: str) -> int:
        f = getattr(lib, f"aoti_torch_{name}")
        f.restype, f.argtypes = ctypes.c_int32, []
        return f()

    cuda, cpu = code("device_type_cuda"), code("device_type_cpu")
    codes: dict = {}
    m = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    samples = [m, m.t(), m[1:], m[:, 2:], torch.zeros(3, dtype=torch.float16), torch.ones(0)]
    samples += [torch.zeros(5, dtype=dt) for dt in (torch.int64, torch.int8, torch.float64)]
    for t in samples:
        dt, ty, ix, contiguous, ptr = module.torch_abi_probe(offset, fns, t)
        if codes.setdefault(t.dtype, dt) != dt or list(codes.values()).count(dt) != 1:
            raise ValueError(f"the shim's dtype codes disagree for {t.dtype}")
        if (ty, ix, contiguous, ptr) != (cpu, t.get_device(), t.is_contiguous(), t.data_ptr()):
            raise ValueError(
                f"the shim reads {(ty, ix, contiguous, ptr)} for a tensor whose methods say "
                f"{(cpu, t.get_device(), t.is_contiguous(), t.data_ptr())}"
            )

    def dtype_code(dtype) -> int:
        c = codes.get(dtype)
        if c is None:
            c = codes[dtype] = module.torch_abi_probe(offset, fns, torch.empty(0, dtype=dtype))[0]
        return c

    return offset, fns, cuda, dtype_code


def torch_stream_shim(torch) -> int:
    """The address of ``aoti_torch_get_current_cuda_stream`` (torch's stable C shim, in
    libtorch_cuda: ``at::cuda::getCurrentCUDAStream(device)``, what
    ``torch._C._cuda_getCurrentRawStream`` returns), or 0 (a CPU-only torch, another
    platform): then the C launcher calls the Python getter."""
    import os

    path = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cuda.so")
    if not os.path.exists(path):
        return 0
    try:
        lib = ctypes.CDLL(path)
        return ctypes.cast(lib.aoti_torch_get_current_cuda_stream, c_void_p).value or 0
    except (OSError, AttributeError):
        return 0


def enable_cupy(state, cupy, params: list) -> None:
    """Let the C launcher take CuPy arrays (exact ``cupy.ndarray``, declared dtype)."""
    import numpy

    never = object()  # a pointee numpy cannot name (bfloat16): CuPy takes the slow path
    dtypes = []
    for p in params:
        if p.kind != "pointer" or p.code is None:
            dtypes.append(None)
        else:
            name = argmod.NUMPY_DTYPE_NAMES.get(p.code)
            dtypes.append(numpy.dtype(name) if name else never)

    def cupy_stream(get=cupy.cuda.get_current_stream):
        return get().ptr

    state.set_cupy(cupy.ndarray, dtypes, cupy_stream, cupy.cuda.runtime.getDevice)


def _class_attr(cls, name: str):
    """The descriptor ``name`` as defined on ``cls`` or a base (not bound to an instance)."""
    for base in cls.__mro__:
        if name in base.__dict__:
            return base.__dict__[name]
    raise AttributeError(name)
