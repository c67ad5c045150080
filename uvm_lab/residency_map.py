"""Residency maps: where each 4 KiB page of every allocation lives, rebuilt from events alone.

The tracker never asks a backend where a page is: it replays the event stream with the driver's
rules, so a map is exactly as true as the events are, on the simulator and on a real GPU alike.
A page state is a bitmask of the processors holding a copy (:mod:`uvm_lab.page_states`): the host (1),
GPU ``d`` (``1 << (d + 1)``), several of them (a read-duplicated page), none (0, never touched), and
:data:`UNKNOWN` (0x80) where the map cannot know whether a GPU holds a copy.

Rules applied per record:
- SEGMENT_ALLOC: managed pages start nowhere, device memory on its GPU, pinned memory on the host.
- HtoD / DtoH / DtoD: the pages move to ``dst``; into a ReadMostly page that still has its source
  copy they are duplicated instead. An eviction (DtoH, cause EVICTION) leaves only the host copy.
- INVALIDATE: the copies on ``src`` are dropped.
- PREFETCH: untouched pages are populated at the destination. A prefetch that completed with nothing
  measuring its migrations (flags ``PREFETCH_IMPLIES_MOVES``: a real GPU, tracing off) places every page
  at the destination as the driver does (:func:`~uvm_lab.tracing.inference.prefetch_result`), and the
  process-wide tracker publishes the migrations that implies, cause USER_INFERRED.
- UNOBSERVED: a GPU (``dst``) worked on the pages unseen: those not on that GPU alone become unknown,
  keeping their host bit (the host watcher sets it right). A ReadMostly collapse makes every page with
  several copies unknown, or places it at its preferred location where that held a copy. Host code's
  access leaves the pages on the host: alone after a write, beside their copies for a ReadMostly read.
- RESIDENCY: the pages are in state ``value`` (inferred, from the host's page tables).
- GPU / CPU page fault: untouched pages in the serviced range are populated at the preferred
  location if set, else at the faulting processor (first touch); a write leaves one copy, the writer's.
  A fault with ``bytes`` 0 (CUPTI's: the faulting page, range unknown) on an untouched page services
  the range the driver's density rule picks (:mod:`uvm_lab.tracing.density`); a CPU fault of unknown
  access on a page the host already holds a copy of can only be a write, and collapses it.
- Records of a fault or migration whose ``alloc_id`` names another segment are stale (delivered
  after their allocation was freed and its address reused) and are skipped.
- ADVICE: ReadMostly and PreferredLocation are tracked, since the rules above depend on them.

Runs of fault and migration records (CUPTI delivers them by the ten thousand) are applied in bulk with
the same result: a migration outside ReadMostly pages leaves one copy at its destination, so a run of
them paints each page with its last destination; a fault on a page that already holds data changes
nothing unless it must collapse copies. Records that need the state left by the one before (first
touches, collapses, ReadMostly duplication) are replayed one by one, in order, between the bulk parts.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
from numba import njit, types

from .buffer import DeviceBuffer, find_buffer, page_range
from .errors import BufferClosedError, InvalidArgumentError
from .events.bus import EventBus, get_bus
from .events.schema import (
    PREFETCH_IMPLIES_MOVES,
    AccessType,
    Advice,
    EventKind,
    MemoryKind,
    MigrationCause,
    UnobservedCause,
)
from .location import HOST_ID
from .page_states import (
    BOTH,
    GPU,
    HOST,
    MAX_GPUS,
    NOWHERE,
    UNKNOWN,
    bit,
    bits,
    categories,
    count_states,
    gpu_bits,
    state_name,
)
from .tracing.density import BLOCK_PAGES, serviced_region
from .tracing.inference import moves, prefetch_result
from .units import PAGE_SIZE, format_bytes

__all__ = ["BOTH", "GPU", "HOST", "NOWHERE", "UNKNOWN", "ResidencyMap", "ResidencyTracker", "get_tracker",
           "residency"]

_NO_PREFERENCE = -2
_WRITES = (AccessType.WRITE, AccessType.ATOMIC)
_FAULTS = (EventKind.GPU_PAGE_FAULT, EventKind.CPU_PAGE_FAULT)
_DRIVER = frozenset(int(k) for k in (EventKind.HTOD, EventKind.DTOH, EventKind.DTOD, EventKind.GPU_PAGE_FAULT,
                                     EventKind.CPU_PAGE_FAULT, EventKind.REMOTE_MAP))
_MOVES = np.zeros(256, dtype=bool)
_MOVES[[EventKind.HTOD, EventKind.DTOH, EventKind.DTOD]] = True
_BULK = _MOVES.copy()           # kinds a run of which may be applied in bulk
_BULK[[EventKind.GPU_PAGE_FAULT, EventKind.CPU_PAGE_FAULT]] = True
_BULK_MIN = 16                  # shorter runs go one by one
_REPLAYED = (EventKind.SEGMENT_ALLOC, EventKind.SEGMENT_FREE, EventKind.HTOD, EventKind.DTOH, EventKind.DTOD,
             EventKind.INVALIDATE, EventKind.PREFETCH, EventKind.GPU_PAGE_FAULT, EventKind.CPU_PAGE_FAULT,
             EventKind.ADVICE, EventKind.UNOBSERVED, EventKind.RESIDENCY)
_COPY_COUNT = np.array([bin(v & 0x7F).count("1") for v in range(256)], dtype=np.uint8)




def _where(states: np.ndarray) -> dict[str, np.ndarray]:
    """Which of :meth:`ResidencyMap.counts`' groups each page state is in."""
    unknown = (states & UNKNOWN) != 0
    on_host = ((states & HOST) != 0) & ~unknown
    on_gpu = gpu_bits(states) != 0
    return {"gpu": on_gpu & ~on_host, "host": on_host & ~on_gpu, "both": on_host & on_gpu, "nowhere": states == 0,
            "unknown": unknown}


_WHERE_NAMES = tuple(_where(np.zeros(1, np.uint8)))
_WHERE_BY_STATE = np.array(list(_where(np.arange(256, dtype=np.uint8)).values()), dtype=np.int64)


@dataclass(frozen=True)
class ResidencyMap:
    """A snapshot of the page states of one address range."""

    address: int
    size: int
    states: np.ndarray
    page_size: int = PAGE_SIZE
    #: One bool per page: ReadMostly (such a page may have several copies); None where not known.
    read_mostly: np.ndarray | None = None

    NOWHERE = NOWHERE
    HOST = HOST
    GPU = GPU
    BOTH = BOTH
    UNKNOWN = UNKNOWN

    @cached_property
    def pages_by_state(self) -> np.ndarray:
        """How many pages are in each of the 256 page states (``int64``): one pass over the pages, which every
        count of the map (:meth:`counts`, a view's categories) then reads. The map is a snapshot: read once."""
        counts = count_states(self.states)
        counts.flags.writeable = False
        return counts

    def counts(self) -> dict[str, int]:
        """Pages by where their copies are: ``gpu`` (on one or more GPUs only), ``host`` (only), ``both``,
        ``nowhere``, and ``unknown`` (whether a GPU holds them cannot be known; see :meth:`copies` for the
        host's side of those). The five add up to the pages of the map."""
        # Pages by state (256 counters), then the rule (_where) over the states.
        return dict(zip(_WHERE_NAMES, (_WHERE_BY_STATE @ self.pages_by_state).tolist(), strict=True))

    def summary(self) -> dict[str, float]:
        """Fractions of pages on the GPU only, the host only, both, nowhere, and unknown; they sum to 1."""
        n = max(len(self.states), 1)
        return {k: v / n for k, v in self.counts().items()}

    def copies(self) -> dict[str, int]:
        """Pages each processor is known to hold a copy of: ``{"host": n, "gpu:0": n, "gpu:1": n, ...}``.

        A read-duplicated page counts once for each holder. Pages whose GPU side is unknown count for the
        host where it holds them, and for no GPU. Processors holding nothing are left out.
        """
        held = {"host": int(((self.states & HOST) != 0).sum())}
        held.update({f"gpu:{d}": int(((self.states & np.uint8(bit(d))) != 0).sum()) for d in range(MAX_GPUS)})
        return {k: v for k, v in held.items() if v}

    def runs(self) -> list[tuple[int, int, str]]:
        """The map as runs of equal state: ``(first page, pages, state name)``, the name as
        :func:`~uvm_lab.page_states.state_name` gives it (``"gpu:1"``, ``"host+unknown"`` ...)."""
        states = self.states
        if not len(states):
            return []
        edges = np.flatnonzero(np.diff(states)) + 1
        starts = np.r_[0, edges]
        lengths = np.diff(np.r_[starts, len(states)])
        return [(int(a), int(n), state_name(int(states[a]))) for a, n in zip(starts.tolist(), lengths.tolist(),
                                                                              strict=True)]

    def categories(self) -> np.ndarray:
        """Each page's category code, as views draw it (:func:`uvm_lab.page_states.categories`)."""
        return categories(self.states)

    def __repr__(self) -> str:
        parts = ", ".join(f"{k} {v:.1%}" for k, v in self.summary().items() if v or k != "unknown")
        held = ", ".join(f"{k} {v}" for k, v in self.copies().items())
        return (f"<ResidencyMap {format_bytes(self.size)} at {self.address:#x}, {len(self.states)} pages: {parts}"
                f"{'; copies: ' + held if held else ''}>")


class _Segment:
    __slots__ = ("address", "any_read_mostly", "id", "kind", "preferred", "read_mostly", "size", "state")

    def __init__(self, address: int, size: int, kind: int, device: int, seg_id: int) -> None:
        n = -(-size // PAGE_SIZE)
        initial = {int(MemoryKind.DEVICE): bit(device), int(MemoryKind.PINNED_HOST): 1}.get(kind, 0)
        self.address, self.size, self.kind, self.id = address, size, kind, seg_id
        self.state = np.full(n, initial, dtype=np.uint8)
        self.read_mostly = np.zeros(n, dtype=bool)
        self.any_read_mostly = False
        self.preferred = np.full(n, _NO_PREFERENCE, dtype=np.int16)

    def pages(self, address: int, nbytes: int) -> slice:
        first = max((address - self.address) // PAGE_SIZE, 0)
        last = min(-(-(address + nbytes - self.address) // PAGE_SIZE), len(self.state))
        return slice(int(first), int(last))


class ResidencyTracker:
    """Keeps the page states of every live segment by replaying the events published on a bus.

    It also keeps a journal of where the states changed, so that a view redraws only what did
    (:meth:`changes`).
    """

    #: Journal entries kept (address ranges, merged per batch of events); a reader further behind than
    #: this is told to read everything again.
    JOURNAL = 1 << 16
    #: Past this many separate ranges in one batch, each segment's are joined into one span.
    _RANGES_PER_BATCH = 256

    def __init__(self, bus: EventBus | None = None, *, publishes_inferred: bool = False) -> None:
        if not isinstance(publishes_inferred, bool):
            raise InvalidArgumentError(f"publishes_inferred must be True or False, got {publishes_inferred!r}",
                                       value=publishes_inferred, expected="a bool")
        #: Whether this tracker publishes the migrations a completed, unmeasured prefetch implies. One
        #: tracker per bus should (the process-wide one does), or they would be counted once per tracker.
        self.publishes_inferred = publishes_inferred
        self._segments: dict[int, _Segment] = {}
        self._starts: list[int] = []
        self._table: tuple[np.ndarray, np.ndarray, np.ndarray, list[_Segment]] | None = None   # for bulk lookups
        self._lock = threading.Lock()
        self._inferred: list[np.ndarray] = []   # migrations to publish once a batch is replayed
        self._touched: list[tuple[int, int]] = []   # address ranges the batch being replayed changed
        self._touched_runs: list[np.ndarray] = []    # the same, from bulk runs: (n, 2) arrays
        # Rows (batch number, start, end), oldest first, in _journal[_journal_head:_journal_tail]; room for twice
        # JOURNAL rows, moved down when the end is reached, so a reader finds its place by one search.
        self._journal = np.zeros((0, 3), dtype=np.int64)
        self._journal_head = self._journal_tail = 0
        self._batches = 0          # batches that changed something
        self._forgotten = 0        # the newest batch number that fell out of the journal
        self._advice_changes = 0   # ADVICE records replayed (see advice_changes)
        self.bus = bus or get_bus()
        self.subscription = self.bus.subscribe(self.apply, kinds=_REPLAYED, inline=True)

    def close(self) -> None:
        self.subscription.close()

    def apply(self, records: np.ndarray) -> None:
        """Replay ``records`` (in order) onto the page states."""
        with self._lock:
            self._inferred = []
            self._replay(records)
            inferred, self._inferred = self._inferred, []
            if self._touched or self._touched_runs:
                self._note()
        if inferred:   # published outside the lock: this tracker hears them too (they change nothing)
            self.bus.publish(np.concatenate(inferred))

    def _replay(self, records: np.ndarray) -> None:
        n = len(records)
        bulk = _BULK[records["kind"]]
        if n < _BULK_MIN or not bulk.any():
            for rec in records.tolist():
                self._apply_one(*rec)
            return
        # Runs of fault and migration records in bulk; everything else one by one.
        edges = np.flatnonzero(np.diff(bulk.view(np.int8))) + 1
        for a, b in zip(np.r_[0, edges].tolist(), np.r_[edges, n].tolist(), strict=True):
            if bulk[a] and b - a >= _BULK_MIN:
                self._apply_run(records[a:b])
            else:
                for rec in records[a:b].tolist():
                    self._apply_one(*rec)

    def _note(self) -> None:
        """Journal the ranges one batch changed, merged (lock held)."""
        ranges = np.concatenate([np.array(self._touched, dtype=np.int64).reshape(-1, 2), *self._touched_runs])
        self._touched, self._touched_runs = [], []
        merged = _merge(ranges)
        if len(merged) > self._RANGES_PER_BATCH:   # a scattered batch: one span per segment it touched
            starts = self._lookup_table()[0].astype(np.int64)
            which = np.searchsorted(starts, merged[:, 0], side="right") - 1
            spans = [(int(merged[which == i, 0].min()), int(merged[which == i, 1].max()))
                     for i in np.unique(which).tolist()]
            merged = np.array(spans, dtype=np.int64).reshape(-1, 2)
        self._batches += 1
        self._journal_add(merged)

    def _journal_add(self, ranges: np.ndarray) -> None:
        """Journal ``ranges`` as batch ``_batches``'s; past ``JOURNAL`` rows the oldest fall out (lock held)."""
        rows = np.column_stack([np.full(len(ranges), self._batches, dtype=np.int64), ranges])
        if self._journal_tail + len(rows) > len(self._journal):   # no room left at the end: move the rows down
            held = self._journal[self._journal_head:self._journal_tail]
            journal = np.zeros((max(2 * self.JOURNAL, 2 * len(rows)), 3), dtype=np.int64)
            journal[:len(held)] = held
            self._journal, self._journal_head, self._journal_tail = journal, 0, len(held)
        self._journal[self._journal_tail:self._journal_tail + len(rows)] = rows
        self._journal_tail += len(rows)
        if self._journal_tail - self._journal_head > self.JOURNAL:
            self._journal_head = self._journal_tail - self.JOURNAL
            self._forgotten = int(self._journal[self._journal_head - 1, 0])

    @property
    def advice_changes(self) -> int:
        """ADVICE records replayed so far. While it stays put, no buffer's advice changed through a backend's
        ``advise`` (every one publishes what it set), so a reader that keeps advice it read reads it again only
        once this moves: reading it asks the backend, which a loop's operations hold meanwhile."""
        return self._advice_changes

    def changes(self, since: int = 0) -> tuple[int, np.ndarray | None]:
        """Where page states (or advice) may have changed since ``since``: ``(now, ranges)``.

        ``now`` is the cursor to pass next time; ``ranges`` an ``(n, 2)`` int64 array of ``[start, end)``
        address ranges, sorted and disjoint, or None when ``since`` is older than the journal holds (read
        everything again). Segments made or freed are among the ranges. Start with ``since=0``, which
        reports everything the journal still holds.
        """
        if isinstance(since, bool) or not isinstance(since, (int, np.integer)) or since < 0:
            raise InvalidArgumentError(f"since must be a cursor that changes() returned (an int >= 0), got {since!r}",
                                       value=since, expected="an int >= 0")
        self.bus.flush(wait=False)
        with self._lock:
            if since > self._batches:
                raise InvalidArgumentError(f"since {since} is ahead of this tracker ({self._batches})", value=since,
                                           expected=f"an int from 0 to {self._batches}")
            if since < self._forgotten:
                return self._batches, None
            return self._batches, _merged_since(self._journal, self._journal_head, self._journal_tail, since)

    def _lookup_table(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[_Segment]]:
        if self._table is None:
            segs = [self._segments[a] for a in self._starts]
            self._table = (np.array([s.address for s in segs], dtype=np.uint64),
                           np.array([s.address + s.size for s in segs], dtype=np.uint64),
                           np.array([s.id for s in segs], dtype=np.uint64), segs)
        return self._table

    def _apply_run(self, records: np.ndarray) -> None:
        """Apply a run of fault and migration records: bulk where the rules allow, else one by one.

        Chunks grow while they apply whole and shrink when a record needs the one-by-one rules, so a
        run of first touches costs little more than replaying it record by record.
        """
        n, pos, chunk, streak = len(records), 0, 256, 0
        while pos < n:
            if chunk <= 1:
                self._apply_one(*records[pos].tolist())
                pos += 1
                streak += 1
                if streak >= 16:
                    chunk, streak = 16, 0
                continue
            part = records[pos:pos + chunk]
            k = self._apply_bulk(part)
            if k < len(part):
                self._apply_one(*part[k].tolist())
                pos += k + 1
                chunk = chunk if k >= chunk // 2 else chunk // 2
            else:
                pos += len(part)
                chunk = min(chunk * 2, 1 << 16)

    def _apply_bulk(self, part: np.ndarray) -> int:
        """Apply the longest prefix of ``part`` whose records the bulk rule covers; its length.

        Valid because what the prefix's migrations do cannot change which records qualify: each leaves
        a page with exactly one copy, so a page that held data still does and no copies are created.
        """
        starts, ends, ids, segs = self._lookup_table()
        n = len(part)
        address = part["address"]
        which = np.searchsorted(starts, address, side="right").astype(np.int64) - 1
        live = which >= 0
        live[live] = address[live] < ends[which[live]]
        alloc = part["alloc_id"]
        live[live] = (alloc[live] == 0) | (alloc[live] == ids[which[live]])   # else stale: skipped
        kind = part["kind"]
        nbytes = part["bytes"]
        ok = np.ones(n, dtype=bool)          # records the bulk rule covers (dead ones are no-ops)
        lo = np.zeros(n, dtype=np.int64)
        hi = np.zeros(n, dtype=np.int64)
        value = np.zeros(n, dtype=np.uint8)
        moves = _MOVES[kind] & live
        for si in np.unique(which[live]).tolist():
            seg = segs[si]
            mine = live & (which == si)
            offset = (address[mine] - np.uint64(seg.address)).astype(np.int64)
            m = moves[mine]
            if seg.any_read_mostly:
                ok[np.flatnonzero(mine)[m]] = False      # duplication depends on each page's copies
            npages = len(seg.state)
            first = np.maximum(offset // PAGE_SIZE, 0)
            last = np.minimum(-(-(offset + nbytes[mine].astype(np.int64)) // PAGE_SIZE), npages)
            lo[mine], hi[mine] = first, last
            value[mine] = bits(part["dst"][mine])
            # Faults: a no-op on a page that already holds data, unless copies must collapse.
            f = ~m
            if f.any():
                st = seg.state[np.minimum(first[f], npages - 1)]
                flags = part["flags"][mine][f]
                multi = (st & (st - 1)) != 0
                write = (flags == AccessType.WRITE) | (flags == AccessType.ATOMIC)
                cpu = kind[mine][f] == EventKind.CPU_PAGE_FAULT
                unknown_cpu = cpu & (flags == AccessType.UNKNOWN)
                host_and_gpu = ((st & 1) != 0) & ((st & ~np.uint8(1)) != 0)
                fine = (nbytes[mine][f] == 0) & (st != 0) & ~(write & multi) & ~(unknown_cpu & host_and_gpu)
                idx = np.flatnonzero(mine)[f]
                ok[idx] = fine
                moves[idx] = False
        bad = np.flatnonzero(~ok)
        k = int(bad[0]) if len(bad) else n
        paint = np.flatnonzero(moves[:k])
        if len(paint):
            for si in np.unique(which[paint]).tolist():
                sel = paint[which[paint] == si]
                _paint(segs[si].state, lo[sel], hi[sel], value[sel])
                base = segs[si].address
                self._touched_runs.append(np.stack([base + lo[sel] * PAGE_SIZE, base + hi[sel] * PAGE_SIZE], axis=1))
        return k

    def _apply_one(self, kind: int, flags: int, src: int, dst: int, start: int, end: int, address: int,
                   nbytes: int, value: int, alloc_id: int, stream: int, source: int) -> None:
        if kind == EventKind.SEGMENT_ALLOC:
            if address not in self._segments:
                bisect.insort(self._starts, address)
            self._table = None
            self._segments[address] = _Segment(address, nbytes, flags, dst, alloc_id)
            self._touched.append((address, address + nbytes))
            return
        if kind == EventKind.SEGMENT_FREE:
            gone = self._segments.pop(address, None)
            if gone is not None:
                self._starts.remove(address)
                self._table = None
                self._touched.append((address, address + gone.size))
            return
        if kind == EventKind.ADVICE:   # counted whether or not this tracker holds the range
            self._advice_changes += 1
        seg = self._segment_at(address)
        if seg is None or (alloc_id and alloc_id != seg.id and kind in _DRIVER):
            return
        if nbytes == 0 and kind in _FAULTS:
            sl = self._serviced(seg, address, dst if kind == EventKind.GPU_PAGE_FAULT else HOST_ID, flags)
        else:
            sl = seg.pages(address, nbytes)
        if sl.stop > sl.start:
            self._touched.append((seg.address + sl.start * PAGE_SIZE, seg.address + sl.stop * PAGE_SIZE))
        st = seg.state[sl]
        if kind in (EventKind.HTOD, EventKind.DTOH, EventKind.DTOD):
            target = bit(dst)
            if kind == EventKind.DTOH and flags == MigrationCause.EVICTION:
                st[:] = HOST
            else:
                keep = seg.read_mostly[sl] & ((st & bit(src)) != 0)   # a read-duplicate keeps its source
                st[:] = np.where(keep, st | target, target)
        elif kind == EventKind.INVALIDATE:
            st &= ~np.uint8(bit(src))
        elif kind == EventKind.PREFETCH:
            if flags & PREFETCH_IMPLIES_MOVES:
                old = st.copy()
                st[:] = prefetch_result(old, seg.read_mostly[sl], dst)
                if self.publishes_inferred:
                    self._inferred.append(moves(old, st, address=seg.address + sl.start * PAGE_SIZE,
                                           cause=MigrationCause.USER_INFERRED, alloc_id=seg.id, start=start,
                                           end=end, stream=stream, source=source))
            else:
                st[st == 0] = bit(dst)
        elif kind == EventKind.UNOBSERVED:
            if flags == UnobservedCause.COLLAPSE:
                several = (_COPY_COUNT[st] >= 2) | (((st & UNKNOWN) != 0) & ((st & HOST) != 0))
                pref = seg.preferred[sl]
                pref_bit = bits(pref)
                kept = several & (pref != _NO_PREFERENCE) & ((st & pref_bit) != 0) & (pref_bit != UNKNOWN)
                st[:] = np.where(kept, pref_bit, np.where(several, (st & HOST) | UNKNOWN, st))
            elif flags == UnobservedCause.HOST:   # the host cannot reach GPU memory: it copies or moves pages in
                duplicate = seg.read_mostly[sl] & (st != 0) & (value == AccessType.READ)   # only a read duplicates
                st[:] = np.where(duplicate, st | HOST, HOST)
            else:
                st[st != bit(dst)] = (st[st != bit(dst)] & HOST) | UNKNOWN
        elif kind == EventKind.RESIDENCY:
            st[:] = value & 0xFF
        elif kind in (EventKind.GPU_PAGE_FAULT, EventKind.CPU_PAGE_FAULT):
            faulter = dst if kind == EventKind.GPU_PAGE_FAULT else HOST_ID
            pref = seg.preferred[sl]
            untouched = st == 0
            # First touch: the preferred location if the faulter can reach it, else the faulter.
            # On x86 the CPU cannot reach GPU memory, so a CPU first touch always lands on the host.
            usable = (pref != _NO_PREFERENCE) & ((pref == HOST_ID) | (faulter != HOST_ID))
            st[untouched] = np.where(usable, bits(pref), bit(faulter))[untouched].astype(np.uint8)
            if flags in _WRITES:
                st[(st & (st - 1)) != 0] = bit(faulter)
            elif nbytes == 0 and flags == AccessType.UNKNOWN and faulter == HOST_ID and not untouched.any():
                st[((st & 1) != 0) & ((st & ~np.uint8(1)) != 0)] = HOST   # only a write faults on a host copy
        elif kind == EventKind.ADVICE:
            if flags in (Advice.SET_READ_MOSTLY, Advice.UNSET_READ_MOSTLY):
                seg.read_mostly[sl] = flags == Advice.SET_READ_MOSTLY
                seg.any_read_mostly = bool(seg.read_mostly.any())
            elif flags == Advice.SET_PREFERRED_LOCATION:
                seg.preferred[sl] = dst
            elif flags == Advice.UNSET_PREFERRED_LOCATION:
                seg.preferred[sl] = _NO_PREFERENCE

    @staticmethod
    def _serviced(seg: _Segment, address: int, faulter: int, flags: int) -> slice:
        """The pages a fault known only by its page serviced: the driver's first-touch range for an
        untouched page, else the page alone (what moved is in the migration records)."""
        page = (address - seg.address) // PAGE_SIZE
        if seg.state[page] != 0:
            return slice(page, page + 1)
        # The 2 MiB VA block around the page, in the segment's page numbers.
        block_first = (seg.address // PAGE_SIZE + page) // BLOCK_PAGES * BLOCK_PAGES - seg.address // PAGE_SIZE
        lo, hi = max(block_first, 0), min(block_first + BLOCK_PAGES, len(seg.state))
        resident = np.zeros(BLOCK_PAGES, dtype=bool)
        resident[lo - block_first:hi - block_first] = (seg.state[lo:hi] & bit(faulter)) != 0
        first, last = serviced_region(resident, page - block_first)
        return slice(max(block_first + first, lo), min(block_first + last, hi))

    def _segment_at(self, address: int) -> _Segment | None:
        i = bisect.bisect_right(self._starts, address) - 1
        if i < 0:
            return None
        seg = self._segments[self._starts[i]]
        return seg if address < seg.address + seg.size else None

    def map(self, address: int, size: int) -> ResidencyMap:
        """The page states of ``[address, address + size)``, which must lie in one live segment."""
        self.bus.flush(wait=False)
        with self._lock:
            seg = self._segment_at(address)
            if seg is None or address + size > seg.address + seg.size:
                raise InvalidArgumentError(f"no live allocation holds the range {address:#x} + {size} bytes",
                                           value=address, expected="the range of a live allocation")
            sl = seg.pages(address, size)
            return ResidencyMap(address, size, _copied(seg.state[sl]), read_mostly=_copied(seg.read_mostly[sl]))

    def segments(self) -> list[dict[str, Any]]:
        with self._lock:
            return [{"id": s.id, "address": s.address, "size": s.size, "kind": MemoryKind(s.kind).name.lower()}
                    for s in self._segments.values()]


@njit([types.uint8[::1](types.uint8[::1]), types.boolean[::1](types.boolean[::1])], cache=True)
def _copied(pages: np.ndarray) -> np.ndarray:
    # A map's own copy, made holding the interpreter's lock: numpy lets it go around a copy of a few thousand pages,
    # and a live view reading maps beside a loop would then hand the lock (and this tracker's) to the loop and back.
    return pages.copy()


def _merge(ranges: np.ndarray) -> np.ndarray:
    """``[start, end)`` ranges (an ``(n, 2)`` array) sorted, with overlapping and adjacent ones joined."""
    return _merged(np.ascontiguousarray(ranges, dtype=np.int64).reshape(-1, 2))


@njit(types.int64[:, ::1](types.int64[:, ::1]), cache=True)
def _merged(ranges: np.ndarray) -> np.ndarray:
    # Compiled: every batch the tracker journals, and every read of the journal (a live view's, 20 a second), merges.
    out = np.empty_like(ranges)
    k = -1
    for i in np.argsort(ranges[:, 0], kind="mergesort"):
        start, end = ranges[i, 0], ranges[i, 1]
        if k >= 0 and start <= out[k, 1]:   # overlaps or touches the joined range before it: joins it
            out[k, 1] = max(out[k, 1], end)
        else:
            k += 1
            out[k, 0], out[k, 1] = start, end
    return out[:k + 1].copy()


@njit(types.int64[:, ::1](types.int64[:, ::1], types.int64, types.int64, types.int64), cache=True)
def _merged_since(journal: np.ndarray, head: int, tail: int, since: int) -> np.ndarray:
    # The ranges of the journal's rows [head, tail) after batch `since`, merged: found by one search (a reader that
    # keeps up reads only what is new), in one compiled call (a live view reads the journal 20 times a second).
    first = head + np.searchsorted(journal[head:tail, 0], since, side="right")   # the first row of a later batch
    return _merged(np.ascontiguousarray(journal[first:tail, 1:]))


def _paint(state: np.ndarray, lo: np.ndarray, hi: np.ndarray, value: np.ndarray) -> None:
    """``state[lo[i]:hi[i]] = value[i]`` for each i in order: where ranges overlap, the last one wins."""
    lens = hi - lo
    keep = lens > 0
    lo, hi, value, lens = lo[keep], hi[keep], value[keep], lens[keep]
    if not len(lo):
        return
    order = np.argsort(lo, kind="stable")
    if (hi[order][:-1] > lo[order][1:]).any():   # overlapping ranges: in order, slice by slice
        for first, last, v in zip(lo.tolist(), hi.tolist(), value.tolist(), strict=True):
            state[first:last] = v
        return
    total = int(lens.sum())
    state[np.repeat(lo - (np.cumsum(lens) - lens), lens) + np.arange(total)] = np.repeat(value, lens)


_tracker: ResidencyTracker | None = None
_tracker_lock = threading.Lock()


def get_tracker() -> ResidencyTracker:
    """The process-wide tracker, listening to the process-wide bus."""
    global _tracker
    with _tracker_lock:
        if _tracker is None:
            _tracker = ResidencyTracker(publishes_inferred=True)
        return _tracker


def residency(buffer: Any, *, first_page: int = 0, pages: int | None = None) -> ResidencyMap:
    """The residency map of a :class:`~uvm_lab.DeviceBuffer` (or of the live buffer with that id): of its pages
    ``first_page`` on, ``pages`` of them (all, for None)."""
    buf = buffer if isinstance(buffer, DeviceBuffer) else find_buffer(buffer)
    if buf.closed:
        raise BufferClosedError(f"{buf.label!r} is closed: its pages no longer exist")
    if buf.size == 0 and first_page == 0 and pages is None:
        return ResidencyMap(buf.ptr, 0, np.zeros(0, dtype=np.uint8))
    offset, size = page_range(buf, first_page, pages)
    return get_tracker().map(buf.ptr + offset, size)


# ``ul.residency.GPU`` and friends, beside ``ul.residency(buf)``.
residency.NOWHERE, residency.HOST, residency.GPU, residency.BOTH = NOWHERE, HOST, GPU, BOTH  # type: ignore[attr-defined]
residency.UNKNOWN = UNKNOWN  # type: ignore[attr-defined]
