"""The residency map from CUPTI-shaped records: faults that name one page, migrations that name bytes.

Each test replays records in the shape the collector publishes them (decoded from raw CUPTI bytes)
onto a private bus and tracker, and checks the page states a user would read.
"""

from __future__ import annotations

import numpy as np
import pytest

from uvm_lab.errors import InvalidArgumentError
from uvm_lab.events import EventBus, EventKind, MemoryKind, make_events
from uvm_lab.events.schema import AccessType, Advice, MigrationCause
from uvm_lab.residency_map import BOTH, GPU, HOST, NOWHERE, ResidencyTracker
from uvm_lab.tracing import decode_buffer, encode_records
from uvm_lab.tracing.density import serviced_region

KiB, MiB = 1 << 10, 1 << 20
BASE = 0x7F0000000000          # 2 MiB-aligned, as cudaMallocManaged returns
PAGES = 4 * MiB // 4096


@pytest.fixture
def replay():
    bus = EventBus()
    tracker = ResidencyTracker(bus)
    bus.publish(make_events(1, kind=EventKind.SEGMENT_ALLOC, flags=MemoryKind.MANAGED, address=BASE, bytes=4 * MiB,
                            value=4 * MiB, alloc_id=3, dst=0))

    def publish(*rows, via_cupti=True):
        events = np.concatenate(rows)
        if via_cupti:   # through CUPTI's bytes, as the collector receives them
            kinds = events["kind"]
            um = np.isin(kinds, [1, 2, 3, 4, 8])
            raw = encode_records(events[um])
            decoded = decode_buffer(raw.tobytes())
            decoded["alloc_id"] = events["alloc_id"][um]
            events = np.concatenate([events[~um], decoded]) if (~um).any() else decoded
        bus.publish(events)
        return tracker.map(BASE, 4 * MiB).states

    yield publish
    tracker.close()


def cpu_fault(offset, alloc_id=3):
    return make_events(1, kind=EventKind.CPU_PAGE_FAULT, src=-1, dst=-1, address=BASE + offset, value=1,
                       alloc_id=alloc_id)


def gpu_fault(offset, access=AccessType.READ):
    return make_events(1, kind=EventKind.GPU_PAGE_FAULT, flags=access, src=0, dst=0, address=BASE + offset, value=1,
                       alloc_id=3)


def move(kind, offset, nbytes, cause=MigrationCause.COHERENCE, alloc_id=3):
    src, dst = (-1, 0) if kind == EventKind.HTOD else (0, -1)
    return make_events(1, kind=kind, flags=cause, src=src, dst=dst, address=BASE + offset, bytes=nbytes, value=nbytes,
                       alloc_id=alloc_id)


# One thread writing a fresh block in order faults at these offsets (measured on an H200: 6 CPU faults per
# 2 MiB block, 64 + 64 + 128 + 256 + 512 + 1024 KiB).
SEQUENTIAL = [0, 64 * KiB, 128 * KiB, 256 * KiB, 512 * KiB, 1024 * KiB]


def test_density_rule_reproduces_the_measured_sequence():
    resident = np.zeros(512, dtype=bool)
    sizes = []
    for offset in SEQUENTIAL:
        lo, hi = serviced_region(resident, offset // 4096)
        sizes.append(int((~resident[lo:hi]).sum()) * 4)
        resident[lo:hi] = True
    assert sizes == [64, 64, 128, 256, 512, 1024] and resident.all()


def test_host_first_touch_from_cpu_faults_alone_covers_the_buffer(replay):
    faults = [cpu_fault(block + off) for block in (0, 2 * MiB) for off in SEQUENTIAL]
    states = replay(*faults)
    assert (states == HOST).all()


def test_half_a_block_touched_leaves_the_rest_untouched(replay):
    states = replay(*[cpu_fault(off) for off in SEQUENTIAL[:5]])      # the first 1 MiB of block 0
    assert (states[:256] == HOST).all() and (states[256:] == NOWHERE).all()


def test_gpu_first_touch_takes_the_big_page_and_a_write_collapses_copies(replay):
    states = replay(gpu_fault(5 * 4096, AccessType.WRITE))
    assert (states[:16] == GPU).all() and (states[16:] == NOWHERE).all()


def test_migrations_move_exact_bytes_and_a_fault_on_data_adds_nothing(replay):
    replay(*[cpu_fault(block + off) for block in (0, 2 * MiB) for off in SEQUENTIAL])
    states = replay(gpu_fault(0), move(EventKind.HTOD, 0, 64 * KiB), move(EventKind.HTOD, 64 * KiB, 1984 * KiB,
                                                                            MigrationCause.PREFETCH))
    assert (states[:512] == GPU).all() and (states[512:] == HOST).all()
    states = replay(cpu_fault(8192), move(EventKind.DTOH, 0, 12 * KiB))
    assert (states[:3] == HOST).all() and (states[3:512] == GPU).all()


def test_read_duplicates_and_the_write_that_collapses_them(replay):
    replay(*[cpu_fault(block + off) for block in (0, 2 * MiB) for off in SEQUENTIAL])
    advice = make_events(1, kind=EventKind.ADVICE, flags=Advice.SET_READ_MOSTLY, dst=-2, address=BASE,
                         bytes=4 * MiB, alloc_id=3)
    states = replay(advice, move(EventKind.HTOD, 0, 4 * MiB), via_cupti=True)
    assert (states == BOTH).all()
    # The host reads a duplicated page without faulting; a CPU fault there can only be a write.
    states = replay(cpu_fault(3 * MiB))
    assert states[768] == HOST and (np.delete(states, 768) == BOTH).all()


def test_records_of_a_freed_allocation_do_not_touch_its_successor(replay):
    states = replay(move(EventKind.HTOD, 0, 64 * KiB, alloc_id=99), cpu_fault(0, alloc_id=99))
    assert (states == NOWHERE).all()


def test_a_free_forgets_the_pages(replay):
    replay(*[cpu_fault(off) for off in SEQUENTIAL])
    bus_free = make_events(1, kind=EventKind.SEGMENT_FREE, address=BASE, bytes=4 * MiB, alloc_id=3)
    with pytest.raises(InvalidArgumentError, match="no live allocation"):
        replay(bus_free, via_cupti=False)


@pytest.mark.parametrize("seed", range(12))
def test_a_batch_of_records_leaves_the_same_pages_as_the_same_records_one_at_a_time(seed):
    """The tracker applies runs of CUPTI records in bulk; the pages must come out as replaying them singly."""
    rng = np.random.default_rng(seed)
    n = 600
    kinds = rng.choice([EventKind.HTOD, EventKind.DTOH, EventKind.GPU_PAGE_FAULT, EventKind.CPU_PAGE_FAULT], size=n)
    events = make_events(n, kind=kinds, alloc_id=3)
    events["address"] = BASE + rng.integers(0, PAGES, size=n) * 4096
    if seed % 3 == 0:   # some records beyond the allocation, or of a freed one: skipped alike
        events["address"][::17] = BASE + 8 * MiB
        events["alloc_id"][::23] = 99
    moves = (kinds == EventKind.HTOD) | (kinds == EventKind.DTOH)
    events["bytes"][moves] = rng.choice([4 * KiB, 64 * KiB, 512 * KiB, 2 * MiB], size=int(moves.sum()))
    events["value"] = events["bytes"]
    events["flags"][moves] = rng.choice([MigrationCause.COHERENCE, MigrationCause.PREFETCH, MigrationCause.EVICTION],
                                        size=int(moves.sum()))
    events["src"][kinds == EventKind.HTOD], events["dst"][kinds == EventKind.HTOD] = -1, 0
    events["src"][kinds == EventKind.DTOH], events["dst"][kinds == EventKind.DTOH] = 0, -1
    cpu, gpu = kinds == EventKind.CPU_PAGE_FAULT, kinds == EventKind.GPU_PAGE_FAULT
    events["src"][cpu], events["dst"][cpu] = -1, -1
    events["flags"][gpu] = rng.choice([AccessType.READ, AccessType.WRITE, AccessType.ATOMIC], size=int(gpu.sum()))
    events["flags"][cpu] = rng.choice([AccessType.UNKNOWN, AccessType.READ, AccessType.WRITE], size=int(cpu.sum()))
    events["value"][cpu | gpu] = 1
    prologue = [make_events(1, kind=EventKind.SEGMENT_ALLOC, flags=MemoryKind.MANAGED, address=BASE, bytes=4 * MiB,
                            value=4 * MiB, alloc_id=3, dst=0)]
    if seed % 2:        # ReadMostly on the second half: migrations there duplicate, one by one
        prologue.append(make_events(1, kind=EventKind.ADVICE, flags=Advice.SET_READ_MOSTLY, address=BASE + 2 * MiB,
                                    bytes=2 * MiB, dst=-2))
    if seed % 4 < 2:    # a quarter of the pages touched first, so the faults meet both untouched and held pages
        prologue.append(make_events(1, kind=EventKind.PREFETCH, address=BASE, bytes=MiB, dst=-1))
    states = []
    for batched in (True, False):
        bus = EventBus()
        tracker = ResidencyTracker(bus)
        for p in prologue:
            bus.publish(p)
        if batched:
            bus.publish(events)
        else:
            for i in range(n):
                bus.publish(events[i:i + 1])
        states.append(tracker.map(BASE, 4 * MiB).states)
        tracker.close()
    assert (states[0] == states[1]).all(), np.flatnonzero(states[0] != states[1])[:10]
