"""The simulated device: a page-level model of the UVM driver with a cost model.

Its fault path, every driver rule and cost term, is :mod:`.core`, compiled by numba on first use and kept in
numba's cache; :func:`prepare` compiles it ahead of that first use (about half a minute, once per install).
"""

from .backend import SimBackend
from .platform import PLATFORMS, Platform, get_platform

__all__ = ["PLATFORMS", "Platform", "SimBackend", "get_platform", "prepare"]


def prepare() -> None:
    """Compile the simulator's core, or load it from numba's cache where it was compiled before: a few calls on a
    private simulated device, one for each of the core's entry points."""
    from ...events.bus import EventBus
    from ...events.schema import Advice, MemoryKind
    from ...location import Location

    b = SimBackend(device_memory="8MiB", bus=EventBus())
    gpu, host = Location.device(0), Location.host()
    managed = b.allocate(6 << 20, MemoryKind.MANAGED)
    b.access(managed, 6 << 20, gpu, "write")            # faults, and evictions on an 8 MiB device
    b.access(managed, 1 << 20, host, "read")
    b.advise(managed, 1 << 20, Advice.SET_READ_MOSTLY, None)
    b.prefetch(managed, 1 << 20, gpu)                    # a user migration
    b.advise(managed, 1 << 20, Advice.UNSET_READ_MOSTLY, None)
    b.free(b.allocate(2 << 20, MemoryKind.DEVICE))       # room made for memory that cannot be evicted
    b.free(managed)
