"""The CUDA backend on a real GPU: allocation, prefetch and advice read back from the driver, checked
against /proc/self/pagemap for host residency. Managed allocations stay far below free memory."""

from __future__ import annotations

import numpy as np
import pytest

import uvm_lab as ul
from uvm_lab.errors import BackendError, CudaError, InvalidArgumentError, OutOfMemoryError
from uvm_lab.tracing import host_resident

pytestmark = pytest.mark.gpu
MiB = 1 << 20


def managed(size: int) -> ul.DeviceBuffer:
    free, _ = ul.get_backend().mem_info()
    assert size < free // 4, "GPU tests never come near the card's free memory"
    return ul.DeviceBuffer(size=size, mr=ul.mr.ManagedMemoryResource())


def test_auto_picks_the_gpu_and_reports_capabilities(cuda):
    assert ul.use_backend("auto").name == "cuda"
    caps = ul.get_backend().capabilities
    assert caps.managed_memory and caps.concurrent_managed_access


def test_allocations_of_each_kind_and_device_memory_accounting(cuda):
    free0, _ = cuda.mem_info()
    dev = ul.DeviceBuffer(size=256 * MiB, mr=ul.mr.CudaMemoryResource())
    assert cuda.mem_info()[0] <= free0 - 256 * MiB
    assert ul.residency(dev).summary()["gpu"] == 1.0
    pinned = ul.DeviceBuffer(size=4 * MiB, mr=ul.mr.PinnedHostMemoryResource())
    assert host_resident(pinned.ptr, pinned.size).all()
    buf = managed(64 * MiB)
    assert buf.is_managed and not dev.is_managed
    dev.close()
    assert cuda.mem_info()[0] >= free0 - 8 * MiB


def test_prefetch_moves_pages_as_the_pagemap_shows(cuda):
    buf = managed(64 * MiB)
    ul.touch(buf, on="host", mode="write")
    assert host_resident(buf.ptr, buf.size).all()
    buf.prefetch("gpu")
    cuda.synchronize()
    assert not host_resident(buf.ptr, buf.size).any()
    assert cuda.range_advice(buf.ptr, buf.size).last_prefetch_location == ul.Location(0)
    buf.prefetch("host")
    cuda.synchronize()
    assert host_resident(buf.ptr, buf.size).all()
    assert str(cuda.range_advice(buf.ptr, buf.size).last_prefetch_location) == "host"


def test_prefetch_half_to_the_device(cuda):
    buf = managed(32 * MiB)
    ul.touch(buf, on="host", mode="write")
    cuda.prefetch(buf.ptr, buf.size // 2, ul.Location(0))
    cuda.synchronize()
    present = host_resident(buf.ptr, buf.size)
    half = len(present) // 2
    assert not present[:half].any() and present[half:].all()


def test_advice_is_read_back_from_the_driver(cuda):
    buf = managed(16 * MiB)
    assert (buf.read_mostly, buf.preferred_location, buf.accessed_by) == (False, None, ())
    buf.read_mostly = True
    buf.preferred_location = "host"
    buf.accessed_by = ["gpu"]
    assert (buf.read_mostly, buf.preferred_location, buf.accessed_by) == (True, "host", ("gpu:0",))
    buf.preferred_location = "gpu"
    assert buf.preferred_location == "gpu:0"
    buf.read_mostly = False
    buf.preferred_location = None
    buf.accessed_by = ()
    assert (buf.read_mostly, buf.preferred_location, buf.accessed_by) == (False, None, ())


def test_gpu_touch_reads_and_writes_without_changing_data(cuda):
    buf = managed(8 * MiB)
    view = cuda.host_view(buf.ptr, buf.size)
    view[:] = np.arange(buf.size, dtype=np.uint64).astype(np.uint8)
    expected = view.copy()
    for mode in ("read", "write", "atomic"):
        result = ul.touch(buf, on="gpu", mode=mode)
        assert result.seconds > 0 and result.faults is None     # counts come from CUPTI, not here
    assert not host_resident(buf.ptr, buf.size).any()           # the kernel pulled every page over
    ul.touch(buf, on="host", mode="read")
    assert host_resident(buf.ptr, buf.size).all()
    np.testing.assert_array_equal(cuda.host_view(buf.ptr, buf.size), expected)


def test_read_mostly_keeps_the_host_copy_on_a_gpu_read(cuda):
    buf = managed(16 * MiB)
    ul.touch(buf, on="host", mode="write")
    buf.read_mostly = True
    ul.touch(buf, on="gpu", mode="read")
    assert host_resident(buf.ptr, buf.size).all()               # duplicated, not moved
    ul.touch(buf, on="gpu", mode="write")
    assert not host_resident(buf.ptr, buf.size).any()           # a write collapses the copies


def test_the_oversubscription_guard_refuses_before_allocating(cuda):
    free, _ = cuda.mem_info()
    with pytest.raises(OutOfMemoryError, match="allow_oversubscription") as info:
        ul.mr.ManagedMemoryResource().allocate(free + (1 << 30))
    assert info.value.free <= free and info.value.size == free + (1 << 30)


def test_device_memory_out_of_memory_is_typed(cuda):
    _, total = cuda.mem_info()
    with pytest.raises(OutOfMemoryError) as info:
        ul.mr.CudaMemoryResource().allocate(total * 4)              # refused at once; nothing is mapped
    assert info.value.size == total * 4


def test_errors_on_the_real_backend(cuda):
    dev = ul.DeviceBuffer(size=MiB, mr=ul.mr.CudaMemoryResource())
    with pytest.raises(BackendError, match="managed memory only"):
        dev.read_mostly = True
    with pytest.raises(BackendError, match="host cannot access device memory"):
        ul.touch(dev, on="host")
    with pytest.raises(InvalidArgumentError):
        cuda.prefetch(12345, 10, ul.Location(0))
    assert issubclass(CudaError, BackendError)


def test_the_issue_walkthrough_on_the_gpu(cuda):
    pool = ul.mr.PoolMemoryResource(ul.mr.ManagedMemoryResource(), initial_pool_size="1GiB")
    ul.mr.set_current_device_resource(ul.mr.PrefetchResourceAdaptor(pool))
    a = ul.DeviceBuffer(size="512MiB")
    cuda.synchronize()
    assert not host_resident(a.ptr, a.size).any()              # prefetched to the GPU on allocation
    a.prefetch("host")
    cuda.synchronize()
    assert host_resident(a.ptr, a.size).all()
    ul.touch(a, on="gpu", mode="read")
    assert not host_resident(a.ptr, a.size).any()
    a.read_mostly = True
    a.preferred_location = "host"
    assert (a.read_mostly, a.preferred_location) == (True, "host")
    with ul.record() as trace:
        ul.touch(a, on="host", mode="write")
    assert host_resident(a.ptr, a.size).all()
    # Tracing is off: the backend says what it knows (host code wrote every page: only the host holds them).
    assert set(trace.to_pandas().kind) == {"unobserved"}
    assert ul.residency(a).counts()["host"] == a.size // 4096


def test_cuda_async_memory_resource_on_the_gpu(cuda):
    mr = ul.mr.CudaAsyncMemoryResource()
    with ul.record() as trace:
        buf = ul.DeviceBuffer(size=8 * MiB, mr=mr)
        buf.copy_from_host(np.full(8 * MiB, 3, dtype=np.uint8))
        assert (buf.copy_to_host() == 3).all()
        assert ul.residency(buf).summary()["gpu"] == 1.0 and not buf.is_managed
        buf.close()
    kinds = set(trace.to_pandas().kind)
    assert {"segment_alloc", "alloc", "free"} <= kinds
    assert mr.pool_handle() != 0


def test_cuda_async_owns_a_pool_with_the_threshold_asked_for(cuda):
    from cuda.bindings import runtime as cudart

    from uvm_lab.backends.cuda import check

    mr = ul.mr.CudaAsyncMemoryResource(initial_pool_size="64MiB", release_threshold="128MiB")
    pool = mr.pool_handle()
    assert pool != int(check(cudart.cudaDeviceGetDefaultMemPool(0)))      # its own pool, as RMM's
    threshold = check(cudart.cudaMemPoolGetAttribute(pool, cudart.cudaMemPoolAttr.cudaMemPoolAttrReleaseThreshold))
    assert int(threshold) == 128 * MiB
    assert mr.pool_size() >= 64 * MiB                  # primed: allocated and freed once, still reserved
    ptr = mr.allocate("200MiB")
    assert mr.pool_size() >= 200 * MiB
    mr.deallocate(ptr, "200MiB")
    mr.trim_to(0)
    assert mr.pool_size() == 0
    keep_all = ul.mr.CudaAsyncMemoryResource()
    threshold = check(cudart.cudaMemPoolGetAttribute(keep_all.pool_handle(),
                                                     cudart.cudaMemPoolAttr.cudaMemPoolAttrReleaseThreshold))
    assert int(threshold) == (1 << 64) - 1             # RMM's default: keep everything across syncs


def test_cuda_async_ipc_pool_exports_a_file_descriptor(cuda):
    import os

    from cuda.bindings import runtime as cudart

    from uvm_lab.backends.cuda import check

    supported = int(check(cudart.cudaDeviceGetAttribute(
        cudart.cudaDeviceAttr.cudaDevAttrMemoryPoolSupportedHandleTypes, 0)))
    if not supported & 0x1:
        with pytest.raises(ul.errors.BackendError, match="posix_file_descriptor"):
            ul.mr.CudaAsyncMemoryResource(enable_ipc=True)
        return
    mr = ul.mr.CudaAsyncMemoryResource(enable_ipc=True)
    fd = check(cudart.cudaMemPoolExportToShareableHandle(
        mr.pool_handle(), cudart.cudaMemAllocationHandleType.cudaMemHandleTypePosixFileDescriptor, 0))
    assert int(fd) >= 0
    os.close(int(fd))
    ptr = mr.allocate(1 * MiB)
    mr.deallocate(ptr, 1 * MiB)


def test_streams_of_every_library_order_the_work(cuda):
    import cupy

    with ul.Stream() as s:
        assert s.owns and s.handle != 0
        buf = ul.DeviceBuffer(size=4 * MiB, stream=s)
        buf.copy_from_host(np.arange(4 * MiB, dtype=np.uint8))
        buf.prefetch("gpu", stream=s)
        s.synchronize()
        assert (buf.copy_to_host() == np.arange(4 * MiB, dtype=np.uint8)).all()
        buf.close()
    cupy_stream = cupy.cuda.Stream(non_blocking=True)
    mr = ul.mr.CudaAsyncMemoryResource()
    with ul.record() as trace:
        ptr = mr.allocate(MiB, cupy_stream)
        mr.deallocate(ptr, MiB, cupy_stream)
    assert set(trace.of_kind(ul.events.EventKind.ALLOC)["stream"].tolist()) == {cupy_stream.ptr}
    try:
        import torch
    except ImportError:
        return
    torch_stream = torch.cuda.Stream()
    buf = ul.DeviceBuffer(size=MiB, stream=torch_stream)
    assert buf.stream.handle == torch_stream.cuda_stream
    buf.close()


def test_dlpack_export_to_torch_and_cupy_is_zero_copy(cuda):
    import cupy
    import torch

    buf = ul.DeviceBuffer(size=MiB)
    buf.copy_from_host(np.arange(MiB, dtype=np.uint8))
    tensor = torch.from_dlpack(buf)
    assert tensor.device.type == "cuda" and tensor.dtype == torch.uint8 and tensor.numel() == MiB
    tensor[:4] = 7
    torch.cuda.synchronize()
    assert buf.copy_to_host()[:5].tolist() == [7, 7, 7, 7, 4]
    array = cupy.from_dlpack(buf)
    assert int(array[4]) == 4 and array.data.ptr == buf.ptr
    device = ul.DeviceBuffer(size=MiB, mr=ul.mr.CudaMemoryResource())
    assert device.__dlpack_device__() == (2, 0)
    pinned = ul.DeviceBuffer(size=MiB, mr=ul.mr.PinnedHostMemoryResource())
    assert pinned.__dlpack_device__() == (3, 0)


def test_prefetch_on_access_moves_host_written_data_on_the_consumer_stream(cuda):
    import torch

    mr = ul.mr.PrefetchResourceAdaptor(ul.mr.ManagedMemoryResource(), on="access")
    buf = ul.DeviceBuffer(size=64 * MiB, mr=mr)
    buf.host_view()[:] = 5                              # written on the host: every page is there
    assert host_resident(buf.ptr, buf.size).all()
    stream = torch.cuda.Stream()
    with ul.record() as trace, torch.cuda.stream(stream):
        tensor = torch.from_dlpack(buf)
        total = int(tensor.sum(dtype=torch.int64))
    assert total == 5 * 64 * MiB
    prefetch = trace.of_kind(ul.events.EventKind.PREFETCH)
    assert prefetch["stream"].tolist() == [stream.cuda_stream]
    stream.synchronize()
    assert not host_resident(buf.ptr, buf.size).any()  # the pages moved to the GPU before the kernel


def test_a_large_copy_into_managed_memory_lands_on_the_gpu_unless_the_host_is_preferred(cuda):
    size = 160 * MiB                                   # three 64 MiB chunks, the last one short
    data = (np.arange(size, dtype=np.uint64) % 251).astype(np.uint8)
    buf = ul.DeviceBuffer(size=size)
    with ul.record() as trace:
        buf.copy_from_host(data)
    assert not host_resident(buf.ptr, size).any()       # populated on the GPU, chunk by chunk, ahead of the copy
    assert trace.of_kind(ul.events.EventKind.PREFETCH)["bytes"].tolist() == [size]
    np.testing.assert_array_equal(buf.copy_to_host(), data)
    on_host = ul.DeviceBuffer(size=size)
    on_host.preferred_location = "host"
    on_host.copy_from_host(data)
    assert host_resident(on_host.ptr, size).all()
    np.testing.assert_array_equal(on_host.copy_to_host(), data)
