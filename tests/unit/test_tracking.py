"""TrackingResourceAdaptor: outstanding allocations, RMM's report, stacks on request."""

from __future__ import annotations

import logging

import pytest

import uvm_lab as ul
from uvm_lab.errors import DoubleFreeError, InvalidArgumentError, OutOfMemoryError
from uvm_lab.events.schema import EventKind
from uvm_lab.mr.tracking import TrackingResourceAdaptor


@pytest.fixture
def managed():
    return ul.mr.ManagedMemoryResource()


def test_it_tracks_what_is_outstanding(managed):
    mr = TrackingResourceAdaptor(managed)
    a, b = mr.allocate(1000), mr.allocate("4KiB")
    assert mr.get_allocated_bytes() == 5096
    assert mr.get_outstanding_allocations() == {a: (1000, None), b: (4096, None)}
    mr.deallocate(a, 1000)
    assert mr.get_allocated_bytes() == 4096
    assert mr.get_outstanding_allocations_str() == f"Outstanding Allocations:\n{b:#x}: 4096 B\n"
    mr.deallocate(b, 4096)
    assert mr.get_outstanding_allocations_str() == "Outstanding Allocations:\n"
    assert ul.mr.resource_chain(mr) == [mr, managed]


def make_one(mr):
    return mr.allocate(123)


def test_stacks_name_the_allocating_line(managed):
    mr = TrackingResourceAdaptor(managed, capture_stacks=True)
    ptr = make_one(mr)
    size, stack = mr.get_outstanding_allocations()[ptr]
    assert size == 123 and "in make_one" in stack and "return mr.allocate(123)" in stack
    assert "uvm_lab/mr" not in stack                          # the library's own frames are cut
    report = mr.get_outstanding_allocations_str()
    assert report.startswith(f"Outstanding Allocations:\n{ptr:#x}: 123 B : callstack:\n")
    mr.deallocate(ptr, 123)


def test_log_outstanding_allocations_logs_at_debug(managed, caplog):
    mr = TrackingResourceAdaptor(managed)
    ptr = mr.allocate(64)
    with caplog.at_level(logging.DEBUG, logger="uvm_lab.mr"):
        mr.log_outstanding_allocations()
    assert f"{ptr:#x}: 64 B" in caplog.text
    mr.deallocate(ptr, 64)


def test_failures_leave_the_map_unchanged(managed):
    mr = TrackingResourceAdaptor(managed)
    ptr = mr.allocate(10)
    with ul.record() as trace, pytest.raises(OutOfMemoryError):
        mr.allocate("5GiB")
    assert [EventKind(k) for k in trace.events["kind"]] == [EventKind.ALLOC_FAILURE]
    mr.deallocate(ptr, 10)
    with pytest.raises(DoubleFreeError):
        mr.deallocate(ptr, 10)
    assert mr.get_allocated_bytes() == 0 and mr.get_outstanding_allocations() == {}


def test_zero_bytes_are_not_tracked(managed):
    mr = TrackingResourceAdaptor(managed)
    assert mr.allocate(0) == 0
    assert mr.get_outstanding_allocations() == {}
    mr.deallocate(0, 0)


@pytest.mark.parametrize("bad", [1, "yes", None])
def test_capture_stacks_must_be_a_bool(managed, bad):
    with pytest.raises(InvalidArgumentError, match="capture_stacks"):
        TrackingResourceAdaptor(managed, capture_stacks=bad)


def test_upstream_must_be_a_resource():
    with pytest.raises(InvalidArgumentError, match="upstream_mr"):
        TrackingResourceAdaptor(object())  # type: ignore[arg-type]
