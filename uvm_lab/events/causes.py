"""Why each event happened, as one of a few causes a view can colour: the timeline's legend.

CUPTI spreads the reason for a record over ``kind`` and ``flags`` (a migration's cause, a fault's access
type, a remote map's cause); a reader wants one answer per record. :func:`cause_codes` gives it, for a
whole array at once, as an index into :data:`CAUSE_NAMES`.

- ``demand fault``: a page fault, or a migration made to satisfy one (CUPTI's COHERENCE cause).
- ``prefetch``: a prefetch request, a migration it made, or the driver's own speculative prefetch.
- ``eviction``: a migration that made room on a full GPU.
- ``coherence``: copies dropped without a transfer: a ReadMostly collapse, a duplicate's eviction.
- ``thrashing``: the driver's thrashing and throttling records.
- ``remote map``: pages mapped rather than moved, and access-counter migrations of mapped pages.
- ``inferred``: what uvm_lab knows without a driver record (a completed prefetch's implied moves, the
  host's page tables), and migrations whose cause the driver left unknown.
- ``allocation``: segments and buffers made, freed, failed; pools grown.
- ``advice``: memory advice set or unset.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Final

import numpy as np
from numba import njit, types

from ..errors import InvalidArgumentError
from .schema import (
    EVENT_DTYPE,
    EVENTS_TYPE,
    INFERRED_BIT,
    AccessType,
    Advice,
    EventKind,
    MemoryKind,
    MigrationCause,
    RemoteMapCause,
    UnobservedCause,
)

__all__ = ["CAUSE_NAMES", "cause_codes", "decode_flags"]

CAUSE_NAMES: Final = ("demand fault", "prefetch", "eviction", "coherence", "thrashing", "remote map",
                      "inferred", "allocation", "advice")

_FAULT, _PREFETCH, _EVICTION, _COHERENCE, _THRASHING, _REMOTE, _INFERRED, _ALLOCATION, _ADVICE = range(9)

# A migration's cause (its flags), for the causes CUPTI names; anything else is inferred.
_MIGRATION = np.full(256, _INFERRED, dtype=np.uint8)
_MIGRATION[MigrationCause.USER] = _PREFETCH
_MIGRATION[MigrationCause.COHERENCE] = _FAULT
_MIGRATION[MigrationCause.PREFETCH] = _PREFETCH
_MIGRATION[MigrationCause.EVICTION] = _EVICTION
_MIGRATION[MigrationCause.ACCESS_COUNTERS] = _REMOTE

# Every other kind has one cause whatever its flags (UNOBSERVED's collapse is the one exception, below).
_BY_KIND = np.full(256, _INFERRED, dtype=np.uint8)
_BY_KIND[[EventKind.CPU_PAGE_FAULT, EventKind.GPU_PAGE_FAULT]] = _FAULT
_BY_KIND[[EventKind.THRASHING, EventKind.THROTTLING]] = _THRASHING
_BY_KIND[EventKind.REMOTE_MAP] = _REMOTE
_BY_KIND[EventKind.PREFETCH] = _PREFETCH
_BY_KIND[EventKind.ADVICE] = _ADVICE
_BY_KIND[EventKind.INVALIDATE] = _COHERENCE
_BY_KIND[[EventKind.SEGMENT_ALLOC, EventKind.SEGMENT_FREE, EventKind.ALLOC, EventKind.FREE,
          EventKind.ALLOC_FAILURE, EventKind.POOL_GROW]] = _ALLOCATION

_MIGRATIONS = np.zeros(256, dtype=bool)
_MIGRATIONS[[EventKind.HTOD, EventKind.DTOH, EventKind.DTOD]] = True
# UNOBSERVED's collapse is a coherence; the numbers the compiled pass (_codes) compares with.
_RULE = (INFERRED_BIT, _INFERRED, int(EventKind.UNOBSERVED), int(UnobservedCause.COLLAPSE), _COHERENCE)


def cause_codes(records: np.ndarray) -> np.ndarray:
    """Each record's cause, as a ``uint8`` index into :data:`CAUSE_NAMES`."""
    if not isinstance(records, np.ndarray) or records.dtype != EVENT_DTYPE:
        raise InvalidArgumentError("records must be an EVENT_DTYPE array", value=records,
                                   expected="a numpy array of uvm_lab.events.EVENT_DTYPE")
    out = np.empty(records.shape, dtype=np.uint8)
    _codes(np.ascontiguousarray(records).reshape(-1), _BY_KIND, _MIGRATIONS, _MIGRATION, _RULE, out.reshape(-1))
    return out


@njit((EVENTS_TYPE, types.uint8[::1], types.bool_[::1], types.uint8[::1], types.UniTuple(types.int64, 5),
       types.uint8[::1]), cache=True)
def _codes(records: np.ndarray, by_kind: np.ndarray, migrations: np.ndarray, migration: np.ndarray,
           rule: tuple[int, int, int, int, int], out: np.ndarray) -> None:
    # One pass, compiled: a live view reads in every record a loop publishes. The tables and numbers come in as
    # arguments: numba would freeze globals into its cache, stale once they change.
    inferred_bit, inferred, unobserved, collapse, coherence = rule
    for i in range(len(records)):
        kind, flags = records[i].kind, records[i].flags
        if migrations[kind]:   # an inferred migration is inferred whatever cause it was inferred for
            out[i] = inferred if flags & inferred_bit else migration[flags]
        elif kind == unobserved and flags == collapse:
            out[i] = coherence
        else:
            out[i] = by_kind[kind]


# What a record's ``flags`` mean, by kind: (its cause's enum, or its detail's enum). CUPTI's flags are a
# different enum for each kind.
_CAUSE_ENUM: dict[int, type[IntEnum]] = {
    **{int(k): MigrationCause for k in (EventKind.HTOD, EventKind.DTOH, EventKind.DTOD)},
    int(EventKind.REMOTE_MAP): RemoteMapCause,
    int(EventKind.UNOBSERVED): UnobservedCause,
}
_DETAIL_ENUM: dict[int, type[IntEnum]] = {
    int(EventKind.GPU_PAGE_FAULT): AccessType, int(EventKind.CPU_PAGE_FAULT): AccessType,
    int(EventKind.ADVICE): Advice,
    int(EventKind.SEGMENT_ALLOC): MemoryKind, int(EventKind.SEGMENT_FREE): MemoryKind,
}


def decode_flags(kind: int, flags: int) -> tuple[IntEnum | None, IntEnum | None]:
    """``(cause, detail)``: what one record's ``flags`` say, as the enum member of its kind (a migration's or
    remote map's cause; a fault's access type, an advice, a segment's memory kind), None where they say
    nothing or hold a number its enum lacks. A PREFETCH record's flags say whether it completed unmeasured
    (:data:`~.schema.MigrationCause.USER_INFERRED`)."""
    if kind == EventKind.PREFETCH:
        return (MigrationCause.USER_INFERRED if flags else MigrationCause.USER), None
    if kind == EventKind.ACCESS:   # its access type, beside the bits that say how it was recorded
        return None, AccessType._value2member_map_.get(flags & 0x07)   # type: ignore[return-value]
    cause_enum, detail_enum = _CAUSE_ENUM.get(kind), _DETAIL_ENUM.get(kind)
    cause = cause_enum._value2member_map_.get(flags) if cause_enum else None
    detail = detail_enum._value2member_map_.get(flags) if detail_enum else None
    return cause, detail   # type: ignore[return-value]
