"""Resources and adaptors with RMM's names: the chain, the current resource, prefetch on allocate."""

from __future__ import annotations

import pytest

import uvm_lab as ul
from uvm_lab.errors import InvalidArgumentError, InvalidLocationError, OutOfMemoryError

MiB = 1 << 20


def test_managed_allocation_beyond_free_device_memory_is_refused_by_default():
    with pytest.raises(OutOfMemoryError, match="allow_oversubscription=True") as info:
        ul.mr.ManagedMemoryResource().allocate("5GiB")
    assert info.value.size == 5 << 30 and info.value.free == 4 << 30
    ptr = ul.mr.ManagedMemoryResource(allow_oversubscription=True).allocate("5GiB")
    assert ptr


def test_prefetch_adaptor_prefetches_to_the_device_by_default():
    mr = ul.mr.PrefetchResourceAdaptor(ul.mr.ManagedMemoryResource())
    buf = ul.DeviceBuffer(size=8 * MiB, mr=mr)
    assert ul.residency(buf).summary()["gpu"] == 1.0


def test_prefetch_adaptor_to_host_and_min_size():
    to_host = ul.mr.PrefetchResourceAdaptor(ul.mr.ManagedMemoryResource(), device="host")
    assert ul.residency(ul.DeviceBuffer(size=MiB, mr=to_host)).summary()["host"] == 1.0
    big_only = ul.mr.PrefetchResourceAdaptor(ul.mr.ManagedMemoryResource(), min_size="1MiB")
    assert ul.residency(ul.DeviceBuffer(size=4096, mr=big_only)).summary()["nowhere"] == 1.0
    assert ul.residency(ul.DeviceBuffer(size=MiB, mr=big_only)).summary()["gpu"] == 1.0


def test_prefetch_adaptor_leaves_device_memory_alone():
    mr = ul.mr.PrefetchResourceAdaptor(ul.mr.CudaMemoryResource(), device="host")
    assert ul.residency(ul.DeviceBuffer(size=MiB, mr=mr)).summary()["gpu"] == 1.0


@pytest.mark.parametrize(("kwargs", "error"), [
    ({"device": "tpu"}, InvalidLocationError),
    ({"device": 4}, InvalidLocationError),
    ({"min_size": -1}, ul.errors.InvalidSizeError),
])
def test_prefetch_adaptor_validates(kwargs, error):
    with pytest.raises(error):
        ul.mr.PrefetchResourceAdaptor(ul.mr.ManagedMemoryResource(), **kwargs)


def test_adaptors_need_a_resource_upstream():
    with pytest.raises(InvalidArgumentError, match="upstream_mr"):
        ul.mr.PrefetchResourceAdaptor("managed")


def test_resource_chain_lists_every_layer():
    managed = ul.mr.ManagedMemoryResource()
    pool = ul.mr.PoolMemoryResource(managed, initial_pool_size="64MiB")
    top = ul.mr.StatisticsResourceAdaptor(ul.mr.PrefetchResourceAdaptor(pool))
    chain = ul.mr.resource_chain(top)
    assert [type(r).__name__ for r in chain] == [
        "StatisticsResourceAdaptor", "PrefetchResourceAdaptor", "PoolMemoryResource", "ManagedMemoryResource"]
    assert chain[1].get_upstream() is pool and top.is_managed


def test_current_device_resource_is_used_by_buffers():
    assert isinstance(ul.mr.get_current_device_resource(), ul.mr.ManagedMemoryResource)
    stats = ul.mr.StatisticsResourceAdaptor(ul.mr.ManagedMemoryResource())
    ul.mr.set_current_device_resource(stats)
    assert ul.mr.get_current_device_resource() is stats
    buf = ul.DeviceBuffer(size=MiB)
    assert buf.mr is stats and stats.allocation_counts["current_bytes"] == MiB


def test_a_new_backend_starts_with_a_fresh_default_resource():
    old = ul.mr.StatisticsResourceAdaptor(ul.mr.ManagedMemoryResource())
    ul.mr.set_current_device_resource(old)
    ul.use_backend("sim", device_memory="1GiB")
    assert ul.mr.get_current_device_resource() is not old
    with pytest.raises(InvalidArgumentError, match="another backend"):
        ul.mr.set_current_device_resource(old)


def test_set_current_device_resource_validates():
    with pytest.raises(InvalidArgumentError, match="memory resource"):
        ul.mr.set_current_device_resource(object())
    with pytest.raises(InvalidArgumentError):
        ul.mr.set_per_device_resource("host", ul.mr.ManagedMemoryResource())


def test_pool_walkthrough_from_the_issue():
    pool = ul.mr.PoolMemoryResource(ul.mr.ManagedMemoryResource(), initial_pool_size="1GiB")
    ul.mr.set_current_device_resource(ul.mr.PrefetchResourceAdaptor(pool))
    a = ul.DeviceBuffer(size="512MiB")
    assert ul.residency(a).summary()["gpu"] == 1.0          # prefetched to the GPU on allocation
    a.prefetch("host")
    assert ul.residency(a).summary()["host"] == 1.0
    r = ul.touch(a, on="gpu", mode="read")
    assert r.faults > 0 and r.bytes_htod == 512 * MiB
    a.read_mostly = True
    a.preferred_location = "host"
    assert (a.read_mostly, a.preferred_location) == (True, "host")
    with ul.record() as trace:
        ul.touch(a, on="host", mode="write")
    df = trace.to_pandas()
    assert {"dtoh", "cpu_page_fault"} <= set(df.kind) and df[df.kind == "dtoh"].bytes.sum() == 512 * MiB
    assert ul.residency(a).summary() == {"gpu": 0.0, "host": 1.0, "both": 0.0, "nowhere": 0.0,
                                         "unknown": 0.0}


@pytest.mark.parametrize("ptr", [[1, 2], "0x7f00", None, 1.5])
def test_giving_back_something_that_is_no_pointer_is_a_typed_error(ptr):
    for mr in (ul.mr.ManagedMemoryResource(),
               ul.mr.PoolMemoryResource(ul.mr.ManagedMemoryResource(), initial_pool_size="1MiB")):
        live = mr.allocate(4096)
        with pytest.raises(ul.errors.DoubleFreeError, match="does not hold pointer"):
            mr.deallocate(ptr, 4096)
        mr.deallocate(live, 4096)                  # what it did hold is still there to give back
        assert mr.get_allocated_bytes() == 0


@pytest.mark.parametrize("make", [
    lambda d: ul.mr.CudaMemoryResource(device=d),
    lambda d: ul.mr.ManagedMemoryResource(device=d),
    lambda d: ul.mr.CudaAsyncMemoryResource(device=d),
])
def test_a_leaf_resource_keeps_the_device_it_was_made_for_and_refuses_one_that_is_not_there(make):
    mr = make(0)
    assert mr.device_id == 0
    ptr = mr.allocate(4096)
    mr.deallocate(ptr, 4096)
    for bad in (1, -1, True, "0", 0.0):
        with pytest.raises(InvalidArgumentError, match=r"0\.\.0") as err:
            make(bad)
        assert err.value.value == bad


def test_per_device_resources_default_to_managed_memory_on_their_device_and_check_what_they_are_given():
    mr = ul.mr.get_per_device_resource(0)
    assert isinstance(mr, ul.mr.ManagedMemoryResource) and mr.device_id == 0
    pinned = ul.mr.PinnedHostMemoryResource()       # host memory belongs to no device: any may use it
    ul.mr.set_per_device_resource(0, pinned)
    assert ul.mr.get_current_device_resource() is pinned
    with pytest.raises(InvalidArgumentError, match=r"ordinal 0\.\.0"):
        ul.mr.set_per_device_resource(1, ul.mr.CudaMemoryResource())
    assert ul.mr.get_current_device_resource() is pinned


def test_mem_info_reads_the_current_device_when_none_is_named(sim_backend):
    assert sim_backend.mem_info() == sim_backend.mem_info(0)
    with pytest.raises(InvalidArgumentError):
        sim_backend.mem_info(1)


@pytest.mark.parametrize("chain", ["managed", "pool", "statistics over pool"])
@pytest.mark.parametrize("size", [2**63, 2**64 - 1])
def test_a_size_no_memory_holds_is_out_of_memory_and_changes_nothing(sim_backend, chain, size):
    managed = ul.mr.ManagedMemoryResource()
    mr = {"managed": lambda: managed,
          "pool": lambda: ul.mr.PoolMemoryResource(managed, initial_pool_size="2MiB"),
          "statistics over pool": lambda: ul.mr.StatisticsResourceAdaptor(
              ul.mr.PoolMemoryResource(managed, initial_pool_size="2MiB"))}[chain]()
    kept = mr.allocate(4096)
    before = managed.get_allocated_bytes()
    with pytest.raises(OutOfMemoryError):
        mr.allocate(size)
    with pytest.raises(OutOfMemoryError):
        ul.DeviceBuffer(size=size, mr=mr)
    assert managed.get_allocated_bytes() == before
    if chain == "statistics over pool":
        assert mr.allocation_counts["current_bytes"] == 4096
    other = mr.allocate(1 << 20)   # and the next one works
    mr.deallocate(other, 1 << 20)
    mr.deallocate(kept, 4096)


def test_a_size_past_2_to_the_64_is_a_size_error_not_out_of_memory(sim_backend):
    with pytest.raises(ul.errors.InvalidSizeError, match=r"2\*\*64 - 1"):
        ul.mr.ManagedMemoryResource().allocate(2**64)


def test_a_simulated_allocation_too_large_for_this_host_fails_alone(sim_backend):
    # The simulator keeps every page's state in this process: an EiB of pages (2**48 of them) cannot be held on
    # any host, and saying so leaves the backend able to allocate as before.
    mr = ul.mr.ManagedMemoryResource(allow_oversubscription=True)
    with pytest.raises(OutOfMemoryError, match="pages do not fit") as info:
        mr.allocate(1 << 60)
    assert info.value.size == 1 << 60
    buf = ul.DeviceBuffer(size="4MiB", mr=mr)
    ul.touch(buf, on="gpu", mode="write")
    assert ul.residency(buf).counts()["gpu"] == 1024
    buf.close()
