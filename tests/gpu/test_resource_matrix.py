"""Every resource and adaptor x sizes x streams, on the simulator and (``gpu`` marker) on a real GPU.

Each case allocates a buffer, moves real data in and out through it, frees it, and checks that the
resource gave everything back and said so in events.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import uvm_lab as ul
from uvm_lab.events import EventKind

MiB = 1 << 20

RESOURCES: dict[str, Callable[[], ul.mr.MemoryResource]] = {
    "cuda": lambda: ul.mr.CudaMemoryResource(),
    "managed": lambda: ul.mr.ManagedMemoryResource(),
    "pinned": lambda: ul.mr.PinnedHostMemoryResource(),
    "cuda_async": lambda: ul.mr.CudaAsyncMemoryResource(),
    "pool": lambda: ul.mr.PoolMemoryResource(ul.mr.CudaMemoryResource(), initial_pool_size="16MiB"),
    "arena": lambda: ul.mr.ArenaMemoryResource(ul.mr.CudaMemoryResource(), arena_size="32MiB"),
    "binning": lambda: ul.mr.BinningMemoryResource(ul.mr.CudaMemoryResource(), 10, 20),
    "fixed_size": lambda: ul.mr.FixedSizeMemoryResource(ul.mr.CudaMemoryResource(), "4MiB", 4),
    "prefetch": lambda: ul.mr.PrefetchResourceAdaptor(ul.mr.ManagedMemoryResource()),
    "prefetch_on_access": lambda: ul.mr.PrefetchResourceAdaptor(ul.mr.ManagedMemoryResource(), on="access"),
    "logging": lambda: ul.mr.LoggingResourceAdaptor(ul.mr.ManagedMemoryResource(),
                                                    Path(tempfile.mkdtemp()) / "allocations.csv"),
    "reinitialized": lambda: _reinitialized(),
    "statistics": lambda: ul.mr.StatisticsResourceAdaptor(ul.mr.ManagedMemoryResource()),
    "tracking": lambda: ul.mr.TrackingResourceAdaptor(ul.mr.CudaMemoryResource()),
    "limiting": lambda: ul.mr.LimitingResourceAdaptor(ul.mr.CudaMemoryResource(), "64MiB"),
    "failure_callback": lambda: ul.mr.FailureCallbackResourceAdaptor(ul.mr.CudaMemoryResource(), lambda n: False),
}
SIZES = [1, 4096, MiB + 7, 3 * MiB]


def _reinitialized() -> ul.mr.MemoryResource:
    """What ``rmm.reinitialize`` users get: a managed pool with logging, as the current device's resource."""
    ul.mr.reinitialize(pool_allocator=True, managed_memory=True, initial_pool_size="16MiB", logging=True,
                       log_file_name=Path(tempfile.mkdtemp()) / "log.csv")
    return ul.mr.get_current_device_resource()


@pytest.fixture(params=["sim", pytest.param("cuda", marks=pytest.mark.gpu)])
def backend(request, sim_backend):
    # "cuda" is the conftest's fixture: the real GPU made current, its buffers closed afterwards.
    return sim_backend if request.param == "sim" else request.getfixturevalue("cuda")


@pytest.fixture(params=["default", "stream"])
def stream(request, backend):
    if request.param == "default":
        yield None
        return
    with ul.Stream() as s:             # a real cudaStream_t on the GPU, a label on the simulator
        yield s
        s.synchronize()


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("name", sorted(RESOURCES))
def test_resource_moves_real_data_and_gives_it_all_back(name, size, backend, stream):
    mr = RESOURCES[name]()
    data = (np.arange(size, dtype=np.uint64) * 2654435761 % 251).astype(np.uint8)
    with ul.record() as trace:
        buf = ul.DeviceBuffer(size=size, mr=mr, stream=stream, label=name)
        buf.copy_from_host(data)
        np.testing.assert_array_equal(buf.copy_to_host(), data)
        ptr = buf.ptr
        buf.close()
    assert mr.get_allocated_bytes() == 0
    ev = trace.events
    mine = ev["address"] == ptr
    assert EventKind.ALLOC in ev["kind"][mine] and EventKind.FREE in ev["kind"][mine]
