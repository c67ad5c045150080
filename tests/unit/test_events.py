"""The event bus and recorded traces."""

from __future__ import annotations

import logging
import threading

import numpy as np
import pandas as pd
import pytest

import uvm_lab as ul
from uvm_lab.errors import InvalidArgumentError
from uvm_lab.events import EVENT_DTYPE, EventBus, EventKind, make_events
from uvm_lab.events.bus import ALLOCATOR_RECORD

from .clocks import ManualClock
from .waiting import eventually

MiB = 1 << 20


def test_subscribers_get_batches_filtered_by_kind():
    bus = EventBus(capacity=16)
    everything, faults = [], []
    bus.subscribe(everything.append)
    bus.subscribe(faults.append, kinds=[EventKind.GPU_PAGE_FAULT])
    bus.publish(make_events(3, kind=[EventKind.HTOD, EventKind.GPU_PAGE_FAULT, EventKind.DTOH]))
    bus.flush()
    assert len(everything) == 1 and len(everything[0]) == 3
    assert len(faults) == 1 and faults[0]["kind"].tolist() == [EventKind.GPU_PAGE_FAULT]


def test_history_ring_keeps_the_newest_and_counts_what_fell_out():
    bus = EventBus(capacity=4)
    bus.publish(make_events(3, address=[1, 2, 3]))
    assert bus.history()["address"].tolist() == [1, 2, 3] and bus.dropped == 0
    bus.publish(make_events(3, address=[4, 5, 6]))
    assert bus.history()["address"].tolist() == [3, 4, 5, 6] and bus.dropped == 2
    bus.publish(make_events(9, address=np.arange(10, 19)))
    assert bus.history()["address"].tolist() == [15, 16, 17, 18] and bus.published == 15


def test_history_of_many_small_batches_is_every_record_in_order_and_a_copy():
    bus = EventBus(capacity=1000)
    for start in range(0, 1200, 3):   # as a loop publishes: many batches of a few records
        bus.publish(make_events(3, address=np.arange(start, start + 3), kind=EventKind.HTOD))
    history = bus.history()
    assert history.dtype == EVENT_DTYPE and history["address"].tolist() == list(range(200, 1200))
    history["address"] = 0   # the caller's own copy: writing to it leaves the bus's as it was
    assert bus.history()["address"].tolist() == list(range(200, 1200))


def test_a_subscriber_that_raises_is_detached_and_logged(caplog):
    bus = EventBus()
    good = []

    def bad(_records):
        raise RuntimeError("plot failed")

    bus.subscribe(bad)
    bus.subscribe(good.append)
    with caplog.at_level(logging.ERROR, logger="uvm_lab.events"):
        bus.publish(make_events(1))
        bus.publish(make_events(1))
        bus.flush()
    assert len(good) == 2 and [s.callback for s in bus.subscriptions()] == [good.append]
    assert sum("detached" in r.message for r in caplog.records) == 1


def test_publish_refuses_foreign_arrays():
    with pytest.raises(InvalidArgumentError, match="EVENT_DTYPE"):
        EventBus().publish(np.zeros(2))


def test_record_keeps_only_what_happened_inside():
    buf = ul.DeviceBuffer(size=4 * MiB)
    with ul.record() as trace:
        buf.prefetch("host")
    buf.prefetch("gpu")
    kinds = set(trace.to_pandas()["kind"])
    assert kinds == {"prefetch", "dtoh"} or kinds == {"prefetch"}
    assert trace.summary()["bytes_htod"] == 0


def test_to_pandas_decodes_causes_and_access_types():
    buf = ul.DeviceBuffer(size=4 * MiB, mr=ul.mr.ManagedMemoryResource())
    with ul.record() as trace:
        ul.touch(buf, on="host", mode="write")
        ul.touch(buf, on="gpu", mode="read")
        buf.read_mostly = True
    df = trace.to_pandas()
    assert isinstance(df, pd.DataFrame)
    assert {"kind", "start", "end", "duration", "address", "bytes", "value", "src", "dst", "cause", "detail",
            "alloc_id"} <= set(df.columns)
    htod = df[df.kind == "htod"]
    assert set(htod.cause) <= {"coherence", "prefetch"} and htod.bytes.sum() == 4 * MiB
    assert set(htod.src) == {"host"} and set(htod.dst) == {"gpu:0"}
    assert set(df[df.kind == "gpu_page_fault"].detail) == {"read"}
    # CUPTI gives a CPU fault no access type, and the simulator's records are CUPTI's.
    assert set(df[df.kind == "cpu_page_fault"].detail) == {"unknown"}
    assert df[df.kind == "advice"].detail.tolist() == ["set_read_mostly"]
    assert (df.duration >= 0).all()


def test_allocator_events_carry_the_buffer_id():
    with ul.record() as trace:
        buf = ul.DeviceBuffer(size=MiB)
        buf.close()
    ev = trace.events
    mine = ev["address"] == buf.ptr          # (frees of earlier, collected buffers may land here too)
    alloc = ev[(ev["kind"] == EventKind.ALLOC) & mine]
    free = ev[(ev["kind"] == EventKind.FREE) & mine]
    assert alloc["alloc_id"].tolist() == [buf.id] == free["alloc_id"].tolist()
    assert alloc["bytes"].tolist() == [MiB]
    assert {EventKind.SEGMENT_ALLOC, EventKind.SEGMENT_FREE} <= set(ev["kind"].tolist())


def test_failed_allocation_is_an_event():
    with ul.record() as trace, pytest.raises(ul.errors.OutOfMemoryError):
        ul.DeviceBuffer(size="64GiB")
    fail = trace.of_kind(EventKind.ALLOC_FAILURE)
    assert fail["bytes"].tolist() == [64 << 30]


def test_save_and_load_is_exact(tmp_path):
    buf = ul.DeviceBuffer(size=4 * MiB)
    with ul.record() as trace:
        ul.touch(buf, on="host", mode="write")
    path = tmp_path / "trace.npy"
    trace.save(path)
    back = ul.Trace.load(path)
    assert back.events.dtype == EVENT_DTYPE
    np.testing.assert_array_equal(back.events, trace.events)
    np.save(tmp_path / "other.npy", np.zeros(3))
    with pytest.raises(ValueError, match="uvm_lab events"):
        ul.Trace.load(tmp_path / "other.npy")


def row(address: int, kind: EventKind = EventKind.ALLOC) -> bytes:
    return ALLOCATOR_RECORD.pack(kind, 0, 0, address, 0, 0, 0, 0)


def test_queued_records_arrive_in_order_before_a_later_publish():
    bus = EventBus(flush_interval=60)
    seen = []
    bus.subscribe(lambda r: seen.extend(r["address"].tolist()))
    bus.emit(row(1))
    bus.emit(row(2))
    assert seen == []                                   # queued, not yet delivered
    bus.publish(make_events(1, address=3))
    bus.flush()
    assert seen == [1, 2, 3]


def test_a_slow_subscriber_never_holds_the_producer_and_what_it_cannot_hold_is_dropped_and_counted():
    bus = EventBus(flush_interval=60)
    inside, release = threading.Event(), threading.Event()
    called_on, seen = [], []

    def slow(records):
        called_on.append(threading.get_ident())
        inside.set()
        release.wait()
        seen.extend(records["address"].tolist())

    sub = bus.subscribe(slow, limit=10, name="slow plot")
    bus.publish(make_events(1, address=0))
    assert inside.wait(10)                              # the subscriber is stuck on the first record
    for address in range(1, 25):                        # publishing goes on, one record at a time
        bus.publish(make_events(1, address=address))
    assert bus.published == 25
    assert (sub.waiting, sub.dropped) == (11, 13)       # the limit, and the oldest batch besides
    assert [(s.name, s.waiting, s.dropped) for s in bus.subscriptions()] == [("slow plot", 11, 13)]
    release.set()
    bus.flush()
    assert seen == list(range(12)) and sub.waiting == 0
    assert called_on[0] != threading.get_ident()        # called on the subscription's own thread
    assert bus.history()["address"].tolist() == list(range(25))   # the history is the bus's, whole


def test_a_batch_larger_than_the_room_left_is_cut_and_the_rest_counted():
    bus = EventBus()
    inside, release = threading.Event(), threading.Event()
    seen = []

    def stuck(records):
        inside.set()
        release.wait()
        seen.append(records["address"].tolist())

    sub = bus.subscribe(stuck, limit=8)
    bus.publish(make_events(1, address=0))
    assert inside.wait(10)
    bus.publish(make_events(5, address=[1, 2, 3, 4, 5]))           # the oldest waiting: not counted
    bus.publish(make_events(10, address=list(range(6, 16))))
    assert (sub.waiting, sub.dropped) == (13, 2)
    release.set()
    bus.flush()
    assert seen == [[0], [1, 2, 3, 4, 5], list(range(6, 14))]


def test_inline_subscribers_run_in_the_producers_thread_and_see_everything():
    bus = EventBus()
    threads = []
    bus.subscribe(lambda r: threads.append(threading.get_ident()), inline=True, limit=1)
    for _ in range(5):
        bus.publish(make_events(3))
    assert threads == [threading.get_ident()] * 5


def test_flush_inside_locked_does_not_wait_for_a_subscriber_that_publishes():
    bus = EventBus()
    went = threading.Event()
    seen = []

    def echo(records):
        if records["kind"][0] == EventKind.HTOD:
            bus.publish(make_events(1, kind=EventKind.DTOH))   # needs the bus's lock
        went.set()

    def record(records):
        seen.extend(records["kind"].tolist())

    bus.subscribe(echo)
    bus.subscribe(record)
    with bus.locked():
        bus.publish(make_events(1, kind=EventKind.HTOD))
        went.wait(0.2)          # the echo's thread may be waiting for this lock now
        bus.flush()             # and this must not wait for the echo
    bus.flush()
    assert seen == [EventKind.HTOD, EventKind.DTOH]


@pytest.mark.parametrize("args, message", [
    ((42,), "callback must be callable"),
    ((print, [EventKind.HTOD, 300]), "kinds must be EventKind"),
    ((print, ["htod"]), "kinds must be EventKind"),
])
def test_subscribe_refuses_bad_input_and_subscribes_nothing(args, message):
    bus = EventBus()
    with pytest.raises(InvalidArgumentError, match=message):
        bus.subscribe(*args)
    assert bus.subscriptions() == []


@pytest.mark.parametrize("limit", [0, -1, 1.5, True, "10"])
def test_subscribe_refuses_a_bad_limit(limit):
    bus = EventBus()
    with pytest.raises(InvalidArgumentError, match="limit must be a positive number of records"):
        bus.subscribe(print, limit=limit)
    assert bus.subscriptions() == []


def test_a_subscriber_sees_only_what_comes_after_it_and_all_of_it_when_it_leaves():
    bus = EventBus(flush_interval=60)
    bus.emit(row(1))
    seen = []
    sub = bus.subscribe(lambda r: seen.extend(r["address"].tolist()))
    bus.emit(row(2))
    sub.close()
    bus.emit(row(3))
    bus.flush()
    assert seen == [2]
    assert bus.history()["address"].tolist() == [1, 2, 3]


def test_queued_records_are_published_by_the_flusher_every_interval_without_any_reader():
    clock = ManualClock()
    bus = EventBus(flush_interval=0.01, clock=clock)
    seen = []
    bus.subscribe(seen.append)
    bus.emit(row(7))                                    # starts the flusher
    clock.settle(threads=1)
    assert bus.published == 0                           # queued until the interval is up
    clock.advance(0.01)
    clock.settle(threads=1)
    assert bus.published == 1
    assert eventually(lambda: seen) and seen[0]["address"].tolist() == [7]   # on the subscription's own thread


def test_queued_allocator_records_become_full_records():
    bus = EventBus(flush_interval=60)
    bus.emit(ALLOCATOR_RECORD.pack(EventKind.ALLOC, -1, 3, 1 << 47, 5, 7, 8, 9))
    bus.emit(ALLOCATOR_RECORD.pack(EventKind.FREE, 2, 4, 1 << 47, 5, 7, 1 << 40, 0))
    assert bus.history().tolist() == [(EventKind.ALLOC, 0, 0, -1, 3, 3, 1 << 47, 5, 5, 7, 8, 9),
                                      (EventKind.FREE, 0, 0, 2, 4, 4, 1 << 47, 5, 5, 7, 1 << 40, 0)]


def test_flush_hooks_hand_over_their_records_before_a_reader_reads(caplog):
    bus = EventBus()
    held = [make_events(2, kind=EventKind.HTOD, address=[1, 2])]   # a producer's records not yet published
    calls = []

    def hand_over():
        calls.append("hook")
        bus.history()                        # a hook that reads the bus does not run the hooks again
        while held:
            bus.publish(held.pop(0))

    bus.add_flush_hook(hand_over)
    bus.add_flush_hook(hand_over)            # once, however often added
    assert bus.history()["address"].tolist() == [1, 2] and calls == ["hook"]
    bus.remove_flush_hook(hand_over)
    held.append(make_events(1, address=[3]))
    assert bus.history()["address"].tolist() == [1, 2] and calls == ["hook"]
    bus.remove_flush_hook(hand_over)         # removing twice is harmless


def test_a_flush_hook_that_raises_is_logged_and_the_reader_still_gets_the_bus(caplog):
    bus = EventBus()
    bus.publish(make_events(1, address=[7]))

    def broken():
        raise RuntimeError("device gone")

    bus.add_flush_hook(broken)
    with caplog.at_level(logging.ERROR, logger="uvm_lab.events"):
        assert bus.history()["address"].tolist() == [7]
    assert "flush hook" in caplog.text
    with pytest.raises(InvalidArgumentError, match="callable"):
        bus.add_flush_hook("not a function")


def test_bad_input_to_the_bus_is_refused_and_nothing_queued():
    bus = EventBus(flush_interval=60)
    for bad in (b"short", (1, 0, 0, 0, 0, 0, 0, 0), ALLOCATOR_RECORD.pack(1, 0, 0, 0, 0, 0, 0, 0) + b"x"):
        with pytest.raises(InvalidArgumentError, match="64 bytes"):
            bus.emit(bad)
    with pytest.raises(InvalidArgumentError, match="EVENT_DTYPE"):
        bus.publish([1, 2, 3])
    with pytest.raises(InvalidArgumentError, match="1-D"):
        bus.publish(make_events(4).reshape(2, 2))
    for capacity, interval in ((0, 1.0), (True, 1.0), (10, 0), (10, "soon")):
        with pytest.raises(InvalidArgumentError):
            EventBus(capacity, flush_interval=interval)
    bus.emit(row(9))                       # the bus still works, and held nothing of the refused input
    assert bus.history()["address"].tolist() == [9]


def _addresses(records: np.ndarray) -> list[int]:
    return records["address"].tolist()


def test_a_history_reader_takes_what_was_published_since_its_last_take_in_order():
    bus = EventBus(capacity=64)
    bus.publish(make_events(2, address=[0, 1]))
    late, whole = bus.reader("late"), bus.reader("whole", history=True)
    bus.publish(make_events(1, address=2))
    bus.emit(ALLOCATOR_RECORD.pack(int(EventKind.ALLOC), 0, 5, 3, 4096, 7, 0, 0))   # queued: published at a flush
    assert (late.waiting, _addresses(late.take())) == (1, [2])
    bus.flush()
    bus.publish(make_events(2, address=[4, 5]))
    assert late.waiting == 3
    assert _addresses(late.take()) == [3, 4, 5]
    assert (late.waiting, len(late.take())) == (0, 0)   # each record once
    assert _addresses(whole.take()) == [0, 1, 2, 3, 4, 5]   # with the history the bus held when it was made
    assert (late.dropped, whole.dropped) == (0, 0)
    assert [r.name for r in bus.readers()] == ["late", "whole"]


def test_a_history_reader_that_falls_behind_the_history_counts_what_it_missed():
    bus = EventBus(capacity=4)
    reader = bus.reader("slow view")
    for address in range(7):
        bus.publish(make_events(1, address=address))
    assert reader.waiting == 7
    assert _addresses(reader.take()) == [3, 4, 5, 6]   # the newest the bus still holds, never a guess for the rest
    assert reader.dropped == 3
    bus.publish(make_events(1, address=7))
    assert (_addresses(reader.take()), reader.dropped) == ([7], 3)   # keeping up again, it misses nothing more
    assert "3 dropped" in repr(reader)


def test_history_readers_never_see_access_records_and_close_once_done():
    bus = EventBus(capacity=64)
    with bus.reader("view") as reader:
        bus.publish(make_events(2, kind=EventKind.ACCESS))   # the simulator's accesses: not in the history
        bus.publish(make_events(1, kind=EventKind.HTOD, address=9))
        assert _addresses(reader.take()) == [9] and not reader.closed
    assert reader.closed and bus.readers() == []
    with pytest.raises(InvalidArgumentError, match="name must be a str, got 3"):
        bus.reader(3)
    assert bus.readers() == []


def test_history_readers_on_several_threads_take_every_record_once():
    bus = EventBus(capacity=1 << 16)
    reader = bus.reader("shared")
    taken: list[list[int]] = [[], []]
    done = threading.Event()

    def take(into: list[int]) -> None:
        while not done.is_set():
            into.extend(_addresses(reader.take()))
        into.extend(_addresses(reader.take()))

    threads = [threading.Thread(target=take, args=(into,)) for into in taken]
    for t in threads:
        t.start()
    for first in range(0, 3000, 3):
        bus.publish(make_events(3, address=[first, first + 1, first + 2]))
    done.set()
    for t in threads:
        t.join(10)
    assert sorted(taken[0] + taken[1]) == list(range(3000))
    assert all(part == sorted(part) for part in taken)   # each take's records, and the takes, in order


def test_joined_batches_are_a_new_array_in_order_whatever_their_layout():
    from uvm_lab.events.staged import joined

    records = make_events(6, address=np.arange(6))
    out = joined([records[:2], records[::2], records[4:]])   # contiguous, strided, contiguous
    assert _addresses(out) == [0, 1, 0, 2, 4, 4, 5]
    out["address"][0] = 99   # a copy: what was published stays as it was
    assert records["address"][0] == 0 and out.dtype == EVENT_DTYPE
    assert len(joined([])) == 0


def test_a_history_reader_says_when_half_the_history_waits_unread():
    bus = EventBus(capacity=8)
    reader = bus.reader("held back")
    behind = []
    for _ in range(8):
        bus.publish(make_events(1))
        behind.append(reader.falling_behind(1))   # it looks every 2 records (a quarter of the history)
    assert behind == [False, False, False, False, True, False, True, False]   # 5 and 7 of 8 unread
    reader.take()
    bus.publish(make_events(1))
    assert not reader.falling_behind(1) and reader.dropped == 0
