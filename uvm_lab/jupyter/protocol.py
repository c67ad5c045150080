"""The comm protocol between the kernel and the UVM Lab panel.

Its twin is ``extension/src/protocol.ts``: every message below has a same-named type there, with
the same fields, and ``tests/unit/test_protocol.py`` checks that the two stay in step.

Every message is a JSON object with a ``type``. The front end may send only the commands below;
:func:`parse_command` checks every field of each before the kernel acts on it, and nothing a message
carries is ever evaluated::

    front end -> kernel (commands)
        hello       {seq}                      send a full snapshot
        prefetch    {seq, id, location, first_page, pages}
                                               location: "host" | "gpu" | "gpu:N"; the pages from
                                               first_page on, ``pages`` of them (null: to the end)
        set_advice  {seq, id, advice, value}   read_mostly: bool
                                               preferred_location: "host" | "gpu" | "gpu:N" | null
                                               accessed_by: a list of those locations ([] unsets)
        pause       {seq, paused}              stop (true) or restart (false) updates
        rate        {seq, interval_ms}         the least time between two updates, 50 to 10000 ms
        timeline    {seq, start, end, width, lanes}
                                               the events of [start, end] ns for a view ``width``
                                               pixels wide; lanes: allocation ids (0: none known) or null
        pages       {seq, id, first_page, pages}
                                               one byte a page of those pages (at most CELL_LIMIT): a
                                               large allocation's map at one page a cell
        watch       {seq, ids}                 the allocations whose maps the view shows (null: all):
                                               their maps are read whenever they change, the others'
                                               a few an update
        worker_command  {seq, worker, command}
                                               a prefetch or set_advice (checked as above), carried
                                               out on Dask worker ``worker``, which owns the buffer
        worker_timeline {seq, worker, start, end, width}
                                               worker ``worker``'s events of [start, end] ns (its clock)
        worker_buffers  {seq, worker}          worker ``worker``'s live buffers

    kernel -> front end
        snapshot    {version, time, page_size, cell_limit, device, allocations, samples, samples_dropped}
                                               + one buffer per allocation
        update      {time, device, allocations, samples, clock}   + one buffer per allocation
        removed     {ids}
        timeline    {seq, start, end, width, columns, rows, events, held, dropped, missed, truncated, first,
                     last, sources, by_source, by_source_others}
                                               + one buffer per column (TIMELINE_COLUMNS)
        pages       {seq, id, first_page, pages, time}   + one buffer: each page's category code
        result      {seq, command, ok, error}  one per command; error: {type, message} or null
        experiment  {workload, configurations, created, html}   the latest ``ul.compare`` chart
        cluster     {workers, workers_left_out}   every worker x GPU of the Dask cluster the kernel's
                                               ClusterMonitor watches: at the snapshot, then a few times
                                               a second while it changes (at most MAX_CLUSTER_WORKERS)
        worker_timeline {seq, worker, + the fields of timeline}   + one buffer per column
        worker_buffers  {seq, worker, buffers, truncated}   at most MAX_WORKER_BUFFERS, oldest first

A location is checked for its shape only: whether GPU N exists is the backend's question, and its
answer (a typed error) comes back in the ``result``. ``device.device_count`` says how many GPUs there are.

Residency never travels as a JSON list. The i-th binary buffer of a ``snapshot`` or ``update``
holds the residency of ``allocations[i]``: one byte per 4 KiB page, the code of the page's category
(:func:`uvm_lab.page_states.categories`, named by ``CATEGORY_NAMES``: 0 nowhere, 1 host, 2 both,
3 unknown, 4 gpus, 5 + d GPU d alone). The panel never sees a page state's bits, so it names and
colours a page exactly as the dashboard does. An allocation of more than ``CELL_LIMIT`` pages is
sent as ``cells`` bytes, each standing for ``cell_pages`` consecutive pages (the last cell may hold
fewer) and holding the category most of those pages are in; ``counts`` always gives the exact number
of pages in every category (zero included), so nothing is lost to the downsampling but the
picture's resolution.

Maps travel as changes (version 3). An allocation's ``encoding`` says what its buffer holds: ``"cells"``,
the whole map as above (always so in a snapshot, and for an allocation the view does not hold yet), or
``"runs"``, only the cells that changed since the last message that carried it (:func:`encode_runs`,
decoded by :func:`apply_runs` and its twin). A busy loop that moves a few pages of a large buffer sends
those cells, not the buffer's sixteen thousand.

An update's ``clock`` is the kernel's wall clock, in ms since the epoch, when it read the maps it carries:
every change made before then is in it or in an earlier message. On one machine the page's clock is the
same, so the time from a change to its picture on screen can be measured (``benchmarks/view_scale_browser.py``).

The device lanes are ``samples``: one small row per update interval, stamped on the backend's clock, the
timeline's clock. What belongs to one GPU is a list indexed by GPU ordinal (version 4): memory used against
capacity, bytes in from the host, out to the host (evictions included), in from a peer GPU, faults, evictions;
what belongs to none is one number (bytes allocated, CPU faults). Every list of a sample has one length: the
backend's GPUs, or more where a record named a GPU past them (:func:`.timeline.device_counts` says which GPU
each record counts for). A snapshot carries the samples the kernel still holds and how many it dropped.
``device`` gives the current GPU's ``free`` and ``total``, and each GPU's in ``devices``.

The timeline is asked for, never pushed: the view sends the window it shows and its width in pixels, and
the kernel answers with binary columns (:data:`TIMELINE_COLUMNS`) in which the events of one lane that
are narrower than a pixel and fall in the same pixel, with the same kind and cause, are one row
(``count`` says how many). What one answer carries is bounded by the view's pixels, not by the rate of
events. With the rows comes the window's "by source line" table: the lines of user code that moved the
most bytes in it (then took the most faults), each ``[source, events, gpu_faults, cpu_faults, bytes_htod,
bytes_dtoh, bytes_dtod]`` (:data:`~uvm_lab.events.sources.TOTALS`), and how many lines it left out.

A Dask cluster (version 5) is the kernel's :mod:`uvm_lab.cluster_feed`: the client's ``ClusterMonitor``. Its
workers come as small JSON (``cluster``), each with its GPUs; what the view asks of one worker (its timeline, its
buffers, a prefetch or advice on a buffer it owns) names the worker by address, and the kernel routes it there
with ``client.run`` (:mod:`uvm_lab.dask`). A worker command is checked here field by field, the inner command
as its own type is, before any worker sees it; the worker checks it again and its refusal (a freed buffer, a GPU
it lacks) comes back typed in the ``result``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final, Literal, NotRequired, TypedDict, cast

import numpy as np
from numba import njit, types

from ..errors import InvalidArgumentError, ProtocolError, shown
from ..events.causes import CAUSE_NAMES
from ..page_states import CATEGORY_NAMES
from .dashboard.collect import bin_pages, rebin

__all__ = [
    "ADVICE_NAMES",
    "BY_SOURCE_LIMIT",
    "CATEGORY_NAMES",
    "CAUSE_NAMES",
    "CELL_LIMIT",
    "COMMANDS",
    "COMM_TARGET",
    "MAX_CLUSTER_WORKERS",
    "MAX_LANES",
    "MAX_WIDTH",
    "MAX_WORKER_ADDRESS",
    "MAX_WORKER_BUFFERS",
    "PROTOCOL_VERSION",
    "RATE_LIMITS_MS",
    "ROUTED_COMMANDS",
    "TIMELINE_COLUMNS",
    "AdviceState",
    "AllocationInfo",
    "Cluster",
    "Command",
    "DeviceInfo",
    "DeviceMemory",
    "DeviceSample",
    "ErrorInfo",
    "ExperimentChart",
    "Hello",
    "PageCounts",
    "PageRows",
    "Pages",
    "Pause",
    "Prefetch",
    "Rate",
    "Removed",
    "Result",
    "SetAdvice",
    "Snapshot",
    "Timeline",
    "TimelineRows",
    "Traffic",
    "Update",
    "Watch",
    "WorkerBuffer",
    "WorkerBufferList",
    "WorkerBuffers",
    "WorkerCommand",
    "WorkerDevice",
    "WorkerInfo",
    "WorkerTimeline",
    "WorkerTimelineRows",
    "apply_runs",
    "encode_runs",
    "pack_states",
    "parse_command",
]

COMM_TARGET: Final = "uvm_lab"
# 2: cells carry category codes (one per GPU, "unknown"); counts are per category; device_count.
# 3: maps travel as changed runs; device samples; the timeline query; the update rate.
# 4: device samples per GPU (lists by ordinal) with peer (DtoD) bytes; DeviceInfo.devices.
# 5: a Dask cluster's workers x GPUs (cluster); a worker's timeline, buffers and commands, routed to it.
# 6: an allocation's traffic counts bytes moved between GPUs (dtod_bytes, by cause).
# 7: an update carries the device's memory (device) only with a new device sample; a view keeps the last.
PROTOCOL_VERSION: Final = 7

#: Above this many pages an allocation's map is sent downsampled, in cells of several pages.
CELL_LIMIT: Final = 16384

ADVICE_NAMES: Final = ("read_mostly", "preferred_location", "accessed_by")

#: The update interval a view may ask for, in milliseconds: (least, most).
RATE_LIMITS_MS: Final = (50, 10_000)
#: The widest timeline a view may ask for, in pixels (a wide screen at twice the density).
MAX_WIDTH: Final = 16_384
#: The most lanes one timeline query may name.
MAX_LANES: Final = 4096
#: The most workers one ``cluster`` message carries; the rest are counted in ``workers_left_out``.
MAX_CLUSTER_WORKERS: Final = 256
#: The longest worker address a command may name, in characters.
MAX_WORKER_ADDRESS: Final = 256
#: The most buffers one ``worker_buffers`` answer lists (the oldest first).
MAX_WORKER_BUFFERS: Final = 1000
#: The commands the view may route to a worker: those that act on one buffer it owns.
ROUTED_COMMANDS: Final = ("prefetch", "set_advice")

#: The timeline's columns, in the order of its buffers, with their little-endian numpy types. Times are
#: nanoseconds on the backend's clock; ``lane`` is the allocation id (0: none known); ``kind`` an
#: ``EventKind``; ``cause`` an index into ``CAUSE_NAMES``; ``src``/``dst`` processors (-1 the host, -2 none,
#: -3 several, in a merged row); ``address`` to ``reach`` the bytes the row's events concern (in a merged row,
#: the lowest first byte to the highest last); ``count`` the events the row stands for. Floats where a value
#: may pass 2**32 (addresses stay below 2**53 on both backends' address spaces). ``source`` is the line of
#: user code the events came from (an id of ``uvm_lab.events.sources``; 0 unknown, or several in a merged
#: row); the answer's ``sources`` gives each id's text.
TIMELINE_COLUMNS: Final = (
    ("start", "<f8"), ("end", "<f8"), ("lane", "<f8"), ("kind", "u1"), ("cause", "u1"),
    ("src", "<i2"), ("dst", "<i2"), ("bytes", "<f8"), ("address", "<f8"), ("reach", "<f8"), ("source", "<u4"),
    ("count", "<u4"),
)

# JavaScript numbers are exact only up to 2**53; ids and sequence numbers stay below.
_MAX_INT = 2**53 - 1
#: The most lines a timeline answer's by-source table carries.
BY_SOURCE_LIMIT: Final = 50
# "host", "gpu" or "gpu:N", for prefetch and advice alike; whether device N exists is the backend's
# question, not the protocol's.
_LOCATION = re.compile(r"(?:host|gpu(?::[0-9]{1,3})?)\Z")
_MAX_ACCESSED_BY = 64


# --- front end -> kernel ------------------------------------------------------------------------


class Hello(TypedDict):
    type: Literal["hello"]
    seq: int


class Prefetch(TypedDict):
    type: Literal["prefetch"]
    seq: int
    id: int
    location: str  # "host" | "gpu" | "gpu:N"
    first_page: int
    pages: int | None  # None: to the end of the allocation


class SetAdvice(TypedDict):
    type: Literal["set_advice"]
    seq: int
    id: int
    advice: Literal["read_mostly", "preferred_location", "accessed_by"]
    value: bool | str | list[str] | None


class Pause(TypedDict):
    type: Literal["pause"]
    seq: int
    paused: bool


class Rate(TypedDict):
    type: Literal["rate"]
    seq: int
    interval_ms: int


class Timeline(TypedDict):
    type: Literal["timeline"]
    seq: int
    start: int  # ns, on the backend's clock
    end: int
    width: int  # pixels
    lanes: list[int] | None  # allocation ids; None: every lane


class Pages(TypedDict):
    type: Literal["pages"]
    seq: int
    id: int
    first_page: int
    pages: int  # at most CELL_LIMIT: one byte a page


class Watch(TypedDict):
    type: Literal["watch"]
    seq: int
    ids: list[int] | None  # the allocations whose maps the view shows; None: every one


class WorkerCommand(TypedDict):
    type: Literal["worker_command"]
    seq: int
    worker: str  # the worker's address, as ``cluster`` gives it
    command: Prefetch | SetAdvice  # checked as its own type is (its seq is its own); carried out on the worker


class WorkerTimeline(TypedDict):
    type: Literal["worker_timeline"]
    seq: int
    worker: str
    start: int  # ns, on the worker's backend's clock
    end: int
    width: int  # pixels


class WorkerBuffers(TypedDict):
    type: Literal["worker_buffers"]
    seq: int
    worker: str


Command = Hello | Prefetch | SetAdvice | Pause | Rate | Timeline | Pages | Watch | WorkerCommand | WorkerTimeline | \
    WorkerBuffers


# --- kernel -> front end ------------------------------------------------------------------------


class AdviceState(TypedDict):
    read_mostly: bool
    preferred_location: str | None
    accessed_by: list[str]


# Pages per category, every name of CATEGORY_NAMES (zero included). Spelled out, as its twin is; a
# test checks the keys against CATEGORY_NAMES. Functional syntax: "gpu:0" is not an identifier.
PageCounts = TypedDict("PageCounts", {
    "nowhere": int, "host": int, "both": int, "unknown": int, "gpus": int,
    "gpu:0": int, "gpu:1": int, "gpu:2": int, "gpu:3": int, "gpu:4": int, "gpu:5": int,
})


class Traffic(TypedDict):
    faults: int  # GPU and CPU page faults in the allocation
    htod_bytes: int
    dtoh_bytes: int
    dtod_bytes: int  # moved between GPUs (peer migrations)
    by_cause: list[list[int]]  # per cause (CAUSE_NAMES): [faults, htod_bytes, dtoh_bytes, dtod_bytes]


class AllocationInfo(TypedDict):
    id: int
    label: str
    address: int
    size: int
    is_managed: bool
    advice: AdviceState
    pages: int
    cell_pages: int
    cells: int
    counts: PageCounts
    encoding: Literal["cells", "runs"]
    traffic: Traffic
    requested: str | None  # where the last prefetch sent it ("host", "gpu:N"), whoever asked; None: never


class DeviceMemory(TypedDict):
    free: int
    total: int


class DeviceInfo(TypedDict):
    backend: str
    device_count: int
    free: int  # the current GPU's
    total: int
    devices: list[DeviceMemory]  # each GPU's, by ordinal


class DeviceSample(TypedDict):
    # Lists are per GPU, by ordinal, all of one length; the rest is one number.
    time: int  # ns on the backend's clock, the end of the interval
    used: list[int]  # bytes of each GPU's memory in use (0 where not known: a trace's)
    total: list[int]  # each GPU's capacity (0 where not known)
    allocated: int  # bytes of the live allocations: more than the capacity is oversubscription
    htod_bytes: list[int]  # moved in the interval into each GPU from the host
    dtoh_bytes: list[int]  # out of each GPU to the host, evictions included
    dtod_bytes: list[int]  # into each GPU from a peer GPU
    gpu_faults: list[int]  # taken by each GPU
    cpu_faults: int
    evicted_bytes: list[int]  # evicted from each GPU


class Snapshot(TypedDict):
    type: Literal["snapshot"]
    version: int
    time: int  # ns on the backend's clock: the maps were read at this time (or just after)
    page_size: int
    cell_limit: int
    device: DeviceInfo
    allocations: list[AllocationInfo]
    samples: list[DeviceSample]
    samples_dropped: int


class Update(TypedDict):
    type: Literal["update"]
    time: int  # as the snapshot's
    device: NotRequired[DeviceInfo]  # read when a device sample closes, and sent with it; else as last sent
    allocations: list[AllocationInfo]
    samples: list[DeviceSample]
    clock: float  # the kernel's wall clock (ms since the epoch) when it read the maps sent: older changes are in


class Removed(TypedDict):
    type: Literal["removed"]
    ids: list[int]


class _TimelineAnswer(TypedDict):
    # The fields of a timeline's answer, wherever its events are held: the kernel's (TimelineRows) or a worker's.
    seq: int
    start: int
    end: int
    width: int
    columns: list[str]  # the names of TIMELINE_COLUMNS, the order of the buffers
    rows: int
    events: int  # the events of the window the rows stand for
    held: int  # events the kernel holds for timelines
    dropped: int  # events it no longer holds (the oldest, past its capacity)
    missed: int  # events it never got: the bus dropped them while it was too far behind
    truncated: int  # rows left out past the most one answer carries
    first: int  # ns: the start of the oldest event held (0 if none): where a view's "everything" begins
    last: int  # ns: the latest end of an event held
    sources: dict[str, str]  # each source id of the rows and by_source (a JSON key) -> its line: "In [3], line 5"
    by_source: list[list[int]]  # per line: [source, *TOTALS], the most bytes moved first; at most BY_SOURCE_LIMIT
    by_source_others: int  # lines of the window not in by_source


class TimelineRows(_TimelineAnswer):
    type: Literal["timeline"]


class WorkerTimelineRows(_TimelineAnswer):
    type: Literal["worker_timeline"]
    worker: str  # whose events: the worker's address


class WorkerDevice(TypedDict):
    # One GPU of a worker: memory as last read; what moved and faulted since the worker joined.
    gpu: int
    used: int
    total: int
    htod_bytes: int
    dtoh_bytes: int
    dtod_bytes: int  # in from a peer GPU
    gpu_faults: int
    evicted_bytes: int
    pages: int  # pages of the worker's live buffers held on this GPU


class WorkerInfo(TypedDict):
    address: str
    name: str
    state: Literal["live", "left", "gone"]  # left: closed cleanly; gone: dead, restarted or retired
    backend: str
    gpus: int
    events: int  # since it joined
    cpu_faults: int
    allocated: int  # bytes of its live buffers
    buffers: int
    lost: int  # deltas that never came
    latency_ms: float  # its last delta's, from its oldest event to its arrival at the client
    devices: list[WorkerDevice]  # empty until its first delta


class Cluster(TypedDict):
    type: Literal["cluster"]
    workers: list[WorkerInfo]  # in the order they joined; at most MAX_CLUSTER_WORKERS
    workers_left_out: int  # past it: those that stopped (the earliest joined first), then the newest live ones


class WorkerBuffer(TypedDict):
    id: int
    label: str
    size: int
    is_managed: bool
    copies: dict[str, int]  # pages per place ("host", "gpu:N") holding a copy
    unknown: int  # pages whose place is not known


class WorkerBufferList(TypedDict):
    type: Literal["worker_buffers"]
    seq: int
    worker: str
    buffers: list[WorkerBuffer]  # the oldest first
    truncated: bool  # more than MAX_WORKER_BUFFERS: the newest were left out


class PageRows(TypedDict):
    type: Literal["pages"]
    seq: int
    id: int
    first_page: int
    pages: int
    time: int  # ns on the backend's clock: the pages were read at this time (or just after)


class ExperimentChart(TypedDict):
    type: Literal["experiment"]
    workload: str  # what ran
    configurations: int  # rows of its summary
    created: str  # when it ended, as ISO 8601
    html: str  # its chart (Experiment.to_html): a self-contained page, BokehJS inline


class ErrorInfo(TypedDict):
    type: str
    message: str


class Result(TypedDict):
    type: Literal["result"]
    seq: int | None
    command: str | None
    ok: bool
    error: ErrorInfo | None


# --- validation ---------------------------------------------------------------------------------

COMMANDS: Final[dict[str, tuple[str, ...]]] = {
    "hello": ("seq",),
    "prefetch": ("seq", "id", "location", "first_page", "pages"),
    "set_advice": ("seq", "id", "advice", "value"),
    "pause": ("seq", "paused"),
    "rate": ("seq", "interval_ms"),
    "timeline": ("seq", "start", "end", "width", "lanes"),
    "pages": ("seq", "id", "first_page", "pages"),
    "watch": ("seq", "ids"),
    "worker_command": ("seq", "worker", "command"),
    "worker_timeline": ("seq", "worker", "start", "end", "width"),
    "worker_buffers": ("seq", "worker"),
}


def parse_command(data: object) -> Command:
    """Check that ``data`` is one of the known commands, field by field, and return it.

    Raises :class:`~uvm_lab.errors.ProtocolError` naming the bad value and what would be valid.
    Only the message's shape is checked here; whether the allocation still exists, or the device
    is there, is for the entry point the command calls to say.
    """
    if not isinstance(data, Mapping):
        raise ProtocolError(f"a command must be a JSON object, got {type(data).__name__}", command=data)
    kind = data.get("type")
    if not isinstance(kind, str) or kind not in COMMANDS:
        raise ProtocolError(
            f"unknown command type {shown(kind)}; the commands are {', '.join(COMMANDS)}", command=data
        )
    fields = COMMANDS[kind]
    got = set(data) - {"type"}
    if missing := [f for f in fields if f not in got]:
        raise ProtocolError(f"{kind} is missing {_names(missing)}; its fields are {', '.join(fields)}", command=data)
    if extra := sorted(got - set(fields), key=str):
        raise ProtocolError(f"{kind} got unexpected {_names(extra)}; its fields are {', '.join(fields)}", command=data)

    seq = _integer(data, "seq", low=0)
    if kind == "hello":
        return Hello(type="hello", seq=seq)
    if kind == "pause":
        return Pause(type="pause", seq=seq, paused=_boolean(data, "paused"))
    if kind == "rate":
        low, high = RATE_LIMITS_MS
        return Rate(type="rate", seq=seq, interval_ms=_integer(data, "interval_ms", low=low, high=high))
    if kind == "timeline":
        return _timeline(data, seq)
    if kind == "watch":
        return Watch(type="watch", seq=seq, ids=_ids(data, "ids", "watch ids"))
    if kind.startswith("worker_"):
        return _worker_command(data, kind, seq)
    alloc_id = _integer(data, "id", low=1)
    if kind == "pages":
        return Pages(type="pages", seq=seq, id=alloc_id, first_page=_integer(data, "first_page", low=0),
                     pages=_integer(data, "pages", low=1, high=CELL_LIMIT))
    if kind == "prefetch":
        location = _location(data["location"], data, "prefetch location")
        first_page = _integer(data, "first_page", low=0)
        pages = None if data["pages"] is None else _integer(data, "pages", low=1)
        return Prefetch(type="prefetch", seq=seq, id=alloc_id, location=location, first_page=first_page, pages=pages)
    advice = data["advice"]
    if advice not in ADVICE_NAMES or not isinstance(advice, str):
        raise ProtocolError(f"advice must be one of {_choices(ADVICE_NAMES)}, got {shown(advice)}", command=data)
    value = _advice_value(data, advice)
    return SetAdvice(type="set_advice", seq=seq, id=alloc_id, advice=advice, value=value)  # type: ignore[typeddict-item]


def _timeline(data: Mapping[str, Any], seq: int) -> Timeline:
    start, end, width = _window(data, "timeline")
    lanes = _ids(data, "lanes", "timeline lanes", low=0)
    return Timeline(type="timeline", seq=seq, start=start, end=end, width=width, lanes=lanes)


def _window(data: Mapping[str, Any], kind: str) -> tuple[int, int, int]:
    """A timeline query's start, end and width."""
    start, end = _integer(data, "start", low=0), _integer(data, "end", low=0)
    if end <= start:
        raise ProtocolError(f"{kind} end must be after its start, got start {start} and end {end}", command=data)
    return start, end, _integer(data, "width", low=1, high=MAX_WIDTH)


def _worker_command(data: Mapping[str, Any], kind: str, seq: int) -> WorkerCommand | WorkerTimeline | WorkerBuffers:
    worker = data["worker"]
    if not isinstance(worker, str) or not 0 < len(worker) <= MAX_WORKER_ADDRESS:
        raise ProtocolError(f"worker must be a worker's address, a string of 1 to {MAX_WORKER_ADDRESS} characters, "
                            f"got {shown(worker)}", command=data)
    if kind == "worker_buffers":
        return WorkerBuffers(type="worker_buffers", seq=seq, worker=worker)
    if kind == "worker_timeline":
        start, end, width = _window(data, kind)
        return WorkerTimeline(type="worker_timeline", seq=seq, worker=worker, start=start, end=end, width=width)
    inner = data["command"]
    # The type first: a worker command inside another is refused here, not parsed to any depth.
    kind_inside = inner.get("type") if isinstance(inner, Mapping) else None
    if kind_inside not in ROUTED_COMMANDS:
        raise ProtocolError(f"a worker_command carries {' or '.join(ROUTED_COMMANDS)}, got "
                            f"{shown(kind_inside) if isinstance(inner, Mapping) else shown(inner)}", command=data)
    try:
        command = parse_command(inner)
    except ProtocolError as err:
        raise ProtocolError(f"worker_command's command: {err}", command=data) from err
    return WorkerCommand(type="worker_command", seq=seq, worker=worker, command=cast(Prefetch | SetAdvice, command))


def _ids(data: Mapping[str, Any], name: str, what: str, *, low: int = 1) -> list[int] | None:
    """A field that is a list of allocation ids (at most MAX_LANES; sorted, without repeats), or null."""
    ids = data[name]
    if ids is None:
        return None
    if not isinstance(ids, list):
        raise ProtocolError(f"{what} must be a list of allocation ids or null, got {shown(ids)}", command=data)
    if len(ids) > MAX_LANES:
        raise ProtocolError(f"{what} takes at most {MAX_LANES} ids, got {len(ids)}", command=data)
    for one in ids:
        if type(one) is not int or not low <= one <= _MAX_INT:
            raise ProtocolError(f"a {what[:-1]} must be an allocation id ({low} to 2**53-1), got {shown(one)}",
                                command=data)
    return sorted(set(ids))


def _advice_value(data: Mapping[str, Any], advice: str) -> bool | str | list[str] | None:
    value = data["value"]
    if advice == "read_mostly":
        return _boolean(data, "value", what="read_mostly value")
    if advice == "preferred_location":
        if value is None:
            return None
        return _location(value, data, "preferred_location value")
    if not isinstance(value, list):
        raise ProtocolError(f"accessed_by value must be a list of locations, got {shown(value)}", command=data)
    if len(value) > _MAX_ACCESSED_BY:
        raise ProtocolError(f"accessed_by takes at most {_MAX_ACCESSED_BY} locations, got {len(value)}", command=data)
    locations = [_location(v, data, "accessed_by location") for v in value]
    if len(set(locations)) != len(locations):
        raise ProtocolError(f"accessed_by locations must be distinct, got {shown(value)}", command=data)
    return locations


def _location(value: object, data: Mapping[str, Any], what: str) -> str:
    if not isinstance(value, str) or not _LOCATION.match(value):
        raise ProtocolError(f'{what} must be "host", "gpu" or "gpu:N", got {shown(value)}', command=data)
    return value


def _integer(data: Mapping[str, Any], name: str, *, low: int, high: int = _MAX_INT) -> int:
    value = data[name]
    # bool is an int in Python but never a valid id; floats such as 3.0 are not accepted either.
    if type(value) is not int or not low <= value <= high:
        most = "2**53-1" if high == _MAX_INT else str(high)
        raise ProtocolError(f"{name} must be a whole number from {low} to {most}, got {shown(value)}", command=data)
    return value


def _boolean(data: Mapping[str, Any], name: str, *, what: str | None = None) -> bool:
    value = data[name]
    if not isinstance(value, bool):
        raise ProtocolError(f"{what or name} must be true or false, got {shown(value)}", command=data)
    return value


# Unexpected fields named in an error, at most.
_NAMED = 5


def _names(fields: list[str]) -> str:
    names = ", ".join(shown(f) for f in fields[:_NAMED])
    more = f" and {len(fields) - _NAMED} more" if len(fields) > _NAMED else ""
    return ("field " if len(fields) == 1 else "fields ") + names + more


def _choices(options: tuple[str, ...]) -> str:
    return ", ".join(f'"{o}"' for o in options)


# --- residency encoding -------------------------------------------------------------------------


def pack_states(states: np.ndarray, limit: int = CELL_LIMIT, *,
                since: tuple[np.ndarray, np.ndarray, PageCounts] | None = None,
                counts: Mapping[str, int] | None = None) -> tuple[int, np.ndarray, PageCounts]:
    """The bytes that carry a page-state array, and its exact counts: ``(cell_pages, cells, counts)``.

    Each byte is a category code (:func:`uvm_lab.page_states.categories`). Up to ``limit`` pages, one
    byte per page (``cell_pages`` 1). Beyond, each byte stands for ``cell_pages`` consecutive pages and
    holds the category most of them are in (the dashboard's binning, ties to the lower code); the last
    cell may stand for fewer pages. ``counts`` has every category, by name, with its exact pages.

    ``since`` is an earlier map of the same pages with what packing it gave, ``(states, cells, counts)``:
    then only the cells holding pages that differ are binned again (by the same rule, on their slice) and
    the counts move by those pages, so a few changed pages of a large map cost a few cells. The result is
    the same as packing ``states`` alone.

    ``counts``: the exact counts of ``states`` by category, where the caller has them already (a description's
    ``category_pages``), so they are not counted again.
    """
    if isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or limit < 1:
        raise InvalidArgumentError(f"limit must be a whole number of cells >= 1, got {limit!r}", value=limit,
                                   expected="a whole number >= 1")
    if counts is not None and (set(counts) != set(CATEGORY_NAMES) or sum(counts.values()) != len(states)):
        raise InvalidArgumentError(f"counts must give every category's pages, {len(states)} in all; got {counts!r}",
                                   value=counts, expected=f"pages for each of {', '.join(CATEGORY_NAMES)}")
    cell_pages = bin_pages(len(states), limit)
    if since is not None and len(since[0]) == len(states) and np.asarray(states).dtype == np.uint8:
        before, cells, held = since
        # Only the cells holding pages that changed are binned again (one pass over the pages, compiled).
        fresh, gained = rebin(states, limit, (before, cells))
        if fresh is cells:
            return cell_pages, cells, held
        if counts is None:
            counts = {name: held[name] + int(gained[i]) for i, name in enumerate(CATEGORY_NAMES)}  # type: ignore[literal-required]
        return cell_pages, fresh, cast(PageCounts, dict(counts))
    cells, gained = rebin(states, limit)
    return cell_pages, cells, cast(PageCounts, dict(counts) if counts is not None else
                                   dict(zip(CATEGORY_NAMES, gained.tolist(), strict=True)))


# --- map changes --------------------------------------------------------------------------------

# Unchanged cells between two changed ones are sent along when that is cheaper than a second run's
# header (a start and a length, 4 bytes each).
_RUN_GAP = 8


def encode_runs(old: np.ndarray, new: np.ndarray) -> np.ndarray:
    """The cells of ``new`` that differ from ``old``, as the bytes of a ``"runs"`` buffer.

    Layout, little-endian: ``uint32 n``; ``n`` uint32 starts; ``n`` uint32 lengths; then the cells of
    every run, run after run. Runs are sorted, apart, and cover every changed cell; two changes at most
    ``_RUN_GAP`` cells apart share one run. Both maps must have the same number of cells.
    """
    old, new = _cell_array(old, "old"), _cell_array(new, "new")
    if len(old) != len(new):
        raise InvalidArgumentError(f"runs compare maps of one size, got {len(old)} and {len(new)} cells",
                                   value=(len(old), len(new)), expected="two maps of the same number of cells")
    return _runs(np.ascontiguousarray(old), np.ascontiguousarray(new), _RUN_GAP)


@njit((types.uint8[::1], types.uint8[::1], types.int64), cache=True)
def _runs(old: np.ndarray, new: np.ndarray, gap: int) -> np.ndarray:
    # Compiled, two passes (the runs, then their bytes), in place of numpy's six: a live view encodes every map it
    # shows that changed.
    n = len(new)
    starts = np.empty(n, np.int64)
    ends = np.empty(n, np.int64)
    runs, body, last = 0, 0, -gap - 2
    for i in range(n):
        if old[i] != new[i]:
            if i - last > gap + 1:   # too far from the last change: a run of its own
                if runs:
                    body += ends[runs - 1] - starts[runs - 1]
                starts[runs] = i
                runs += 1
            ends[runs - 1] = i + 1
            last = i
    if runs:
        body += ends[runs - 1] - starts[runs - 1]
    out = np.empty(4 + 8 * runs + body, np.uint8)
    header = np.empty(1 + 2 * runs, np.uint32)
    header[0] = runs
    at = 4 + 8 * runs
    for r in range(runs):
        header[1 + r] = starts[r]
        header[1 + runs + r] = ends[r] - starts[r]
        out[at:at + ends[r] - starts[r]] = new[starts[r]:ends[r]]
        at += ends[r] - starts[r]
    out[:4 + 8 * runs] = header.view(np.uint8)   # the host's order: little-endian wherever numba runs
    return out


def apply_runs(cells: np.ndarray, runs: bytes | np.ndarray) -> np.ndarray:
    """``cells`` with the changes of a ``"runs"`` buffer applied (a new array), as the view decodes it.

    Raises :class:`~uvm_lab.errors.InvalidArgumentError` for a buffer that does not fit ``cells``.
    """
    cells = _cell_array(cells, "cells")
    data = np.frombuffer(runs if isinstance(runs, bytes) else np.ascontiguousarray(runs, np.uint8).tobytes(),
                         dtype=np.uint8)
    n = int(data[:4].view("<u4")[0]) if len(data) >= 4 else -1
    if n < 0 or len(data) < 4 + 8 * n:
        raise InvalidArgumentError(f"a runs buffer of {len(data)} bytes cannot hold its header",
                                   value=len(data), expected="4 + 8 n bytes, then the cells")
    header = data[4:4 + 8 * n].view("<u4").astype(np.int64)
    starts, lengths = header[:n], header[n:]
    body = data[4 + 8 * n:]
    if lengths.sum() != len(body) or (n and (starts + lengths).max() > len(cells)):
        raise InvalidArgumentError(f"runs of {int(lengths.sum())} cells do not fit a body of {len(body)} bytes and "
                                   f"a map of {len(cells)} cells", value=len(data), expected="runs inside the map")
    out = cells.copy()
    at = 0
    for start, length in zip(starts.tolist(), lengths.tolist(), strict=True):
        out[start:start + length] = body[at:at + length]
        at += length
    return out


def _cell_array(cells: object, name: str) -> np.ndarray:
    if not isinstance(cells, np.ndarray) or cells.dtype != np.uint8 or cells.ndim != 1:
        raise InvalidArgumentError(f"{name} must be a 1-D uint8 array of cells, got {cells!r:.60}", value=cells,
                                   expected="a 1-D numpy uint8 array")
    return cells
