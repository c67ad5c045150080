"""Buffer data on the simulator: copies in and out, a NumPy view, and what is shared with other libraries."""

from __future__ import annotations

import numpy as np
import pytest

import uvm_lab as ul
from uvm_lab.errors import BackendError, BufferClosedError, InvalidArgumentError

MiB = 1 << 20


def test_copy_round_trip_and_a_view():
    buf = ul.DeviceBuffer(size=MiB)
    data = np.arange(MiB // 4, dtype=np.int32)
    buf.copy_from_host(data)
    np.testing.assert_array_equal(buf.copy_to_host().view(np.int32), data)
    np.testing.assert_array_equal(buf.host_view(np.int32), data)
    out = np.zeros(MiB // 8, dtype=np.float64)
    assert buf.copy_to_host(out) is out and out.view(np.int32)[3] == 3


def test_a_copy_in_is_a_host_write_of_managed_memory():
    buf = ul.DeviceBuffer(size=4 * MiB)
    buf.prefetch("gpu")
    with ul.record() as trace:
        buf.copy_from_host(b"\x01" * MiB, offset=MiB)
    assert trace.summary()["bytes_dtoh"] == MiB          # those pages came back to the host to be written
    counts = ul.residency(buf).counts()
    assert counts["host"] == MiB // 4096 and counts["gpu"] == 3 * MiB // 4096


def test_device_memory_copies_but_has_no_view():
    buf = ul.DeviceBuffer(size=MiB, mr=ul.mr.CudaMemoryResource())
    buf.copy_from_host(bytes(range(256)) * 4096)
    assert buf.copy_to_host()[:3].tolist() == [0, 1, 2]
    with pytest.raises(BackendError, match="no host view"):
        buf.host_view()


@pytest.mark.parametrize(("data", "error"), [
    (b"x" * (MiB + 1), "do not fit"),
    ("text", "bytes, a buffer or a NumPy array"),
    (np.zeros((64, 64))[:, ::2], "C-contiguous"),
])
def test_bad_copies_change_nothing(data, error):
    buf = ul.DeviceBuffer(size=MiB)
    buf.copy_from_host(b"\x07" * MiB)
    with pytest.raises(InvalidArgumentError, match=error):
        buf.copy_from_host(data)
    assert (buf.copy_to_host() == 7).all()


def test_copy_out_into_a_wrong_array():
    buf = ul.DeviceBuffer(size=MiB)
    with pytest.raises(InvalidArgumentError, match="holds 4 bytes"):
        buf.copy_to_host(np.zeros(1, dtype=np.int32))
    ro = np.zeros(MiB, dtype=np.uint8)
    ro.flags.writeable = False
    with pytest.raises(InvalidArgumentError, match="read-only"):
        buf.copy_to_host(ro)
    with pytest.raises(InvalidArgumentError, match="whole number"):
        ul.DeviceBuffer(size=10).host_view(np.int32)


def test_simulated_memory_is_not_offered_to_other_libraries():
    buf = ul.DeviceBuffer(size=MiB)
    assert not hasattr(buf, "__cuda_array_interface__")
    from uvm_lab.integrations.cupy import cupy_allocator

    with pytest.raises((BackendError, ImportError)):
        cupy_allocator(1024)


def test_closed_buffers_have_no_data():
    buf = ul.DeviceBuffer(size=MiB)
    buf.close()
    with pytest.raises(BufferClosedError):
        buf.copy_to_host()
    with pytest.raises(BufferClosedError):
        buf.copy_from_host(b"1")
