"""A clock the test moves by hand, for the parts that run on threads of their own (the bus's flusher, the lab
view's session, the dashboard): what they do "after 50 ms" they do when the test advances the clock."""

from __future__ import annotations

import threading
import time

from uvm_lab.clock import Clock


class ManualClock(Clock):
    """Time stands still until :meth:`advance`; CPU time is what the test says each piece of work took."""

    def __init__(self, *, now: float = 1000.0, cpu_per_read: float = 0.0) -> None:
        self.now = now
        self._cpu = 0.0
        self._cpu_per_read = cpu_per_read
        self._changed = threading.Condition()
        self._waiters: dict[int, tuple[threading.Event, float | None]] = {}   # by thread id

    def monotonic(self) -> float:
        return self.now

    def thread_time(self) -> float:
        with self._changed:
            self._cpu += self._cpu_per_read   # each read after the first says the work took this long
            return self._cpu

    def wall_ms(self) -> float:
        return self.now * 1000

    def wait(self, event: threading.Event, timeout: float | None) -> bool:
        with self._changed:
            deadline = None if timeout is None else self.now + timeout
            self._waiters[threading.get_ident()] = (event, deadline)
            self._changed.notify_all()
            try:
                while not event.is_set() and (deadline is None or self.now < deadline):
                    # An Event does not tell this condition when it is set: look again soon (real time).
                    self._changed.wait(0.002)
            finally:
                del self._waiters[threading.get_ident()]
                self._changed.notify_all()
            return event.is_set()

    def advance(self, seconds: float) -> None:
        with self._changed:
            self.now += seconds
            self._changed.notify_all()

    def settle(self, threads: int, timeout: float = 10.0) -> None:
        """Return once ``threads`` threads wait on this clock and none of them is due to wake (each one's event
        is clear and its deadline ahead): whatever the last step set off has been done."""
        give_up = time.monotonic() + timeout
        with self._changed:
            while True:
                waiting = list(self._waiters.values())
                if len(waiting) >= threads and all(not e.is_set() and (d is None or d > self.now) for e, d in waiting):
                    return
                if time.monotonic() > give_up:
                    raise AssertionError(f"the threads did not settle: {len(waiting)} of {threads} waiting")
                self._changed.wait(0.002)
