"""DeviceBuffer: allocation, prefetch, advice read back from the backend, and errors that change nothing."""

from __future__ import annotations

import gc
import pickle

import pytest

import uvm_lab as ul
from uvm_lab.errors import (
    BufferClosedError,
    DoubleFreeError,
    InvalidAdviceError,
    InvalidArgumentError,
    InvalidLocationError,
    InvalidSizeError,
)
from uvm_lab.events import EventKind

from .waiting import eventually

MiB = 1 << 20


def test_sizes_as_strings_and_ints():
    assert ul.DeviceBuffer(size="512MiB").size == 512 * MiB
    assert ul.DeviceBuffer(size=4096).nbytes == 4096
    empty = ul.DeviceBuffer(size=0)
    assert empty.ptr == 0 and empty.size == 0 and ul.residency(empty).summary()["nowhere"] == 0


@pytest.mark.parametrize("bad", [-1, "12 parsecs", "1.5B", 3.5, None, [1], True])
def test_bad_sizes_are_refused_and_allocate_nothing(bad):
    with ul.record() as trace, pytest.raises(InvalidSizeError) as info:
        ul.DeviceBuffer(size=bad)
    assert repr(bad) in str(info.value) and info.value.value == bad
    assert not {EventKind.ALLOC, EventKind.SEGMENT_ALLOC} & set(trace.events["kind"].tolist())


def test_advice_is_read_back_from_the_backend():
    buf = ul.DeviceBuffer(size=4 * MiB)
    assert (buf.read_mostly, buf.preferred_location, buf.accessed_by) == (False, None, ())
    buf.read_mostly = True
    buf.preferred_location = "host"
    buf.accessed_by = ["gpu", "host"]
    backend = ul.get_backend().range_advice(buf.ptr, buf.size)
    assert backend.read_mostly and str(backend.preferred_location) == "host"
    assert (buf.read_mostly, buf.preferred_location, set(buf.accessed_by)) == (True, "host", {"gpu:0", "host"})
    buf.accessed_by = "gpu"
    assert buf.accessed_by == ("gpu:0",)
    buf.read_mostly = False
    buf.preferred_location = None
    buf.accessed_by = None
    assert (buf.read_mostly, buf.preferred_location, buf.accessed_by) == (False, None, ())


def test_advise_by_name():
    buf = ul.DeviceBuffer(size=MiB)
    buf.advise("read_mostly")
    buf.advise("preferred_location", "gpu")
    assert buf.read_mostly and buf.preferred_location == "gpu:0"
    buf.advise("unset_preferred_location")
    assert buf.preferred_location is None


@pytest.mark.parametrize(("setter", "value", "error"), [
    ("read_mostly", "yes", InvalidAdviceError),
    ("read_mostly", 1, InvalidAdviceError),
    ("preferred_location", "tpu", InvalidLocationError),
    ("preferred_location", 3, InvalidLocationError),
    ("accessed_by", ["gpu", "gpu:7"], InvalidLocationError),
    ("accessed_by", 2.5, InvalidAdviceError),
])
def test_bad_advice_is_refused_and_leaves_advice_unchanged(setter, value, error):
    buf = ul.DeviceBuffer(size=MiB)
    buf.read_mostly = True
    buf.preferred_location = "gpu"
    buf.accessed_by = "host"
    with ul.record() as trace, pytest.raises(error) as info:
        setattr(buf, setter, value)
    assert repr(value if not isinstance(value, list) else "gpu:7") in str(info.value)
    assert len(trace) == 0                                        # nothing reached the backend
    assert (buf.read_mostly, buf.preferred_location, buf.accessed_by) == (True, "gpu:0", ("host",))


def test_unknown_advice_name():
    buf = ul.DeviceBuffer(size=MiB)
    with pytest.raises(InvalidAdviceError, match="read_mostly") as info:
        buf.advise("read_sometimes")
    assert info.value.value == "read_sometimes"
    with pytest.raises(InvalidAdviceError, match="needs a location"):
        buf.advise("preferred_location")


@pytest.mark.parametrize("bad", ["tpu", "gpu:1", 5, -3, 1.0, [0]])
def test_prefetch_to_a_bad_location_moves_nothing(bad):
    buf = ul.DeviceBuffer(size=MiB)
    buf.prefetch("host")
    with ul.record() as trace, pytest.raises(InvalidLocationError):
        buf.prefetch(bad)
    assert len(trace) == 0 and ul.residency(buf).summary()["host"] == 1.0


def test_freed_buffer_cannot_be_prefetched_advised_or_touched():
    buf = ul.DeviceBuffer(size=MiB)
    buf.close()
    buf.close()                                                    # closing twice is harmless
    assert buf.closed and buf not in ul.live_buffers()
    for action in (lambda: buf.prefetch("gpu"), lambda: setattr(buf, "read_mostly", True),
                   lambda: buf.preferred_location, lambda: ul.touch(buf), lambda: ul.residency(buf)):
        with pytest.raises(BufferClosedError, match=r"freed|closed"):
            action()


def test_double_free_through_the_resource_is_named():
    mr = ul.mr.ManagedMemoryResource()
    ptr = mr.allocate(MiB)
    mr.deallocate(ptr, MiB)
    with pytest.raises(DoubleFreeError, match="already freed") as info:
        mr.deallocate(ptr, MiB)
    assert info.value.ptr == ptr


def test_deallocate_with_the_wrong_size_is_refused_and_keeps_the_allocation():
    mr = ul.mr.ManagedMemoryResource()
    ptr = mr.allocate(MiB)
    with pytest.raises(InvalidArgumentError, match="1048576"):
        mr.deallocate(ptr, 4096)
    assert mr.get_allocated_bytes() == MiB
    mr.deallocate(ptr, MiB)


def test_garbage_collected_buffers_give_their_memory_back():
    mr = ul.mr.ManagedMemoryResource()
    buf = ul.DeviceBuffer(size=MiB, mr=mr)
    buf_id = buf.id
    del buf
    gc.collect()
    assert eventually(lambda: mr.get_allocated_bytes() == 0)   # soon, on a thread that holds no lock
    with pytest.raises(InvalidArgumentError, match=str(buf_id)):
        ul.find_buffer(buf_id)


def test_context_manager_and_registry():
    with ul.DeviceBuffer(size=MiB, label="weights") as buf:
        assert ul.find_buffer(buf.id) is buf and buf in ul.live_buffers()
        assert "weights" in repr(buf)
    assert buf.closed
    with pytest.raises(InvalidArgumentError):
        ul.find_buffer("1")


def test_bad_resource_or_label():
    with pytest.raises(InvalidArgumentError, match="memory resource"):
        ul.DeviceBuffer(size=1, mr="managed")
    with pytest.raises(InvalidArgumentError, match="label"):
        ul.DeviceBuffer(size=1, label=7)


def test_errors_pickle_with_their_data():
    err = ul.errors.OutOfMemoryError("no room", size=10, free=5, limit=8)
    back = pickle.loads(pickle.dumps(err))
    assert (type(back), str(back), back.size, back.free, back.limit) == (type(err), "no room", 10, 5, 8)
    assert isinstance(back, MemoryError) and isinstance(back, ul.errors.UvmLabError)
    bad = ul.errors.InvalidSizeError("bad", value="x", expected="y")
    assert pickle.loads(pickle.dumps(bad)).value == "x"


def test_a_buffer_collected_while_its_resource_is_busy_does_not_block_the_collector():
    import threading

    mr = ul.mr.ManagedMemoryResource()
    holder = [ul.DeviceBuffer(size=MiB, mr=mr)]
    done = threading.Event()

    def drop_last_reference() -> None:   # its finalizer runs on this thread
        holder.clear()
        done.set()

    with mr._lock:                       # as if another thread were inside the resource
        worker = threading.Thread(target=drop_last_reference)
        worker.start()
        assert done.wait(2), "the finalizer blocked on the resource's lock"
        assert mr.get_allocated_bytes() == MiB
    worker.join()
    assert eventually(lambda: mr.get_allocated_bytes() == 0)


def test_a_range_of_pages_reads_as_those_pages_of_the_whole_map():
    buf = ul.DeviceBuffer(size=10 * 4096 + 100, label="ranged")   # 11 pages, the last one short
    buf.prefetch("gpu", offset=2 * 4096, size=3 * 4096)
    whole = ul.residency(buf)
    part = ul.residency(buf, first_page=1, pages=5)
    assert part.address == buf.ptr + 4096 and part.size == 5 * 4096
    assert part.states.tolist() == whole.states[1:6].tolist()
    tail = ul.residency(buf, first_page=10)
    assert tail.size == 100 and tail.states.tolist() == whole.states[10:].tolist()


@pytest.mark.parametrize("first_page, pages, match", [
    (11, None, "is not a page of"), (-1, 2, "is not a page of"), (1.5, 2, "is not a page of"),
    (True, 1, "is not a page of"), (0, 0, "whole number >= 1"), (9, 3, "run past the last page"),
])
def test_a_bad_range_of_pages_is_refused(first_page, pages, match):
    buf = ul.DeviceBuffer(size=11 * 4096, label="ranged")
    with pytest.raises(ul.errors.InvalidArgumentError, match=match):
        ul.residency(buf, first_page=first_page, pages=pages)


def test_a_freed_buffers_label_is_kept_for_views_of_what_happened(monkeypatch):
    from uvm_lab import buffer as buffer_module

    a = ul.DeviceBuffer(size=4096, label="kept")
    a_id = a.id
    a.close()
    assert buffer_module.label_of(a_id) == "kept"
    b = ul.DeviceBuffer(size=4096, label="made as")
    b.label = "renamed"
    assert buffer_module.label_of(b.id) == "renamed"   # a live buffer's own label
    assert buffer_module.label_of(10**12) is None
    with pytest.raises(ul.errors.InvalidArgumentError, match="buffer id must be an int"):
        buffer_module.label_of("kept")
    # Bounded: past LABELS_KEPT the oldest go, counted.
    monkeypatch.setattr(buffer_module, "LABELS_KEPT", 2)
    dropped = buffer_module.labels_dropped()
    for i in range(3):
        ul.DeviceBuffer(size=4096, label=f"many-{i}").close()
    assert buffer_module.label_of(a_id) is None and buffer_module.labels_dropped() > dropped


def test_all_advice_reads_back_in_one_query_as_the_properties_do():
    buf = ul.DeviceBuffer(size="1MiB", label="advised")
    assert buf.advice == {"read_mostly": False, "preferred_location": None, "accessed_by": ()}
    buf.read_mostly = True
    buf.preferred_location = "host"
    buf.accessed_by = ["gpu"]
    assert buf.advice == {"read_mostly": buf.read_mostly, "preferred_location": buf.preferred_location,
                          "accessed_by": buf.accessed_by} == {"read_mostly": True, "preferred_location": "host",
                                                              "accessed_by": ("gpu:0",)}
    buf.close()
    with pytest.raises(ul.errors.BufferClosedError):
        _ = buf.advice


def test_lending_a_buffer_on_the_simulator_changes_nothing_but_checks_its_device(sim_backend):
    buf = ul.DeviceBuffer(size="1MiB")
    buf.prefetch("gpu")
    before = ul.residency(buf).summary()
    with ul.record() as trace:
        buf.lend()            # no other library runs kernels over simulated memory: the map stays exact
        buf.lend("gpu:0")
    assert ul.residency(buf).summary() == before == {**before, "gpu": 1.0}
    assert trace.summary()["events"] == 0
    for bad in ("host", 3, "gpu:7"):
        with pytest.raises(InvalidLocationError):
            buf.lend(bad)
    buf.close()
    with pytest.raises(BufferClosedError):
        buf.lend()
