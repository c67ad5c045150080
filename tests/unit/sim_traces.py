"""Run one script on a fresh simulator and compare what two runs left: records, results, clock and state."""

from __future__ import annotations

import numpy as np

from uvm_lab.backends.sim import SimBackend
from uvm_lab.events import EventBus


def same_records(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal records, but for where each backend placed its segments and how it numbered them."""
    if len(a) != len(b):
        return False
    names = [n for n in a.dtype.names if n not in ("address", "alloc_id")]
    shift = a["address"].astype(np.int64) - b["address"].astype(np.int64)
    ids = np.unique(np.stack((a["alloc_id"], b["alloc_id"]), axis=1), axis=0)
    return all(np.array_equal(a[n], b[n]) for n in names) and len(np.unique(shift)) == 1 \
        and len(np.unique(ids[:, 0])) == len(ids) == len(np.unique(ids[:, 1]))


def traced(script, **backend) -> tuple:
    """Run ``script`` on a new backend: its records, results, clock, page table, FIFO and evictions."""
    bus = EventBus(capacity=1 << 22)
    b = SimBackend(bus=bus, **backend)
    results = script(b)
    t, mem = b._table, b._memory
    state = np.concatenate((t.state, t.writable, t.remote, t.chunk.view(np.uint8), t.last_use.view(np.uint8)))
    return bus.history(), results, b.now_ns(), state, list(mem._order.items()), mem.evicted_blocks


def assert_same(one: tuple, other: tuple) -> None:
    assert len(one[0]) == len(other[0])
    assert same_records(one[0], other[0])
    assert one[1] == other[1]
    assert one[2] == other[2]
    assert np.array_equal(one[3], other[3])
    assert one[4:] == other[4:]
