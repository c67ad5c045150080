"""A trace's view as one self-contained HTML file: :func:`snapshot`. Like PyTorch's memory_viz, it needs no
network and no server: the viewer (the lab view's own drawing code, bundled by ``jlpm build`` into
``snapshot_viewer.js`` beside this module) and the data are both inside the page.

What the page carries, all computed here from the trace's records by the code the live view uses:

- the timeline as a pyramid of :meth:`.timeline.EventWindow.query` answers over the whole trace, at
  ``1024 * 2**k`` pixels, finest last, while the rows fit ``max_rows``. The viewer shows the coarsest level
  whose pixel is no wider than the one on screen, so events are merged by the one rule written in Python;
- the device lanes, summed per interval and per GPU by :class:`.timeline.DeviceSeries`;
- the allocations the trace saw made, each with its traffic as :meth:`.timeline.EventWindow.traffic` counts it;
- :meth:`~uvm_lab.events.trace.Trace.by_source`, and the trace's summary.

Page maps are not included: a trace lacks the pages' places before it began and any records lost, so a map
rebuilt from it could be wrong, and the map never guesses. Every bound (levels, rows, allocations, source
lines, events the kernel no longer held) is counted and shown in the page.
"""

from __future__ import annotations

import base64
import json
import math
import os
import tempfile
import zlib
from datetime import datetime
from pathlib import Path
from typing import Any, Final, TypedDict

import numpy as np

from ..buffer import label_of
from ..errors import InvalidArgumentError, InvalidStateError
from ..events import EventKind, get_bus
from ..events.sources import texts as source_texts
from ..events.trace import Trace
from ..paths import file_path
from .protocol import TIMELINE_COLUMNS, DeviceSample, Traffic
from .timeline import DeviceSeries, EventWindow, device_counts

__all__ = ["VIEWER", "SnapshotData", "snapshot"]

#: The viewer bundle, built by ``jlpm build`` (``extension/snapshot.config.js``).
VIEWER: Final = Path(__file__).with_name("snapshot_viewer.js")
#: The coarsest level's width in pixels; each level doubles it.
BASE_WIDTH: Final = 1024
#: The finest level's most pixels (about 16 M: a 1 ms trace at 60 ps a pixel).
MAX_WIDTH: Final = BASE_WIDTH << 14
#: Device-lane intervals over the trace's span.
SAMPLES: Final = 400
#: The most allocations and source lines listed.
MAX_ALLOCATIONS: Final = 10_000
MAX_SOURCES: Final = 1_000
DEFAULT_MAX_ROWS: Final = 400_000
#: Device-lane fields a trace can tell; memory in use and capacity are the GPUs', not in any record.
SAMPLED: Final = ("allocated", "htod_bytes", "dtoh_bytes", "dtod_bytes", "gpu_faults", "cpu_faults", "evicted_bytes")


class SnapshotLevel(TypedDict):
    width: int  # pixels over the whole extent
    rows: int
    events: int
    truncated: int  # rows EventWindow.query left out (past its MAX_ROWS)
    columns: dict[str, str]  # TIMELINE_COLUMNS, each zlib-compressed little-endian bytes, base64


class SnapshotAllocation(TypedDict):
    id: int
    label: str
    address: int
    size: int
    made: int  # ns
    freed: int | None
    source: str
    traffic: Traffic


class SnapshotBounds(TypedDict):
    events_not_held: int  # events the kernel's bus had already let go of (a snapshot of what it holds)
    events_missed: int  # events the recording never got: it fell behind (Trace.missed)
    levels: int
    finest_pixel_ns: float
    finer_levels_left_out: int  # finer levels that did not fit max_rows (0: the finest merges nothing more)
    rows: int
    max_rows: int
    rows_truncated: int
    allocations_left_out: int
    sources_left_out: int


class SnapshotData(TypedDict):
    title: str
    made: str  # when the snapshot was written, ISO 8601
    first: int
    last: int
    events: int
    summary: dict[str, Any]
    levels: list[SnapshotLevel]
    sources: dict[str, str]
    allocations: list[SnapshotAllocation]
    samples: list[DeviceSample]
    sampled: list[str]
    by_source: list[dict[str, Any]]
    bounds: SnapshotBounds


def snapshot(trace: Trace | None, path: str | os.PathLike[str], *, title: str | None = None,
             max_rows: int = DEFAULT_MAX_ROWS) -> Path:
    """Write ``trace``'s view to ``path`` as one HTML file that opens anywhere, with no network or server.

    ``trace`` is a :class:`~uvm_lab.Trace` (``with ul.record() as trace:``), or None for every event the
    kernel still holds (the live view's timeline). ``max_rows`` bounds the timeline's rows in the file
    (about 60 bytes each before compression); the coarsest level is always kept. Returns the path written.

    Raises
    ------
    InvalidArgumentError
        ``trace`` is not a Trace, ``path`` is not a file path in an existing folder, ``title`` is not a str,
        or ``max_rows`` is not an int >= 1. Nothing is written.
    InvalidStateError
        The viewer was not built (``cd extension && jlpm build``).
    """
    events_not_held = 0
    if trace is None:
        bus = get_bus()
        bus.flush(wait=False)
        trace, events_not_held = Trace(bus.history()), bus.dropped
    elif not isinstance(trace, Trace):
        raise InvalidArgumentError(f"trace must be a uvm_lab.Trace or None, got {type(trace).__name__}",
                                   value=trace, expected="a uvm_lab.Trace, or None for the events the kernel holds")
    target = _target(path)
    if title is not None and not isinstance(title, str):
        raise InvalidArgumentError(f"title must be a str or None, got {title!r}", value=title,
                                   expected="a str or None")
    if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1:
        raise InvalidArgumentError(f"max_rows must be a whole number of rows >= 1, got {max_rows!r}",
                                   value=max_rows, expected="an int >= 1")
    if not VIEWER.is_file():
        raise InvalidStateError(f"the snapshot viewer {VIEWER.name} is not built: run `jlpm build` in extension/")
    data = snapshot_data(trace, title=title or f"uvm_lab trace: {target.stem}", max_rows=max_rows,
                         events_not_held=events_not_held)
    page = render_html(data, VIEWER.read_text(encoding="utf-8"))
    # Written beside the target and moved in place: a failure leaves no half file behind.
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)   # as open() would make it, not mkstemp's owner-only
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(page)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def _target(path: object) -> Path:
    given = file_path(path, expected="a file path (str or os.PathLike), such as view.html")
    target = Path(given).expanduser()
    if target.is_dir():
        raise InvalidArgumentError(f"path {given!r} is a folder", value=path,
                                   expected="a file path, such as trace.html")
    if not target.parent.is_dir():
        raise InvalidArgumentError(f"the folder of {given!r} does not exist", value=path,
                                   expected="a file path in an existing folder")
    return target


def snapshot_data(trace: Trace, *, title: str, max_rows: int = DEFAULT_MAX_ROWS,
                  events_not_held: int = 0) -> SnapshotData:
    """What the page embeds (:class:`SnapshotData`), from ``trace``'s records."""
    events = trace.events
    window = EventWindow(capacity=max(1, len(events)))
    allocations, allocations_left_out = _feed(window, events)
    first, last = window.extent()
    last = max(last, first + 1)
    levels, finer_left_out = _pyramid(window, first, last, max_rows)
    ids = np.unique(np.concatenate([_column(level, "source") for level in levels] or [np.zeros(0, np.uint32)]))
    ids = ids[ids != 0]
    by_source = trace.by_source()
    sources_left_out = max(0, len(by_source) - MAX_SOURCES)
    by_source = by_source.head(MAX_SOURCES)
    by_source["cell"] = by_source["cell"].astype(object).where(by_source["cell"].notna(), None)
    return SnapshotData(
        title=title, made=datetime.now().astimezone().isoformat(timespec="seconds"), first=first, last=last,
        events=len(events), summary=trace.summary(), levels=levels,
        sources=dict(zip((str(i) for i in ids.tolist()), source_texts(ids), strict=True)),
        allocations=allocations, samples=_samples(events, first, last), sampled=list(SAMPLED),
        by_source=by_source.to_dict(orient="records"),
        bounds=SnapshotBounds(events_not_held=events_not_held, events_missed=trace.missed, levels=len(levels),
                              finest_pixel_ns=(last - first) / levels[-1]["width"],
                              finer_levels_left_out=finer_left_out, rows=sum(level["rows"] for level in levels),
                              max_rows=max_rows, rows_truncated=sum(level["truncated"] for level in levels),
                              allocations_left_out=allocations_left_out, sources_left_out=sources_left_out),
    )


def _feed(window: EventWindow, events: np.ndarray) -> tuple[list[SnapshotAllocation], int]:
    """Feed ``events`` to ``window``, reading each buffer's traffic just before its FREE (where the window lets
    go of it); return the allocations the trace saw made, and how many more there were than are listed."""
    kinds = events["kind"]
    frees = np.flatnonzero(kinds == EventKind.FREE)
    # A run of FREEs is read at its first: nothing between them adds traffic.
    runs = frees[np.r_[True, np.diff(frees) > 1]] if len(frees) else frees
    traffic: dict[int, Traffic] = {}
    fed = 0
    for at in [*runs.tolist(), len(events)]:
        window.feed(events[fed:at])
        fed = at
        end = at
        while end < len(events) and kinds[end] == EventKind.FREE:
            traffic[int(events["alloc_id"][end])] = window.traffic(int(events["alloc_id"][end]))
            end += 1
    made = events[kinds == EventKind.ALLOC]
    freed_at = {int(i): int(t) for i, t in zip(events["alloc_id"][frees].tolist(), events["start"][frees].tolist(),
                                               strict=True)}
    texts = source_texts(made["source"][:MAX_ALLOCATIONS])
    allocations = [
        SnapshotAllocation(id=i, label=label_of(i) or f"buffer {i}", address=address, size=size, made=t,
                           freed=freed_at.get(i), source=text,
                           traffic=traffic[i] if i in traffic else window.traffic(i))
        for i, address, size, t, text in zip(made["alloc_id"][:MAX_ALLOCATIONS].tolist(),
                                             made["address"][:MAX_ALLOCATIONS].tolist(),
                                             made["bytes"][:MAX_ALLOCATIONS].tolist(),
                                             made["start"][:MAX_ALLOCATIONS].tolist(), texts, strict=True)
    ]
    return allocations, max(0, len(made) - MAX_ALLOCATIONS)


def _pyramid(window: EventWindow, first: int, last: int, max_rows: int) -> tuple[list[SnapshotLevel], int]:
    """The whole extent queried at ``BASE_WIDTH * 2**k`` pixels while the rows fit ``max_rows`` (the first
    always), stopping where finer levels would say no more; and how many finer levels were left out for room."""
    levels: list[SnapshotLevel] = []
    total = 0
    width = BASE_WIDTH
    while width <= MAX_WIDTH:
        columns, events, truncated = window.query(first, last, width, None)
        rows = len(columns["start"])
        if levels and total + rows > max_rows:
            finer = width
            left_out = 0
            while finer <= MAX_WIDTH and (last - first) / finer >= 1:
                left_out += 1
                finer *= 2
            return levels, left_out
        total += rows
        levels.append(SnapshotLevel(width=width, rows=rows, events=events, truncated=truncated,
                                    columns={name: _encode(columns[name]) for name, _ in TIMELINE_COLUMNS}))
        # Finer levels would say no more: nothing merged, the same rows three levels running, or a ns a pixel.
        if rows == events or [level["rows"] for level in levels[-3:]] == [rows] * 3 or (last - first) / width < 2:
            break
        width *= 2
    return levels, 0


def _encode(column: np.ndarray) -> str:
    return base64.b64encode(zlib.compress(np.ascontiguousarray(column).tobytes(), 6)).decode("ascii")


def _column(level: SnapshotLevel, name: str) -> np.ndarray:
    """A level's column, decoded (as the viewer decodes it)."""
    dtype = dict(TIMELINE_COLUMNS)[name]
    return np.frombuffer(zlib.decompress(base64.b64decode(level["columns"][name])), dtype=dtype)


def _samples(events: np.ndarray, first: int, last: int) -> list[DeviceSample]:
    """``SAMPLES`` intervals over ``[first, last]``, summed by :class:`DeviceSeries`; ``allocated`` is the bytes
    of the allocations made in the trace and not yet freed (used and total are the GPUs': not known, 0). Every
    sample lists the GPUs any record of the trace counts for (at least one), by :func:`device_counts`' rule."""
    if not len(events):
        return []
    bins = SAMPLES
    step = (last - first) / bins
    series = DeviceSeries(capacity=bins, interval=0.0)
    order = np.argsort(events["start"], kind="stable")
    ordered = events[order]
    edges = first + step * np.arange(1, bins + 1)
    cuts = np.searchsorted(ordered["start"], edges, side="right")
    cuts[-1] = len(ordered)
    kinds = ordered["kind"]
    made = kinds == EventKind.ALLOC
    sizes = dict(zip(ordered["alloc_id"][made].tolist(), ordered["bytes"][made].tolist(), strict=True))
    delta = np.where(made, ordered["bytes"].astype(np.int64), 0)
    for at in np.flatnonzero(kinds == EventKind.FREE).tolist():
        delta[at] = -sizes.get(int(ordered["alloc_id"][at]), 0)
    allocated = np.cumsum(delta)
    not_known = [0] * device_counts(events)[0].shape[1]
    lo = 0
    for edge, hi in zip(edges.tolist(), cuts.tolist(), strict=True):
        series.feed(ordered[lo:hi])
        series.close_interval(math.ceil(edge), used=not_known, total=not_known,
                              allocated=int(allocated[hi - 1]) if hi else 0)
        lo = hi
    return series.since(0)[0]


def render_html(data: SnapshotData, viewer: str) -> str:
    """The page: the data as JSON, then the viewer, both inline. ``</`` is escaped in both, so neither can end
    its ``<script>`` early."""
    payload = json.dumps(data, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    script = viewer.replace("</script", "<\\/script")
    title = (data["title"].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;"))
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        f"<title>{title}</title>\n</head>\n<body>\n"
        "<div id=\"uvm-lab-snapshot\"></div>\n"
        f"<script type=\"application/json\" id=\"uvm-lab-data\">{payload}</script>\n"
        f"<script>{script}</script>\n</body>\n</html>\n"
    )
