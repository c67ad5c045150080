"""The plain-batch fast path is an optimisation only: with it on or off, the same records, clock, state and stats."""

from __future__ import annotations

import numpy as np
import pytest

from uvm_lab import workloads as W
from uvm_lab.backends.sim import SimBackend
from uvm_lab.events import EventBus
from uvm_lab.events.schema import Advice, MemoryKind
from uvm_lab.location import Location

from .test_sim_fast_path import _same

MiB = 1 << 20
GPU, HOST = Location.device(0), Location.host()


_LEAN = ("fast_batches", "fast_run_batches")


def _run(fast: bool, script, lean: tuple[str, ...] = _LEAN, **backend) -> tuple:
    """Run ``script`` with the lean batch paths named in ``lean`` (fast) or with none (the general path)."""
    bus = EventBus(capacity=1 << 22)
    b = SimBackend(bus=bus, **backend)
    for flag in _LEAN:
        setattr(b._engine, flag, fast and flag in lean)
    results = script(b)
    t, mem = b._table, b._memory
    state = np.concatenate((t.state, t.writable, t.remote, t.chunk.view(np.uint8), t.last_use.view(np.uint8)))
    return bus.history(), results, b.now_ns(), state, list(mem._order.items()), mem.evicted_blocks


def _assert_same(fast: tuple, slow: tuple) -> None:
    assert len(fast[0]) == len(slow[0])
    assert _same(fast[0], slow[0])
    assert fast[1] == slow[1]
    assert fast[2] == slow[2]
    assert np.array_equal(fast[3], slow[3])
    assert fast[4:] == slow[4:]


@pytest.mark.parametrize("lean", [_LEAN, ("fast_batches",), ("fast_run_batches",)])
@pytest.mark.parametrize("eviction", ["fifo", "lru", "tree"])
@pytest.mark.parametrize("ratio", [0.5, 1.5])
@pytest.mark.parametrize("name", list(W.WORKLOADS))
def test_workloads_give_the_same_trace_either_way(name, ratio, eviction, lean):
    for policy in W.POLICIES:
        w = W.make(name, size="16MiB")
        device = max(2 * MiB, int(w.total_bytes / ratio) // (2 * MiB) * (2 * MiB))

        def script(b, w=w, policy=policy):
            return W.run_sim(w, b, policy=policy, prefetch_chunk="4MiB")

        _assert_same(_run(True, script, lean, device_memory=device, eviction=eviction),
                     _run(False, script, device_memory=device, eviction=eviction))


def _ping_pong(b: SimBackend) -> list:
    """GPU and host take turns on the same pages (thrashing, throttling, pins), then with advice on parts."""
    out = []
    p = b.allocate(8 * MiB, MemoryKind.MANAGED)
    pages = p + np.arange(8 * MiB // 4096, dtype=np.uint64) * 4096
    for i in range(20):
        out.append(b.access_stream(pages[(i * 37) % 1000:][:1500], GPU, "write" if i % 3 else "read"))
        out.append(b.access_stream(pages[(i * 53) % 900:][:300:3], HOST, "write" if i % 2 else "read"))
    b.advise(p, 2 * MiB, Advice.SET_PREFERRED_LOCATION, GPU)
    b.advise(p + 2 * MiB, 2 * MiB, Advice.SET_ACCESSED_BY, GPU)
    b.advise(p + 4 * MiB, 2 * MiB, Advice.SET_READ_MOSTLY, None)
    rng = np.random.default_rng(1)
    for i in range(10):
        out.append(b.access_stream(pages[::-1][(i * 41) % 1500:][:700], GPU, "write" if i % 2 else "read"))
        out.append(b.access_stream(rng.choice(pages, 2000), GPU, rng.random(2000) < 0.3))
        out.append(b.access_stream(rng.choice(pages, 200), HOST, rng.random(200) < 0.5))
    return out


@pytest.mark.parametrize("backend", [{}, {"thrashing": False}, {"prefetcher": False}, {"prefetch_threshold": 90},
                                     {"eviction": "lru"}, {"device_memory": "4MiB"}, {"platform": "gh200-ats"}])
def test_mixed_advice_and_thrashing_give_the_same_trace_either_way(backend):
    args = {"device_memory": "6MiB", **backend}
    _assert_same(_run(True, _ping_pong, **args), _run(False, _ping_pong, **args))
    _assert_same(_run(True, _ping_pong, ("fast_run_batches",), **args), _run(False, _ping_pong, **args))


def _prefetch_reference(engine, pages: np.ndarray, to_here: np.ndarray, processor: int, g: int) -> np.ndarray:
    """R5 over whole bitmaps with :func:`density_region`: what the engine's sparse walk must return."""
    from uvm_lab.backends.sim.model import BLOCK_SHIFT, NO_LOCATION, PAGES_PER_BLOCK
    from uvm_lab.backends.sim.prefetcher import density_region

    t = engine.table
    target = pages[to_here]
    blocks = np.unique(target >> BLOCK_SHIFT)
    rows = len(blocks)
    idx = (blocks[:, None] * PAGES_PER_BLOCK + np.arange(PAGES_PER_BLOCK)[None, :]).reshape(-1)
    npages = t.block_pages[blocks].astype(np.int64)
    valid = (np.arange(PAGES_PER_BLOCK)[None, :] < npages[:, None]).reshape(-1)
    st = t.state[idx]
    resident = ((st & g) != 0) & valid
    faulted = np.zeros(rows * PAGES_PER_BLOCK, dtype=bool)
    faulted[np.searchsorted(blocks, target >> BLOCK_SHIFT) * PAGES_PER_BLOCK + (target & (PAGES_PER_BLOCK - 1))] = True
    thrash = np.array([engine.thrashing.blocks[b].thrashing[p & 511] if b in engine.thrashing.blocks else False
                       for b, p in zip((idx >> BLOCK_SHIFT).tolist(), idx.tolist(), strict=True)], dtype=bool) & valid
    thrash = thrash if thrash.any() else None
    region = density_region(resident.reshape(rows, -1), faulted.reshape(rows, -1), npages,
                            thrashing=None if thrash is None else thrash.reshape(rows, -1),
                            threshold=engine.threshold).reshape(-1)
    cand = np.flatnonzero(region & ~resident & ~faulted)
    near, near_st = idx[cand], st[cand]
    pref = t.preferred[near]
    eligible = ((pref == NO_LOCATION) | (pref == processor)) & ((t.remote[near] & g) == 0)
    eligible &= ~(((t.accessed_by[near] & g) != 0) & (near_st != 0))
    if thrash is not None:
        eligible &= ~thrash[cand]
    cand = cand[eligible]
    empty = np.flatnonzero(~(st.reshape(rows, -1) != 0).any(axis=1))
    for e in empty.tolist():
        pref_e = t.preferred[idx.reshape(rows, -1)[e]]
        if (pref_e == processor).any():
            add = valid.reshape(rows, -1)[e] & (pref_e == processor) & ~faulted.reshape(rows, -1)[e]
            cand = np.union1d(cand, e * PAGES_PER_BLOCK + np.flatnonzero(add))
    return idx[cand]


@pytest.mark.parametrize("threshold", [1, 51, 90, 100])
def test_the_prefetcher_over_the_batch_blocks_matches_whole_bitmaps(threshold):
    from uvm_lab.backends.sim.thrashing import _Block

    rng = np.random.default_rng(threshold)
    b = SimBackend(device_memory="64MiB", bus=EventBus(), prefetch_threshold=threshold)
    ptrs = [b.allocate(size, MemoryKind.MANAGED) for size in (20 * MiB, 3 * MiB + 40960, 6 * MiB)]
    e, t = b._engine, b._table
    live = np.flatnonzero(np.repeat(t.block_pages > 0, 512) & (np.arange(len(t.state)) % 512 <
                                                                np.repeat(t.block_pages, 512)))
    assert len(ptrs) == 3 and len(live)
    for trial in range(60):
        density = rng.choice([0.0, 0.01, 0.1, 0.5, 0.9])
        t.state[live] = np.where(rng.random(len(live)) < density, rng.choice([1, 2, 3], len(live)), 0)
        t.state[live[rng.random(len(live)) < 0.3 * (trial % 2)]] = 1          # some blocks host-only
        for name, values, p in (("preferred", [-1, 0], 0.02), ("accessed_by", [1, 2], 0.02), ("remote", [1, 2], 0.02)):
            arr = getattr(t, name)
            arr[live] = np.where(rng.random(len(live)) < p * (trial % 3), rng.choice(values, len(live)),
                                 -2 if name == "preferred" else 0)
        e.thrashing.blocks.clear()
        for blk in rng.choice(np.unique(live >> 9), 3 * (trial % 2)).tolist():
            e.thrashing.blocks[blk] = _Block(thrashing=rng.random(512) < 0.05)
        for processor in (0, -1):
            g = 1 if processor == -1 else 2
            count = int(rng.choice([1, 5, 256, 600]))
            pages = np.unique(rng.choice(live, count))
            if rng.random() < 0.5:     # runs, as sweeps fault
                start = int(rng.choice(live))
                pages = live[(live >= start) & (live < start + count)]
            to_here = rng.random(len(pages)) < 0.9
            if not to_here.any():
                continue
            got = e._prefetch_pages(pages, to_here, processor, g)
            assert np.array_equal(got, _prefetch_reference(e, pages, to_here, processor, g)), trial


@pytest.mark.parametrize("threshold", [1, 30, 51, 99, 100])
def test_dense_subtrees_and_one_block_answers_are_the_density_region(threshold):
    from uvm_lab.backends.sim.prefetcher import block_prefetch, dense_subtrees, density_region

    rng = np.random.default_rng(threshold)
    for _ in range(60):
        rows = int(rng.integers(1, 20))
        npages = np.where(rng.random(rows) < 0.3, rng.integers(1, 512, rows), 512)
        valid = np.arange(512)[None, :] < npages[:, None]
        resident = (rng.random((rows, 512)) < rng.choice([0.0, 0.02, 0.3, 0.9])) & valid
        faulted = (rng.random((rows, 512)) < rng.choice([0.002, 0.02, 0.2])) & valid
        thrashing = (rng.random((rows, 512)) < 0.02) if rng.random() < 0.3 else None
        want = density_region(resident, faulted, npages, thrashing=thrashing, threshold=threshold)
        r, i = np.nonzero(faulted)
        lo, hi = dense_subtrees(resident, r, i, npages, thrashing=thrashing, threshold=threshold)
        got = np.zeros_like(want)
        for row, a, z in zip(r.tolist(), lo.tolist(), hi.tolist(), strict=True):
            got[row, a:z] = True
        assert np.array_equal(got, want)
        if thrashing is None:
            assert np.array_equal(block_prefetch(resident[0], faulted[0], int(npages[0]), threshold),
                                  np.flatnonzero(want[0] & ~resident[0] & ~faulted[0]))


def _run_batches(b: SimBackend) -> list:
    """Batches that are one run in one block: half blocks, a partial block, first touches, mixed flags, prefetches."""
    out = []
    odd = b.allocate(5 * MiB + 12288, MemoryKind.MANAGED)
    fresh = b.allocate(8 * MiB, MemoryKind.MANAGED)
    b.prefetch(odd, 5 * MiB + 12288, HOST)
    op = odd + np.arange((5 * MiB + 12288) // 4096, dtype=np.uint64) * 4096
    fp = fresh + np.arange(8 * MiB // 4096, dtype=np.uint64) * 4096
    rows = np.concatenate([op[r * 256:(r + 1) * 256] for r in (0, 2, 1, 4, 3, 5, 8, 9, 10, 6, 7)])
    writes = np.zeros(len(rows), dtype=bool)
    writes[300:400] = True
    writes[::5] = True
    out.append(b.access_stream([rows], GPU, [writes]))
    out.append(b.access_stream(fp[:1500], GPU, "write", in_flight=128))              # first touches
    out.append(b.access_stream(fp[::-1].copy(), GPU, "read", in_flight=100))
    out.append(b.access_stream(op, HOST, "read"))
    out.append(b.access_stream(op[::-1].copy(), GPU, "write"))
    out.append(b.access_stream(fp, GPU, "read"))
    return out


@pytest.mark.parametrize("backend", [{}, {"prefetch_threshold": 1}, {"prefetch_threshold": 30},
                                     {"prefetch_threshold": 100}, {"prefetcher": False}, {"thrashing": False},
                                     {"eviction": "lru"}, {"platform": "gh200-ats"}, {"device_memory": "4MiB"}])
def test_one_run_batches_give_the_same_trace_either_way(backend, monkeypatch):
    from uvm_lab.backends.sim.engine import FaultEngine

    taken = [0]
    original = FaultEngine._service_run

    def counting(self, *args):
        done = original(self, *args)
        taken[0] += bool(done)
        return done

    monkeypatch.setattr(FaultEngine, "_service_run", counting)
    args = {"device_memory": "12MiB", **backend}
    _assert_same(_run(True, _run_batches, ("fast_run_batches",), **args), _run(False, _run_batches, **args))
    assert taken[0] >= 8
