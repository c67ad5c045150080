"""The driver's density prefetcher (research R5, ``uvm_perf_prefetch.c``), exactly.

For each VA block of a fault batch, the driver builds a bitmap of the block's pages: the pages already
resident at the destination, plus the faulted pages. Every 64 KiB big page holding a fault is filled
(unless one of its pages is thrashing). A binary tree over the block (4 KiB leaves) then gives, for
each faulted page, the largest subtree containing it whose ``count * 100 > threshold * size``; the
union of those subtrees is the region the fault brings in. The root is the 2 MiB block, so a region
never crosses a block.

One thread faulting in order at 0, 64K, 128K, 256K, 512K, 1M of a host-resident block therefore moves
64K, 64K, 128K, 256K, 512K, 1M: each fault doubles what is resident.
"""

from __future__ import annotations

import numpy as np

from ...units import BIG_PAGE_SIZE, BLOCK_SIZE, PAGE_SIZE

__all__ = ["BIG", "DEFAULT_THRESHOLD", "PAGES_PER_BLOCK", "density_region", "grow_to_big_pages"]

PAGES_PER_BLOCK = BLOCK_SIZE // PAGE_SIZE   # 512 leaves
BIG = BIG_PAGE_SIZE // PAGE_SIZE            # 16 pages per big page
#: ``uvm_perf_prefetch_threshold``: a subtree is prefetched when more than 51% of it is set.
DEFAULT_THRESHOLD = 51
_LEVELS = [1 << i for i in range(PAGES_PER_BLOCK.bit_length())]   # subtree sizes 1, 2, ... 512
_cache: dict[bytes, np.ndarray] = {}
_CACHE_LIMIT = 1 << 16


def grow_to_big_pages(faulted: np.ndarray, npages: np.ndarray, blocked: np.ndarray | None = None) -> np.ndarray:
    """Every 64 KiB big page of each row that holds a fault, filled (rows are blocks of 512 pages).

    A partial block's last big page is the pages that exist. ``blocked`` marks pages (thrashing ones)
    whose big page must not grow.
    """
    rows = faulted.shape[0]
    big = faulted.reshape(rows, -1, BIG).any(axis=2)
    if blocked is not None:
        big &= ~blocked.reshape(rows, -1, BIG).any(axis=2)
    grown = np.repeat(big, BIG, axis=1)
    return grown & _valid(npages, rows)


def _valid(npages: np.ndarray, rows: int) -> np.ndarray:
    return np.arange(PAGES_PER_BLOCK)[None, :] < np.asarray(npages).reshape(rows, 1)


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
    one = faulted.ndim == 1
    resident = np.atleast_2d(resident)
    faulted = np.atleast_2d(faulted)
    rows = faulted.shape[0]
    n = np.full(rows, PAGES_PER_BLOCK) if npages is None else np.broadcast_to(np.asarray(npages), (rows,))
    key = None
    if rows == 1 and thrashing is None:
        key = b"".join((np.packbits(resident).tobytes(), np.packbits(faulted).tobytes(),
                        int(n[0]).to_bytes(2, "little"), threshold.to_bytes(1, "little")))
        hit = _cache.get(key)
        if hit is not None:
            return hit[0] if one else hit
    region = _compute(resident, faulted, n, None if thrashing is None else np.atleast_2d(thrashing), threshold)
    if key is not None:
        if len(_cache) >= _CACHE_LIMIT:
            _cache.clear()
        region.setflags(write=False)
        _cache[key] = region
    return region[0] if one else region


def _compute(resident: np.ndarray, faulted: np.ndarray, n: np.ndarray, thrashing: np.ndarray | None,
             threshold: int) -> np.ndarray:
    # Only the subtrees that hold a fault can be taken, and those containing one fault are nested: walk up
    # from each fault (a few per block) instead of evaluating every subtree of every block.
    rows = faulted.shape[0]
    valid = _valid(n, rows)
    faulted = faulted & valid
    bitmap = (resident | faulted | grow_to_big_pages(faulted, n, thrashing)) & valid
    counts = np.zeros((rows, PAGES_PER_BLOCK + 1), dtype=np.int32)
    np.cumsum(bitmap, axis=1, dtype=np.int32, out=counts[:, 1:])
    counts = counts.reshape(-1)
    r, i = np.nonzero(faulted)
    base = r * (PAGES_PER_BLOCK + 1)
    nr = np.asarray(n, dtype=np.int64)[r]
    best_lo = np.zeros(len(i), dtype=np.int64)
    best_hi = np.zeros(len(i), dtype=np.int64)    # empty: nothing taken
    for s in _LEVELS:
        lo = i & ~(s - 1)
        count = counts[base + lo + s] - counts[base + lo]
        # A subtree of a partial block holds only the pages that exist.
        size = np.clip(nr - lo, 0, s)
        take = count * 100 > threshold * size
        best_lo[take] = lo[take]
        best_hi[take] = lo[take] + s
    width = PAGES_PER_BLOCK + 1
    edges = np.bincount(base + best_lo, minlength=rows * width) - np.bincount(base + best_hi, minlength=rows * width)
    region = np.cumsum(edges.reshape(rows, width)[:, :PAGES_PER_BLOCK], axis=1) > 0
    return region & valid
