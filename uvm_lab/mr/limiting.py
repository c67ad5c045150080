"""A cap on the bytes outstanding through a resource: RMM's ``LimitingResourceAdaptor``.

As in RMM every allocation counts rounded up to 256 bytes (``CUDA_ALLOCATION_ALIGNMENT``), so
:meth:`LimitingResourceAdaptor.get_allocated_bytes` reports the aligned total, and a request that
would take it past ``allocation_limit`` raises :class:`~uvm_lab.errors.OutOfMemoryError` (with
``size``, ``free`` = what is left under the limit, and ``limit``) without reaching the upstream.
A refusal publishes an ALLOC_FAILURE event, as a failing resource does.
"""

from __future__ import annotations

from ..events.schema import EventKind
from ..units import format_bytes, parse_size
from .base import MemoryResource, ResourceAdaptor

__all__ = ["LimitingResourceAdaptor"]

ALIGNMENT = 256


class LimitingResourceAdaptor(ResourceAdaptor):
    """Refuses allocations that would take the bytes outstanding through it past ``allocation_limit``.

    Parameters
    ----------
    upstream_mr
        The resource that hands out the memory.
    allocation_limit
        The most bytes (counted in 256-byte units) that may be outstanding, an int or a string such
        as ``"1GiB"``.

    Raises
    ------
    InvalidArgumentError
        ``upstream_mr`` is not a memory resource.
    InvalidSizeError
        ``allocation_limit`` is not a non-negative size.

    Examples
    --------
    >>> mr = ul.mr.LimitingResourceAdaptor(ul.mr.ManagedMemoryResource(), "1GiB")
    >>> mr.allocate("2GiB")             # OutOfMemoryError: past the limit
    """

    def __init__(self, upstream_mr: MemoryResource, allocation_limit: int | str) -> None:
        limit = parse_size(allocation_limit, name="allocation_limit")
        super().__init__(upstream_mr)
        self._limit = limit
        self._allocated = 0

    def get_allocated_bytes(self) -> int:
        """Bytes outstanding through this adaptor, each allocation rounded up to 256."""
        return self._allocated

    def get_allocation_limit(self) -> int:
        """The limit, in bytes."""
        return self._limit

    def _allocate(self, size: int, stream: int) -> int:
        aligned = (size + ALIGNMENT - 1) & -ALIGNMENT
        with self._lock:
            if self._allocated + aligned > self._limit:
                free = self._limit - self._allocated
                self._emit(EventKind.ALLOC_FAILURE, 0, size, 0, stream)
                raise self._out_of_memory(
                    size, free, self._limit,
                    f"{format_bytes(self._allocated)} of its allocation_limit {format_bytes(self._limit)} "
                    f"are allocated, leaving {format_bytes(free)}")
            self._allocated += aligned     # reserved first, as RMM does, so concurrent callers see it
        try:
            return self.upstream_mr.allocate(size, stream)
        except BaseException:
            with self._lock:
                self._allocated -= aligned
            raise

    def _deallocate(self, ptr: int, size: int, stream: int) -> None:
        self.upstream_mr.deallocate(ptr, size, stream)
        with self._lock:
            self._allocated -= (size + ALIGNMENT - 1) & -ALIGNMENT

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.upstream_mr!r}, allocation_limit={format_bytes(self._limit)!r})"
