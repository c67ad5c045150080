"""Which allocation a fault or migration belongs to: address (and time) to allocation id.

CUPTI's records carry an address and a timestamp, nothing more. An :class:`AllocationIndex` learns the
address ranges of allocations from the event stream itself (``SEGMENT_ALLOC``/``SEGMENT_FREE`` for the
backend's mappings, or ``ALLOC``/``FREE`` for the buffers that memory resources hand out) and answers,
for a batch of records at once, which allocation held each address *when the record happened*. Time
matters because addresses are reused: a migration delivered late, after its allocation was freed and
the address handed out again, must not be charged to the newcomer.

Two levels, two meanings of "allocation":

``"segment"``
    The backend's mapping (``cudaMallocManaged`` ...). This is what ``alloc_id`` means in migration and
    fault records on both backends, and what the residency tracker keys its pages on.
``"buffer"``
    What a memory resource handed out (``DeviceBuffer.id``); inside a pool, one of many per segment.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Literal

import numpy as np
from numba import njit, types

from ..errors import InvalidArgumentError
from ..events.bus import EventBus, Subscription
from ..events.causes import decode_flags
from ..events.schema import EVENT_DTYPE, EventKind, MigrationCause

__all__ = ["AllocationIndex", "attribute", "cause_names"]

Level = Literal["segment", "buffer"]
_LEVELS: dict[str, tuple[EventKind, EventKind]] = {
    "segment": (EventKind.SEGMENT_ALLOC, EventKind.SEGMENT_FREE),
    "buffer": (EventKind.ALLOC, EventKind.FREE),
}
#: Record kinds that ``attribute`` fills in (allocator events already carry their ids).
UNIFIED_MEMORY_KINDS = tuple(int(k) for k in (EventKind.HTOD, EventKind.DTOH, EventKind.CPU_PAGE_FAULT,
                                              EventKind.GPU_PAGE_FAULT, EventKind.THRASHING, EventKind.THROTTLING,
                                              EventKind.REMOTE_MAP, EventKind.DTOD))
_NEVER = np.iinfo(np.int64).max


class AllocationIndex:
    """Address ranges of allocations over time, learned from allocator events.

    Parameters
    ----------
    level
        ``"segment"`` (the backend's mappings; the default) or ``"buffer"`` (what memory resources
        hand out).
    history
        How many freed allocations to remember for records that arrive after the free.

    Examples
    --------
    >>> index = AllocationIndex()
    >>> index.update(trace.events)            # or: index.follow(bus)
    >>> ids = index.lookup(events["address"], events["start"])
    """

    def __init__(self, level: Level = "segment", *, history: int = 65536) -> None:
        if level not in _LEVELS:
            raise InvalidArgumentError(f"level must be one of {sorted(_LEVELS)}, got {level!r}", value=level,
                                       expected=" or ".join(repr(k) for k in _LEVELS))
        if isinstance(history, bool) or not isinstance(history, int) or history < 0:
            raise InvalidArgumentError(f"history must be a non-negative int, got {history!r}", value=history,
                                       expected="an int >= 0")
        self.level = level
        self._alloc, self._free = (int(k) for k in _LEVELS[level])
        self._live: dict[int, tuple[int, int, int]] = {}            # address -> (size, id, alloc time)
        self._freed: deque[tuple[int, int, int, int, int]] = deque(maxlen=history)   # (addr, end, id, t0, t1)
        self._lock = threading.Lock()
        self._arrays: tuple[np.ndarray, ...] | None = None          # live ranges sorted, rebuilt on change
        self._subscription: Subscription | None = None

    def __len__(self) -> int:
        """Live allocations known."""
        return len(self._live)

    def update(self, events: np.ndarray) -> None:
        """Learn from ``events`` (any ``EVENT_DTYPE`` array; other kinds are ignored), in order."""
        if not isinstance(events, np.ndarray) or events.dtype != EVENT_DTYPE:
            raise InvalidArgumentError("events must be an EVENT_DTYPE array", value=events,
                                       expected="a numpy array of uvm_lab.events.EVENT_DTYPE")
        kinds = events["kind"]
        mine = events[(kinds == self._alloc) | (kinds == self._free)]
        if not len(mine):
            return
        with self._lock:
            for kind, address, size, alloc_id, t in zip(mine["kind"].tolist(), mine["address"].tolist(),
                                                        mine["bytes"].tolist(), mine["alloc_id"].tolist(),
                                                        mine["start"].tolist(), strict=True):
                if kind == self._alloc:
                    self._live[address] = (size, alloc_id, t)
                else:
                    held = self._live.pop(address, None)
                    if held is not None:
                        self._freed.append((address, address + held[0], held[1], held[2], t))
            self._arrays = None

    def follow(self, bus: EventBus) -> Subscription:
        """Keep learning from everything published on ``bus`` from now on."""
        if self._subscription is not None:
            raise InvalidArgumentError("this index already follows a bus", value=bus, expected="a fresh index")
        self._subscription = bus.subscribe(self.update, kinds=(self._alloc, self._free), inline=True)
        return self._subscription

    def close(self) -> None:
        """Stop following the bus."""
        if self._subscription is not None:
            self._subscription.close()
            self._subscription = None

    def _live_arrays(self) -> tuple[np.ndarray, ...]:
        arrays = self._arrays
        if arrays is None:
            items = sorted(self._live.items())
            starts = np.fromiter((a for a, _ in items), dtype=np.uint64, count=len(items))
            ends = np.fromiter((a + s for a, (s, _, _) in items), dtype=np.uint64, count=len(items))
            ids = np.fromiter((i for _, (_, i, _) in items), dtype=np.uint64, count=len(items))
            born = np.fromiter((t for _, (_, _, t) in items), dtype=np.int64, count=len(items))
            arrays = self._arrays = (starts, ends, ids, born)
        return arrays

    def lookup(self, addresses: np.ndarray, times: np.ndarray | None = None) -> np.ndarray:
        """The allocation id holding each address (at each time, if given); 0 where none did.

        Parameters
        ----------
        addresses
            Addresses (any integer array).
        times
            When each address was touched, on the backend's clock. Without times, only live
            allocations are considered.
        """
        addresses = np.asarray(addresses, dtype=np.uint64).reshape(-1)
        if times is not None:
            times = np.asarray(times, dtype=np.int64).reshape(-1)
            if times.shape != addresses.shape:
                raise InvalidArgumentError(f"times has {len(times)} entries for {len(addresses)} addresses",
                                           value=len(times), expected=str(len(addresses)))
        with self._lock:
            starts, ends, ids, born = self._live_arrays()
            freed = list(self._freed) if times is not None else []
        out = np.zeros(len(addresses), dtype=np.uint64)
        if len(starts):
            _find(starts, ends, ids, born, addresses, times if times is not None else born[:0], out)
        if freed:
            missing = np.flatnonzero(out == 0)
            if len(missing):
                a, t = addresses[missing], times[missing]   # type: ignore[index]
                for lo, hi, alloc_id, t0, t1 in reversed(freed):   # newest first
                    hit = (a >= lo) & (a < hi) & (t >= t0) & (t < t1) & (out[missing] == 0)
                    if hit.any():
                        out[missing[hit]] = alloc_id
        return out


@njit((types.uint64[::1], types.uint64[::1], types.uint64[::1], types.int64[::1], types.uint64[:], types.int64[:],
       types.uint64[::1]), cache=True)
def _find(starts: np.ndarray, ends: np.ndarray, ids: np.ndarray, born: np.ndarray, addresses: np.ndarray,
          times: np.ndarray, out: np.ndarray) -> None:
    # Per address, the live range that starts at or before it (a binary search), if the address is inside it (and,
    # with times, the allocation was made by then). Compiled, one call for the batch: a live view looks up every
    # record a loop publishes.
    for k in range(len(addresses)):
        address = addresses[k]
        lo, hi = 0, len(starts)
        while lo < hi:
            mid = (lo + hi) >> 1
            if starts[mid] <= address:
                lo = mid + 1
            else:
                hi = mid
        j = lo - 1
        if j >= 0 and address < ends[j] and (len(times) == 0 or times[k] >= born[j]):
            out[k] = ids[j]


def attribute(events: np.ndarray, index: AllocationIndex, *, overwrite: bool = False) -> np.ndarray:
    """A copy of ``events`` with ``alloc_id`` filled in for fault, migration and other CUPTI records.

    Allocator events keep their own ids. Records no allocation held keep 0 (memory uvm_lab did not
    allocate). With ``overwrite``, ids already set are recomputed too.
    """
    if not isinstance(events, np.ndarray) or events.dtype != EVENT_DTYPE:
        raise InvalidArgumentError("events must be an EVENT_DTYPE array", value=events,
                                   expected="a numpy array of uvm_lab.events.EVENT_DTYPE")
    if not isinstance(index, AllocationIndex):
        raise InvalidArgumentError(f"index must be an AllocationIndex, got {type(index).__name__}", value=index,
                                   expected="uvm_lab.tracing.AllocationIndex")
    out = events.copy()
    todo = np.isin(out["kind"], UNIFIED_MEMORY_KINDS)
    if not overwrite:
        todo &= out["alloc_id"] == 0
    if todo.any():
        sel = out[todo]
        out["alloc_id"][todo] = index.lookup(sel["address"], sel["start"].astype(np.int64))
    return out


# Where a cause's words are not its name's: what the request or the driver did.
_MIGRATION_WORDS = {MigrationCause.USER: "user prefetch", MigrationCause.PREFETCH: "driver prefetch",
                    MigrationCause.USER_INFERRED: "user prefetch (inferred)"}
_SAID = frozenset(int(k) for k in (EventKind.HTOD, EventKind.DTOH, EventKind.DTOD, EventKind.GPU_PAGE_FAULT,
                                   EventKind.CPU_PAGE_FAULT, EventKind.REMOTE_MAP))


def cause_names(events: np.ndarray) -> list[str]:
    """Why each record happened, in words: the migration cause, the fault's access type, the remote map's
    cause ("" where the record has none; "unknown" where its flags say nothing known). One decoding of the
    flags (:func:`~uvm_lab.events.causes.decode_flags`), spelled for reading."""
    if not isinstance(events, np.ndarray) or events.dtype != EVENT_DTYPE:
        raise InvalidArgumentError("events must be an EVENT_DTYPE array", value=events,
                                   expected="a numpy array of uvm_lab.events.EVENT_DTYPE")
    words: dict[tuple[int, int], str] = {}   # few distinct (kind, flags): decode each once
    out = []
    for key in zip(events["kind"].tolist(), events["flags"].tolist(), strict=True):
        word = words.get(key)
        if word is None:
            word = words[key] = _words(*key)
        out.append(word)
    return out


def _words(kind: int, flags: int) -> str:
    if kind not in _SAID:
        return ""
    cause, detail = decode_flags(kind, flags)
    said = cause if cause is not None else detail
    if said is None:
        return "unknown"
    if isinstance(said, MigrationCause) and said in _MIGRATION_WORDS:
        return _MIGRATION_WORDS[said]
    return said.name.lower().replace("_", " ")
