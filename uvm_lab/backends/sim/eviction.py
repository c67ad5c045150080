"""GPU memory: 2 MiB root chunks, and which one goes when a chunk allocation fails (research R6).

The driver evicts only when a chunk allocation fails, synchronously, one whole 2 MiB root chunk at a
time, copying every page it backs to the host with cause EVICTION. Its victim is the head of the
``USED`` list, which is kept in allocation order and moved to the tail when a VA block allocates or
unpins a chunk in it, that is, when data migrates into it, **not when it is accessed**: in effect FIFO
by last migration. Chunks with no resident page (``UNUSED``) go before any used chunk.

Two "what if" policies sit beside it:

- ``"lru"``: least recently *accessed* root chunk (what the driver's TODO says it would like);
- ``"tree"``: LRU, plus the ISCA'19 tree-based neighbourhood pre-eviction: after evicting a chunk, its
  buddy under each aligned power-of-two group of chunks (4, 8 ... 32 MiB) of the same allocation is
  evicted too once no more than half of the group is still on the GPU (the mirror image of the
  prefetcher's "more than half"), so a sweep's old neighbourhood leaves at once.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from ...errors import InvalidArgumentError
from ...events.schema import EVENT_DTYPE, EventKind, MigrationCause
from ...location import HOST_ID
from .compiled import COMPILED, core
from .model import BLOCK_SHIFT, PAGES_PER_BLOCK, EventLog, PageTable, page_runs
from .platform import Platform, link_seconds

__all__ = ["EVICTION_POLICIES", "GpuMemory"]

#: Policy names: the driver's, and the what-if ones.
EVICTION_POLICIES = ("fifo", "lru", "tree")
_TREE_LEVELS = 5   # groups of 2 .. 32 root chunks


class GpuMemory:
    """One device's memory: capacity in root chunks, who holds them, and eviction.

    Parameters
    ----------
    table
        The page table whose blocks hold chunks.
    capacity_blocks
        Root chunks the device has.
    platform
        Costs of the eviction copies.
    policy
        One of :data:`EVICTION_POLICIES`.
    device
        The device ordinal.
    """

    def __init__(self, table: PageTable, capacity_blocks: int, platform: Platform, policy: str = "fifo",
                 device: int = 0) -> None:
        if policy not in EVICTION_POLICIES:
            raise InvalidArgumentError(f"eviction must be one of {', '.join(EVICTION_POLICIES)}, got {policy!r}",
                                       value=policy, expected=", ".join(EVICTION_POLICIES))
        self.table = table
        self.capacity = capacity_blocks
        self.platform = platform
        self.policy = policy
        self.device = device
        self.bit = 1 << (device + 1)
        self.used = 0            # managed root chunks held
        self.pinned = 0          # cudaMalloc memory: never evicted
        self.evicted_blocks = 0
        #: On the prefetch path evictions overlap the refill: their records do not advance the clock,
        #: and their seconds add up here for the caller to weigh against the copies they overlap.
        self.overlap = False
        self.overlapped_seconds = 0.0
        self._order: OrderedDict[int, int] = OrderedDict()   # block -> stamp when (re)queued
        self._tick = 0
        self._whole_for: Platform | None = None
        self._whole_s = 0.0
        #: Scan and time runs of evictions in C where it was compiled (switchable, so that the tests can hold
        #: the compiled code to the Python one).
        self.compiled = COMPILED

    @property
    def free_blocks(self) -> int:
        return self.capacity - self.used - self.pinned

    # -- bookkeeping the policies need ------------------------------------------------------------------
    def migrated_into(self, blocks: np.ndarray) -> None:
        """Data migrated into these blocks' chunks: the driver requeues them at the tail (FIFO by migration)."""
        self._tick += 1
        order = self._order
        for b in blocks.tolist():
            if b in order:
                order.move_to_end(b)
                order[b] = self._tick

    def accessed(self, blocks: np.ndarray) -> None:
        """Blocks touched by resident accesses: only the LRU-like policies care."""
        if self.policy != "fifo" and len(blocks):
            self._tick += 1
            self.table.last_use[blocks] = self._tick

    # -- allocation and eviction -------------------------------------------------------------------------
    def claim(self, blocks: np.ndarray, protect: set[int], log: EventLog) -> np.ndarray:
        """Give each block a root chunk, evicting as needed; returns a mask of the blocks that got one.

        Blocks in ``protect`` (those being serviced) are never chosen as victims.
        """
        table = self.table
        got = table.chunk[blocks].copy()
        need = np.flatnonzero(~got)
        short = len(need) - self.free_blocks
        if short > 1 and self.policy == "fifo" and not self.overlap:
            # FIFO's victims do not depend on what the claims do: evict them all at once up front.
            victims = []
            for b in self._order:
                if b not in protect:
                    victims.append(b)
                    if len(victims) == short:
                        break
            if victims:
                self._evict_many(np.array(victims, dtype=np.int64), log)
        if 0 < len(need) <= self.free_blocks:
            # Room for every claim: no eviction between them, so the loop below at once.
            claimed = blocks[need]
            ticks = self._tick + 1 + np.arange(len(need), dtype=np.int64)
            table.chunk[claimed] = True
            table.last_use[claimed] = ticks
            self.used += len(need)
            self._tick += len(need)
            self._order.update(zip(claimed.tolist(), ticks.tolist(), strict=True))
            got[need] = True
            return got
        for i in need.tolist():
            if self.claim_one(int(blocks[i]), protect, log):
                got[i] = True
        return got

    def claim_one(self, b: int, protect: set[int], log: EventLog) -> bool:
        """Give block ``b``, which holds no chunk, one, evicting first if none is free; False if none can be had."""
        if self.free_blocks <= 0 and not self.make_room(1, protect, log):
            return False
        self.table.chunk[b] = True
        self.used += 1
        self._tick += 1
        self._order[b] = self._tick
        self.table.last_use[b] = self._tick
        return True

    def make_room(self, nblocks: int, protect: set[int], log: EventLog) -> bool:
        """Evict until ``nblocks`` chunks are free; False if only protected or pinned chunks are left."""
        while self.free_blocks < nblocks:
            victim = self._victim(protect)
            if victim is None:
                return False
            self.evict(victim, log)
            if self.policy == "tree":
                self._pre_evict(victim, protect, log)
        return True

    def _victim(self, protect: set[int]) -> int | None:
        order, table = self._order, self.table
        # Chunks with no page left here are given back at once (release_if_empty), so the UNUSED list is
        # empty and the victim is the head of USED.
        rounds = 0
        while order:
            for b, stamp in order.items():
                if b in protect:
                    continue
                if self.policy != "fifo" and table.last_use[b] > stamp:
                    # Touched since it was queued: LRU gives it another round (lazy requeue).
                    order.move_to_end(b)
                    order[b] = int(table.last_use[b])
                    break
                return b
            else:
                return None
            rounds += 1
            if rounds > 4 * len(order):   # every chunk keeps being touched: take the oldest stamp
                return min((b for b in order if b not in protect), key=lambda k: order[k], default=None)
        return None

    def _pre_evict(self, victim: int, protect: set[int], log: EventLog) -> None:
        table = self.table
        alloc = table.block_alloc[victim]
        for level in range(1, _TREE_LEVELS + 1):
            size = 1 << level
            lo = victim >> level << level
            group = np.arange(lo, min(lo + size, table.nblocks))
            group = group[table.block_alloc[group] == alloc]
            held = group[table.chunk[group]]
            if len(held) * 2 > len(group):    # the mirror of the prefetcher's "more than half": keep it
                break
            for b in held.tolist():
                if b not in protect:
                    self.evict(b, log)

    def evict(self, b: int, log: EventLog) -> None:
        """Copy every page that only this chunk holds back to the host; drop duplicated copies."""
        table, g = self.table, self.bit
        lo = b * PAGES_PER_BLOCK
        st = table.state[lo:lo + int(table.block_pages[b])]
        if len(st) == PAGES_PER_BLOCK and not self.overlap and (st == g).all():
            self._evict_whole(b, log)
            return
        only_here = np.flatnonzero(st == g) + lo
        copies = np.flatnonzero(((st & g) != 0) & (st != g)) + lo
        starts, lengths = page_runs(only_here)
        if len(starts):
            nbytes = lengths.astype(np.uint64) * 4096
            seconds = link_seconds(nbytes, self.platform.eviction_bw, self.platform.link_k)
            log.add_many(EventKind.DTOH, flags=MigrationCause.EVICTION, src=self.device, dst=HOST_ID,
                         address=table.addresses(starts), nbytes=nbytes, alloc_id=table.block_alloc[b],
                         seconds=seconds, advance=not self.overlap)
            if self.overlap:
                self.overlapped_seconds += float(np.sum(seconds))
        if not self.overlap:   # a fault waits for the chunk to be unmapped and given up
            log.advance(self.platform.fault_eviction_latency)
        self.invalidate(copies, log)
        table.state[only_here] = 1
        table.state[copies] &= np.uint8(~g & 0xFF)
        # The GPU's mappings of these pages go with the chunk; AccessedBy mappings follow the data to the host.
        self.drop(b)
        self.evicted_blocks += 1

    def _evict_whole(self, b: int, log: EventLog) -> None:
        """:meth:`evict` of a block held here whole and only here (as a sweep or a stencil leaves one), with
        scalars: one copy of the block, then the wait for the chunk; the same record and clock."""
        table, p = self.table, self.platform
        if self._whole_for is not p:   # the copy's seconds, as link_seconds gives them for one 2 MiB run
            self._whole_for = p
            self._whole_s = link_seconds(np.array([PAGES_PER_BLOCK], dtype=np.int64).astype(np.uint64) * 4096,
                                         p.eviction_bw, p.link_k).tolist()[0]
        nbytes = PAGES_PER_BLOCK * 4096
        start = log.t
        end = start + self._whole_s * 1e9
        log.rows.append((EventKind.DTOH, MigrationCause.EVICTION, self.device, HOST_ID, int(start), int(end),
                         int(table.block_address[b]), nbytes, nbytes, table.block_alloc[b], 0, 0))
        log.t = end
        log.advance(p.fault_eviction_latency)
        lo = b * PAGES_PER_BLOCK
        table.state[lo:lo + PAGES_PER_BLOCK] = 1
        self.drop(b)
        self.evicted_blocks += 1

    def _evict_many(self, victims: np.ndarray, log: EventLog) -> None:
        """:meth:`evict` each of ``victims`` in turn, with one pass over arrays where none holds a duplicate."""
        table, g = self.table, self.bit
        only = None   # the pages only the victims held, where the compiled scan has not moved them home already
        if self.compiled:
            room = len(victims) * PAGES_PER_BLOCK // 2    # runs a victim can hold: every other page
            found = np.empty((3, room), dtype=np.int64)
            k = core.victim_runs(table.state, victims, table.block_pages[victims].astype(np.int64), g, found[0],
                                 found[1], found[2])
            if k < 0:   # duplicates are invalidated between the copies
                for b in victims.tolist():
                    self.evict(b, log)
                return
            starts, lengths, owner = found[:, :k]
        else:
            st = table.state.reshape(-1, PAGES_PER_BLOCK)[victims]    # the victims' blocks, whole
            npages = table.block_pages[victims]
            if (npages != PAGES_PER_BLOCK).any():
                st = np.where(np.arange(PAGES_PER_BLOCK)[None, :] < npages[:, None], st, 0)
            if (((st & g) != 0) & (st != g)).any():   # duplicates are invalidated between the copies
                for b in victims.tolist():
                    self.evict(b, log)
                return
            flat = np.flatnonzero(st.reshape(-1) == g)
            only = victims[flat >> BLOCK_SHIFT] * PAGES_PER_BLOCK + (flat & (PAGES_PER_BLOCK - 1))
            starts, lengths = page_runs(only)
            owner = flat[np.concatenate(([0], np.cumsum(lengths)[:-1]))] >> BLOCK_SHIFT if len(starts) else starts
        if len(starts):
            nbytes = lengths.astype(np.uint64) * 4096
            durations = link_seconds(nbytes, self.platform.eviction_bw, self.platform.link_k) * 1e9
            per_victim = np.bincount(owner, minlength=len(victims))
            wait = self.platform.fault_eviction_latency * 1e9
            # The clock as EventLog.add_many advances it, victim by victim (tuples up to four, else a cumsum),
            # and as evict() then advances it by the wait for the chunk.
            if per_victim.max() <= 4:   # one addition after another throughout: a cumsum from the clock
                at = np.arange(len(starts)) + owner                  # each copy, after its victims' waits
                steps = np.full(len(starts) + len(victims), wait)
                steps[at] = durations
                clock = np.cumsum(np.concatenate(([log.t], steps)))
                begin, finish, now = clock[at], clock[at + 1], float(clock[-1])
            elif self.compiled:
                begin, finish = np.empty(len(starts)), np.empty(len(starts))
                now = core.clock_by_victim(per_victim, durations, log.t, wait, begin, finish)
            else:
                begin, finish, now = self._clock_by_victim(per_victim.tolist(), durations.tolist(), log.t, wait)
            log._flush_rows()
            out = np.empty(len(starts), dtype=EVENT_DTYPE)
            out["kind"], out["flags"], out["src"], out["dst"] = EventKind.DTOH, MigrationCause.EVICTION, \
                self.device, HOST_ID
            out["start"] = np.asarray(begin, dtype=np.float64).astype(np.uint64)
            out["end"] = np.asarray(finish, dtype=np.float64).astype(np.uint64)
            out["address"], out["bytes"], out["value"] = table.addresses(starts), nbytes, nbytes
            out["alloc_id"], out["stream"], out["source"] = table.block_alloc[victims[owner]], 0, 0
            log.chunks.append(out)
            log.t = now
        else:
            for _ in range(len(victims)):
                log.advance(self.platform.fault_eviction_latency)
        self.evicted(victims, only)

    def evicted(self, victims: np.ndarray, only: np.ndarray | None) -> None:
        """After the copies of a run of evictions: ``only`` (the pages only the victims held; None where they are
        there already) are on the host, and the victims' chunks are given back (:meth:`drop` for each, at once)."""
        if only is not None:
            self.table.state[only] = 1
        self.drop_many(victims)
        self.evicted_blocks += len(victims)

    @staticmethod
    def _clock_by_victim(per_victim: list[int], durations: list[float], now: float,
                         wait: float) -> tuple[list, list, float]:
        """Start and end of each eviction copy, and the clock after them, as one add_many per victim sets them
        and the wait for its chunk follows."""
        begin, finish = [], []
        r = 0
        for c in per_victim:
            if c <= 4:
                for d in durations[r:r + c]:
                    begin.append(now)
                    now = now + d
                    finish.append(now)
            elif c:
                acc, t0 = 0.0, now
                for d in durations[r:r + c]:
                    begin.append(now)
                    acc += d
                    now = t0 + acc
                    finish.append(now)
            r += c
            now = now + wait
        return begin, finish, now

    def invalidate(self, pages: np.ndarray, log: EventLog, src: int | None = None) -> None:
        """Record that the copies of ``pages`` on ``src`` (this device by default) were dropped."""
        starts, lengths = page_runs(pages)
        if len(starts):
            p = self.device if src is None else src
            log.add_many(EventKind.INVALIDATE, flags=0, src=p, dst=p, address=self.table.addresses(starts),
                         nbytes=lengths.astype(np.uint64) * 4096,
                         alloc_id=self.table.block_alloc[starts >> BLOCK_SHIFT])

    def drop(self, b: int) -> None:
        """Give block ``b``'s chunk back (its pages have left the GPU, or its segment is freed)."""
        if self.table.chunk[b]:
            self.table.chunk[b] = False
            self.used -= 1
            self._order.pop(b, None)

    def drop_many(self, blocks: np.ndarray) -> None:
        """:meth:`drop` for each of ``blocks`` (a run of victims, or a freed segment's), at once."""
        held = blocks[self.table.chunk[blocks]]
        if not len(held):
            return
        self.table.chunk[held] = False
        self.used -= len(held)
        order = self._order
        if 4 * len(held) < len(order):
            for b in held.tolist():
                order.pop(b, None)
        else:
            # Most of the queue goes: keep the rest, in order, rather than unlink each. In place, since the
            # fault path holds the queue across an eviction.
            gone = set(held.tolist())
            kept = [(b, t) for b, t in order.items() if b not in gone]
            order.clear()
            order.update(kept)

    def release_if_empty(self, blocks: np.ndarray) -> None:
        """Blocks whose pages all left the GPU give their chunks back."""
        table = self.table
        for b in blocks.tolist():
            if table.chunk[b]:
                lo = b * PAGES_PER_BLOCK
                if not (table.state[lo:lo + PAGES_PER_BLOCK] & self.bit).any():
                    self.drop(b)
