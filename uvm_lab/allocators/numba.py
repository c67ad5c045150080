"""Numba CUDA arrays in uvm_lab memory: an External Memory Management plugin, as RMM's ``rmm.allocators.numba``::

    from numba import cuda
    from uvm_lab.allocators.numba import UvmLabNumbaManager
    cuda.set_memory_manager(UvmLabNumbaManager)

or ``NUMBA_CUDA_MEMORY_MANAGER=uvm_lab.allocators.numba`` before Numba starts. Every device array Numba
makes then is a :class:`~uvm_lab.DeviceBuffer` from the current device resource (managed memory by default),
with its events and maps. Host allocations stay Numba's own.

This module imports without Numba; where Numba (numba-cuda) is missing, making the manager raises
:class:`~uvm_lab.errors.BackendError`, as does an allocation on the simulator.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

from ..backends import get_backend
from ..errors import BackendError
from .lent import lent_buffer

__all__ = ["UvmLabNumbaManager"]

try:
    from numba import cuda as _numba_cuda
    from numba.cuda import HostOnlyCUDAMemoryManager as _Base
    from numba.cuda import IpcHandle as _IpcHandle
    from numba.cuda import MemoryPointer as _MemoryPointer
except ImportError:   # no Numba: a manager that says so when made
    _numba_cuda = _IpcHandle = _MemoryPointer = None  # type: ignore[assignment,misc]

    class _Base:  # type: ignore[no-redef]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise BackendError("Numba is not installed here: UvmLabNumbaManager is a plugin for numba-cuda "
                               "(pip install numba-cuda) on a GPU")


def _finalizer(handle: int, allocations: dict[int, Any]) -> Callable[[], None]:
    """What Numba calls when the array's memory is let go: drop the buffer, which frees it through its resource."""

    def finalize() -> None:
        # After a context reset Numba may have cleared the table already (RMM's note): nothing is left to drop.
        if allocations:
            del allocations[handle]

    return finalize


def _device_pointer(address: int) -> Any:
    """The pointer type Numba's driver layer takes: ``CUdeviceptr`` with NVIDIA's bindings, else ``c_void_p``."""
    from numba.cuda.cudadrv import driver

    if getattr(driver, "USE_NV_BINDING", True):
        return driver.binding.CUdeviceptr(address)
    return ctypes.c_void_p(address)


class UvmLabNumbaManager(_Base):
    """Numba's memory manager plugin (interface version 1): device arrays from uvm_lab's current device
    resource, host arrays from Numba, as RMM's ``RMMNumbaManager``.

    Raises
    ------
    BackendError
        On construction, where Numba is not installed; on allocation, on the simulator.
    """

    def initialize(self) -> None:
        """Nothing to set up: allocations go to the current device resource."""

    def memalloc(self, size: int) -> Any:
        """An on-device allocation of ``size`` bytes, as a :class:`~uvm_lab.DeviceBuffer` Numba owns."""
        if get_backend().is_simulated:
            raise BackendError("Numba needs a real GPU; the current uvm_lab backend is the simulator")
        buf = lent_buffer(size, label="numba")   # Numba's kernels use it, on the current device
        address = int(buf.ptr)
        # Numba clears self.allocations on a context reset; the buffer lives until the finalizer drops it.
        self.allocations[address] = buf
        return _MemoryPointer(self.context, _device_pointer(address), size,
                              finalizer=_finalizer(address, self.allocations))

    def get_ipc_handle(self, memory: Any) -> Any:
        """An IPC handle for ``memory``, offset within the allocation that holds it (as RMM's). CUDA shares device
        memory (``CudaMemoryResource``, pools over it) between processes, not managed memory."""
        from numba.cuda.cudadrv import driver

        ipc_mem_handle = getattr(get_backend(), "ipc_mem_handle", None)
        if ipc_mem_handle is None:
            raise BackendError("IPC handles need a real GPU; the current uvm_lab backend is the simulator")
        start, _ = driver.device_extents(memory)
        handle = ipc_mem_handle(int(start))
        offset = int(memory.handle) - int(start)
        source_info = _numba_cuda.current_context().device.get_device_identity()
        return _IpcHandle(memory, handle, memory.size, source_info, offset=offset)

    def get_memory_info(self) -> tuple[int, int]:
        """Not given, as in RMM: the current resource may be a pool, whose free memory the device's does not show.
        :func:`uvm_lab.available_device_memory` gives the device's."""
        raise NotImplementedError("UvmLabNumbaManager does not report memory info; "
                                  "use uvm_lab.available_device_memory()")

    @property
    def interface_version(self) -> int:
        return 1


# NUMBA_CUDA_MEMORY_MANAGER=uvm_lab.allocators.numba: Numba looks this name up in the module.
_numba_memory_manager = UvmLabNumbaManager
