"""Replay: a recorded trace run again on a fresh simulated GPU, the same or with one choice changed."""

from __future__ import annotations

import numpy as np
import pytest

import uvm_lab as ul
from uvm_lab.backends.sim import SimBackend
from uvm_lab.errors import InvalidArgumentError, InvalidLocationError
from uvm_lab.events import EventKind, make_events
from uvm_lab.events.bus import EventBus
from uvm_lab.trace_replay import PREFETCH_CHOICES, measured
from uvm_lab.workloads import POLICIES, WORKLOADS, make, run_sim

from .test_bounded_events import Stalling

MiB = 1 << 20
MEASURES = ("bytes_htod", "bytes_dtoh", "bytes_evicted", "gpu_faults", "cpu_faults")


def recorded(name: str, policy: str, device_memory: str, **params: object) -> ul.Trace:
    """A catalog workload run on its own simulated GPU, recorded with its accesses."""
    bus = EventBus()
    with ul.record(bus, accesses=True, limit=1 << 22) as trace:
        run_sim(make(name, **params), SimBackend(device_memory, bus=bus), policy=policy)
    assert not trace.missed
    return trace


@pytest.mark.parametrize("device_memory", ["256MiB", "96MiB"])   # fits; oversubscribed 1.7x
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", WORKLOADS)
def test_a_simulator_trace_replayed_as_it_was_moves_the_same_bytes_in_the_same_time(name, policy, device_memory):
    trace = recorded(name, policy, device_memory, size="160MiB")
    replayed = ul.replay(trace, device_memory=device_memory)

    original = measured(trace)
    assert replayed.exact and replayed.note == ""
    assert {k: getattr(replayed, k) for k in MEASURES} == {k: original[k] for k in MEASURES}
    assert replayed.seconds == pytest.approx(original["seconds"], rel=0.01)
    assert original["seconds"] > 0 and len(trace.of_kind(EventKind.ACCESS))   # it ran, and its accesses are in


def test_what_if_the_gpu_had_more_memory():
    trace = recorded("multi_pass_stream", "faults", "64MiB", size="96MiB", passes=3)
    small, large = ul.replay(trace, device_memory="64MiB"), ul.replay(trace, device_memory="1GiB")

    assert small.bytes_evicted > 0 and large.bytes_evicted == 0
    assert large.bytes_htod == 96 * MiB   # each page comes over once, and stays
    assert large.seconds < small.seconds


def test_prefetch_choices_change_what_faults():
    ul.use_backend("sim", device_memory="1GiB")
    with ul.record(accesses=True) as trace:
        buf = ul.DeviceBuffer(size="64MiB")
        ul.touch(buf, on="host", mode="write")
        buf.prefetch("gpu")
        ul.touch(buf, on="gpu")
    results = {choice: ul.replay(trace, prefetch=choice) for choice in PREFETCH_CHOICES}

    assert results["recorded"].gpu_faults == 0   # the recorded prefetch brought it over before the kernel
    assert results["none"].gpu_faults > 0 and results["none"].bytes_htod == 64 * MiB
    assert results["on_access"].gpu_faults == 0
    assert results["none"].seconds > results["recorded"].seconds
    # Besides the recorded one, on allocation, to the GPU, before the host writes it: made there, every page goes
    # to the host for the write, and back with the recorded prefetch.
    on_allocate = results["on_allocate"]
    assert (on_allocate.bytes_dtoh, on_allocate.bytes_htod) == (64 * MiB, 64 * MiB)
    assert results["needed"].as_dict() == results["recorded"].as_dict()   # the one prefetch moved it all


def test_only_the_prefetches_that_move_something_are_kept_where_asked():
    ul.use_backend("sim", device_memory="1GiB")
    with ul.record(accesses=True) as trace:
        buf = ul.DeviceBuffer(size="64MiB")
        ul.touch(buf, on="host", mode="write")
        for _ in range(20):
            buf.prefetch("gpu")   # the first moves it; the rest find it there
            ul.touch(buf, on="gpu", size="1MiB")
    recorded, needed = ul.replay(trace), ul.replay(trace, prefetch="needed")

    assert needed.bytes_htod == recorded.bytes_htod == 64 * MiB and needed.gpu_faults == 0
    assert needed.seconds < recorded.seconds


def test_a_prefetch_choice_for_one_allocation_leaves_the_others_as_recorded():
    ul.use_backend("sim", device_memory="1GiB")
    with ul.record(accesses=True) as trace:
        a, b = ul.DeviceBuffer(size="16MiB"), ul.DeviceBuffer(size="16MiB")
        for buf in (a, b):
            ul.touch(buf, on="host", mode="write")
            buf.prefetch("gpu")
            ul.touch(buf, on="gpu")
    ids = trace.events["alloc_id"][trace.events["kind"] == EventKind.ALLOC].tolist()
    one = ul.replay(trace, prefetch={ids[0]: "none"})

    assert one.gpu_faults == ul.replay(trace, prefetch="none").gpu_faults // 2 > 0
    with pytest.raises(InvalidArgumentError, match="it allocates"):
        ul.replay(trace, prefetch={12345678: "none"})
    with pytest.raises(InvalidArgumentError, match="on_access"):
        ul.replay(trace, prefetch={ids[0]: "sometimes"})


def test_advice_set_on_an_allocation_replaces_what_the_trace_set():
    ul.use_backend("sim", device_memory="1GiB")
    with ul.record(accesses=True) as trace:
        buf = ul.DeviceBuffer(size="32MiB")
        buf.read_mostly = True   # the trap: a buffer the GPU writes
        for _ in range(3):
            ul.touch(buf, on="host", mode="write")
            ul.touch(buf, on="gpu", mode="write")
    alloc_id = int(trace.events["alloc_id"][trace.events["kind"] == EventKind.ALLOC][0])
    as_recorded = ul.replay(trace)
    without = ul.replay(trace, set_advice={alloc_id: {}})
    none = ul.replay(trace, advice="none")
    preferred = ul.replay(trace, set_advice={alloc_id: {"preferred_location": "host", "accessed_by": "gpu"}})

    assert (without.seconds, without.bytes_htod) == (none.seconds, none.bytes_htod)
    assert without.seconds < as_recorded.seconds
    assert preferred.bytes_htod == 0   # the GPU writes the host's pages over the link: nothing migrates
    assert as_recorded.seconds == pytest.approx(measured(trace)["seconds"], rel=0.01)


def test_a_trace_without_accesses_replays_its_faults_as_a_lower_bound():
    ul.use_backend("sim", device_memory="64MiB")
    with ul.record() as faults_only:
        buf = ul.DeviceBuffer(size="48MiB")
        ul.touch(buf, on="host", mode="write")
        for _ in range(3):
            ul.touch(buf, on="gpu")
    assert not (faults_only.events["kind"] == EventKind.ACCESS).any()
    replayed = ul.replay(faults_only)

    assert not replayed.exact and "lower bound" in replayed.note
    assert replayed.bytes_htod == measured(faults_only)["bytes_htod"] == 48 * MiB
    assert ul.replay(faults_only, device_memory="16MiB").bytes_evicted > 0   # the faults still overflow it


def test_memory_allocated_before_the_recording_is_named_not_replayed():
    buf = ul.DeviceBuffer(size="8MiB")
    with ul.record(accesses=True) as trace:
        ul.touch(buf, on="gpu")
    replayed = ul.replay(trace)

    assert not replayed.exact
    assert "allocated before the recording began" in replayed.note
    assert replayed.bytes_htod == 0


def test_a_saved_trace_replays_as_the_one_recorded(tmp_path):
    trace = recorded("stencil", "faults", "64MiB", size="96MiB")
    trace.save(tmp_path / "run.uvmtrace")
    loaded = ul.Trace.load(tmp_path / "run.uvmtrace")

    assert ul.replay(loaded, device_memory="64MiB").as_dict() == ul.replay(trace, device_memory="64MiB").as_dict()


def test_the_replay_can_keep_its_own_trace_and_it_replays_in_turn():
    trace = recorded("random_gather", "faults", "32MiB", size="48MiB", count=4096)
    first = ul.replay(trace, device_memory="32MiB", keep_trace=True)

    assert first.trace is not None and not first.trace.missed
    assert ul.replay(first.trace, device_memory="32MiB").as_dict() == first.as_dict()
    assert ul.replay(trace, device_memory="32MiB").trace is None


def test_accesses_are_published_only_to_a_recording_that_asks():
    bus = ul.events.get_bus()
    buf = ul.DeviceBuffer(size="4MiB")
    seen: list[np.ndarray] = []
    with bus.subscribe(seen.append, name="every kind, by default"):
        with ul.record() as plain:
            assert not bus.wants_accesses
            ul.touch(buf, on="gpu")
        with ul.record(accesses=True) as full:
            assert bus.wants_accesses
            ul.touch(buf, on="host")
        bus.flush()
    assert not bus.wants_accesses

    def kinds(events: np.ndarray) -> set[int]:
        return set(events["kind"].tolist())

    assert EventKind.ACCESS not in kinds(plain.events)
    assert EventKind.ACCESS in kinds(full.events)
    assert all(EventKind.ACCESS not in kinds(batch) for batch in seen)   # nor to anyone else
    assert EventKind.ACCESS not in kinds(bus.history())


def test_access_records_read_as_what_was_done():
    with ul.record(accesses=True) as trace:
        buf = ul.DeviceBuffer(size="4MiB")
        ul.touch(buf, on="host", mode="write", offset="1MiB", size="2MiB")
    table = trace.to_pandas()
    access = table[table["kind"] == "access"].iloc[0]

    assert (access["src"], access["detail"], access["bytes"]) == ("host", "write", 2 * MiB)
    assert access["address"] == buf.ptr + MiB
    assert access["source"].startswith("test_trace_replay.py:")   # the user's line, as every event has


def test_a_batch_mixing_accesses_with_other_records_is_refused():
    bus = EventBus()
    got: list[np.ndarray] = []
    bus.subscribe(got.append, inline=True)
    mixed = make_events(2, kind=[EventKind.ACCESS, EventKind.HTOD])
    with pytest.raises(InvalidArgumentError, match="batches of their own"):
        bus.publish(mixed)
    assert not got and bus.published == 0


@pytest.fixture
def small_trace() -> ul.Trace:
    with ul.record(accesses=True) as trace:
        buf = ul.DeviceBuffer(size="4MiB")
        ul.touch(buf, on="gpu")
    return trace


@pytest.mark.parametrize(("options", "error", "names"), [
    ({"prefetch": "always"}, InvalidArgumentError, "recorded, needed, none, on_access, on_allocate"),
    ({"advice": "some"}, InvalidArgumentError, "recorded, none"),
    ({"device_memory": "lots"}, InvalidArgumentError, "lots"),
    ({"device_memory": "1MiB"}, InvalidArgumentError, "2 MiB"),
    ({"platform": "quantum"}, InvalidArgumentError, "quantum"),
    ({"set_advice": [1]}, InvalidArgumentError, "alloc_id"),
    ({"set_advice": {999_999: {}}}, InvalidArgumentError, "999999"),
    ({"keep_trace": "yes"}, InvalidArgumentError, "keep_trace"),
])
def test_bad_options_are_refused_before_anything_runs(small_trace, options, error, names):
    before = ul.get_backend()
    with pytest.raises(error, match=names):
        ul.replay(small_trace, **options)
    assert ul.get_backend() is before


def test_bad_advice_is_refused(small_trace):
    alloc_id = int(small_trace.events["alloc_id"][small_trace.events["kind"] == EventKind.ALLOC][0])
    with pytest.raises(InvalidArgumentError, match="read_mostly, preferred_location, accessed_by"):
        ul.replay(small_trace, set_advice={alloc_id: {"read_only": True}})
    with pytest.raises(InvalidArgumentError, match="True or False"):
        ul.replay(small_trace, set_advice={alloc_id: {"read_mostly": "yes"}})
    with pytest.raises(InvalidLocationError, match="mars"):
        ul.replay(small_trace, set_advice={alloc_id: {"preferred_location": "mars"}})


def test_a_trace_that_missed_records_or_is_not_a_trace_is_refused():
    with pytest.raises(InvalidArgumentError, match="Trace"):
        ul.replay(np.zeros(3))
    with pytest.raises(InvalidArgumentError, match="accesses must be True or False"), ul.record(accesses=1):
        pass
    bus = EventBus()
    Stalling.release.clear()
    Stalling.copying.clear()
    try:
        with ul.record(bus, limit=1) as trace:
            bus.publish(make_events(1, kind=EventKind.HTOD, bytes=4096).view(Stalling))   # its thread is stuck
            assert Stalling.copying.wait(10)
            for _ in range(3):
                bus.publish(make_events(1, kind=EventKind.DTOH, bytes=4096))
            Stalling.release.set()
    finally:
        Stalling.release.set()
    assert trace.missed == 1   # one waiting besides the stuck batch, as limit=1 allows: the third was dropped
    with pytest.raises(InvalidArgumentError, match="missed 1 records"):
        ul.replay(trace)
