"""What the map infers with no driver record: completed prefetches, unobserved GPU work, and the host watcher.

On a real GPU with tracing off these are the map's only sources besides uvm_lab's own allocator events. The
records here are those the CUDA backend publishes (a PREFETCH that completed with nothing measuring it, an
UNOBSERVED kernel or collapse), on machines of one and of two GPUs, replayed by a tracker on a private bus;
the host's page tables are recorded bitmaps the watcher reads as it would read /proc/self/pagemap.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import uvm_lab as ul
from uvm_lab.errors import BackendError, InvalidArgumentError
from uvm_lab.events import EventBus, EventKind, MemoryKind, make_events
from uvm_lab.events.schema import PREFETCH_IMPLIES_MOVES, Advice, MigrationCause, UnobservedCause
from uvm_lab.events.trace import record
from uvm_lab.page_states import CATEGORY_NAMES, HOST, UNKNOWN, bit, categories, state_name
from uvm_lab.residency_map import ResidencyTracker
from uvm_lab.tracing import HostWatcher, cause_names
from uvm_lab.tracing.inference import moves, prefetch_result

PAGE = 4096
BASE = 0x7F0000000000
N = 16
GPU0, GPU1 = bit(0), bit(1)


@pytest.fixture
def bus():
    return EventBus()


@pytest.fixture
def tracker(bus):
    t = ResidencyTracker(bus, publishes_inferred=True)
    bus.publish(make_events(1, kind=EventKind.SEGMENT_ALLOC, flags=MemoryKind.MANAGED, address=BASE,
                            bytes=N * PAGE, value=N * PAGE, alloc_id=3, dst=0))
    yield t
    t.close()


def states(tracker: ResidencyTracker) -> list[int]:
    return tracker.map(BASE, N * PAGE).states.tolist()


def prefetched(bus: EventBus, dst: int, first: int = 0, pages: int = N, *, implies: bool = True) -> None:
    bus.publish(make_events(1, kind=EventKind.PREFETCH, flags=PREFETCH_IMPLIES_MOVES if implies else 0, dst=dst,
                            address=BASE + first * PAGE, bytes=pages * PAGE, alloc_id=3, start=10, end=20, stream=5))


def set_states(bus: EventBus, values: list[int]) -> None:
    bus.publish(make_events(len(values), kind=EventKind.RESIDENCY, address=BASE + np.arange(len(values)) * PAGE,
                            bytes=PAGE, value=values, alloc_id=3))


# -- completed prefetches --------------------------------------------------------------------------------------
def test_a_completed_prefetch_moves_every_page_and_publishes_what_moved(bus, tracker):
    set_states(bus, [HOST] * 8 + [GPU1] * 4 + [0] * 4)
    with record(bus) as trace:
        prefetched(bus, 0)
    assert states(tracker) == [GPU0] * N
    ev = trace.events
    # The request first, then the moves it implies: HtoD from the host, a peer copy from GPU 1; the
    # untouched pages are populated, which moves nothing.
    assert ev["kind"].tolist() == [EventKind.PREFETCH, EventKind.HTOD, EventKind.DTOD]
    moved = ev[1:]
    assert moved["src"].tolist() == [-1, 1] and (moved["dst"] == 0).all()
    assert moved["bytes"].tolist() == [8 * PAGE, 4 * PAGE]
    assert set(cause_names(moved)) == {"user prefetch (inferred)"}
    assert (moved["start"] == 10).all() and (moved["end"] == 20).all() and (moved["stream"] == 5).all()
    summary = trace.summary()
    assert summary["bytes_htod"] == summary["bytes_inferred"] - 4 * PAGE == 8 * PAGE
    assert summary["bytes_dtod"] == 4 * PAGE


def test_a_prefetch_back_to_the_host_and_of_a_range(bus, tracker):
    prefetched(bus, 1)
    with record(bus) as trace:
        prefetched(bus, -1, first=4, pages=8)
    assert states(tracker) == [GPU1] * 4 + [HOST] * 8 + [GPU1] * 4
    dtoh = trace.of_kind(EventKind.DTOH)
    assert dtoh["src"].tolist() == [1] and dtoh["bytes"].tolist() == [8 * PAGE]


def test_read_mostly_pages_keep_their_copies(bus, tracker):
    set_states(bus, [HOST] * 4 + [GPU1] * 4 + [HOST | GPU1] * 4 + [UNKNOWN | HOST] * 4)
    bus.publish(make_events(1, kind=EventKind.ADVICE, flags=Advice.SET_READ_MOSTLY, address=BASE, bytes=N * PAGE,
                            alloc_id=3, dst=-2))
    with record(bus) as trace:
        prefetched(bus, 0)
    assert states(tracker) == ([HOST | GPU0] * 4 + [GPU0 | GPU1] * 4 + [HOST | GPU0 | GPU1] * 4
                               + [UNKNOWN | HOST | GPU0] * 4)
    copies = trace.of_kind(EventKind.HTOD, EventKind.DTOD)
    assert copies["src"].tolist() == [-1, 1, -1] and copies["bytes"].tolist() == [4 * PAGE, 4 * PAGE, 8 * PAGE]


def test_a_measured_prefetch_only_populates_untouched_pages(bus, tracker):
    """With CUPTI recording transfers, the moves come from its records: none is inferred, none counted twice."""
    set_states(bus, [HOST] * 8 + [0] * 8)
    with record(bus) as trace:
        prefetched(bus, 0, implies=False)
    assert states(tracker) == [HOST] * 8 + [GPU0] * 8
    assert trace.summary()["bytes_htod"] == 0


def test_only_the_publishing_tracker_publishes_and_every_tracker_agrees(bus, tracker):
    quiet = ResidencyTracker(bus)
    quiet.apply(bus.history())          # the allocation, made before it listened
    set_states(bus, [HOST] * N)
    with record(bus) as trace:
        prefetched(bus, 1)
    assert len(trace.of_kind(EventKind.HTOD)) == 1
    assert states(tracker) == quiet.map(BASE, N * PAGE).states.tolist() == [GPU1] * N
    quiet.close()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([0, HOST, GPU0, GPU1, HOST | GPU0, GPU0 | GPU1, UNKNOWN, UNKNOWN | HOST]),
                min_size=1, max_size=40), st.sampled_from([-1, 0, 1]), st.booleans())
def test_replaying_the_moves_of_a_prefetch_changes_nothing_more(old, dst, rm):
    """The inferred moves reach every tracker after the PREFETCH that implied them: they must agree with it."""
    old = np.array(old, dtype=np.uint8)
    rm_pages = np.full(len(old), rm)
    new = prefetch_result(old, rm_pages, dst)
    assert ((new & bit(dst)) != 0).all()
    if not rm:
        assert (new == bit(dst)).all()
    ev = moves(old, new, address=BASE, cause=MigrationCause.USER_INFERRED)
    # Every move lands at dst, comes from a copy the page had, and no page moves twice.
    assert (ev["dst"] == dst).all()
    first = ((ev["address"] - BASE) // PAGE).astype(int).tolist()
    pages = [p for a, n in zip(first, (ev["bytes"] // PAGE).astype(int).tolist(), strict=True)
             for p in range(a, a + n)]
    assert len(set(pages)) == len(pages)
    assert all(old[p] != 0 for p in pages)


# -- unobserved work -------------------------------------------------------------------------------------------
def test_a_kernel_nothing_recorded_leaves_its_pages_unknown_but_the_host_bit(bus, tracker):
    set_states(bus, [HOST] * 4 + [GPU0] * 4 + [GPU1] * 4 + [0] * 4)
    bus.publish(make_events(1, kind=EventKind.UNOBSERVED, flags=UnobservedCause.KERNEL, dst=0, address=BASE,
                            bytes=N * PAGE, alloc_id=3))
    # GPU 0's own pages stay; the rest may have moved to it or been read in place: unknown.
    assert states(tracker) == [UNKNOWN | HOST] * 4 + [GPU0] * 4 + [UNKNOWN] * 8
    counts = tracker.map(BASE, N * PAGE)
    assert counts.counts() == {"gpu": 4, "host": 0, "both": 0, "nowhere": 0, "unknown": 12}
    assert counts.copies() == {"host": 4, "gpu:0": 4}


def test_unsetting_read_mostly_collapses_duplicates_where_the_driver_chooses(bus, tracker):
    set_states(bus, [HOST | GPU0] * 4 + [GPU0 | GPU1] * 4 + [HOST] * 4 + [HOST | GPU1] * 4)
    bus.publish(make_events(1, kind=EventKind.ADVICE, flags=Advice.SET_PREFERRED_LOCATION, dst=1,
                            address=BASE + 12 * PAGE, bytes=4 * PAGE, alloc_id=3))
    bus.publish(make_events(1, kind=EventKind.UNOBSERVED, flags=UnobservedCause.COLLAPSE, dst=-2, address=BASE,
                            bytes=N * PAGE, alloc_id=3))
    # Several copies: one is kept, where the driver chooses (unknown), or at the preferred location if it held one.
    assert states(tracker) == [UNKNOWN | HOST] * 4 + [UNKNOWN] * 4 + [HOST] * 4 + [GPU1] * 4


@pytest.mark.parametrize("read_mostly", [False, True])
def test_host_code_leaves_its_pages_on_the_host(bus, tracker, read_mostly):
    set_states(bus, [0] * 4 + [GPU0] * 4 + [HOST | GPU1] * 4 + [UNKNOWN] * 4)
    if read_mostly:
        bus.publish(make_events(1, kind=EventKind.ADVICE, flags=Advice.SET_READ_MOSTLY, address=BASE,
                                bytes=N * PAGE, alloc_id=3, dst=-2))
    bus.publish(make_events(1, kind=EventKind.UNOBSERVED, flags=UnobservedCause.HOST, dst=-1, address=BASE,
                            bytes=8 * PAGE, value=1, alloc_id=3))        # a read of the first half
    bus.publish(make_events(1, kind=EventKind.UNOBSERVED, flags=UnobservedCause.HOST, dst=-1,
                            address=BASE + 12 * PAGE, bytes=4 * PAGE, value=2, alloc_id=3))   # a write
    # A ReadMostly read copies a page in beside its copies; any other access leaves the host's copy alone.
    middle = [HOST | GPU0] * 4 if read_mostly else [HOST] * 4
    assert states(tracker) == [HOST] * 4 + middle + [HOST | GPU1] * 4 + [HOST] * 4


# -- the watcher, on recorded page tables ------------------------------------------------------------------
class RecordedHost:
    """The host's page tables as a test sets them; ``moving`` pages read differently on every read."""

    def __init__(self) -> None:
        self.present = np.zeros(N, dtype=bool)
        self.moving = np.zeros(N, dtype=bool)
        self.reads = 0

    def __call__(self, address: int, size: int) -> np.ndarray:
        assert address == BASE
        self.reads += 1
        return np.where(self.moving, self.reads % 2 == 1, self.present)


@pytest.mark.parametrize("gpus", [1, 2])
def test_the_watcher_settles_a_kernels_pages_from_the_host_tables(bus, tracker, gpus):
    host = RecordedHost()
    watcher = HostWatcher(tracker=tracker, gpus=gpus, read_host=host, now=lambda: 777)
    host.present[:8] = True
    with record(bus) as trace:
        first = watcher.check()
    assert first.first_touch == 8 and states(tracker) == [HOST] * 8 + [0] * 8
    assert trace.of_kind(EventKind.CPU_PAGE_FAULT)["start"].tolist() == [777]
    # A kernel on GPU 0 with tracing off: it faulted pages 0-3 away from the host and first-touched 8-15.
    bus.publish(make_events(1, kind=EventKind.UNOBSERVED, flags=UnobservedCause.KERNEL, dst=0, address=BASE,
                            bytes=N * PAGE, alloc_id=3))
    host.present[:4] = False
    found = watcher.check()
    after = states(tracker)
    assert after[4:8] == [HOST] * 4                                # not ReadMostly: the host's only copy
    if gpus == 1:
        assert after[:4] == [GPU0] * 4 and after[8:] == [GPU0] * 8
        assert found.htod == 4 and found.learned == 12          # pages 4-15: nothing moved, the host told
    else:                                                           # which GPU? The host cannot say
        assert after[:4] == [UNKNOWN] * 4 and after[8:] == [UNKNOWN] * 8
    assert watcher.check().unrecorded == 0
    status = watcher.status()
    assert status["rounds"] == 3 and status["pages"] == 3 * N and status["first_touch"] == 8
    assert "3 rounds" in repr(watcher)


def test_the_watcher_leaves_pages_in_motion_alone(bus, tracker):
    host = RecordedHost()
    watcher = HostWatcher(tracker=tracker, gpus=1, read_host=host, now=lambda: 1)
    host.present[:] = True
    host.moving[:4] = True
    found = watcher.check()
    assert found.first_touch == 12 and states(tracker) == [0] * 4 + [HOST] * 12


def test_the_watcher_checks_its_arguments(tracker):
    for kwargs in ({"interval": 0}, {"interval": True}, {"interval": "1"}, {"gpus": 0}, {"tracker": object()},
                   {"read_host": 3}):
        with pytest.raises(InvalidArgumentError):
            HostWatcher(**kwargs)
    with pytest.raises(InvalidArgumentError):
        HostWatcher(tracker=tracker, gpus=1).check(repair="no")


def test_the_simulator_is_never_watched(sim_backend):
    assert ul.tracing.get_watcher() is None or not ul.tracing.get_watcher().running
    with pytest.raises(BackendError, match="simulated"):
        ul.tracing.watch()
    with pytest.raises(InvalidArgumentError, match="real GPU"):
        ul.use_backend("sim", watch=True)
    with pytest.raises(InvalidArgumentError):
        ul.use_backend("sim", watch="yes")


# -- several GPUs --------------------------------------------------------------------------------------------
def test_two_gpus_are_two_places_in_the_map_its_counts_and_its_names(bus, tracker):
    """Recorded events of a two-GPU machine: CUPTI's HtoD to each GPU, a peer copy, a read-duplicate."""
    ev = make_events(4, kind=[EventKind.HTOD, EventKind.HTOD, EventKind.HTOD, EventKind.DTOD],
                     flags=MigrationCause.COHERENCE, src=[-1, -1, -1, 0], dst=[0, 1, 0, 1],
                     address=BASE + np.array([0, 4, 12, 12]) * PAGE, bytes=4 * PAGE, alloc_id=3)
    set_states(bus, [HOST] * N)
    bus.publish(ev)
    m = tracker.map(BASE, N * PAGE)
    assert m.states.tolist() == [GPU0] * 4 + [GPU1] * 4 + [HOST] * 4 + [GPU1] * 4
    assert m.copies() == {"host": 4, "gpu:0": 4, "gpu:1": 8}
    assert m.counts()["gpu"] == 12
    assert m.runs() == [(0, 4, "gpu:0"), (4, 4, "gpu:1"), (8, 4, "host"), (12, 4, "gpu:1")]
    names = [CATEGORY_NAMES[c] for c in categories(m.states)]
    assert names[0] == "gpu:0" and names[4] == "gpu:1" and names[8] == "host"
    assert "gpu:1 8" in repr(m)


def test_page_state_names_and_categories():
    assert [state_name(s) for s in (0, HOST, GPU0, GPU1, HOST | GPU1, UNKNOWN, UNKNOWN | HOST)] == [
        "nowhere", "host", "gpu:0", "gpu:1", "host+gpu:1", "unknown", "host+unknown"]
    assert [CATEGORY_NAMES[c] for c in categories(np.array([0, 1, 3, 0x80, 0x81, 6, 4], np.uint8))] == [
        "nowhere", "host", "both", "unknown", "unknown", "gpus", "gpu:1"]
    assert bit(-1) == HOST and bit(0) == GPU0 and bit(6) == UNKNOWN and bit(-2) == UNKNOWN
    with pytest.raises(InvalidArgumentError):
        state_name(256)


# -- the bus ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("inline", [True, False], ids=["inline", "on-its-own-thread"])
def test_a_subscriber_that_publishes_is_heard_after_the_batch_by_everyone(bus, inline):
    heard: dict[str, list[int]] = {"first": [], "second": []}
    follow = make_events(1, kind=EventKind.DTOH)

    def first(records: np.ndarray) -> None:
        heard["first"] += records["kind"].tolist()
        if records["kind"][0] == EventKind.HTOD:
            bus.publish(follow)

    bus.subscribe(first, inline=inline)
    bus.subscribe(lambda r: heard["second"].extend(r["kind"].tolist()))
    bus.publish(make_events(1, kind=EventKind.HTOD))
    bus.publish(make_events(1, kind=EventKind.ADVICE))
    bus.flush()
    order = bus.history()["kind"].tolist()
    assert heard["first"] == heard["second"] == order                 # everyone hears one order
    assert order[0] == EventKind.HTOD and sorted(order) == [EventKind.HTOD, EventKind.DTOH, EventKind.ADVICE]
    if inline:   # published as the batch is: right after it, before what the producer publishes next
        assert order[:2] == [EventKind.HTOD, EventKind.DTOH]
