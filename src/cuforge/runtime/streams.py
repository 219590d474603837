"""Streams: what ``stream=`` accepts, and which stream a launch uses by default.

``stream=`` takes a torch ``Stream``, a CuPy ``Stream``, a cuda.core ``Stream`` (anything
with ``__cuda_stream__``), a ``cuda.bindings`` ``CUstream`` or an integer handle.

With no ``stream=``, a launch follows what the caller is doing:

* torch tensors among the arguments -> torch's current stream on their device (so the
  kernel is ordered with the torch ops around it);
* else, CuPy imported -> CuPy's current stream;
* else the legacy default stream (handle 0).
"""

from __future__ import annotations

import sys

from cuforge.runtime.errors import ArgumentError

__all__ = ["stream_handle", "default_stream", "torch_stream_getter"]


def _int_handle(s) -> int:
    if s < 0:
        raise ArgumentError(f"stream handle must be >= 0, got {s}")
    return int(s)


def _torch_handle(s) -> int:
    return int(s.cuda_stream)


def _cuda_stream_protocol(s) -> int:
    return int(s.__cuda_stream__()[1])


def _ptr_handle(s) -> int:
    return int(s.ptr)


def _handle_attr(s) -> int:
    return int(s.handle)


def _int_conversion(s) -> int:
    return int(s)


_HANDLERS: dict[type, object] = {int: _int_handle}


def _classify(t: type):
    if issubclass(t, bool):
        return None
    if issubclass(t, int):
        return _int_handle
    if hasattr(t, "cuda_stream"):  # torch.cuda.Stream / ExternalStream
        return _torch_handle
    if hasattr(t, "__cuda_stream__"):  # cuda.core Stream, recent CuPy
        return _cuda_stream_protocol
    if hasattr(t, "ptr"):  # CuPy Stream
        return _ptr_handle
    if hasattr(t, "handle"):
        return _handle_attr
    if hasattr(t, "__int__") or hasattr(t, "getPtr"):  # cuda.bindings CUstream
        return _int_conversion
    return None


def stream_handle(stream) -> int:
    """The ``CUstream`` handle (an int) of any accepted stream object."""
    t = type(stream)
    handler = _HANDLERS.get(t)
    if handler is None:
        handler = _classify(t)
        if handler is None:
            raise ArgumentError(
                f"stream= takes a torch, CuPy or cuda.core Stream or an int handle, not "
                f"{t.__name__}"
            )
        _HANDLERS[t] = handler
    return handler(stream)


def torch_stream_getter(torch=None):
    """A function device -> torch's current raw stream handle there (cheap: no Stream object).
    ``torch``: the torch module to ask (default: the one imported; None when there is none)."""
    if torch is None:
        torch = sys.modules.get("torch")
    if torch is None:
        return None
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw
    return lambda device: torch.cuda.current_stream(device).cuda_stream


def default_stream(framework: str | None, device: int) -> int:
    """The stream a launch uses when none is given (see the module docstring)."""
    if framework == "torch":
        return torch_stream_getter()(device)
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        try:
            return int(cupy.cuda.get_current_stream().ptr)
        except Exception:  # noqa: BLE001 - CuPy without a usable device: legacy default stream
            return 0
    return 0
