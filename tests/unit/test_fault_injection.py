"""Every failed allocation leaves every layer as it was, at any size and in any layer of any resource chain.

Hypothesis builds a random chain (a leaf, then up to four layers of suballocators and adaptors), puts a layer
that fails on command at a random place in it, and runs random allocations: some of sizes no memory holds,
some failed by the injected layer at a random call, some that work. Around each one that fails, every layer's
public state (bytes handed out, pool sizes and free ranges, statistics, outstanding allocations), the device's
free memory, the live buffers' residency maps and the list of live buffers must be what they were before;
and the next allocation must work.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, reject, settings
from hypothesis import strategies as st

import uvm_lab as ul
from uvm_lab.errors import OutOfMemoryError, UvmLabError

KiB, MiB = 1 << 10, 1 << 20


class FailsOnCommand(ul.mr.ResourceAdaptor):
    """Hands out its upstream's memory, except that the ``fail_in``-th call from now raises out of memory."""

    def __init__(self, upstream_mr: ul.mr.MemoryResource) -> None:
        super().__init__(upstream_mr)
        self.fail_in: int | None = None

    def _allocate(self, size: int, stream: int) -> int:
        if self.fail_in is not None:
            self.fail_in -= 1
            if self.fail_in <= 0:
                self.fail_in = None
                raise OutOfMemoryError(f"injected failure of {size} bytes", size=size)
        return self.upstream_mr.allocate(size, stream)

    def _deallocate(self, ptr: int, size: int, stream: int) -> None:
        self.upstream_mr.deallocate(ptr, size, stream)


LEAVES = {
    "managed": lambda: ul.mr.ManagedMemoryResource(),
    "device": lambda: ul.mr.CudaMemoryResource(),
    "async pool": lambda: ul.mr.CudaAsyncMemoryResource(initial_pool_size="4MiB"),
}
LAYERS = {
    "pool": lambda up, _: ul.mr.PoolMemoryResource(up, initial_pool_size="2MiB", maximum_pool_size="64MiB"),
    "arena": lambda up, _: ul.mr.ArenaMemoryResource(up, arena_size="32MiB"),
    "binning": lambda up, _: ul.mr.BinningMemoryResource(up, 12, 20),
    "fixed size": lambda up, _: ul.mr.FixedSizeMemoryResource(up, block_size="1MiB", blocks_to_preallocate=4),
    "limiting": lambda up, _: ul.mr.LimitingResourceAdaptor(up, "48MiB"),
    "statistics": lambda up, _: ul.mr.StatisticsResourceAdaptor(up),
    "tracking": lambda up, _: ul.mr.TrackingResourceAdaptor(up),
    "logging": lambda up, log: ul.mr.LoggingResourceAdaptor(up, log),
    "prefetch": lambda up, _: ul.mr.PrefetchResourceAdaptor(up),
    "failure callback": lambda up, _: ul.mr.FailureCallbackResourceAdaptor(up, lambda size: False),
}
SUBALLOCATORS = (ul.mr.PoolMemoryResource, ul.mr.ArenaMemoryResource, ul.mr.BinningMemoryResource,
                 ul.mr.FixedSizeMemoryResource, ul.mr.CudaAsyncMemoryResource)
SIZES = st.one_of(st.integers(1, 4 * MiB), st.sampled_from([256, 4096, MiB, MiB + 1, 16 * MiB, 1 << 40,
                                                            2**63, 2**64 - 1]))


def observed(mr: ul.mr.MemoryResource, buffers: list[ul.DeviceBuffer]) -> list[Any]:
    """Everything a user can read of the chain, the device and the buffers."""
    layers = []
    for layer in ul.mr.resource_chain(mr):
        seen: dict[str, Any] = {"layer": type(layer).__name__}
        for name in ("get_allocated_bytes", "pool_size", "free_ranges", "upstream_blocks",
                     "get_outstanding_allocations"):
            # cudaMallocAsync's pool is the driver's: on a failure it gives back what it holds unused and tries
            # again, as CUDA's does. What it has handed out is the same.
            if isinstance(layer, ul.mr.CudaAsyncMemoryResource) and name in ("pool_size", "upstream_blocks"):
                continue
            if hasattr(layer, name):
                seen[name] = getattr(layer, name)()
        if hasattr(layer, "allocation_counts"):
            seen["counts"] = dict(layer.allocation_counts)
        layers.append(seen)
    maps = [(b.id, ul.residency(b).states.tobytes()) for b in buffers]
    trims = any(isinstance(layer, ul.mr.CudaAsyncMemoryResource) for layer in ul.mr.resource_chain(mr))
    device = None if trims else mr.backend.mem_info()   # (what such a pool gives back is free again)
    return [layers, device, maps, sorted(b.id for b in ul.live_buffers())]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(leaf=st.sampled_from(sorted(LEAVES)), layers=st.lists(st.sampled_from(sorted(LAYERS)), max_size=4),
       at=st.integers(0, 4), data=st.data())
def test_a_failed_allocation_anywhere_changes_nothing_and_the_next_one_works(sim_backend, tmp_path, leaf, layers,
                                                                             at, data):
    ul.use_backend("sim", device_memory="4GiB")   # each example on a device of its own
    mr: ul.mr.MemoryResource = LEAVES[leaf]()
    injector = None
    for i, name in enumerate([*layers, None]):
        if i == min(at, len(layers)):
            mr = injector = FailsOnCommand(mr)
        if name is not None:
            try:
                mr = LAYERS[name](mr, tmp_path / f"log{i}.csv")
            except UvmLabError:   # a chain whose layers preallocate more, or larger, than those below them give
                reject()
    assert injector is not None
    buffers: list[ul.DeviceBuffer] = []
    try:
        for _ in range(data.draw(st.integers(1, 12), label="allocations")):
            size = data.draw(SIZES, label="size")
            injector.fail_in = data.draw(st.one_of(st.none(), st.integers(1, 3)), label="fail at call")
            before = observed(mr, buffers)
            try:
                buf = ul.DeviceBuffer(size=size, mr=mr)
            except UvmLabError as err:
                event(f"{type(err).__name__} {'injected' if 'injected' in str(err) else 'real'}")
                assert observed(mr, buffers) == before, f"{size} bytes failed through {ul.mr.resource_chain(mr)}"
                injector.fail_in = None
                if buffers:   # room for one more, in a chain this test may have filled
                    buffers.pop().close()
                probe = ul.DeviceBuffer(size=4096, mr=mr)   # and the next allocation works
                probe.close()
                continue
            ul.touch(buf, on="gpu", mode="write", size=min(buf.size, 64 * KiB)) if buf.is_managed and buf.size else None
            buffers.append(buf)
    finally:
        injector.fail_in = None
        for buf in buffers:
            buf.close()
    # Every layer above the first suballocator gave back all it handed out (a suballocator keeps its blocks).
    for layer in ul.mr.resource_chain(mr):
        if isinstance(layer, SUBALLOCATORS):
            break
        if hasattr(layer, "get_outstanding_allocations"):
            assert layer.get_outstanding_allocations() == {}
        if hasattr(layer, "allocation_counts"):
            assert layer.allocation_counts["current_bytes"] == 0


ADAPTORS = [name for name in sorted(LAYERS) if name not in ("pool", "arena", "binning", "fixed size")]


@pytest.mark.parametrize("size", [2**63, 2**64 - 1, 1 << 50])
@pytest.mark.parametrize("chain", [*([name] for name in sorted(LAYERS)), ["pool", *ADAPTORS]], ids=str)
def test_a_size_no_chain_can_hold_fails_at_every_depth_and_changes_nothing(sim_backend, tmp_path, chain, size):
    mr: ul.mr.MemoryResource = ul.mr.ManagedMemoryResource()
    for i, name in enumerate(chain):   # one layer above the other, checked at every depth
        mr = LAYERS[name](mr, tmp_path / f"log{i}.csv")
        kept = ul.DeviceBuffer(size=4096, mr=mr)
        before = observed(mr, [kept])
        with pytest.raises(UvmLabError):
            ul.DeviceBuffer(size=size, mr=mr)
        assert observed(mr, [kept]) == before, name
        kept.close()
