"""Which allocations are outstanding, and where they were made: RMM's ``TrackingResourceAdaptor``.

The adaptor keeps a map of every allocation that went through it and is not yet freed, with its
size and, when ``capture_stacks=True``, the Python stack that made it (found leaks name their
line). Capturing a stack costs tens of microseconds a call: turn it on to hunt a leak, not by default.
"""

from __future__ import annotations

import logging
import traceback

from ..errors import InvalidArgumentError
from .base import MemoryResource, ResourceAdaptor

__all__ = ["TrackingResourceAdaptor"]

_log = logging.getLogger("uvm_lab.mr")


class TrackingResourceAdaptor(ResourceAdaptor):
    """Keeps every outstanding allocation through it (size, and the stack when asked).

    Parameters
    ----------
    upstream_mr
        The resource that hands out the memory.
    capture_stacks
        Record the Python stack of every allocation (shown by :meth:`get_outstanding_allocations_str`).

    Examples
    --------
    >>> mr = ul.mr.TrackingResourceAdaptor(ul.mr.ManagedMemoryResource(), capture_stacks=True)
    >>> ptr = mr.allocate(1000)
    >>> print(mr.get_outstanding_allocations_str())     # 0x...: 1000 B : callstack: ...
    """

    def __init__(self, upstream_mr: MemoryResource, capture_stacks: bool = False) -> None:
        super().__init__(upstream_mr)
        if not isinstance(capture_stacks, bool):
            raise InvalidArgumentError(f"capture_stacks must be a bool, got {capture_stacks!r}",
                                       value=capture_stacks, expected="True or False")
        self.capture_stacks = capture_stacks
        self._outstanding: dict[int, tuple[int, str | None]] = {}    # ptr -> (size, stack or None)
        self._allocated_bytes = 0

    def get_allocated_bytes(self) -> int:
        """Bytes allocated through this adaptor and not yet freed."""
        return self._allocated_bytes

    def get_outstanding_allocations(self) -> dict[int, tuple[int, str | None]]:
        """``{ptr: (size, stack)}`` of every outstanding allocation (``stack`` is None without capture_stacks)."""
        with self._lock:
            return dict(self._outstanding)

    def get_outstanding_allocations_str(self) -> str:
        """RMM's report: ``Outstanding Allocations:`` then one ``ptr: size B`` line each, stacks under them."""
        with self._lock:
            lines = ["Outstanding Allocations:\n"]
            for ptr, (size, stack) in self._outstanding.items():
                lines.append(f"{ptr:#x}: {size} B")
                if stack is not None:
                    lines.append(f" : callstack:\n{stack}")
                lines.append("\n")
            return "".join(lines)

    def log_outstanding_allocations(self) -> None:
        """Log the report at DEBUG level on the ``uvm_lab.mr`` logger (RMM logs it at debug level too)."""
        _log.debug("%s", self.get_outstanding_allocations_str())

    def _allocate(self, size: int, stream: int) -> int:
        stack = "".join(traceback.format_stack()[:-2]) if self.capture_stacks else None
        ptr = self.upstream_mr.allocate(size, stream)
        if ptr:
            with self._lock:
                self._outstanding[ptr] = (size, stack)
                self._allocated_bytes += size
        return ptr

    def _deallocate(self, ptr: int, size: int, stream: int) -> None:
        # The upstream goes first: a double free raises there and leaves the map untouched.
        self.upstream_mr.deallocate(ptr, size, stream)
        with self._lock:
            if self._outstanding.pop(ptr, None) is not None:
                self._allocated_bytes -= size
