"""ManagedMemoryResource: unified memory (cudaMallocManaged), the memory uvm_lab is about."""

from __future__ import annotations

from ..backends import get_backend
from ..events.schema import MemoryKind
from ..units import format_bytes
from .base import MemoryResource, device_of

__all__ = ["ManagedMemoryResource"]


class ManagedMemoryResource(MemoryResource):
    """Allocates managed memory: pages migrate between host and GPU on fault or prefetch.

    By default an allocation larger than the device's free memory is refused with
    :class:`~uvm_lab.errors.OutOfMemoryError`: oversubscribing a real, shared GPU can stall it.
    ``allow_oversubscription=True`` opts in (the simulator is the safe place to study it).

    ``device`` is the GPU whose free memory that guard reads and whose memory the allocation counts
    against (the current device when None); the memory itself can live anywhere.
    """

    def __init__(self, *, allow_oversubscription: bool = False, device: int | None = None) -> None:
        backend = get_backend()
        super().__init__(backend, device_of(backend, device))
        self.allow_oversubscription = bool(allow_oversubscription)

    @property
    def is_managed(self) -> bool:
        return True

    def _allocate(self, size: int, stream: int) -> int:
        if not self.allow_oversubscription:
            free, total = self.backend.mem_info(self.device_id)
            if size > free:
                raise self._out_of_memory(
                    size, free, total,
                    f"only {format_bytes(free)} of device memory is free and oversubscription is off; "
                    f"pass allow_oversubscription=True to let pages be evicted to the host")
        return self.backend.allocate(size, MemoryKind.MANAGED, device=self.device_id, stream=stream)

    def _deallocate(self, ptr: int, size: int, stream: int) -> None:
        self.backend.free(ptr, stream=stream)

    def __repr__(self) -> str:
        args = [f"device={self.device_id}"] if self.device_id else []
        args += ["allow_oversubscription=True"] if self.allow_oversubscription else []
        return f"ManagedMemoryResource({', '.join(args)})"
