"""Access streams: each phase of a workload as the pages it touches, in the order a GPU or host touches them.

A stream is a sequence of chunks; each chunk is ``(offsets, buffer_index, writes)``: byte offsets into one
buffer, in program order, at one access per distinct page run (consecutive accesses to the same page are
one access, as a warp's coalesced loads are). Long streams come in chunks of at most ``CHUNK`` accesses so
that a 64 GiB sweep never exists as one array. Random patterns draw from ``numpy.random.default_rng(seed)``:
the same seed gives the same stream.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from ..units import PAGE_SIZE
from .spec import Phase, Workload

__all__ = ["CHUNK", "Chunk", "phase_stream", "stream_shape"]

CHUNK = 1 << 20


@dataclass(frozen=True)
class Chunk:
    """Accesses of one phase: byte ``offsets`` into buffer ``buffer``; ``write`` for each (or for all)."""

    buffer: str
    offsets: np.ndarray
    write: bool | np.ndarray


def stream_shape(phase: Phase) -> dict[str, int]:
    """How the phase runs: pages in flight and bytes per access (the simulator's concurrency model)."""
    if phase.processor == "host":
        return {"in_flight": 1, "bytes_per_access": 1}   # one byte of each page, as the GPU side's host loop
    if phase.pattern == "gather":
        # Every warp reads its own random 128 B: as many distinct pages in flight as warps.
        return {"in_flight": int(phase.param("warps_in_flight", 2048)),
                "bytes_per_access": int(phase.param("bytes_per_access", 128))}
    if phase.pattern == "strided":
        # One 4-byte read every ``stride`` bytes moves a 32-byte sector; below a page, one access stands for
        # all of the page's reads (only one reaches the fault path).
        stride = int(phase.param("stride", PAGE_SIZE))
        return {"in_flight": 256, "bytes_per_access": min(PAGE_SIZE, 32 * max(1, PAGE_SIZE // stride))}
    return {"in_flight": 256, "bytes_per_access": PAGE_SIZE}


def _pages(lo: int, hi: int) -> Iterator[np.ndarray]:
    for start in range(lo, hi, CHUNK):
        yield np.arange(start, min(hi, start + CHUNK), dtype=np.int64) * PAGE_SIZE


def phase_stream(workload: Workload, phase: Phase) -> Iterator[Chunk]:
    """The accesses of ``phase`` as chunks, deterministic for a given workload description."""
    sizes = workload.buffers
    first = phase.buffers[0]
    npages = sizes[first] // PAGE_SIZE
    if phase.pattern == "host_write" and int(phase.param("every", 1)) > 1:   # one page in ``every``
        offsets = np.arange(0, npages, int(phase.param("every", 1)), dtype=np.int64) * PAGE_SIZE
        for lo in range(0, len(offsets), CHUNK):
            yield Chunk(first, offsets[lo:lo + CHUNK], True)
    elif phase.pattern in ("stream", "host_write", "host_read"):
        write = phase.pattern == "host_write" or bool(phase.param("write", False))
        for _ in range(phase.param("passes", 1)):
            for offsets in _pages(0, npages):
                yield Chunk(first, offsets, write)
    elif phase.pattern == "strided":
        stride = int(phase.param("stride", 64 << 10))
        offsets = np.arange(int(phase.param("offset", 0)), sizes[first], stride, dtype=np.int64)
        if stride < PAGE_SIZE:   # several accesses per page: one per page is what reaches the fault path
            offsets = np.unique(offsets // PAGE_SIZE) * PAGE_SIZE
        for _ in range(phase.param("passes", 1)):
            for lo in range(0, len(offsets), CHUNK):
                yield Chunk(first, offsets[lo:lo + CHUNK], False)
    elif phase.pattern == "gather":
        rng = np.random.default_rng(phase.param("seed", 0))
        count = int(phase.param("count", npages))
        bpa = int(phase.param("bytes_per_access", 128))
        for lo in range(0, count, CHUNK):
            n = min(CHUNK, count - lo)
            yield Chunk(first, rng.integers(0, sizes[first] // bpa, n, dtype=np.int64) * bpa, False)
    elif phase.pattern == "stencil":
        yield from _stencil(phase, sizes)
    elif phase.pattern == "matmul":
        yield from _matmul(phase, sizes)


def _stencil(phase: Phase, sizes: dict[str, int]) -> Iterator[Chunk]:
    """Row i of the output reads rows i-1, i, i+1 of the input: per row, the input's three rows then the output's."""
    src, dst = phase.buffers[0], phase.buffers[-1]
    row = max(PAGE_SIZE, int(phase.param("row_bytes", 1 << 20)) // PAGE_SIZE * PAGE_SIZE)
    rows = min(sizes[src], sizes[dst]) // row
    per_row = row // PAGE_SIZE
    rows_per_chunk = max(1, CHUNK // (4 * per_row))
    cols = np.arange(per_row, dtype=np.int64) * PAGE_SIZE
    for _ in range(phase.param("passes", 1)):
        for lo in range(0, rows, rows_per_chunk):
            r = np.arange(lo, min(rows, lo + rows_per_chunk), dtype=np.int64)
            above, below = np.maximum(r - 1, 0), np.minimum(r + 1, rows - 1)
            reads = np.stack((above, r, below), axis=1)[:, :, None] * row + cols[None, None, :]
            for i, rr in enumerate(r.tolist()):
                yield Chunk(src, reads[i].reshape(-1), False)
                yield Chunk(dst, rr * row + cols, True)


def _matmul(phase: Phase, sizes: dict[str, int]) -> Iterator[Chunk]:
    """C[i, j] += A[i, k] B[k, j] over tiles, i and j outer, k inner; tiles are stored contiguously.

    As the GPU side's kernel (one launch per k step, ``c[i] += a[i] * b[i]``), every step reads its A and B
    tiles and reads, then writes, the C tile: C is swept ``tiles`` times, not once, and its first touch is a
    read (a load faults before the store).
    """
    a, b, c = (phase.buffers + phase.buffers[-1:] * 3)[:3]
    n = int(phase.param("tiles", 4))
    tile = min(sizes[a], sizes[b], sizes[c]) // (n * n) // PAGE_SIZE * PAGE_SIZE
    cols = np.arange(tile // PAGE_SIZE, dtype=np.int64) * PAGE_SIZE
    for i in range(n):
        for j in range(n):
            for k in range(n):
                yield Chunk(a, (i * n + k) * tile + cols, False)
                yield Chunk(b, (k * n + j) * tile + cols, False)
                yield Chunk(c, (i * n + j) * tile + cols, False)
                yield Chunk(c, (i * n + j) * tile + cols, True)
