"""The GPU side: the one place cuforge loads ``libcuda`` to ask about the driver and GPUs.

* :func:`libcuda` / :func:`libcuda_pydll` -- the driver library through ctypes (loaded once
  per process; :mod:`cuforge.runtime.driver` launches through the same handle);
* :func:`driver_version` -- ``cuDriverGetVersion``;
* :func:`devices` -- every visible GPU with its name, arch and memory (``cuforge doctor``);
* :func:`visible_gpu_archs` -- their archs, remembered across processes.

Nothing here raises: no driver or no GPU is an answer (None, [] or a reason). ``ctypes``
is imported on first use only.
"""

from __future__ import annotations

import os
import sys

from cuforge.toolchain import memo as _memo

__all__ = [
    "libcuda",
    "libcuda_pydll",
    "libcuda_error",
    "driver_version",
    "devices",
    "visible_gpu_archs",
]

_NAMES = ("nvcuda.dll",) if sys.platform == "win32" else ("libcuda.so.1", "libcuda.so")

# "lib": CDLL | None, "error": why not, "pydll", "version", "archs"
_state: dict[str, object] = {}


def _load() -> None:
    import ctypes  # ctypes: only when libcuda is probed, not on a cache hit

    first: OSError | None = None
    for name in _NAMES:
        try:
            _state["lib"] = ctypes.CDLL(name)
            _state["error"] = None
            return
        except OSError as exc:
            first = first or exc
    _state["lib"] = None
    _state["error"] = f"no NVIDIA driver ({_NAMES[0]} cannot be loaded: {first})"


def libcuda() -> ctypes.CDLL | None:  # noqa: F821 - ctypes is imported lazily
    """The CUDA driver library (``libcuda.so.1``) as a ``ctypes.CDLL``, or None when there
    is no driver (:func:`libcuda_error` says why). Loaded once per process; never raises."""
    if "lib" not in _state:
        with _memo.lock:
            if "lib" not in _state:
                _load()
    return _state["lib"]


def libcuda_error() -> str | None:
    """Why :func:`libcuda` is None (a sentence), or None when the driver is loaded."""
    libcuda()
    return _state["error"]


def libcuda_pydll() -> ctypes.PyDLL | None:  # noqa: F821 - ctypes is imported lazily
    """The same loaded library as a ``ctypes.PyDLL`` (calls keep the GIL: the launch path),
    or None without a driver."""
    lib = libcuda()
    if lib is None:
        return None
    if "pydll" not in _state:
        import ctypes

        _state["pydll"] = ctypes.PyDLL(lib._name, handle=lib._handle)
    return _state["pydll"]


def driver_version() -> int | None:
    """The driver's CUDA version (``cuDriverGetVersion``, e.g. 13000), or None without a driver."""
    if "version" in _state:
        return _state["version"]
    version = None
    with _memo.lock:
        lib = libcuda()
        if lib is not None:
            import ctypes

            try:
                value = ctypes.c_int()
                if lib.cuDriverGetVersion(ctypes.byref(value)) == 0:
                    version = value.value
            except (OSError, AttributeError):
                version = None
        _state["version"] = version
    return version


def devices() -> tuple[list[dict[str, object]], str | None]:
    """``([{"index", "name", "arch", "memory_bytes"}, ...], None)`` for the visible GPUs,
    asked of the driver now (``cuInit``; ~180 ms in a fresh process), or ``([], why there
    are none)``. Never raises."""
    import ctypes

    lib = libcuda()
    if lib is None:
        return [], libcuda_error()
    try:
        rc = lib.cuInit(0)
        if rc == 100:
            return [], "the NVIDIA driver sees no GPU (CUDA_ERROR_NO_DEVICE)"
        if rc != 0:
            return [], f"the NVIDIA driver did not start (cuInit error {rc})"
        count = ctypes.c_int()
        if lib.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value == 0:
            return [], "the NVIDIA driver sees no GPU"
        found = []
        for i in range(count.value):
            dev = ctypes.c_int()
            if lib.cuDeviceGet(ctypes.byref(dev), i) != 0:
                continue
            major, minor = ctypes.c_int(), ctypes.c_int()
            # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75, _MINOR = 76
            if lib.cuDeviceGetAttribute(ctypes.byref(major), 75, dev) != 0:
                continue
            if lib.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev) != 0:
                continue
            name = ctypes.create_string_buffer(256)
            lib.cuDeviceGetName(name, 256, dev)
            mem = ctypes.c_size_t()
            lib.cuDeviceTotalMem_v2(ctypes.byref(mem), dev)
            found.append(
                {
                    "index": i,
                    "name": name.value.decode(errors="replace"),
                    "arch": f"sm_{major.value}{minor.value}",
                    "memory_bytes": mem.value,
                }
            )
    except (OSError, AttributeError) as exc:  # a driver without an entry point
        return [], f"the NVIDIA driver could not be queried ({exc})"
    if not found:
        return [], "the NVIDIA driver lists GPUs but none could be queried"
    return found, None


def visible_gpu_archs() -> list[str]:
    """``["sm_90", ...]``, one per visible device, through the driver (ctypes on
    ``libcuda.so.1``); [] without a driver or GPU. Never raises; memoized per process.

    ``cuInit`` costs ~180 ms in a fresh process (measured on an H200), so a found answer
    is also kept in the on-disk memo, keyed by what would change it: the boot id, the
    driver version, the GPUs the driver lists (``/proc/driver/nvidia/gpus``, which
    containers mask to their own), the ``/dev/nvidiaN`` nodes, ``CUDA_VISIBLE_DEVICES``
    and ``CUDA_DEVICE_ORDER``. A later process on the same boot skips ``cuInit``."""
    cached = _state.get("archs")
    if cached is not None:
        return list(cached)
    with _memo.lock:
        cached = _state.get("archs")
        if cached is not None:
            return list(cached)
        try:
            archs = _memoized_archs()
        except Exception:  # noqa: BLE001 - never raise from a probe
            archs = []
        _state["archs"] = tuple(archs)
    return archs


def _gpu_memo_key() -> str | None:
    """What identifies the set of visible GPUs without asking the driver; None when the
    NVIDIA kernel driver exposes nothing to key on (then the driver is asked)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip()
        with open("/proc/driver/nvidia/version", encoding="utf-8", errors="replace") as f:
            driver = f.readline().strip()
        gpus = sorted(os.listdir("/proc/driver/nvidia/gpus"))
        nodes = sorted(n for n in os.listdir("/dev") if n.startswith("nvidia") and n[6:].isdigit())
    except OSError:
        return None
    if not boot or not gpus:
        return None
    return "|".join(
        (
            boot,
            driver,
            ",".join(gpus),
            ",".join(nodes),
            "CUDA_VISIBLE_DEVICES=" + os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"),
            "CUDA_DEVICE_ORDER=" + (os.environ.get("CUDA_DEVICE_ORDER") or ""),
        )
    )


def _no_nvidia_driver() -> bool:
    """True when Linux shows no NVIDIA kernel driver (nor WSL's GPU bridge): then there is
    no GPU to ask about, and importing ctypes and dlopen-ing libcuda (~4 ms) is skipped."""
    return (
        sys.platform.startswith("linux")
        and not os.path.exists("/proc/driver/nvidia")
        and not os.path.exists("/dev/dxg")
    )


def _memoized_archs() -> list[str]:
    if _no_nvidia_driver():
        return []
    key = _gpu_memo_key()
    if key is None:
        return _query_archs()
    memo = _memo.load()
    found = memo.get("gpus", {}).get(key)
    if isinstance(found, list) and found and all(isinstance(a, str) for a in found):
        return list(found)
    archs = _query_archs()
    if archs:
        memo["gpus"] = {key: archs}  # only the current boot's answer is worth keeping
        _memo.save(memo)
    return archs


def _query_archs() -> list[str]:
    return [d["arch"] for d in devices()[0]]
