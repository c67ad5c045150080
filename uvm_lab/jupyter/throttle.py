"""How often a live view may refresh: at most once an interval, and never more than a share of the kernel's time.

A view that watches a loop takes the GIL from it while it reads maps and packs messages. Each refresh (and each
answer to a timeline query, which reads every event held) is paid for by the time after it: work that took
``cost`` seconds uses up ``cost / share`` seconds of the clock (19 times the cost after it, at 5%), and the
next piece of work may start once what came before, and the piece itself, would be paid for within ``burst``
seconds (:data:`BURST` unless given). A piece is expected to cost what the last one did: charged only after it
ran, a refresh of 50 ms would overshoot a short loop's share by its whole cost. So the first change after a quiet
stretch goes out at once, however costly; past it, while pieces cost what the last one did, the work takes at most
its share of any stretch of time and ``share * burst`` seconds more. The burst is short because loops are:
a loop of a second must pay the share too, not a second's grace. Both the lab view's session and the widget
dashboard follow it; the session splits :data:`BUSY_SHARE` between its updates and its answers to timeline queries,
each with a budget of its own, so that a costly answer never holds the updates back.

The cost is the refreshing thread's CPU time (``time.thread_time``), what it took from the kernel. Its wall
time would also count the time it waited for the GIL while the loop held it: the busier the loop, the longer
a refresh would seem, and a view of a busy loop would fall silent for seconds while costing it little.

Each time a refresh takes the GIL back from the loop, the loop's thread sleeps until the refresh lets go, and the
refresh waits to take it back: a hand-off costs both threads more than a compiled pass of a few microseconds. So the
compiled passes a refresh runs hold the GIL rather than let it go (``benchmarks/README.md``, "The loop's sleeps").

How long a thread waits for the GIL before it asks for it is the interpreter's switch interval, 5 ms by default:
the loop, back from its compiled work while a refresh runs, waits for the whole refresh. While a live view or
dashboard refreshes beside the kernel's code (:class:`FineSwitching`), the interval is :data:`LIVE_SWITCH_INTERVAL`,
so the two take turns in grains of a tenth of a millisecond; the value found is put back when the last one closes.
"""

from __future__ import annotations

import sys
import threading

__all__ = ["BURST", "BUSY_SHARE", "LIVE_SWITCH_INTERVAL", "Budget", "FineSwitching"]

#: The most of the kernel's time that a live view's refreshes may take.
BUSY_SHARE = 0.05
#: The most time (in seconds of the clock) that work done may be owed for before more work waits: a few updates.
BURST = 0.25
#: The interpreter's switch interval (``sys.setswitchinterval``, seconds) while a live view or dashboard refreshes.
LIVE_SWITCH_INTERVAL = 1e-4


class Budget:
    """The kernel time a view has spent, and when it may next spend some. Thread-safe.

    Times are ``time.monotonic()`` seconds, given by the caller (a test passes its own).
    """

    def __init__(self, share: float = BUSY_SHARE, burst: float = BURST) -> None:
        self._share = share
        self._burst = burst
        self._lock = threading.Lock()
        self._paid_at = float("-inf")   # the moment at which the work done so far is paid for
        self._last_cost = 0.0           # what the next piece of work is expected to cost

    def spend(self, started: float, cost: float) -> None:
        """Note work that started at ``started`` and took ``cost`` seconds of its thread's CPU."""
        with self._lock:
            self._paid_at = max(self._paid_at, started) + cost / self._share
            self._last_cost = cost

    def ready_at(self) -> float:
        """The earliest moment at which the next piece of work (expected to cost what the last did) may start."""
        with self._lock:
            return self._paid_at + self._last_cost / self._share - self._burst


class FineSwitching:
    """The interpreter's switch interval held at :data:`LIVE_SWITCH_INTERVAL` while at least one live refresher (a
    view's session, a live dashboard) holds one of these; the interval found before the first is put back when the
    last is released, unless something else set another meanwhile (that one stays). Thread-safe; :meth:`release` is
    idempotent."""

    _lock = threading.Lock()
    _holders = 0
    _found: float | None = None   # the interval before the first holder took it
    _set = 0.0                    # the interval as the interpreter reads it back once set (whole microseconds)

    def __init__(self) -> None:
        self._held = False
        with FineSwitching._lock:
            if FineSwitching._holders == 0:
                FineSwitching._found = sys.getswitchinterval()
                sys.setswitchinterval(LIVE_SWITCH_INTERVAL)
                FineSwitching._set = sys.getswitchinterval()
            FineSwitching._holders += 1
            self._held = True

    def release(self) -> None:
        with FineSwitching._lock:
            if not self._held:
                return
            self._held = False
            FineSwitching._holders -= 1
            if FineSwitching._holders == 0:
                found, FineSwitching._found = FineSwitching._found, None
                if found is not None and sys.getswitchinterval() == FineSwitching._set:
                    sys.setswitchinterval(found)
