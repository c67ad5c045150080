"""Random sequences of pool and statistics operations, checked against simple models after every step."""

from __future__ import annotations

from itertools import pairwise
from typing import Any, ClassVar

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import uvm_lab as ul
from uvm_lab.errors import DoubleFreeError, OutOfMemoryError
from uvm_lab.mr import pool as pool_module
from uvm_lab.mr.base import MemoryResource
from uvm_lab.mr.bestfit import COMPILED, PyBestFit
from uvm_lab.mr.pool import ALIGNMENT, PoolMemoryResource
from uvm_lab.mr.statistics import StatisticsResourceAdaptor

from .upstreams import CappedUpstream, ContiguousUpstream

KiB = 1 << 10
MiB = 1 << 20

# Enough steps to fragment, grow and run out; few enough examples to finish in seconds.
SETTINGS = settings(max_examples=60, stateful_step_count=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

sizes = st.one_of(
    st.integers(1, 2 * ALIGNMENT),          # around the alignment
    st.integers(1, 64 * KiB),
    st.sampled_from([256 * KiB, MiB, 3 * MiB]),
    st.integers(1, 6 * MiB),                # often past the cap or the upstream's limit
)


def aligned(n: int) -> int:
    return -(-n // ALIGNMENT) * ALIGNMENT


class PoolMachine(RuleBasedStateMachine):
    """A pool over a capped upstream: allocate (some requests fail), free, double free, release."""

    #: What ``use_backend`` gets; tests/gpu runs the same machine with ``{"name": "cuda"}``.
    backend: ClassVar[dict[str, Any]] = {"name": "sim", "device_memory": "4GiB"}
    #: The free list the pool is built with; ``PyBestFit`` runs every call in Python, never the hot path.
    free_list: ClassVar[type] = pool_module.BestFit

    @initialize(initial=st.sampled_from([0, 4 * KiB, 64 * KiB, MiB]),
                maximum=st.sampled_from([None, MiB, 4 * MiB, 8 * MiB]),
                upstream_limit=st.sampled_from([2 * MiB, 6 * MiB, 16 * MiB]),
                contiguous=st.booleans())
    def start(self, initial: int, maximum: int | None, upstream_limit: int, contiguous: bool) -> None:
        ul.use_backend(**self.backend)
        if maximum is not None:
            initial = min(initial, maximum)
        managed: MemoryResource = ul.mr.ManagedMemoryResource()
        self.region = ContiguousUpstream(managed, 32 * MiB) if contiguous else None
        # With a region, blocks lie side by side: coalescing must still stop at their edges.
        self.upstream = CappedUpstream(self.region or managed, upstream_limit)
        self.maximum = maximum
        built_with, pool_module.BestFit = pool_module.BestFit, self.free_list
        try:
            self.pool = PoolMemoryResource(self.upstream, initial_pool_size=initial, maximum_pool_size=maximum)
        finally:
            pool_module.BestFit = built_with
        self.live: dict[int, int] = {}      # ptr -> requested size
        self.freed: set[int] = set()        # pointers given back and not handed out again

    def teardown(self) -> None:
        pool = getattr(self, "pool", None)
        if pool is None:
            return
        for ptr, size in self.live.items():
            pool.deallocate(ptr, size)
        pool.release()
        assert self.upstream.held == 0
        if self.region is not None:
            self.region.close()

    def state(self) -> tuple:
        return self.pool.pool_size(), self.pool.upstream_blocks(), self.pool.free_ranges()

    @rule(size=sizes)
    def allocate(self, size: int) -> None:
        need = aligned(size)
        fits = [(n, address) for address, n in self.pool.free_ranges() if n >= need]
        before = self.state()
        try:
            ptr = self.pool.allocate(size)
        except OutOfMemoryError:
            assert not fits, "the pool failed although a free range was large enough"
            assert self.state() == before
            event("pool: out of memory")
            return
        event("pool: best fit" if fits else "pool: grew")
        if fits:
            assert ptr == min(fits)[1], "not the best fit"
            assert self.pool.pool_size() == before[0]
        assert ptr not in self.live
        self.live[ptr] = size
        self.freed.discard(ptr)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        ptr = data.draw(st.sampled_from(sorted(self.live)))
        self.pool.deallocate(ptr, self.live.pop(ptr))
        self.freed.add(ptr)

    @precondition(lambda self: self.freed)
    @rule(data=st.data())
    def double_free(self, data: st.DataObject) -> None:
        ptr = data.draw(st.sampled_from(sorted(self.freed)))
        before = self.state()
        try:
            self.pool.deallocate(ptr, 1)
        except DoubleFreeError:
            pass
        else:
            raise AssertionError(f"freeing {ptr:#x} twice did not raise")
        assert self.state() == before

    @precondition(lambda self: not self.live)
    @rule()
    def release(self) -> None:
        self.pool.release()
        assert self.pool.pool_size() == 0 and self.upstream.held == 0
        self.freed.clear()

    @invariant()
    def live_allocations_are_aligned_and_disjoint(self) -> None:
        spans = sorted((ptr, ptr + aligned(size)) for ptr, size in self.live.items())
        for (_, end), (start, _) in pairwise(spans):
            assert end <= start, "two live allocations overlap"
        assert all(ptr % ALIGNMENT == 0 for ptr, _ in spans)

    @invariant()
    def every_range_lies_within_one_block(self) -> None:
        blocks = self.pool.upstream_blocks()
        ranges = [(ptr, aligned(size)) for ptr, size in self.live.items()] + self.pool.free_ranges()
        for ptr, n in ranges:
            assert any(base <= ptr and ptr + n <= base + size for base, size in blocks), f"{ptr:#x} is outside"

    @invariant()
    def nothing_leaks(self) -> None:
        blocks = self.pool.upstream_blocks()
        free = self.pool.free_ranges()
        allocated = sum(aligned(size) for size in self.live.values())
        assert allocated + sum(n for _, n in free) == self.pool.pool_size() == sum(n for _, n in blocks)
        assert self.pool.pool_size() == self.upstream.held
        assert self.pool.get_allocated_bytes() == sum(self.live.values())
        if self.maximum is not None:
            assert self.pool.pool_size() <= self.maximum

    @invariant()
    def free_ranges_are_disjoint_and_coalesced(self) -> None:
        starts = {base for base, _ in self.pool.upstream_blocks()}
        free = self.pool.free_ranges()
        live = set(self.live)
        for (ptr, n), (nxt, _) in pairwise(free):
            assert ptr + n <= nxt, "free ranges overlap"
            assert ptr + n < nxt or nxt in starts, "two touching free ranges of one block were not merged"
        for ptr, n in free:
            assert not any(ptr <= p < ptr + n for p in live), "a live allocation lies in a free range"


class Level:
    """One level of RMM's counter stack: (value, peak, total) for bytes and for allocations."""

    def __init__(self) -> None:
        self.bytes = [0, 0, 0]
        self.count = [0, 0, 0]

    def add(self, n: int) -> None:
        for counter, step in ((self.bytes, n), (self.count, 1)):
            counter[0] += step
            counter[2] += step
            counter[1] = max(counter[1], counter[0])

    def remove(self, n: int) -> None:
        self.bytes[0] -= n
        self.count[0] -= 1

    def absorb(self, top: Level) -> None:
        for mine, theirs in ((self.bytes, top.bytes), (self.count, top.count)):
            mine[1] = max(mine[1], mine[0] + theirs[1])
            mine[0] += theirs[0]
            mine[2] += theirs[2]

    def as_dict(self) -> dict[str, int]:
        return {"current_bytes": self.bytes[0], "peak_bytes": self.bytes[1], "total_bytes": self.bytes[2],
                "current_count": self.count[0], "peak_count": self.count[1], "total_count": self.count[2]}


class StatisticsMachine(RuleBasedStateMachine):
    """Statistics over a capped pool, against a model of RMM's counter stack."""

    #: What ``use_backend`` gets; tests/gpu runs the same machine with ``{"name": "cuda"}``.
    backend: ClassVar[dict[str, Any]] = {"name": "sim", "device_memory": "4GiB"}

    @initialize(maximum=st.sampled_from([MiB, 4 * MiB]))
    def start(self, maximum: int) -> None:
        ul.use_backend(**self.backend)
        self.pool = PoolMemoryResource(ul.mr.ManagedMemoryResource(), initial_pool_size=0,
                                       maximum_pool_size=maximum)
        self.stats = StatisticsResourceAdaptor(self.pool)
        self.levels = [Level()]
        self.live: dict[int, int] = {}

    def teardown(self) -> None:
        stats = getattr(self, "stats", None)
        if stats is None:
            return
        for ptr, size in self.live.items():
            stats.deallocate(ptr, size)
        self.pool.release()

    @rule(size=sizes)
    def allocate(self, size: int) -> None:
        try:
            ptr = self.stats.allocate(size)
        except OutOfMemoryError:
            event("statistics: out of memory")
            return
        self.live[ptr] = size
        self.levels[-1].add(size)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        ptr = data.draw(st.sampled_from(sorted(self.live)))
        size = self.live.pop(ptr)
        self.stats.deallocate(ptr, size)
        self.levels[-1].remove(size)

    @rule()
    def push(self) -> None:
        assert self.stats.push_counters() == self.levels[-1].as_dict()
        self.levels.append(Level())

    @precondition(lambda self: len(self.levels) > 1)
    @rule()
    def pop(self) -> None:
        top = self.levels.pop()
        assert self.stats.pop_counters() == top.as_dict()
        self.levels[-1].absorb(top)

    @invariant()
    def counters_match_the_model(self) -> None:
        assert self.stats.allocation_counts == self.levels[-1].as_dict()
        assert self.stats.counter_depth == len(self.levels)

    @invariant()
    def allocated_bytes_match(self) -> None:
        live = sum(self.live.values())
        assert self.stats.get_allocated_bytes() == live == self.pool.get_allocated_bytes()


class PurePythonPoolMachine(PoolMachine):
    """The same machine on the pool's Python path, where the compiled one is built."""

    free_list = PyBestFit


TestPool = PoolMachine.TestCase
TestPool.settings = SETTINGS
TestPurePythonPool = pytest.mark.skipif(not COMPILED, reason="without a C compiler TestPool is already pure Python")(
    PurePythonPoolMachine.TestCase)
TestPurePythonPool.settings = SETTINGS
TestStatistics = StatisticsMachine.TestCase
TestStatistics.settings = SETTINGS
