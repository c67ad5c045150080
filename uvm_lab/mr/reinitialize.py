"""Rebuild every device's resource in one call: RMM's ``rmm.reinitialize``.

For each device in ``devices`` the chain is built bottom-up, as RMM builds it::

    ManagedMemoryResource() if managed_memory else CudaMemoryResource()
      -> PoolMemoryResource(..., initial_pool_size, maximum_pool_size)   if pool_allocator
      -> LoggingResourceAdaptor(..., log_file_name with ".dev<id>")      if logging

and made that device's resource (:func:`~uvm_lab.mr.current.set_per_device_resource`). Hooks
registered with :func:`register_reinitialize_hook` run first, the last registered first.

Every argument is checked, and every device's chain is built, before any device's resource is
replaced: a failure leaves the per-device resources as they were.

Differences from RMM: pool sizes given without ``pool_allocator=True`` are an error (RMM ignores
them), and the per-device chains are made on the current backend's current device (see the
note on multi-GPU in the lead's backend).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from numbers import Integral
from typing import Any

from ..backends import get_backend
from ..errors import InvalidArgumentError
from ..paths import file_path
from .base import MemoryResource
from .current import set_per_device_resource
from .device import CudaMemoryResource
from .logging import LOG_FILE_ENV, LoggingResourceAdaptor
from .managed import ManagedMemoryResource
from .pool import PoolMemoryResource

__all__ = ["register_reinitialize_hook", "reinitialize", "unregister_reinitialize_hook"]

_hooks: list[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = []


def register_reinitialize_hook(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Callable[..., Any]:
    """Call ``func(*args, **kwargs)`` at the start of every :func:`reinitialize` (to drop caches
    that hold memory from the old resources). Returns ``func``, so it also works as a decorator."""
    if not callable(func):
        raise InvalidArgumentError(f"func must be callable, got {func!r}", value=func, expected="a callable")
    _hooks.append((func, args, kwargs))
    return func


def unregister_reinitialize_hook(func: Callable[..., Any]) -> None:
    """Remove every registration of ``func``."""
    _hooks[:] = [h for h in _hooks if h[0] != func]


def _bool(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgumentError(f"{name} must be a bool, got {value!r}", value=value, expected="True or False")
    return value


def _devices(devices: object, count: int) -> list[int]:
    expected = f"a device ordinal 0..{count - 1} or a list of them"
    items = [devices] if isinstance(devices, (Integral, bool)) else devices
    if isinstance(items, (str, bytes)) or not isinstance(items, Sequence) or not items:
        raise InvalidArgumentError(f"devices must be an int or a non-empty list of ints, got {devices!r}",
                                   value=devices, expected=expected)
    out: list[int] = []
    for d in items:
        if isinstance(d, bool) or not isinstance(d, Integral) or not 0 <= int(d) < count:
            raise InvalidArgumentError(f"devices must name devices 0..{count - 1}, got {d!r} in {devices!r}",
                                       value=devices, expected=expected)
        if int(d) in out:
            raise InvalidArgumentError(f"devices names device {d} twice: {devices!r}", value=devices,
                                       expected="each device once")
        out.append(int(d))
    return out


def _log_name(base: str, device: int) -> str:
    """RMM's ``_append_id``: ``rmm_log.csv`` on device 0 -> ``rmm_log.dev0.csv``."""
    root, ext = os.path.splitext(base)
    return f"{root}.dev{device}{ext}"


def reinitialize(pool_allocator: bool = False, managed_memory: bool = False,
                 initial_pool_size: int | str | None = None, maximum_pool_size: int | str | None = None,
                 devices: int | Sequence[int] = 0, logging: bool = False,
                 log_file_name: str | os.PathLike[str] | None = None) -> None:
    """Build a fresh resource chain for each of ``devices`` and make it that device's resource.

    Parameters
    ----------
    pool_allocator
        Put a :class:`~uvm_lab.mr.pool.PoolMemoryResource` over the base resource.
    managed_memory
        Base the chain on :class:`~uvm_lab.mr.managed.ManagedMemoryResource` (unified memory)
        rather than :class:`~uvm_lab.mr.device.CudaMemoryResource`.
    initial_pool_size, maximum_pool_size
        The pool's sizes (ints or strings such as ``"1GiB"``); only with ``pool_allocator=True``.
    devices
        A device ordinal or a list of them (default: device 0).
    logging
        Put a :class:`~uvm_lab.mr.logging.LoggingResourceAdaptor` on top, writing
        ``log_file_name`` (or ``$RMM_LOG_FILE``) with ``.dev<id>`` before the extension.
    log_file_name
        The log's base name; only with ``logging=True``.

    Raises
    ------
    InvalidArgumentError
        A flag that is not a bool, a device that does not exist, pool sizes without a pool, a log
        file without logging, or logging with no file name.
    InvalidSizeError, OutOfMemoryError
        From the pool (a bad size, or an initial size the device cannot hold).
    """
    pool = _bool(pool_allocator, "pool_allocator")
    managed = _bool(managed_memory, "managed_memory")
    log = _bool(logging, "logging")
    backend = get_backend()
    devs = _devices(devices, backend.device_count())
    if not pool and (initial_pool_size is not None or maximum_pool_size is not None):
        raise InvalidArgumentError(
            "initial_pool_size and maximum_pool_size size a pool: pass pool_allocator=True as well, or leave "
            "them None", value=(initial_pool_size, maximum_pool_size), expected="None without pool_allocator=True")
    if log_file_name is not None and not log:
        raise InvalidArgumentError("log_file_name names the log of logging=True: pass logging=True as well, "
                                   "or leave it None", value=log_file_name, expected="None without logging=True")
    base_name: str | None = None
    if log:
        name = log_file_name if log_file_name is not None else os.environ.get(LOG_FILE_ENV) or None
        if name is None:
            raise InvalidArgumentError(
                f"logging=True needs a file: pass log_file_name= or set {LOG_FILE_ENV}", value=None,
                expected="a file name")
        base_name = file_path(name, name="log_file_name", expected="a str or os.PathLike file name")

    for func, args, kwargs in reversed(_hooks):
        func(*args, **kwargs)

    built: dict[int, MemoryResource] = {}
    for device in devs:
        mr: MemoryResource = ManagedMemoryResource(device=device) if managed else CudaMemoryResource(device=device)
        if pool:
            mr = PoolMemoryResource(mr, initial_pool_size=initial_pool_size, maximum_pool_size=maximum_pool_size)
        if base_name is not None:
            mr = LoggingResourceAdaptor(mr, log_file_name=_log_name(base_name, device))
        built[device] = mr
    for device, mr in built.items():
        set_per_device_resource(device, mr)
