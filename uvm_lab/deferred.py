"""Work that garbage collection asks for, done soon after on a thread that holds no uvm_lab lock.

A finalizer (a collected buffer's, a pool's) runs on whatever thread the collector happens to run
on, perhaps one inside uvm_lab that holds the event bus's or a resource's lock. Were the finalizer to
free memory there, it would take more locks and could deadlock with a thread waiting for the first.
So finalizers only queue their work here. A daemon thread runs the queue every ``INTERVAL`` seconds;
the next ``DeviceBuffer`` and :func:`run` run it at once.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = ["INTERVAL", "defer", "run"]

INTERVAL = 0.05
log = logging.getLogger("uvm_lab")

_queue: deque[tuple[Callable[..., Any], tuple[Any, ...]]] = deque()   # append/popleft are atomic
_worker: threading.Thread | None = None
_start = threading.Lock()
# Held while queued work runs, so that run() returns only once work the worker had already taken is
# done too (a caller freeing memory before it allocates must find that memory back).
_running = threading.RLock()


def defer(fn: Callable[..., Any], *args: Any) -> None:
    """Run ``fn(*args)`` soon, on a thread that holds no lock of uvm_lab's. Safe to call from a finalizer."""
    if sys.is_finalizing():
        # The interpreter is exiting: no new thread can start (waiting for one would hang the exit),
        # and the process's memory goes back to the system with it.
        return
    _queue.append((fn, args))
    if _worker is None:
        _start_worker()


def run() -> None:
    """Run what is queued, here and now, and wait for what is already running (hold no uvm_lab lock)."""
    with _running:
        while _queue:   # checked first: an empty queue is the common case, and a raised IndexError costs more
            try:
                fn, args = _queue.popleft()
            except IndexError:
                return
            try:
                fn(*args)
            except Exception:
                log.exception("deferred %r failed", fn)


def _start_worker() -> None:
    global _worker
    with _start:
        if _worker is None:
            _worker = threading.Thread(target=_loop, name="uvm_lab-deferred", daemon=True)
            _worker.start()


def _loop() -> None:
    pause = threading.Event()
    while not sys.is_finalizing():
        pause.wait(INTERVAL)
        run()
