"""The one event record: CUPTI's ``UnifiedMemoryCounter3`` fields, plus allocator events.

Both backends emit arrays of :data:`EVENT_DTYPE`. The unified-memory kinds keep CUPTI's numbers
(``CUpti_ActivityUnifiedMemoryCounterKind``) and the ``flags`` field keeps CUPTI's meaning for each
kind: the migration cause for HtoD/DtoH, the access type for GPU faults, the remote-map cause for
REMOTE_MAP. Allocator events (numbered from 16) use ``flags`` as documented on :class:`EventKind`.

Fields
------
kind      EventKind
flags     per kind, see above (CPU faults: 0 = unknown, from CUPTI and the simulator alike)
src, dst  processor ids: a device ordinal, or -1 for the host
start,end nanoseconds on the backend's clock (simulated time on the simulator)
address   first byte concerned
bytes     extent in bytes (migrations: bytes moved; faults: the range serviced)
value     CUPTI's value: bytes for transfers, number of faults for fault records
alloc_id  the allocation the address belongs to (0 when unknown)
stream    stream handle (0 = default stream)
source    the line of user code it came from, an id in :mod:`uvm_lab.events.sources` (0 when unknown)
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np
from numba import typeof

from ..errors import InvalidArgumentError

__all__ = [
    "ACCESS_PART",
    "ACCESS_RUN",
    "ACCESS_STREAM",
    "ACCESS_UNIFORM",
    "EVENTS_TYPE",
    "EVENT_DTYPE",
    "EVENT_DTYPE_WITHOUT_SOURCE",
    "INFERRED_BIT",
    "PREFETCH_IMPLIES_MOVES",
    "AccessType",
    "Advice",
    "EventKind",
    "MemoryKind",
    "MigrationCause",
    "RemoteMapCause",
    "UnobservedCause",
    "as_events",
    "is_inferred",
    "make_events",
    "record_of",
]

EVENT_DTYPE = np.dtype([
    ("kind", np.uint8),
    ("flags", np.uint8),
    ("src", np.int16),
    ("dst", np.int16),
    ("start", np.uint64),
    ("end", np.uint64),
    ("address", np.uint64),
    ("bytes", np.uint64),
    ("value", np.uint64),
    ("alloc_id", np.uint64),
    ("stream", np.uint64),
    ("source", np.uint32),
])


#: An EVENT_DTYPE array as the compiled passes take it (one-dimensional, contiguous): their signatures name it, so
#: each is compiled once, when its module is imported (and cached), not at a first call in a view's thread.
EVENTS_TYPE = typeof(np.empty(0, EVENT_DTYPE))

#: The record before events carried their ``source``: traces saved then still load (:func:`as_events`).
EVENT_DTYPE_WITHOUT_SOURCE = np.dtype([field for field in EVENT_DTYPE.descr if field[0] != "source"])


def as_events(records: np.ndarray) -> np.ndarray:
    """``records`` as ``EVENT_DTYPE``: as they are, or converted from :data:`EVENT_DTYPE_WITHOUT_SOURCE` with every
    ``source`` 0 (unknown).

    Raises
    ------
    InvalidArgumentError
        ``records`` is not an array of either layout.
    """
    dtype = getattr(records, "dtype", None)
    if dtype == EVENT_DTYPE:
        return records
    if dtype != EVENT_DTYPE_WITHOUT_SOURCE:
        what = dtype if dtype is not None else type(records).__name__
        raise InvalidArgumentError(f"not uvm_lab event records: dtype {what}", value=records,
                                   expected="an array of uvm_lab.events.EVENT_DTYPE")
    out = np.zeros(records.shape, dtype=EVENT_DTYPE)
    for field in EVENT_DTYPE_WITHOUT_SOURCE.descr:
        out[field[0]] = records[field[0]]
    return out


class EventKind(IntEnum):
    # CUPTI unified-memory counter kinds, same numbers.
    HTOD = 1
    DTOH = 2
    CPU_PAGE_FAULT = 3
    GPU_PAGE_FAULT = 4
    THRASHING = 5
    THROTTLING = 6
    REMOTE_MAP = 7
    DTOD = 8
    # Allocator events.
    SEGMENT_ALLOC = 16   #: the backend mapped memory (cudaMallocManaged ...); flags = MemoryKind, dst = device
    SEGMENT_FREE = 17    #: the backend unmapped it
    ALLOC = 18           #: a memory resource handed out a buffer; value = requested size
    FREE = 19            #: a buffer went back to its resource
    ALLOC_FAILURE = 20   #: an allocation failed; bytes = requested size
    POOL_GROW = 21       #: a pool took ``bytes`` more from its upstream
    PREFETCH = 22        #: a prefetch was requested; dst = destination
    ADVICE = 23          #: memory advice was set; flags = Advice, dst = location (or -2 when none applies)
    # Driver events that CUPTI's counters do not carry (the UVM driver's own vocabulary).
    INVALIDATE = 24      #: copies on ``src`` dropped without a transfer (read-duplicate collapse, eviction of a copy)
    # What uvm_lab knows without a record of the driver's (a real GPU with tracing off).
    UNOBSERVED = 25      #: pages changed where nothing recorded it; flags = UnobservedCause, dst = the GPU at work
    RESIDENCY = 26       #: the pages' state, as inferred: value = the page state (uvm_lab.page_states)
    #: A modelled access (the simulator's, published only to a recording that asks: :mod:`uvm_lab.trace_replay`);
    #: src = the processor, flags = :class:`AccessType` and the ``ACCESS_*`` bits.
    ACCESS = 27

    @property
    def is_migration(self) -> bool:
        return self in (EventKind.HTOD, EventKind.DTOH, EventKind.DTOD)


class MigrationCause(IntEnum):
    """``CUpti_ActivityUnifiedMemoryMigrationCause``."""

    UNKNOWN = 0
    USER = 1             #: an explicit request: cudaMemPrefetchAsync
    COHERENCE = 2        #: to satisfy a page fault
    PREFETCH = 3         #: the driver's own speculative prefetch
    EVICTION = 4         #: to make room on a full GPU
    ACCESS_COUNTERS = 5  #: access-counter driven migration
    #: Not CUPTI's: a completed ``cudaMemPrefetchAsync`` whose migrations nothing measured; the backend
    #: publishes what it implies (USER, with the :data:`INFERRED_BIT`).
    USER_INFERRED = 0x81
    #: Not CUPTI's: no record of this migration arrived; the host's page tables show it happened
    #: (:func:`uvm_lab.tracing.reconcile`), for a reason they cannot tell.
    INFERRED = 255


#: Set in the ``flags`` of a migration that was inferred rather than measured (:func:`is_inferred`).
INFERRED_BIT = 0x80


def is_inferred(flags: int | np.ndarray) -> bool | np.ndarray:
    """Whether a migration's ``flags`` (its cause) mark it inferred rather than reported by the driver."""
    return (np.asarray(flags) & INFERRED_BIT) != 0 if isinstance(flags, np.ndarray) else bool(flags & INFERRED_BIT)


class UnobservedCause(IntEnum):
    """Why pages changed where no record shows it (the ``flags`` of an UNOBSERVED record)."""

    KERNEL = 1     #: a kernel on GPU ``dst`` accessed them (faults are not traced)
    COPY = 2       #: a copy on GPU ``dst``'s engines read or wrote them
    COLLAPSE = 3   #: ReadMostly was unset: the driver keeps one copy of each duplicated page, where it chooses
    HOST = 4       #: host code read (``value`` READ) or wrote (WRITE) them: they are on the host, a write's alone


#: A PREFETCH record's ``flags``: the prefetch completed and nothing measures its migrations, so the
#: map places every page at ``dst`` and the migrations it implies are published (cause USER_INFERRED).
PREFETCH_IMPLIES_MOVES = 1


class AccessType(IntEnum):
    """``CUpti_ActivityUnifiedMemoryAccessType``."""

    UNKNOWN = 0
    READ = 1
    WRITE = 2
    ATOMIC = 3
    PREFETCH = 4


#: An ACCESS record's ``flags``, besides its :class:`AccessType` (the low three bits). A range access (``touch``)
#: is one record: ``address`` and ``bytes`` its range. An access stream is a header (``ACCESS_STREAM``: ``address``
#: in-flight accesses, ``bytes`` bytes an access, ``value`` warps or 0 for the whole GPU, ``dst`` 1 for a launch,
#: ``ACCESS_UNIFORM`` where one mode applied to every access) and then its accesses as runs of consecutive pages
#: (``ACCESS_RUN``; ``ACCESS_PART`` on the first of each part the simulator ran), each of one access type.
ACCESS_UNIFORM = 0x08
ACCESS_STREAM = 0x10
ACCESS_PART = 0x20
ACCESS_RUN = 0x40


class RemoteMapCause(IntEnum):
    """``CUpti_ActivityUnifiedMemoryRemoteMapCause``."""

    UNKNOWN = 0
    COHERENCE = 1
    THRASHING = 2
    POLICY = 3
    OUT_OF_MEMORY = 4
    EVICTION = 5


class MemoryKind(IntEnum):
    """What a segment is, in the ``flags`` of SEGMENT_ALLOC."""

    DEVICE = 1       #: cudaMalloc: on the GPU, never migrates
    MANAGED = 2      #: cudaMallocManaged: migrates page by page
    PINNED_HOST = 3  #: cudaHostAlloc: on the host, GPU-accessible


class Advice(IntEnum):
    """``cudaMemoryAdvise``, same numbers."""

    SET_READ_MOSTLY = 1
    UNSET_READ_MOSTLY = 2
    SET_PREFERRED_LOCATION = 3
    UNSET_PREFERRED_LOCATION = 4
    SET_ACCESSED_BY = 5
    UNSET_ACCESSED_BY = 6


#: ``dst`` for events where no processor applies.
NO_PROCESSOR = -2


def record_of(kind: int, *, flags: int = 0, src: int = 0, dst: int = 0, start: int = 0, end: int = 0,
              address: int = 0, nbytes: int = 0, value: int | None = None, alloc_id: int = 0,
              stream: int = 0, source: int = 0) -> np.ndarray:
    """A one-record array, built straight from a tuple (the allocator's hot path)."""
    return np.array([(kind, flags, src, dst, start, end, address, nbytes, nbytes if value is None else value,
                      alloc_id, stream, source)], dtype=EVENT_DTYPE)


def make_events(n: int = 1, **fields: object) -> np.ndarray:
    """An array of ``n`` zeroed records with ``fields`` set (scalars broadcast, arrays per record)."""
    out = np.zeros(n, dtype=EVENT_DTYPE)
    for name, value in fields.items():
        out[name] = value
    return out
