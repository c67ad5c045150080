"""SimBackend: a simulated GPU with unified memory, behind the same protocol as the real one.

The model follows the NVIDIA UVM driver's rules where they decide residency (research notes R1-R11):

- pages are 4 KiB, GPU memory is allocated in 2 MiB root chunks and evicted a whole chunk at a time,
  FIFO by the last migration into it (``eviction="lru"`` and ``"tree"`` are what-if policies);
- GPU faults are batched (256 after de-duplication, one replay per batch); each faulting page goes where
  R3's ordered rules say (ReadMostly, PreferredLocation, thrash pins, first touch, AccessedBy);
- what moves grows by the driver's 51% density-tree prefetcher; thrashing between processors is
  detected, throttled and pinned with the driver's constants; prefetch requests evict like faults do;
- on x86 the CPU cannot map GPU memory, so a host access always migrates; ``gh200-ats`` can.

Costs come from a :class:`Platform` profile and advance a simulated clock; every change is published
as the same records the CUDA backend emits, so residency maps and traces are built the same way.
Beyond the protocol, :meth:`SimBackend.access_stream` runs an arbitrary access stream (the workloads
of :mod:`uvm_lab.workloads`), and the clock, traces and page states depend on nothing but the calls
made, so the same calls give the same trace.
"""

from __future__ import annotations

import bisect
import ctypes
import errno
import os
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from ...errors import BackendError, DoubleFreeError, InvalidArgumentError, OutOfMemoryError, shown
from ...events.accesses import range_record, stream_header, stream_runs
from ...events.bus import EventBus, get_bus, new_alloc_id
from ...events.schema import NO_PROCESSOR, AccessType, Advice, EventKind, MemoryKind
from ...events.sources import capture
from ...location import HOST_ID, Location
from ...units import BLOCK_SIZE, PAGE_SIZE, format_bytes, parse_size
from ..base import AccessMode, AccessResult, Capabilities, RangeAdvice
from .core import advice_of
from .engine import FaultEngine, StreamStats
from .eviction import EVICTION_POLICIES, GpuMemory
from .model import BLOCK_SHIFT, NO_LOCATION, EventLog, PageTable, Segment, bit
from .platform import Platform, get_platform
from .thrashing import ThrashingDetector

__all__ = ["MAX_DEVICES", "SimBackend"]

_BASE_ADDRESS = 0x7F00_0000_0000           # where simulated mappings start (looks like a GPU VA)
#: The most simulated GPUs: a page's residency is one byte, the host's bit and one bit a device.
MAX_DEVICES = 7
_ACCESS_TYPES = {"read": AccessType.READ, "write": AccessType.WRITE, "atomic": AccessType.ATOMIC}
_STREAM_CHUNK = 1 << 20                    # addresses converted to pages at a time
_TRANSLATE_SLICE = 1 << 15
_PAGE_SHIFT = PAGE_SIZE.bit_length() - 1


class _AddressSpace:
    """One process, one virtual address space: every simulated backend takes its ranges from here, so
    addresses never repeat, even across ``use_backend`` calls (events and maps key on addresses)."""

    def __init__(self) -> None:
        self._next = _BASE_ADDRESS
        self._lock = threading.Lock()

    def reserve(self, size: int) -> int:
        with self._lock:
            address = self._next
            # Mappings start on a VA block and leave a block of gap, as separate mappings do.
            self._next = -(-(address + size + BLOCK_SIZE) // BLOCK_SIZE) * BLOCK_SIZE
            return address


_address_space = _AddressSpace()


class SimBackend:
    """A simulated device: ``device_memory`` bytes of GPU memory on a ``platform``.

    Parameters
    ----------
    device_memory
        GPU memory per device, an int or a string such as ``"16GiB"`` (at least one 2 MiB block).
    platform
        A profile name from :data:`~uvm_lab.backends.sim.platform.PLATFORMS` or a :class:`Platform`.
    bus
        Where events go; the process-wide bus by default.
    eviction
        ``"fifo"`` (the driver: FIFO by last migration into a 2 MiB chunk), or the what-if policies
        ``"lru"`` (least recently accessed chunk) and ``"tree"`` (LRU with tree pre-eviction).
    prefetcher
        The driver's density prefetcher (``uvm_perf_prefetch_enable``); off, faults move 4 KiB pages.
    prefetch_threshold
        ``uvm_perf_prefetch_threshold`` in percent, 1 to 100 (51).
    thrashing
        Thrashing detection, throttling and pinning (``uvm_perf_thrashing_enable``).
    devices
        How many GPUs, each with ``device_memory`` of its own (1 to :data:`MAX_DEVICES`).

    Raises
    ------
    InvalidArgumentError
        For a size below one block, an unknown platform or eviction policy, or a threshold out of range.
    """

    name = "sim"
    is_simulated = True

    def __init__(self, device_memory: int | str = "16GiB", platform: str | Platform = "x86-pcie5", *,
                 bus: EventBus | None = None, eviction: str = "fifo", prefetcher: bool = True,
                 prefetch_threshold: int = 51, thrashing: bool = True, devices: int = 1) -> None:
        memory = parse_size(device_memory, name="device_memory", allow_zero=False)
        if memory < BLOCK_SIZE:
            raise InvalidArgumentError(f"device_memory must be at least 2 MiB (one VA block), got {device_memory!r}",
                                       value=device_memory, expected=">= 2MiB")
        if isinstance(prefetch_threshold, bool) or not isinstance(prefetch_threshold, int) \
                or not 1 <= prefetch_threshold <= 100:
            raise InvalidArgumentError(f"prefetch_threshold must be an int percentage 1..100, got "
                                       f"{prefetch_threshold!r}", value=prefetch_threshold, expected="1..100")
        if isinstance(devices, bool) or not isinstance(devices, int) or not 1 <= devices <= MAX_DEVICES:
            raise InvalidArgumentError(f"devices must be an int from 1 to {MAX_DEVICES}, got {devices!r}",
                                       value=devices, expected=f"1..{MAX_DEVICES}")
        for flag, value in (("prefetcher", prefetcher), ("thrashing", thrashing)):
            if not isinstance(value, bool):
                raise InvalidArgumentError(f"{flag} must be True or False, got {value!r}", value=value,
                                           expected="True or False")
        self.platform = get_platform(platform)
        self.device_memory = memory
        self.bus = bus if bus is not None else get_bus()
        #: A post-Pascal GPU on Linux; malloc'd memory is reachable only on ATS/HMM platforms.
        self.capabilities = Capabilities(managed_memory=True, concurrent_managed_access=True,
                                         pageable_memory_access=self.platform.pageable_memory_access,
                                         memory_pools=True)
        self._devices = devices
        self._now = 0
        self._segments: dict[int, Segment] = {}
        self._starts: list[int] = []
        self._table = PageTable(devices)
        self._memory = GpuMemory(self._table, memory // BLOCK_SIZE, eviction)
        self._thrashing = ThrashingDetector(self._table, enabled=thrashing)
        self._engine = FaultEngine(self._table, self._memory, self.platform, self._thrashing,
                                   prefetch=prefetcher, prefetch_threshold=prefetch_threshold)
        self._lock = threading.RLock()

    def __repr__(self) -> str:
        return (f"SimBackend(device_memory={format_bytes(self.device_memory)!r}, "
                f"platform={self.platform.name!r}, eviction={self._memory.policy!r})")

    @property
    def eviction(self) -> str:
        """The eviction policy in force (one of ``fifo``, ``lru``, ``tree``)."""
        return self._memory.policy

    # -- identity and clock ---------------------------------------------------------------------------
    def device_count(self) -> int:
        return self._devices

    def contexts(self) -> frozenset[int]:
        return frozenset(range(self._devices))   # simulated GPUs cost nothing to read

    def current_device(self) -> int:
        return 0

    def now_ns(self) -> int:
        return self._now

    def synchronize(self) -> None:
        """All simulated work is complete when its call returns."""

    def mem_info(self, device: int | None = None) -> tuple[int, int]:
        self._check_device(0 if device is None else device)
        d = 0 if device is None else device
        return self._memory.free_blocks(d) * BLOCK_SIZE, self._memory.capacity(d) * BLOCK_SIZE

    # -- mapping -----------------------------------------------------------------------------------------
    def allocate(self, size: int, kind: MemoryKind, *, device: int = 0, stream: int = 0) -> int:
        size = parse_size(size, allow_zero=False)
        kind = MemoryKind(kind)
        self._check_device(device)
        with self._lock:
            log = EventLog(self._now)
            mem = self._memory
            if kind is MemoryKind.DEVICE:
                need = -(-size // BLOCK_SIZE)
                if mem.pinned(device) + need > mem.capacity(device):
                    free, total = self.mem_info(device)
                    raise OutOfMemoryError(
                        f"cannot allocate {format_bytes(size)} of device memory on simulated device {device}: "
                        f"{format_bytes(total - mem.pinned(device) * BLOCK_SIZE)} is not held by "
                        f"other device allocations", size=size, free=free, limit=total)
            try:
                seg = Segment(id=new_alloc_id(), address=_address_space.reserve(size), size=size, kind=kind,
                              device=HOST_ID if kind is MemoryKind.PINNED_HOST else device, table=self._table)
            except MemoryError as err:   # the simulator's page table is this process's memory: nothing changed
                free, total = self.mem_info(device)
                raise OutOfMemoryError(
                    f"cannot simulate {format_bytes(size)} ({size} bytes): the simulator keeps each page's state "
                    f"in this process's memory, and {-(-size // PAGE_SIZE):,} pages do not fit",
                    size=size, free=free, limit=total) from err
            if kind is MemoryKind.DEVICE:
                self._engine.make_room(device, need, log)
                mem.pin(device, need)
            self._segments[seg.address] = seg
            bisect.insort(self._starts, seg.address)
            log.add(EventKind.SEGMENT_ALLOC, flags=kind, dst=seg.device, address=seg.address, nbytes=size,
                    alloc_id=seg.id, stream=stream)
            self._finish(log)
            return seg.address

    def allocate_system(self, size: int, *, device: int = 0, stream: int = 0) -> int:
        """``malloc`` memory on an HMM or ATS platform: the model's pages follow the managed rules, so it is
        a managed segment. Elsewhere a :class:`BackendError`: the simulated GPU cannot reach it."""
        if not self.capabilities.pageable_memory_access:
            raise BackendError(f"the simulated GPU on platform {self.platform.name!r} cannot reach pageable host "
                               f"memory (no HMM or ATS); platform 'gh200-ats' can")
        return self.allocate(size, MemoryKind.MANAGED, device=device, stream=stream)

    def free(self, ptr: int, *, stream: int = 0) -> None:
        with self._lock:
            seg = self._segments.get(ptr)
            if seg is None:
                raise DoubleFreeError(f"{ptr!r} is not the address of a live simulated allocation "
                                      f"(already freed, or never allocated here)",
                                      ptr=ptr if isinstance(ptr, int) else 0)
            if seg.kind is MemoryKind.DEVICE:
                self._memory.pin(seg.device, -seg.nblocks)
            first = seg.base >> BLOCK_SHIFT
            self._memory.release(first, seg.nblocks)
            self._thrashing.forget(first, seg.nblocks)
            self._table.release(seg.base, seg.npages)
            del self._segments[ptr]
            self._starts.remove(ptr)
            log = EventLog(self._now)
            log.add(EventKind.SEGMENT_FREE, flags=seg.kind, dst=seg.device, address=seg.address, nbytes=seg.size,
                    alloc_id=seg.id, stream=stream)
            self._finish(log)

    def segment_kind(self, ptr: int) -> MemoryKind | None:
        seg = self._segment_at(ptr)
        return seg.kind if seg is not None else None

    def segments(self) -> list[dict[str, Any]]:
        """Plain data about each live mapping (for status displays)."""
        with self._lock:
            return [{"id": s.id, "address": s.address, "size": s.size, "kind": s.kind.name.lower(),
                     "gpu_blocks": int(s.gpu_blocks.sum())} for s in self._segments.values()]

    def page_states(self, ptr: int, size: int) -> np.ndarray:
        """A copy of the simulator's own residency bitmask of each 4 KiB page of a range (1 host, 2 GPU 0).

        This is the model's ground truth, for tests and teaching; residency maps are built from events.
        """
        with self._lock:
            seg = self._find(ptr, size)
            first, last = seg.page_range(ptr, size)
            return self._table.state[seg.base + first:seg.base + last].copy()

    # -- prefetch and advice -------------------------------------------------------------------------------
    def prefetch(self, ptr: int, size: int, location: Location, *, stream: int = 0) -> None:
        """``cudaMemPrefetchAsync`` (R8): whole blocks, populating untouched pages, evicting as needed.

        Evictions run beside the copies into the GPU (the link is full duplex), so a block costs the
        longer of the two. Thrashing state of the pages is reset; nothing is prefetched beyond the range.
        """
        with self._lock:
            seg = self._find(ptr, size)
            self._check_location(location)
            if seg.kind is not MemoryKind.MANAGED:
                return  # as cudaMemPrefetchAsync on RMM's terms: a no-op on memory that cannot migrate
            first, last = seg.page_range(ptr, size)
            if last <= first:
                return
            t = self._table
            log = EventLog(self._now)
            dst = location.id
            log.add(EventKind.PREFETCH, dst=dst, address=ptr, nbytes=size, alloc_id=seg.id, stream=stream)
            lo_all, hi_all = seg.base + first, seg.base + last
            t.last_prefetch[lo_all:hi_all] = dst
            stopped = self._engine.migrate(lo_all, hi_all, dst, stream, log)
            if stopped < hi_all:
                self._finish(log)
                free, total = self.mem_info(dst)
                raise OutOfMemoryError(
                    f"prefetch to {location} stopped at {format_bytes((stopped - lo_all) * PAGE_SIZE)} of "
                    f"{format_bytes(size)}: device memory is held by allocations that cannot be evicted",
                    size=size, free=free, limit=total)
            self._finish(log)

    def advise(self, ptr: int, size: int, advice: Advice, location: Location | None) -> None:
        advice = Advice(advice)
        with self._lock:
            seg = self._find(ptr, size)
            if seg.kind is not MemoryKind.MANAGED:
                raise BackendError(f"memory advice applies to managed memory only; the range at {ptr:#x} is "
                                   f"{seg.kind.name.lower()} memory")
            needs_location = advice in (Advice.SET_PREFERRED_LOCATION, Advice.SET_ACCESSED_BY,
                                        Advice.UNSET_ACCESSED_BY)
            if needs_location:
                if location is None:
                    raise InvalidArgumentError(f"{advice.name} needs a location", value=None,
                                               expected='"host" or a device')
                self._check_location(location)
            first, last = seg.page_range(ptr, size)
            t = self._table
            sl = slice(seg.base + first, seg.base + last)
            log = EventLog(self._now)
            log.add(EventKind.ADVICE, flags=advice, dst=location.id if needs_location and location else NO_PROCESSOR,
                    address=ptr, nbytes=size, alloc_id=seg.id)
            if advice is Advice.SET_READ_MOSTLY:
                t.read_mostly[sl] = True
                # The driver revokes write access from the processor holding each page (and unmaps the
                # others): the first write to each page faults (uvm_va_block_set_read_duplication).
                t.writable[sl] = 0
            elif advice is Advice.UNSET_READ_MOSTLY:
                t.read_mostly[sl] = False
                self._engine.collapse_duplicates(sl.start, sl.stop, self._devices, log)
            elif advice is Advice.SET_PREFERRED_LOCATION:
                assert location is not None
                t.preferred[sl] = location.id
            elif advice is Advice.UNSET_PREFERRED_LOCATION:
                t.preferred[sl] = NO_LOCATION
                t.remote[sl] = 0  # the mappings that policy made may vanish
            elif advice is Advice.SET_ACCESSED_BY:
                assert location is not None
                t.accessed_by[sl] |= np.uint8(bit(location.id))
            else:
                assert location is not None
                t.accessed_by[sl] &= np.uint8(~bit(location.id) & 0xFF)
            self._finish(log)

    def range_advice(self, ptr: int, size: int) -> RangeAdvice:
        with self._lock:
            seg = self._find(ptr, size)
            first, last = seg.page_range(ptr, size)
            t = self._table
            sl = slice(seg.base + first, seg.base + last)
            if seg.kind is not MemoryKind.MANAGED:
                return RangeAdvice(False, None, (), None)
            read_mostly, preferred, mapped, prefetched = advice_of(t.read_mostly[sl], t.preferred[sl],
                                                                   t.accessed_by[sl], t.last_prefetch[sl])
            accessed = tuple(Location(p) for p in [HOST_ID, *range(self._devices)] if mapped & bit(p))
            return RangeAdvice(bool(read_mostly), None if preferred == NO_LOCATION else Location(preferred), accessed,
                               None if prefetched == NO_LOCATION else Location(prefetched))

    # -- access ------------------------------------------------------------------------------------------------
    def access(self, ptr: int, size: int, processor: Location, mode: AccessMode, *, stream: int = 0) -> AccessResult:
        """Every page of the range, once, in order: a grid-stride kernel on a GPU, a loop on the host.

        On a GPU it costs what the CUDA backend's ``access`` costs: a launch (``access_launch_latency``) and
        its byte-wise touch kernel's rate on resident pages (``touch_read_bw`` and the like), faults aside.
        On the host it costs what the CUDA backend's host loop costs: one byte of every page read
        (``host_access_latency`` a page) and, to write, written back (``host_write_latency`` more), faults
        aside. Its faults are those of one pass of the mode's accesses.
        """
        if mode not in _ACCESS_TYPES:
            raise InvalidArgumentError(f"mode must be one of {sorted(_ACCESS_TYPES)}, got {mode!r}",
                                       value=mode, expected=", ".join(sorted(_ACCESS_TYPES)))
        with self._lock:
            seg = self._find(ptr, size)
            self._check_location(processor)
            first, last = seg.page_range(ptr, size)
            log = EventLog(self._now)
            # What a recording for replay reads (uvm_lab.trace_replay): the call itself.
            accesses = [range_record(ptr, size, processor.id, _ACCESS_TYPES[mode], alloc_id=seg.id, stream=stream,
                                     start=self._now)] if self.bus.wants_accesses else None
            p = self.platform
            touch_bw = {"read": p.touch_read_bw, "write": p.touch_write_bw, "atomic": p.touch_atomic_bw}[mode]
            if seg.kind is MemoryKind.DEVICE and processor.is_host:
                raise BackendError("the host cannot access device memory (cudaMalloc); use managed or "
                                   "pinned host memory, or copy it")
            if not processor.is_host:   # the touch kernel, launched and waited for, as the CUDA backend times it
                log.advance(p.access_launch_latency)
            if seg.kind is MemoryKind.DEVICE:
                log.advance((last - first) * PAGE_SIZE / touch_bw)
                stats = StreamStats()
            elif seg.kind is MemoryKind.PINNED_HOST and processor.is_host:
                stats = StreamStats()
                log.advance((last - first) * (p.host_access_latency
                                              + (p.host_write_latency if mode != "read" else 0.0)))
            elif seg.kind is MemoryKind.PINNED_HOST:
                stats = StreamStats(bytes_remote=(last - first) * PAGE_SIZE)
                log.advance((last - first) * PAGE_SIZE / p.remote_bw)
            elif processor.is_host:
                pages = np.arange(seg.base + first, seg.base + last, dtype=np.int64)
                stats = self._engine.run([(pages, mode != "read")], HOST_ID, log, in_flight=1, bytes_per_access=1,
                                         access_type=_ACCESS_TYPES[mode], stream=stream)
                if mode != "read":   # the loop's read of every page before it writes them back
                    log.advance((last - first) * p.host_access_latency)
            else:
                pages = np.arange(seg.base + first, seg.base + last, dtype=np.int64)
                stats = self._engine.run([(pages, mode != "read")], processor.id, log, in_flight=p.gpu_pages_in_flight,
                                         access_type=_ACCESS_TYPES[mode], stream=stream, memory_bw=touch_bw)
            return self._result(log, stats, accesses)

    def access_stream(self, addresses: np.ndarray | Iterable[np.ndarray], processor: Location,
                      mode: AccessMode | np.ndarray | Iterable[np.ndarray] = "read", *, in_flight: int | None = None,
                      bytes_per_access: int = PAGE_SIZE, warps: int | None = None, stream: int = 0,
                      launch: bool = False) -> AccessResult:
        """Run an access stream on managed memory: addresses touched in program order (simulator only).

        Parameters
        ----------
        addresses
            Byte addresses inside live managed allocations, one per access (an array, or an iterable of
            arrays for long streams); each access touches the 4 KiB page holding its address.
        processor
            Who accesses: a device, or the host.
        mode
            ``"read"``, ``"write"`` or ``"atomic"`` for every access, or boolean "is a write" arrays shaped
            like ``addresses`` (chunk by chunk).
        in_flight
            Accesses the processor keeps going past a stalled one: a full grid-stride kernel keeps
            ``platform.gpu_pages_in_flight`` distinct pages in flight (the default on a GPU), a single
            warp 1, a host thread 1 (the default on the host).
        bytes_per_access
            Bytes each access moves when it hits (the cost of resident and remote accesses).
        warps
            Warps issuing the accesses; they cap what hits can stream (None: the whole GPU).
        launch
            The stream starts a kernel launched on an idle GPU: ``platform.kernel_launch_latency`` passes
            before its first access (a GPU processor only).

        Raises
        ------
        InvalidArgumentError
            For an address outside every live managed allocation, a bad mode or count, or a write array
            whose length differs from its chunk's. An array, or a list or tuple of them, is checked whole
            before any access runs, so nothing has happened when this is raised. Any other iterable is
            streamed: each chunk is checked before it runs, and the chunks before a bad one have run.
        """
        if isinstance(mode, str) and mode not in _ACCESS_TYPES:
            raise InvalidArgumentError(f"mode must be one of {sorted(_ACCESS_TYPES)} or boolean write arrays, "
                                       f"got {mode!r}", value=mode, expected=", ".join(sorted(_ACCESS_TYPES)))
        for name, value, low in (("in_flight", in_flight, 1), ("bytes_per_access", bytes_per_access, 1),
                                 ("warps", warps, 1)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer))
                                      or value < low):
                raise InvalidArgumentError(f"{name} must be a positive integer, got {value!r}", value=value,
                                           expected="a positive integer")
        self._check_location(processor)
        if not isinstance(launch, (bool, np.bool_)):
            raise InvalidArgumentError(f"launch must be True or False, got {launch!r}", value=launch,
                                       expected="True or False")
        if launch and processor.is_host:
            raise InvalidArgumentError("launch is for a kernel: the host launches nothing", value=launch,
                                       expected="launch=False for the host")
        if in_flight is None:
            in_flight = 1 if processor.is_host else self.platform.gpu_pages_in_flight
        in_memory = isinstance(addresses, (np.ndarray, list, tuple))
        chunks = [addresses] if isinstance(addresses, np.ndarray) else addresses
        if isinstance(mode, str):
            writes: bool | Iterable[np.ndarray] = mode != "read"
            access_type = _ACCESS_TYPES[mode]
        else:
            writes = [mode] if isinstance(mode, np.ndarray) else mode
            access_type = AccessType.WRITE
        with self._lock:
            parts: Iterable[tuple[np.ndarray, bool | np.ndarray]] = self._parts_of(chunks, writes)
            if in_memory:   # checked whole before anything runs: a bad address leaves the state as it was
                parts = list(parts)
            log = EventLog(self._now)
            accesses = None
            if self.bus.wants_accesses:   # what a recording for replay reads (uvm_lab.trace_replay): call and pages
                accesses = [stream_header(processor.id, access_type, uniform=isinstance(mode, str),
                                          in_flight=in_flight, bytes_per_access=bytes_per_access, warps=warps,
                                          launch=bool(launch), stream=stream, start=self._now)]
                parts = self._recorded(parts, accesses, processor.id, access_type, isinstance(mode, str), stream)
            if launch:
                log.advance(self.platform.kernel_launch_latency)
            try:
                stats = self._engine.run(parts, processor.id, log, in_flight=in_flight,
                                         bytes_per_access=bytes_per_access, warps=warps, access_type=access_type,
                                         stream=stream)
            finally:
                self._finish(log, accesses)
            seconds = stats.seconds + (self.platform.kernel_launch_latency if launch else 0.0)
            return AccessResult(seconds=seconds, faults=stats.faults, bytes_htod=stats.bytes_htod,
                                bytes_dtoh=stats.bytes_dtoh, bytes_remote=stats.bytes_remote,
                                bytes_dtod=stats.bytes_dtod)

    def _parts_of(self, chunks: Iterable[np.ndarray], writes: bool | Iterable[np.ndarray]
                  ) -> Iterator[tuple[np.ndarray, bool | np.ndarray]]:
        """``(global pages, writes)`` of each part of each chunk, checked against the live managed segments.

        ``writes`` is one flag for every access or a boolean array per chunk, split with it.
        """
        starts = np.array(self._starts, dtype=np.uint64)
        segs = [self._segments[a] for a in self._starts]
        ends = np.array([s.end for s in segs], dtype=np.uint64)
        bases = np.array([s.base for s in segs], dtype=np.int64)
        managed = np.array([s.kind is MemoryKind.MANAGED for s in segs], dtype=bool)
        flags = None if isinstance(writes, bool) else iter(writes)
        for index, chunk in enumerate(chunks):
            a = np.asarray(chunk)
            if a.dtype.kind not in "iu":
                raise InvalidArgumentError(f"addresses must be integers, got an array of {a.dtype}", value=a.dtype,
                                           expected="an integer array of byte addresses")
            a = a.astype(np.uint64, copy=False).reshape(-1)
            w: bool | np.ndarray = writes if isinstance(writes, bool) \
                else _write_flags(None if flags is None else next(flags, None), len(a), index)
            for lo in range(0, len(a), _STREAM_CHUNK):
                part = a[lo:lo + _STREAM_CHUNK]
                out = np.empty(len(part), dtype=np.int64)
                # In slices that stay in the cache: the temporaries of a whole chunk cost more than the work.
                for s in range(0, len(part), _TRANSLATE_SLICE):
                    _translate(part[s:s + _TRANSLATE_SLICE], out[s:s + _TRANSLATE_SLICE], starts, ends, bases, managed)
                yield out, w if isinstance(w, bool) else w[lo:lo + _STREAM_CHUNK]
        if flags is not None and next(flags, None) is not None:
            raise InvalidArgumentError("mode has more write arrays than there are address chunks",
                                       value="extra write arrays", expected="one write array per chunk")

    def _recorded(self, parts: Iterable[tuple[np.ndarray, bool | np.ndarray]], into: list[np.ndarray],
                  processor: int, access_type: AccessType, uniform: bool, stream: int
                  ) -> Iterator[tuple[np.ndarray, bool | np.ndarray]]:
        """``parts``, each noted in ``into`` as it runs (:func:`~uvm_lab.events.accesses.stream_runs`)."""
        t = self._table
        for pages, writes in parts:
            into.append(stream_runs(t.addresses(pages), writes, processor, access_type, uniform=uniform,
                                    alloc_ids=t.block_alloc[pages >> BLOCK_SHIFT],
                                    stream=stream, start=self._now))
            yield pages, writes

    def _result(self, log: EventLog, stats: StreamStats, accesses: list[np.ndarray] | None = None) -> AccessResult:
        start = self._now
        self._finish(log, accesses)
        return AccessResult(seconds=(self._now - start) / 1e9, faults=stats.faults, bytes_htod=stats.bytes_htod,
                            bytes_dtoh=stats.bytes_dtoh, bytes_remote=stats.bytes_remote, bytes_dtod=stats.bytes_dtod)

    def statistics(self) -> dict[str, Any]:
        """Counters of the model: chunks held and evicted, thrashing blocks tracked."""
        with self._lock:
            mem = self._memory
            devices = range(self._devices)
            return {"chunks_used": sum(mem.used(d) for d in devices),
                    "chunks_pinned": sum(mem.pinned(d) for d in devices),
                    "chunks_total": sum(mem.capacity(d) for d in devices),
                    "chunks_evicted": mem.evicted_blocks(), "thrashing_blocks": len(self._thrashing.blocks),
                    "eviction": mem.policy}

    def lend(self, ptr: int, size: int, device: int) -> None:
        """Nothing to mark: no other library runs kernels over the simulator's memory (only modelled accesses
        move its pages), so its maps stay exact. The range and the device are checked all the same."""
        self._find(ptr, size)
        self._check_device(device)

    # -- data ------------------------------------------------------------------------------------------------
    def host_view(self, ptr: int, size: int) -> np.ndarray:
        """The simulated bytes, as a NumPy view. Reading or writing it is not a modelled access: use
        :meth:`access` (``ul.touch``) for that."""
        with self._lock:
            seg = self._find(ptr, size)
            if seg.kind is MemoryKind.DEVICE:
                raise BackendError("device memory (cudaMalloc) has no host view; copy it to the host instead")
            return seg.data[ptr - seg.address : ptr - seg.address + size]

    def write(self, ptr: int, data: np.ndarray, *, stream: int = 0) -> None:
        """A copy from the host: a host write of the range (faults and all) for managed memory."""
        with self._lock:
            seg = self._find(ptr, data.size)
            if not data.size:
                return
            if seg.kind is MemoryKind.MANAGED:
                self.access(ptr, data.size, Location.host(), "write", stream=stream)
            elif seg.kind is MemoryKind.DEVICE:
                self._now += int(data.size / self.platform.prefetch_htod_bw * 1e9)
            seg.data[ptr - seg.address : ptr - seg.address + data.size] = data

    def read(self, ptr: int, out: np.ndarray, *, stream: int = 0) -> None:
        """A copy to the host: a host read of the range for managed memory."""
        with self._lock:
            seg = self._find(ptr, out.size)
            if not out.size:
                return
            if seg.kind is MemoryKind.MANAGED:
                self.access(ptr, out.size, Location.host(), "read", stream=stream)
            elif seg.kind is MemoryKind.DEVICE:
                self._now += int(out.size / self.platform.prefetch_dtoh_bw * 1e9)
            out[:] = seg.data[ptr - seg.address : ptr - seg.address + out.size]

    def copy(self, dst: int, src: int, size: int, *, stream: int = 0) -> None:
        """A copy into a simulated allocation. From another one it is the GPU's copy engine's: a GPU read of the
        source and a GPU write of the destination (faults and all, for managed memory). From any other address
        it is a copy from the host (:meth:`write`), of host memory read through ``/proc/self/mem``, so an address
        that is not mapped is an :class:`InvalidArgumentError`, never a crash."""
        with self._lock:
            dseg = self._find(dst, size)
            if not size:
                return
            sseg = self._segment_at(src)
            if sseg is None:
                self.write(dst, _read_host(src, size), stream=stream)
                return
            sseg = self._find(src, size)
            gpu = Location.device(dseg.device if dseg.device != HOST_ID else
                                  sseg.device if sseg.device != HOST_ID else 0)
            self.access(src, size, gpu, "read", stream=stream)
            self.access(dst, size, gpu, "write", stream=stream)
            data = sseg.data[src - sseg.address : src - sseg.address + size].copy()   # the ranges may overlap
            dseg.data[dst - dseg.address : dst - dseg.address + size] = data

    def _finish(self, log: EventLog, accesses: list[np.ndarray] | None = None) -> None:
        """Publish what ``log`` holds, after ``accesses`` (the ACCESS records of what it did, for a recording)."""
        self._now = max(self._now, int(log.t))
        source = capture()   # one call made every record of the log: they share the user's line
        if accesses:
            access = np.concatenate(accesses)
            access["end"] = self._now
            access["source"] = source
            self.bus.publish(access)
        for piece in log.pieces():
            piece["source"] = source
            self.bus.publish(piece)

    # -- lookups and checks ------------------------------------------------------------------------------
    def _segment_at(self, ptr: int) -> Segment | None:
        if isinstance(ptr, bool) or not isinstance(ptr, (int, np.integer)):
            return None
        i = bisect.bisect_right(self._starts, ptr) - 1
        if i < 0:
            return None
        seg = self._segments[self._starts[i]]
        return seg if ptr < seg.end else None

    def _find(self, ptr: int, size: int) -> Segment:
        seg = self._segment_at(ptr)
        if seg is None or size < 0 or ptr + size > seg.end:
            raise InvalidArgumentError(
                f"the range {ptr!r} + {size!r} bytes is not inside a live allocation of this backend",
                value=ptr, expected="an address range returned by allocate and not yet freed")
        return seg

    def _check_device(self, device: int) -> None:
        if isinstance(device, bool) or not isinstance(device, int) or not 0 <= device < self._devices:
            raise InvalidArgumentError(f"device must be 0..{self._devices - 1}, got {device!r}",
                                       value=device, expected=f"0..{self._devices - 1}")

    def _check_location(self, location: Location) -> None:
        if not isinstance(location, Location):
            raise InvalidArgumentError(f"expected a Location, got {location!r}", value=location,
                                       expected="uvm_lab.Location")
        if not location.is_host:
            self._check_device(location.id)


def _read_host(address: int, size: int) -> np.ndarray:
    """``size`` bytes of this process's memory at ``address``. Read through ``/proc/self/mem`` where there is one,
    so that an address not mapped is refused rather than crashing the process (the simulator's own addresses
    name no real memory, and a stale one must not be dereferenced)."""
    out = np.empty(size, dtype=np.uint8)
    expected = "an address of readable host memory, or inside a live simulated allocation"
    if isinstance(address, bool) or not isinstance(address, (int, np.integer)) or not 0 < address < 1 << 63:
        raise InvalidArgumentError(f"cannot read {size} bytes at {shown(address)}: not an address of this process",
                                   value=address, expected=expected)
    try:
        fd = os.open("/proc/self/mem", os.O_RDONLY)
    except OSError:   # no procfs: read it in place, as cudaMemcpy would
        out[:] = np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(int(address)))
        return out
    try:
        done = 0
        while done < size:
            got = os.preadv(fd, [memoryview(out.data)[done:]], int(address) + done)
            if got <= 0:
                raise OSError(errno.EIO, "short read")
            done += got
    except (OSError, OverflowError):
        raise InvalidArgumentError(
            f"cannot read {size} bytes at {int(address):#x}: it is not inside a live simulated allocation, and this "
            f"process has no readable memory there", value=address, expected=expected) from None
    finally:
        os.close(fd)
    return out


# The eviction policies a SimBackend accepts, for discovery.
SimBackend.EVICTION_POLICIES = EVICTION_POLICIES  # type: ignore[attr-defined]


def _write_flags(flags: object, n: int, index: int) -> np.ndarray:
    """Chunk ``index``'s write flags as a boolean array of its ``n`` accesses."""
    if flags is None:
        raise InvalidArgumentError(f"mode has no write array for address chunk {index}", value=None,
                                   expected="one write array per chunk")
    w = np.asarray(flags)
    if w.dtype != np.bool_:
        raise InvalidArgumentError(f"write arrays must be boolean, got an array of {w.dtype} for chunk {index}",
                                   value=w.dtype, expected="a boolean array, True where the access writes")
    if w.size != n:
        raise InvalidArgumentError(f"the write array of chunk {index} has {w.size} flags for {n} addresses",
                                   value=w.size, expected=f"{n} flags, one per address")
    return w.reshape(-1)


def _translate(part: np.ndarray, out: np.ndarray, starts: np.ndarray, ends: np.ndarray, bases: np.ndarray,
               managed: np.ndarray) -> None:
    """The global pages of the addresses ``part`` into ``out``; raises for one outside a managed segment."""
    # The segments of the lowest and the highest address: most slices stay inside one, or a few.
    first, last = (np.searchsorted(starts, np.array([part.min(), part.max()]), side="right") - 1).tolist()
    if first == last >= 0 and part.max() < ends[first] and managed[first]:
        np.subtract(part, starts[first], out=out.view(np.uint64))
        out >>= _PAGE_SHIFT
        out += bases[first]
        return
    if 0 <= first < last <= first + 4:   # a comparison per segment beats a search per address
        i = np.full(len(part), first, dtype=np.int64)
        for k in range(first + 1, last + 1):
            i += part >= starts[k]
    else:
        i = np.searchsorted(starts, part, side="right").astype(np.int64) - 1
    ok = i >= 0
    if ok.all():
        ok = (part < ends[i]) & managed[i]
    else:
        ok[ok] = (part[ok] < ends[i[ok]]) & managed[i[ok]]
    if not ok.all():
        bad = int(part[np.argmin(ok)])
        raise InvalidArgumentError(f"address {bad:#x} is not inside a live managed allocation of this backend",
                                   value=bad, expected="addresses of managed allocations")
    np.subtract(part, starts[i], out=out.view(np.uint64))
    out >>= _PAGE_SHIFT
    out += bases[i]
