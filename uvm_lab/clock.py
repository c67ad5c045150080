"""The time that uvm_lab's background threads go by: the bus's flusher, the lab view's session, the dashboard.

Each takes a ``clock``; :data:`SYSTEM_CLOCK` (the process's own clocks) unless given another. A test passes a clock
it moves by hand, so that what happens "after 50 ms" happens when the test says so and not when a loaded machine
gets round to it: no sleeping, and no assertion that depends on how fast the machine is.
"""

from __future__ import annotations

import threading
import time

from .errors import InvalidArgumentError, shown

__all__ = ["SYSTEM_CLOCK", "Clock", "checked_clock", "checked_seconds"]


class Clock:
    """The process's clocks. Subclass it to move time by hand; every method is called from several threads."""

    def monotonic(self) -> float:
        """Seconds, for intervals (``time.monotonic``)."""
        return time.monotonic()

    def thread_time(self) -> float:
        """The calling thread's CPU seconds (``time.thread_time``): what a view's work took from the kernel."""
        return time.thread_time()

    def wall_ms(self) -> float:
        """Milliseconds since the epoch (``time.time``), comparable with a browser's ``Date.now()``."""
        return time.time() * 1000

    def wait(self, event: threading.Event, timeout: float | None) -> bool:
        """Block until ``event`` is set or ``timeout`` seconds of this clock have passed (None: no limit);
        whether ``event`` is set."""
        return event.wait(timeout)


#: The clock everything uses unless given another.
SYSTEM_CLOCK = Clock()


def checked_clock(clock: object) -> Clock:
    """``clock``, if it is a :class:`Clock`; else a typed error that names it."""
    if not isinstance(clock, Clock):
        raise InvalidArgumentError(f"clock must be a uvm_lab.clock.Clock, got {shown(clock)}", value=clock,
                                   expected="a uvm_lab.clock.Clock (SYSTEM_CLOCK, or a subclass of Clock)")
    return clock


def checked_seconds(value: object, name: str) -> float:
    """``value`` as a float, if it is a finite number of seconds above 0; else a typed error that names it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise InvalidArgumentError(f"{name} must be a positive number of seconds, got {shown(value)}", value=value,
                                   expected="a number of seconds > 0")
    return float(value)
