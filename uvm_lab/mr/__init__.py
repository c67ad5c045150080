"""Memory resources with RMM's names and semantics: ``ul.mr.ManagedMemoryResource()`` and friends."""

from .base import MemoryResource, ResourceAdaptor, resource_chain
from .current import (
    get_current_device_resource,
    get_per_device_resource,
    set_current_device_resource,
    set_per_device_resource,
)
from .device import CudaMemoryResource, PinnedHostMemoryResource
from .managed import ManagedMemoryResource
from .pool import PoolMemoryResource
from .prefetch import PrefetchResourceAdaptor
from .statistics import StatisticsResourceAdaptor

__all__ = [
    "CudaMemoryResource",
    "ManagedMemoryResource",
    "MemoryResource",
    "PinnedHostMemoryResource",
    "PoolMemoryResource",
    "PrefetchResourceAdaptor",
    "ResourceAdaptor",
    "StatisticsResourceAdaptor",
    "get_current_device_resource",
    "get_per_device_resource",
    "resource_chain",
    "set_current_device_resource",
    "set_per_device_resource",
]
