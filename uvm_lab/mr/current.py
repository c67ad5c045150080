"""The current device resource, per device, as RMM's ``set_current_device_resource``.

uvm_lab's default is :class:`ManagedMemoryResource` rather than RMM's ``CudaMemoryResource``:
unified memory is what this library is for, so a plain ``DeviceBuffer(size=...)`` can be prefetched,
advised and watched page by page.
"""

from __future__ import annotations

import threading

from ..backends import get_backend, has_backend
from ..errors import InvalidArgumentError
from ..location import Location
from .base import MemoryResource
from .managed import ManagedMemoryResource

__all__ = [
    "available_device_memory",
    "get_current_device_resource",
    "get_per_device_resource",
    "is_initialized",
    "set_current_device_resource",
    "set_per_device_resource",
]

_resources: dict[int, MemoryResource] = {}
_lock = threading.Lock()


def _device(device: object) -> int:
    backend = get_backend()
    loc = Location.parse(device, device_count=backend.device_count(), name="device")
    if loc.is_host:
        raise InvalidArgumentError("device resources are per GPU; got the host", value=device,
                                   expected=f"a device ordinal 0..{backend.device_count() - 1}")
    return loc.id


def get_per_device_resource(device: int) -> MemoryResource:
    """The resource that ``DeviceBuffer`` uses on ``device`` (made on first use)."""
    backend = get_backend()
    if type(device) is int:   # the allocators' hot path: a device that has its resource already, nothing to parse
        mr = _resources.get(device)
        if mr is not None and mr.backend is backend:
            return mr
    dev = _device(device)
    with _lock:
        mr = _resources.get(dev)
        if mr is None or mr.backend is not backend:   # a new backend starts with a fresh default
            mr = _resources[dev] = ManagedMemoryResource(device=dev)
        return mr


def set_per_device_resource(device: int, mr: MemoryResource) -> None:
    """Make ``mr`` the resource for ``device``."""
    dev = _device(device)
    if not isinstance(mr, MemoryResource):
        raise InvalidArgumentError(f"mr must be a uvm_lab memory resource, got {mr!r} ({type(mr).__name__})",
                                   value=mr, expected="a uvm_lab.mr.MemoryResource")
    if mr.backend is not get_backend():
        raise InvalidArgumentError(f"{mr!r} was made on another backend ({mr.backend!r}); make it again after "
                                   f"use_backend()", value=mr, expected="a resource of the current backend")
    if mr.device_id >= 0 and mr.device_id != dev:   # host memory (pinned) may serve any device
        raise InvalidArgumentError(f"{mr!r} allocates on device {mr.device_id}, not device {dev}; make it with "
                                   f"device={dev}", value=mr, expected=f"a resource made with device={dev}")
    with _lock:
        _resources[dev] = mr


def get_current_device_resource() -> MemoryResource:
    """The resource for the current device."""
    return get_per_device_resource(get_backend().current_device())


def set_current_device_resource(mr: MemoryResource) -> None:
    """Make ``mr`` the resource for the current device."""
    set_per_device_resource(get_backend().current_device(), mr)


def is_initialized() -> bool:
    """Whether uvm_lab is ready to allocate: a backend is current, so every device has its resource (the one set,
    or the default made on first use).

    Where uvm_lab differs: RMM answers whether every per-device resource has been made, which after import it
    always has. uvm_lab picks its device (``use_backend``) on first use, so before a backend is chosen this is
    False; ``use_backend``, ``get_backend``, :func:`~uvm_lab.mr.reinitialize` or the first allocation make it True.
    """
    return has_backend()


def available_device_memory() -> tuple[int, int]:
    """``(free, total)`` bytes of the current device's memory, as RMM's ``available_device_memory``
    (``cudaMemGetInfo``; the simulated device's on the simulator)."""
    free, total = get_backend().mem_info()
    return int(free), int(total)
