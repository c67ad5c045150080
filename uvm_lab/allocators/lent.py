"""The buffer each of uvm_lab's allocators hands to its library (CuPy, Numba, torch): lent to that library's
kernels, which uvm_lab does not see (:meth:`~uvm_lab.DeviceBuffer.lend`), so that its map says unknown where
they may have faulted pages in, never "nowhere"."""

from __future__ import annotations

from ..buffer import DeviceBuffer
from ..location import Location
from ..mr.base import MemoryResource


def lent_buffer(size: int, *, label: str, device: int | Location | None = None, mr: MemoryResource | None = None,
                stream: object = None) -> DeviceBuffer:
    """``DeviceBuffer(size=size, mr=mr, stream=stream, label=label)``, lent to kernels on ``device`` (None: the
    current GPU); all or nothing: a buffer that cannot be lent is freed again."""
    buffer = DeviceBuffer(size=size, mr=mr, stream=stream, label=label)
    try:
        buffer.lend(device)
    except BaseException:
        buffer.close()
        raise
    return buffer
