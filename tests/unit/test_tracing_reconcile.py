"""What lost records missed: a map against the host's page tables, and the events that close the gap.

The maps here are built from events on a private bus and tracker, as the collector builds them; the
"host" is a bitmap the test chooses (on a GPU it comes from /proc/self/pagemap). After the inferred events
are published the map must place exactly the host's pages on the host, and a second check finds nothing.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from uvm_lab.errors import InvalidArgumentError
from uvm_lab.events import EventBus, EventKind, MemoryKind, make_events
from uvm_lab.events.schema import Advice, MigrationCause
from uvm_lab.residency_map import BOTH, GPU, HOST, NOWHERE, ResidencyTracker
from uvm_lab.tracing import cause_names, reconcile

PAGE = 4096
BASE = 0x7F0000000000
PAGES = 64


def tracker_with(states: list[int]) -> tuple[EventBus, ResidencyTracker]:
    """A tracker whose one managed segment holds ``states``, reached through events."""
    bus = EventBus()
    tracker = ResidencyTracker(bus)
    bus.publish(make_events(1, kind=EventKind.SEGMENT_ALLOC, flags=MemoryKind.MANAGED, address=BASE,
                            bytes=len(states) * PAGE, value=len(states) * PAGE, alloc_id=7, dst=0))
    bus.publish(make_events(1, kind=EventKind.ADVICE, flags=Advice.SET_READ_MOSTLY, address=BASE,
                            bytes=len(states) * PAGE, alloc_id=7, dst=-2))
    rows = []
    for i, s in enumerate(states):
        if s & HOST:
            rows.append(make_events(1, kind=EventKind.CPU_PAGE_FAULT, src=-1, dst=-1, address=BASE + i * PAGE,
                                    bytes=PAGE, value=1, alloc_id=7))
        if s & GPU:   # HtoD of a ReadMostly page the host holds duplicates it; of an untouched one, moves it
            rows.append(make_events(1, kind=EventKind.HTOD, flags=MigrationCause.COHERENCE, src=-1, dst=0,
                                    address=BASE + i * PAGE, bytes=PAGE, value=PAGE, alloc_id=7))
    if rows:
        bus.publish(np.concatenate(rows))
    assert tracker.map(BASE, len(states) * PAGE).states.tolist() == states
    return bus, tracker


def test_each_disagreement_becomes_the_event_that_explains_it():
    states = [HOST, HOST, BOTH, GPU, GPU, NOWHERE, NOWHERE, HOST]
    host = np.array([0, 0, 0, 1, 1, 1, 0, 1], dtype=bool)
    bus, tracker = tracker_with(states)
    found = reconcile(np.array(states, dtype=np.uint8), host, address=BASE, device=0, alloc_id=7, now=123)
    assert (found.htod, found.host_copy_dropped, found.dtoh, found.first_touch) == (2, 1, 2, 1)
    assert found.unrecorded == 6 and found.pages == 8
    ev = found.events
    # The HtoD is a move: the host copy goes with it, also on this ReadMostly segment.
    assert ev["kind"].tolist() == [EventKind.HTOD, EventKind.INVALIDATE, EventKind.DTOH, EventKind.CPU_PAGE_FAULT]
    assert ev["address"].tolist() == [BASE, BASE, BASE + 3 * PAGE, BASE + 5 * PAGE]
    assert ev["bytes"].tolist() == [2 * PAGE, 3 * PAGE, 2 * PAGE, PAGE]      # runs, not pages
    assert cause_names(ev)[0] == cause_names(ev)[2] == "inferred"
    assert ev["value"][3] == 0                                          # no fault is claimed for a first touch
    assert (ev["start"] == 123).all() and (ev["alloc_id"] == 7).all()
    bus.publish(ev)
    assert tracker.map(BASE, 8 * PAGE).states.tolist() == [GPU, GPU, GPU, BOTH, BOTH, HOST, NOWHERE, HOST]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([NOWHERE, HOST, GPU, BOTH]), min_size=1, max_size=PAGES),
       st.data())
def test_after_repair_the_map_places_exactly_the_hosts_pages_on_the_host(states, data):
    host = np.array(data.draw(st.lists(st.booleans(), min_size=len(states), max_size=len(states))), dtype=bool)
    bus, tracker = tracker_with(states)
    before = np.array(states, dtype=np.uint8)
    found = reconcile(before, host, address=BASE, device=0, alloc_id=7)
    assert found.unrecorded == int((((before & HOST) != 0) != host).sum())
    bus.publish(found.events)
    after = tracker.map(BASE, len(states) * PAGE).states
    assert (((after & HOST) != 0) == host).all()
    assert ((after & GPU) != 0)[~host & ((before & HOST) != 0)].all()   # what left the host went to the GPU
    assert reconcile(after, host, address=BASE, device=0).unrecorded == 0
    tracker.close()


def test_agreement_infers_nothing():
    states = np.array([HOST, GPU, BOTH, NOWHERE], dtype=np.uint8)
    found = reconcile(states, np.array([1, 0, 1, 0], dtype=bool), address=BASE, device=0)
    assert found.unrecorded == 0 and len(found.events) == 0


@pytest.mark.parametrize("kwargs", [
    {"states": np.zeros(4, dtype=np.int64)},
    {"host": np.zeros(3, dtype=bool)},
    {"address": BASE + 1},
    {"address": -PAGE},
    {"device": -1},
    {"device": True},
])
def test_bad_input_is_refused(kwargs):
    args = {"states": np.zeros(4, dtype=np.uint8), "host": np.zeros(4, dtype=bool), "address": BASE, "device": 0}
    args.update(kwargs)
    with pytest.raises(InvalidArgumentError):
        reconcile(args.pop("states"), args.pop("host"), **args)
