"""The pool's free list: best fit, coalescing, never across the edge of an upstream block.

:class:`BestFit` is the compiled one (``_pool.c``) where the package was built with a C compiler,
and :class:`PyBestFit` otherwise; both follow the same rules, and the tests hold them to each other.

* ``take(need)`` cuts ``need`` bytes from the front of the smallest free range that holds them (the
  lowest address among equals) and returns its address, or None when no range holds them.
* ``give(ptr, size)`` frees a range and merges it with the free ranges just before and after it,
  except across a block's start: two blocks that happen to lie side by side stay two.
* ``add_block(ptr, size)`` adds a new block, all free; ``clear()`` forgets everything.
"""

from __future__ import annotations

from bisect import bisect_left, insort

from ..events.bus import ALLOCATOR_RECORD

__all__ = ["COMPILED", "BestFit", "PyBestFit"]

# Free ranges sorted by one int key, size in the high bits and address in the low 64, so a best-fit
# search is a single bisect with no tuple building.
_SHIFT = 64
_ADDRESS_MASK = (1 << _SHIFT) - 1


class PyBestFit:
    """The free list in Python (see the module's rules)."""

    def __init__(self) -> None:
        self._keys: list[int] = []           # sorted (size << 64 | address) of every free range
        self._start: dict[int, int] = {}     # free range address -> size
        self._end: dict[int, int] = {}       # free range end -> address
        self._blocks: set[int] = set()       # block starts

    def take(self, need: int) -> int | None:
        keys = self._keys
        i = bisect_left(keys, need << _SHIFT)
        if i == len(keys):
            return None
        key = keys[i]
        ptr = key & _ADDRESS_MASK
        have = key >> _SHIFT
        del self._start[ptr]
        if have == need:
            del keys[i]
            del self._end[ptr + have]
            return ptr
        rest = ptr + need                    # the tail stays free
        self._start[rest] = have - need
        self._end[ptr + have] = rest
        key = ((have - need) << _SHIFT) | rest
        if i == 0 or keys[i - 1] < key:      # still in order: replace in place
            keys[i] = key
        else:
            del keys[i]
            insort(keys, key, 0, i)
        return ptr

    def give(self, ptr: int, size: int) -> None:
        end = ptr + size
        blocks = self._blocks
        below = None if ptr in blocks else self._end.pop(ptr, None)
        above = None if end in blocks else self._start.pop(end, None)
        keys = self._keys
        start = ptr
        old = -1                 # key of a merged-away range, whose slot the merged range can take
        if below is not None:
            start = below
            old = ((ptr - below) << _SHIFT) | below
        if above is not None:
            if old >= 0:
                del keys[bisect_left(keys, old)]
            old = (above << _SHIFT) | end
            end += above
        key = ((end - start) << _SHIFT) | start
        if old < 0:
            insort(keys, key)
        else:
            # The merged range is larger than the one it replaces, so it sorts at or after it.
            j = bisect_left(keys, old)
            if j + 1 == len(keys) or keys[j + 1] > key:
                keys[j] = key
            else:
                del keys[j]
                insort(keys, key, j)
        self._start[start] = end - start     # overwrites the merged-away entries
        self._end[end] = start

    def add_block(self, ptr: int, size: int) -> None:
        self._blocks.add(ptr)
        self._start[ptr] = size
        self._end[ptr + size] = ptr
        insort(self._keys, (size << _SHIFT) | ptr)

    def clear(self) -> None:
        self._keys.clear()
        self._start.clear()
        self._end.clear()
        self._blocks.clear()

    def ranges(self) -> list[tuple[int, int]]:
        return sorted(self._start.items())

    def largest(self) -> int:
        return self._keys[-1] >> _SHIFT if self._keys else 0

    def free_bytes(self) -> int:
        return sum(self._start.values())


try:
    from ._pool import RECORD_SIZE, BestFit
    if ALLOCATOR_RECORD.size != RECORD_SIZE:   # built from older sources: its events would not line up
        raise ImportError(f"uvm_lab.mr._pool writes {RECORD_SIZE}-byte events; rebuild it (python hatch_build.py)")
except ImportError:     # built without a C compiler: the same rules in Python
    BestFit = PyBestFit  # type: ignore[misc,assignment]

#: Whether :class:`BestFit` is the compiled free list.
COMPILED = BestFit is not PyBestFit
