"""A suballocator built for low fragmentation: RMM's ``ArenaMemoryResource``, simplified.

How it works
------------
* **One global arena.** At construction the resource takes one region of ``arena_size`` bytes from
  its upstream (a ``POOL_GROW`` event) and never grows: when the region is used up, allocation
  fails with :class:`~uvm_lab.errors.OutOfMemoryError`, as RMM's arena does.
* **Small requests** (up to :data:`SMALL_MAX`, 256 KiB) are rounded up to a size class (256, 512,
  768 and 1024 bytes, then four classes per doubling: 1.25, 1.5, 1.75 and 2 KiB ...), and served
  from **superblocks** of :data:`SUPERBLOCK_SIZE` (1 MiB) cut into equal slots of one class. A
  superblock is taken from the global arena when its class has no free slot, and goes back as
  soon as its last slot is freed, so memory freed by one size is soon usable by any other.
* **Large requests** are rounded up to 256 bytes and cut best-fit (the smallest free range that
  holds them, the lowest address among equals) from the global arena; freed ranges coalesce.
* **Failure** leaves the arena exactly as it was. With ``dump_log_on_failure=True`` a description
  of the arena (:meth:`ArenaMemoryResource.dump_memory_log`) is appended to
  ``rmm_arena_memory_dump.log`` in the working directory, RMM's file name.

Simplified against RMM: there are no per-thread (per-stream) arenas: one set of superblocks
serves every thread under the resource's lock (the simulator is synchronous, so RMM's reason for
them, contention between streams, does not arise). RMM also keeps a few empty superblocks per
thread arena; here an empty superblock goes straight back to the global arena.
"""

from __future__ import annotations

from bisect import bisect_left, insort

from ..deferred import defer
from ..errors import InvalidArgumentError, InvalidSizeError
from ..units import format_bytes, parse_size
from .base import MemoryResource
from .fixed_size import ALIGNMENT, _align_up, check_aligned, check_upstream, give_back_when_collected, publish_grow

__all__ = ["SIZE_CLASSES", "SMALL_MAX", "SUPERBLOCK_SIZE", "ArenaMemoryResource", "FreeRanges"]

#: The unit the global arena hands to size classes.
SUPERBLOCK_SIZE = 1 << 20
#: The largest request served from a size class; larger ones come straight from the global arena.
SMALL_MAX = SUPERBLOCK_SIZE // 4
#: The size classes, ascending: every small request is rounded up to one of these.
SIZE_CLASSES: tuple[int, ...] = (256, 512, 768, *sorted(
    {p * q // 4 for p in (1 << e for e in range(10, 18)) for q in (4, 5, 6, 7, 8) if p * q // 4 <= SMALL_MAX}))
#: The file that ``dump_log_on_failure`` appends to, RMM's name.
DUMP_FILE_NAME = "rmm_arena_memory_dump.log"


class FreeRanges:
    """Free address ranges inside blocks: best-fit take, coalescing give, never across a block edge."""

    def __init__(self) -> None:
        self.blocks: dict[int, int] = {}       # block address -> size
        self._keys: list[tuple[int, int]] = []  # sorted (size, address) of every free range
        self._start: dict[int, int] = {}        # free range address -> size
        self._end: dict[int, int] = {}          # free range end -> address

    def add_block(self, ptr: int, size: int) -> None:
        self.blocks[ptr] = size
        self._insert(ptr, size)

    def is_free(self, ptr: int) -> bool:
        """Whether the block at ``ptr`` is wholly free."""
        return self._start.get(ptr) == self.blocks[ptr]

    def remove_block(self, ptr: int) -> None:
        """Forget a wholly free block."""
        size = self.blocks.pop(ptr)
        self._remove(ptr, size)

    def take(self, need: int) -> int | None:
        """The address of ``need`` bytes cut from the smallest free range that holds them, or None."""
        i = bisect_left(self._keys, (need, -1))
        if i == len(self._keys):
            return None
        have, ptr = self._keys[i]
        self._remove(ptr, have)
        if have > need:
            self._insert(ptr + need, have - need)
        return ptr

    def give(self, ptr: int, size: int) -> None:
        """Make ``size`` bytes at ``ptr`` free again, merged with free neighbours in the same block."""
        start, end = ptr, ptr + size
        if ptr not in self.blocks and (below := self._end.get(ptr)) is not None:
            self._remove(below, ptr - below)
            start = below
        if end not in self.blocks and (above := self._start.get(end)) is not None:
            self._remove(end, above)
            end += above
        self._insert(start, end - start)

    def free_bytes(self) -> int:
        return sum(self._start.values())

    def largest(self) -> int:
        return self._keys[-1][0] if self._keys else 0

    def ranges(self) -> list[tuple[int, int]]:
        """``(address, size)`` of every free range, by address."""
        return sorted(self._start.items())

    def _insert(self, ptr: int, size: int) -> None:
        insort(self._keys, (size, ptr))
        self._start[ptr] = size
        self._end[ptr + size] = ptr

    def _remove(self, ptr: int, size: int) -> None:
        del self._keys[bisect_left(self._keys, (size, ptr))]
        del self._start[ptr]
        del self._end[ptr + size]


def _size_class(size: int) -> int:
    return SIZE_CLASSES[bisect_left(SIZE_CLASSES, size)]


class ArenaMemoryResource(MemoryResource):
    """A fixed arena from ``upstream_mr``, cut into size-class superblocks and best-fit large ranges.

    Parameters
    ----------
    upstream_mr
        The resource the arena is taken from (``ManagedMemoryResource()``, ...).
    arena_size
        Bytes to take from the upstream, an int or a string such as ``"1GiB"``; a multiple of 256,
        at least one superblock (1 MiB). ``None`` (the default) takes half of the device's free
        memory, rounded down to 256 bytes, as RMM does.
    dump_log_on_failure
        Append a description of the arena to ``rmm_arena_memory_dump.log`` when an allocation fails.

    Raises
    ------
    InvalidArgumentError
        ``upstream_mr`` is not a memory resource, or ``dump_log_on_failure`` is not a bool.
    InvalidSizeError
        ``arena_size`` is not a size, not a multiple of 256, or smaller than 1 MiB.
    OutOfMemoryError
        The upstream cannot supply ``arena_size``.

    Examples
    --------
    >>> arena = ul.mr.ArenaMemoryResource(ul.mr.ManagedMemoryResource(), "256MiB")
    >>> ptr = arena.allocate(1000)        # a 1 KiB slot of a superblock
    >>> arena.deallocate(ptr, 1000)
    """

    upstream_mr: MemoryResource

    def __init__(self, upstream_mr: MemoryResource, arena_size: int | str | None = None,
                 dump_log_on_failure: bool = False) -> None:
        check_upstream(upstream_mr)
        if not isinstance(dump_log_on_failure, bool):
            raise InvalidArgumentError(f"dump_log_on_failure must be a bool, got {dump_log_on_failure!r}",
                                       value=dump_log_on_failure, expected="True or False")
        if arena_size is None:
            device = upstream_mr.device_id
            free = upstream_mr.backend.mem_info(device if device >= 0 else upstream_mr.backend.current_device())[0]
            size = max(SUPERBLOCK_SIZE, (free // 2) & -ALIGNMENT)
        else:
            size = parse_size(arena_size, name="arena_size", allow_zero=False)
            if size % ALIGNMENT or size < SUPERBLOCK_SIZE:
                raise InvalidSizeError(
                    f"arena_size must be a multiple of {ALIGNMENT} bytes and at least one superblock "
                    f"({format_bytes(SUPERBLOCK_SIZE)}), got {arena_size!r} = {size} bytes",
                    value=arena_size, expected=f"a multiple of {ALIGNMENT} >= {SUPERBLOCK_SIZE}")
        super().__init__(upstream_mr.backend)
        self.upstream_mr = upstream_mr
        self._arena_size = size
        self.dump_log_on_failure = dump_log_on_failure
        self._global = FreeRanges()
        self._superblocks: dict[int, list[int]] = {}   # superblock address -> its free slots (a stack)
        self._class_of: dict[int, int] = {}           # superblock address -> its size class
        self._partial: dict[int, dict[int, None]] = {c: {} for c in SIZE_CLASSES}  # class -> superblocks with room
        self._home: dict[int, int] = {}               # live small pointer -> its superblock
        with self._lock:
            self._take_region(0)

    # -- what the arena is ----------------------------------------------------------------------
    @property
    def arena_size(self) -> int:
        """Bytes of the global arena."""
        return self._arena_size

    def pool_size(self) -> int:
        """Bytes held from the upstream: the arena, or 0 after :meth:`release`."""
        return sum(self._global.blocks.values())

    def upstream_blocks(self) -> list[tuple[int, int]]:
        """``(address, size)`` of the region held from the upstream (none after :meth:`release`)."""
        with self._lock:
            return sorted(self._global.blocks.items())

    def free_ranges(self) -> list[tuple[int, int]]:
        """``(address, size)`` of every free range of the global arena (superblocks in use are not free)."""
        with self._lock:
            return self._global.ranges()

    def superblocks(self) -> dict[int, tuple[int, int]]:
        """Every superblock in use: address -> (size class, free slots)."""
        with self._lock:
            return {sb: (self._class_of[sb], len(slots)) for sb, slots in self._superblocks.items()}

    def dump_memory_log(self) -> str:
        """A description of the arena: sizes, free ranges and superblocks (what a failure dumps)."""
        with self._lock:
            lines = [f"{type(self).__name__}: arena {format_bytes(self._arena_size)}, "
                     f"{format_bytes(self._global.free_bytes())} free in {len(self._global.ranges())} range(s), "
                     f"largest free range {format_bytes(self._global.largest())}; "
                     f"{len(self._live)} live allocation(s), {len(self._superblocks)} superblock(s)"]
            lines += [f"  free {ptr:#x} {size}" for ptr, size in self._global.ranges()]
            lines += [f"  superblock {sb:#x} class {self._class_of[sb]} free slots {len(slots)}"
                      for sb, slots in sorted(self._superblocks.items())]
            return "\n".join(lines) + "\n"

    def release(self) -> None:
        """Give the arena back to the upstream (it is taken again on the next allocation).

        Raises
        ------
        InvalidStateError
            Allocations are still live: deallocate them first.
        """
        with self._lock:
            self._refuse_release_while_live()
            for ptr, size in list(self._global.blocks.items()):
                self.upstream_mr.deallocate(ptr, size)
                self._global.remove_block(ptr)

    # -- the suballocator (called by MemoryResource.allocate/deallocate, under self._lock) --------
    def _allocate(self, size: int, stream: int) -> int:
        if self._global.blocks:
            return self._carve(size)
        self._take_region(stream)          # after release(): the arena comes back for this request
        try:
            return self._carve(size)
        except BaseException:
            self.release()                 # ... and goes again if the request fails, leaving no trace
            raise

    def _carve(self, size: int) -> int:
        if size <= SMALL_MAX:
            cls = _size_class(size)
            partial = self._partial[cls]
            if partial:
                sb = next(iter(partial))
            else:
                sb = self._take(SUPERBLOCK_SIZE, size)
                self._superblocks[sb] = list(range(sb + (SUPERBLOCK_SIZE // cls - 1) * cls, sb - 1, -cls))
                self._class_of[sb] = cls
                partial[sb] = None
            slots = self._superblocks[sb]
            ptr = slots.pop()
            if not slots:
                del partial[sb]
            self._home[ptr] = sb
            return ptr
        return self._take(_align_up(size), size)

    def _deallocate(self, ptr: int, size: int, stream: int) -> None:
        sb = self._home.pop(ptr, None)
        if sb is None:
            self._global.give(ptr, _align_up(size))
            return
        cls = self._class_of[sb]
        slots = self._superblocks[sb]
        slots.append(ptr)
        if len(slots) == SUPERBLOCK_SIZE // cls:     # the last slot came back: the superblock goes home
            del self._superblocks[sb], self._class_of[sb], self._partial[cls][sb]
            self._global.give(sb, SUPERBLOCK_SIZE)
        else:
            self._partial[cls][sb] = None

    def _take(self, need: int, size: int) -> int:
        ptr = self._global.take(need)
        if ptr is None:
            err = self._out_of_memory(
                size, self._global.free_bytes(), self._arena_size,
                f"no free range of the {format_bytes(self._arena_size)} arena holds {format_bytes(need)} "
                f"(largest free range {format_bytes(self._global.largest())}, "
                f"{format_bytes(self._global.free_bytes())} free in all)")
            if self.dump_log_on_failure:
                with open(DUMP_FILE_NAME, "a", encoding="utf-8") as log:
                    log.write(f"allocation of {size} bytes failed\n{self.dump_memory_log()}")
            raise err
        return ptr

    def _take_region(self, stream: int) -> None:
        ptr = self.upstream_mr.allocate(self._arena_size, stream)
        check_aligned(self, ptr, self._arena_size, stream)
        self._global.add_block(ptr, self._arena_size)
        publish_grow(self, ptr, self._arena_size, stream)

    # -- lifetime -------------------------------------------------------------------------------
    def __del__(self) -> None:
        g = getattr(self, "_global", None)
        if g is None or not g.blocks:
            return
        try:  # noqa: SIM105 - contextlib itself may be gone at exit
            defer(give_back_when_collected, self, g.blocks)
        except Exception:
            pass

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.upstream_mr!r}, arena_size={format_bytes(self._arena_size)!r}, "
                f"dump_log_on_failure={self.dump_log_on_failure})")

