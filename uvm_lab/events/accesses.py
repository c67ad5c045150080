"""ACCESS records: what a program accessed, as :mod:`uvm_lab.trace_replay` replays it.

The simulator publishes them for its modelled accesses; the GPU side of :mod:`uvm_lab.workloads` publishes the same
records for the kernels it launches, since it knows what they touch. Either publishes them only while a recording
asks (:attr:`~.bus.EventBus.wants_accesses`): see :class:`~.schema.EventKind` and the ``ACCESS_*`` flags.
"""

from __future__ import annotations

import numpy as np

from ..units import BLOCK_SIZE, PAGE_SIZE
from .schema import (
    ACCESS_PART,
    ACCESS_RUN,
    ACCESS_STREAM,
    ACCESS_UNIFORM,
    NO_PROCESSOR,
    AccessType,
    EventKind,
    make_events,
)

__all__ = ["range_record", "stream_header", "stream_runs"]


def range_record(address: int, size: int, processor: int, access_type: AccessType, *, alloc_id: int = 0,
                 stream: int = 0, start: int = 0) -> np.ndarray:
    """One range access (``touch``): every page of ``[address, address + size)`` once, in order."""
    return make_events(1, kind=EventKind.ACCESS, flags=access_type, src=processor, dst=NO_PROCESSOR, start=start,
                       address=address, bytes=size, alloc_id=alloc_id, stream=stream)


def stream_header(processor: int, access_type: AccessType, *, uniform: bool, in_flight: int, bytes_per_access: int,
                  warps: int | None, launch: bool, stream: int = 0, start: int = 0) -> np.ndarray:
    """The record that opens an access stream: how it ran. Its parts follow (:func:`stream_runs`)."""
    flags = int(access_type) | ACCESS_STREAM | (ACCESS_UNIFORM if uniform else 0)
    return make_events(1, kind=EventKind.ACCESS, flags=flags, src=processor, dst=int(launch), start=start,
                       address=in_flight, bytes=bytes_per_access, value=warps or 0, stream=stream)


def stream_runs(pages: np.ndarray, writes: bool | np.ndarray, processor: int, access_type: AccessType, *,
                uniform: bool, alloc_ids: int | np.ndarray, stream: int = 0, start: int = 0) -> np.ndarray:
    """One part of an access stream: the page-aligned addresses ``pages`` in program order, as one record per run
    of consecutive pages within one 2 MiB block and of one access type, the first marked ``ACCESS_PART``.

    ``writes`` says which accesses write (one flag for all, or one each); with ``uniform`` every run carries
    ``access_type``, else READ or WRITE as its accesses do. ``alloc_ids``: the allocation, of all or of each.
    """
    n = len(pages)
    if not n:
        return make_events(0)
    pages = np.asarray(pages, dtype=np.uint64)
    w = np.broadcast_to(np.bool_(writes), n) if isinstance(writes, (bool, np.bool_)) else writes
    cut = np.flatnonzero((np.diff(pages) != PAGE_SIZE) | ((pages[1:] % BLOCK_SIZE) == 0) | (w[1:] != w[:-1])) + 1
    starts = np.concatenate(([0], cut))
    first = pages[starts]
    types = np.full(len(starts), access_type, dtype=np.uint8) if uniform else \
        np.where(w[starts], np.uint8(AccessType.WRITE), np.uint8(AccessType.READ))
    runs = make_events(len(starts), kind=EventKind.ACCESS, flags=types | ACCESS_RUN, src=processor,
                       dst=NO_PROCESSOR, start=start, address=first, bytes=np.diff(np.append(starts, n)) * PAGE_SIZE,
                       alloc_id=alloc_ids if np.isscalar(alloc_ids) else np.asarray(alloc_ids)[starts], stream=stream)
    runs["flags"][0] |= ACCESS_PART
    return runs
