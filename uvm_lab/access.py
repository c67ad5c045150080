"""``touch``: run an access to every page of a buffer, as a kernel on a GPU or a loop on the host."""

from __future__ import annotations

from .backends.base import AccessMode, AccessResult
from .buffer import DeviceBuffer
from .errors import BufferClosedError, InvalidArgumentError
from .location import Location
from .stream import as_stream_handle
from .units import parse_size

__all__ = ["touch"]

_MODES = ("read", "write", "atomic")


def touch(buffer: DeviceBuffer, on: int | str | Location = "gpu", mode: AccessMode = "read", *,
          offset: int | str = 0, size: int | str | None = None, stream: object = None) -> AccessResult:
    """Access bytes ``[offset, offset + size)`` of ``buffer`` from ``on`` (``"gpu"``, ``"host"`` ...).

    On the simulator this is a modelled kernel or host loop: pages fault and migrate according to
    the driver's rules, and the cost advances the simulated clock. A GPU access runs on ``stream``
    (the default stream when None); under a ``PrefetchResourceAdaptor(on="access")`` the buffer is
    prefetched on that stream first. Returns what it cost.
    """
    if not isinstance(buffer, DeviceBuffer):
        raise InvalidArgumentError(f"touch needs a DeviceBuffer, got {buffer!r} ({type(buffer).__name__})",
                                   value=buffer, expected="a uvm_lab.DeviceBuffer")
    if buffer.closed:
        raise BufferClosedError(f"cannot touch {buffer.label!r}: its memory was freed")
    if mode not in _MODES:
        raise InvalidArgumentError(f"mode must be one of {', '.join(_MODES)}, got {mode!r}", value=mode,
                                   expected=", ".join(_MODES))
    backend = buffer.mr.backend
    where = Location.parse(on, device_count=backend.device_count(), current_device=backend.current_device(), name="on")
    start = parse_size(offset, name="offset")
    length = buffer.size - start if size is None else parse_size(size, name="size")
    if start + length > buffer.size:
        raise InvalidArgumentError(f"offset {start} + size {length} runs past the end of the buffer "
                                   f"({buffer.size} bytes)",
                                   value=(offset, size), expected=f"a range within 0..{buffer.size}")
    handle = as_stream_handle(stream)
    if length == 0:
        return AccessResult(0.0, 0, 0, 0)
    if not where.is_host:
        buffer._prefetch_on_access(handle)
    return backend.access(buffer.ptr + start, length, where, mode, stream=handle)
