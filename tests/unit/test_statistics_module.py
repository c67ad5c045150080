"""``ul.statistics``, RMM's ``rmm.statistics``: RMM's own test cases, run as an RMM user writes them.

Where RMM's tests ``del`` a buffer and read the counters at once, these close it (or run the frees that garbage
collection queued, ``ul.deferred.run()``): uvm_lab frees a collected buffer soon after, not at once.
"""

from __future__ import annotations

import inspect

import pytest

import uvm_lab as ul
from uvm_lab.errors import InvalidArgumentError, InvalidStateError
from uvm_lab.statistics import (
    ProfilerRecords,
    Statistics,
    default_profiler_records,
    enable_statistics,
    get_statistics,
    pop_statistics,
    profiler,
    push_statistics,
    statistics,
)


def stats_of(current_bytes, current_count, peak_bytes, peak_count, total_bytes, total_count) -> Statistics:
    return Statistics(current_bytes=current_bytes, current_count=current_count, peak_bytes=peak_bytes,
                      peak_count=peak_count, total_bytes=total_bytes, total_count=total_count)


@pytest.fixture
def stats_mr():
    """RMM's fixture: a StatisticsResourceAdaptor over the default resource, made current."""
    mr = ul.mr.StatisticsResourceAdaptor(ul.mr.get_current_device_resource())
    ul.mr.set_current_device_resource(mr)
    return mr


def name_of(func) -> str:
    """RMM's ``_get_descriptive_name_of_object``: what a decorated function's record is called."""
    func = inspect.unwrap(func)
    _, line = inspect.getsourcelines(func)
    return f"{inspect.getfile(func)}:{line}({func.__qualname__})"


def test_context():
    mr0 = ul.mr.get_current_device_resource()
    assert get_statistics() is None
    with statistics():
        mr1 = ul.mr.get_current_device_resource()
        assert isinstance(mr1, ul.mr.StatisticsResourceAdaptor)
        b1 = ul.DeviceBuffer(size=20)
        assert get_statistics() == stats_of(20, 1, 20, 1, 20, 1)
        with statistics():
            assert ul.mr.get_current_device_resource() is mr1
            b2 = ul.DeviceBuffer(size=10)
            assert get_statistics() == stats_of(10, 1, 10, 1, 10, 1)
        assert get_statistics() == stats_of(30, 2, 30, 2, 30, 2)
        b1.close()
        b2.close()
    assert ul.mr.get_current_device_resource() is mr0
    assert get_statistics() is None


def test_multiple_mr(stats_mr):
    buffers = [ul.DeviceBuffer(size=1000) for _ in range(10)]
    for i in range(9, 0, -2):
        buffers.pop(i).close()
    assert stats_mr.allocation_counts == stats_of(5000, 5, 10000, 10, 10000, 10)
    mr2 = ul.mr.StatisticsResourceAdaptor(stats_mr)
    ul.mr.set_current_device_resource(mr2)
    buffers += [ul.DeviceBuffer(size=1000) for _ in range(2)]
    assert mr2.allocation_counts == stats_of(2000, 2, 2000, 2, 2000, 2)
    assert stats_mr.allocation_counts == stats_of(7000, 7, 10000, 10, 12000, 12)
    for buf in buffers:
        buf.close()
    assert mr2.allocation_counts == stats_of(0, 0, 2000, 2, 2000, 2)
    assert stats_mr.allocation_counts == stats_of(0, 0, 10000, 10, 12000, 12)


def test_counter_stack(stats_mr):
    buffers = [ul.DeviceBuffer(size=10) for _ in range(10)]
    assert stats_mr.push_counters() == stats_of(100, 10, 100, 10, 100, 10)     # the level before the push
    b1 = ul.DeviceBuffer(size=10)
    assert stats_mr.push_counters() == stats_of(10, 1, 10, 1, 10, 1)
    b1.close()
    assert stats_mr.pop_counters() == stats_of(-10, -1, 0, 0, 0, 0)            # can go below zero
    b1 = ul.DeviceBuffer(size=10)
    assert stats_mr.push_counters() == stats_of(10, 1, 10, 1, 20, 2)
    b2 = ul.DeviceBuffer(size=10)
    assert stats_mr.pop_counters() == stats_of(10, 1, 10, 1, 10, 1)
    assert stats_mr.pop_counters() == stats_of(20, 2, 20, 2, 30, 3)
    b1.close()
    b2.close()
    assert stats_mr.allocation_counts == stats_of(100, 10, 120, 12, 130, 13)
    with pytest.raises(InvalidStateError, match="must follow a push_counters"):   # RMM: IndexError
        stats_mr.pop_counters()
    for buf in buffers:
        buf.close()


def test_current_statistics(stats_mr):
    b1 = ul.DeviceBuffer(size=10)
    assert get_statistics() == stats_of(10, 1, 10, 1, 10, 1)
    b2 = ul.DeviceBuffer(size=20)
    assert push_statistics() == stats_of(30, 2, 30, 2, 30, 2)
    del b1
    ul.deferred.run()                      # what garbage collection queued
    assert pop_statistics() == stats_of(-10, -1, 0, 0, 0, 0)
    del b2
    ul.deferred.run()
    assert get_statistics() == stats_of(0, 0, 30, 2, 30, 2)


def test_statistics_disabled():
    assert get_statistics() is None
    assert push_statistics() is None
    assert pop_statistics() is None
    assert get_statistics() is None


def test_enable_statistics_wraps_the_current_resource_once():
    base = ul.mr.get_current_device_resource()
    enable_statistics()
    top = ul.mr.get_current_device_resource()
    assert isinstance(top, ul.mr.StatisticsResourceAdaptor) and top.upstream_mr is base
    enable_statistics()
    assert ul.mr.get_current_device_resource() is top
    with ul.DeviceBuffer(size=64):
        assert get_statistics().current_bytes == 64


def test_profiler(stats_mr):
    records = ProfilerRecords()
    assert len(records.records) == 0 and "No data" in records.report()

    @profiler(records=records)
    def f1():
        b1 = ul.DeviceBuffer(size=10)
        b2 = ul.DeviceBuffer(size=10)
        b1.close()
        return b2

    b1 = f1()
    b2 = f1()

    @profiler(records=records)
    def f2():
        b1 = ul.DeviceBuffer(size=10)

        @profiler(records=records, name="g2")
        def g2(b1):
            b2 = ul.DeviceBuffer(size=10)
            b1.close()
            return b2

        return g2(b1)

    kept = [f2(), f2()]
    b1.close()
    b2.close()
    kept.append(f2())

    @profiler(records=records)
    def f3():
        return [ul.DeviceBuffer(size=100) for _ in range(100)]

    kept += f3()
    assert records.records[name_of(f1)] == ProfilerRecords.MemoryRecord(num_calls=2, memory_total=40, memory_peak=20)
    assert records.records[name_of(f2)] == ProfilerRecords.MemoryRecord(num_calls=3, memory_total=60, memory_peak=20)
    assert records.records["g2"] == ProfilerRecords.MemoryRecord(num_calls=3, memory_total=30, memory_peak=10)
    assert records.records[name_of(f3)] == ProfilerRecords.MemoryRecord(
        num_calls=1, memory_total=10000, memory_peak=10000)

    @profiler()   # the default records
    def f4():
        return [ul.DeviceBuffer(size=10) for _ in range(10)]

    kept += f4()
    with profiler(name="b1 and b2"):
        b1 = ul.DeviceBuffer(size=100)
        b2 = ul.DeviceBuffer(size=100)
        with profiler(name="del b1 and b2"):
            b1.close()
            b2.close()
    assert default_profiler_records.records[name_of(f4)] == ProfilerRecords.MemoryRecord(1, 100, 100)
    assert default_profiler_records.records["b1 and b2"] == ProfilerRecords.MemoryRecord(1, 200, 200)
    assert default_profiler_records.records["del b1 and b2"] == ProfilerRecords.MemoryRecord(1, 0, 0)
    for buf in kept:
        buf.close()


def test_the_report_reads_as_rmms(stats_mr):
    records = ProfilerRecords()
    with profiler(records=records, name="small"):
        ul.DeviceBuffer(size=1_000).close()
    for _ in range(2):
        with profiler(records=records, name="large"):
            ul.DeviceBuffer(size=2_000_000).close()
    lines = records.report().splitlines()
    assert lines[:2] == ["Memory Profiling", "================"]
    assert "Ordered by: memory_peak" in lines
    table = lines[lines.index("ncalls     memory_peak    memory_total  filename:lineno(function)") + 1:]
    assert table == ["     2       2,000,000       4,000,000  large", "     1           1,000           1,000  small"]
    by_calls = records.report(ordered_by="num_calls").splitlines()
    assert by_calls[-2:] == table
    assert str(records) == records.report()


def test_the_profiler_records_nothing_while_statistics_are_off():
    records = ProfilerRecords()

    @profiler(records=records)
    def allocate():
        return ul.DeviceBuffer(size=10)

    allocate().close()
    with profiler(records=records, name="block"):
        ul.DeviceBuffer(size=10).close()
    assert records.records == {}


def test_a_profiled_call_that_raises_is_still_recorded_and_its_level_popped(stats_mr):
    records = ProfilerRecords()

    @profiler(records=records, name="fails")
    def fails():
        ul.DeviceBuffer(size=10).close()
        raise KeyError("boom")

    with pytest.raises(KeyError):
        fails()
    assert records.records["fails"] == ProfilerRecords.MemoryRecord(1, 10, 10)
    assert stats_mr.counter_depth == 1


def test_a_profiled_function_keeps_its_name_and_result(stats_mr):
    @profiler()
    def answer(x, *, y):
        """Doc."""
        return x + y

    assert answer(40, y=2) == 42 and answer.__name__ == "answer" and answer.__doc__ == "Doc."


def test_changing_the_resource_inside_statistics_raises_and_keeps_the_change(stats_mr):
    other = ul.mr.ManagedMemoryResource()
    with pytest.raises(InvalidStateError, match="changed inside"), statistics():
        ul.mr.set_current_device_resource(other)
    assert ul.mr.get_current_device_resource() is other
    assert stats_mr.counter_depth == 1            # the level the block pushed was popped


@pytest.mark.parametrize(("call", "match"), [
    (lambda: profiler(records={}), "records must be a ProfilerRecords"),
    (lambda: profiler(name=3), "name must be a str"),
    (lambda: profiler()(42), "decorates a function"),
    (lambda: profiler().__enter__(), "needs a name"),
    (lambda: ProfilerRecords().report(ordered_by="speed"), "ordered_by must be one of"),
    (lambda: ProfilerRecords().add("x", {"total_bytes": 1}), "data must be a Statistics"),
    (lambda: ProfilerRecords().add(1, Statistics(0, 0, 0, 0, 0, 0)), "name must be a str"),
])
def test_bad_arguments_are_typed_errors_that_change_nothing(stats_mr, call, match):
    with pytest.raises(InvalidArgumentError, match=match):
        call()
    assert stats_mr.counter_depth == 1 and default_profiler_records.records.get("") is None
