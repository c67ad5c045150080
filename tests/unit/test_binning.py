"""BinningMemoryResource on the simulator: routing to bins, add_bin, bin_mrs, validation and failure."""

from __future__ import annotations

import gc

import pytest

import uvm_lab as ul
from uvm_lab import deferred
from uvm_lab.errors import DoubleFreeError, InvalidArgumentError, InvalidSizeError, OutOfMemoryError
from uvm_lab.events.schema import EventKind
from uvm_lab.mr.binning import BinningMemoryResource
from uvm_lab.mr.fixed_size import FixedSizeMemoryResource
from uvm_lab.mr.statistics import StatisticsResourceAdaptor

from .upstreams import CappedUpstream

KiB = 1 << 10
MiB = 1 << 20


@pytest.fixture
def managed():
    return ul.mr.ManagedMemoryResource()


def test_no_bins_by_default_everything_goes_upstream(managed):
    mr = BinningMemoryResource(managed)
    assert mr.bin_mrs == [] and mr.bin_sizes == []
    ptr = mr.allocate(1000)
    assert managed.get_allocated_bytes() == 1000
    assert mr.get_resource(1000) is managed
    mr.deallocate(ptr, 1000)
    assert managed.get_allocated_bytes() == 0


def test_exponents_make_one_fixed_size_bin_per_power_of_two(managed):
    mr = BinningMemoryResource(managed, 10, 13)
    assert mr.bin_sizes == [1 * KiB, 2 * KiB, 4 * KiB, 8 * KiB]
    assert all(isinstance(b, FixedSizeMemoryResource) for b in mr.bin_mrs)
    assert [b.block_size for b in mr.bin_mrs] == mr.bin_sizes
    assert all(b.upstream_mr is managed for b in mr.bin_mrs)


@pytest.mark.parametrize(("size", "bin_index"),
                         [(1, 0), (1024, 0), (1025, 1), (3000, 2), (8 * KiB, 3), (8 * KiB + 1, None)])
def test_a_request_goes_to_the_smallest_bin_that_holds_it(managed, size, bin_index):
    mr = BinningMemoryResource(managed, 10, 13)
    target = managed if bin_index is None else mr.bin_mrs[bin_index]
    assert mr.get_resource(size) is target
    before = target.get_allocated_bytes()
    ptr = mr.allocate(size)
    assert target.get_allocated_bytes() == before + size
    assert mr.get_allocated_bytes() == size
    mr.deallocate(ptr, size)
    assert target.get_allocated_bytes() == before


def test_add_bin_with_and_without_a_resource(managed):
    mr = BinningMemoryResource(managed)
    mr.add_bin("4KiB")
    custom = StatisticsResourceAdaptor(managed)
    mr.add_bin(64 * KiB, custom)
    assert mr.bin_sizes == [4 * KiB, 64 * KiB]
    assert isinstance(mr.bin_mrs[0], FixedSizeMemoryResource) and mr.bin_mrs[1] is custom
    ptr = mr.allocate(10 * KiB)
    assert custom.allocation_counts["current_bytes"] == 10 * KiB
    mr.deallocate(ptr, 10 * KiB)
    assert custom.allocation_counts["current_bytes"] == 0


def test_add_bin_rounds_to_256_and_an_existing_size_is_kept(managed):
    mr = BinningMemoryResource(managed)
    mr.add_bin(1000)
    first = mr.bin_mrs[0]
    mr.add_bin(1024)                         # the same bin size: nothing changes, as in RMM
    assert mr.bin_mrs == [first] and mr.bin_sizes == [1024]
    with pytest.raises(InvalidArgumentError, match="already exists"):
        mr.add_bin(1024, StatisticsResourceAdaptor(managed))
    assert mr.bin_mrs == [first]


def test_a_bin_added_later_does_not_misroute_earlier_pointers(managed):
    mr = BinningMemoryResource(managed)
    ptr = mr.allocate(100)                   # from the upstream
    mr.add_bin(1024)
    mr.deallocate(ptr, 100)                  # still goes back to the upstream
    assert managed.get_allocated_bytes() == 128 * KiB     # only the new bin's first chunk
    assert mr.bin_mrs[0].get_allocated_bytes() == 0


@pytest.mark.parametrize(("lo", "hi"), [(-2, 3), (3, -2), (-1, 3), (3, -1), (5, 4), (1.0, 3), (True, 3), (0, 41),
                                        ("1", 3)])
def test_bad_exponents_are_named(managed, lo, hi):
    with pytest.raises(InvalidArgumentError):
        BinningMemoryResource(managed, lo, hi)
    assert managed.get_allocated_bytes() == 0


def test_bad_upstream_and_bin_resource(managed):
    with pytest.raises(InvalidArgumentError, match="upstream_mr"):
        BinningMemoryResource(None)  # type: ignore[arg-type]
    mr = BinningMemoryResource(managed)
    with pytest.raises(InvalidArgumentError, match="bin_resource"):
        mr.add_bin(1024, "pool")  # type: ignore[arg-type]
    with pytest.raises(InvalidSizeError):
        mr.add_bin(0)
    with pytest.raises(InvalidSizeError):
        mr.add_bin("lots")
    other = ul.mr.ManagedMemoryResource()
    ul.use_backend("sim", device_memory="1GiB")
    with pytest.raises(InvalidArgumentError, match="another backend"):
        BinningMemoryResource(ul.mr.ManagedMemoryResource()).add_bin(1024, other)
    assert mr.bin_mrs == []


def test_construction_that_runs_out_keeps_nothing(managed):
    # Room for the 1 KiB and 2 KiB bins' chunks (128 + 256 KiB) but not one 4 KiB block.
    upstream = CappedUpstream(managed, 387 * KiB)
    with pytest.raises(OutOfMemoryError):
        BinningMemoryResource(upstream, 10, 12)
    assert upstream.held == 0


def test_a_failing_request_leaves_everything_as_it_was(managed):
    mr = BinningMemoryResource(managed, 10, 10)
    gc.collect()   # an earlier test's buffers, freed by the collector, must not free inside the recording:
    deferred.run()  # their frees are queued (uvm_lab.deferred), and an allocation that fails runs the queue
    with ul.record() as trace, pytest.raises(OutOfMemoryError):
        mr.allocate("5GiB")                  # more than the 4 GiB device: the upstream refuses
    assert mr.get_allocated_bytes() == 0 and managed.get_allocated_bytes() == 128 * KiB
    assert list(trace.events["kind"]) == [EventKind.ALLOC_FAILURE]   # published once, by the upstream


def test_events_come_from_the_bin_not_twice(managed):
    mr = BinningMemoryResource(managed, 10, 10)
    with ul.record() as trace:
        ptr = mr.allocate(100)
        mr.deallocate(ptr, 100)
    kinds = [EventKind(k) for k in trace.events["kind"]]
    assert kinds == [EventKind.ALLOC, EventKind.FREE]


def test_allocation_id_is_the_serving_resources(managed):
    mr = BinningMemoryResource(managed, 10, 10)
    ptr = mr.allocate(100)
    assert mr.allocation_id(ptr) == mr.bin_mrs[0].allocation_id(ptr)
    mr.deallocate(ptr, 100)


def test_double_free_and_wrong_size(managed):
    mr = BinningMemoryResource(managed, 10, 10)
    ptr = mr.allocate(100)
    with pytest.raises(InvalidArgumentError):
        mr.deallocate(ptr, 99)
    mr.deallocate(ptr, 100)
    with pytest.raises(DoubleFreeError):
        mr.deallocate(ptr, 100)
    with pytest.raises(DoubleFreeError):
        mr.deallocate(12345, 100)
    assert mr.allocate(0) == 0
    mr.deallocate(0, 0)


def test_repr(managed):
    assert repr(BinningMemoryResource(managed, 10, 11)) == \
        "BinningMemoryResource(ManagedMemoryResource(), bins=[1 KiB, 2 KiB])"
