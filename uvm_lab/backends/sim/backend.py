"""SimBackend: a simulated GPU with unified memory, behind the same protocol as the real one.

The model follows the NVIDIA UVM driver's rules where they decide residency (research notes R1-R8):
- pages are 4 KiB, migrations grow to 64 KiB big pages, GPU memory is allocated and evicted in 2 MiB
  blocks, FIFO by the last migration into the block (not by access);
- a page resident nowhere is populated (zero-filled) where it is first touched, or at its preferred
  location; ReadMostly duplicates on read and collapses on write; PreferredLocation=host turns GPU
  faults into remote mappings; AccessedBy maps a processor to the data wherever it lives;
- a fault batch services up to 256 faults; a block more than 51% resident after a fault is filled
  (a first cut of the density prefetcher: the full tree is a later refinement);
- on x86 the CPU cannot map GPU memory, so a host access always migrates.

Costs come from a :class:`Platform` profile and advance a simulated clock; every change is published
as the same records the CUDA backend emits, so residency maps and traces are built the same way.
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from typing import Any

import numpy as np

from ...errors import BackendError, DoubleFreeError, InvalidArgumentError, OutOfMemoryError
from ...events.bus import EventBus, get_bus, new_alloc_id
from ...events.schema import NO_PROCESSOR, AccessType, Advice, EventKind, MemoryKind, MigrationCause, RemoteMapCause
from ...location import HOST_ID, Location
from ...units import BIG_PAGE_SIZE, BLOCK_SIZE, PAGE_SIZE, format_bytes, parse_size
from ..base import AccessMode, AccessResult, Capabilities, RangeAdvice
from .model import NO_LOCATION, PAGES_PER_BLOCK, EventLog, Segment, bit, runs
from .platform import Platform, get_platform

__all__ = ["SimBackend"]

_BIG = BIG_PAGE_SIZE // PAGE_SIZE          # pages per big page
_BASE_ADDRESS = 0x7F00_0000_0000           # where simulated mappings start (looks like a GPU VA)


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
_DENSITY_THRESHOLD = 0.51                  # uvm_perf_prefetch_threshold
_ACCESS_TYPES = {"read": AccessType.READ, "write": AccessType.WRITE, "atomic": AccessType.ATOMIC}


def _grow_to_big_pages(mask: np.ndarray) -> np.ndarray:
    """Every 64 KiB big page that holds a True becomes all True (blocks start big-page aligned)."""
    n = len(mask)
    padded = np.zeros(-(-n // _BIG) * _BIG, dtype=bool)
    padded[:n] = mask
    grown = np.repeat(padded.reshape(-1, _BIG).any(axis=1), _BIG)
    return grown[:n]


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
    """

    name = "sim"
    is_simulated = True
    #: An x86 machine with a post-Pascal GPU on Linux, without HMM: the H200 the profile is calibrated on.
    capabilities = Capabilities(managed_memory=True, concurrent_managed_access=True, pageable_memory_access=False,
                                memory_pools=True)

    def __init__(self, device_memory: int | str = "16GiB", platform: str | Platform = "x86-pcie5", *,
                 bus: EventBus | None = None) -> None:
        memory = parse_size(device_memory, name="device_memory", allow_zero=False)
        if memory < BLOCK_SIZE:
            raise InvalidArgumentError(f"device_memory must be at least 2 MiB (one VA block), got {device_memory!r}",
                                       value=device_memory, expected=">= 2MiB")
        self.platform = get_platform(platform)
        self.device_memory = memory
        self.bus = bus if bus is not None else get_bus()
        # One simulated GPU for now; page states are bitmasks so that more can follow.
        self._devices = 1
        self._now = 0
        self._segments: dict[int, Segment] = {}
        self._starts: list[int] = []
        self._capacity_blocks = memory // BLOCK_SIZE
        self._used_blocks = [0]                               # managed 2 MiB chunks resident
        self._pinned_blocks = [0]                             # cudaMalloc memory, never evicted
        self._fifo: list[OrderedDict[tuple[int, int], Segment]] = [OrderedDict()]
        self._lock = threading.RLock()

    def __repr__(self) -> str:
        return (f"SimBackend(device_memory={format_bytes(self.device_memory)!r}, "
                f"platform={self.platform.name!r})")

    # -- identity and clock ---------------------------------------------------------------------------
    def device_count(self) -> int:
        return self._devices

    def current_device(self) -> int:
        return 0

    def now_ns(self) -> int:
        return self._now

    def synchronize(self) -> None:
        """All simulated work is complete when its call returns."""

    def mem_info(self, device: int = 0) -> tuple[int, int]:
        self._check_device(device)
        used = (self._used_blocks[device] + self._pinned_blocks[device]) * BLOCK_SIZE
        total = self._capacity_blocks * BLOCK_SIZE
        return total - used, total

    # -- mapping -----------------------------------------------------------------------------------------
    def allocate(self, size: int, kind: MemoryKind, *, device: int = 0, stream: int = 0) -> int:
        size = parse_size(size, allow_zero=False)
        kind = MemoryKind(kind)
        self._check_device(device)
        with self._lock:
            log = EventLog(self._now)
            if kind is MemoryKind.DEVICE:
                need = -(-size // BLOCK_SIZE)
                if self._pinned_blocks[device] + need > self._capacity_blocks:
                    free, total = self.mem_info(device)
                    raise OutOfMemoryError(
                        f"cannot allocate {format_bytes(size)} of device memory on simulated device {device}: "
                        f"{format_bytes(total - self._pinned_blocks[device] * BLOCK_SIZE)} is not held by "
                        f"other device allocations", size=size, free=free, limit=total)
                self._make_room(device, need, protect=set(), log=log)
                self._pinned_blocks[device] += need
            seg = Segment(id=new_alloc_id(), address=_address_space.reserve(size), size=size, kind=kind,
                          device=HOST_ID if kind is MemoryKind.PINNED_HOST else device)
            self._segments[seg.address] = seg
            bisect.insort(self._starts, seg.address)
            log.add(EventKind.SEGMENT_ALLOC, flags=kind, dst=seg.device, address=seg.address, nbytes=size,
                    alloc_id=seg.id, stream=stream)
            self._finish(log)
            return seg.address

    def free(self, ptr: int, *, stream: int = 0) -> None:
        with self._lock:
            seg = self._segments.get(ptr)
            if seg is None:
                raise DoubleFreeError(f"{ptr!r} is not the address of a live simulated allocation "
                                      f"(already freed, or never allocated here)",
                                      ptr=ptr if isinstance(ptr, int) else 0)
            if seg.kind is MemoryKind.DEVICE:
                self._pinned_blocks[seg.device] -= seg.nblocks
            for b in np.flatnonzero(seg.gpu_blocks):
                self._drop_block(seg, int(b), 0)
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

    # -- prefetch and advice -------------------------------------------------------------------------------
    def prefetch(self, ptr: int, size: int, location: Location, *, stream: int = 0) -> None:
        with self._lock:
            seg = self._find(ptr, size)
            self._check_location(location)
            if seg.kind is not MemoryKind.MANAGED:
                return  # as cudaMemPrefetchAsync on RMM's terms: a no-op on memory that cannot migrate
            first, last = seg.page_range(ptr, size)
            log = EventLog(self._now)
            dst = location.id
            log.add(EventKind.PREFETCH, dst=dst, address=ptr, nbytes=size, alloc_id=seg.id, stream=stream)
            seg.last_prefetch[first:last] = dst
            d = bit(dst)
            p = self.platform
            for b, lo, hi in seg.blocks(first, last):
                st = seg.state[lo:hi]
                need = (st & d) == 0
                populate = need & (st == 0)
                copy = need & (st != 0)
                dup = copy & seg.read_mostly[lo:hi]
                if location.is_host:
                    source = self._gpu_of(seg, lo, copy)
                    self._migrate_runs(log, seg, lo, copy, EventKind.DTOH, MigrationCause.USER, source, HOST_ID,
                                       p.prefetch_dtoh_bw, stream)
                    log.advance(populate.sum() * PAGE_SIZE / p.host_populate_bw)
                else:
                    if (copy | populate).any() and not self._claim(seg, b, dst, log):
                        self._finish(log)
                        free, total = self.mem_info(dst)
                        raise OutOfMemoryError(
                            f"prefetch to {location} stopped at {format_bytes((lo - first) * PAGE_SIZE)} of "
                            f"{format_bytes(size)}: device memory is held by allocations that cannot be evicted",
                            size=size, free=free, limit=total)
                    self._migrate_runs(log, seg, lo, copy, EventKind.HTOD, MigrationCause.USER, HOST_ID, dst,
                                       p.prefetch_htod_bw, stream)
                    log.advance(populate.sum() * PAGE_SIZE / p.gpu_populate_bw)
                    seg.remote[lo:hi][copy & ~dup] = 0
                st[populate | (copy & ~dup)] = d   # moved (or first touched) there
                st[dup] |= d                       # ReadMostly: a copy beside the others
                if location.is_host:
                    self._release_if_empty(seg, b)
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
            sl = slice(first, last)
            log = EventLog(self._now)
            log.add(EventKind.ADVICE, flags=advice, dst=location.id if needs_location and location else NO_PROCESSOR,
                    address=ptr, nbytes=size, alloc_id=seg.id)
            if advice is Advice.SET_READ_MOSTLY:
                seg.read_mostly[sl] = True
            elif advice is Advice.UNSET_READ_MOSTLY:
                seg.read_mostly[sl] = False
                self._collapse_duplicates(seg, first, last, log)
            elif advice is Advice.SET_PREFERRED_LOCATION:
                assert location is not None
                seg.preferred[sl] = location.id
            elif advice is Advice.UNSET_PREFERRED_LOCATION:
                seg.preferred[sl] = NO_LOCATION
                seg.remote[sl] = 0  # the mappings that policy made may vanish
            elif advice is Advice.SET_ACCESSED_BY:
                assert location is not None
                seg.accessed_by[sl] |= bit(location.id)
            else:
                assert location is not None
                seg.accessed_by[sl] &= ~np.uint8(bit(location.id))
            self._finish(log)

    def range_advice(self, ptr: int, size: int) -> RangeAdvice:
        with self._lock:
            seg = self._find(ptr, size)
            first, last = seg.page_range(ptr, size)

            def uniform(values: np.ndarray) -> Location | None:
                v = int(values[0]) if len(values) else NO_LOCATION
                return Location(v) if v != NO_LOCATION and (values == v).all() else None

            if seg.kind is not MemoryKind.MANAGED:
                return RangeAdvice(False, None, (), None)
            mapped = np.bitwise_and.reduce(seg.accessed_by[first:last]) if last > first else 0
            accessed = tuple(Location(p) for p in [HOST_ID, *range(self._devices)] if mapped & bit(p))
            return RangeAdvice(bool(seg.read_mostly[first:last].all()), uniform(seg.preferred[first:last]),
                               accessed, uniform(seg.last_prefetch[first:last]))

    # -- access ------------------------------------------------------------------------------------------------
    def access(self, ptr: int, size: int, processor: Location, mode: AccessMode, *, stream: int = 0) -> AccessResult:
        if mode not in _ACCESS_TYPES:
            raise InvalidArgumentError(f"mode must be one of {sorted(_ACCESS_TYPES)}, got {mode!r}",
                                       value=mode, expected=", ".join(sorted(_ACCESS_TYPES)))
        with self._lock:
            seg = self._find(ptr, size)
            self._check_location(processor)
            first, last = seg.page_range(ptr, size)
            log = EventLog(self._now)
            stats = {"faults": 0, "htod": 0, "dtoh": 0, "remote": 0, "entries": 0}
            if seg.kind is MemoryKind.DEVICE:
                if processor.is_host:
                    raise BackendError("the host cannot access device memory (cudaMalloc); use managed or "
                                       "pinned host memory, or copy it")
                log.advance((last - first) * PAGE_SIZE / self.platform.gpu_memory_bw)
            elif seg.kind is MemoryKind.PINNED_HOST:
                bw = self.platform.host_memory_bw if processor.is_host else self.platform.remote_bw
                stats["remote"] = 0 if processor.is_host else (last - first) * PAGE_SIZE
                log.advance((last - first) * PAGE_SIZE / bw)
            else:
                for b, lo, hi in seg.blocks(first, last):
                    if processor.is_host:
                        self._host_access_block(seg, b, lo, hi, mode, log, stats, stream)
                    else:
                        self._gpu_access_block(seg, b, lo, hi, processor.id, mode, log, stats, stream)
                batches = -(-stats["entries"] // self.platform.fault_batch_size)
                log.advance(batches * self.platform.fault_batch_latency if not processor.is_host else 0.0)
            start = self._now
            self._finish(log)
            return AccessResult(seconds=(self._now - start) / 1e9, faults=stats["faults"], bytes_htod=stats["htod"],
                                bytes_dtoh=stats["dtoh"], bytes_remote=stats["remote"])

    def _gpu_access_block(self, seg: Segment, b: int, lo: int, hi: int, device: int, mode: AccessMode,
                          log: EventLog, stats: dict[str, int], stream: int) -> None:
        p = self.platform
        g = bit(device)
        blo, bhi = b * PAGES_PER_BLOCK, min((b + 1) * PAGES_PER_BLOCK, seg.npages)
        st = seg.state[blo:bhi]
        rm = seg.read_mostly[blo:bhi]
        pref = seg.preferred[blo:bhi]
        acc = np.zeros(bhi - blo, dtype=bool)
        acc[lo - blo : hi - blo] = True
        write = np.bool_(mode != "read")  # numpy bool: ~write must be logical, not bitwise on an int
        has = (st & g) != 0
        on_host = (st & 1) != 0
        mapped = ((seg.accessed_by[blo:bhi] | seg.remote[blo:bhi]) & g) != 0
        remote_ok = acc & ~has & on_host & mapped
        fault = acc & ~has & ~remote_ok
        collapse = acc & has & (st != g) & write          # writes fault on read-only duplicates
        fault |= collapse
        if not fault.any():
            stats["remote"] += int(remote_ok.sum()) * PAGE_SIZE
            log.advance(remote_ok.sum() * PAGE_SIZE / p.remote_bw + (acc & has).sum() * PAGE_SIZE / p.gpu_memory_bw)
            return
        nowhere = st == 0
        dup = fault & rm & ~write & on_host & ~has                      # R3(a)
        policy_remote = fault & ~has & on_host & ~dup & (pref == HOST_ID)  # R3(f), PreferredLocation=host
        migrate = fault & ~has & ~nowhere & ~dup & ~policy_remote      # R3(b), (g)
        # The driver moves whole big pages, and fills a block that the fault leaves more than 51% resident.
        eligible = (st == 1) & ~rm & (pref != HOST_ID) & ~mapped
        grown = (_grow_to_big_pages(migrate) & eligible) | migrate
        resident_after = has | grown | dup | (fault & nowhere)
        if resident_after.sum() > _DENSITY_THRESHOLD * (bhi - blo):
            grown |= eligible
        populate = nowhere & _grow_to_big_pages(fault)                 # R2: first touch zero-fills big pages
        populate_host = populate & (pref == HOST_ID)
        populate_gpu = populate & ~populate_host
        if (grown | dup | populate_gpu | collapse).any() and not self._claim(seg, b, device, log):
            # No GPU memory can be freed (all of it is cudaMalloc memory): map the host copy remotely.
            oom = fault & on_host
            for start, length in runs(oom):
                log.add(EventKind.REMOTE_MAP, flags=RemoteMapCause.OUT_OF_MEMORY, src=HOST_ID, dst=device,
                        address=seg.page_address(blo + start), nbytes=length * PAGE_SIZE, alloc_id=seg.id)
            seg.remote[blo:bhi][oom] |= g
            stats["remote"] += int((oom | remote_ok).sum()) * PAGE_SIZE
            stats["faults"] += int(fault.sum())
            return
        prefetched = grown & ~migrate
        self._migrate_runs(log, seg, blo, migrate | dup, EventKind.HTOD, MigrationCause.COHERENCE, HOST_ID, device,
                           p.fault_htod_bw, stream)
        self._migrate_runs(log, seg, blo, prefetched, EventKind.HTOD, MigrationCause.PREFETCH, HOST_ID, device,
                           p.fault_htod_bw, stream)
        # A write leaves one copy, the writer's: as on the hardware, the write fault itself says so
        # (no separate record), and the residency map collapses the copies when it replays the fault.
        for start, length in runs(policy_remote | populate_host):
            log.add(EventKind.REMOTE_MAP, flags=RemoteMapCause.POLICY, src=HOST_ID, dst=device,
                    address=seg.page_address(blo + start), nbytes=length * PAGE_SIZE, alloc_id=seg.id)
        self._fault_runs(log, seg, blo, fault, populate, EventKind.GPU_PAGE_FAULT, mode, device, stream)
        st[grown | collapse | populate_gpu] = g
        st[dup] |= g
        st[populate_host] = 1
        seg.remote[blo:bhi][policy_remote | populate_host] |= g
        seg.remote[blo:bhi][grown] &= ~np.uint8(g)
        moved = int((grown | dup).sum()) * PAGE_SIZE
        remote = int((policy_remote | remote_ok | populate_host).sum()) * PAGE_SIZE
        stats["htod"] += moved
        stats["remote"] += remote
        stats["faults"] += int(fault.sum())
        stats["entries"] += int(_grow_to_big_pages(fault).sum()) // _BIG or 1
        log.advance(populate_gpu.sum() * PAGE_SIZE / p.gpu_populate_bw + remote / p.remote_bw
                    + (acc & has).sum() * PAGE_SIZE / p.gpu_memory_bw)

    def _host_access_block(self, seg: Segment, b: int, lo: int, hi: int, mode: AccessMode,
                           log: EventLog, stats: dict[str, int], stream: int) -> None:
        p = self.platform
        blo, bhi = b * PAGES_PER_BLOCK, min((b + 1) * PAGES_PER_BLOCK, seg.npages)
        st = seg.state[blo:bhi]
        rm = seg.read_mostly[blo:bhi]
        acc = np.zeros(bhi - blo, dtype=bool)
        acc[lo - blo : hi - blo] = True
        write = np.bool_(mode != "read")  # numpy bool: ~write must be logical, not bitwise on an int
        has = (st & 1) != 0
        collapse = acc & has & (st != 1) & write
        fault = (acc & ~has) | collapse          # x86: the CPU cannot map GPU memory
        if not fault.any():
            log.advance(acc.sum() * PAGE_SIZE / p.host_memory_bw)
            return
        nowhere = st == 0
        dup = fault & ~has & ~nowhere & rm & ~write
        migrate = fault & ~has & ~nowhere & ~dup
        grown = (_grow_to_big_pages(migrate) & (st != 0) & ~has & ~rm) | migrate
        populate = nowhere & _grow_to_big_pages(fault)
        source = self._gpu_of(seg, blo, grown | dup)
        self._migrate_runs(log, seg, blo, migrate | dup, EventKind.DTOH, MigrationCause.COHERENCE, source, HOST_ID,
                           p.fault_dtoh_bw, stream)
        self._migrate_runs(log, seg, blo, grown & ~migrate, EventKind.DTOH, MigrationCause.PREFETCH, source, HOST_ID,
                           p.fault_dtoh_bw, stream)
        self._fault_runs(log, seg, blo, fault, populate, EventKind.CPU_PAGE_FAULT, mode, HOST_ID, stream)
        log.advance(int(_grow_to_big_pages(fault).sum()) // _BIG * p.cpu_fault_latency)
        st[grown | collapse | populate] = 1
        st[dup] |= 1
        stats["dtoh"] += int((grown | dup).sum()) * PAGE_SIZE
        stats["faults"] += int(fault.sum())
        log.advance(populate.sum() * PAGE_SIZE / p.host_populate_bw + acc.sum() * PAGE_SIZE / p.host_memory_bw)
        self._release_if_empty(seg, b)

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

    # -- GPU memory: blocks, eviction ---------------------------------------------------------------------------
    def _claim(self, seg: Segment, b: int, device: int, log: EventLog) -> bool:
        """Make sure block ``b`` of ``seg`` holds a GPU chunk, evicting FIFO if needed; False if impossible."""
        key = (seg.id, b)
        fifo = self._fifo[device]
        if seg.gpu_blocks[b]:
            fifo.move_to_end(key)   # FIFO by last migration into the block, as the driver's list
            return True
        if not self._make_room(device, 1, protect={key}, log=log):
            return False
        seg.gpu_blocks[b] = True
        self._used_blocks[device] += 1
        fifo[key] = seg
        return True

    def _make_room(self, device: int, nblocks: int, protect: set[tuple[int, int]], log: EventLog) -> bool:
        fifo = self._fifo[device]
        while self._capacity_blocks - self._used_blocks[device] - self._pinned_blocks[device] < nblocks:
            victim = next((k for k in fifo if k not in protect), None)
            if victim is None:
                return False
            self._evict(fifo[victim], victim[1], device, log)
        return True

    def _evict(self, seg: Segment, b: int, device: int, log: EventLog) -> None:
        g = bit(device)
        blo, bhi = b * PAGES_PER_BLOCK, min((b + 1) * PAGES_PER_BLOCK, seg.npages)
        st = seg.state[blo:bhi]
        only_here = st == g
        copies = ((st & g) != 0) & ~only_here
        self._migrate_runs(log, seg, blo, only_here, EventKind.DTOH, MigrationCause.EVICTION, device, HOST_ID,
                           self.platform.prefetch_dtoh_bw, 0)
        self._invalidate_runs(log, seg, blo, copies, device)
        st[only_here] = 1
        st[copies] &= ~np.uint8(g)
        self._drop_block(seg, b, device)

    def _release_if_empty(self, seg: Segment, b: int) -> None:
        """A block whose pages all left the GPU gives its chunk back."""
        if seg.gpu_blocks[b]:
            blo, bhi = b * PAGES_PER_BLOCK, min((b + 1) * PAGES_PER_BLOCK, seg.npages)
            if not (seg.state[blo:bhi] > 1).any():
                self._drop_block(seg, b, 0)

    def _drop_block(self, seg: Segment, b: int, device: int) -> None:
        seg.gpu_blocks[b] = False
        self._used_blocks[device] -= 1
        self._fifo[device].pop((seg.id, b), None)

    def _collapse_duplicates(self, seg: Segment, first: int, last: int, log: EventLog) -> None:
        """UnsetReadMostly: keep the preferred location's copy if it has one, else the host's."""
        st = seg.state[first:last]
        pref = seg.preferred[first:last]
        dup = (st & (st - 1)) != 0                 # more than one bit set
        if not dup.any():
            return
        pref_bit = np.where(pref == HOST_ID, 1, np.where(pref >= 0, 1 << (pref.astype(np.int32) + 1), 0))
        keep = np.where((st & pref_bit) != 0, pref, HOST_ID)
        for device in range(self._devices):
            g = bit(device)
            drop = dup & ((st & g) != 0) & (keep != device)
            self._invalidate_runs(log, seg, first, drop, device)
            st[drop] &= ~np.uint8(g)
        drop_host = dup & ((st & 1) != 0) & (keep != HOST_ID)
        self._invalidate_runs(log, seg, first, drop_host, HOST_ID)
        st[drop_host] &= ~np.uint8(1)
        for b, _, _ in seg.blocks(first, last):
            self._release_if_empty(seg, b)

    # -- records -------------------------------------------------------------------------------------------
    def _migrate_runs(self, log: EventLog, seg: Segment, base: int, mask: np.ndarray, kind: EventKind,
                      cause: MigrationCause, src: int, dst: int, bandwidth: float, stream: int) -> None:
        for start, length in runs(mask):
            nbytes = length * PAGE_SIZE
            log.add(kind, flags=cause, src=src, dst=dst, address=seg.page_address(base + start), nbytes=nbytes,
                    alloc_id=seg.id, stream=stream, seconds=nbytes / bandwidth)

    def _fault_runs(self, log: EventLog, seg: Segment, base: int, fault: np.ndarray, populate: np.ndarray,
                    kind: EventKind, mode: AccessMode, processor: int, stream: int) -> None:
        """One fault record per run of faulted (or zero-filled) pages: value = pages that faulted."""
        for start, length in runs(fault | populate):
            log.add(kind, flags=_ACCESS_TYPES[mode], src=processor, dst=processor,
                    address=seg.page_address(base + start), nbytes=length * PAGE_SIZE,
                    value=int(fault[start : start + length].sum()), alloc_id=seg.id, stream=stream)

    def _invalidate_runs(self, log: EventLog, seg: Segment, base: int, mask: np.ndarray, src: int) -> None:
        for start, length in runs(mask):
            log.add(EventKind.INVALIDATE, src=src, dst=src, address=seg.page_address(base + start),
                    nbytes=length * PAGE_SIZE, alloc_id=seg.id)

    def _gpu_of(self, seg: Segment, base: int, mask: np.ndarray) -> int:
        """The device holding pages being migrated to the host (the lowest GPU bit present)."""
        st = seg.state[base : base + len(mask)][mask]
        gpus = int(np.bitwise_or.reduce(st)) >> 1 if len(st) else 1
        return (gpus & -gpus).bit_length() - 1 if gpus else 0

    def _finish(self, log: EventLog) -> None:
        self._now = max(self._now, int(log.t))
        if log.rows:
            self.bus.publish(log.to_array())

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
