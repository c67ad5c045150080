"""Protocol-buffer messages written column by column read back as protobuf writes them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from uvm_lab.errors import InvalidArgumentError
from uvm_lab.tracing import wire

pb = pytest.importorskip("perfetto.protos.perfetto.trace.perfetto_trace_pb2")   # the schema that reads back

UINT64 = st.integers(0, (1 << 64) - 1)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(UINT64, UINT64, st.booleans(), st.booleans(), st.lists(UINT64, max_size=3)),
                max_size=30))
def test_rows_encode_what_protobuf_reads_field_for_field(rows):
    """Each row is a TrackEvent: a track uuid, maybe a name iid, maybe one pointer annotation, flow ids."""
    n = len(rows)
    uuid = np.array([r[0] for r in rows], dtype=np.uint64)
    pointer = np.array([r[1] for r in rows], dtype=np.uint64)
    named = np.array([r[2] for r in rows], dtype=bool)
    annotated = np.array([r[3] for r in rows], dtype=bool)
    event = wire.Rows(n)
    event.varint(11, uuid)
    event.varint(10, 7, present=named)
    arg = wire.Rows(n)
    arg.varint(1, 2)
    arg.varint(7, pointer)
    event.message(4, arg, present=annotated)
    flows = [f for r in rows for f in r[4]]
    data = b"".join(wire.varint(47 << 3 | 1) + f.to_bytes(8, "little") for f in flows)
    event.tail(np.frombuffer(data, dtype=np.uint8), np.array([10 * len(r[4]) for r in rows], dtype=np.int64))
    packet = wire.Rows(n)
    packet.message(11, event)
    trace = wire.Rows(n)
    trace.message(1, packet)
    encoded = trace.encode().tobytes()

    decoded = pb.Trace.FromString(encoded)
    assert len(decoded.packet) == n
    for row, p in zip(rows, decoded.packet, strict=True):
        e = p.track_event
        assert e.track_uuid == row[0]
        assert e.HasField("name_iid") == row[2] and (not row[2] or e.name_iid == 7)
        assert [(a.name_iid, a.pointer_value) for a in e.debug_annotations] == ([(2, row[1])] if row[3] else [])
        assert list(e.flow_ids) == row[4]
    # The sizes agree with protobuf's own encoding of the same messages.
    assert len(encoded) == decoded.ByteSize()


def test_interleave_puts_rows_of_two_shapes_back_in_order():
    first, second = wire.Rows(2), wire.Rows(1)
    first.varint(8, np.array([1, 3], dtype=np.uint64))
    second.varint(8, np.array([2], dtype=np.uint64))
    second.varint(10, 5)
    wrapped = [wire.Rows(rows.n) for rows in (first, second)]
    for outer, inner in zip(wrapped, (first, second), strict=True):
        outer.message(1, inner)
    out = wire.interleave(3, [(np.array([0, 2]), wrapped[0]), (np.array([1]), wrapped[1])]).tobytes()
    assert [p.timestamp for p in pb.Trace.FromString(out).packet] == [1, 2, 3]
    assert [p.trusted_packet_sequence_id for p in pb.Trace.FromString(out).packet] == [0, 5, 0]


def test_rows_refuse_columns_of_the_wrong_length():
    rows = wire.Rows(3)
    with pytest.raises(InvalidArgumentError):
        rows.varint(1, np.arange(2))
    with pytest.raises(InvalidArgumentError):
        rows.varint(1, 0, present=np.ones(4, dtype=bool))
    with pytest.raises(InvalidArgumentError):
        rows.message(2, wire.Rows(2))
    with pytest.raises(InvalidArgumentError):
        rows.tail(np.zeros(3, dtype=np.uint8), np.array([1, 1, 0]))
    assert rows.encode().tobytes() == b""             # nothing was added
