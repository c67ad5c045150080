"""CudaBackend: a real NVIDIA GPU, through cuda-python's runtime bindings.

This is the only module of uvm_lab that imports ``cuda.*``. Every runtime call goes through one
gate, :func:`check`, which turns CUDA's ``(error, value)`` tuples into a value or a
:class:`~uvm_lab.errors.CudaError` named after the CUDA error. CUDA 13's forms are used:
``cudaMemPrefetchAsync(ptr, n, cudaMemLocation, flags, stream)`` and ``cudaMemAdvise(ptr, n, advice,
cudaMemLocation)``.

The backend publishes allocator, prefetch and advice events. Faults and migrations happen in the
driver; they reach the event stream through CUPTI's unified-memory counters (``uvm_lab.tracing``),
so without that source ``touch`` reports its time but no fault or byte counts. What the backend knows
without them it publishes, so that maps stay true with tracing off:

- a prefetch is published once it completes (an event recorded behind it on its stream, polled off the
  caller's thread and whenever the bus is read), as PREFETCH with ``PREFETCH_IMPLIES_MOVES`` where nothing
  measures its migrations: the residency tracker then places its pages and publishes the moves;
- a kernel or copy over managed pages that no fault record describes is UNOBSERVED: those pages' GPU
  side becomes unknown until the host watcher (``uvm_lab.tracing.watcher``) settles it;
- unsetting ReadMostly collapses duplicated pages where the driver chooses: UNOBSERVED too;
- memory lent to another library's kernels (:meth:`CudaBackend.lend`, by uvm_lab's allocators for CuPy, Numba
  and torch): UNOBSERVED once a page, since those kernels may fault it in from nowhere unseen.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
import time
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np

from ..errors import BackendError, CudaError, DoubleFreeError, InvalidArgumentError, OutOfMemoryError
from ..events.accesses import range_record
from ..events.bus import EventBus, get_bus, new_alloc_id
from ..events.schema import (
    NO_PROCESSOR,
    PREFETCH_IMPLIES_MOVES,
    AccessType,
    Advice,
    EventKind,
    MemoryKind,
    UnobservedCause,
    record_of,
)
from ..events.sources import capture
from ..location import HOST_ID, Location
from ..units import PAGE_SIZE, format_bytes, parse_size
from .base import AccessMode, AccessResult, Capabilities, RangeAdvice

try:
    from cuda.bindings import driver as cuda_driver
    from cuda.bindings import runtime as cudart
except ImportError:  # the cuda extra is not installed
    cudart = cuda_driver = None

__all__ = ["CudaBackend", "check"]

_INVALID_DEVICE = -2   # cudaInvalidDeviceId

#: Copies into managed memory of at least two chunks are pipelined, chunk by chunk (see ``write``).
COPY_CHUNK = 64 << 20

#: Completed prefetches' events kept for reuse, at most (a loop of prefetches needs no more than it has in flight).
_IDLE_EVENTS = 64

#: ``handles=`` names for :meth:`CudaBackend.create_async_pool`, as ``cudaMemAllocationHandleType`` bits.
POOL_HANDLE_TYPES = {"posix_file_descriptor": 0x1, "fabric": 0x8}


def check(result: Any) -> Any:
    """``(cudaError_t, *values)`` -> the value(s), or raise :class:`CudaError` naming the error."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != cudart.cudaError_t.cudaSuccess:
        code = int(err)
        name = err.name if hasattr(err, "name") else str(code)
        _, text = cudart.cudaGetErrorString(err)
        message = text.decode() if isinstance(text, bytes) else str(text)
        exc_type = OutOfMemoryError if err == cudart.cudaError_t.cudaErrorMemoryAllocation else CudaError
        if exc_type is OutOfMemoryError:
            raise OutOfMemoryError(f"{name}: {message}")
        raise CudaError(f"{name}: {message}", name=name, code=code)
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


_LIBC: Any = None


def _libc() -> Any:
    """The C library, for system-allocated memory (``posix_memalign`` / ``free``)."""
    global _LIBC
    if _LIBC is None:
        libc = ctypes.CDLL(None)
        libc.posix_memalign.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_size_t]
        libc.posix_memalign.restype = ctypes.c_int
        libc.free.argtypes = [ctypes.c_void_p]
        libc.free.restype = None
        _LIBC = libc
    return _LIBC


def _location(loc: Location) -> Any:
    out = cudart.cudaMemLocation()
    if loc.is_host:
        out.type = cudart.cudaMemLocationType.cudaMemLocationTypeHost
        out.id = 0
    else:
        out.type = cudart.cudaMemLocationType.cudaMemLocationTypeDevice
        out.id = loc.id
    return out


_TOUCH_SOURCE = r"""
extern "C" __global__ void uvm_lab_touch(unsigned long long address, unsigned long long n, int mode,
                                         unsigned int* sink) {
    // Every byte of [address, address + n): read it, write it back unchanged, or add 0 atomically.
    unsigned char* p = (unsigned char*)address;
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned int acc = 0;
    if (mode == 0) {
        for (; i < n; i += stride) acc += p[i];
        if (acc == 0xFFFFFFFFu) atomicAdd(sink, 1u);   // keeps the reads from being optimised away
    } else if (mode == 1) {
        volatile unsigned char* v = p;
        for (; i < n; i += stride) v[i] = v[i];
    } else {
        // 32-bit atomics on the aligned words inside the range
        unsigned long long first = (address + 3) & ~3ull, last = (address + n) & ~3ull;
        unsigned long long words = last > first ? (last - first) / 4 : 0;
        unsigned int* w = (unsigned int*)first;
        for (; i < words; i += stride) atomicAdd(w + i, 0u);
    }
}
"""
_MODES = {"read": 0, "write": 1, "atomic": 2}
#: The access type of each mode: an UNOBSERVED record carries it in ``value``, an ACCESS record in ``flags``.
_ACCESS = {"read": AccessType.READ, "write": AccessType.WRITE, "atomic": AccessType.ATOMIC}


class _Prefetch(NamedTuple):
    """A prefetch issued and not yet seen complete."""

    event: Any      # recorded on its stream right behind it
    device: int     # the event's (the stream's) device
    ptr: int
    size: int
    dst: int
    seg_id: int
    start: int      # when it was issued, on the backend's clock
    stream: int
    flags: int      # PREFETCH_IMPLIES_MOVES where nothing measures its migrations
    source: int     # the user's line that asked for it (uvm_lab.events.sources)


def _measured(what: str, device: int) -> bool:
    """Whether a running CUPTI collector records ``what`` ("transfers" or "kernels") on ``device``."""
    from ..tracing.cupti import measures

    return measures(what, device)


def _capabilities_of(device: int) -> Capabilities:
    attr = cudart.cudaDeviceAttr

    def flag(a: Any) -> bool:
        return bool(check(cudart.cudaDeviceGetAttribute(a, device)))

    return Capabilities(
        managed_memory=flag(attr.cudaDevAttrManagedMemory),
        concurrent_managed_access=flag(attr.cudaDevAttrConcurrentManagedAccess),
        pageable_memory_access=flag(attr.cudaDevAttrPageableMemoryAccess),
        memory_pools=flag(attr.cudaDevAttrMemoryPoolsSupported),
    )


def _name_of(device: int) -> str:
    name = check(cudart.cudaGetDeviceProperties(device)).name
    return name.decode(errors="replace").rstrip("\x00") if isinstance(name, bytes) else str(name)


class CudaBackend:
    """The CUDA devices of this process, with unified memory.

    ``device`` is the current one: resources made without a ``device=`` allocate there, and it is
    where "gpu" means. Every other GPU is reached by naming it: ``ManagedMemoryResource(device=1)``,
    ``buf.prefetch("gpu:1")``, ``reinitialize(devices=[0, 1])``. Calls for another device make it
    current for the call only, as RMM's per-device resources do.

    Parameters
    ----------
    device
        The current device's ordinal (made current, and its primary context created).
    bus
        Where events go; the process-wide bus by default.
    """

    name = "cuda"
    is_simulated = False

    @classmethod
    def is_available(cls) -> bool:
        """True where cuda-python is installed and at least one GPU answers."""
        if cudart is None:
            return False
        try:
            return int(check(cudart.cudaGetDeviceCount())) > 0
        except Exception:
            return False

    def __init__(self, device: int = 0, *, bus: EventBus | None = None) -> None:
        if cudart is None:
            raise BackendError("cuda-python is not installed: pip install 'uvm_lab[cuda]'")
        count = int(check(cudart.cudaGetDeviceCount()))
        if isinstance(device, bool) or not isinstance(device, int) or not 0 <= device < count:
            raise InvalidArgumentError(f"device must be 0..{count - 1}, got {device!r}", value=device,
                                       expected=f"0..{count - 1}")
        check(cudart.cudaSetDevice(device))
        check(cudart.cudaFree(0))   # create the primary context now (CUPTI needs it before it is enabled)
        self.bus = bus if bus is not None else get_bus()
        self._device = device
        self._count = count
        self._segments: dict[int, tuple[int, MemoryKind, int]] = {}   # ptr -> (size, kind, segment id)
        self._homes: dict[int, int] = {}     # ptr -> the device that was current when it was allocated
        self._lent: dict[int, np.ndarray] = {}   # segment id -> its pages lent to other libraries' kernels (lend)
        self._system: set[int] = set()       # segments from malloc (allocate_system), freed with free()
        self._lock = threading.RLock()
        self._kernel: Any = None
        self._contexts = {device}            # devices whose primary context this backend has made
        self._pools: dict[int, Any] = {}     # handle -> cudaMemPool_t, for pools this backend created
        self._side_stream: int | None = None  # where copies into managed memory prefetch ahead of themselves
        self._prefetches: list[_Prefetch] = []   # issued, not yet seen complete, in issue order
        self._idle_events: list[tuple[int, Any]] = []   # (device, event) to record behind the next prefetch
        self._prefetch_lock = threading.Lock()
        self._prefetch_wake = threading.Event()
        self._poller: threading.Thread | None = None
        self._capabilities = [_capabilities_of(d) for d in range(count)]
        #: What the current device can do (``capabilities_of(d)`` for another).
        self.capabilities = self._capabilities[device]
        self._names = [_name_of(d) for d in range(count)]
        self.device_name = self._names[device]

    def __repr__(self) -> str:
        return f"CudaBackend(device={self._device}, name={self.device_name!r})"

    # -- identity and clock ---------------------------------------------------------------------------
    def device_count(self) -> int:
        return self._count

    def contexts(self) -> frozenset[int]:
        with self._lock:
            return frozenset(self._contexts)

    def current_device(self) -> int:
        return self._device

    def capabilities_of(self, device: int) -> Capabilities:
        """What ``device`` can do (managed memory, concurrent access, memory pools ...)."""
        return self._capabilities[self._ordinal(device)]

    def _ordinal(self, device: object) -> int:
        if isinstance(device, bool) or not isinstance(device, (int, np.integer)) or not 0 <= device < self._count:
            raise InvalidArgumentError(f"device must be a device ordinal 0..{self._count - 1}, got {device!r}",
                                       value=device, expected=f"0..{self._count - 1}")
        return int(device)

    @contextlib.contextmanager
    def _on(self, device: int) -> Iterator[None]:
        """Make ``device`` current for the calls inside (the runtime's current device is per thread)."""
        device = self._ordinal(device)
        before = int(check(cudart.cudaGetDevice()))
        if before == device:
            yield
            return
        check(cudart.cudaSetDevice(device))
        try:
            if device not in self._contexts:
                check(cudart.cudaFree(0))     # its primary context, made once
                self._contexts.add(device)
            yield
        finally:
            check(cudart.cudaSetDevice(before))

    # The builtin itself, not a method around it: every allocator event reads the clock.
    now_ns = staticmethod(time.perf_counter_ns)

    def synchronize(self) -> None:
        """``cudaDeviceSynchronize`` on every device this backend has used; completed prefetches are then published."""
        for device in sorted(self._contexts):
            with self._on(device):
                check(cudart.cudaDeviceSynchronize())
        self.poll_prefetches()

    # -- streams ---------------------------------------------------------------------------------------
    def create_stream(self) -> int:
        """``cudaStreamCreate``: a new stream on the current device, as an int handle."""
        return int(check(cudart.cudaStreamCreate()))

    def destroy_stream(self, handle: int) -> None:
        check(cudart.cudaStreamDestroy(handle))

    def synchronize_stream(self, handle: int) -> None:
        check(cudart.cudaStreamSynchronize(handle))
        self.poll_prefetches()

    def mem_info(self, device: int | None = None) -> tuple[int, int]:
        with self._on(self._device if device is None else device):
            free, total = check(cudart.cudaMemGetInfo())
        return int(free), int(total)

    # -- mapping -----------------------------------------------------------------------------------------
    def allocate(self, size: int, kind: MemoryKind, *, device: int | None = None, stream: int = 0) -> int:
        """Allocate on ``device`` (the current one when None); pinned host memory belongs to no device."""
        size = parse_size(size, allow_zero=False)
        kind = MemoryKind(kind)
        device = self._device if device is None or kind is MemoryKind.PINNED_HOST else self._ordinal(device)
        with self._lock, self._on(device):
            try:
                if kind is MemoryKind.MANAGED:
                    self._require("managed_memory", "cudaMallocManaged", device)
                    ptr = int(check(cudart.cudaMallocManaged(size, cudart.cudaMemAttachGlobal)))
                elif kind is MemoryKind.DEVICE:
                    ptr = int(check(cudart.cudaMalloc(size)))
                else:
                    ptr = int(check(cudart.cudaMallocHost(size)))
            except OutOfMemoryError as exc:
                free, total = self.mem_info(device)
                raise OutOfMemoryError(f"cannot allocate {format_bytes(size)} of {kind.name.lower()} memory on "
                                       f"device {device}: {exc}; {format_bytes(free)} of {format_bytes(total)} free",
                                       size=size, free=free, limit=total) from None
            seg_id = new_alloc_id()
            self._segments[ptr] = (size, kind, seg_id)
            self._homes[ptr] = device
        now = self.now_ns()
        self.bus.publish(record_of(EventKind.SEGMENT_ALLOC, flags=kind, address=ptr, nbytes=size, alloc_id=seg_id,
                                   dst=HOST_ID if kind is MemoryKind.PINNED_HOST else device, start=now,
                                   end=now, stream=stream, source=capture()))
        return ptr

    def free(self, ptr: int, *, stream: int = 0) -> None:
        with self._lock:
            held = self._segments.get(ptr)
            if held is None:
                raise DoubleFreeError(f"{ptr!r} is not a live allocation of this backend (already freed?)",
                                      ptr=ptr if isinstance(ptr, int) else 0)
            size, kind, seg_id = held
            if ptr in self._system:
                # free() is immediate, unlike cudaFree: the work queued on the stream must finish first (as RMM).
                check(cudart.cudaStreamSynchronize(stream))
                _libc().free(ptr)
                self._system.discard(ptr)
            else:
                with self._on(self._homes[ptr]):
                    check(cudart.cudaFreeHost(ptr) if kind is MemoryKind.PINNED_HOST else cudart.cudaFree(ptr))
            del self._segments[ptr], self._homes[ptr]
            self._lent.pop(seg_id, None)
        now = self.now_ns()
        self.bus.publish(record_of(EventKind.SEGMENT_FREE, flags=kind, address=ptr, nbytes=size, alloc_id=seg_id,
                                   start=now, end=now, stream=stream, source=capture()))

    def allocate_system(self, size: int, *, device: int | None = None, stream: int = 0) -> int:
        """``malloc`` (256-byte aligned) memory that ``device`` reaches through HMM or ATS; published as managed
        memory, which it behaves as there (it migrates, and takes prefetch and advice)."""
        size = parse_size(size, allow_zero=False)
        device = self._device if device is None else self._ordinal(device)
        self._require("pageable_memory_access", "system-allocated memory (malloc) on a GPU", device)
        out = ctypes.c_void_p()
        if _libc().posix_memalign(ctypes.byref(out), 256, size) or not out.value:
            raise OutOfMemoryError(f"cannot allocate {format_bytes(size)} of system memory (posix_memalign failed)",
                                   size=size)
        ptr = int(out.value)
        with self._lock:
            seg_id = new_alloc_id()
            self._segments[ptr] = (size, MemoryKind.MANAGED, seg_id)
            self._homes[ptr] = device
            self._system.add(ptr)
        now = self.now_ns()
        self.bus.publish(record_of(EventKind.SEGMENT_ALLOC, flags=MemoryKind.MANAGED, address=ptr, nbytes=size,
                                   alloc_id=seg_id, dst=device, start=now, end=now, stream=stream, source=capture()))
        return ptr

    def ipc_mem_handle(self, ptr: int) -> Any:
        """``cuIpcGetMemHandle`` of the device allocation starting at ``ptr``: the driver API's handle, which
        Numba's IPC opens in the other process."""
        err, handle = cuda_driver.cuIpcGetMemHandle(cuda_driver.CUdeviceptr(ptr))
        if err != cuda_driver.CUresult.CUDA_SUCCESS:
            name = getattr(err, "name", str(int(err)))
            raise CudaError(f"cuIpcGetMemHandle of {ptr:#x} failed: {name}", name=name, code=int(err))
        return handle

    # -- stream-ordered pools (cudaMallocAsync) --------------------------------------------------------

    def create_async_pool(self, *, device: int, release_threshold: int | None, handles: tuple[str, ...] = ()) -> int:
        """``cudaMemPoolCreate``: a memory pool of device memory that the caller owns, as an int handle.

        ``release_threshold=None`` keeps every reserved byte (RMM's default: the maximum uint64);
        ``handles`` makes the pool's memory exportable to other processes (``"posix_file_descriptor"``)
        or nodes (``"fabric"``).

        Raises
        ------
        BackendError
            The device has no memory pools, or cannot export the handle types asked for.
        """
        device = self._ordinal(device)
        self._require("memory_pools", "cudaMemPoolCreate", device)
        bits = 0
        for name in handles:
            bits |= POOL_HANDLE_TYPES[name]
        if bits:
            supported = int(check(cudart.cudaDeviceGetAttribute(
                cudart.cudaDeviceAttr.cudaDevAttrMemoryPoolSupportedHandleTypes, device)))
            missing = [name for name in handles if not supported & POOL_HANDLE_TYPES[name]]
            if missing:
                raise BackendError(f"{self.device_name} cannot export memory-pool handles of type "
                                   f"{', '.join(missing)} (the device supports handle bits {supported:#x})")
        props = cudart.cudaMemPoolProps()
        props.allocType = cudart.cudaMemAllocationType.cudaMemAllocationTypePinned
        props.handleTypes = cudart.cudaMemAllocationHandleType(bits)
        props.location.type = cudart.cudaMemLocationType.cudaMemLocationTypeDevice
        props.location.id = device
        pool = check(cudart.cudaMemPoolCreate(props))
        try:
            threshold = (1 << 64) - 1 if release_threshold is None else release_threshold
            check(cudart.cudaMemPoolSetAttribute(pool, cudart.cudaMemPoolAttr.cudaMemPoolAttrReleaseThreshold,
                                                 cuda_driver.cuuint64_t(threshold)))
        except BaseException:
            check(cudart.cudaMemPoolDestroy(pool))
            raise
        handle = int(pool)
        self._pools[handle] = pool
        return handle

    def destroy_async_pool(self, pool: int) -> None:
        """``cudaMemPoolDestroy`` of a pool from :meth:`create_async_pool` (its memory must be freed)."""
        check(cudart.cudaMemPoolDestroy(self._pools.pop(pool)))

    def async_pool_reserved(self, pool: int) -> int:
        """Bytes the pool holds from the device now (``cudaMemPoolAttrReservedMemCurrent``)."""
        value = check(cudart.cudaMemPoolGetAttribute(self._pools[pool],
                                                     cudart.cudaMemPoolAttr.cudaMemPoolAttrReservedMemCurrent))
        return int(value)

    def trim_async_pool(self, pool: int, keep: int) -> None:
        """``cudaMemPoolTrimTo``: give unused reserved memory back until at most ``keep`` bytes are held."""
        check(cudart.cudaMemPoolTrimTo(self._pools[pool], keep))

    def allocate_async(self, size: int, *, device: int | None = None, stream: int = 0, pool: int | None = None) -> int:
        """``cudaMallocAsync`` (or ``cudaMallocFromPoolAsync`` from ``pool``), ordered on ``stream``."""
        size = parse_size(size, allow_zero=False)
        device = self._device if device is None else self._ordinal(device)
        self._require("memory_pools", "cudaMallocAsync", device)
        with self._lock, self._on(device):
            try:
                if pool is None:
                    ptr = int(check(cudart.cudaMallocAsync(size, stream)))
                else:
                    ptr = int(check(cudart.cudaMallocFromPoolAsync(size, self._pools[pool], stream)))
            except OutOfMemoryError as exc:
                free, total = self.mem_info(device)
                raise OutOfMemoryError(f"cannot allocate {format_bytes(size)} from device {device}'s memory pool: "
                                       f"{exc}",
                                       size=size, free=free, limit=total) from None
            seg_id = new_alloc_id()
            self._segments[ptr] = (size, MemoryKind.DEVICE, seg_id)
            self._homes[ptr] = device
        now = self.now_ns()
        self.bus.publish(record_of(EventKind.SEGMENT_ALLOC, flags=MemoryKind.DEVICE, address=ptr, nbytes=size,
                                   alloc_id=seg_id, dst=device, start=now, end=now, stream=stream,
                                   source=capture()))
        return ptr

    def free_async(self, ptr: int, *, stream: int = 0) -> None:
        """``cudaFreeAsync`` of memory from :meth:`allocate_async`."""
        with self._lock:
            held = self._segments.get(ptr)
            if held is None:
                raise DoubleFreeError(f"{ptr!r} is not a live allocation of this backend (already freed?)",
                                      ptr=ptr if isinstance(ptr, int) else 0)
            with self._on(self._homes[ptr]):
                check(cudart.cudaFreeAsync(ptr, stream))
            del self._segments[ptr], self._homes[ptr]
            self._lent.pop(held[2], None)
        now = self.now_ns()
        self.bus.publish(record_of(EventKind.SEGMENT_FREE, flags=held[1], address=ptr, nbytes=held[0],
                                   alloc_id=held[2], start=now, end=now, stream=stream, source=capture()))

    def async_pool_handle(self, device: int) -> int:
        """The device's default memory pool (``cudaDeviceGetDefaultMemPool``), as an int handle."""
        return int(check(cudart.cudaDeviceGetDefaultMemPool(device)))

    def segment_kind(self, ptr: int) -> MemoryKind | None:
        seg = self._segment_at(ptr)
        return seg[2] if seg is not None else None

    # -- prefetch and advice -------------------------------------------------------------------------------
    def prefetch(self, ptr: int, size: int, location: Location, *, stream: int = 0) -> None:
        """``cudaMemPrefetchAsync`` to the host or any GPU, whatever the current device; published once complete.

        A prefetch to GPU ``d`` runs with ``d`` current (its context made if need be), on ``stream``, or on
        ``d``'s default stream when ``stream`` is 0. The caller is never synchronized: the PREFETCH record
        follows when the work completes (:meth:`poll_prefetches`).
        """
        _, _, kind, seg_id = self._find(ptr, size)
        self._check_location(location)
        if kind is not MemoryKind.MANAGED:
            return   # RMM's behaviour: memory that cannot migrate is left alone
        device = self._device if location.is_host else location.id
        self._require("concurrent_managed_access", "cudaMemPrefetchAsync", device)
        flags = 0 if _measured("transfers", device) else PREFETCH_IMPLIES_MOVES
        issuer = self._stream_device(stream) if stream else device
        start = self.now_ns()
        with self._on(device), self._on(issuer):   # the target's context must exist, and the stream's be current
            check(cudart.cudaMemPrefetchAsync(ptr, size, _location(location), 0, stream))
            event = self._event(issuer)
            check(cudart.cudaEventRecord(event, stream))
        with self._prefetch_lock:
            self._prefetches.append(_Prefetch(event, issuer, ptr, size, location.id, seg_id, start, stream, flags,
                                              capture()))
        self._watch_prefetches()

    def poll_prefetches(self) -> None:
        """Publish every prefetch that has completed, in the order they were issued (never blocks on the GPU)."""
        if not self._prefetches:
            return
        # The bus's lock before this backend's, always: a reader holding the bus's lock polls through its flush hook.
        with self.bus.locked(), self._prefetch_lock:
            if not self._prefetches:
                return
            done: list[_Prefetch] = []
            waiting: list[_Prefetch] = []
            for p in self._prefetches:
                (done if not waiting and self._completed(p.event) else waiting).append(p)
            self._prefetches = waiting
            for p in done:   # a few events are kept for the next prefetches; the rest go
                if len(self._idle_events) < _IDLE_EVENTS:
                    self._idle_events.append((p.device, p.event))
                else:
                    check(cudart.cudaEventDestroy(p.event))
            if not done:
                return
            now = self.now_ns()
            records = [record_of(EventKind.PREFETCH, flags=p.flags, dst=p.dst, address=p.ptr, nbytes=p.size,
                                 alloc_id=p.seg_id, start=p.start, end=now, stream=p.stream, source=p.source)
                       for p in done]
            # Published under the locks, so two pollers cannot publish two prefetches out of order.
            self.bus.publish(np.concatenate(records))

    def pending_prefetches(self) -> int:
        """Prefetches issued and not yet seen complete."""
        with self._prefetch_lock:
            return len(self._prefetches)

    def _completed(self, event: Any) -> bool:
        (err,) = cudart.cudaEventQuery(event)
        if err == cudart.cudaError_t.cudaErrorNotReady:
            return False
        check((err,))   # any other error is the device's, and is raised
        return True

    def _stream_device(self, stream: int) -> int:
        """The device a stream belongs to (``cudaStreamGetDevice``, CUDA 12.8 on; else the current device)."""
        get = getattr(cudart, "cudaStreamGetDevice", None)
        return int(check(get(stream))) if get is not None else int(check(cudart.cudaGetDevice()))

    def _event(self, device: int) -> Any:
        """An event for ``device`` (current), from those completed prefetches gave back, or a new one."""
        with self._prefetch_lock:
            for i, (d, event) in enumerate(self._idle_events):
                if d == device:
                    del self._idle_events[i]
                    return event
        return check(cudart.cudaEventCreateWithFlags(cudart.cudaEventDisableTiming))

    def _watch_prefetches(self) -> None:
        """Make sure something polls: a thread while prefetches are pending, and every read of the bus."""
        with self._prefetch_lock:
            if self._poller is None:
                self.bus.add_flush_hook(self.poll_prefetches)
                self._poller = threading.Thread(target=self._poll_periodically, name="uvm_lab-prefetch-poll",
                                                daemon=True)
                self._poller.start()
        self._prefetch_wake.set()

    def _poll_periodically(self) -> None:
        while True:
            self._prefetch_wake.wait()
            self._prefetch_wake.clear()
            while self.pending_prefetches():
                time.sleep(0.001)
                try:
                    self.poll_prefetches()
                except Exception:   # the poller must not die silently mid-run
                    import logging

                    logging.getLogger("uvm_lab.backends").exception("polling prefetches failed")
                    break

    def _unobserved(self, ptr: int, size: int, cause: UnobservedCause, device: int, seg_id: int, *,
                    mode: AccessMode | None = None, unless: str | None = None, flush: bool = True) -> None:
        """Pages that ``device`` worked on where no record shows what moved (see the module docstring); nothing
        where a running CUPTI collector records ``unless`` (:func:`uvm_lab.tracing.measures`) on ``device``.
        ``flush``: CUPTI's records of the same work, if any, are published first (not for work yet to come)."""
        if unless is not None and _measured(unless, self._device if device == HOST_ID else device):
            return
        if flush:
            self.bus.flush(wait=False)
        now = self.now_ns()
        self.bus.publish(record_of(EventKind.UNOBSERVED, flags=cause, dst=device, address=ptr, nbytes=size,
                                   value=_ACCESS[mode] if mode else 0, alloc_id=seg_id, start=now, end=now,
                                   source=capture()))

    def lend(self, ptr: int, size: int, device: int) -> None:
        base, seg_size, kind, seg_id = self._find(ptr, size)
        self._check_location(Location.device(device))
        if kind is not MemoryKind.MANAGED or size == 0 or _measured("kernels", device):
            return
        # What a library's kernels do unseen that the host watcher cannot see either is a first touch: a page
        # faulted in from nowhere. Once marked, a page is never nowhere again while its segment lives (a pool
        # lends the same pages over and over), so each page is marked once: one record, not one per tensor.
        first, stop = (ptr - base) // PAGE_SIZE, -(-(ptr + size - base) // PAGE_SIZE)
        with self._lock:
            lent = self._lent.get(seg_id)
            if lent is None:
                lent = self._lent[seg_id] = np.zeros(-(-seg_size // PAGE_SIZE), dtype=bool)
            if lent[first:stop].all():
                return
            lent[first:stop] = True
        self._unobserved(ptr, size, UnobservedCause.KERNEL, device, seg_id, flush=False)

    def advise(self, ptr: int, size: int, advice: Advice, location: Location | None) -> None:
        advice = Advice(advice)
        _, _, kind, seg_id = self._find(ptr, size)
        if kind is not MemoryKind.MANAGED:
            raise BackendError(f"memory advice applies to managed memory only; the range at {ptr:#x} is "
                               f"{kind.name.lower()} memory")
        self._require("concurrent_managed_access", "cudaMemAdvise",
                      self._device if location is None or location.is_host else location.id)
        needs = advice in (Advice.SET_PREFERRED_LOCATION, Advice.SET_ACCESSED_BY, Advice.UNSET_ACCESSED_BY)
        if needs and location is None:
            raise InvalidArgumentError(f"{advice.name} needs a location", value=None, expected='"host" or a device')
        if location is not None:
            self._check_location(location)
        target = location if location is not None else Location.device(self._device)
        check(cudart.cudaMemAdvise(ptr, size, cudart.cudaMemoryAdvise(int(advice)), _location(target)))
        now = self.now_ns()
        self.bus.publish(record_of(EventKind.ADVICE, flags=advice, dst=location.id if needs and location else
                                   NO_PROCESSOR, address=ptr, nbytes=size, alloc_id=seg_id, start=now, end=now,
                                   source=capture()))
        if advice is Advice.UNSET_READ_MOSTLY:   # duplicates collapse to one copy, where the driver chooses
            self._unobserved(ptr, size, UnobservedCause.COLLAPSE, NO_PROCESSOR, seg_id)

    def range_advice(self, ptr: int, size: int) -> RangeAdvice:
        _, _, kind, _ = self._find(ptr, size)
        if kind is not MemoryKind.MANAGED:
            return RangeAdvice(False, None, (), None)
        attr = cudart.cudaMemRangeAttribute

        def one(a: Any) -> int:
            return int(check(cudart.cudaMemRangeGetAttribute(4, a, ptr, size)))

        def loc(value: int) -> Location | None:
            return None if value == _INVALID_DEVICE else Location(value)

        slots = self._count + 1
        raw = check(cudart.cudaMemRangeGetAttribute(4 * slots, attr.cudaMemRangeAttributeAccessedBy, ptr, size))
        ids = list(raw) if isinstance(raw, (list, tuple)) else np.frombuffer(bytes(raw), dtype=np.int32).tolist()
        accessed = tuple(sorted(Location(int(i)) for i in ids if int(i) != _INVALID_DEVICE))
        return RangeAdvice(read_mostly=bool(one(attr.cudaMemRangeAttributeReadMostly)),
                           preferred_location=loc(one(attr.cudaMemRangeAttributePreferredLocation)),
                           accessed_by=accessed,
                           last_prefetch_location=loc(one(attr.cudaMemRangeAttributeLastPrefetchLocation)))

    # -- access ------------------------------------------------------------------------------------------------
    def access(self, ptr: int, size: int, processor: Location, mode: AccessMode, *, stream: int = 0) -> AccessResult:
        if mode not in _MODES:
            raise InvalidArgumentError(f"mode must be one of {sorted(_MODES)}, got {mode!r}", value=mode,
                                       expected=", ".join(_MODES))
        _, _, kind, seg_id = self._find(ptr, size)
        self._check_location(processor)
        if processor.is_host and kind is MemoryKind.DEVICE:
            raise BackendError("the host cannot access device memory (cudaMalloc); use managed or pinned host "
                               "memory, or copy it")
        if self.bus.wants_accesses:   # for a recording that replays it (uvm_lab.trace_replay); before its faults
            self.bus.publish(range_record(ptr, size, processor.id, _ACCESS[mode], alloc_id=seg_id,
                                          stream=stream, start=self.now_ns()))
        if processor.is_host:
            self.synchronize()   # without concurrent access the host may touch managed memory only when idle
            start = time.perf_counter()
            self._host_touch(ptr, size, mode)
            seconds = time.perf_counter() - start
            if kind is MemoryKind.MANAGED:
                self._unobserved(ptr, size, UnobservedCause.HOST, HOST_ID, seg_id, mode=mode, unless="host")
            return AccessResult(seconds, None, None, None, None, None)
        start = time.perf_counter()
        with self._on(processor.id):
            self._gpu_touch(ptr, size, mode, stream)
        seconds = time.perf_counter() - start
        if kind is MemoryKind.MANAGED:
            self._unobserved(ptr, size, UnobservedCause.KERNEL, processor.id, seg_id, mode=mode, unless="kernels")
        return AccessResult(seconds, None, None, None, None, None)

    def host_view(self, ptr: int, size: int) -> np.ndarray:
        """A NumPy ``uint8`` view of host-accessible memory (managed or pinned), no copy."""
        _, _, kind, _ = self._find(ptr, size)
        if kind is MemoryKind.DEVICE:
            raise BackendError("device memory (cudaMalloc) has no host view; copy it to the host instead")
        return np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(ptr))

    def write(self, ptr: int, data: np.ndarray, *, stream: int = 0) -> None:
        _, _, kind, seg_id = self._find(ptr, data.size)
        if not data.size:
            return
        if kind is MemoryKind.MANAGED and data.size >= 2 * COPY_CHUNK and self._lands_on_device(ptr, data.size):
            start = self.now_ns()
            flags = 0 if _measured("transfers", self._device) else PREFETCH_IMPLIES_MOVES
            self._pipelined_write(ptr, data, stream)
            check(cudart.cudaStreamSynchronize(stream))
            self.bus.publish(record_of(EventKind.PREFETCH, flags=flags, dst=self._device, address=ptr,
                                       nbytes=data.size, alloc_id=seg_id, start=start, end=self.now_ns(),
                                       stream=self._side_stream or 0, source=capture()))
        else:
            check(cudart.cudaMemcpyAsync(ptr, data.ctypes.data, data.size, cudart.cudaMemcpyKind.cudaMemcpyDefault,
                                         stream))
            check(cudart.cudaStreamSynchronize(stream))
        if kind is MemoryKind.MANAGED:
            self._unobserved(ptr, data.size, UnobservedCause.COPY, self._device, seg_id, mode="write",
                             unless="kernels")

    def _lands_on_device(self, ptr: int, size: int) -> bool:
        """Whether a copy into managed memory should bring it to the GPU (not when the host is preferred)."""
        preferred = int(check(cudart.cudaMemRangeGetAttribute(
            4, cudart.cudaMemRangeAttribute.cudaMemRangeAttributePreferredLocation, ptr, size)))
        return preferred != HOST_ID and self.capabilities.concurrent_managed_access

    def _pipelined_write(self, ptr: int, data: np.ndarray, stream: int) -> None:
        # A copy into managed pages that are not on the GPU runs through the driver's fault path (2.4x
        # slower than a pinned copy on an H100). Prefetching each chunk first populates it on the GPU;
        # doing that on a side stream, one chunk ahead of the copy, hides it behind the copy before.
        with self._lock:
            if self._side_stream is None:
                self._side_stream = int(check(cudart.cudaStreamCreateWithFlags(cudart.cudaStreamNonBlocking)))
            side = self._side_stream
        here = _location(Location(self._device))
        events = []
        try:
            for offset in range(0, data.size, COPY_CHUNK):
                n = min(COPY_CHUNK, data.size - offset)
                event = check(cudart.cudaEventCreateWithFlags(cudart.cudaEventDisableTiming))
                events.append(event)
                check(cudart.cudaMemPrefetchAsync(ptr + offset, n, here, 0, side))
                check(cudart.cudaEventRecord(event, side))
                check(cudart.cudaStreamWaitEvent(stream, event, 0))
                check(cudart.cudaMemcpyAsync(ptr + offset, data.ctypes.data + offset, n,
                                             cudart.cudaMemcpyKind.cudaMemcpyDefault, stream))
        finally:
            for event in events:
                check(cudart.cudaEventDestroy(event))   # released by the driver once the stream passes it

    def read(self, ptr: int, out: np.ndarray, *, stream: int = 0) -> None:
        _, _, kind, seg_id = self._find(ptr, out.size)
        if out.size:
            check(cudart.cudaMemcpyAsync(out.ctypes.data, ptr, out.size, cudart.cudaMemcpyKind.cudaMemcpyDefault,
                                         stream))
            check(cudart.cudaStreamSynchronize(stream))
            if kind is MemoryKind.MANAGED:
                self._unobserved(ptr, out.size, UnobservedCause.COPY, self._device, seg_id, mode="read",
                                 unless="kernels")

    def copy(self, dst: int, src: int, size: int, *, stream: int = 0) -> None:
        """``cudaMemcpyAsync(dst, src, size, cudaMemcpyDefault)`` on ``stream``, waited for. ``src`` may be any
        address unified addressing knows: this backend's, another library's device memory, or host memory."""
        _, _, kind, seg_id = self._find(dst, size)
        source = self._segment_at(src)
        if source is not None:
            self._find(src, size)
        if not size:
            return
        check(cudart.cudaMemcpyAsync(dst, src, size, cudart.cudaMemcpyKind.cudaMemcpyDefault, stream))
        check(cudart.cudaStreamSynchronize(stream))
        if source is not None and source[2] is MemoryKind.MANAGED:
            self._unobserved(src, size, UnobservedCause.COPY, self._device, source[3], mode="read", unless="kernels")
        if kind is MemoryKind.MANAGED:
            self._unobserved(dst, size, UnobservedCause.COPY, self._device, seg_id, mode="write", unless="kernels")

    def _host_touch(self, ptr: int, size: int, mode: AccessMode) -> None:
        # One access per 4 KiB page, as a host loop over the buffer: enough to fault every page in.
        view = self.host_view(ptr, size)
        first = (-ptr) % PAGE_SIZE
        offsets = np.arange(first, size, PAGE_SIZE)
        if first:
            offsets = np.concatenate(([0], offsets))
        if mode == "read":
            int(view[offsets].sum(dtype=np.uint64))
        else:
            view[offsets] = view[offsets]   # write each page back unchanged

    def _gpu_touch(self, ptr: int, size: int, mode: AccessMode, stream: int) -> None:
        import cupy  # the kernel is compiled by CuPy (part of the cuda extra)

        if self._kernel is None:
            self._kernel = cupy.RawKernel(_TOUCH_SOURCE, "uvm_lab_touch")
        sink = cupy.zeros(1, dtype=cupy.uint32)
        threads = 256
        blocks = int(min(max(1, -(-size // threads)), 132 * 32))
        with cupy.cuda.ExternalStream(stream) if stream else cupy.cuda.Stream.null:
            self._kernel((blocks,), (threads,), (np.uint64(ptr), np.uint64(size), np.int32(_MODES[mode]), sink))
        check(cudart.cudaStreamSynchronize(stream))

    # -- lookups and checks ------------------------------------------------------------------------------
    def _segment_at(self, ptr: int) -> tuple[int, int, MemoryKind, int] | None:
        if isinstance(ptr, bool) or not isinstance(ptr, (int, np.integer)):
            return None
        with self._lock:
            for base, (size, kind, seg_id) in self._segments.items():
                if base <= ptr < base + size:
                    return base, size, kind, seg_id
        return None

    def _find(self, ptr: int, size: int) -> tuple[int, int, MemoryKind, int]:
        seg = self._segment_at(ptr)
        if seg is None or size < 0 or ptr + size > seg[0] + seg[1]:
            raise InvalidArgumentError(
                f"the range {ptr!r} + {size!r} bytes is not inside a live allocation of this backend",
                value=ptr, expected="an address range returned by allocate and not yet freed")
        return seg

    def _check_location(self, location: Location) -> None:
        if not isinstance(location, Location):
            raise InvalidArgumentError(f"expected a Location, got {location!r}", value=location,
                                       expected="uvm_lab.Location")
        if not location.is_host and not 0 <= location.id < self._count:
            raise InvalidArgumentError(f"this machine has devices 0..{self._count - 1}; got {location}",
                                       value=location, expected=f'"host" or "gpu:0".."gpu:{self._count - 1}"')

    def _require(self, capability: str, call: str, device: int | None = None) -> None:
        device = self._device if device is None else device
        if not getattr(self._capabilities[device], capability):
            raise BackendError(f"{call} needs {capability.replace('_', ' ')}, which device {device} "
                               f"({self._names[device]}) does not have")
