"""DeviceBuffer: memory from a resource, with prefetch and memory advice.

Advice is read back from the backend each time (``cudaMemRangeGetAttribute`` on a GPU), never
cached here, so what a buffer reports is what the driver holds.
"""

from __future__ import annotations

import itertools
import threading
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Iterable
from numbers import Integral
from typing import Any

import numpy as np

from . import deferred
from .backends.base import RangeAdvice
from .dlpack import KDL_CUDA, KDL_CUDA_HOST, to_capsule
from .errors import BufferClosedError, InvalidAdviceError, InvalidArgumentError, InvalidLocationError, shown
from .events.schema import Advice, MemoryKind
from .location import Location
from .mr.base import MemoryResource, resource_chain
from .mr.current import get_current_device_resource
from .stream import DEFAULT_STREAM, Stream, as_stream_handle
from .units import MAX_SIZE, PAGE_SIZE, format_bytes, parse_size

__all__ = ["LABELS_KEPT", "DeviceBuffer", "find_buffer", "label_of", "labels_dropped", "live_buffers",
           "live_generation", "page_range"]

_live: dict[int, weakref.ref[DeviceBuffer]] = {}
_live_lock = threading.Lock()
_live_generation = 0   # bumped whenever a buffer joins or leaves _live: see live_generation()
_empty_ids = itertools.count(-1, -1)   # zero-size buffers hold no allocation: negative ids never clash

#: How many buffers' labels are kept after they are freed (records carry only ids; a trace's view names
#: its lanes by them). Past it the oldest go, counted by :func:`labels_dropped`.
LABELS_KEPT = 65_536
_labels: OrderedDict[int, str] = OrderedDict()
_labels_dropped = 0

_ADVICE_NAMES = {
    "read_mostly": Advice.SET_READ_MOSTLY,
    "unset_read_mostly": Advice.UNSET_READ_MOSTLY,
    "preferred_location": Advice.SET_PREFERRED_LOCATION,
    "unset_preferred_location": Advice.UNSET_PREFERRED_LOCATION,
    "accessed_by": Advice.SET_ACCESSED_BY,
    "unset_accessed_by": Advice.UNSET_ACCESSED_BY,
}


def _access_prefetcher(mr: MemoryResource) -> Any:
    """The ``PrefetchResourceAdaptor(on="access")`` in ``mr``'s chain, if there is one (a chain never changes:
    the answer is kept for as long as ``mr`` lives)."""
    try:
        return _prefetchers[mr]
    except KeyError:
        pass
    from .mr.prefetch import PrefetchResourceAdaptor

    found = next((resource for resource in resource_chain(mr)
                  if isinstance(resource, PrefetchResourceAdaptor) and resource.on == "access"), None)
    _prefetchers[mr] = found
    return found


_prefetchers: weakref.WeakKeyDictionary[MemoryResource, Any] = weakref.WeakKeyDictionary()


def _release(mr: MemoryResource, ptr: int, size: int, stream: int, buffer_id: int, stream_owner: object = None) -> None:
    global _live_generation
    with _live_lock:
        if _live.pop(buffer_id, None) is not None:
            _live_generation += 1
    try:
        mr.deallocate(ptr, size, stream)
    except Exception as exc:  # a destructor never raises
        warnings.warn(f"freeing buffer {buffer_id} at {ptr:#x} failed ({exc}); the allocation may have leaked",
                      RuntimeWarning, stacklevel=2)


class DeviceBuffer:
    """``size`` bytes from ``mr`` (the current device resource by default), as RMM's ``DeviceBuffer``.

    Parameters
    ----------
    ptr
        An address to copy ``size`` bytes from into the new buffer (RMM's ``ptr=``): host memory, or device
        memory (another buffer's ``ptr``; on a GPU any device memory). 0, the default, copies nothing.
    size
        Bytes, as an int or a string such as ``"512MiB"``.
    stream
        The stream the allocation, its copies and its free are ordered on: None (the default
        stream), a :class:`~uvm_lab.Stream`, an int handle, or a CuPy, PyTorch or cuda.core stream.
    mr
        The memory resource to allocate from.
    label
        A name shown in residency maps and dashboards (default ``"buffer <id>"``).

    Where uvm_lab differs: the copy from ``ptr`` is complete when the constructor returns, on any stream
    (RMM waits only on the default stream). As with RMM, ``ptr`` must name memory that can be read; on the
    simulator an address inside a live simulated allocation is read from it, and any other is read as host
    memory (an address with nothing mapped there is an :class:`~uvm_lab.errors.InvalidArgumentError`).
    """

    def __init__(self, *, ptr: int = 0, size: int | str = 0, stream: object = None, mr: MemoryResource | None = None,
                 label: str | None = None) -> None:
        source = _address(ptr, "ptr")
        nbytes = parse_size(size)
        handle = as_stream_handle(stream)
        if mr is None:
            mr = get_current_device_resource()
        elif not isinstance(mr, MemoryResource):
            raise InvalidArgumentError(f"mr must be a uvm_lab memory resource, got {mr!r} ({type(mr).__name__})",
                                       value=mr, expected="a uvm_lab.mr.MemoryResource or None")
        _check_label(label)
        deferred.run()   # frees that garbage collection queued: give that memory back first
        address = mr.allocate(nbytes, handle)
        if source and nbytes:
            try:
                mr.backend.copy(address, source, nbytes, stream=handle)
            except BaseException:
                mr.deallocate(address, nbytes, handle)   # all or nothing
                raise
        self._mr = mr
        self._access_prefetcher = _access_prefetcher(mr)
        self._adopt(address, nbytes, handle, stream, label)

    def _adopt(self, ptr: int, nbytes: int, handle: int, stream: object, label: str | None) -> None:
        """Make ``[ptr, ptr + nbytes)`` from this buffer's resource its memory: its id, its label, the finalizer
        that frees it, and its place among the live buffers."""
        self._ptr = ptr
        self._size = nbytes
        # Keep the caller's stream object alive as long as the buffer: its handle must stay valid.
        self._stream = stream if isinstance(stream, Stream) else DEFAULT_STREAM if handle == 0 else Stream(stream)
        self.id = self._mr.allocation_id(ptr) if nbytes else next(_empty_ids)
        self._label = label if label is not None else f"buffer {self.id}"
        # The caller's stream object rides along with the free, so its handle is still valid then.
        self._finalizer = weakref.finalize(self, deferred.defer, _release, self._mr, ptr, nbytes, handle, self.id,
                                           stream)
        self._finalizer.atexit = False   # the process's exit frees device memory; nothing to publish then
        global _live_generation
        with _live_lock:
            _live[self.id] = weakref.ref(self)
            _live_generation += 1
            _remember_label(self.id, self._label)

    @staticmethod
    def to_device(b: Any, stream: object = None) -> DeviceBuffer:
        """A new buffer (from the current device resource) holding a copy of the host bytes ``b``, as RMM's."""
        data = _as_bytes(b, "b", writable=False)
        buf = DeviceBuffer(size=data.size, stream=stream)
        try:
            buf.copy_from_host(data)
        except BaseException:
            buf.close()
            raise
        return buf

    def copy(self) -> DeviceBuffer:
        """A new buffer from the same resource, on the same stream, holding a copy of this one's bytes (RMM's)."""
        self._check_open("copy")
        return DeviceBuffer(ptr=self._ptr, size=self._size, stream=self._stream, mr=self._mr)

    __copy__ = copy

    # -- what it is --------------------------------------------------------------------------------------
    @property
    def ptr(self) -> int:
        return self._ptr

    @property
    def size(self) -> int:
        return self._size

    @property
    def nbytes(self) -> int:
        return self._size

    @property
    def mr(self) -> MemoryResource:
        return self._mr

    @property
    def stream(self) -> Stream:
        """The stream the buffer's allocation, copies and free are ordered on."""
        return self._stream

    @property
    def label(self) -> str:
        """The name shown in residency maps, views and traces (``"buffer <id>"`` unless one was given).

        Setting it renames the buffer everywhere: live views list the buffers again (as when one is made or
        freed) and describe it under its new name, and a trace made earlier names it so too. None gives back
        the default name.
        """
        return self._label

    @label.setter
    def label(self, value: str | None) -> None:
        _check_label(value)
        global _live_generation
        with _live_lock:
            self._label = value if value is not None else f"buffer {self.id}"
            if self.id in _live:   # a closed buffer keeps the name it was freed under in traces
                _remember_label(self.id, self._label)
                _live_generation += 1

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    @property
    def is_managed(self) -> bool:
        """Whether the memory is unified (can migrate, take advice)."""
        return self._mr.backend.segment_kind(self._ptr) is MemoryKind.MANAGED if self._size else self._mr.is_managed

    def close(self) -> None:
        """Give the memory back to its resource. Closing twice is harmless; using a closed buffer is an error."""
        held = self._finalizer.detach()   # (self, defer, args, kwargs): free now, in the caller's thread
        if held is not None:
            _release(*held[2][1:])

    def __enter__(self) -> DeviceBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"ptr={self._ptr:#x}"
        return f"<DeviceBuffer {self.label!r} id={self.id} size={format_bytes(self._size)} {state}>"

    # -- data ---------------------------------------------------------------------------------------------
    def copy_from_host(self, data: Any, stream: object = None, *, offset: int | str = 0) -> None:
        """Copy ``data`` (bytes, a buffer, or a contiguous NumPy array of any dtype) into the buffer at ``offset``.

        ``stream`` (RMM's argument) orders the copy; None is the buffer's own stream. The copy is complete
        when the call returns.
        """
        self._check_open("copy into")
        src = _as_bytes(data, "data", writable=False)
        start = parse_size(offset, name="offset")
        handle = self._stream_handle(stream)
        if start + src.size > self._size:
            raise InvalidArgumentError(f"{src.size} bytes at offset {start} do not fit in {self.label!r} "
                                       f"({self._size} bytes)", value=data,
                                       expected=f"at most {self._size - start} bytes")
        if src.size:   # an empty buffer holds no allocation to write to
            self._mr.backend.write(self._ptr + start, src, stream=handle)

    def copy_to_host(self, ary: Any = None, stream: object = None) -> Any:
        """The buffer's bytes in host memory: a new ``uint8`` array, or ``ary`` (a writable buffer or array whose
        ``nbytes`` equal the buffer's), filled and returned. ``stream`` as for :meth:`copy_from_host`."""
        self._check_open("copy from")
        if ary is None:
            out = np.empty(self._size, dtype=np.uint8)
        else:
            out = _as_bytes(ary, "ary", writable=True)
            if out.size != self._size:
                raise InvalidArgumentError(f"ary holds {out.size} bytes but {self.label!r} has {self._size}",
                                           value=ary, expected=f"an array of {self._size} bytes")
        handle = self._stream_handle(stream)
        if self._size:
            self._mr.backend.read(self._ptr, out, stream=handle)
        return out if ary is None else ary

    def tobytes(self, stream: object = None) -> bytes:
        """The buffer's bytes as ``bytes`` (RMM's ``tobytes``); ``bytes(buffer)`` is the same."""
        return bytes(self.copy_to_host(stream=stream).data)

    def __bytes__(self) -> bytes:
        return self.tobytes()

    def copy_from_device(self, cuda_ary: Any, stream: object = None) -> None:
        """Copy device memory into the start of the buffer, as RMM's ``copy_from_device``.

        ``cuda_ary`` is another :class:`DeviceBuffer`, or an object with ``__cuda_array_interface__`` that
        describes a 1-D contiguous array (a CuPy or Numba array) of at most :attr:`size` bytes. On the
        simulator only simulated memory is device memory: another buffer, or an interface whose address lies
        inside a live simulated allocation. ``stream`` as for :meth:`copy_from_host`.
        """
        self._check_open("copy into")
        backend = self._mr.backend
        handle = self._stream_handle(stream)
        if isinstance(cuda_ary, DeviceBuffer):
            cuda_ary._check_open("copy from")
            if cuda_ary.mr.backend is not backend:
                raise InvalidArgumentError(f"{cuda_ary.label!r} was made on another backend than {self.label!r}",
                                           value=cuda_ary, expected="a buffer of the same backend")
            src, nbytes = cuda_ary.ptr, cuda_ary.size
        else:
            src, nbytes = _device_array(cuda_ary)
            if nbytes and backend.is_simulated and backend.segment_kind(src) is None:
                raise InvalidArgumentError(
                    f"cuda_ary's address {src:#x} is not inside a live simulated allocation: on the simulator, device "
                    f"memory is the simulated device's", value=cuda_ary,
                    expected="a DeviceBuffer, or an interface to simulated memory")
        if nbytes > self._size:
            raise InvalidArgumentError(f"cuda_ary holds {nbytes} bytes but {self.label!r} has {self._size}",
                                       value=cuda_ary, expected=f"at most {self._size} bytes")
        if nbytes:
            backend.copy(self._ptr, src, nbytes, stream=handle)

    def resize(self, new_size: int | str, stream: object = None) -> None:
        """Make the buffer ``new_size`` bytes, keeping its first ``min(size, new_size)`` bytes (RMM's ``resize``).

        The buffer moves to a new allocation from its resource: the new memory is allocated and the bytes
        copied, then the old memory is freed, each with its events. :attr:`ptr` and :attr:`id` are then the new
        allocation's (live-buffer lists and maps follow it); the label stays. ``stream`` (None: the buffer's
        own) orders the copy and becomes the buffer's stream. If the allocation or the copy fails, the buffer is
        as it was.

        Where uvm_lab differs: RMM shrinks in place (keeping the memory as spare capacity) and grows into a new
        allocation; uvm_lab always moves, so that a buffer's size is its allocation's, which its maps, prefetch
        and advice cover. Advice is per allocation: the new memory has none, as in RMM; set it again. A resize
        to the buffer's own size changes nothing.
        """
        self._check_open("resize")
        nbytes = parse_size(new_size, name="new_size")
        owner = self._stream if stream is None else stream
        handle = as_stream_handle(owner)
        if nbytes == self._size:
            return
        mr = self._mr
        deferred.run()
        ptr = mr.allocate(nbytes, handle)
        keep = min(self._size, nbytes)
        if keep:
            try:
                mr.backend.copy(ptr, self._ptr, keep, stream=handle)
            except BaseException:
                mr.deallocate(ptr, nbytes, handle)
                raise
        held = self._finalizer.detach()   # the old memory goes after the new is filled, as in RMM
        if held is not None:
            _release(*held[2][1:])
        self._adopt(ptr, nbytes, handle, owner, self.label)

    def host_view(self, dtype: Any = np.uint8) -> np.ndarray:
        """A NumPy view of the buffer, without a copy: managed or pinned memory only.

        On a GPU, touching the view from the host faults the pages in, as any host access does. On the
        simulator the view holds the simulated bytes, but touching it is not a modelled access: use
        :func:`uvm_lab.touch` for that.
        """
        self._check_open("view")
        dt = np.dtype(dtype)
        if self._size % dt.itemsize:
            raise InvalidArgumentError(f"{self._size} bytes is not a whole number of {dt} items", value=dtype,
                                       expected=f"a dtype whose itemsize divides {self._size}")
        if not self._size:
            return np.zeros(0, dtype=dt)
        return self._mr.backend.host_view(self._ptr, self._size).view(dt)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """The buffer as a 1-D ``uint8`` device array (CUDA Array Interface v3), for CuPy, Numba, PyTorch.

        Reading it is an access: under a ``PrefetchResourceAdaptor(on="access")`` the buffer is prefetched
        on its own stream first, and that stream is named so the consumer waits for it.
        """
        if self._mr.backend.is_simulated:
            # AttributeError, so that hasattr() says no: a simulated address names no real memory.
            raise AttributeError("a buffer on the simulated device has no real device memory to share")
        self._check_open("share")
        handle = self._stream.handle
        queued = self._prefetch_on_access(handle)
        # CAI v3: 0 is not allowed for the legacy default stream; it is 1.
        stream = (handle or 1) if queued else None
        return {"shape": (self._size,), "typestr": "|u1", "data": (self._ptr, False), "version": 3,
                "strides": None, "stream": stream}

    def __dlpack__(self, *, stream: int | None = None, max_version: tuple[int, int] | None = None,
                   dl_device: tuple[int, int] | None = None, copy: bool | None = None) -> object:
        """The buffer as a DLPack capsule (a 1-D ``uint8`` tensor), for ``torch.from_dlpack`` and others.

        ``stream`` is the consumer's stream, as the DLPack protocol gives it (None or 1: the legacy
        default stream, 2: per-thread default, -1: no synchronization, otherwise a handle). Work
        queued on the buffer's own stream is waited for first, and under a
        ``PrefetchResourceAdaptor(on="access")`` the prefetch is queued on the consumer's stream.
        """
        backend = self._mr.backend
        if backend.is_simulated:
            raise BufferError("a buffer on the simulated device has no real device memory to share")
        self._check_open("share")
        device = self.__dlpack_device__()
        if dl_device is not None and tuple(dl_device) != device:
            raise BufferError(f"{self.label!r} lives on DLPack device {device}, not {tuple(dl_device)}; "
                              f"uvm_lab does not copy across devices on export")
        if copy:
            raise BufferError("uvm_lab exports buffers without copying; copy=True is not supported")
        if stream is not None and (isinstance(stream, bool) or not isinstance(stream, int) or stream in (0, -2)
                                   or stream < -1):
            raise BufferError(f"stream must be None, -1, 1, 2 or a stream handle, got {stream!r}")
        consumer = 0 if stream in (None, -1, 1) else int(stream)   # a DLPack handle is a CUDA handle
        if stream != -1 and consumer != self._stream.handle:
            backend.synchronize_stream(self._stream.handle)  # type: ignore[attr-defined]
        if stream != -1:
            self._prefetch_on_access(consumer)
        return to_capsule(self, self._ptr, self._size, *device)

    def __dlpack_device__(self) -> tuple[int, int]:
        """``(device type, device id)``: CUDA for managed and device memory, CUDA host for pinned memory."""
        if self._mr.backend.is_simulated:
            raise BufferError("a buffer on the simulated device has no real device memory to share")
        if self._size and self._mr.backend.segment_kind(self._ptr) is MemoryKind.PINNED_HOST:
            return (KDL_CUDA_HOST, 0)
        return (KDL_CUDA, self._mr.device_id if self._mr.device_id >= 0 else 0)

    def _prefetch_on_access(self, stream: int) -> bool:
        """Under a ``PrefetchResourceAdaptor(on="access")``, prefetch before an access on ``stream``."""
        adaptor = self._access_prefetcher
        if adaptor is None or not self._size or self._size < adaptor.min_size or not self.is_managed:
            return False
        self._mr.backend.prefetch(self._ptr, self._size, adaptor.location, stream=stream)
        return True

    # -- prefetch and advice ---------------------------------------------------------------------------
    def prefetch(self, location: int | str | Location | None = None, stream: object = None, *,
                 device: int | str | Location | None = None, offset: int | str = 0,
                 size: int | str | None = None) -> None:
        """Migrate the buffer's pages to ``location`` (``"gpu"``, ``"gpu:N"``, ``"host"`` or an ordinal).

        ``device`` is RMM's name for the same argument (an ordinal, ``-1`` for the host as
        ``cudaCpuDeviceId``, or anything ``location`` takes); give one or the other. With neither, the pages go
        to the current device, as in RMM. ``stream`` orders the prefetch; None is the buffer's own stream, as
        in RMM.

        As ``cudaMemPrefetchAsync``: pages not yet touched are populated there; memory that cannot
        migrate (device or pinned host memory) is left alone. ``offset`` and ``size`` (bytes, or strings
        such as ``"2MiB"``) prefetch part of the buffer; the whole of it by default. Asynchronous on
        ``stream``: synchronize it (or the device) to wait for the pages.
        """
        self._check_open("prefetch")
        if location is not None and device is not None:
            raise InvalidArgumentError(f"give the destination once, as location (uvm_lab's name) or device (RMM's), "
                                       f"not both: got location={shown(location)}, device={shown(device)}",
                                       value=(location, device), expected="location=... or device=..., not both")
        if device is not None:
            loc = self._location(device, "device")
        else:
            loc = self._location("gpu" if location is None else location, "location")
        start = parse_size(offset, name="offset")
        length = self._size - start if size is None else parse_size(size, name="size")
        if start + length > self._size:
            raise InvalidArgumentError(f"offset {start} + size {length} runs past the end of the buffer "
                                       f"({self._size} bytes)", value=(offset, size),
                                       expected=f"a range within 0..{self._size}")
        handle = self._stream_handle(stream)
        if length:
            self._mr.backend.prefetch(self._ptr + start, length, loc, stream=handle)

    def lend(self, device: int | str | Location | None = None) -> None:
        """Say that this buffer is handed to a library whose kernels on GPU ``device`` (the current one when None)
        uvm_lab does not see, as uvm_lab's allocators for CuPy, Numba and torch do. Those kernels may fault its
        pages in from nowhere at any time, which the host watcher cannot see either: where nothing measures GPU
        faults (CUPTI's), its map says unknown for the GPU's side of them, never "nowhere". On the simulator,
        where no other library runs kernels, nothing changes.

        Raises
        ------
        InvalidLocationError
            ``device`` is the host, or a GPU this backend does not have.
        BufferClosedError
            The buffer is closed.
        """
        self._check_open("lend")
        location = self._location("gpu" if device is None else device, "device")
        if location.is_host:
            raise InvalidLocationError(f"device must be a GPU: a library's kernels run on one, got {device!r}",
                                       value=device, expected='"gpu", "gpu:N" or a device ordinal')
        if self._size:
            self._mr.backend.lend(self._ptr, self._size, location.id)

    def advise(self, advice: str | Advice, location: int | str | Location | None = None) -> None:
        """Apply ``cudaMemAdvise``: ``advice`` is a name such as ``"read_mostly"`` or ``"unset_accessed_by"``."""
        self._check_open("advise")
        adv = self._advice(advice)
        needs = adv in (Advice.SET_PREFERRED_LOCATION, Advice.SET_ACCESSED_BY, Advice.UNSET_ACCESSED_BY)
        if needs and location is None:
            raise InvalidAdviceError(f"advice {adv.name.lower()!r} needs a location", value=location,
                                     expected='"host", "gpu" or a device ordinal')
        loc = self._location(location, "location") if location is not None else None
        self._advise(adv, loc)

    @property
    def advice(self) -> dict[str, Any]:
        """Every advice in force, read back from the backend in one query: ``{"read_mostly": bool,
        "preferred_location": "host" | "gpu:N" | None, "accessed_by": ("host", "gpu:N", ...)}``, as the three
        properties below report them one at a time."""
        advice = self._range_advice()
        return {
            "read_mostly": advice.read_mostly,
            "preferred_location": str(advice.preferred_location) if advice.preferred_location is not None else None,
            "accessed_by": tuple(str(loc) for loc in advice.accessed_by),
        }

    @property
    def read_mostly(self) -> bool:
        """ReadMostly advice: reads make read-only copies where they happen; a write collapses them."""
        return self._range_advice().read_mostly

    @read_mostly.setter
    def read_mostly(self, value: bool) -> None:
        self._check_open("set read_mostly on")
        if not isinstance(value, bool):
            raise InvalidAdviceError(f"read_mostly must be True or False, got {value!r}", value=value,
                                     expected="True or False")
        self._advise(Advice.SET_READ_MOSTLY if value else Advice.UNSET_READ_MOSTLY, None)

    @property
    def preferred_location(self) -> str | None:
        """Where the driver should keep the pages (``"host"``, ``"gpu:0"``), or None when unset."""
        loc = self._range_advice().preferred_location
        return str(loc) if loc is not None else None

    @preferred_location.setter
    def preferred_location(self, value: int | str | Location | None) -> None:
        self._check_open("set preferred_location on")
        if value is None:
            self._advise(Advice.UNSET_PREFERRED_LOCATION, None)
        else:
            self._advise(Advice.SET_PREFERRED_LOCATION, self._location(value, "preferred_location"))

    @property
    def accessed_by(self) -> tuple[str, ...]:
        """Processors that keep a mapping to the pages wherever they live."""
        return tuple(str(loc) for loc in self._range_advice().accessed_by)

    @accessed_by.setter
    def accessed_by(self, value: int | str | Location | Iterable[int | str | Location] | None) -> None:
        self._check_open("set accessed_by on")
        if value is None:
            wanted: set[Location] = set()
        elif isinstance(value, (str, Integral, Location)):
            wanted = {self._location(value, "accessed_by")}
        elif isinstance(value, Iterable):
            wanted = {self._location(v, "accessed_by") for v in value}   # validate all before changing any
        else:
            raise InvalidAdviceError(f"accessed_by must be a location, a sequence of locations or None, got {value!r}",
                                     value=value, expected="a location, a sequence of locations, or None")
        current = set(self._range_advice().accessed_by)
        for loc in sorted(current - wanted):
            self._advise(Advice.UNSET_ACCESSED_BY, loc)
        for loc in sorted(wanted - current):
            self._advise(Advice.SET_ACCESSED_BY, loc)

    # -- helpers ---------------------------------------------------------------------------------------------
    def _check_open(self, action: str) -> None:
        if self.closed:
            raise BufferClosedError(f"cannot {action} {self.label!r}: its memory was freed (the buffer is closed)")

    def _stream_handle(self, stream: object) -> int:
        """The handle of ``stream``; None is the buffer's own stream."""
        return self._stream.handle if stream is None else as_stream_handle(stream)

    def _location(self, value: Any, name: str) -> Location:
        backend = self._mr.backend
        return Location.parse(value, device_count=backend.device_count(), current_device=backend.current_device(),
                              name=name)

    def _advice(self, advice: Any) -> Advice:
        if isinstance(advice, Advice):
            return advice
        if isinstance(advice, str) and advice.lower() in _ADVICE_NAMES:
            return _ADVICE_NAMES[advice.lower()]
        valid = ", ".join(_ADVICE_NAMES)
        raise InvalidAdviceError(f"unknown advice {advice!r}; valid: {valid}", value=advice, expected=valid)

    def _advise(self, advice: Advice, location: Location | None) -> None:
        if self._size:
            self._mr.backend.advise(self._ptr, self._size, advice, location)

    def _range_advice(self) -> RangeAdvice:
        self._check_open("read advice of")
        if not self._size:
            return RangeAdvice(False, None, (), None)
        return self._mr.backend.range_advice(self._ptr, self._size)


def _as_bytes(data: Any, name: str, *, writable: bool) -> np.ndarray:
    """Contiguous host data as a flat ``uint8`` array (a view where possible)."""
    try:
        arr = np.asarray(data) if isinstance(data, np.ndarray) else np.frombuffer(memoryview(data), dtype=np.uint8)
    except TypeError:
        raise InvalidArgumentError(f"{name} must be bytes, a buffer or a NumPy array, got {type(data).__name__}",
                                   value=data, expected="bytes, a buffer or a NumPy array") from None
    if not arr.flags.c_contiguous:
        raise InvalidArgumentError(f"{name} must be C-contiguous", value=data, expected="a C-contiguous array")
    if writable and not arr.flags.writeable:
        raise InvalidArgumentError(f"{name} is read-only", value=data, expected="a writable array")
    return arr.reshape(-1).view(np.uint8)


def _check_label(label: object) -> None:
    if label is not None and not isinstance(label, str):
        raise InvalidArgumentError(f"label must be a str or None, got {shown(label)} ({type(label).__name__})",
                                   value=label, expected="a str or None")


def _address(value: Any, name: str) -> int:
    """An address argument: a whole number from 0 to 2**64 - 1."""
    if type(value) is int and 0 <= value <= MAX_SIZE:   # the common case, without the slower ABC check below
        return value
    if isinstance(value, bool) or not isinstance(value, Integral) or not 0 <= int(value) <= MAX_SIZE:
        raise InvalidArgumentError(f"{name} must be an address (an int from 0 to 2**64 - 1), got {shown(value)}",
                                   value=value, expected="an int address, or 0 for none")
    return int(value)


def _device_array(obj: Any) -> tuple[int, int]:
    """``(address, nbytes)`` of a 1-D contiguous array described by ``__cuda_array_interface__``."""
    expected = "a DeviceBuffer, or an object with __cuda_array_interface__ of a 1-D contiguous array"
    try:
        cai = obj.__cuda_array_interface__
    except AttributeError:
        raise InvalidArgumentError(f"cuda_ary must be a DeviceBuffer or have __cuda_array_interface__, got "
                                   f"{shown(obj)} ({type(obj).__name__})", value=obj, expected=expected) from None
    try:
        shape, typestr, data = tuple(cai["shape"]), cai["typestr"], cai["data"]
        strides = cai.get("strides")
        itemsize = np.dtype(typestr).itemsize
        address = data[0]
    except (TypeError, KeyError, IndexError, ValueError):
        raise InvalidArgumentError(f"cuda_ary's __cuda_array_interface__ is malformed: {shown(cai)}", value=obj,
                                   expected=expected) from None
    if len(shape) != 1 or isinstance(shape[0], bool) or not isinstance(shape[0], Integral) or int(shape[0]) < 0:
        raise InvalidArgumentError(f"only 1-D contiguous arrays can be copied (as in RMM), got shape {shown(shape)}",
                                   value=obj, expected=expected)
    items = int(shape[0])
    if strides is not None and items > 1 and tuple(strides) != (itemsize,):
        raise InvalidArgumentError(f"only contiguous arrays can be copied (as in RMM), got strides {shown(strides)} "
                                   f"for items of {itemsize} bytes", value=obj, expected=expected)
    nbytes = items * itemsize
    return (_address(address, "cuda_ary's address") if nbytes else 0), nbytes


def live_buffers() -> list[DeviceBuffer]:
    """Every buffer not yet closed, oldest first."""
    with _live_lock:
        refs = sorted(_live.items())
    return [buf for _, ref in refs if (buf := ref()) is not None and not buf.closed]


def live_generation() -> int:
    """A number that grows whenever a buffer is made or freed: while it stays the same, :func:`live_buffers`
    lists the same buffers (but for any collected meanwhile, whose memory is freed soon after). A view that
    keeps its own list reads it again only when this moves."""
    return _live_generation


def _remember_label(buffer_id: int, label: str) -> None:
    global _labels_dropped
    _labels[buffer_id] = label
    while len(_labels) > LABELS_KEPT:
        _labels.popitem(last=False)
        _labels_dropped += 1


def label_of(buffer_id: int) -> str | None:
    """The label of buffer ``buffer_id``: a live buffer's own, else the one it was made with (it may have been
    freed); None for an id no buffer of this process had, or whose label is no longer kept."""
    if isinstance(buffer_id, bool) or not isinstance(buffer_id, Integral):
        raise InvalidArgumentError(f"buffer id must be an int, got {buffer_id!r}", value=buffer_id,
                                   expected="a buffer's id")
    with _live_lock:
        ref = _live.get(int(buffer_id))
        remembered = _labels.get(int(buffer_id))
    buf = ref() if ref is not None else None
    return buf.label if buf is not None and not buf.closed else remembered


def labels_dropped() -> int:
    """Labels of freed buffers no longer kept, past :data:`LABELS_KEPT`."""
    return _labels_dropped


def find_buffer(buffer_id: int) -> DeviceBuffer:
    """The live buffer with this id, or :class:`InvalidArgumentError` naming the ids that exist."""
    if isinstance(buffer_id, bool) or not isinstance(buffer_id, Integral):
        raise InvalidArgumentError(f"buffer id must be an int, got {buffer_id!r}", value=buffer_id,
                                   expected="the id of a live buffer")
    with _live_lock:
        ref = _live.get(int(buffer_id))
    buf = ref() if ref is not None else None
    if buf is None or buf.closed:
        ids = [b.id for b in live_buffers()]
        raise InvalidArgumentError(f"no live buffer has id {buffer_id}; live ids: {ids}", value=buffer_id,
                                   expected=f"one of {ids}")
    return buf


def page_range(buffer: DeviceBuffer, first_page: int, pages: int | None) -> tuple[int, int]:
    """Pages ``first_page`` to ``first_page + pages - 1`` of ``buffer`` (to its end for None) as the ``offset``
    and ``size`` in bytes its methods take; the last page may be short."""
    total = -(-buffer.size // PAGE_SIZE)
    name = buffer.label or buffer.id
    if isinstance(first_page, bool) or not isinstance(first_page, Integral) or not 0 <= first_page < max(total, 1):
        raise InvalidArgumentError(f"first_page {first_page!r} is not a page of {name!r} ({total} pages)",
                                   value=first_page, expected=f"a page from 0 to {max(total - 1, 0)}")
    offset = int(first_page) * PAGE_SIZE
    if pages is None:
        return offset, max(buffer.size - offset, 0)
    if isinstance(pages, bool) or not isinstance(pages, Integral) or pages < 1:
        raise InvalidArgumentError(f"pages must be a whole number >= 1 or None (to the end), got {pages!r}",
                                   value=pages, expected="an int >= 1 or None")
    if first_page + pages > total:
        raise InvalidArgumentError(f"pages {first_page} to {first_page + pages - 1} run past the last page of "
                                   f"{name!r} ({total} pages)", value=pages,
                                   expected=f"at most {total - first_page} pages from page {first_page}")
    return offset, min(int(pages) * PAGE_SIZE, buffer.size - offset)
