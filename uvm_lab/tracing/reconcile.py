"""What the records missed: a residency map against the host's page tables, and the events that close the gap.

The host's page tables (:func:`~uvm_lab.tracing.host_resident`) are exact for managed memory. With tracing
off, they are the only record of what kernels and host code moved (:mod:`uvm_lab.tracing.watcher` reads them
at a low rate); with CUPTI on, they catch what CUPTI lost without counting it (``benchmarks/README.md``). Every
disagreement between them and a map says where a page went, as far as the host can tell:

=================================== ====================== ===============================================
map says                            host's page tables say the map then says, and the event published
=================================== ====================== ===============================================
on the host only                    not on the host        on the GPU (one GPU), else unknown: HtoD
                                                           (cause ``INFERRED``); to ``dst`` -2 where the GPU
                                                           cannot be named
on the host and GPUs (ReadMostly)   not on the host        on those GPUs: the host copy was dropped
on GPUs, or unknown                 on the host            on the host (and still on the GPUs, if ReadMostly):
                                                           DtoH from the lowest GPU, or ``src`` -2 if unknown
nowhere (never touched)             on the host            on the host: CPU fault of unknown access (first
                                                           touch)
unknown, the host's side agrees     on the host            on the host alone, unless ReadMostly
unknown, the host's side agrees     not on the host        on the GPU, where there is one GPU
=================================== ====================== ===============================================

An unknown page always holds data (it became unknown when a GPU or the driver worked on it), so on a one-GPU
machine a page that the host does not hold is on the GPU, and a page that is not ReadMostly has one copy. The
last two rows learn where a page is without anything having moved: no migration, only the state. Every
changed page also gets a RESIDENCY record with its new state, so the map ends exactly there whatever the
events before it did. Inferred events carry the cause :attr:`~uvm_lab.events.MigrationCause.INFERRED` or a
``value`` of 0 faults (first touches); their time is when the check ran, since the real one is unknown. What
the host's page tables cannot show stays unknown or as it was: which GPU took a page on a machine of several,
and a GPU's copy of a page the host also holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import InvalidArgumentError
from ..events.schema import EVENT_DTYPE, AccessType, EventKind, MigrationCause
from ..location import HOST_ID
from ..page_states import GPU, HOST, UNKNOWN, gpu_bits
from ..units import PAGE_SIZE
from .inference import moves, runs

__all__ = ["Reconciliation", "changes", "host_truth", "reconcile"]


@dataclass(frozen=True)
class Reconciliation:
    """Pages whose last change no record accounts for, by what the change was, and the events that
    would make the map match the host (:data:`~uvm_lab.events.EVENT_DTYPE`, in address order)."""

    pages: int = 0                #: pages compared
    htod: int = 0                 #: pages that left the host for a GPU with no HtoD record
    dtoh: int = 0                 #: pages that came back to the host with no DtoH record
    first_touch: int = 0          #: pages the host touched first with no CPU fault record
    host_copy_dropped: int = 0    #: read-duplicated pages whose host copy went with no record
    learned: int = 0              #: pages whose place the host's side settled, with nothing moved (unknown before)
    events: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=EVENT_DTYPE))

    @property
    def unrecorded(self) -> int:
        """Every page the host's side disagreed on: moved with no record. More than CUPTI lost where a counter was
        off (:meth:`uvm_lab.tracing.CuptiCollector.account` counts only what the enabled counters should have
        carried). A check sees what moved since the last one: after the data came home, the host's page tables no
        longer show where it went meanwhile."""
        return self.htod + self.dtoh + self.first_touch + self.host_copy_dropped

    def __add__(self, other: Reconciliation) -> Reconciliation:
        return Reconciliation(self.pages + other.pages, self.htod + other.htod, self.dtoh + other.dtoh,
                              self.first_touch + other.first_touch,
                              self.host_copy_dropped + other.host_copy_dropped, self.learned + other.learned,
                              np.concatenate((self.events, other.events)))

    def __repr__(self) -> str:
        return (f"<Reconciliation of {self.pages} pages: {self.htod} HtoD, {self.dtoh} DtoH, {self.first_touch} "
                f"first touches, {self.host_copy_dropped} host copies dropped, unrecorded; {self.learned} learned>")


def host_truth(states: np.ndarray, host: np.ndarray, read_mostly: np.ndarray, *, gpus: int) -> np.ndarray:
    """The page states once the host's side is taken from ``host`` (see the module docstring's table)."""
    on_host = (states & HOST) != 0
    unknown = (states & UNKNOWN) != 0
    rest = states & ~np.uint8(HOST)
    new = states.copy()
    came = host & ~on_host
    new[came] = np.where(read_mostly[came], states[came] | HOST, HOST)
    left = ~host & on_host
    if gpus == 1:   # a page held somewhere that the host does not hold is on the one GPU
        new[left | (~host & unknown)] = GPU
    else:           # on the GPUs that held copies too, or on one the map cannot name
        new[left] = np.where(rest[left] != 0, rest[left], np.uint8(UNKNOWN))
    single = host & on_host & unknown & ~read_mostly   # held by the host, and by nothing else
    new[single] = HOST
    return new


def changes(states: np.ndarray, host: np.ndarray, read_mostly: np.ndarray, *, gpus: int) -> np.ndarray:
    """Where :func:`host_truth` would change the state: a bool per page (a few passes over the pages, so a round
    that finds the map and the host agreeing costs little)."""
    on_host = (states & HOST) != 0
    unknown = (states & UNKNOWN) != 0
    settles = (~host & unknown) if gpus == 1 else np.zeros_like(unknown)
    return (on_host != host) | settles | (unknown & host & ~read_mostly)


def _records(mask: np.ndarray, kind: EventKind, *, address: int, alloc_id: int, now: int, flags: int = 0,
             src: int = HOST_ID, dst: int = HOST_ID, value: np.ndarray | None = None) -> np.ndarray:
    """One record per run of ``mask`` (or per run of equal ``value`` within it)."""
    first, length = runs(mask, np.zeros(len(mask), dtype=np.uint8) if value is None else value)
    ev = np.zeros(len(first), dtype=EVENT_DTYPE)
    ev["kind"], ev["flags"], ev["src"], ev["dst"] = kind, flags, src, dst
    ev["start"] = ev["end"] = now
    ev["address"] = address + first * PAGE_SIZE
    ev["bytes"] = length * PAGE_SIZE
    ev["value"] = 0 if value is None else value[first]
    ev["alloc_id"] = alloc_id
    return ev


def reconcile(states: np.ndarray, host: np.ndarray, *, address: int, gpus: int = 1,
              read_mostly: np.ndarray | None = None, settled: np.ndarray | None = None, alloc_id: int = 0,
              now: int = 0) -> Reconciliation:
    """Compare a map's page states with the host's present bits; return what disagrees, with the events.

    Parameters
    ----------
    states
        The map's page states (``ResidencyMap.states``, :mod:`uvm_lab.page_states`).
    host
        One bool per page: present in host RAM (:func:`~uvm_lab.tracing.host_resident`).
    address
        The first page's address (page-aligned).
    gpus
        How many GPUs the process has: with one, a page that left the host is on it; with several, the
        host's page tables cannot say which took it.
    read_mostly
        One bool per page: ReadMostly (``ResidencyMap.read_mostly``); such pages may keep several copies.
        None: none is.
    settled
        One bool per page: False where the host's side is in motion (it read differently twice); those pages
        are left as they are. None: all are settled.
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
    rm = np.zeros(len(states), dtype=bool) if read_mostly is None else np.asarray(read_mostly)
    if rm.dtype != bool or rm.shape != states.shape:
        raise InvalidArgumentError(f"read_mostly must be one bool per page, got {getattr(rm, 'dtype', rm)!r} of "
                                   f"shape {getattr(rm, 'shape', None)}", value=read_mostly,
                                   expected=f"a bool array of {len(states)} pages, or None")
    ok = np.ones(len(states), dtype=bool) if settled is None else np.asarray(settled)
    if ok.dtype != bool or ok.shape != states.shape:
        raise InvalidArgumentError(f"settled must be one bool per page, got {getattr(ok, 'dtype', ok)!r}",
                                   value=settled, expected=f"a bool array of {len(states)} pages, or None")
    if isinstance(address, bool) or not isinstance(address, int) or address < 0 or address % PAGE_SIZE:
        raise InvalidArgumentError(f"address must be page-aligned, got {address!r}", value=address,
                                   expected=f"a non-negative multiple of {PAGE_SIZE}")
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise InvalidArgumentError(f"gpus must be the number of GPUs, at least 1, got {gpus!r}", value=gpus,
                                   expected="an int >= 1")
    if not (changes(states, host, rm, gpus=gpus) & ok).any():
        return Reconciliation(pages=len(states))
    new = np.where(ok, host_truth(states, host, rm, gpus=gpus), states)
    on_host = (states & HOST) != 0
    left = on_host & ~host & ok
    came = host & ~on_host & ok
    first_touch = came & (states == 0)
    dropped = left & (gpu_bits(states) != 0)   # other copies were known: the host's went, nothing moved
    changed = new != states
    parts = [moves(states, new, address=address, cause=MigrationCause.INFERRED, alloc_id=alloc_id, start=now,
                   end=now),
             _records(first_touch, EventKind.CPU_PAGE_FAULT, flags=AccessType.UNKNOWN, address=address,
                      alloc_id=alloc_id, now=now),
             _records(changed, EventKind.RESIDENCY, value=new, address=address, alloc_id=alloc_id, now=now)]
    events = np.concatenate(parts)
    return Reconciliation(pages=len(states), htod=int((left & ~dropped).sum()), dtoh=int((came & ~first_touch).sum()),
                          first_touch=int(first_touch.sum()), host_copy_dropped=int(dropped.sum()),
                          learned=int((changed & ~left & ~came).sum()), events=events)
