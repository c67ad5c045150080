"""Thrashing detection, throttling and pinning (research R7, ``uvm_perf_thrashing.c``), with its constants.

The detector targets ping-pong between processors, not capacity thrash: per-page state exists only for
a block that two different processors migrated data into within ``lapse`` (500 us). Then every
migration of a page caused by a fault or by the prefetcher (not by eviction) counts; a page that
migrates ``threshold`` (3) times, each within ``lapse`` of the last, is thrashing. Faults on a thrashing
page from any processor but the period's "do-not-throttle" one (alternating) are throttled: not serviced
for ``nap`` (500 us). After ``pin_threshold`` (10) throttles the page is pinned for ``pin`` (150 ms): to
its preferred location if every processor can reach it, else to the host, which every processor can
map; the others map it remotely. An explicit prefetch resets the pages it moves; a block with no
thrashing for ``epoch`` (1 s) forgets its state, at most ``max_resets`` (4) times.

The rules are :mod:`.core`'s (``note_migrations``, ``hints``, ``reset_pages``); this holds their state: a note of
each block's last migration in, and per-page state in slots, one a block that has any.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from . import core
from .model import NO_LOCATION, PAGES_PER_BLOCK, PageTable

__all__ = ["ThrashingConstants", "ThrashingDetector"]


@dataclass(frozen=True)
class ThrashingConstants:
    """The driver's module parameters (``uvm_perf_thrashing_*``), times in nanoseconds."""

    lapse: int = 500_000
    threshold: int = 3
    pin_threshold: int = 10
    nap: int = 500_000          # 1 x lapse
    pin: int = 150_000_000      # 300 x lapse
    epoch: int = 1_000_000_000  # 2000 x lapse
    max_resets: int = 4


# The arrays of a slot, per page and per slot, and their types (core.clear_slot says what a fresh slot holds).
_PAGE_STATE = (("count", np.uint8), ("last_t", np.int64), ("last_proc", np.int8), ("thrashing", np.bool_),
               ("throttles", np.uint8), ("pin_loc", np.int8), ("pin_until", np.int64))
_SLOT_STATE = (("dnt", np.int8), ("period_end", np.int64), ("last_thrash", np.int64))


class ThrashingDetector:
    """Thrashing state for one simulated address space.

    Parameters
    ----------
    table
        The page table whose blocks it watches.
    enabled
        ``uvm_perf_thrashing_enable``; off, nothing is detected, throttled or pinned.
    constants
        The module parameters.
    """

    def __init__(self, table: PageTable, enabled: bool = True, constants: ThrashingConstants | None = None) -> None:
        self.table = table
        self.enabled = enabled
        self.c = constants or ThrashingConstants()
        c = self.c
        self.counters = np.array([enabled, 0, c.lapse, c.threshold, c.pin_threshold, c.nap, c.pin, c.epoch,
                                  c.max_resets], dtype=np.int64)
        self._blocks: tuple[np.ndarray, ...] = (np.zeros(0, np.int64), np.zeros(0, np.int8), np.zeros(0, np.int64),
                                                np.zeros(0, np.int32))   # slot, note processor, note time, resets
        self._slots = self._fresh_slots(4)

    @staticmethod
    def _fresh_slots(n: int) -> tuple[np.ndarray, ...]:
        return (*(np.zeros((n, PAGES_PER_BLOCK), dtype) for _, dtype in _PAGE_STATE),
                *(np.zeros(n, dtype) for _, dtype in _SLOT_STATE))

    @property
    def arrays(self) -> tuple[np.ndarray, ...]:
        """The state as :mod:`.core` takes it: the counters, the per-block arrays (grown with the table) and the
        slots."""
        nblocks = self.table.nblocks
        if len(self._blocks[0]) < nblocks:
            extra = nblocks - len(self._blocks[0])
            fill = (-1, NO_LOCATION, 0, 0)
            self._blocks = tuple(np.concatenate((a, np.full(extra, f, a.dtype)))
                                 for a, f in zip(self._blocks, fill, strict=True))
        return (self.counters, *self._blocks, *self._slots)

    def make_room(self, slots: int) -> None:
        """Room for ``slots`` more blocks with state: the slots of blocks that lost theirs (freed) are taken back
        first, then the slot arrays grow."""
        slot_of = self.arrays[1]
        held = np.flatnonzero(slot_of >= 0)
        old = slot_of[held]
        size = len(self._slots[0])
        if len(held) + slots > size:
            size = max(2 * size, len(held) + slots)
        fresh = self._fresh_slots(size)
        for new, current in zip(fresh, self._slots, strict=True):
            new[:len(held)] = current[old]
        slot_of[held] = np.arange(len(held))
        self._slots = fresh
        self.counters[1] = len(held)

    def forget(self, first_block: int, nblocks: int) -> None:
        """A segment was freed: drop the state of its blocks."""
        core.forget_blocks(self.arrays, first_block, nblocks)

    @property
    def blocks(self) -> dict[int, SimpleNamespace]:
        """Each block with state, and its state: per page ``count``, ``last_t``, ``last_proc``, ``thrashing``,
        ``throttles``, ``pin_loc`` and ``pin_until`` (views that change as the detector works), and ``dnt``,
        ``period_end`` and ``last_thrash``."""
        slot_of = self.arrays[1]
        out = {}
        for b in np.flatnonzero(slot_of >= 0).tolist():
            s = int(slot_of[b])
            state = {name: self._slots[i][s] for i, (name, _) in enumerate(_PAGE_STATE)}
            state.update({name: self._slots[len(_PAGE_STATE) + i][s].item() for i, (name, _) in enumerate(_SLOT_STATE)})
            out[b] = SimpleNamespace(**state)
        return out

    def set_thrashing(self, block: int, pages: np.ndarray) -> None:
        """Give ``block`` state with ``pages`` (512 flags) thrashing: what the tests of the rules start from."""
        if self.counters[1] >= len(self._slots[0]):
            self.make_room(1)
        arrays = self.arrays
        slot = core.slot_for(arrays, block, 0)
        self._slots[3][slot] = pages

    def clear(self) -> None:
        """Forget every block's state."""
        self.arrays[1][:] = -1
        self.counters[1] = 0
