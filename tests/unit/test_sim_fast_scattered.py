"""The scattered-batch fast path is an optimisation only: with it on or off, the same records, clock, state and stats.

It services a run of GPU batches whose faults land in untouched blocks, no block in two batches (a strided read,
the first touches of a gather), with one pass over arrays for all of them. These tests run the same streams with
it on and off and compare everything, and count the accesses it took over, so that a comparison where it never
ran cannot pass. It serves the numpy code only (the compiled plain batch outruns it), so they run without the
compiled core.
"""

from __future__ import annotations

import numpy as np
import pytest

from uvm_lab import workloads as W
from uvm_lab.backends.sim import SimBackend, engine
from uvm_lab.events.schema import Advice, MemoryKind
from uvm_lab.location import Location

from .test_sim_fast_batches import _assert_same
from .test_sim_fast_half_blocks import _run as _run_with
from .test_sim_fast_half_blocks import count_taken

MiB = 1 << 20
PAGE = 4096
GPU, HOST = Location.device(0), Location.host()


def _run(fast: bool, script, **backend) -> tuple:
    return _run_with(fast, script, "fast_scattered", **backend)


@pytest.fixture
def taken(monkeypatch) -> list[int]:
    """Accesses the scattered-batch path consumed, call by call, in backends made without the compiled core."""
    monkeypatch.setattr(engine, "COMPILED", False)
    return count_taken(monkeypatch, "_scattered")


def _pages(ptr: int, size: int, step: int = PAGE) -> np.ndarray:
    return ptr + np.arange(0, size, step, dtype=np.uint64)


def _scatters(b: SimBackend) -> list:
    """Sparse and scattered reads and writes, then the cases the fast path must stop at or hand back."""
    out = []
    rng = np.random.default_rng(7)
    big = b.allocate(40 * MiB, MemoryKind.MANAGED)
    odd = b.allocate(5 * MiB + 12288, MemoryKind.MANAGED)     # a partial last block
    fresh = b.allocate(8 * MiB, MemoryKind.MANAGED)          # never touched: batches populate
    b.prefetch(big, 40 * MiB, HOST)
    b.prefetch(odd, 5 * MiB + 12288, HOST)
    out.append(b.access_stream(_pages(big, 40 * MiB, 64 << 10), GPU, "read"))     # one page in 16
    b.prefetch(big, 40 * MiB, HOST)
    out.append(b.access_stream(_pages(big, 40 * MiB, 80 << 10), GPU, "write"))    # strides across 64K groups
    b.prefetch(big, 40 * MiB, HOST)
    # One page of each block, blocks in a shuffled order: batches out of address order, every block fresh.
    blocks = rng.permutation(20)
    out.append(b.access_stream(big + blocks.astype(np.uint64) * (2 * MiB) + 12288, GPU, "read"))
    # Hits between the batches: the pages just read, again, then on to the next blocks.
    b.prefetch(big, 40 * MiB, HOST)
    sparse = _pages(big, 40 * MiB, 32 << 10)
    again = np.concatenate([np.concatenate((sparse[i:i + 300], sparse[i:i + 300], sparse[max(0, i - 5000):i]))
                            for i in range(0, len(sparse), 300)])
    out.append(b.access_stream(again, GPU, "read"))
    out.append(b.access_stream(_pages(odd, 5 * MiB + 12288, 16 << 10), GPU, "read"))
    out.append(b.access_stream(_pages(fresh, 8 * MiB, 48 << 10), GPU, "write"))    # first touches: populate
    # A stride whose pattern repeats every third block: three prefetch patterns, each laid over its blocks.
    wide = b.allocate(64 * MiB, MemoryKind.MANAGED)
    b.prefetch(wide, 64 * MiB, HOST)
    out.append(b.access_stream(_pages(wide, 64 * MiB, 48 << 10), GPU, "read"))
    # A gather: random pages, blocks met again by later batches.
    b.prefetch(big, 40 * MiB, HOST)
    out.append(b.access_stream(big + rng.integers(0, 40 * MiB // PAGE, 6000).astype(np.uint64) * PAGE, GPU, "read"))
    # Reads and writes by access, changing along the stream.
    b.prefetch(big, 40 * MiB, HOST)
    pages = _pages(big, 40 * MiB, 64 << 10)
    writes = (np.arange(len(pages)) // 200) % 2 == 1
    out.append(b.access_stream([pages], GPU, [writes]))
    # Advice, a remote mapping and a duplicate on some blocks.
    b.prefetch(big, 40 * MiB, HOST)
    b.advise(big + 4 * MiB, 2 * MiB, Advice.SET_READ_MOSTLY, None)
    b.advise(big + 10 * MiB, 2 * MiB, Advice.SET_ACCESSED_BY, GPU)
    b.advise(big + 16 * MiB, 2 * MiB, Advice.SET_PREFERRED_LOCATION, HOST)
    out.append(b.access_stream(_pages(big, 40 * MiB, 64 << 10), GPU, "read"))
    out.append(b.access_stream(_pages(big, 40 * MiB, 64 << 10), HOST, "write"))   # back: thrashing state
    out.append(b.access_stream(_pages(big, 40 * MiB, 64 << 10), GPU, "read"))
    return out


@pytest.mark.parametrize("backend", [{}, {"thrashing": False}, {"prefetcher": False}, {"prefetch_threshold": 1},
                                     {"prefetch_threshold": 100}, {"device_memory": "6MiB"},
                                     {"device_memory": "24MiB"}, {"eviction": "lru"}, {"platform": "gh200-ats"},
                                     {"platform": "x86-pcie3"}])
def test_scattered_streams_give_the_same_trace_either_way(backend, taken):
    args = {"device_memory": "64MiB", **backend}
    fast = _run(True, _scatters, **args)
    used = sum(taken)
    _assert_same(fast, _run(False, _scatters, **args))
    if backend.get("eviction", "fifo") != "fifo":
        assert used == 0
    elif backend.get("device_memory") == "6MiB":   # three chunks: a batch of eight blocks evicts its own
        assert used > 0
    else:
        assert used >= 2000, used   # it took over for most of the sparse reads


def _victims(b: SimBackend) -> list:
    """A GPU full of one buffer, then sparse batches that evict it from the front, reading what they evict."""
    out = []
    a, c = b.allocate(24 * MiB, MemoryKind.MANAGED), b.allocate(24 * MiB, MemoryKind.MANAGED)
    b.prefetch(a, 24 * MiB, HOST)
    b.prefetch(c, 24 * MiB, HOST)
    out.append(b.access_stream(_pages(a, 24 * MiB), GPU, "read"))               # a fills the GPU
    sparse = _pages(c, 24 * MiB, 64 << 10)                                       # two batches: 8 blocks, then 4
    first_block, second_block = _pages(a, 16 * PAGE), _pages(a + 2 * MiB, 16 * PAGE)
    # Inside the first batch's accesses its victims still hit; after them, one of them faults again.
    out.append(b.access_stream(np.concatenate((sparse[:200], second_block, sparse[200:240])), GPU, "read"))
    out.append(b.access_stream(np.concatenate((sparse[240:], first_block)), GPU, "read"))
    b.prefetch(a, 24 * MiB, HOST)
    b.prefetch(c, 24 * MiB, HOST)
    out.append(b.access_stream(_pages(a, 24 * MiB), GPU, "read"))
    out.append(b.access_stream(np.concatenate((sparse[:256], first_block, sparse[256:])), GPU, "read"))
    b.prefetch(a, 24 * MiB, HOST)
    b.prefetch(c, 24 * MiB, HOST)
    b.advise(a, 2 * MiB, Advice.SET_READ_MOSTLY, None)
    out.append(b.access_stream(_pages(a, 24 * MiB), GPU, "read"))               # a block of duplicates first
    out.append(b.access_stream(sparse, GPU, "read"))                             # evicting it needs invalidations
    return out


@pytest.mark.parametrize("device", ["24MiB", "28MiB"])
def test_evictions_and_reused_victims_give_the_same_trace_either_way(device, taken):
    fast = _run(True, _victims, device_memory=device)
    assert sum(taken) > 0
    _assert_same(fast, _run(False, _victims, device_memory=device))


def test_it_stops_where_the_general_path_must_take_over(taken):
    """A block met again, advice, a write after reads, thrashing state: each ends a run early."""
    _run(True, _scatters, device_memory="64MiB")
    assert len(taken) > 8          # runs ended and began again
    assert min(taken) < max(taken)


@pytest.mark.parametrize("initial", ["host", "nowhere"])
@pytest.mark.parametrize("ratio", [0.5, 1.5])
@pytest.mark.parametrize("name", list(W.WORKLOADS))
def test_workloads_give_the_same_trace_either_way(name, ratio, initial, taken):
    w = W.make(name, size="16MiB")
    device = max(2 * MiB, int(w.total_bytes / ratio) // (2 * MiB) * (2 * MiB))
    for policy in W.POLICIES:
        def script(b, policy=policy):
            return W.run_sim(w, b, policy=policy, prefetch_chunk="4MiB", initial=initial)

        _assert_same(_run(True, script, device_memory=device), _run(False, script, device_memory=device))
    if name == "strided" and ratio < 1:   # oversubscribed, a batch's eight blocks are more than the GPU holds
        assert sum(taken) > 0


def test_a_strided_read_is_serviced_by_it_whole(taken):
    w = W.make("strided", size="64MiB")
    accesses = sum(len(c.offsets) for ph in w.phases for c in W.phase_stream(w, ph))
    W.run_sim(w, device_memory="128MiB")
    assert sum(taken) == accesses
