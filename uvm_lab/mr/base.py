"""Memory resources: RMM's ``allocate(nbytes, stream) -> ptr`` / ``deallocate(ptr, nbytes, stream)``.

``*MemoryResource`` classes hand out memory and publish ALLOC / FREE / ALLOC_FAILURE events;
``*ResourceAdaptor`` classes wrap an upstream resource and add behaviour (prefetch, statistics ...)
without handing out memory of their own. The chain is explicit: every adaptor has ``upstream_mr``,
and :func:`resource_chain` lists the whole chain top-down.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from numbers import Integral
from typing import TYPE_CHECKING

from ..errors import DoubleFreeError, InvalidArgumentError, InvalidStateError, OutOfMemoryError
from ..events.bus import ALLOCATOR_RECORD, _alloc_ids
from ..events.schema import EventKind
from ..events.sources import capture
from ..stream import as_stream_handle
from ..units import MAX_SIZE, format_bytes, parse_size

if TYPE_CHECKING:
    from ..backends.base import Backend

__all__ = ["MemoryResource", "ResourceAdaptor", "resource_chain"]


def device_of(backend: Backend, device: object) -> int:
    """The ordinal a leaf resource allocates on: ``device``, or the backend's current one when None."""
    if device is None:
        return backend.current_device()
    count = backend.device_count()
    if isinstance(device, bool) or not isinstance(device, Integral) or not 0 <= int(device) < count:
        raise InvalidArgumentError(f"device must be a device ordinal 0..{count - 1} on this "
                                   f"{'simulated ' if backend.is_simulated else ''}machine, got {device!r}",
                                   value=device, expected=f"None (the current device) or 0..{count - 1}")
    return int(device)

# Plain ints: an enum member costs an attribute lookup on every allocation.
_ALLOC, _FREE, _ALLOC_FAILURE = int(EventKind.ALLOC), int(EventKind.FREE), int(EventKind.ALLOC_FAILURE)
_pack = ALLOCATOR_RECORD.pack


class MemoryResource:
    """Base of every resource. Subclasses implement ``_allocate`` and ``_deallocate``.

    The public methods validate, keep the table of live allocations (so a double free is caught
    and named), and publish the allocator events.
    """

    backend: Backend
    # Looked up once, at the first event (_emit); absent until then.
    _event_device: int
    _now_ns: Callable[[], int]
    _event_queue: Callable[[bytes], object]
    #: The resource this one takes memory from (adaptors and suballocators), or None for a leaf.
    upstream_mr: MemoryResource | None = None

    def __init__(self, backend: Backend, device: int | None = None) -> None:
        self.backend = backend
        self._device = device                           # a leaf's own device; None: the upstream's
        self._live: dict[int, tuple[int, int]] = {}     # ptr -> (size, alloc_id)
        self._lock = threading.RLock()

    # -- what the resource hands out ------------------------------------------------------------
    @property
    def is_managed(self) -> bool:
        """Whether allocations are unified (managed) memory that can migrate and take advice."""
        return self.upstream_mr.is_managed if self.upstream_mr is not None else False

    @property
    def device_id(self) -> int:
        """The device this resource allocates on (-1 for host memory): a leaf's own, an adaptor's upstream's."""
        if self.upstream_mr is not None:
            return self.upstream_mr.device_id
        return self._device if self._device is not None else self.backend.current_device()

    # -- RMM's interface --------------------------------------------------------------------------
    def allocate(self, nbytes: int | str, stream: int | None = None) -> int:
        """Allocate ``nbytes`` (an int or a string such as ``"2GiB"``) and return the address."""
        # The hot path is a plain positive int and the default stream; anything else is validated in full.
        size = nbytes if type(nbytes) is int and 0 < nbytes <= MAX_SIZE else parse_size(nbytes, name="nbytes")
        s = 0 if stream is None else as_stream_handle(stream)
        if size == 0:
            return 0  # as cudaMalloc(0) and RMM: a null pointer, nothing to track
        lock = self._lock
        lock.acquire()   # acquire/release: half the cost of ``with`` on this path
        try:
            ptr = self._allocate(size, s)
            alloc_id = next(_alloc_ids)
            self._live[ptr] = (size, alloc_id)
        except OutOfMemoryError:
            self._emit(_ALLOC_FAILURE, 0, size, 0, s)
            raise
        finally:
            lock.release()
        self._emit(_ALLOC, ptr, size, alloc_id, s)
        return ptr

    def deallocate(self, ptr: int, nbytes: int | str, stream: int | None = None) -> None:
        """Give back ``ptr``, which this resource returned for ``nbytes`` bytes."""
        size = nbytes if type(nbytes) is int and 0 < nbytes <= MAX_SIZE else parse_size(nbytes, name="nbytes")
        s = 0 if stream is None else as_stream_handle(stream)
        if ptr == 0 and size == 0:
            return
        lock = self._lock
        lock.acquire()
        try:
            held = self._live.get(ptr) if type(ptr) is int else None
            if held is None or held[0] != size:
                held = self._held(ptr, size, nbytes)   # raises, naming what is wrong
            self._deallocate(ptr, size, s)
            del self._live[ptr]
        finally:
            lock.release()
        self._emit(_FREE, ptr, size, held[1], s)

    def _held(self, ptr: int, size: int, nbytes: object) -> tuple[int, int]:
        """What the live table holds for ``ptr``, checked against the size given back (call with the lock held)."""
        held = self._live.get(ptr) if type(ptr) is int or isinstance(ptr, Integral) else None
        if held is None:
            raise DoubleFreeError(
                f"{type(self).__name__} does not hold pointer {ptr!r}: it was already freed, "
                f"or was allocated by another resource", ptr=ptr if isinstance(ptr, int) else 0)
        if held[0] != size:
            raise InvalidArgumentError(
                f"pointer {ptr:#x} was allocated with {held[0]} bytes, but deallocate was given {size}",
                value=nbytes, expected=f"{held[0]}")
        return held

    def allocation_id(self, ptr: int) -> int:
        """The event id of the live allocation at ``ptr`` (what ALLOC published)."""
        held = self._live.get(ptr)
        if held is None:
            raise DoubleFreeError(f"{type(self).__name__} holds no allocation at {ptr!r}", ptr=ptr)
        return held[1]

    def get_allocated_bytes(self) -> int:
        """Bytes currently handed out by this resource."""
        with self._lock:
            return sum(size for size, _ in self._live.values())

    # -- for subclasses -------------------------------------------------------------------------
    def _allocate(self, size: int, stream: int) -> int:
        raise NotImplementedError

    def _deallocate(self, ptr: int, size: int, stream: int) -> None:
        raise NotImplementedError

    def _emit(self, kind: int, ptr: int, size: int, alloc_id: int, stream: int) -> None:
        try:
            device, now, queue = self._event_device, self._now_ns, self._event_queue
        except AttributeError:
            # A resource's device, clock and bus never change: look them up (through the chain) once.
            device, now = self._event_device, self._now_ns = self.device_id, self.backend.now_ns
            queue = self._event_queue = self.backend.bus.allocator_queue().extend
        queue(_pack(kind, device, now(), ptr, size, alloc_id, stream, capture()))

    def _refuse_release_while_live(self, what: str = "allocation(s)", detail: str = "") -> None:
        """A suballocator's ``release()`` gives nothing back while any of it is handed out (lock held)."""
        if self._live:
            raise InvalidStateError(f"cannot release {type(self).__name__}: {len(self._live)} {what}{detail} "
                                    f"are still live; deallocate them first")

    def _out_of_memory(self, size: int, free: int, limit: int, why: str) -> OutOfMemoryError:
        return OutOfMemoryError(
            f"{type(self).__name__} cannot allocate {format_bytes(size)} ({size} bytes): {why}",
            size=size, free=free, limit=limit)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class ResourceAdaptor(MemoryResource):
    """A resource that wraps ``upstream_mr`` and hands out the upstream's memory.

    Adaptors publish no ALLOC/FREE of their own (the upstream did); they add behaviour around it.
    """

    upstream_mr: MemoryResource

    def __init__(self, upstream_mr: MemoryResource) -> None:
        if not isinstance(upstream_mr, MemoryResource):
            raise InvalidArgumentError(
                f"upstream_mr must be a uvm_lab memory resource, got {upstream_mr!r} ({type(upstream_mr).__name__})",
                value=upstream_mr, expected="a uvm_lab.mr.MemoryResource")
        super().__init__(upstream_mr.backend)
        self.upstream_mr = upstream_mr

    def get_upstream(self) -> MemoryResource:
        """RMM's name for ``upstream_mr``."""
        return self.upstream_mr

    def allocate(self, nbytes: int | str, stream: int | None = None) -> int:
        size = nbytes if type(nbytes) is int and nbytes > 0 else parse_size(nbytes, name="nbytes")
        return self._allocate(size, 0 if stream is None else as_stream_handle(stream))

    def deallocate(self, ptr: int, nbytes: int | str, stream: int | None = None) -> None:
        size = nbytes if type(nbytes) is int and nbytes > 0 else parse_size(nbytes, name="nbytes")
        self._deallocate(ptr, size, 0 if stream is None else as_stream_handle(stream))

    def allocation_id(self, ptr: int) -> int:
        return self.upstream_mr.allocation_id(ptr)

    def get_allocated_bytes(self) -> int:
        return self.upstream_mr.get_allocated_bytes()

    def _allocate(self, size: int, stream: int) -> int:
        return self.upstream_mr.allocate(size, stream)

    def _deallocate(self, ptr: int, size: int, stream: int) -> None:
        self.upstream_mr.deallocate(ptr, size, stream)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.upstream_mr!r})"


def resource_chain(mr: MemoryResource) -> list[MemoryResource]:
    """The chain from ``mr`` down to the resource that owns the memory: ``[mr, upstream, ...]``."""
    chain = [mr]
    # Suballocators (pool, arena, binning) are resources of their own but still have an upstream.
    while (upstream := getattr(chain[-1], "upstream_mr", None)) is not None:
        chain.append(upstream)
    return chain
