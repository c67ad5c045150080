"""Notebook cells as sources: which cell a line of code is in, and which cell is running.

``%load_ext uvm_lab`` calls :func:`follow_cells`: from then on, lines captured in a cell carry its execution
count (IPython names each cell's code object after it), and driver events are charged to the cell running when
they arrive (:mod:`uvm_lab.events.sources`). When a cell ends the bus is flushed, so records the driver already
holds for that cell's work are charged to it, not to the next one.
"""

from __future__ import annotations

import re
from typing import Any

from ..events import get_bus
from ..events.sources import begin_cell, end_cells, set_cell_namer

__all__ = ["follow_cells", "stop_following_cells"]

_IN = re.compile(r"In\s*\[(\d+)\]\Z")


def follow_cells(ipython: Any) -> None:
    """Name cells after their execution counts and note each cell as it starts (idempotent)."""
    set_cell_namer(lambda filename: _cell_of(ipython, filename))
    events = ipython.events
    if _started not in events.callbacks["pre_run_cell"]:
        events.register("pre_run_cell", _started)
        events.register("post_run_cell", _ended)
    _started(None, ipython)   # the cell running now: the one that loaded uvm_lab


def stop_following_cells(ipython: Any) -> None:
    """Undo :func:`follow_cells`."""
    set_cell_namer(None)
    end_cells()
    for name, callback in (("pre_run_cell", _started), ("post_run_cell", _ended)):
        if callback in ipython.events.callbacks[name]:
            ipython.events.unregister(name, callback)


def _cell_of(ipython: Any, filename: str) -> int | None:
    # IPython's own naming, as its tracebacks show it: ("Cell", "In[3]") for a cell's code, None otherwise.
    named = ipython.compile.format_code_name(filename)
    match = _IN.match(named[1]) if isinstance(named, tuple) and len(named) == 2 else None
    return int(match.group(1)) if match else None


def _started(info: Any, ipython: Any = None) -> None:
    from IPython import get_ipython

    shell = ipython if ipython is not None else get_ipython()
    if shell is not None:
        begin_cell(int(shell.execution_count))


def _ended(result: Any) -> None:
    get_bus().flush(wait=False)
