"""The page-level state the simulator keeps for each segment of memory.

A page's residency is a bitmask of the processors holding a valid copy: bit 0 the host, bit d+1
device d. Two bits set means a read-duplicated page (ReadMostly). Advice is kept per page, as the
driver keeps it per VA range: ReadMostly, PreferredLocation, AccessedBy, and the remote mappings
that PreferredLocation creates. GPU memory is accounted per 2 MiB VA block, the driver's unit of
allocation and eviction.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from ...events.schema import EVENT_DTYPE, MemoryKind
from ...location import HOST_ID
from ...units import BLOCK_SIZE, PAGE_SIZE

__all__ = ["NO_LOCATION", "PAGES_PER_BLOCK", "EventLog", "Segment", "bit", "runs"]

PAGES_PER_BLOCK = BLOCK_SIZE // PAGE_SIZE
#: "no advice" in the per-page location arrays.
NO_LOCATION = -2


def bit(processor: int) -> int:
    """The residency bit of a processor: 1 for the host, 2 for device 0, 4 for device 1 ..."""
    return 1 if processor == HOST_ID else 1 << (processor + 1)


def runs(mask: np.ndarray) -> Iterator[tuple[int, int]]:
    """``(start, length)`` of each run of True in a boolean array."""
    if not mask.any():
        return
    padded = np.concatenate(([False], mask, [False]))
    edges = np.flatnonzero(padded[1:] != padded[:-1])
    for start, stop in zip(edges[::2], edges[1::2], strict=True):
        yield int(start), int(stop - start)


@dataclass(eq=False)
class Segment:
    """One mapping made by ``allocate``: its pages, their residency and their advice."""

    id: int
    address: int
    size: int
    kind: MemoryKind
    device: int
    state: np.ndarray = field(init=False)
    read_mostly: np.ndarray = field(init=False)
    preferred: np.ndarray = field(init=False)
    accessed_by: np.ndarray = field(init=False)
    remote: np.ndarray = field(init=False)
    last_prefetch: np.ndarray = field(init=False)
    gpu_blocks: np.ndarray = field(init=False)
    _data: np.ndarray | None = field(init=False, default=None)

    @property
    def data(self) -> np.ndarray:
        """The bytes themselves, made on first use (most simulations never look at data)."""
        if self._data is None:
            self._data = np.zeros(self.size, dtype=np.uint8)
        return self._data

    def __post_init__(self) -> None:
        n = self.npages
        initial = {MemoryKind.MANAGED: 0, MemoryKind.DEVICE: bit(self.device), MemoryKind.PINNED_HOST: 1}[self.kind]
        self.state = np.full(n, initial, dtype=np.uint8)
        self.read_mostly = np.zeros(n, dtype=bool)
        self.preferred = np.full(n, NO_LOCATION, dtype=np.int16)
        self.accessed_by = np.zeros(n, dtype=np.uint8)       # residency-style bitmask of processors
        self.remote = np.zeros(n, dtype=np.uint8)            # processors mapped remotely by policy
        self.last_prefetch = np.full(n, NO_LOCATION, dtype=np.int16)
        self.gpu_blocks = np.zeros(self.nblocks, dtype=bool)  # 2 MiB GPU chunk held (managed only)

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

    def blocks(self, first: int, last: int) -> Iterator[tuple[int, int, int]]:
        """``(block, lo, hi)``: the pages ``[lo, hi)`` of each 2 MiB block that ``[first, last)`` touches."""
        for b in range(first // PAGES_PER_BLOCK, -(-last // PAGES_PER_BLOCK)):
            yield b, max(first, b * PAGES_PER_BLOCK), min(last, (b + 1) * PAGES_PER_BLOCK)

    def page_address(self, page: int) -> int:
        return self.address + page * PAGE_SIZE


class EventLog:
    """Records produced by one backend operation, stamped on the simulated clock, published at once."""

    def __init__(self, start_ns: int) -> None:
        self.t = float(start_ns)
        self.rows: list[tuple[int, ...]] = []

    def add(self, kind: int, *, flags: int = 0, src: int = 0, dst: int = 0, address: int = 0, nbytes: int = 0,
            value: int | None = None, alloc_id: int = 0, stream: int = 0, seconds: float = 0.0) -> None:
        """Append a record lasting ``seconds`` from the current simulated time, and advance the clock."""
        start = self.t
        self.t += seconds * 1e9
        self.rows.append((kind, flags, src, dst, int(start), int(self.t), address, nbytes,
                          nbytes if value is None else value, alloc_id, stream))

    def advance(self, seconds: float) -> None:
        self.t += seconds * 1e9

    def to_array(self) -> np.ndarray:
        return np.array(self.rows, dtype=EVENT_DTYPE)
