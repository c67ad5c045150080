"""What the map can infer with no record of the driver's: a completed prefetch, and the moves between two maps.

On a real GPU with tracing off, no driver record says what a ``cudaMemPrefetchAsync`` moved. Its completion
says enough: every page of the range is then at the destination, where a ReadMostly page keeps the copies it
had (the driver read-duplicates it) and any other page keeps only that one (:func:`prefetch_result`). The
migrations between the map before and after are :func:`moves`, published with cause ``USER_INFERRED``, so
byte counts and timelines see them as they would see CUPTI's.

:func:`moves` is also how the host watcher (:mod:`uvm_lab.tracing.reconcile`) turns what the host's page
tables show into migrations. Each copy a page gained came from one it had: from the host if it held one and
a GPU gained the copy, else from the lowest GPU holding one, else (the map did not know where its copies
were) from an unknown GPU, ``src`` -2. A page that held nothing gains its first copy by population, not by a
migration, and a page whose GPU copies were unknown that is then known to be on a GPU gained no copy the map
can show moving: neither is a migration here.
"""

from __future__ import annotations

import numpy as np

from ..events.schema import EVENT_DTYPE, NO_PROCESSOR, EventKind
from ..location import HOST_ID
from ..page_states import HOST, MAX_GPUS, UNKNOWN, bit, gpu_bits
from ..units import PAGE_SIZE

__all__ = ["moves", "prefetch_result", "runs"]

#: For a page state, the lowest GPU holding a copy (-2 where none is known to).
_LOWEST_GPU = np.array([next((d for d in range(MAX_GPUS) if v & (1 << (d + 1))), NO_PROCESSOR) for v in range(256)],
                       dtype=np.int16)


def prefetch_result(states: np.ndarray, read_mostly: np.ndarray, dst: int) -> np.ndarray:
    """The page states after a prefetch of these pages to ``dst`` (``HOST_ID`` or a GPU) completed.

    A ReadMostly page gains a copy at ``dst`` and keeps the ones it had (what its old copies were, known or
    unknown, stays so); any other page has exactly one copy, at ``dst``.
    """
    target = np.uint8(bit(dst))
    states = np.asarray(states, dtype=np.uint8)
    return np.where(np.asarray(read_mostly, dtype=bool) & (states != 0), states | target, target).astype(np.uint8)


def runs(mask: np.ndarray, key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """First index and length of each run of True in ``mask`` over which ``key`` stays the same."""
    idx = np.flatnonzero(mask)
    if not len(idx):
        return idx, idx
    breaks = np.flatnonzero((np.diff(idx) != 1) | (np.diff(key[idx]) != 0)) + 1
    starts = idx[np.r_[0, breaks]]
    ends = idx[np.r_[breaks - 1, len(idx) - 1]] + 1
    return starts, ends - starts


def moves(old: np.ndarray, new: np.ndarray, *, address: int, cause: int, alloc_id: int = 0, start: int = 0,
          end: int = 0, stream: int = 0, source: int = 0) -> np.ndarray:
    """The migrations that take pages from ``old`` to ``new`` states, as runs of records (in address order
    for each destination: the host, then GPU 0, 1 ...; a copy to an unknown GPU last).

    Only copies gained are migrations: a copy lost goes without a transfer. See the module docstring for
    where each copy is taken to come from. ``source`` is the line that caused them (the prefetch's).
    """
    old = np.asarray(old, dtype=np.uint8)
    new = np.asarray(new, dtype=np.uint8)
    held = (old & ~np.uint8(UNKNOWN)) != 0       # the map knew of a copy
    known_host = (old & HOST) != 0
    lowest = _LOWEST_GPU[old]
    parts = []

    def add(mask: np.ndarray, src: np.ndarray, dst: int) -> None:
        first, length = runs(mask, src)
        if not len(first):
            return
        ev = np.zeros(len(first), dtype=EVENT_DTYPE)
        s = src[first]
        ev["kind"] = np.where(dst == HOST_ID, EventKind.DTOH, np.where(s == HOST_ID, EventKind.HTOD, EventKind.DTOD))
        ev["flags"], ev["src"], ev["dst"] = cause, s, dst
        ev["start"], ev["end"] = start, end
        ev["address"] = address + first * PAGE_SIZE
        ev["bytes"] = ev["value"] = length * PAGE_SIZE
        ev["alloc_id"], ev["stream"], ev["source"] = alloc_id, stream, source
        parts.append(ev)

    # To the host: from the lowest GPU that held it, or an unknown one.
    came = ((new & HOST) != 0) & ~known_host & (old != 0)
    add(came, lowest, HOST_ID)
    # To each GPU: from the host where it held a copy, else the lowest GPU; never from nowhere.
    origin = np.where(known_host, np.int16(HOST_ID), lowest).astype(np.int16)
    for d in range(MAX_GPUS):
        b = np.uint8(1 << (d + 1))
        add(((new & b) != 0) & ((old & b) == 0) & held, origin, d)
    # To a GPU the map cannot name: a copy left the host for it.
    add(((new & UNKNOWN) != 0) & (gpu_bits(new) == 0) & known_host & ((new & HOST) == 0), origin, NO_PROCESSOR)
    return np.concatenate(parts) if parts else np.zeros(0, dtype=EVENT_DTYPE)
