"""Collectors: what the dashboard and ``%uvm status`` show, as plain data.

Nothing here imports a widget or a plotting library. :func:`collect_snapshot` reads the kernel-side
API (``ul.live_buffers()``, ``ul.residency()``, ``backend.mem_info()``, the event bus) and returns a
dict of builtins and numpy arrays; the components in this package only render such a dict. The
snapshot's shape::

    {
      "backend": "sim", "device_count": 1, "time_ns": 123456,
      "memory": {"free": int, "total": int, "used": int},           # backend.mem_info()
      "events": {"published": int, "dropped": int},                 # the bus's counters
      "totals": {...} | None,                                       # EventTotals.snapshot()
      "resource": ["PrefetchResourceAdaptor", "PoolMemoryResource", ...],
      "resource_stats": {"current_bytes": ..., ...} | None,         # a StatisticsResourceAdaptor in the chain
      "allocations": [                                              # ul.live_buffers(), oldest first
        {"id", "label", "size", "address", "is_managed", "page_size",
         "states": uint8 array (one entry per page, ul.residency's encoding),
         "summary": {"gpu": f, "host": f, "both": f, "nowhere": f},
         "advice": {"read_mostly": bool, "preferred_location": str | None, "accessed_by": (str, ...)} | None},
      ],
    }
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

import uvm_lab as ul
from uvm_lab.errors import BufferClosedError
from uvm_lab.events import get_bus

__all__ = ["STATE_NAMES", "EventTotals", "bin_states", "collect_snapshot", "describe_buffer"]

#: ``ul.residency`` page states, by value: 0 nowhere, 1 host, 2 gpu, 3 both.
STATE_NAMES = ("nowhere", "host", "gpu", "both")

class EventTotals:
    """Running totals of ``Trace.summary()`` over every batch the bus delivers: events, counts per kind,
    bytes migrated each way, faults.

    Seeded with the bus's history, so it counts from the start of the session as far as the history
    ring reaches. ``feed`` may be called from any thread (the bus delivers on the publisher's thread).
    """

    _SUMMED = ("events", "bytes_htod", "bytes_dtoh", "gpu_faults", "cpu_faults")

    def __init__(self, history: np.ndarray | None = None) -> None:
        self._lock = threading.Lock()
        self._totals: dict[str, int] = dict.fromkeys(self._SUMMED, 0)
        self._counts: dict[str, int] = {}
        if history is not None and len(history):
            self.feed(history)

    def feed(self, records: np.ndarray) -> None:
        part = ul.Trace(records).summary()
        with self._lock:
            for key in self._SUMMED:
                self._totals[key] += part[key]
            for name, n in part["counts"].items():
                self._counts[name] = self._counts.get(name, 0) + n

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {**self._totals, "counts": dict(self._counts)}


def describe_buffer(buf: Any) -> dict[str, Any]:
    """One allocation as plain data: identity, residency (page states and fractions), advice."""
    res = ul.residency(buf)
    advice = None
    if buf.is_managed:
        advice = {
            "read_mostly": bool(buf.read_mostly),
            "preferred_location": buf.preferred_location,
            "accessed_by": tuple(buf.accessed_by),
        }
    return {
        "id": int(buf.id),
        "label": str(buf.label or ""),
        "size": int(buf.size),
        "address": int(buf.ptr),
        "is_managed": bool(buf.is_managed),
        "page_size": int(res.page_size),
        "states": np.array(res.states, dtype=np.uint8, copy=True),
        "summary": {k: float(v) for k, v in res.summary().items()},
        "advice": advice,
    }


def collect_snapshot(totals: EventTotals | None = None) -> dict[str, Any]:
    """Everything a view shows, read through the public API (see the module docstring for the shape)."""
    backend = ul.get_backend()
    free, total = backend.mem_info()
    bus = get_bus()
    allocations = []
    for buf in ul.live_buffers():
        try:
            allocations.append(describe_buffer(buf))
        except BufferClosedError:
            continue  # freed by another thread between live_buffers() and now
    chain = ul.mr.resource_chain(ul.mr.get_current_device_resource())
    stats = next((dict(r.allocation_counts) for r in chain if hasattr(r, "allocation_counts")), None)
    return {
        "backend": backend.name,
        "device_count": int(backend.device_count()),
        "time_ns": int(backend.now_ns()),
        "memory": {"free": int(free), "total": int(total), "used": int(total - free)},
        "events": {"published": int(bus.published), "dropped": int(bus.dropped)},
        "totals": totals.snapshot() if totals is not None else None,
        "resource": [type(r).__name__ for r in chain],
        "resource_stats": stats,
        "allocations": allocations,
    }


def bin_states(states: np.ndarray, n_bins: int) -> dict[str, np.ndarray]:
    """Group pages into at most ``n_bins`` equal runs; per bin: page range, pages per state, dominant state.

    ``states`` is ``ResidencyMap.states``; the result's states are 0 nowhere, 1 host, 2 gpu, 3 both.

    Returns columns ``first``, ``last`` (page indices, inclusive), ``nowhere``, ``host``, ``gpu``,
    ``both`` (page counts) and ``state`` (the state most of the bin's pages are in).
    """
    n = len(states)
    if n == 0:
        empty = np.zeros(0, dtype=np.int64)
        return {"first": empty, "last": empty, **{s: empty for s in STATE_NAMES}, "state": np.zeros(0, np.uint8)}
    per_bin = -(-n // max(1, n_bins))          # ceil: every bin but the last holds per_bin pages
    starts = np.arange(0, n, per_bin)
    # ul.residency's states are processor bitmasks (bit 0 the host, bit d+1 device d): fold every
    # GPU bit into "gpu", so a page on gpu:1 counts as gpu, not as an unknown state.
    category = (states & 1) + 2 * ((states & ~np.uint8(1)) != 0)
    onehot = np.zeros((n, 4), dtype=np.int64)
    onehot[np.arange(n), category] = 1
    counts = np.add.reduceat(onehot, starts, axis=0)
    out = {
        "first": starts.astype(np.int64),
        "last": np.minimum(starts + per_bin, n).astype(np.int64) - 1,
        **{name: counts[:, i] for i, name in enumerate(STATE_NAMES)},
        "state": counts.argmax(axis=1).astype(np.uint8),
    }
    return out
