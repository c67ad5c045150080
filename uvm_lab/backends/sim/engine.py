"""The fault path: an access stream meets the page table, faults are batched and serviced by the rules.

A stream is an array of global page numbers in program order, with the number of accesses in flight
(how far ahead of the oldest stalled access the processor keeps going). The engine scans the stream
for the first access that cannot proceed; the batch is the distinct faulting pages among the next
``in_flight`` accesses, up to ``fault_batch_size`` (256) after de-duplication, serviced together with
one replay (research R4). A host thread has one access in flight and its faults are serviced one by one.

Servicing a batch, per page, picks the destination by the driver's ordered rules (R3), grows what moves
with the density prefetcher (R5), allocates 2 MiB chunks and evicts to get them (R1, R6), feeds the
thrashing detector (R7), and emits what CUPTI would: HtoD/DtoH with cause COHERENCE/PREFETCH/EVICTION,
GPU fault records with the access type (CPU fault records without one, as CUPTI), REMOTE_MAP, THRASHING and
THROTTLING, and INVALIDATE where copies go with no transfer (CUPTI has no record of it).

Cost of a GPU batch: a round trip, plus a service time per VA block, plus each copy on the size-dependent
link, plus a per-page cost for the pages it migrates, plus synchronous evictions. Accesses that hit cost
their bytes at the GPU's (or, through a remote mapping, the link's) bandwidth, capped by what the warps
in flight can issue.

A streaming kernel's faults (whole blocks of host-only pages, no advice, FIFO eviction) are serviced many
blocks at a time by :meth:`FaultEngine._sweep`, with the same records, clock and state as batch by batch.
A batch with no advice, duplicate, remote mapping or thrashing state in it is serviced by
:meth:`FaultEngine._service_plain`, which leaves out the rules that cannot apply, or, where it is one run of
pages in one block, by :meth:`FaultEngine._service_run` with slices and scalars. A host thread's faults along
blocks it takes from the front (a read-back of GPU-resident pages, a first write) follow a fixed schedule per
block and are serviced a run at a time by :meth:`FaultEngine._host_run`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from ...events.schema import EVENT_DTYPE, AccessType, EventKind, MigrationCause, RemoteMapCause
from ...location import HOST_ID
from ...units import PAGE_SIZE
from .eviction import GpuMemory
from .model import BLOCK_SHIFT, NO_LOCATION, PAGES_PER_BLOCK, EventLog, PageTable, page_runs
from .platform import Platform, link_seconds
from .prefetcher import DEFAULT_THRESHOLD, block_prefetch, dense_subtrees
from .thrashing import ThrashingDetector

__all__ = ["FaultEngine", "StreamStats"]


def _blocks_of(pages: np.ndarray) -> np.ndarray:
    """The distinct blocks of sorted pages."""
    b = pages >> BLOCK_SHIFT
    return b[np.concatenate(([True], b[1:] != b[:-1]))] if len(b) > 1 else b

def _block_runs(pages: np.ndarray) -> int:
    """Runs of consecutive sorted pages, split where a 2 MiB block ends (the driver copies block by block)."""
    if len(pages) < 2:
        return len(pages)
    return 1 + int(np.count_nonzero((pages[1:] != pages[:-1] + 1) | ((pages[1:] & (PAGES_PER_BLOCK - 1)) == 0)))

_LANES = np.arange(PAGES_PER_BLOCK)
_SCAN = 1 << 16   # accesses checked at once while looking for the next fault
_HALF = PAGES_PER_BLOCK // 2
# The scan windows _run_chunk takes while everything hits (1024, 2048 ... _SCAN), and their running totals.
_SCAN_SIZES = np.array([1024 << i for i in range((_SCAN // 1024).bit_length())], dtype=np.int64)
_SCAN_CUM = np.cumsum(_SCAN_SIZES)
_SCAN_CUM0 = np.concatenate(([0], _SCAN_CUM))
# Outcomes of R3 per faulting page.
_MIGRATE, _DUP, _POPULATE, _REMOTE, _POP_REMOTE, _COLLAPSE, _NONE = range(7)


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
    seconds: float = 0.0


class FaultEngine:
    """Services access streams on one page table with one device's memory.

    Parameters
    ----------
    table, memory, platform, thrashing
        The page table, the device's memory (chunks and eviction), the costs, the thrashing detector.
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
        #: Service runs of whole blocks that a sweep faults in all at once (:meth:`_sweep`); the records,
        #: clock and state are the same either way, so this exists to test that they are.
        self.fast_sweeps = True
        #: Service batches with no advice, duplicate or thrashing state in them by :meth:`_service_plain`,
        #: which skips the rules that cannot apply; switchable for the same reason as ``fast_sweeps``.
        self.fast_batches = True
        #: Service a host thread's run of faults through blocks moving to it from the front by
        #: :meth:`_host_run`, all at once; switchable for the same reason as ``fast_sweeps``.
        self.fast_host_runs = True
        #: Service a GPU batch that is one run of pages in one block by :meth:`_service_run`, with slices and
        #: scalars; switchable for the same reason as ``fast_batches``.
        self.fast_run_batches = True
        self._kept_for: tuple | None = None
        self._kept: dict[str, dict] = {}

    # -- the stream ------------------------------------------------------------------------------------------
    def run(self, chunks: Iterable[np.ndarray], processor: int, write: bool | Iterable[np.ndarray], log: EventLog,
            *, in_flight: int, bytes_per_access: int = PAGE_SIZE, warps: int | None = None,
            access_type: AccessType | None = None, stream: int = 0) -> StreamStats:
        """Run the accesses in ``chunks`` (arrays of global pages) by ``processor``.

        ``write`` is one flag for every access or, chunk by chunk, a boolean array beside the pages.
        ``warps`` caps the throughput of accesses that hit (None: the whole device).
        """
        p = self.platform
        stats = StreamStats()
        host = processor == HOST_ID
        if host:
            local_bw, remote_bw = p.host_memory_bw, p.remote_host_bw
        else:
            cap = float("inf") if warps is None else warps * p.warp_bw
            local_bw, remote_bw = min(p.gpu_memory_bw, cap), min(p.remote_bw, cap)
        writes = None if isinstance(write, (bool, np.bool_)) else iter(write)
        kind = AccessType.WRITE if access_type is None else access_type
        start = log.t
        local, remote = bytes_per_access / local_bw, bytes_per_access / remote_bw
        if host:   # one thread: a small access still costs a miss
            local, remote = max(local, p.host_access_latency), max(remote, p.host_access_latency)
        else:      # a small remote read is a round trip over the link, several in flight
            remote = max(remote, p.remote_request_latency / max(1, in_flight))
        for pages in chunks:
            wr = bool(write) if writes is None else next(writes)
            self._run_chunk(np.asarray(pages, dtype=np.int64), wr, processor, log, stats, in_flight=max(1, in_flight),
                            local=local, remote=remote, bytes_per_access=bytes_per_access, kind=kind, stream=stream)
        stats.seconds = (log.t - start) / 1e9
        return stats

    def _usable(self, pages: np.ndarray, processor: int, wr: bool | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(local, remote)``: accesses that proceed without a fault, on a local copy or through a mapping."""
        t = self.table
        g = 1 if processor == HOST_ID else 1 << (processor + 1)
        st = t.state[pages]
        local = (st & g) != 0
        if wr is not False:
            # A write to a read-only mapping faults: a duplicate's, or a ReadMostly page's that its holder has
            # not written since the advice or the last duplication (the driver maps such pages read-only).
            ro = local & (st != g)
            rm = t.read_mostly[pages]
            if rm.any():
                ro |= local & rm & ((t.writable[pages] & g) == 0)
            local &= ~(ro & wr)
        mapped = ((t.accessed_by[pages] | t.remote[pages]) & g) != 0
        if processor == HOST_ID:
            reach = (st > 1) if self.platform.cpu_maps_gpu_memory else np.zeros(len(pages), dtype=bool)
        else:
            reach = (st & 1) != 0
        remote = ~local & mapped & reach & ((st & g) == 0)
        return local, remote

    def _run_chunk(self, pages: np.ndarray, wr: bool | np.ndarray, processor: int, log: EventLog, stats: StreamStats,
                   *, in_flight: int, local: float, remote: float, bytes_per_access: int, kind: AccessType,
                   stream: int) -> None:
        n = len(pages)
        stats.accesses += n
        batch_size = 1 if processor == HOST_ID else self.platform.fault_batch_size
        scalar_wr = not isinstance(wr, np.ndarray)
        counters = self.platform.access_counter_migration and processor != HOST_ID
        pos = 0
        scan = max(in_flight, 1024)      # short after a fault, doubling while everything hits
        while pos < n:
            end = min(n, pos + scan)
            span = pages[pos:end]
            w = wr if scalar_wr else wr[pos:end]
            ok_local, ok_remote = self._usable(span, processor, w)
            good = ok_local | ok_remote
            first_bad = len(span) if good.all() else int(np.argmin(good))
            if first_bad:
                n_remote = int(np.count_nonzero(ok_remote[:first_bad]))
                self._hits(span[:first_bad], first_bad - n_remote, n_remote, local, remote, bytes_per_access, log,
                           stats, processor)
                if counters and n_remote:
                    self._count_remote(span[:first_bad][ok_remote[:first_bad]], processor, log, stats, stream)
            pos += first_bad
            if first_bad == len(span):
                scan = min(2 * scan, _SCAN)
                continue
            scan = max(in_flight, 1024)
            if self.fast_sweeps and processor == HOST_ID and in_flight == 1:
                done = self._upgrades(pages, pos, wr, log, stats, local=local, remote=remote, kind=kind,
                                      stream=stream)
                if done:
                    pos += done
                    continue
            if self.fast_host_runs and processor == HOST_ID and in_flight == 1:
                done = self._host_run(pages, pos, log, stats, local=local, remote=remote, stream=stream)
                if done:
                    pos += done
                    continue
            if self.fast_sweeps and in_flight == batch_size == _HALF and processor != HOST_ID:
                done = self._sweep(pages, pos, wr, processor, log, stats, local=local, remote=remote, kind=kind,
                                   stream=stream)
                if done:
                    pos += done
                    continue
            # The batch: distinct faulting pages among the next ``in_flight`` accesses.
            win = pages[pos:pos + in_flight]
            ww = wr if scalar_wr else wr[pos:pos + in_flight]
            l2, r2 = (ok_local[first_bad:first_bad + in_flight], ok_remote[first_bad:first_bad + in_flight]) \
                if pos + len(win) <= end else self._usable(win, processor, ww)
            bad = np.flatnonzero(~(l2 | r2))
            fp = win[bad]
            if len(fp) < 2 or (fp[1:] > fp[:-1]).all():   # in order and distinct: a sweep (the common case)
                uniq, first = fp, np.arange(len(fp))
            else:
                # The batch is the first batch_size distinct pages: a prefix holding more than that decides it.
                head = 2 * batch_size
                while True:
                    uniq, first = np.unique(fp[:head], return_index=True)
                    if len(uniq) > batch_size or head >= len(fp):
                        break
                    head *= 4
            if len(uniq) > batch_size:
                order = np.argsort(first, kind="stable")
                cut = int(bad[first[order[batch_size]]])
                uniq = np.sort(uniq[order[:batch_size]])
            else:
                cut = len(win)
            if scalar_wr:
                wpages = np.full(len(uniq), bool(ww))
            else:
                wsel = bad[bad < cut]
                wflags = ww[wsel]
                if wflags.all():     # every page of the batch is among these accesses
                    wpages = np.ones(len(uniq), dtype=bool)
                elif not wflags.any():
                    wpages = np.zeros(len(uniq), dtype=bool)
                else:
                    written = np.unique(win[wsel][wflags])
                    wpages = np.isin(uniq, written, assume_unique=True)
            n_remote = int(np.count_nonzero(r2[:cut]))
            # Faulted accesses proceed after the replay, some of them through a new remote mapping (which a
            # plain batch never makes: its pages end up at the faulting processor).
            lean = self.fast_run_batches and self._service_run(uniq, wpages, processor, log, stats, kind, stream)
            if not lean and self.fast_batches:
                lean = self._service_plain(uniq, wpages, processor, log, stats, kind, stream)
            if not lean:
                self._service(uniq, wpages, processor, log, stats, kind, stream)
                served = win[bad[bad < cut]]
                if len(served):
                    n_remote += int(np.count_nonzero(self._usable(served, processor, False)[1]))
            self._hits(win[:cut], cut - n_remote, n_remote, local, remote, bytes_per_access, log, stats, processor)
            pos += cut

    # -- the sweep fast path -----------------------------------------------------------------------------------
    def _sweep(self, pages: np.ndarray, pos: int, wr: bool | np.ndarray, processor: int, log: EventLog,
               stats: StreamStats, *, local: float, remote: float, kind: AccessType, stream: int) -> int:
        """Service, all at once, a run of whole blocks that a sweep faults in half a block per batch.

        The common case of a streaming kernel: from ``pages[pos]`` on, consecutive pages of whole 2 MiB
        blocks, every page on the host only, no advice, no thrashing state, FIFO eviction, batches of 256
        distinct faults. Each block is then two batches of 256 pages, the density prefetcher adds nothing
        (half a block is not above the threshold; the second half completes the block), each batch moves
        one 1 MiB run with one fault record, and the first batch of a block evicts the head of the FIFO
        when no chunk is free. This method produces exactly the records, clock, state and counters that
        :meth:`_service` would, batch by batch, with one pass over arrays instead of one per batch.
        Returns the accesses consumed (0 where the case does not apply, and the general path runs).
        """
        t, p, mem, thr = self.table, self.platform, self.memory, self.thrashing
        p0 = int(pages[pos])
        if p0 & (PAGES_PER_BLOCK - 1) or mem.policy != "fifo" or mem.overlap or thr.blocks \
                or (self.prefetch and self.threshold < 50) or mem.free_blocks < 0:
            return 0
        limit = (len(pages) - pos) // PAGES_PER_BLOCK * PAGES_PER_BLOCK
        if limit == 0:
            return 0
        # Look a block ahead first, then 8x further while the run lasts: a pattern that is not a sweep is
        # turned away after one block instead of a scan of the rest of the chunk on every batch.
        window = PAGES_PER_BLOCK
        while True:
            m = min(window, limit)
            nb = self._sweepable(pages, pos, m, wr)
            if nb * PAGES_PER_BLOCK < m or m == limit:
                break
            window *= 8
        if nb == 0:
            return 0
        b0 = p0 >> BLOCK_SHIFT
        write = bool(wr[pos]) if isinstance(wr, np.ndarray) else bool(wr)
        if thr.enabled:
            for j in range(nb):
                last = thr._touch.get(b0 + j)
                if last is not None and last[0] != processor:
                    nb = j
                    break
        free = mem.free_blocks
        order = mem._order
        nb = min(nb, free + len(order))
        g = 1 << (processor + 1)
        n_evict = max(0, nb - free)
        victims = np.fromiter(order.keys(), dtype=np.int64, count=n_evict) if n_evict else np.zeros(0, np.int64)
        if n_evict:
            vst = t.state[(victims[:, None] * PAGES_PER_BLOCK + np.arange(PAGES_PER_BLOCK)[None, :])]
            valid = np.arange(PAGES_PER_BLOCK)[None, :] < t.block_pages[victims][:, None]
            vst = np.where(valid, vst, 0)
            copies = ((vst & g) != 0) & (vst != g)
            if copies.any():   # duplicates need invalidations: stop before the first such victim
                first = int(np.argmax(copies.any(axis=1)))
                nb, n_evict = free + first, first
                victims, vst = victims[:first], vst[:first]
        if nb <= 0:
            return 0
        blocks = np.arange(b0, b0 + nb, dtype=np.int64)
        # -- the evictions' records: runs of pages only the chunk holds, per victim (as GpuMemory.evict) ----------
        if n_evict:
            flat = np.flatnonzero((vst == g).reshape(-1))
            only = victims[flat >> BLOCK_SHIFT] * PAGES_PER_BLOCK + (flat & (PAGES_PER_BLOCK - 1))
            ev_start, ev_len = page_runs(only)
            # Which victim each run belongs to: runs follow the victims' order.
            ev_victim = (flat[np.concatenate(([0], np.cumsum(ev_len)[:-1]))] >> BLOCK_SHIFT) if len(ev_start) else \
                np.zeros(0, np.int64)
            ev_bytes = ev_len.astype(np.uint64) * PAGE_SIZE
            ev_secs = link_seconds(ev_bytes, p.eviction_bw, p.link_k)
            ev_secs_list = np.atleast_1d(ev_secs).tolist()
            runs_per_victim = np.bincount(ev_victim, minlength=n_evict).tolist()
        else:
            ev_start = ev_len = ev_victim = ev_bytes = np.zeros(0, np.int64)
            ev_secs_list, runs_per_victim = [], []
        # -- the clock, batch by batch, with the very float operations of the general path ----------------------
        half_bytes = _HALF * PAGE_SIZE
        copy_s = float(link_seconds(np.array([half_bytes], dtype=np.uint64), p.fault_htod_bw, p.link_k)[0])
        halves = []   # a block's first batch allocates its chunk, the second finds it
        for new_chunks in (1, 0):
            service = p.fault_batch_latency + p.fault_block_latency * 1 + _HALF * p.fault_latency
            service += 0 * PAGE_SIZE / p.gpu_populate_bw + half_bytes // PAGE_SIZE * p.fault_page_latency \
                + _HALF * p.fault_unmap_latency + 1 * p.fault_unmap_run_latency + new_chunks * p.fault_chunk_latency
            halves.append(service)
        hits = (_HALF * local + 0 * remote) * 1e9
        n_ev = len(ev_start)
        ev_t = np.empty((n_ev, 2), dtype=np.float64)
        bt = np.empty((nb, 2, 2), dtype=np.float64)   # per block, per half: copy start, copy end (= fault time)
        touch = np.empty(nb, dtype=np.int64)
        now = log.t
        r = 0
        for j in range(nb):
            k = j - free
            if k >= 0:
                c = runs_per_victim[k]
                if c <= 4:
                    for i in range(r, r + c):
                        ev_t[i, 0] = now
                        now = now + ev_secs_list[i] * 1e9
                        ev_t[i, 1] = now
                else:   # as EventLog.add_many's array path
                    ends = now + np.cumsum(np.asarray(ev_secs_list[r:r + c], dtype=np.float64) * 1e9)
                    ev_t[r:r + c, 0] = np.concatenate(([now], ends[:-1]))
                    ev_t[r:r + c, 1] = ends
                    now = float(ends[-1])
                r += c
            for h in range(2):
                bt[j, h, 0] = now
                now = now + copy_s * 1e9
                bt[j, h, 1] = now
                now += halves[h] * 1e9
                if h:
                    touch[j] = int(now)
                now += hits
        log.t = now
        # -- the records, in the order the general path appends them --------------------------------------------
        n_rec = n_ev + 4 * nb
        out = np.zeros(n_rec, dtype=EVENT_DTYPE)
        # Position of each block's first record: its victim's runs come first.
        per_block = np.full(nb, 4, dtype=np.int64)
        if n_evict:
            per_block[free:free + n_evict] += np.asarray(runs_per_victim, dtype=np.int64)
        first = np.concatenate(([0], np.cumsum(per_block)[:-1]))
        ev_pos = (first[free:free + n_evict, None] + np.arange(max(runs_per_victim, default=0))[None, :]) \
            if n_evict else None
        if n_ev:
            within = np.arange(n_ev) - np.repeat(np.concatenate(([0], np.cumsum(runs_per_victim)[:-1])),
                                                 runs_per_victim)
            idx = ev_pos[ev_victim, within]
            e = out[idx]
            e["kind"], e["flags"], e["src"], e["dst"] = EventKind.DTOH, MigrationCause.EVICTION, mem.device, HOST_ID
            e["start"], e["end"] = ev_t[:, 0].astype(np.uint64), ev_t[:, 1].astype(np.uint64)
            e["address"], e["bytes"], e["value"] = t.addresses(ev_start), ev_bytes, ev_bytes
            e["alloc_id"], e["stream"] = t.block_alloc[victims[ev_victim]], 0
            out[idx] = e
        base = first + per_block - 4                       # each block's four records: copy, fault, copy, fault
        half_pages = (blocks[:, None] * PAGES_PER_BLOCK + np.array([0, _HALF])[None, :]).reshape(-1)
        addr = t.addresses(half_pages)
        alloc = np.repeat(t.block_alloc[blocks], 2)
        starts = bt[:, :, 0].reshape(-1).astype(np.uint64)
        fault_t = bt[:, :, 1].reshape(-1).astype(np.uint64)
        pos_copy = (base[:, None] + np.array([0, 2])[None, :]).reshape(-1)
        c = np.zeros(2 * nb, dtype=EVENT_DTYPE)
        c["kind"], c["flags"], c["src"], c["dst"] = EventKind.HTOD, MigrationCause.COHERENCE, HOST_ID, processor
        c["start"], c["end"], c["address"], c["bytes"], c["value"] = starts, fault_t, addr, half_bytes, half_bytes
        c["alloc_id"], c["stream"] = alloc, stream
        out[pos_copy] = c
        f = np.zeros(2 * nb, dtype=EVENT_DTYPE)
        f["kind"], f["flags"] = EventKind.GPU_PAGE_FAULT, kind if write else AccessType.READ
        f["src"], f["dst"], f["start"], f["end"] = processor, processor, fault_t, fault_t
        f["address"], f["bytes"], f["value"], f["alloc_id"], f["stream"] = addr, half_bytes, _HALF, alloc, stream
        out[pos_copy + 1] = f
        log._flush_rows()
        log.chunks.append(out)
        # -- state, chunks and the FIFO, as the batches leave them ------------------------------------------------
        if n_evict:
            t.state[only] = 1
            for v in victims.tolist():
                mem.drop(v)
            mem.evicted_blocks += n_evict
        t.state[p0:p0 + nb * PAGES_PER_BLOCK] = g
        t.chunk[b0:b0 + nb] = True
        mem.used += nb
        tick = mem._tick
        for b in blocks.tolist():
            tick += 3                # claimed (one tick), then requeued by each of its two batches' migrations
            order[b] = tick
        t.last_use[b0:b0 + nb] = mem._tick + 1 + 3 * np.arange(nb)
        mem._tick = tick
        if thr.enabled:
            for b, when in zip(blocks.tolist(), touch.tolist(), strict=True):
                thr._touch[b] = (processor, when)
        stats.batches += 2 * nb
        stats.faults += nb * PAGES_PER_BLOCK
        stats.bytes_htod += nb * 2 * half_bytes
        stats.evictions += n_evict
        return nb * PAGES_PER_BLOCK

    def _upgrades(self, pages: np.ndarray, pos: int, wr: bool | np.ndarray, log: EventLog, stats: StreamStats, *,
                  local: float, remote: float, kind: AccessType, stream: int) -> int:
        """Service, all at once, a host thread's run of writes to ReadMostly pages that only the host holds.

        Each such write faults on the read-only mapping and the fault only upgrades it (nothing moves or is
        invalidated; :meth:`_service` with one page, ``read_mostly_host_write_latency``). From ``pages[pos]``
        on, while the pages rise and each access is such a write, this produces the records, clock, state
        and counters of servicing them one by one. Returns the accesses consumed (0: the general path runs).
        """
        t = self.table
        if self.thrashing.blocks:
            return 0
        if isinstance(wr, np.ndarray):
            if not wr[pos]:
                return 0
            stop = np.flatnonzero(~wr[pos:])
            end = pos + (int(stop[0]) if len(stop) else len(wr) - pos)
        elif not wr:
            return 0
        else:
            end = len(pages)
        span = pages[pos:end]
        ok = t.read_mostly[span] & (t.state[span] == 1) & ((t.writable[span] & 1) == 0)
        if len(span) > 1:
            ok[1:] &= span[1:] > span[:-1]
        k = len(span) if ok.all() else int(np.argmin(ok))
        if k == 0:
            return 0
        run = span[:k]
        # The clock, fault by fault, with the general path's float operations: service, then the access.
        steps = np.empty(2 * k + 1, dtype=np.float64)
        steps[0] = log.t
        steps[1::2] = self.platform.read_mostly_host_write_latency * 1 * 1e9
        steps[2::2] = (1 * local + 0 * remote) * 1e9
        clock = np.cumsum(steps)
        f = np.zeros(k, dtype=EVENT_DTYPE)
        f["kind"], f["flags"], f["src"], f["dst"] = EventKind.CPU_PAGE_FAULT, AccessType.UNKNOWN, HOST_ID, HOST_ID
        f["start"] = f["end"] = clock[0:2 * k:2].astype(np.uint64)
        f["address"], f["bytes"], f["value"] = t.addresses(run), PAGE_SIZE, 1
        f["alloc_id"], f["stream"] = t.block_alloc[run >> BLOCK_SHIFT], stream
        log._flush_rows()
        log.chunks.append(f)
        log.t = float(clock[-1])
        t.writable[run] = 1
        self.memory.release_if_empty(np.unique(run >> BLOCK_SHIFT))
        stats.batches += k
        stats.faults += k
        return k

    def _keep(self, name: str) -> dict:
        """A dict of values the fast paths work out once from the platform and the prefetcher's settings,
        emptied if any of those has changed since."""
        settings = (self.platform, self.prefetch, self.threshold)
        if self._kept_for != settings:
            self._kept_for, self._kept = settings, {}
        return self._kept.setdefault(name, {})

    # -- the host-run fast path ----------------------------------------------------------------------------------
    def _host_run(self, pages: np.ndarray, pos: int, log: EventLog, stats: StreamStats, *, local: float,
                  remote: float, stream: int) -> int:
        """Service, all at once, a host thread's faults along consecutive pages of blocks it takes from the front.

        A host thread faults one page at a time. Where, from ``pages[pos]`` (a fault) on, the accesses are
        consecutive pages, and each block they cross holds its first pages on the host only and every other
        page in one place (the GPU only, or nowhere), with no advice, remote mapping or thrashing state,
        each fault is a plain one (:meth:`_service_plain`): the page comes to the host with the pages the
        density prefetcher adds, which run from it to the end of its subtree (64K, 64K, 128K ... 1M from the
        start of a block), so the block stays "host up to a frontier" and the next fault is at the frontier.
        The faults of a block are therefore a fixed schedule (:meth:`_host_schedule`), and this produces
        their records, clock, state and counters, and those of the accesses that hit between them, with one
        pass over arrays. It stops after the last fault of the run, or before a fault that would give a
        block thrashing state. Returns the accesses consumed (0: the general path runs).
        """
        t, p, mem, thr = self.table, self.platform, self.memory, self.thrashing
        n = len(pages)
        p0 = int(pages[pos])
        lane0 = p0 & (PAGES_PER_BLOCK - 1)
        b0 = p0 >> BLOCK_SHIFT
        # Cheap refusals first: a fault that starts no such run is turned away here, most of the time (the
        # page before it must be at the host, the block's last page where it is).
        if pos + 1 >= n or int(pages[pos + 1]) != p0 + 1 or int(t.state[p0]) not in (0, mem.bit) \
                or (lane0 and t.state[p0 - 1] != 1) or b0 in thr.blocks \
                or t.state[b0 * PAGES_PER_BLOCK + int(t.block_pages[b0]) - 1] != t.state[p0]:
            return 0
        # Look to the end of the first block, then 8x further while the run lasts.
        limit, window = n - pos, PAGES_PER_BLOCK - lane0
        while True:
            m = min(window, limit)
            run = self._host_blocks(pages, pos, m)
            if run is None:
                return 0
            if run[0] < m or m == limit:
                break
            window *= 8
        m, frontier, beyond, npages = run
        nb = len(frontier)
        # -- the faults: each block's schedule from its frontier, cut where the run ends ------------------------
        end_lane = np.full(nb, PAGES_PER_BLOCK, dtype=np.int64)
        end_lane[-1] = ((p0 + m - 1) & (PAGES_PER_BLOCK - 1)) + 1
        lanes_l, his_l, rows_l = [], [], []
        for j, (f, npg, stop) in enumerate(zip(frontier.tolist(), npages.tolist(), end_lane.tolist(), strict=True)):
            if f >= min(npg, stop):
                continue
            sched = self._host_schedule(f, npg)
            if sched is None:    # not a run from the front (a prefetcher setting that skips pages): stop here
                m = (b0 + j) * PAGES_PER_BLOCK - p0
                break
            lanes, his = sched
            if stop < npg:
                k = int(np.searchsorted(lanes, stop))
                lanes, his = lanes[:k], his[:k]
            lanes_l.append(lanes)
            his_l.append(his)
            rows_l.append(np.full(len(lanes), j, dtype=np.int64))
        if not lanes_l:
            return 0
        row = np.concatenate(rows_l)
        base = (b0 + row) * PAGES_PER_BLOCK
        fault = base + np.concatenate(lanes_l)         # global pages that fault, in order
        hi = base + np.concatenate(his_l)              # each fault brings [fault, hi) to the host
        from_gpu = beyond[row] != 0
        n_extra = hi - fault - 1
        at = pos + (fault - p0)                        # where each fault sits in the stream
        nf = len(fault)
        # -- the clock, step by step, with the general path's float operations ---------------------------------
        # Per fault: the copy of the page and that of its neighbours (from the GPU), the service, the faulted
        # access; then the accesses that hit up to the next fault, in the scan windows _run_chunk takes.
        gap = np.zeros(nf, dtype=np.int64)
        gap[:-1] = at[1:] - at[:-1] - 1
        full = np.where(gap < _SCAN_CUM[-1], np.searchsorted(_SCAN_CUM, gap, side="right"),
                        len(_SCAN_CUM) + (gap - _SCAN_CUM[-1]) // _SCAN)
        rest = gap - np.where(full <= len(_SCAN_CUM), _SCAN_CUM0[np.minimum(full, len(_SCAN_CUM))],
                              _SCAN_CUM[-1] + (full - len(_SCAN_CUM)) * _SCAN)
        groups = full + (rest > 0)
        n_copy = from_gpu.astype(np.int64) + (from_gpu & (n_extra > 0))
        count = n_copy + 2 + groups
        first = np.zeros(nf + 1, dtype=np.int64)
        np.cumsum(count, out=first[1:])
        steps = np.empty(int(first[-1]) + 1, dtype=np.float64)
        steps[0] = log.t
        s = first[:-1] + 1                             # each fault's first step in ``steps``
        copy_step = self._keep("host_copy_steps")
        for k in np.unique(np.concatenate(([1], n_extra[from_gpu & (n_extra > 0)]))).tolist():
            if k not in copy_step:
                secs = link_seconds(np.array([k], dtype=np.uint64) * PAGE_SIZE, p.fault_dtoh_bw, p.link_k)
                copy_step[k] = secs.tolist()[0] * 1e9
        steps[s[from_gpu]] = copy_step[1]
        two = from_gpu & (n_extra > 0)
        if two.any():
            steps[s[two] + 1] = [copy_step[k] for k in n_extra[two].tolist()]
        svc = s + n_copy
        steps[svc] = self._host_service_step(from_gpu, n_extra)
        steps[svc + 1] = (1 * local + 0 * remote) * 1e9
        if groups.any():
            g_fault = np.repeat(np.arange(nf), groups)
            g_index = np.arange(len(g_fault)) - np.repeat(np.cumsum(groups) - groups, groups)
            size = np.where(g_index < full[g_fault], _SCAN_SIZES[np.minimum(g_index, len(_SCAN_SIZES) - 1)],
                            rest[g_fault])
            steps[svc[g_fault] + 2 + g_index] = (size * local + 0 * remote) * 1e9
        clock = np.cumsum(steps)
        served_at = clock[svc]                     # the clock when each fault's service ends
        # R7: a block's first migration back here within the lapse of the GPU's makes thrashing state: the
        # general path takes that fault.
        cut = nf
        if thr.enabled:
            lapse = thr.c.lapse
            blk = b0 + row
            new_block = np.ones(nf, dtype=bool)
            new_block[1:] = row[1:] != row[:-1]
            for i in np.flatnonzero(new_block & from_gpu).tolist():
                last = thr._touch.get(int(blk[i]))
                if last is not None and last[0] != HOST_ID and int(served_at[i]) - last[1] <= lapse:
                    cut = i
                    break
            if cut == 0:
                return 0
        # -- the records, in the order the general path appends them -------------------------------------------
        fault, hi, row, from_gpu, n_extra, s, svc = (a[:cut] for a in (fault, hi, row, from_gpu, n_extra, s, svc))
        two = from_gpu & (n_extra > 0)
        per = n_copy[:cut] + 1
        rec = np.zeros(cut + 1, dtype=np.int64)
        np.cumsum(per, out=rec[1:])
        out = np.zeros(int(rec[-1]), dtype=EVENT_DTYPE)
        alloc = t.block_alloc[b0 + row]
        addr = t.addresses(fault)
        g_rec = rec[:-1][from_gpu]
        c = out[g_rec]
        c["kind"], c["flags"], c["src"], c["dst"] = EventKind.DTOH, MigrationCause.COHERENCE, mem.device, HOST_ID
        c["start"], c["end"] = clock[s[from_gpu] - 1].astype(np.uint64), clock[s[from_gpu]].astype(np.uint64)
        c["address"], c["bytes"], c["value"] = addr[from_gpu], PAGE_SIZE, PAGE_SIZE
        c["alloc_id"], c["stream"] = alloc[from_gpu], stream
        out[g_rec] = c
        if two.any():
            e = out[rec[:-1][two] + 1]
            nbytes = n_extra[two].astype(np.uint64) * PAGE_SIZE
            e["kind"], e["flags"], e["src"], e["dst"] = EventKind.DTOH, MigrationCause.PREFETCH, mem.device, HOST_ID
            e["start"], e["end"] = clock[s[two]].astype(np.uint64), clock[s[two] + 1].astype(np.uint64)
            e["address"], e["bytes"], e["value"] = addr[two] + np.uint64(PAGE_SIZE), nbytes, nbytes
            e["alloc_id"], e["stream"] = alloc[two], stream
            out[rec[:-1][two] + 1] = e
        f = np.zeros(cut, dtype=EVENT_DTYPE)
        when = clock[svc - 1].astype(np.uint64)
        f["kind"], f["flags"], f["src"], f["dst"] = EventKind.CPU_PAGE_FAULT, AccessType.UNKNOWN, HOST_ID, HOST_ID
        f["start"], f["end"], f["address"], f["value"] = when, when, addr, 1
        f["bytes"] = np.where(from_gpu, 1, hi - fault).astype(np.uint64) * PAGE_SIZE
        f["alloc_id"], f["stream"] = alloc, stream
        out[rec[1:] - 1] = f
        log._flush_rows()
        log.chunks.append(out)
        if cut < nf:   # up to the fault the general path takes, with the hits before it
            log.t = float(clock[first[cut]])
            done = int(at[cut]) - pos
        else:
            log.t = float(clock[-1])
            done = int(at[nf - 1]) + 1 - pos
        # -- state: every page brought here is on the host only; a block emptied of GPU pages gives its chunk back
        length = hi - fault
        t.state[np.repeat(fault - (np.cumsum(length) - length), length) + np.arange(int(length.sum()))] = 1
        last = np.ones(cut, dtype=bool)
        last[:-1] = row[1:] != row[:-1]
        done_rows = last & from_gpu
        for b, h, npg in zip((b0 + row[done_rows]).tolist(), (hi - base[:cut])[done_rows].tolist(),
                             npages[row[done_rows]].tolist(), strict=True):
            if h == npg:
                mem.drop(b)
        if thr.enabled:
            for b, now in zip((b0 + row[done_rows]).tolist(), served_at[:cut][done_rows].tolist(), strict=True):
                thr._touch[b] = (HOST_ID, int(now))
        stats.batches += cut
        stats.faults += cut
        moved = int(np.count_nonzero(from_gpu)) + int(n_extra[from_gpu].sum())
        stats.bytes_dtoh += moved * PAGE_SIZE
        stats.bytes_prefetched += int(n_extra[from_gpu].sum()) * PAGE_SIZE
        return done

    def _host_blocks(self, pages: np.ndarray, pos: int, m: int) -> tuple | None:
        """For :meth:`_host_run`: ``(m, frontier, beyond, npages)`` over the blocks that the first ``m`` accesses
        from ``pos`` cross, cut to the consecutive pages in blocks it can service (None: not even the first).

        ``frontier`` is a block's leading pages on the host only, ``beyond`` the state of every page after them.
        """
        t, thr = self.table, self.thrashing
        p0 = int(pages[pos])
        off = np.flatnonzero(pages[pos:pos + m] != p0 + np.arange(m, dtype=np.int64))
        if len(off):
            m = int(off[0])
        b0, b1 = p0 >> BLOCK_SHIFT, (p0 + m - 1) >> BLOCK_SHIFT
        nb = b1 - b0 + 1
        sl = slice(b0 * PAGES_PER_BLOCK, (b1 + 1) * PAGES_PER_BLOCK)
        st = t.state[sl].reshape(nb, PAGES_PER_BLOCK)
        npages = t.block_pages[b0:b1 + 1].astype(np.int64)
        valid = _LANES[None, :] < npages[:, None]
        away = (st != 1) & valid
        frontier = np.where(away.any(axis=1), np.argmax(away, axis=1), npages)
        beyond = st[np.arange(nb), np.minimum(frontier, PAGES_PER_BLOCK - 1)]
        beyond = np.where(frontier < npages, beyond, 0)
        ok = ((st == beyond[:, None]) | (_LANES[None, :] < frontier[:, None]) | (~valid & (st == 0))).all(axis=1)
        ok &= (beyond == 0) | (beyond == self.memory.bit)
        ok &= ~t.read_mostly[sl].reshape(nb, -1).any(axis=1)
        ok &= (t.preferred[sl] == NO_LOCATION).reshape(nb, -1).all(axis=1)
        ok &= ((t.accessed_by[sl] | t.remote[sl]) == 0).reshape(nb, -1).all(axis=1)
        ok[:-1] &= npages[:-1] == PAGES_PER_BLOCK
        if thr.blocks:
            ok &= np.array([b not in thr.blocks for b in range(b0, b1 + 1)])
        ok[0] &= int(frontier[0]) == p0 & (PAGES_PER_BLOCK - 1)
        k = nb if ok.all() else int(np.argmin(ok))
        if k == 0:
            return None
        if k < nb:
            m = (b0 + k) * PAGES_PER_BLOCK - p0
        return m, frontier[:k], beyond[:k], npages[:k]

    def _host_schedule(self, frontier: int, npages: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The faults a host thread takes walking up a block from ``frontier`` (pages below it at the host, none
        above): ``(lanes, his)``, each fault bringing lanes ``[lane, hi)`` (the prefetcher's region), or None
        where some region is not of that form. Depends only on the block's size and the prefetcher's settings.
        """
        schedules = self._keep("host_schedules")
        key = (frontier, npages)
        if key in schedules:
            return schedules[key]
        lanes, his = [], []
        f = frontier
        out: tuple[np.ndarray, np.ndarray] | None = None
        while f < npages:
            hi = f + 1
            if self.prefetch:
                resident, faulted = np.zeros(PAGES_PER_BLOCK, dtype=bool), np.zeros(PAGES_PER_BLOCK, dtype=bool)
                resident[:f] = True
                faulted[f] = True
                near = block_prefetch(resident, faulted, npages, self.threshold)
                if len(near):
                    if int(near[0]) != f + 1 or int(near[-1]) - f != len(near):
                        break
                    hi = int(near[-1]) + 1
            lanes.append(f)
            his.append(hi)
            f = hi
        else:
            out = (np.array(lanes, dtype=np.int64), np.array(his, dtype=np.int64))
        schedules[key] = out
        return out

    def _host_service_step(self, from_gpu: np.ndarray, n_extra: np.ndarray) -> np.ndarray:
        """``service * 1e9`` of each plain host fault, as :meth:`_service_plain` computes it (the same operations)."""
        p = self.platform
        cache = self._keep("host_service_steps")
        keys = list(zip(from_gpu.tolist(), n_extra.tolist(), strict=True))
        for key in set(keys):
            if key not in cache:
                gpu, extra = key
                moved = 1 + extra if gpu else 0
                n_populated = 0 if gpu else 1 + extra
                moved_bytes = moved * PAGE_SIZE
                service = p.cpu_fault_latency
                service += n_populated * PAGE_SIZE / p.host_populate_bw + moved_bytes // PAGE_SIZE \
                    * p.fault_page_latency + moved * p.fault_unmap_latency + (1 if moved else 0) \
                    * p.fault_unmap_run_latency
                cache[key] = service * 1e9
        return np.array([cache[k] for k in keys], dtype=np.float64)

    def _sweepable(self, pages: np.ndarray, pos: int, m: int, wr: bool | np.ndarray) -> int:
        """Whole blocks among the ``m`` accesses from ``pos`` that a sweep can service at once (see :meth:`_sweep`)."""
        t = self.table
        p0 = int(pages[pos])
        seq = pages[pos:pos + m]
        off = np.flatnonzero(seq != p0 + np.arange(m, dtype=np.int64))
        m = (int(off[0]) if len(off) else m) // PAGES_PER_BLOCK * PAGES_PER_BLOCK
        if isinstance(wr, np.ndarray) and m:
            w = wr[pos:pos + m]
            change = np.flatnonzero(w != w[0])
            m = (int(change[0]) if len(change) else m) // PAGES_PER_BLOCK * PAGES_PER_BLOCK
        nb = m // PAGES_PER_BLOCK
        if nb == 0:
            return 0
        b0 = p0 >> BLOCK_SHIFT
        sl = slice(p0, p0 + m)
        shape = (nb, PAGES_PER_BLOCK)
        ok = (t.block_pages[b0:b0 + nb] == PAGES_PER_BLOCK) & ~t.chunk[b0:b0 + nb]
        ok &= (t.state[sl] == 1).reshape(shape).all(axis=1)
        ok &= ~t.read_mostly[sl].reshape(shape).any(axis=1)
        ok &= (t.preferred[sl] == NO_LOCATION).reshape(shape).all(axis=1)
        ok &= ((t.accessed_by[sl] | t.remote[sl]) == 0).reshape(shape).all(axis=1)
        return int(np.argmin(ok)) if not ok.all() else nb

    def _hits(self, pages: np.ndarray, n_local: int, n_remote: int, local: float, remote: float,
              bytes_per_access: int, log: EventLog, stats: StreamStats, processor: int) -> None:
        log.t += (n_local * local + n_remote * remote) * 1e9
        stats.bytes_remote += n_remote * bytes_per_access
        if processor != HOST_ID and self.memory.policy != "fifo":
            self.memory.accessed(np.unique(pages >> BLOCK_SHIFT))

    def _count_remote(self, pages: np.ndarray, processor: int, log: EventLog, stats: StreamStats, stream: int) -> None:
        """Access counters (R9): remote accesses per 2 MiB region; past the threshold the region migrates."""
        t = self.table
        blocks, counts = np.unique(pages >> BLOCK_SHIFT, return_counts=True)
        t.counters[blocks] += counts.astype(np.int32)
        hot = blocks[t.counters[blocks] >= self.platform.access_counter_threshold]
        for b in hot.tolist():
            t.counters[b] = 0
            lo = b * PAGES_PER_BLOCK
            pg = np.arange(lo, lo + int(t.block_pages[b]), dtype=np.int64)
            st = t.state[pg]
            g = 1 << (processor + 1)
            # Serviced as a prefetch-type access: a preferred location elsewhere keeps the data there.
            move = pg[((st & g) == 0) & (st != 0) & (t.preferred[pg] != HOST_ID)]
            if not len(move) or not self.memory.claim(np.array([b]), {b}, log)[0]:
                continue
            dup = t.read_mostly[move]
            self._copy(move, HOST_ID, processor, MigrationCause.ACCESS_COUNTERS, self.platform.fault_htod_bw, log,
                       stats, stream)
            t.state[move[dup]] |= np.uint8(g)
            t.writable[move[dup]] = 0
            t.state[move[~dup]] = g
            t.remote[move] &= np.uint8(~g & 0xFF)
            self.memory.migrated_into(np.array([b]))

    # -- one batch -----------------------------------------------------------------------------------------------
    def _service(self, pages: np.ndarray, wr: np.ndarray, processor: int, log: EventLog, stats: StreamStats,
                 kind: AccessType, stream: int) -> None:
        t, p, mem = self.table, self.platform, self.memory
        host = processor == HOST_ID
        g = 1 if host else 1 << (processor + 1)
        st = t.state[pages]
        pref = t.preferred[pages]
        nowhere = st == 0
        now = int(log.t)
        stats.batches += 1
        stats.faults += len(pages)
        # -- R7: throttling and pins -----------------------------------------------------------------------
        pin = None
        if self.thrashing.blocks:
            reach_all = (pref == HOST_ID) | ((pref >= 0) & p.cpu_maps_gpu_memory)
            throttle, pin = self.thrashing.hints(pages, processor, now, pref, reach_all)
            if throttle.any():
                starts, lengths = page_runs(pages[throttle])
                log.add_many(EventKind.THROTTLING, flags=0, src=processor, dst=processor,
                             address=t.addresses(starts), nbytes=lengths.astype(np.uint64) * PAGE_SIZE,
                             alloc_id=t.block_alloc[starts >> BLOCK_SHIFT], seconds=self.thrashing.c.nap / 1e9,
                             advance=False)
                log.t += self.thrashing.c.nap          # the faults are dropped and replayed after the nap
                stats.throttles += int(throttle.sum())
            if not (pin != NO_LOCATION).any():
                pin = None
        # -- R3: the destination of each faulting page ---------------------------------------------------------
        out = self._destinations(pages, st, pref, nowhere, wr, processor, g, pin)
        to_here = (out == _MIGRATE) | (out == _DUP) | (out == _POPULATE)
        # -- R5: the density prefetcher grows what comes here ----------------------------------------------------
        extra = pages[:0]
        if to_here.any():
            extra = self._prefetch_pages(pages, to_here, processor, g)
        # -- R1/R6: chunks for the blocks that receive pages on a GPU ---------------------------------------
        lost = None
        new_chunks = 0
        if not host:
            keep = to_here | (out == _COLLAPSE)
            blocks = np.union1d(_blocks_of(pages[keep]), _blocks_of(extra))
            if len(blocks):
                before = mem.evicted_blocks
                had = t.chunk[blocks]
                got = mem.claim(blocks, set(blocks.tolist()), log)
                new_chunks = int(np.count_nonzero(got & ~had))
                stats.evictions += mem.evicted_blocks - before
                if not got.all():
                    # No GPU memory can be freed (it is all cudaMalloc): map the host copy remotely instead.
                    lost = blocks[~got]
                    fail = np.isin(pages >> BLOCK_SHIFT, lost) & keep
                    out[fail & nowhere] = _NONE      # left untouched: nothing can hold it on the GPU
                    out[fail & ~nowhere] = _REMOTE
                    extra = extra[~np.isin(extra >> BLOCK_SHIFT, lost)]
                    to_here = (out == _MIGRATE) | (out == _DUP) | (out == _POPULATE)
        # -- the changes, and their records ------------------------------------------------------------------
        src_bw = p.fault_dtoh_bw if host else p.fault_htod_bw
        moved = pages[(out == _MIGRATE) | (out == _DUP)]
        ex_st = t.state[extra]
        # Prefetched neighbours take the batch's access type: a write batch moves ReadMostly pages instead of
        # duplicating them (otherwise every following write would fault again on a read-only copy).
        ex_dup = t.read_mostly[extra] & (ex_st != 0) & (not wr.any())
        ex_rm_moved = extra[t.read_mostly[extra] & (ex_st != 0) & ~ex_dup]
        ex_moved = extra[ex_st != 0]
        ex_pop = extra[ex_st == 0]
        source = HOST_ID if not host else self._gpu_of(np.concatenate((st[(out == _MIGRATE) | (out == _DUP)], ex_st)))
        # The source's mapping changes for a migration (unmapped) and for a duplicate its holder may write
        # (write revoked); a duplicate of a read-only page leaves it alone.
        sb = 1 if source == HOST_ID else 1 << (source + 1)
        dup_pages = np.concatenate((pages[out == _DUP], extra[ex_dup]))
        unmapped = len(moved) + len(ex_moved) - len(dup_pages) + int(np.count_nonzero(t.writable[dup_pages] & sb))
        moved_bytes = self._copy(moved, source, processor, MigrationCause.COHERENCE, src_bw, log, stats, stream)
        moved_bytes += self._copy(ex_moved, source, processor, MigrationCause.PREFETCH, src_bw, log, stats, stream)
        stats.bytes_prefetched += len(ex_moved) * PAGE_SIZE
        if host and wr.any():  # a host write moves a ReadMostly page: its fault record cannot say "write"
            rm_written = pages[(out == _MIGRATE) & wr & t.read_mostly[pages]]
            if len(rm_written):
                ex_rm_moved = np.union1d(ex_rm_moved, rm_written)
        if len(ex_rm_moved):   # moved, not copied: the source's copy goes (the map would keep a duplicate)
            mem.invalidate(ex_rm_moved, log, src=source)
        collapse = pages[out == _COLLAPSE]
        if len(collapse):      # a write to a read-duplicated page: the other copies go
            others = t.state[collapse] & np.uint8(~g & 0xFF)
            for q in (HOST_ID, *range(mem.device, mem.device + 1)):
                qb = 1 if q == HOST_ID else 1 << (q + 1)
                mem.invalidate(collapse[(others & qb) != 0], log, src=q)
        remote_pages = pages[(out == _REMOTE) | (out == _POP_REMOTE)]
        if len(remote_pages):
            cause = RemoteMapCause.OUT_OF_MEMORY if lost is not None else (
                RemoteMapCause.THRASHING if pin is not None else RemoteMapCause.POLICY)
            starts, lengths = page_runs(remote_pages)
            log.add_many(EventKind.REMOTE_MAP, flags=cause, src=HOST_ID if not host else mem.device, dst=processor,
                         address=t.addresses(starts), nbytes=lengths.astype(np.uint64) * PAGE_SIZE,
                         alloc_id=t.block_alloc[starts >> BLOCK_SHIFT])
        # Fault records: one per run of faulted or first-touched pages, reads and writes apart.
        populated = np.concatenate((pages[(out == _POPULATE) | (out == _POP_REMOTE)], ex_pop))
        served = out != _NONE
        reads, writes = pages[~wr & served], pages[wr & served]
        if len(ex_pop):   # first-touched neighbours ride in the batch's records (a write batch's if any)
            if len(writes):
                writes = np.union1d(writes, ex_pop)
            else:
                reads = np.union1d(reads, ex_pop)
        fault_kind = EventKind.CPU_PAGE_FAULT if host else EventKind.GPU_PAGE_FAULT
        if host:
            # A host write to a ReadMostly page it alone holds moves and invalidates nothing: the driver only
            # upgrades the read-only mapping. That fault costs less than one that copies (measured on an H200).
            upgrade = (out == _COLLAPSE) & (st == g)
            service = (p.read_mostly_host_write_latency * len(pages) if upgrade.all() and not len(extra)
                       else p.cpu_fault_latency)
        else:
            service = p.fault_batch_latency + p.fault_block_latency * len(_blocks_of(pages)) \
                + len(pages) * p.fault_latency
        populate_bw = p.host_populate_bw if host else p.gpu_populate_bw
        # Per range of source pages unmapped (or write-protected): a TLB shootdown, whatever its size. Faulted
        # and prefetched pages are disjoint, each sorted: their union is a merge.
        migrated = np.sort(np.concatenate((moved, ex_moved)), kind="stable") if len(ex_moved) else moved
        ro_dups = dup_pages[(t.writable[dup_pages] & sb) == 0] if len(dup_pages) else dup_pages
        unmapped_pages = np.setdiff1d(migrated, ro_dups, assume_unique=True) if len(ro_dups) else migrated
        service += len(populated) * PAGE_SIZE / populate_bw + moved_bytes // PAGE_SIZE * p.fault_page_latency \
            + unmapped * p.fault_unmap_latency + _block_runs(unmapped_pages) * p.fault_unmap_run_latency \
            + new_chunks * p.fault_chunk_latency
        if not host and wr.any():
            # R3 (a): a GPU write taking a ReadMostly page to the writer costs per page (as measured on an H200).
            written = t.read_mostly[pages] & wr & ((out == _MIGRATE) | (out == _COLLAPSE))
            service += (int(np.count_nonzero(written)) + len(ex_rm_moved)) * p.read_mostly_write_latency
        faulted = pages if len(ex_pop) else None
        self._fault_records(reads, faulted, AccessType.READ, fault_kind, processor, log, stream)
        self._fault_records(writes, faulted, kind, fault_kind, processor, log, stream)
        log.t += service * 1e9
        # State.
        t.state[pages[(out == _MIGRATE) | (out == _POPULATE) | (out == _COLLAPSE)]] = g
        t.state[pages[out == _DUP]] |= np.uint8(g)
        t.state[ex_moved[~ex_dup[ex_st != 0]]] = g
        t.state[ex_moved[ex_dup[ex_st != 0]]] |= np.uint8(g)
        t.state[ex_pop] = g
        # Write permission on ReadMostly pages (R3 (a)): duplicates are read-only everywhere; what a write
        # takes to the writer (the faulted pages and, in a write batch, the neighbours) is mapped read-write.
        t.writable[pages[out == _DUP]] = 0
        t.writable[ex_moved[ex_dup[ex_st != 0]]] = 0
        if wr.any():
            rm = t.read_mostly[pages]
            t.writable[pages[rm & wr & ((out == _MIGRATE) | (out == _POPULATE) | (out == _COLLAPSE))]] = g
            t.writable[ex_rm_moved] = g
            t.writable[ex_pop[t.read_mostly[ex_pop]]] = g
        pop_remote = pages[out == _POP_REMOTE]
        if len(pop_remote):
            where = pref[out == _POP_REMOTE]
            t.state[pop_remote] = np.where(where >= 0, np.left_shift(1, where.astype(np.int16) + 1), 1).astype(
                np.uint8)
        if len(remote_pages):
            t.remote[remote_pages] |= np.uint8(g)
        arrived = np.concatenate((pages[to_here], extra))
        if len(arrived):
            t.remote[arrived] &= np.uint8(~g & 0xFF)
        if not host:
            mem.migrated_into(np.union1d(_blocks_of(pages[to_here]), _blocks_of(extra)))
        else:
            mem.release_if_empty(np.unique(np.concatenate((moved, ex_moved, collapse)) >> BLOCK_SHIFT))
        # R7: migrations caused by faults and the prefetcher feed the detector.
        if self.thrashing.enabled and len(migrated):
            hot = self.thrashing.on_migration(migrated, processor, int(log.t))
            if len(hot):
                starts, lengths = page_runs(np.sort(hot))
                log.add_many(EventKind.THRASHING, flags=0, src=processor, dst=processor,
                             address=t.addresses(starts), nbytes=lengths.astype(np.uint64) * PAGE_SIZE,
                             alloc_id=t.block_alloc[starts >> BLOCK_SHIFT])

    def _service_plain(self, pages: np.ndarray, wr: np.ndarray, processor: int, log: EventLog, stats: StreamStats,
                       kind: AccessType, stream: int) -> bool:
        """:meth:`_service` for the common batch, or False (having changed nothing) where it is not one.

        The common batch: no thrashing state anywhere, and faulting pages with no advice, no remote mapping
        and one copy each, none of it at the faulting processor; their prefetched neighbours are not
        ReadMostly; on a GPU, the chunks they need can be had by evicting. Then every page migrates (or is
        populated), nothing is duplicated, collapsed, invalidated or mapped remotely, and this does what
        :meth:`_service` does with the rules that cannot apply left out: the same records, clock
        (the same float operations in the same order), state and counters.
        """
        t, p, mem = self.table, self.platform, self.memory
        if self.thrashing.blocks:
            return False
        host = processor == HOST_ID
        g = 1 if host else 1 << (processor + 1)
        st = t.state[pages]
        if ((st & (st - 1)) | (st & g)).any() or (t.preferred[pages] != NO_LOCATION).any() \
                or t.read_mostly[pages].any() or (t.accessed_by[pages] | t.remote[pages]).any():
            return False
        blocks = _blocks_of(pages)
        # claim() can fail only when every chunk it could evict is one the batch needs.
        if not host and len(blocks) > mem.free_blocks + len(mem._order):
            return False
        extra = self._prefetch_pages(pages, np.ones(len(pages), dtype=bool), processor, g) if self.prefetch \
            else pages[:0]
        if len(extra) and t.read_mostly[extra].any():
            return False
        stats.batches += 1
        stats.faults += len(pages)
        new_chunks = 0
        if not host:
            # The prefetched pages lie in the faulting pages' blocks; the claim cannot fail (checked above).
            before = mem.evicted_blocks
            new_chunks = len(blocks) - int(np.count_nonzero(t.chunk[blocks]))
            mem.claim(blocks, set(blocks.tolist()), log)
            stats.evictions += mem.evicted_blocks - before
        nowhere = st == 0
        moved = pages[~nowhere] if nowhere.any() else pages
        ex_st = t.state[extra]
        ex_held = ex_st != 0
        ex_moved, ex_pop = extra[ex_held], extra[~ex_held]
        if host:
            source, src_bw = self._gpu_of(np.concatenate((st[~nowhere], ex_st))), p.fault_dtoh_bw
        else:
            source, src_bw = HOST_ID, p.fault_htod_bw
        unmapped = len(moved) + len(ex_moved)
        moved_bytes = self._copy(moved, source, processor, MigrationCause.COHERENCE, src_bw, log, stats, stream)
        moved_bytes += self._copy(ex_moved, source, processor, MigrationCause.PREFETCH, src_bw, log, stats, stream)
        stats.bytes_prefetched += len(ex_moved) * PAGE_SIZE
        # Fault records: one per run of faulted or first-touched pages, reads and writes apart.
        n_populated = len(pages) - len(moved) + len(ex_pop)
        any_write = bool(wr.any())
        if not any_write:
            reads, writes = pages, pages[:0]
        elif wr.all():
            reads, writes = pages[:0], pages
        else:
            reads, writes = pages[~wr], pages[wr]
        if len(ex_pop):   # disjoint from the faulted pages, each sorted: the union is a merge
            if len(writes):
                writes = np.sort(np.concatenate((writes, ex_pop)))
            else:
                reads = np.sort(np.concatenate((reads, ex_pop)))
        service = p.cpu_fault_latency if host else p.fault_batch_latency + p.fault_block_latency * len(blocks) \
            + len(pages) * p.fault_latency
        populate_bw = p.host_populate_bw if host else p.gpu_populate_bw
        # Every page that moves here loses its source mapping. Disjoint and sorted: the union is a merge.
        migrated = np.sort(np.concatenate((moved, ex_moved)), kind="stable") if len(ex_moved) else moved
        service += n_populated * PAGE_SIZE / populate_bw + moved_bytes // PAGE_SIZE * p.fault_page_latency \
            + unmapped * p.fault_unmap_latency + _block_runs(migrated) * p.fault_unmap_run_latency \
            + new_chunks * p.fault_chunk_latency
        # (No ReadMostly page is written: the general path's read_mostly_write_latency term adds 0.0.)
        fault_kind = EventKind.CPU_PAGE_FAULT if host else EventKind.GPU_PAGE_FAULT
        faulted = pages if len(ex_pop) else None
        self._fault_records(reads, faulted, AccessType.READ, fault_kind, processor, log, stream)
        self._fault_records(writes, faulted, kind, fault_kind, processor, log, stream)
        log.t += service * 1e9
        # State: every page here is now at the faulting processor only.
        t.state[pages] = g
        if len(extra):
            t.state[extra] = g
            t.remote[extra] &= np.uint8(~g & 0xFF)
        if not host:
            mem.migrated_into(blocks)
        else:
            mem.release_if_empty(np.unique(np.concatenate((moved, ex_moved)) >> BLOCK_SHIFT))
        # R7: migrations caused by faults and the prefetcher feed the detector.
        if self.thrashing.enabled and len(migrated):
            hot = self.thrashing.on_migration(migrated, processor, int(log.t))
            if len(hot):
                starts, lengths = page_runs(np.sort(hot))
                log.add_many(EventKind.THRASHING, flags=0, src=processor, dst=processor,
                             address=t.addresses(starts), nbytes=lengths.astype(np.uint64) * PAGE_SIZE,
                             alloc_id=t.block_alloc[starts >> BLOCK_SHIFT])
        return True

    def _service_run(self, pages: np.ndarray, wr: np.ndarray, processor: int, log: EventLog, stats: StreamStats,
                     kind: AccessType, stream: int) -> bool:
        """:meth:`_service_plain` for a GPU batch that is one run of consecutive pages in one block, or False
        (having changed nothing).

        Such a batch (a sweep's half block where :meth:`_sweep` does not apply: a stencil's rows, a tile's
        row) is the common one. Where the block holds no advice, remote mapping or thrashing state and every
        faulting page is on the host only (or nowhere), this does what :meth:`_service_plain` does with
        slices and scalars where that works with arrays: the same records, clock (the same float operations
        in the same order), state and counters.
        """
        t, p, mem = self.table, self.platform, self.memory
        k = len(pages)
        a = int(pages[0])
        z = a + k
        b = a >> BLOCK_SHIFT
        if processor == HOST_ID or k < 2 or self.thrashing.blocks or int(pages[-1]) != z - 1 \
                or (z - 1) >> BLOCK_SHIFT != b:
            return False
        lo = b * PAGES_PER_BLOCK
        row = slice(lo, lo + PAGES_PER_BLOCK)
        st = t.state[a:z]
        first = int(st[0])
        if first > 1 or (st != first).any() or t.read_mostly[row].any() or (t.preferred[row] != NO_LOCATION).any() \
                or (t.accessed_by[row] | t.remote[row]).any():
            return False
        has_chunk = bool(t.chunk[b])
        if not has_chunk and mem.free_blocks + len(mem._order) < 1:
            return False
        g = 1 << (processor + 1)
        npages = int(t.block_pages[b])
        extra = pages[:0]
        if self.prefetch:
            # R5 as _prefetch_pages takes it for one block with no advice: every candidate is eligible, and
            # the block is not populated whole (no page prefers the GPU).
            resident = (t.state[row] & g) != 0
            resident[npages:] = False
            faulted = np.zeros(PAGES_PER_BLOCK, dtype=bool)
            faulted[a - lo:z - lo] = True
            cand = block_prefetch(resident, faulted, npages, self.threshold)
            if len(cand):
                extra = lo + cand
        stats.batches += 1
        stats.faults += k
        blocks = np.array([b], dtype=np.int64)
        if not has_chunk:
            before = mem.evicted_blocks
            mem.claim(blocks, {b}, log)
            stats.evictions += mem.evicted_blocks - before
        moved = pages if first else pages[:0]
        ex_st = t.state[extra]
        ex_held = ex_st != 0
        ex_moved, ex_pop = extra[ex_held], extra[~ex_held]
        unmapped = len(moved) + len(ex_moved)
        moved_bytes = 0
        if first:   # one run: one copy (EventLog.add_many's few-records path, by hand)
            nbytes = k * PAGE_SIZE
            copy_seconds = self._keep("run_copy_seconds")
            secs = copy_seconds.get(nbytes)
            if secs is None:
                secs = copy_seconds[nbytes] = link_seconds(
                    np.array([k], dtype=np.int64).astype(np.uint64) * PAGE_SIZE, p.fault_htod_bw, p.link_k).tolist()[0]
            start = log.t
            end = start + secs * 1e9
            address = int(t.block_address[b]) + (a - lo) * PAGE_SIZE
            alloc = int(t.block_alloc[b])
            log.rows.append((EventKind.HTOD, MigrationCause.COHERENCE, HOST_ID, processor, int(start), int(end),
                             address, nbytes, nbytes, alloc, stream))
            log.t = end
            stats.bytes_htod += nbytes
            moved_bytes = nbytes
        moved_bytes += self._copy(ex_moved, HOST_ID, processor, MigrationCause.PREFETCH, p.fault_htod_bw, log, stats,
                                  stream)
        stats.bytes_prefetched += len(ex_moved) * PAGE_SIZE
        n_populated = k - len(moved) + len(ex_pop)
        service = p.fault_batch_latency + p.fault_block_latency * 1 + k * p.fault_latency
        migrated = np.sort(np.concatenate((moved, ex_moved)), kind="stable") if len(ex_moved) else moved
        service += n_populated * PAGE_SIZE / p.gpu_populate_bw + moved_bytes // PAGE_SIZE * p.fault_page_latency \
            + unmapped * p.fault_unmap_latency + _block_runs(migrated) * p.fault_unmap_run_latency \
            + (0 if has_chunk else 1) * p.fault_chunk_latency
        any_write = bool(wr.any())
        if len(ex_pop) or (any_write and not wr.all()):
            if not any_write:
                reads, writes = pages, pages[:0]
            elif wr.all():
                reads, writes = pages[:0], pages
            else:
                reads, writes = pages[~wr], pages[wr]
            if len(ex_pop):
                if len(writes):
                    writes = np.sort(np.concatenate((writes, ex_pop)))
                else:
                    reads = np.sort(np.concatenate((reads, ex_pop)))
            faulted = pages if len(ex_pop) else None
            self._fault_records(reads, faulted, AccessType.READ, EventKind.GPU_PAGE_FAULT, processor, log, stream)
            self._fault_records(writes, faulted, kind, EventKind.GPU_PAGE_FAULT, processor, log, stream)
        else:       # one run, every page faulted: one record
            now = int(log.t)
            log.rows.append((EventKind.GPU_PAGE_FAULT, kind if any_write else AccessType.READ, processor, processor,
                             now, now, int(t.block_address[b]) + (a - lo) * PAGE_SIZE, k * PAGE_SIZE, k,
                             int(t.block_alloc[b]), stream))
        log.t += service * 1e9
        t.state[a:z] = g
        if len(extra):
            t.state[extra] = g
        mem.migrated_into(blocks)
        if self.thrashing.enabled and len(migrated):
            hot = self.thrashing.on_migration(migrated, processor, int(log.t))
            if len(hot):
                starts, lengths = page_runs(np.sort(hot))
                log.add_many(EventKind.THRASHING, flags=0, src=processor, dst=processor,
                             address=t.addresses(starts), nbytes=lengths.astype(np.uint64) * PAGE_SIZE,
                             alloc_id=t.block_alloc[starts >> BLOCK_SHIFT])
        return True

    def _destinations(self, pages: np.ndarray, st: np.ndarray, pref: np.ndarray, nowhere: np.ndarray, wr: np.ndarray,
                      processor: int, g: int, pin: np.ndarray | None) -> np.ndarray:
        """R3's ordered rules, first match wins, per page."""
        t, p = self.table, self.platform
        host = processor == HOST_ID
        has = (st & g) != 0
        if pin is None and not (pref != NO_LOCATION).any() and not t.read_mostly[pages].any() \
                and not (t.accessed_by[pages] | t.remote[pages]).any() and not ((st & (st - 1)) != 0).any():
            # No advice and no duplicates: every rule but (d) and (g) is moot.
            return np.where(nowhere, _POPULATE, np.where(has, _COLLAPSE, _MIGRATE)).astype(np.int8)
        pinned = np.zeros(len(pages), dtype=bool) if pin is None else pin != NO_LOCATION
        # Can the faulting processor map memory at the preferred location? (x86: the CPU cannot map vidmem.)
        reach_pref = (pref == processor) | (pref == HOST_ID) if not host else (
            (pref == HOST_ID) | ((pref >= 0) & p.cpu_maps_gpu_memory))
        out = np.full(len(pages), _NONE, dtype=np.int8)
        undecided = np.ones(len(pages), dtype=bool)

        def decide(mask: np.ndarray, outcome: int | np.ndarray) -> None:
            m = mask & undecided
            out[m] = outcome if np.isscalar(outcome) else outcome[m]
            undecided[m] = False

        duplicated = (st & (st - 1)) != 0
        # (a) ReadMostly, or already duplicated and not pinned: a read copies, a write collapses to the writer.
        a = (t.read_mostly[pages] | (duplicated & ~pinned)) & ~nowhere
        decide(a & ~wr, _DUP)
        decide(a & wr, np.where(has, _COLLAPSE, _MIGRATE))
        # (b) the faulting processor is the preferred location.
        decide(pref == processor, np.where(nowhere, _POPULATE, np.where(has, _COLLAPSE, _MIGRATE)))
        # (c) a thrashing pin: use the pinned location.
        if pin is not None:
            here = pin == processor
            decide(pinned & here, np.where(nowhere, _POPULATE, _MIGRATE))
            decide(pinned & ~here, np.where(nowhere, _POP_REMOTE, _REMOTE))
        # (d) resident nowhere: the preferred location if the faulter can reach it, else the faulter (R2).
        decide(nowhere & (pref != NO_LOCATION) & reach_pref & (pref != processor), _POP_REMOTE)
        decide(nowhere, _POPULATE)
        # (e) AccessedBy the faulter, which can reach the current location: map remotely.
        reach_now = ((st & 1) != 0) if not host else ((st > 1) & p.cpu_maps_gpu_memory)
        decide(((t.accessed_by[pages] & g) != 0) & reach_now, _REMOTE)
        # (f) a preferred location the faulter can reach: the data goes (or stays) there, mapped remotely.
        # With one GPU the page is already at the preferred location whenever this rule applies.
        decide((pref != NO_LOCATION) & reach_pref, _REMOTE)
        # (g) otherwise: migrate to the faulting processor (a write to its own duplicate collapses).
        decide(undecided, np.where(has, _COLLAPSE, _MIGRATE))
        return out

    def _prefetch_pages(self, pages: np.ndarray, to_here: np.ndarray, processor: int, g: int) -> np.ndarray:
        """R5: the pages the density prefetcher adds for the blocks whose faults come to ``processor``."""
        t = self.table
        target = pages[to_here]
        blocks = _blocks_of(target)
        if not self.prefetch:
            return pages[:0]
        rows = len(blocks)
        # The batch's blocks, whole, as rows of 512 pages (the table holds whole blocks).
        st = t.state.reshape(-1, PAGES_PER_BLOCK)[blocks]
        npages = t.block_pages[blocks].astype(np.int64)
        partial = not (npages == PAGES_PER_BLOCK).all()
        valid = _LANES[None, :] < npages[:, None] if partial else None
        resident = (st & g) != 0
        if partial:
            resident &= valid
        row = np.searchsorted(blocks, target >> BLOCK_SHIFT) if rows > 1 else np.zeros(len(target), np.int64)
        lane = target & (PAGES_PER_BLOCK - 1)
        thrash = None
        if self.thrashing.blocks:
            thrash = self.thrashing.thrashing_rows(blocks)
            if partial:
                thrash &= valid
            if not thrash.any():
                thrash = None
        faulted = np.zeros(rows * PAGES_PER_BLOCK, dtype=bool)
        faulted[row * PAGES_PER_BLOCK + lane] = True
        if rows == 1 and thrash is None:
            cand = block_prefetch(resident[0], faulted, int(npages[0]), self.threshold)
        else:
            cand = self._region(resident, faulted, row, lane, npages, thrash)
        if len(cand):
            near = blocks[cand >> BLOCK_SHIFT] * PAGES_PER_BLOCK + (cand & (PAGES_PER_BLOCK - 1))
            near_st = st.reshape(-1)[cand]
            pref = t.preferred[near]
            # Never prefetched: thrashing pages, pages leaving their preferred location, pages kept remote by policy.
            eligible = ((pref == NO_LOCATION) | (pref == processor)) & ((t.remote[near] & g) == 0)
            eligible &= ~(((t.accessed_by[near] & g) != 0) & (near_st != 0))
            if thrash is not None:
                eligible &= ~thrash.reshape(-1)[cand]
            cand = cand[eligible]
        # A block with nothing resident anywhere, faulting towards its preferred location, is populated whole.
        empty = np.flatnonzero(~st.view(np.uint64).any(axis=1))
        if len(empty):
            pref_e = t.preferred.reshape(-1, PAGES_PER_BLOCK)[blocks[empty]]
            whole = (pref_e == processor).any(axis=1)
            if whole.any():
                add = whole[:, None] & (pref_e == processor) & ~faulted.reshape(rows, -1)[empty]
                if partial:
                    add &= valid[empty]
                flat_add = (empty[:, None] * PAGES_PER_BLOCK + np.arange(PAGES_PER_BLOCK)[None, :])[add]
                cand = np.union1d(cand, flat_add)
        return blocks[cand >> BLOCK_SHIFT] * PAGES_PER_BLOCK + (cand & (PAGES_PER_BLOCK - 1))

    def _region(self, resident: np.ndarray, faulted: np.ndarray, row: np.ndarray, lane: np.ndarray,
                npages: np.ndarray, thrash: np.ndarray | None) -> np.ndarray:
        """The density region's pages that are neither resident nor faulted, as sorted offsets into the rows."""
        lo, hi = dense_subtrees(resident, row, lane, npages, thrashing=thrash, threshold=self.threshold)
        # The faults' ranges are nested or disjoint (aligned subtrees): keep the outer ones, in order.
        flat = row * PAGES_PER_BLOCK
        start, stop = flat + lo, flat + hi
        some = stop > start
        if not some.all():
            start, stop = start[some], stop[some]
        if len(start) > 1:
            order = np.lexsort((start - stop, start))
            start, stop = start[order], stop[order]
            outer = np.ones(len(start), dtype=bool)
            outer[1:] = start[1:] >= np.maximum.accumulate(stop)[:-1]
            start, stop = start[outer], stop[outer]
        length = stop - start
        region = np.arange(int(length.sum()), dtype=np.int64) + np.repeat(start - (np.cumsum(length) - length), length)
        return region[~resident.reshape(-1)[region] & ~faulted[region]]

    # -- records ----------------------------------------------------------------------------------------------
    def _copy(self, pages: np.ndarray, src: int, dst: int, cause: MigrationCause, bw: float, log: EventLog,
              stats: StreamStats, stream: int) -> int:
        """Emit the copies of ``pages`` (sorted) from ``src`` to ``dst``, one per run; returns bytes."""
        if not len(pages):
            return 0
        t = self.table
        starts, lengths = page_runs(pages, distinct=True)
        nbytes = lengths.astype(np.uint64) * PAGE_SIZE
        log.add_many(EventKind.DTOH if dst == HOST_ID else EventKind.HTOD, flags=cause, src=src, dst=dst,
                     address=t.addresses(starts), nbytes=nbytes, alloc_id=t.block_alloc[starts >> BLOCK_SHIFT],
                     stream=stream, seconds=link_seconds(nbytes, bw, self.platform.link_k))
        total = len(pages) * PAGE_SIZE
        if dst == HOST_ID:
            stats.bytes_dtoh += total
        else:
            stats.bytes_htod += total
        return total

    def _fault_records(self, pages: np.ndarray, faulted: np.ndarray | None, access: AccessType, kind: EventKind,
                       processor: int, log: EventLog, stream: int) -> None:
        """One fault record per run; ``value`` is the number of faults in it (first-touch neighbours add none)."""
        if not len(pages):
            return
        t = self.table
        if kind == EventKind.CPU_PAGE_FAULT:   # CUPTI gives a CPU fault no access type: nor does the simulator
            access = AccessType.UNKNOWN
        starts, lengths = page_runs(pages, distinct=True)
        if faulted is None:        # every page of these records faulted
            per_run = lengths
        else:
            is_fault = np.isin(pages, faulted, assume_unique=True)
            per_run = np.add.reduceat(is_fault.astype(np.int64), np.concatenate(([0], np.cumsum(lengths)[:-1])))
        log.add_many(kind, flags=access, src=processor, dst=processor, address=t.addresses(starts),
                     nbytes=lengths.astype(np.uint64) * PAGE_SIZE, value=per_run,
                     alloc_id=t.block_alloc[starts >> BLOCK_SHIFT], stream=stream)

    @staticmethod
    def _gpu_of(states: np.ndarray) -> int:
        """The device holding pages being migrated to the host (the lowest GPU bit present)."""
        gpus = int(np.bitwise_or.reduce(states)) >> 1 if len(states) else 1
        return (gpus & -gpus).bit_length() - 1 if gpus else 0
