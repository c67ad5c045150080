"""Records of copies and faults, one per run of pages, written in C (``_records.c``) where it was compiled.

:func:`run_records` does what ``page_runs`` and :meth:`~.model.EventLog.add_many` do together, with the same
records and clock; the engine keeps that numpy code for builds without a compiler (``compiled.COMPILED`` False).
"""

from __future__ import annotations

import numpy as np

from ...events.schema import EVENT_DTYPE
from ...units import PAGE_SIZE
from .compiled import core
from .model import PAGES_PER_BLOCK, EventLog, PageTable
from .platform import link_seconds

__all__ = ["link_table", "run_records"]

_VALUE_BYTES, _VALUE_PAGES, _VALUE_FAULTED = range(3)
_seconds: dict[tuple[float, float], np.ndarray] = {}


def link_table(bw: float, k: float) -> np.ndarray:
    """``link_seconds`` of a run of 0 .. 512 pages: what add_many's records of those runs last."""
    table = _seconds.get((bw, k))
    if table is None:
        table = _seconds[(bw, k)] = link_seconds(np.arange(PAGES_PER_BLOCK + 1, dtype=np.uint64) * PAGE_SIZE, bw, k)
    return table


def run_records(log: EventLog, table: PageTable, pages: np.ndarray, kind: int, flags: int, src: int, dst: int,
                stream: int, link: tuple[float, float] | None = None, faulted: np.ndarray | None = None) -> None:
    """Append one record per run of ``pages`` (sorted, distinct) to ``log``.

    With ``link`` (a link's bandwidth and shape constant) the records are copies: each lasts what the link
    takes for its bytes, back to back, and its value is its bytes. Without, they are faults: they take no
    time, and their value is their pages, or with ``faulted`` (sorted) how many of them faulted.
    """
    log._flush_rows()      # the records stay in the order they were made
    out = np.empty(len(pages), dtype=EVENT_DTYPE)
    value = _VALUE_BYTES if link is not None else _VALUE_PAGES if faulted is None else _VALUE_FAULTED
    seconds = None if link is None else link_table(*link)
    faulted = None if faulted is None else np.ascontiguousarray(faulted, dtype=np.int64)
    n, log.t = core.run_records(np.ascontiguousarray(pages, dtype=np.int64), kind, flags, src, dst, stream,
                                table.block_address, table.block_alloc, seconds, value, faulted, log.t, out)
    log.chunks.append(out[:n])
