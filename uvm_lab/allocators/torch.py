"""PyTorch's CUDA tensors in uvm_lab memory, as RMM's ``rmm.allocators.torch``. Two ways in:

**Every CUDA allocation of the process** (RMM's way), before torch makes its first CUDA tensor::

    from uvm_lab.allocators.torch import uvm_lab_torch_allocator
    torch.cuda.memory.change_current_allocator(uvm_lab_torch_allocator)

torch then asks the current uvm_lab device resource for each tensor's memory, and frees it there. torch's
pluggable allocators keep no statistics: ``torch.cuda.memory_stats()`` raises, and :func:`memory_stats` here
gives torch's keys for what torch holds from uvm_lab.

**Some allocations, behind torch's caching allocator** (which keeps ``torch.cuda.memory_stats()`` whole)::

    pool = uvm_lab.allocators.torch.mem_pool()
    with torch.cuda.use_mem_pool(pool):
        model = MLP().cuda()

torch asks uvm_lab for segments (2 MiB and more) and carves its tensors out of them, as it does from
``cudaMalloc``; it keeps them cached until ``torch.cuda.empty_cache()`` or the pool's end.

Either way each allocation is a :class:`~uvm_lab.DeviceBuffer` from ``get_per_device_resource(device)``, so it is
an event charged to the line of user code that made torch allocate, counted in the statistics, and mapped page
by page like any buffer (labelled ``"torch"``, or ``"torch segment"`` in a pool, until
:func:`uvm_lab.torch.label` names it after the parameters and buffers in it). :func:`buffer_at` finds the buffer
under a tensor's address.

torch loads allocators from a shared library by function name: ``shim/torch_shim.cpp``, built with the package
where a C++ compiler is present, whose functions call back into this module (with the GIL, through ctypes).
Importing this module needs neither torch nor the library; making an allocator without either, or on the
simulator (whose memory torch cannot use), raises :class:`~uvm_lab.errors.BackendError` saying what is missing.
"""

from __future__ import annotations

import ctypes
import sysconfig
import threading
import warnings
from bisect import bisect_right
from pathlib import Path
from typing import Any

from .. import deferred
from ..backends import get_backend
from ..buffer import DeviceBuffer
from ..errors import BackendError, InvalidArgumentError, shown
from ..mr.current import get_per_device_resource
from .lent import lent_buffer

# Also ``uvm_lab_torch_allocator``, RMM's module attribute, made when first asked for (``__getattr__``).
__all__ = ["SHIM", "allocations", "buffer_at", "mem_pool", "memory_stats", "torch_allocator"]

#: The shared library torch loads the allocator's functions from (built with the package, see the notes above).
SHIM = Path(__file__).with_name("shim") / ("libuvm_lab_torch" + (sysconfig.get_config_var("SHLIB_SUFFIX") or ".so"))
#: The functions in it: allocate for ``change_current_allocator``, allocate for a ``MemPool``, and free.
MALLOC, POOL_MALLOC, FREE = "uvm_lab_torch_malloc", "uvm_lab_torch_pool_malloc", "uvm_lab_torch_free"

_ALLOC_HOOK = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
                               ctypes.c_void_p, ctypes.c_size_t)
_FREE_HOOK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p)

_held: dict[int, tuple[DeviceBuffer, int]] = {}   # by address: what torch holds from uvm_lab now, and if pooled
_starts: list[int] | None = None   # _held's addresses in order, for buffer_at; None once they change
_lock = threading.Lock()
# torch.cuda.memory_stats()'s counters, each [current, peak, allocated, freed]: segments and reserved bytes are
# every buffer torch holds; allocations are those it made tensors of directly (a pool's tensors are torch's own).
_counts = {key: [0, 0, 0, 0] for key in ("segment", "reserved_bytes", "allocation", "allocated_bytes")}


def _allocate(size: int, device: int, stream: int | None, pooled: int, error: int | None, error_size: int) -> int:
    """torch's allocate, through the shim: a buffer from the device's resource, its address (0 on failure, with
    the reason written to ``error`` for the shim to raise or torch to report as out of memory)."""
    global _starts
    if size == 0:
        return 0   # as cudaMalloc(0): nothing to hold
    try:
        buffer = lent_buffer(size, mr=get_per_device_resource(device), stream=stream or None, device=device,
                             label="torch segment" if pooled else "torch")
    except Exception as exc:   # nothing may cross back into C++
        if error:
            message = f"uvm_lab could not allocate {size} bytes on cuda:{device} for torch: {exc}".encode()
            ctypes.memmove(error, message, min(len(message), error_size - 1))
        return 0
    with _lock:
        _held[buffer.ptr] = (buffer, pooled)
        _starts = None
        _count(+1, size, pooled)
    return buffer.ptr


def _free(ptr: int | None, size: int, device: int, stream: int | None) -> None:
    """torch's free, through the shim. The memory goes back to its resource soon after, on a thread that holds
    no uvm_lab lock (torch may free from a collector that runs inside one): see :mod:`uvm_lab.deferred`."""
    global _starts
    if not ptr:
        return
    with _lock:
        buffer, pooled = _held.pop(ptr, (None, 0))
        if buffer is not None:
            _starts = None
            _count(-1, buffer.size, pooled)
    if buffer is None:
        warnings.warn(f"torch freed {ptr:#x} ({size} bytes), which uvm_lab's allocator did not give it",
                      RuntimeWarning, stacklevel=1)
        return
    deferred.defer(buffer.close)


def _count(sign: int, size: int, pooled: int) -> None:
    """Count an allocation (``sign`` +1) or a free (-1) of ``size`` bytes (call with the lock held)."""
    _bump(_counts["segment"], sign, 1)
    _bump(_counts["reserved_bytes"], sign, size)
    if not pooled:
        _bump(_counts["allocation"], sign, 1)
        _bump(_counts["allocated_bytes"], sign, size)


def _bump(counts: list[int], sign: int, amount: int) -> None:
    if sign > 0:
        counts[0] += amount
        counts[2] += amount
        if counts[0] > counts[1]:
            counts[1] = counts[0]
    else:
        counts[0] -= amount
        counts[3] += amount


# ctypes keeps no reference to a callback it hands to C: these must live as long as the process.
_hooks = (_ALLOC_HOOK(_allocate), _FREE_HOOK(_free))
_library: ctypes.CDLL | None = None
_allocators: dict[str, Any] = {}


def shim() -> ctypes.CDLL:
    """The loaded shim, its callbacks set to this module's (the same library torch loads by path)."""
    global _library
    if _library is None:
        if not SHIM.is_file():
            raise BackendError(f"uvm_lab's torch allocator needs its shim, {SHIM.name}, which was not built with "
                               f"this install (it needs a C++ compiler): install a C++ compiler (g++), then "
                               f"reinstall uvm_lab")
        library = ctypes.CDLL(str(SHIM))
        library.uvm_lab_torch_set_hooks(*_hooks)
        _library = library
    return _library


def _torch() -> Any:
    try:
        import torch
    except ImportError as exc:
        raise BackendError("PyTorch is not installed here: uvm_lab's torch allocator needs a CUDA build of "
                           "torch and a GPU (pip install 'uvm_lab[torch]')") from exc
    if get_backend().is_simulated:
        raise BackendError("torch's CUDA allocator needs a real GPU; the current uvm_lab backend is the simulator "
                           "(on the simulator, uvm_lab.torch.manage makes managed CPU tensors)")
    if not torch.cuda.is_available():
        raise BackendError(f"this torch ({torch.__version__}) has no CUDA device: the allocator feeds torch's "
                           f"CUDA tensors")
    return torch


def _pluggable(malloc: str) -> Any:
    torch = _torch()
    with _lock:
        if malloc not in _allocators:
            shim()
            _allocators[malloc] = torch.cuda.memory.CUDAPluggableAllocator(str(SHIM), malloc, FREE)
        return _allocators[malloc]


def torch_allocator() -> Any:
    """The allocator for ``torch.cuda.memory.change_current_allocator`` (also ``uvm_lab_torch_allocator``): one
    for the process, as torch allows one current allocator.

    Raises
    ------
    BackendError
        torch (a CUDA build), a GPU, or the shim is missing, or the current backend is the simulator.
    """
    return _pluggable(MALLOC)


def mem_pool(*, use_on_oom: bool = False) -> Any:
    """A new ``torch.cuda.MemPool`` whose segments come from uvm_lab (``with torch.cuda.use_mem_pool(pool):``).

    Raises
    ------
    InvalidArgumentError
        ``use_on_oom`` is not True or False.
    BackendError
        As :func:`torch_allocator`.
    """
    if not isinstance(use_on_oom, bool):
        raise InvalidArgumentError(f"use_on_oom must be True or False, got {shown(use_on_oom)}", value=use_on_oom,
                                   expected="True or False")
    allocator = _pluggable(POOL_MALLOC)
    return _torch().cuda.MemPool(allocator.allocator(), use_on_oom=use_on_oom)


def allocations() -> list[DeviceBuffer]:
    """The buffers torch holds from uvm_lab now, by address."""
    with _lock:
        return [_held[ptr][0] for ptr in sorted(_held)]


def buffer_at(address: int) -> DeviceBuffer | None:
    """The buffer torch holds from uvm_lab that ``address`` (a tensor's ``data_ptr()``) falls in, or None."""
    if not isinstance(address, int) or isinstance(address, bool) or address < 0:
        raise InvalidArgumentError(f"address must be a non-negative int, got {shown(address)}", value=address,
                                   expected="a non-negative int, such as tensor.data_ptr()")
    global _starts
    with _lock:
        if _starts is None:   # sorted again only after torch allocated or freed: label() asks once a tensor
            _starts = sorted(_held)
        starts = _starts
        at = bisect_right(starts, address) - 1
        buffer = _held[starts[at]][0] if at >= 0 else None
    return buffer if buffer is not None and address < buffer.ptr + buffer.size else None


def memory_stats() -> dict[str, int]:
    """What torch holds from uvm_lab, under ``torch.cuda.memory_stats()``'s keys (all devices together), each
    ``.all.current``, ``.peak``, ``.allocated`` and ``.freed``: ``segment`` and ``reserved_bytes`` count every
    buffer torch holds from uvm_lab; ``allocation`` and ``allocated_bytes`` those that torch made a tensor of
    directly (``change_current_allocator``). A pool's tensors are carved by torch from its segments: for those,
    ``torch.cuda.memory_stats()`` itself. Frees torch asked for are done first, as in ``ul.statistics``."""
    deferred.run()
    with _lock:
        return {f"{key}.all.{name}": value for key, counts in _counts.items()
                for name, value in zip(("current", "peak", "allocated", "freed"), counts, strict=True)}


def __getattr__(name: str) -> Any:
    # RMM's module attribute: made when first asked for, so that importing this module never needs torch.
    if name == "uvm_lab_torch_allocator":
        return torch_allocator()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
