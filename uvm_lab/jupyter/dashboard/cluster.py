"""The cluster dashboard: every worker × GPU of a Dask cluster, from a :class:`~uvm_lab.dask.ClusterMonitor`.

Memory used against each GPU's capacity as bars (a gone worker's in grey, its last picture kept), a table of what
moved and faulted, one worker's timeline a click away, and prefetch routed to the worker that owns the buffer
(:meth:`~uvm_lab.dask.ClusterMonitor.command`: the panel's commands, checked on the worker). A refused command's
typed error is shown under the controls. The monitor's deltas wake a refresh thread; at most one refresh an
``interval``.
"""

from __future__ import annotations

import html
import logging
import threading
from typing import Any

import ipywidgets as widgets
from bokeh.models import ColumnDataSource, FactorRange
from bokeh.models.widgets.tables import DataTable, NumberFormatter, TableColumn
from bokeh.plotting import figure

from uvm_lab.clock import SYSTEM_CLOCK, Clock, checked_clock, checked_seconds
from uvm_lab.errors import InvalidArgumentError, shown
from uvm_lab.events import EventKind
from uvm_lab.units import format_bytes

from ..palette import CAUSE_PALETTE, PALETTE
from .base import BokehView, close_widget_tree, update_source

__all__ = ["ClusterDashboard"]

log = logging.getLogger("uvm_lab.jupyter")

_GONE = "#9e9e9e"
#: The timeline's rows, by event kind: what a worker's timeline shows of its events.
_KINDS: dict[int, str] = {EventKind.HTOD: "HtoD", EventKind.DTOH: "DtoH", EventKind.DTOD: "DtoD (peer)",
          EventKind.GPU_PAGE_FAULT: "GPU faults", EventKind.CPU_PAGE_FAULT: "CPU faults",
          EventKind.PREFETCH: "prefetch"}
_KIND_COLOURS = {"HtoD": PALETTE["gpu:0"], "DtoH": PALETTE["host"], "DtoD (peer)": PALETTE["gpu:1"],
                 "GPU faults": CAUSE_PALETTE["demand fault"], "CPU faults": PALETTE["both"],
                 "prefetch": PALETTE["gpus"]}
_TABLE = (("lane", "worker × GPU"), ("state", "state"), ("used", "used"), ("total", "capacity"),
          ("htod_bytes", "HtoD bytes"), ("dtoh_bytes", "DtoH bytes"), ("dtod_bytes", "peer bytes in"),
          ("gpu_faults", "GPU faults"), ("evicted_bytes", "evicted"), ("pages", "pages held"),
          ("events", "events"), ("lost", "deltas lost"))


class ClusterDashboard:
    """Every worker × GPU of ``monitor``'s cluster, live.

    Parameters
    ----------
    monitor
        A :class:`~uvm_lab.dask.ClusterMonitor`.
    interval
        Least seconds between two refreshes.
    live
        Refresh as deltas arrive (the default); with ``live=False`` only when :meth:`refresh` is called.
    """

    def __init__(self, monitor: Any, *, interval: float = 0.5, live: bool = True, clock: Clock = SYSTEM_CLOCK) -> None:
        if not all(hasattr(monitor, a) for a in ("rows", "workers", "command", "timeline", "buffers", "wait")):
            raise InvalidArgumentError(f"monitor must be a uvm_lab.dask.ClusterMonitor, got {shown(monitor)}",
                                       value=monitor, expected="a uvm_lab.dask.ClusterMonitor")
        self.monitor = monitor
        self.interval = checked_seconds(interval, "interval")
        self._clock = checked_clock(clock)
        self.memory = ColumnDataSource({"lane": [], "used": [], "total": [], "colour": []})
        self.table = ColumnDataSource({name: [] for name, _ in _TABLE})
        self.events = ColumnDataSource({"left": [], "right": [], "kind": [], "colour": [], "count": []})
        self._lanes = FactorRange(factors=[])
        bars = figure(height=80, sizing_mode="stretch_width", y_range=self._lanes, x_axis_label="bytes",
                      toolbar_location=None, title="Memory used of each GPU's capacity")
        bars.hbar(y="lane", right="total", height=0.7, source=self.memory, fill_alpha=0.0, line_color="#616161")
        bars.hbar(y="lane", right="used", height=0.7, source=self.memory, color="colour")
        self._bars = bars
        columns = [TableColumn(field=name, title=title, formatter=NumberFormatter(format="0,0"))
                   if name not in ("lane", "state") else TableColumn(field=name, title=title)
                   for name, title in _TABLE]
        grid = DataTable(source=self.table, columns=columns, height=160, sizing_mode="stretch_width",
                         index_position=None)
        timeline = figure(height=180, sizing_mode="stretch_width", y_range=FactorRange(factors=list(_KIND_COLOURS)),
                          toolbar_location="above", x_axis_label="ns (the worker's backend clock)")
        timeline.hbar(y="kind", left="left", right="right", height=0.7, source=self.events, color="colour")
        self._timeline, self._timeline_title = timeline, widgets.HTML("Worker timeline: pick a worker")
        self.views = BokehView(_column(bars, grid, timeline))
        self.worker = widgets.Dropdown(description="worker", options=[], layout=widgets.Layout(width="320px"))
        self.buffer = widgets.Dropdown(description="buffer", options=[], layout=widgets.Layout(width="320px"))
        self.location = widgets.Dropdown(description="to", options=["host"], layout=widgets.Layout(width="200px"))
        self.show_timeline = widgets.Button(description="Show timeline")
        self.send_prefetch = widgets.Button(description="Prefetch")
        self.message = widgets.HTML()
        self.header = widgets.HTML()
        self.worker.observe(lambda _: self._on_worker(), names="value")
        self.show_timeline.on_click(lambda _: self.draw_timeline())
        self.send_prefetch.on_click(lambda _: self.prefetch())
        controls = widgets.HBox([self.worker, self.show_timeline, self.buffer, self.location, self.send_prefetch])
        self.root = widgets.VBox([self.header, self.views, controls, self.message, self._timeline_title])
        self.refreshes = 0
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._closed = False
        self.refresh()
        if live:
            threading.Thread(target=self._run, name="uvm_lab-cluster-dashboard", daemon=True).start()

    # -- rendering --------------------------------------------------------------------------------------------

    def refresh(self) -> None:
        """Draw what the monitor holds now."""
        with self._lock:
            if self._closed:
                return
            try:
                rows = self.monitor.rows()
                # A restarted worker keeps its name and gets a new address: the address tells the two apart.
                lanes = [f"{row['name']} · {row['worker'].split('://')[-1]} gpu:{row['gpu']}" for row in rows]
                colours = [_GONE if row["state"] != "live" else PALETTE.get(f"gpu:{row['gpu']}", PALETTE["gpus"])
                           for row in rows]
                update_source(self.memory, {"lane": lanes, "used": [r["used"] for r in rows],
                                            "total": [r["total"] for r in rows], "colour": colours})
                self._lanes.factors = lanes[::-1]
                self._bars.height = 50 + 22 * max(1, len(lanes))
                update_source(self.table, {name: lanes if name == "lane" else [r[name] for r in rows]
                                           for name, _ in _TABLE})
                workers = self.monitor.workers()
                live = [(f"{w.name or a} ({a})", a) for a, w in workers.items() if w.state == "live"]
                if [v for _, v in live] != [v for _, v in self.worker.options]:
                    self.worker.options = live
                gone = sum(w.state != "live" for w in workers.values())
                used = sum(r["used"] for r in rows if r["state"] == "live")
                total = sum(r["total"] for r in rows if r["state"] == "live")
                self.header.value = (f"<b>uvm_lab cluster</b> · {len(live)} live worker(s)"
                                     + (f", {gone} gone" if gone else "")
                                     + f" · {format_bytes(used)} used of {format_bytes(total)} · "
                                     f"{sum(w.events for w in workers.values()):,} events"
                                     + (f" · {self.monitor.bad} bad messages dropped" if self.monitor.bad else ""))
                self.refreshes += 1
            except Exception as err:   # a broken refresh must not kill the thread
                log.exception("uvm_lab cluster dashboard refresh failed")
                self.header.value = f'<span style="color:#c62828">refresh failed: {html.escape(repr(err))}</span>'

    def _on_worker(self) -> None:
        worker = self.worker.value
        if worker is None:
            return
        lanes = self.monitor.workers().get(worker)
        self.location.options = ["host", *(f"gpu:{d}" for d in range(lanes.gpus if lanes else 0))]
        try:
            self.buffer.options = [(f"{b['label'] or 'buffer'} #{b['id']} ({format_bytes(b['size'])})", b["id"])
                                   for b in self.monitor.buffers(worker)]
        except Exception as err:   # the worker went away meanwhile: said, not raised into the widget
            self._say(err)

    def draw_timeline(self, width: int = 1200) -> None:
        """Fetch the picked worker's timeline (everything it holds) and draw it."""
        worker = self.worker.value
        if worker is None:
            return
        try:
            rows, columns = self.monitor.timeline(worker, 0, 2**53 - 1, width)
        except Exception as err:
            self._say(err)
            return
        names = [_KINDS.get(k) for k in columns["kind"].tolist()]
        keep = [i for i, name in enumerate(names) if name is not None]
        with self._lock:
            update_source(self.events, {
                "left": columns["start"][keep], "right": columns["end"][keep],
                "kind": [names[i] for i in keep], "colour": [_KIND_COLOURS[str(names[i])] for i in keep],
                "count": columns["count"][keep]})
            dropped = f", {rows['dropped']:,} dropped" if rows["dropped"] else ""
            self._timeline_title.value = html.escape(
                f"Worker timeline: {worker}, {rows['events']:,} events in {rows['rows']:,} rows{dropped}")

    def prefetch(self) -> dict[str, Any] | None:
        """Prefetch the picked buffer of the picked worker to the picked place; the worker's result."""
        worker, buffer_id = self.worker.value, self.buffer.value
        if worker is None or buffer_id is None:
            self.message.value = "pick a worker and one of its buffers first"
            return None
        result = self.monitor.command(worker, {"type": "prefetch", "seq": 0, "id": buffer_id,
                                               "location": self.location.value, "first_page": 0, "pages": None})
        if result["ok"]:
            self.message.value = f"prefetched #{buffer_id} on {html.escape(worker)} to {self.location.value}"
        else:
            self.message.value = _error(result["error"]["type"], result["error"]["message"])
        return result

    def _say(self, err: Exception) -> None:
        self.message.value = _error(type(err).__name__, str(err))

    # -- live updates ---------------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.monitor.wait(self.interval):
                self.refresh()
                self._clock.wait(self._stop, self.interval)

    def close(self) -> None:
        """Stop refreshing and close every widget. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        close_widget_tree(self.root)

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        from .dashboard import load_bokehjs

        load_bokehjs()
        self.views.resync()
        return self.root._repr_mimebundle_(**kwargs)


def _error(kind: str, message: str) -> str:
    return f'<span style="color:#c62828">{html.escape(kind)}: {html.escape(message)}</span>'


def _column(*children: Any) -> Any:
    from bokeh.layouts import column

    return column(*children, sizing_mode="stretch_width")
