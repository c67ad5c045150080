"""Every event says where in the user's code it came from: the line that called uvm_lab, or the cell running."""

from __future__ import annotations

import contextlib
import gc
import inspect
import os

import numpy as np
import pytest

import uvm_lab as ul
from uvm_lab.errors import InvalidArgumentError
from uvm_lab.events import EventBus, EventKind, make_events, sources
from uvm_lab.events.schema import EVENT_DTYPE_WITHOUT_SOURCE
from uvm_lab.events.trace import Trace

HERE = os.path.basename(__file__)


def here() -> str:
    """``file:line`` of the line after the caller's."""
    return f"{HERE}:{inspect.currentframe().f_back.f_lineno + 1}"


@pytest.fixture
def sim():
    # Buffers earlier tests dropped are collected now: freed inside a test's record, their FREE would be charged
    # to the line running then (as it should be), and the test would see a line it did not write.
    gc.collect()
    backend = ul.use_backend("sim", device_memory="256MiB")
    yield backend


def lines(trace: Trace) -> dict[str, list[str]]:
    """The source text of each kind's records, in order, without repeats."""
    out: dict[str, list[str]] = {}
    for kind, text in zip(trace.to_pandas()["kind"].tolist(), trace.to_pandas()["source"].tolist(), strict=True):
        if text not in out.setdefault(kind, []):
            out[kind].append(text)
    return out


def test_each_api_call_carries_the_line_that_made_it(sim):
    with ul.record() as trace:
        made = here()
        buf = ul.DeviceBuffer(size="2MiB")
        written = here()
        ul.touch(buf, on="host", mode="write")   # first touch: the pages land on the host
        prefetched = here()
        buf.prefetch("gpu")
        touched = here()
        ul.touch(buf, on="host", mode="write")
        advised = here()
        buf.read_mostly = True
        closed = here()
        buf.close()
    seen = lines(trace)
    assert seen["alloc"] == [made] and seen["segment_alloc"] == [made]
    assert seen["prefetch"] == [prefetched] and seen["htod"] == [prefetched]
    assert seen["cpu_page_fault"] == [written, touched] and seen["dtoh"] == [touched]
    assert seen["advice"] == [advised]
    assert seen["free"] == [closed] and seen["segment_free"] == [closed]
    assert trace.to_pandas()["cell"].isna().all()   # not in a notebook


def test_the_compiled_pool_and_the_python_pool_name_the_same_lines(sim):
    pool = ul.mr.PoolMemoryResource(ul.mr.ManagedMemoryResource(), initial_pool_size="8MiB")
    with ul.record() as trace:
        fast = here()
        ptr = pool.allocate(4096)                           # the compiled hot path, where built
        slow = here()
        other = pool.allocate("8KiB")                       # a string size takes the Python method
        pool.deallocate(ptr, 4096)
        pool.deallocate(other, 8192)
    df = trace.to_pandas()
    allocs = df[df["kind"] == "alloc"]["source"].tolist()
    assert allocs == [fast, slow]
    assert len(df[df["kind"] == "free"]["source"].unique()) == 2


def test_a_call_through_a_library_is_charged_to_the_users_line(sim):
    buf = ul.DeviceBuffer(size="1MiB")
    with ul.record() as trace:
        line = here()
        with contextlib.closing(buf):   # the standard library calls buf.close(): the user's `with` is the cause
            pass
    assert lines(trace)["free"] == [f"{HERE}:{int(line.rsplit(':', 1)[1])}"]


def helper_that_prefetches(buf):
    buf.prefetch("host")   # the innermost user line is the one named


def test_the_innermost_user_line_is_named(sim):
    buf = ul.DeviceBuffer(size="1MiB")
    buf.prefetch("gpu")
    inner = f"{HERE}:{inspect.getsourcelines(helper_that_prefetches)[1] + 1}"
    with ul.record() as trace:
        helper_that_prefetches(buf)
    assert lines(trace)["prefetch"] == [inner] and lines(trace)["dtoh"] == [inner]


def test_the_python_walk_finds_what_the_compiled_one_finds():
    line = here()
    walked, compiled = sources.python_capture(), sources.capture()
    assert walked == compiled and sources.get_sources().describe(walked).text == line


def test_driver_events_are_charged_to_the_running_cell():
    bus = EventBus()
    seen = []
    bus.subscribe(seen.append)
    try:
        cell = sources.begin_cell(7)
        mine = here()
        own = sources.capture()
        bus.publish(make_events(3, kind=EventKind.HTOD, source=[0, own, 0]))   # the middle one knows its line
    finally:
        sources.end_cells()
    bus.flush()
    got = np.concatenate(seen)["source"]
    assert got.tolist() == [cell, own, cell]
    assert sources.get_sources().describe(cell) == sources.Source("", 0, 7, "")
    assert sources.texts(got) == ["In [7]", mine, "In [7]"]
    bus.publish(make_events(1, kind=EventKind.HTOD))   # no cell runs any more: unknown
    bus.flush()
    assert seen[-1]["source"].tolist() == [0]


def test_a_tool_acting_for_the_user_is_named_not_the_line_or_cell_on_the_stack(sim):
    from uvm_lab.jupyter.comm import PanelSession
    from uvm_lab.jupyter.commands import CONTROLS_SOURCE

    class Sink:
        def send(self, *args, **kwargs): ...
        def on_msg(self, callback): ...
        def on_close(self, callback): ...
        def close(self, *args, **kwargs): ...

    buf = ul.DeviceBuffer(size="1MiB")
    session = PanelSession(Sink(), start=False)
    sources.begin_cell(4)
    try:
        with ul.record() as trace:
            # From the view's controls: charged to them, though a test line and cell 4 are there to take it.
            assert session.handle({"type": "prefetch", "seq": 1, "id": buf.id, "location": "gpu", "first_page": 0,
                                   "pages": None})["ok"]
            assert session.handle({"type": "set_advice", "seq": 2, "id": buf.id, "advice": "read_mostly",
                                   "value": True})["ok"]
            mine = here()
            buf.prefetch("host")   # the user's own call, after: the user's line again
            bus = ul.events.get_bus()
            bus.publish(make_events(1, kind=EventKind.HTOD))   # the driver's, after: the running cell's
            bus.flush()
    finally:
        sources.end_cells()
        session.close()
    got = lines(trace)
    assert got["prefetch"] == [CONTROLS_SOURCE, mine] and got["advice"] == [CONTROLS_SOURCE]
    assert trace.to_pandas()["source"].iloc[-1] == "In [4]"
    # Both walks answer for the line again once the tool is done.
    line = here()
    walked, compiled = sources.python_capture(), sources.capture()
    assert walked == compiled and sources.get_sources().describe(compiled).text == line
    with pytest.raises(InvalidArgumentError, match="non-empty"), sources.acting_for("  "):
        pass


def test_capture_can_be_turned_off(sim):
    sources.set_capturing(False)
    try:
        with ul.record() as trace:
            ul.DeviceBuffer(size="1MiB").close()
    finally:
        sources.set_capturing(True)
    assert sources.capturing()
    assert (trace.events["source"] == sources.running_cell()).all()


def test_the_table_is_bounded_and_counts_what_it_drops():
    table = sources.SourceTable(capacity=2)
    a = table.intern(sources.Source("a.py", 1, None, "f"))
    b = table.intern(sources.Source("a.py", 2, None, "f"))
    assert table.intern(sources.Source("a.py", 1, None, "f")) == a   # seen before: the same id
    assert table.intern(sources.Source("a.py", 3, None, "f")) == 0
    assert (len(table), table.dropped) == (2, 1)
    assert table.texts(np.array([a, b, 0, 99])) == ["a.py:1", "a.py:2", "", ""]
    assert table.cells(np.array([a, 0])) == [None, None]


@pytest.mark.parametrize("call, match", [
    (lambda: sources.get_sources().describe(-1), "no source has id -1"),
    (lambda: sources.get_sources().describe(10**9), "no source has id"),
    (lambda: sources.texts(np.array([1.5])), "integer array"),
    (lambda: sources.begin_cell(-1), "execution count"),
    (lambda: sources.set_capturing("yes"), "True or False"),
    (lambda: sources.set_cell_namer(3), "callable"),
    (lambda: sources.SourceTable(capacity=0), "capacity"),
])
def test_bad_input_is_refused(call, match):
    before = (len(sources.get_sources()), sources.running_cell(), sources.capturing())
    with pytest.raises(InvalidArgumentError, match=match):
        call()
    assert (len(sources.get_sources()), sources.running_cell(), sources.capturing()) == before


def test_a_trace_saved_before_events_had_sources_still_loads(tmp_path):
    old = np.zeros(3, dtype=EVENT_DTYPE_WITHOUT_SOURCE)
    old["kind"], old["bytes"] = EventKind.HTOD, [4096, 8192, 4096]
    np.save(tmp_path / "old.npy", old)
    trace = Trace.load(tmp_path / "old.npy")
    assert trace.summary()["bytes_htod"] == 16384
    assert trace.to_pandas()["source"].tolist() == ["", "", ""]


def test_by_source_totals_what_each_line_moved(sim):
    buf = ul.DeviceBuffer(size="4MiB")
    ul.touch(buf, on="host", mode="write")
    with ul.record() as trace:
        to_gpu = here()
        buf.prefetch("gpu")
        back = here()
        ul.touch(buf, on="host", mode="read")
    table = trace.by_source().set_index("source")
    assert table.loc[to_gpu, "bytes_htod"] == 4 << 20 and table.loc[to_gpu, "cpu_faults"] == 0
    assert table.loc[back, "bytes_dtoh"] == 4 << 20 and table.loc[back, "cpu_faults"] > 0
    assert table["bytes_moved"].sum() == trace.summary()["bytes_htod"] + trace.summary()["bytes_dtoh"]
