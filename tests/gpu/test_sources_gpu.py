"""On a real GPU, events name the user's line that caused them, and the driver's name the running cell.

The prefetch's completion and the migrations it implies are published later, from the backend's own thread or a
reader's flush: they must still carry the line that issued the prefetch. CUPTI's records have no caller; with a
cell running they carry that cell.
"""

from __future__ import annotations

import inspect
import os

import numpy as np
import pytest

import uvm_lab as ul
from uvm_lab.events import EventKind, sources
from uvm_lab.tracing import CuptiCollector, cupti_status

pytestmark = pytest.mark.gpu
HERE = os.path.basename(__file__)


def here() -> str:
    return f"{HERE}:{inspect.currentframe().f_back.f_lineno + 1}"


def texts(trace, *kinds: EventKind, address: int | None = None) -> set[str]:
    ev = trace.of_kind(*kinds)
    if address is not None:   # this buffer's only: an earlier test's buffer may be collected, and freed, meanwhile
        ev = ev[ev["address"] == address]
    return set(sources.texts(ev["source"]))


def test_api_events_and_a_prefetchs_completion_name_the_users_line(cuda):
    with ul.record() as trace:
        made = here()
        buf = ul.DeviceBuffer(size="64MiB", mr=ul.mr.ManagedMemoryResource())
        written = here()
        ul.touch(buf, on="host", mode="write")
        moved = here()
        buf.prefetch(0)
        cuda.synchronize()   # the prefetch completes; its record and implied moves follow on another path
        advised = here()
        buf.read_mostly = True
        freed, ptr = here(), buf.ptr
        buf.close()
    assert texts(trace, EventKind.SEGMENT_ALLOC, EventKind.ALLOC) == {made}
    assert texts(trace, EventKind.PREFETCH) == {moved}
    htod = trace.of_kind(EventKind.HTOD)
    assert int(htod["bytes"].sum()) == 64 << 20 and set(sources.texts(htod["source"])) == {moved}
    assert texts(trace, EventKind.UNOBSERVED) >= {written}
    assert texts(trace, EventKind.ADVICE) == {advised}
    assert texts(trace, EventKind.SEGMENT_FREE, EventKind.FREE, address=ptr) == {freed}


def test_cuptis_records_name_the_cell_running(cuda):
    status = cupti_status()
    if not status["installed"]:
        pytest.skip(status["reason"])
    buf = ul.DeviceBuffer(size="64MiB", mr=ul.mr.ManagedMemoryResource())
    ul.touch(buf, on="host", mode="write")
    collector = CuptiCollector(gpu_faults=True, required=True).start()
    try:
        cell = sources.begin_cell(41)
        with ul.record() as trace:
            read = here()
            ul.touch(buf, on="gpu", mode="read")
            cuda.synchronize()
            collector.flush()
    finally:
        sources.end_cells()
        collector.stop()
        buf.close()
    driver = trace.of_kind(EventKind.GPU_PAGE_FAULT, EventKind.HTOD)
    assert len(driver) and int(driver["bytes"][driver["kind"] == EventKind.HTOD].sum()) > 0
    # The driver's records carry the cell; what the call itself published carries its line.
    assert set(np.unique(driver["source"]).tolist()) == {cell}
    assert sources.texts(np.array([cell])) == ["In [41]"]
    assert read not in sources.texts(driver["source"])
