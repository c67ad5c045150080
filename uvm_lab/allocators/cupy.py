"""CuPy arrays in uvm_lab memory, as RMM's ``rmm.allocators.cupy``::

    from uvm_lab.allocators.cupy import uvm_lab_cupy_allocator
    cupy.cuda.set_allocator(uvm_lab_cupy_allocator)

Every array CuPy makes then comes from a uvm_lab resource (the current device resource, or the one
given to :func:`make_cupy_allocator`), so its allocation, prefetch and residency show in events and maps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import BackendError
from ..mr.base import MemoryResource
from ..mr.current import get_current_device_resource
from .lent import lent_buffer

__all__ = ["cupy_allocator", "make_cupy_allocator", "uvm_lab_cupy_allocator"]


def _cupy() -> Any:
    try:
        import cupy
    except ImportError as exc:
        raise BackendError("CuPy is not installed here: the CuPy allocator needs it and a GPU "
                           "(pip install 'uvm_lab[cuda]')") from exc
    return cupy


def make_cupy_allocator(mr: MemoryResource | None = None) -> Callable[[int], Any]:
    """An allocator for ``cupy.cuda.set_allocator`` that takes memory from ``mr`` (None: the current resource)."""
    cupy = _cupy()

    def allocate(nbytes: int) -> Any:
        resource = mr if mr is not None else get_current_device_resource()
        if resource.backend.is_simulated:
            raise BackendError("CuPy needs a real GPU; the current uvm_lab backend is the simulator")
        stream = cupy.cuda.get_current_stream().ptr
        buf = lent_buffer(nbytes, mr=resource, stream=stream or None, label="cupy",
                          device=resource.device_id if resource.device_id >= 0 else None)
        # CuPy holds the buffer as the owner: when the array dies, the buffer is freed through its resource.
        memory = cupy.cuda.UnownedMemory(buf.ptr, nbytes, buf, resource.device_id if nbytes else None)
        return cupy.cuda.MemoryPointer(memory, 0)

    return allocate


def uvm_lab_cupy_allocator(nbytes: int) -> Any:
    """Allocate ``nbytes`` for CuPy from the current device resource (RMM's ``rmm_cupy_allocator``).

    Raises
    ------
    BackendError
        The current backend is the simulator (its memory is not real), or CuPy is not installed.
    """
    if get_current_device_resource().backend.is_simulated:
        raise BackendError("CuPy needs a real GPU; the current uvm_lab backend is the simulator")
    return make_cupy_allocator()(nbytes)


#: The name earlier releases gave :func:`uvm_lab_cupy_allocator`.
cupy_allocator = uvm_lab_cupy_allocator
