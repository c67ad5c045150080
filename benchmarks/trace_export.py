"""Exporting a million events: Perfetto's protobuf format, Chrome JSON, and Perfetto's own Python builder.

    python3 benchmarks/trace_export.py                       # 1 M events, best of 3
    python3 benchmarks/trace_export.py --events 200000 --repeats 5 --peer-events 200000

The events come from the simulator: an oversubscribed loop (two buffers, 1.25x the device memory)
written and read on the GPU, prefetched to the host, read on the host under ReadMostly, allocated and
freed inside the recording. That recording is tiled, each copy later in time and with its own
allocation ids, up to ``--events``. Every exporter writes the same events to a file; the time is the
whole call (best of ``--repeats``, median beside it), the size is the file's, and the memory is the
peak that ``tracemalloc`` sees during a separate call (numpy's arrays included).

The peer is what a user of the ``perfetto`` package would write: ``TraceProtoBuilder`` with one
``TracePacket`` per slice start, end and instant, carrying the same tracks, names, arguments and
counters (no flows). It is timed on ``--peer-events`` events (default: all of them), once.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import uvm_lab as ul
from uvm_lab.events import EVENT_DTYPE, EventKind
from uvm_lab.events.sources import get_sources
from uvm_lab.tracing import cause_names, to_chrome_trace, to_perfetto

MiB = 1 << 20


def recorded_loop(passes: int) -> np.ndarray:
    """One recording of the simulator's oversubscribed loop."""
    ul.use_backend("sim", device_memory="256MiB")
    with ul.record() as trace:
        a = ul.DeviceBuffer(size="192MiB")
        b = ul.DeviceBuffer(size="128MiB")
        for _ in range(passes):
            ul.touch(a, on="gpu", mode="write")
            ul.touch(b, on="gpu", mode="read")
            b.prefetch("host")
            a.read_mostly = True
            ul.touch(a, on="host", mode="read")
            a.read_mostly = False
        a.close()
        b.close()
    return trace.events


def tiled(base: np.ndarray, n: int) -> np.ndarray:
    """``n`` events: copies of ``base``, each after the last and with allocation ids of its own."""
    copies = -(-n // len(base))
    out = np.concatenate([base] * copies)[:n]
    copy = np.repeat(np.arange(copies, dtype=np.uint64), len(base))[:n]
    span = np.uint64(int(base["end"].max() - base["start"].min()) + 1000)
    out["start"] += copy * span
    out["end"] += copy * span
    ids = out["alloc_id"] != 0
    out["alloc_id"][ids] += copy[ids] * np.uint64(int(base["alloc_id"].max()))
    return out


def official_builder(events: np.ndarray, path: str) -> int:
    """The same trace with ``perfetto.trace_builder.proto_builder.TraceProtoBuilder``: one object per packet."""
    from perfetto.trace_builder.proto_builder import TraceProtoBuilder

    builder = TraceProtoBuilder()
    seq = 1

    def track(uuid: int, name: str, parent: int = 0, unit: int = 0) -> None:
        packet = builder.add_packet()
        packet.trusted_packet_sequence_id = seq
        packet.track_descriptor.uuid = uuid
        packet.track_descriptor.name = name
        if parent:
            packet.track_descriptor.parent_uuid = parent
        if unit:
            packet.track_descriptor.counter.unit = unit

    track(1, "uvm_lab")
    track(2, "allocations", 1)
    counters = {int(EventKind.HTOD): 4, int(EventKind.DTOH): 5, int(EventKind.GPU_PAGE_FAULT): 7,
                int(EventKind.CPU_PAGE_FAULT): 8}
    for name, uuid, unit in (("HtoD bytes", 4, 3), ("DtoH bytes", 5, 3), ("GPU faults", 7, 2), ("CPU faults", 8, 2)):
        track(uuid, name, 1, unit)
    lanes = {int(a): 64 + i for i, a in enumerate(np.unique(events["alloc_id"]).tolist())}
    for alloc_id, uuid in lanes.items():
        track(uuid, f"allocation {alloc_id}" if alloc_id else "no allocation", 2)
    causes = cause_names(events)
    names: dict[str, int] = {}
    strings: dict[str, int] = {}
    arg_names = {"bytes": 1, "address": 2, "src -> dst": 3}
    lines = get_sources().texts(events["source"])
    first = builder.add_packet()
    first.trusted_packet_sequence_id = seq
    first.sequence_flags = 1
    totals = dict.fromkeys(counters.values(), 0)
    rows = []
    for kind, cause, line, src, dst, start, end, address, nbytes, value, alloc_id in zip(
            events["kind"].tolist(), causes, lines, *(events[f].tolist() for f in ("src", "dst", "start", "end",
                                                                                    "address", "bytes", "value",
                                                                                    "alloc_id")),
            strict=True):
        rows.append((start, 3 if end > start else 2, kind, cause, line, src, dst, address, nbytes, value, alloc_id))
        if end > start:
            rows.append((end, 1, kind, cause, line, src, dst, address, nbytes, value, alloc_id))
    rows.sort(key=lambda r: (r[0], r[1]))
    for ts, role, kind, cause, line, src, dst, address, nbytes, value, alloc_id in rows:
        packet = builder.add_packet()
        packet.timestamp = ts
        packet.trusted_packet_sequence_id = seq
        packet.sequence_flags = 2
        event = packet.track_event
        event.track_uuid = lanes[alloc_id]
        if role == 1:
            event.type = event.TYPE_SLICE_END
        else:
            event.type = event.TYPE_SLICE_BEGIN if role == 3 else event.TYPE_INSTANT
            name = f"{EventKind(kind).name} {cause}" + (f" · {line}" if line else "")   # as uvm_lab names it
            event.name_iid = names.setdefault(name, len(names) + 1)
            arg = event.debug_annotations.add()
            arg.name_iid = arg_names["bytes"]
            arg.uint_value = nbytes
            arg = event.debug_annotations.add()
            arg.name_iid = arg_names["address"]
            arg.pointer_value = address
            arg = event.debug_annotations.add()
            arg.name_iid = arg_names["src -> dst"]
            arg.string_value_iid = strings.setdefault(f"{src} -> {dst}", len(strings) + 1)
        counter = counters.get(kind)
        if counter and (role == 1 or (role == 2 and kind in (EventKind.GPU_PAGE_FAULT, EventKind.CPU_PAGE_FAULT))):
            totals[counter] += value if kind in (EventKind.GPU_PAGE_FAULT, EventKind.CPU_PAGE_FAULT) else nbytes
            event.extra_counter_track_uuids.append(counter)
            event.extra_counter_values.append(totals[counter])
    for name, iid in names.items():
        first.interned_data.event_names.add(iid=iid, name=name)
    for name, iid in arg_names.items():
        first.interned_data.debug_annotation_names.add(iid=iid, name=name)
    for text, iid in strings.items():
        first.interned_data.debug_annotation_string_values.add(iid=iid, str=text.encode())
    data = builder.serialize()
    with open(path, "wb") as f:
        f.write(data)
    return len(data)


def measure(name: str, export: Callable[[np.ndarray, str], object], events: np.ndarray, repeats: int,
            workdir: str) -> dict[str, float]:
    path = os.path.join(workdir, name.replace(" ", "_"))
    times = []
    for _ in range(repeats):
        gc.collect()
        t0 = time.perf_counter()
        export(events, path)
        times.append(time.perf_counter() - t0)
    size = os.path.getsize(path)
    gc.collect()
    tracemalloc.start()
    export(events, path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    os.remove(path)
    return {"best": min(times), "median": statistics.median(times), "bytes": size, "peak": peak, "events": len(events)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--passes", type=int, default=3, help="loop passes in the recording that is tiled")
    ap.add_argument("--peer-events", type=int, default=None, help="events for the official builder (default: all)")
    ap.add_argument("--no-peer", action="store_true")
    args = ap.parse_args()

    t0 = time.perf_counter()
    base = recorded_loop(args.passes)
    events = tiled(base, args.events)
    assert events.dtype == EVENT_DTYPE
    kinds, counts = np.unique(events["kind"], return_counts=True)
    mix = ", ".join(f"{EventKind(int(k)).name.lower()} {c / len(events):.1%}" for k, c in zip(kinds, counts,
                                                                                               strict=True))
    print(f"{len(events):,} events ({len(base):,} recorded, tiled) in {time.perf_counter() - t0:.1f} s: {mix}")
    print(f"slices (start < end): {(events['end'] > events['start']).mean():.1%}; "
          f"allocations: {len(np.unique(events['alloc_id'])):,}")

    with tempfile.TemporaryDirectory() as workdir:
        results = {"to_perfetto": measure("to_perfetto", to_perfetto, events, args.repeats, workdir),
                   "to_chrome_trace, streamed to a file": measure("to_chrome_trace", to_chrome_trace, events,
                                                                  args.repeats, workdir)}
        if not args.no_peer:
            peer_events = events[:args.peer_events] if args.peer_events else events
            results["perfetto TraceProtoBuilder (the peer)"] = measure("official", official_builder, peer_events, 1,
                                                                       workdir)
    peer = results.get("perfetto TraceProtoBuilder (the peer)")
    print("\n| exporter | events | best s | median s | M events/s | file MB | B/event | peak MB | vs peer |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, r in results.items():
        ratio = (f"{(r['best'] / r['events']) / (peer['best'] / peer['events']):.3f}x" if peer else "")
        print(f"| {name} | {r['events']:,} | {r['best']:.2f} | {r['median']:.2f} | {r['events'] / r['best'] / 1e6:.2f} "
              f"| {r['bytes'] / 1e6:.1f} | {r['bytes'] / r['events']:.1f} | {r['peak'] / 1e6:.0f} | {ratio} |")
    if peer:
        print("\n(vs peer: time per event against the peer's)")


if __name__ == "__main__":
    main()
