"""CudaAsyncMemoryResource on the simulator: device memory from a pool with a release threshold."""

from __future__ import annotations

import pytest

import uvm_lab as ul
from uvm_lab.errors import BackendError, DoubleFreeError, InvalidArgumentError, InvalidSizeError, OutOfMemoryError
from uvm_lab.events.schema import EventKind, MemoryKind
from uvm_lab.mr.cuda_async import CudaAsyncMemoryResource

MiB = 1 << 20
GiB = 1 << 30


def test_defaults_reserve_nothing_and_keep_everything():
    mr = CudaAsyncMemoryResource()
    assert mr.pool_size() == 0 and mr.release_threshold is None
    assert not mr.is_managed and mr.device_id == 0
    assert (mr.enable_ipc, mr.enable_fabric) == (False, False)


def test_allocations_are_device_memory_that_never_migrates(sim_backend):
    mr = CudaAsyncMemoryResource()
    free = sim_backend.mem_info(0)[0]
    ptr = mr.allocate("3MiB", stream=5)
    assert sim_backend.segment_kind(ptr) is MemoryKind.DEVICE
    assert sim_backend.mem_info(0)[0] == free - 4 * MiB      # reserved in whole 2 MiB blocks
    mr.deallocate(ptr, "3MiB", stream=5)
    assert mr.pool_size() == 4 * MiB                          # no threshold: the pool keeps it
    again = mr.allocate(MiB)
    assert again == ptr                                       # and reuses it
    mr.deallocate(again, MiB)


def test_initial_pool_size_primes_the_pool(sim_backend):
    mr = CudaAsyncMemoryResource(initial_pool_size="64MiB")
    assert mr.pool_size() == 64 * MiB
    ptrs = [mr.allocate(10 * MiB) for _ in range(6)]
    assert mr.pool_size() == 64 * MiB and len(mr.upstream_blocks()) == 1
    for p in ptrs:
        mr.deallocate(p, 10 * MiB)


def test_the_release_threshold_trims_wholly_free_chunks(sim_backend):
    mr = CudaAsyncMemoryResource(initial_pool_size="32MiB", release_threshold="48MiB")
    big = mr.allocate(40 * MiB)                               # past the first chunk: a second one
    assert mr.pool_size() == 72 * MiB
    mr.deallocate(big, 40 * MiB)
    assert mr.pool_size() == 32 * MiB                         # the 40 MiB chunk went back
    mr.trim_to(0)
    assert mr.pool_size() == 0
    assert sim_backend.mem_info(0)[0] == sim_backend.mem_info(0)[1]


def test_a_zero_threshold_gives_back_every_free_chunk():
    mr = CudaAsyncMemoryResource(release_threshold=0)
    ptr = mr.allocate(MiB)
    mr.deallocate(ptr, MiB)
    assert mr.pool_size() == 0


def test_events_are_published():
    mr = CudaAsyncMemoryResource()
    with ul.record() as trace:
        ptr = mr.allocate(1000, stream=3)
        mr.deallocate(ptr, 1000, stream=3)
        with pytest.raises(OutOfMemoryError):
            mr.allocate("5GiB")
    kinds = [EventKind(k) for k in trace.events["kind"]]
    # The failing request first gave the pool's unused chunk back (SEGMENT_FREE), as the driver does.
    assert kinds == [EventKind.SEGMENT_ALLOC, EventKind.ALLOC, EventKind.FREE, EventKind.SEGMENT_FREE,
                     EventKind.ALLOC_FAILURE]
    alloc = trace.events[1]
    assert (int(alloc["address"]), int(alloc["bytes"]), int(alloc["stream"])) == (ptr, 1000, 3)


def test_running_out_gives_unused_memory_back_then_retries(sim_backend):
    mr = CudaAsyncMemoryResource()
    ptr = mr.allocate(3 * GiB)
    mr.deallocate(ptr, 3 * GiB)
    big = mr.allocate(3 * GiB + MiB)                          # does not fit beside the cached 3 GiB
    assert mr.pool_size() == 3 * GiB + 2 * MiB
    mr.deallocate(big, 3 * GiB + MiB)


def test_a_failure_leaves_the_allocations_as_they_were(sim_backend):
    mr = CudaAsyncMemoryResource()
    keep = mr.allocate(GiB)
    with pytest.raises(OutOfMemoryError) as err:
        mr.allocate(4 * GiB)
    assert err.value.size == 4 * GiB
    assert mr.get_allocated_bytes() == GiB and mr.pool_size() == GiB
    mr.deallocate(keep, GiB)
    with pytest.raises(DoubleFreeError):
        mr.deallocate(keep, GiB)


@pytest.mark.parametrize(("kwargs", "error"), [
    ({"initial_pool_size": -1}, InvalidSizeError),
    ({"initial_pool_size": "big"}, InvalidSizeError),
    ({"release_threshold": 1.5}, InvalidSizeError),
    ({"initial_pool_size": "2MiB", "release_threshold": "1MiB"}, InvalidArgumentError),
    ({"enable_ipc": 1}, InvalidArgumentError),
    ({"enable_fabric": "no"}, InvalidArgumentError),
])
def test_bad_arguments_are_named(sim_backend, kwargs, error):
    free = sim_backend.mem_info(0)[0]
    with pytest.raises(error):
        CudaAsyncMemoryResource(**kwargs)
    assert sim_backend.mem_info(0)[0] == free


@pytest.mark.parametrize("flag", ["enable_ipc", "enable_fabric"])
def test_shareable_handles_are_not_on_the_simulator(flag):
    with pytest.raises(BackendError, match=flag):
        CudaAsyncMemoryResource(**{flag: True})


def test_pool_handle_is_not_on_the_simulator():
    with pytest.raises(BackendError, match="pool_handle"):
        CudaAsyncMemoryResource().pool_handle()


def test_a_backend_without_stream_ordered_allocation_is_refused(monkeypatch, sim_backend):
    monkeypatch.setattr(sim_backend, "name", "cuda")
    with pytest.raises(BackendError, match="not available"):
        CudaAsyncMemoryResource()


def test_what_the_resource_asks_of_a_backend_with_driver_pools(monkeypatch, sim_backend):
    # The contract with CudaBackend (exercised for real by tests/gpu): an own pool, made with the
    # threshold and handle types, primed once, allocated from, trimmed and destroyed.
    calls: list[tuple] = []
    monkeypatch.setattr(sim_backend, "name", "cuda")
    stubs = {
        "create_async_pool": lambda *, device, release_threshold, handles: calls.append(
            ("create", device, release_threshold, handles)) or 77,
        "allocate_async": lambda size, *, device, stream, pool: calls.append(("alloc", size, stream, pool)) or 0x1000,
        "free_async": lambda ptr, *, stream: calls.append(("free", ptr, stream)),
        "async_pool_reserved": lambda pool: 4096,
        "trim_async_pool": lambda pool, keep: calls.append(("trim", pool, keep)),
    }
    for name, stub in stubs.items():
        monkeypatch.setattr(sim_backend, name, stub, raising=False)
    mr = CudaAsyncMemoryResource(initial_pool_size=4096, release_threshold="1MiB")
    assert calls == [("create", 0, 1 << 20, ()), ("alloc", 4096, 0, 77), ("free", 0x1000, 0)]  # primed as RMM does
    assert mr.pool_handle() == 77 and mr.pool_size() == 4096
    assert mr.allocate(10, stream=2) == 0x1000
    mr.deallocate(0x1000, 10, stream=2)
    mr.trim_to(0)
    assert calls[3:] == [("alloc", 10, 2, 77), ("free", 0x1000, 2), ("trim", 77, 0)]
    with pytest.raises(BackendError, match="chunks"):
        mr.upstream_blocks()
    mr._pool = None    # nothing to destroy on the simulator when the resource is collected


def test_repr():
    assert repr(CudaAsyncMemoryResource(release_threshold="1GiB")) == \
        "CudaAsyncMemoryResource(pool_size='0 B', release_threshold='1 GiB')"
