"""The CUPTI collector's life cycle, on a stand-in for cupti-python (CI has no GPU and no CUPTI).

The stand-in keeps cupti-python's surface (the calls the collector makes, their arguments, errors with a
``status``, record objects with a ``ptr`` into CUPTI's buffer) and delivers records the test writes in
CUPTI's binary layout. The real library runs in tests/gpu/test_cupti_residency.py.
"""

from __future__ import annotations

import ctypes
import sys
import threading
import time
import types
import warnings

import numpy as np
import pytest

import uvm_lab.tracing.cupti as collector_module
from uvm_lab.errors import BackendError, InvalidArgumentError, InvalidStateError
from uvm_lab.events import EventBus, EventKind, MemoryKind, make_events
from uvm_lab.events.trace import record
from uvm_lab.tracing import CUPTI_UM_COUNTER3_DTYPE, CuptiCollector, TracingUnavailableWarning

MiB = 1 << 20
BASE = 0x7F0000000000
LAG = 5_000_000          # the stand-in's CUPTI clock runs 5 ms behind the backend's


class CuptiError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"ERROR ({status})")
        self.status = status


class Record:
    """What cupti-python hands the buffer callback: an object over the record's bytes in the buffer."""

    def __init__(self, buffer: np.ndarray, i: int) -> None:
        self.ptr = buffer.ctypes.data + i * buffer.itemsize
        self._r = buffer[i]
        self.kind = int(self._r["kind"])

    def __getattr__(self, name):
        field = "flags" if name == "flags_" else name
        return int(self._r[field])


class FakeCupti(types.ModuleType):
    def __init__(self) -> None:
        super().__init__("cupti.cupti")
        self.callbacks = None
        self.configured: list[int] = []
        self.enabled: set[int] = set()
        self.period = None
        self.pending: list[np.ndarray] = []
        self.enable_error: int | None = None
        self.dropped = 0
        self.contiguous = True
        self.flushes = 0
        self.lock = threading.Lock()          # CUPTI delivers one flush at a time

    def activity_register_callbacks(self, requested, completed):
        self.callbacks = (requested, completed)

    def activity_configure_unified_memory_counter(self, ptr, count):
        raw = np.frombuffer((ctypes.c_uint8 * (16 * count)).from_address(ptr), dtype=np.uint32).reshape(count, 4)
        assert (raw[:, 3] == 1).all()          # every counter asked for is enabled
        self.configured = sorted(raw[:, 1].tolist())

    def activity_enable(self, kind):
        if self.enable_error is not None:
            raise CuptiError(self.enable_error)
        self.enabled.add(kind)

    def activity_disable(self, kind):
        self.enabled.discard(kind)

    def activity_flush_period(self, ms):
        self.period = ms

    def activity_flush_all(self, flag):
        requested, completed = self.callbacks
        size, _ = requested()
        assert size > 0
        with self.lock:
            self.flushes += 1
            while self.pending:
                buf = self.pending.pop(0)
                objects = [Record(buf, i) for i in range(len(buf))]
                if not self.contiguous:
                    objects.reverse()
                completed(objects)

    def activity_get_num_dropped_records(self, context, stream, ptr):
        ctypes.c_uint64.from_address(ptr).value, self.dropped = self.dropped, 0

    def get_timestamp(self):
        return time.perf_counter_ns() - LAG

    def deliver(self, rows: list[tuple]) -> None:
        buf = np.zeros(len(rows), dtype=CUPTI_UM_COUNTER3_DTYPE)
        for i, (kind, value, start, address, src, dst, flags) in enumerate(rows):
            buf[i] = (25, kind, value, start, start + 1000, address, src, dst, 0xFFFFFFFF, 1, flags, 0, (0,) * 5)
        with self.lock:
            self.pending.append(buf)


@pytest.fixture
def fake(monkeypatch):
    module = FakeCupti()
    package = types.ModuleType("cupti")
    package.cupti = module
    monkeypatch.setitem(sys.modules, "cupti", package)
    monkeypatch.setitem(sys.modules, "cupti.cupti", module)
    for name, value in (("_active", None), ("_registered", None), ("_keepalive", []), ("_libcupti", None)):
        monkeypatch.setattr(collector_module, name, value)
    monkeypatch.setattr(collector_module, "_warned", set())
    return module


@pytest.fixture
def bus():
    bus = EventBus()
    bus.publish(make_events(1, kind=EventKind.SEGMENT_ALLOC, flags=MemoryKind.MANAGED, address=BASE, bytes=4 * MiB,
                            value=4 * MiB, alloc_id=21, start=time.perf_counter_ns()))
    return bus


def test_records_flow_decoded_attributed_and_on_the_backends_clock(fake, bus):
    with CuptiCollector(bus=bus, device=0) as cupti, record(bus) as trace:
        assert cupti.running and cupti.receiver == "objects" and 25 in fake.enabled
        now = fake.get_timestamp()
        fake.deliver([(1, 65536, now, BASE, 0xFFFFFFFF, 0, 2),
                      (2, 4096, now + 10, BASE + 3 * MiB, 0, 0xFFFFFFFF, 1),
                      (4, 2, now + 20, BASE + 8192, 0, 0xFFFFFFFF, 2),
                      (1, 4096, now + 30, 0x1000, 0xFFFFFFFF, 0, 2)])      # memory uvm_lab did not allocate
        cupti.flush()
    ev = trace.of_kind(EventKind.HTOD, EventKind.DTOH, EventKind.GPU_PAGE_FAULT)
    assert ev["kind"].tolist() == [1, 2, 4, 1]
    assert ev["alloc_id"].tolist() == [21, 21, 21, 0]
    assert trace.summary()["bytes_htod"] == 65536 + 4096 and trace.summary()["bytes_dtoh"] == 4096
    assert abs(int(ev["start"][0]) - (now + LAG)) < 2_000_000    # within 2 ms of the shifted clock
    assert cupti.status()["records"] == 4 and cupti.status()["unattributed"] == 1
    assert not cupti.running and 25 not in fake.enabled and fake.period == 0


def test_the_counters_asked_for_are_the_ones_configured(fake, bus):
    with CuptiCollector(bus=bus):
        assert fake.configured == [1, 2, 3, 5, 6, 7, 8]            # GPU faults are opt-in
    with CuptiCollector(bus=bus, gpu_faults=True, cpu_faults=False):
        assert fake.configured == [1, 2, 4, 5, 6, 7, 8]
    with CuptiCollector(bus=bus, counters=["htod", "dtoh"], flush_interval=0.25):
        assert fake.configured == [1, 2] and fake.period == 250


def test_records_out_of_buffer_order_are_read_one_object_at_a_time(fake, bus):
    fake.contiguous = False
    with CuptiCollector(bus=bus) as cupti, record(bus) as trace:
        t = fake.get_timestamp()
        fake.deliver([(1, 8192, t, BASE, 0xFFFFFFFF, 0, 3), (2, 4096, t + 5, BASE + 4096, 0, 0xFFFFFFFF, 4)])
        cupti.flush()
    assert sorted(trace.events["bytes"].tolist()) == [4096, 8192]
    assert set(trace.events["alloc_id"].tolist()) == {21}


def test_dropped_records_are_counted_and_shown(fake, bus):
    with CuptiCollector(bus=bus) as cupti:
        fake.dropped = 17
        cupti.flush()
        assert cupti.dropped == 17 and "17 dropped" in repr(cupti)
        assert not cupti.status()["complete"] and "17" in cupti.status()["warning"]


def test_reading_the_bus_drains_cupti_while_the_collector_runs(fake, bus):
    with CuptiCollector(bus=bus, drain_interval=10) as cupti, record(bus) as trace:
        t = fake.get_timestamp()
        fake.deliver([(1, 8192, t, BASE, 0xFFFFFFFF, 0, 2)])
        assert trace.summary()["bytes_htod"] == 8192          # no cupti.flush(): the trace's read drained it
        assert cupti.status()["complete"] and cupti.status()["warning"] == ""
    before = fake.flushes
    bus.flush()                                              # stopped: no longer the bus's hook
    assert fake.flushes == before


def test_a_drain_that_brings_a_full_cupti_queue_marks_the_record_incomplete(fake, bus):
    limit = collector_module.CUPTI_UM_QUEUE_RECORDS

    def migrations(n):
        t = fake.get_timestamp()
        return [(1, 4096, t + i, BASE + 4096 * (i % 1024), 0xFFFFFFFF, 0, 2) for i in range(n)]

    with CuptiCollector(bus=bus, drain_interval=10) as cupti:
        for n in (limit - 1, 3 * limit):                    # any other count: CUPTI kept up (a host write's faults)
            fake.deliver(migrations(n))
            cupti.flush()
            assert cupti.status()["complete"]
        fake.deliver(migrations(limit))                     # exactly a full queue: what lossy drains bring
        cupti.flush()
        status = cupti.status()
    assert not status["complete"] and status["saturated"] == 1 and status["max_per_drain"] == 3 * limit
    assert "probably lost" in status["warning"] and "incomplete" in repr(cupti)


def test_one_collector_at_a_time(fake, bus):
    with CuptiCollector(bus=bus), pytest.raises(InvalidStateError, match="another CuptiCollector"):
        CuptiCollector(bus=bus).start()
    with CuptiCollector(bus=bus) as again:     # free again after the first stopped
        assert again.running


@pytest.mark.parametrize(("status", "words"), [(13, "context does not exist"), (31, "MPS"), (33, "vGPU"),
                                                 (39, "another CUPTI client")])
def test_cupti_refusals_are_explained_once_and_leave_the_collector_inert(fake, bus, status, words):
    fake.enable_error = status
    with pytest.warns(TracingUnavailableWarning, match=words):
        cupti = CuptiCollector(bus=bus).start()
    assert not cupti.running and words in cupti.reason
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # the same reason is not repeated
        CuptiCollector(bus=bus).start()
    cupti.flush()                               # inert collectors still answer
    cupti.stop()
    with pytest.raises(BackendError, match=words):
        CuptiCollector(bus=bus, required=True).start()


def test_without_cupti_python_the_reason_names_the_extra(monkeypatch, bus):
    monkeypatch.setitem(sys.modules, "cupti", None)     # import fails as if not installed
    monkeypatch.setattr(collector_module, "_warned", set())
    with pytest.warns(TracingUnavailableWarning, match=r"uvm_lab\[cupti\]"):
        cupti = CuptiCollector(bus=bus).start()
    assert not cupti.running and collector_module.cupti_status()["installed"] is False


@pytest.mark.parametrize("kwargs", [{"gpu_faults": 1}, {"counters": "htod"}, {"counters": ["pages"]}, {"counters": []},
                                    {"device": -1}, {"flush_interval": 0}, {"drain_interval": 0},
                                    {"buffer_size": 100}, {"buffer_size": (1 << 20) + 4}, {"decoder": "fast"},
                                    {"bus": "bus"}])
def test_bad_arguments_are_refused(kwargs):
    with pytest.raises(InvalidArgumentError):
        CuptiCollector(**kwargs)


def test_check_host_finds_what_cupti_lost_and_repairs_the_map(fake):
    """Real host pages (an anonymous mapping: /proc/self/pagemap is the oracle), records from the stand-in."""
    import mmap

    from uvm_lab.residency_map import GPU, HOST, ResidencyTracker

    pages = 8
    region = mmap.mmap(-1, pages * 4096)
    memory = np.frombuffer(region, dtype=np.uint8)
    base = memory.ctypes.data
    memory[: 4 * 4096: 4096] = 1                       # the host holds pages 0-3; 4-7 were never touched
    bus = EventBus()
    tracker = ResidencyTracker(bus)
    bus.publish(make_events(1, kind=EventKind.SEGMENT_ALLOC, flags=MemoryKind.MANAGED, address=base,
                            bytes=pages * 4096, value=pages * 4096, alloc_id=5, start=time.perf_counter_ns()))
    try:
        with CuptiCollector(bus=bus, device=0) as cupti:
            # CUPTI's records of the host's first touches, a CPU fault a page; the HtoD of pages 4-7 that
            # followed never arrives.
            now = fake.get_timestamp()
            fake.deliver([(3, 0x4000, now + i, base + i * 4096, 0xFFFFFFFF, 0xFFFFFFFF, 0) for i in range(pages)])
            cupti.flush()
            assert tracker.map(base, pages * 4096).states.tolist() == [HOST] * pages
            assert cupti.status()["complete"]
            with pytest.raises(InvalidArgumentError, match="bus of its own"):
                cupti.check_host()
            with record(bus) as trace:
                found = cupti.check_host(tracker=tracker)
            assert (found.htod, found.dtoh, found.first_touch, found.unrecorded) == (4, 0, 0, 4)
            assert tracker.map(base, pages * 4096).states.tolist() == [HOST] * 4 + [GPU] * 4
            assert trace.summary()["bytes_htod"] == 4 * 4096
            status = cupti.status()
            assert status["unrecorded"] == 4 and not status["complete"] and "no record" in status["warning"]
            assert cupti.check_host(tracker=tracker).unrecorded == 0      # repaired: nothing more to find
            with pytest.raises(InvalidArgumentError):
                cupti.check_host(tracker=tracker, repair="yes")
            with pytest.raises(InvalidArgumentError):
                cupti.check_host(tracker=bus)
    finally:
        tracker.close()


def test_check_host_needs_a_started_collector(fake, bus):
    from uvm_lab.residency_map import ResidencyTracker

    with pytest.raises(InvalidStateError, match="never started"):
        CuptiCollector(bus=bus).check_host(tracker=ResidencyTracker(bus))


def test_the_host_watcher_counts_what_cupti_lost_in_the_collectors_status(fake):
    """While CUPTI runs, a watcher round that finds pages moved with no record counts them as CUPTI's loss."""
    from uvm_lab.residency_map import ResidencyTracker
    from uvm_lab.tracing import HostWatcher

    base, pages = 0x7F0000000000, 8
    bus = EventBus()
    tracker = ResidencyTracker(bus)
    bus.publish(make_events(1, kind=EventKind.SEGMENT_ALLOC, flags=MemoryKind.MANAGED, address=base,
                            bytes=pages * 4096, value=pages * 4096, alloc_id=5))
    host = np.zeros(pages, dtype=bool)
    host[:3] = True                               # the host touched three pages; no CPU fault record came
    watcher = HostWatcher(tracker=tracker, gpus=1, read_host=lambda address, size: host.copy(), now=lambda: 1)
    try:
        with CuptiCollector(bus=bus, device=0) as cupti:
            assert cupti.status()["complete"]
            assert watcher.check().first_touch == 3
            status = cupti.status()
            assert status["unrecorded"] == 3 and not status["complete"] and "no record" in status["warning"]
            watcher.check()
            assert cupti.status()["unrecorded"] == 3          # repaired: counted once
        with pytest.raises(InvalidArgumentError):
            cupti.account("3 pages")
    finally:
        tracker.close()
