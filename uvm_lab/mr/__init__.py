"""Memory resources with RMM's names and semantics: ``ul.mr.ManagedMemoryResource()`` and friends."""

from .arena import ArenaMemoryResource
from .base import MemoryResource, ResourceAdaptor, resource_chain
from .binning import BinningMemoryResource
from .callback import CallbackMemoryResource
from .cuda_async import CudaAsyncMemoryResource
from .current import (
    available_device_memory,
    get_current_device_resource,
    get_per_device_resource,
    is_initialized,
    set_current_device_resource,
    set_per_device_resource,
)
from .device import CudaMemoryResource, PinnedHostMemoryResource
from .failure_callback import FailureCallbackResourceAdaptor
from .fixed_size import FixedSizeMemoryResource
from .limiting import LimitingResourceAdaptor
from .logging import LoggingResourceAdaptor
from .managed import ManagedMemoryResource
from .pool import PoolMemoryResource
from .prefetch import PrefetchResourceAdaptor
from .reinitialize import register_reinitialize_hook, reinitialize, unregister_reinitialize_hook
from .statistics import StatisticsResourceAdaptor
from .system import SamHeadroomMemoryResource, SystemMemoryResource
from .tracking import TrackingResourceAdaptor

__all__ = [
    "ArenaMemoryResource",
    "BinningMemoryResource",
    "CallbackMemoryResource",
    "CudaAsyncMemoryResource",
    "CudaMemoryResource",
    "FailureCallbackResourceAdaptor",
    "FixedSizeMemoryResource",
    "LimitingResourceAdaptor",
    "LoggingResourceAdaptor",
    "ManagedMemoryResource",
    "MemoryResource",
    "PinnedHostMemoryResource",
    "PoolMemoryResource",
    "PrefetchResourceAdaptor",
    "ResourceAdaptor",
    "SamHeadroomMemoryResource",
    "StatisticsResourceAdaptor",
    "SystemMemoryResource",
    "TrackingResourceAdaptor",
    "available_device_memory",
    "get_current_device_resource",
    "get_per_device_resource",
    "is_initialized",
    "register_reinitialize_hook",
    "reinitialize",
    "resource_chain",
    "set_current_device_resource",
    "set_per_device_resource",
    "unregister_reinitialize_hook",
]
