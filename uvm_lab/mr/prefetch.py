"""PrefetchResourceAdaptor: prefetch each new managed allocation to where it will be used."""

from __future__ import annotations

from ..errors import InvalidArgumentError
from ..location import Location
from ..units import parse_size
from .base import MemoryResource, ResourceAdaptor

__all__ = ["PrefetchResourceAdaptor"]


class PrefetchResourceAdaptor(ResourceAdaptor):
    """After each upstream allocation, prefetch it to ``device`` (RMM's adaptor, and more).

    Parameters
    ----------
    upstream_mr
        The resource that allocates.
    device
        Where to prefetch: None for the current device (RMM's behaviour), ``"host"``, ``"gpu:N"`` or an ordinal.
    min_size
        Allocations smaller than this are not prefetched (small buffers are cheaper to fault in).
    on
        When to prefetch. ``"allocate"`` (the default, RMM's behaviour): right after each allocation, on
        the allocation's stream. ``"access"``: each time a :class:`~uvm_lab.DeviceBuffer` from this
        resource is handed to a GPU consumer, on the consumer's stream: ``__dlpack__(stream=s)``
        (``torch.from_dlpack``, ``cupy.from_dlpack``), ``__cuda_array_interface__`` (on the buffer's
        stream, which the interface then names) and ``ul.touch(buf, "gpu", stream=s)``. Data the host
        wrote after allocation then moves once, just before the kernel that reads it.

    As in RMM, memory that cannot migrate (not managed) is left alone.
    """

    def __init__(self, upstream_mr: MemoryResource, device: int | str | None = None, min_size: int | str = 0,
                 on: str = "allocate") -> None:
        if on not in ("allocate", "access"):
            raise InvalidArgumentError(f"on must be 'allocate' or 'access', got {on!r}", value=on,
                                       expected="'allocate' or 'access'")
        super().__init__(upstream_mr)
        self.on = on
        backend = self.backend
        self.location = Location.parse(backend.current_device() if device is None else device,
                                       device_count=backend.device_count(), current_device=backend.current_device(),
                                       name="device")
        self.min_size = parse_size(min_size, name="min_size")

    def _allocate(self, size: int, stream: int) -> int:
        ptr = self.upstream_mr.allocate(size, stream)
        if self.on == "allocate" and size and size >= self.min_size and self.upstream_mr.is_managed:
            self.backend.prefetch(ptr, size, self.location, stream=stream)
        return ptr

    def __repr__(self) -> str:
        return (f"PrefetchResourceAdaptor({self.upstream_mr!r}, device={str(self.location)!r}, "
                f"min_size={self.min_size}, on={self.on!r})")
