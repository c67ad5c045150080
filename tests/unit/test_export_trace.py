"""Traces out: Chrome/Perfetto JSON, RMM's CSV log, and save/load without loss."""

from __future__ import annotations

import csv
import io
import json
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import uvm_lab as ul
from uvm_lab.errors import InvalidArgumentError
from uvm_lab.events import EVENT_DTYPE, EventKind, make_events
from uvm_lab.events.schema import AccessType, MigrationCause
from uvm_lab.events.trace import Trace
from uvm_lab.tracing import to_chrome_trace, to_rmm_csv
from uvm_lab.tracing.export import RMM_HEADER

MiB = 1 << 20


def sample() -> np.ndarray:
    rows = [
        dict(kind=EventKind.SEGMENT_ALLOC, address=0x10000000, bytes=4 * MiB, alloc_id=1, start=1000, end=1000),
        dict(kind=EventKind.ALLOC, address=0x10000000, bytes=MiB, alloc_id=2, start=1100, end=1100),
        dict(kind=EventKind.ALLOC, address=0x10100000, bytes=3 * MiB, alloc_id=3, start=1200, end=1200, stream=0xAB),
        dict(kind=EventKind.HTOD, flags=MigrationCause.COHERENCE, src=-1, dst=0, address=0x10000000, bytes=65536,
             alloc_id=1, start=2000, end=5000),
        dict(kind=EventKind.HTOD, flags=MigrationCause.USER, src=-1, dst=0, address=0x10010000, bytes=MiB,
             alloc_id=1, start=6000, end=26000),
        dict(kind=EventKind.DTOH, flags=MigrationCause.EVICTION, src=0, dst=-1, address=0x10000000, bytes=65536,
             alloc_id=1, start=30000, end=31000),
        dict(kind=EventKind.GPU_PAGE_FAULT, flags=AccessType.WRITE, src=0, dst=0, address=0x10002000, value=3,
             alloc_id=1, start=1900, end=1990),
        dict(kind=EventKind.CPU_PAGE_FAULT, src=-1, dst=-1, address=0x10000000, value=1, alloc_id=1, start=29000,
             end=29000),
        dict(kind=EventKind.FREE, address=0x10000000, bytes=MiB, alloc_id=2, start=40000, end=40000),
        dict(kind=EventKind.ALLOC_FAILURE, address=0, bytes=64 * MiB, start=41000, end=41000),
    ]
    out = np.concatenate([make_events(1, **r) for r in rows])
    out["value"] = np.where(out["value"] == 0, out["bytes"], out["value"])
    return out


def lane_ids(doc) -> dict[str, int]:
    return {e["args"]["name"]: e["tid"] for e in doc["traceEvents"] if e.get("name") == "thread_name"}


def test_chrome_trace_puts_each_kind_in_its_lane_named_by_cause(tmp_path):
    path = tmp_path / "t.json"
    doc = Trace(sample()).to_chrome_trace(path)
    assert json.loads(path.read_text()) == doc
    lanes = lane_ids(doc)
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    by_lane = {name: sorted(e["name"] for e in slices if e["tid"] == tid) for name, tid in lanes.items()}
    assert by_lane["HtoD"] == ["HtoD coherence", "HtoD user prefetch"]
    assert by_lane["DtoH"] == ["DtoH eviction"]
    assert by_lane["GPU page faults"] == ["GPU fault write"]
    assert by_lane["CPU page faults"] == ["CPU fault unknown"]
    user = next(e for e in slices if e["name"] == "HtoD user prefetch")
    assert (user["ts"], user["dur"]) == (5.0, 20.0)          # microseconds since the first event (1000 ns)
    assert user["args"]["bytes"] == MiB and user["args"]["src"] == "host" and user["args"]["dst"] == "gpu:0"
    colours = {e["name"]: e["cname"] for e in slices}
    assert colours["HtoD coherence"] in ("bad", "terrible") and colours["DtoH eviction"] in ("bad", "terrible")
    assert colours["HtoD user prefetch"] == "good"
    assert doc["otherData"]["origin_ns"] == 1000


def test_chrome_trace_allocations_open_and_close_and_count_live_bytes():
    doc = to_chrome_trace(sample())
    spans = [e for e in doc["traceEvents"] if e["ph"] in "be"]
    opened = {e["id"] for e in spans if e["ph"] == "b"}
    closed = {e["id"] for e in spans if e["ph"] == "e"}
    assert opened == {"0x2", "0x3"} and closed == {"0x2"}       # allocation 3 is still live
    counter = [e["args"]["bytes"] for e in doc["traceEvents"] if e["ph"] == "C"]
    assert counter == [MiB, 4 * MiB, 3 * MiB]
    instants = sorted(e["name"] for e in doc["traceEvents"] if e["ph"] == "i")
    assert instants == ["alloc", "alloc", "alloc_failure", "free", "segment_alloc"]


def test_an_empty_trace_is_a_valid_document():
    doc = to_chrome_trace(np.zeros(0, dtype=EVENT_DTYPE))
    assert json.loads(json.dumps(doc)) == doc and not [e for e in doc["traceEvents"] if e["ph"] != "M"]


def test_rmm_csv_has_rmms_columns_and_one_row_per_allocator_action(tmp_path):
    path = tmp_path / "log.csv"
    text = to_rmm_csv(sample(), path, thread=77, wall_clock_offset_ns=0)
    assert path.read_text() == text
    rows = list(csv.DictReader(io.StringIO(text)))
    assert text.splitlines()[0] == RMM_HEADER
    assert [(r["Action"], r["Pointer"], r["Size"], r["Stream"]) for r in rows] == [
        ("allocate", "0x10000000", str(MiB), "0"),
        ("allocate", "0x10100000", str(3 * MiB), "0xab"),
        ("free", "0x10000000", str(MiB), "0"),
        ("allocate failure", "(nil)", str(64 * MiB), "0"),
    ]
    assert {r["Thread"] for r in rows} == {"77"}
    micros = [int(r["Time"].rsplit(".", 1)[1]) for r in rows]
    assert micros == [1, 1, 40, 41]                              # event time in ns, as microseconds


def test_rmm_csv_matches_what_the_logging_adaptor_writes(tmp_path):
    log = tmp_path / "adaptor.csv"
    mr = ul.mr.LoggingResourceAdaptor(ul.mr.ManagedMemoryResource(), log)
    with ul.record() as trace:
        ptrs = [(mr.allocate(n), n) for n in (1000, 4096, 3 * MiB)]
        for p, n in reversed(ptrs):
            mr.deallocate(p, n)
    mr.flush()
    key = ("Action", "Pointer", "Size", "Stream")
    # Only this test's allocations: frees deferred from earlier tests may land inside the recording.
    events = trace.events
    mine = events[(events["kind"] == EventKind.ALLOC) & np.isin(events["address"], [p for p, _ in ptrs])]
    events = events[np.isin(events["alloc_id"], mine["alloc_id"])]
    ours = Counter(tuple(r[k] for k in key) for r in csv.DictReader(io.StringIO(to_rmm_csv(events))))
    theirs = [tuple(r[k] for k in key) for r in csv.DictReader(io.StringIO(log.read_text()))]
    assert len(theirs) == 6
    assert ours == Counter(theirs)          # the same rows: adaptors pass allocations through unrecorded


def test_bad_export_arguments_are_refused(tmp_path):
    with pytest.raises(InvalidArgumentError):
        to_chrome_trace([1, 2, 3])
    with pytest.raises(InvalidArgumentError):
        to_chrome_trace(sample(), 42)
    with pytest.raises(InvalidArgumentError):
        to_chrome_trace(sample(), tmp_path / "missing" / "t.json")
    with pytest.raises(InvalidArgumentError):
        to_rmm_csv(sample(), thread=-1)
    with pytest.raises(InvalidArgumentError):
        to_rmm_csv(sample(), wall_clock_offset_ns=1.5)


@settings(max_examples=25, deadline=None)
@given(arrays(EVENT_DTYPE, st.integers(0, 50)))
def test_save_and_load_give_back_every_byte(tmp_path_factory, events):
    path = tmp_path_factory.mktemp("trace") / "t.npy"
    Trace(events).save(path)
    assert Trace.load(path).events.tobytes() == events.tobytes()


def test_load_refuses_what_save_did_not_write(tmp_path):
    other = tmp_path / "other.npy"
    np.save(other, np.arange(10))
    with pytest.raises(InvalidArgumentError, match="does not hold uvm_lab events"):
        Trace.load(other)
    junk = tmp_path / "junk.npy"
    junk.write_bytes(b"not numpy")
    with pytest.raises(InvalidArgumentError, match="cannot read"):
        Trace.load(junk)
    with pytest.raises(InvalidArgumentError, match="cannot read"):
        Trace.load(tmp_path / "absent.npy")
    with pytest.raises(InvalidArgumentError):
        Trace(sample()).save(tmp_path / "no" / "such" / "dir.npy")
    with pytest.raises(InvalidArgumentError):
        Trace(sample()).save(None)
