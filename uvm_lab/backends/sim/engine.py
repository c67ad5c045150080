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

Cost of a GPU batch: a round trip, plus a service time per VA block, per 2 MiB chunk it allocates and per
fault, plus each copy on the size-dependent link, plus a cost per page copied, per page unmapped at the source
and per contiguous range unmapped (a TLB shootdown), plus synchronous evictions. Accesses that hit cost
their bytes at the GPU's (or, through a remote mapping, the link's) bandwidth, capped by what the warps
in flight can issue. The link is full duplex: remote writes overlap remote reads, and a stream pays only for
the direction that carries more.

Every batch is serviced by :meth:`FaultEngine._service`, the rules as written. Where the C extension was built,
a plain GPU batch (no advice, duplicate, remote mapping or thrashing state; FIFO eviction) is serviced by its
twin in ``_service.c``, and a stream's run of such batches with the hits between them by ``_run.c``: the same
records, clock, state and counters, which the tests hold to ``_service``'s.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from ...events.schema import AccessType, EventKind, MigrationCause, RemoteMapCause
from ...location import HOST_ID
from ...units import PAGE_SIZE
from .compiled import COMPILED, core
from .eviction import GpuMemory
from .model import BLOCK_SHIFT, NO_LOCATION, PAGES_PER_BLOCK, EventLog, PageTable, page_runs
from .platform import Platform, link_seconds
from .prefetcher import DEFAULT_THRESHOLD, block_prefetch, dense_subtrees
from .records import link_table, run_records
from .thrashing import ThrashingDetector

__all__ = ["FaultEngine", "StreamStats"]

_LANES = np.arange(PAGES_PER_BLOCK)
_SCAN = 1 << 16   # accesses checked at once while looking for the next fault


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


def blocks_of(pages: np.ndarray) -> np.ndarray:
    """The distinct blocks of sorted pages."""
    b = pages >> BLOCK_SHIFT
    return b[np.concatenate(([True], b[1:] != b[:-1]))] if len(b) > 1 else b


def block_runs(pages: np.ndarray) -> int:
    """Runs of consecutive sorted pages, split where a 2 MiB block ends (the driver copies block by block)."""
    if len(pages) < 2:
        return len(pages)
    return 1 + int(np.count_nonzero((pages[1:] != pages[:-1] + 1) | ((pages[1:] & (PAGES_PER_BLOCK - 1)) == 0)))


def _written(remote: np.ndarray, n_remote: int, write: bool | np.ndarray, n: int) -> int:
    """How many of the ``n_remote`` remote accesses (``remote``, a mask over ``n`` accesses) are writes."""
    if not n_remote or write is False:
        return 0
    if isinstance(write, np.ndarray):
        return int(np.count_nonzero(remote & write[:n]))
    return n_remote if write else 0


def _host_access_cost(write: bool | np.ndarray, read_cost: float, write_cost: float) -> float:
    """What one host access of a chunk costs: a read's or a write's, or for a mix their mean over the chunk
    (the hits are charged at one rate a chunk, so a mix gets its total right, not each access's time)."""
    if not isinstance(write, np.ndarray):
        return write_cost if write else read_cost
    if not len(write):
        return read_cost
    return read_cost + (write_cost - read_cost) * (np.count_nonzero(write) / len(write))


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
        #: Find the accesses that proceed with ``_access.c``, take the prefetcher's region from ``_prefetch.c``,
        #: write the records of copies and faults with ``_records.c``, and service plain GPU batches with
        #: ``_service.c`` (runs of them with ``_run.c``) where they were compiled. The numpy code and
        #: :meth:`_service` give the same answers, records and clock; switchable so that the tests can hold the
        #: one to the other.
        self.compiled = COMPILED
        self._plain_costs_for: Platform | None = None   # the platform _compiled_plain's costs are for
        self._remote_read_s = self._remote_written_s = 0.0

    # -- the stream ------------------------------------------------------------------------------------------
    def run(self, parts: Iterable[tuple[np.ndarray, bool | np.ndarray]], processor: int, log: EventLog,
            *, in_flight: int, bytes_per_access: int = PAGE_SIZE, warps: int | None = None,
            access_type: AccessType | None = None, stream: int = 0, memory_bw: float | None = None) -> StreamStats:
        """Run the accesses in ``parts`` by ``processor``, in order.

        Each part is an array of global pages and its writes: one flag for all, or a boolean array beside them.
        ``warps`` caps the throughput of accesses that hit (None: the whole device); ``memory_bw`` is what hits
        on a GPU stream at (None: ``platform.gpu_memory_bw``, a kernel of word loads).
        """
        p = self.platform
        stats = StreamStats()
        host = processor == HOST_ID
        if host:
            local_bw, remote_bw = p.host_memory_bw, p.remote_host_bw
        else:
            cap = float("inf") if warps is None else warps * p.warp_bw
            local_bw = min(p.gpu_memory_bw if memory_bw is None else memory_bw, cap)
            remote_bw = min(p.remote_bw, cap)
        kind = AccessType.WRITE if access_type is None else access_type
        start = log.t
        local, remote = bytes_per_access / local_bw, bytes_per_access / remote_bw
        if host:   # one thread: a small access still costs a miss, a write more than a read
            local_read, local_write = max(local, p.host_access_latency), max(local, p.host_write_latency)
            remote = max(remote, p.host_access_latency)
        else:      # a small remote read is a round trip over the link, several in flight
            remote = max(remote, p.remote_request_latency / max(1, in_flight))
        # The link is full duplex: remote writes go the other way from remote reads and overlap them. Their
        # time is kept apart and only what exceeds the remote reads' is added, at the end of the stream.
        self._remote_read_s = self._remote_written_s = 0.0
        for pages, wr in parts:
            if host:
                local = _host_access_cost(wr, local_read, local_write)
            self._run_chunk(np.asarray(pages, dtype=np.int64), wr, processor, log, stats, in_flight=max(1, in_flight),
                            local=local, remote=remote, bytes_per_access=bytes_per_access, kind=kind, stream=stream)
        if self._remote_written_s > self._remote_read_s:
            log.t += (self._remote_written_s - self._remote_read_s) * 1e9
        stats.seconds = (log.t - start) / 1e9
        return stats

    def _usable(self, pages: np.ndarray, processor: int, wr: bool | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(local, remote)``: accesses that proceed without a fault, on a local copy or through a mapping."""
        t = self.table
        g = 1 if processor == HOST_ID else 1 << (processor + 1)
        if self.compiled:
            local, remote = np.empty(len(pages), dtype=bool), np.empty(len(pages), dtype=bool)
            reach = 1 if processor != HOST_ID else 2 if self.platform.cpu_maps_gpu_memory else 0
            writes = np.ascontiguousarray(wr, dtype=bool).view(np.uint8) if isinstance(wr, np.ndarray) else bool(wr)
            core.usable(t.state, t.read_mostly.view(np.uint8), t.writable, t.accessed_by, t.remote,
                        np.ascontiguousarray(pages, dtype=np.int64), writes, g, reach, local.view(np.uint8),
                        remote.view(np.uint8))
            return local, remote
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
        mem = self.memory
        # The compiled loop of plain batches, tried again after each plain batch this loop services. It takes
        # one write flag for all the accesses (write flags all alike give the same results as that flag).
        plain_runs = self.compiled and not counters and processor == mem.device and n > 0
        if plain_runs and not scalar_wr:
            plain_runs = bool(wr.all()) or not wr.any()
        write = bool(wr if scalar_wr else plain_runs and wr[0])
        try_plain = plain_runs
        pos = 0
        scan = max(in_flight, 1024)      # short after a fault, doubling while everything hits
        while pos < n:
            if try_plain and self._plain_applies(processor):
                before = pos
                pos, scan, again = self._plain_run(pages, pos, write, processor, log, stats, in_flight=in_flight,
                                                   scan=scan, local=local, remote=remote,
                                                   bytes_per_access=bytes_per_access, kind=kind, stream=stream)
                if again:
                    continue
                try_plain = pos > before
                if pos >= n:
                    break
            end = min(n, pos + scan)
            span = pages[pos:end]
            w = wr if scalar_wr else wr[pos:end]
            ok_local, ok_remote = self._usable(span, processor, w)
            good = ok_local | ok_remote
            first_bad = len(span) if good.all() else int(np.argmin(good))
            if first_bad:
                n_remote = int(np.count_nonzero(ok_remote[:first_bad]))
                self._hits(span[:first_bad], first_bad - n_remote, n_remote, local, remote, bytes_per_access, log,
                           stats, processor, _written(ok_remote[:first_bad], n_remote, w, first_bad))
                if counters and n_remote:
                    self._count_remote(span[:first_bad][ok_remote[:first_bad]], processor, log, stats, stream)
            pos += first_bad
            if first_bad == len(span):
                scan = min(2 * scan, _SCAN)
                continue
            scan = max(in_flight, 1024)
            # The batch: distinct faulting pages among the next ``in_flight`` accesses.
            win = pages[pos:pos + in_flight]
            ww = wr if scalar_wr else wr[pos:pos + in_flight]
            l2, r2 = (ok_local[first_bad:first_bad + in_flight], ok_remote[first_bad:first_bad + in_flight]) \
                if pos + len(win) <= end else self._usable(win, processor, ww)
            bad = np.flatnonzero(~(l2 | r2))
            uniq, cut = self._batch_pages(win[bad], bad, batch_size, len(win))
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
            n_written = _written(r2[:cut], n_remote, ww, cut)
            # Faulted accesses proceed after the replay, some of them through a new remote mapping (which a
            # plain batch never makes: its pages end up at the faulting processor).
            if self._compiled_plain(uniq, wpages, processor, log, stats, kind, stream):
                try_plain = plain_runs
            else:
                self._service(uniq, wpages, processor, log, stats, kind, stream)
                sel = bad[bad < cut]
                if len(sel):
                    now_remote = self._usable(win[sel], processor, False)[1]
                    more = int(np.count_nonzero(now_remote))
                    n_remote += more
                    n_written += _written(now_remote, more, ww if scalar_wr else ww[sel], len(sel))
            self._hits(win[:cut], cut - n_remote, n_remote, local, remote, bytes_per_access, log, stats, processor,
                       n_written)
            pos += cut

    def _batch_pages(self, fp: np.ndarray, bad: np.ndarray, batch_size: int, n: int) -> tuple[np.ndarray, int]:
        """The batch of faults ``fp`` (the pages of the window's accesses ``bad``, of ``n``): its first
        ``batch_size`` distinct pages by first fault, sorted, and the access where the next batch begins."""
        if self.compiled:
            uniq = np.empty(batch_size, dtype=np.int64)
            count, stop = core.batch_pages(fp, batch_size, uniq)
            return uniq[:count], (int(bad[stop]) if stop >= 0 else n)
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
        if len(uniq) <= batch_size:
            return uniq, n
        order = np.argsort(first, kind="stable")
        return np.sort(uniq[order[:batch_size]]), int(bad[first[order[batch_size]]])

    def _hits(self, pages: np.ndarray, n_local: int, n_remote: int, local: float, remote: float,
              bytes_per_access: int, log: EventLog, stats: StreamStats, processor: int, n_written: int = 0) -> None:
        """Accesses that proceed: local ones at memory bandwidth, remote reads over the link now; remote writes
        (``n_written`` of the remote ones) go the other way over the link and are weighed at the stream's end."""
        log.t += (n_local * local + (n_remote - n_written) * remote) * 1e9
        if n_remote:
            self._remote_read_s += (n_remote - n_written) * remote
            self._remote_written_s += n_written * remote
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
            blocks = np.union1d(blocks_of(pages[keep]), blocks_of(extra))
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
        protected = int(np.count_nonzero(t.writable[dup_pages] & sb))   # duplicates whose holder loses write
        unmapped = len(moved) + len(ex_moved) - len(dup_pages) + protected
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
            service = p.fault_batch_latency + p.fault_block_latency * len(blocks_of(pages)) \
                + len(pages) * p.fault_latency + int(np.count_nonzero(wr)) * p.fault_write_latency
        populate_bw = p.host_populate_bw if host else p.gpu_populate_bw
        # Per range of source pages unmapped (or write-protected): a TLB shootdown, whatever its size. Faulted
        # and prefetched pages are disjoint, each sorted: their union is a merge.
        migrated = np.sort(np.concatenate((moved, ex_moved)), kind="stable") if len(ex_moved) else moved
        ro_dups = dup_pages[(t.writable[dup_pages] & sb) == 0] if len(dup_pages) else dup_pages
        unmapped_pages = np.setdiff1d(migrated, ro_dups, assume_unique=True) if len(ro_dups) else migrated
        if protected and source == HOST_ID:
            # Ranges of host pages write-protected for a duplicate cost less than ranges unmapped for a move.
            rw_dups = np.sort(dup_pages[(t.writable[dup_pages] & sb) != 0])
            rest = np.setdiff1d(unmapped_pages, rw_dups, assume_unique=True)
            range_cost = block_runs(rest) * p.fault_unmap_run_latency \
                + block_runs(rw_dups) * p.read_mostly_protect_run_latency
        else:
            range_cost = block_runs(unmapped_pages) * p.fault_unmap_run_latency
        service += len(populated) * PAGE_SIZE / populate_bw + moved_bytes // PAGE_SIZE * p.fault_page_latency \
            + unmapped * p.fault_unmap_latency + range_cost + new_chunks * p.fault_chunk_latency
        if protected and source == HOST_ID:   # the host's write access, taken back page by page
            service += protected * p.read_mostly_protect_latency
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
            mem.migrated_into(np.union1d(blocks_of(pages[to_here]), blocks_of(extra)))
        else:
            mem.release_if_empty(np.unique(np.concatenate((moved, ex_moved, collapse)) >> BLOCK_SHIFT))
        # R7: migrations caused by faults and the prefetcher feed the detector.
        self._feed_thrashing(migrated, processor, log)

    def _feed_thrashing(self, migrated: np.ndarray, processor: int, log: EventLog) -> None:
        """R7: pages that faults and the prefetcher migrated feed the detector; what turns hot is recorded."""
        if self.thrashing.enabled and len(migrated):
            hot = self.thrashing.on_migration(migrated, processor, int(log.t))
            if len(hot):
                t = self.table
                starts, lengths = page_runs(np.sort(hot))
                log.add_many(EventKind.THRASHING, flags=0, src=processor, dst=processor,
                             address=t.addresses(starts), nbytes=lengths.astype(np.uint64) * PAGE_SIZE,
                             alloc_id=t.block_alloc[starts >> BLOCK_SHIFT])

    # -- plain batches, compiled ---------------------------------------------------------------------------------
    def _plain_applies(self, processor: int) -> bool:
        """Whether the C plain batch may take ``processor``'s batches now: it is for this memory's GPU with FIFO
        eviction, outside a prefetch, and keeps no thrashing state of its own (so there must be none)."""
        mem = self.memory
        return processor == mem.device and mem.policy == "fifo" and not mem.overlap and not self.thrashing.blocks

    def _compiled_plain(self, pages: np.ndarray, wr: np.ndarray, processor: int, log: EventLog, stats: StreamStats,
                        kind: AccessType, stream: int) -> bool:
        """:meth:`_service` for a plain GPU batch, in C (``_service.c``), or False (having changed nothing) where
        the C code is not built or the batch is not one it takes."""
        if not self.compiled or not self._plain_applies(processor):
            return False
        args = self._plain_arguments(processor, log, kind, stream)
        args[10], args[11] = np.ascontiguousarray(pages, dtype=np.int64), np.ascontiguousarray(wr, dtype=bool).view(
            np.uint8)
        out = core.service_plain(*args)
        if out is None:
            return False
        records, evictions, copied, prefetched, noted = out
        self._plain_taken(args, log, noted, records)
        stats.batches += 1
        stats.faults += len(pages)
        stats.evictions += evictions
        stats.bytes_htod += copied
        stats.bytes_prefetched += prefetched
        return True

    def _plain_run(self, pages: np.ndarray, pos: int, write: bool, processor: int, log: EventLog, stats: StreamStats,
                   *, in_flight: int, scan: int, local: float, remote: float, bytes_per_access: int, kind: AccessType,
                   stream: int) -> tuple[int, int, bool]:
        """``_run_chunk``'s loop from ``pos`` on in C (``_run.c``), for as long as every batch is one that
        :meth:`_compiled_plain` takes: the same records, clock, state and counters. Returns where the loop goes
        on, its scan window, and whether it stopped only because a batch's records did not fit the log's tail
        (they are in the log; the run can go on)."""
        args = self._plain_arguments(processor, log, kind, stream)
        args[10], args[11] = pages, write
        hit = np.array([local, remote, self._remote_read_s, self._remote_written_s])
        tally = np.zeros(8, dtype=np.int64)
        pos, scan, records = core.run_plain(*args, self.table.writable, pos, in_flight, self.platform.fault_batch_size,
                                            scan, _SCAN, hit, bytes_per_access, tally)
        batches, faults, evictions, copied, prefetched, remote_bytes, written, noted = tally.tolist()
        self._plain_taken(args, log, noted, written)
        if records is not None:
            log.put(records)
        self._remote_read_s, self._remote_written_s = float(hit[2]), float(hit[3])
        stats.batches += batches
        stats.faults += faults
        stats.evictions += evictions
        stats.bytes_htod += copied
        stats.bytes_prefetched += prefetched
        stats.bytes_remote += remote_bytes
        return pos, scan, records is not None

    def _plain_arguments(self, processor: int, log: EventLog, kind: AccessType, stream: int) -> list:
        """``service_plain``'s arguments (``run_plain``'s first ones), the batch's pages and writes left to fill in."""
        t, p, mem, thr = self.table, self.platform, self.memory, self.thrashing
        if self._plain_costs_for is not p:
            self._plain_costs_for = p
            self._plain_costs = np.array([p.fault_batch_latency, p.fault_block_latency, p.fault_latency,
                                          p.fault_write_latency, p.gpu_populate_bw, p.fault_page_latency,
                                          p.fault_unmap_latency, p.fault_unmap_run_latency, p.fault_chunk_latency,
                                          p.fault_eviction_latency * 1e9])
            self._plain_links = (link_table(p.fault_htod_bw, p.link_k), link_table(p.eviction_bw, p.link_k))
        codes = np.array([EventKind.HTOD, EventKind.DTOH, EventKind.GPU_PAGE_FAULT, MigrationCause.COHERENCE,
                          MigrationCause.PREFETCH, MigrationCause.EVICTION, AccessType.READ, kind, stream],
                         dtype=np.int64)
        counters = np.array([mem.capacity, mem.used, mem.pinned, mem._tick, mem.evicted_blocks], dtype=np.int64)
        notes = thr._touch
        if thr.enabled:
            notes.reserve(t.nblocks)
        tail, filled = log.tail()
        return [t.state, t.read_mostly.view(np.uint8), t.preferred, t.accessed_by, t.remote, t.chunk.view(np.uint8),
                t.block_pages, t.block_address, t.block_alloc, t.last_use, None, None, self._plain_costs,
                *self._plain_links, codes, counters, np.array([log.t]), processor,
                self.threshold if self.prefetch else -1, mem._order, notes.processor if thr.enabled else None,
                notes.time if thr.enabled else None, thr.c.lapse, tail, filled]

    def _plain_taken(self, args: list, log: EventLog, noted: int, records: int | bytes | bytearray) -> None:
        """Take back what ``service_plain`` or ``run_plain`` changed outside the page table: the log (records
        written into its tail, or given as bytes), its clock, the memory's counters and the thrashing notes."""
        mem, counters, clock = self.memory, args[16], args[17]
        self.thrashing._touch.noted(noted)
        if isinstance(records, int):
            log.grow(records)
        elif records:   # too many for the tail's room: copied into a new tail, where the next batches go on
            log.put(records)
        log.t = float(clock[0])
        mem.used, mem._tick, mem.evicted_blocks = int(counters[1]), int(counters[3]), int(counters[4])

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
        blocks = blocks_of(target)
        if not self.prefetch:
            return pages[:0]
        rows = len(blocks)
        npages = t.block_pages[blocks].astype(np.int64)
        row = np.searchsorted(blocks, target >> BLOCK_SHIFT) if rows > 1 else np.zeros(len(target), np.int64)
        lane = target & (PAGES_PER_BLOCK - 1)
        thrash = None
        if self.thrashing.blocks:
            thrash = self.thrashing.thrashing_rows(blocks)
            thrash &= _LANES[None, :] < npages[:, None]
            if not thrash.any():
                thrash = None
        if self.compiled:
            extra = np.empty(rows * PAGES_PER_BLOCK, dtype=np.int64)
            empty_rows = np.empty(rows, dtype=np.uint8)
            k = core.region(t.state, t.preferred, t.remote, t.accessed_by, blocks, row, lane, npages, g,
                            processor, self.threshold, None if thrash is None else thrash.view(np.uint8), extra,
                            empty_rows)
            extra = extra[:k]
            empty = np.flatnonzero(empty_rows)
        else:
            cand, empty = self._numpy_region(blocks, row, lane, npages, g, thrash)
            extra = self._eligible(blocks, cand, processor, g, thrash)
        # A block with nothing resident anywhere, faulting towards its preferred location, is populated whole.
        if len(empty):
            pref_e = t.preferred.reshape(-1, PAGES_PER_BLOCK)[blocks[empty]]
            whole = (pref_e == processor).any(axis=1)
            if whole.any():
                faulted = np.zeros(rows * PAGES_PER_BLOCK, dtype=bool)
                faulted[row * PAGES_PER_BLOCK + lane] = True
                add = whole[:, None] & (pref_e == processor) & ~faulted.reshape(rows, -1)[empty]
                add &= _LANES[None, :] < npages[empty, None]
                flat_add = (blocks[empty][:, None] * PAGES_PER_BLOCK + _LANES[None, :])[add]
                extra = np.union1d(extra, flat_add)
        return extra

    def _eligible(self, blocks: np.ndarray, cand: np.ndarray, processor: int, g: int,
                  thrash: np.ndarray | None) -> np.ndarray:
        """The page numbers of the candidates (offsets into the batch's rows) that policy lets the prefetcher move."""
        t = self.table
        near = blocks[cand >> BLOCK_SHIFT] * PAGES_PER_BLOCK + (cand & (PAGES_PER_BLOCK - 1))
        if not len(near):
            return near
        pref = t.preferred[near]
        # Never prefetched: thrashing pages, pages leaving their preferred location, pages kept remote by policy.
        eligible = ((pref == NO_LOCATION) | (pref == processor)) & ((t.remote[near] & g) == 0)
        eligible &= ~(((t.accessed_by[near] & g) != 0) & (t.state[near] != 0))
        if thrash is not None:
            eligible &= ~thrash.reshape(-1)[cand]
        return near[eligible]

    def _numpy_region(self, blocks: np.ndarray, row: np.ndarray, lane: np.ndarray, npages: np.ndarray, g: int,
                      thrash: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """What the compiled ``region`` gives, with numpy: the region's new pages as offsets into the batch's rows,
        and the rows with no page resident anywhere."""
        t, rows = self.table, len(blocks)
        # The batch's blocks, whole, as rows of 512 pages (the table holds whole blocks).
        st = t.state.reshape(-1, PAGES_PER_BLOCK)[blocks]
        resident = (st & g) != 0
        if not (npages == PAGES_PER_BLOCK).all():
            resident &= _LANES[None, :] < npages[:, None]
        faulted = np.zeros(rows * PAGES_PER_BLOCK, dtype=bool)
        faulted[row * PAGES_PER_BLOCK + lane] = True
        if rows == 1 and thrash is None:
            cand = block_prefetch(resident[0], faulted, int(npages[0]), self.threshold)
        else:
            cand = self._region(resident, faulted, row, lane, npages, thrash)
        return cand, np.flatnonzero(~st.view(np.uint64).any(axis=1))

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
        kind = EventKind.DTOH if dst == HOST_ID else EventKind.HTOD
        if self.compiled:
            run_records(log, t, pages, kind, cause, src, dst, stream, (bw, self.platform.link_k))
        else:
            starts, lengths = page_runs(pages, distinct=True)
            nbytes = lengths.astype(np.uint64) * PAGE_SIZE
            log.add_many(kind, flags=cause, src=src, dst=dst, address=t.addresses(starts), nbytes=nbytes,
                         alloc_id=t.block_alloc[starts >> BLOCK_SHIFT], stream=stream,
                         seconds=link_seconds(nbytes, bw, self.platform.link_k))
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
        if self.compiled:
            run_records(log, t, pages, kind, access, processor, processor, stream, faulted=faulted)
            return
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
