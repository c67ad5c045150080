"""The simulated device: a page-level model of the UVM driver with a cost model."""

from .backend import SimBackend
from .platform import PLATFORMS, Platform, get_platform

__all__ = ["PLATFORMS", "Platform", "SimBackend", "get_platform"]
