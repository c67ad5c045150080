"""Which 4 KiB pages of a range are resident in host memory, read from ``/proc/self/pagemap``.

Each virtual page has an 8-byte entry there; bit 63 says the page is present in RAM. For managed
memory this is an exact oracle of host residency: a page that migrated to the GPU is unmapped on
the host, so its bit clears. Reading it needs no privilege (only the frame numbers are hidden).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import BackendError, InvalidArgumentError
from ..units import PAGE_SIZE

__all__ = ["OracleAgreement", "host_resident", "oracle_agreement"]

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


@dataclass(frozen=True)
class OracleAgreement:
    """How far a residency map's host copies agree with the host's page tables.

    Attributes
    ----------
    pages
        Pages compared.
    agree
        Pages where the map and the oracle agree on "is there a copy on the host".
    fraction
        ``agree / pages`` (1.0 for an empty range).
    map_only
        Page indices (from the map's first page) the map places on the host but the host does not hold.
    host_only
        Page indices the host holds but the map does not place there.
    """

    pages: int
    agree: int
    fraction: float
    map_only: np.ndarray
    host_only: np.ndarray

    def __repr__(self) -> str:
        return (f"<OracleAgreement {self.fraction:.4%} of {self.pages} pages; map-only {len(self.map_only)}, "
                f"host-only {len(self.host_only)}>")


def oracle_agreement(residency_map: Any) -> OracleAgreement:
    """Compare a residency map's host copies with :func:`host_resident` (the host's page tables).

    The oracle sees only the host side: a page the map places on the host (alone or read-duplicated)
    should be present in host RAM, and every other page absent. GPU copies cannot be checked this way.
    Meaningful for managed memory on a real GPU; on the simulator there are no real pages to compare.

    Parameters
    ----------
    residency_map
        A :class:`~uvm_lab.ResidencyMap` (``ul.residency(buf)``), or a live managed ``DeviceBuffer``.

    Raises
    ------
    InvalidArgumentError
        Neither a map nor a buffer, or the map's address is not page-aligned.
    BackendError
        ``/proc/self/pagemap`` cannot be read (not Linux).

    Examples
    --------
    >>> agreement = ul.tracing.oracle_agreement(ul.residency(buf))
    >>> assert agreement.fraction >= 0.999, agreement
    """
    from ..buffer import DeviceBuffer
    from ..residency_map import ResidencyMap, residency

    if isinstance(residency_map, DeviceBuffer):
        residency_map = residency(residency_map)
    if not isinstance(residency_map, ResidencyMap):
        raise InvalidArgumentError(f"expected a ResidencyMap or a DeviceBuffer, got {type(residency_map).__name__}",
                                   value=residency_map, expected="ul.residency(buf), or buf")
    if residency_map.address % PAGE_SIZE:
        raise InvalidArgumentError(f"the map starts at {residency_map.address:#x}, inside a page; the oracle compares "
                                   f"whole pages", value=residency_map.address, expected="a page-aligned address")
    host = host_resident(residency_map.address, residency_map.size)
    mapped = (np.asarray(residency_map.states) & 1) != 0
    n = min(len(host), len(mapped))
    host, mapped = host[:n], mapped[:n]
    agree = int((host == mapped).sum())
    return OracleAgreement(pages=n, agree=agree, fraction=agree / n if n else 1.0,
                           map_only=np.flatnonzero(mapped & ~host), host_only=np.flatnonzero(host & ~mapped))
