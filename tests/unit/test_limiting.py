"""LimitingResourceAdaptor: a byte cap counted in 256-byte units, as RMM counts it."""

from __future__ import annotations

import pytest

import uvm_lab as ul
from uvm_lab.errors import DoubleFreeError, InvalidArgumentError, InvalidSizeError, OutOfMemoryError
from uvm_lab.events.schema import EventKind
from uvm_lab.mr.limiting import LimitingResourceAdaptor

KiB = 1 << 10


@pytest.fixture
def managed():
    return ul.mr.ManagedMemoryResource()


def test_limit_and_aligned_accounting(managed):
    mr = LimitingResourceAdaptor(managed, "4KiB")
    assert mr.get_allocation_limit() == 4 * KiB
    a = mr.allocate(1)
    assert mr.get_allocated_bytes() == 256
    b = mr.allocate(3 * KiB)
    assert mr.get_allocated_bytes() == 3 * KiB + 256
    mr.deallocate(a, 1)
    assert mr.get_allocated_bytes() == 3 * KiB
    mr.deallocate(b, 3 * KiB)
    assert mr.get_allocated_bytes() == 0
    assert ul.mr.resource_chain(mr) == [mr, managed]


def test_past_the_limit_raises_with_size_free_and_limit(managed):
    mr = LimitingResourceAdaptor(managed, 4 * KiB)
    ptr = mr.allocate(3 * KiB)
    with ul.record() as trace, pytest.raises(OutOfMemoryError, match="allocation_limit") as err:
        mr.allocate(1025)
    assert (err.value.size, err.value.free, err.value.limit) == (1025, KiB, 4 * KiB)
    assert [EventKind(k) for k in trace.events["kind"]] == [EventKind.ALLOC_FAILURE]
    assert mr.get_allocated_bytes() == 3 * KiB and managed.get_allocated_bytes() == 3 * KiB
    last = mr.allocate(KiB)                                    # exactly up to the limit is fine
    mr.deallocate(last, KiB)
    mr.deallocate(ptr, 3 * KiB)


def test_an_upstream_failure_gives_the_reservation_back(managed):
    mr = LimitingResourceAdaptor(managed, "8GiB")
    with pytest.raises(OutOfMemoryError):
        mr.allocate("5GiB")                                    # under the limit, over the device
    assert mr.get_allocated_bytes() == 0


def test_a_double_free_leaves_the_count(managed):
    mr = LimitingResourceAdaptor(managed, KiB)
    ptr = mr.allocate(100)
    mr.deallocate(ptr, 100)
    with pytest.raises(DoubleFreeError):
        mr.deallocate(ptr, 100)
    assert mr.get_allocated_bytes() == 0


def test_a_zero_limit_allows_only_zero_bytes(managed):
    mr = LimitingResourceAdaptor(managed, 0)
    assert mr.allocate(0) == 0
    with pytest.raises(OutOfMemoryError):
        mr.allocate(1)


@pytest.mark.parametrize("bad", [-1, "lots", 1.5, None, True])
def test_bad_limits_are_named(managed, bad):
    with pytest.raises(InvalidSizeError) as err:
        LimitingResourceAdaptor(managed, bad)
    assert err.value.value is bad


def test_upstream_must_be_a_resource():
    with pytest.raises(InvalidArgumentError, match="upstream_mr"):
        LimitingResourceAdaptor("x", 10)  # type: ignore[arg-type]


def test_repr(managed):
    assert repr(LimitingResourceAdaptor(managed, "1GiB")) == \
        "LimitingResourceAdaptor(ManagedMemoryResource(), allocation_limit='1 GiB')"
