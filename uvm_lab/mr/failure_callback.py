"""A second chance for failed allocations: RMM's ``FailureCallbackResourceAdaptor``.

When the upstream raises :class:`~uvm_lab.errors.OutOfMemoryError`, the adaptor calls
``callback(nbytes)``. A true result means "I freed something, try again" and the allocation is
retried; a false one re-raises the error. A callback that raises propagates its own error (the
out-of-memory error is chained as its cause) and the allocation leaves nothing behind.

A typical callback frees a cache, or counts failures and gives up after a few::

    def retry_once(nbytes, state={"tries": 0}):
        state["tries"] += 1
        cache.clear()
        return state["tries"] < 2
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import InvalidArgumentError, OutOfMemoryError
from .base import MemoryResource, ResourceAdaptor

__all__ = ["FailureCallbackResourceAdaptor"]


class FailureCallbackResourceAdaptor(ResourceAdaptor):
    """Calls ``callback(nbytes) -> bool`` when an allocation from ``upstream_mr`` runs out of memory.

    Parameters
    ----------
    upstream_mr
        The resource that hands out the memory.
    callback
        Called with the requested size after each failure: True retries, False re-raises.

    Raises
    ------
    InvalidArgumentError
        ``upstream_mr`` is not a memory resource, or ``callback`` is not callable.
    """

    def __init__(self, upstream_mr: MemoryResource, callback: Callable[[int], bool]) -> None:
        if not callable(callback):
            raise InvalidArgumentError(f"callback must be callable as callback(nbytes) -> bool, got {callback!r}",
                                       value=callback, expected="a callable taking the size in bytes")
        super().__init__(upstream_mr)
        self.callback = callback

    def _allocate(self, size: int, stream: int) -> int:
        while True:
            try:
                return self.upstream_mr.allocate(size, stream)
            except OutOfMemoryError:
                if not self.callback(size):
                    raise

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.upstream_mr!r}, callback={self.callback!r})"
