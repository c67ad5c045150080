"""DeviceBuffer under RMM's names: ``ptr=``, ``to_device``, ``copy``, ``tobytes``, ``copy_from_device``, ``resize`` and
``prefetch(device=)``, on the simulator. RMM's docstring examples run as they are written."""

from __future__ import annotations

import numpy as np
import pytest

import uvm_lab as ul
from uvm_lab.errors import (
    BufferClosedError,
    InvalidArgumentError,
    InvalidLocationError,
    InvalidSizeError,
    OutOfMemoryError,
)

MiB = 1 << 20


class DeviceArray:
    """An object that shares memory through the CUDA Array Interface, as a CuPy or Numba array does."""

    def __init__(self, ptr: int, shape: tuple, typestr: str = "|u1", strides: tuple | None = None) -> None:
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (ptr, False),
                                         "strides": strides, "version": 3}


def kinds(trace) -> list[str]:
    return trace.to_pandas().kind.tolist()


# -- RMM's docstring examples ----------------------------------------------------------------------------

def test_rmms_examples():
    db = ul.DeviceBuffer.to_device(b"abc")
    db_copy = db.copy()
    assert db.copy_to_host().tolist() == [97, 98, 99] and db_copy.copy_to_host().tolist() == [97, 98, 99]
    assert db is not db_copy and db.ptr != db_copy.ptr
    hb = bytearray(db.nbytes)
    db.copy_to_host(hb)
    assert hb == bytearray(b"abc")
    assert bytes(db) == b"abc" and db.tobytes() == b"abc"
    db = ul.DeviceBuffer(size=10)
    db.copy_from_host(b"abcdef")
    assert db.copy_to_host()[:6].tolist() == [97, 98, 99, 100, 101, 102]
    db = ul.DeviceBuffer(size=5)
    db2 = ul.DeviceBuffer.to_device(b"abc")
    db.copy_from_device(db2)
    assert db.copy_to_host()[:3].tolist() == [97, 98, 99]


# -- ptr= ----------------------------------------------------------------------------------------------------

def test_ptr_copies_host_memory_into_the_new_buffer():
    host = np.arange(1000, dtype=np.int32)
    buf = ul.DeviceBuffer(ptr=host.ctypes.data, size=host.nbytes)
    np.testing.assert_array_equal(buf.copy_to_host().view(np.int32), host)


def test_ptr_copies_device_memory_into_the_new_buffer_on_its_resource():
    src = ul.DeviceBuffer.to_device(bytes(range(256)) * 16)
    mr = ul.mr.StatisticsResourceAdaptor(ul.mr.CudaMemoryResource())
    with ul.record() as trace:
        dst = ul.DeviceBuffer(ptr=src.ptr + 16, size=1024, mr=mr)
    assert dst.tobytes() == (bytes(range(256)) * 16)[16:1040]
    assert dst.mr is mr and mr.allocation_counts.current_bytes == 1024
    assert kinds(trace).count("alloc") == 1


def test_ptr_zero_only_allocates():
    buf = ul.DeviceBuffer(ptr=0, size=64)
    assert buf.size == 64 and buf.ptr != 0


@pytest.mark.parametrize("bad", [-1, 1.5, "0x7f00", True, 2**64, None])
def test_a_ptr_that_is_no_address_is_refused_before_anything_is_allocated(bad):
    with ul.record() as trace, pytest.raises(InvalidArgumentError, match="ptr must be an address") as info:
        ul.DeviceBuffer(ptr=bad, size=64)
    assert info.value.value == bad and len(trace) == 0


def test_a_ptr_to_nothing_readable_fails_and_leaves_nothing_allocated():
    gone = ul.DeviceBuffer(size=4096)
    stale = gone.ptr
    gone.close()
    mr = ul.mr.ManagedMemoryResource()
    before = len(ul.live_buffers())
    with pytest.raises(InvalidArgumentError, match="not inside a live simulated allocation"):
        ul.DeviceBuffer(ptr=stale, size=4096, mr=mr)
    assert mr.get_allocated_bytes() == 0 and len(ul.live_buffers()) == before


# -- to_device, copy, tobytes ----------------------------------------------------------------------------------

def test_to_device_takes_any_host_buffer_and_the_current_resource():
    stats = ul.mr.StatisticsResourceAdaptor(ul.mr.ManagedMemoryResource())
    ul.mr.set_current_device_resource(stats)
    buf = ul.DeviceBuffer.to_device(np.array([1.5, 2.5]))
    assert buf.mr is stats and np.frombuffer(buf.tobytes(), dtype=np.float64).tolist() == [1.5, 2.5]
    assert ul.DeviceBuffer.to_device(memoryview(b"xy")).tobytes() == b"xy"
    assert ul.DeviceBuffer.to_device(b"").size == 0


def test_to_device_of_something_that_is_no_buffer_allocates_nothing():
    with ul.record() as trace, pytest.raises(InvalidArgumentError, match="bytes, a buffer or a NumPy array"):
        ul.DeviceBuffer.to_device("text")
    assert len(trace) == 0


def test_copy_keeps_the_resource_and_stream_and_is_independent():
    stream = ul.Stream()
    mr = ul.mr.ManagedMemoryResource()
    buf = ul.DeviceBuffer(size=8, mr=mr, stream=stream)
    buf.copy_from_host(b"12345678")
    twin = buf.copy()
    assert twin.mr is mr and twin.stream is stream and twin.id != buf.id
    buf.copy_from_host(b"x")
    assert twin.tobytes() == b"12345678" and buf.tobytes() == b"x2345678"
    buf.close()
    with pytest.raises(BufferClosedError):
        buf.copy()
    with pytest.raises(BufferClosedError):
        buf.tobytes()


# -- copy_from_device --------------------------------------------------------------------------------------------

def test_copy_from_device_reads_a_cuda_array_interface():
    src = ul.DeviceBuffer.to_device(np.arange(8, dtype=np.float32))
    dst = ul.DeviceBuffer(size=64)
    dst.copy_from_device(DeviceArray(src.ptr, (8,), "<f4"))
    assert dst.copy_to_host()[:32].view(np.float32).tolist() == list(range(8))
    dst.copy_from_device(DeviceArray(src.ptr, (2,), "<f4", strides=(4,)))   # contiguous strides are fine
    dst.copy_from_device(DeviceArray(0, (0,)))                               # nothing to copy


@pytest.mark.parametrize(("source", "match"), [
    (object(), "__cuda_array_interface__"),
    (b"abc", "__cuda_array_interface__"),
    ("2-D", "1-D contiguous"),
    ("strided", "contiguous"),
    ("too big", "holds 128 bytes"),
    ("host", "not inside a live simulated allocation"),
    ("malformed", "malformed"),
])
def test_copy_from_device_refuses_what_it_cannot_copy_and_changes_nothing(source, match):
    src = ul.DeviceBuffer.to_device(bytes(128))
    host = np.zeros(16, dtype=np.uint8)
    made = {"2-D": DeviceArray(src.ptr, (4, 4)), "strided": DeviceArray(src.ptr, (4,), "<f4", strides=(8,)),
            "too big": DeviceArray(src.ptr, (128,)), "host": DeviceArray(host.ctypes.data, (16,)),
            "malformed": DeviceArray(src.ptr, (4,), typestr="not a type")}
    dst = ul.DeviceBuffer.to_device(b"\x07" * 64)
    with pytest.raises(InvalidArgumentError, match=match):
        dst.copy_from_device(made.get(source, source))
    assert dst.tobytes() == b"\x07" * 64


def test_copy_from_device_of_a_closed_or_foreign_buffer():
    dst = ul.DeviceBuffer(size=64)
    src = ul.DeviceBuffer.to_device(b"abc")
    src.close()
    with pytest.raises(BufferClosedError):
        dst.copy_from_device(src)
    foreign = ul.DeviceBuffer.to_device(b"abc")
    ul.use_backend("sim", device_memory="1GiB")
    mine = ul.DeviceBuffer(size=64)
    with pytest.raises(InvalidArgumentError, match="another backend"):
        mine.copy_from_device(foreign)


# -- resize --------------------------------------------------------------------------------------------------

def test_resize_grows_and_shrinks_keeping_the_bytes_that_fit():
    buf = ul.DeviceBuffer.to_device(b"abcdef")
    buf.resize(4096)
    assert buf.size == 4096 and buf.tobytes()[:6] == b"abcdef"
    buf.resize(3)
    assert buf.size == buf.nbytes == 3 and buf.tobytes() == b"abc"
    buf.resize(0)
    assert buf.size == 0 and buf.tobytes() == b""
    buf.resize("1KiB")
    assert buf.size == 1024


def test_a_resize_is_a_new_allocation_then_a_free_and_the_buffer_follows_it():
    stats = ul.mr.StatisticsResourceAdaptor(ul.mr.ManagedMemoryResource())
    buf = ul.DeviceBuffer(size=MiB, mr=stats, label="weights")
    old_id, old_ptr = buf.id, buf.ptr
    with ul.record() as trace:
        buf.resize(2 * MiB)
    events = trace.to_pandas()
    alloc, free = events[events.kind == "alloc"], events[events.kind == "free"]
    assert alloc.bytes.tolist() == [2 * MiB] and free.bytes.tolist() == [MiB]
    assert alloc.index[0] < free.index[0]                         # allocated and filled before the old is freed
    assert buf.id != old_id and buf.ptr != old_ptr and buf.label == "weights"
    assert ul.find_buffer(buf.id) is buf and [b.id for b in ul.live_buffers()].count(old_id) == 0
    with pytest.raises(InvalidArgumentError):
        ul.find_buffer(old_id)
    assert stats.allocation_counts == {"current_bytes": 2 * MiB, "current_count": 1, "peak_bytes": 3 * MiB,
                                       "peak_count": 2, "total_bytes": 3 * MiB, "total_count": 2}
    buf.prefetch("gpu")
    assert ul.residency(buf).summary()["gpu"] == 1.0 and ul.residency(buf).size == 2 * MiB
    buf.close()
    assert stats.get_allocated_bytes() == 0


def test_resize_to_the_same_size_changes_nothing():
    buf = ul.DeviceBuffer(size=4096)
    before = (buf.id, buf.ptr)
    with ul.record() as trace:
        buf.resize(4096)
    assert len(trace) == 0 and (buf.id, buf.ptr) == before


def test_resize_takes_the_stream_it_is_given():
    buf = ul.DeviceBuffer(size=4096)
    stream = ul.Stream()
    buf.resize(8192, stream=stream)
    assert buf.stream is stream


def test_a_resize_that_does_not_fit_leaves_the_buffer_as_it_was():
    mr = ul.mr.LimitingResourceAdaptor(ul.mr.ManagedMemoryResource(), allocation_limit="1MiB")
    buf = ul.DeviceBuffer(size=MiB // 2, mr=mr)
    buf.copy_from_host(b"keep")
    before = (buf.id, buf.ptr, buf.size)
    with pytest.raises(OutOfMemoryError):
        buf.resize(MiB)
    assert (buf.id, buf.ptr, buf.size) == before and buf.tobytes()[:4] == b"keep"
    assert ul.find_buffer(buf.id) is buf and mr.get_allocated_bytes() == MiB // 2


@pytest.mark.parametrize("bad", [-1, "12 parsecs", 1.5, None])
def test_a_bad_size_to_resize_is_refused(bad):
    buf = ul.DeviceBuffer(size=4096)
    with ul.record() as trace, pytest.raises(InvalidSizeError, match="new_size"):
        buf.resize(bad)
    assert len(trace) == 0 and buf.size == 4096


def test_a_closed_buffer_cannot_be_resized():
    buf = ul.DeviceBuffer(size=4096)
    buf.close()
    with pytest.raises(BufferClosedError):
        buf.resize(8192)


# -- prefetch(device=) -----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("call", "where"), [
    (lambda b: b.prefetch(), "gpu"),
    (lambda b: b.prefetch(None), "gpu"),
    (lambda b: b.prefetch(device=None), "gpu"),
    (lambda b: b.prefetch(device=0), "gpu"),
    (lambda b: b.prefetch(device=-1), "host"),            # cudaCpuDeviceId
    (lambda b: b.prefetch(device="host"), "host"),
    (lambda b: b.prefetch("host", None), "host"),
    (lambda b: b.prefetch(location="host", device=None), "host"),
])
def test_prefetch_takes_rmms_device_or_uvm_labs_location(call, where):
    buf = ul.DeviceBuffer(size=MiB)
    buf.prefetch("host" if where == "gpu" else "gpu")
    call(buf)
    assert ul.residency(buf).summary()[where] == 1.0


def test_prefetch_with_both_location_and_device_is_refused_and_moves_nothing():
    buf = ul.DeviceBuffer(size=MiB)
    buf.prefetch("host")
    with ul.record() as trace, pytest.raises(InvalidArgumentError, match="not both"):
        buf.prefetch("gpu", device=0)
    with pytest.raises(InvalidLocationError, match="device"):
        buf.prefetch(device=3)
    assert len(trace) == 0 and ul.residency(buf).summary()["host"] == 1.0


def test_prefetch_runs_on_the_buffers_stream_unless_given_one():
    stream, other = ul.Stream(), ul.Stream()
    buf = ul.DeviceBuffer(size=MiB, stream=stream)
    with ul.record() as trace:
        buf.prefetch()
        buf.prefetch("host", other)
    prefetches = trace.to_pandas().query("kind == 'prefetch'")
    assert prefetches.stream.tolist() == [stream.handle, other.handle]


def test_copies_take_rmms_stream_argument():
    stream = ul.Stream()
    buf = ul.DeviceBuffer(size=4)
    with ul.record() as trace:
        buf.copy_from_host(b"abcd", stream)
        assert buf.copy_to_host(None, stream).tobytes() == b"abcd"
        assert buf.tobytes(stream) == b"abcd"
    assert set(trace.to_pandas().stream) == {stream.handle}
    with pytest.raises(InvalidArgumentError, match="stream"):
        buf.tobytes(stream=-2)
