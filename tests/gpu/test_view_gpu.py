"""The lab view's data on a real GPU, with tracing off and on: the maps it decodes are ul.residency's, and the
timeline names each event's cause and line.

The session is the kernel's end of the view (protocol 3), fed a recording comm; what the view would hold is
decoded from its messages exactly as the extension decodes them (tests/unit/test_view_data.py).
"""

from __future__ import annotations

import inspect
import os

import numpy as np
import pytest

import uvm_lab as ul
from tests.unit.test_view_data import RecordingComm, ViewOfMaps
from uvm_lab.events import EventKind, get_bus
from uvm_lab.events.causes import CAUSE_NAMES
from uvm_lab.jupyter.comm import PanelSession
from uvm_lab.jupyter.protocol import TIMELINE_COLUMNS, pack_states
from uvm_lab.tracing import CuptiCollector, cupti_status

pytestmark = pytest.mark.gpu
HERE = os.path.basename(__file__)


def settle(session: PanelSession, view: ViewOfMaps, comm: RecordingComm, backend) -> None:
    backend.synchronize()
    get_bus().flush()
    session.flush()
    view.read(comm.messages)
    comm.messages.clear()


def assert_view_is_residency(view: ViewOfMaps) -> None:
    full = {b.id: pack_states(ul.residency(b).states)[1] for b in ul.live_buffers() if b.size}
    assert view.maps.keys() == full.keys()
    for alloc_id, cells in full.items():
        assert np.array_equal(view.maps[alloc_id], cells), f"allocation {alloc_id}"


def timeline(session: PanelSession, comm: RecordingComm, lane: int) -> tuple[dict, dict[str, np.ndarray]]:
    result = session.handle({"type": "timeline", "seq": 9, "start": 0, "end": ul.get_backend().now_ns() + 1,
                             "width": 2000, "lanes": [lane]})
    assert result["ok"], result
    (rows, buffers), _ = comm.messages
    comm.messages.clear()
    return rows, {name: np.frombuffer(b, dtype) for (name, dtype), b in zip(TIMELINE_COLUMNS, buffers, strict=True)}


def test_the_view_follows_a_real_gpu_with_tracing_off(cuda):
    comm = RecordingComm()
    session = PanelSession(comm, start=False)
    view = ViewOfMaps()
    try:
        buf = ul.DeviceBuffer(size="64MiB", mr=ul.mr.ManagedMemoryResource(), label="weights")
        session.handle({"type": "hello", "seq": 0})
        ul.touch(buf, on="host", mode="write")
        prefetched = inspect.currentframe().f_lineno + 1
        buf.prefetch(0)
        settle(session, view, comm, cuda)
        assert_view_is_residency(view)
        assert set(view.maps[buf.id].tolist()) == {5}   # every cell gpu:0
        ul.touch(buf, on="gpu", mode="read")             # unseen work: the host's bit stays, the GPU's unknown
        settle(session, view, comm, cuda)
        assert_view_is_residency(view)
        rows, cols = timeline(session, comm, buf.id)
        inferred = cols["kind"] == EventKind.HTOD
        assert inferred.any() and {CAUSE_NAMES[c] for c in cols["cause"][inferred]} == {"inferred"}
        assert {rows["sources"][str(s)] for s in cols["source"][inferred]} == {f"{HERE}:{prefetched}"}
        assert cols["bytes"][inferred].sum() == 64 << 20
    finally:
        session.close()


def test_the_view_shows_cuptis_faults_with_tracing_on(cuda):
    status = cupti_status()
    if not status["installed"]:
        pytest.skip(status["reason"])
    comm = RecordingComm()
    session = PanelSession(comm, start=False)
    view = ViewOfMaps()
    collector = CuptiCollector(gpu_faults=True, required=True).start()
    try:
        buf = ul.DeviceBuffer(size="64MiB", mr=ul.mr.ManagedMemoryResource(), label="activations")
        ul.touch(buf, on="host", mode="write")
        session.handle({"type": "hello", "seq": 0})
        ul.touch(buf, on="gpu", mode="read")   # faults the pages in, measured
        cuda.synchronize()
        collector.flush()
        settle(session, view, comm, cuda)
        assert_view_is_residency(view)
        _, cols = timeline(session, comm, buf.id)
        causes = {CAUSE_NAMES[c] for c in cols["cause"]}
        assert "demand fault" in causes and "inferred" not in causes
        faults = cols["kind"] == EventKind.GPU_PAGE_FAULT
        htod = cols["kind"] == EventKind.HTOD
        assert faults.any() and cols["bytes"][htod].sum() > 0   # CUPTI's own migrations (it may lose some)
    finally:
        collector.stop()
        session.close()


def test_the_views_controls_and_page_reads_on_a_real_gpu(cuda):
    from uvm_lab.jupyter.commands import CONTROLS_SOURCE
    from uvm_lab.jupyter.protocol import CELL_LIMIT

    comm = RecordingComm()
    session = PanelSession(comm, start=False)
    try:
        buf = ul.DeviceBuffer(size="96MiB", mr=ul.mr.ManagedMemoryResource(), label="big")   # past CELL_LIMIT pages
        ul.touch(buf, on="host", mode="write")
        with ul.record() as trace:
            assert session.handle({"type": "prefetch", "seq": 1, "id": buf.id, "location": "gpu:0",
                                   "first_page": 20_000, "pages": 1000})["ok"]
            cuda.synchronize()
            get_bus().flush()
        table = trace.to_pandas()
        assert set(table["source"][table["kind"] == "prefetch"]) == {CONTROLS_SOURCE}   # the view's, not a cell's
        comm.messages.clear()
        # Those pages, one byte each, as ul.residency reads them: GPU 0 alone where the prefetch put them.
        assert session.handle({"type": "pages", "seq": 2, "id": buf.id, "first_page": CELL_LIMIT,
                               "pages": 8192})["ok"]
        (header, buffers), _ = comm.messages
        comm.messages.clear()
        codes = np.frombuffer(buffers[0], np.uint8)
        assert header["pages"] == 8192
        assert codes.tolist() == ul.residency(buf, first_page=CELL_LIMIT, pages=8192).categories().tolist()
        moved = codes[20_000 - CELL_LIMIT:21_000 - CELL_LIMIT]
        assert set(moved.tolist()) == {5} and (codes != 5).sum() == 8192 - 1000
        # The timeline's by-source table charges the moved bytes to the controls.
        rows, _ = timeline(session, comm, buf.id)
        by_line = {rows["sources"][str(r[0])]: r for r in rows["by_source"] if r[0]}
        assert by_line[CONTROLS_SOURCE][4] == 1000 * 4096   # bytes to the GPU
    finally:
        session.close()
