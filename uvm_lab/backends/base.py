"""The Backend protocol: what a memory resource or a buffer may ask of a device.

Two implementations stand behind it: ``SimBackend`` (a page-level model of the UVM driver,
the default on a machine with no GPU) and, with the ``cuda`` extra, the real CUDA backend.
Everything above this layer (resources, buffers, residency, the Jupyter front ends) is written
against this protocol only, and every change a backend makes to memory is published as events.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

import numpy as np

from ..events.bus import EventBus
from ..events.schema import Advice, MemoryKind
from ..location import Location

__all__ = ["AccessMode", "AccessResult", "Backend", "Capabilities", "RangeAdvice", "gpu_memory"]

AccessMode = Literal["read", "write", "atomic"]


@dataclass(frozen=True)
class AccessResult:
    """What one access (a kernel, or a host loop, over a range) cost.

    On a real GPU the counts are known only from CUPTI's records; without them they are None.
    """

    seconds: float               #: wall time on the backend's clock (simulated time on the simulator)
    faults: int | None           #: page faults taken
    bytes_htod: int | None       #: bytes migrated host to device
    bytes_dtoh: int | None       #: bytes migrated device to host
    bytes_remote: int | None = 0  #: bytes read or written over the link without migrating
    bytes_dtod: int | None = 0    #: bytes migrated from another GPU (a fault on this GPU for a page a peer held)


@dataclass(frozen=True)
class Capabilities:
    """What the device and driver support (``cudaDeviceGetAttribute``)."""

    managed_memory: bool               #: cudaMallocManaged works
    concurrent_managed_access: bool    #: CPU and GPU may touch managed memory at once; prefetch and advice work
    pageable_memory_access: bool       #: the GPU reaches malloc'd memory (HMM or ATS)
    memory_pools: bool                 #: cudaMallocAsync and memory pools


@dataclass(frozen=True)
class RangeAdvice:
    """Advice in force on a whole range, as ``cudaMemRangeGetAttribute`` reports it."""

    read_mostly: bool                   #: True only if every page is ReadMostly
    preferred_location: Location | None #: None if unset or if the pages differ
    accessed_by: tuple[Location, ...]   #: processors mapped to the range wherever it lives
    last_prefetch_location: Location | None


@runtime_checkable
class Backend(Protocol):
    """A device (real or simulated) that allocates, migrates and advises memory."""

    name: str
    bus: EventBus
    capabilities: Capabilities
    #: True for the simulator: its addresses name no real memory, so no other library may use them.
    is_simulated: bool

    def device_count(self) -> int: ...

    def current_device(self) -> int: ...

    def mem_info(self, device: int | None = None) -> tuple[int, int]:
        """``(free, total)`` bytes of ``device``'s memory (the current device when None), as ``cudaMemGetInfo``."""
        ...

    def contexts(self) -> frozenset[int]:
        """The GPUs this process holds a context on: those whose memory can be read without making one (a CUDA
        context costs a GPU hundreds of MiB, and a view must not put one on a GPU the program never used)."""
        ...

    def now_ns(self) -> int:
        """The backend's clock in nanoseconds (simulated time on the simulator)."""
        ...

    def allocate(self, size: int, kind: MemoryKind, *, device: int = 0, stream: int = 0) -> int:
        """Map ``size`` bytes of ``kind`` memory and return its address; emits SEGMENT_ALLOC."""
        ...

    def allocate_system(self, size: int, *, device: int = 0, stream: int = 0) -> int:
        """``malloc`` ``size`` bytes that ``device`` reaches through HMM or ATS
        (``capabilities.pageable_memory_access``); emits SEGMENT_ALLOC as managed memory, which it migrates as."""
        ...

    def free(self, ptr: int, *, stream: int = 0) -> None:
        """Unmap a segment returned by :meth:`allocate` or :meth:`allocate_system`; emits SEGMENT_FREE."""
        ...

    def segment_kind(self, ptr: int) -> MemoryKind | None:
        """The kind of the segment holding ``ptr``, or None if no live segment does."""
        ...

    def prefetch(self, ptr: int, size: int, location: Location, *, stream: int = 0) -> None:
        """``cudaMemPrefetchAsync``: migrate a managed range to ``location``; no-op on other memory."""
        ...

    def advise(self, ptr: int, size: int, advice: Advice, location: Location | None) -> None:
        """``cudaMemAdvise`` on a managed range."""
        ...

    def range_advice(self, ptr: int, size: int) -> RangeAdvice:
        """Read the advice back, as ``cudaMemRangeGetAttribute`` does."""
        ...

    def access(self, ptr: int, size: int, processor: Location, mode: AccessMode, *, stream: int = 0) -> AccessResult:
        """Run an access by ``processor`` to every page of the range (a kernel on a GPU; a loop on the host)."""
        ...

    def lend(self, ptr: int, size: int, device: int) -> None:
        """Say that ``[ptr, ptr + size)``, managed memory of a live allocation, is handed to a library whose
        kernels on GPU ``device`` uvm_lab does not see (torch's, CuPy's, Numba's, through uvm_lab's allocators for
        them). Those kernels may fault pages in from nowhere at any time, unseen by the host watcher too: where
        nothing measures GPU faults, the maps say unknown for the GPU's side of those pages, never "nowhere"."""
        ...

    def host_view(self, ptr: int, size: int) -> np.ndarray:
        """A ``uint8`` NumPy view of managed or pinned memory, without a copy."""
        ...

    def write(self, ptr: int, data: np.ndarray, *, stream: int = 0) -> None:
        """Copy ``data`` (contiguous ``uint8``) from the host into ``[ptr, ptr + data.size)``."""
        ...

    def read(self, ptr: int, out: np.ndarray, *, stream: int = 0) -> None:
        """Copy ``[ptr, ptr + out.size)`` into the host array ``out`` (contiguous ``uint8``)."""
        ...

    def copy(self, dst: int, src: int, size: int, *, stream: int = 0) -> None:
        """``cudaMemcpy`` with ``cudaMemcpyDefault``: ``size`` bytes from ``src`` into ``[dst, dst + size)``, which is
        inside a live allocation of this backend; ``src`` is another such range, or any other memory the copy
        can read (host memory; on a GPU, device memory of other libraries too). Complete when it returns."""
        ...

    def synchronize(self) -> None: ...


def gpu_memory(backend: Backend) -> list[tuple[int, int]]:
    """``(free, total)`` of each GPU of ``backend``, by ordinal, as views show them: ``(0, 0)`` (not read) for a GPU
    the process holds no context on, rather than a context made on it for a picture."""
    read = backend.contexts()
    return [backend.mem_info(d) if d in read else (0, 0) for d in range(backend.device_count())]
