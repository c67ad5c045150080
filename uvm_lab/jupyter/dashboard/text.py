"""Plain-text views of a snapshot and of a trace summary, for ``%uvm status`` and ``%%uvm_trace``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from uvm_lab.units import format_bytes

from .collect import shown_categories

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["format_status", "format_table", "format_top_sources", "format_trace_summary", "gpu_memories"]


def gpu_memories(memory: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """Each GPU's memory of a snapshot's ``memory`` with the name every view gives it: "device memory" where there
    is one GPU, "GPU d memory" for each where there are several."""
    devices = memory["devices"]
    if len(devices) == 1:
        return [("device memory", devices[0])]
    return [(f"GPU {gpu['device']} memory", gpu) for gpu in devices]


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, right: Sequence[int] = ()) -> str:
    """A fixed-width table; columns whose index is in ``right`` are right-aligned."""
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(row: list[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths,
                                                                                              strict=True))).rstrip()

    return "\n".join([line(cells[0]), line(["-" * w for w in widths]), *(line(r) for r in cells[1:])])


def _advice_text(advice: Mapping[str, Any] | None) -> str:
    if advice is None:
        return "n/a (not managed)"
    parts = []
    if advice["read_mostly"]:
        parts.append("read_mostly")
    if advice["preferred_location"]:
        parts.append(f"preferred={advice['preferred_location']}")
    if advice["accessed_by"]:
        parts.append("accessed_by=" + ",".join(advice["accessed_by"]))
    return ", ".join(parts) or "-"


def format_status(snapshot: Mapping[str, Any]) -> str:
    """The ``%uvm status`` report: backend, each GPU's memory, resource, live allocations, event counters.

    The allocation table has a column per page category: each GPU of the device, "gpus" where there
    are several, host, both, unknown and nowhere (and any other category that holds pages).
    """
    ev = snapshot["events"]
    lines = [
        f"backend: {snapshot['backend']} ({snapshot['device_count']} device(s)), "
        f"clock {snapshot['time_ns'] / 1e6:,.3f} ms",
        *(f"{name}: {format_bytes(mem['used'])} used, {format_bytes(mem['free'])} free, "
          f"{format_bytes(mem['total'])} total" for name, mem in gpu_memories(snapshot["memory"])),
        "resource: " + " -> ".join(snapshot["resource"]),
        f"events: {ev['published']:,} published, {ev['dropped']:,} dropped from history",
        _subscriptions_text(ev["subscriptions"]),
    ]
    allocs = snapshot["allocations"]
    if not allocs:
        lines.append("live allocations: none")
        return "\n".join(lines)
    total = sum(a["size"] for a in allocs)
    lines.append(f"live allocations: {len(allocs)}, {format_bytes(total)}")
    present = {name for a in allocs for name, n in a["category_pages"].items() if n}
    shown = shown_categories(snapshot["device_count"], present)
    rows = []
    for a in allocs:
        pages, n_pages = a["category_pages"], max(len(a["states"]), 1)
        rows.append([a["id"], a["label"] or "-", format_bytes(a["size"]), "managed" if a["is_managed"] else "device",
                     *(f"{100 * pages[name] / n_pages:.1f}%" for name in shown), _advice_text(a["advice"])])
    headers = ["id", "label", "size", "kind", *shown, "advice"]
    table = format_table(headers, rows, right=(0, 2, *range(4, 4 + len(shown))))
    lines += ["", table]
    return "\n".join(lines)


def _subscriptions_text(subscriptions: Sequence[Mapping[str, Any]]) -> str:
    """Who listens to the bus, and what each missed by falling behind (what the bus dropped for it)."""
    behind = [s for s in subscriptions if s["dropped"]]
    return f"subscribers: {len(subscriptions)}, " + (
        "none fell behind" if not behind else
        "dropped for those that fell behind: " + ", ".join(f"{s['name']} {s['dropped']:,}" for s in behind))


def format_trace_summary(summary: Mapping[str, Any], *, clock: str = "backend") -> str:
    """The ``%%uvm_trace`` report, from ``Trace.summary()``."""
    head = f"uvm_trace: {summary['events']:,} events over {summary['seconds'] * 1e3:,.3f} ms of {clock} time"
    rows = [
        ["migrated host -> device", format_bytes(summary["bytes_htod"])],
        ["migrated device -> host", format_bytes(summary["bytes_dtoh"])],
        ["GPU page faults", f"{summary['gpu_faults']:,}"],
        ["CPU page faults", f"{summary['cpu_faults']:,}"],
    ]
    if summary["missed"]:
        rows.append(["missed (fell behind)", f"{summary['missed']:,} event{'' if summary['missed'] == 1 else 's'}"])
    lines = [head, *(f"  {name:<26}{value}" for name, value in rows)]
    counts = summary["counts"]
    if counts:
        lines.append("  events by kind: " + ", ".join(f"{k} {n:,}" for k, n in sorted(counts.items(),
                                                                                    key=lambda kv: -kv[1])))
    return "\n".join(lines)


def format_top_sources(by_source: pd.DataFrame, *, top: int = 5) -> str:
    """The lines that caused the most faults, and the most bytes moved, from ``Trace.by_source()``."""
    known = by_source[by_source["source"] != ""]
    lines = []
    for title, column, show in (("faults", "faults", lambda n: f"{n:,}"), ("bytes moved", "bytes_moved", format_bytes)):
        values = known["gpu_faults"] + known["cpu_faults"] if column == "faults" else known[column]
        order = values[values > 0].sort_values(ascending=False, kind="stable").head(top)
        if not len(order):
            continue
        lines.append(f"  top lines by {title}:")
        lines.extend(f"    {show(int(values[i])):>12}  {known['source'][i]}" for i in order.index)
    return "\n".join(lines) if lines else "  no known line faulted or moved memory"
