"""RMM's names beyond the resources of old: the top-level functions, CallbackMemoryResource, the HMM/ATS resources
and the allocators package, on the simulator."""

from __future__ import annotations

import importlib
import subprocess
import sys

import numpy as np
import pytest

import uvm_lab as ul
from uvm_lab.errors import BackendError, DoubleFreeError, InvalidArgumentError, InvalidStateError, OutOfMemoryError
from uvm_lab.events import EventKind

MiB = 1 << 20
GiB = 1 << 30


# -- top-level names -------------------------------------------------------------------------------------------

def test_rmms_top_level_functions_are_uvm_labs():
    assert ul.reinitialize is ul.mr.reinitialize
    assert ul.register_reinitialize_hook is ul.mr.register_reinitialize_hook
    assert ul.unregister_reinitialize_hook is ul.mr.unregister_reinitialize_hook
    assert ul.is_initialized is ul.mr.is_initialized
    assert ul.available_device_memory is ul.mr.available_device_memory
    ul.reinitialize(pool_allocator=True, managed_memory=True, initial_pool_size="64MiB")
    assert isinstance(ul.mr.get_current_device_resource(), ul.mr.PoolMemoryResource)


def test_available_device_memory_is_the_current_devices_free_and_total(sim_backend):
    assert ul.available_device_memory() == (4 * GiB, 4 * GiB)
    buf = ul.DeviceBuffer(size=64 * MiB)
    buf.prefetch()
    assert ul.available_device_memory() == (4 * GiB - 64 * MiB, 4 * GiB) == sim_backend.mem_info()


def test_is_initialized_says_whether_a_backend_has_been_chosen():
    assert ul.is_initialized()              # the tests' fixture chose the simulator
    code = ("import uvm_lab as ul; print(ul.is_initialized()); ul.use_backend('sim'); print(ul.is_initialized())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]


# -- CallbackMemoryResource ---------------------------------------------------------------------------------------

def test_callback_resource_runs_rmms_example():
    base = ul.mr.ManagedMemoryResource()
    calls: list[tuple] = []

    def allocate_func(size, stream):
        calls.append(("allocate", size, stream))
        return base.allocate(size, stream)

    def deallocate_func(ptr, size, stream):
        calls.append(("deallocate", size, stream))
        return base.deallocate(ptr, size, stream)

    ul.mr.set_current_device_resource(ul.mr.CallbackMemoryResource(allocate_func, deallocate_func))
    with ul.record() as trace:
        dbuf = ul.DeviceBuffer(size=256)
        assert base.get_allocated_bytes() == 256
        dbuf.close()
    assert calls == [("allocate", 256, ul.DEFAULT_STREAM), ("deallocate", 256, ul.DEFAULT_STREAM)]
    assert base.get_allocated_bytes() == 0
    assert trace.to_pandas().kind.tolist().count("alloc") == 2    # the callback resource's and the base's


def test_callback_resource_passes_the_buffers_stream():
    stream = ul.Stream()
    seen = []
    base = ul.mr.ManagedMemoryResource()
    mr = ul.mr.CallbackMemoryResource(lambda size, s: seen.append(s) or base.allocate(size, s),
                                      lambda ptr, size, s: seen.append(s) or base.deallocate(ptr, size, s))
    ul.DeviceBuffer(size=64, mr=mr, stream=stream).close()
    assert [s.handle for s in seen] == [stream.handle, stream.handle]


@pytest.mark.parametrize(("returned", "error", "match"), [
    ("0x10", InvalidArgumentError, "not an address"),
    (-1, InvalidArgumentError, "not an address"),
    (None, InvalidArgumentError, "not an address"),
    (0, OutOfMemoryError, "null address"),
])
def test_callback_resource_refuses_what_is_no_address_and_publishes_no_allocation(returned, error, match):
    mr = ul.mr.CallbackMemoryResource(lambda size, stream: returned, lambda ptr, size, stream: None)
    with ul.record() as trace, pytest.raises(error, match=match):
        mr.allocate(64)
    assert EventKind.ALLOC not in set(trace.events["kind"].tolist()) and mr.get_allocated_bytes() == 0


def test_callback_resource_refuses_an_address_handed_out_twice():
    mr = ul.mr.CallbackMemoryResource(lambda size, stream: 0x1000, lambda ptr, size, stream: None)
    assert mr.allocate(64) == 0x1000
    with pytest.raises(InvalidStateError, match="already handed out"):
        mr.allocate(64)
    assert mr.get_allocated_bytes() == 64


def test_a_callback_that_raises_propagates_and_changes_nothing():
    base = ul.mr.ManagedMemoryResource()

    def deallocate(ptr, size, stream):
        raise KeyError("no")

    mr = ul.mr.CallbackMemoryResource(lambda size, stream: base.allocate(size, stream), deallocate)
    ptr = mr.allocate(64)
    with pytest.raises(KeyError):
        mr.deallocate(ptr, 64)
    assert mr.get_allocated_bytes() == 64
    with pytest.raises(DoubleFreeError):
        mr.deallocate(ptr + 1, 64)


@pytest.mark.parametrize("args", [(None, print), (print, "free"), (1, 2)])
def test_callback_resource_needs_two_callables(args):
    with pytest.raises(InvalidArgumentError, match="must be callable"):
        ul.mr.CallbackMemoryResource(*args)


# -- SystemMemoryResource and SamHeadroomMemoryResource --------------------------------------------------------

@pytest.mark.parametrize("make", [ul.mr.SystemMemoryResource, lambda: ul.mr.SamHeadroomMemoryResource("1GiB")])
def test_system_memory_needs_hmm_or_ats_and_says_what_would_work(make):
    with pytest.raises(BackendError, match="HMM or ATS") as info:
        make()
    assert "ManagedMemoryResource" in str(info.value) and "gh200-ats" in str(info.value)


def test_system_memory_on_an_ats_platform_migrates_as_managed_memory():
    ul.use_backend("sim", device_memory="4GiB", platform="gh200-ats")
    mr = ul.mr.SystemMemoryResource()
    buf = ul.DeviceBuffer(size=8 * MiB, mr=mr)
    assert mr.is_managed and buf.is_managed
    buf.copy_from_host(np.full(8 * MiB, 3, dtype=np.uint8))
    buf.prefetch("gpu")
    assert ul.residency(buf).summary()["gpu"] == 1.0 and (buf.copy_to_host() == 3).all()
    buf.preferred_location = "host"
    assert buf.preferred_location == "host"
    buf.close()
    assert mr.get_allocated_bytes() == 0


def test_sam_headroom_keeps_the_headroom_free_by_advice():
    backend = ul.use_backend("sim", device_memory="4GiB", platform="gh200-ats")
    mr = ul.mr.SamHeadroomMemoryResource(headroom="3GiB")
    with ul.record() as trace:
        buf = ul.DeviceBuffer(size=2 * GiB, mr=mr)
    advice = trace.of_kind(EventKind.ADVICE)
    assert advice["bytes"].tolist() == [GiB, GiB]                    # 4 GiB free less 3 GiB of headroom
    assert str(backend.range_advice(buf.ptr, GiB).preferred_location) == "gpu:0"
    assert str(backend.range_advice(buf.ptr + GiB, GiB).preferred_location) == "host"
    small = ul.DeviceBuffer(size=MiB, mr=ul.mr.SamHeadroomMemoryResource(0))
    assert small.preferred_location == "gpu:0"
    full = ul.DeviceBuffer(size=MiB, mr=ul.mr.SamHeadroomMemoryResource("8GiB"))
    assert full.preferred_location == "host"


def test_sam_headroom_validates_its_size():
    ul.use_backend("sim", platform="gh200-ats")
    with pytest.raises(ul.errors.InvalidSizeError, match="headroom"):
        ul.mr.SamHeadroomMemoryResource(-1)


def test_the_simulator_refuses_system_memory_where_its_platform_has_none(sim_backend):
    with pytest.raises(BackendError, match="gh200-ats"):
        sim_backend.allocate_system(4096)


# -- allocators -----------------------------------------------------------------------------------------------------

def test_the_allocators_package_has_rmms_layout_and_the_old_names_still_import():
    from uvm_lab.allocators import cupy as allocators_cupy
    from uvm_lab.integrations import cupy as integrations_cupy

    assert integrations_cupy.cupy_allocator is allocators_cupy.cupy_allocator is allocators_cupy.uvm_lab_cupy_allocator
    assert integrations_cupy.make_cupy_allocator is allocators_cupy.make_cupy_allocator


def test_cupy_allocator_on_the_simulator_is_a_backend_error():
    from uvm_lab.allocators.cupy import uvm_lab_cupy_allocator

    with ul.record() as trace, pytest.raises(BackendError, match="real GPU"):
        uvm_lab_cupy_allocator(1024)
    assert len(trace) == 0


def test_the_numba_plugin_imports_anywhere_and_says_what_is_missing():
    numba_plugin = importlib.import_module("uvm_lab.allocators.numba")
    assert numba_plugin._numba_memory_manager is numba_plugin.UvmLabNumbaManager   # NUMBA_CUDA_MEMORY_MANAGER
    try:
        import numba.cuda  # noqa: F401
    except ImportError:
        with pytest.raises(BackendError, match="numba-cuda"):
            numba_plugin.UvmLabNumbaManager()
    else:
        pytest.skip("numba is installed here: the GPU tests use the plugin")
