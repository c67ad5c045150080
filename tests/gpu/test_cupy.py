"""CuPy on uvm_lab memory, and buffers shared through the CUDA Array Interface, on a real GPU."""

from __future__ import annotations

import numpy as np
import pytest

import uvm_lab as ul
from uvm_lab.events import EventKind
from uvm_lab.tracing import host_resident

from ..unit.waiting import eventually

pytestmark = pytest.mark.gpu
MiB = 1 << 20


def test_copies_and_views_on_each_kind_of_memory(cuda):
    data = np.arange(MiB // 4, dtype=np.float32)
    for mr in (ul.mr.ManagedMemoryResource(), ul.mr.CudaMemoryResource(), ul.mr.PinnedHostMemoryResource()):
        buf = ul.DeviceBuffer(size=MiB, mr=mr)
        buf.copy_from_host(data)
        np.testing.assert_array_equal(buf.copy_to_host().view(np.float32), data)
        if buf.is_managed:
            np.testing.assert_array_equal(buf.host_view(np.float32), data)


def test_cuda_array_interface_is_read_by_cupy(cuda, cupy):
    buf = ul.DeviceBuffer(size=4 * MiB)
    buf.copy_from_host(np.ones(MiB, dtype=np.float32))
    arr = cupy.asarray(buf).view(cupy.float32)
    assert float(arr.sum()) == MiB
    assert arr.data.ptr == buf.ptr


def test_cupy_arrays_come_from_a_uvm_lab_pool(cuda, cupy):
    from uvm_lab.integrations.cupy import make_cupy_allocator

    pool = ul.mr.PoolMemoryResource(ul.mr.ManagedMemoryResource(), initial_pool_size="256MiB")
    stats = ul.mr.StatisticsResourceAdaptor(pool)
    cupy.cuda.set_allocator(make_cupy_allocator(stats))
    with ul.record() as trace:
        n = 16 * MiB // 8
        x = cupy.arange(n, dtype=cupy.int64)
        y = (x * 2).sum()
    assert int(y) == n * (n - 1)
    allocs = trace.of_kind(EventKind.ALLOC)
    assert 16 * MiB in allocs["bytes"].tolist()
    assert stats.allocation_counts["current_bytes"] >= 16 * MiB
    buf = next(b for b in ul.live_buffers() if b.ptr == x.data.ptr)
    # CuPy's kernel wrote it, which uvm_lab does not see with tracing off: its map says unknown, never "nowhere"
    where = ul.residency(buf).summary()
    assert where["nowhere"] == 0.0 and where["gpu"] + where["unknown"] == 1.0, where
    buf.prefetch("host")
    cuda.synchronize()
    assert host_resident(x.data.ptr, x.nbytes).all()             # a CuPy array's pages, moved by uvm_lab
    del x, y, buf                                               # the last references to the array's memory
    import gc

    gc.collect()
    # freed through the resource when CuPy let go (soon, off the collecting thread)
    assert eventually(lambda: stats.allocation_counts["current_bytes"] == 0)
