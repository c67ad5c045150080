"""RMM's names on a real GPU: DeviceBuffer's copies (ptr=, copy_from_device, resize) through cudaMemcpy, CuPy's and
Numba's allocators, CallbackMemoryResource, and the HMM/ATS resources where the GPU has (or lacks) pageable access."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import uvm_lab as ul
from uvm_lab.errors import BackendError
from uvm_lab.tracing import host_resident

pytestmark = pytest.mark.gpu
MiB = 1 << 20


@pytest.mark.parametrize("make", [ul.mr.ManagedMemoryResource, ul.mr.CudaMemoryResource])
def test_ptr_copy_from_device_resize_and_tobytes_move_the_bytes(cuda, make):
    data = np.arange(MiB, dtype=np.uint8)
    mr = make()
    host_copy = ul.DeviceBuffer(ptr=data.ctypes.data, size=data.size, mr=mr)
    assert host_copy.tobytes() == data.tobytes()
    device_copy = ul.DeviceBuffer(ptr=host_copy.ptr + 1, size=1000, mr=mr)
    assert device_copy.tobytes() == data[1:1001].tobytes()
    target = ul.DeviceBuffer(size=2 * MiB, mr=mr)
    target.copy_from_device(host_copy)
    assert target.copy_to_host()[: MiB].tobytes() == data.tobytes()
    old = target.ptr
    target.resize(3 * MiB)
    assert target.ptr != old and target.copy_to_host()[: MiB].tobytes() == data.tobytes()
    target.resize(10)
    assert target.tobytes() == data[:10].tobytes()
    twin = host_copy.copy()
    assert twin.tobytes() == data.tobytes() and twin.mr is mr


def test_copy_from_device_reads_cupy_arrays_and_ptr_takes_their_memory(cuda, cupy):
    arr = cupy.arange(1024, dtype=cupy.float32)
    buf = ul.DeviceBuffer(size=arr.nbytes)
    buf.copy_from_device(arr)
    np.testing.assert_array_equal(buf.copy_to_host().view(np.float32), np.arange(1024, dtype=np.float32))
    other = ul.DeviceBuffer(ptr=arr.data.ptr, size=arr.nbytes)
    assert other.tobytes() == buf.tobytes()
    with pytest.raises(ul.errors.InvalidArgumentError, match="1-D"):
        buf.copy_from_device(arr.reshape(32, 32))


def test_prefetch_takes_rmms_device_argument(cuda):
    buf = ul.DeviceBuffer(size=16 * MiB, mr=ul.mr.ManagedMemoryResource())
    ul.touch(buf, on="host", mode="write")
    buf.prefetch(device=0)
    cuda.synchronize()
    assert not host_resident(buf.ptr, buf.size).any()
    buf.prefetch(device=-1)   # cudaCpuDeviceId
    cuda.synchronize()
    assert host_resident(buf.ptr, buf.size).all()


def test_the_cupy_allocator_under_rmms_name(cuda, cupy):
    from uvm_lab.allocators.cupy import uvm_lab_cupy_allocator

    stats = ul.mr.StatisticsResourceAdaptor(ul.mr.ManagedMemoryResource())
    ul.mr.set_current_device_resource(stats)
    cupy.cuda.set_allocator(uvm_lab_cupy_allocator)
    x = cupy.ones(MiB, dtype=cupy.uint8)
    assert int(x.sum()) == MiB and stats.allocation_counts.current_bytes >= MiB
    assert any(b.ptr == x.data.ptr and b.label == "cupy" for b in ul.live_buffers())


def test_callback_resource_on_the_gpu(cuda):
    base = ul.mr.CudaMemoryResource()
    sizes = []
    mr = ul.mr.CallbackMemoryResource(lambda size, stream: sizes.append(size) or base.allocate(size, stream),
                                      lambda ptr, size, stream: base.deallocate(ptr, size, stream))
    with ul.DeviceBuffer.to_device(b"on the gpu") as buf, ul.DeviceBuffer(ptr=buf.ptr, size=buf.size, mr=mr) as copy:
        assert copy.tobytes() == b"on the gpu"
    assert sizes == [10] and base.get_allocated_bytes() == 0


def test_system_memory_where_the_gpu_reaches_pageable_memory_and_a_clear_error_where_not(cuda):
    if not cuda.capabilities.pageable_memory_access:
        for make in (ul.mr.SystemMemoryResource, lambda: ul.mr.SamHeadroomMemoryResource(0)):
            with pytest.raises(BackendError, match="HMM or ATS") as info:
                make()
            assert "ManagedMemoryResource" in str(info.value)
        return
    mr = ul.mr.SystemMemoryResource()
    buf = ul.DeviceBuffer(size=16 * MiB, mr=mr)
    buf.copy_from_host(np.full(16 * MiB, 5, dtype=np.uint8))
    buf.prefetch("gpu")
    ul.touch(buf, on="gpu", mode="read")
    assert (buf.copy_to_host() == 5).all()
    buf.close()
    free, _ = cuda.mem_info()
    everything = ul.mr.SamHeadroomMemoryResource(free + (1 << 30))   # more headroom than free memory: all on the host
    with ul.DeviceBuffer(size=16 * MiB, mr=everything) as part:
        assert part.preferred_location == "host"
    with ul.DeviceBuffer(size=16 * MiB, mr=ul.mr.SamHeadroomMemoryResource(0)) as part:
        assert part.preferred_location == "gpu:0"


def test_numba_arrays_come_from_uvm_lab_through_the_plugin(cuda):
    pytest.importorskip("numba.cuda")
    script = textwrap.dedent("""
        import gc
        import numpy as np
        import uvm_lab as ul
        ul.use_backend("cuda", watch=False)
        from numba import cuda

        a = cuda.to_device(np.arange(4096, dtype=np.float32))
        address = a.__cuda_array_interface__["data"][0]
        owned = [b for b in ul.live_buffers() if b.label == "numba"]
        assert [b.ptr for b in owned] == [address], (owned, address)

        # A kernel on the same memory (CuPy's: numba's own compiler is not what this tests).
        import cupy
        view = cupy.asarray(a)
        view *= 2
        cupy.cuda.runtime.deviceSynchronize()
        del view
        assert (a.copy_to_host() == 2 * np.arange(4096, dtype=np.float32)).all()
        print(type(cuda.current_context().memory_manager).__name__)
        del a, owned
        gc.collect()
        ul.deferred.run()
        print(len([b for b in ul.live_buffers() if b.label == "numba"]))
    """)
    env = dict(os.environ, NUMBA_CUDA_MEMORY_MANAGER="uvm_lab.allocators.numba")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["UvmLabNumbaManager", "0"]
