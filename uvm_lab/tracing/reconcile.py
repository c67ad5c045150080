"""What the records missed: a residency map against the host's page tables, and the events that would close the gap.

CUPTI can lose unified-memory records without counting them (``benchmarks/README.md``: whole windows of
faults and migrations, several milliseconds long, on one H200 host). The host's page tables
(:func:`~uvm_lab.tracing.host_resident`) are exact for managed memory, so with the GPU idle every
disagreement between them and a map built from records names a record that never arrived:

============================== ====================== =============================================
map says                       host's page tables say inferred event
============================== ====================== =============================================
on the host only               not on the host        HtoD to the GPU (cause ``INFERRED``), then
                                                      INVALIDATE of the host copy (a move, also of
                                                      a ReadMostly page)
on the host and a GPU          not on the host        INVALIDATE of the host copy
on a GPU only                  on the host            DtoH from that GPU (cause ``INFERRED``)
nowhere (never touched)        on the host            CPU fault of unknown access (a first touch)
============================== ====================== =============================================

Inferred events carry :attr:`~uvm_lab.events.MigrationCause.INFERRED` (migrations) or a ``value`` of 0
faults (first touches), so a timeline can tell them from what the driver reported; their time is when the
check ran, since the real one was lost. Only the host side can be checked: a lost GPU-to-GPU migration
or a lost GPU first touch leaves no trace in the host's page tables.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import InvalidArgumentError
from ..events.schema import EVENT_DTYPE, NO_PROCESSOR, AccessType, EventKind, MigrationCause
from ..location import HOST_ID
from ..units import PAGE_SIZE

__all__ = ["Reconciliation", "reconcile"]


@dataclass(frozen=True)
class Reconciliation:
    """Pages whose last change no record accounts for, by what the change was, and the events that
    would make the map match the host (:data:`~uvm_lab.events.EVENT_DTYPE`, in address order)."""

    pages: int = 0                #: pages compared
    htod: int = 0                 #: pages that left the host for a GPU with no HtoD record
    dtoh: int = 0                 #: pages that came back to the host with no DtoH record
    first_touch: int = 0          #: pages the host touched first with no CPU fault record
    host_copy_dropped: int = 0    #: read-duplicated pages whose host copy went with no record
    events: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=EVENT_DTYPE))

    @property
    def unrecorded(self) -> int:
        """Every page in disagreement."""
        return self.htod + self.dtoh + self.first_touch + self.host_copy_dropped

    def __add__(self, other: Reconciliation) -> Reconciliation:
        return Reconciliation(self.pages + other.pages, self.htod + other.htod, self.dtoh + other.dtoh,
                              self.first_touch + other.first_touch,
                              self.host_copy_dropped + other.host_copy_dropped,
                              np.concatenate((self.events, other.events)))

    def __repr__(self) -> str:
        return (f"<Reconciliation of {self.pages} pages: {self.htod} HtoD, {self.dtoh} DtoH, {self.first_touch} "
                f"first touches, {self.host_copy_dropped} host copies dropped, unrecorded>")


#: For a page state, the lowest GPU holding a copy (0 where none does).
_LOWEST_GPU = np.array([((v >> 1) & -(v >> 1)).bit_length() - 1 if v >> 1 else 0 for v in range(256)], dtype=np.int16)


def _runs(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """First page and length of each run of True."""
    edges = np.flatnonzero(np.diff(np.concatenate(([0], mask.view(np.int8), [0]))))
    return edges[0::2], edges[1::2] - edges[0::2]


def reconcile(states: np.ndarray, host: np.ndarray, *, address: int, device: int, alloc_id: int = 0,
              now: int = 0) -> Reconciliation:
    """Compare a map's page states with the host's present bits; return what disagrees, with the events.

    Parameters
    ----------
    states
        The map's page states (``ResidencyMap.states``: bit 0 the host, bit ``d + 1`` GPU ``d``).
    host
        One bool per page: present in host RAM (:func:`~uvm_lab.tracing.host_resident`).
    address
        The first page's address (page-aligned).
    device
        The GPU that host pages left for (the map cannot say which, where several could have taken them).
    alloc_id
        The allocation the pages belong to, for the events' ``alloc_id``.
    now
        The events' timestamp, on the backend's clock.
    """
    states = np.asarray(states)
    host = np.asarray(host)
    if states.dtype != np.uint8 or host.dtype != bool or states.shape != host.shape or states.ndim != 1:
        raise InvalidArgumentError("states and host must be 1-D, of the same length, uint8 and bool",
                                   value=(getattr(states, "dtype", None), getattr(host, "dtype", None)),
                                   expected="ResidencyMap.states and host_resident(...) of the same range")
    if isinstance(address, bool) or not isinstance(address, int) or address < 0 or address % PAGE_SIZE:
        raise InvalidArgumentError(f"address must be page-aligned, got {address!r}", value=address,
                                   expected=f"a non-negative multiple of {PAGE_SIZE}")
    if isinstance(device, bool) or not isinstance(device, int) or device < 0:
        raise InvalidArgumentError(f"device must be a GPU ordinal, got {device!r}", value=device,
                                   expected="an int >= 0")
    on_host = (states & 1) != 0
    on_gpu = (states & ~np.uint8(1)) != 0
    left = on_host & ~host
    htod, dropped = left & ~on_gpu, left & on_gpu
    came = host & ~on_host
    first_touch, dtoh = came & (states == 0), came & on_gpu
    parts = []

    def add(mask: np.ndarray, kind: EventKind, flags: int, src: np.ndarray | int, dst: int) -> None:
        first, length = _runs(mask)
        if not len(first):
            return
        ev = np.zeros(len(first), dtype=EVENT_DTYPE)
        ev["kind"], ev["flags"], ev["src"], ev["dst"] = kind, flags, src if np.isscalar(src) else src[first], dst
        ev["start"] = ev["end"] = now
        ev["address"] = address + first * PAGE_SIZE
        ev["bytes"] = length * PAGE_SIZE
        ev["value"] = 0 if kind == EventKind.CPU_PAGE_FAULT else length * PAGE_SIZE
        ev["alloc_id"] = alloc_id
        parts.append(ev)

    add(htod, EventKind.HTOD, MigrationCause.INFERRED, HOST_ID, device)
    # The host copy is gone in both cases: after the HtoD too, where the map would have read-duplicated
    # a ReadMostly page rather than moved it.
    add(htod | dropped, EventKind.INVALIDATE, 0, HOST_ID, NO_PROCESSOR)
    if dtoh.any():   # from the lowest GPU holding each page, a run per source GPU
        source = _LOWEST_GPU[states]
        for gpu in np.unique(source[dtoh]).tolist():
            add(dtoh & (source == gpu), EventKind.DTOH, MigrationCause.INFERRED, gpu, HOST_ID)
    add(first_touch, EventKind.CPU_PAGE_FAULT, AccessType.UNKNOWN, HOST_ID, HOST_ID)
    events = np.concatenate(parts) if parts else np.zeros(0, dtype=EVENT_DTYPE)
    events = events[np.argsort(events["address"], kind="stable")]   # stable: an HtoD before its INVALIDATE
    return Reconciliation(pages=len(states), htod=int(htod.sum()), dtoh=int(dtoh.sum()),
                          first_touch=int(first_touch.sum()), host_copy_dropped=int(dropped.sum()), events=events)
