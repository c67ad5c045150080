"""CuPy arrays in uvm_lab memory: ``cupy.cuda.set_allocator(cupy_allocator)``, as RMM's ``rmm_cupy_allocator``.

Every array CuPy makes then comes from a uvm_lab resource (the current device resource, or the one
given to :func:`make_cupy_allocator`), so its allocation, prefetch and residency show in events and maps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..backends import get_backend
from ..buffer import DeviceBuffer
from ..errors import BackendError
from ..mr.base import MemoryResource
from ..mr.current import get_current_device_resource

__all__ = ["cupy_allocator", "make_cupy_allocator"]


def make_cupy_allocator(mr: MemoryResource | None = None) -> Callable[[int], Any]:
    """An allocator for ``cupy.cuda.set_allocator`` that takes memory from ``mr`` (None: the current resource)."""
    import cupy

    def allocate(nbytes: int) -> Any:
        resource = mr if mr is not None else get_current_device_resource()
        if resource.backend.is_simulated:
            raise BackendError("CuPy needs a real GPU; the current uvm_lab backend is the simulator")
        stream = cupy.cuda.get_current_stream().ptr
        buf = DeviceBuffer(size=nbytes, mr=resource, stream=stream or None, label="cupy")
        # CuPy holds the buffer as the owner: when the array dies, the buffer is freed through its resource.
        memory = cupy.cuda.UnownedMemory(buf.ptr, nbytes, buf, resource.device_id if nbytes else None)
        return cupy.cuda.MemoryPointer(memory, 0)

    return allocate


def cupy_allocator(nbytes: int) -> Any:
    """Allocate ``nbytes`` for CuPy from the current device resource."""
    if get_backend().is_simulated:
        raise BackendError("CuPy needs a real GPU; the current uvm_lab backend is the simulator")
    return make_cupy_allocator()(nbytes)
