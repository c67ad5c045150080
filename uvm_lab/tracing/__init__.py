"""Observing the real device: the host-residency oracle (and, later, CUPTI's unified-memory counters)."""

from .pagemap import host_resident

__all__ = ["host_resident"]
