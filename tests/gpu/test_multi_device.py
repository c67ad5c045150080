"""Per-device resources on a machine with two or more GPUs: each allocates, prefetches and pools on its own
device, read back from the driver; the caller's current device is never changed. Small allocations only."""

from __future__ import annotations

import gc

import pytest

import uvm_lab as ul
from uvm_lab.errors import InvalidArgumentError
from uvm_lab.events import EventKind

pytestmark = pytest.mark.gpu
MiB = 1 << 20


@pytest.fixture
def two(cuda):
    if cuda.device_count() < 2:
        pytest.skip(f"needs two GPUs; this machine has {cuda.device_count()} (run it on nvidia-h200-x2)")
    yield cuda
    ul.mr.reinitialize()    # device 0's plain default again, for the tests after


def device_of_pointer(ptr: int) -> int:
    from cuda.bindings import runtime as cudart

    err, attrs = cudart.cudaPointerGetAttributes(ptr)
    assert err == cudart.cudaError_t.cudaSuccess
    return int(attrs.device)


def current_device() -> int:
    from cuda.bindings import runtime as cudart

    err, device = cudart.cudaGetDevice()
    assert err == cudart.cudaError_t.cudaSuccess
    return int(device)


def test_each_leaf_resource_allocates_on_its_own_device(two):
    for device in (1, 0):
        for mr in (ul.mr.CudaMemoryResource(device=device), ul.mr.CudaAsyncMemoryResource(device=device)):
            ptr = mr.allocate(8 * MiB)
            assert device_of_pointer(ptr) == device, mr
            assert mr.device_id == device
            mr.deallocate(ptr, 8 * MiB)
            assert current_device() == 0, "a call for another device leaves the caller's device current"


def test_device_memory_is_counted_against_the_device_it_is_on(two):
    gc.collect()
    ul.deferred.run()          # pools an earlier test dropped give their memory back first
    two.synchronize()
    free0, free1 = two.mem_info(0)[0], two.mem_info(1)[0]
    assert two.mem_info()[1] == two.mem_info(0)[1]      # no device: the current one
    buf = ul.DeviceBuffer(size=512 * MiB, mr=ul.mr.CudaMemoryResource(device=1))
    assert two.mem_info(1)[0] <= free1 - 512 * MiB
    assert abs(two.mem_info(0)[0] - free0) < 64 * MiB
    buf.close()


def test_reinitialize_builds_a_pool_per_device_and_buffers_prefetch_to_theirs(two):
    ul.mr.reinitialize(pool_allocator=True, managed_memory=True, initial_pool_size="64MiB", devices=[0, 1])
    pools = [ul.mr.get_per_device_resource(d) for d in (0, 1)]
    assert [p.device_id for p in pools] == [0, 1]
    assert pools[0] is not pools[1]
    with ul.record() as trace:
        buf = ul.DeviceBuffer(size=16 * MiB, mr=pools[1])
        ul.touch(buf, on="host", mode="write")
        buf.prefetch("gpu:1")
        two.synchronize()
    assert two.range_advice(buf.ptr, buf.size).last_prefetch_location == ul.Location(1)
    allocs = trace.events[trace.events["kind"] == EventKind.ALLOC]
    assert allocs["dst"].tolist() == [1]
    ul.touch(buf, on="gpu:1", mode="read")       # a kernel on device 1 reads it there
    buf.preferred_location = "gpu:1"
    assert two.range_advice(buf.ptr, buf.size).preferred_location == ul.Location(1)
    buf.close()
    assert current_device() == 0


def test_a_resource_of_one_device_is_refused_for_another(two):
    mr = ul.mr.CudaMemoryResource(device=1)
    with pytest.raises(InvalidArgumentError, match="device 1, not device 0"):
        ul.mr.set_per_device_resource(0, mr)
    assert ul.mr.get_per_device_resource(0).device_id == 0
    with pytest.raises(InvalidArgumentError, match=f"0..{two.device_count() - 1}"):
        ul.mr.ManagedMemoryResource(device=two.device_count())
