"""Events: one record dtype for everything that happens to memory, a bus, and recorded traces."""

from .bus import EventBus, Subscription, get_bus, new_alloc_id
from .schema import (
    EVENT_DTYPE,
    AccessType,
    Advice,
    EventKind,
    MemoryKind,
    MigrationCause,
    RemoteMapCause,
    make_events,
    record_of,
)

__all__ = [
    "EVENT_DTYPE",
    "AccessType",
    "Advice",
    "EventBus",
    "EventKind",
    "MemoryKind",
    "MigrationCause",
    "RemoteMapCause",
    "Subscription",
    "get_bus",
    "make_events",
    "new_alloc_id",
    "record_of",
]
