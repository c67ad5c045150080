"""Traces out of uvm_lab: Chrome/Perfetto trace JSON and RMM's allocation log (CSV).

:func:`to_chrome_trace` writes the Trace Event Format that ``chrome://tracing`` and
https://ui.perfetto.dev open: one process, a lane (thread) each for HtoD, DtoH, DtoD, GPU faults,
CPU faults, thrashing/throttling/remote maps, and allocations. A slice is named after its kind and
cause ("HtoD coherence", "GPU fault write"), so Perfetto, which colours by name, colours by cause;
``cname`` carries the same colouring for chrome://tracing (coherence and eviction in reds, as
Nsight Systems shows them). Each allocation's lifetime is an async span; live bytes are a counter.

:func:`to_rmm_csv` writes RMM's ``logging_resource_adaptor`` format
(``Thread,Time,Action,Pointer,Size,Stream``), one row per allocation, failed allocation and free,
so RMM's replay benchmark and log tools read it.
"""

from __future__ import annotations

import json
import os
import threading
import time
from datetime import datetime
from typing import Any

import numpy as np

from ..errors import InvalidArgumentError
from ..events.schema import EVENT_DTYPE, EventKind, MemoryKind
from .attribution import cause_names

__all__ = ["LANES", "RMM_HEADER", "to_chrome_trace", "to_rmm_csv"]

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
_SHORT = {EventKind.HTOD: "HtoD", EventKind.DTOH: "DtoH", EventKind.DTOD: "DtoD",
          EventKind.GPU_PAGE_FAULT: "GPU fault", EventKind.CPU_PAGE_FAULT: "CPU fault",
          EventKind.THRASHING: "thrashing", EventKind.THROTTLING: "throttling", EventKind.REMOTE_MAP: "remote map",
          EventKind.INVALIDATE: "invalidate"}
#: chrome://tracing's reserved colour names, by cause.
_COLOURS = {"user prefetch": "good", "coherence": "bad", "driver prefetch": "rail_load", "eviction": "terrible",
            "access counters": "olive", "read": "thread_state_running", "write": "bad", "atomic": "terrible",
            "prefetch": "rail_load", "thrashing": "terrible", "policy": "olive", "out of memory": "terrible",
            "unknown": "grey", "inferred": "black", "": "generic_work"}


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
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise InvalidArgumentError(f"path must be a file path, got {path!r}", value=path,
                                   expected="a str or os.PathLike, or None")
    return os.fspath(path)


def to_chrome_trace(trace: Any, path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """The trace as Chrome/Perfetto trace JSON (written to ``path`` too, if given).

    Parameters
    ----------
    trace
        A :class:`~uvm_lab.Trace` or an ``EVENT_DTYPE`` array.
    path
        Where to write the JSON.

    Returns
    -------
    dict
        ``{"traceEvents": [...], "displayTimeUnit": "ns", "otherData": {...}}``. Times are microseconds
        since the first event; ``otherData["origin_ns"]`` is that event's clock reading.

    Raises
    ------
    InvalidArgumentError
        ``trace`` is not a trace, or ``path`` is not a path (or cannot be written).
    """
    events = _events_of(trace)
    out_path = _check_path(path)
    origin = int(events["start"].min()) if len(events) else 0
    rows: list[dict[str, Any]] = [
        {"ph": "M", "pid": _PID, "name": "process_name", "args": {"name": "uvm_lab"}},
    ]
    for tid, name in sorted({*LANES.values(), _ALLOCATIONS}):
        rows.append({"ph": "M", "pid": _PID, "tid": tid, "name": "thread_name", "args": {"name": name}})
        rows.append({"ph": "M", "pid": _PID, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": tid}})
    causes = cause_names(events)
    ts = ((events["start"].astype(np.int64) - origin) / 1e3).tolist()
    dur = ((events["end"].astype(np.int64) - events["start"].astype(np.int64)) / 1e3).tolist()
    live = 0
    for i, (kind, addr, nbytes, value, src, dst, alloc_id, flags) in enumerate(zip(
            events["kind"].tolist(), events["address"].tolist(), events["bytes"].tolist(), events["value"].tolist(),
            events["src"].tolist(), events["dst"].tolist(), events["alloc_id"].tolist(), events["flags"].tolist(),
            strict=True)):
        cause = causes[i]
        if kind in LANES:
            name = f"{_SHORT[kind]} {cause}".strip()
            args = {"address": f"{addr:#x}", "bytes": nbytes, "value": value, "src": _processor(src),
                    "dst": _processor(dst), "alloc_id": alloc_id, "cause": cause}
            rows.append({"ph": "X", "pid": _PID, "tid": LANES[kind][0], "name": name, "cat": _SHORT[kind],
                         "ts": ts[i], "dur": max(dur[i], 0.0), "cname": _COLOURS.get(cause, "generic_work"),
                         "args": args})
            continue
        try:
            label = EventKind(kind).name.lower()
        except ValueError:
            label = f"kind {kind}"
        args = {"address": f"{addr:#x}", "bytes": nbytes, "alloc_id": alloc_id}
        if kind == EventKind.SEGMENT_ALLOC:
            args["memory"] = MemoryKind(flags).name.lower() if flags in MemoryKind._value2member_map_ else str(flags)
        if kind in (EventKind.PREFETCH, EventKind.ADVICE):
            args["location"] = _processor(dst)
        rows.append({"ph": "i", "s": "t", "pid": _PID, "tid": _ALLOCATIONS[0], "name": label, "cat": "allocator",
                     "ts": ts[i], "args": args})
        if kind in (EventKind.ALLOC, EventKind.FREE):
            opening = kind == EventKind.ALLOC
            rows.append({"ph": "b" if opening else "e", "pid": _PID, "tid": _ALLOCATIONS[0], "cat": "allocation",
                         "id": f"{alloc_id:#x}", "name": f"allocation {alloc_id}", "ts": ts[i],
                         "args": {"address": f"{addr:#x}", "bytes": nbytes} if opening else {}})
            live += nbytes if opening else -nbytes
            rows.append({"ph": "C", "pid": _PID, "name": "allocated bytes", "ts": ts[i], "args": {"bytes": live}})
    result = {"traceEvents": rows, "displayTimeUnit": "ns",
              "otherData": {"producer": "uvm_lab", "origin_ns": origin, "events": len(events)}}
    if out_path is not None:
        try:
            with open(out_path, "w", encoding="utf-8") as f:
                json.dump(result, f, separators=(",", ":"))
        except OSError as exc:
            raise InvalidArgumentError(f"cannot write {out_path!r}: {exc}", value=path,
                                       expected="a writable file path") from exc
    return result


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
