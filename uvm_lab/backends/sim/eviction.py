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

The rules are :mod:`.core`'s (``claim``, ``victim``, ``evict``); this holds their state: the queue, as a linked
list over the page table's blocks, and the counters.
"""

from __future__ import annotations

import numpy as np

from ...errors import InvalidArgumentError
from . import core
from .model import PageTable

__all__ = ["EVICTION_POLICIES", "GpuMemory"]

#: Policy names: the driver's, and the what-if ones.
EVICTION_POLICIES = ("fifo", "lru", "tree")

_C = {name: i for i, name in enumerate(core.MEMORY_COUNTERS)}
_UNQUEUED = -2


class GpuMemory:
    """One device's memory: capacity in root chunks, who holds them, and the eviction queue.

    Parameters
    ----------
    table
        The page table whose blocks hold chunks.
    capacity_blocks
        Root chunks the device has.
    policy
        One of :data:`EVICTION_POLICIES`.
    device
        The device ordinal.
    """

    def __init__(self, table: PageTable, capacity_blocks: int, policy: str = "fifo", device: int = 0) -> None:
        if policy not in EVICTION_POLICIES:
            raise InvalidArgumentError(f"eviction must be one of {', '.join(EVICTION_POLICIES)}, got {policy!r}",
                                       value=policy, expected=", ".join(EVICTION_POLICIES))
        self.table = table
        self.policy = policy
        self.device = device
        self.counters = np.zeros(len(core.MEMORY_COUNTERS), dtype=np.int64)
        self.counters[[_C["capacity"], _C["policy"], _C["device"]]] = (capacity_blocks,
                                                                        EVICTION_POLICIES.index(policy), device)
        self.counters[[_C["head"], _C["tail"]]] = -1
        self._queue: tuple[np.ndarray, ...] = (np.zeros(0, dtype=np.int64),) * 3

    @property
    def arrays(self) -> tuple[np.ndarray, ...]:
        """The queue (next and previous block, the stamp it was queued with: one each a block of the table) and the
        counters, as :mod:`.core` takes them; grown with the table."""
        nblocks = self.table.nblocks
        if len(self._queue[0]) < nblocks:
            old = len(self._queue[0])
            grown = tuple(np.concatenate((a, np.full(nblocks - old, _UNQUEUED if i < 2 else 0, dtype=np.int64)))
                          for i, a in enumerate(self._queue))
            self._queue = grown
        return (*self._queue, self.counters)

    capacity = property(lambda self: int(self.counters[_C["capacity"]]))
    used = property(lambda self: int(self.counters[_C["used"]]), doc="Managed root chunks held.")
    evicted_blocks = property(lambda self: int(self.counters[_C["evicted"]]))

    @property
    def pinned(self) -> int:
        """Root chunks of cudaMalloc memory: never evicted."""
        return int(self.counters[_C["pinned"]])

    @pinned.setter
    def pinned(self, blocks: int) -> None:
        self.counters[_C["pinned"]] = blocks

    @property
    def free_blocks(self) -> int:
        return self.capacity - self.used - self.pinned

    def release(self, first: int, nblocks: int) -> None:
        """A segment's blocks were freed: their chunks go back."""
        core.release_blocks(self.table.arrays(), self.arrays, first, nblocks)
