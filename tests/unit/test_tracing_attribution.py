"""Which allocation each CUPTI record belongs to, and what its flags mean."""

from __future__ import annotations

import numpy as np
import pytest

import uvm_lab as ul
from uvm_lab.errors import InvalidArgumentError
from uvm_lab.events import EVENT_DTYPE, EventBus, EventKind, make_events
from uvm_lab.tracing import AllocationIndex, attribute, cause_names, decode_buffer, encode_records

MiB = 1 << 20


def segment(kind, address, size, alloc_id, t):
    return make_events(1, kind=kind, address=address, bytes=size, value=size, alloc_id=alloc_id, start=t, end=t)


def um(kind, address, t, nbytes=4096):
    return make_events(1, kind=kind, address=address, bytes=nbytes, value=nbytes, start=t, end=t + 1)


def test_records_map_to_the_segment_holding_their_address():
    index = AllocationIndex()
    index.update(np.concatenate([segment(EventKind.SEGMENT_ALLOC, 0x10000000, 4 * MiB, 7, 0),
                                 segment(EventKind.SEGMENT_ALLOC, 0x20000000, 2 * MiB, 9, 0)]))
    addresses = [0x10000000, 0x10000000 + 4 * MiB - 1, 0x10000000 + 4 * MiB, 0x20000000 + 12345, 0x0FFFFFFF, 0]
    assert index.lookup(addresses).tolist() == [7, 7, 0, 9, 0, 0]
    assert len(index) == 2


def test_a_reused_address_is_charged_to_whoever_held_it_then():
    index = AllocationIndex()
    index.update(np.concatenate([segment(EventKind.SEGMENT_ALLOC, 0x10000000, MiB, 1, 100),
                                 segment(EventKind.SEGMENT_FREE, 0x10000000, MiB, 1, 200),
                                 segment(EventKind.SEGMENT_ALLOC, 0x10000000, MiB, 2, 300)]))
    at = [0x10000000 + 4096] * 4
    assert index.lookup(at, [150, 250, 350, 50]).tolist() == [1, 0, 2, 0]
    assert index.lookup(at[:1]).tolist() == [2]          # no time: only the live allocation


def test_attribute_fills_only_unknown_ids_of_driver_records():
    index = AllocationIndex()
    index.update(segment(EventKind.SEGMENT_ALLOC, 0x10000000, MiB, 5, 0))
    events = np.concatenate([um(EventKind.HTOD, 0x10001000, 10), um(EventKind.GPU_PAGE_FAULT, 0x10002000, 11),
                             um(EventKind.DTOH, 0x30000000, 12), um(EventKind.HTOD, 0x10003000, 13),
                             segment(EventKind.PREFETCH, 0x10000000, MiB, 77, 14)])
    events["alloc_id"][3] = 3
    out = attribute(events, index)
    assert out["alloc_id"].tolist() == [5, 5, 0, 3, 77]
    assert attribute(events, index, overwrite=True)["alloc_id"].tolist() == [5, 5, 0, 5, 77]
    assert events["alloc_id"].tolist() == [0, 0, 0, 3, 77]   # the input is left alone


def test_the_index_follows_a_bus_and_forgets_nothing_it_needs():
    bus = EventBus()
    index = AllocationIndex()
    index.follow(bus)
    bus.publish(segment(EventKind.SEGMENT_ALLOC, 0x40000000, MiB, 11, 0))
    assert index.lookup([0x40000010]).tolist() == [11]
    bus.publish(segment(EventKind.SEGMENT_FREE, 0x40000000, MiB, 11, 50))
    assert index.lookup([0x40000010], [20]).tolist() == [11]
    index.close()
    bus.publish(segment(EventKind.SEGMENT_ALLOC, 0x40000000, MiB, 12, 60))
    assert index.lookup([0x40000010]).tolist() == [0]       # closed: no longer listening


def test_buffers_on_the_simulator_get_their_segment_and_their_own_ids(sim_backend):
    bus = sim_backend.bus
    segments, buffers = AllocationIndex("segment"), AllocationIndex("buffer")
    segments.update(bus.history())
    buffers.update(bus.history())
    segments.follow(bus)
    buffers.follow(bus)
    a = ul.DeviceBuffer(size="4MiB", mr=ul.mr.ManagedMemoryResource())
    b = ul.DeviceBuffer(size="2MiB", mr=ul.mr.ManagedMemoryResource())
    seg_ids = {int(e["address"]): int(e["alloc_id"]) for e in bus.history()
               if e["kind"] == EventKind.SEGMENT_ALLOC}
    # Records as CUPTI would deliver them: raw bytes, decoded, then attributed.
    raw = encode_records(np.concatenate([um(EventKind.HTOD, a.ptr + 65536, 1, 65536),
                                         um(EventKind.DTOH, b.ptr + 4096, 2),
                                         um(EventKind.HTOD, b.ptr + b.size, 3)]))
    events = attribute(decode_buffer(raw.tobytes()), segments)
    assert events["alloc_id"].tolist() == [seg_ids[a.ptr], seg_ids[b.ptr], 0]
    assert buffers.lookup(events["address"]).tolist() == [a.id, b.id, 0]
    a.close()
    b.close()
    segments.close()
    buffers.close()


def test_causes_and_access_types_in_words():
    events = np.zeros(9, dtype=EVENT_DTYPE)
    events["kind"] = [1, 1, 2, 2, 4, 4, 4, 7, 18]
    events["flags"] = [1, 3, 2, 4, 1, 2, 3, 2, 0]
    assert cause_names(events) == ["user prefetch", "driver prefetch", "coherence", "eviction", "read", "write",
                                   "atomic", "thrashing", ""]


def test_bad_arguments_are_refused():
    with pytest.raises(InvalidArgumentError, match="level"):
        AllocationIndex("page")
    with pytest.raises(InvalidArgumentError):
        AllocationIndex(history=-1)
    with pytest.raises(InvalidArgumentError):
        AllocationIndex().update(np.zeros(2))
    with pytest.raises(InvalidArgumentError, match="times"):
        AllocationIndex().lookup([1, 2], [1])
    with pytest.raises(InvalidArgumentError):
        attribute(np.zeros(1, dtype=EVENT_DTYPE), "index")


def test_the_words_and_to_pandas_decode_every_kinds_flags_alike():
    from uvm_lab.events import make_events
    from uvm_lab.events.trace import Trace

    kinds = [k for k in EventKind for _ in range(256)]
    events = make_events(len(kinds), kind=kinds, flags=list(range(256)) * len(EventKind))
    table = Trace(events).to_pandas()
    said = {"user prefetch": "user", "driver prefetch": "prefetch", "user prefetch (inferred)": "user_inferred"}
    for word, cause, detail, kind, flags in zip(cause_names(events), table["cause"], table["detail"],
                                                table["kind"], events["flags"].tolist(), strict=True):
        if not word:
            continue   # a kind whose flags are no cause or access type
        name = cause or (detail if not detail.isdigit() else "")
        assert said.get(word, word.replace(" ", "_")) == (name or "unknown"), (kind, flags, word, cause, detail)
