"""The fault path: an access stream meets the page table, faults are batched and serviced by the rules.

A stream is an array of global page numbers in program order, with the number of accesses in flight
(how far ahead of the oldest stalled access the processor keeps going). At the first access that cannot
proceed, the batch is the distinct faulting pages among the next ``in_flight`` accesses, up to
``fault_batch_size`` (256) after de-duplication, serviced together with one replay (research R4). A host
thread has one access in flight and its faults are serviced one by one.

Servicing a batch, per page, picks the destination by the driver's ordered rules (R3), grows what moves
with the density prefetcher (R5), allocates 2 MiB chunks and evicts to get them (R1, R6), feeds the
thrashing detector (R7), and emits what CUPTI would: HtoD/DtoH with cause COHERENCE/PREFETCH/EVICTION,
GPU fault records with the access type (CPU fault records without one, as CUPTI), REMOTE_MAP, THRASHING and
THROTTLING, and INVALIDATE where copies go with no transfer (CUPTI has no record of it).

Cost of a GPU batch: a round trip, plus a service time per VA block, per 2 MiB chunk it allocates and per
fault, plus each copy on the size-dependent link, plus a cost per page copied, per page unmapped at the source
and per contiguous range unmapped (a TLB shootdown), plus synchronous evictions. Accesses that hit cost
their bytes at the GPU's (or, through a remote mapping, the link's) bandwidth, capped by what the warps
in flight can issue. The link is full duplex: remote writes overlap remote reads, and a stream pays only for
the direction that carries more.

All of it is :mod:`.core`'s, compiled; this sets a stream up and takes its records and tallies back.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass, fields

import numpy as np

from ...events.schema import AccessType
from ...location import HOST_ID
from ...units import PAGE_SIZE
from . import core
from .eviction import GpuMemory
from .model import EventLog, PageTable
from .platform import Platform
from .thrashing import ThrashingDetector

__all__ = ["FaultEngine", "StreamStats", "platform_costs"]

#: ``uvm_perf_prefetch_threshold``: a subtree is prefetched when more than 51% of it is set (R5).
DEFAULT_THRESHOLD = 51


@dataclass
class StreamStats:
    """What a stream cost (bytes and counts; seconds is on the simulated clock)."""

    accesses: int = 0
    faults: int = 0
    batches: int = 0
    bytes_htod: int = 0
    bytes_dtoh: int = 0
    bytes_remote: int = 0
    bytes_prefetched: int = 0
    evictions: int = 0
    throttles: int = 0
    bytes_dtod: int = 0          #: copied between GPUs, on the peer link
    seconds: float = 0.0


assert [f.name for f in fields(StreamStats)][:-1] == list(core.STATS)
@functools.lru_cache(maxsize=32)   # a calibration makes hundreds of profiles: the last few are kept
def platform_costs(p: Platform) -> np.ndarray:
    """The platform's costs as :mod:`.core` takes them (``core.COSTS``)."""
    return np.array([float(getattr(p, name)) for name in core.COSTS])


class FaultEngine:
    """Runs access streams on one page table with the devices' memory.

    Parameters
    ----------
    table, memory, platform, thrashing
        The page table, the devices' memory (chunks and eviction), the costs, the thrashing detector.
    prefetch
        ``uvm_perf_prefetch_enable``: with it off, a fault moves its own page only.
    prefetch_threshold
        ``uvm_perf_prefetch_threshold`` (51).
    """

    def __init__(self, table: PageTable, memory: GpuMemory, platform: Platform, thrashing: ThrashingDetector, *,
                 prefetch: bool = True, prefetch_threshold: int = DEFAULT_THRESHOLD) -> None:
        self.table = table
        self.memory = memory
        self.platform = platform
        self.thrashing = thrashing
        self.prefetch = prefetch
        self.threshold = prefetch_threshold
        self._protect = np.zeros(0, dtype=np.int64)   # core's marks of the blocks a batch holds on to
        self._marks = np.zeros(1, dtype=np.int64)

    def protect(self) -> tuple[np.ndarray, np.ndarray]:
        """Where :mod:`.core` marks the blocks a batch must not evict (one entry a block), and the last mark."""
        if len(self._protect) < self.table.nblocks:
            self._protect = np.concatenate((self._protect, np.zeros(self.table.nblocks - len(self._protect),
                                                                    dtype=np.int64)))
        return self._protect, self._marks

    def run(self, parts: Iterable[tuple[np.ndarray, bool | np.ndarray]], processor: int, log: EventLog,
            *, in_flight: int, bytes_per_access: int = PAGE_SIZE, warps: int | None = None,
            access_type: AccessType | None = None, stream: int = 0, memory_bw: float | None = None) -> StreamStats:
        """Run the accesses in ``parts`` by ``processor``, in order.

        Each part is an array of global pages and its writes: one flag for all, or a boolean array beside them.
        ``warps`` caps the throughput of accesses that hit (None: the whole device); ``memory_bw`` is what hits
        on a GPU stream at (None: ``platform.gpu_memory_bw``, a kernel of word loads).
        """
        p = self.platform
        host = processor == HOST_ID
        in_flight = max(1, in_flight)
        if host:
            local_bw, remote_bw = p.host_memory_bw, p.remote_host_bw
        else:
            cap = float("inf") if warps is None else warps * p.warp_bw
            local_bw = min(p.gpu_memory_bw if memory_bw is None else memory_bw, cap)
            remote_bw = min(p.remote_bw, cap)
        kind = int(AccessType.WRITE if access_type is None else access_type)
        local = bytes_per_access / local_bw
        remote = bytes_per_access / remote_bw
        if host:   # one thread: a small access still costs a miss, a write more than a read
            local_read, local_write = max(local, p.host_access_latency), max(local, p.host_write_latency)
            remote = max(remote, p.host_access_latency)
        else:      # a small remote read is a round trip over the link, several in flight
            local_read = local_write = local
            remote = max(remote, p.remote_request_latency / in_flight)
        start = log.t
        tallies = np.zeros(len(core.STATS), dtype=np.int64)
        remote_s = np.zeros(2)   # remote reads' and writes' seconds: the link is full duplex
        records, count, clock = log.open()
        costs = platform_costs(p)
        threshold = self.threshold if self.prefetch else 0
        accesses = 0
        for pages, wr in parts:
            pages = np.ascontiguousarray(pages, dtype=np.int64)
            writes = np.ascontiguousarray(wr, dtype=bool) if isinstance(wr, np.ndarray) else np.array([bool(wr)])
            accesses += len(pages)
            pos = 0
            while True:
                protect, marks = self.protect()
                status, pos = core.run_stream(self.table.arrays(), self.memory.arrays, self.thrashing.arrays, costs,
                                              pages, writes, pos, processor, in_flight, local_read, local_write,
                                              remote, bytes_per_access, kind, stream, threshold, protect, marks,
                                              records, count, clock, tallies, remote_s)
                if status == core.DONE:
                    break
                self.thrashing.make_room(p.fault_batch_size)
        if remote_s[1] > remote_s[0]:   # remote writes took longer than the reads they overlapped
            clock[0] += (remote_s[1] - remote_s[0]) * 1e9
        log.close(records, count, clock)
        stats = StreamStats(*tallies.tolist())
        stats.accesses = accesses
        stats.seconds = (log.t - start) / 1e9
        return stats

    def migrate(self, lo: int, hi: int, dst: int, stream: int, log: EventLog) -> int:
        """R8, ``cudaMemPrefetchAsync`` of pages ``lo .. hi - 1`` to ``dst`` (:func:`.core.migrate`); returns the
        first page not moved (``hi`` when all were)."""
        protect, marks = self.protect()
        records, count, clock = log.open()
        stopped = core.migrate(self.table.arrays(), self.memory.arrays, self.thrashing.arrays,
                               platform_costs(self.platform), lo, hi, dst, stream, protect, marks, records, count,
                               clock)
        log.close(records, count, clock)
        return int(stopped)

    def make_room(self, device: int, nblocks: int, log: EventLog) -> bool:
        """Evict until ``nblocks`` chunks of ``device`` are free (for memory that cannot be evicted); False if they
        cannot be."""
        protect, marks = self.protect()
        marks[0] += 1
        records, count, clock = log.open()
        ok, _ = core.make_room(self.table.arrays(), self.memory.arrays, device, nblocks, protect, marks[0], records,
                               count, clock, platform_costs(self.platform), False)
        log.close(records, count, clock)
        return bool(ok)

    def collapse_duplicates(self, lo: int, hi: int, devices: int, log: EventLog) -> None:
        """UnsetReadMostly on pages ``lo .. hi - 1`` (:func:`.core.collapse_duplicates`)."""
        records, count, clock = log.open()
        core.collapse_duplicates(self.table.arrays(), self.memory.arrays, lo, hi, devices, records, count, clock)
        log.close(records, count, clock)

    def prefetch_pages(self, pages: np.ndarray, to_here: np.ndarray, processor: int) -> np.ndarray:
        """R5 for a batch: the pages the density prefetcher adds to those of ``pages`` (sorted, distinct) that come
        to ``processor`` (``to_here``), as :func:`.core.prefetch_pages` finds them."""
        pages = np.ascontiguousarray(pages, dtype=np.int64)
        dest = np.where(to_here, core.MIGRATE, core.NONE).astype(np.int8)
        blocks = np.unique(pages >> core.SHIFT)
        extra = np.empty(len(blocks) * core.PAGES, dtype=np.int64)
        n = core.prefetch_pages(self.table.arrays(), self.thrashing.arrays, pages, dest, len(pages), processor,
                                self.threshold, blocks, len(blocks), extra)
        return extra[:n]
