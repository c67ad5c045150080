"""Traces out of uvm_lab: Perfetto's protobuf trace, Chrome/Perfetto trace JSON, and RMM's allocation log (CSV).

:func:`to_perfetto` writes Perfetto's own format (a ``Trace`` of ``TracePacket``\\ s), which
https://ui.perfetto.dev opens and which stays small and quick for millions of events:

- counter tracks for the memory in use, the bytes moved host to device and device to host (rising
  totals: the UI's "rate" mode shows the bandwidth) and the GPU and CPU faults taken;
- one track per allocation (named by its ``alloc_id``; records of no known allocation share one track),
  where each record is a slice (an instant where it took no time) named after its kind and cause
  ("HtoD coherence", "GPU fault write", "prefetch", "advice set_read_mostly"), with its bytes, processors,
  address and the line of user code it came from as arguments;
- an arrow from each prefetch request to the migrations it caused.

:func:`to_chrome_trace` writes the Trace Event Format that ``chrome://tracing`` and Perfetto open: one
process, a lane (thread) each for HtoD, DtoH, DtoD, GPU faults, CPU faults, thrashing/throttling/remote
maps, and allocations. Slices carry the same names, so Perfetto, which colours by name, colours by cause;
``cname`` carries the same colouring for chrome://tracing (coherence and eviction in reds, as Nsight
Systems shows them). Each allocation's lifetime is an async span; live bytes are a counter. With a path it
is written as it is made, a chunk of events at a time.

:func:`to_rmm_csv` writes RMM's ``logging_resource_adaptor`` format
(``Thread,Time,Action,Pointer,Size,Stream``), one row per allocation, failed allocation and free,
so RMM's replay benchmark and log tools read it.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import IO, Any

import numpy as np

from ..errors import InvalidArgumentError
from ..events.schema import EVENT_DTYPE, Advice, EventKind, MemoryKind, MigrationCause
from ..events.sources import get_sources
from ..paths import file_path
from . import wire
from .attribution import cause_names

__all__ = ["LANES", "RMM_HEADER", "to_chrome_trace", "to_perfetto", "to_rmm_csv"]

#: RMM's CSV header.
RMM_HEADER = "Thread,Time,Action,Pointer,Size,Stream"

#: Lane (thread id, name) for each event kind.
LANES: dict[int, tuple[int, str]] = {
    EventKind.HTOD: (1, "HtoD"),
    EventKind.DTOH: (2, "DtoH"),
    EventKind.DTOD: (3, "DtoD"),
    EventKind.GPU_PAGE_FAULT: (4, "GPU page faults"),
    EventKind.CPU_PAGE_FAULT: (5, "CPU page faults"),
    EventKind.THRASHING: (6, "Thrashing, throttling, remote map"),
    EventKind.THROTTLING: (6, "Thrashing, throttling, remote map"),
    EventKind.REMOTE_MAP: (6, "Thrashing, throttling, remote map"),
    EventKind.INVALIDATE: (6, "Thrashing, throttling, remote map"),
}
_ALLOCATIONS = (7, "Allocations")
_PID = 1
_SHORT: dict[int, str] = {EventKind.HTOD: "HtoD", EventKind.DTOH: "DtoH", EventKind.DTOD: "DtoD",
          EventKind.GPU_PAGE_FAULT: "GPU fault", EventKind.CPU_PAGE_FAULT: "CPU fault",
          EventKind.THRASHING: "thrashing", EventKind.THROTTLING: "throttling", EventKind.REMOTE_MAP: "remote map",
          EventKind.INVALIDATE: "invalidate"}
#: chrome://tracing's reserved colour names, by cause.
_COLOURS = {"user prefetch": "good", "coherence": "bad", "driver prefetch": "rail_load", "eviction": "terrible",
            "access counters": "olive", "read": "thread_state_running", "write": "bad", "atomic": "terrible",
            "prefetch": "rail_load", "thrashing": "terrible", "policy": "olive", "out of memory": "terrible",
            "unknown": "grey", "inferred": "black", "": "generic_work"}
_MIGRATIONS = (int(EventKind.HTOD), int(EventKind.DTOH), int(EventKind.DTOD))
_FAULTS = (int(EventKind.GPU_PAGE_FAULT), int(EventKind.CPU_PAGE_FAULT))
#: Events are formatted and written this many at a time.
_CHUNK = 1 << 16


def _events_of(trace: Any) -> np.ndarray:
    events = getattr(trace, "events", trace)
    if not isinstance(events, np.ndarray) or events.dtype != EVENT_DTYPE:
        raise InvalidArgumentError(f"expected a Trace or an EVENT_DTYPE array, got {type(trace).__name__}",
                                   value=trace, expected="uvm_lab.Trace or a numpy array of EVENT_DTYPE")
    return events


def _processor(p: int) -> str:
    return "host" if p == -1 else ("" if p < -1 else f"gpu:{p}")


def _check_path(path: Any) -> str | None:
    if path is None:
        return None
    return file_path(path, expected="a str or os.PathLike, or None")


def _slice_name(kind: int, flags: int, cause: str) -> str:
    """What a record is called on a timeline: its kind, and its cause where it has one."""
    if kind in LANES:
        return f"{_SHORT[kind]} {cause}".strip()
    if kind == EventKind.ADVICE:
        return f"advice {Advice(flags).name.lower()}" if flags in Advice._value2member_map_ else "advice"
    try:
        return EventKind(kind).name.lower()
    except ValueError:
        return f"kind {kind}"


def _kind_keys(events: np.ndarray) -> np.ndarray:
    """One number per (kind, flags): what a record's name and cause depend on."""
    return (events["kind"].astype(np.uint32) << 8) | events["flags"]


def _groups(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``np.unique(keys, return_index=True, return_inverse=True)``, without sorting where the keys span a
    small range (ids, codes): one pass over a table as long as the range."""
    keys = np.asarray(keys)
    n = len(keys)
    if n == 0 or int(keys.max()) - int(keys.min()) > 4 * n + (1 << 16):
        values, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        return values, first, inverse.reshape(-1)
    low = keys.min()
    offset = (keys - low).astype(np.intp)
    first_at = np.full(int(offset.max()) + 1, n, dtype=np.intp)
    np.minimum.at(first_at, offset, np.arange(n))
    present = first_at < n
    rank = np.cumsum(present) - 1
    return np.flatnonzero(present).astype(keys.dtype) + low, first_at[present], rank[offset]


def _route_keys(events: np.ndarray, *, by_kind: bool = True) -> np.ndarray:
    """One small number per (kind, src, dst) (or per (src, dst)) the records hold."""
    src, dst = events["src"].astype(np.int64), events["dst"].astype(np.int64)
    src -= src.min(initial=0)
    dst -= dst.min(initial=0)
    key = src * (int(dst.max(initial=0)) + 1) + dst
    if by_kind:
        key += events["kind"].astype(np.int64) * (int(key.max(initial=0)) + 1)
    return key


def _name_table(events: np.ndarray) -> tuple[np.ndarray, list[str], list[str], np.ndarray]:
    """``(index, names, causes, kinds)``: each record's index into tables of names and causes, one entry
    per (kind, flags) the records hold, and the kind of each entry. Names and causes are worked out once
    per entry, not once per record."""
    _, first, index = _groups(_kind_keys(events))
    representatives = events[first]
    causes = cause_names(representatives)
    names = [_slice_name(k, f, c) for k, f, c in zip(representatives["kind"].tolist(),
                                                     representatives["flags"].tolist(), causes, strict=True)]
    return index, names, causes, representatives["kind"]


def _write_file(path: str, original: Any, write: Callable[[IO[Any]], Any], mode: str) -> Any:
    try:
        with (open(path, "wb") if mode == "wb" else open(path, "w", encoding="utf-8")) as f:
            return write(f)
    except OSError as exc:
        raise InvalidArgumentError(f"cannot write {path!r}: {exc}", value=original,
                                   expected="a writable file path") from exc


def _route_table(events: np.ndarray) -> tuple[np.ndarray, list[int], list[int]]:
    """``(index, srcs, dsts)``: each record's index into a table of the (src, dst) pairs the records hold."""
    _, first, index = _groups(_route_keys(events, by_kind=False))
    return index, events["src"][first].tolist(), events["dst"][first].tolist()


# -- Chrome trace JSON --------------------------------------------------------------------------------------

def _chrome_pieces(events: np.ndarray, origin: int) -> Iterator[str]:
    """The document's text, in pieces of at most :data:`_CHUNK` events' rows each."""
    yield '{"traceEvents":['
    rows: list[str] = [json.dumps({"ph": "M", "pid": _PID, "name": "process_name", "args": {"name": "uvm_lab"}})]
    for tid, name in sorted({*LANES.values(), _ALLOCATIONS}):
        rows.append(json.dumps({"ph": "M", "pid": _PID, "tid": tid, "name": "thread_name", "args": {"name": name}}))
        rows.append(json.dumps({"ph": "M", "pid": _PID, "tid": tid, "name": "thread_sort_index",
                                "args": {"sort_index": tid}}))
    yield ",".join(rows)

    # Everything that depends on (kind, flags) or on (src, dst) is formatted once per combination. ``heads``:
    # a lane's slice row up to its times, or an instant's name.
    index, names, causes, table_kinds = _name_table(events)
    heads, cause_json = [], []
    for kind, name, cause in zip(table_kinds.tolist(), names, causes, strict=True):
        lane = LANES.get(kind)
        heads.append(f'{{"ph":"X","pid":{_PID},"tid":{lane[0]},"name":{json.dumps(name)},'
                     f'"cat":{json.dumps(_SHORT[kind])},"cname":"{_COLOURS.get(cause, "generic_work")}",'
                     if lane else json.dumps(name))
        cause_json.append(json.dumps(cause))
    route_index, srcs, dsts = _route_table(events)
    route_json = [f'"src":"{_processor(s)}","dst":"{_processor(d)}"' for s, d in zip(srcs, dsts, strict=True)]
    location_json = [f',"location":"{_processor(d)}"' for d in dsts]
    memory_json = {f: f',"memory":"{MemoryKind(f).name.lower() if f in MemoryKind._value2member_map_ else f}"'
                   for f in range(256)}

    # Live bytes after each allocation or free, in the order they happened.
    kinds = events["kind"]
    allocator = np.flatnonzero((kinds == EventKind.ALLOC) | (kinds == EventKind.FREE))
    signed = np.where(kinds[allocator] == EventKind.ALLOC, 1, -1) * events["bytes"][allocator].astype(np.int64)
    live_after = dict(zip(allocator.tolist(), np.cumsum(signed).tolist(), strict=True))

    lane_kinds = np.array(sorted(int(k) for k in LANES), dtype=np.uint8)
    for lo in range(0, len(events), _CHUNK):
        chunk = events[lo:lo + _CHUNK]
        start = chunk["start"].astype(np.int64)
        ts = ((start - origin) / 1e3).tolist()
        dur = (np.maximum(chunk["end"].astype(np.int64) - start, 0) / 1e3).tolist()
        in_lane = np.isin(chunk["kind"], lane_kinds)
        rows = []
        sel = np.flatnonzero(in_lane)
        if len(sel):
            part = chunk[sel]
            rows += [f'{heads[k]}"ts":{ts[i]},"dur":{dur[i]},"args":{{"address":"{a:#x}","bytes":{b},"value":{v},'
                     f'{route_json[r]},"alloc_id":{aid},"cause":{cause_json[k]}}}}}'
                     for i, k, r, a, b, v, aid in zip(sel.tolist(), index[lo + sel].tolist(),
                                                      route_index[lo + sel].tolist(), part["address"].tolist(),
                                                      part["bytes"].tolist(), part["value"].tolist(),
                                                      part["alloc_id"].tolist(), strict=True)]
        sel = np.flatnonzero(~in_lane)
        part = chunk[sel]
        for i, kind, k, r, addr, nbytes, alloc_id, flags in zip(
                sel.tolist(), part["kind"].tolist(), index[lo + sel].tolist(), route_index[lo + sel].tolist(),
                part["address"].tolist(), part["bytes"].tolist(), part["alloc_id"].tolist(), part["flags"].tolist(),
                strict=True):
            extra = (memory_json[flags] if kind == EventKind.SEGMENT_ALLOC else
                     location_json[r] if kind in (EventKind.PREFETCH, EventKind.ADVICE) else "")
            rows.append(f'{{"ph":"i","s":"t","pid":{_PID},"tid":{_ALLOCATIONS[0]},"name":{heads[k]},'
                        f'"cat":"allocator","ts":{ts[i]},"args":{{"address":"{addr:#x}","bytes":{nbytes},'
                        f'"alloc_id":{alloc_id}{extra}}}}}')
            if kind in (EventKind.ALLOC, EventKind.FREE):
                opening = kind == EventKind.ALLOC
                args = f'{{"address":"{addr:#x}","bytes":{nbytes}}}' if opening else "{}"
                rows.append(f'{{"ph":"{"b" if opening else "e"}","pid":{_PID},"tid":{_ALLOCATIONS[0]},'
                            f'"cat":"allocation","id":"{alloc_id:#x}","name":"allocation {alloc_id}",'
                            f'"ts":{ts[i]},"args":{args}}}')
                rows.append(f'{{"ph":"C","pid":{_PID},"name":"allocated bytes","ts":{ts[i]},'
                            f'"args":{{"bytes":{live_after[lo + i]}}}}}')
        if rows:
            yield "," + ",".join(rows)
    other = {"producer": "uvm_lab", "origin_ns": origin, "events": len(events)}
    yield f'],"displayTimeUnit":"ns","otherData":{json.dumps(other)}}}'


def to_chrome_trace(trace: Any, path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """The trace as Chrome/Perfetto trace JSON: returned as a dict, or written to ``path``.

    With a ``path``, the document is written as it is made, :data:`_CHUNK` events at a time, and
    never held whole in memory: this is the way to export a long trace (for millions of events,
    :func:`to_perfetto` is smaller and faster still).

    Parameters
    ----------
    trace
        A :class:`~uvm_lab.Trace` or an ``EVENT_DTYPE`` array.
    path
        Where to write the JSON; None to get the document back instead.

    Returns
    -------
    dict
        Without ``path``: the document, ``{"traceEvents": [...], "displayTimeUnit": "ns",
        "otherData": {...}}``. Times are microseconds since the first event; ``otherData["origin_ns"]``
        is that event's clock reading. With ``path``: what was written, ``{"path": str, "bytes": int,
        "events": int, "origin_ns": int}`` (``events``: the trace's records).

    Raises
    ------
    InvalidArgumentError
        ``trace`` is not a trace, or ``path`` is not a path (or cannot be written).
    """
    events = _events_of(trace)
    out_path = _check_path(path)
    origin = int(events["start"].min()) if len(events) else 0
    if out_path is None:
        return json.loads("".join(_chrome_pieces(events, origin)))

    def write(f: IO[str]) -> int:
        written = 0
        for piece in _chrome_pieces(events, origin):
            written += len(piece)   # ASCII only: every name and value above is
            f.write(piece)
        return written

    written = _write_file(out_path, path, write, "w")
    return {"path": out_path, "bytes": written, "events": len(events), "origin_ns": origin}


# -- Perfetto protobuf --------------------------------------------------------------------------------------

# Field numbers of Perfetto's trace proto (protos/perfetto/trace/...): what the bytes below mean.
_TRACE_PACKET = 1                                           # Trace.packet
_P_TIMESTAMP, _P_SEQUENCE_ID, _P_TRACK_EVENT, _P_INTERNED = 8, 10, 11, 12
_P_SEQUENCE_FLAGS, _P_TRACK_DESCRIPTOR, _P_FIRST_ON_SEQUENCE = 13, 60, 87
_P_CLOCK_SNAPSHOT, _P_TIMESTAMP_CLOCK, _P_DEFAULTS = 6, 58, 59
_INCREMENTAL_STATE_CLEARED = 1                              # TracePacket.SequenceFlags
_S_CLOCKS, _K_ID, _K_TIMESTAMP, _K_INCREMENTAL = 1, 1, 2, 3  # ClockSnapshot, ClockSnapshot.Clock
_BOOTTIME, _DELTA_CLOCK = 6, 64     # a builtin clock, and this sequence's own clock: each packet's time is
                                    # the time since the packet before (Perfetto's SDK does the same)
_E_TYPE, _E_NAME_IID, _E_TRACK_UUID, _E_ANNOTATION = 9, 10, 11, 4
_E_COUNTER_VALUE, _E_EXTRA_COUNTER_UUIDS, _E_EXTRA_COUNTER_VALUES = 30, 31, 12
_E_FLOW_IDS, _E_TERMINATING_FLOW_IDS = 47, 48
_A_NAME_IID, _A_UINT, _A_POINTER, _A_STRING_IID = 1, 3, 7, 17   # DebugAnnotation
_D_UUID, _D_NAME, _D_PARENT, _D_COUNTER, _D_CHILD_ORDERING, _D_DESCRIPTION, _D_SIBLING_MERGE = 1, 2, 5, 8, 11, 14, 15
_CHRONOLOGICAL, _MERGE_BY_NAME = 2, 1
_C_UNIT, _C_INCREMENTAL, _UNIT_COUNT, _UNIT_BYTES = 3, 5, 2, 3   # CounterDescriptor
_I_EVENT_NAMES, _I_ANNOTATION_NAMES, _I_STRINGS = 2, 3, 29   # InternedData
_SEQUENCE = 1

# Rows of the packet table, in the order they sort at equal times: a counter's first value, then a
# slice's end, then instants, then a slice's start (so back-to-back slices do not overlap).
_FIRST_VALUE, _END, _INSTANT, _BEGIN = 0, 1, 2, 3
_EVENT_TYPE = np.array([4, 2, 3, 1], dtype=np.uint64)        # TrackEvent.Type of each row kind

_ROOT_TRACK, _ALLOCATION_TRACKS, _FIRST_LANE_TRACK = 1, 2, 64
#: Counter tracks: (name, unit, what they count). Each record moving a counter carries the change, which
#: Perfetto adds up (``is_incremental``): the UI shows totals, and its rate mode the bandwidth.
_COUNTERS = (
    ("memory in use", _UNIT_BYTES, "bytes mapped (SEGMENT_ALLOC/SEGMENT_FREE); where the trace has no "
     "mappings, bytes handed out by memory resources (ALLOC/FREE)"),
    ("HtoD bytes", _UNIT_BYTES, "bytes moved host to device so far; the rate is the bandwidth"),
    ("DtoH bytes", _UNIT_BYTES, "bytes moved device to host so far; the rate is the bandwidth"),
    ("DtoD bytes", _UNIT_BYTES, "bytes moved device to device so far; the rate is the bandwidth"),
    ("GPU faults", _UNIT_COUNT, "GPU page faults so far (CUPTI's count)"),
    ("CPU faults", _UNIT_COUNT, "CPU page faults so far"),
)
_MEMORY, _HTOD, _DTOH, _DTOD, _GPU_FAULTS, _CPU_FAULTS = range(1, len(_COUNTERS) + 1)
_COUNTER_OF_KIND = {EventKind.HTOD: _HTOD, EventKind.DTOH: _DTOH, EventKind.DTOD: _DTOD,
                    EventKind.GPU_PAGE_FAULT: _GPU_FAULTS, EventKind.CPU_PAGE_FAULT: _CPU_FAULTS}


def _counter_track(counter: int) -> int:
    return _ALLOCATION_TRACKS + counter


#: Numeric arguments of every slice: (name, DebugAnnotation field, value of each record, kinds or None: all).
_NUMBER_ANNOTATIONS: tuple[tuple[str, int, Callable[[Any], np.ndarray], tuple[int, ...] | None], ...] = (
    ("bytes", _A_UINT, lambda ev: ev["bytes"], None),
    ("faults", _A_UINT, lambda ev: ev["value"], _FAULTS),
    ("address", _A_POINTER, lambda ev: ev["address"], None),
)
_ROUTED = (*(int(k) for k in LANES), int(EventKind.PREFETCH), int(EventKind.UNOBSERVED))


def _route_texts(representatives: np.ndarray) -> list[str]:
    return [f"{_processor(s)} -> {_processor(d)}" if k in _ROUTED else ""
            for k, s, d in zip(representatives["kind"].tolist(), representatives["src"].tolist(),
                               representatives["dst"].tolist(), strict=True)]


def _location_texts(representatives: np.ndarray) -> list[str]:
    return [_processor(d) if k == EventKind.ADVICE else ""
            for k, d in zip(representatives["kind"].tolist(), representatives["dst"].tolist(), strict=True)]


#: Text arguments: (name, what records share the text, the texts of records, one of each kind; "" for
#: none). Each text is written once (interned); records carry its number. The cause is in the slice's name,
#: and pages are bytes / 4 KiB: neither is written again.
_TEXT_ANNOTATIONS: tuple[tuple[str, Callable[[np.ndarray], np.ndarray],
                               Callable[[np.ndarray], list[str]]], ...] = (
    ("src -> dst", _route_keys, _route_texts),
    ("location", _route_keys, _location_texts),
)
#: A migration requested by cudaMemPrefetchAsync (measured or inferred) is linked to the request that
#: covers its address, if one of the latest this many requests before it does.
_PREFETCH_LOOKBACK = 8


class _Strings:
    """Interned strings: each distinct text gets a number from 1."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def __call__(self, text: str) -> int:
        return self.ids.setdefault(text, len(self.ids) + 1)


def _sublanes(lane: np.ndarray, start: np.ndarray, end: np.ndarray, is_slice: np.ndarray) -> np.ndarray:
    """For each record, which of its allocation's tracks holds it: slices on one track must not overlap.

    Each round keeps, lane by lane, the slices that start after every earlier one (of those left) has
    ended, and moves the others on to the next track.
    """
    out = np.zeros(len(lane), dtype=np.int64)
    slices = np.flatnonzero(is_slice)
    if not len(slices):
        return out
    # (lane, time) packed into one int64, so that a running maximum stays in its lane: times since the
    # first slice where they fit, else their ranks.
    first, last = start[slices] - start[slices].min(), end[slices] - start[slices].min()
    span = int(last.max()) + 1
    if span * (int(lane.max()) + 1) >= 1 << 62:
        _, _, ranks = _groups(np.concatenate([first, last]))
        first, last, span = ranks[:len(slices)], ranks[len(slices):], len(ranks) + 1
    base = lane[slices].astype(np.int64) * span
    order = np.argsort(base + first, kind="stable")        # by lane, then by start
    slices, first, base = slices[order], first[order], base[order]
    last = last[order] + base
    remaining = np.arange(len(slices))
    level = 0
    while len(remaining):
        ends = last[remaining]
        before = np.maximum.accumulate(ends)
        before = np.concatenate([[-1], before[:-1]])
        clash = (before >= base[remaining]) & (first[remaining] < before - base[remaining])
        out[slices[remaining[~clash]]] = level
        remaining = remaining[clash]
        level += 1
    return out


def _prefetch_links(events: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(migrations, requests)``: each migration made for a prefetch request, and that request.

    A migration of cause "user prefetch" (CUPTI's ``USER``, or inferred from a completed prefetch)
    belongs to the latest PREFETCH record at or before its start whose range holds its address and
    whose destination is its destination. Migrations no request explains get no link.
    """
    kinds = events["kind"]
    requests = np.flatnonzero(kinds == EventKind.PREFETCH)
    user = (events["flags"] == MigrationCause.USER) | (events["flags"] == MigrationCause.USER_INFERRED)
    migrations = np.flatnonzero(np.isin(kinds, _MIGRATIONS) & user)
    if not len(requests) or not len(migrations):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    requests = requests[np.argsort(events["start"][requests], kind="stable")]
    latest = np.searchsorted(events["start"][requests], events["start"][migrations], side="right") - 1
    found = np.full(len(migrations), -1, dtype=np.int64)
    address, dst = events["address"][migrations], events["dst"][migrations]
    for back in range(_PREFETCH_LOOKBACK):
        candidate = latest - back
        open_ = (candidate >= 0) & (found < 0)
        if not open_.any():
            break
        request = requests[np.maximum(candidate, 0)]
        lo = events["address"][request]
        hit = open_ & (address >= lo) & (address < lo + events["bytes"][request]) & (dst == events["dst"][request])
        found[hit] = request[hit]
    linked = found >= 0
    return migrations[linked], found[linked]


def _packet(*fields: bytes) -> bytes:
    return wire.message(_TRACE_PACKET, wire.field(_P_SEQUENCE_ID, _SEQUENCE), *fields)


def _track(uuid: int, name: str, parent: int | None = None, *extra: bytes) -> bytes:
    body = [wire.field(_D_UUID, uuid), wire.field(_D_NAME, name)]
    if parent is not None:
        body.append(wire.field(_D_PARENT, parent))
    return _packet(wire.message(_P_TRACK_DESCRIPTOR, *body, *extra))


def to_perfetto(trace: Any, path: str | os.PathLike[str]) -> int:
    """Write the trace in Perfetto's protobuf format, for https://ui.perfetto.dev.

    Tracks, under one "uvm_lab" track:

    - counters: "memory in use" (bytes mapped by the backend, SEGMENT_ALLOC/SEGMENT_FREE; where the trace
      has no mappings, bytes handed out by memory resources, ALLOC/FREE), starting from what the trace's
      frees show was already live; "HtoD bytes", "DtoH bytes" (and "DtoD bytes" where there are any),
      totals that rise as each migration ends, so that the UI's rate mode shows the bandwidth; "GPU faults"
      and "CPU faults", totals of CUPTI's fault counts;
    - "allocations": one track per ``alloc_id`` ("allocation 7"; "no allocation" for records of none).
      Each record is a slice from ``start`` to ``end`` (an instant where they are equal), named after its
      kind and cause ("HtoD coherence", "GPU fault write", "prefetch", "advice set_read_mostly") and the
      line of user code that caused it, where known ("HtoD user prefetch · In [3], line 5"), with
      arguments ``bytes``, ``src -> dst``, ``address`` (and ``faults`` for faults, ``location`` for
      advice). Slices of one allocation that overlap go on further
      tracks of the same name, which the UI shows as one;
    - flows: an arrow from each PREFETCH request to each migration it caused, where the migration's cause
      is a user prefetch and a request at or before it covers its address with the same destination.

    Times are the backend's clock in nanoseconds, unchanged. Strings are interned, and the file is
    encoded in bulk and written a chunk at a time: a million events take about two seconds and 70 MB
    (``benchmarks/trace_export.py``).

    Parameters
    ----------
    trace
        A :class:`~uvm_lab.Trace` or an ``EVENT_DTYPE`` array.
    path
        Where to write the trace (by convention ``.pftrace`` or ``.perfetto-trace``).

    Returns
    -------
    int
        The bytes written.

    Raises
    ------
    InvalidArgumentError
        ``trace`` is not a trace, or ``path`` is not a path (or cannot be written).
    """
    events = _events_of(trace)
    if path is None:
        raise InvalidArgumentError("to_perfetto needs a path to write to", value=path,
                                   expected="a str or os.PathLike")
    out_path = _check_path(path)
    assert out_path is not None
    return _write_file(out_path, path, lambda f: _write_perfetto(events, f), "wb")


def _write_perfetto(events: np.ndarray, f: IO[bytes]) -> int:
    n = len(events)
    kinds = events["kind"]
    start = events["start"].astype(np.int64)
    end = np.maximum(events["end"].astype(np.int64), start)
    origin = int(start.min()) if n else 0
    is_slice = end > start

    strings = _Strings()
    index, names, _, _ = _name_table(events)
    # The line of code that caused a slice is in its name ("HtoD prefetch · In [3], line 5"): written once
    # per name, where an argument would be written once per slice, and Perfetto's tables group by it.
    sources = events["source"].astype(np.int64)
    named, first, index = _groups(index.astype(np.int64) * (int(sources.max(initial=0)) + 1) + sources)
    base = (named // (int(sources.max(initial=0)) + 1)).tolist()
    names = [f"{names[k]} · {line}" if line else names[k]
             for k, line in zip(base, get_sources().texts(sources[first]), strict=True)]
    # Arrays by record have one more entry, for the rows of no record (a counter's first value).
    name_iid = np.append(index + 1, 0).astype(np.uint32)
    text_iids = []
    for _, keys_of, texts_of in _TEXT_ANNOTATIONS:
        _, first, inverse = _groups(keys_of(events))
        table = np.array([strings(t) if t else 0 for t in texts_of(events[first])] or [0], dtype=np.uint32)
        text_iids.append(np.append(table[inverse], 0))
    annotation_names = [a[0] for a in _NUMBER_ANNOTATIONS] + [a[0] for a in _TEXT_ANNOTATIONS]

    # Tracks: one per allocation, and more of the same name where its slices overlap.
    lanes, _, lane = _groups(events["alloc_id"])
    sub = _sublanes(lane, start, end, is_slice)
    tracks, _, track = _groups(lane.astype(np.int64) * (int(sub.max(initial=0)) + 1) + sub)
    track_uuid = np.append(track + _FIRST_LANE_TRACK, 0).astype(np.uint32)
    track_lane = tracks // (int(sub.max(initial=0)) + 1)
    del index, lane, sub, track

    # Counters: which record moves which counter, by how much, at its start or at its end.
    counter = np.zeros(n + 1, dtype=np.uint8)
    delta = np.zeros(n + 1, dtype=np.int64)
    for kind, c in _COUNTER_OF_KIND.items():
        mine = kinds == kind
        counter[:n][mine] = c
        delta[:n][mine] = (events["bytes"] if c in (_HTOD, _DTOH, _DTOD) else events["value"])[mine].astype(np.int64)
    segments = np.isin(kinds, (EventKind.SEGMENT_ALLOC, EventKind.SEGMENT_FREE))
    opening, closing = ((EventKind.SEGMENT_ALLOC, EventKind.SEGMENT_FREE) if segments.any()
                        else (EventKind.ALLOC, EventKind.FREE))
    counter[:n][(kinds == opening) | (kinds == closing)] = _MEMORY
    delta[:n][kinds == opening] = events["bytes"][kinds == opening].astype(np.int64)
    delta[:n][kinds == closing] = -events["bytes"][kinds == closing].astype(np.int64)
    # Frees of allocations made before the trace began: those bytes were live at its start.
    freed_unopened = (kinds == closing) & ~np.isin(events["alloc_id"], events["alloc_id"][kinds == opening])
    first_value = np.zeros(len(_COUNTERS) + 1, dtype=np.int64)
    first_value[_MEMORY] = events["bytes"][freed_unopened].sum().astype(np.int64)   # modulo 2**64, as int64s add
    at_end = np.append(np.isin(kinds, _MIGRATIONS) & is_slice, False)   # bytes have moved once a migration ends

    # Flows: prefetch request -> each migration it caused.
    linked, requests = _prefetch_links(events)
    flow_of = np.zeros(n + 1, dtype=np.uint64)
    flow_of[linked] = linked.astype(np.uint64) + 1
    by_request = np.argsort(requests, kind="stable")
    flow_requests, flow_ids = requests[by_request], linked[by_request].astype(np.uint64) + 1

    # The packet table: every record's first row (a slice's start or an instant), every slice's end,
    # and each counter's first value; sorted by time.
    shown = [c for c in range(1, len(_COUNTERS) + 1) if c != _DTOD or (kinds == EventKind.DTOD).any()]
    index_type = np.int32 if n < 1 << 31 else np.int64
    slice_rows = np.flatnonzero(is_slice).astype(index_type)
    row_event = np.concatenate([np.full(len(shown), -1, dtype=index_type), np.arange(n, dtype=index_type), slice_rows])
    row_kind = np.concatenate([np.full(len(shown), _FIRST_VALUE), np.where(is_slice, _BEGIN, _INSTANT),
                               np.full(len(slice_rows), _END)]).astype(np.uint8)
    row_time = np.concatenate([np.full(len(shown), origin), start, end[slice_rows]])
    del start, end, is_slice, slice_rows
    if int(row_time.max(initial=origin)) - origin < 1 << 61:
        order = np.argsort((row_time - origin) * 4 + row_kind, kind="stable")
    else:
        order = np.lexsort((row_kind, row_time))
    row_event, row_kind, row_time = row_event[order], row_kind[order], row_time[order]
    del order
    event = np.where(row_event < 0, n, row_event)
    row_counter = np.where(row_kind == _FIRST_VALUE, 0, counter[event])
    row_counter[row_kind == _FIRST_VALUE] = shown
    row_counter[np.where(row_kind == _END, ~at_end[event], at_end[event] & (row_kind != _FIRST_VALUE))] = 0
    row_value = np.where(row_kind == _FIRST_VALUE, first_value[row_counter], delta[event]).view(np.uint64)
    del event

    interned = wire.message(
        _P_INTERNED,
        [wire.message(_I_EVENT_NAMES, wire.field(1, i + 1), wire.field(2, name)) for i, name in enumerate(names)],
        [wire.message(_I_ANNOTATION_NAMES, wire.field(1, i + 1), wire.field(2, name))
         for i, name in enumerate(annotation_names)],
        [wire.message(_I_STRINGS, wire.field(1, i), wire.field(2, text)) for text, i in strings.ids.items()])
    clocks = wire.message(_P_CLOCK_SNAPSHOT,
                          wire.message(_S_CLOCKS, wire.field(_K_ID, _BOOTTIME), wire.field(_K_TIMESTAMP, origin)),
                          wire.message(_S_CLOCKS, wire.field(_K_ID, _DELTA_CLOCK), wire.field(_K_TIMESTAMP, origin),
                                       wire.field(_K_INCREMENTAL, 1)))
    head = [_packet(wire.field(_P_TIMESTAMP, origin), wire.field(_P_TIMESTAMP_CLOCK, _BOOTTIME),
                    wire.field(_P_SEQUENCE_FLAGS, _INCREMENTAL_STATE_CLEARED), wire.field(_P_FIRST_ON_SEQUENCE, 1),
                    wire.message(_P_DEFAULTS, wire.field(_P_TIMESTAMP_CLOCK, _DELTA_CLOCK)), clocks, interned),
            _track(_ROOT_TRACK, "uvm_lab"),
            _track(_ALLOCATION_TRACKS, "allocations", _ROOT_TRACK, wire.field(_D_CHILD_ORDERING, _CHRONOLOGICAL),
                   wire.field(_D_DESCRIPTION, "one track per alloc_id: its migrations, faults, prefetches, advice "
                                              "and allocator events"))]
    for c in shown:
        name, unit, description = _COUNTERS[c - 1]
        counter_descriptor = wire.message(_D_COUNTER, wire.field(_C_UNIT, unit), wire.field(_C_INCREMENTAL, 1))
        head.append(_track(_counter_track(c), name, _ROOT_TRACK, counter_descriptor,
                           wire.field(_D_DESCRIPTION, description)))
    for i, lane_index in enumerate(track_lane.tolist()):
        alloc_id = int(lanes[lane_index])
        head.append(_track(_FIRST_LANE_TRACK + i, f"allocation {alloc_id}" if alloc_id else "no allocation",
                           _ALLOCATION_TRACKS, wire.field(_D_SIBLING_MERGE, _MERGE_BY_NAME)))
    written = f.write(b"".join(head))

    row_time = np.diff(row_time, prepend=origin).astype(np.uint64)   # the time since the packet before
    flow_key = np.frombuffer(wire.varint(_E_FLOW_IDS << 3 | 1), dtype=np.uint8)

    def packets(rows: np.ndarray) -> wire.Rows:
        """The packets of ``rows`` (of the packet table), all starts or all the others: two shapes,
        each with few fields that some rows lack."""
        m = len(rows)
        kind = row_kind[rows]
        event = np.where(row_event[rows] < 0, n, row_event[rows])
        counters = row_counter[rows]
        counter_uuid = _counter_track(1) + counters.astype(np.uint64) - 1
        body = wire.Rows(m)
        body.varint(_E_TYPE, _EVENT_TYPE[kind])
        body.varint(_E_TRACK_UUID, np.where(kind == _FIRST_VALUE, counter_uuid, track_uuid[event]))
        starting = bool(m) and kind[0] in (_BEGIN, _INSTANT)
        if starting:
            records = {name: events[name][event] for name in ("kind", "bytes", "value", "address")}   # all < n
            body.varint(_E_NAME_IID, name_iid[event])
            for iid, (_, number, values_of, only) in enumerate(_NUMBER_ANNOTATIONS, start=1):
                arg = wire.Rows(m)
                arg.varint(_A_NAME_IID, iid)
                arg.varint(number, values_of(records))
                body.message(_E_ANNOTATION, arg, present=None if only is None else np.isin(records["kind"], only))
            for iid, texts in enumerate(text_iids, start=len(_NUMBER_ANNOTATIONS) + 1):
                arg = wire.Rows(m)
                arg.varint(_A_NAME_IID, iid)
                values = texts[event]
                arg.varint(_A_STRING_IID, values)
                body.message(_E_ANNOTATION, arg, present=values > 0)
        sampled = (counters > 0) & (kind != _FIRST_VALUE)
        body.varint(_E_EXTRA_COUNTER_UUIDS, counter_uuid, present=sampled)
        body.varint(_E_EXTRA_COUNTER_VALUES, row_value[rows], present=sampled)
        if not starting:
            body.varint(_E_COUNTER_VALUE, row_value[rows], present=kind == _FIRST_VALUE)
        elif len(flow_requests):
            flows = flow_of[event]
            body.fixed64(_E_TERMINATING_FLOW_IDS, flows, present=flows > 0)
            requesting = records["kind"] == EventKind.PREFETCH
            first = np.searchsorted(flow_requests, event, side="left")
            count = np.where(requesting, np.searchsorted(flow_requests, event, side="right") - first, 0)
            if count.any():
                ids = flow_ids[np.repeat(first - np.cumsum(count) + count, count) + np.arange(int(count.sum()))]
                tail = np.empty((len(ids), 10), dtype=np.uint8)
                tail[:, :2] = flow_key
                tail[:, 2:] = ids.astype("<u8").view(np.uint8).reshape(-1, 8)
                body.tail(tail.reshape(-1), count * 10)
        packet = wire.Rows(m)
        packet.varint(_P_TIMESTAMP, row_time[rows])
        packet.varint(_P_SEQUENCE_ID, _SEQUENCE)
        packet.message(_P_TRACK_EVENT, body)
        trace = wire.Rows(m)
        trace.message(_TRACE_PACKET, packet)
        return trace

    for lo in range(0, len(row_event), _CHUNK * 2):
        rows = np.arange(lo, min(lo + _CHUNK * 2, len(row_event)))
        starts = (row_kind[rows] == _BEGIN) | (row_kind[rows] == _INSTANT)
        parts = [(np.flatnonzero(group), packets(rows[group])) for group in (starts, ~starts) if group.any()]
        written += f.write(wire.interleave(len(rows), parts).tobytes())
    return written


def to_rmm_csv(trace: Any, path: str | os.PathLike[str] | None = None, *, thread: int | None = None,
               wall_clock_offset_ns: int | None = None) -> str:
    """The trace's allocations, failed allocations and frees in RMM's logging-adaptor CSV format.

    Parameters
    ----------
    trace
        A :class:`~uvm_lab.Trace` or an ``EVENT_DTYPE`` array. Every memory resource's ``ALLOC`` and
        ``FREE`` is a row (a pool's suballocations and its growth from upstream alike): filter the
        events first to keep one resource.
    path
        Where to write the CSV.
    thread
        The ``Thread`` column: events do not record threads, so one id is written on every row
        (this thread's native id by default).
    wall_clock_offset_ns
        Added to event times to get the wall-clock ``Time`` column. By default the offset between
        ``time.time_ns()`` and ``time.perf_counter_ns()`` now: right for the CUDA backend's clock in
        this process. (The simulator's clock is simulated time; any offset gives consistent order.)

    Returns
    -------
    str
        The CSV text, header first.
    """
    events = _events_of(trace)
    out_path = _check_path(path)
    if thread is None:
        thread = threading.get_native_id()
    if isinstance(thread, bool) or not isinstance(thread, int) or thread < 0:
        raise InvalidArgumentError(f"thread must be a non-negative int, got {thread!r}", value=thread,
                                   expected="an int >= 0")
    if wall_clock_offset_ns is None:
        wall_clock_offset_ns = time.time_ns() - time.perf_counter_ns()
    if isinstance(wall_clock_offset_ns, bool) or not isinstance(wall_clock_offset_ns, int):
        raise InvalidArgumentError(f"wall_clock_offset_ns must be an int, got {wall_clock_offset_ns!r}",
                                   value=wall_clock_offset_ns, expected="an int number of nanoseconds")
    actions = {int(EventKind.ALLOC): "allocate", int(EventKind.FREE): "free",
               int(EventKind.ALLOC_FAILURE): "allocate failure"}
    sel = events[np.isin(events["kind"], list(actions))]
    lines = [RMM_HEADER]
    for kind, start, addr, nbytes, stream in zip(sel["kind"].tolist(), sel["start"].tolist(), sel["address"].tolist(),
                                                 sel["bytes"].tolist(), sel["stream"].tolist(), strict=True):
        wall_ns = start + wall_clock_offset_ns
        stamp = datetime.fromtimestamp(wall_ns // 1_000_000_000).strftime("%H:%M:%S")
        micros = (wall_ns // 1000) % 1_000_000
        pointer = f"{addr:#x}" if addr else "(nil)"
        lines.append(f"{thread},{stamp}.{micros:06d},{actions[kind]},{pointer},{nbytes},"
                     f"{f'{stream:#x}' if stream else '0'}")
    text = "\n".join(lines) + "\n"
    if out_path is not None:
        try:
            with open(out_path, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as exc:
            raise InvalidArgumentError(f"cannot write {out_path!r}: {exc}", value=path,
                                       expected="a writable file path") from exc
    return text
