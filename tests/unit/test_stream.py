"""``stream=`` takes uvm_lab's streams, raw handles and other libraries' streams, everywhere."""

from __future__ import annotations

import pytest

import uvm_lab as ul
from uvm_lab.errors import InvalidArgumentError
from uvm_lab.events.schema import EventKind
from uvm_lab.stream import as_stream_handle


class ProtocolStream:
    """What cuda.core's and CuPy's streams offer: the CUDA stream protocol."""

    def __init__(self, handle: int, version: int = 0) -> None:
        self.handle, self.version = handle, version

    def __cuda_stream__(self) -> tuple[int, int]:
        return (self.version, self.handle)


def test_none_and_the_default_stream_are_handle_zero():
    assert as_stream_handle(None) == 0
    assert as_stream_handle(ul.DEFAULT_STREAM) == 0
    assert ul.DEFAULT_STREAM.is_default


def test_a_new_stream_has_its_own_handle_and_allocations_carry_it():
    with ul.Stream() as a, ul.Stream() as b:
        assert a.owns and b.owns
        assert a.handle != b.handle and 0 not in (a.handle, b.handle)
        mr = ul.mr.PoolMemoryResource(ul.mr.ManagedMemoryResource(), initial_pool_size="1MiB")
        with ul.record() as trace:
            ptr = mr.allocate(4096, a)
            mr.deallocate(ptr, 4096, stream=b)
        assert trace.of_kind(EventKind.ALLOC)["stream"].tolist() == [a.handle]
        assert trace.of_kind(EventKind.FREE)["stream"].tolist() == [b.handle]


def test_a_buffer_keeps_its_stream_and_orders_its_work_on_it():
    with ul.Stream() as s:
        with ul.record() as trace:
            buf = ul.DeviceBuffer(size="1MiB", stream=s)
            buf.prefetch("gpu", stream=s)
        assert buf.stream is s
        assert trace.of_kind(EventKind.ALLOC)["stream"].tolist() == [s.handle]
        assert trace.of_kind(EventKind.PREFETCH)["stream"].tolist() == [s.handle]
        buf.close()


def test_a_foreign_stream_is_taken_through_the_cuda_stream_protocol():
    foreign = ProtocolStream(0x1234)
    assert as_stream_handle(foreign) == 0x1234
    view = ul.Stream(foreign)
    assert view.handle == 0x1234 and not view.owns
    view.close()                        # a view owns nothing: closing it leaves the handle usable
    assert as_stream_handle(view) == 0x1234
    buf = ul.DeviceBuffer(size=4096, stream=foreign)
    assert buf.stream.handle == 0x1234
    buf.close()


@pytest.mark.parametrize("bad", [-1, "0", 1.5, True, object(), ProtocolStream(5, version=1), ProtocolStream(-3)])
def test_anything_else_is_refused_by_name(bad):
    with pytest.raises(InvalidArgumentError, match="stream must be") as err:
        as_stream_handle(bad)
    assert err.value.value is bad


def test_a_bad_stream_leaves_the_resource_and_the_buffers_as_they_were():
    mr = ul.mr.ManagedMemoryResource()
    before = len(ul.live_buffers())
    with pytest.raises(InvalidArgumentError, match="stream"):
        mr.allocate(4096, stream="default")
    with pytest.raises(InvalidArgumentError, match="stream"):
        ul.DeviceBuffer(size=4096, mr=mr, stream=-5)
    assert mr.get_allocated_bytes() == 0
    assert len(ul.live_buffers()) == before


def test_a_closed_stream_is_refused():
    s = ul.Stream()
    s.close()
    assert repr(s) == "Stream(closed)"
    with pytest.raises(InvalidArgumentError, match="closed"):
        ul.mr.ManagedMemoryResource().allocate(4096, s)
    with pytest.raises(ul.errors.InvalidStateError, match="closed"):
        s.synchronize()


def test_streams_compare_by_handle():
    assert ul.Stream(7) == ul.Stream(ProtocolStream(7))
    assert len({ul.Stream(7), ul.Stream(7), ul.Stream(8)}) == 2
