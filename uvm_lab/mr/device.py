"""Resources for memory that does not migrate: device memory (cudaMalloc) and pinned host memory."""

from __future__ import annotations

from ..backends import get_backend
from ..events.schema import MemoryKind
from ..location import HOST_ID
from .base import MemoryResource, device_of

__all__ = ["CudaMemoryResource", "PinnedHostMemoryResource"]


class CudaMemoryResource(MemoryResource):
    """``cudaMalloc`` / ``cudaFree``: GPU memory that never migrates and is never evicted.

    ``device`` is the GPU it allocates on: the current device when None (RMM's resources use the
    device current at each call; this one keeps the device it was made for).
    """

    def __init__(self, *, device: int | None = None) -> None:
        backend = get_backend()
        super().__init__(backend, device_of(backend, device))

    def _allocate(self, size: int, stream: int) -> int:
        return self.backend.allocate(size, MemoryKind.DEVICE, device=self.device_id, stream=stream)

    def _deallocate(self, ptr: int, size: int, stream: int) -> None:
        self.backend.free(ptr, stream=stream)

    def __repr__(self) -> str:
        return f"CudaMemoryResource(device={self.device_id})" if self.device_id else "CudaMemoryResource()"


class PinnedHostMemoryResource(MemoryResource):
    """``cudaHostAlloc``: page-locked host memory that GPUs read over the link (zero-copy)."""

    def __init__(self) -> None:
        super().__init__(get_backend())

    @property
    def device_id(self) -> int:
        return HOST_ID

    def _allocate(self, size: int, stream: int) -> int:
        return self.backend.allocate(size, MemoryKind.PINNED_HOST, stream=stream)

    def _deallocate(self, ptr: int, size: int, stream: int) -> None:
        self.backend.free(ptr, stream=stream)
