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
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...location import HOST_ID
from .model import BLOCK_SHIFT, NO_LOCATION, PAGES_PER_BLOCK

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


@dataclass
class _Block:
    count: np.ndarray = field(default_factory=lambda: np.zeros(PAGES_PER_BLOCK, dtype=np.uint8))
    last_t: np.ndarray = field(default_factory=lambda: np.full(PAGES_PER_BLOCK, -(1 << 62), dtype=np.int64))
    last_proc: np.ndarray = field(default_factory=lambda: np.full(PAGES_PER_BLOCK, NO_LOCATION, dtype=np.int8))
    thrashing: np.ndarray = field(default_factory=lambda: np.zeros(PAGES_PER_BLOCK, dtype=bool))
    throttles: np.ndarray = field(default_factory=lambda: np.zeros(PAGES_PER_BLOCK, dtype=np.uint8))
    pin_loc: np.ndarray = field(default_factory=lambda: np.full(PAGES_PER_BLOCK, NO_LOCATION, dtype=np.int8))
    pin_until: np.ndarray = field(default_factory=lambda: np.zeros(PAGES_PER_BLOCK, dtype=np.int64))
    dnt: int = NO_LOCATION       # the period's do-not-throttle processor
    period_end: int = 0
    last_thrash: int = 0
    resets: int = 0


class BlockNotes:
    """Each block's last migration in, as ``(processor, time)``: a mapping from block numbers kept in two arrays
    (one entry a block, grown with the page table), so that compiled code reads and writes them in place."""

    def __init__(self) -> None:
        self.processor = np.full(0, NO_LOCATION, dtype=np.int8)   # NO_LOCATION: no note
        self.time = np.zeros(0, dtype=np.int64)
        self._count = 0

    def reserve(self, nblocks: int) -> None:
        """Room for blocks ``0 .. nblocks - 1``."""
        if nblocks > len(self.processor):
            size = max(nblocks, 2 * len(self.processor))
            self.processor = np.concatenate((self.processor, np.full(size - len(self.processor), NO_LOCATION,
                                                                     dtype=np.int8)))
            self.time = np.concatenate((self.time, np.zeros(size - len(self.time), dtype=np.int64)))

    def noted(self, added: int) -> None:
        """``added`` notes were written into the arrays directly."""
        self._count += added

    def get(self, b: int, default: tuple[int, int] | None = None) -> tuple[int, int] | None:
        if 0 <= b < len(self.processor) and self.processor[b] != NO_LOCATION:
            return int(self.processor[b]), int(self.time[b])
        return default

    def __setitem__(self, b: int, note: tuple[int, int]) -> None:
        self.reserve(b + 1)
        if self.processor[b] == NO_LOCATION:
            self._count += 1
        self.processor[b], self.time[b] = note

    def update(self, notes) -> None:
        for b, note in notes:
            self[b] = note

    def pop(self, b: int, default: tuple[int, int] | None = None) -> tuple[int, int] | None:
        note = self.get(b)
        if note is None:
            return default
        self.processor[b] = NO_LOCATION
        self._count -= 1
        return note

    def forget(self, first: int, n: int) -> None:
        """Drop the notes of blocks ``first .. first + n - 1``."""
        span = self.processor[first:first + n]
        self._count -= int(np.count_nonzero(span != NO_LOCATION))
        span[:] = NO_LOCATION

    def items(self) -> list[tuple[int, tuple[int, int]]]:
        blocks = np.flatnonzero(self.processor != NO_LOCATION)
        return [(b, (p, t)) for b, p, t in zip(blocks.tolist(), self.processor[blocks].tolist(),
                                                self.time[blocks].tolist(), strict=True)]

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0


class ThrashingDetector:
    """Per-block thrashing state for one simulated address space.

    Parameters
    ----------
    enabled
        ``uvm_perf_thrashing_enable``; off, nothing is detected, throttled or pinned.
    constants
        The module parameters.
    """

    def __init__(self, enabled: bool = True, constants: ThrashingConstants | None = None) -> None:
        self.enabled = enabled
        self.c = constants or ThrashingConstants()
        self.blocks: dict[int, _Block] = {}
        self._touch = BlockNotes()     # block -> (processor, time) of its last migration in
        self._resets: dict[int, int] = {}

    def forget(self, first_block: int, nblocks: int) -> None:
        """A segment was freed: drop the state of its blocks."""
        self._touch.forget(first_block, nblocks)
        last = first_block + nblocks
        for held in (self.blocks, self._resets):   # walk the smaller side: a freed segment may span 100,000s
            if len(held) < nblocks:
                for b in [b for b in held if first_block <= b < last]:
                    del held[b]
            else:
                for b in range(first_block, last):
                    held.pop(b, None)

    def reset(self, lo: int, hi: int) -> None:
        """User migrations (cudaMemPrefetchAsync) reset the state of pages ``lo`` to ``hi - 1`` (a range, not an
        array of its pages: a prefetch of gigabytes would otherwise fill one for nothing, mostly)."""
        if not self.blocks or hi <= lo:
            return
        first, last = lo >> BLOCK_SHIFT, (hi - 1) >> BLOCK_SHIFT
        for b in sorted(b for b in self.blocks if first <= b <= last):
            s = self.blocks[b]
            base = b * PAGES_PER_BLOCK
            i = slice(max(lo, base) - base, min(hi, base + PAGES_PER_BLOCK) - base)
            s.count[i] = 0
            s.thrashing[i] = False
            s.throttles[i] = 0
            s.pin_loc[i] = NO_LOCATION

    def on_migration(self, pages: np.ndarray, dest: int, now: int) -> np.ndarray:
        """Note fault- or prefetch-caused migrations of sorted ``pages`` to ``dest``; returns those now thrashing."""
        if not self.enabled or not len(pages):
            return pages[:0]
        c = self.c
        blocks = pages >> BLOCK_SHIFT
        cuts = np.flatnonzero(blocks[1:] != blocks[:-1]) + 1
        bounds = [0, *cuts.tolist(), len(pages)]
        found = []
        heads = blocks[np.concatenate(([0], cuts))]    # the distinct blocks, in order
        state, touch = self.blocks, self._touch
        touch.reserve(int(heads[-1]) + 1)
        # A block with no state notes the migration; one that another processor migrated into within the lapse
        # starts state.
        stateless = np.fromiter((b not in state for b in heads.tolist()), dtype=bool, count=len(heads)) if state \
            else np.ones(len(heads), dtype=bool)
        last_p, last_t = touch.processor[heads], touch.time[heads]
        starts = stateless & (last_p != NO_LOCATION) & (last_p != dest) & (now - last_t <= c.lapse)
        touch.noted(int(np.count_nonzero(stateless & (last_p == NO_LOCATION))))
        touch.processor[heads[stateless]] = dest
        touch.time[heads[stateless]] = now
        for j in np.flatnonzero(~stateless | starts).tolist():
            b = int(heads[j])
            s = state.get(b)
            if s is None:
                s = self.blocks[b] = _Block(last_thrash=now)
            elif now - s.last_thrash > c.epoch and self._resets.get(b, 0) < c.max_resets:
                self._resets[b] = self._resets.get(b, 0) + 1
                s = self.blocks[b] = _Block(last_thrash=now)
            i = pages[bounds[j]:bounds[j + 1]] & (PAGES_PER_BLOCK - 1)
            recent = (now - s.last_t[i] <= c.lapse) & (s.last_proc[i] != dest)
            s.count[i] = np.where(recent, np.minimum(s.count[i].astype(np.int32) + 1, 255), 1)
            s.last_t[i] = now
            s.last_proc[i] = dest
            new = (s.count[i] >= c.threshold) & ~s.thrashing[i]
            if new.any():
                s.thrashing[i[new]] = True
                s.last_thrash = now
                found.append(i[new] + b * PAGES_PER_BLOCK)
        return np.concatenate(found) if found else pages[:0]

    def thrashing_rows(self, blocks: np.ndarray) -> np.ndarray:
        """Which pages of each of ``blocks`` are flagged as thrashing, as ``(len(blocks), 512)``."""
        out = np.zeros((len(blocks), PAGES_PER_BLOCK), dtype=bool)
        for j, b in enumerate(blocks.tolist()):
            s = self.blocks.get(b)
            if s is not None:
                out[j] = s.thrashing
        return out

    def hints(self, pages: np.ndarray, processor: int, now: int, preferred: np.ndarray,
              reach_all: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For faults by ``processor`` on ``pages``: ``(throttle, pin_location)``.

        ``pin_location`` is NO_LOCATION where no pin is in force. Throttling counts towards pinning;
        ``preferred`` and ``reach_all`` (every processor can map the preferred location) decide where a
        new pin goes.
        """
        throttle = np.zeros(len(pages), dtype=bool)
        pin = np.full(len(pages), NO_LOCATION, dtype=np.int8)
        if not self.blocks:
            return throttle, pin
        c = self.c
        blocks = pages >> BLOCK_SHIFT
        for b in np.unique(blocks).tolist():
            s = self.blocks.get(b)
            if s is None:
                continue
            j = np.flatnonzero(blocks == b)
            i = pages[j] & (PAGES_PER_BLOCK - 1)
            pinned = (s.pin_loc[i] != NO_LOCATION) & (s.pin_until[i] > now)
            pin[j[pinned]] = s.pin_loc[i[pinned]]
            hot = s.thrashing[i] & ~pinned
            if not hot.any():
                continue
            if now >= s.period_end:   # a new period: the other processor may go unthrottled
                s.dnt = processor if s.dnt != processor else NO_LOCATION
                s.period_end = now + c.nap
            if processor == s.dnt:
                continue
            k, jj = i[hot], j[hot]
            # After pin_threshold throttles, the next fault pins the page instead.
            to_pin = s.throttles[k] >= c.pin_threshold
            throttle[jj[~to_pin]] = True
            s.throttles[k[~to_pin]] += 1
            if to_pin.any():
                kk, jp = k[to_pin], jj[to_pin]
                loc = np.where(reach_all[jp] & (preferred[jp] != NO_LOCATION), preferred[jp], HOST_ID)
                s.pin_loc[kk] = loc
                s.pin_until[kk] = now + c.pin
                s.throttles[kk] = 0
                pin[jp] = loc
        return throttle, pin
