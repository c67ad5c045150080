"""The kernel end of the lab panel, driven through a recording fake comm on the simulated device."""

from __future__ import annotations

import contextvars
import json
import threading
import time
import types

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import uvm_lab as ul
from uvm_lab.jupyter import comm as lab_comm
from uvm_lab.jupyter.comm import PanelSession, register_comm_target
from uvm_lab.jupyter.dashboard import collect
from uvm_lab.jupyter.protocol import CELL_LIMIT, PROTOCOL_VERSION, apply_runs
from uvm_lab.jupyter.timeline import DeviceSeries, EventWindow
from uvm_lab.page_states import CATEGORY_NAMES, categories

from .clocks import ManualClock
from .waiting import eventually

PAGE = 4096
# Category codes on the wire (page_states.CATEGORY_NAMES), spelled out.
NOWHERE, HOST, BOTH, UNKNOWN, GPUS, GPU0, GPU1 = 0, 1, 2, 3, 4, 5, 6
NO_PAGES = dict.fromkeys(CATEGORY_NAMES, 0)


class RecordingComm:
    """A comm that keeps every message sent to the front end (after ipywidgets' DummyComm)."""

    def __init__(self):
        self.messages = []  # (data, [bytes of each buffer])
        self._on_msg = None
        self._on_close = None
        self.closed = False
        self._lock = threading.Lock()

    def send(self, data=None, metadata=None, buffers=None):
        with self._lock:
            self.messages.append((data, [bytes(b) for b in buffers or ()]))

    def on_msg(self, callback):
        self._on_msg = callback

    def on_close(self, callback):
        self._on_close = callback

    def close(self, data=None, metadata=None, buffers=None):
        self.closed = True

    # what the front end does
    def deliver(self, data):
        self._on_msg({"content": {"comm_id": "c0", "data": data}, "buffers": []})

    def close_from_frontend(self):
        self._on_close({"content": {"comm_id": "c0", "data": {}}})

    def of_type(self, kind):
        with self._lock:
            return [(d, b) for d, b in self.messages if d["type"] == kind]

    def clear(self):
        with self._lock:
            self.messages.clear()


@pytest.fixture
def device():
    backend = ul.use_backend("sim", device_memory="1GiB")
    yield backend
    for buf in ul.live_buffers():
        buf.close()


@pytest.fixture
def session(device):
    # Its own timeline and device series, unfed and on a stopped clock: the maps are all these tests watch.
    s = PanelSession(RecordingComm(), start=False, timeline=(EventWindow(), DeviceSeries(clock=ManualClock())))
    yield s
    s.close()


def drawn(buf):
    """What the panel should draw for ``buf``: the category of each page of ul.residency, one byte per page."""
    return categories(ul.residency(buf).states).tobytes()


def exact_counts(buf):
    """``ul.residency(buf)``'s pages per category, every category."""
    codes = ul.residency(buf).categories()
    return {name: int((codes == code).sum()) for code, name in enumerate(CATEGORY_NAMES)}


def held_by_view(updates, buf, cells):
    """``buf``'s map as a view holds it after ``updates``, starting from ``cells`` (its changes applied)."""
    held = np.frombuffer(cells, np.uint8)
    for data, buffers in updates:
        for info, payload in zip(data["allocations"], buffers, strict=True):
            if info["id"] == buf.id:
                payload = np.frombuffer(payload, np.uint8)
                held = apply_runs(held, payload) if info["encoding"] == "runs" else payload
    return held.tobytes()


def allocation(message, buf):
    data, buffers = message
    i = next(i for i, a in enumerate(data["allocations"]) if a["id"] == buf.id)
    return data["allocations"][i], buffers[i]


def test_hello_sends_a_snapshot_with_binary_residency_matching_ul_residency(session, device):
    a = ul.DeviceBuffer(size="8MiB", label="a")
    b = ul.DeviceBuffer(size="2MiB", label="b")
    a.prefetch("gpu")
    ul.touch(b, on="host", mode="write")
    session.comm.deliver({"type": "hello", "seq": 1})

    (snapshot, buffers), (result, _) = session.comm.messages
    assert result == {"type": "result", "seq": 1, "command": "hello", "ok": True, "error": None}
    assert snapshot["type"] == "snapshot"
    assert snapshot["version"] == PROTOCOL_VERSION == 7
    assert snapshot["page_size"] == PAGE and snapshot["cell_limit"] == CELL_LIMIT
    free = device.mem_info()[0]
    assert snapshot["device"] == {"backend": "sim", "device_count": 1, "free": free, "total": 1 << 30,
                                  "devices": [{"free": free, "total": 1 << 30}]}
    assert [x["id"] for x in snapshot["allocations"]] == [a.id, b.id]
    assert len(buffers) == 2
    for buf in (a, b):
        info, cells = allocation((snapshot, buffers), buf)
        assert cells == drawn(buf)
        assert info["counts"] == exact_counts(buf)
        assert info["pages"] == info["cells"] == buf.size // PAGE and info["cell_pages"] == 1
        assert info["label"] == buf.label and info["size"] == buf.size and info["is_managed"] is True
        assert info["advice"] == {"read_mostly": False, "preferred_location": None, "accessed_by": []}
    assert allocation((snapshot, buffers), a)[0]["counts"] == {**NO_PAGES, "gpu:0": 2048}
    assert allocation((snapshot, buffers), b)[0]["counts"] == {**NO_PAGES, "host": 512}
    assert allocation((snapshot, buffers), a)[1] == bytes([GPU0]) * 2048


def test_residency_never_travels_as_a_json_list(session, device):
    buf = ul.DeviceBuffer(size="1MiB")
    buf.prefetch("gpu")
    session.comm.deliver({"type": "hello", "seq": 1})
    snapshot, buffers = session.comm.of_type("snapshot")[0]

    def lists(value):
        if isinstance(value, dict):
            return [x for v in value.values() for x in lists(v)]
        if isinstance(value, list):
            return [len(value), *(x for v in value for x in lists(v))]
        return []

    assert max(lists(snapshot)) < 256  # no page array hides in the JSON: 256 pages went as bytes
    assert buffers == [drawn(buf)] == [bytes([GPU0]) * 256]


def test_prefetch_changes_the_buffer_and_the_update_follows_before_the_result(session, device):
    buf = ul.DeviceBuffer(size="4MiB", label="x")
    session.handle({"type": "hello", "seq": 1})
    session.comm.clear()

    result = session.handle({"type": "prefetch", "seq": 2, "id": buf.id, "location": "gpu",
                             "first_page": 0, "pages": None})
    assert result["ok"] is True
    assert ul.residency(buf).counts()["gpu"] == 1024
    (update, buffers), (sent_result, _) = session.comm.messages
    assert sent_result is result
    assert update["type"] == "update" and [a["id"] for a in update["allocations"]] == [buf.id]
    assert buffers[0] == drawn(buf) == bytes([GPU0]) * 1024

    session.comm.clear()
    session.handle({"type": "prefetch", "seq": 3, "id": buf.id, "location": "host", "first_page": 0, "pages": None})
    assert ul.residency(buf).counts()["host"] == 1024
    update, buffers = session.comm.of_type("update")[0]
    assert buffers[0] == drawn(buf) == bytes([HOST]) * 1024
    assert update["allocations"][0]["counts"] == {**NO_PAGES, "host": 1024}


def test_prefetch_to_a_named_gpu(session, device):
    buf = ul.DeviceBuffer(size="1MiB", label="x")
    buf.prefetch("host")
    session.handle({"type": "hello", "seq": 1})
    session.comm.clear()
    result = session.handle({"type": "prefetch", "seq": 2, "id": buf.id, "location": "gpu:0",
                             "first_page": 0, "pages": None})
    assert result["ok"] is True
    assert ul.residency(buf).copies() == {"gpu:0": 256}
    update, buffers = session.comm.of_type("update")[0]
    assert buffers == [bytes([GPU0]) * 256]
    assert update["allocations"][0]["counts"] == {**NO_PAGES, "gpu:0": 256}


def test_every_category_travels_apart_with_exact_counts(session, device, monkeypatch):
    """Pages on gpu:0, gpu:1, the host, both, unknown and nowhere: each its own code, each counted.

    The simulator has one GPU and never loses track of a page, so the map is made here and handed to the
    session as the kernel's residency."""
    buf = ul.DeviceBuffer(size="40KiB", label="mixed")  # ten pages
    #                  nowhere host gpu:0 gpu:1 host+gpu:0 host+gpu:1 unknown host+unknown gpu:0+gpu:1 gpu:1
    states = np.array([0, 1, 2, 4, 3, 5, 0x80, 0x81, 6, 4], dtype=np.uint8)
    real = collect.describe_buffer

    def describe(b, **kwargs):
        plain = real(b, **kwargs)
        if b.id != buf.id:
            return plain
        return {**plain, "states": states, "category_pages": collect.category_pages(states)}

    monkeypatch.setattr(collect, "describe_buffer", describe)
    session.handle({"type": "hello", "seq": 1})
    info, cells = allocation(session.comm.of_type("snapshot")[0], buf)
    assert cells == bytes([NOWHERE, HOST, GPU0, GPU1, BOTH, BOTH, UNKNOWN, UNKNOWN, GPUS, GPU1])
    assert info["counts"] == {**NO_PAGES, "nowhere": 1, "host": 1, "gpu:0": 1, "gpu:1": 2, "both": 2,
                              "unknown": 2, "gpus": 1}
    assert info["pages"] == info["cells"] == 10 and info["cell_pages"] == 1


def test_advice_commands_go_through_the_buffer_properties(session, device):
    buf = ul.DeviceBuffer(size="2MiB")
    buf.prefetch("gpu")
    session.handle({"type": "hello", "seq": 1})

    def advice():
        session.comm.clear()
        return session.comm

    comm = advice()
    assert session.handle({"type": "set_advice", "seq": 2, "id": buf.id, "advice": "read_mostly", "value": True})["ok"]
    assert buf.read_mostly is True
    assert comm.of_type("update")[0][0]["allocations"][0]["advice"]["read_mostly"] is True

    comm = advice()
    session.handle({"type": "set_advice", "seq": 3, "id": buf.id, "advice": "preferred_location", "value": "host"})
    assert buf.preferred_location == "host"
    assert comm.of_type("update")[0][0]["allocations"][0]["advice"]["preferred_location"] == "host"

    session.handle({"type": "set_advice", "seq": 4, "id": buf.id, "advice": "preferred_location", "value": None})
    assert buf.preferred_location is None

    comm = advice()
    session.handle({"type": "set_advice", "seq": 5, "id": buf.id, "advice": "accessed_by", "value": ["gpu"]})
    assert buf.accessed_by == ("gpu:0",)
    assert comm.of_type("update")[0][0]["allocations"][0]["advice"]["accessed_by"] == ["gpu:0"]
    session.handle({"type": "set_advice", "seq": 6, "id": buf.id, "advice": "accessed_by", "value": []})
    assert buf.accessed_by == ()

    session.handle({"type": "set_advice", "seq": 7, "id": buf.id, "advice": "read_mostly", "value": False})
    assert buf.read_mostly is False
    assert all(r["ok"] for r, _ in session.comm.of_type("result"))


@pytest.mark.parametrize(
    ("command", "error_type", "mentions"),
    [
        ({"type": "prefetch", "seq": 5, "id": 999_999, "location": "gpu",
          "first_page": 0, "pages": None}, "InvalidArgumentError", "no live buffer"),
        ({"type": "set_advice", "seq": 5, "id": 999_999, "advice": "read_mostly", "value": True},
         "InvalidArgumentError", "999999"),
        ({"type": "set_advice", "seq": 5, "id": "ID", "advice": "preferred_location", "value": "gpu:3"},
         "InvalidLocationError", "gpu:3"),
        ({"type": "prefetch", "seq": 5, "id": "ID", "location": "nowhere",
          "first_page": 0, "pages": None}, "ProtocolError", "nowhere"),
        # A well-formed GPU the simulated device does not have: the backend's typed answer.
        ({"type": "prefetch", "seq": 5, "id": "ID", "location": "gpu:1",
          "first_page": 0, "pages": None}, "InvalidLocationError", "'gpu:1'"),
        ({"type": "prefetch", "seq": 5, "id": "ID", "location": "gpu:x",
          "first_page": 0, "pages": None}, "ProtocolError", "'gpu:x'"),
        ({"type": "prefetch", "seq": 5, "id": "ID", "location": "gpu:-1",
          "first_page": 0, "pages": None}, "ProtocolError", "'gpu:-1'"),
    ],
)
def test_errors_come_back_as_results_and_the_comm_lives_on(session, device, command, error_type, mentions):
    buf = ul.DeviceBuffer(size="1MiB")
    command = {k: (buf.id if v == "ID" else v) for k, v in command.items()}
    session.comm.deliver(command)
    (result, _), = session.comm.of_type("result")
    assert result["ok"] is False and result["seq"] == 5 and result["command"] == command["type"]
    assert result["error"]["type"] == error_type
    assert mentions in result["error"]["message"]
    assert not session.closed and not session.comm.closed

    session.comm.deliver({"type": "prefetch", "seq": 6, "id": buf.id, "location": "gpu",
                          "first_page": 0, "pages": None})
    assert session.comm.of_type("result")[-1][0]["ok"] is True
    assert ul.residency(buf).counts()["gpu"] == 256


def test_a_closed_buffer_is_reported_removed(session, device):
    keep = ul.DeviceBuffer(size="1MiB")
    drop = ul.DeviceBuffer(size="1MiB")
    session.handle({"type": "hello", "seq": 1})
    session.comm.clear()
    drop.close()
    assert session.flush() is True
    assert [d for d, _ in session.comm.messages] == [{"type": "removed", "ids": [drop.id]}]
    session.comm.clear()
    result = session.handle({"type": "prefetch", "seq": 2, "id": drop.id, "location": "gpu",
                             "first_page": 0, "pages": None})
    assert result["error"]["type"] == "InvalidArgumentError"
    session.comm.clear()
    keep.prefetch("gpu")
    assert session.flush() is True
    assert [a["id"] for a in session.comm.of_type("update")[0][0]["allocations"]] == [keep.id]


def test_updates_carry_only_what_changed(session, device):
    a = ul.DeviceBuffer(size="1MiB", label="a")
    b = ul.DeviceBuffer(size="1MiB", label="b")
    session.handle({"type": "hello", "seq": 1})
    session.comm.clear()
    assert session.flush() is False  # nothing happened
    ul.touch(b, on="gpu")
    assert session.flush() is True
    (update, buffers), = session.comm.messages
    assert [x["id"] for x in update["allocations"]] == [b.id]  # not a, untouched
    assert buffers == [drawn(b)]
    assert a.id in session._sent
    session.comm.clear()
    b.prefetch("gpu")  # already there: events, but the same pages
    assert session.flush() is False
    assert session.comm.messages == []
    c = ul.DeviceBuffer(size="1MiB", label="c")
    assert session.flush() is True
    assert [x["id"] for x in session.comm.of_type("update")[0][0]["allocations"]] == [c.id]


def test_an_update_carries_the_wall_clock_at_which_it_read_the_maps(device):
    clock = ManualClock()
    session = PanelSession(RecordingComm(), start=False, clock=clock,
                           timeline=(EventWindow(), DeviceSeries(clock=ManualClock())))
    try:
        buf = ul.DeviceBuffer(size="1MiB", label="a")
        session.handle({"type": "hello", "seq": 1})
        ul.touch(buf, on="gpu")
        clock.advance(2.5)                             # the maps are read 2.5 s later
        session.flush()
        (update, _), = session.comm.of_type("update")
        assert update["clock"] == clock.wall_ms()      # the browser's latency is measured from here
    finally:
        session.close()


@pytest.mark.parametrize("kwargs, message", [
    ({"interval": 0}, "interval must be a positive number of seconds"),
    ({"interval": -1.0}, "interval must be a positive number of seconds"),
    ({"idle": float("inf")}, "idle must be a positive number of seconds"),
    ({"clock": time}, "clock must be a uvm_lab.clock.Clock"),
])
def test_a_session_refuses_a_bad_interval_or_clock_and_listens_to_nothing(device, kwargs, message):
    listening = len(ul.events.get_bus().subscriptions())
    with pytest.raises(ul.errors.InvalidArgumentError, match=message):
        PanelSession(RecordingComm(), start=False, **kwargs)
    assert len(ul.events.get_bus().subscriptions()) == listening


def test_pause_stops_updates_and_resume_sends_a_snapshot(session, device):
    buf = ul.DeviceBuffer(size="1MiB")
    session.handle({"type": "hello", "seq": 1})
    assert session.handle({"type": "pause", "seq": 2, "paused": True})["ok"]
    assert session.paused
    session.comm.clear()
    buf.prefetch("gpu")
    assert session.flush() is False
    assert session.comm.of_type("update") == []
    session.handle({"type": "pause", "seq": 3, "paused": False})
    (_, buffers), = session.comm.of_type("snapshot")
    assert buffers == [drawn(buf)]
    assert session.flush() is False  # the snapshot covered what changed while paused


def test_a_paused_view_sleeps_through_a_loops_events_and_wakes_only_for_its_idle_sample(device):
    # Each wake of the view's thread takes the interpreter's lock from the loop; paused, it has nothing to send.
    clock = ManualClock(cpu_per_read=0.001)   # each wake of the thread reads its CPU time twice
    window = EventWindow()
    window.read_from(ul.events.get_bus().reader("a hidden view's timeline"))
    session = PanelSession(RecordingComm(), clock=clock, idle=1.0, timeline=(window, DeviceSeries(clock=ManualClock())))
    try:
        buf = ul.DeviceBuffer(size="1MiB")
        session.handle({"type": "hello", "seq": 1})
        session.handle({"type": "pause", "seq": 2, "paused": True})
        for step in (1.0, 0.05):   # an idle sample, and its turn in the throttle past: the thread waits for news
            clock.advance(step)
            clock.settle(threads=1)
        before = clock.thread_time()
        for i in range(40):   # a loop's events, while the view is hidden
            buf.prefetch("gpu" if i % 2 else "host")
        ul.events.get_bus().flush()
        clock.settle(threads=1)
        assert clock.thread_time() == pytest.approx(before + 0.001)   # the thread was not woken: no reads between
        assert window.reader.waiting > 0
        clock.advance(1.0)   # the idle sample's turn: woken once, and still nothing sent
        clock.settle(threads=1)
        assert clock.thread_time() == pytest.approx(before + 0.004)
        assert session.comm.of_type("update") == []
        # ... but its timeline read the loop's events in, so that the bus's history never leaves it behind
        assert (window.reader.waiting, window.missed) == (0, 0)
        assert window.traffic(buf.id, read_in=False)["htod_bytes"] > 0
        session.handle({"type": "pause", "seq": 3, "paused": False})   # shown again: what it missed, at once
        (_, buffers), = session.comm.of_type("snapshot")[-1:]
        assert buffers == [drawn(buf)]
    finally:
        session.close()
        window.reader.close()


def test_huge_allocations_are_sent_in_cells_with_exact_counts(session, device):
    buf = ul.DeviceBuffer(size="96MiB")  # 24576 pages: two per cell
    ul.touch(buf, on="gpu", size="40MiB")
    session.handle({"type": "hello", "seq": 1})
    info, cells = allocation(session.comm.of_type("snapshot")[0], buf)
    assert info["pages"] == 24576 and info["cell_pages"] == 2 and info["cells"] == len(cells) == 12288
    assert info["counts"] == exact_counts(buf) == {**NO_PAGES, "gpu:0": 10240, "nowhere": 14336}
    assert cells == bytes([GPU0]) * 5120 + bytes([NOWHERE]) * 7168


def test_zero_size_buffers_are_not_listed(session, device):
    empty = ul.DeviceBuffer(size=0)
    assert empty in ul.live_buffers()
    real = ul.DeviceBuffer(size="1MiB")
    session.handle({"type": "hello", "seq": 1})
    assert [a["id"] for a in session.comm.of_type("snapshot")[0][0]["allocations"]] == [real.id]


def _failing_once(monkeypatch, error: Exception) -> list:
    """Make describing an allocation fail once, as a send or a read can; returns the calls made."""

    real, calls = collect.describe_buffer, []

    def describe(buf, **kwargs):
        calls.append(buf.id)
        if len(calls) == 1:
            raise error
        return real(buf, **kwargs)

    monkeypatch.setattr(collect, "describe_buffer", describe)
    return calls


def test_a_failed_update_is_sent_by_the_next_flush_without_new_events(session, device, monkeypatch):
    buf = ul.DeviceBuffer(size="2MiB")
    session.handle({"type": "hello", "seq": 1})
    session.comm.clear()
    buf.prefetch("gpu")
    calls = _failing_once(monkeypatch, RuntimeError("the panel's read failed"))
    with pytest.raises(RuntimeError, match="read failed"):
        session.flush()
    assert session.comm.of_type("update") == [] and calls == [buf.id]
    assert session.flush() is True          # nothing moved since: what the failed flush took goes now
    (_, buffers), = session.comm.of_type("update")
    assert buffers == [drawn(buf)] == [bytes([GPU0]) * 512]
    assert session.flush() is False         # and it is noted as sent


def test_the_background_thread_retries_a_failed_update(device, monkeypatch):

    comm = RecordingComm()
    session = PanelSession(comm, interval=0.02)
    real, broken, calls = collect.describe_buffer, threading.Event(), []

    def describe(buf, **kwargs):
        calls.append(buf.id)
        if broken.is_set():
            raise RuntimeError("the panel's read failed")
        return real(buf, **kwargs)

    try:
        buf = ul.DeviceBuffer(size="2MiB")
        session.handle({"type": "hello", "seq": 1})
        before = drawn(buf)
        comm.clear()
        monkeypatch.setattr(collect, "describe_buffer", describe)
        broken.set()
        buf.prefetch("gpu")                 # the last event there is: every read of the map fails while broken
        assert eventually(lambda: len(calls) >= 2)
        # An update may still go out before the pages move (the prefetch's request, seen first), never the moved map.
        assert held_by_view(comm.of_type("update"), buf, before) == before != drawn(buf)
        broken.clear()                      # no new event: only a retry can send the map now
        assert eventually(lambda: held_by_view(comm.of_type("update"), buf, before) == drawn(buf))
        assert drawn(buf) == bytes([GPU0]) * 512
    finally:
        session.close()
    session._thread.join(timeout=5)


def test_updates_flow_from_the_background_thread_one_an_interval_while_a_cell_runs(device):
    comm = RecordingComm()
    interval = 0.05
    clock = ManualClock()
    bus = ul.events.get_bus()
    session = PanelSession(comm, interval=interval, clock=clock)
    try:
        buf = ul.DeviceBuffer(size="8MiB")
        session.handle({"type": "hello", "seq": 1})
        before = drawn(buf)
        comm.clear()
        # A "cell": 41 migrations on this (main) thread, within one interval.
        for i in range(41):
            buf.prefetch("gpu" if i % 2 == 0 else "host")
        bus.flush()                                     # every event has reached the session
        clock.settle(threads=1)
        assert len(comm.of_type("update")) <= 1         # at most one went out in the interval
        clock.advance(interval)
        clock.settle(threads=1)
        updates = comm.of_type("update")
        assert 1 <= len(updates) <= 2                   # the next holds everything that came after
        assert held_by_view(updates, buf, before) == drawn(buf) == bytes([GPU0]) * 2048
        clock.advance(interval)
        clock.settle(threads=1)
        assert len(comm.of_type("update")) == len(updates)   # nothing changed since: nothing sent
    finally:
        session.close()
    session._thread.join(timeout=5)
    assert not session._thread.is_alive()


def test_background_updates_are_sent_from_the_context_of_the_panels_last_message(device):
    # ipykernel keeps the parent request in a context variable and routes the comm's next incoming
    # message to the shell its last outgoing one came from: updates must not claim the main shell.
    parent = contextvars.ContextVar("parent", default="main shell")
    comm = RecordingComm()
    seen = []
    send = comm.send
    comm.send = lambda data=None, metadata=None, buffers=None: (seen.append((data["type"], parent.get())),
                                                               send(data, metadata, buffers))
    session = PanelSession(comm, interval=0.01)
    try:
        buf = ul.DeviceBuffer(size="1MiB")  # before the hello: no update for it goes out
        ul.events.get_bus().flush()
        assert seen == []

        def on_subshell():
            parent.set("subshell")
            comm.deliver({"type": "hello", "seq": 1})

        worker = threading.Thread(target=on_subshell)
        worker.start()
        worker.join(timeout=5)
        buf.prefetch("gpu")  # on the main thread, whose context says "main shell"
        assert eventually(lambda: any(kind == "update" for kind, _ in seen))
        assert ("snapshot", "subshell") in seen and ("result", "subshell") in seen
        # The prefetch's request and its moved pages may go out as one update or two: each from the subshell.
        assert {where for kind, where in list(seen) if kind == "update"} == {"subshell"}
    finally:
        session.close()


def test_commands_from_several_threads_at_once(device):
    # ipykernel 7 runs comm handlers on subshell threads while the main thread runs a cell.
    comm = RecordingComm()
    session = PanelSession(comm, interval=0.01)
    bufs = [ul.DeviceBuffer(size="1MiB", label=f"t{i}") for i in range(4)]
    errors = []

    def worker(buf, n):
        try:
            for i in range(n):
                where = "gpu" if i % 2 else "host"
                r = session.handle({"type": "prefetch", "seq": i, "id": buf.id, "location": where,
                                    "first_page": 0, "pages": None})
                if not r["ok"]:
                    errors.append(r)
                session.handle({"type": "set_advice", "seq": i, "id": buf.id, "advice": "read_mostly",
                                "value": bool(i % 2)})
        except Exception as err:  # pragma: no cover - the assertion below reports it
            errors.append(err)

    try:
        threads = [threading.Thread(target=worker, args=(b, 15)) for b in bufs]
        for t in threads:
            t.start()
        for _ in range(15):  # the "cell"
            ul.touch(bufs[0], on="host")
        for t in threads:
            t.join(timeout=30)
        assert not any(t.is_alive() for t in threads)
        assert errors == []
        comm.clear()
        session.handle({"type": "hello", "seq": 99})
        snapshot, buffers = comm.of_type("snapshot")[0]
        for buf in bufs:
            info, cells = allocation((snapshot, buffers), buf)
            assert cells == drawn(buf)
            assert info["advice"]["read_mostly"] is False  # each worker's last command (i = 14) turned it off
    finally:
        session.close()


def test_closing_the_comm_ends_the_session(device):
    comm = RecordingComm()
    bus = ul.events.get_bus()
    before, reading = len(bus.subscriptions()), len(bus.readers())
    session = PanelSession(comm, interval=0.01)
    assert len(bus.subscriptions()) == before + 1   # its own
    assert len(bus.readers()) == reading + 1        # the kernel's timeline, which it opened
    comm.close_from_frontend()
    assert session.closed
    assert (len(bus.subscriptions()), len(bus.readers())) == (before, reading)
    session._thread.join(timeout=5)
    assert not session._thread.is_alive()
    buf = ul.DeviceBuffer(size="1MiB")
    buf.prefetch("gpu")
    bus.flush()   # delivered to every subscriber: the session is none of them now
    assert comm.messages == []


def test_the_kernels_timeline_listens_only_while_a_view_is_open(device):
    bus = ul.events.get_bus()

    def timelines():
        return [r for r in bus.readers() if r.name == "the live view's timeline"]

    assert timelines() == [], "an earlier test left a view open"
    first, second = PanelSession(RecordingComm(), start=False), PanelSession(RecordingComm(), start=False)
    assert len(timelines()) == 1   # one for the kernel, whatever the number of views
    first.close()
    first.close()   # closing twice gives back once
    assert len(timelines()) == 1   # the other view still reads it
    second.close()
    assert timelines() == []   # no view: the bus's history is read by none
    buf = ul.DeviceBuffer(size="1MiB")
    buf.prefetch("gpu")
    third = PanelSession(RecordingComm(), start=False)
    try:   # a view opened later starts from the bus's history: what happened while none was open is there
        window = third._window
        assert window.held >= 2 and buf.id in window.changed_lanes(0)[1]
    finally:
        third.close()


def test_register_comm_target_outside_a_kernel_is_a_no_op():
    assert register_comm_target() is False


class FakeCommManager:
    def __init__(self):
        self.targets = {}

    def register_target(self, name, handler):
        self.targets[name] = handler


def test_register_comm_target_in_a_kernel_opens_sessions(device, monkeypatch):
    manager = FakeCommManager()
    shell = types.SimpleNamespace(kernel=types.SimpleNamespace(comm_manager=manager))
    monkeypatch.setattr("IPython.get_ipython", lambda: shell)
    assert register_comm_target() is True
    assert register_comm_target() is True  # idempotent
    assert list(manager.targets) == ["uvm_lab"]

    buf = ul.DeviceBuffer(size="1MiB", label="opened")
    comm = RecordingComm()
    manager.targets["uvm_lab"](comm, {"content": {"comm_id": "c1", "target_name": "uvm_lab",
                                                  "data": {"type": "hello", "seq": 1}}})
    (snapshot, _), = comm.of_type("snapshot")
    assert [a["label"] for a in snapshot["allocations"]] == ["opened"]
    (session,) = [s for s in lab_comm.sessions() if s.comm is comm]
    comm.close_from_frontend()
    assert session not in lab_comm.sessions()
    buf.close()


def test_a_bad_open_message_is_answered_not_raised(device, monkeypatch):
    manager = FakeCommManager()
    monkeypatch.setattr("IPython.get_ipython",
                        lambda: types.SimpleNamespace(kernel=types.SimpleNamespace(comm_manager=manager)))
    register_comm_target()
    comm = RecordingComm()
    manager.targets["uvm_lab"](comm, {"content": {"data": {"type": "hello"}}})
    (result, _), = comm.of_type("result")
    assert result["error"]["type"] == "ProtocolError" and "seq" in result["error"]["message"]
    for s in lab_comm.sessions():
        if s.comm is comm:
            s.close()


def test_an_update_describes_again_only_the_allocations_whose_pages_changed(session, device, monkeypatch):
    # At 1,000 allocations and 16 M pages an update must cost what the loop changed: the residency tracker's
    # journal names the buffers to read again, and only those are.
    buffers = [ul.DeviceBuffer(size="1MiB", label=f"b{i}") for i in range(5)]
    session.handle({"type": "hello", "seq": 1})
    real, described = collect.describe_buffer, []

    def describe(buf, **kwargs):
        described.append(buf.label)
        return real(buf, **kwargs)

    monkeypatch.setattr(collect, "describe_buffer", describe)
    ul.touch(buffers[3], on="gpu", mode="write", size="64KiB")
    session.comm.clear()
    assert session.flush() is True
    assert described == ["b3"]
    (update, _), = session.comm.of_type("update")
    assert [a["label"] for a in update["allocations"]] == ["b3"]
    described.clear()
    assert session.flush() is False and described == []     # nothing changed since: nothing read


# -- replies to anything: bounded, encodable, and nothing changed ------------------------------------------

def _nested(depth):
    outer = inner = []
    for _ in range(depth):
        inner.append([])
        inner = inner[0]
    return outer


def _reply_is_safe(comm, before_sent):
    """The last message is a result a view can read: UTF-8 JSON of a few hundred bytes, whatever came in."""
    assert len(comm.messages) == before_sent + 1
    data, _ = comm.messages[-1]
    wire = json.dumps(data, ensure_ascii=False).encode("utf-8")   # raises on a lone surrogate
    assert data["type"] == "result" and len(wire) < 1200
    return data


@pytest.mark.parametrize("message", [
    {"type": "x" * 10**7, "seq": 1},
    {"type": "\udcff", "seq": 2},
    {"type": "watch", "seq": 3, "ids": _nested(100_000)},
    {"type": "hello", "seq": 10**30},
    {"type": "hello", "seq": 4, **{f"k{i}" * 1000: 1 for i in range(100)}},
    {"type": "prefetch", "seq": 5, "id": 1, "location": "gpu:" + "9" * 10**6, "first_page": 0, "pages": None},
    {"type": "set_advice", "seq": 6, "id": 1, "advice": "\ud800" * 1000, "value": True},
    [_nested(50_000)],
])
def test_a_bad_command_gets_a_small_encodable_reply_and_changes_nothing(session, message):
    buf = ul.DeviceBuffer(size="1MiB", label="kept")
    session.handle({"type": "hello", "seq": 0})
    sent, interval, paused = len(session.comm.messages), session.interval, session.paused
    session.handle(message)
    reply = _reply_is_safe(session.comm, sent)
    assert reply["ok"] is False and reply["error"]["message"]
    assert reply["command"] in (None, "watch", "hello", "prefetch", "set_advice")
    assert (session.interval, session.paused) == (interval, paused)
    assert ul.residency(buf).counts()["nowhere"] == 256    # no command reached the buffer
    assert session.handle({"type": "hello", "seq": 7})["ok"]   # and the session still serves


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
                    lambda children: st.lists(children, max_size=4) | st.dictionaries(
                        st.sampled_from(["type", "seq", "id", "ids", "paused", "interval_ms", "start", "end", "width",
                                         "lanes", "location", "first_page", "pages", "advice", "value", "worker",
                                         "command", "x"]),
                        children, max_size=8), max_leaves=30),
       st.sampled_from(["hello", "pause", "rate", "timeline", "watch", "pages", "prefetch", "set_advice",
                        "worker_command", "worker_timeline", "worker_buffers", None]))
def test_random_json_never_breaks_the_session(session, data, kind):
    if kind is not None and isinstance(data, dict):
        data = {**data, "type": kind}
    buf = ul.DeviceBuffer(size="64KiB", label="fuzzed")
    try:
        sent = len(session.comm.messages)
        reply = session.handle(data)
        result = next(d for d, _ in reversed(session.comm.messages[sent:]) if d["type"] == "result")
        assert result == reply and len(json.dumps(result, ensure_ascii=False).encode("utf-8")) < 1200
        assert session.handle({"type": "hello", "seq": 1})["ok"]
    finally:
        buf.close()


def test_an_experiments_chart_reaches_an_open_view_and_one_that_opens_later(device):
    first = PanelSession(RecordingComm(), start=False, timeline=(EventWindow(), DeviceSeries(clock=ManualClock())))
    try:
        first.handle({"type": "hello", "seq": 0})
        result = ul.compare("multi_pass_stream", {"policy": ["faults", "prefetch"]}, size="16MiB", passes=2,
                            progress=False)
        [(chart, _)] = first.comm.of_type("experiment")
        assert (chart["workload"], chart["configurations"]) == ("multi_pass_stream", 2)
        assert chart["created"] == result.metadata["created"]
        # A page of its own, BokehJS inline: it draws in the view's frame with no network.
        assert chart["html"].startswith("<!DOCTYPE html>") and "Bokeh" in chart["html"]
        assert "https://cdn.bokeh.org" not in chart["html"] and "faults" in chart["html"]
    finally:
        first.close()
    later = PanelSession(RecordingComm(), start=False, timeline=(EventWindow(), DeviceSeries(clock=ManualClock())))
    try:
        later.handle({"type": "hello", "seq": 0})
        [snapshot, (chart, _)] = [m for m in later.comm.messages if m[0]["type"] in ("snapshot", "experiment")]
        assert snapshot[0]["type"] == "snapshot" and chart["created"] == result.metadata["created"]
        first.comm.clear()
        ul.compare("strided", size="16MiB", progress=False)
        assert first.comm.of_type("experiment") == []   # a closed view is sent nothing
        assert len(later.comm.of_type("experiment")) == 2
    finally:
        later.close()


def test_a_view_held_back_while_the_bus_history_turns_over_misses_no_event(device):
    # A bus that holds 8 records, and a view that sends nothing meanwhile (no thread of its own, and paused): the
    # loop's own thread reads the timeline in once half the history is unread, so its counts take every record.
    bus = ul.events.EventBus(capacity=8)
    window = EventWindow()
    window.read_from(bus.reader("a held-back view's timeline"))
    session = PanelSession(RecordingComm(), start=False, bus=bus, timeline=(window, DeviceSeries(clock=ManualClock())))
    try:
        session.handle({"type": "pause", "seq": 1, "paused": True})
        for address in range(40):
            bus.publish(ul.events.make_events(1, kind=ul.events.EventKind.DTOH, address=address << 12, bytes=4096))
        assert bus.dropped == 32   # the history turned over four times
        assert window.reader.waiting < 8 and window.missed == 0   # never the whole history unread
        assert window.held == 40
    finally:
        session.close()
        window.reader.close()
