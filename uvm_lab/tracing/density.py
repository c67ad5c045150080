"""The UVM driver's density prefetcher: which pages one fault brings in.

A CUPTI fault record names the faulting page, not the range the driver serviced. For pages that
already hold data, the migration records that follow say exactly what moved; for a first touch
(zero-fill, no transfer) nothing does. This module reproduces the driver's rule for that range
(``uvm_perf_prefetch.c``; research note R5), so the residency map can follow a first touch:

1. Within the faulting page's 2 MiB VA block, take the pages already resident at the destination,
   plus the faulting page.
2. Grow to big pages: the whole 64 KiB big page of the fault is in.
3. Walk a binary tree over the block (4 KiB leaves) from the faulting page to the root; the largest
   subtree more than 51 % full (``count * 100 > 51 * size``) is the serviced region.

One thread touching a fresh block in order thus takes 6 faults of 64, 64, 128, 256, 512 and 1024 KiB,
the sequence measured on hardware.
"""

from __future__ import annotations

import numpy as np

from ..units import PAGE_SIZE

__all__ = ["BIG_PAGE_PAGES", "BLOCK_PAGES", "THRESHOLD_PERCENT", "serviced_region"]

#: Pages in a VA block (2 MiB).
BLOCK_PAGES = (2 << 20) // PAGE_SIZE
#: Pages in a big page (64 KiB).
BIG_PAGE_PAGES = (64 << 10) // PAGE_SIZE
#: ``uvm_perf_prefetch_threshold``'s default.
THRESHOLD_PERCENT = 51


def serviced_region(resident: np.ndarray, faulted: int, *, threshold: int = THRESHOLD_PERCENT) -> tuple[int, int]:
    """The pages ``[lo, hi)`` of a VA block that one fault brings to the destination.

    Parameters
    ----------
    resident
        One bool per page of the block (``BLOCK_PAGES`` of them): already resident at the destination.
        Pages outside the allocation are False.
    faulted
        Index of the faulting page in the block.
    threshold
        Percent a subtree must exceed to be taken whole.
    """
    n = len(resident)
    if not 0 <= faulted < n:
        raise IndexError(f"faulted page {faulted} is outside the block of {n} pages")
    bitmap = np.asarray(resident, dtype=bool).copy()
    lo = faulted - faulted % BIG_PAGE_PAGES
    hi = min(lo + BIG_PAGE_PAGES, n)
    bitmap[lo:hi] = True
    counts = np.concatenate(([0], np.cumsum(bitmap)))
    size = BIG_PAGE_PAGES * 2
    while size <= max(n, BLOCK_PAGES):
        s = faulted - faulted % size
        e = min(s + size, n)
        if (counts[e] - counts[s]) * 100 > threshold * size:
            lo, hi = s, e
        size *= 2
    return lo, hi
