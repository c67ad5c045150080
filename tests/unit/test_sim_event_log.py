"""An operation's records (``EventLog``): whichever way they were added, they come out in order, and records that
compiled code wrote into the log's tail are published without being copied."""

from __future__ import annotations

import numpy as np

from uvm_lab.backends.sim.model import EventLog
from uvm_lab.events.schema import EVENT_DTYPE, EventKind


def _written(tail: np.ndarray, filled: int, values: range) -> int:
    """Write records into ``tail`` from ``filled`` on as compiled code does (value = each of ``values``)."""
    n = len(values)
    tail[filled:filled + n] = np.zeros(n, dtype=EVENT_DTYPE)
    tail["kind"][filled:filled + n] = EventKind.HTOD
    tail["value"][filled:filled + n] = np.asarray(values)
    return n


def _as_bytes(values: range) -> bytes:
    out = np.zeros(len(values), dtype=EVENT_DTYPE)
    out["kind"], out["value"] = EventKind.DTOH, np.asarray(values)
    return out.tobytes()


def _values(log: EventLog) -> list[int]:
    return [int(v) for piece in log.pieces() for v in piece["value"]]


def test_records_come_out_in_the_order_they_went_in_whichever_way():
    log = EventLog(0)
    log.add(EventKind.HTOD, value=0)
    tail, filled = log.tail()
    log.grow(_written(tail, filled, range(1, 4)))
    tail, filled = log.tail()
    assert filled == 3                       # nothing came between: the same tail goes on
    log.grow(_written(tail, filled, range(4, 6)))
    log.put(_as_bytes(range(6, 9)))
    log.add_many(EventKind.DTOH, flags=0, src=0, dst=0, address=np.zeros(6, np.uint64),
                 nbytes=np.zeros(6, np.uint64), value=np.arange(9, 15, dtype=np.uint64))
    tail, filled = log.tail()
    assert filled == 0                       # records came after the tail: a new one, the old one's kept
    log.grow(_written(tail, filled, range(15, 17)))
    log.grow(0)
    log.add(EventKind.HTOD, value=17)
    assert _values(log) == list(range(18))
    assert len(log) == 18


def test_a_full_tail_is_published_as_it_is():
    log = EventLog(0)
    tail, filled = log.tail()
    log.grow(_written(tail, filled, range(EventLog.TAIL - 10)))
    tail_again, filled = log.tail(room=100)   # 100 more do not fit: a new tail
    assert tail_again is not tail and filled == 0
    log.grow(_written(tail_again, filled, range(EventLog.TAIL - 10, EventLog.TAIL + 90)))
    pieces = list(log.pieces())
    assert len(pieces) == 2 and np.shares_memory(pieces[0], tail) and np.shares_memory(pieces[1], tail_again)
    assert _values(log) == list(range(EventLog.TAIL + 90))


def test_more_records_than_a_tail_holds_go_in_whole():
    log = EventLog(0)
    log.put(_as_bytes(range(3)))
    log.put(_as_bytes(range(3, EventLog.TAIL + 50)))
    tail, filled = log.tail()
    log.grow(_written(tail, filled, range(EventLog.TAIL + 50, EventLog.TAIL + 60)))
    assert _values(log) == list(range(EventLog.TAIL + 60))
