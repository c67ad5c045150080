"""The page-level state the simulator keeps: one page table for every managed byte, and the event log.

A page's residency is a bitmask of the processors holding a valid copy: bit 0 the host, bit d+1
device d. Two bits set means a read-duplicated page (ReadMostly). Advice is kept per page, as the
driver keeps it per VA range: ReadMostly, PreferredLocation, AccessedBy, and the remote mappings
that policy creates. GPU memory is accounted per 2 MiB VA block, the driver's unit of allocation and
eviction (research R1).

Every segment's pages live in one :class:`PageTable`, each segment starting on a block of the table,
so that an access stream over several buffers is one array of page numbers and every rule is a
vectorized operation on it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba.typed import List

from ...events.schema import EVENT_DTYPE, EVENTS_TYPE, MemoryKind
from ...location import HOST_ID
from ...units import BLOCK_SIZE, PAGE_SIZE

__all__ = ["NO_LOCATION", "PAGES_PER_BLOCK", "EventLog", "PageTable", "Segment", "bit"]

PAGES_PER_BLOCK = BLOCK_SIZE // PAGE_SIZE
BLOCK_SHIFT = PAGES_PER_BLOCK.bit_length() - 1
#: "no advice" in the per-page location arrays.
NO_LOCATION = -2


def bit(processor: int) -> int:
    """The residency bit of a processor: 1 for the host, 2 for device 0, 4 for device 1 ..."""
    return 1 if processor == HOST_ID else 1 << (processor + 1)


class PageTable:
    """Per-page and per-block arrays for every segment of one simulated device, grown on demand.

    Pages are numbered globally; segment ``s`` owns pages ``[s.base, s.base + s.npages)`` and starts on a
    block. Freed ranges are reused first fit. Arrays may be reallocated as the table grows, so callers
    index them afresh instead of keeping views.
    """

    # Per page, then per block (see _alloc_arrays).
    state: np.ndarray
    read_mostly: np.ndarray
    preferred: np.ndarray
    accessed_by: np.ndarray
    remote: np.ndarray
    writable: np.ndarray
    last_prefetch: np.ndarray
    chunk: np.ndarray
    last_use: np.ndarray
    counters: np.ndarray
    block_address: np.ndarray
    block_alloc: np.ndarray
    block_pages: np.ndarray

    def __init__(self, devices: int = 1) -> None:
        self.devices = devices
        self.nblocks = 0
        self._top = 0
        self._free: list[tuple[int, int]] = []      # (first block, blocks), sorted
        self._alloc_arrays(0)

    def _alloc_arrays(self, nblocks: int) -> None:
        n = nblocks * PAGES_PER_BLOCK
        # Every array is made before any is kept: a failure (MemoryError, for a table larger than this process can
        # hold) leaves the table as it was.
        fresh = {
            "state": np.zeros(n, dtype=np.uint8),
            "read_mostly": np.zeros(n, dtype=bool),
            "preferred": np.full(n, NO_LOCATION, dtype=np.int8),
            "accessed_by": np.zeros(n, dtype=np.uint8),     # residency-style bitmask of processors
            "remote": np.zeros(n, dtype=np.uint8),          # processors mapped remotely by policy
            # Processors whose mapping of a ReadMostly page allows writes: SetReadMostly and read duplication
            # map read-only, a write fault maps the writer read-write (R3 (a)). Consulted on ReadMostly pages only.
            "writable": np.zeros(n, dtype=np.uint8),
            "last_prefetch": np.full(n, NO_LOCATION, dtype=np.int8),
            # Per device and block: a 2 MiB chunk held (managed memory only); when it was last used (LRU-by-access
            # eviction); its access counters (remote accesses by that device).
            "chunk": np.zeros((self.devices, nblocks), dtype=bool),
            "last_use": np.zeros((self.devices, nblocks), dtype=np.int64),
            "counters": np.zeros((self.devices, nblocks), dtype=np.int32),
            "block_address": np.zeros(nblocks, dtype=np.uint64),
            "block_alloc": np.zeros(nblocks, dtype=np.uint64),
            "block_pages": np.zeros(nblocks, dtype=np.int16),   # pages that exist in the block (0: free)
        }
        if self.nblocks:
            for name, value in fresh.items():
                old = getattr(self, name)
                value[..., :old.shape[-1]] = old
        self.__dict__.update(fresh)
        self.nblocks = nblocks

    def reserve(self, npages: int, address: int, alloc_id: int) -> int:
        """Room for ``npages`` pages of a new segment at ``address``; returns its first global page."""
        need = -(-npages // PAGES_PER_BLOCK)
        first = None
        for i, (start, length) in enumerate(self._free):
            if length >= need:
                first = start
                self._free[i:i + 1] = [(start + need, length - need)] if length > need else []
                break
        if first is None:
            if self._top + need > self.nblocks:   # may fail (MemoryError) with nothing changed
                self._alloc_arrays(max(self._top + need, 2 * self.nblocks, 64))
            first = self._top
            self._top += need
        # No reset here: a range is clean already, fresh or reset by release(). Writing it again would touch
        # every page of every array, which for a new table is most of an allocation's cost.
        blocks = np.arange(need)
        self.block_address[first:first + need] = address + blocks.astype(np.uint64) * BLOCK_SIZE
        self.block_alloc[first:first + need] = alloc_id
        self.block_pages[first:first + need] = np.minimum(npages - blocks * PAGES_PER_BLOCK, PAGES_PER_BLOCK)
        return first * PAGES_PER_BLOCK

    def release(self, base: int, npages: int) -> None:
        first, need = base // PAGES_PER_BLOCK, -(-npages // PAGES_PER_BLOCK)
        self._reset(first, need)
        self._free.append((first, need))
        self._free.sort()
        merged: list[tuple[int, int]] = []
        for start, length in self._free:
            if merged and merged[-1][0] + merged[-1][1] == start:
                merged[-1] = (merged[-1][0], merged[-1][1] + length)
            else:
                merged.append((start, length))
        if merged and merged[-1][0] + merged[-1][1] == self._top:   # give the top back
            self._top = merged.pop()[0]
        self._free = merged

    def _reset(self, first: int, nblocks: int) -> None:
        sl = slice(first * PAGES_PER_BLOCK, (first + nblocks) * PAGES_PER_BLOCK)
        self.state[sl] = 0
        self.read_mostly[sl] = False
        self.preferred[sl] = NO_LOCATION
        self.accessed_by[sl] = 0
        self.remote[sl] = 0
        self.writable[sl] = 0
        self.last_prefetch[sl] = NO_LOCATION
        bl = slice(first, first + nblocks)
        self.chunk[:, bl] = False
        self.last_use[:, bl] = 0
        self.counters[:, bl] = 0
        self.block_pages[bl] = 0

    def arrays(self) -> tuple[np.ndarray, ...]:
        """The arrays in the order :mod:`.core` takes them (fetched afresh: growing the table replaces them)."""
        return (self.state, self.read_mostly, self.preferred, self.accessed_by, self.remote, self.writable, self.chunk,
                self.last_use, self.counters, self.block_address, self.block_alloc, self.block_pages)

    def addresses(self, pages: np.ndarray) -> np.ndarray:
        """The address of each global page."""
        return self.block_address[pages >> BLOCK_SHIFT] + ((pages & (PAGES_PER_BLOCK - 1)) * PAGE_SIZE).astype(
            np.uint64)


@dataclass(eq=False)
class Segment:
    """One mapping made by ``allocate``: where its pages sit in the page table, and its bytes."""

    id: int
    address: int
    size: int
    kind: MemoryKind
    device: int
    table: PageTable
    base: int = 0
    _data: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.base = self.table.reserve(self.npages, self.address, self.id)
        initial = {MemoryKind.MANAGED: 0, MemoryKind.DEVICE: bit(self.device), MemoryKind.PINNED_HOST: 1}[self.kind]
        if initial:   # a reserved range is all 0 already
            self.table.state[self.base:self.base + self.npages] = initial

    @property
    def data(self) -> np.ndarray:
        """The bytes themselves, made on first use (most simulations never look at data)."""
        if self._data is None:
            self._data = np.zeros(self.size, dtype=np.uint8)
        return self._data

    def _view(self, name: str) -> np.ndarray:
        return getattr(self.table, name)[self.base:self.base + self.npages]

    # Views into the page table (made afresh on each use: the table may have grown since).
    state = property(lambda self: self._view("state"), doc="Residency bitmask per page.")
    read_mostly = property(lambda self: self._view("read_mostly"), doc="ReadMostly advice per page.")
    preferred = property(lambda self: self._view("preferred"), doc="PreferredLocation per page.")
    accessed_by = property(lambda self: self._view("accessed_by"), doc="AccessedBy bitmask per page.")
    remote = property(lambda self: self._view("remote"), doc="Processors mapped remotely by policy, per page.")
    last_prefetch = property(lambda self: self._view("last_prefetch"), doc="Last prefetch destination per page.")

    @property
    def gpu_blocks(self) -> np.ndarray:
        """Per device and 2 MiB block of the segment: whether the device holds a chunk for it."""
        first = self.base // PAGES_PER_BLOCK
        return self.table.chunk[:, first:first + self.nblocks]

    @property
    def npages(self) -> int:
        return -(-self.size // PAGE_SIZE)

    @property
    def nblocks(self) -> int:
        return -(-self.size // BLOCK_SIZE)

    @property
    def end(self) -> int:
        return self.address + self.size

    def page_range(self, ptr: int, size: int) -> tuple[int, int]:
        """Pages ``[first, last)`` covering bytes ``[ptr, ptr + size)``, widened to whole pages as CUDA does."""
        first = (ptr - self.address) // PAGE_SIZE
        last = -(-(ptr + size - self.address) // PAGE_SIZE)
        return first, min(last, self.npages)

    def page_address(self, page: int) -> int:
        return self.address + page * PAGE_SIZE


def _joined(chunks: list[np.ndarray]) -> np.ndarray:
    """Record arrays as one, joined as bytes: numpy copies a packed structured dtype field by field, several
    times slower."""
    return chunks[0] if len(chunks) == 1 else np.concatenate([c.view(np.uint8) for c in chunks]).view(EVENT_DTYPE)


#: The largest record buffer a thread keeps for its next operation; a larger one, grown by a long run, is let go.
SPARE_RECORDS = 1 << 16
_spare = threading.local()   # each thread's record buffer (EventLog.open), made once rather than per operation


class EventLog:
    """Records produced by one backend operation, stamped on the simulated clock, published when it ends."""

    def __init__(self, start_ns: int) -> None:
        self.t = float(start_ns)
        self.rows: list[tuple[int, ...]] = []
        self.chunks: list[np.ndarray] = []

    def add(self, kind: int, *, flags: int = 0, src: int = 0, dst: int = 0, address: int = 0, nbytes: int = 0,
            value: int | None = None, alloc_id: int = 0, stream: int = 0, seconds: float = 0.0) -> None:
        """Append a record lasting ``seconds`` from the current simulated time, and advance the clock."""
        start = self.t
        self.t += seconds * 1e9
        self.rows.append((kind, flags, src, dst, int(start), int(self.t), address, nbytes,
                          nbytes if value is None else value, alloc_id, stream, 0))

    def open(self) -> tuple[Any, np.ndarray, np.ndarray]:
        """Where :mod:`.core` writes records and moves the clock: a growing record array (in a one-item typed
        list), the count written into it, and the clock. :meth:`close` takes them back."""
        self._flush_rows()
        records = getattr(_spare, "records", None)
        if records is None:
            # Made from its type, known once: ``List([array])`` types a structured array in Python on every
            # call, which took most of a simulated operation's time.
            records = List.empty_list(EVENTS_TYPE)
            records.append(np.empty(1024, dtype=EVENT_DTYPE))
        else:
            _spare.records = None   # lent to this operation alone: one opened meanwhile makes its own
        return records, np.zeros(1, dtype=np.int64), np.array([self.t])

    def close(self, records: Any, count: np.ndarray, clock: np.ndarray) -> None:
        """Take what :mod:`.core` wrote into what :meth:`open` gave."""
        written = records[0]
        kept = len(written) <= SPARE_RECORDS   # then the next operation writes over it: what it holds is copied out
        if count[0]:
            taken = written[:int(count[0])]
            self.chunks.append(taken.copy() if kept else taken)
        self.t = float(clock[0])
        if kept:
            _spare.records = records

    def advance(self, seconds: float) -> None:
        self.t += seconds * 1e9

    def _flush_rows(self) -> None:
        if self.rows:
            self.chunks.append(np.array(self.rows, dtype=EVENT_DTYPE))
            self.rows = []

    def __len__(self) -> int:
        return len(self.rows) + sum(len(c) for c in self.chunks)

    def pieces(self, limit: int = 1 << 16) -> Iterator[np.ndarray]:
        """The records in order, as arrays of at most about ``limit`` records (a larger chunk comes whole): what a
        long run made is published without one copy of all of it (joining is bytes, not fields)."""
        self._flush_rows()
        group: list[np.ndarray] = []
        held = 0
        for chunk in self.chunks:
            if group and held + len(chunk) > limit:
                yield _joined(group)
                group, held = [], 0
            group.append(chunk)
            held += len(chunk)
        if group:
            yield _joined(group)
