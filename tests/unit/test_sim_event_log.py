"""An operation's records (``EventLog``): whether added from Python or written by the compiled core, they come out in
the order they were made, with the clock where the last one left it."""

from __future__ import annotations

from uvm_lab.backends.sim import core
from uvm_lab.backends.sim.model import SPARE_RECORDS, EventLog
from uvm_lab.events.schema import EventKind


def _values(log: EventLog) -> list[int]:
    return [int(v) for piece in log.pieces() for v in piece["value"]]


def test_records_come_out_in_the_order_they_went_in_whichever_way():
    log = EventLog(0)
    log.add(EventKind.HTOD, value=0, seconds=1e-6)
    records, count, clock = log.open()
    assert clock[0] == 1000   # the core starts where Python left the clock
    for i in range(1, 3000):  # more than the buffer first holds: it grows
        core.emit(records, count, clock, EventKind.DTOH, 0, 0, 0, 0, 4096, i, 1, 0, 1e-9, True)
    log.close(records, count, clock)
    assert log.t == 1000 + 2999
    log.add(EventKind.HTOD, value=3000)
    assert _values(log) == list(range(3001))
    assert len(log) == 3001


def test_pieces_cut_a_long_log_without_splitting_a_chunk():
    log = EventLog(0)
    for i in range(5):
        records, count, clock = log.open()
        for j in range(100):
            core.emit(records, count, clock, EventKind.HTOD, 0, 0, 0, 0, 4096, 100 * i + j, 1, 0, 0.0, True)
        log.close(records, count, clock)
    pieces = list(log.pieces(limit=250))
    assert [len(p) for p in pieces] == [200, 200, 100]
    assert _values(log) == list(range(500))


def test_an_operation_opened_inside_another_writes_records_of_its_own():
    outer, inner = EventLog(0), EventLog(0)
    outer_records, outer_count, outer_clock = outer.open()
    inner_records, inner_count, inner_clock = inner.open()
    core.emit(outer_records, outer_count, outer_clock, EventKind.HTOD, 0, 0, 0, 0, 4096, 1, 1, 0, 0.0, True)
    core.emit(inner_records, inner_count, inner_clock, EventKind.HTOD, 0, 0, 0, 0, 4096, 2, 1, 0, 0.0, True)
    inner.close(inner_records, inner_count, inner_clock)
    outer.close(outer_records, outer_count, outer_clock)
    assert _values(outer) == [1]
    assert _values(inner) == [2]


def test_a_buffer_grown_by_a_long_run_is_let_go_after_it():
    log = EventLog(0)
    records, count, clock = log.open()
    for i in range(SPARE_RECORDS + 1):
        core.emit(records, count, clock, EventKind.HTOD, 0, 0, 0, 0, 4096, i, 1, 0, 0.0, True)
    log.close(records, count, clock)
    assert len(log) == SPARE_RECORDS + 1
    after = EventLog(0)
    records, count, clock = after.open()
    assert len(records[0]) <= SPARE_RECORDS   # the next operation starts small again: memory stays bounded
    core.emit(records, count, clock, EventKind.HTOD, 0, 0, 0, 0, 4096, 7, 1, 0, 0.0, True)
    after.close(records, count, clock)
    assert _values(after) == [7]
    assert _values(log) == list(range(SPARE_RECORDS + 1))   # the long run's records, not written over
