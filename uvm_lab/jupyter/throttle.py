"""How often a live view may refresh: at most once an interval, and never more than a share of the kernel's time.

A view that watches a loop takes the GIL from it while it reads maps and packs messages. After a refresh that
took ``cost`` seconds, the next waits :func:`gap`: at least the view's interval, and long enough that refreshing
takes at most :data:`BUSY_SHARE` of the time (19 times the cost, at 5%). Both the lab view's session and the
widget dashboard follow it; the lab view's session counts its answers to timeline queries in the same budget
(an answer reads every event it holds), so that updates and answers together stay within the share.

The cost is the refreshing thread's CPU time (``time.thread_time``), what it took from the kernel. Its wall
time would also count the time it waited for the GIL while the loop held it: the busier the loop, the longer
a refresh would seem, and a view of a busy loop would fall silent for seconds while costing it little.
"""

from __future__ import annotations

__all__ = ["BUSY_SHARE", "gap"]

#: The most of the kernel's time that a live view's refreshes may take.
BUSY_SHARE = 0.05


def gap(interval: float, cost: float) -> float:
    """Seconds from the start of one refresh to the next, after one that took ``cost`` seconds."""
    return max(interval, cost / BUSY_SHARE)
