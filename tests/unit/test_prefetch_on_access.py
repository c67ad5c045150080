"""``PrefetchResourceAdaptor(on="access")`` prefetches when a buffer is used on a GPU, on that use's stream."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import uvm_lab as ul
from uvm_lab import dlpack
from uvm_lab.errors import InvalidArgumentError
from uvm_lab.events.schema import EventKind

MiB = 1 << 20


@pytest.fixture
def on_access():
    return ul.mr.PrefetchResourceAdaptor(ul.mr.ManagedMemoryResource(), on="access")


def test_nothing_moves_at_allocation(on_access):
    with ul.record() as trace:
        buf = ul.DeviceBuffer(size=4 * MiB, mr=on_access)
    assert len(trace.of_kind(EventKind.PREFETCH)) == 0
    assert ul.residency(buf).summary()["nowhere"] == 1.0


def test_a_gpu_access_prefetches_first_on_the_access_stream(on_access):
    buf = ul.DeviceBuffer(size=4 * MiB, mr=on_access)
    ul.touch(buf, "host", "write")
    with ul.Stream() as s, ul.record() as trace:
        result = ul.touch(buf, "gpu", stream=s)
        handle = s.handle
    prefetches = trace.of_kind(EventKind.PREFETCH)
    assert prefetches["stream"].tolist() == [handle]
    assert prefetches["bytes"].tolist() == [4 * MiB]
    assert result.faults == 0                       # the data was already there when the kernel ran
    assert ul.residency(buf).summary()["gpu"] == 1.0
    # A host access is no GPU access: nothing is prefetched for it.
    with ul.record() as trace:
        ul.touch(buf, "host")
    assert len(trace.of_kind(EventKind.PREFETCH)) == 0


def test_small_buffers_are_left_to_fault(on_access):
    mr = ul.mr.PrefetchResourceAdaptor(ul.mr.ManagedMemoryResource(), min_size="1MiB", on="access")
    small = ul.DeviceBuffer(size=64 * 1024, mr=mr)
    with ul.record() as trace:
        result = ul.touch(small, "gpu")
    assert len(trace.of_kind(EventKind.PREFETCH)) == 0
    assert result.faults > 0


def test_the_default_still_prefetches_at_allocation():
    mr = ul.mr.PrefetchResourceAdaptor(ul.mr.ManagedMemoryResource())
    assert mr.on == "allocate"
    buf = ul.DeviceBuffer(size=4 * MiB, mr=mr)
    assert ul.residency(buf).summary()["gpu"] == 1.0


@pytest.mark.parametrize("bad", ["first_touch", None, 1])
def test_on_is_checked(bad):
    with pytest.raises(InvalidArgumentError, match="on must be") as err:
        ul.mr.PrefetchResourceAdaptor(ul.mr.ManagedMemoryResource(), on=bad)
    assert err.value.value == bad


def test_a_bad_stream_for_touch_changes_nothing(on_access):
    buf = ul.DeviceBuffer(size=MiB, mr=on_access)
    with ul.record() as trace, pytest.raises(InvalidArgumentError, match="stream"):
        ul.touch(buf, "gpu", stream="fast")
    assert len(trace) == 0
    assert ul.residency(buf).summary()["nowhere"] == 1.0


def test_simulated_buffers_are_not_exported():
    buf = ul.DeviceBuffer(size=MiB)
    with pytest.raises(BufferError, match="simulated"):
        buf.__dlpack__()
    with pytest.raises(BufferError, match="simulated"):
        buf.__dlpack_device__()


class HostBytes:
    """A producer of host memory through uvm_lab's DLPack export, so NumPy can consume it here."""

    def __init__(self, data: np.ndarray) -> None:
        self.data = data

    def __dlpack__(self, **kwargs: object) -> object:
        return dlpack.to_capsule(self, self.data.ctypes.data, self.data.nbytes, 1, 0)   # kDLCPU

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)


def test_an_export_is_zero_copy_and_released_by_its_consumer():
    before = dlpack.live_exports()
    data = np.arange(256, dtype=np.uint8)
    view = np.from_dlpack(HostBytes(data))
    assert view.tolist() == data.tolist()
    data[3] = 200
    assert view[3] == 200                           # the same memory, not a copy
    assert dlpack.live_exports() == before + 1
    del view
    gc.collect()
    assert dlpack.live_exports() == before


def test_a_capsule_nobody_takes_releases_its_export():
    before = dlpack.live_exports()
    capsule = HostBytes(np.zeros(16, dtype=np.uint8)).__dlpack__()
    assert dlpack.live_exports() == before + 1
    del capsule
    gc.collect()
    assert dlpack.live_exports() == before
