"""Exact shortcuts of the fault path: common cases serviced in fewer passes, with the same result.

Each method here does, for one common case, what :class:`~.engine.FaultEngine`'s general path does batch by
batch: the same records in the same order, the same clock (the same float operations in the same order), the
same page table, chunks, FIFO order, thrashing state and counters. Each declines (returns 0 or False, having
changed nothing) where its case does not apply, and each can be switched off on the engine
(``fast_sweeps``, ``fast_batches``, ``fast_plain_runs``, ``fast_run_batches``, ``fast_half_blocks``,
``fast_host_runs``), which is how the tests compare them with the general path.

- :meth:`Shortcuts._sweep`: a streaming kernel's run of whole blocks of host-only pages, half a block a batch.
- :meth:`Shortcuts._upgrades`: a host thread's writes to ReadMostly pages only the host holds.
- :meth:`Shortcuts._host_run`: a host thread's faults along blocks it takes from the front.
- :meth:`Shortcuts._service_plain`: a batch with no advice, duplicate, remote mapping or thrashing state.
- :meth:`Shortcuts._plain_run`: a GPU stream's run of such batches and the hits between them, in C.
- :meth:`Shortcuts._service_run`: such a GPU batch that is one run of pages in one block.
- :meth:`Shortcuts._half_blocks`: a GPU stream of such batches, each a half block, with hits between them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ...events.schema import EVENT_DTYPE, AccessType, EventKind, MigrationCause
from ...location import HOST_ID
from ...units import PAGE_SIZE
from .compiled import core
from .model import BLOCK_SHIFT, NO_LOCATION, PAGES_PER_BLOCK, EventLog, page_runs
from .platform import link_seconds
from .prefetcher import block_prefetch
from .records import link_table

if TYPE_CHECKING:
    from .engine import StreamStats

__all__ = ["HitSteps", "Shortcuts", "block_runs", "blocks_of"]

_LANES = np.arange(PAGES_PER_BLOCK)
_SCAN = 1 << 16   # accesses checked at once while looking for the next fault
_HALF = PAGES_PER_BLOCK // 2
# The scan windows _run_chunk takes while everything hits (1024, 2048 ... _SCAN), and their running totals.
_SCAN_SIZES = np.array([1024 << i for i in range((_SCAN // 1024).bit_length())], dtype=np.int64)
_SCAN_CUM = np.cumsum(_SCAN_SIZES)
_SCAN_CUM0 = np.concatenate(([0], _SCAN_CUM))


class HitSteps:
    """The clock's step for ``count`` accesses that hit locally, as ``_run_chunk``'s ``_hits`` adds it (kept per
    count), and the steps for a gap of hits in the scan windows ``_run_chunk`` takes after a fault."""

    def __init__(self, local: float, remote: float) -> None:
        self.local, self.remote = local, remote
        self._steps: dict[int, float] = {}

    def __call__(self, count: int) -> float:
        step = self._steps.get(count)
        if step is None:
            step = self._steps[count] = (count * self.local + 0 * self.remote) * 1e9
        return step

    def after_gap(self, now: float, gap: int) -> float:
        """``now`` after ``gap`` hits, window by window (1024 after a fault, doubling up to ``_SCAN``)."""
        size = 1024
        while gap >= size:
            now += self(size)
            gap -= size
            size = min(2 * size, _SCAN)
        if gap:
            now += self(gap)
        return now


def blocks_of(pages: np.ndarray) -> np.ndarray:
    """The distinct blocks of sorted pages."""
    b = pages >> BLOCK_SHIFT
    return b[np.concatenate(([True], b[1:] != b[:-1]))] if len(b) > 1 else b


def block_runs(pages: np.ndarray) -> int:
    """Runs of consecutive sorted pages, split where a 2 MiB block ends (the driver copies block by block)."""
    if len(pages) < 2:
        return len(pages)
    return 1 + int(np.count_nonzero((pages[1:] != pages[:-1] + 1) | ((pages[1:] & (PAGES_PER_BLOCK - 1)) == 0)))


def _reads_and_writes(pages: np.ndarray, wr: np.ndarray, first_touched: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A batch's faulted pages split by access, its first-touched neighbours riding with the writes if any."""
    if not wr.any():
        reads, writes = pages, pages[:0]
    elif wr.all():
        reads, writes = pages[:0], pages
    else:
        reads, writes = pages[~wr], pages[wr]
    if len(first_touched):   # disjoint from the faulted pages, each sorted: the union is a merge
        if len(writes):
            writes = np.sort(np.concatenate((writes, first_touched)))
        else:
            reads = np.sort(np.concatenate((reads, first_touched)))
    return reads, writes


class Shortcuts:
    """The exact shortcuts, mixed into :class:`~.engine.FaultEngine` (whose state and general path they use)."""

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
            service = p.fault_batch_latency + p.fault_block_latency * 1 + _HALF * p.fault_latency \
                + (_HALF if write else 0) * p.fault_write_latency
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
                now = now + p.fault_eviction_latency * 1e9   # as GpuMemory.evict waits for the chunk
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
            mem.evicted(victims, only)
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
        if self.compiled and processor == mem.device and mem.policy == "fifo" and not mem.overlap \
                and self._compiled_plain(pages, wr, processor, log, stats, kind, stream):
            return True
        host = processor == HOST_ID
        g = 1 if host else 1 << (processor + 1)
        st = t.state[pages]
        if ((st & (st - 1)) | (st & g)).any() or (t.preferred[pages] != NO_LOCATION).any() \
                or t.read_mostly[pages].any() or (t.accessed_by[pages] | t.remote[pages]).any():
            return False
        blocks = blocks_of(pages)
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
        reads, writes = _reads_and_writes(pages, wr, ex_pop)
        service = p.cpu_fault_latency if host else p.fault_batch_latency + p.fault_block_latency * len(blocks) \
            + len(pages) * p.fault_latency + int(np.count_nonzero(wr)) * p.fault_write_latency
        populate_bw = p.host_populate_bw if host else p.gpu_populate_bw
        # Every page that moves here loses its source mapping. Disjoint and sorted: the union is a merge.
        migrated = np.sort(np.concatenate((moved, ex_moved)), kind="stable") if len(ex_moved) else moved
        service += n_populated * PAGE_SIZE / populate_bw + moved_bytes // PAGE_SIZE * p.fault_page_latency \
            + unmapped * p.fault_unmap_latency + block_runs(migrated) * p.fault_unmap_run_latency \
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
        self._feed_thrashing(migrated, processor, log)
        return True

    def _compiled_plain(self, pages: np.ndarray, wr: np.ndarray, processor: int, log: EventLog, stats: StreamStats,
                        kind: AccessType, stream: int) -> bool:
        """:meth:`_service_plain` for a GPU with FIFO eviction, in C (``_service.c``), or False (having changed
        nothing) where the batch is not one it takes."""
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
        :meth:`_compiled_plain` takes and no other shortcut may take it: the same records, clock, state and
        counters. Returns where the loop goes on, its scan window, and whether it stopped only because a batch's
        records did not fit the log's tail (they are in the log; the run can go on)."""
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
                             address, nbytes, nbytes, alloc, stream, 0))
            log.t = end
            stats.bytes_htod += nbytes
            moved_bytes = nbytes
        moved_bytes += self._copy(ex_moved, HOST_ID, processor, MigrationCause.PREFETCH, p.fault_htod_bw, log, stats,
                                  stream)
        stats.bytes_prefetched += len(ex_moved) * PAGE_SIZE
        n_populated = k - len(moved) + len(ex_pop)
        migrated = np.sort(np.concatenate((moved, ex_moved)), kind="stable") if len(ex_moved) else moved
        service = self._run_service(k, int(np.count_nonzero(wr)), n_populated, moved_bytes, unmapped,
                                    block_runs(migrated), has_chunk)
        any_write = bool(wr.any())
        if len(ex_pop) or (any_write and not wr.all()):
            reads, writes = _reads_and_writes(pages, wr, ex_pop)
            faulted = pages if len(ex_pop) else None
            self._fault_records(reads, faulted, AccessType.READ, EventKind.GPU_PAGE_FAULT, processor, log, stream)
            self._fault_records(writes, faulted, kind, EventKind.GPU_PAGE_FAULT, processor, log, stream)
        else:       # one run, every page faulted: one record
            now = int(log.t)
            log.rows.append((EventKind.GPU_PAGE_FAULT, kind if any_write else AccessType.READ, processor, processor,
                             now, now, int(t.block_address[b]) + (a - lo) * PAGE_SIZE, k * PAGE_SIZE, k,
                             int(t.block_alloc[b]), stream, 0))
        log.t += service * 1e9
        t.state[a:z] = g
        if len(extra):
            t.state[extra] = g
        mem.migrated_into(blocks)
        self._feed_thrashing(migrated, processor, log)
        return True


    # -- the half-block fast path -------------------------------------------------------------------------------
    def _half_blocks(self, pages: np.ndarray, pos: int, wr: bool | np.ndarray, processor: int, log: EventLog,
                     stats: StreamStats, *, local: float, remote: float, kind: AccessType, stream: int) -> int:
        """Service, all at once, a run of half-block batches with accesses that hit between them.

        A stencil's rows, a tile's rows, sweeps of several buffers in turn: from ``pages[pos]`` (a fault) on,
        every access either hits a page held here only or is the first of 256 that read or write, in order,
        one aligned half block whose pages are all on the host only (or nowhere). Each such half block is
        then one batch that :meth:`_service_run` services with nothing prefetched, and the accesses between
        batches hit in the scan windows :meth:`_run_chunk` takes. This produces the records, clock, state and
        counters of that, batch by batch, with scalar steps and no pass over arrays per batch (where the
        general path would hand a whole block to :meth:`_sweep` instead, that gives the same result). It needs
        no advice in the blocks touched, no thrashing state and FIFO eviction, and it stops before a batch
        that would evict a chunk the accesses still to come use or that mixes reads and writes, and after one
        that leaves thrashing state. Returns the accesses consumed (0: the general path runs).
        """
        t, p, mem, thr = self.table, self.platform, self.memory, self.thrashing
        n = len(pages)
        p0 = int(pages[pos])
        if p0 & (_HALF - 1) or pos + _HALF > n or int(pages[pos + _HALF - 1]) != p0 + _HALF - 1 \
                or mem.policy != "fifo" or mem.overlap or thr.blocks or mem.free_blocks < 0:
            return 0
        g = 1 << (processor + 1)
        nbytes = _HALF * PAGE_SIZE
        copy_seconds = self._keep("run_copy_seconds")     # shared with _service_run: the same value
        secs = copy_seconds.get(nbytes)
        if secs is None:
            secs = copy_seconds[nbytes] = link_seconds(
                np.array([_HALF], dtype=np.int64).astype(np.uint64) * PAGE_SIZE, p.fault_htod_bw, p.link_k).tolist()[0]
        service = self._half_service()
        prefetched = self._half_prefetch()
        hit = HitSteps(local, remote)
        read_kind = AccessType.READ
        order, touch, lapse = mem._order, thr._touch, thr.c.lapse
        rows = log.rows
        done = pos            # the stream position after the last batch serviced here
        window = 1 << 14
        while done < n:
            end = min(n, done + window)
            seg_at, seg_page, seg_len, seg_write, status, last = self._half_segments(pages, done, end, wr, g)
            count = len(seg_at) if end == n else len(seg_at) - 1   # the last one may go on past the window
            served = False
            for i in range(count):
                first = seg_page[i]
                hb = first >> 8
                code = status[hb]
                if code == g:
                    continue              # hits, counted when the next batch comes
                at = seg_at[i]
                b = hb >> 1
                other = status[hb ^ 1]
                if code not in (0, 1) or first & (_HALF - 1) or seg_len[i] != _HALF or other < 0 or \
                        (self.prefetch and prefetched[hb & 1, other == g]):
                    return done - pos
                write = seg_write[i]
                if write is None:         # reads and writes in one batch
                    return done - pos
                has_chunk = bool(t.chunk[b])
                if not has_chunk and mem.free_blocks <= 0 and (not order or last.get(next(iter(order)), -1) >= i):
                    return done - pos     # no chunk to take, or the victim is used further on
                log.t = hit.after_gap(log.t, at - done)   # the hits since the last batch
                # The batch, as _service_run.
                stats.batches += 1
                stats.faults += _HALF
                if not has_chunk:
                    before = mem.evicted_blocks
                    mem.claim_one(b, {b}, log)   # the victim was checked above: there is one
                    stats.evictions += mem.evicted_blocks - before
                address = int(t.block_address[b]) + (first & (PAGES_PER_BLOCK - 1)) * PAGE_SIZE
                alloc = int(t.block_alloc[b])
                if code:
                    start = log.t
                    stop = start + secs * 1e9
                    rows.append((EventKind.HTOD, MigrationCause.COHERENCE, HOST_ID, processor, int(start), int(stop),
                                 address, nbytes, nbytes, alloc, stream, 0))
                    log.t = stop
                    stats.bytes_htod += nbytes
                now = int(log.t)
                rows.append((EventKind.GPU_PAGE_FAULT, kind if write else read_kind, processor, processor, now, now,
                             address, nbytes, _HALF, alloc, stream, 0))
                log.t += service[code, has_chunk, write]
                t.state[first:first + _HALF] = g
                mem._tick += 1               # GpuMemory.migrated_into, for one block
                if b in order:
                    order.move_to_end(b)
                    order[b] = mem._tick
                thrashing = False
                if code and thr.enabled:     # ThrashingDetector.on_migration, for a block with no state yet
                    now = int(log.t)
                    seen = touch.get(b)
                    if seen is None or seen[0] == processor or now - seen[1] > lapse:
                        touch[b] = (processor, now)
                    else:
                        self._feed_thrashing(np.arange(first, first + _HALF, dtype=np.int64), processor, log)
                        thrashing = True
                log.t += hit(_HALF)
                status[hb] = g
                done = at + _HALF
                served = True
                if thrashing:
                    return done - pos
            if end == n:
                break
            window *= 4 if served else 16    # the run goes on: look further ahead next time
        return done - pos

    def _half_segments(self, pages: np.ndarray, lo: int, hi: int, wr: bool | np.ndarray,
                       g: int) -> tuple[list, list, list, list, dict, dict]:
        """``pages[lo:hi]`` cut into runs of consecutive pages within a half block, for :meth:`_half_blocks`.

        Returns each run's stream position, first page, length and write flag (None where it both reads and
        writes); the state of each half block they touch (``g``: here only; 1: host only; 0: nowhere; -1:
        anything else, or a block with advice, a remote mapping or missing pages); and the last run that
        touches each block.
        """
        t = self.table
        span = pages[lo:hi]
        cut = np.flatnonzero((span[1:] != span[:-1] + 1) | ((span[1:] & (_HALF - 1)) == 0)) + 1
        starts = np.concatenate(([0], cut))
        lengths = np.diff(np.append(starts, len(span)))
        first = span[starts]
        if isinstance(wr, np.ndarray):
            w = wr[lo:hi]
            flips = np.flatnonzero(w[1:] != w[:-1]) + 1       # where the flag changes: a run with one inside mixes
            mixed = np.searchsorted(flips, starts, side="right") != np.searchsorted(flips, starts + lengths - 1,
                                                                                     side="right")
            writes = [None if m else f for m, f in zip(mixed.tolist(), w[starts].tolist(), strict=True)] \
                if mixed.any() else w[starts].tolist()
        else:
            writes = [bool(wr)] * len(starts)
        blocks = np.unique(first >> BLOCK_SHIFT)
        st = t.state.reshape(-1, 2, _HALF)[blocks]
        low, high = st.min(axis=2), st.max(axis=2)
        clean = t.block_pages[blocks] == PAGES_PER_BLOCK
        clean &= ~t.read_mostly.reshape(-1, PAGES_PER_BLOCK)[blocks].any(axis=1)
        clean &= (t.preferred.reshape(-1, PAGES_PER_BLOCK)[blocks] == NO_LOCATION).all(axis=1)
        clean &= ~(t.accessed_by.reshape(-1, PAGES_PER_BLOCK)[blocks] | t.remote.reshape(-1, PAGES_PER_BLOCK)[
            blocks]).any(axis=1)
        code = np.where((low == high) & clean[:, None] & ((low <= 1) | (low == g)), low.astype(np.int64), -1)
        halves = (2 * blocks[:, None] + np.arange(2)[None, :]).reshape(-1)
        status = dict(zip(halves.tolist(), code.reshape(-1).tolist(), strict=True))
        seg_blocks = (first >> BLOCK_SHIFT).tolist()
        last = dict(zip(seg_blocks, range(len(seg_blocks)), strict=True))
        return (starts + lo).tolist(), first.tolist(), lengths.tolist(), writes, status, last

    def _run_service(self, k: int, written: int, n_populated: int, moved_bytes: int, unmapped: int, runs: int,
                     has_chunk: bool) -> float:
        """Seconds to service a GPU batch of one run of ``k`` pages, ``written`` of them written, in one block
        (``_service``'s sum, in its order)."""
        p = self.platform
        service = p.fault_batch_latency + p.fault_block_latency * 1 + k * p.fault_latency \
            + written * p.fault_write_latency
        service += n_populated * PAGE_SIZE / p.gpu_populate_bw + moved_bytes // PAGE_SIZE * p.fault_page_latency \
            + unmapped * p.fault_unmap_latency + runs * p.fault_unmap_run_latency \
            + (0 if has_chunk else 1) * p.fault_chunk_latency
        return service

    def _half_service(self) -> dict:
        """The service time of a half-block batch, in ns, by (pages on the host, chunk already held, written)."""
        kept = self._keep("half_service")
        if not kept:
            for moving in (0, 1):
                moved = _HALF if moving else 0
                for has_chunk in (False, True):
                    for write in (False, True):
                        kept[moving, has_chunk, write] = self._run_service(
                            _HALF, _HALF if write else 0, _HALF - moved, moved * PAGE_SIZE, moved, 1 if moved else 0,
                            has_chunk) * 1e9
        return kept

    def _half_prefetch(self) -> dict:
        """Whether the density prefetcher adds pages to a half block's batch, by (which half, the other half
        resident here): a half block alone is not above the threshold, and with its other half it is whole."""
        kept = self._keep("half_prefetch")
        if not kept:
            for half in (0, 1):
                for other_here in (False, True):
                    faulted = np.zeros(PAGES_PER_BLOCK, dtype=bool)
                    faulted[half * _HALF:(half + 1) * _HALF] = True
                    resident = np.zeros(PAGES_PER_BLOCK, dtype=bool)
                    if other_here:
                        resident[(1 - half) * _HALF:(2 - half) * _HALF] = True
                    kept[half, other_here] = len(block_prefetch(resident, faulted, PAGES_PER_BLOCK,
                                                                self.threshold)) > 0
        return kept
