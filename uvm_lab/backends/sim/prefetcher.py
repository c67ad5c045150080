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

__all__ = ["BIG", "DEFAULT_THRESHOLD", "PAGES_PER_BLOCK", "block_prefetch", "dense_subtrees", "density_region",
           "grow_to_big_pages"]

PAGES_PER_BLOCK = BLOCK_SIZE // PAGE_SIZE   # 512 leaves
BIG = BIG_PAGE_SIZE // PAGE_SIZE            # 16 pages per big page
#: ``uvm_perf_prefetch_threshold``: a subtree is prefetched when more than 51% of it is set.
DEFAULT_THRESHOLD = 51
_LEVELS = [1 << i for i in range(PAGES_PER_BLOCK.bit_length())]   # subtree sizes 1, 2, ... 512
_CACHE_LIMIT = 1 << 16   # one-block answers block_prefetch keeps


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
    region = _compute(resident, faulted, n, None if thrashing is None else np.atleast_2d(thrashing), threshold)
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


_LANES = np.arange(BIG)
_BIGS = PAGES_PER_BLOCK // BIG                 # big pages per block
_BIG_LEVELS = np.array([x for x in _LEVELS if x >= BIG])
_SMALL_LEVELS = np.array([x for x in _LEVELS if x < BIG])
_BYTE_SUM = np.uint64(0x0101010101010101)


def _big_page_counts(bitmap: np.ndarray) -> np.ndarray:
    """Pages set in each big page of each row of a ``(rows, 512)`` boolean array, as ``(rows, 32)`` ints."""
    # Each big page is 16 bytes of 0/1: add its two 8-byte words, then sum their bytes with one multiply.
    words = np.ascontiguousarray(bitmap).view(np.uint64).reshape(bitmap.shape[0], -1, 2)
    pair = words[:, :, 0] + words[:, :, 1]
    return ((pair * _BYTE_SUM) >> np.uint64(56)).astype(np.int64)


def dense_subtrees(resident: np.ndarray, rows: np.ndarray, lanes: np.ndarray, npages: np.ndarray, *,
                   thrashing: np.ndarray | None = None,
                   threshold: int = DEFAULT_THRESHOLD) -> tuple[np.ndarray, np.ndarray]:
    """The subtree each fault brings in, as :func:`density_region` takes it: ``(lo, hi)`` lanes per fault.

    ``resident`` is ``(blocks, 512)`` (only pages that exist may be set), the faults are ``(rows[k],
    lanes[k])``, distinct and sorted, on pages that exist; ``hi`` is cut at the block's last page and
    ``lo == hi`` where a fault takes nothing. The union of these ranges is :func:`density_region`'s region.
    Subtrees of a big page or more are judged once per faulted big page from whole big pages' counts;
    smaller ones, lane by lane, only for the faults that no such subtree takes.
    """
    nrows = resident.shape[0]
    n = np.asarray(npages, dtype=np.int64).reshape(nrows)
    rows = np.asarray(rows, dtype=np.int64)
    lanes = np.asarray(lanes, dtype=np.int64)
    bitmap = resident.copy()
    bitmap[rows, lanes] = True
    # Big pages holding a fault (sorted keys: the faults are), and those that grow (none thrashing).
    key = rows * _BIGS + lanes // BIG
    new = np.ones(len(key), dtype=bool)
    new[1:] = key[1:] != key[:-1]
    big_key = key[new]
    which = np.cumsum(new) - 1                     # each fault's big page among big_key
    big_row, big_at = big_key // _BIGS, big_key % _BIGS
    grows = np.ones(len(big_key), dtype=bool)
    if thrashing is not None:
        grows = _big_page_counts(thrashing)[big_row, big_at] == 0
    # Per big page of the batch's blocks, the pages of the bitmap: a grown one holds every page that exists.
    counts = _big_page_counts(bitmap)
    counts[big_row[grows], big_at[grows]] = np.minimum(np.maximum(n[big_row[grows]] - big_at[grows] * BIG, 0), BIG)
    prefix = np.zeros((nrows, _BIGS + 1), dtype=np.int64)
    np.cumsum(counts, axis=1, out=prefix[:, 1:])
    # Subtrees of 16 .. 512 pages, every level at once: the largest dense one wins.
    sizes = _BIG_LEVELS[None, :]
    lo = (big_at[:, None] * BIG) & ~(sizes - 1)
    r = big_row[:, None]
    count = prefix[r, (lo + sizes) // BIG] - prefix[r, lo // BIG]
    nr = n[big_row][:, None]
    take = count * 100 > threshold * np.minimum(np.maximum(nr - lo, 0), sizes)
    level = len(_BIG_LEVELS) - 1 - np.argmax(take[:, ::-1], axis=1)
    taken = take.any(axis=1)
    pick = np.arange(len(big_key))
    big_lo = np.where(taken, lo[pick, level], 0)
    big_hi = np.where(taken, big_lo + _BIG_LEVELS[level], 0)
    best_lo, best_hi = big_lo[which], big_hi[which]
    # Below a big page, for the faults no larger subtree takes (a thrashing big page, or a 100% threshold).
    small = np.flatnonzero(~taken[which])
    if len(small):
        f_row, f_lane = rows[small], lanes[small]
        first = f_lane & ~(BIG - 1)
        own = bitmap[f_row[:, None], first[:, None] + _LANES[None, :]]
        grown = grows[which[small]]
        if grown.any():
            own = np.where(grown[:, None], first[:, None] + _LANES[None, :] < n[f_row][:, None], own)
        own_prefix = np.zeros((len(small), BIG + 1), dtype=np.int64)
        np.cumsum(own, axis=1, out=own_prefix[:, 1:])
        sizes = _SMALL_LEVELS[None, :]
        lo = f_lane[:, None] & ~(sizes - 1)
        k = np.arange(len(small))[:, None]
        count = own_prefix[k, lo - first[:, None] + sizes] - own_prefix[k, lo - first[:, None]]
        take = count * 100 > threshold * np.minimum(np.maximum(n[f_row][:, None] - lo, 0), sizes)
        level = len(_SMALL_LEVELS) - 1 - np.argmax(take[:, ::-1], axis=1)
        taken_small = take.any(axis=1)
        pick = np.arange(len(small))
        best_lo[small] = np.where(taken_small, lo[pick, level], 0)
        best_hi[small] = np.where(taken_small, best_lo[small] + _SMALL_LEVELS[level], 0)
    nr = n[rows]
    return best_lo, np.minimum(best_hi, np.maximum(best_lo, nr))


_block_cache: dict[bytes, np.ndarray] = {}


def block_prefetch(resident: np.ndarray, faulted: np.ndarray, npages: int, threshold: int) -> np.ndarray:
    """For one block (512 booleans each; ``resident`` only where pages exist): the sorted offsets of the pages
    that :func:`density_region` brings in and that are neither resident nor faulted.

    A sweep meets the same few bitmaps over and over: the answers are kept.
    """
    key = b"".join((np.packbits(resident).tobytes(), np.packbits(faulted).tobytes(),
                    npages.to_bytes(2, "little"), threshold.to_bytes(1, "little")))
    hit = _block_cache.get(key)
    if hit is None:
        lanes = np.flatnonzero(faulted)
        lo, hi = dense_subtrees(resident[None, :], np.zeros(len(lanes), dtype=np.int64), lanes, np.array([npages]),
                                threshold=threshold)
        edges = np.zeros(PAGES_PER_BLOCK + 1, dtype=np.int64)
        np.add.at(edges, lo, 1)
        np.add.at(edges, hi, -1)
        region = np.cumsum(edges[:PAGES_PER_BLOCK]) > 0
        hit = np.flatnonzero(region & ~resident & ~faulted)
        hit.setflags(write=False)
        if len(_block_cache) >= _CACHE_LIMIT:
            _block_cache.clear()
        _block_cache[key] = hit
    return hit
