"""Waiting for what uvm_lab does soon rather than at once (frees asked for by garbage collection)."""

from __future__ import annotations

import time
from collections.abc import Callable


def eventually(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    """True as soon as ``predicate()`` is, False if it still is not after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True
