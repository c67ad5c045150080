"""Resources for memory that does not migrate: device memory (cudaMalloc) and pinned host memory."""

from __future__ import annotations

from ..backends import get_backend
from ..events.schema import MemoryKind
from ..location import HOST_ID
from .base import MemoryResource

__all__ = ["CudaMemoryResource", "PinnedHostMemoryResource"]


class CudaMemoryResource(MemoryResource):
    """``cudaMalloc`` / ``cudaFree``: GPU memory that never migrates and is never evicted."""

    def __init__(self) -> None:
        super().__init__(get_backend())

    def _allocate(self, size: int, stream: int) -> int:
        return self.backend.allocate(size, MemoryKind.DEVICE, device=self.device_id, stream=stream)

    def _deallocate(self, ptr: int, size: int, stream: int) -> None:
        self.backend.free(ptr, stream=stream)


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
