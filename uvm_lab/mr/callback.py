"""Allocation by Python functions of your own: RMM's ``CallbackMemoryResource``.

For debugging and teaching: every allocation and free calls into Python. The callbacks usually take
their memory from another resource, whose own events then appear beside this one's::

    base = ul.mr.ManagedMemoryResource()
    def allocate(size, stream):
        print(f"Allocating {size} bytes")
        return base.allocate(size, stream)
    def deallocate(ptr, size, stream):
        print(f"Deallocating {size} bytes")
        base.deallocate(ptr, size, stream)
    ul.mr.set_current_device_resource(ul.mr.CallbackMemoryResource(allocate, deallocate))
"""

from __future__ import annotations

from collections.abc import Callable
from numbers import Integral
from typing import Any

from ..backends import get_backend
from ..errors import InvalidArgumentError, InvalidStateError, OutOfMemoryError, shown
from ..stream import DEFAULT_STREAM, Stream
from ..units import MAX_SIZE, format_bytes
from .base import MemoryResource

__all__ = ["CallbackMemoryResource"]


def _stream(handle: int) -> Stream:
    return DEFAULT_STREAM if handle == 0 else Stream(handle)


class CallbackMemoryResource(MemoryResource):
    """Allocates with ``allocate_func(size, stream) -> ptr`` and frees with ``deallocate_func(ptr, size, stream)``.

    Parameters
    ----------
    allocate_func
        Called with the size in bytes and the :class:`~uvm_lab.Stream`; returns the address (an int).
    deallocate_func
        Called with the address, the size and the stream.

    As in RMM, an exception from a callback propagates to the caller and the call changes nothing. This
    resource publishes ALLOC and FREE events for what the callbacks hand out, as any resource does; a
    returned address that is no int, a null address for a non-zero size (an :class:`OutOfMemoryError`, as a
    null from an allocator means), or one already handed out and not freed, is refused.

    Raises
    ------
    InvalidArgumentError
        Either callback is not callable.
    """

    def __init__(self, allocate_func: Callable[[int, Stream], int],
                 deallocate_func: Callable[[int, int, Stream], Any]) -> None:
        for name, func, signature in (("allocate_func", allocate_func, "allocate_func(size, stream) -> ptr"),
                                      ("deallocate_func", deallocate_func, "deallocate_func(ptr, size, stream)")):
            if not callable(func):
                raise InvalidArgumentError(f"{name} must be callable as {signature}, got {shown(func)}",
                                           value=func, expected=f"a callable: {signature}")
        super().__init__(get_backend())
        self._allocate_func = allocate_func
        self._deallocate_func = deallocate_func

    def _allocate(self, size: int, stream: int) -> int:
        ptr = self._allocate_func(size, _stream(stream))
        if isinstance(ptr, bool) or not isinstance(ptr, Integral) or not 0 <= int(ptr) <= MAX_SIZE:
            raise InvalidArgumentError(f"allocate_func returned {shown(ptr)} for {size} bytes, not an address",
                                       value=ptr, expected="an int address from 0 to 2**64 - 1")
        if not ptr:
            raise OutOfMemoryError(f"allocate_func returned a null address for {format_bytes(size)} ({size} bytes)",
                                   size=size)
        if int(ptr) in self._live:   # the caller holds the lock (MemoryResource.allocate)
            raise InvalidStateError(f"allocate_func returned {int(ptr):#x}, which this resource already handed out "
                                    f"and was not given back")
        return int(ptr)

    def _deallocate(self, ptr: int, size: int, stream: int) -> None:
        self._deallocate_func(ptr, size, _stream(stream))

    def __repr__(self) -> str:
        return f"CallbackMemoryResource({self._allocate_func!r}, {self._deallocate_func!r})"
