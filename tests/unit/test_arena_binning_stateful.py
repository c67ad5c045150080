"""Random sequences of arena and binning operations, checked against simple models after every step.

After any sequence of allocate (including failing ones), free and double free: live allocations
never overlap, nothing leaks (every byte taken from the upstream is accounted for), a failure
changes nothing, and a StatisticsResourceAdaptor over the resource counts exactly.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any, ClassVar

import hypothesis.strategies as st
from hypothesis import HealthCheck, event, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import uvm_lab as ul
from uvm_lab.errors import DoubleFreeError, OutOfMemoryError
from uvm_lab.mr.arena import SIZE_CLASSES, SMALL_MAX, SUPERBLOCK_SIZE, ArenaMemoryResource
from uvm_lab.mr.base import MemoryResource
from uvm_lab.mr.binning import BinningMemoryResource
from uvm_lab.mr.fixed_size import FixedSizeMemoryResource
from uvm_lab.mr.statistics import StatisticsResourceAdaptor

from .upstreams import CappedUpstream

KiB = 1 << 10
MiB = 1 << 20

SETTINGS = settings(max_examples=50, stateful_step_count=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def aligned(n: int) -> int:
    return -(-n // 256) * 256


def arena_footprint(size: int) -> int:
    """What an arena allocation of ``size`` occupies: its size class, or its 256-byte rounding."""
    return next(c for c in SIZE_CLASSES if c >= size) if size <= SMALL_MAX else aligned(size)


class Model:
    """Statistics as they must be, counted independently of the adaptor."""

    def __init__(self) -> None:
        self.live: dict[int, int] = {}
        self.freed: set[int] = set()
        self.peak_bytes = self.peak_count = self.total_bytes = self.total_count = 0

    def allocated(self, ptr: int, size: int) -> None:
        assert ptr not in self.live
        self.live[ptr] = size
        self.freed.discard(ptr)
        self.total_bytes += size
        self.total_count += 1
        self.peak_bytes = max(self.peak_bytes, sum(self.live.values()))
        self.peak_count = max(self.peak_count, len(self.live))

    def counts(self) -> dict[str, int]:
        return {"current_bytes": sum(self.live.values()), "current_count": len(self.live),
                "peak_bytes": self.peak_bytes, "peak_count": self.peak_count,
                "total_bytes": self.total_bytes, "total_count": self.total_count}


class ArenaMachine(RuleBasedStateMachine):
    """An arena of a few superblocks: small and large requests, many of which cannot fit."""

    #: What ``use_backend`` gets; tests/gpu runs the same machine with ``{"name": "cuda"}``.
    backend: ClassVar[dict[str, Any]] = {"name": "sim", "device_memory": "4GiB"}

    @initialize(arena_size=st.sampled_from([MiB, 2 * MiB, 4 * MiB, 4 * MiB + 768]))
    def start(self, arena_size: int) -> None:
        ul.use_backend(**self.backend)
        self.managed = ul.mr.ManagedMemoryResource()
        self.arena = ArenaMemoryResource(self.managed, arena_size)
        self.stats = StatisticsResourceAdaptor(self.arena)
        self.region = self.arena.upstream_blocks()[0]
        self.model = Model()

    def teardown(self) -> None:
        arena = getattr(self, "arena", None)
        if arena is None:
            return
        for ptr, size in list(self.model.live.items()):
            self.stats.deallocate(ptr, size)
        assert arena.superblocks() == {}
        assert arena.free_ranges() == [self.region]          # everything coalesced back into one range
        arena.release()
        assert self.managed.get_allocated_bytes() == 0

    def state(self) -> tuple:
        return self.arena.free_ranges(), self.arena.superblocks(), self.arena.get_allocated_bytes()

    @rule(size=st.one_of(st.integers(1, 2 * KiB), st.integers(1, SMALL_MAX), st.integers(SMALL_MAX, 3 * MiB),
                         st.sampled_from(SIZE_CLASSES)))
    def allocate(self, size: int) -> None:
        before = self.state()
        try:
            ptr = self.stats.allocate(size)
        except OutOfMemoryError:
            event("out of memory")
            assert self.state() == before, "a failed allocation changed the arena"
            free = self.arena.free_ranges()
            if size <= SMALL_MAX:
                cls = arena_footprint(size)
                assert all(c != cls or n == 0 for c, n in self.arena.superblocks().values())
                assert all(n < SUPERBLOCK_SIZE for _, n in free)
            else:
                assert all(n < aligned(size) for _, n in free)
            return
        assert ptr % 256 == 0
        self.model.allocated(ptr, size)

    @precondition(lambda self: self.model.live)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        ptr = data.draw(st.sampled_from(sorted(self.model.live)))
        self.stats.deallocate(ptr, self.model.live.pop(ptr))
        self.model.freed.add(ptr)

    @precondition(lambda self: self.model.freed)
    @rule(data=st.data())
    def double_free(self, data: st.DataObject) -> None:
        ptr = data.draw(st.sampled_from(sorted(self.model.freed)))
        before = self.state()
        try:
            self.stats.deallocate(ptr, 256)
        except DoubleFreeError:
            pass
        else:
            raise AssertionError("a double free was accepted")
        assert self.state() == before

    @invariant()
    def no_overlap_and_inside_the_arena(self) -> None:
        if not hasattr(self, "arena"):
            return
        start, size = self.region
        spans = sorted((p, p + arena_footprint(s)) for p, s in self.model.live.items())
        for (_, end), (nxt, _) in pairwise(spans):
            assert end <= nxt, "two live allocations overlap"
        assert all(start <= a and b <= start + size for a, b in spans)
        for ptr, n in self.arena.free_ranges():               # nor does any live one overlap a free range
            assert all(b <= ptr or a >= ptr + n for a, b in spans)

    @invariant()
    def no_leak(self) -> None:
        if not hasattr(self, "arena"):
            return
        small = sum(1 for s in self.model.live.values() if s <= SMALL_MAX)
        slots_free = sum(n for _, n in self.arena.superblocks().values())
        slots_total = sum(SUPERBLOCK_SIZE // c for c, _ in self.arena.superblocks().values())
        assert slots_total - slots_free == small
        large = sum(aligned(s) for s in self.model.live.values() if s > SMALL_MAX)
        free = sum(n for _, n in self.arena.free_ranges())
        assert free + large + SUPERBLOCK_SIZE * len(self.arena.superblocks()) == self.region[1]

    @invariant()
    def statistics_are_exact(self) -> None:
        if hasattr(self, "stats"):
            assert self.stats.allocation_counts == self.model.counts()
            assert self.arena.get_allocated_bytes() == sum(self.model.live.values())


class BinningMachine(RuleBasedStateMachine):
    """Fixed-size bins (and sometimes an arena bin) over a capped upstream; large requests go upstream."""

    #: What ``use_backend`` gets; tests/gpu runs the same machine with ``{"name": "cuda"}``.
    backend: ClassVar[dict[str, Any]] = {"name": "sim", "device_memory": "4GiB"}

    @initialize(exponents=st.sampled_from([(-1, -1), (10, 10), (8, 12)]), arena_bin=st.booleans(),
                limit=st.sampled_from([MiB, 3 * MiB, 8 * MiB]), blocks=st.sampled_from([1, 4, 16]))
    def start(self, exponents: tuple[int, int], arena_bin: bool, limit: int, blocks: int) -> None:
        ul.use_backend(**self.backend)
        self.managed = ul.mr.ManagedMemoryResource()
        self.upstream = CappedUpstream(self.managed, limit)
        self.binning = BinningMemoryResource(self.upstream)
        if exponents[0] >= 0:                        # small chunks, so that bins also run out
            for e in range(exponents[0], exponents[1] + 1):
                self.binning.add_bin(1 << e, FixedSizeMemoryResource(self.upstream, 1 << e, blocks))
        self.arena_upstream = CappedUpstream(self.managed, MiB)
        if arena_bin:
            self.binning.add_bin(64 * KiB, ArenaMemoryResource(self.arena_upstream, MiB))
        self.stats = StatisticsResourceAdaptor(self.binning)
        self.model = Model()
        self.served_by: dict[int, MemoryResource] = {}

    def teardown(self) -> None:
        binning = getattr(self, "binning", None)
        if binning is None:
            return
        for ptr, size in list(self.model.live.items()):
            self.stats.deallocate(ptr, size)
        for b in binning.bin_mrs:
            b.release()  # type: ignore[attr-defined]
        assert self.upstream.held == 0 and self.arena_upstream.held == 0

    def held(self) -> tuple[int, int]:
        return self.upstream.held, self.arena_upstream.held

    @rule(size=st.one_of(st.integers(1, 5 * KiB), st.integers(1, 80 * KiB), st.integers(1, 2 * MiB)))
    def allocate(self, size: int) -> None:
        target = self.binning.get_resource(size)
        before = (self.held(), self.binning.get_allocated_bytes())
        try:
            ptr = self.stats.allocate(size)
        except OutOfMemoryError:
            event("out of memory")
            assert (self.held(), self.binning.get_allocated_bytes()) == before
            return
        bins = dict(zip(self.binning.bin_sizes, self.binning.bin_mrs, strict=True))
        fits = [s for s in bins if s >= size]
        assert target is (bins[min(fits)] if fits else self.upstream), "routed to the wrong resource"
        target.allocation_id(ptr)                    # the target holds it (raises otherwise)
        self.served_by[ptr] = target
        self.model.allocated(ptr, size)

    @precondition(lambda self: self.model.live)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        ptr = data.draw(st.sampled_from(sorted(self.model.live)))
        self.stats.deallocate(ptr, self.model.live.pop(ptr))
        del self.served_by[ptr]
        self.model.freed.add(ptr)

    @precondition(lambda self: self.model.freed)
    @rule(data=st.data())
    def double_free(self, data: st.DataObject) -> None:
        ptr = data.draw(st.sampled_from(sorted(self.model.freed)))
        before = (self.held(), self.binning.get_allocated_bytes())
        try:
            self.stats.deallocate(ptr, 1)
        except DoubleFreeError:
            pass
        else:
            raise AssertionError("a double free was accepted")
        assert (self.held(), self.binning.get_allocated_bytes()) == before

    @invariant()
    def no_overlap(self) -> None:
        if not hasattr(self, "binning"):
            return
        spans = sorted((p, p + s) for p, s in self.model.live.items())
        for (_, end), (nxt, _) in pairwise(spans):
            assert end <= nxt, "two live allocations overlap"

    @invariant()
    def no_leak(self) -> None:
        if not hasattr(self, "binning"):
            return
        in_bins = sum(b.pool_size() for b in self.binning.bin_mrs
                      if isinstance(b, FixedSizeMemoryResource) and b.upstream_mr is self.upstream)
        direct = sum(s for p, s in self.model.live.items() if self.served_by[p] is self.upstream)
        assert self.upstream.held == in_bins + direct
        arenas = [b for b in self.binning.bin_mrs if isinstance(b, ArenaMemoryResource)]
        assert self.arena_upstream.held == sum(a.pool_size() for a in arenas)

    @invariant()
    def statistics_are_exact(self) -> None:
        if hasattr(self, "stats"):
            assert self.stats.allocation_counts == self.model.counts()
            assert self.binning.get_allocated_bytes() == sum(self.model.live.values())


TestArena = ArenaMachine.TestCase
TestArena.settings = SETTINGS
TestBinning = BinningMachine.TestCase
TestBinning.settings = SETTINGS
