"""An exact shortcut for scattered GPU batches: many batches of faults in untouched blocks, serviced at once.

A strided read (one page in every 64 KiB) or the first touches of a gather fault on nearly every access, so
the general path spends a pass over arrays, a prefetcher call and a handful of record calls on every batch of
256 faults. Where each batch's faults land in blocks that nothing has brought to this GPU (no chunk, no page
here, no advice, no remote mapping) and no two batches share a block, no batch changes what another finds:
which accesses fault, what the density prefetcher adds and what moves are all decided by the state before
the first of them. :meth:`ScatteredBatches._scattered` then services the run with one pass over arrays for
all its batches, and a scalar loop per batch for the clock, with the same float operations in the same order
as :meth:`~.shortcuts.Shortcuts._service_plain` and :class:`~.eviction.GpuMemory` use batch by batch. The
engine's ``fast_scattered`` switch turns it off, which is how the tests compare it with the general path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ...events.schema import EVENT_DTYPE, AccessType, EventKind, MigrationCause
from ...location import HOST_ID
from ...units import PAGE_SIZE
from .model import BLOCK_SHIFT, NO_LOCATION, PAGES_PER_BLOCK, EventLog, page_runs
from .platform import link_seconds
from .prefetcher import block_prefetch
from .shortcuts import HitSteps

if TYPE_CHECKING:
    from .engine import StreamStats

__all__ = ["ScatteredBatches"]

_FIRST_WINDOW = 1 << 11
_LAST_WINDOW = 1 << 18


def _group_clock(now: float, d: np.ndarray, lo: int, hi: int, t0: np.ndarray, t1: np.ndarray) -> float:
    """Stamp records ``lo:hi`` (seconds ``d``, already in ns) back to back from ``now`` as EventLog.add_many does:
    one addition after another for up to four records, else ``now`` plus a running sum. Returns the clock."""
    c = hi - lo
    if c <= 4:
        for i in range(lo, hi):
            t0[i] = now
            now = now + d[i]
            t1[i] = now
        return now
    ends = now + np.cumsum(d[lo:hi])
    t0[lo] = now
    t0[lo + 1:hi] = ends[:-1]
    t1[lo:hi] = ends
    return float(ends[-1])


def _slots(owner: np.ndarray, base: np.ndarray) -> np.ndarray:
    """Where each record goes: its batch's first slot for this kind plus its rank among the batch's (``owner``
    sorted by batch)."""
    n = len(owner)
    if not n:
        return owner
    first = np.flatnonzero(np.concatenate(([True], owner[1:] != owner[:-1])))
    rank = np.arange(n) - np.repeat(first, np.diff(np.append(first, n)))
    return base[owner] + rank


def _union_starts(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Where the runs of the union of two disjoint page sets begin (cut at block boundaries, as
    :func:`~.model.page_runs` cuts), from each set's runs ``(first, length)``: the runs are merged, not the pages."""
    if not len(b[0]):
        return a[0]
    starts = np.concatenate((a[0], b[0]))
    ends = starts + np.concatenate((a[1], b[1]))
    o = np.argsort(starts, kind="stable")
    starts, ends = starts[o], ends[o]
    new = np.ones(len(starts), dtype=bool)
    new[1:] = (starts[1:] != ends[:-1]) | ((starts[1:] & (PAGES_PER_BLOCK - 1)) == 0)
    return starts[new]


class ScatteredBatches:
    """The scattered-batch shortcut, mixed into :class:`~.engine.FaultEngine` (whose state and helpers it uses)."""

    def _scattered(self, pages: np.ndarray, pos: int, wr: bool | np.ndarray, processor: int, log: EventLog,
                   stats: StreamStats, *, local: float, remote: float, kind: AccessType, stream: int) -> int:
        """Service, all at once, the GPU batches from ``pages[pos]`` (a fault) on whose faults land in untouched
        blocks, no block in two batches; returns the accesses consumed (0: the general path runs).

        Each batch is, as in ``_run_chunk``, the faults among the ``fault_batch_size`` accesses from the next
        fault on, serviced as :meth:`_service_plain` services it, then those accesses, and the hits up to the
        next batch in ``_run_chunk``'s scan windows. The run stops before a batch that touches a block an
        earlier one did, a block that holds anything on this GPU, advice or a remote mapping, a block the
        thrashing detector would flag, a remote access, a change of access type, or an eviction of a chunk that
        holds duplicates or that the accesses after that batch's use. FIFO eviction only, no thrashing state.
        """
        mem = self.memory
        if mem.policy != "fifo" or mem.overlap or self.thrashing.blocks or mem.free_blocks < 0:
            return 0
        n = len(pages)
        window = _FIRST_WINDOW
        done = pos
        while done < n:
            end = min(n, done + window)
            run = self._scattered_run(pages, done, end, wr, processor, log)
            if run is None:
                break
            done = self._scattered_service(run, pages, wr, processor, log, stats, local=local, remote=remote,
                                           kind=kind, stream=stream)
            if not run["whole"] or end == n:
                break
            window = min(window * 8, _LAST_WINDOW)
        return done - pos

    # -- which batches ------------------------------------------------------------------------------------------
    def _scattered_run(self, pages: np.ndarray, lo: int, hi: int, wr: bool | np.ndarray, processor: int,
                       log: EventLog) -> dict | None:
        """The batches among ``pages[lo:hi]`` that :meth:`_scattered` can service, or None if not even one."""
        t, p, mem, thr = self.table, self.platform, self.memory, self.thrashing
        n = len(pages)
        size = p.fault_batch_size
        span = pages[lo:hi]
        short = False     # the run ends inside the span: the general path takes over after it
        if isinstance(wr, np.ndarray):
            w = wr[lo:hi]
            change = np.flatnonzero(w != w[0])
            if len(change):   # one access type per run: the batches' records then need no split
                hi = lo + int(change[0])
                short = True
                span, w = span[:hi - lo], w[:hi - lo]
            write = bool(w[0]) if len(w) else False
        else:
            w, write = wr, bool(wr)
        if not len(span):
            return None
        # A remote hit is taken for a fault here: its block (AccessedBy, or mapped remotely) ends the run below.
        faults = np.flatnonzero(~self._usable(span, processor, w)[0]) + lo
        # The batches' starts: the first fault, then the first fault past each batch's accesses.
        starts = []
        k = 0
        nf = len(faults)
        while k < nf:
            s = int(faults[k])
            e = min(s + size, n)
            if e > hi:
                break
            starts.append(s)
            k = int(np.searchsorted(faults, e))
        if not starts:
            return None
        starts_a = np.array(starts, dtype=np.int64)
        fpos = faults[:k]
        fbatch = np.searchsorted(starts_a, fpos, side="right") - 1
        fpages = pages[fpos]
        order = np.lexsort((fpages, fbatch))
        fpages, fbatch = fpages[order], fbatch[order]
        keep = np.concatenate(([True], (fpages[1:] != fpages[:-1]) | (fbatch[1:] != fbatch[:-1])))
        upages, ubatch = fpages[keep], fbatch[keep]
        ublock = upages >> BLOCK_SHIFT
        first = np.concatenate(([True], (ublock[1:] != ublock[:-1]) | (ubatch[1:] != ubatch[:-1])))
        bblock, bbatch = ublock[first], ubatch[first]
        nb = len(starts)
        # A block in two batches: the later one would find the earlier one's pages here.
        blocks, where, inverse = np.unique(bblock, return_index=True, return_inverse=True)
        again = bbatch != bbatch[where][inverse]
        if again.any():
            nb = int(bbatch[again].min())
        # Untouched here: no chunk, no page on this GPU or elsewhere but the host, no advice, no remote mapping.
        rows = t.state.reshape(-1, PAGES_PER_BLOCK)[blocks]
        fresh = ~t.chunk[blocks] & (rows <= 1).all(axis=1)
        fresh &= ~t.read_mostly.reshape(-1, PAGES_PER_BLOCK)[blocks].any(axis=1)
        fresh &= (t.preferred.reshape(-1, PAGES_PER_BLOCK)[blocks] == NO_LOCATION).all(axis=1)
        fresh &= ~(t.accessed_by.reshape(-1, PAGES_PER_BLOCK)[blocks]
                   | t.remote.reshape(-1, PAGES_PER_BLOCK)[blocks]).any(axis=1)
        if thr.enabled and thr._touch:   # a block last migrated elsewhere, lately: the detector would flag it
            now, lapse, touch = int(log.t), thr.c.lapse, thr._touch
            for j, b in enumerate(blocks.tolist()):
                seen = touch.get(b)
                if seen is not None and seen[0] != processor and now - seen[1] <= lapse:
                    fresh[j] = False
        if not fresh.all():
            nb = min(nb, int(bbatch[where][~fresh].min()))
        # Chunks: each batch claims one per block; past the free ones, FIFO's head goes, victim by victim.
        per_batch = np.bincount(bbatch, minlength=len(starts))
        evicting = np.maximum(np.cumsum(per_batch) - mem.free_blocks, 0)
        queued = len(mem._order)
        if nb and evicting[nb - 1] > queued:
            nb = int(np.searchsorted(evicting, queued, side="right"))
        n_evict = int(evicting[nb - 1]) if nb else 0
        victims = np.fromiter(mem._order.keys(), dtype=np.int64, count=n_evict) if n_evict else \
            np.zeros(0, np.int64)
        if n_evict:
            g = mem.bit
            vst = t.state.reshape(-1, PAGES_PER_BLOCK)[victims]
            valid = np.arange(PAGES_PER_BLOCK)[None, :] < t.block_pages[victims][:, None]
            vst = np.where(valid, vst, 0)
            # The batch that evicts each victim, and the accesses that must not come after it.
            by = np.searchsorted(evicting, np.arange(n_evict), side="right")
            stop = nb
            dup = (((vst & g) != 0) & (vst != g)).any(axis=1)
            if dup.any():
                stop = min(stop, int(by[np.argmax(dup)]))
            touched = span >> BLOCK_SHIFT
            vs = np.argsort(victims)
            at = np.searchsorted(victims[vs], touched)
            hit = at < n_evict
            hit[hit] = victims[vs][at[hit]] == touched[hit]
            if hit.any():   # within its batch's accesses a victim still hits (they were gathered before)
                used = np.flatnonzero(hit) + lo
                which = vs[at[hit]]
                late = used >= np.minimum(starts_a[by[which]] + size, n)
                if late.any():
                    stop = min(stop, int(by[which][late].min()))
            if stop < nb:
                nb = stop
                n_evict = int(evicting[nb - 1]) if nb else 0
                victims = victims[:n_evict]
                vst = vst[:n_evict]
                by = by[:n_evict]
        if nb == 0:
            return None
        whole = not short and nb == len(starts)
        take = ubatch < nb
        bsel = bbatch < nb
        return {"whole": whole, "from": lo, "starts": starts_a[:nb], "pages": upages[take],
                "blocks": bblock[bsel], "block_batch": bbatch[bsel], "victims": victims,
                "victim_states": vst if n_evict else None, "victim_batch": by if n_evict else None,
                "write": write}

    # -- servicing them -----------------------------------------------------------------------------------------
    def _scattered_service(self, run: dict, pages: np.ndarray, wr: bool | np.ndarray, processor: int, log: EventLog,
                           stats: StreamStats, *, local: float, remote: float, kind: AccessType, stream: int) -> int:
        """Service the batches :meth:`_scattered_run` found; returns the stream position after the last one."""
        t, p, mem, thr = self.table, self.platform, self.memory, self.thrashing
        n = len(pages)
        size = p.fault_batch_size
        g = 1 << (processor + 1)
        starts = run["starts"]
        nb = len(starts)
        write = run["write"]
        # Page by page the work goes in page order (no page, and no block, is in two batches); records are put
        # in batch order at the end. A page's batch comes from its block, through a table over the blocks' span.
        fp = np.sort(run["pages"])
        blocks, block_batch = run["blocks"], run["block_batch"]
        victims = run["victims"]
        b_lo = int(blocks.min())
        lut = np.zeros(int(blocks.max()) - b_lo + 1, dtype=np.int64)
        lut[blocks - b_lo] = block_batch
        by_page = np.sort(blocks)
        edges = np.concatenate((by_page, by_page + 1)) * PAGES_PER_BLOCK

        def batch_of(first: np.ndarray) -> np.ndarray:
            return lut[(first >> BLOCK_SHIFT) - b_lo]

        def per_batch(sorted_pages: np.ndarray) -> np.ndarray:
            """How many of ``sorted_pages`` each batch holds, counted block by block."""
            at = np.searchsorted(sorted_pages, edges)
            return np.bincount(lut[by_page - b_lo], weights=at[len(by_page):] - at[:len(by_page)],
                               minlength=nb).astype(np.int64)

        def in_batch_order(first: np.ndarray, *cols: np.ndarray) -> tuple[np.ndarray, ...]:
            """Runs found in page order, put in batch order (page order within a batch), with their batches."""
            owner = batch_of(first)
            o = np.argsort(owner, kind="stable")
            return (owner[o], first[o], *(c[o] for c in cols))

        # The prefetcher, once for every batch's blocks (it decides block by block).
        extra = self._fresh_prefetch(fp, by_page, processor, g) if self.prefetch else fp[:0]
        st, ex_st = t.state[fp], t.state[extra]
        ex_moving = ex_st != 0
        moved = fp[st != 0]
        ex_moved, ex_pop = extra[ex_moving], extra[~ex_moving]
        # Copies: one per run of pages moving, faulted ones (COHERENCE) and then prefetched ones (PREFETCH).
        m_runs, x_runs = page_runs(moved), page_runs(ex_moved)
        coh_b, coh_start, coh_len = in_batch_order(*m_runs)
        pre_b, pre_start, pre_len = in_batch_order(*x_runs)
        coh_bytes = coh_len.astype(np.uint64) * PAGE_SIZE
        pre_bytes = pre_len.astype(np.uint64) * PAGE_SIZE
        coh_d = link_seconds(coh_bytes, p.fault_htod_bw, p.link_k) * 1e9 if len(coh_bytes) else np.zeros(0)
        pre_d = link_seconds(pre_bytes, p.fault_htod_bw, p.link_k) * 1e9 if len(pre_bytes) else np.zeros(0)
        # Fault records: one per run of faulted and first-touched pages; value counts the faults in it.
        if len(ex_pop):
            allp = np.concatenate((fp, ex_pop))
            o = np.argsort(allp, kind="stable")
            allp = allp[o]
            isf = (o < len(fp)).astype(np.int64)
            f_start, f_len = page_runs(allp)
            f_val = np.add.reduceat(isf, np.concatenate(([0], np.cumsum(f_len)[:-1])))
        else:
            f_start, f_len = page_runs(fp)
            f_val = f_len
        f_b, f_start, f_len, f_val = in_batch_order(f_start, f_len, f_val)
        # Evictions: runs of the pages only each victim's chunk holds (GpuMemory.evict), victim by victim.
        n_evict = len(victims)
        if n_evict:
            vst = run["victim_states"]
            flat = np.flatnonzero((vst == mem.bit).reshape(-1))
            only = victims[flat >> BLOCK_SHIFT] * PAGES_PER_BLOCK + (flat & (PAGES_PER_BLOCK - 1))
            ev_start, ev_len = page_runs(only)
            ev_owner = (flat[np.concatenate(([0], np.cumsum(ev_len)[:-1]))] >> BLOCK_SHIFT) if len(ev_start) \
                else np.zeros(0, np.int64)
            ev_bytes = ev_len.astype(np.uint64) * PAGE_SIZE
            ev_d = link_seconds(ev_bytes, p.eviction_bw, p.link_k) * 1e9 if len(ev_bytes) else np.zeros(0)
            ev_runs = np.bincount(ev_owner, minlength=n_evict)
            ev_first = np.concatenate(([0], np.cumsum(ev_runs)))
            victim_b = run["victim_batch"]
            ev_b = victim_b[ev_owner]
        else:
            only = ev_start = ev_b = np.zeros(0, np.int64)
            ev_d = np.zeros(0)
            ev_first = np.zeros(1, np.int64)
            victim_b = np.zeros(0, np.int64)
        # Per batch: counts for the service time, and where each kind's records begin.
        cnt = lambda b: np.bincount(b, minlength=nb)   # noqa: E731
        n_pages, n_blocks, n_moved = cnt(batch_of(fp)), cnt(block_batch), cnt(batch_of(moved))
        n_ex_moved, n_ex_pop = per_batch(ex_moved), per_batch(ex_pop)
        # What leaves the host, as ranges unmapped (cut where a block ends): the two sets' runs, merged.
        mig_start = _union_starts(m_runs, x_runs)
        unmap_runs = cnt(batch_of(mig_start))
        n_ev, n_coh, n_pre, n_f = cnt(ev_b), cnt(coh_b), cnt(pre_b), cnt(f_b)
        per = n_ev + n_coh + n_pre + n_f
        base = np.concatenate(([0], np.cumsum(per)[:-1]))
        # -- the clock, batch by batch ------------------------------------------------------------------------
        ev_t0, ev_t1 = np.empty(len(ev_start)), np.empty(len(ev_start))
        coh_t0, coh_t1 = np.empty(len(coh_start)), np.empty(len(coh_start))
        pre_t0, pre_t1 = np.empty(len(pre_start)), np.empty(len(pre_start))
        fault_t = np.empty(nb, dtype=np.int64)
        touch_t = np.empty(nb, dtype=np.int64)
        wait = p.fault_eviction_latency * 1e9
        hit = HitSteps(local, remote)
        first_ev = np.searchsorted(victim_b, np.arange(nb + 1)).tolist() if n_evict else [0] * (nb + 1)
        coh_at = np.concatenate(([0], np.cumsum(n_coh))).tolist()
        pre_at = np.concatenate(([0], np.cumsum(n_pre))).tolist()
        ev_at = ev_first.tolist()
        npg, nbk = n_pages.tolist(), n_blocks.tolist()
        nmv, nxm, nxp, nur = n_moved.tolist(), n_ex_moved.tolist(), n_ex_pop.tolist(), unmap_runs.tolist()
        s_list = starts.tolist()
        now = log.t
        cursor = run["from"]
        for j in range(nb):
            s = s_list[j]
            now = hit.after_gap(now, s - cursor)   # the hits since the last batch
            for v in range(first_ev[j], first_ev[j + 1]):
                now = _group_clock(now, ev_d, ev_at[v], ev_at[v + 1], ev_t0, ev_t1)
                now = now + wait
            now = _group_clock(now, coh_d, coh_at[j], coh_at[j + 1], coh_t0, coh_t1)
            now = _group_clock(now, pre_d, pre_at[j], pre_at[j + 1], pre_t0, pre_t1)
            fault_t[j] = int(now)
            k, moved_j = npg[j], nmv[j] + nxm[j]
            new_chunks = nbk[j]
            service = p.fault_batch_latency + p.fault_block_latency * nbk[j] + k * p.fault_latency \
                + (k if write else 0) * p.fault_write_latency
            service += (k - nmv[j] + nxp[j]) * PAGE_SIZE / p.gpu_populate_bw \
                + moved_j * p.fault_page_latency + moved_j * p.fault_unmap_latency \
                + nur[j] * p.fault_unmap_run_latency + new_chunks * p.fault_chunk_latency
            now += service * 1e9
            touch_t[j] = int(now)
            cut = min(s + size, n) - s
            now += hit(cut)
            cursor = s + cut
        log.t = now
        # -- the records, in the order the general path appends them -------------------------------------------
        out = np.zeros(int(per.sum()), dtype=EVENT_DTYPE)

        def put(slots: np.ndarray, kind_: int, flags: int, src: int, dst: int, t0: np.ndarray, t1: np.ndarray,
                start_pages: np.ndarray, nbytes: np.ndarray, value: np.ndarray, alloc: np.ndarray, on: int) -> None:
            for name, column in (("kind", kind_), ("flags", flags), ("src", src), ("dst", dst), ("start", t0),
                                 ("end", t1), ("address", t.addresses(start_pages)), ("bytes", nbytes),
                                 ("value", value), ("alloc_id", alloc), ("stream", on)):
                out[name][slots] = column

        if len(ev_start):
            put(_slots(ev_b, base), EventKind.DTOH, MigrationCause.EVICTION, mem.device, HOST_ID,
                ev_t0.astype(np.uint64), ev_t1.astype(np.uint64), ev_start, ev_bytes, ev_bytes,
                t.block_alloc[victims[ev_owner]], 0)
        if len(coh_start):
            put(_slots(coh_b, base + n_ev), EventKind.HTOD, MigrationCause.COHERENCE, HOST_ID, processor,
                coh_t0.astype(np.uint64), coh_t1.astype(np.uint64), coh_start, coh_bytes, coh_bytes,
                t.block_alloc[coh_start >> BLOCK_SHIFT], stream)
        if len(pre_start):
            put(_slots(pre_b, base + n_ev + n_coh), EventKind.HTOD, MigrationCause.PREFETCH, HOST_ID, processor,
                pre_t0.astype(np.uint64), pre_t1.astype(np.uint64), pre_start, pre_bytes, pre_bytes,
                t.block_alloc[pre_start >> BLOCK_SHIFT], stream)
        if len(f_start):
            ft = fault_t[f_b].astype(np.uint64)
            put(_slots(f_b, base + n_ev + n_coh + n_pre), EventKind.GPU_PAGE_FAULT,
                kind if run["write"] else AccessType.READ, processor, processor, ft, ft, f_start,
                f_len.astype(np.uint64) * PAGE_SIZE, f_val, t.block_alloc[f_start >> BLOCK_SHIFT], stream)
        log._flush_rows()
        log.chunks.append(out)
        # -- state, chunks, the FIFO and the detector, as the batches leave them ---------------------------------
        if n_evict:
            mem.evicted(victims, only)
            stats.evictions += n_evict
        t.state[fp] = g
        if len(extra):
            t.state[extra] = g
        t.chunk[blocks] = True
        mem.used += len(blocks)
        q = np.arange(len(blocks), dtype=np.int64)
        t.last_use[blocks] = mem._tick + q + block_batch + 1          # each batch's claims, one tick each
        requeued = mem._tick + np.cumsum(n_blocks) + np.arange(nb) + 1   # then its migrated_into tick
        mem._order.update(zip(blocks.tolist(), requeued[block_batch].tolist(), strict=True))
        mem._tick = int(requeued[-1])
        if thr.enabled and len(mig_start):   # on_migration's first note of each block that pages left the host for
            mb = mig_start >> BLOCK_SHIFT
            mb = mb[np.concatenate(([True], mb[1:] != mb[:-1]))]
            when = touch_t[lut[mb - b_lo]].tolist()
            thr._touch.update((b, (processor, w)) for b, w in zip(mb.tolist(), when, strict=True))
        stats.batches += nb
        stats.faults += len(fp)
        stats.bytes_htod += (len(moved) + len(ex_moved)) * PAGE_SIZE
        stats.bytes_prefetched += len(ex_moved) * PAGE_SIZE
        return cursor

    def _fresh_prefetch(self, fp: np.ndarray, blocks: np.ndarray, processor: int, g: int) -> np.ndarray:
        """What the density prefetcher adds to faults ``fp`` (sorted) in untouched ``blocks`` (sorted): as
        ``_prefetch_pages`` finds it, where nothing is resident, nothing is advised and nothing thrashes.

        A regular stride faults every block in the same few patterns: each pattern is worked out once (and
        kept, by :func:`block_prefetch`) and laid over its blocks. Scattered faults, all patterns different,
        go to ``_prefetch_pages`` at once.
        """
        t = self.table
        row = np.searchsorted(blocks, fp >> BLOCK_SHIFT)
        faulted = np.zeros((len(blocks), PAGES_PER_BLOCK), dtype=bool)
        faulted[row, fp & (PAGES_PER_BLOCK - 1)] = True
        npages = t.block_pages[blocks].astype(np.int64)
        key = np.concatenate((np.packbits(faulted, axis=1), npages.astype("<u2").view(np.uint8).reshape(-1, 2)),
                             axis=1)
        patterns, first, which = np.unique(np.ascontiguousarray(key).view(f"V{key.shape[1]}").ravel(),
                                           return_index=True, return_inverse=True)
        if len(patterns) * 8 > len(blocks):
            return self._prefetch_pages(fp, np.ones(len(fp), dtype=bool), processor, g)
        nothing = np.zeros(PAGES_PER_BLOCK, dtype=bool)
        cands = [block_prefetch(nothing, faulted[r], int(npages[r]), self.threshold).astype(np.int64)
                 for r in first.tolist()]
        sizes = np.array([len(c) for c in cands], dtype=np.int64)
        per_row = sizes[which]
        total = int(per_row.sum())
        if not total:
            return fp[:0]
        # Block by block, in block order: each pattern's candidates laid over its blocks at once.
        row_first = np.concatenate(([0], np.cumsum(per_row)[:-1]))
        base = blocks * PAGES_PER_BLOCK
        out = np.empty(total, dtype=np.int64)
        if len(cands) == 1:
            out.reshape(len(blocks), -1)[:] = base[:, None] + cands[0][None, :]
            return out
        for p, cand in enumerate(cands):
            if len(cand):
                rows = np.flatnonzero(which == p)
                out[(row_first[rows][:, None] + np.arange(len(cand))).ravel()] = \
                    (base[rows][:, None] + cand[None, :]).ravel()
        return out
