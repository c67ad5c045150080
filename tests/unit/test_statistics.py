"""StatisticsResourceAdaptor on the simulator: counts, peaks, totals and RMM's counter stack."""

from __future__ import annotations

import pytest

import uvm_lab as ul
from uvm_lab.errors import DoubleFreeError, InvalidArgumentError, InvalidStateError, OutOfMemoryError
from uvm_lab.mr.base import MemoryResource, resource_chain
from uvm_lab.mr.pool import PoolMemoryResource
from uvm_lab.mr.statistics import StatisticsResourceAdaptor

KiB = 1 << 10
MiB = 1 << 20


def counts(current_bytes: int = 0, current_count: int = 0, peak_bytes: int = 0, peak_count: int = 0,
           total_bytes: int = 0, total_count: int = 0) -> dict[str, int]:
    return {"current_bytes": current_bytes, "current_count": current_count, "peak_bytes": peak_bytes,
            "peak_count": peak_count, "total_bytes": total_bytes, "total_count": total_count}


@pytest.fixture
def managed() -> MemoryResource:
    return ul.mr.ManagedMemoryResource()


@pytest.fixture
def stats(managed) -> StatisticsResourceAdaptor:
    return StatisticsResourceAdaptor(managed)


def test_a_fresh_adaptor_counts_nothing(stats):
    assert stats.allocation_counts == counts()
    assert stats.get_allocated_bytes() == 0
    assert stats.counter_depth == 1


def test_current_peak_and_total(stats):
    a = stats.allocate(1000)
    b = stats.allocate("4KiB")
    assert stats.allocation_counts == counts(5096, 2, 5096, 2, 5096, 2)
    stats.deallocate(a, 1000)
    assert stats.allocation_counts == counts(4096, 1, 5096, 2, 5096, 2)
    c = stats.allocate(500)
    assert stats.allocation_counts == counts(4596, 2, 5096, 2, 5596, 3)
    stats.deallocate(b, 4096)
    stats.deallocate(c, 500)
    assert stats.allocation_counts == counts(0, 0, 5096, 2, 5596, 3)
    assert stats.get_allocated_bytes() == 0


def test_a_zero_byte_allocation_is_counted_as_rmm_counts_it(stats):
    ptr = stats.allocate(0)
    assert ptr == 0
    assert stats.allocation_counts == counts(0, 1, 0, 1, 0, 1)
    stats.deallocate(ptr, 0)
    assert stats.allocation_counts == counts(0, 0, 0, 1, 0, 1)


def test_counts_are_of_requested_bytes_not_of_what_a_pool_rounds_to(managed):
    pool = PoolMemoryResource(managed, initial_pool_size="64KiB")
    stats = StatisticsResourceAdaptor(pool)
    ptr = stats.allocate(1)
    assert stats.allocation_counts["current_bytes"] == 1
    assert pool.get_allocated_bytes() == 1
    stats.deallocate(ptr, 1)


def test_allocation_counts_is_a_fresh_statistics(stats):
    snapshot = stats.allocation_counts
    snapshot.current_bytes = 99
    assert stats.allocation_counts == counts()


def test_counters_read_as_rmms_statistics_and_as_the_mapping_they_were():
    stats = StatisticsResourceAdaptor(ul.mr.ManagedMemoryResource())
    ptr = stats.allocate(1000)
    got = stats.allocation_counts
    assert isinstance(got, ul.statistics.Statistics)
    assert (got.current_bytes, got.peak_count, got.total_bytes) == (1000, 1, 1000)   # RMM's attributes
    assert got["current_bytes"] == 1000 and dict(got) == counts(1000, 1, 1000, 1, 1000, 1)
    assert got == counts(1000, 1, 1000, 1, 1000, 1) and got != {"current_bytes": 1000}
    same, other = ul.statistics.Statistics(1000, 1, 1000, 1, 1000, 1), ul.statistics.Statistics(0, 1, 1000, 1, 1000, 1)
    assert got == same != other
    with pytest.raises(KeyError):
        got["bytes"]
    stats.deallocate(ptr, 1000)


def test_the_adaptor_hands_out_the_upstreams_memory(managed, stats):
    ptr = stats.allocate(4096)
    assert managed.get_allocated_bytes() == 4096
    assert stats.allocation_id(ptr) == managed.allocation_id(ptr)
    stats.deallocate(ptr, 4096)
    assert managed.get_allocated_bytes() == 0


def test_the_adaptor_follows_its_upstream(managed, stats):
    assert stats.upstream_mr is managed and stats.get_upstream() is managed
    assert stats.is_managed is managed.is_managed
    assert stats.device_id == managed.device_id
    assert resource_chain(stats) == [stats, managed]
    assert repr(stats) == f"StatisticsResourceAdaptor({managed!r})"


@pytest.mark.parametrize("upstream", [None, 3, "pool"])
def test_upstream_must_be_a_memory_resource(upstream):
    with pytest.raises(InvalidArgumentError, match="upstream_mr"):
        StatisticsResourceAdaptor(upstream)


# -- the counter stack (rmm statistics_resource_adaptor: push_counters / pop_counters) ------------

def test_push_returns_the_level_below_and_starts_from_zero(stats):
    a = stats.allocate(100)
    below = stats.push_counters()
    assert below == counts(100, 1, 100, 1, 100, 1)
    assert stats.allocation_counts == counts()
    assert stats.counter_depth == 2
    stats.deallocate(a, 100)


def test_pop_returns_the_level_and_folds_it_into_the_one_below(stats):
    a = stats.allocate(100)
    stats.push_counters()
    b = stats.allocate(300)
    c = stats.allocate(50)
    stats.deallocate(c, 50)
    popped = stats.pop_counters()
    assert popped == counts(300, 1, 350, 2, 350, 2)
    # Below: current and total add up; the peak is the most of its old peak and its
    # current-at-push plus the popped peak (100 + 350).
    assert stats.allocation_counts == counts(400, 2, 450, 3, 450, 3)
    assert stats.counter_depth == 1
    stats.deallocate(a, 100)
    stats.deallocate(b, 300)


def test_freeing_older_memory_inside_a_level_counts_against_it(stats):
    a = stats.allocate(1000)
    stats.push_counters()
    stats.deallocate(a, 1000)
    assert stats.allocation_counts == counts(-1000, -1, 0, 0, 0, 0)
    assert stats.get_allocated_bytes() == 0
    assert stats.pop_counters() == counts(-1000, -1, 0, 0, 0, 0)
    assert stats.allocation_counts == counts(0, 0, 1000, 1, 1000, 1)


def test_a_lower_peak_survives_a_popped_level_that_stayed_below_it(stats):
    big = stats.allocate(10 * KiB)
    stats.deallocate(big, 10 * KiB)
    stats.push_counters()
    small = stats.allocate(KiB)
    stats.pop_counters()
    assert stats.allocation_counts == counts(KiB, 1, 10 * KiB, 1, 11 * KiB, 2)
    stats.deallocate(small, KiB)


def test_levels_nest(stats):
    stats.push_counters()
    a = stats.allocate(10)
    stats.push_counters()
    b = stats.allocate(20)
    stats.push_counters()
    c = stats.allocate(40)
    assert stats.counter_depth == 4
    assert stats.pop_counters() == counts(40, 1, 40, 1, 40, 1)
    assert stats.pop_counters() == counts(60, 2, 60, 2, 60, 2)
    assert stats.pop_counters() == counts(70, 3, 70, 3, 70, 3)
    assert stats.allocation_counts == counts(70, 3, 70, 3, 70, 3)
    assert stats.get_allocated_bytes() == 70
    for ptr, n in ((a, 10), (b, 20), (c, 40)):
        stats.deallocate(ptr, n)


def test_popping_the_last_level_raises(stats):
    with pytest.raises(InvalidStateError, match="must follow a push_counters"):
        stats.pop_counters()
    stats.push_counters()
    stats.pop_counters()
    with pytest.raises(InvalidStateError):
        stats.pop_counters()
    assert stats.counter_depth == 1


# -- failures leave the counters alone ------------------------------------------------------------

def test_a_double_free_raises_and_counts_nothing(stats):
    ptr = stats.allocate(100)
    stats.deallocate(ptr, 100)
    before = stats.allocation_counts
    with pytest.raises(DoubleFreeError):
        stats.deallocate(ptr, 100)
    assert stats.allocation_counts == before


def test_a_failed_allocation_counts_nothing(managed):
    stats = StatisticsResourceAdaptor(PoolMemoryResource(managed, initial_pool_size=0, maximum_pool_size="1MiB"))
    ptr = stats.allocate(MiB)
    before = stats.allocation_counts
    with pytest.raises(OutOfMemoryError):
        stats.allocate(1)
    assert stats.allocation_counts == before
    stats.deallocate(ptr, MiB)


def test_bad_arguments_raise_and_count_nothing(stats):
    with pytest.raises(InvalidArgumentError):
        stats.allocate(-1)
    with pytest.raises(InvalidArgumentError):
        stats.allocate(100, stream=-3)
    assert stats.allocation_counts == counts()
