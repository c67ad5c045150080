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
    """Every simulated device's memory: capacity in root chunks, who holds them, and each device's eviction queue.

    Parameters
    ----------
    table
        The page table whose blocks hold chunks (one row of chunks a device).
    capacity_blocks
        Root chunks each device has.
    policy
        One of :data:`EVICTION_POLICIES`.
    """

    def __init__(self, table: PageTable, capacity_blocks: int, policy: str = "fifo") -> None:
        if policy not in EVICTION_POLICIES:
            raise InvalidArgumentError(f"eviction must be one of {', '.join(EVICTION_POLICIES)}, got {policy!r}",
                                       value=policy, expected=", ".join(EVICTION_POLICIES))
        self.table = table
        self.policy = policy
        devices = table.devices
        self.counters = np.zeros((devices, len(core.MEMORY_COUNTERS)), dtype=np.int64)
        self.counters[:, _C["capacity"]] = capacity_blocks
        self.counters[:, _C["policy"]] = EVICTION_POLICIES.index(policy)
        self.counters[:, [_C["head"], _C["tail"]]] = -1
        self._queue: tuple[np.ndarray, ...] = (np.zeros((devices, 0), dtype=np.int64),) * 3

    @property
    def arrays(self) -> tuple[np.ndarray, ...]:
        """Each device's queue (next and previous block, the stamp it was queued with: a row a device, an entry a
        block of the table) and counters, as :mod:`.core` takes them; grown with the table."""
        nblocks = self.table.nblocks
        if self._queue[0].shape[1] < nblocks:
            devices, old = self._queue[0].shape
            self._queue = tuple(
                np.concatenate((a, np.full((devices, nblocks - old), _UNQUEUED if i < 2 else 0, dtype=np.int64)),
                               axis=1) for i, a in enumerate(self._queue))
        return (*self._queue, self.counters)

    def capacity(self, device: int = 0) -> int:
        """Root chunks device ``device`` has."""
        return int(self.counters[device, _C["capacity"]])

    def used(self, device: int = 0) -> int:
        """Managed root chunks device ``device`` holds."""
        return int(self.counters[device, _C["used"]])

    def pinned(self, device: int = 0) -> int:
        """Root chunks of device ``device`` held by cudaMalloc memory: never evicted."""
        return int(self.counters[device, _C["pinned"]])

    def pin(self, device: int, blocks: int) -> None:
        """``blocks`` more (or, negative, fewer) root chunks of ``device`` held by cudaMalloc memory."""
        self.counters[device, _C["pinned"]] += blocks

    def evicted_blocks(self, device: int | None = None) -> int:
        """Chunks evicted from ``device`` (None: from every device)."""
        column = self.counters[:, _C["evicted"]]
        return int(column.sum() if device is None else column[device])

    def free_blocks(self, device: int = 0) -> int:
        return self.capacity(device) - self.used(device) - self.pinned(device)

    def release(self, first: int, nblocks: int) -> None:
        """A segment's blocks were freed: their chunks go back, on every device."""
        core.release_blocks(self.table.arrays(), self.arrays, first, nblocks)
