"""What the lab view's timeline and device lanes read: recent events as columns, and per-interval samples.

Both are fed by the event bus and shared by every view of the kernel (:func:`shared`), so a view opened
late, or opened again, starts with what happened before it. Both are bounded: the oldest events and
samples go first, and how many went is counted and sent to the view, which shows it.

:class:`EventWindow` answers the ``timeline`` query (:mod:`.protocol`): the events of a time window,
with those narrower than one of the view's pixels merged per lane, pixel, kind and cause, so an answer
grows with the view's width and lanes, not with the rate of events. :class:`DeviceSeries` sums each
update interval's transfers, faults and evictions into one small row, per GPU: :func:`device_counts` is the one rule
of which GPU a record counts for.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Final

import numpy as np
from numba import njit, typed, types

from ..clock import SYSTEM_CLOCK, Clock, checked_clock
from ..errors import InvalidArgumentError, InvalidStateError
from ..events import EventKind, MigrationCause, get_bus
from ..events.bus import EventBus, HistoryReader, Subscription
from ..events.causes import CAUSE_NAMES, cause_codes
from ..events.schema import EVENTS_TYPE, INFERRED_BIT
from ..events.sources import totals
from ..events.staged import StagedRecords, joined
from ..tracing.attribution import AllocationIndex
from .protocol import TIMELINE_COLUMNS, DeviceSample, Traffic

__all__ = ["GPU_COUNTERS", "DeviceSeries", "EventWindow", "device_counts", "follow", "release_shared", "shared"]

#: A merged row's ``src`` or ``dst`` when its events had several.
SEVERAL: Final = -3

# The columns an EventWindow keeps of each record (the timeline's, less the merge count).
_KEPT = {name: np.dtype(dtype) for name, dtype in TIMELINE_COLUMNS if name != "count"}
# What it holds of each: those, and a fault record's count (for by_source).
_HELD = {**_KEPT, "value": np.dtype(np.float64)}


class _Chunk:
    """Consecutive events as columns (:data:`_HELD`, and ``lane_id``: the lane as an int, for matching), with the
    earliest start and the latest end among them, so a query passes over a chunk outside its window unread."""

    __slots__ = ("_by_lane", "columns", "first", "last")

    def __init__(self, columns: dict[str, np.ndarray]) -> None:
        self.columns = columns
        self.first = float(columns["start"].min()) if len(columns["start"]) else np.inf
        self.last = float(columns["end"].max()) if len(columns["end"]) else -np.inf
        self._by_lane: tuple[np.ndarray, np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self.columns["start"])

    def in_lanes(self, wanted: np.ndarray) -> np.ndarray:
        """Which rows are in one of the lanes ``wanted`` (sorted ``int64``): a mask, or the rows' indices in order.

        A large chunk sorts its rows by lane once (a chunk does not change) and then finds a view's few lanes
        by searching, at a cost that grows with the rows found rather than the rows held."""
        lane = self.columns["lane_id"]
        if len(lane) < _INDEXED_ROWS:
            return np.isin(lane, wanted)
        if self._by_lane is None:
            order = np.argsort(lane, kind="stable")
            self._by_lane = (lane[order], order)
        lanes, order = self._by_lane
        lo, hi = np.searchsorted(lanes, wanted, side="left"), np.searchsorted(lanes, wanted, side="right")
        found = [order[a:b] for a, b in zip(lo.tolist(), hi.tolist(), strict=True) if b > a]
        return np.sort(np.concatenate(found)) if found else np.zeros(0, np.int64)


# The counter a record of each kind adds to: 0 faults (its value), 1 bytes to a GPU from the host, 2 to the host,
# 3 between GPUs; -1 none.
_COUNTER = np.full(256, -1, dtype=np.int64)
_COUNTER[[EventKind.GPU_PAGE_FAULT, EventKind.CPU_PAGE_FAULT]] = 0
_COUNTER[EventKind.HTOD] = 1
_COUNTER[EventKind.DTOH] = 2
_COUNTER[EventKind.DTOD] = 3
_TRAFFIC_COUNTERS = 4

# A buffer's own records, found by id rather than by address (see _lanes); kinds compared in loops, as ints.
_OWN = np.zeros(256, dtype=bool)
_OWN[[EventKind.ALLOC, EventKind.FREE]] = True
_PREFETCH, _FREE = int(EventKind.PREFETCH), int(EventKind.FREE)

#: Read-ins whose changed buffers are kept for changed_lanes (a reader further behind is given every buffer).
_CHANGES_KEPT = 256

#: A chunk of at least this many rows finds a view's lanes through its rows sorted by lane.
_INDEXED_ROWS = 4096

#: Chunks are joined while the older of two is no longer than the newer, up to this many rows: a loop reads in
#: small batches, and a query pays per chunk, so the window holds a few large chunks (each row copied a few
#: times over its life, as in a binary counter).
_CHUNK_ROWS = 1 << 16


class EventWindow:
    """The newest ``capacity`` events as columns, for timeline queries. Thread-safe.

    Records come from a bus's history (:meth:`read_from`), taken when something reads, or are fed (:meth:`feed`),
    which only queues them. They are sorted into lanes and causes, and their traffic counted, when something reads,
    on the reader's thread, which a live view throttles (:mod:`.throttle`): a loop that publishes pays nothing for
    the window. The timeline's columns are built only when a query asks for them, so a view's updates never carry
    that cost.
    """

    #: The most rows one answer carries; past it the earliest rows are kept and the rest counted.
    MAX_ROWS: Final = 200_000

    def __init__(self, capacity: int = 1 << 19) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise InvalidArgumentError(f"capacity must be a whole number of events >= 1, got {capacity!r}",
                                       value=capacity, expected="an int >= 1")
        self._capacity = capacity
        self._lock = threading.Lock()
        self._chunks: deque[_Chunk] = deque()
        self._held = 0
        self._seen = 0
        # A record's alloc_id names the backend's segment; a lane is a buffer (what the view lists).
        self._buffers = AllocationIndex("buffer", history=0)
        # Per live buffer: per cause, faults and bytes each way; and the destination of its last prefetch. Dropped at
        # its FREE.
        self._lanes_held = _Lanes((len(CAUSE_NAMES), _TRAFFIC_COUNTERS))
        # The buffers each recent read-in changed (ids, each once), newest last: what a reader that keeps up reads.
        self._changes: deque[tuple[int, np.ndarray]] = deque(maxlen=_CHANGES_KEPT)
        self._read_ins = 0
        self._pending = StagedRecords()     # fed, not yet read in
        self._unbuilt: deque[tuple[np.ndarray, np.ndarray, np.ndarray]] = deque()   # read in: records, lanes, causes
        self._unbuilt_rows = 0
        self._reading = threading.Lock()         # one reader reads the pending records in, in order
        self.reader: HistoryReader | None = None   # where it takes a bus's records from, if it follows one
        self._also: Callable[[np.ndarray], None] | None = None   # handed what the reader takes (read_from)
        self._last_window: tuple[tuple, dict[str, np.ndarray]] | None = None   # see _window

    @property
    def held(self) -> int:
        self._read_in(build=True)
        return self._held

    @property
    def dropped(self) -> int:
        """Events that fell out, oldest first, past ``capacity``."""
        self._read_in(build=True)
        return self._seen - self._held

    @property
    def missed(self) -> int:
        """Events never read: they left the bus's history while nothing read the window for longer than the history
        holds (where it follows a bus: :meth:`read_from`)."""
        return self.reader.dropped if self.reader is not None else 0

    def read_from(self, reader: HistoryReader, also: Callable[[np.ndarray], None] | None = None) -> None:
        """Take records from ``reader`` whenever something reads the window, and hand each take to ``also`` too (a
        device series that counts the same records)."""
        if not isinstance(reader, HistoryReader):
            raise InvalidArgumentError(f"reader must be a bus's HistoryReader, got {type(reader).__name__}",
                                       value=reader, expected="EventBus.reader(...)")
        if also is not None and not callable(also):
            raise InvalidArgumentError(f"also must be callable or None, got {type(also).__name__}", value=also,
                                       expected="a callable taking an EVENT_DTYPE array, or None")
        with self._reading:
            self.reader, self._also = reader, also

    def catch_up(self, *, wait: bool = True) -> None:
        """Read in what was published or fed so far (a reader that reads seldom keeps the bus's history from
        leaving it behind). ``wait=False``: not if another thread is reading in now, which takes the same records;
        for a publisher's thread, which holds the bus's lock and must not wait for a reader that waits for it."""
        self._read_in(wait=wait)

    def feed(self, records: np.ndarray) -> None:
        """Keep ``records`` (``EVENT_DTYPE``); drop the oldest past capacity."""
        if not len(records):
            return
        with self._lock:
            self._pending.add(records)
            full = len(self._pending) > self._capacity
        if full:   # nothing reads: bound what waits
            self._read_in()

    def _read_in(self, *, build: bool = False, wait: bool = True) -> None:
        """Read in what was fed, and what the reader takes: each record's lane and cause, and the traffic they add
        (what a view's update reads). The timeline's columns are built from them only when a query needs them
        (``build``): a view's updates read often and its queries seldom, and a build of what a busy loop publishes in
        a few seconds costs many updates' worth, which an update would have carried (and the throttle then held the
        next ones back). Read in and not built, the records past what the window holds go, oldest first, as a build
        would have dropped them (their traffic is counted already)."""
        if not self._reading.acquire(blocking=wait):
            return
        try:
            self._read_in_locked(build)
        finally:
            self._reading.release()

    def _read_in_locked(self, build: bool) -> None:
        taken = self.reader.take() if self.reader is not None else None
        with self._lock:
            pending = self._pending.take()
        if taken is not None and len(taken):   # fed ones, if any, came earlier: read in first
            pending = joined((pending, taken)) if len(pending) else taken
            if self._also is not None:
                self._also(taken)
        if len(pending):   # in one piece: loops publish small batches
            own = _any_of(pending, _OWN)   # a buffer made or freed: few batches
            lanes, causes = self._lanes(pending, own), cause_codes(pending)
            self._count_traffic(pending, lanes, causes, own)
            self._unbuilt.append((pending, lanes, causes))
            self._unbuilt_rows += len(pending)
            self._drop_unbuilt()
        if self._unbuilt and build:
            self._build()

    def _drop_unbuilt(self) -> None:
        """Drop whole parts read in and not built, oldest first, while the newer ones alone fill the window."""
        parts, gone = self._unbuilt, 0
        while len(parts) > 1 and self._unbuilt_rows - len(parts[0][0]) >= self._capacity:
            rows = len(parts.popleft()[0])
            self._unbuilt_rows -= rows
            gone += rows
        if gone:   # every built chunk is older than what is left: the next build drops them too
            with self._lock:
                self._seen += gone

    def _build(self) -> None:
        """The records read in since the last build as one more chunk of columns; the oldest past capacity go."""
        parts, self._unbuilt, self._unbuilt_rows = self._unbuilt, deque(), 0
        # Up to one part a read-in since the last query: the records joined as bytes (.events.staged.joined).
        records = joined(part[0] for part in parts)
        lanes, causes = np.concatenate([part[1] for part in parts]), np.concatenate([part[2] for part in parts])
        seen = len(records)
        records, lanes, causes = records[-self._capacity:], lanes[-self._capacity:], causes[-self._capacity:]
        chunk = _Chunk({
            "start": records["start"].astype(np.float64),
            "end": np.maximum(records["end"], records["start"]).astype(np.float64),
            "lane": lanes,
            "lane_id": lanes.astype(np.int64),
            "kind": records["kind"].copy(),
            "cause": causes,
            "src": records["src"].astype(np.int16),
            "dst": records["dst"].astype(np.int16),
            "bytes": records["bytes"].astype(np.float64),
            "address": records["address"].astype(np.float64),
            "reach": (records["address"] + records["bytes"]).astype(np.float64),
            "source": records["source"].astype(np.uint32),
            "value": records["value"].astype(np.float64),   # a fault record's fault count: for by_source
        })
        with self._lock:
            self._seen += seen
            chunks = self._chunks
            chunks.append(chunk)
            while len(chunks) > 1 and len(chunks[-2]) <= len(chunk) and len(chunks[-2]) + len(chunk) <= _CHUNK_ROWS:
                older = chunks[-2]
                chunk = _Chunk({k: np.concatenate([older.columns[k], v]) for k, v in chunk.columns.items()})
                chunks.pop()
                chunks[-1] = chunk
            self._held += len(records)
            while self._held > self._capacity:
                extra = self._held - self._capacity
                first = chunks[0]
                if len(first) <= extra:
                    chunks.popleft()
                    self._held -= len(first)
                else:
                    chunks[0] = _Chunk({k: v[extra:] for k, v in first.columns.items()})
                    self._held -= extra

    def extent(self) -> tuple[int, int]:
        """The start of the oldest event held and the latest end of any, in ns; ``(0, 0)`` when none is."""
        self._read_in(build=True)
        with self._lock:
            chunks = [c for c in self._chunks if len(c)]
            if not chunks:
                return 0, 0
            return int(min(c.first for c in chunks)), int(max(c.last for c in chunks))

    def traffic(self, lane: int, *, read_in: bool = True) -> Traffic:
        """What buffer ``lane`` has seen since it was made (as far as this window has watched). ``read_in=False``:
        as of the last read-in (:meth:`changed_lanes`'s), for a view that reads many lanes as of one moment."""
        if read_in:
            self._read_in()
        with self._lock:
            table = self._lanes_held.traffic(lane)
            if table is None:
                rows, sums = [[0] * _TRAFFIC_COUNTERS for _ in CAUSE_NAMES], [0] * _TRAFFIC_COUNTERS
            else:
                rows = table.tolist()
                sums = [sum(column) for column in zip(*rows, strict=True)]   # a few causes: numpy's sum costs more
        return Traffic(faults=sums[0], htod_bytes=sums[1], dtoh_bytes=sums[2], dtod_bytes=sums[3], by_cause=rows)

    def requested(self, lane: int, *, read_in: bool = True) -> str | None:
        """Where the last prefetch of buffer ``lane`` sent it: ``"host"``, ``"gpu:N"``, or None if none did
        (``read_in`` as for :meth:`traffic`)."""
        if read_in:
            self._read_in()
        with self._lock:
            dst = self._lanes_held.requested(lane)
        return None if dst is None else "host" if dst < 0 else f"gpu:{dst}"

    def changed_lanes(self, since: int) -> tuple[int, set[int]]:
        """The buffers whose :meth:`traffic` or :meth:`requested` may differ from what they were at cursor
        ``since`` (0: ever), and the cursor to pass next time. A view reads those again, not every buffer."""
        self._read_in()
        with self._lock:
            changes = self._changes
            if changes and changes[0][0] <= since + 1:   # every read-in after `since` is in the log
                recent = []
                for stamp, changed in reversed(changes):
                    if stamp <= since:
                        break
                    recent.append(changed)
                return self._read_ins, set(np.concatenate(recent).tolist()) if recent else set()
            # A reader further behind than the log: any buffer the window counted for, or saw prefetched, may have.
            return self._read_ins, set(self._lanes_held.keys().tolist())

    def _count_traffic(self, records: np.ndarray, lanes: np.ndarray, causes: np.ndarray, own: bool) -> None:
        """Add what ``records`` (in ``lanes``, with ``causes``) moved to their lanes' traffic; ``own``: whether any is
        a buffer's own ALLOC or FREE (a freed buffer's counts go)."""
        touched, sums, prefetched, destinations, changed = _sum_traffic(records, lanes, causes, _COUNTER, _PREFETCH,
                                                                        (len(CAUSE_NAMES), _TRAFFIC_COUNTERS))
        freed = records["alloc_id"][records["kind"] == _FREE].tolist() if own else []
        with self._lock:
            self._read_ins += 1
            # A copy of numpy's own: the compiled pass's array is a view of its whole buffer, kept for 256 read-ins.
            self._changes.append((self._read_ins, changed.copy()))
            self._lanes_held.add(touched, sums, prefetched, destinations)
            for lane in freed:
                self._lanes_held.pop(int(lane))

    def _lanes(self, records: np.ndarray, own_any: bool) -> np.ndarray:
        """The buffer each record concerns (0: none live then): by address, but a buffer's own ALLOC and FREE
        by id (``own_any``: whether the batch holds any). The batch is read in order, a run of allocator records at a
        time, so a record before a FREE is the freed buffer's and one after an ALLOC the new buffer's."""
        if not own_any:   # most batches: no buffer made or freed
            return self._buffers.lookup(records["address"]).astype(np.float64)
        own = _OWN[records["kind"]]
        lanes = np.zeros(len(records), dtype=np.uint64)
        # Where a run of allocator records starts or ends: the batch splits there.
        bounds = [0, *(np.flatnonzero(own[1:] != own[:-1]) + 1).tolist(), len(records)]
        for lo, hi in itertools.pairwise(bounds):
            part = records[lo:hi]
            if own[lo]:
                self._buffers.update(part)
                lanes[lo:hi] = part["alloc_id"]
            else:
                lanes[lo:hi] = self._buffers.lookup(part["address"])
        return lanes.astype(np.float64)

    def by_source(self, start: int, end: int, lanes: list[int] | None,
                  limit: int = 50) -> tuple[np.ndarray, np.ndarray, int]:
        """What each line of user code caused in ``[start, end]`` (in ``lanes``): ``(ids, table, others)``, the
        ``limit`` lines that moved the most bytes (then took the most faults) with their :data:`~..events.sources.
        TOTALS`, and how many more lines the window has."""
        columns = self._window(start, end, lanes, ("source", "kind", "value", "bytes"))
        ids, table = totals(columns["source"], columns["kind"], columns["value"], columns["bytes"])
        moved = table[:, 3:].sum(axis=1)
        faults = table[:, 1:3].sum(axis=1)
        order = np.lexsort((ids, -faults, -moved))
        return ids[order[:limit]], table[order[:limit]], max(0, len(ids) - limit)

    def _window(self, start: int, end: int, lanes: list[int] | None,
                names: tuple[str, ...]) -> dict[str, np.ndarray]:
        """Columns ``names`` of the events held that overlap ``[start, end]`` in ``lanes`` (None: all).

        The last window read is kept until an event arrives: a view's timeline answer reads it twice (its
        rows, then its by-source table), and the second read costs nothing."""
        self._read_in(build=True)
        with self._lock:
            chunks = list(self._chunks)
            key = (self._seen, start, end, None if lanes is None else tuple(lanes))
            cached = self._last_window
        if cached is None or cached[0] != key:
            wanted = None if lanes is None else np.unique(np.asarray(lanes, dtype=np.int64))
            parts = []
            for chunk in chunks:   # each filtered on its own
                if not len(chunk) or chunk.first > end or chunk.last < start:
                    continue
                columns = chunk.columns
                if wanted is not None:   # the lanes first: a view's few lanes are a small share of the rows
                    rows = chunk.in_lanes(wanted)
                    columns = {name: columns[name][rows] for name in _HELD}
                if not (chunk.first >= start and chunk.last <= end):
                    keep = (columns["start"] <= end) & (columns["end"] >= start)
                    columns = {name: columns[name][keep] for name in _HELD}
                parts.append(columns)
            joined = {name: np.concatenate([part[name] for part in parts]) if parts else np.zeros(0, dtype)
                      for name, dtype in _HELD.items()}
            cached = (key, joined)
            with self._lock:
                self._last_window = cached
        return {name: cached[1][name] for name in names}

    def query(self, start: int, end: int, width: int,
              lanes: list[int] | None) -> tuple[dict[str, np.ndarray], int, int]:
        """The rows of ``[start, end]`` for a view ``width`` pixels wide: ``(columns, events, truncated)``.

        An event narrower than a pixel is merged with the other such events of its lane, pixel, kind and
        cause into one row: the earliest start, the latest end, the bytes summed, ``count`` events, and
        ``src``/``dst`` kept where all agree (else ``SEVERAL``). Wider events are rows of their own. Rows
        are sorted by start.
        """
        columns = self._window(start, end, lanes, tuple(_KEPT))
        events = len(columns["start"])
        pixel = (end - start) / width
        narrow = (columns["end"] - columns["start"]) < pixel
        merged = _merge({k: v[narrow] for k, v in columns.items()}, start, pixel, width)
        wide = {k: v[~narrow] for k, v in columns.items()}
        wide["count"] = np.ones(len(wide["start"]), dtype=np.uint32)
        rows = {k: np.concatenate([merged[k], wide[k]]) for k in merged}
        order = np.argsort(rows["start"], kind="stable")
        truncated = max(0, len(order) - self.MAX_ROWS)
        order = order[: self.MAX_ROWS]
        return {name: np.ascontiguousarray(rows[name][order], dtype=dtype) for name, dtype in TIMELINE_COLUMNS}, \
            events, truncated


@njit(types.boolean(EVENTS_TYPE, types.bool_[::1]), cache=True)
def _any_of(records: np.ndarray, kinds: np.ndarray) -> bool:
    # Whether any record is of one of the kinds marked in `kinds` (by kind): one compiled call, not a gather and a
    # reduction (a live view asks it of every batch a loop publishes). A loop: numba compiles no any() of a generator.
    for i in range(len(records)):  # noqa: SIM110
        if kinds[records[i].kind]:
            return True
    return False


@njit((EVENTS_TYPE, types.float64[::1], types.uint8[::1], types.int64[::1], types.int64,
       types.UniTuple(types.int64, 2)), cache=True)
def _sum_traffic(records: np.ndarray, lanes: np.ndarray, causes: np.ndarray, counter: np.ndarray, prefetch: int,
                 shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """What ``records`` (in ``lanes``, with ``causes``) add to each lane's traffic: the lanes they count for, with
    their sums, ``shape`` (causes, counters) each (``counter``: by kind, the counter a record adds to, or -1); the
    lanes prefetched, each once, with the destination of its last prefetch; and both sets of lanes together, each
    once (in the order found): those whose traffic or last prefetch moved.

    Compiled, two passes (find the lanes, then sum): a live view reads in every record a loop publishes. Like the
    view's other compiled passes it holds the interpreter's lock (see :mod:`.throttle`). Lanes are found in a small
    open-addressed table (a sort costs more than the passes)."""
    n = len(records)
    size = 16
    while size < 2 * n:
        size *= 2
    slots = np.full(size, -1, np.int64)   # by the lane's hash: its number among the lanes found, or -1
    found = np.empty(n, np.int64)         # the lanes found, in the order found
    group = np.empty(n, np.int64)         # each counted record's lane number (-1: not counted)
    last = np.full(n, -1, np.int64)       # per lane number: its last prefetch record, or -1
    groups = 0
    for i in range(n):
        group[i] = -1
        if lanes[i] == 0:
            continue
        what = counter[records[i].kind]
        if what < 0 and records[i].kind != prefetch:
            continue
        lane = np.int64(lanes[i])
        h = (lane * 0x9E3779B97F4A7C15) & (size - 1)
        while slots[h] >= 0 and found[slots[h]] != lane:
            h = (h + 1) & (size - 1)
        if slots[h] < 0:
            slots[h] = groups
            found[groups] = lane
            groups += 1
        if what >= 0:
            group[i] = slots[h]
        else:
            last[slots[h]] = i
    sums = np.zeros((groups, shape[0], shape[1]), np.int64)
    counted = np.zeros(groups, np.bool_)
    for i in range(n):
        g = group[i]
        if g >= 0:
            what = counter[records[i].kind]
            sums[g, causes[i], what] += np.int64(records[i].value) if what == 0 else np.int64(records[i].bytes)
            counted[g] = True
    touched = found[:groups][counted]
    prefetched = np.flatnonzero(last[:groups] >= 0)
    destinations = np.empty(len(prefetched), np.int64)
    for j in range(len(prefetched)):
        destinations[j] = records[last[prefetched[j]]].dst
    return touched, sums[counted], found[prefetched], destinations, found[:groups]


#: A lane's last prefetch destination where none was seen (a prefetch to the host is -1).
_NOT_PREFETCHED = np.iinfo(np.int64).min


class _Lanes:
    """Per key (a buffer): counters of one ``shape`` and the destination of its last prefetch, in rows of arrays, and
    the keys' rows in a compiled hash map: a read-in adds to the hundreds of buffers it touched in one compiled
    call, with no Python object per buffer. A popped key's row is zeroed and reused. Not thread-safe."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self._slots = typed.Dict.empty(types.int64, types.int64)
        self._rows = np.zeros((16, *shape), dtype=np.int64)
        self._requested = np.full(16, _NOT_PREFETCHED, dtype=np.int64)
        self._free = np.zeros(16, dtype=np.int64)   # rows given back, a stack of _free_count
        self._free_count = 0
        self._used = 0   # rows handed out in order; below this, each is held or in _free

    def keys(self) -> np.ndarray:
        return _keys_of(self._slots)

    def traffic(self, key: int) -> np.ndarray | None:
        slot = _slot_of(self._slots, key)
        return None if slot < 0 else self._rows[slot]

    def requested(self, key: int) -> int | None:
        """The destination of ``key``'s last prefetch, or None."""
        slot = _slot_of(self._slots, key)
        dst = _NOT_PREFETCHED if slot < 0 else int(self._requested[slot])
        return None if dst == _NOT_PREFETCHED else dst

    def add(self, keys: np.ndarray, values: np.ndarray, prefetched: np.ndarray, destinations: np.ndarray) -> None:
        """Add ``values[i]`` to the row of ``keys[i]`` (distinct), and note ``destinations[j]`` as ``prefetched[j]``'s
        last prefetch; a key without a row gets a zeroed one."""
        if not len(keys) and not len(prefetched):
            return
        needed = self._used + len(keys) + len(prefetched)
        if needed > len(self._rows):   # room for every key being new: the compiled pass never grows an array
            grown = max(needed, 2 * len(self._rows))
            self._rows = np.concatenate([self._rows, np.zeros((grown - len(self._rows), *self._rows.shape[1:]),
                                                              dtype=np.int64)])
            self._requested = np.concatenate([self._requested, np.full(grown - len(self._requested),
                                                                       _NOT_PREFETCHED, dtype=np.int64)])
        self._free_count, self._used = _add_lanes(
            self._slots, self._rows, self._requested, self._free, self._free_count, self._used,
            np.ascontiguousarray(keys, dtype=np.int64), np.ascontiguousarray(values, dtype=np.int64),
            np.ascontiguousarray(prefetched, dtype=np.int64), np.ascontiguousarray(destinations, dtype=np.int64))

    def pop(self, key: int) -> None:
        slot = _slot_of(self._slots, key)
        if slot < 0:
            return
        del self._slots[key]
        self._rows[slot] = 0
        self._requested[slot] = _NOT_PREFETCHED
        if self._free_count == len(self._free):
            self._free = np.concatenate([self._free, np.zeros(len(self._free), dtype=np.int64)])
        self._free[self._free_count] = slot
        self._free_count += 1


@njit(cache=True)
def _slot_of(slots: typed.Dict, key: int) -> int:
    # From Python a typed dict's own get costs several times this call.
    return slots.get(key, -1)


@njit(cache=True)
def _keys_of(slots: typed.Dict) -> np.ndarray:
    keys = np.empty(len(slots), np.int64)
    for i, key in enumerate(slots.keys()):
        keys[i] = key
    return keys


@njit(cache=True)
def _add_lanes(slots: typed.Dict, rows: np.ndarray, requested: np.ndarray, free: np.ndarray, free_count: int,
               used: int, keys: np.ndarray, values: np.ndarray, prefetched: np.ndarray,
               destinations: np.ndarray) -> tuple[int, int]:
    # rows[slot of keys[i]] += values[i], requested[slot of prefetched[j]] = destinations[j], compiled (see
    # .throttle): a read-in adds to a few hundred buffers. Returns the free stack's count and the rows handed out.
    for i in range(len(keys) + len(prefetched)):
        key = keys[i] if i < len(keys) else prefetched[i - len(keys)]
        if key in slots:
            slot = slots[key]
        else:
            if free_count > 0:
                free_count -= 1
                slot = free[free_count]
            else:
                slot = used
                used += 1
            slots[key] = slot
        if i < len(keys):
            rows[slot] += values[i]
        else:
            requested[slot] = destinations[i - len(keys)]
    return free_count, used


def _merge(cols: dict[str, np.ndarray], start: int, pixel: float, width: int) -> dict[str, np.ndarray]:
    """One row per lane, pixel, kind and cause of ``cols`` (events narrower than a pixel)."""
    n = len(cols["start"])
    if not n:
        return {**cols, "count": np.zeros(0, np.uint32)}
    x = np.clip(((cols["start"] - start) // pixel).astype(np.int64), 0, width - 1)
    _, lane = np.unique(cols["lane"], return_inverse=True)
    key = ((lane.astype(np.int64) * width + x) * 256 + cols["kind"]) * 256 + cols["cause"]
    order = np.argsort(key, kind="stable")
    sorted_key = key[order]
    firsts = np.flatnonzero(np.r_[True, sorted_key[1:] != sorted_key[:-1]])
    s = {k: v[order] for k, v in cols.items()}
    out = {
        "start": np.minimum.reduceat(s["start"], firsts),
        "end": np.maximum.reduceat(s["end"], firsts),
        "lane": s["lane"][firsts],
        "kind": s["kind"][firsts],
        "cause": s["cause"][firsts],
        "bytes": np.add.reduceat(s["bytes"], firsts),
        "address": np.minimum.reduceat(s["address"], firsts),
        "reach": np.maximum.reduceat(s["reach"], firsts),
        "count": np.diff(np.r_[firsts, n]).astype(np.uint32),
    }
    for name, several in (("src", SEVERAL), ("dst", SEVERAL), ("source", 0)):
        col = s[name]
        agree = np.minimum.reduceat(col, firsts) == np.maximum.reduceat(col, firsts)
        out[name] = np.where(agree, col[firsts], several).astype(col.dtype)
    return out


#: The per-GPU counters of a :class:`~.protocol.DeviceSample` that records add to: the rows of
#: :func:`device_counts`' table.
GPU_COUNTERS: Final = ("htod_bytes", "dtoh_bytes", "dtod_bytes", "evicted_bytes", "gpu_faults")
_HTOD, _DTOH, _DTOD, _EVICTED, _GPU_FAULT = range(len(GPU_COUNTERS))
_CPU_FAULT = len(GPU_COUNTERS)   # one more row: the host's faults, no GPU's

# The one rule of what a record adds to in a device sample. By its kind and flags (``kind << 8 | flags``): the counter
# (a row above, or -1: none).
_COUNTER_OF = np.full(256 << 8, -1, dtype=np.int64)
_COUNTER_OF[EventKind.HTOD << 8:(EventKind.HTOD + 1) << 8] = _HTOD
_COUNTER_OF[EventKind.DTOH << 8:(EventKind.DTOH + 1) << 8] = _DTOH
_COUNTER_OF[EventKind.DTOD << 8:(EventKind.DTOD + 1) << 8] = _DTOD
_COUNTER_OF[EventKind.GPU_PAGE_FAULT << 8:(EventKind.GPU_PAGE_FAULT + 1) << 8] = _GPU_FAULT
_COUNTER_OF[EventKind.CPU_PAGE_FAULT << 8:(EventKind.CPU_PAGE_FAULT + 1) << 8] = _CPU_FAULT
_COUNTER_OF[[EventKind.DTOH << 8 | MigrationCause.EVICTION | inferred for inferred in (0, INFERRED_BIT)]] = _EVICTED
# By the counter: the GPU it counts for is the record's source for what leaves a GPU (DtoH, evictions), else its
# destination (the GPU a migration reached; a GPU fault's src and dst are both the faulting GPU).
_FOR_SOURCE = np.isin(np.arange(_CPU_FAULT + 1), [_DTOH, _EVICTED])
# A fault record's amount is its value (the faults it stands for); a migration's, its bytes.
_BY_VALUE = np.isin(np.arange(_CPU_FAULT + 1), [_GPU_FAULT, _CPU_FAULT])


def device_counts(records: np.ndarray, gpus: int = 1) -> tuple[np.ndarray, int]:
    """What ``records`` add to a device sample: a ``(len(GPU_COUNTERS), n)`` int64 table, a row per counter of
    :data:`GPU_COUNTERS` and a column per GPU ordinal, and the CPU faults.

    HtoD counts for the GPU it went to, DtoH for the GPU it left (an eviction both as DtoH and as evicted), DtoD for
    the GPU that received it, a GPU fault for the faulting GPU. ``n`` is ``gpus``, or the highest GPU a record counts
    for plus one where that is more, so no record is lost. A record that names no GPU where its kind needs one (made by
    hand: the backends always name it) counts for GPU 0.
    """
    table, cpu_faults = _count_device(np.ascontiguousarray(records).reshape(-1), int(gpus), _COUNTER_OF,
                                      _FOR_SOURCE, _BY_VALUE, _EVICTED_RULE)
    return table, int(cpu_faults)


# The rows that come out of the table (an eviction, a transfer to the host too) and the CPU's: for _count_device.
_EVICTED_RULE = (_DTOH, _EVICTED, _CPU_FAULT, len(GPU_COUNTERS))


@njit((EVENTS_TYPE, types.int64, types.int64[::1], types.bool_[::1], types.bool_[::1],
       types.UniTuple(types.int64, 4)), cache=True)
def _count_device(records: np.ndarray, gpus: int, counter_of: np.ndarray, for_source: np.ndarray,
                  by_value: np.ndarray, rule: tuple[int, int, int, int]) -> tuple[np.ndarray, np.int64]:
    # Compiled, two passes: a live view's every update reads what the loop published since the last. The tables
    # come in as arguments: numba would freeze globals into its cache.
    dtoh, evicted, cpu_fault, rows = rule
    n = gpus
    for i in range(len(records)):   # the GPUs the table needs: those asked for, and any a record counts for
        counter = counter_of[(np.int64(records[i].kind) << 8) | records[i].flags]
        if counter >= 0 and counter != cpu_fault:
            gpu = np.int64(records[i].src if for_source[counter] else records[i].dst)
            n = max(n, max(int(gpu), 0) + 1)   # one naming no GPU (-1, made by hand) counts for GPU 0
    table = np.zeros((rows, n), np.int64)
    cpu_faults = np.int64(0)
    for i in range(len(records)):
        counter = counter_of[(np.int64(records[i].kind) << 8) | records[i].flags]
        if counter < 0:
            continue
        amount = np.int64(records[i].value) if by_value[counter] else np.int64(records[i].bytes)
        if counter == cpu_fault:
            cpu_faults += amount
            continue
        gpu = np.int64(records[i].src if for_source[counter] else records[i].dst)
        table[counter, max(int(gpu), 0)] += amount
    table[dtoh] += table[evicted]   # an eviction is a transfer to the host too
    return table, cpu_faults


def _no_counts() -> np.ndarray:
    return np.zeros((len(GPU_COUNTERS), 0), dtype=np.int64)


class DeviceSeries:
    """One :class:`~.protocol.DeviceSample` per interval: per GPU, bytes each way, faults and evictions summed from
    the bus (:func:`device_counts`), and memory used read when the interval closes. Keeps the newest ``capacity``.
    Thread-safe."""

    def __init__(self, capacity: int = 3000, *, interval: float = 0.1, clock: Clock = SYSTEM_CLOCK) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise InvalidArgumentError(f"capacity must be a whole number of samples >= 1, got {capacity!r}",
                                       value=capacity, expected="an int >= 1")
        self._clock = checked_clock(clock)   # when an interval ends (a test moves its own)
        self.interval = interval
        self._lock = threading.Lock()
        self._samples: deque[DeviceSample] = deque(maxlen=capacity)
        self._taken = 0       # samples ever closed; the index of the next one
        self._closed_at = -float("inf")
        self._open = _no_counts()   # the open interval's GPU_COUNTERS, a column per GPU seen in it
        self._open_cpu_faults = 0
        self._pending = StagedRecords()   # fed since the last close_interval, summed there

    @property
    def dropped(self) -> int:
        return self._taken - len(self._samples)

    def feed(self, records: np.ndarray) -> None:
        """Count ``records`` in the open interval (summed when it closes: the publisher pays a copy)."""
        if not len(records):
            return
        with self._lock:
            self._pending.add(records)
            if len(self._pending) >= 1 << 16:   # no view closes intervals now: sum them, so nothing piles up
                self._add(self._pending.take())

    def add(self, records: np.ndarray) -> None:
        """Count ``records`` in the open interval now: for a reader's thread, where staging them would only copy
        them once more (:meth:`feed` is for a publisher's)."""
        if len(records):
            with self._lock:
                self._add(records)

    def _add(self, records: np.ndarray) -> None:
        table, cpu_faults = device_counts(records, self._open.shape[1])
        self._open = _widened(self._open, table.shape[1]) + table
        self._open_cpu_faults += cpu_faults

    def due(self) -> bool:
        """Whether :meth:`close_interval` would end the open interval now: a view reads the device's memory only
        then."""
        now = self._clock.monotonic()
        with self._lock:
            return self._ends_at(now)

    def _ends_at(self, now: float) -> bool:
        return now - self._closed_at >= self.interval

    def close_interval(self, time_ns: int, used: Sequence[int], total: Sequence[int], allocated: int = 0) -> bool:
        """End the open interval as a sample, unless one ended less than ``interval`` ago (several views
        share the series). Returns whether it did.

        ``used`` and ``total``: each GPU's memory in use and capacity, by ordinal. The sample's lists are as long as
        those, or longer where a record of the interval counted for a GPU past them (its memory then 0: not known).
        """
        used, total = _per_gpu(used, "used"), _per_gpu(total, "total")
        if len(used) != len(total):
            raise InvalidArgumentError(f"used and total must give the same GPUs, got {len(used)} and {len(total)}",
                                       value=(used, total), expected="two lists of one length")
        now = self._clock.monotonic()
        with self._lock:
            if not self._ends_at(now):
                return False   # what was fed waits, staged, and is summed once when the interval closes
            pending = self._pending.take()
            if len(pending):   # what was fed since the last close: this interval's, summed at once
                self._add(pending)
            self._closed_at = now
            gpus = max(len(used), self._open.shape[1])
            counts = _widened(self._open, gpus).tolist()
            memory = [0] * (gpus - len(used))
            sample = DeviceSample(time=int(time_ns), used=used + memory, total=total + memory,
                                  allocated=int(allocated), htod_bytes=counts[_HTOD], dtoh_bytes=counts[_DTOH],
                                  dtod_bytes=counts[_DTOD], gpu_faults=counts[_GPU_FAULT],
                                  cpu_faults=self._open_cpu_faults, evicted_bytes=counts[_EVICTED])
            self._open, self._open_cpu_faults = _no_counts(), 0
            self._samples.append(sample)
            self._taken += 1
            return True

    def since(self, index: int) -> tuple[list[DeviceSample], int]:
        """The samples from number ``index`` on that are still held, and the number of the next."""
        with self._lock:
            count = min(len(self._samples), self._taken - index)
            # Read from the newest end: an update asks for the last few of thousands held.
            return list(itertools.islice(reversed(self._samples), max(0, count)))[::-1], self._taken


def _widened(table: np.ndarray, gpus: int) -> np.ndarray:
    """``table`` with zero columns added up to ``gpus`` columns."""
    if table.shape[1] >= gpus:
        return table
    wide = np.zeros((table.shape[0], gpus), dtype=table.dtype)   # np.pad costs many times more for a small table
    wide[:, :table.shape[1]] = table
    return wide


def _per_gpu(values: object, name: str) -> list[int]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not all(
            isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 0 for v in values):
        raise InvalidArgumentError(f"{name} must be a list of bytes per GPU (whole numbers >= 0), got {values!r:.80}",
                                   value=values, expected="a list of ints >= 0, one per GPU")
    return [int(v) for v in values]


_shared: tuple[EventWindow, DeviceSeries] | None = None
_shared_users = 0
_shared_lock = threading.Lock()


def shared(bus: EventBus | None = None) -> tuple[EventWindow, DeviceSeries]:
    """The kernel's one event window and device series, made and subscribed when the first view takes them
    (seeded with the bus's history, so the timeline starts before that view), and let go once the last has
    given them back (:func:`release_shared`): a kernel that no view watches pays nothing for them. Each call
    is one taker's."""
    global _shared, _shared_users
    with _shared_lock:
        if _shared is None:
            bus = bus or get_bus()
            window, series = EventWindow(), DeviceSeries()

            with bus.locked():   # its history, and then everything published after it: no gap, no overlap
                window.feed(bus.history())
                window.read_from(bus.reader("the live view's timeline"), also=series.add)
            _shared = (window, series)
        _shared_users += 1
        return _shared


def follow(bus: EventBus, window: EventWindow, feed: Callable[[np.ndarray], None], name: str) -> Subscription:
    """Seed ``window`` with ``bus``'s history and subscribe ``feed`` (which feeds the window, and whatever else its
    taker keeps) with no gap between the two, for a taker that needs each record as it is published (a Dask worker's
    reporter says how long its events waited); one that reads only when it reads takes a reader instead (see
    :func:`shared`).

    Inline: feeding only queues (bounded by the window's capacity), cheaper in the loop's thread than a thread woken
    for it; the window then misses nothing.
    """
    with bus.locked():
        window.feed(bus.history())
        return bus.subscribe(feed, name=name, inline=True)


def release_shared() -> None:
    """Give back what one call of :func:`shared` took; the last taker's release unsubscribes them (a view
    opened later starts again from the bus's history, which holds more than a window does)."""
    global _shared, _shared_users
    with _shared_lock:
        if _shared_users <= 0:
            raise InvalidStateError("release_shared() was called more often than shared(): nothing is held")
        _shared_users -= 1
        if _shared_users == 0 and _shared is not None:
            reader, _shared = _shared[0].reader, None
            if reader is not None:
                reader.close()
