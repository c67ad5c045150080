"""uvm_lab's allocator for torch, through its compiled shim, called as torch calls it: by the functions' names in
the shared library, with torch's arguments. torch's CUDA build and a GPU are not needed for this half (the
simulator's memory stands behind it); tests/gpu/test_torch_allocator_gpu.py hands it to torch itself."""

from __future__ import annotations

import ctypes
import sys

import pytest

import uvm_lab as ul
from uvm_lab import deferred
from uvm_lab.allocators import torch as allocator
from uvm_lab.errors import BackendError, InvalidArgumentError
from uvm_lab.mr import LimitingResourceAdaptor, ManagedMemoryResource, set_current_device_resource

MiB = 1 << 20

pytestmark = pytest.mark.skipif(not allocator.SHIM.is_file(),
                                reason=f"{allocator.SHIM.name} was not built here (it needs a C++ compiler)")


@pytest.fixture
def shim(sim_backend):
    """The library torch would load, with its functions typed as torch calls them."""
    library = ctypes.CDLL(str(allocator.SHIM))
    for name in (allocator.MALLOC, allocator.POOL_MALLOC):
        getattr(library, name).restype = ctypes.c_void_p
        getattr(library, name).argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    getattr(library, allocator.FREE).argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    allocator.shim()   # as making an allocator does: the callbacks set
    yield library
    assert allocator.allocations() == [], "a test left memory with torch's allocator"


def _free(library, ptr, size):
    getattr(library, allocator.FREE)(ptr, size, 0, None)
    deferred.run()   # the memory goes back on uvm_lab's own time: now, for the test


def test_an_allocation_torch_asks_for_is_a_labelled_buffer_charged_to_the_callers_line(shim):
    before = allocator.memory_stats()
    with ul.record() as trace:
        ptr = getattr(shim, allocator.MALLOC)(3 * MiB, 0, None); line = sys._getframe().f_lineno  # noqa: E702
        buffer = allocator.buffer_at(ptr + MiB)
        assert buffer is not None and buffer.ptr == ptr and buffer.size == 3 * MiB
        assert buffer.label == "torch" and buffer.is_managed and buffer in ul.live_buffers()
        assert ul.residency(buffer).summary()["nowhere"] == 1.0     # nothing touched yet, as after cudaMallocManaged
        now = allocator.memory_stats()
        assert now["allocation.all.current"] == before["allocation.all.current"] + 1
        assert now["allocated_bytes.all.current"] == before["allocated_bytes.all.current"] + 3 * MiB
        assert now["reserved_bytes.all.current"] == before["reserved_bytes.all.current"] + 3 * MiB
        _free(shim, ptr, 3 * MiB)
    assert buffer.closed and allocator.buffer_at(ptr) is None
    after = allocator.memory_stats()
    assert after["allocated_bytes.all.current"] == before["allocated_bytes.all.current"]
    assert after["allocated_bytes.all.freed"] == before["allocated_bytes.all.freed"] + 3 * MiB
    allocs = trace.to_pandas().query("kind == 'alloc'")
    assert list(allocs["bytes"]) == [3 * MiB]
    assert allocs["source"].iloc[0].endswith(f"test_torch_allocator.py:{line}")


def test_a_pool_asks_for_segments_which_torch_carves_itself(shim):
    before = allocator.memory_stats()
    ptr = getattr(shim, allocator.POOL_MALLOC)(2 * MiB, 0, None)
    assert allocator.buffer_at(ptr).label == "torch segment"
    now = allocator.memory_stats()
    assert now["segment.all.current"] == before["segment.all.current"] + 1
    assert now["reserved_bytes.all.current"] == before["reserved_bytes.all.current"] + 2 * MiB
    # torch counts the tensors it carves from a segment itself: they are not uvm_lab's allocations
    assert now["allocation.all.current"] == before["allocation.all.current"]
    _free(shim, ptr, 2 * MiB)
    assert allocator.memory_stats()["segment.all.current"] == before["segment.all.current"]


def test_buffer_at_finds_the_allocation_an_address_falls_in_and_nothing_between(shim):
    a = getattr(shim, allocator.MALLOC)(MiB, 0, None)
    b = getattr(shim, allocator.MALLOC)(MiB, 0, None)
    assert allocator.buffer_at(a).ptr == a and allocator.buffer_at(b + MiB - 1).ptr == b
    assert allocator.buffer_at(max(a, b) + MiB) is None and allocator.buffer_at(0) is None
    assert [buf.ptr for buf in allocator.allocations()] == sorted([a, b])
    _free(shim, a, MiB)
    _free(shim, b, MiB)


def test_a_failed_allocation_gives_torch_a_null_pointer_and_changes_nothing(shim):
    set_current_device_resource(LimitingResourceAdaptor(ManagedMemoryResource(), allocation_limit=4 * MiB))
    before = allocator.memory_stats()
    with ul.record() as trace:
        assert getattr(shim, allocator.POOL_MALLOC)(8 * MiB, 0, None) is None   # torch: out of memory
    assert allocator.memory_stats() == before and allocator.allocations() == []
    assert list(trace.to_pandas()["kind"]) == ["alloc_failure"]
    assert getattr(shim, allocator.MALLOC)(0, 0, None) is None   # nothing asked, nothing thrown
    ptr = getattr(shim, allocator.MALLOC)(2 * MiB, 0, None)      # the allocator goes on
    _free(shim, ptr, 2 * MiB)


def test_freeing_an_address_it_did_not_give_warns_and_changes_nothing(shim):
    ptr = getattr(shim, allocator.MALLOC)(MiB, 0, None)
    before = allocator.memory_stats()
    with pytest.warns(RuntimeWarning, match="did not give it"):
        getattr(shim, allocator.FREE)(ptr + 64, MiB, 0, None)
    getattr(shim, allocator.FREE)(None, 0, 0, None)   # torch's free of a zero-byte tensor: nothing to do
    assert allocator.memory_stats() == before and allocator.buffer_at(ptr).ptr == ptr
    _free(shim, ptr, MiB)


def test_making_an_allocator_for_torch_on_the_simulator_says_it_needs_a_gpu(sim_backend):
    pytest.importorskip("torch")
    with pytest.raises(BackendError, match="needs a real GPU"):
        allocator.torch_allocator()
    with pytest.raises(BackendError, match="needs a real GPU"):
        allocator.mem_pool()


def test_without_torch_the_allocator_says_how_to_install_it(sim_backend, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(BackendError, match="PyTorch is not installed"):
        allocator.torch_allocator()
    with pytest.raises(BackendError, match="PyTorch is not installed"):
        allocator.uvm_lab_torch_allocator  # noqa: B018 - RMM's attribute, made when asked for


@pytest.mark.parametrize("bad", [-1, "0x10", 1.5, True, None])
def test_buffer_at_rejects_what_is_not_an_address(sim_backend, bad):
    with pytest.raises(InvalidArgumentError, match="address must be a non-negative int"):
        allocator.buffer_at(bad)


def test_mem_pool_rejects_a_flag_that_is_not_a_bool(sim_backend):
    with pytest.raises(InvalidArgumentError, match="use_on_oom must be True or False"):
        allocator.mem_pool(use_on_oom=1)
