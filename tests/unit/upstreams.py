"""Test upstreams for the pool: a capped one that runs out of memory, and one whose blocks touch."""

from __future__ import annotations

from uvm_lab.mr.base import MemoryResource, ResourceAdaptor


class CappedUpstream(ResourceAdaptor):
    """Passes allocations through until ``limit`` bytes are out, then runs out of memory."""

    def __init__(self, upstream_mr: MemoryResource, limit: int) -> None:
        super().__init__(upstream_mr)
        self.limit = limit
        self.held = 0

    def _allocate(self, size: int, stream: int) -> int:
        if self.held + size > self.limit:
            raise self._out_of_memory(size, self.limit - self.held, self.limit, "over the test's cap")
        ptr = self.upstream_mr.allocate(size, stream)
        self.held += size
        return ptr

    def _deallocate(self, ptr: int, size: int, stream: int) -> None:
        self.upstream_mr.deallocate(ptr, size, stream)
        self.held -= size


class ContiguousUpstream(MemoryResource):
    """Hands out consecutive ranges of one region, so that the pool's blocks touch each other."""

    def __init__(self, upstream_mr: MemoryResource, size: int) -> None:
        super().__init__(upstream_mr.backend)
        self.upstream_mr = upstream_mr
        self.region = upstream_mr.allocate(size)
        self.end = self.region + size
        self.next = self.region

    def _allocate(self, size: int, stream: int) -> int:
        if self.next + size > self.end:
            raise self._out_of_memory(size, self.end - self.next, self.end - self.region, "region used up")
        ptr, self.next = self.next, self.next + size
        return ptr

    def _deallocate(self, ptr: int, size: int, stream: int) -> None:
        pass

    def close(self) -> None:
        self.upstream_mr.deallocate(self.region, self.end - self.region)
