"""What the host's page tables say the map missed, and the events that close the gap.

The maps here are built from events on a private bus and tracker, as on a GPU; the "host" is a bitmap the test
chooses (on a GPU it comes from /proc/self/pagemap). After the inferred events are published the map must place
exactly the host's pages on the host, say where the rest went as far as the host's side can tell (the one GPU
of a one-GPU machine; unknown on a machine of several), and a second check must find nothing.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from uvm_lab.errors import InvalidArgumentError
from uvm_lab.events import EventBus, EventKind, MemoryKind, make_events
from uvm_lab.events.schema import Advice
from uvm_lab.page_states import HOST, UNKNOWN, bit
from uvm_lab.residency_map import ResidencyTracker
from uvm_lab.tracing import cause_names, reconcile

PAGE = 4096
BASE = 0x7F0000000000
GPU0, GPU1 = bit(0), bit(1)


def tracker_with(states: list[int], *, read_mostly: bool = False) -> tuple[EventBus, ResidencyTracker]:
    """A tracker whose one managed segment holds exactly ``states`` (RESIDENCY records put them there)."""
    bus = EventBus()
    tracker = ResidencyTracker(bus)
    n = len(states)
    bus.publish(make_events(1, kind=EventKind.SEGMENT_ALLOC, flags=MemoryKind.MANAGED, address=BASE,
                            bytes=n * PAGE, value=n * PAGE, alloc_id=7, dst=0))
    if read_mostly:
        bus.publish(make_events(1, kind=EventKind.ADVICE, flags=Advice.SET_READ_MOSTLY, address=BASE,
                                bytes=n * PAGE, alloc_id=7, dst=-2))
    bus.publish(make_events(n, kind=EventKind.RESIDENCY, address=BASE + np.arange(n) * PAGE, bytes=PAGE,
                            value=states, alloc_id=7))
    assert tracker.map(BASE, n * PAGE).states.tolist() == states
    return bus, tracker


def check(states: list[int], host: list[int], **options: object) -> tuple[object, list[int]]:
    """Reconcile, publish, and return what was found and the map after."""
    rm = bool(options.pop("read_mostly", False))
    bus, tracker = tracker_with(states, read_mostly=rm)
    current = tracker.map(BASE, len(states) * PAGE)
    found = reconcile(current.states, np.array(host, dtype=bool), address=BASE, alloc_id=7,
                      read_mostly=current.read_mostly, **options)
    bus.publish(found.events)
    after = tracker.map(BASE, len(states) * PAGE).states.tolist()
    tracker.close()
    return found, after


def test_on_one_gpu_what_left_the_host_is_on_the_gpu_and_what_came_is_on_the_host():
    found, after = check([HOST, HOST, GPU0, GPU0, 0, 0, HOST], [0, 0, 1, 1, 1, 0, 1], gpus=1, now=123)
    assert after == [GPU0, GPU0, HOST, HOST, HOST, 0, HOST]
    assert (found.htod, found.dtoh, found.first_touch, found.host_copy_dropped) == (2, 2, 1, 0)
    assert found.unrecorded == 5 and found.pages == 7
    moves = found.events[np.isin(found.events["kind"], [EventKind.HTOD, EventKind.DTOH])]
    assert moves["kind"].tolist() == [EventKind.DTOH, EventKind.HTOD]        # runs, not pages
    assert moves["bytes"].tolist() == [2 * PAGE, 2 * PAGE]
    assert moves["src"].tolist() == [0, -1] and moves["dst"].tolist() == [-1, 0]
    assert set(cause_names(moves)) == {"inferred"}
    first_touch = found.events[found.events["kind"] == EventKind.CPU_PAGE_FAULT]
    assert first_touch["address"].tolist() == [BASE + 4 * PAGE] and first_touch["value"].tolist() == [0]
    assert (found.events["start"] == 123).all() and (found.events["alloc_id"] == 7).all()


def test_on_several_gpus_a_page_that_left_the_host_is_unknown_not_guessed():
    found, after = check([HOST, HOST, GPU1, HOST | GPU1], [0, 0, 1, 0], gpus=2, read_mostly=True)
    # The first two went to some GPU; the third came back from GPU 1 and keeps its copy there (ReadMostly);
    # the fourth lost its host copy and is on GPU 1, which held one.
    assert after == [UNKNOWN, UNKNOWN, HOST | GPU1, GPU1]
    htod = found.events[found.events["kind"] == EventKind.HTOD]
    assert htod["dst"].tolist() == [-2] and htod["bytes"].tolist() == [2 * PAGE]
    assert found.host_copy_dropped == 1


def test_unknown_pages_are_settled_where_the_host_can_tell_and_left_unknown_where_not():
    states = [UNKNOWN, UNKNOWN, UNKNOWN | HOST, UNKNOWN | HOST]
    host = [0, 1, 1, 0]
    found, after = check(states, host, gpus=1)
    assert after == [GPU0, HOST, HOST, GPU0]          # one GPU; a page that is not ReadMostly has one copy
    assert found.learned == 2 and found.dtoh == 1 and found.htod == 1
    # Nothing moved for the pages learned: no migration is claimed for them.
    moves = found.events[np.isin(found.events["kind"], [EventKind.HTOD, EventKind.DTOH, EventKind.DTOD])]
    assert sorted(moves["address"].tolist()) == [BASE + PAGE, BASE + 3 * PAGE]
    _, after = check(states, host, gpus=2)
    assert after == [UNKNOWN, HOST, HOST, UNKNOWN]
    _, after = check(states, host, gpus=2, read_mostly=True)
    assert after == [UNKNOWN, UNKNOWN | HOST, UNKNOWN | HOST, UNKNOWN]   # a GPU may hold a copy too


def test_pages_in_motion_are_left_for_the_next_round():
    settled = np.array([True, False, True, False])
    found, after = check([HOST, HOST, GPU0, GPU0], [0, 0, 1, 1], gpus=1, settled=settled)
    assert after == [GPU0, HOST, HOST, GPU0]
    assert found.unrecorded == 2


@settings(max_examples=80, deadline=None)
@given(st.lists(st.sampled_from([0, HOST, GPU0, GPU1, HOST | GPU0, GPU0 | GPU1, UNKNOWN, UNKNOWN | HOST]),
                min_size=1, max_size=48),
       st.data(), st.sampled_from([1, 2]), st.booleans())
def test_after_repair_the_host_side_is_exact_and_a_second_look_finds_nothing(states, data, gpus, rm):
    if gpus == 1:   # a one-GPU machine has no GPU 1
        states = [s & ~GPU1 or (GPU0 if s else 0) for s in states]
    if not rm:      # a page that is not ReadMostly has one copy
        states = [HOST if s & HOST else (s & ~(s - 1) if s & 0x7F else s) for s in states]
    host = data.draw(st.lists(st.booleans(), min_size=len(states), max_size=len(states)))
    found, after = check(states, host, gpus=gpus, read_mostly=rm)
    after_arr = np.array(after, dtype=np.uint8)
    assert (((after_arr & HOST) != 0) == np.array(host)).all()
    before = np.array(states, dtype=np.uint8)
    assert found.unrecorded == int((((before & HOST) != 0) != np.array(host)).sum())
    # A page that left the host is somewhere on a GPU: named where the map can, unknown where not, never nowhere.
    left = ((before & HOST) != 0) & ~np.array(host)
    assert (after_arr[left] != 0).all()
    if gpus == 1:
        assert not (after_arr & UNKNOWN)[~np.array(host)].any()   # one GPU: whatever the host lacks is on it
    again = reconcile(after_arr, np.array(host), address=BASE, gpus=gpus, read_mostly=np.full(len(states), rm))
    assert again.unrecorded == 0 and again.learned == 0 and not len(again.events)


def test_agreement_infers_nothing():
    states = np.array([HOST, GPU0, HOST | GPU0, 0], dtype=np.uint8)
    found = reconcile(states, np.array([1, 0, 1, 0], dtype=bool), address=BASE, gpus=1,
                      read_mostly=np.ones(4, dtype=bool))
    assert found.unrecorded == 0 and len(found.events) == 0


@pytest.mark.parametrize("kwargs", [
    {"states": np.zeros(4, dtype=np.int64)},
    {"host": np.zeros(3, dtype=bool)},
    {"address": BASE + 1},
    {"address": -PAGE},
    {"gpus": 0},
    {"gpus": True},
    {"read_mostly": np.zeros(3, dtype=bool)},
    {"settled": np.zeros(4, dtype=np.uint8)},
])
def test_bad_input_is_refused(kwargs):
    args = {"states": np.zeros(4, dtype=np.uint8), "host": np.zeros(4, dtype=bool), "address": BASE, "gpus": 1}
    args.update(kwargs)
    with pytest.raises(InvalidArgumentError):
        reconcile(args.pop("states"), args.pop("host"), **args)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 255), min_size=1, max_size=40), st.data(), st.sampled_from([1, 2, 3]))
def test_the_quick_look_says_exactly_where_the_host_side_changes_something(states, data, gpus):
    from uvm_lab.tracing.reconcile import changes, host_truth

    n = len(states)
    arr = np.array(states, dtype=np.uint8)
    host = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    rm = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    assert (changes(arr, host, rm, gpus=gpus) == (host_truth(arr, host, rm, gpus=gpus) != arr)).all()
