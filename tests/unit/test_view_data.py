"""The protocol's data for the lab view: maps as changed runs (decoding them always gives the full
snapshot's map), the timeline query with its per-pixel merging, the device lanes' samples (per GPU), and each
event's cause."""

from __future__ import annotations

import inspect
import time
import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import uvm_lab as ul
from uvm_lab.errors import InvalidArgumentError
from uvm_lab.events import EventKind, MigrationCause, UnobservedCause, make_events
from uvm_lab.events.causes import CAUSE_NAMES, cause_codes
from uvm_lab.events.trace import Trace
from uvm_lab.jupyter.comm import PanelSession
from uvm_lab.jupyter.protocol import CELL_LIMIT, TIMELINE_COLUMNS, apply_runs, encode_runs, pack_states
from uvm_lab.jupyter.timeline import GPU_COUNTERS, SEVERAL, DeviceSeries, EventWindow, device_counts

from .clocks import ManualClock

PAGE = 4096
MiB = 1 << 20


class RecordingComm:
    def __init__(self):
        self.messages = []

    def send(self, data=None, metadata=None, buffers=None):
        self.messages.append((data, [bytes(b) for b in buffers or ()]))

    def on_msg(self, callback):
        self._on_msg = callback

    def on_close(self, callback):
        pass

    def close(self, data=None, metadata=None, buffers=None):
        pass

    def deliver(self, data):
        self._on_msg({"content": {"comm_id": "c0", "data": data}, "buffers": []})


# --- runs -----------------------------------------------------------------------------------------

cells_and_changes = st.integers(1, 400).flatmap(lambda n: st.tuples(
    st.binary(min_size=n, max_size=n),
    st.lists(st.tuples(st.integers(0, n - 1), st.integers(1, 40), st.integers(0, 10)), max_size=12)))


@given(cells_and_changes)
def test_applying_the_runs_of_a_change_gives_the_new_map(case):
    first, changes = case
    old = np.frombuffer(first, np.uint8).copy()
    new = old.copy()
    for start, length, code in changes:
        new[start:start + length] = code
    runs = encode_runs(old, new)
    assert np.array_equal(apply_runs(old, runs), new)
    n = int(runs[:4].view("<u4")[0])
    if np.array_equal(old, new):
        assert n == 0 and len(runs) == 4
    # Never more cells than the map, never more runs than changes.
    assert len(runs) - 4 - 8 * n <= len(new)
    assert n <= max(1, len(changes)) or not changes


def test_runs_carry_only_the_cells_that_changed():
    old = np.zeros(16384, np.uint8)
    new = old.copy()
    new[100:104] = 5
    new[9000] = 1
    runs = encode_runs(old, new)
    assert runs[:4].view("<u4").tolist() == [2]
    assert runs[4:20].view("<u4").tolist() == [100, 9000, 4, 1]
    assert runs[20:].tolist() == [5, 5, 5, 5, 1]


def test_nearby_changes_share_a_run():
    old = np.zeros(64, np.uint8)
    new = old.copy()
    new[[10, 19]] = 1        # 8 unchanged cells apart: one run, the gap sent along
    new[[40, 50]] = 2        # 9 apart: two runs
    runs = encode_runs(old, new)
    n = int(runs[:4].view("<u4")[0])
    assert runs[4:4 + 8 * n].view("<u4").tolist() == [10, 40, 50, 10, 1, 1]


@pytest.mark.parametrize(("cells", "runs", "mentions"), [
    (np.zeros(4, np.uint8), b"\x01\x00", "cannot hold its header"),
    (np.zeros(4, np.uint8), np.array([1, 0], "<u4").tobytes(), "cannot hold its header"),
    (np.zeros(4, np.uint8), np.array([1, 3, 2], "<u4").tobytes() + b"\x01\x01", "do not fit"),
    (np.zeros(4, np.uint8), np.array([1, 0, 2], "<u4").tobytes() + b"\x01", "do not fit"),
    (np.zeros(4, np.int16), np.array([0], "<u4").tobytes(), "1-D uint8"),
])
def test_runs_that_do_not_fit_are_refused(cells, runs, mentions):
    with pytest.raises(InvalidArgumentError, match=mentions):
        apply_runs(cells, runs)


def test_runs_compare_maps_of_one_size():
    with pytest.raises(InvalidArgumentError, match="one size"):
        encode_runs(np.zeros(3, np.uint8), np.zeros(4, np.uint8))


# --- the session's maps, change after change --------------------------------------------------------

@pytest.fixture
def device():
    backend = ul.use_backend("sim", device_memory="128MiB")
    yield backend
    for buf in ul.live_buffers():
        buf.close()


class ViewOfMaps:
    """What the view holds, decoded from the messages exactly as model.ts does."""

    def __init__(self):
        self.maps: dict[int, np.ndarray] = {}

    def read(self, messages):
        for data, buffers in messages:
            if data["type"] == "snapshot":
                self.maps.clear()
            if data["type"] in ("snapshot", "update"):
                for info, payload in zip(data["allocations"], buffers, strict=True):
                    cells = np.frombuffer(payload, np.uint8)
                    if info["encoding"] == "runs":
                        cells = apply_runs(self.maps[info["id"]], cells)
                    assert len(cells) == info["cells"]
                    self.maps[info["id"]] = cells.copy()
            elif data["type"] == "removed":
                for alloc_id in data["ids"]:
                    del self.maps[alloc_id]


operations = st.lists(st.tuples(
    st.sampled_from(["touch gpu", "touch host", "prefetch gpu", "prefetch host", "read_mostly", "free", "new"]),
    st.integers(0, 2), st.integers(0, 600), st.integers(1, 300)), min_size=1, max_size=12)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(operations)
def test_the_maps_decoded_from_changes_are_the_full_snapshots_maps(device, ops):
    for buf in ul.live_buffers():
        buf.close()
    comm = RecordingComm()
    session = PanelSession(comm, start=False)
    try:
        # One buffer of more than CELL_LIMIT pages, so cells of several pages change too.
        buffers = [ul.DeviceBuffer(size=f"{n}KiB", label=f"b{i}") for i, n in enumerate((2400, 70_000, 64))]
        session.handle({"type": "hello", "seq": 0})
        view = ViewOfMaps()
        for kind, which, first, pages in ops:
            live = [b for b in buffers if not b.closed]
            if kind == "new":
                buffers.append(ul.DeviceBuffer(size=f"{pages * 4}KiB", label="new"))
            elif live:
                buf = live[which % len(live)]
                offset = min(first, buf.size // PAGE - 1) * PAGE
                size = min(pages * PAGE, buf.size - offset)
                if kind.startswith("touch"):
                    ul.touch(buf, on=kind.split()[1], mode="write", offset=offset, size=size)
                elif kind.startswith("prefetch"):
                    buf.prefetch(kind.split()[1])
                elif kind == "read_mostly":
                    buf.read_mostly = not buf.read_mostly
                else:
                    buf.close()
            ul.events.get_bus().flush()
            session.flush()
            view.read(comm.messages)
            comm.messages.clear()
            full = {b.id: pack_states(ul.residency(b).states)[1] for b in ul.live_buffers() if b.size}
            assert view.maps.keys() == full.keys()
            for alloc_id, cells in full.items():
                assert np.array_equal(view.maps[alloc_id], cells)
    finally:
        session.close()


def test_an_update_of_a_few_pages_of_a_large_buffer_is_small(device):
    comm = RecordingComm()
    session = PanelSession(comm, start=False)
    try:
        big = ul.DeviceBuffer(size="48MiB", label="big")   # 12288 pages, one cell each
        session.handle({"type": "hello", "seq": 0})
        comm.messages.clear()
        ul.touch(big, on="gpu", mode="write", offset="1MiB", size="16KiB")
        ul.events.get_bus().flush()
        assert session.flush()
        (update, buffers), = comm.messages
        (info,) = update["allocations"]
        assert info["encoding"] == "runs" and info["cells"] == 12288
        assert len(buffers[0]) < 100     # the header and the cells that changed, not 12288 bytes
    finally:
        session.close()


# --- causes ---------------------------------------------------------------------------------------

def _cause(**fields):
    return CAUSE_NAMES[int(cause_codes(make_events(1, **fields))[0])]


@pytest.mark.parametrize(("fields", "cause"), [
    ({"kind": EventKind.GPU_PAGE_FAULT}, "demand fault"),
    ({"kind": EventKind.CPU_PAGE_FAULT}, "demand fault"),
    ({"kind": EventKind.HTOD, "flags": MigrationCause.COHERENCE}, "demand fault"),
    ({"kind": EventKind.HTOD, "flags": MigrationCause.USER}, "prefetch"),
    ({"kind": EventKind.HTOD, "flags": MigrationCause.PREFETCH}, "prefetch"),
    ({"kind": EventKind.PREFETCH}, "prefetch"),
    ({"kind": EventKind.DTOH, "flags": MigrationCause.EVICTION}, "eviction"),
    ({"kind": EventKind.INVALIDATE}, "coherence"),
    ({"kind": EventKind.UNOBSERVED, "flags": UnobservedCause.COLLAPSE}, "coherence"),
    ({"kind": EventKind.UNOBSERVED, "flags": UnobservedCause.KERNEL}, "inferred"),
    ({"kind": EventKind.THRASHING}, "thrashing"),
    ({"kind": EventKind.REMOTE_MAP}, "remote map"),
    ({"kind": EventKind.DTOH, "flags": MigrationCause.ACCESS_COUNTERS}, "remote map"),
    ({"kind": EventKind.HTOD, "flags": MigrationCause.USER_INFERRED}, "inferred"),
    ({"kind": EventKind.DTOH, "flags": MigrationCause.INFERRED}, "inferred"),
    ({"kind": EventKind.DTOH, "flags": MigrationCause.UNKNOWN}, "inferred"),
    ({"kind": EventKind.ALLOC}, "allocation"),
    ({"kind": EventKind.FREE}, "allocation"),
    ({"kind": EventKind.ADVICE}, "advice"),
])
def test_every_event_has_one_cause(fields, cause):
    assert _cause(**fields) == cause


def test_causes_refuse_what_is_not_records():
    with pytest.raises(InvalidArgumentError, match="EVENT_DTYPE"):
        cause_codes(np.zeros(3))


# --- the timeline ---------------------------------------------------------------------------------

BASE = 1 << 40   # buffer n lies at BASE * n: an address far from any real one


def _window_with_buffers(*ids, capacity=1 << 19):
    """An EventWindow that has seen buffers ``ids`` allocated (lane n holds the addresses BASE * n on)."""
    window = EventWindow(capacity)
    # Allocated long after every window the tests ask for: only the lanes they set up are in view.
    window.feed(make_events(len(ids), kind=EventKind.ALLOC, address=[BASE * i for i in ids], bytes=BASE,
                            alloc_id=list(ids), start=10**15, end=10**15))
    return window


def _events(starts, durations, lanes, kind=EventKind.HTOD, flags=MigrationCause.COHERENCE, nbytes=PAGE, dst=0):
    """Records at ``starts`` in buffers ``lanes`` (their alloc_id the segment's, 99, as the backends write)."""
    starts = np.asarray(starts)
    return make_events(len(starts), kind=kind, flags=flags, start=starts, end=starts + np.asarray(durations),
                       address=BASE * np.asarray(lanes, dtype=np.uint64) + PAGE, alloc_id=99, bytes=nbytes,
                       value=nbytes, src=-1, dst=dst)


def test_events_narrower_than_a_pixel_merge_per_lane_pixel_and_cause():
    window = _window_with_buffers(1, 2)
    # 100 ns a pixel. Lane 1: five 10-ns faults in pixel 0, one in pixel 3; lane 2: two in pixel 0.
    window.feed(_events([0, 10, 20, 30, 40, 300], 10, 1))
    window.feed(_events([5, 15], 10, 2))
    window.feed(_events([50], 10, 1, flags=MigrationCause.USER))   # another cause: its own row
    window.feed(_events([600], 250, 1))                            # wider than a pixel: its own row
    cols, events, truncated = window.query(0, 1000, 10, None)
    assert list(cols) == [name for name, _ in TIMELINE_COLUMNS]
    rows = sorted(zip(cols["lane"].tolist(), cols["start"].tolist(), cols["end"].tolist(), cols["count"].tolist(),
                      cols["bytes"].tolist(), [CAUSE_NAMES[c] for c in cols["cause"]], strict=True))
    assert rows == [
        (1, 0, 50, 5, 5 * PAGE, "demand fault"),
        (1, 50, 60, 1, PAGE, "prefetch"),
        (1, 300, 310, 1, PAGE, "demand fault"),
        (1, 600, 850, 1, PAGE, "demand fault"),
        (2, 5, 25, 2, 2 * PAGE, "demand fault"),
    ]
    assert (events, truncated) == (10, 0)
    first = int(np.flatnonzero(cols["count"] == 5)[0])     # the five merged faults: the pages they touched
    assert (cols["address"][first], cols["reach"][first]) == (BASE + PAGE, BASE + 2 * PAGE)
    assert cols["start"].tolist() == sorted(cols["start"].tolist())


def test_a_merged_row_names_src_dst_and_source_only_where_its_events_agree():
    window = _window_with_buffers(1)
    first = _events([0, 1], 1, 1, dst=0)
    first["source"] = 7
    second = _events([2], 1, 1, dst=1)
    second["source"] = 7
    window.feed(first)
    window.feed(second)
    cols, _, _ = window.query(0, 100, 1, [1])
    assert cols["src"].tolist() == [-1] and cols["dst"].tolist() == [SEVERAL] and cols["source"].tolist() == [7]
    third = _events([3], 1, 1, dst=1)
    third["source"] = 8
    window.feed(third)
    cols, _, _ = window.query(0, 100, 1, [1])
    assert cols["source"].tolist() == [0]    # several lines: none named


def test_the_timeline_keeps_the_window_and_the_lanes_asked_for():
    window = _window_with_buffers(1, 2)
    window.feed(_events([50, 500, 1500], 10, [1, 2, 1]))
    window.feed(_events([600], 10, [7]))    # no buffer there: lane 0
    cols, events, _ = window.query(400, 1000, 100, [2, 3])
    assert cols["lane"].tolist() == [2] and events == 1
    cols, events, _ = window.query(400, 2000, 100, None)
    assert cols["start"].tolist() == [500, 600, 1500] and cols["lane"].tolist() == [2, 0, 1]


def test_a_lane_is_the_buffer_the_address_is_in_while_it_lives():
    window = _window_with_buffers(1)
    freed = make_events(1, kind=EventKind.FREE, address=BASE, bytes=BASE, alloc_id=1, start=20, end=20)
    # One batch: a record before the free, the free, a record after it.
    window.feed(np.concatenate([_events([10], 1, [1]), freed, _events([30], 1, [1])]))
    cols, _, _ = window.query(5, 100, 100, None)
    assert list(zip(cols["start"].tolist(), cols["lane"].tolist(), strict=True)) == [(10, 1), (20, 1), (30, 0)]


def test_each_buffer_counts_only_its_own_traffic_across_many_made_and_freed():
    # More buffers than fit the first table, freed and made again in turns: a freed buffer's counts go with it,
    # and one made after it starts from nothing.
    window, expected = EventWindow(), {}
    for rnd in range(3):
        ids = list(range(1 + 40 * rnd, 41 + 40 * rnd))
        window.feed(make_events(len(ids), kind=EventKind.ALLOC, address=[BASE * i for i in ids], bytes=BASE,
                                alloc_id=ids, start=10**15, end=10**15))
        window.feed(_events(np.arange(len(ids)), 1, ids, nbytes=np.array(ids) * PAGE))
        window.feed(_events(np.arange(len(ids) // 2), 1, ids[::2], kind=EventKind.DTOH, nbytes=PAGE))
        assert {window.requested(i) for i in ids} == {None}   # a row given back holds no earlier buffer's prefetch
        window.feed(make_events(len(ids[::3]), kind=EventKind.PREFETCH, address=[BASE * i for i in ids[::3]],
                                bytes=PAGE, dst=[-1 if i % 2 else 0 for i in ids[::3]]))
        for i in ids:
            expected[i] = (i * PAGE, PAGE if (i - ids[0]) % 2 == 0 else 0)
            traffic = window.traffic(i)
            assert (traffic["htod_bytes"], traffic["dtoh_bytes"]) == expected[i]
            assert window.requested(i) == (None if (i - ids[0]) % 3 else "host" if i % 2 else "gpu:0")
        freed = ids[: len(ids) // 2]
        window.feed(make_events(len(freed), kind=EventKind.FREE, address=[BASE * i for i in freed], bytes=BASE,
                                alloc_id=freed, start=10**15, end=10**15))
        for i in freed:
            assert window.traffic(i)["htod_bytes"] == 0 and window.requested(i) is None
        for i in ids[len(ids) // 2:]:
            assert (window.traffic(i)["htod_bytes"], window.traffic(i)["dtoh_bytes"]) == expected[i]

def test_the_timeline_holds_a_bounded_number_of_events_and_counts_the_rest():
    window = EventWindow(capacity=5)
    window.feed(_events(range(3), 1, 1))
    window.feed(_events(range(3, 7), 1, 1))
    assert (window.held, window.dropped) == (5, 2)
    cols, events, _ = window.query(0, 100, 100, None)
    assert cols["start"].tolist() == [2, 3, 4, 5, 6] and events == 5
    window.feed(_events(range(7, 20), 1, 1))
    assert (window.held, window.dropped) == (5, 15)
    assert window.extent() == (15, 20)     # the oldest held starts at 15; the newest ends at 19 + 1


def test_what_updates_read_in_and_no_query_built_is_bounded_and_still_counted():
    window = _window_with_buffers(1, capacity=5)
    cursor = 0
    for start in range(0, 3000, 3):   # a view's updates, and no timeline query, while a loop runs
        window.feed(_events([start, start + 1, start + 2], 1, 1))
        cursor, lanes = window.changed_lanes(cursor)
        assert lanes == {1}
    assert window.traffic(1)["htod_bytes"] == 3000 * PAGE   # every record counted, those dropped too
    cols, events, _ = window.query(0, 10_000, 10_000, None)
    assert cols["start"].tolist() == [2995, 2996, 2997, 2998, 2999] and events == 5
    assert (window.held, window.dropped) == (5, 3001 - 5)   # the buffer's ALLOC was read in too


def test_a_window_that_no_query_builds_holds_no_more_than_its_capacity():
    window = _window_with_buffers(1, capacity=5)

    def updates(start: int, stop: int) -> None:
        cursor = 0
        for at in range(start, stop, 3):
            window.feed(_events([at, at + 1, at + 2], 1, 1))
            cursor, _ = window.changed_lanes(cursor)

    updates(0, 3000)
    window.changed_lanes(0)   # as a reader further behind than the log: every pass compiled before memory is traced
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        updates(3000, 30_000)   # 27,000 records more (1.7 MB as records), none of them asked for by a query
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert after - before < 64_000
    assert window.traffic(1)["htod_bytes"] == 30_000 * PAGE


def test_an_answer_carries_at_most_max_rows(monkeypatch):
    window = _window_with_buffers(1)
    monkeypatch.setattr(EventWindow, "MAX_ROWS", 3)
    window.feed(_events(range(0, 1000, 100), 1, 1))
    cols, events, truncated = window.query(0, 1000, 1000, [1])
    assert cols["start"].tolist() == [0, 100, 200] and (events, truncated) == (10, 7)


def test_the_by_source_table_is_what_the_trace_says_of_the_same_events(device):
    window = EventWindow()
    with ul.record() as trace:
        a, b = ul.DeviceBuffer(size="2MiB", label="a"), ul.DeviceBuffer(size="1MiB", label="b")
        ul.touch(a, on="gpu", mode="write")
        a.prefetch("host")
        ul.touch(b, on="gpu", mode="read")
        ul.events.get_bus().flush()
    window.feed(trace.events)
    ids, table, others = window.by_source(0, 2**62, None)
    expected = trace.by_source()
    assert others == 0 and len(ids) == len(expected) >= 3
    got = dict(zip(ul.events.sources.texts(ids), table.tolist(), strict=True))
    for row in expected.itertuples():
        assert got[row.source] == [row.events, row.gpu_faults, row.cpu_faults, row.bytes_htod, row.bytes_dtoh,
                                   row.bytes_dtod], row.source
    # The most bytes moved first; a limit keeps the top lines and counts the rest.
    moved = table[:, 3:].sum(axis=1)
    assert (np.diff(moved) <= 0).all() and moved[0] == expected["bytes_moved"].max() > 0
    top, _, left = window.by_source(0, 2**62, None, limit=1)
    assert top.tolist() == ids[:1].tolist() and left == len(ids) - 1
    # Only the lanes asked for: b's line is not among a's.
    only_a, _, _ = window.by_source(0, 2**62, [a.id])
    assert "test_view_data.py" in " ".join(ul.events.sources.texts(only_a))
    assert set(only_a.tolist()) < set(ids.tolist())


@pytest.mark.parametrize("capacity", [0, -1, 2.5, True, "9"])
def test_a_window_needs_a_whole_capacity(capacity):
    with pytest.raises(InvalidArgumentError, match="capacity"):
        EventWindow(capacity)


def test_a_timeline_query_is_answered_with_columns_and_changes_nothing(device):
    buf = ul.DeviceBuffer(size="1MiB", label="t")
    touched_at = inspect.currentframe().f_lineno + 1
    ul.touch(buf, on="gpu", mode="write")
    ul.events.get_bus().flush()
    comm = RecordingComm()
    session = PanelSession(comm, start=False)
    try:
        published = ul.events.get_bus().published
        states = ul.residency(buf).states.tobytes()
        end = ul.get_backend().now_ns() + 1
        result = session.handle({"type": "timeline", "seq": 4, "start": 0, "end": end, "width": 500,
                                 "lanes": [buf.id]})
        assert result["ok"], result
        (rows, buffers), _ = comm.messages
        assert rows["type"] == "timeline" and rows["seq"] == 4 and rows["rows"] >= 1
        # What the window holds reaches at least as far as what it sent, each way.
        assert rows["first"] <= np.frombuffer(buffers[0], "<f8").min()
        assert rows["last"] >= np.frombuffer(buffers[1], "<f8").max()
        assert rows["columns"] == [name for name, _ in TIMELINE_COLUMNS] and len(buffers) == len(TIMELINE_COLUMNS)
        cols = {name: np.frombuffer(b, dtype) for (name, dtype), b in zip(TIMELINE_COLUMNS, buffers, strict=True)}
        assert set(cols["lane"].tolist()) == {buf.id}
        causes = {CAUSE_NAMES[c] for c in cols["cause"]}
        # Each row names the line of code behind it, and the answer carries that line's text.
        line = f"test_view_data.py:{touched_at}"
        assert {rows["sources"][str(s)] for s in cols["source"][cols["kind"] == EventKind.GPU_PAGE_FAULT]} == {line}
        assert "demand fault" in causes and "allocation" in causes
        # The window's lines by what they caused: the touch's line took its faults.
        by_line = {rows["sources"][str(r[0])]: r[1:] for r in rows["by_source"]}
        assert by_line[line][1] > 0 and by_line[line][2] == 0   # GPU faults, no CPU faults
        assert rows["by_source_others"] == 0
        assert cols["bytes"][cols["kind"] == EventKind.HTOD].sum() == 0    # a write on the GPU of fresh pages
        assert ul.events.get_bus().published == published
        assert ul.residency(buf).states.tobytes() == states
    finally:
        session.close()


def test_the_rate_command_sets_the_update_interval(device):
    session = PanelSession(RecordingComm(), start=False)
    try:
        assert session.handle({"type": "rate", "seq": 1, "interval_ms": 500})["ok"]
        assert session.interval == 0.5
        assert not session.handle({"type": "rate", "seq": 2, "interval_ms": 20})["ok"]
        assert session.interval == 0.5
    finally:
        session.close()


# --- the device lanes -------------------------------------------------------------------------------

@pytest.mark.parametrize("count", ["feed", "add"])   # staged by a publisher, or counted at once by a reader
def test_a_sample_sums_its_interval_and_views_sharing_it_do_not_split_it(count):
    clock = ManualClock(now=0.0)
    series = DeviceSeries(interval=0.1, clock=clock)
    counted = getattr(series, count)
    counted(_events([0, 1], 1, 1, kind=EventKind.HTOD, nbytes=PAGE))
    counted(_events([2], 1, 1, kind=EventKind.DTOH, flags=MigrationCause.EVICTION, nbytes=2 * PAGE))
    counted(make_events(2, kind=EventKind.GPU_PAGE_FAULT, value=3))
    counted(make_events(1, kind=EventKind.CPU_PAGE_FAULT, value=1))
    counted(make_events(0))
    assert series.close_interval(1000, used=[10], total=[100], allocated=150)
    clock.now = 0.05
    counted(_events([5], 1, 1, kind=EventKind.HTOD, nbytes=PAGE))
    assert not series.close_interval(2000, used=[20], total=[100])    # another view, too soon: same interval
    clock.now = 0.2
    assert series.close_interval(3000, used=[30], total=[100])
    samples, next_index = series.since(0)
    assert samples == [
        {"time": 1000, "used": [10], "total": [100], "allocated": 150, "htod_bytes": [2 * PAGE],
         "dtoh_bytes": [2 * PAGE], "dtod_bytes": [0], "gpu_faults": [6], "cpu_faults": 1, "evicted_bytes": [2 * PAGE]},
        {"time": 3000, "used": [30], "total": [100], "allocated": 0, "htod_bytes": [PAGE], "dtoh_bytes": [0],
         "dtod_bytes": [0], "gpu_faults": [0], "cpu_faults": 0, "evicted_bytes": [0]},
    ]
    assert next_index == 2 and series.since(1)[0] == samples[1:]


def test_the_series_keeps_a_bounded_number_of_samples_and_counts_the_rest():
    clock = ManualClock(now=0.0)
    series = DeviceSeries(capacity=2, clock=clock)
    for t in range(5):
        clock.now = t
        series.close_interval(t, [0], [1])
    samples, next_index = series.since(0)
    assert [s["time"] for s in samples] == [3, 4] and series.dropped == 3 and next_index == 5
    # A view up to date gets the newest alone, and one past the end none.
    assert [s["time"] for s in series.since(4)[0]] == [4] and series.since(5) == ([], 5)


def test_updates_carry_the_device_samples(device):
    clock = ManualClock(now=0.0)
    window, series = EventWindow(), DeviceSeries(clock=clock)
    comm = RecordingComm()
    session = PanelSession(comm, start=False, timeline=(window, series))
    try:
        with ul.events.get_bus().subscribe(series.feed):
            buf = ul.DeviceBuffer(size="8MiB", label="s")
            ul.touch(buf, on="host", mode="write")
            session.handle({"type": "hello", "seq": 0})
            snapshot = comm.messages[0][0]
            assert [s["used"] for s in snapshot["samples"]] == [[0]] and snapshot["samples_dropped"] == 0
            clock.now = 1
            buf.prefetch("gpu")
            ul.events.get_bus().flush()
            comm.messages.clear()
            session.flush()
        update = next(d for d, _ in comm.messages if d["type"] == "update")
        (sample,) = update["samples"]
        assert (sample["total"], sample["used"], sample["allocated"]) == ([128 * 2**20], [8 * 2**20], 8 * 2**20)
        assert (sample["htod_bytes"], sample["dtoh_bytes"], sample["dtod_bytes"]) == ([8 * 2**20], [0], [0])
        assert sample["time"] == ul.get_backend().now_ns()
    finally:
        session.close()


def test_an_update_reads_the_devices_memory_only_with_a_new_sample(device):
    clock = ManualClock(now=0.0)
    comm = RecordingComm()
    session = PanelSession(comm, start=False, timeline=(EventWindow(), DeviceSeries(interval=0.1, clock=clock)))
    try:
        buf = ul.DeviceBuffer(size="8MiB", label="s")
        session.handle({"type": "hello", "seq": 0})   # the snapshot closes the first interval
        comm.messages.clear()
        clock.now = 0.05                              # within it: the map changes, no sample is due
        buf.prefetch("gpu")
        session.flush()
        (update,) = [d for d, _ in comm.messages if d["type"] == "update"]
        assert [a["id"] for a in update["allocations"]] == [buf.id]
        assert update["samples"] == [] and "device" not in update   # the view keeps the memory it last had
        comm.messages.clear()
        clock.now = 0.1                               # the interval ends: a sample, and the memory it read
        session.flush()
        (update,) = [d for d, _ in comm.messages if d["type"] == "update"]
        (sample,) = update["samples"]
        free, total = ul.get_backend().mem_info()
        assert update["device"]["free"] == free and sample["used"] == [total - free] == [8 * 2**20]
    finally:
        session.close()


@pytest.fixture
def two_gpus():
    backend = ul.use_backend("sim", devices=2, device_memory="64MiB")
    yield backend
    for buf in ul.live_buffers():
        buf.close()


def test_two_gpus_samples_give_each_gpu_its_memory_and_moves(two_gpus):
    clock = ManualClock(now=0.0)
    window, series = EventWindow(), DeviceSeries(clock=clock)
    comm = RecordingComm()
    session = PanelSession(comm, start=False, timeline=(window, series))
    bus = ul.events.get_bus()

    def next_sample():
        clock.now += 1
        bus.flush()
        comm.messages.clear()
        session.flush()
        (sample,) = next(d for d, _ in comm.messages if d["type"] == "update")["samples"]
        return sample

    try:
        with bus.subscribe(series.feed), bus.subscribe(window.feed), ul.record() as trace:
            buf = ul.DeviceBuffer(size="8MiB", label="peer")
            ul.touch(buf, on="host", mode="write")
            session.handle({"type": "hello", "seq": 0})
            snapshot = comm.messages[0][0]
            assert snapshot["device"]["device_count"] == 2
            assert snapshot["device"]["devices"] == [{"free": 64 * MiB, "total": 64 * MiB}] * 2
            assert [s["used"] for s in snapshot["samples"]] == [[0, 0]]
            buf.prefetch("gpu:0")      # host -> GPU 0
            first = next_sample()
            buf.prefetch("gpu:1")      # GPU 0 -> GPU 1, over the peer link
            second = next_sample()
            ul.touch(buf, on="gpu:0", mode="read")   # GPU 0 faults, and the pages come back from GPU 1
            third = next_sample()
        assert first["htod_bytes"] == [8 * MiB, 0] and first["dtod_bytes"] == [0, 0]
        assert first["used"] == [8 * MiB, 0] and first["total"] == [64 * MiB] * 2
        assert second["dtod_bytes"] == [0, 8 * MiB] and second["htod_bytes"] == second["dtoh_bytes"] == [0, 0]
        assert second["used"] == [0, 8 * MiB]      # GPU 1's memory grew by what moved, GPU 0's was given back
        assert third["dtod_bytes"] == [8 * MiB, 0] and third["gpu_faults"][0] > 0 == third["gpu_faults"][1]
        # Every byte the trace moved between the GPUs is in the samples, counted once.
        assert sum(s["dtod_bytes"][gpu] for s in (first, second, third) for gpu in (0, 1)) == \
            trace.summary()["bytes_dtod"]
        # And in the buffer's own traffic: both peer moves, by cause (the prefetch's, then the fault's).
        traffic = window.traffic(buf.id)
        assert traffic["dtod_bytes"] == 16 * MiB == trace.summary()["bytes_dtod"]
        by_cause = dict(zip(CAUSE_NAMES, traffic["by_cause"], strict=True))
        assert by_cause["prefetch"][3] == 8 * MiB and by_cause["demand fault"][3] == 8 * MiB
    finally:
        session.close()


def test_a_one_gpu_sample_lists_one_gpu(device):
    series = DeviceSeries(clock=ManualClock(now=0.0))
    series.feed(_events([0], 1, 1, kind=EventKind.DTOH, flags=MigrationCause.EVICTION, nbytes=PAGE))
    assert series.close_interval(5, used=[3], total=[9])
    (sample,) = series.since(0)[0]
    assert {name: value for name, value in sample.items() if isinstance(value, list)} == {
        "used": [3], "total": [9], "htod_bytes": [0], "dtoh_bytes": [PAGE], "dtod_bytes": [0], "gpu_faults": [0],
        "evicted_bytes": [PAGE]}


def _reference_counts(records, gpus):
    """The attribution rule spelled out record by record, to check the vectorised one against."""
    counts = {name: {} for name in GPU_COUNTERS}
    cpu_faults = 0
    for r in records:
        kind, flags, src, dst = int(r["kind"]), int(r["flags"]), int(r["src"]), int(r["dst"])
        eviction = kind == EventKind.DTOH and flags & ~0x80 == MigrationCause.EVICTION
        for name, wanted, gpu, amount in (("htod_bytes", kind == EventKind.HTOD, dst, r["bytes"]),
                                          ("dtoh_bytes", kind == EventKind.DTOH, src, r["bytes"]),
                                          ("evicted_bytes", eviction, src, r["bytes"]),
                                          ("dtod_bytes", kind == EventKind.DTOD, dst, r["bytes"]),
                                          ("gpu_faults", kind == EventKind.GPU_PAGE_FAULT, dst, r["value"])):
            if wanted:
                counts[name][max(gpu, 0)] = counts[name].get(max(gpu, 0), 0) + int(amount)
        cpu_faults += int(r["value"]) if kind == EventKind.CPU_PAGE_FAULT else 0
    width = max([gpus, *(gpu + 1 for by_gpu in counts.values() for gpu in by_gpu)])
    return [[counts[name].get(gpu, 0) for gpu in range(width)] for name in GPU_COUNTERS], cpu_faults


records_of_several_gpus = st.lists(st.tuples(
    st.sampled_from([EventKind.HTOD, EventKind.DTOH, EventKind.DTOD, EventKind.GPU_PAGE_FAULT,
                     EventKind.CPU_PAGE_FAULT, EventKind.PREFETCH, EventKind.REMOTE_MAP]),
    st.sampled_from([0, MigrationCause.USER, MigrationCause.EVICTION, MigrationCause.EVICTION | 0x80,
                     MigrationCause.USER_INFERRED]),
    st.integers(-2, 6), st.integers(-2, 6), st.integers(0, 1 << 30), st.integers(0, 64)), max_size=40)


@given(records_of_several_gpus, st.integers(0, 3))
def test_each_record_counts_for_the_gpu_the_one_rule_names(rows, gpus):
    records = make_events(len(rows))
    for i, (kind, flags, src, dst, nbytes, value) in enumerate(rows):
        records[i] = make_events(1, kind=kind, flags=flags, src=src, dst=dst, bytes=nbytes, value=value)[0]
    table, cpu_faults = device_counts(records, gpus)
    assert (table.tolist(), cpu_faults) == _reference_counts(records, gpus)
    # Summed over the GPUs: the trace's own totals, nothing lost past the GPUs asked for.
    summary = Trace(records).summary()
    by_name = dict(zip(GPU_COUNTERS, table.sum(axis=1).tolist(), strict=True))
    assert (by_name["htod_bytes"], by_name["dtoh_bytes"], by_name["dtod_bytes"], by_name["gpu_faults"],
            cpu_faults) == (summary["bytes_htod"], summary["bytes_dtoh"], summary["bytes_dtod"],
                            summary["gpu_faults"], summary["cpu_faults"])


def test_a_record_on_a_gpu_past_the_ones_given_widens_the_sample_and_crashes_nothing():
    series = DeviceSeries(clock=ManualClock(now=0.0))
    series.feed(make_events(1, kind=EventKind.DTOD, src=0, dst=3, bytes=PAGE, value=PAGE))
    assert series.close_interval(1, used=[10, 20], total=[100, 100])
    (sample,) = series.since(0)[0]
    assert sample["dtod_bytes"] == [0, 0, 0, PAGE]
    assert sample["used"] == [10, 20, 0, 0] and sample["total"] == [100, 100, 0, 0]   # not known: 0
    assert len(sample["htod_bytes"]) == len(sample["gpu_faults"]) == 4


@pytest.mark.parametrize(("used", "total", "mentions"), [
    (5, [9], "used must be a list of bytes per GPU"),
    ([1, 2], [9], "used and total must give the same GPUs, got 2 and 1"),
    ([-1], [9], "used must be a list"),
    ([1], ["9"], "total must be a list"),
    ([True], [9], "used must be a list"),
])
def test_bad_memory_per_gpu_is_refused(used, total, mentions):
    series = DeviceSeries(clock=ManualClock(now=0.0))
    with pytest.raises(InvalidArgumentError, match=mentions):
        series.close_interval(1, used=used, total=total)
    assert series.since(0)[0] == []


def test_each_allocation_reports_its_faults_and_bytes_by_cause(device):
    window = EventWindow()
    comm = RecordingComm()
    session = PanelSession(comm, start=False, timeline=(window, DeviceSeries(clock=ManualClock(now=0.0))))
    try:
        with ul.events.get_bus().subscribe(window.feed):
            buf = ul.DeviceBuffer(size="2MiB", label="t")
            untouched = ul.DeviceBuffer(size="1MiB", label="o")
            ul.touch(buf, on="host", mode="write")
            ul.touch(buf, on="gpu", mode="read")      # faults on the GPU, pages move to it
            buf.prefetch("host")                      # and back, by request
            ul.events.get_bus().flush()
            session.handle({"type": "hello", "seq": 0})
        infos = {a["label"]: a["traffic"] for a in comm.messages[0][0]["allocations"]}
        with ul.record() as trace:   # what the same steps record, for the expected figures
            again = ul.DeviceBuffer(size="2MiB", label="again")
            ul.touch(again, on="host", mode="write")
            ul.touch(again, on="gpu", mode="read")
            again.prefetch("host")
        summary = trace.summary()
        traffic = infos["t"]
        assert traffic["htod_bytes"] == summary["bytes_htod"] > 0
        assert traffic["dtoh_bytes"] == summary["bytes_dtoh"] > 0
        assert traffic["faults"] == summary["gpu_faults"] + summary["cpu_faults"] > 0
        by_cause = dict(zip(CAUSE_NAMES, traffic["by_cause"], strict=True))
        assert by_cause["demand fault"][1] > 0 and by_cause["prefetch"][2] == traffic["dtoh_bytes"]
        requested = {a["label"]: a["requested"] for a in comm.messages[0][0]["allocations"]}
        assert requested == {"t": "host", untouched.label: None}
        assert infos[untouched.label] == {"faults": 0, "htod_bytes": 0, "dtoh_bytes": 0, "dtod_bytes": 0,
                                      "by_cause": [[0, 0, 0, 0]] * 9}
    finally:
        session.close()


def test_a_prefetch_of_a_page_range_moves_those_pages_only(device):
    buf = ul.DeviceBuffer(size=10 * PAGE + 100, label="r")    # 11 pages, the last one short
    ul.touch(buf, on="host", mode="write")
    session = PanelSession(RecordingComm(), start=False)
    try:
        result = session.handle({"type": "prefetch", "seq": 1, "id": buf.id, "location": "gpu", "first_page": 2,
                                 "pages": 3})
        assert result["ok"], result
        codes = ul.residency(buf).categories().tolist()
        assert codes == [1, 1, 5, 5, 5, 1, 1, 1, 1, 1, 1]     # host, host, gpu:0 x3, host ...
        result = session.handle({"type": "prefetch", "seq": 2, "id": buf.id, "location": "gpu", "first_page": 9,
                                 "pages": 2})                   # to the end, the short page included
        assert result["ok"], result
        assert ul.residency(buf).categories().tolist()[9:] == [5, 5]
        before = ul.residency(buf).states.tobytes()
        for first, pages, mentions in [(9, 3, "run past the last page"), (11, None, "is not a page of")]:
            result = session.handle({"type": "prefetch", "seq": 3, "id": buf.id, "location": "host",
                                     "first_page": first, "pages": pages})
            assert not result["ok"] and result["error"]["type"] == "InvalidArgumentError"
            assert mentions in result["error"]["message"] and "11 pages" in result["error"]["message"]
        assert ul.residency(buf).states.tobytes() == before
    finally:
        session.close()


def test_the_pages_query_reads_a_large_allocations_pages_one_byte_each(device):
    buf = ul.DeviceBuffer(size=(CELL_LIMIT + 40) * PAGE, label="big")   # more pages than a map has cells
    ul.touch(buf, on="gpu", mode="write", offset=37 * PAGE, size=3 * PAGE)
    comm = RecordingComm()
    session = PanelSession(comm, start=False)
    try:
        result = session.handle({"type": "pages", "seq": 5, "id": buf.id, "first_page": 30,
                                 "pages": CELL_LIMIT})
        assert result["ok"], result
        (header, buffers), _ = comm.messages
        assert (header["type"], header["seq"], header["id"], header["first_page"], header["pages"]) == \
            ("pages", 5, buf.id, 30, CELL_LIMIT)
        assert header["time"] <= ul.get_backend().now_ns()
        codes = np.frombuffer(buffers[0], np.uint8)
        assert codes.tolist() == ul.residency(buf).categories()[30:30 + CELL_LIMIT].tolist()
        assert 7 in np.flatnonzero(codes == 5) and (codes == 0).any()   # page-exact: GPU 0's among untouched
        # Past the end: the typed error, and nothing sent.
        sent = len(comm.messages)
        result = session.handle({"type": "pages", "seq": 6, "id": buf.id, "first_page": 41,
                                 "pages": CELL_LIMIT})
        assert not result["ok"] and result["error"]["type"] == "InvalidArgumentError"
        assert "run past the last page" in result["error"]["message"] and len(comm.messages) == sent + 1
    finally:
        session.close()


def test_maps_the_view_shows_come_first_and_the_others_catch_up(device, monkeypatch):
    import uvm_lab.jupyter.comm as comm_module

    monkeypatch.setattr(comm_module, "OTHERS_PER_SECOND", 0)
    shown, hidden = ul.DeviceBuffer(size="1MiB", label="shown"), ul.DeviceBuffer(size="1MiB", label="hidden")
    comm, view = RecordingComm(), ViewOfMaps()
    session = PanelSession(comm, start=False)
    try:
        session.handle({"type": "hello", "seq": 0})
        assert session.handle({"type": "watch", "seq": 1, "ids": [shown.id]})["ok"]
        for buf in (shown, hidden):
            ul.touch(buf, on="gpu", mode="write")
        ul.events.get_bus().flush()
        session.flush()
        view.read(comm.messages)
        comm.messages.clear()
        assert view.maps[shown.id].tolist() == pack_states(ul.residency(shown).states)[1].tolist()
        assert view.maps[hidden.id].tolist() != pack_states(ul.residency(hidden).states)[1].tolist()   # not yet
        # Watching every map again (the sidebar's way): the other catches up at the next update.
        assert session.handle({"type": "watch", "seq": 2, "ids": None})["ok"]
        session.flush()
        view.read(comm.messages)
        assert view.maps[hidden.id].tolist() == pack_states(ul.residency(hidden).states)[1].tolist()
    finally:
        session.close()


def test_a_panel_that_shows_every_map_reads_a_bounded_few_an_update_the_longest_waiting_first(device, monkeypatch):
    import uvm_lab.jupyter.comm as comm_module

    monkeypatch.setattr(comm_module, "MAPS_PER_UPDATE", 2)
    bufs = [ul.DeviceBuffer(size="1MiB", label=f"b{i}") for i in range(5)]
    comm, view = RecordingComm(), ViewOfMaps()
    session = PanelSession(comm, start=False)   # no watch: the sidebar's way, every map shown
    try:
        session.handle({"type": "hello", "seq": 0})
        for buf in bufs:
            ul.touch(buf, on="gpu", mode="write")
        ul.events.get_bus().flush()

        def current() -> list[bool]:
            view.read(comm.messages)
            comm.messages.clear()
            return [view.maps[b.id].tolist() == pack_states(ul.residency(b).states)[1].tolist() for b in bufs]

        session.flush()
        assert current() == [True, True, False, False, False]
        session.flush()
        assert current() == [True, True, True, True, False]
        session.flush()
        assert all(current())
    finally:
        session.close()


def test_an_idle_kernel_still_sends_device_samples(device):
    clock = ManualClock(now=0.0)
    window, series = EventWindow(), DeviceSeries(clock=clock)
    comm = RecordingComm()
    session = PanelSession(comm, timeline=(window, series), idle=0.01)   # its own thread, no event to wake it
    try:
        session.handle({"type": "hello", "seq": 0})
        samples = []
        for _ in range(500):   # a wait for the session's thread, not a measure of its speed
            clock.now += 1
            samples = [s for d, _ in list(comm.messages) if d["type"] == "update" for s in d["samples"]]
            if len(samples) >= 2:
                break
            time.sleep(0.01)
        assert len(samples) >= 2
        assert all(d["allocations"] == [] for d, _ in list(comm.messages) if d["type"] == "update")
    finally:
        session.close()
