"""What a view's commands do, wherever the view is: the panel's kernel, or a Dask worker a client routes to.

Both callers parse a command with :func:`~.protocol.parse_command` first; these functions carry out the parsed
command through the entry points a user's code calls (``find_buffer``, ``prefetch``, the advice properties),
so a command from a view is checked and charged exactly as the same call in a cell would be.
"""

from __future__ import annotations

import numpy as np

import uvm_lab as ul

from ..buffer import page_range
from ..events import get_bus
from ..events.sources import acting_for
from ..events.sources import texts as source_texts
from .protocol import BY_SOURCE_LIMIT, TIMELINE_COLUMNS, Prefetch, SetAdvice, Timeline, TimelineRows
from .timeline import EventWindow

__all__ = ["CONTROLS_SOURCE", "answer_timeline", "change_buffer"]

#: What the events of a prefetch or advice sent from a view are charged to.
CONTROLS_SOURCE = "UVM Lab controls"


def change_buffer(command: Prefetch | SetAdvice) -> None:
    """Prefetch a buffer's pages, or set one of its advice, as ``command`` says; charged to the view's controls.

    Raises whatever the entry point raises for it: a buffer freed since the view listed it, a GPU that is not
    there, advice the backend cannot give.
    """
    get_bus().flush(wait=False)   # what came before is the cell's
    with acting_for(CONTROLS_SOURCE):   # what this does is the view's doing, not the last cell's
        buf = ul.find_buffer(command["id"])
        if command["type"] == "prefetch":
            offset, size = page_range(buf, command["first_page"], command["pages"])
            buf.prefetch(command["location"], offset=offset, size=size)
        elif command["advice"] == "read_mostly":
            buf.read_mostly = command["value"]  # type: ignore[assignment]
        elif command["advice"] == "preferred_location":
            buf.preferred_location = command["value"]  # type: ignore[assignment]
        else:
            buf.accessed_by = command["value"]  # type: ignore[assignment]
        get_bus().flush(wait=False)


def answer_timeline(window: EventWindow, query: Timeline) -> tuple[TimelineRows, list[np.ndarray]]:
    """The answer to a timeline query from ``window``'s events: the rows' message, and one buffer a column."""
    columns, events, truncated = window.query(query["start"], query["end"], query["width"], query["lanes"])
    first, last = window.extent()
    lines, totals, others = window.by_source(query["start"], query["end"], query["lanes"], BY_SOURCE_LIMIT)
    ids = np.union1d(np.unique(columns["source"]), lines)
    ids = ids[ids != 0]
    sources = dict(zip((str(i) for i in ids.tolist()), source_texts(ids), strict=True))
    rows = TimelineRows(type="timeline", seq=query["seq"], start=query["start"], end=query["end"],
                        width=query["width"], columns=[name for name, _ in TIMELINE_COLUMNS],
                        rows=len(columns["start"]), events=events, held=window.held,
                        dropped=window.dropped, missed=window.missed, truncated=truncated,
                        first=first, last=last,
                        sources=sources, by_source=np.column_stack([lines, totals]).tolist(),
                        by_source_others=others)
    return rows, [columns[name] for name, _ in TIMELINE_COLUMNS]
