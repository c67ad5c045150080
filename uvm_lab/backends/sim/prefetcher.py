"""The driver's density prefetcher (research R5, ``uvm_perf_prefetch.c``), on whole bitmaps.

For each VA block of a fault batch, the driver builds a bitmap of the block's pages: the pages already
resident at the destination, plus the faulted pages. Every 64 KiB big page holding a fault is filled
(unless one of its pages is thrashing). A binary tree over the block (4 KiB leaves) then gives, for
each faulted page, the largest subtree containing it whose ``count * 100 > threshold * size``; the
union of those subtrees is the region the fault brings in. The root is the 2 MiB block, so a region
never crosses a block.

One thread faulting in order at 0, 64K, 128K, 256K, 512K, 1M of a host-resident block therefore moves
64K, 64K, 128K, 256K, 512K, 1M: each fault doubles what is resident.

The rule is :func:`.core.region`'s; :func:`density_region` asks it about bitmaps, as the tests of the rule do.
"""

from __future__ import annotations

import numpy as np

from ...units import BLOCK_SIZE, PAGE_SIZE
from . import core

__all__ = ["DEFAULT_THRESHOLD", "PAGES_PER_BLOCK", "density_region"]

PAGES_PER_BLOCK = BLOCK_SIZE // PAGE_SIZE   # 512 leaves
#: ``uvm_perf_prefetch_threshold``: a subtree is prefetched when more than 51% of it is set.
DEFAULT_THRESHOLD = 51


def density_region(resident: np.ndarray, faulted: np.ndarray, npages: np.ndarray | int | None = None, *,
                   thrashing: np.ndarray | None = None, threshold: int = DEFAULT_THRESHOLD) -> np.ndarray:
    """The pages each fault brings in: the union of the largest dense subtrees around the faults.

    Parameters
    ----------
    resident, faulted
        Boolean arrays of shape ``(blocks, 512)`` (or ``(512,)`` for one block): pages already at the
        destination, and pages that faulted towards it.
    npages
        Pages that exist in each block (512 but for a partial last block).
    thrashing
        Pages the thrashing detector flagged: their big pages do not grow.
    threshold
        The density threshold in percent (``uvm_perf_prefetch_threshold``, 51 by default).

    Returns
    -------
    numpy.ndarray
        The region, same shape as ``faulted``; it includes the faulted pages and may include resident ones.
    """
    one = np.ndim(faulted) == 1
    resident = np.atleast_2d(np.asarray(resident, dtype=bool))
    faulted = np.atleast_2d(np.asarray(faulted, dtype=bool))
    rows = faulted.shape[0]
    n = np.broadcast_to(np.asarray(PAGES_PER_BLOCK if npages is None else npages), (rows,))
    hot = np.zeros((rows, PAGES_PER_BLOCK), dtype=bool) if thrashing is None else np.atleast_2d(thrashing)
    region = np.zeros((rows, PAGES_PER_BLOCK), dtype=bool)
    lanes = np.empty(PAGES_PER_BLOCK, dtype=np.int64)
    for r in range(rows):
        valid = np.arange(PAGES_PER_BLOCK) < n[r]
        state = (resident[r] & valid).astype(np.uint8)
        k = core.region(state, 1, 0, int(n[r]), np.ascontiguousarray(faulted[r] & valid),
                        np.ascontiguousarray(hot[r], dtype=bool), threshold, True, lanes)
        region[r, lanes[:k]] = True
    return region[0] if one else region
