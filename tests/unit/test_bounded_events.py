"""A consumer that falls behind the bus: what it misses is dropped for it alone, counted, and shown where a user
looks (``Trace.summary()`` and ``%%uvm_trace``, ``%uvm status``, the lab view's timeline)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import uvm_lab as ul
from uvm_lab.errors import InvalidArgumentError
from uvm_lab.events import EventBus, EventKind, make_events
from uvm_lab.jupyter.comm import PanelSession
from uvm_lab.jupyter.dashboard import collect
from uvm_lab.jupyter.dashboard.collect import collect_snapshot
from uvm_lab.jupyter.dashboard.text import format_status, format_trace_summary
from uvm_lab.jupyter.timeline import DeviceSeries, EventWindow

from .clocks import ManualClock


class Stalling(np.ndarray):
    """A batch whose copy waits until ``release`` is set: a subscriber that copies it is stuck there."""

    release = threading.Event()
    copying = threading.Event()

    def copy(self, order="C"):
        type(self).copying.set()
        type(self).release.wait()
        return np.asarray(self).copy(order)


@pytest.fixture
def stalling():
    Stalling.release.clear()
    Stalling.copying.clear()
    yield lambda n: make_events(n, kind=EventKind.HTOD, bytes=4096).view(Stalling)
    Stalling.release.set()


def test_a_recording_that_falls_behind_says_how_many_events_it_missed(stalling):
    bus = EventBus()
    with ul.record(bus, limit=3) as trace:
        bus.publish(stalling(1))                         # the recording's thread is stuck copying this one
        assert Stalling.copying.wait(10)
        for _ in range(5):
            bus.publish(make_events(1, kind=EventKind.DTOH, bytes=4096))
        Stalling.release.set()
    summary = trace.summary()
    # 3 waiting besides the oldest batch, as limit=3 allows: the fifth was dropped.
    assert (trace.missed, summary["missed"], summary["events"]) == (1, 1, 5)
    assert summary["bytes_htod"] == 4096 and summary["bytes_dtoh"] == 4 * 4096
    assert "missed (fell behind)      1 event\n" in format_trace_summary(summary)


def test_a_recording_that_keeps_up_misses_nothing_and_says_nothing_of_it(sim_backend):
    buf = ul.DeviceBuffer(size="4MiB")
    with ul.record() as trace:
        for where in ("gpu", "host", "gpu"):
            buf.prefetch(where)
    assert trace.missed == trace.summary()["missed"] == 0
    assert "missed" not in format_trace_summary(trace.summary())


def test_status_names_each_subscriber_that_fell_behind_and_what_it_missed(sim_backend):
    bus = ul.events.get_bus()
    inside, release = threading.Event(), threading.Event()

    def slow_plot(records):
        inside.set()
        release.wait()

    sub = bus.subscribe(slow_plot, limit=2, name="my slow plot")
    try:
        buf = ul.DeviceBuffer(size="4MiB")
        assert inside.wait(10)                           # stuck on the allocation's first batch
        for where in ("gpu", "host") * 5:
            buf.prefetch(where)
        bus.flush(wait=False)
        assert sub.dropped > 0 and sub.waiting == 3   # its limit, and the oldest batch besides
        status = format_status(collect_snapshot())
        assert f"dropped for those that fell behind: my slow plot {sub.dropped:,}" in status
    finally:
        release.set()
        sub.close()
    assert "none fell behind" in format_status(collect_snapshot())


def test_the_views_timeline_answer_counts_what_it_missed(sim_backend, monkeypatch):
    # A bus of its own that holds four records: a window that nothing reads while six are published (no view is
    # open yet to read it in) misses two.
    bus = EventBus(capacity=4)
    window = EventWindow()
    window.read_from(bus.reader("a view's timeline"))
    monkeypatch.setattr(collect, "get_bus", lambda: bus)   # what %uvm status reads
    for address in range(6):
        bus.publish(make_events(1, kind=EventKind.DTOH, address=address << 12, bytes=4096, start=address,
                                end=address))
    assert (window.reader.waiting, window.reader.dropped) == (6, 0)   # nothing is counted before a read
    session = PanelSession(_Sink(), start=False, bus=bus, timeline=(window, DeviceSeries(clock=ManualClock())))
    try:
        result = session.handle({"type": "timeline", "seq": 1, "start": 0, "end": 1 << 50, "width": 100,
                                 "lanes": None})
        assert result["ok"], result
        (answer, _), = [m for m in session.comm.sent if m[0]["type"] == "timeline"]
        assert (answer["missed"], answer["events"]) == (window.missed, 4) == (2, 4)
        assert window.extent() == (2, 5)   # the oldest two are not there
        assert "dropped for those that fell behind: a view's timeline 2" in format_status(collect_snapshot())
    finally:
        session.close()
        window.reader.close()


def test_record_refuses_what_is_not_a_bus():
    with pytest.raises(InvalidArgumentError, match="bus must be a uvm_lab EventBus"), ul.record("the bus"):
        pass


class _Sink:
    def __init__(self):
        self.sent = []

    def send(self, data=None, metadata=None, buffers=None):
        self.sent.append((data, buffers))

    def on_msg(self, callback): ...

    def on_close(self, callback): ...

    def close(self, *args, **kwargs): ...
