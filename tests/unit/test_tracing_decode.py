"""CUPTI's unified-memory records, decoded: buffers built byte for byte in CUPTI's C layout.

The records are packed here with ``struct`` from the C declaration of
``CUpti_ActivityUnifiedMemoryCounter3`` (kind, counterKind, value, start, end, address, srcId, dstId,
streamId, processId, flags, pad, processors[5]; 8-byte aligned, 104 bytes), independently of the
decoder's own NumPy dtype.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from uvm_lab.errors import InvalidArgumentError
from uvm_lab.events import EVENT_DTYPE, AccessType, EventKind, MigrationCause, RemoteMapCause
from uvm_lab.tracing import CUPTI_UM_COUNTER3_DTYPE, decode_buffer, decode_records, encode_records
from uvm_lab.tracing.decode import clock_offset

UM = 25                      # CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER
CPU = 0xFFFFFFFF             # CUPTI_UNIFIED_MEMORY_CPU_DEVICE_ID
LAYOUT = "<iiQQQQIIIIII5Q"   # the C struct, field by field


def record(counter_kind, *, value=0, start=0, end=0, address=0, src=0, dst=0, flags=0, kind=UM, stream=CPU,
           pid=4242, processors=(0, 0, 0, 0, 0)) -> bytes:
    return struct.pack(LAYOUT, kind, counter_kind, value, start, end, address, src, dst, stream, pid, flags, 0,
                       *processors)


def test_the_layout_is_cuptis_104_bytes():
    assert struct.calcsize(LAYOUT) == 104 == CUPTI_UM_COUNTER3_DTYPE.itemsize


def test_migrations_keep_direction_bytes_and_cause():
    buf = b"".join([
        record(1, value=65536, start=1000, end=3000, address=0x7F0000010000, src=CPU, dst=0, flags=2),
        record(2, value=2 << 20, start=4000, end=9000, address=0x7F0000200000, src=0, dst=CPU, flags=1),
        record(8, value=4096, start=10, end=20, address=0x7F0000000000, src=0, dst=1, flags=3),
    ])
    ev = decode_buffer(buf)
    assert ev.dtype == EVENT_DTYPE and len(ev) == 3
    assert ev["kind"].tolist() == [EventKind.HTOD, EventKind.DTOH, EventKind.DTOD]
    assert ev["src"].tolist() == [-1, 0, 0] and ev["dst"].tolist() == [0, -1, 1]
    assert ev["bytes"].tolist() == [65536, 2 << 20, 4096] == ev["value"].tolist()
    assert ev["flags"].tolist() == [MigrationCause.COHERENCE, MigrationCause.USER, MigrationCause.PREFETCH]
    assert ev["start"].tolist() == [1000, 4000, 10] and ev["end"].tolist() == [3000, 9000, 20]
    assert ev["address"].tolist() == [0x7F0000010000, 0x7F0000200000, 0x7F0000000000]
    assert (ev["alloc_id"] == 0).all() and (ev["stream"] == 0).all()


def test_the_direction_of_a_migration_comes_from_its_kind():
    # CUPTI 13 (H100, driver 580) gives srcId = dstId = the GPU for both directions; older CUPTI gave the
    # host as 0xFFFFFFFF. Both must decode to host -> gpu:1 and gpu:1 -> host.
    new = decode_buffer(record(1, value=4096, src=1, dst=1) + record(2, value=4096, src=1, dst=1))
    old = decode_buffer(record(1, value=4096, src=CPU, dst=1) + record(2, value=4096, src=1, dst=CPU))
    assert new.tobytes() == old.tobytes()
    assert new["src"].tolist() == [-1, 1] and new["dst"].tolist() == [1, -1]


def test_gpu_faults_name_the_faulting_gpu_and_access_but_no_range():
    ev = decode_buffer(record(4, value=3, start=50, end=80, address=0x7F0000003000, src=2, dst=CPU,
                              flags=AccessType.WRITE))
    assert ev["kind"][0] == EventKind.GPU_PAGE_FAULT
    assert (ev["src"][0], ev["dst"][0]) == (2, 2)          # CUPTI: ignore dstId for GPU faults
    assert ev["value"][0] == 3 and ev["bytes"][0] == 0    # fault groups; the serviced range is unknown
    assert ev["flags"][0] == AccessType.WRITE and ev["end"][0] == 80


def test_cpu_faults_count_one_fault_each_and_have_no_end():
    program_counter = 0x55555555ABCD
    ev = decode_buffer(record(3, value=program_counter, start=700, end=12345, address=0x7F0000005000, src=7, dst=9,
                              flags=9))
    assert ev["kind"][0] == EventKind.CPU_PAGE_FAULT
    assert (ev["src"][0], ev["dst"][0]) == (-1, -1)
    assert ev["value"][0] == 1 and ev["bytes"][0] == 0
    assert ev["flags"][0] == 0                             # CUPTI gives CPU faults no access type
    assert ev["end"][0] == ev["start"][0] == 700           # CUPTI: ignore end for CPU faults


def test_thrashing_throttling_and_remote_map():
    buf = b"".join([
        record(5, value=2 << 20, start=5, end=99, address=0x7F0000000000, src=0b11, dst=0, flags=0),
        record(6, value=0, start=6, end=60, address=0x7F0000000000, src=1, dst=CPU),
        record(7, value=65536, start=7, end=70, address=0x7F0000400000, src=CPU, dst=0,
               flags=RemoteMapCause.THRASHING),
    ])
    ev = decode_buffer(buf)
    assert ev["kind"].tolist() == [EventKind.THRASHING, EventKind.THROTTLING, EventKind.REMOTE_MAP]
    assert ev["bytes"].tolist() == [2 << 20, 0, 65536]
    assert (ev["src"][0], ev["dst"][0]) == (-2, -2)        # srcId is a device mask: no one processor
    assert (ev["src"][1], ev["dst"][1]) == (1, 1)
    assert (ev["src"][2], ev["dst"][2], ev["flags"][2]) == (-1, 0, RemoteMapCause.THRASHING)
    assert ev["end"][0] == 5 and ev["end"][2] == 7 and ev["end"][1] == 60


def test_unknown_counter_kinds_are_left_out():
    ev = decode_buffer(record(1, value=4096) + record(0) + record(42, value=1) + record(2, value=8192, src=0, dst=CPU))
    assert ev["kind"].tolist() == [EventKind.HTOD, EventKind.DTOH]


def test_clock_offset_moves_every_timestamp():
    ev = decode_buffer(record(1, value=4096, start=1_000_000, end=1_500_000), clock_offset=-250_000)
    assert (ev["start"][0], ev["end"][0]) == (750_000, 1_250_000)


def test_an_end_before_the_start_is_clamped():
    ev = decode_buffer(record(1, value=4096, start=900, end=100))
    assert ev["end"][0] == ev["start"][0] == 900


def test_valid_size_limits_the_records_read():
    buf = bytearray(record(1, value=4096, address=1 << 40) * 3 + b"\xff" * 512)   # CUPTI's buffer is larger
    assert len(decode_buffer(buf, 2 * 104)) == 2
    assert len(decode_buffer(memoryview(buf), 0)) == 0


def test_a_misaligned_buffer_decodes_the_same():
    data = record(2, value=12288, start=3, end=4, address=0x7F0000001000, src=0, dst=CPU)
    shifted = np.frombuffer(b"\0\0\0" + data, dtype=np.uint8)[3:]
    assert shifted.ctypes.data % 8 != 0
    assert decode_buffer(shifted).tobytes() == decode_buffer(data).tobytes()


@pytest.mark.parametrize("valid", [1, 103, 105, -1, 10_000])
def test_bad_valid_sizes_are_refused(valid):
    with pytest.raises(InvalidArgumentError) as info:
        decode_buffer(record(1, value=4096) * 2, valid)
    assert info.value.value == valid


def test_a_buffer_with_other_activity_kinds_is_refused_naming_the_kind():
    with pytest.raises(InvalidArgumentError, match="activity kind 10"):
        decode_buffer(record(1, value=4096) + record(1, kind=10))


def test_non_buffers_and_wrong_dtypes_are_refused():
    with pytest.raises(InvalidArgumentError):
        decode_buffer(12345)
    with pytest.raises(InvalidArgumentError):
        decode_records(np.zeros(3, dtype=EVENT_DTYPE))
    with pytest.raises(InvalidArgumentError):
        decode_records(np.zeros(1, dtype=CUPTI_UM_COUNTER3_DTYPE), clock_offset=1.5)


def test_a_million_records_decode_to_the_same_totals():
    n = 1_000_000
    rng = np.random.default_rng(7)
    raw = np.zeros(n, dtype=CUPTI_UM_COUNTER3_DTYPE)
    raw["kind"] = UM
    raw["counter_kind"] = rng.choice([1, 2, 4], size=n)
    raw["value"] = rng.integers(1, 512, size=n) * 4096
    raw["start"] = np.arange(n) * 10
    raw["end"] = raw["start"] + 5
    raw["src_id"] = np.where(raw["counter_kind"] == 1, CPU, 0)
    raw["dst_id"] = np.where(raw["counter_kind"] == 2, CPU, 0)
    ev = decode_buffer(raw.tobytes())
    migrations = raw["counter_kind"] != 4
    assert len(ev) == n
    assert int(ev["bytes"].sum()) == int(raw["value"][migrations].sum())
    assert int(ev["value"][ev["kind"] == EventKind.GPU_PAGE_FAULT].sum()) == int(raw["value"][~migrations].sum())


migration = st.tuples(
    st.sampled_from([EventKind.HTOD, EventKind.DTOH, EventKind.DTOD]),
    st.integers(0, 5), st.integers(0, 7), st.integers(0, 7),
    st.integers(0, 2**50), st.integers(0, 2**20), st.integers(0, 2**48), st.integers(1, 2**31))


@given(st.lists(migration, max_size=40), st.integers(-2**40, 2**40))
def test_migrations_survive_encoding_and_decoding(rows, offset):
    events = np.zeros(len(rows), dtype=EVENT_DTYPE)
    for i, (kind, cause, src, dst, start, dur, address, nbytes) in enumerate(rows):
        src = -1 if kind == EventKind.HTOD else src       # HtoD leaves the host, DtoH arrives there
        dst = -1 if kind == EventKind.DTOH else dst
        events[i] = (kind, cause, src, dst, start + 2**41, start + 2**41 + dur, address, nbytes, nbytes, 0, 0, 0)
    back = decode_records(encode_records(events, clock_offset=offset), clock_offset=offset)
    assert back.tobytes() == events.tobytes()


def test_clock_offset_picks_the_tightest_sample():
    readings = iter([100, 110, 90, 95, 200, 300])   # backend, cupti, backend ... ; second pair is tightest
    cupti = iter([50, 40, 45])
    offset = clock_offset(lambda: next(cupti), backend_now=lambda: next(readings), samples=3)
    assert offset == (90 + 95) // 2 - 40
