"""A real two-GPU machine's events, replayed: per-GPU page states from recorded events, with no GPU here.

``data/two_gpus_h100.npz`` was recorded on two H100s by ``tests/gpu/record_two_gpus.py`` with tracing off:
host writes, prefetches to each GPU and back (whole and in part), a kernel on GPU 1, ReadMostly duplicates
on both GPUs, a host read, the host watcher after every step. It holds every event published and, at the end,
each buffer's map and the host's page tables of its pages.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from uvm_lab.events import EventBus, EventKind
from uvm_lab.events.schema import EVENT_DTYPE_WITHOUT_SOURCE, as_events, is_inferred
from uvm_lab.events.trace import Trace
from uvm_lab.page_states import HOST, UNKNOWN, bit
from uvm_lab.residency_map import ResidencyTracker

DATA = Path(__file__).parent / "data" / "two_gpus_h100.npz"
PAGE = 4096


@pytest.fixture(scope="module")
def recorded():
    # Recorded before events carried their source: read as any old saved trace is.
    return {name: as_events(a) if a.dtype == EVENT_DTYPE_WITHOUT_SOURCE else a for name, a in np.load(DATA).items()}


def replay(events: np.ndarray, *, publishes: bool = False) -> tuple[ResidencyTracker, Trace]:
    bus = EventBus()
    tracker = ResidencyTracker(bus, publishes_inferred=publishes)
    seen = []
    bus.subscribe(seen.append)
    bus.publish(events)
    bus.flush()
    return tracker, Trace(np.concatenate(seen))


def test_the_replayed_maps_are_the_maps_the_machine_had(recorded):
    tracker, _ = replay(recorded["events"])
    for name in ("a", "b"):
        address = int(recorded[f"{name}_address"])
        states = recorded[f"{name}_states"]
        m = tracker.map(address, len(states) * PAGE)
        assert (m.states == states).all()
        # and the host's side of them is what the host's page tables showed
        assert (((m.states & HOST) != 0) == recorded[f"{name}_host"]).all()


def test_two_gpus_hold_different_pages_and_what_cannot_be_known_reads_unknown(recorded):
    tracker, _ = replay(recorded["events"])
    a = tracker.map(int(recorded["a_address"]), len(recorded["a_states"]) * PAGE)
    b = tracker.map(int(recorded["b_address"]), len(recorded["b_states"]) * PAGE)
    mib = 256   # pages
    # a: 1 MiB prefetched back to the host, 1 MiB still on GPU 0, 2 MiB a kernel on GPU 1 read (moved or read
    # across the link: unknown), 4 MiB prefetched to GPU 1.
    assert a.runs() == [(0, mib, "host"), (mib, mib, "gpu:0"), (2 * mib, 2 * mib, "unknown"),
                        (4 * mib, 4 * mib, "gpu:1")]
    assert a.copies() == {"host": mib, "gpu:0": mib, "gpu:1": 4 * mib}
    # b: ReadMostly, duplicated on both GPUs (the first half) or on GPU 0, and kept on the host.
    assert b.runs() == [(0, 2 * mib, "host+gpu:0+gpu:1"), (2 * mib, 2 * mib, "host+gpu:0")]
    assert int(recorded["a_states"][2 * mib]) == UNKNOWN and int(recorded["b_states"][0]) == HOST | bit(0) | bit(1)


def test_the_inferred_moves_follow_from_the_prefetches(recorded):
    """Dropped from the stream, the inferred migrations are derived again, the same ones, peer copy included."""
    events = recorded["events"]
    moves = np.isin(events["kind"], [EventKind.HTOD, EventKind.DTOH, EventKind.DTOD]) & is_inferred(events["flags"])
    _, trace = replay(events[~moves], publishes=True)
    derived = trace.events[np.isin(trace.events["kind"], [EventKind.HTOD, EventKind.DTOH, EventKind.DTOD])]
    fields = ["kind", "flags", "src", "dst", "address", "bytes", "alloc_id"]
    assert [tuple(r) for r in derived[fields].tolist()] == [tuple(r) for r in events[moves][fields].tolist()]
    assert EventKind.DTOD in derived["kind"] and (derived["src"][derived["kind"] == EventKind.DTOD] == 0).all()
    summary = Trace(events).summary()
    assert summary["bytes_inferred"] == summary["bytes_htod"] + summary["bytes_dtoh"] + summary["bytes_dtod"] > 0
