"""Statistics: device memory, bytes migrated each way, page faults, event counters (a bokeh table)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bokeh.models import ColumnDataSource, DataTable, TableColumn

from uvm_lab.units import format_bytes

from .base import BokehView, DashboardComponent, update_source

__all__ = ["Statistics", "statistics_rows"]


def statistics_rows(snapshot: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The ``(metric, value)`` rows the table shows, as text."""
    mem = snapshot["memory"]
    allocs = snapshot["allocations"]
    pct = 100 * mem["used"] / mem["total"] if mem["total"] else 0.0
    rows = [
        ("backend", f"{snapshot['backend']} ({snapshot['device_count']} device(s))"),
        ("device memory used", f"{format_bytes(mem['used'])} of {format_bytes(mem['total'])} ({pct:.1f}%)"),
        ("device memory free", format_bytes(mem["free"])),
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

    def __init__(self, *, width: int = 420) -> None:
        self.source = ColumnDataSource(data={"metric": [], "value": []})
        self.table = DataTable(
            source=self.source, width=width, height=330, index_position=None, sortable=False,
            reorderable=False, selectable=False, header_row=False,
            columns=[TableColumn(field="metric", title="metric", width=170),
                     TableColumn(field="value", title="value", width=width - 170)],
        )
        self.root = BokehView(self.table)

    def update(self, snapshot: Mapping[str, Any]) -> None:
        rows = statistics_rows(snapshot)
        update_source(self.source, {"metric": [m for m, _ in rows], "value": [v for _, v in rows]})
