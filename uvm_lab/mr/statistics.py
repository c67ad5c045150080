"""Counting what passes through a resource: RMM's ``StatisticsResourceAdaptor``.

The adaptor keeps a stack of counter levels. Each level counts bytes and allocations three ways:

``current``  what is live now (within a pushed level this can go below zero: freeing memory that
             was allocated before the push counts against the level)
``peak``     the highest ``current`` the level has seen
``total``    everything ever allocated at that level

:meth:`~StatisticsResourceAdaptor.allocation_counts` reads the top level.
:meth:`~StatisticsResourceAdaptor.push_counters` starts a fresh level (returning the counters of
the level below it); :meth:`~StatisticsResourceAdaptor.pop_counters` removes the top level,
returns its counters and folds them into the level below, exactly as RMM does: the lower level's
current and total grow by the popped ones, and its peak becomes at least its current-at-push plus
the popped level's peak.

Counters are read as RMM's :class:`Statistics` (``stats.current_bytes``), which also reads as the
mapping earlier releases returned (``stats["current_bytes"]``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields

from ..errors import InvalidStateError
from ..units import parse_size
from .base import MemoryResource, ResourceAdaptor

__all__ = ["Statistics", "StatisticsResourceAdaptor"]


@dataclass
class Statistics:
    """What a level of counters holds, as RMM's ``rmm.statistics.Statistics``.

    Attributes
    ----------
    current_bytes, current_count
        Bytes and allocations live now (within a pushed level, below zero when older memory was freed).
    peak_bytes, peak_count
        The highest ``current_bytes`` and ``current_count`` seen.
    total_bytes, total_count
        Everything ever allocated.

    Where uvm_lab differs: it also reads as a read-only mapping of those six names (``stats["peak_bytes"]``,
    ``dict(stats)``) and compares equal to such a mapping, as ``allocation_counts`` was a dict before.
    """

    current_bytes: int
    current_count: int
    peak_bytes: int
    peak_count: int
    total_bytes: int
    total_count: int

    def keys(self) -> tuple[str, ...]:
        return _NAMES

    def __getitem__(self, key: str) -> int:
        if key not in _NAMES:
            raise KeyError(key)
        value: int = getattr(self, key)
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(_NAMES)

    def __len__(self) -> int:
        return len(_NAMES)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Statistics):
            return all(getattr(self, k) == getattr(other, k) for k in _NAMES)
        if isinstance(other, Mapping):
            return set(other.keys()) == set(_NAMES) and all(other[k] == getattr(self, k) for k in _NAMES)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]   # mutable, as RMM's dataclass


_NAMES = tuple(f.name for f in fields(Statistics))

# One counter level is a list: [bytes current, bytes peak, bytes total, count current, count peak, count total].


def _as_stats(level: list[int]) -> Statistics:
    return Statistics(current_bytes=level[0], current_count=level[3], peak_bytes=level[1], peak_count=level[4],
                      total_bytes=level[2], total_count=level[5])


class StatisticsResourceAdaptor(ResourceAdaptor):
    """Counts the bytes and allocations that go through it to ``upstream_mr``.

    Parameters
    ----------
    upstream_mr
        The resource that hands out the memory.

    Examples
    --------
    >>> mr = ul.mr.StatisticsResourceAdaptor(ul.mr.ManagedMemoryResource())
    >>> ptr = mr.allocate(1000)
    >>> mr.allocation_counts.current_bytes
    1000
    """

    def __init__(self, upstream_mr: MemoryResource) -> None:
        super().__init__(upstream_mr)
        self._levels: list[list[int]] = [[0, 0, 0, 0, 0, 0]]
        self._current_bytes = 0    # across every level: what went through this adaptor and is still live

    @property
    def allocation_counts(self) -> Statistics:
        """The top level's counters: ``current_bytes``, ``current_count``, ``peak_bytes``, ``peak_count``,
        ``total_bytes`` and ``total_count`` (a fresh :class:`Statistics`)."""
        with self._lock:
            return _as_stats(self._levels[-1])

    def push_counters(self) -> Statistics:
        """Start a new level of counters, all zero; return the counters of the level it covers."""
        with self._lock:
            below = _as_stats(self._levels[-1])
            self._levels.append([0, 0, 0, 0, 0, 0])
            return below

    def pop_counters(self) -> Statistics:
        """Remove the top level, fold it into the level below, and return its counters.

        Raises
        ------
        InvalidStateError
            There is no pushed level: the bottom level is never popped.
        """
        with self._lock:
            if len(self._levels) < 2:
                raise InvalidStateError("cannot pop the last level of counters: pop_counters() must follow a "
                                        "push_counters()")
            top = self._levels.pop()
            below = self._levels[-1]
            for cur, peak, total in ((0, 1, 2), (3, 4, 5)):
                below[peak] = max(below[peak], below[cur] + top[peak])
                below[cur] += top[cur]
                below[total] += top[total]
            return _as_stats(top)

    @property
    def counter_depth(self) -> int:
        """How many levels of counters there are (1 until :meth:`push_counters` is called)."""
        return len(self._levels)

    def get_allocated_bytes(self) -> int:
        """Bytes allocated through this adaptor and not yet freed, whatever the counter level."""
        return self._current_bytes

    # allocate/deallocate are overridden whole: the upstream validates the arguments, so the adaptor's
    # own work is only the counting (one layer of calls less on every allocation).
    def allocate(self, nbytes: int | str, stream: int | None = None) -> int:
        ptr = self.upstream_mr.allocate(nbytes, stream)
        size = nbytes if type(nbytes) is int else parse_size(nbytes, name="nbytes")
        lock = self._lock
        lock.acquire()
        try:
            level = self._levels[-1]
            level[0] += size
            level[2] += size
            if level[0] > level[1]:
                level[1] = level[0]
            level[3] += 1
            level[5] += 1
            if level[3] > level[4]:
                level[4] = level[3]
            self._current_bytes += size
        finally:
            lock.release()
        return ptr

    def deallocate(self, ptr: int, nbytes: int | str, stream: int | None = None) -> None:
        # The upstream goes first: a double free raises there and leaves the counters untouched.
        self.upstream_mr.deallocate(ptr, nbytes, stream)
        size = nbytes if type(nbytes) is int else parse_size(nbytes, name="nbytes")
        lock = self._lock
        lock.acquire()
        try:
            level = self._levels[-1]
            level[0] -= size
            level[3] -= 1
            self._current_bytes -= size
        finally:
            lock.release()
