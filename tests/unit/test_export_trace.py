"""Traces out: Perfetto's protobuf format, Chrome/Perfetto JSON, RMM's CSV log, and save/load without loss."""

from __future__ import annotations

import csv
import inspect
import io
import json
import os
from collections import Counter, defaultdict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import uvm_lab as ul
from uvm_lab.errors import InvalidArgumentError, TraceFileError
from uvm_lab.events import EVENT_DTYPE, EventKind, make_events
from uvm_lab.events.schema import AccessType, MigrationCause
from uvm_lab.events.trace import Trace
from uvm_lab.tracing import to_chrome_trace, to_perfetto, to_rmm_csv
from uvm_lab.tracing.export import RMM_HEADER

# Perfetto's own schema reads the files back (the test extra installs it; a GPU machine may lack it).
perfetto_trace_pb2 = pytest.importorskip("perfetto.protos.perfetto.trace.perfetto_trace_pb2")
UnknownFieldSet = pytest.importorskip("google.protobuf.unknown_fields").UnknownFieldSet

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
    written = Trace(sample()).to_chrome_trace(path)         # streamed: what was written, not the document
    doc = to_chrome_trace(sample())
    assert json.loads(path.read_text()) == doc
    assert written == {"path": str(path), "bytes": path.stat().st_size, "events": 10, "origin_ns": 1000}
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


def test_an_empty_trace_is_a_valid_document(tmp_path):
    doc = to_chrome_trace(np.zeros(0, dtype=EVENT_DTYPE))
    assert json.loads(json.dumps(doc)) == doc and not [e for e in doc["traceEvents"] if e["ph"] != "M"]
    to_chrome_trace(np.zeros(0, dtype=EVENT_DTYPE), tmp_path / "t.json")
    assert json.loads((tmp_path / "t.json").read_text()) == doc


def test_a_streamed_chrome_trace_of_many_chunks_is_one_valid_document(tmp_path):
    with ul.record() as trace:
        a = ul.DeviceBuffer(size="16MiB")
        for _ in range(3):
            ul.touch(a, on="gpu", mode="write")
            a.prefetch("host")
            a.read_mostly = True
            ul.touch(a, on="host", mode="read")
            a.read_mostly = False
    events = np.concatenate([trace.events] * (-(-70_000 // len(trace.events))))   # more than one chunk
    path = tmp_path / "t.json"
    to_chrome_trace(events, path)
    doc = json.loads(path.read_text())
    rows = [e for e in doc["traceEvents"] if e["ph"] in "Xi"]
    assert len(rows) == len(events)
    assert Counter(e["name"] for e in rows)["advice set_read_mostly"] == (events["kind"] == EventKind.ADVICE).sum() // 2
    htod = sum(e["args"]["bytes"] for e in rows if e["name"].startswith("HtoD"))
    assert htod == Trace(events).summary()["bytes_htod"]


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
    kinds = np.array([int(k) for k in EventKind], dtype=np.uint8)
    events["kind"] = kinds[events["kind"] % len(kinds)]   # any record of any kind uvm_lab has
    path = tmp_path_factory.mktemp("trace") / "t.uvmtrace"
    Trace(events).save(path)
    assert Trace.load(path).events.tobytes() == events.tobytes()


def test_load_refuses_what_save_did_not_write(tmp_path):
    other = tmp_path / "other.npy"
    np.save(other, np.arange(10))
    with pytest.raises(TraceFileError, match="not uvm_lab events"):
        Trace.load(other)
    junk = tmp_path / "junk.npy"
    junk.write_bytes(b"not numpy")
    with pytest.raises(TraceFileError, match="does not start with"):
        Trace.load(junk)
    with pytest.raises(InvalidArgumentError, match="cannot read"):
        Trace.load(tmp_path / "absent.npy")
    with pytest.raises(InvalidArgumentError):
        Trace(sample()).save(tmp_path / "no" / "such" / "dir.npy")
    with pytest.raises(InvalidArgumentError):
        Trace(sample()).save(None)


# -- Perfetto's protobuf format, read back with Perfetto's own schema ------------------------------------------

INCREMENTAL_CLOCK = 64


def read_perfetto(path) -> dict:
    """What Perfetto's UI would show, decoded with the ``perfetto`` package's schema: tracks by uuid,
    slices (track, name, start, end, args, flows), counter samples by track, and flows."""
    data = path.read_bytes()
    trace = perfetto_trace_pb2.Trace.FromString(data)
    assert trace.ByteSize() == len(data)
    tracks, names, arg_names, strings = {}, {}, {}, {}
    slices, counters, open_slices = [], defaultdict(list), defaultdict(list)
    now = None
    for packet in trace.packet:
        assert packet.trusted_packet_sequence_id == 1
        # Every byte is a field of Perfetto's schema: nothing it would skip as unknown.
        assert not UnknownFieldSet(packet) and not UnknownFieldSet(packet.track_event)
        assert not any(UnknownFieldSet(arg) for arg in packet.track_event.debug_annotations)
        if packet.HasField("trace_packet_defaults"):
            assert packet.sequence_flags == 1           # the first packet clears the sequence's state
            assert packet.trace_packet_defaults.timestamp_clock_id == INCREMENTAL_CLOCK
            [clock] = [c for c in packet.clock_snapshot.clocks if c.clock_id == INCREMENTAL_CLOCK]
            assert clock.is_incremental
            now = clock.timestamp
        if packet.HasField("interned_data"):
            names.update({e.iid: e.name for e in packet.interned_data.event_names})
            arg_names.update({e.iid: e.name for e in packet.interned_data.debug_annotation_names})
            strings.update({e.iid: e.str.decode() for e in packet.interned_data.debug_annotation_string_values})
        if packet.HasField("track_descriptor"):
            tracks[packet.track_descriptor.uuid] = packet.track_descriptor
        if not packet.HasField("track_event"):
            continue
        now += packet.timestamp                          # the time since the packet before
        event = packet.track_event
        for uuid, value in zip(event.extra_counter_track_uuids, event.extra_counter_values, strict=True):
            counters[uuid].append((now, value))
        if event.type == event.TYPE_COUNTER:
            counters[event.track_uuid].append((now, event.counter_value))
            continue
        if event.type == event.TYPE_SLICE_END:
            begin = open_slices[event.track_uuid].pop()
            begin["end"] = now
            continue
        args = {}
        for arg in event.debug_annotations:
            value = (strings[arg.string_value_iid] if arg.HasField("string_value_iid") else
                     arg.pointer_value if arg.HasField("pointer_value") else arg.uint_value)
            args[arg_names[arg.name_iid]] = value
        # A slice is named by its kind and cause, then the line of code that caused it (where known).
        name, _, source = names[event.name_iid].partition(" · ")
        row = {"track": tracks[event.track_uuid].name, "uuid": event.track_uuid, "name": name, "source": source,
               "start": now, "end": now, "args": args, "flows": list(event.flow_ids),
               "ends_flows": list(event.terminating_flow_ids)}
        slices.append(row)
        if event.type == event.TYPE_SLICE_BEGIN:
            assert not open_slices[event.track_uuid], "slices on one track must not overlap"
            open_slices[event.track_uuid].append(row)
    assert not any(open_slices.values())
    by_name = {d.name: uuid for uuid, d in tracks.items() if d.HasField("counter")}
    return {"tracks": tracks, "slices": slices, "counters": {name: counters[uuid] for name, uuid in by_name.items()},
            "counter_tracks": {name: tracks[uuid] for name, uuid in by_name.items()}}


def total(samples) -> int:
    """A counter's value at the end: Perfetto adds up an incremental counter's samples."""
    return sum(v for _, v in samples)


def test_perfetto_has_a_track_per_allocation_and_the_counters(tmp_path):
    path = tmp_path / "t.pftrace"
    written = to_perfetto(sample(), path)
    assert written == path.stat().st_size
    doc = read_perfetto(path)
    named = Counter(d.name for d in doc["tracks"].values())
    assert {"allocation 1", "allocation 2", "allocation 3", "no allocation", "allocations", "uvm_lab"} <= set(named)
    assert set(doc["counter_tracks"]) == {"memory in use", "HtoD bytes", "DtoH bytes", "GPU faults", "CPU faults"}
    units = {name: d.counter.unit for name, d in doc["counter_tracks"].items()}
    assert units["HtoD bytes"] == units["memory in use"] == perfetto_trace_pb2.CounterDescriptor.UNIT_SIZE_BYTES
    assert units["GPU faults"] == perfetto_trace_pb2.CounterDescriptor.UNIT_COUNT
    allocations = next(uuid for uuid, d in doc["tracks"].items() if d.name == "allocations")
    lanes = [d for d in doc["tracks"].values() if d.name.startswith("allocation ") or d.name == "no allocation"]
    assert {d.parent_uuid for d in lanes} == {allocations}
    assert len(doc["slices"]) == len(sample())       # every record is one slice or instant


def test_perfetto_slices_are_named_by_kind_and_cause_and_carry_their_arguments(tmp_path):
    path = tmp_path / "t.pftrace"
    Trace(sample()).to_perfetto(path)
    slices = {s["name"]: s for s in read_perfetto(path)["slices"]}
    user = slices["HtoD user prefetch"]
    assert (user["track"], user["start"], user["end"]) == ("allocation 1", 6000, 26000)
    assert user["args"] == {"bytes": MiB, "src -> dst": "host -> gpu:0", "address": 0x10010000}
    fault = slices["GPU fault write"]
    assert (fault["start"], fault["end"]) == (1900, 1990)
    assert fault["args"]["faults"] == 3
    assert slices["DtoH eviction"]["args"]["src -> dst"] == "gpu:0 -> host"
    assert slices["CPU fault unknown"]["start"] == slices["CPU fault unknown"]["end"] == 29000   # an instant
    assert slices["alloc_failure"]["track"] == "no allocation"
    assert {"segment_alloc", "alloc", "free"} <= set(slices)


def test_perfetto_counters_add_up_to_the_traces_summary(tmp_path):
    with ul.record() as trace:
        a = ul.DeviceBuffer(size="16MiB")
        ul.touch(a, on="gpu", mode="write")
        a.prefetch("host")
        a.read_mostly = True
        ul.touch(a, on="gpu", mode="read")
        ul.touch(a, on="host", mode="write")
        a.close()
    summary = trace.summary()
    assert summary["bytes_htod"] and summary["bytes_dtoh"] and summary["gpu_faults"] and summary["cpu_faults"]
    path = tmp_path / "t.pftrace"
    trace.to_perfetto(path)
    counters = read_perfetto(path)["counters"]
    assert total(counters["HtoD bytes"]) == summary["bytes_htod"]
    assert total(counters["DtoH bytes"]) == summary["bytes_dtoh"]
    assert total(counters["GPU faults"]) == summary["gpu_faults"]
    assert total(counters["CPU faults"]) == summary["cpu_faults"]
    memory = counters["memory in use"]
    assert max(np.cumsum([v for _, v in memory])) == 16 * MiB
    assert total(memory) == 0                        # mapped, then unmapped
    times = [t for _, samples in counters.items() for t, _ in samples]
    assert min(times) >= int(trace.events["start"].min()) and max(times) <= int(trace.events["end"].max())


def test_perfetto_memory_counter_starts_with_what_the_frees_show_was_live(tmp_path):
    events = sample()
    events = events[events["kind"] != EventKind.SEGMENT_ALLOC]      # no mappings: memory resources' ALLOC/FREE
    before = make_events(1, kind=EventKind.FREE, address=0x20000000, bytes=5 * MiB, alloc_id=9, start=45000,
                         end=45000)
    path = tmp_path / "t.pftrace"
    to_perfetto(np.concatenate([events, before]), path)
    memory = read_perfetto(path)["counters"]["memory in use"]
    values = np.cumsum([v for _, v in memory])
    assert values[0] == 5 * MiB                      # allocation 9 was freed, so it was live from the start
    assert list(values[1:]) == [6 * MiB, 9 * MiB, 8 * MiB, 3 * MiB]


def test_perfetto_flows_link_each_prefetch_to_the_migrations_it_caused(tmp_path):
    with ul.record() as trace:
        a = ul.DeviceBuffer(size="8MiB")
        b = ul.DeviceBuffer(size="8MiB")
        ul.touch(a, on="gpu", mode="write")
        ul.touch(b, on="gpu", mode="write")
        a.prefetch("host")
        b.prefetch("host")
    ev = trace.events
    requests = ev[ev["kind"] == EventKind.PREFETCH]
    assert len(requests) == 2
    path = tmp_path / "t.pftrace"
    trace.to_perfetto(path)
    slices = read_perfetto(path)["slices"]
    prefetches = [s for s in slices if s["name"] == "prefetch"]
    migrations = {f: s for s in slices for f in s["ends_flows"]}
    assert len(prefetches) == 2
    for request, prefetch in zip(requests, prefetches, strict=True):
        caused = [migrations[f] for f in prefetch["flows"]]
        assert caused and all(m["name"] == "DtoH user prefetch" for m in caused)
        assert sum(m["args"]["bytes"] for m in caused) == request["bytes"]
        assert {m["track"] for m in caused} == {prefetch["track"]}
    user = [s for s in slices if s["name"] == "DtoH user prefetch"]
    assert len(migrations) == len(user)              # every prefetch migration is explained, once


def test_overlapping_slices_of_one_allocation_go_on_tracks_of_the_same_name(tmp_path):
    rows = [dict(kind=EventKind.HTOD, flags=MigrationCause.COHERENCE, src=-1, dst=0, address=0x1000, bytes=4096,
                 alloc_id=5, start=t0, end=t1) for t0, t1 in ((100, 300), (200, 400), (250, 260), (400, 500))]
    path = tmp_path / "t.pftrace"
    to_perfetto(np.concatenate([make_events(1, **r) for r in rows]), path)
    doc = read_perfetto(path)                         # asserts that no track holds overlapping slices
    spans = sorted((s["start"], s["end"]) for s in doc["slices"])
    assert spans == [(100, 300), (200, 400), (250, 260), (400, 500)]
    lanes = {s["uuid"] for s in doc["slices"]}
    assert len(lanes) == 3 and {doc["tracks"][u].name for u in lanes} == {"allocation 5"}
    merge = perfetto_trace_pb2.TrackDescriptor.SIBLING_MERGE_BEHAVIOR_BY_TRACK_NAME
    assert {doc["tracks"][u].sibling_merge_behavior for u in lanes} == {merge}   # shown as one track


def test_an_empty_trace_is_a_valid_perfetto_file(tmp_path):
    path = tmp_path / "t.pftrace"
    to_perfetto(np.zeros(0, dtype=EVENT_DTYPE), path)
    doc = read_perfetto(path)
    assert doc["slices"] == [] and "HtoD bytes" in doc["counter_tracks"]


def test_bad_perfetto_arguments_are_refused_and_write_nothing(tmp_path):
    with pytest.raises(InvalidArgumentError):
        to_perfetto([1, 2, 3], tmp_path / "a.pftrace")
    with pytest.raises(InvalidArgumentError, match="needs a path"):
        to_perfetto(sample(), None)
    with pytest.raises(InvalidArgumentError):
        to_perfetto(sample(), 42)
    with pytest.raises(InvalidArgumentError, match="cannot write"):
        to_perfetto(sample(), tmp_path / "missing" / "t.pftrace")
    assert list(tmp_path.iterdir()) == []


@settings(max_examples=40, deadline=None)
@given(arrays(EVENT_DTYPE, st.integers(0, 40)))
def test_any_events_make_a_perfetto_file_with_one_slice_each(tmp_path_factory, events):
    events["start"] %= 1 << 62                       # clock readings in ns: 146 years of them
    events["end"] %= 1 << 62
    path = tmp_path_factory.mktemp("perfetto") / "t.pftrace"
    to_perfetto(events, path)
    doc = read_perfetto(path)                         # decodes; slices never overlap on a track
    assert len(doc["slices"]) == len(events)
    starts = sorted(s["start"] for s in doc["slices"])
    assert starts == sorted(events["start"].tolist())


def test_perfetto_slices_name_the_line_of_user_code(tmp_path, sim_backend):
    with ul.record() as trace:
        line = inspect.currentframe().f_lineno + 1
        a = ul.DeviceBuffer(size="1MiB")
        a.prefetch("gpu")
    trace.to_perfetto(tmp_path / "t.pftrace")
    slices = read_perfetto(tmp_path / "t.pftrace")["slices"]
    here = f"{os.path.basename(__file__)}:{line}"
    assert {s["source"] for s in slices if s["name"] in ("alloc", "segment_alloc")} == {here}
    assert {s["source"] for s in slices if s["name"] == "prefetch"} == {f"{os.path.basename(__file__)}:{line + 1}"}
    assert all("source" not in s["args"] for s in slices)   # said once, in the name


def test_every_export_keeps_the_gpus_of_a_peer_migration(tmp_path):
    """A two-GPU run: each DtoD slice says which GPU the pages left and which they reached, in every format."""
    ul.use_backend("sim", devices=2, device_memory="64MiB")
    with ul.record() as trace:
        buf = ul.DeviceBuffer(size="4MiB", label="peer")
        ul.touch(buf, on="host", mode="write")
        buf.prefetch("gpu:0")
        buf.prefetch("gpu:1")
        buf.prefetch("gpu:0")
    buf.close()
    peers = trace.events[trace.events["kind"] == EventKind.DTOD]
    there = [(int(s), int(d)) for s, d in zip(peers["src"], peers["dst"], strict=True)]
    assert set(there) == {(0, 1), (1, 0)} and peers["bytes"].sum() == 8 * MiB
    expected = Counter(f"gpu:{s} -> gpu:{d}" for s, d in there)

    doc = to_chrome_trace(trace)
    dtod = lane_ids(doc)["DtoD"]
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["tid"] == dtod]
    assert Counter(f"{e['args']['src']} -> {e['args']['dst']}" for e in slices) == expected
    assert sum(e["args"]["bytes"] for e in slices) == 8 * MiB

    trace.to_perfetto(tmp_path / "t.pftrace")
    perfetto = [s for s in read_perfetto(tmp_path / "t.pftrace")["slices"] if s["name"].startswith("DtoD")]
    assert Counter(s["args"]["src -> dst"] for s in perfetto) == expected

    frame = trace.to_pandas()
    rows = frame[frame["kind"].str.lower() == "dtod"]
    assert Counter(f"{s} -> {d}" for s, d in zip(rows["src"], rows["dst"], strict=True)) == expected

    trace.save(tmp_path / "t.uvmtrace")
    loaded = Trace.load(tmp_path / "t.uvmtrace").events
    np.testing.assert_array_equal(loaded[loaded["kind"] == EventKind.DTOD], peers)
