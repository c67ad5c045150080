"""Events: one record dtype for everything that happens to memory, a bus, recorded traces, and the line of user
code each event came from (:mod:`.sources`)."""

from .bus import EventBus, HistoryReader, Subscription, get_bus, new_alloc_id
from .schema import (
    EVENT_DTYPE,
    INFERRED_BIT,
    PREFETCH_IMPLIES_MOVES,
    AccessType,
    Advice,
    EventKind,
    MemoryKind,
    MigrationCause,
    RemoteMapCause,
    UnobservedCause,
    as_events,
    is_inferred,
    make_events,
    record_of,
)

__all__ = [
    "EVENT_DTYPE",
    "INFERRED_BIT",
    "PREFETCH_IMPLIES_MOVES",
    "AccessType",
    "Advice",
    "EventBus",
    "EventKind",
    "HistoryReader",
    "MemoryKind",
    "MigrationCause",
    "RemoteMapCause",
    "Subscription",
    "UnobservedCause",
    "as_events",
    "get_bus",
    "is_inferred",
    "make_events",
    "new_alloc_id",
    "record_of",
]
