"""A coalescing best-fit suballocator over an upstream resource: RMM's ``PoolMemoryResource``.

The pool takes large blocks from its upstream and carves allocations out of them, so most
``allocate``/``deallocate`` calls never reach the upstream (nor, on a real GPU, the driver).

How it works
------------
* Every allocation is rounded up to :data:`ALIGNMENT` (256 bytes, ``CUDA_ALLOCATION_ALIGNMENT``),
  so every address the pool returns is 256-byte aligned. (A 0-byte request never gets here: as
  ``cudaMalloc(0)`` and RMM, every resource answers it with a null pointer.)
* **Best fit.** A request takes the smallest free range that holds it (the lowest address among
  equals) and is cut from the front of that range; the rest stays free.
* **Coalescing.** A freed range merges with the free ranges just before and after it, but never
  across the edge of an upstream block: two blocks the upstream happened to place side by side
  are still two blocks, each given back whole.
* **Growth.** When no free range is large enough the pool takes a new block from the upstream and
  publishes a ``POOL_GROW`` event (``address`` = the new block, ``bytes`` = its size). As RMM does,
  an uncapped pool grows by ``max(request, pool_size())`` (it doubles), and a capped pool by
  ``max(request, remaining // 2)``, half the way to ``maximum_pool_size``. If the upstream is out of
  memory the pool halves its attempt, down to the request itself, before it gives up.
* **Failure.** A request that no free range holds and no growth can supply raises
  :class:`~uvm_lab.errors.OutOfMemoryError`, and the pool is left exactly as it was.
* **Release.** Blocks go back to the upstream on :meth:`PoolMemoryResource.release` (only when no
  allocation is live) or when the pool is garbage-collected. A freed allocation only returns its
  range to the pool; ``pool_size()`` never shrinks before then.

Speed: where the package was compiled (``uvm_lab/mr/_pool.c``), ``allocate``/``deallocate`` with int
sizes and None or int streams run in C with the same effects as the Python methods (lock, free list,
table of live allocations, one event each); any other call, a growth and every error run in Python.

Differences from RMM: allocation is not stream-ordered (one free list for all streams; the
simulated backend is synchronous); ``initial_pool_size=None`` is clamped to ``maximum_pool_size``
instead of failing; and a capped pool does not hand wholly free blocks back to make headroom
(RMM 26 does), so that an out-of-memory failure never changes the pool.
"""

from __future__ import annotations

from ..deferred import defer
from ..errors import BackendError, InvalidArgumentError, InvalidSizeError, InvalidStateError, OutOfMemoryError
from ..events.bus import _alloc_ids
from ..events.schema import EventKind
from ..units import MAX_SIZE, format_bytes, parse_size
from .base import MemoryResource
from .bestfit import COMPILED, BestFit
from .fixed_size import give_back_when_collected, publish_grow

if COMPILED:
    from ._pool import BestFit as CompiledBestFit
    from ._pool import HotPath, LiveTable, RLock

__all__ = ["ALIGNMENT", "PoolMemoryResource"]

#: Alignment of every pool allocation and of the pool's sizes: ``rmm::CUDA_ALLOCATION_ALIGNMENT``.
ALIGNMENT = 256

def _align_up(n: int) -> int:
    return (n + ALIGNMENT - 1) & -ALIGNMENT


def _align_down(n: int) -> int:
    return n & -ALIGNMENT


class PoolMemoryResource(MemoryResource):
    """A coalescing best-fit pool of memory taken from ``upstream_mr``.

    Parameters
    ----------
    upstream_mr
        The resource the pool takes its blocks from (``ManagedMemoryResource()``, ...).
    initial_pool_size
        Bytes to take from the upstream now, an int or a string such as ``"1GiB"``; a multiple of
        256. ``None`` (the default) takes half of the device's free memory, rounded down to 256
        bytes (and at most ``maximum_pool_size``); ``0`` takes nothing until the first allocation.
    maximum_pool_size
        The most the pool may ever hold from the upstream; a multiple of 256. ``None`` (the
        default) leaves only the upstream's own limit.

    Raises
    ------
    InvalidArgumentError
        ``upstream_mr`` is not a memory resource, or ``initial_pool_size > maximum_pool_size``.
    InvalidSizeError
        A size that is not a non-negative number of bytes, or not a multiple of 256.
    OutOfMemoryError
        The upstream cannot supply ``initial_pool_size``.

    Examples
    --------
    >>> pool = ul.mr.PoolMemoryResource(ul.mr.ManagedMemoryResource(), "1GiB", "4GiB")
    >>> ptr = pool.allocate("100MiB")
    >>> pool.deallocate(ptr, "100MiB")
    """

    upstream_mr: MemoryResource

    def __init__(self, upstream_mr: MemoryResource, initial_pool_size: int | str | None = None,
                 maximum_pool_size: int | str | None = None) -> None:
        if not isinstance(upstream_mr, MemoryResource):
            raise InvalidArgumentError(
                f"upstream_mr must be a uvm_lab memory resource, got {upstream_mr!r} ({type(upstream_mr).__name__})",
                value=upstream_mr, expected="a uvm_lab.mr.MemoryResource, such as ul.mr.ManagedMemoryResource()")
        maximum = None if maximum_pool_size is None else _aligned_size(maximum_pool_size, "maximum_pool_size",
                                                                        allow_zero=False)
        if initial_pool_size is None:
            device = upstream_mr.device_id
            free = upstream_mr.backend.mem_info(device if device >= 0 else upstream_mr.backend.current_device())[0]
            initial = _align_down(free // 2)
            if maximum is not None:
                initial = min(initial, maximum)
        else:
            initial = _aligned_size(initial_pool_size, "initial_pool_size", allow_zero=True)
            if maximum is not None and initial > maximum:
                raise InvalidArgumentError(
                    f"initial_pool_size ({format_bytes(initial)}) is larger than maximum_pool_size "
                    f"({format_bytes(maximum)}); give an initial size of at most the maximum",
                    value=initial_pool_size, expected=f"at most maximum_pool_size = {maximum}")

        super().__init__(upstream_mr.backend)
        self._free = BestFit()                   # the free ranges (compiled where the package was built so)
        if COMPILED and type(self._free) is CompiledBestFit:
            # The same rules as the base class's RLock and dict, kept where the hot path reaches them without a call.
            self._lock = RLock()
            self._live = LiveTable()
        self.upstream_mr = upstream_mr
        self._maximum = maximum
        self._pool_size = 0
        self._blocks: dict[int, int] = {}        # upstream block address -> size
        if initial:
            with self._lock:
                self._add_block(*self._take_from_upstream(initial, initial, 0), 0)
        self._bind_hot_path()

    def _bind_hot_path(self) -> None:
        """Where the package was compiled, run this pool's common calls in C.

        ``allocate``/``deallocate`` with int sizes and None or int streams are then served by
        ``_pool.HotPath`` with the same effects as the Python methods (lock, free list, live table,
        allocation id, one event); every other call, and every growth or error, still runs here.
        A subclass that changes any step keeps the Python methods.
        """
        if not COMPILED or type(self._free) is not CompiledBestFit:
            return
        cls = type(self)
        if any(getattr(cls, name) is not getattr(PoolMemoryResource, name)
               for name in ("allocate", "deallocate", "_allocate", "_deallocate", "_emit")):
            return
        hot = HotPath(self, self._free, self._live, _alloc_ids, self._lock, self.backend.now_ns,
                      self.backend.bus.allocator_queue(), self.device_id, int(EventKind.ALLOC), int(EventKind.FREE),
                      PoolMemoryResource.allocate, PoolMemoryResource.deallocate, InvalidStateError)
        # Instance attributes, found before the class's methods: no Python frame on the common call.
        self.allocate, self.deallocate = hot.allocate, hot.deallocate  # type: ignore[method-assign]

    # -- what the pool is -----------------------------------------------------------------------
    @property
    def maximum_pool_size(self) -> int | None:
        """The cap on :meth:`pool_size`, or None when only the upstream limits it."""
        return self._maximum

    def get_upstream(self) -> MemoryResource:
        """RMM's name for ``upstream_mr``."""
        return self.upstream_mr

    def pool_size(self) -> int:
        """Bytes the pool holds from its upstream (allocated and free)."""
        return self._pool_size

    def upstream_blocks(self) -> list[tuple[int, int]]:
        """``(address, size)`` of every block held from the upstream, by address."""
        with self._lock:
            return sorted(self._blocks.items())

    def free_ranges(self) -> list[tuple[int, int]]:
        """``(address, size)`` of every free range in the pool, by address."""
        with self._lock:
            return self._free.ranges()

    def release(self) -> None:
        """Give every block back to the upstream; the pool is empty afterwards (it grows again on use).

        Raises
        ------
        InvalidStateError
            Allocations are still live: deallocate them first.
        """
        with self._lock:
            live = sum(_align_up(size) for size, _ in self._live.values())
            self._refuse_release_while_live(detail=f" ({format_bytes(live)})")
            for ptr, size in sorted(self._blocks.items()):
                self.upstream_mr.deallocate(ptr, size)
                del self._blocks[ptr]
                self._pool_size -= size
            self._free.clear()

    # -- the suballocator (called by MemoryResource.allocate/deallocate, under self._lock) --------
    def _allocate(self, size: int, stream: int) -> int:
        need = (size + ALIGNMENT - 1) & -ALIGNMENT
        # No free range is larger than the pool (and the free list reads sizes below 2**64 only).
        ptr = self._free.take(need) if need <= self._pool_size else None
        if ptr is None:
            self._add_block(*self._grow(need, stream), stream)
            ptr = self._free.take(need)
        return ptr

    def _deallocate(self, ptr: int, size: int, stream: int) -> None:
        self._free.give(ptr, (size + ALIGNMENT - 1) & -ALIGNMENT)

    # -- growth ---------------------------------------------------------------------------------
    def _grow(self, need: int, stream: int) -> tuple[int, int]:
        """Take a block of at least ``need`` bytes from the upstream, or raise with nothing changed."""
        if need > MAX_SIZE:
            raise self._out_of_memory(need, self._free_bytes(), self._maximum or 0,
                                      "no memory resource holds more than 2**64 - 1 bytes")
        if self._maximum is None:
            return self._take_from_upstream(max(need, self._pool_size), need, stream)
        remaining = self._maximum - self._pool_size
        if need > remaining:
            raise self._out_of_memory(
                need, self._free_bytes(), self._maximum,
                f"the pool holds {format_bytes(self._pool_size)} of its maximum_pool_size "
                f"{format_bytes(self._maximum)}, and its largest free range is {format_bytes(self._largest_free())}")
        return self._take_from_upstream(max(need, _align_down(remaining // 2)), need, stream)

    def _take_from_upstream(self, try_size: int, need: int, stream: int) -> tuple[int, int]:
        """RMM's ``try_to_expand``: ask for ``try_size``, halving on failure down to ``need``."""
        while True:
            try:
                ptr = self.upstream_mr.allocate(try_size, stream)
            except OutOfMemoryError as err:
                if try_size <= need:
                    raise self._out_of_memory(
                        need, self._free_bytes(), self._maximum or 0,
                        f"its upstream {type(self.upstream_mr).__name__} cannot supply a block of "
                        f"{format_bytes(need)} ({err})") from err
                try_size = max(need, _align_down(try_size // 2))
                continue
            return ptr, try_size

    def _add_block(self, ptr: int, size: int, stream: int) -> None:
        """Make a block just taken from the upstream one free range of the pool, and say so."""
        if ptr % ALIGNMENT:
            self.upstream_mr.deallocate(ptr, size, stream)
            raise BackendError(
                f"{type(self.upstream_mr).__name__} returned address {ptr:#x}, which is not {ALIGNMENT}-byte "
                f"aligned; a pool needs an upstream whose allocations are")
        self._blocks[ptr] = size
        self._pool_size += size
        self._free.add_block(ptr, size)
        publish_grow(self, ptr, size, stream)

    def _free_bytes(self) -> int:
        return self._free.free_bytes()

    def _largest_free(self) -> int:
        return self._free.largest()

    # -- lifetime -------------------------------------------------------------------------------
    def __del__(self) -> None:
        # A destructor never raises. At interpreter exit the module's globals may already be gone
        # (RMM skips its release while the process exits), so nothing here may reach for them.
        blocks = getattr(self, "_blocks", None)
        if not blocks:
            return
        try:  # noqa: SIM105 - contextlib itself may be gone at exit
            defer(give_back_when_collected, self, blocks)
        except Exception:
            pass

    def __repr__(self) -> str:
        maximum = None if self._maximum is None else format_bytes(self._maximum)
        return (f"{type(self).__name__}({self.upstream_mr!r}, pool_size={format_bytes(self._pool_size)!r}, "
                f"maximum_pool_size={maximum!r})")


def _aligned_size(value: object, name: str, *, allow_zero: bool) -> int:
    size = parse_size(value, name=name, allow_zero=allow_zero)
    if size % ALIGNMENT:
        down, up = _align_down(size), _align_up(size)
        hint = f"{down} or {up}" if down else f"{up}"
        raise InvalidSizeError(f"{name} must be a multiple of {ALIGNMENT} bytes, got {value!r} = {size} bytes; "
                               f"use {hint}", value=value, expected=f"a multiple of {ALIGNMENT} bytes")
    return size

