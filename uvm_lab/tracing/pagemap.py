"""Which 4 KiB pages of a range are resident in host memory, read from ``/proc/self/pagemap``.

Each virtual page has an 8-byte entry there; bit 63 says the page is present in RAM. For managed
memory this is an exact oracle of host residency: a page that migrated to the GPU is unmapped on
the host, so its bit clears. Reading it needs no privilege (only the frame numbers are hidden).
"""

from __future__ import annotations

import os

import numpy as np

from ..errors import BackendError, InvalidArgumentError
from ..units import PAGE_SIZE

__all__ = ["host_resident"]

_PRESENT = np.uint64(1) << np.uint64(63)


def host_resident(address: int, size: int) -> np.ndarray:
    """A bool per 4 KiB page of ``[address, address + size)``: True where the page is in host RAM.

    Raises :class:`BackendError` where ``/proc/self/pagemap`` is not available (not Linux).
    """
    if isinstance(address, bool) or not isinstance(address, int) or address < 0:
        raise InvalidArgumentError(f"address must be a non-negative int, got {address!r}", value=address,
                                   expected="a virtual address")
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise InvalidArgumentError(f"size must be a non-negative int, got {size!r}", value=size,
                                   expected="a size in bytes")
    if os.sysconf("SC_PAGE_SIZE") != PAGE_SIZE:
        raise BackendError(f"the host's page size is {os.sysconf('SC_PAGE_SIZE')}, not 4 KiB")
    first = address // PAGE_SIZE
    last = -(-(address + size) // PAGE_SIZE)
    try:
        with open("/proc/self/pagemap", "rb", buffering=0) as f:
            f.seek(first * 8)
            raw = f.read((last - first) * 8)
    except OSError as exc:
        raise BackendError(f"cannot read /proc/self/pagemap ({exc}); the host-residency oracle needs Linux") from exc
    return (np.frombuffer(raw, dtype=np.uint64) & _PRESENT) != 0
