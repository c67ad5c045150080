"""System-allocated memory for HMM and ATS machines: RMM's ``SystemMemoryResource`` and ``SamHeadroomMemoryResource``.

Where the GPU reaches pageable host memory (Linux's HMM on x86 with a recent driver, or ATS on Grace
Hopper: ``cudaDevAttrPageableMemoryAccess``), plain ``malloc`` memory migrates between the host and the
GPU as managed memory does, and prefetch and advice work on it. Elsewhere a GPU cannot touch it, so both
resources refuse to be made there, naming what would work instead.

Where uvm_lab differs: the allocation's events and maps show it as managed memory (its pages follow the
same rules on such machines; the simulator models both alike, on its ``gh200-ats`` platform).
"""

from __future__ import annotations

from ..backends import get_backend
from ..backends.base import Backend
from ..errors import BackendError
from ..events.schema import Advice
from ..location import Location
from ..units import parse_size
from .base import MemoryResource, device_of

__all__ = ["SamHeadroomMemoryResource", "SystemMemoryResource"]

#: RMM's allocation alignment: the headroom split falls on it.
_ALIGNMENT = 256


def _require_pageable_access(backend: Backend, resource: str) -> None:
    if backend.capabilities.pageable_memory_access:
        return
    device = backend.current_device()
    where = (f"simulated device {device} ({backend!r})" if backend.is_simulated
             else f"device {device} of {backend!r}")
    hint = " or simulate one with ul.use_backend('sim', platform='gh200-ats')" if backend.is_simulated else ""
    raise BackendError(
        f"{resource} needs a GPU that reaches pageable host memory (HMM or ATS: cudaDevAttrPageableMemoryAccess), "
        f"which {where} does not have. Use ul.mr.ManagedMemoryResource() for unified memory here{hint}.")


class SystemMemoryResource(MemoryResource):
    """``malloc`` / ``free``: pageable host memory that GPUs reach through HMM or ATS, and that migrates.

    Allocations are 256-byte aligned. As in RMM, a free first waits for the work queued on its stream.

    Raises
    ------
    BackendError
        The current device cannot reach pageable memory (no HMM or ATS): use :class:`ManagedMemoryResource`.
    """

    def __init__(self) -> None:
        backend = get_backend()
        _require_pageable_access(backend, type(self).__name__)
        super().__init__(backend, device_of(backend, None))

    @property
    def is_managed(self) -> bool:
        return True   # it migrates and takes advice, as managed memory does

    def _allocate(self, size: int, stream: int) -> int:
        return self.backend.allocate_system(size, device=self.device_id, stream=stream)

    def _deallocate(self, ptr: int, size: int, stream: int) -> None:
        self.backend.free(ptr, stream=stream)


class SamHeadroomMemoryResource(SystemMemoryResource):
    """System memory that leaves ``headroom`` bytes of the GPU's memory free (RMM's headroom resource).

    Each allocation is ``malloc`` memory. Of it, as much as fits in the device's free memory less
    ``headroom`` (rounded down to 256 bytes) is advised to prefer the GPU; the rest prefers the host. The
    advice is published as ADVICE events after the allocation's own.

    Parameters
    ----------
    headroom
        Bytes of device memory to keep free for other allocations (an int or a string such as ``"2GiB"``).

    Raises
    ------
    InvalidSizeError
        ``headroom`` is not a size.
    BackendError
        The current device cannot reach pageable memory (no HMM or ATS): use :class:`ManagedMemoryResource`.
    """

    def __init__(self, headroom: int | str) -> None:
        self.headroom = parse_size(headroom, name="headroom")
        super().__init__()

    def allocate(self, nbytes: int | str, stream: int | None = None) -> int:
        ptr = super().allocate(nbytes, stream)
        if ptr:
            with self._lock:
                size = self._live[ptr][0]
            try:
                self._advise(ptr, size)
            except BaseException:
                super().deallocate(ptr, size, stream)   # all or nothing
                raise
        return ptr

    def _advise(self, ptr: int, size: int) -> None:
        free = self.backend.mem_info(self.device_id)[0]
        allocatable = max(free - self.headroom, 0)
        gpu = min(allocatable, size) // _ALIGNMENT * _ALIGNMENT
        if gpu:
            self.backend.advise(ptr, gpu, Advice.SET_PREFERRED_LOCATION, Location.device(self.device_id))
        if size - gpu:
            self.backend.advise(ptr + gpu, size - gpu, Advice.SET_PREFERRED_LOCATION, Location.host())

    def __repr__(self) -> str:
        return f"SamHeadroomMemoryResource(headroom={self.headroom})"
