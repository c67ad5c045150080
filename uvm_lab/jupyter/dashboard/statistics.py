"""Statistics: each GPU's memory, bytes migrated each way, page faults, event counters (a table).

The rows live in a bokeh ``ColumnDataSource`` like every component's data; the table itself is
plain HTML in an ipywidget: bokeh's ``DataTable`` does not redraw when a source of the same length
gets new values through jupyter_bokeh (its grid refreshes only when the view's indices change).
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

import ipywidgets as widgets
from bokeh.models import ColumnDataSource

from uvm_lab.units import format_bytes

from .base import DashboardComponent, update_source
from .text import gpu_memories

__all__ = ["Statistics", "statistics_rows"]


def statistics_rows(snapshot: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The ``(metric, value)`` rows the table shows, as text."""
    allocs = snapshot["allocations"]
    rows = [("backend", f"{snapshot['backend']} ({snapshot['device_count']} device(s))")]
    for name, mem in gpu_memories(snapshot["memory"]):
        pct = 100 * mem["used"] / mem["total"] if mem["total"] else 0.0
        rows += [(f"{name} used", f"{format_bytes(mem['used'])} of {format_bytes(mem['total'])} ({pct:.1f}%)"),
                 (f"{name} free", format_bytes(mem["free"]))]
    rows += [
        ("live allocations", f"{len(allocs)} ({format_bytes(sum(a['size'] for a in allocs))})"),
        ("resource", " → ".join(snapshot["resource"])),
    ]
    stats = snapshot.get("resource_stats")
    if stats:
        rows.append(("resource statistics", f"current {format_bytes(stats['current_bytes'])}, "
                     f"peak {format_bytes(stats['peak_bytes'])}, {stats['total_count']} allocations in all"))
    totals = snapshot.get("totals")
    if totals is not None:
        rows += [
            ("migrated host → device", format_bytes(totals["bytes_htod"])),
            ("migrated device → host", format_bytes(totals["bytes_dtoh"])),
            ("GPU page faults", f"{totals['gpu_faults']:,}"),
            ("CPU page faults", f"{totals['cpu_faults']:,}"),
        ]
    ev = snapshot["events"]
    rows += [
        ("events published / dropped", f"{ev['published']:,} / {ev['dropped']:,}"),
        ("backend clock", f"{snapshot['time_ns'] / 1e6:,.3f} ms"),
    ]
    return rows


class Statistics(DashboardComponent):
    """A two-column table (metric, value) of :func:`statistics_rows`."""

    def __init__(self) -> None:
        self.source = ColumnDataSource(data={"metric": [], "value": []})
        self.root = widgets.HTML()

    def update(self, snapshot: Mapping[str, Any]) -> None:
        rows = statistics_rows(snapshot)
        if not update_source(self.source, {"metric": [m for m, _ in rows], "value": [v for _, v in rows]}):
            return
        cell = "padding:2px 16px 2px 4px;border-bottom:1px solid var(--jp-border-color2, #e0e0e0)"
        body = "".join(f'<tr><td style="{cell};color:var(--jp-ui-font-color2, #555)">{html.escape(m)}</td>'
                       f'<td style="{cell}">{html.escape(v)}</td></tr>' for m, v in rows)
        table = "border-collapse:collapse;font-size:var(--jp-ui-font-size1, 13px)"
        self.root.value = f'<table style="{table}">{body}</table>'
