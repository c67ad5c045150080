"""Blocks of one size, carved from chunks of the upstream: RMM's ``FixedSizeMemoryResource``.

The resource takes chunks of ``blocks_to_preallocate * block_size`` bytes from its upstream and
hands out whole blocks from a free list, so every allocation costs the same whatever its size (up
to ``block_size``) and a freed block is reused at once.

* ``block_size`` is rounded up to a multiple of 256 bytes (``CUDA_ALLOCATION_ALIGNMENT``), as RMM does.
* A request larger than ``block_size`` raises :class:`~uvm_lab.errors.InvalidSizeError`: it is a
  wrong use of the resource, not a shortage (RMM refuses it too).
* One chunk is taken at construction; when the free list runs dry another chunk is taken (a
  ``POOL_GROW`` event). If the upstream cannot supply a whole chunk the resource halves its
  attempt, down to one block, before it raises :class:`~uvm_lab.errors.OutOfMemoryError`; a
  failure leaves the resource as it was. (RMM fails at once: the halving is uvm_lab's.)
* Chunks go back to the upstream on :meth:`FixedSizeMemoryResource.release` (no allocation live)
  or when the resource is garbage-collected.
"""

from __future__ import annotations

import warnings
from numbers import Integral

from ..deferred import defer
from ..errors import BackendError, InvalidArgumentError, InvalidSizeError, OutOfMemoryError
from ..events.schema import EventKind, make_events
from ..events.sources import capture
from ..units import format_bytes, parse_size
from .base import MemoryResource

__all__ = ["FixedSizeMemoryResource"]

ALIGNMENT = 256


def _align_up(n: int) -> int:
    return (n + ALIGNMENT - 1) & -ALIGNMENT


def check_upstream(upstream_mr: object, name: str = "upstream_mr") -> MemoryResource:
    """``upstream_mr`` if it is a memory resource, else an InvalidArgumentError naming it."""
    if not isinstance(upstream_mr, MemoryResource):
        raise InvalidArgumentError(
            f"{name} must be a uvm_lab memory resource, got {upstream_mr!r} ({type(upstream_mr).__name__})",
            value=upstream_mr, expected="a uvm_lab.mr.MemoryResource, such as ul.mr.ManagedMemoryResource()")
    return upstream_mr


def publish_grow(mr: MemoryResource, ptr: int, size: int, stream: int) -> None:
    """Say that ``mr`` took the block ``ptr`` of ``size`` bytes from its upstream (a POOL_GROW event)."""
    upstream = mr.upstream_mr
    assert upstream is not None
    now = mr.backend.now_ns()
    mr.backend.bus.publish(make_events(
        1, kind=EventKind.POOL_GROW, start=now, end=now, address=ptr, bytes=size, value=size,
        alloc_id=upstream.allocation_id(ptr), stream=stream, dst=mr.device_id, source=capture()))


def check_aligned(mr: MemoryResource, ptr: int, size: int, stream: int) -> None:
    """Give a just-taken upstream block back and raise if it is not 256-byte aligned."""
    if ptr % ALIGNMENT:
        upstream = mr.upstream_mr
        assert upstream is not None
        upstream.deallocate(ptr, size, stream)
        raise BackendError(
            f"{type(upstream).__name__} returned address {ptr:#x}, which is not {ALIGNMENT}-byte aligned; "
            f"{type(mr).__name__} needs an upstream whose allocations are")


def give_back_when_collected(mr: MemoryResource, blocks: dict[int, int]) -> None:
    """What a suballocator's destructor does: blocks back to the upstream first, then a warning."""
    upstream = mr.upstream_mr
    live = len(mr._live)
    failure: Exception | None = None
    for ptr, size in list(blocks.items()):
        try:
            assert upstream is not None
            upstream.deallocate(ptr, size)
            del blocks[ptr]
        except Exception as err:
            failure = err
    if failure is not None:
        warnings.warn(f"{type(mr).__name__} could not give {len(blocks)} block(s) back to its upstream "
                      f"({failure!r}); the memory may have leaked", ResourceWarning, stacklevel=3)
    elif live:
        warnings.warn(f"{type(mr).__name__} was garbage-collected with {live} live allocation(s); "
                      f"their memory went back to the upstream", ResourceWarning, stacklevel=3)


class FixedSizeMemoryResource(MemoryResource):
    """Hands out blocks of ``block_size`` bytes taken, a chunk at a time, from ``upstream_mr``.

    Parameters
    ----------
    upstream_mr
        The resource the chunks come from.
    block_size
        The size of every block, an int or a string such as ``"1MiB"`` (the default); rounded up to
        a multiple of 256 bytes.
    blocks_to_preallocate
        Blocks per chunk taken from the upstream, the first chunk at construction (default 128).

    Raises
    ------
    InvalidArgumentError
        ``upstream_mr`` is not a memory resource, or ``blocks_to_preallocate`` is not a positive int.
    InvalidSizeError
        ``block_size`` is not a positive size.
    OutOfMemoryError
        The upstream cannot supply even one block.

    Examples
    --------
    >>> mr = ul.mr.FixedSizeMemoryResource(ul.mr.ManagedMemoryResource(), "64KiB", 16)
    >>> ptr = mr.allocate(1000)        # takes a whole 64 KiB block
    >>> mr.deallocate(ptr, 1000)
    """

    upstream_mr: MemoryResource

    def __init__(self, upstream_mr: MemoryResource, block_size: int | str = "1MiB",
                 blocks_to_preallocate: int = 128) -> None:
        check_upstream(upstream_mr)
        block: int = _align_up(parse_size(block_size, name="block_size", allow_zero=False))
        if (isinstance(blocks_to_preallocate, bool) or not isinstance(blocks_to_preallocate, Integral)
                or blocks_to_preallocate < 1):
            raise InvalidArgumentError(
                f"blocks_to_preallocate must be a positive int, got {blocks_to_preallocate!r}",
                value=blocks_to_preallocate, expected="an int >= 1")
        super().__init__(upstream_mr.backend)
        self.upstream_mr = upstream_mr
        self._block_size: int = block
        self._blocks_per_chunk: int = int(blocks_to_preallocate)
        self._chunks: dict[int, int] = {}     # upstream chunk address -> size
        self._free: list[int] = []            # free block addresses (a stack: the last freed is reused first)
        with self._lock:
            self._grow(0)

    # -- what the resource is -------------------------------------------------------------------
    def get_block_size(self) -> int:
        """The size of every block (RMM's name)."""
        return self._block_size

    @property
    def block_size(self) -> int:
        """The size of every block, a multiple of 256 bytes."""
        return self._block_size

    @property
    def blocks_to_preallocate(self) -> int:
        """Blocks per chunk taken from the upstream."""
        return self._blocks_per_chunk

    def pool_size(self) -> int:
        """Bytes held from the upstream (blocks handed out and free)."""
        return sum(self._chunks.values())

    def free_blocks(self) -> int:
        """How many blocks are free."""
        return len(self._free)

    def upstream_blocks(self) -> list[tuple[int, int]]:
        """``(address, size)`` of every chunk held from the upstream, by address."""
        with self._lock:
            return sorted(self._chunks.items())

    def release(self) -> None:
        """Give every chunk back to the upstream (the resource takes a chunk again on its next use).

        Raises
        ------
        InvalidStateError
            Allocations are still live: deallocate them first.
        """
        with self._lock:
            self._refuse_release_while_live("block(s)")
            for ptr, size in sorted(self._chunks.items()):
                self.upstream_mr.deallocate(ptr, size)
                del self._chunks[ptr]
            self._free.clear()

    # -- the suballocator -------------------------------------------------------------------------
    def _allocate(self, size: int, stream: int) -> int:
        if size > self._block_size:
            raise InvalidSizeError(
                f"{type(self).__name__} hands out blocks of {format_bytes(self._block_size)}; a request of "
                f"{format_bytes(size)} ({size} bytes) is larger. Use a BinningMemoryResource to route large "
                f"requests elsewhere", value=size, expected=f"at most block_size = {self._block_size}")
        if not self._free:
            self._grow(stream)
        return self._free.pop()

    def _deallocate(self, ptr: int, size: int, stream: int) -> None:
        self._free.append(ptr)

    def _grow(self, stream: int) -> None:
        """Take a chunk (halving down to one block if the upstream is short), or raise with nothing changed."""
        blocks = self._blocks_per_chunk
        while True:
            try:
                ptr = self.upstream_mr.allocate(blocks * self._block_size, stream)
            except OutOfMemoryError as err:
                if blocks == 1:
                    raise self._out_of_memory(
                        self._block_size, 0, 0,
                        f"no block is free and its upstream {type(self.upstream_mr).__name__} cannot supply "
                        f"another ({err})") from err
                blocks //= 2
                continue
            break
        chunk = blocks * self._block_size
        check_aligned(self, ptr, chunk, stream)
        self._chunks[ptr] = chunk
        # Pushed highest first, so blocks are handed out from the chunk's start.
        self._free.extend(range(ptr + chunk - self._block_size, ptr - 1, -self._block_size))
        publish_grow(self, ptr, chunk, stream)

    # -- lifetime -------------------------------------------------------------------------------
    def __del__(self) -> None:
        chunks = getattr(self, "_chunks", None)
        if not chunks:
            return
        try:  # noqa: SIM105 - contextlib itself may be gone at exit
            defer(give_back_when_collected, self, chunks)
        except Exception:
            pass

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.upstream_mr!r}, block_size={format_bytes(self._block_size)!r}, "
                f"blocks_to_preallocate={self._blocks_per_chunk})")
