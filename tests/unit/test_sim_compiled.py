"""The simulator's compiled core (``_simcore``: ``_access.c``, ``_prefetch.c``, ``_eviction.c``, ``_records.c``,
``_service.c``, ``_run.c``) gives what its numpy and Python twins give (for a plain batch, ``FaultEngine._service``),
and runs give the same traces with it or without it."""

from __future__ import annotations

import numpy as np
import pytest

from uvm_lab import workloads as W
from uvm_lab.backends.sim import SimBackend, engine, prefetcher
from uvm_lab.backends.sim.compiled import COMPILED, core
from uvm_lab.backends.sim.eviction import GpuMemory
from uvm_lab.backends.sim.model import NO_LOCATION, EventLog, page_runs
from uvm_lab.backends.sim.platform import link_seconds
from uvm_lab.backends.sim.records import run_records
from uvm_lab.events.schema import AccessType, Advice, EventKind, MemoryKind
from uvm_lab.location import Location

from .sim_traces import assert_same, traced

pytestmark = pytest.mark.skipif(not COMPILED,
                                reason="the simulator's C parts were not compiled (no C compiler at build time)")

MiB = 1 << 20
PAGES = prefetcher.PAGES_PER_BLOCK
GPU, HOST = Location.device(0), Location.host()


def _engine(threshold: int):
    b = SimBackend(device_memory="64MiB", prefetch_threshold=threshold)
    return b, b._engine


def _batch(rng: np.random.Generator, nblocks: int, table_blocks: int, advice: bool | str):
    """A random batch: blocks of a table, partial blocks among them, residency of every density, faults, and
    (with ``advice``) preferred locations, remote mappings and AccessedBy here and there (with ``"some
    blocks"``, in a random half of the table's blocks only, so that blocks with none sit beside them)."""
    blocks = np.sort(rng.choice(table_blocks, nblocks, replace=False)).astype(np.int64)
    npages = np.where(rng.random(nblocks) < 0.2, rng.integers(1, PAGES, nblocks), PAGES).astype(np.int64)
    n = table_blocks * PAGES
    state = np.zeros(n, dtype=np.uint8)
    preferred = np.full(n, NO_LOCATION, dtype=np.int8)
    remote, accessed_by = np.zeros(n, dtype=np.uint8), np.zeros(n, dtype=np.uint8)
    if advice:
        preferred[rng.random(n) < 0.05] = rng.choice([-1, 0, 1])
        remote[rng.random(n) < 0.05] = 2
        accessed_by[rng.random(n) < 0.05] = rng.choice([2, 4, 6])
        if advice == "some blocks":
            clean = np.repeat(rng.random(table_blocks) < 0.5, PAGES)
            preferred[clean], remote[clean], accessed_by[clean] = NO_LOCATION, 0, 0
    rows, lanes = [], []
    for r, (b, k) in enumerate(zip(blocks.tolist(), npages.tolist(), strict=True)):
        held = rng.random(k) < rng.choice([0.0, 0.05, 0.3, 0.6, 0.95])
        state[b * PAGES:b * PAGES + k] = np.where(held, rng.choice([2, 3, 6], k), rng.choice([0, 1], k))
        if rng.random() < 0.1:
            state[b * PAGES:b * PAGES + k] = 0          # nothing resident anywhere
        m = int(rng.integers(1, min(k, 40) + 1))
        chosen = np.sort(rng.choice(k, m, replace=False))
        if rng.random() < 0.3:   # a run, as a sweep faults
            lo = int(rng.integers(0, k))
            chosen = np.arange(lo, min(k, lo + m))
        rows += [r] * len(chosen)
        lanes += chosen.tolist()
    return (state, preferred, remote, accessed_by), blocks, np.array(rows, dtype=np.int64), \
        np.array(lanes, dtype=np.int64), npages


@pytest.mark.parametrize("threshold", [1, 25, 51, 75, 100])
@pytest.mark.parametrize("thrashing", [False, True])
@pytest.mark.parametrize("advice", [False, True, "some blocks"])
def test_the_compiled_prefetch_is_the_numpy_one(threshold, thrashing, advice):
    rng = np.random.default_rng(threshold * 6 + thrashing * 3 + [False, True, "some blocks"].index(advice))
    b, engine = _engine(threshold)
    t = b._table
    for _ in range(60):
        nblocks = int(rng.integers(1, 12))
        arrays, blocks, rows, lanes, npages = _batch(rng, nblocks, 16, advice)
        thrash = None
        if thrashing:
            thrash = (rng.random((nblocks, PAGES)) < 0.02) & (np.arange(PAGES)[None, :] < npages[:, None])
        t.state, t.preferred, t.remote, t.accessed_by = arrays
        cand, numpy_empty = engine._numpy_region(blocks, rows, lanes, npages, 2, thrash)
        expected = engine._eligible(blocks, cand, 0, 2, thrash)
        out, empty = np.empty(nblocks * PAGES, dtype=np.int64), np.empty(nblocks, dtype=np.uint8)
        k = core.region(*arrays, blocks, rows, lanes, npages, 2, 0, threshold,
                                       None if thrash is None else thrash.view(np.uint8), out, empty)
        assert out[:k].tolist() == expected.tolist()
        assert np.flatnonzero(empty).tolist() == numpy_empty.tolist()


def _table(npages: int):
    return (np.ones(npages, dtype=np.uint8), np.full(npages, NO_LOCATION, dtype=np.int8),
            np.zeros(npages, dtype=np.uint8), np.zeros(npages, dtype=np.uint8))


@pytest.mark.parametrize("platform", ["x86-pcie5", "gh200-ats"])
def test_the_compiled_usable_is_the_numpy_one(platform):
    """Duplicates, ReadMostly pages written or not, AccessedBy and remote mappings; GPUs and the host; reads,
    writes and a mix."""
    rng = np.random.default_rng(8)
    b = SimBackend(device_memory="64MiB", platform=platform)
    t, engine = b._table, b._engine
    n = 8 * PAGES
    for _ in range(40):
        t.state = rng.choice([0, 1, 2, 3, 4, 6, 7], n).astype(np.uint8)
        t.read_mostly = rng.random(n) < 0.3
        t.writable = rng.choice([0, 1, 2, 4, 3], n).astype(np.uint8)
        t.accessed_by = np.where(rng.random(n) < 0.2, rng.choice([1, 2, 4], n), 0).astype(np.uint8)
        t.remote = np.where(rng.random(n) < 0.2, rng.choice([1, 2, 4], n), 0).astype(np.uint8)
        pages = rng.integers(0, n, 3000)
        for processor in (-1, 0, 1):
            for wr in (False, True, rng.random(len(pages)) < 0.5):
                engine.compiled = True
                got = engine._usable(pages, processor, wr)
                engine.compiled = False
                expected = engine._usable(pages, processor, wr)
                assert np.array_equal(got[0], expected[0]) and np.array_equal(got[1], expected[1])


def test_the_compiled_batch_pages_are_the_numpy_ones():
    """The batch's first distinct pages and where the next batch begins: sweeps in order, gathers with repeats,
    fewer distinct pages than the batch holds, exactly as many, and one more."""
    rng = np.random.default_rng(9)
    fault_engine = SimBackend(device_memory="64MiB")._engine
    for trial in range(600):
        size = int(rng.choice([1, 7, 256, 257, 300]))
        n = int(rng.integers(0, 1200))
        fp = np.sort(rng.choice(1 << 20, n, replace=False)) if trial % 3 == 0 else \
            rng.integers(0, int(rng.integers(1, 2000)), n)
        if trial % 3 == 1:   # a sweep that comes back: in order for a while, then not
            fp = np.concatenate((np.sort(fp[:n - n // 8]), fp[n - n // 8:]))
        bad = np.sort(rng.choice(4 * n + 1, n, replace=False))    # where in the window each fault lies
        fault_engine.compiled = True
        got = fault_engine._batch_pages(fp, bad, size, 4 * n + 1)
        fault_engine.compiled = False
        expected = fault_engine._batch_pages(fp, bad, size, 4 * n + 1)
        assert np.array_equal(got[0], expected[0]) and got[1] == expected[1], trial


def test_a_bad_batch_pages_call_raises():
    out = np.empty(256, dtype=np.int64)
    with pytest.raises(ValueError):     # no room for the batch
        core.batch_pages(np.arange(10), 300, out)
    with pytest.raises(ValueError):     # no batch
        core.batch_pages(np.arange(10), 0, out)
    with pytest.raises(TypeError):      # int32 where int64 is needed
        core.batch_pages(np.arange(10, dtype=np.int32), 256, out)
    with pytest.raises(TypeError):      # two arguments where three are needed
        core.batch_pages(np.arange(10), 256)


def test_the_prefetch_sequence_is_the_drivers():
    """R5's sequence, on the compiled path: faults at 0, 64K, 128K, 256K, 512K move 64K, 64K, 128K, 256K, 512K."""
    arrays = _table(PAGES)
    moved = []
    for kib in (0, 64, 128, 256, 512):
        lane = kib // 4
        out, empty = np.empty(PAGES, dtype=np.int64), np.empty(1, dtype=np.uint8)
        k = core.region(*arrays, np.zeros(1, np.int64), np.zeros(1, np.int64), np.array([lane]),
                                       np.array([PAGES]), 2, 0, 51, None, out, empty)
        moved.append((k + 1) * 4)
        arrays[0][out[:k]] = 2
        arrays[0][lane] = 2
    assert moved == [64, 64, 128, 256, 512]


def test_bad_arguments_raise_instead_of_reading_outside_the_table():
    out, empty = np.empty(PAGES, dtype=np.int64), np.empty(1, dtype=np.uint8)
    arrays = _table(PAGES)
    one, n = np.zeros(1, np.int64), np.array([PAGES])
    region = core.region
    with pytest.raises(IndexError):     # a block past the table
        region(*arrays, np.array([1]), one, one, n, 2, 0, 51, None, out, empty)
    with pytest.raises(IndexError):     # a lane past the block
        region(*arrays, one, one, np.array([PAGES]), n, 2, 0, 51, None, out, empty)
    with pytest.raises(ValueError):     # no room for the answer
        region(*arrays, one, one, one, n, 2, 0, 51, None, out[:10], empty)
    with pytest.raises(ValueError):     # arrays of another table
        region(arrays[0], arrays[1][:10], *arrays[2:], one, one, one, n, 2, 0, 51, None, out, empty)
    with pytest.raises(ValueError):     # two residency bits
        region(*arrays, one, one, one, n, 6, 0, 51, None, out, empty)
    with pytest.raises(TypeError):      # int32 where int64 is needed
        region(*arrays, one.astype(np.int32), one, one, n, 2, 0, 51, None, out, empty)


def test_the_compiled_eviction_clock_is_the_python_one():
    rng = np.random.default_rng(5)
    clock = core.clock_by_victim
    for _ in range(200):
        per_victim = rng.choice([0, 1, 2, 3, 4, 5, 9, 40], int(rng.integers(1, 30)))
        durations = rng.random(int(per_victim.sum())) * rng.choice([1e2, 1e5, 1e7])
        now, wait = float(rng.integers(0, 1 << 40)) + rng.random(), float(rng.random() * 3e4)
        begin, finish = np.empty(len(durations)), np.empty(len(durations))
        end = clock(per_victim, durations, now, wait, begin, finish)
        py_begin, py_finish, py_end = GpuMemory._clock_by_victim(per_victim.tolist(), durations.tolist(), now, wait)
        assert end == py_end                       # to the bit: the same additions in the same order
        assert begin.tolist() == py_begin
        assert finish.tolist() == py_finish


def test_the_compiled_eviction_scan_is_the_numpy_one():
    """Victims with partial blocks, empty ones, runs of every length and duplicates (which fall back)."""
    rng = np.random.default_rng(6)
    for _ in range(100):
        b = SimBackend(device_memory="64MiB")
        t, mem = b._table, b._memory
        t.state = rng.choice([0, 1, 2, 2, 2], 24 * PAGES).astype(np.uint8)
        if rng.random() < 0.3:
            t.state[rng.integers(0, 24 * PAGES, 3)] = 3     # a duplicate or three
        t.block_pages = np.where(rng.random(24) < 0.2, rng.integers(0, PAGES, 24), PAGES).astype(np.int16)
        victims = rng.permutation(24)[:int(rng.integers(1, 24))].astype(np.int64)
        npages = t.block_pages[victims].astype(np.int64)
        found = np.empty((3, len(victims) * PAGES // 2), dtype=np.int64)
        before = t.state.copy()
        k = core.victim_runs(t.state, victims, npages, 2, *found)
        st = np.where(np.arange(PAGES)[None, :] < npages[:, None], before.reshape(-1, PAGES)[victims], 0)
        if (((st & 2) != 0) & (st != 2)).any():
            assert k == -1 and np.array_equal(t.state, before)      # nothing changed
            continue
        flat = np.flatnonzero(st.reshape(-1) == 2)
        only = victims[flat >> 9] * PAGES + (flat & (PAGES - 1))
        starts, lengths = page_runs(only)
        assert found[0, :k].tolist() == starts.tolist()
        assert found[1, :k].tolist() == lengths.tolist()
        assert found[2, :k].tolist() == (flat[np.cumsum(lengths) - lengths] >> 9).tolist()
        expected = before.copy()
        expected[only] = 1
        assert np.array_equal(t.state, expected)
        del mem


def _records_of(log: EventLog) -> np.ndarray:
    return np.concatenate(list(log.pieces()))


def _records_by_numpy(t, pages, link, faulted, start):
    """What the engine's numpy code writes for ``pages``: page_runs, then EventLog.add_many."""
    log = EventLog(0)
    log.t = start
    starts, lengths = page_runs(pages, distinct=True)
    nbytes = lengths.astype(np.uint64) * 4096
    if link is not None:
        log.add_many(EventKind.HTOD, flags=2, src=-1, dst=0, address=t.addresses(starts), nbytes=nbytes,
                     alloc_id=t.block_alloc[starts >> 9], stream=7, seconds=link_seconds(nbytes, *link))
    else:
        value = lengths if faulted is None else np.add.reduceat(np.isin(pages, faulted).astype(np.int64),
                                                                 np.cumsum(lengths) - lengths)
        log.add_many(EventKind.GPU_PAGE_FAULT, flags=2, src=-1, dst=0, address=t.addresses(starts), nbytes=nbytes,
                     value=value, alloc_id=t.block_alloc[starts >> 9], stream=7)
    return _records_of(log), log.t


def test_the_compiled_records_are_the_numpy_ones():
    """Runs of every length, cut at blocks; four records or fewer (one after another) and more (a running sum)."""
    rng = np.random.default_rng(7)
    b = SimBackend(device_memory="64MiB")
    t = b._table
    t.block_address = (np.arange(8, dtype=np.uint64) + 100) << np.uint64(21)
    t.block_alloc = rng.integers(1, 5, 8).astype(np.uint64)
    for _ in range(300):
        n = int(rng.choice([1, 2, 3, 5, 40, 600]))
        pages = np.unique(rng.integers(0, 8 * PAGES, n))
        if rng.random() < 0.5:      # long runs
            pages = np.unique(np.concatenate([np.arange(a, a + int(rng.integers(1, 700)))
                                              for a in rng.integers(0, 7 * PAGES, 3)]))
            pages = pages[pages < 8 * PAGES]
        link = (float(rng.choice([12e9, 50e9])), float(rng.choice([0.07292, 0.3]))) if rng.random() < 0.5 else None
        faulted = None if rng.random() < 0.5 else np.sort(rng.choice(pages, max(1, len(pages) // 2), replace=False))
        start = float(rng.integers(0, 1 << 40)) + rng.random()
        expected, expected_t = _records_by_numpy(t, pages, link, faulted, start)
        log = EventLog(0)
        log.t = start
        run_records(log, t, pages, EventKind.HTOD if link else EventKind.GPU_PAGE_FAULT, 2, -1, 0, 7, link, faulted)
        assert log.t == expected_t
        assert _records_of(log).tobytes() == expected.tobytes()


def test_a_bad_records_call_raises():
    t = SimBackend(device_memory="64MiB")._table
    t.block_address, t.block_alloc = np.zeros(2, np.uint64), np.zeros(2, np.uint64)
    log = EventLog(0)
    with pytest.raises(ValueError):    # not sorted
        run_records(log, t, np.array([5, 3]), EventKind.HTOD, 0, -1, 0, 0, (1e9, 0.07))
    with pytest.raises(ValueError):    # outside the table
        run_records(log, t, np.array([3, 2 * PAGES]), EventKind.HTOD, 0, -1, 0, 0, (1e9, 0.07))
    with pytest.raises(ValueError):    # a kind no record has
        run_records(log, t, np.array([3]), 300, 0, -1, 0, 0, (1e9, 0.07))
    assert len(log) == 0 and log.t == 0.0


def test_a_bad_eviction_clock_call_raises():
    begin = finish = np.empty(3)
    with pytest.raises(ValueError):    # five copies claimed, three given
        core.clock_by_victim(np.array([5]), np.ones(3), 0.0, 1.0, begin, finish)
    with pytest.raises(ValueError):    # copies left over
        core.clock_by_victim(np.array([1]), np.ones(3), 0.0, 1.0, begin, finish)
    with pytest.raises(ValueError):    # no room for the answer
        core.clock_by_victim(np.array([3]), np.ones(3), 0.0, 1.0, begin[:2], finish)
    with pytest.raises(TypeError):     # float32 durations
        core.clock_by_victim(np.array([3]), np.ones(3, np.float32), 0.0, 1.0, begin, finish)


def _both(script, **backend) -> None:
    """``script`` gives the same records, clock, state, stats and thrashing detector's notes with the compiled
    parts and without them."""
    runs, notes = [], []
    for compiled in (True, False):
        def switched(b, compiled=compiled):
            assert hasattr(b._engine, "compiled") and hasattr(b._memory, "compiled")
            b._engine.compiled = compiled
            b._memory.compiled = compiled
            out = script(b)
            thr = b._engine.thrashing
            notes.append((thr._touch.items(), len(thr._touch), sorted(thr.blocks)))
            return out
        runs.append(traced(switched, **backend))
    assert_same(*runs)
    assert notes[0] == notes[1]


@pytest.mark.parametrize("ratio", [0.5, 1.5])
@pytest.mark.parametrize("name", list(W.WORKLOADS))
def test_workloads_give_the_same_trace_either_way(name, ratio):
    for policy in W.POLICIES:
        w = W.make(name, size="16MiB")
        device = max(2 * MiB, int(w.total_bytes / ratio) // (2 * MiB) * (2 * MiB))
        _both(lambda b, w=w, policy=policy: W.run_sim(w, b, policy=policy, prefetch_chunk="4MiB"),
              device_memory=device)


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


@pytest.mark.parametrize("backend", [{}, {"prefetch_threshold": 90}, {"device_memory": "4MiB"},
                                     {"platform": "gh200-ats"}])
def test_advice_thrashing_and_host_turns_give_the_same_trace_either_way(backend):
    _both(_ping_pong, **backend)


def _pages(ptr: int, size: int, step: int = 4096) -> np.ndarray:
    return ptr + np.arange(0, size, step, dtype=np.uint64)


def _sweeps(b: SimBackend) -> list:
    """Whole blocks in order, half a block a batch: oversubscribed and fitting, a partial last block, writes, a
    host round trip, a part already resident, write flags that change along the stream, ReadMostly blocks."""
    out = []
    big, odd = b.allocate(40 * MiB, MemoryKind.MANAGED), b.allocate(5 * MiB + 12288, MemoryKind.MANAGED)
    b.prefetch(big, 40 * MiB, HOST)
    b.prefetch(odd, 5 * MiB + 12288, HOST)
    pages = _pages(big, 40 * MiB)
    for mode in ("read", "read", "write"):
        out.append(b.access_stream(pages, GPU, mode))
    out.append(b.access_stream(_pages(odd, 5 * MiB + 12288), GPU, "read"))
    out.append(b.access_stream(pages[:2048], HOST, "read"))
    b.prefetch(big + 8 * MiB, 4 * MiB, GPU)
    out.append(b.access_stream(pages[::-1].copy(), GPU, "read"))
    writes = np.zeros(len(pages), dtype=bool)
    writes[3000:7000] = True
    out.append(b.access_stream([pages], GPU, [writes]))
    b.advise(big, 4 * MiB, Advice.SET_READ_MOSTLY, None)
    out.append(b.access_stream(pages, GPU, "read"))
    return out


def _rows(b: SimBackend) -> list:
    """A stencil's rows over two buffers, half a block each with hits between them: evicting victims used again,
    first touches, a batch that mixes reads and writes, thrashing state, half blocks split between host and
    GPU, advice on some blocks, rows out of order."""
    half = 256
    out = []
    src, dst = b.allocate(24 * MiB, MemoryKind.MANAGED), b.allocate(12 * MiB, MemoryKind.MANAGED)
    fresh = b.allocate(8 * MiB, MemoryKind.MANAGED)
    b.prefetch(src, 24 * MiB, HOST)
    b.prefetch(dst, 12 * MiB, HOST)
    sp, dp, fp = _pages(src, 24 * MiB), _pages(dst, 12 * MiB), _pages(fresh, 8 * MiB)

    def stencil(rows: range, out_pages: np.ndarray, flip: int | None = None):
        parts, flags = [], []
        last = len(sp) // half - 1
        for r in rows:
            parts.append(sp[max(r - 1, 0) * half:(min(r + 1, last) + 1) * half])
            flags.append(np.zeros(len(parts[-1]), dtype=bool))
            o = r % (len(out_pages) // half)
            parts.append(out_pages[o * half:(o + 1) * half])
            flags.append(np.ones(half, dtype=bool))
        w = np.concatenate(flags)
        if flip is not None:      # one read inside a written half block: that batch mixes reads and writes
            w[flip] = not w[flip]
        return b.access_stream([np.concatenate(parts)], GPU, [w])

    out.append(stencil(range(48), dp))
    out.append(stencil(range(47, -1, -1), dp))
    out.append(stencil(range(0, 48, 2), fp, flip=2 * half + 2 * (4 * half) + 3 * half + 17))
    out.append(b.access_stream(np.concatenate((sp[half:2 * half], sp[8 * half:10 * half])), GPU, "read"))
    out.append(b.access_stream(sp[:4 * half], HOST, "write"))
    out.append(stencil(range(16), dp))
    out.append(b.access_stream(dp[:8 * half], HOST, "read"))
    b.prefetch(src, 24 * MiB, HOST)
    b.prefetch(src + 6 * MiB + 40960, 100 * 4096, GPU)
    out.append(stencil(range(48), dp))
    b.advise(src + 4 * MiB, 2 * MiB, Advice.SET_READ_MOSTLY, None)
    b.advise(dst, 2 * MiB, Advice.SET_PREFERRED_LOCATION, HOST)
    b.prefetch(src, 24 * MiB, HOST)
    out.append(stencil(range(48), dp))
    out.append(b.access_stream([sp[::-1].copy()], GPU, "read"))
    return out


def _scatters(b: SimBackend) -> list:
    """Sparse GPU batches: strides, blocks in a shuffled order, hits between batches, first touches, a gather,
    write flags that change along the stream, advice on some blocks and thrashing state."""
    out = []
    rng = np.random.default_rng(7)
    big, odd = b.allocate(40 * MiB, MemoryKind.MANAGED), b.allocate(5 * MiB + 12288, MemoryKind.MANAGED)
    fresh = b.allocate(8 * MiB, MemoryKind.MANAGED)
    b.prefetch(big, 40 * MiB, HOST)
    b.prefetch(odd, 5 * MiB + 12288, HOST)
    out.append(b.access_stream(_pages(big, 40 * MiB, 64 << 10), GPU, "read"))
    b.prefetch(big, 40 * MiB, HOST)
    out.append(b.access_stream(_pages(big, 40 * MiB, 80 << 10), GPU, "write"))
    b.prefetch(big, 40 * MiB, HOST)
    out.append(b.access_stream(big + rng.permutation(20).astype(np.uint64) * (2 * MiB) + 12288, GPU, "read"))
    b.prefetch(big, 40 * MiB, HOST)
    sparse = _pages(big, 40 * MiB, 32 << 10)
    again = np.concatenate([np.concatenate((sparse[i:i + 300], sparse[i:i + 300], sparse[max(0, i - 5000):i]))
                            for i in range(0, len(sparse), 300)])
    out.append(b.access_stream(again, GPU, "read"))
    out.append(b.access_stream(_pages(odd, 5 * MiB + 12288, 16 << 10), GPU, "read"))
    out.append(b.access_stream(_pages(fresh, 8 * MiB, 48 << 10), GPU, "write"))
    b.prefetch(big, 40 * MiB, HOST)
    out.append(b.access_stream(big + rng.integers(0, 40 * MiB // 4096, 6000).astype(np.uint64) * 4096, GPU, "read"))
    b.prefetch(big, 40 * MiB, HOST)
    pages = _pages(big, 40 * MiB, 64 << 10)
    out.append(b.access_stream([pages], GPU, [(np.arange(len(pages)) // 200) % 2 == 1]))
    b.prefetch(big, 40 * MiB, HOST)
    b.advise(big + 4 * MiB, 2 * MiB, Advice.SET_READ_MOSTLY, None)
    b.advise(big + 10 * MiB, 2 * MiB, Advice.SET_ACCESSED_BY, GPU)
    b.advise(big + 16 * MiB, 2 * MiB, Advice.SET_PREFERRED_LOCATION, HOST)
    out.append(b.access_stream(pages, GPU, "read"))
    out.append(b.access_stream(pages, HOST, "write"))
    out.append(b.access_stream(pages, GPU, "read"))
    return out


def _run_batches(b: SimBackend) -> list:
    """Batches that are one run in one block: half blocks, a partial block, first touches, mixed flags, fewer
    accesses in flight than a batch holds."""
    out = []
    odd, fresh = b.allocate(5 * MiB + 12288, MemoryKind.MANAGED), b.allocate(8 * MiB, MemoryKind.MANAGED)
    b.prefetch(odd, 5 * MiB + 12288, HOST)
    op, fp = _pages(odd, 5 * MiB + 12288), _pages(fresh, 8 * MiB)
    rows = np.concatenate([op[r * 256:(r + 1) * 256] for r in (0, 2, 1, 4, 3, 5, 8, 9, 10, 6, 7)])
    writes = np.zeros(len(rows), dtype=bool)
    writes[300:400] = True
    writes[::5] = True
    out.append(b.access_stream([rows], GPU, [writes]))
    out.append(b.access_stream(fp[:1500], GPU, "write", in_flight=128))
    out.append(b.access_stream(fp[::-1].copy(), GPU, "read", in_flight=100))
    out.append(b.access_stream(op, HOST, "read"))
    out.append(b.access_stream(op[::-1].copy(), GPU, "write"))
    out.append(b.access_stream(fp, GPU, "read"))
    return out


@pytest.mark.parametrize("backend", [{}, {"thrashing": False}, {"prefetcher": False}, {"prefetch_threshold": 1},
                                     {"prefetch_threshold": 100}, {"device_memory": "4MiB"},
                                     {"device_memory": "64MiB"}, {"eviction": "lru"}, {"platform": "gh200-ats"}])
@pytest.mark.parametrize("script", [_sweeps, _rows, _scatters, _run_batches])
def test_sweeps_rows_scatters_and_one_run_batches_give_the_same_trace_either_way(script, backend):
    _both(script, **{"device_memory": "16MiB", **backend})


def _gathers(b: SimBackend, read_mostly: bool = False) -> list:
    """Random GPU reads and writes over three buffers (one with a partial last block), some of them first
    touches; halfway, the first buffer goes back to the host. The host's moves are long enough ago that the
    thrashing detector stays out of it. With ``read_mostly``, a fourth buffer is read-duplicated on the GPU
    first, so that victims hold duplicates."""
    rng = np.random.default_rng(11)
    sizes = (96 * MiB, 64 * MiB + 5 * 4096, 40 * MiB)
    ptrs = [b.allocate(size, MemoryKind.MANAGED) for size in sizes]
    pages = np.concatenate([p + np.arange(n // 4096, dtype=np.uint64) * 4096
                            for p, n in zip(ptrs, sizes, strict=True)])
    out = []
    if read_mostly:
        dup = b.allocate(32 * MiB, MemoryKind.MANAGED)
        b.prefetch(dup, 32 * MiB, HOST)
        b.advise(dup, 32 * MiB, Advice.SET_READ_MOSTLY, None)
        out.append(b.access_stream(dup + np.arange(0, 32 * MiB, 4096, dtype=np.uint64), GPU, "read"))
    for i in range(80):
        if i in (0, 40):
            b.prefetch(ptrs[0], sizes[0], HOST)
            b._now += 10_000_000   # 10 ms on: past the thrashing detector's lapse
        picks = rng.choice(pages, int(rng.integers(50, 500)))
        wr = rng.random(len(picks)) < 0.3
        out.append(b.access_stream(picks, GPU, (False, wr, True)[i % 3]))
    return out


@pytest.mark.parametrize("read_mostly", [False, True])
@pytest.mark.parametrize("backend", [{"device_memory": "1GiB"}, {"device_memory": "128MiB"},
                                     {"device_memory": "160MiB"}, {"device_memory": "128MiB", "thrashing": False},
                                     {"device_memory": "128MiB", "prefetcher": False},
                                     {"device_memory": "128MiB", "prefetch_threshold": 90}])
def test_compiled_plain_batches_give_the_same_trace(backend, read_mostly, monkeypatch):
    """Oversubscribed (evicting FIFO's head, duplicates among the victims or not) or not, with the detector off,
    the prefetcher off or stricter; batch by batch from the Python loop, or in runs by the compiled loop."""
    taken = {"batch by batch": 0, "in runs": 0}
    plain, run = engine.FaultEngine._compiled_plain, engine.FaultEngine._plain_run

    def counted(self, *args):
        done = plain(self, *args)
        taken["batch by batch"] += done
        return done

    def counted_run(self, pages, pos, write, processor, log, stats, **kwargs):
        before = stats.batches
        out = run(self, pages, pos, write, processor, log, stats, **kwargs)
        taken["in runs"] += stats.batches - before
        return out

    monkeypatch.setattr(engine.FaultEngine, "_compiled_plain", counted)
    monkeypatch.setattr(engine.FaultEngine, "_plain_run", counted_run)
    _both(lambda b: _gathers(b, read_mostly), **backend)
    # Batches that need more chunks than the GPU has go to the general path; the rest are the compiled one's:
    # in runs, the plain batches of streams with one write flag (two of three) until one is not plain (the
    # Python loop takes that one, and the compiled loop again after a plain one); the others' batch by batch.
    assert taken["in runs"] >= 5 and taken["batch by batch"] >= 5, taken


def test_batches_that_overflow_the_logs_tail_give_the_same_trace(monkeypatch):
    """A batch writes its records straight into the log's tail where they fit, and hands them back as
    bytes where not: with small tails both happen, and the trace is the numpy code's."""
    monkeypatch.setattr(EventLog, "TAIL", 300)
    ways = {"into the tail": 0, "as bytes": 0}
    grow, put = EventLog.grow, EventLog.put

    def counted_grow(self, count):
        ways["into the tail"] += count > 0
        return grow(self, count)

    def counted_put(self, records):
        ways["as bytes"] += 1
        return put(self, records)

    monkeypatch.setattr(EventLog, "grow", counted_grow)
    monkeypatch.setattr(EventLog, "put", counted_put)
    _both(lambda b: _gathers(b, True), device_memory="128MiB")
    # put() grows the tail too: the batches written straight into it are the rest.
    assert ways["into the tail"] - ways["as bytes"] >= 5 and ways["as bytes"] >= 5, ways


def test_a_strided_read_goes_through_the_compiled_loop_whole(monkeypatch):
    """With the compiled core, every batch of a strided read is a plain one, serviced in one run of the compiled
    loop: none goes to the general path."""
    calls = {"_service": 0, "_compiled_plain": 0, "_plain_run": 0}
    for name in calls:
        original = getattr(engine.FaultEngine, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            done = _original(self, *args, **kwargs)
            calls[_name] += done[0] > args[1] if _name == "_plain_run" else 1 if _name == "_service" else bool(done)
            return done

        monkeypatch.setattr(engine.FaultEngine, name, counted)
    W.run_sim(W.make("strided", size="64MiB"), SimBackend(device_memory="128MiB"))
    assert calls == {"_service": 0, "_compiled_plain": 0, "_plain_run": 1}


def test_a_bad_plain_run_call_raises_and_changes_nothing():
    """The compiled loop checks what it is given before it reads the table by it, and changes nothing then."""
    b = SimBackend(device_memory="64MiB")
    b.allocate(8 * MiB, MemoryKind.MANAGED)
    e, t = b._engine, b._engine.table
    log = EventLog(0)
    args = e._plain_arguments(0, log, AccessType.READ, 0)
    state, clock = t.state.copy(), args[17].copy()

    def call(pages, write=False, pos=0, tally=8, extra=()):
        args[10], args[11] = np.asarray(pages, dtype=np.int64), write
        return core.run_plain(*args, t.writable, pos, 256, 256, 1024, 1 << 16, np.zeros(4), 4096,
                              np.zeros(tally, dtype=np.int64), *extra)

    # A page past the table, in the first batch: the loop stops before it, where the Python loop raises.
    assert call([0, 1, 2, len(t.state) + 5]) == (0, 1024, None)
    with pytest.raises(IndexError):
        e._usable(np.array([len(t.state) + 5]), 0, False)
    with pytest.raises(TypeError):      # one flag for all, not an array
        call([0, 1], write=np.zeros(2, dtype=bool))
    with pytest.raises(ValueError):     # a position past the stream
        call([0, 1], pos=3)
    with pytest.raises(ValueError):     # a tally of the wrong length
        call([0, 1], tally=7)
    with pytest.raises(TypeError):      # one argument too many
        call([0, 1], extra=(0,))
    assert (t.state == state).all() and (args[17] == clock).all() and not len(log)
    # The same call, well formed, services the batch.
    pos, _, pending = call([0, 1, 2, 700])
    assert pos == 4 and pending is None and (t.state[[0, 1, 2, 700]] == 2).all()
