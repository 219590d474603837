"""The C++ CUDA kernel of kernel-mode custom ops (issue 25): one small shim,
``_opshim.cpp``, built once per torch version by cuforge's own torch build (cached like any
``cuforge.torch.load`` extension: a second process compiles nothing) and loaded with ctypes.

For an op it qualifies for (:func:`plan`), the shim registers a boxed C++ kernel with
torch's dispatcher for the CUDA key. A call then goes dispatcher -> C++: read the
arguments from the IValue stack, check device / dtype / contiguity, allocate the outputs
(``at::empty`` like the input, contiguous), pack the kernel's parameter buffer, launch through
the driver's ``cuLaunchKernelEx`` on torch's current stream (``aoti_torch_get_current_cuda_stream``),
bump the version counters of written tensors. No Python runs, except once per device to
load the kernel there (a ctypes callback).

The fake (meta) kernel, autograd and every other dispatch key stay Python: torch.compile,
``opcheck`` and CUDA graphs see the same op.

Which ops qualify (else the Python kernel stays, and :data:`why_not` says why):
kernel mode; the schema derived from the kernel (no ``schema=`` with other names or
keyword-only arguments); outputs from ``out_like=`` (or none); ``block`` and
``shared_mem`` fixed; ``grid`` fixed or a :func:`cdiv_grid` (``ceil(value / per)`` of an
integer parameter or of a tensor parameter's numel); every parameter a pointer or a plain
scalar the C launcher packs; the parameter buffer <= 4 KiB.
"""

from __future__ import annotations

import ctypes
import os
from ctypes import c_char_p, c_int, c_int64, c_uint64, c_void_p

__all__ = ["cdiv_grid", "CdivGrid", "load_shim", "shim_info", "plan", "register", "enabled"]

_HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(_HERE, "_opshim.cpp")

#: what load_shim found: "path", "compiled" (files compiled by this process's build), "why"
#: (why there is no shim, when there is none)
_state: dict = {}

_PREPARE = ctypes.CFUNCTYPE(c_uint64, ctypes.c_int32)


class CdivGrid:
    """A 1-D grid of ``ceil(value / per)`` blocks, where ``value`` is the kernel parameter
    ``param``: an integer's value or a tensor's ``numel()``. Callable with the kernel's
    arguments (the Python kernel evaluates it so); the C++ kernel evaluates it itself."""

    __slots__ = ("param", "per")

    def __init__(self, param: str, per: int) -> None:
        if not isinstance(param, str):
            raise TypeError(f"cdiv_grid: param must be a kernel parameter name, got {param!r}")
        if type(per) is not int or per < 1:
            raise ValueError(f"cdiv_grid: per must be an int >= 1, got {per!r}")
        self.param = param
        self.per = per

    def __repr__(self) -> str:
        return f"cdiv_grid({self.param!r}, {self.per})"


def cdiv_grid(param: str, per: int) -> CdivGrid:
    """``grid=`` for :func:`cuforge.torch.custom_op`: ``ceil(param / per)`` blocks, ``param``
    naming an integer kernel parameter or a tensor one (its ``numel()``). Unlike a lambda,
    the C++ kernel can evaluate it, so the op keeps the C++ path."""
    return CdivGrid(param, per)


def _bind_grid(grid: CdivGrid, names: list[str], label: str):
    """A Python function of the kernel's arguments for ``grid``."""
    try:
        i = names.index(grid.param)
    except ValueError:
        raise ValueError(
            f"{label}: cdiv_grid names {grid.param!r}, which is not a kernel parameter "
            f"(its parameters: {', '.join(names)})"
        ) from None
    per = grid.per

    def g(*kargs):
        v = kargs[i]
        n = v if type(v) is int else v.numel()
        return (n + per - 1) // per

    return g, i


#: Why the C++ kernel is off when the process turned it off
OFF_WHY = "CUFORGE_TORCH_OP_SHIM=0 turns the C++ op shim off"


def enabled(cpp) -> str | None:
    """None when the shim may be tried for ``cpp`` (True / False / None), else why not:
    ``cpp=True`` tries it (even without a GPU), ``False`` never, None when torch sees a GPU;
    ``CUFORGE_TORCH_OP_SHIM=0`` turns it off for the process (:data:`OFF_WHY`)."""
    if cpp is False:
        return "cpp=False"
    from cuforge.base.config import settings

    if not settings().torch_op_shim:
        return OFF_WHY
    if cpp:
        return None
    import torch

    return None if torch.cuda.is_available() else "torch sees no GPU"


def load_shim(cache=None):
    """The shim library (a ``ctypes.CDLL``), built on first use, or None (``_state["why"]``
    says why: no C++ compiler, no torch headers, a failed build)."""
    if "lib" in _state:
        return _state["lib"]
    lib = None
    try:
        import torch

        from cuforge.torch.build import BuildSpec, build

        name = "cuforge_opshim_" + torch.__version__.replace(".", "_").replace("+", "_")
        result = build(
            BuildSpec(
                name,
                [SOURCE],
                extra_cflags=["-O2"],
                with_cuda=False,
                is_python_module=False,
                cache=cache,
            )
        )
        _state["path"] = result.path
        _state["compiled"] = len(result.compiled)
        lib = ctypes.CDLL(result.path)
        if lib.cfshim_abi_version() != 3:
            raise RuntimeError(f"the shim at {result.path} has another ABI version")
        lib.cfshim_register.restype = c_void_p
        lib.cfshim_register.argtypes = [c_char_p] * 4 + [ctypes.POINTER(c_int64)]
        lib.cfshim_register.argtypes += [c_void_p] * 4 + [c_char_p, c_int]
        lib.cfshim_unregister.argtypes = [c_void_p]
        lib.cfshim_set_func.argtypes = [c_void_p, c_int, c_uint64]
        lib.cfshim_calls.argtypes = [c_void_p]
        lib.cfshim_calls.restype = c_uint64
        lib.cfshim_fast_calls.argtypes = [c_void_p]
        lib.cfshim_fast_calls.restype = c_uint64
        # the eager entry makes a Python object: called with the GIL held (a PyDLL)
        fast = ctypes.PyDLL(result.path).cfshim_fast
        fast.restype = ctypes.py_object
        fast.argtypes = [c_void_p, ctypes.py_object]
        _state["fast"] = fast
        pydll = ctypes.PyDLL(result.path)
        py_entry = pydll.cfshim_py_entry
        py_entry.restype = ctypes.py_object
        py_entry.argtypes = [ctypes.POINTER(c_int64)] * 2 + [c_int, c_int]
        py_entry.argtypes += [ctypes.py_object] * 3
        _state["py_entry"] = py_entry
        py_calls = pydll.cfshim_py_entry_calls
        py_calls.restype, py_calls.argtypes = c_int64, [ctypes.py_object]
        _state["py_entry_calls"] = py_calls
    except Exception as exc:  # noqa: BLE001 - any build/load failure: the Python kernel stays
        _state["why"] = f"the C++ op shim is not available ({type(exc).__name__}: {exc})".split(
            "\n"
        )[0]
        lib = None
    _state["lib"] = lib
    return lib


def shim_info() -> dict:
    """What :func:`load_shim` found (path, files compiled in this process, why not)."""
    return {k: v for k, v in _state.items() if k in ("path", "compiled", "why")}


def _driver_entries():
    """(cuLaunchKernelEx address or 0, cuLaunchKernel address, stream getter address)."""
    import torch

    from cuforge.runtime import driver as drv_mod
    from cuforge.runtime.fastpath import torch_stream_shim

    d = drv_mod.driver()
    ex = getattr(d.pydll, "cuLaunchKernelEx", None)
    ex = ctypes.cast(ex, c_void_p).value if ex is not None else 0
    plain = ctypes.cast(d.pydll.cuLaunchKernel, c_void_p).value
    return ex or 0, plain or 0, torch_stream_shim(torch)


def _dtype_code(dt) -> int:
    """c10::ScalarType code of a torch dtype, through torch's stable C shim."""
    import torch

    lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
    f = getattr(lib, f"aoti_torch_dtype_{str(dt).removeprefix('torch.')}")
    f.restype, f.argtypes = ctypes.c_int32, []
    return int(f())


#: the schema types the shim reads and checks, as its codes (_opshim.cpp's A_TENSOR, A_INT,
#: A_FLOAT, A_BOOL): the C++ kernel's inputs and the eager entries' arguments
_ARG_TYPES = {"Tensor": 0, "int": 1, "SymInt": 1, "float": 2, "bool": 3}


def plan(kernel, args, inputs, outputs, parsed, alloc, grid, block, shared_mem, mutates):
    """``(spec, names)`` for the shim, or a string saying why the op does not qualify."""
    try:
        return _plan(kernel, args, inputs, outputs, parsed, alloc, grid, block, shared_mem, mutates)
    except (AttributeError, KeyError, OSError, TypeError, ValueError) as exc:
        return f"cannot lay the op out for the C++ kernel ({type(exc).__name__}: {exc})"


def _plan(kernel, args, inputs, outputs, parsed, alloc, grid, block, shared_mem, mutates):
    import torch

    from cuforge.runtime import args as argmod
    from cuforge.runtime.fastlaunch import KINDS
    from cuforge.runtime.kernel import _dims

    names = [a.name for a in inputs]
    if any(a.kwarg_only for a in parsed.arguments) or [a.name for a in parsed.arguments] != names:
        return "the schema has keyword-only arguments or other names than the kernel's"
    if outputs and getattr(alloc, "_cuforge_like", None) is None:
        return "its outputs come from fake=, not out_like="
    if callable(block) or callable(shared_mem):
        return "block or shared_mem is a function"
    layout = getattr(kernel, "_layout", None)
    if layout is None or getattr(kernel, "_layout_changed", False):
        return "the kernel's parameter layout is not known before it loads"
    try:
        b, sh = _dims(block, "block"), int(shared_mem)
    except (TypeError, ValueError) as exc:
        return f"block / shared_mem: {exc}"
    kargs = [a.name for a in args]
    grid_mode, grid_src, grid_per, g = 0, -1, 1, (1, 1, 1)
    if isinstance(grid, CdivGrid):
        if grid.param not in kargs:
            return f"cdiv_grid names {grid.param!r}, not a kernel parameter"
        grid_mode, grid_src, grid_per = 1, kargs.index(grid.param), grid.per
        p = args[grid_src].param
        if p.kind != "pointer" and p.code not in ("b", "B", "h", "H", "i", "I", "q", "Q"):
            return f"cdiv_grid names {grid.param!r}, which is neither a tensor nor an integer"
    elif callable(grid):
        return "grid is a Python function (cuforge.torch.cdiv_grid keeps the C++ path)"
    else:
        try:
            g = _dims(grid, "grid")
        except (TypeError, ValueError) as exc:
            return f"grid: {exc}"
        if 0 in g:
            return "the grid is empty"
    if layout.size > 4096 or len(kargs) > 64:
        return "the kernel's parameter buffer is larger than 4 KiB"
    input_pos = {n: i for i, n in enumerate(names)}
    spec = [len(inputs), len(args), len(outputs), layout.size, *g, *b, sh]
    spec += [grid_mode, grid_src, grid_per, 1 if parsed.returns else 0, 0]
    for a, off in zip(args, layout.offsets, strict=True):
        p = a.param
        if p.kind == "pointer":
            kind = KINDS["ptr"]
            dt = argmod.torch_dtype_for(p.code, torch)
            code = _dtype_code(dt) if dt is not None else -1
        elif p.kind == "scalar" and p.code in KINDS:
            kind, code = KINDS[p.code], -1
        else:
            return f"kernel parameter {a.name!r} ({p.type}) is not a pointer or plain scalar"
        src = input_pos[a.name] if a.name in input_pos else -(outputs.index(a.name) + 1)
        spec += [src, kind, off, code]
    for a in inputs:
        t = a.schema_type
        spec += [_ARG_TYPES[t], 1 if t == "Tensor" and a.name not in mutates else 0]
        spec += [1 if a.name in mutates else 0]
    spec += list(alloc._cuforge_like) if outputs else []
    return spec, names


def register(op, kernel, spec, names, cache=None):
    """Register the shim's CUDA kernel for ``op`` (a CuforgeOp); None, or why not."""
    lib = load_shim(cache)
    if lib is None:
        why = _state.get("why", "the C++ op shim is not available")
        from cuforge.core.caching import resolve

        resolve(cache).warn_once(f"cuforge.torch.custom_op: the Python CUDA kernel stays: {why}")
        return why
    if _test_cpu is not None:  # tests: the CPU key, a recording launch, no driver
        spec = list(spec)
        spec[15] = 1
        ex, plain, stream = _test_cpu[0], 0, _test_cpu[1]
        kernel = _TestKernel()
    else:
        try:
            ex, plain, stream = _driver_entries()
        except Exception:  # noqa: BLE001 - no driver: a launch would fail, and says so
            ex, plain, stream = 0, ctypes.cast(_no_launch, c_void_p).value, 0
    if not stream:
        # a CPU-only torch: its CUDA key never runs, registering still shows the path
        stream = ctypes.cast(_no_stream, c_void_p).value
    shmem = spec[10]
    testing = isinstance(kernel, _TestKernel)
    offsets = tuple(kernel._layout.offsets) if kernel._layout is not None else None

    def prepare(device: int) -> int:
        """The kernel's function on ``device``, loaded there; for ``-(device + 1)``: make
        that device's primary context current (a launch found none) and return 1."""
        if testing:
            return _Loaded.func if device >= 0 else 1
        from cuforge.runtime import driver as drv_mod

        d = drv_mod.driver()
        if device < 0:
            d.use_device(-device - 1)
            return 1
        previous = d.use_device(device)
        try:
            func = kernel._devices[device].func or kernel._load(device)
            if kernel._layout_changed or (
                offsets is not None and tuple(kernel._layout.offsets) != offsets
            ):
                raise RuntimeError(
                    f"kernel {kernel.name!r}: its parameter layout changed when it loaded; "
                    "register the op with cpp=False"
                )
            if shmem > kernel._devices[device].shm_set:
                kernel._allow_shared_memory(device, func, shmem)
            return func
        finally:
            if previous and previous != d.primary_context(device):
                d.set_current_context(previous)

    cb = _PREPARE(prepare)
    arr = (c_int64 * len(spec))(*spec)
    err = ctypes.create_string_buffer(512)
    label = f"{op._qualname} (cuforge C++ kernel over {getattr(kernel, 'name', kernel)!r})"
    handle = lib.cfshim_register(
        op._namespace.encode(),
        op._name.encode(),
        label.encode(),
        "\n".join(names).encode(),
        arr,
        ex or None,
        plain or None,
        stream,
        ctypes.cast(cb, c_void_p).value,
        err,
        len(err),
    )
    if not handle:
        return f"the shim refused the op: {err.value.decode(errors='replace')}"
    op._cuforge_cpp = (handle, cb, lib)  # the callback lives as long as the registration
    # the eager entry (see _opshim.cpp): the op's __call__ takes it outside torch.compile
    op._cuforge_fast = _state["fast"](handle, op._opoverload)
    return None


#: tests only: (cuLaunchKernelEx stand-in address, stream getter address): register() then
#: registers for the CPU key and launches there (tests/torch/test_custom_op_shim.py)
_test_cpu: tuple[int, int] | None = None


class _TestKernel:
    """The kernel as the test registration sees it: loaded everywhere, at a fake address."""

    name = "test"
    _layout_changed = False

    def __init__(self) -> None:
        self._devices = [_Loaded()] * 64
        self._layout = None


class _Loaded:
    func = 0xF00D
    shm_set = 1 << 20


def _no_stream_fn(device: int, out) -> int:
    return 1


def _no_launch(*args) -> int:
    return 100  # CUDA_ERROR_NO_DEVICE


_no_launch = ctypes.CFUNCTYPE(ctypes.c_int, *[ctypes.c_void_p] * 11)(_no_launch)
_no_stream = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_int32, ctypes.c_void_p)(_no_stream_fn)


def written_by(arg) -> bool:
    """Whether the schema argument ``arg`` is marked written (``Tensor(a!)``)."""
    return arg.alias_info is not None and arg.alias_info.is_write


def python_entry(op, kernel, parsed, key: str, cpp, cache=None) -> str | None:
    """Give ``op`` (a CuforgeOp whose ``key`` kernel is the Python ``kernel``) the shim's
    eager entry to that kernel (``_opshim.cpp``, ``cfshim_py_entry``): a plain eager call
    runs ``kernel`` straight and bumps the version counters of the tensors the schema marks
    written; any other goes through the dispatcher as before. ``kernel`` is the op's
    implementation, not the registered wrappers (``CuforgeOp._device_kernel``,
    ``custom_ops._dynamo_disabled``): the entry's checks include the first's grad check and
    the second's Dynamo frame-hook check (a call under the hook goes to the OpOverload), and
    the entry bumps. None, or why not (the op then simply goes through the dispatcher;
    nothing is warned)."""
    why = enabled(cpp)
    if why is not None:
        return why
    if key not in ("CUDA", "CPU"):
        return f"the kernel is registered for {key}, not one device's key"
    types = []
    for a in parsed.arguments:
        t = _ARG_TYPES.get(str(a.type))
        if t is None or a.kwarg_only:
            return f"argument {a.name!r} is {'keyword-only' if a.kwarg_only else a.type}"
        types.append(t)
    if 0 not in types:
        return "the op takes no tensor (the dispatcher picks its device from the tensors)"
    if load_shim(cache) is None:
        return _state.get("why", "the C++ op shim is not available")
    written = [int(written_by(a)) for a in parsed.arguments]
    if any(w and t != 0 for w, t in zip(written, types, strict=True)):
        return "the schema marks a non-tensor argument written"
    import torch

    try:  # the entry hands calls made under Dynamo's frame hook to the OpOverload
        hook = torch._C._dynamo.eval_frame.get_eval_frame_callback
    except AttributeError:
        return "this torch has no get_eval_frame_callback (Dynamo's frame hook)"
    n, cpu = len(types), int(key == "CPU")
    op._cuforge_fast = _state["py_entry"](
        (c_int64 * n)(*types), (c_int64 * n)(*written), n, cpu, kernel, op._opoverload, hook
    )
    op._cuforge_py_entry, op._cuforge_entry_key = op._cuforge_fast, key
    return None


def _counter(op, name: str) -> int:
    found = getattr(op, "_cuforge_cpp", None)
    if found is None:
        return 0
    handle, _, lib = found
    return int(getattr(lib, name)(handle))


def calls(op) -> int:
    """How many calls the op's C++ kernel has run (0 without one)."""
    return _counter(op, "cfshim_calls")


def fast_calls(op) -> int:
    """How many of :func:`calls` the op's eager entry ran itself, without the dispatcher;
    for an op whose kernel is Python: how many calls its eager entry handed that kernel
    itself."""
    entry = getattr(op, "_cuforge_py_entry", None)
    if entry is not None:
        return int(_state["py_entry_calls"](entry))
    return _counter(op, "cfshim_fast_calls")
