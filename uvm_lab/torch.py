"""PyTorch's unified-memory API (RFC-0023), over uvm_lab memory::

    import torch
    import uvm_lab.torch as ut

    t = ut.manage(torch.ones(1024))      # a copy in managed memory, as pin_memory() is a copy in pinned memory
    ut.is_managed(t)                     # True
    g = ut.to(t, "cuda")                 # the same storage: advice for the GPU, then a prefetch there
    c = ut.to(g, "cpu")                  # back: advice for the host, a prefetch, a synchronize
    ut.label(model)                      # the views name each managed parameter and buffer

The names follow the RFC (``torch.cuda.set_enabled_uvm``, ``get_enabled_uvm``, ``Tensor.is_managed``,
``manage_memory``, ``unmanage_memory``, ``Tensor.to``), as functions that take the tensor, since torch's own
classes are not changed here. Managed tensors come from the current device resource
(:func:`uvm_lab.mr.get_current_device_resource`, which must give managed memory), so their allocation, advice,
prefetches, faults and migrations are events, statistics and residency maps like any buffer's:
``ul.residency(ut.buffer_of(t))``.

**The RFC's semantics.**

- ``to(t, device)`` of a managed tensor whose dtype does not change (and ``copy=False``) moves no bytes by
  copy: it sets the advice of the destination (below) and prefetches the storage there, and the tensor it
  returns has the same storage. From a GPU to the CPU it synchronizes first, unless ``non_blocking``. Any
  other conversion (a dtype change, ``copy=True``, a tensor that is not managed) copies, as the RFC says.
- The RFC's initial advice: memory for a GPU tensor has PreferredLocation the GPU and no AccessedBy; memory
  for a CPU tensor has PreferredLocation the host (``cudaCpuDeviceId``) and AccessedBy the current GPU.
- While UVM is enabled (:func:`set_enabled_uvm`, or ``PYTORCH_ENABLE_UNIFIED_MEMORY=1`` in the environment),
  the copies :func:`to` makes are managed tensors too, on the CPU as on a GPU (the RFC sends every CPU and
  GPU allocation to its managed allocator).

**On the simulator** (the ``"sim"`` backend, with CPU-only torch or any torch): a managed tensor is a CPU
tensor over the simulated managed memory's bytes. Where it is, for the RFC, is the place :func:`to` last
sent it, as :func:`device_of` says (``"cpu"`` or ``"cuda:0"``): ``to(t, "cuda")`` advises and prefetches its
pages to the simulated GPU, where the maps show them, and returns ``t`` itself (the RFC's "return self"), its
torch ``device`` still ``cpu``. Its bytes can be read and written through torch at any time; such reads and
writes are not modelled accesses (:func:`uvm_lab.touch` is), but the copies this module makes are: they
touch the source and destination memory on the processor that copies (the GPU when either end is a GPU).
The simulator has no other CUDA memory that torch could use, so a copy to ``"cuda"`` there is always a
managed tensor, enabled or not.

**Tensors torch makes itself.** On a GPU, :func:`set_enabled_uvm` ``(True)`` makes uvm_lab's allocator
(:mod:`uvm_lab.allocators.torch`) torch's CUDA allocator, so every CUDA tensor torch makes from then on
(``torch.empty(..., device="cuda")``, the results of operations, gradients) is managed memory; it must come
before torch's first CUDA tensor, and cannot be undone in the process, since torch cannot change its allocator
once it has one. With ``PYTORCH_ENABLE_UNIFIED_MEMORY=1`` in the environment, importing this module does it.
Such a tensor moves by the RFC's rules like any managed tensor, where it has its storage to itself. Tensors
that torch carves from the segments of a pool (``uvm_lab.allocators.torch.mem_pool()``) are managed too, but
share their buffer (the segment): :func:`to` copies them. Once the allocator is torch's, :func:`unmanage`'s copy
is torch's memory, which is uvm_lab's again.

**Errors.** Torch is imported when first needed: without it, every function but :func:`get_enabled_uvm`
raises :class:`~uvm_lab.errors.BackendError` saying how to install it (importing this module works). A value
that is not a tensor, a tensor on a device other than the CPU or a CUDA GPU, a layout other than strided, a
dtype that is not a ``torch.dtype`` or a device that does not exist raise
:class:`~uvm_lab.errors.InvalidArgumentError` (:class:`~uvm_lab.errors.InvalidLocationError` for devices),
naming the value and what would be valid; all are checked before anything changes.
"""

from __future__ import annotations

import os
import threading
import warnings
import weakref
from numbers import Integral
from typing import Any

from . import deferred
from .access import touch
from .allocators.torch import buffer_at, torch_allocator
from .backends import get_backend
from .buffer import DeviceBuffer
from .dlpack import KDL_CPU, KDL_CUDA, to_capsule
from .errors import BackendError, InvalidArgumentError, InvalidLocationError, shown
from .location import Location
from .mr.current import get_current_device_resource

__all__ = ["ENV_VAR", "buffer_of", "device_of", "get_enabled_uvm", "is_managed", "label", "manage",
           "set_enabled_uvm", "to", "unmanage"]

#: The environment variable RFC-0023 reads: UVM is enabled when it is set to 1 (or true, yes, on).
ENV_VAR = "PYTORCH_ENABLE_UNIFIED_MEMORY"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")

_enabled: bool | None = None   # None: not set by set_enabled_uvm, the environment decides
_INSTALL = ("PyTorch is not installed here: uvm_lab.torch needs it (without a GPU, the CPU wheel is enough: "
            "pip install torch --index-url https://download.pytorch.org/whl/cpu)")


def _torch() -> Any:
    try:
        import torch
    except ImportError as exc:
        raise BackendError(_INSTALL) from exc
    return torch


# -- enabling -----------------------------------------------------------------------------------------------
def set_enabled_uvm(enabled: bool) -> None:
    """Enable or disable unified memory for tensors (RFC-0023's ``torch.cuda.set_enabled_uvm``).

    While enabled, the copies :func:`to` makes are managed tensors, with the RFC's initial advice for where
    they are. On a GPU, enabling makes uvm_lab's allocator torch's, so that every CUDA tensor torch makes is
    managed too (see the module's notes): before torch's first CUDA tensor, and for good. Setting it overrides
    ``PYTORCH_ENABLE_UNIFIED_MEMORY``; the RFC has no way back to the environment's value, and neither has this.

    Raises
    ------
    InvalidArgumentError
        ``enabled`` is not True or False.
    BackendError
        Enabling, where torch is not installed, or where the current backend has no managed memory; on a GPU,
        where torch has made CUDA tensors already, or the allocator's shim was not built. Disabling, on a GPU,
        once enabling made uvm_lab's allocator torch's.
    """
    global _enabled
    if not isinstance(enabled, bool):
        raise InvalidArgumentError(f"enabled must be True or False, got {shown(enabled)} ({type(enabled).__name__})",
                                   value=enabled, expected="True or False")
    if enabled:
        _torch()
        _check_managed_backend()
        if not get_backend().is_simulated:
            _install_allocator()
    elif _installed:
        raise BackendError("torch's CUDA tensors come from uvm_lab's allocator in this process, and torch cannot "
                           "change its allocator back once it has one: start a new process to disable UVM")
    _enabled = enabled


_installed = False   # whether uvm_lab's allocator is torch's current CUDA allocator in this process


def _install_allocator() -> None:
    """Make uvm_lab's allocator torch's (``change_current_allocator``), so that torch's CUDA tensors are managed."""
    global _installed
    if _installed:
        return
    torch = _torch()
    allocator = torch_allocator()
    try:
        torch.cuda.memory.change_current_allocator(allocator)
    except RuntimeError as exc:
        raise BackendError(f"torch has already made CUDA tensors with its own allocator ({exc}), and cannot change "
                           f"it now: enable UVM before the first CUDA tensor (or set {ENV_VAR}=1 before "
                           f"importing uvm_lab.torch), or allocate in a pool of managed memory: "
                           f"`with torch.cuda.use_mem_pool(uvm_lab.allocators.torch.mem_pool()):`") from None
    _installed = True


def get_enabled_uvm() -> bool:
    """Whether unified memory is enabled: the last :func:`set_enabled_uvm`, else ``PYTORCH_ENABLE_UNIFIED_MEMORY``.

    Raises
    ------
    InvalidArgumentError
        Nothing set it, and the environment variable holds something other than 1/0, true/false, yes/no or
        on/off (any case).
    """
    if _enabled is not None:
        return _enabled
    raw = os.environ.get(ENV_VAR, "")
    text = raw.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise InvalidArgumentError(f"{ENV_VAR}={shown(raw)} is neither on nor off", value=raw,
                               expected="1, true, yes, on (enabled) or 0, false, no, off, unset (disabled)")


def _check_managed_backend() -> None:
    mr = get_current_device_resource()
    if not mr.is_managed:
        raise BackendError(f"the current device resource, {type(mr).__name__}, does not give managed memory: "
                           f"set one that does (ul.mr.ManagedMemoryResource, or a pool or adaptor over it)")


# -- managed storage ----------------------------------------------------------------------------------------
class _Storage:
    """What every torch storage over one managed buffer holds (through its DLPack capsule): the buffer, so
    that it lives as long as any tensor over it and is freed soon after the last one dies, and where the RFC
    says the memory is now."""

    __slots__ = ("__weakref__", "buffer", "host", "location", "owner")

    def __init__(self, buffer: DeviceBuffer, location: Location, owner: Any = None) -> None:
        self.buffer = buffer
        # For memory that torch allocated through uvm_lab's allocator: torch's own storage, kept alive as long as
        # any tensor over this, since torch frees the buffer when its storage dies.
        self.owner = owner
        # The host's view of the bytes keeps them alive even past the buffer's own close (a test's teardown,
        # a new backend): a tensor over them never reads freed memory.
        self.host = buffer.host_view()
        self.location = location


_storages: dict[int, weakref.ref[_Storage]] = {}   # by the address torch's storages over it start at
_storages_lock = threading.Lock()


def _register(address: int, storage: _Storage) -> None:
    def forget(ref: weakref.ref[_Storage], address: int = address) -> None:
        with _storages_lock:
            if _storages.get(address) is ref:
                del _storages[address]

    with _storages_lock:
        _storages[address] = weakref.ref(storage, forget)


def _storage_of(t: Any) -> _Storage | None:
    address = t.untyped_storage().data_ptr()
    with _storages_lock:
        ref = _storages.get(address)
    storage = ref() if ref is not None else None
    if storage is None or storage.buffer.closed:
        return _allocated(t) if t.device.type == "cuda" else None
    return storage


def _allocated(t: Any) -> _Storage | None:
    """The storage of CUDA tensor ``t`` where torch allocated all of it through uvm_lab's allocator
    (:mod:`uvm_lab.allocators.torch`) in managed memory, as for a managed tensor, so the RFC's moves apply.
    A tensor that shares a pool's segment with others is not: its buffer is the segment (:func:`buffer_of`)."""
    untyped = t.untyped_storage()
    buffer = buffer_at(untyped.data_ptr())
    if buffer is None or buffer.ptr != untyped.data_ptr() or buffer.size != untyped.nbytes() or not buffer.is_managed:
        return None
    storage = _Storage(buffer, Location.device(t.device.index or 0), owner=untyped)
    _register(buffer.ptr, storage)
    return storage


def _managed_buffer(t: Any) -> DeviceBuffer | None:
    """The managed buffer ``t``'s memory is in: its storage's, or the segment of a pool of uvm_lab's it is in."""
    storage = _storage_of(t)
    if storage is not None:
        return storage.buffer
    if t.device.type == "cuda":
        buffer = buffer_at(t.untyped_storage().data_ptr())
        if buffer is not None and buffer.is_managed:
            return buffer
    return None


def _tensor(t: Any, name: str = "t") -> Any:
    """``t``, checked: a strided torch tensor on the CPU or a CUDA GPU."""
    torch = _torch()
    if not isinstance(t, torch.Tensor):
        raise InvalidArgumentError(f"{name} must be a torch.Tensor, got {shown(t)} ({type(t).__name__})", value=t,
                                   expected="a torch.Tensor")
    if t.device.type not in ("cpu", "cuda"):
        raise InvalidArgumentError(f"{name} is on device {str(t.device)!r}: managed memory holds CPU and CUDA "
                                   f"tensors only", value=t, expected="a tensor on 'cpu' or 'cuda'")
    if t.layout is not torch.strided:
        raise InvalidArgumentError(f"{name} has layout {t.layout}: managed memory holds strided (dense) tensors only",
                                   value=t, expected="a tensor of layout torch.strided")
    return t


def _where(t: Any) -> Location:
    """Where the RFC says ``t`` is: a managed tensor's storage's place, else torch's device."""
    storage = _storage_of(t)
    if storage is not None:
        return storage.location
    return Location.host() if t.device.type == "cpu" else Location.device(t.device.index or 0)


def _torch_device(location: Location) -> str:
    return "cpu" if location.is_host else f"cuda:{location.id}"


def _device(value: Any) -> Location:
    """A destination as torch writes one: ``"cpu"``, ``"cuda"``, ``"cuda:N"``, a ``torch.device`` or an ordinal."""
    torch = _torch()
    backend = get_backend()
    count = backend.device_count()
    valid = f"'cpu', 'cuda', 'cuda:N' for N in 0..{count - 1}, a torch.device of those, or an ordinal"
    if isinstance(value, (str, torch.device)):
        try:
            dev = torch.device(value)
        except (RuntimeError, TypeError, ValueError):
            raise InvalidLocationError(f"device must be {valid}, got {shown(value)}", value=value,
                                       expected=valid) from None
        if dev.type == "cpu":
            return Location.host()
        if dev.type != "cuda":
            raise InvalidLocationError(f"device {shown(value)} is a {dev.type!r} device: managed memory is for the "
                                       f"CPU and CUDA GPUs", value=value, expected=valid)
        ordinal = backend.current_device() if dev.index is None else dev.index
    elif isinstance(value, Integral) and not isinstance(value, bool):
        ordinal = int(value)
    else:
        raise InvalidLocationError(f"device must be {valid}, got {shown(value)} ({type(value).__name__})",
                                   value=value, expected=valid)
    if not 0 <= ordinal < count:
        raise InvalidLocationError(f"device {shown(value)}: there is no GPU {ordinal} (this backend has {count})",
                                   value=value, expected=valid)
    return Location.device(ordinal)


def _dtype(value: Any, t: Any) -> Any:
    torch = _torch()
    if value is None:
        return t.dtype
    if not isinstance(value, torch.dtype):
        raise InvalidArgumentError(f"dtype must be a torch.dtype or None, got {shown(value)} ({type(value).__name__})",
                                   value=value, expected="a torch.dtype such as torch.float32, or None (unchanged)")
    return value


def _flag(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgumentError(f"{name} must be True or False, got {shown(value)} ({type(value).__name__})",
                                   value=value, expected="True or False")
    return value


def _advise(buffer: DeviceBuffer, location: Location) -> None:
    """RFC-0023's advice for memory used at ``location``: for a GPU, PreferredLocation there and no AccessedBy;
    for the host, PreferredLocation the host and AccessedBy the current GPU."""
    if location.is_host:
        buffer.preferred_location = location
        buffer.accessed_by = Location.device(buffer.mr.backend.current_device())
    else:
        buffer.preferred_location = location
        buffer.accessed_by = None


def _over(storage: _Storage, location: Location, dtype: Any, size: Any, stride: Any, offset: int) -> Any:
    """A tensor over ``storage``'s memory: on the simulator, or for the host, a CPU tensor over its host bytes;
    on a GPU for a GPU, a CUDA tensor over the managed pointer."""
    torch = _torch()
    buffer = storage.buffer
    if buffer.mr.backend.is_simulated or location.is_host:
        capsule = to_capsule(storage, storage.host.ctypes.data, storage.host.size, KDL_CPU, 0)
    else:
        capsule = to_capsule(storage, buffer.ptr, buffer.size, KDL_CUDA, location.id)
    raw = torch.from_dlpack(capsule)
    return torch.empty(0, dtype=dtype, device=raw.device).set_(raw.untyped_storage(), offset, size, stride)


def _contiguous_strides(size: Any) -> tuple[int, ...]:
    strides, step = [], 1
    for n in reversed(tuple(size)):
        strides.append(step)
        step *= max(int(n), 1)
    return tuple(reversed(strides))


def _span(t: Any) -> tuple[int, int]:
    """``(offset, size)`` in bytes of the part of its storage that ``t`` covers."""
    item = t.element_size()
    if t.numel() == 0:
        return t.storage_offset() * item, 0
    last = sum((n - 1) * s for n, s in zip(t.size(), t.stride(), strict=True) if s > 0)
    first = t.storage_offset() + sum((n - 1) * s for n, s in zip(t.size(), t.stride(), strict=True) if s < 0)
    return first * item, (last - (first - t.storage_offset()) + 1) * item


def _copy(t: Any, location: Location, dtype: Any, non_blocking: bool, managed: bool, label: str | None) -> Any:
    """A copy of ``t`` at ``location`` with ``dtype``: in new managed memory (with the RFC's advice for
    ``location``, prefetched there) when ``managed``, else torch's own."""
    torch = _torch()
    source = _storage_of(t)
    src_at = _where(t)
    backend = source.buffer.mr.backend if source is not None else get_backend()
    # The copy runs on the GPU when either end is one (as torch's copy kernel does), else on the host.
    processor = location if not location.is_host else src_at
    if source is not None and backend.is_simulated:
        offset, size = _span(t)
        if size:
            touch(source.buffer, on=processor, mode="read", offset=offset, size=size)
    if not managed:
        out = t.detach().to(device=_torch_device(location) if not backend.is_simulated else "cpu", dtype=dtype,
                            non_blocking=non_blocking, copy=True)
    else:
        _check_managed_backend()
        nbytes = t.numel() * torch.empty(0, dtype=dtype).element_size()
        deferred.run()
        # At least one byte: a tensor of no elements still has an address, by which it is known as managed.
        buffer = DeviceBuffer(size=max(nbytes, 1), label=label)
        try:
            if not buffer.is_managed:
                raise BackendError(f"the current device resource gave {buffer.label!r} memory that is not managed")
            _advise(buffer, location)
            storage = _Storage(buffer, location)
            out = _over(storage, location, dtype, t.size(), _contiguous_strides(t.size()), 0)
            if backend.is_simulated:
                touch(buffer, on=processor, mode="write", size=nbytes)
            out.copy_(t.detach())
            buffer.prefetch(location)
            _register(out.untyped_storage().data_ptr(), storage)
        except BaseException:
            buffer.close()
            raise
    if location.is_host and not src_at.is_host and not non_blocking:
        backend.synchronize()
    if t.requires_grad and (dtype.is_floating_point or dtype.is_complex):
        out.requires_grad_(True)
    return out


# -- the RFC's functions ------------------------------------------------------------------------------------
def is_managed(t: Any) -> bool:
    """Whether ``t``'s storage is uvm_lab managed memory (RFC-0023's ``Tensor.is_managed()``): made by
    :func:`manage` or :func:`to`, or by torch through uvm_lab's allocator (:mod:`uvm_lab.allocators.torch`)
    from managed memory, and its buffer not closed. Views of a managed tensor are managed too."""
    return _managed_buffer(_tensor(t)) is not None


def buffer_of(t: Any) -> DeviceBuffer:
    """The :class:`~uvm_lab.DeviceBuffer` under managed tensor ``t``: for ``ul.residency``, ``ul.touch``, advice.

    The buffer lives as long as any tensor over it; it is freed soon after the last one dies. For a tensor that
    torch carved from a pool's segment (:func:`uvm_lab.allocators.torch.mem_pool`), it is the whole segment.

    Raises
    ------
    InvalidArgumentError
        ``t`` is not a managed tensor.
    """
    buffer = _managed_buffer(_tensor(t))
    if buffer is None:
        raise InvalidArgumentError(f"{_describe(t)} is not managed: its memory is torch's, not uvm_lab's",
                                   value=t, expected="a tensor from uvm_lab.torch.manage or uvm_lab.torch.to, or "
                                                     "one torch made with uvm_lab's allocator")
    return buffer


def device_of(t: Any) -> str:
    """Where ``t`` is, as torch names devices (``"cpu"``, ``"cuda:0"``): for a managed tensor, where :func:`to`
    last sent its storage (on the simulator its torch ``device`` stays ``cpu``); else torch's device."""
    return _torch_device(_where(_tensor(t)))


def manage(t: Any, *, label: str | None = None) -> Any:
    """A copy of ``t`` in managed memory (RFC-0023's ``Tensor.manage_memory()``), as ``pin_memory()`` is a copy
    in pinned memory; ``t`` itself when it is managed already.

    The memory comes from the current device resource, with the RFC's initial advice for where ``t`` is (the
    CPU: PreferredLocation the host, AccessedBy the current GPU; a GPU: PreferredLocation that GPU), and the
    copy is contiguous. ``label`` names it in the maps and views (see also :func:`label`). A tensor that
    requires grad gives a leaf that requires grad.

    Raises
    ------
    InvalidArgumentError
        ``t`` is not a strided CPU or CUDA tensor, or ``label`` is not a str.
    BackendError
        The current device resource does not give managed memory, or torch is missing.
    """
    _tensor(t)
    if label is not None and not isinstance(label, str):
        raise InvalidArgumentError(f"label must be a str or None, got {shown(label)}", value=label,
                                   expected="a str or None")
    if _storage_of(t) is not None:
        return t
    _check_managed_backend()
    return _copy(t, _where(t), t.dtype, True, managed=True, label=label)


def unmanage(t: Any) -> Any:
    """A copy of managed ``t`` in torch's own memory (RFC-0023's ``Tensor.unmanage_memory()``); ``t`` itself
    when it is not managed.

    Raises
    ------
    InvalidArgumentError
        ``t`` is not a strided CPU or CUDA tensor.
    BackendError
        On the simulator, ``t`` is on a GPU (:func:`device_of`): the simulator has no CUDA memory of torch's
        own to copy it to. ``to(t, "cpu")`` first.
    """
    storage = _storage_of(_tensor(t))
    if storage is None:
        return t
    if storage.buffer.mr.backend.is_simulated and not storage.location.is_host:
        raise BackendError(f"{_describe(t)} is on {_torch_device(storage.location)} on the simulator, where a CUDA "
                           f"tensor can only be managed memory: move it to the CPU first (uvm_lab.torch.to(t, 'cpu'))")
    return _copy(t, storage.location, t.dtype, True, managed=False, label=None)


def to(t: Any, device: Any = None, dtype: Any = None, non_blocking: bool = False, copy: bool = False) -> Any:
    """``t`` on ``device`` with ``dtype``, by RFC-0023's ``Tensor.to()``.

    A managed tensor whose dtype does not change, without ``copy``, keeps its storage: the RFC's advice for
    ``device`` is set (PreferredLocation there; AccessedBy the current GPU for the CPU, none for a GPU), the
    storage is prefetched there, and from a GPU to the CPU the device is synchronized unless ``non_blocking``
    (then the caller must synchronize before reading on the host). On the simulator this returns ``t`` itself
    (the RFC's "return self"), its pages on their way; on a GPU, a tensor of the new torch device over the same
    memory. The same device and dtype, without ``copy``, return ``t`` for any tensor, as torch does.

    Otherwise it copies (a dtype change, ``copy=True``, or a tensor that is not managed): into new managed
    memory (the RFC's advice for ``device``, prefetched there) while UVM is enabled, and on the simulator for a
    GPU (its only CUDA memory torch can use); else torch's own copy. A copy is contiguous, and a leaf.

    ``device`` is ``"cpu"``, ``"cuda"``, ``"cuda:N"``, a ``torch.device`` or an ordinal; None keeps where ``t``
    is (:func:`device_of`). ``dtype`` is a ``torch.dtype``; None keeps ``t``'s.

    Raises
    ------
    InvalidArgumentError
        ``t`` is not a strided CPU or CUDA tensor; ``dtype`` is not a ``torch.dtype``; a flag is not a bool.
    InvalidLocationError
        ``device`` is not the CPU or a GPU this backend has.
    BackendError
        A copy into managed memory, where the current device resource does not give it; torch is missing.
    """
    _tensor(t)
    src_at = _where(t)
    location = src_at if device is None else _device(device)
    new_dtype = _dtype(dtype, t)
    _flag(non_blocking, "non_blocking")
    _flag(copy, "copy")
    storage = _storage_of(t)
    if not copy and new_dtype == t.dtype:
        if location == src_at:
            return t
        if storage is not None:
            return _move(t, storage, location, non_blocking)
    backend = storage.buffer.mr.backend if storage is not None else get_backend()
    managed = get_enabled_uvm() or (backend.is_simulated and not location.is_host)
    return _copy(t, location, new_dtype, non_blocking, managed=managed, label=None)


def _move(t: Any, storage: _Storage, location: Location, non_blocking: bool) -> Any:
    buffer = storage.buffer
    source = storage.location
    _advise(buffer, location)
    buffer.prefetch(location)
    if location.is_host and not source.is_host and not non_blocking:
        buffer.mr.backend.synchronize()
    storage.location = location
    if buffer.mr.backend.is_simulated:
        return t
    out = _over(storage, location, t.dtype, t.size(), t.stride(), t.storage_offset())
    if t.requires_grad:
        out.requires_grad_(True)
    return out


def label(module: Any, prefix: str = "") -> dict[str, str]:
    """Name the buffers under ``module``'s managed parameters and buffers by their names in it (``"0.weight"``,
    ``"encoder.norm.running_mean"``, after ``prefix``), so that maps, views and traces show tensor names.

    Returns ``{name: label}`` for those labelled. Parameters and buffers that are not managed (torch's own
    memory, which uvm_lab does not see) are left out; tensors that share one buffer (one storage, or one segment
    of a pool of uvm_lab's) give it their names joined by ``", "``.

    Raises
    ------
    InvalidArgumentError
        ``module`` is not a ``torch.nn.Module``, or ``prefix`` is not a str.
    """
    torch = _torch()
    if not isinstance(module, torch.nn.Module):
        raise InvalidArgumentError(f"module must be a torch.nn.Module, got {shown(module)} ({type(module).__name__})",
                                   value=module, expected="a torch.nn.Module")
    if not isinstance(prefix, str):
        raise InvalidArgumentError(f"prefix must be a str, got {shown(prefix)}", value=prefix, expected="a str")
    names: dict[int, tuple[DeviceBuffer, list[str]]] = {}
    for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
        if tensor is None:
            continue
        buffer = _managed_buffer(tensor)
        if buffer is not None:
            names.setdefault(buffer.id, (buffer, []))[1].append(prefix + name)
    labelled = {}
    for buffer, tensor_names in names.values():
        buffer.label = ", ".join(tensor_names)
        labelled.update(dict.fromkeys(tensor_names, buffer.label))
    return labelled


def _describe(t: Any) -> str:
    return f"tensor of shape {tuple(t.shape)} and dtype {t.dtype} on {t.device}"


def _from_environment() -> None:
    """``PYTORCH_ENABLE_UNIFIED_MEMORY=1`` on a GPU: make uvm_lab's allocator torch's now, before torch's first
    CUDA tensor, as the RFC reads the variable when torch starts."""
    try:
        if not get_enabled_uvm() or get_backend().is_simulated:
            return
        _install_allocator()
    except (BackendError, InvalidArgumentError) as exc:
        warnings.warn(f"{ENV_VAR} is set, but torch's CUDA tensors will not be managed: {exc}", RuntimeWarning,
                      stacklevel=2)


if os.environ.get(ENV_VAR):
    _from_environment()
