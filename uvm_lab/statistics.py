"""Allocation statistics of the current device resource, as RMM's ``rmm.statistics``.

    ul.statistics.enable_statistics()        # the current resource, wrapped in a StatisticsResourceAdaptor
    with ul.statistics.statistics():         # a fresh level of counters for the block
        buf = ul.DeviceBuffer(size="1MiB")
        ul.statistics.get_statistics()       # Statistics(current_bytes=1048576, current_count=1, ...)

    @ul.statistics.profiler()                # per-function peaks and totals, in default_profiler_records
    def step(): ...
    print(ul.statistics.default_profiler_records.report())

Everything here reads and changes only the current device resource, as RMM does: statistics are "enabled"
while that resource is a :class:`~uvm_lab.mr.StatisticsResourceAdaptor`, and the counters are its stack
(:meth:`~uvm_lab.mr.StatisticsResourceAdaptor.push_counters`). While they are not enabled, the getters
return None and the profiler records nothing.

Where uvm_lab differs: a buffer dropped without ``close()`` is freed soon after it is collected (on a thread
that holds no lock: :mod:`uvm_lab.deferred`), not at once, so its free counts against whichever level is on top
then. Close buffers, or call ``ul.deferred.run()``, before reading counters that must include their frees.
Misuse raises uvm_lab's typed errors (an :class:`~uvm_lab.errors.InvalidStateError` where RMM raises
``IndexError`` or ``ValueError`` for the state of the stack).
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import wraps
from typing import Any, ParamSpec, TypeVar

from . import deferred
from .errors import InvalidArgumentError, InvalidStateError, shown
from .mr.base import MemoryResource
from .mr.current import get_current_device_resource, set_current_device_resource
from .mr.statistics import Statistics, StatisticsResourceAdaptor

__all__ = [
    "ProfilerContext",
    "ProfilerRecords",
    "Statistics",
    "default_profiler_records",
    "enable_statistics",
    "get_statistics",
    "pop_statistics",
    "profiler",
    "push_statistics",
    "statistics",
]

P = ParamSpec("P")
T = TypeVar("T")


def _adaptor() -> StatisticsResourceAdaptor | None:
    mr = get_current_device_resource()
    return mr if isinstance(mr, StatisticsResourceAdaptor) else None


def enable_statistics() -> None:
    """Wrap the current device resource in a :class:`~uvm_lab.mr.StatisticsResourceAdaptor`, unless it is one.

    Idempotent. As in RMM, the adaptor must stay the current resource while statistics are gathered: a
    resource set over it turns them off again.
    """
    mr = get_current_device_resource()
    if not isinstance(mr, StatisticsResourceAdaptor):
        set_current_device_resource(StatisticsResourceAdaptor(mr))


def get_statistics() -> Statistics | None:
    """The current resource's counters (its top level), or None when statistics are not enabled. Frees already
    asked for (a collected buffer's, a tensor's that torch let go) are done first, so that they are counted."""
    deferred.run()
    adaptor = _adaptor()
    return adaptor.allocation_counts if adaptor is not None else None


def push_statistics() -> Statistics | None:
    """Push a fresh level of counters and return the counters before the push; None (and nothing pushed)
    when statistics are not enabled."""
    adaptor = _adaptor()
    return adaptor.push_counters() if adaptor is not None else None


def pop_statistics() -> Statistics | None:
    """Pop the top level of counters (folding it into the one below) and return it; None when statistics
    are not enabled.

    Raises
    ------
    InvalidStateError
        Only the bottom level is left (RMM raises ``IndexError``): pop must follow a push.
    """
    adaptor = _adaptor()
    return adaptor.pop_counters() if adaptor is not None else None


@contextmanager
def statistics() -> Iterator[None]:
    """Statistics for the block: a fresh level of counters if they are enabled, else a
    :class:`~uvm_lab.mr.StatisticsResourceAdaptor` made the current resource for the block and taken off after.

    Raises
    ------
    InvalidStateError
        The current resource was changed inside the block (RMM raises ``ValueError``). The change is kept;
        the level this block pushed is popped from the adaptor it was pushed on.
    """
    pushed = _adaptor()
    prior: MemoryResource | None = None
    if pushed is not None:
        pushed.push_counters()
    else:
        prior = get_current_device_resource()
        enable_statistics()
    current = get_current_device_resource()
    try:
        yield
    finally:
        changed = current is not get_current_device_resource()
        if pushed is not None:
            pushed.pop_counters()
        elif not changed:
            set_current_device_resource(prior)  # type: ignore[arg-type]   # set with it above
        if changed:
            raise InvalidStateError(
                f"the current device resource was changed inside ul.statistics.statistics() (from {current!r} "
                f"to {get_current_device_resource()!r}); change it outside the block")


class ProfilerRecords:
    """Memory statistics of profiled functions and blocks, by name (thread-safe), as RMM's."""

    @dataclass
    class MemoryRecord:
        """One name's record: how often it ran, the bytes it allocated in all, and its highest peak."""

        num_calls: int = 0
        memory_total: int = 0
        memory_peak: int = 0

        def add(self, memory_total: int, memory_peak: int) -> None:
            self.num_calls += 1
            self.memory_total += memory_total
            self.memory_peak = max(self.memory_peak, memory_peak)

    _ORDERS = ("num_calls", "memory_peak", "memory_total")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: dict[str, ProfilerRecords.MemoryRecord] = {}

    def add(self, name: str, data: Statistics) -> None:
        """Add one run's counters (``data.total_bytes`` and ``data.peak_bytes``) to the record ``name``."""
        if not isinstance(name, str):
            raise InvalidArgumentError(f"name must be a str, got {shown(name)}", value=name, expected="a str")
        if not isinstance(data, Statistics):
            raise InvalidArgumentError(f"data must be a Statistics, got {shown(data)}", value=data,
                                       expected="a uvm_lab.statistics.Statistics")
        with self._lock:
            record = self._records.setdefault(name, ProfilerRecords.MemoryRecord())
            record.add(memory_total=data.total_bytes, memory_peak=data.peak_bytes)

    @property
    def records(self) -> dict[str, ProfilerRecords.MemoryRecord]:
        """The records by name (a fresh dict)."""
        with self._lock:
            return dict(self._records)

    def report(self, ordered_by: str = "memory_peak") -> str:
        """The records as RMM prints them, largest ``ordered_by`` (``"num_calls"``, ``"memory_peak"`` or
        ``"memory_total"``) first."""
        if ordered_by not in self._ORDERS:
            raise InvalidArgumentError(f"ordered_by must be one of {', '.join(self._ORDERS)}, got {shown(ordered_by)}",
                                       value=ordered_by, expected=", ".join(self._ORDERS))
        records = sorted(self.records.items(), key=lambda item: getattr(item[1], ordered_by), reverse=True)
        out = "Memory Profiling\n================\n\n"
        if not records:
            return out + "No data, maybe profiling wasn't enabled?"
        out += ("Legends:\n"
                "  ncalls       - number of times the function or code block was called\n"
                "  memory_peak  - peak memory allocated in function or code block (in bytes)\n"
                "  memory_total - total memory allocated in function or code block (in bytes)\n")
        out += f"\nOrdered by: {ordered_by}\n"
        out += "\nncalls     memory_peak    memory_total  filename:lineno(function)\n"
        lines = [f"{data.num_calls:6,d} {data.memory_peak:15,d} {data.memory_total:15,d}  {name}"
                 for name, data in records]
        return out + "\n".join(lines)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.records})"

    def __str__(self) -> str:
        return self.report()


#: Where :func:`profiler` records when given no ``records``.
default_profiler_records = ProfilerRecords()


def _name_of(func: Callable[..., Any]) -> str:
    """RMM's name for a profiled function: ``file:line(qualified name)``."""
    unwrapped = inspect.unwrap(func)
    try:
        _, line = inspect.getsourcelines(unwrapped)
        path = inspect.getfile(unwrapped)
    except (OSError, TypeError):   # no source (made by exec, or a builtin): the code object says where
        code = getattr(unwrapped, "__code__", None)
        path, line = (code.co_filename, code.co_firstlineno) if code is not None else ("?", 0)
    return f"{path}:{line}({getattr(unwrapped, '__qualname__', repr(unwrapped))})"


class ProfilerContext:
    """What :func:`profiler` returns: a decorator and a context manager that record into ``records``."""

    def __init__(self, records: ProfilerRecords, name: str) -> None:
        self._records = records
        self._name = name
        self._entered: list[StatisticsResourceAdaptor | None] = []   # the adaptor each open ``with`` pushed on
        self._lock = threading.Lock()

    def __call__(self, func: Callable[P, T]) -> Callable[P, T]:
        if not callable(func):
            raise InvalidArgumentError(f"profiler() decorates a function, got {shown(func)}", value=func,
                                       expected="a callable")
        name = self._name or _name_of(func)
        records = self._records

        @wraps(func)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
            adaptor = _push()
            try:
                return func(*args, **kwargs)
            finally:
                _pop(adaptor, records, name)

        return wrapper

    def __enter__(self) -> ProfilerContext:
        if not self._name:
            raise InvalidArgumentError("profiler() used as a context manager needs a name: "
                                       "with ul.statistics.profiler(name='load'): ...", value=self._name,
                                       expected="a non-empty name")
        adaptor = _push()
        with self._lock:
            self._entered.append(adaptor)
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            adaptor = self._entered.pop()
        _pop(adaptor, self._records, self._name)


def _push() -> StatisticsResourceAdaptor | None:
    adaptor = _adaptor()
    if adaptor is not None:
        adaptor.push_counters()
    return adaptor


def _pop(adaptor: StatisticsResourceAdaptor | None, records: ProfilerRecords, name: str) -> None:
    # From the adaptor it was pushed on: a resource set meanwhile leaves the counter stacks as they should be.
    if adaptor is not None:
        records.add(name, adaptor.pop_counters())


def profiler(*, records: ProfilerRecords = default_profiler_records, name: str = "") -> ProfilerContext:
    """Record the memory statistics of a function (as a decorator) or a block (as a context manager).

    While statistics are enabled (:func:`enable_statistics`), each call or block runs on a fresh level of
    counters, and its total and peak bytes are added to ``records`` under ``name``; otherwise it records
    nothing.

    Parameters
    ----------
    records
        Where to record (:data:`default_profiler_records` by default).
    name
        The record's name: needed for a block; a function's defaults to ``file:line(qualified name)``.

    Where uvm_lab differs: each call pops the level from the adaptor it pushed it on, even if the current
    resource changed meanwhile (RMM pops from whatever resource is current then).

    Examples
    --------
    >>> @ul.statistics.profiler()
    ... def load(): return ul.DeviceBuffer(size="1MiB")
    >>> with ul.statistics.profiler(name="a block"):
    ...     b = ul.DeviceBuffer(size=100)
    """
    if not isinstance(records, ProfilerRecords):
        raise InvalidArgumentError(f"records must be a ProfilerRecords, got {shown(records)}", value=records,
                                   expected="a uvm_lab.statistics.ProfilerRecords")
    if not isinstance(name, str):
        raise InvalidArgumentError(f"name must be a str, got {shown(name)}", value=name, expected="a str")
    return ProfilerContext(records, name)
