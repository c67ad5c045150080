"""Routing requests by size to bins: RMM's ``BinningMemoryResource``.

Each bin is a resource that serves requests up to its size. A request goes to the smallest bin
whose size holds it; a request larger than every bin goes to the upstream. A freed pointer goes
back to the resource that handed it out (remembered per pointer, so a bin added later never
misroutes an earlier allocation).

``BinningMemoryResource(upstream, min_size_exponent=m, max_size_exponent=n)`` starts with one
:class:`~uvm_lab.mr.fixed_size.FixedSizeMemoryResource` bin for each power of two ``2**m .. 2**n``,
as RMM does; ``add_bin(size)`` adds another, ``add_bin(size, resource)`` routes to a resource of
your own.

Differences from RMM: adding a second bin of a size that already has one is a no-op without a
resource (as in RMM) but an :class:`~uvm_lab.errors.InvalidArgumentError` with one (RMM ignores
the resource silently).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from numbers import Integral

from ..errors import InvalidArgumentError, OutOfMemoryError
from ..stream import as_stream_handle
from ..units import format_bytes, parse_size
from .base import MemoryResource
from .fixed_size import FixedSizeMemoryResource, _align_up, check_upstream

__all__ = ["BinningMemoryResource"]

#: The largest exponent accepted for a bin (2**40 bytes = 1 TiB).
MAX_EXPONENT = 40


def _exponent(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or not -1 <= int(value) <= MAX_EXPONENT:
        raise InvalidArgumentError(
            f"{name} must be -1 (no bins) or an int from 0 to {MAX_EXPONENT}, got {value!r}",
            value=value, expected=f"-1 or an int in 0..{MAX_EXPONENT}")
    return int(value)


class BinningMemoryResource(MemoryResource):
    """Sends each request to the smallest bin that holds it, and larger ones to ``upstream_mr``.

    Parameters
    ----------
    upstream_mr
        The resource for requests larger than every bin, and the upstream of the bins made here.
    min_size_exponent, max_size_exponent
        With both ``>= 0``, one fixed-size bin for each power of two from ``2**min_size_exponent`` to
        ``2**max_size_exponent``. Both ``-1`` (the default) start with no bins.

    Raises
    ------
    InvalidArgumentError
        ``upstream_mr`` is not a memory resource, an exponent is out of range, only one of them is
        ``-1``, or ``min_size_exponent > max_size_exponent``.
    OutOfMemoryError
        The upstream cannot supply the bins' first chunks (the bins made so far are given back).

    Examples
    --------
    >>> mr = ul.mr.BinningMemoryResource(ul.mr.ManagedMemoryResource(), 10, 16)   # bins 1 KiB .. 64 KiB
    >>> ptr = mr.allocate(3000)          # from the 4 KiB bin
    >>> mr.deallocate(ptr, 3000)
    """

    upstream_mr: MemoryResource

    def __init__(self, upstream_mr: MemoryResource, min_size_exponent: int = -1,
                 max_size_exponent: int = -1) -> None:
        check_upstream(upstream_mr)
        lo = _exponent(min_size_exponent, "min_size_exponent")
        hi = _exponent(max_size_exponent, "max_size_exponent")
        if (lo < 0) != (hi < 0):
            raise InvalidArgumentError(
                f"min_size_exponent and max_size_exponent must both be -1 (no bins) or both be >= 0, got "
                f"{lo} and {hi}", value=(min_size_exponent, max_size_exponent), expected="both -1 or both >= 0")
        if lo > hi:
            raise InvalidArgumentError(
                f"min_size_exponent ({lo}) is larger than max_size_exponent ({hi})",
                value=min_size_exponent, expected=f"at most max_size_exponent = {hi}")
        super().__init__(upstream_mr.backend)
        self.upstream_mr = upstream_mr
        self._sizes: list[int] = []                     # bin sizes, ascending
        self._bins: dict[int, MemoryResource] = {}      # bin size -> resource
        self._owner: dict[int, MemoryResource] = {}     # live pointer -> the resource that handed it out
        made: list[FixedSizeMemoryResource] = []
        try:
            for e in range(lo, hi + 1) if lo >= 0 else ():
                made.append(FixedSizeMemoryResource(upstream_mr, 1 << e))
        except OutOfMemoryError:
            for mr in made:          # a failure keeps nothing: the bins made so far go back now
                mr.release()
            raise
        for mr in made:
            self._insert(mr.block_size, mr)

    # -- bins -----------------------------------------------------------------------------------
    def add_bin(self, size: int | str, bin_resource: MemoryResource | None = None) -> None:
        """Route requests of up to ``size`` bytes (rounded up to 256) to ``bin_resource``.

        With ``bin_resource=None`` the bin is a new ``FixedSizeMemoryResource(upstream_mr, size)``,
        and a size that already has a bin is left as it is (as in RMM).

        Raises
        ------
        InvalidSizeError
            ``size`` is not a positive size.
        InvalidArgumentError
            ``bin_resource`` is not a memory resource of this backend, or ``size`` already has a bin.
        OutOfMemoryError
            The upstream cannot supply a new fixed-size bin's first chunk (no bin is added).
        """
        bin_size = _align_up(parse_size(size, name="size", allow_zero=False))
        if bin_resource is None:
            if bin_size in self._bins:
                return
            bin_resource = FixedSizeMemoryResource(self.upstream_mr, bin_size)
        else:
            check_upstream(bin_resource, "bin_resource")
            if bin_resource.backend is not self.backend:
                raise InvalidArgumentError(
                    f"bin_resource {bin_resource!r} was made on another backend; make it again after use_backend()",
                    value=bin_resource, expected="a resource of this resource's backend")
            if bin_size in self._bins:
                raise InvalidArgumentError(
                    f"a bin of {format_bytes(bin_size)} already exists ({self._bins[bin_size]!r})",
                    value=size, expected=f"a size other than {sorted(self._bins)}")
        with self._lock:
            self._insert(bin_size, bin_resource)

    def _insert(self, size: int, mr: MemoryResource) -> None:
        insort(self._sizes, size)
        self._bins[size] = mr

    @property
    def bin_mrs(self) -> list[MemoryResource]:
        """The bins' resources, smallest bin first."""
        return [self._bins[s] for s in self._sizes]

    @property
    def bin_sizes(self) -> list[int]:
        """The bins' sizes, ascending."""
        return list(self._sizes)

    def get_resource(self, nbytes: int | str) -> MemoryResource:
        """The resource a request of ``nbytes`` goes to: the smallest bin that holds it, else the upstream."""
        size = parse_size(nbytes, name="nbytes")
        i = bisect_left(self._sizes, size)
        return self._bins[self._sizes[i]] if i < len(self._sizes) else self.upstream_mr

    # -- routing --------------------------------------------------------------------------------
    # A router publishes no events of its own: the bin or the upstream that serves a request already
    # published its ALLOC / FREE / ALLOC_FAILURE. It still keeps the table of live pointers, so a
    # double free is caught here and named.
    def allocate(self, nbytes: int | str, stream: int | None = None) -> int:
        size = parse_size(nbytes, name="nbytes")
        s = as_stream_handle(stream)
        if size == 0:
            return 0
        with self._lock:
            i = bisect_left(self._sizes, size)
            mr = self._bins[self._sizes[i]] if i < len(self._sizes) else self.upstream_mr
            ptr = mr.allocate(size, s)
            self._live[ptr] = (size, mr.allocation_id(ptr))
            self._owner[ptr] = mr
            return ptr

    def deallocate(self, ptr: int, nbytes: int | str, stream: int | None = None) -> None:
        size = parse_size(nbytes, name="nbytes")
        s = as_stream_handle(stream)
        if ptr == 0 and size == 0:
            return
        with self._lock:
            self._held(ptr, size, nbytes)
            self._owner[ptr].deallocate(ptr, size, s)
            del self._live[ptr]
            del self._owner[ptr]

    def __repr__(self) -> str:
        bins = ", ".join(format_bytes(s) for s in self._sizes)
        return f"{type(self).__name__}({self.upstream_mr!r}, bins=[{bins}])"
