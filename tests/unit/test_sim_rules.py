"""The simulator against the UVM driver's documented rules (research/uvm-semantics.md, R1-R11)."""

from __future__ import annotations

import numpy as np
import pytest

from uvm_lab.backends.sim import PLATFORMS, SimBackend
from uvm_lab.backends.sim.model import NO_LOCATION
from uvm_lab.backends.sim.platform import get_platform, link_seconds
from uvm_lab.backends.sim.prefetcher import density_region
from uvm_lab.errors import InvalidArgumentError
from uvm_lab.events import EventBus, EventKind, MigrationCause, RemoteMapCause
from uvm_lab.events.schema import Advice, MemoryKind
from uvm_lab.location import HOST_ID, Location
from uvm_lab.units import BLOCK_SIZE, PAGE_SIZE

KiB, MiB = 1 << 10, 1 << 20
GPU, HOST = Location.device(0), Location.host()


class Recorder:
    def __init__(self, bus: EventBus) -> None:
        self.bus = bus
        self.chunks: list[np.ndarray] = []
        bus.subscribe(self.chunks.append)

    def take(self) -> np.ndarray:
        self.bus.flush()   # what waits for this subscriber is delivered first
        out = np.concatenate(self.chunks) if self.chunks else np.zeros(0)
        self.chunks.clear()
        return out


def backend(memory: str = "64MiB", **kw: object) -> tuple[SimBackend, Recorder]:
    bus = EventBus()
    return SimBackend(memory, bus=bus, **kw), Recorder(bus)


def of(ev: np.ndarray, kind: EventKind, cause: int | None = None) -> np.ndarray:
    sel = ev[ev["kind"] == kind]
    return sel if cause is None else sel[sel["flags"] == cause]


# -- R5: the density prefetcher ---------------------------------------------------------------------------
def test_r5_one_thread_in_order_moves_64k_64k_128k_256k_512k_1m():
    """R5, observed on hardware: sequential faults at 0, 64K, 128K, 256K, 512K, 1M of a host-resident block."""
    b, rec = backend()
    ptr = b.allocate(BLOCK_SIZE, MemoryKind.MANAGED)
    b.prefetch(ptr, BLOCK_SIZE, HOST)
    rec.take()
    moved = []
    for off in (0, 64 * KiB, 128 * KiB, 256 * KiB, 512 * KiB, 1 * MiB):
        r = b.access_stream(np.array([ptr + off], dtype=np.uint64), GPU, "read", in_flight=1)
        assert r.faults == 1
        moved.append(r.bytes_htod // KiB)
    assert moved == [64, 64, 128, 256, 512, 1024]
    ev = rec.take()
    # The faulted 4 KiB page comes with cause COHERENCE, the rest of each region as the driver's PREFETCH.
    assert int(of(ev, EventKind.HTOD, MigrationCause.COHERENCE)["bytes"].sum()) == 6 * PAGE_SIZE
    assert int(of(ev, EventKind.HTOD, MigrationCause.PREFETCH)["bytes"].sum()) == BLOCK_SIZE - 6 * PAGE_SIZE


def test_r5_threshold_is_strictly_more_than_51_percent():
    """count*100 > 51*size: half a subtree (50%) is not enough, 53% is."""
    resident = np.zeros(512, dtype=bool)
    resident[:240] = True
    faulted = np.zeros(512, dtype=bool)
    faulted[240] = True                      # 256 of 512 set after big-page growth: exactly 50%
    assert not density_region(resident, faulted)[256:].any()
    faulted[256] = True                      # 272 of 512: the whole block
    assert density_region(resident, faulted).all()


def test_r5_region_never_crosses_the_2mib_block():
    resident = np.zeros((2, 512), dtype=bool)
    faulted = np.zeros((2, 512), dtype=bool)
    resident[0, :500] = True
    faulted[0, 511] = True
    region = density_region(resident, faulted)
    assert region[0].all() and not region[1].any()


def test_r5_thrashing_pages_do_not_grow_to_big_pages():
    faulted = np.zeros(512, dtype=bool)
    faulted[0] = True
    thrash = np.zeros(512, dtype=bool)
    thrash[5] = True
    region = density_region(np.zeros(512, dtype=bool), faulted, thrashing=thrash)
    assert region[0] and region.sum() == 1


def test_r5_partial_last_block_counts_only_its_pages():
    """The last block of a 2 MiB + 64 KiB allocation has 16 pages: one fault there fills it (16/16)."""
    b, _ = backend()
    size = BLOCK_SIZE + 64 * KiB
    ptr = b.allocate(size, MemoryKind.MANAGED)
    b.prefetch(ptr, size, HOST)
    r = b.access_stream(np.array([ptr + BLOCK_SIZE], dtype=np.uint64), GPU, "read", in_flight=1)
    assert r.bytes_htod == 64 * KiB


def test_prefetcher_off_moves_only_the_faulted_page():
    b, _ = backend(prefetcher=False)
    ptr = b.allocate(BLOCK_SIZE, MemoryKind.MANAGED)
    b.prefetch(ptr, BLOCK_SIZE, HOST)
    r = b.access_stream(np.array([ptr], dtype=np.uint64), GPU, "read", in_flight=1)
    assert r.bytes_htod == PAGE_SIZE


def _dense_region(resident, faulted, npages, thrashing, threshold):
    """R5 evaluated on every subtree of every block: the definition the prefetcher's walk from the faults must match."""
    from uvm_lab.backends.sim.prefetcher import PAGES_PER_BLOCK

    rows = faulted.shape[0]
    valid = np.arange(PAGES_PER_BLOCK)[None, :] < npages[:, None]
    faulted = faulted & valid
    # Every 64 KiB big page holding a fault, filled, unless one of its pages is thrashing.
    big = faulted.reshape(rows, -1, 16).any(axis=2)
    if thrashing is not None:
        big &= ~thrashing.reshape(rows, -1, 16).any(axis=2)
    bitmap = (resident | faulted | np.repeat(big, 16, axis=1)) & valid
    region = np.zeros_like(faulted)
    s = 1
    while s <= PAGES_PER_BLOCK:
        count = bitmap.reshape(rows, -1, s).sum(axis=2)
        has_fault = faulted.reshape(rows, -1, s).any(axis=2)
        size = np.clip(npages[:, None] - np.arange(0, PAGES_PER_BLOCK, s)[None, :], 0, s)
        region |= np.repeat(has_fault & (count * 100 > threshold * size), s, axis=1)
        s *= 2
    return region & valid


@pytest.mark.parametrize("threshold", [1, 51, 75, 100])
def test_the_prefetcher_walk_from_the_faults_takes_every_dense_subtree(threshold):
    rng = np.random.default_rng(threshold)
    for density in (0.002, 0.02, 0.2, 0.6):
        rows = 40
        resident = rng.random((rows, 512)) < density
        faulted = (rng.random((rows, 512)) < density / 2) & ~resident
        npages = np.where(rng.random(rows) < 0.3, rng.integers(1, 512, rows), 512)
        thrashing = rng.random((rows, 512)) < 0.01
        for th in (None, thrashing):
            got = density_region(resident, faulted, npages, thrashing=th, threshold=threshold)
            assert np.array_equal(got, _dense_region(resident, faulted, npages, th, threshold))


def _prefetch_reference(engine, pages: np.ndarray, to_here: np.ndarray, processor: int, g: int) -> np.ndarray:
    """R5 over whole bitmaps with :func:`density_region`: what the engine's sparse walk must return."""
    from uvm_lab.backends.sim.model import BLOCK_SHIFT, PAGES_PER_BLOCK

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
        e.thrashing.clear()
        for blk in rng.choice(np.unique(live >> 9), 3 * (trial % 2)).tolist():
            e.thrashing.set_thrashing(blk, rng.random(512) < 0.05)
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
            got = e.prefetch_pages(pages, to_here, processor)
            assert np.array_equal(got, _prefetch_reference(e, pages, to_here, processor, g)), trial


# -- R4: fault batching ---------------------------------------------------------------------------------------
def test_r4_batches_hold_at_most_256_distinct_faults_and_duplicates_merge():
    b, rec = backend()
    ptr = b.allocate(8 * MiB, MemoryKind.MANAGED)
    b.prefetch(ptr, 8 * MiB, HOST)
    rec.take()
    pages = np.arange(600, dtype=np.uint64)
    addrs = ptr + np.repeat(pages, 3) * PAGE_SIZE          # every page three times: merged in the batch
    r = b.access_stream(addrs, GPU, "read", in_flight=3 * 600, warps=None)
    assert r.faults <= 600
    # The first batch took exactly 256 pages (1 MiB) and the prefetcher stopped at 50% of the block.
    first_batch = rec.take()
    faults = of(first_batch, EventKind.GPU_PAGE_FAULT)
    assert int(faults["value"][0]) == 256


def test_r4_one_round_trip_per_batch_not_per_fault():
    """512 touches on distinct blocks at once cost far less than 512 serial round trips (H200: 9.0 ms vs 20 us each)."""
    b, _ = backend("2GiB")
    ptr = b.allocate(1 << 30, MemoryKind.MANAGED)
    addrs = ptr + np.arange(512, dtype=np.uint64) * BLOCK_SIZE
    together = b.access_stream(addrs, GPU, "write", in_flight=512)
    b2, _ = backend("2GiB")
    ptr2 = b2.allocate(1 << 30, MemoryKind.MANAGED)
    alone = b2.access_stream(ptr2 + np.arange(512, dtype=np.uint64) * BLOCK_SIZE, GPU, "write", in_flight=1)
    assert together.faults == alone.faults == 512
    assert together.seconds < alone.seconds


# -- R1/R2: granularities, first touch ------------------------------------------------------------------------
def test_r1_one_touched_page_allocates_a_whole_2mib_chunk():
    b, _ = backend()
    ptr = b.allocate(8 * MiB, MemoryKind.MANAGED)
    free0, _ = b.mem_info()
    b.access_stream(np.array([ptr + 5 * PAGE_SIZE], dtype=np.uint64), GPU, "read")
    assert free0 - b.mem_info()[0] == BLOCK_SIZE


def test_r2_first_touch_zero_fills_at_the_preferred_location_without_transfer():
    b, rec = backend()
    ptr = b.allocate(2 * MiB, MemoryKind.MANAGED)
    b.advise(ptr, 2 * MiB, Advice.SET_PREFERRED_LOCATION, HOST)
    rec.take()
    r = b.access(ptr, 2 * MiB, GPU, "read")
    assert r.bytes_htod == 0 and r.bytes_dtoh == 0
    assert (b.page_states(ptr, 2 * MiB) == 1).all()                 # populated on the host, mapped remotely
    assert len(of(rec.take(), EventKind.REMOTE_MAP, RemoteMapCause.POLICY))


# -- R3: the truth table -----------------------------------------------------------------------------------
# (advice, where the page is, who faults, read/write) -> where the page ends up, what moved, remote or not.
R3_TABLE = [
    # (a) ReadMostly: a read copies, a write collapses to the writer.
    ("read_mostly", "host", "gpu", "read", 3, "htod", False),
    ("read_mostly", "host", "gpu", "write", 2, "htod", False),
    ("read_mostly", "gpu", "host", "read", 3, "dtoh", False),
    # (b) the faulting processor is the preferred location: migrate to it.
    ("prefer_gpu", "host", "gpu", "read", 2, "htod", False),
    ("prefer_host", "gpu", "host", "read", 1, "dtoh", False),
    # (d) resident nowhere: the preferred location if reachable, else the faulter (R2).
    ("prefer_host", "nowhere", "gpu", "read", 1, None, True),
    ("prefer_gpu", "nowhere", "host", "write", 1, None, False),     # x86: the CPU cannot reach vidmem
    ("none", "nowhere", "gpu", "write", 2, None, False),
    # (e) AccessedBy the faulter: map remotely, no migration (the GPU does not even fault on host pages).
    ("accessed_by_gpu", "host", "gpu", "read", 1, None, True),
    ("accessed_by_host", "gpu", "host", "read", 1, "dtoh", False),  # x86: the CPU cannot map GPU memory
    # (f) preferred location elsewhere but reachable: map remotely.
    ("prefer_host", "host", "gpu", "read", 1, None, True),
    # (f) does not apply to the CPU on x86: a host access always migrates, even to GPU-preferred data.
    ("prefer_gpu", "gpu", "host", "read", 1, "dtoh", False),
    # (g) otherwise migrate to the faulter.
    ("none", "host", "gpu", "read", 2, "htod", False),
    ("none", "gpu", "host", "write", 1, "dtoh", False),
]


@pytest.mark.parametrize("advice,start,who,mode,final,moved,remote", R3_TABLE)
def test_r3_truth_table(advice, start, who, mode, final, moved, remote):
    b, rec = backend()
    ptr = b.allocate(BLOCK_SIZE, MemoryKind.MANAGED)
    if start != "nowhere":
        b.prefetch(ptr, BLOCK_SIZE, GPU if start == "gpu" else HOST)
    settings = {"read_mostly": (Advice.SET_READ_MOSTLY, None), "prefer_gpu": (Advice.SET_PREFERRED_LOCATION, GPU),
                "prefer_host": (Advice.SET_PREFERRED_LOCATION, HOST),
                "accessed_by_gpu": (Advice.SET_ACCESSED_BY, GPU), "accessed_by_host": (Advice.SET_ACCESSED_BY, HOST)}
    if advice in settings:
        b.advise(ptr, BLOCK_SIZE, *settings[advice])
    rec.take()
    processor = GPU if who == "gpu" else HOST
    r = b.access_stream(np.array([ptr], dtype=np.uint64), processor, mode, in_flight=1)
    assert b.page_states(ptr, PAGE_SIZE)[0] == final
    assert (r.bytes_htod > 0) == (moved == "htod") and (r.bytes_dtoh > 0) == (moved == "dtoh")
    assert (r.bytes_remote > 0) == remote


@pytest.mark.parametrize("read_first", [True, False])
def test_r3a_a_gpu_write_collapses_read_mostly_pages_one_by_one(read_first):
    """R3 (a): a write collapses a ReadMostly page to one copy on the writer, the other copies invalidated.

    The driver services those writes page by page (a 1 GiB ReadMostly output took 55-60 s on the H200), so
    each page the write takes costs ``read_mostly_write_latency`` on top of the batch; plain pages do not.
    """
    n = BLOCK_SIZE // PAGE_SIZE
    spent = {}
    for latency in (100e-6, 300e-6):
        b, rec = backend(platform=PLATFORMS["x86-pcie5"].with_(read_mostly_write_latency=latency))
        ptr = b.allocate(BLOCK_SIZE, MemoryKind.MANAGED)
        plain = b.allocate(BLOCK_SIZE, MemoryKind.MANAGED)
        for q in (ptr, plain):
            b.prefetch(q, BLOCK_SIZE, HOST)
        b.advise(ptr, BLOCK_SIZE, Advice.SET_READ_MOSTLY, None)
        pages = ptr + np.arange(n, dtype=np.uint64) * PAGE_SIZE
        if read_first:
            b.access_stream(pages, GPU, "read")
            assert (b.page_states(ptr, BLOCK_SIZE) == 3).all()      # read-duplicated: host and GPU
        rec.take()
        r = b.access_stream(pages, GPU, "write")
        assert (b.page_states(ptr, BLOCK_SIZE) == 2).all()          # one copy, on the writer
        ev = rec.take()
        gone = of(ev, EventKind.INVALIDATE)
        # A duplicate's host copy is invalidated; a host-only page migrates (its source goes with the copy).
        assert int(gone[gone["src"] == HOST_ID]["bytes"].sum()) == (BLOCK_SIZE if read_first else 0)
        assert r.bytes_htod == (0 if read_first else BLOCK_SIZE)
        assert r.faults > 0
        other = b.access_stream(plain + np.arange(n, dtype=np.uint64) * PAGE_SIZE, GPU, "write")
        spent[latency] = (r.seconds, other.seconds)
    assert spent[300e-6][0] - spent[100e-6][0] == pytest.approx(n * 200e-6)
    assert spent[300e-6][1] == pytest.approx(spent[100e-6][1])
    assert spent[100e-6][1] < n * 100e-6


def test_r3c_a_gpu_preferred_page_hammered_by_the_cpu_keeps_migrating():
    """PreferredLocation overrides thrash pinning for the preferred processor: the ping-pong continues."""
    b, _rec = backend()
    ptr = b.allocate(64 * KiB, MemoryKind.MANAGED)
    b.advise(ptr, 64 * KiB, Advice.SET_PREFERRED_LOCATION, GPU)
    a = np.array([ptr], dtype=np.uint64)
    for _ in range(30):
        assert b.access_stream(a, GPU, "write", in_flight=1).bytes_htod + b.access_stream(
            a, HOST, "write").bytes_dtoh > 0
    assert b.page_states(ptr, PAGE_SIZE)[0] == 1


# -- R6: eviction -----------------------------------------------------------------------------------------------
def _fill(b: SimBackend, n: int) -> list[int]:
    ptrs = [b.allocate(BLOCK_SIZE, MemoryKind.MANAGED) for _ in range(n)]
    for p in ptrs:
        b.prefetch(p, BLOCK_SIZE, GPU)
    return ptrs


def _evicted(ev: np.ndarray) -> list[int]:
    return of(ev, EventKind.DTOH, MigrationCause.EVICTION)["address"].tolist()


def test_r6_fifo_evicts_by_last_migration_not_by_access():
    b, rec = backend("8MiB")
    a, _c, _d, _e = _fill(b, 4)
    b.access(a, BLOCK_SIZE, GPU, "read")           # an access does not requeue the chunk
    rec.take()
    f = b.allocate(BLOCK_SIZE, MemoryKind.MANAGED)
    b.prefetch(f, BLOCK_SIZE, GPU)
    assert _evicted(rec.take()) == [a]


def test_r6_a_migration_into_a_chunk_moves_it_to_the_tail():
    b, rec = backend("8MiB")
    a, c, _d, _e = _fill(b, 4)
    b.prefetch(a, PAGE_SIZE, HOST)                  # a page leaves, then comes back: a migrates in again
    b.prefetch(a, PAGE_SIZE, GPU)
    rec.take()
    f = b.allocate(BLOCK_SIZE, MemoryKind.MANAGED)
    b.prefetch(f, BLOCK_SIZE, GPU)
    assert _evicted(rec.take()) == [c]


@pytest.mark.parametrize("freed", [1, 3])
def test_r6_freeing_a_buffer_leaves_the_others_chunks_in_fifo_order(freed):
    # Freeing gives a buffer's chunks back; the chunks of the others keep their turn. (Freeing most of the
    # queue rebuilds it rather than unlinking chunk by chunk: its order must survive that too.)
    b, rec = backend("16MiB")
    keep = [b.allocate(BLOCK_SIZE, MemoryKind.MANAGED) for _ in range(8 - freed)]
    gone = b.allocate(freed * BLOCK_SIZE, MemoryKind.MANAGED)
    b.prefetch(keep[1], BLOCK_SIZE, GPU)
    b.prefetch(gone, freed * BLOCK_SIZE, GPU)        # the freed chunks sit between the kept ones
    for p in [keep[0], *keep[2:]]:
        b.prefetch(p, BLOCK_SIZE, GPU)
    b.free(gone)
    rec.take()
    new = b.allocate((freed + 2) * BLOCK_SIZE, MemoryKind.MANAGED)
    b.prefetch(new, (freed + 2) * BLOCK_SIZE, GPU)   # the free chunks first, then FIFO's head twice
    assert _evicted(rec.take()) == [keep[1], keep[0]]


def test_r6_lru_what_if_keeps_the_recently_accessed_chunk():
    b, rec = backend("8MiB", eviction="lru")
    a, c, _d, _e = _fill(b, 4)
    b.access(a, BLOCK_SIZE, GPU, "read")
    rec.take()
    f = b.allocate(BLOCK_SIZE, MemoryKind.MANAGED)
    b.prefetch(f, BLOCK_SIZE, GPU)
    assert _evicted(rec.take()) == [c]


def test_r6_eviction_moves_whole_chunks_and_never_touches_cudamalloc_memory():
    b, rec = backend("8MiB")
    dev = b.allocate(4 * MiB, MemoryKind.DEVICE)
    a, _c = _fill(b, 2)
    rec.take()
    f = b.allocate(BLOCK_SIZE, MemoryKind.MANAGED)
    b.prefetch(f, BLOCK_SIZE, GPU)
    ev = of(rec.take(), EventKind.DTOH, MigrationCause.EVICTION)
    assert int(ev["bytes"].sum()) == BLOCK_SIZE and ev["address"].tolist() == [a]
    assert (b.page_states(dev, 4 * MiB) == 2).all()


def test_r6_tree_what_if_pre_evicts_the_buddy():
    b, rec = backend("8MiB", eviction="tree")
    big = b.allocate(8 * MiB, MemoryKind.MANAGED)
    b.prefetch(big, 8 * MiB, GPU)
    rec.take()
    f = b.allocate(BLOCK_SIZE, MemoryKind.MANAGED)
    b.prefetch(f, BLOCK_SIZE, GPU)
    # Evicting the oldest chunk leaves half of its 4 MiB pair, so the buddy goes; then half of the 8 MiB group.
    assert sorted(_evicted(rec.take())) == [big + i * BLOCK_SIZE for i in range(4)]
    assert b.mem_info()[0] == 3 * BLOCK_SIZE


def test_r8_prefetch_is_a_source_of_eviction_and_skips_resident_pages():
    b, rec = backend("4MiB")
    a, _c = _fill(b, 2)
    rec.take()
    b.prefetch(a, BLOCK_SIZE, GPU)                  # already there: nothing moves
    assert not len(of(rec.take(), EventKind.HTOD))
    f = b.allocate(BLOCK_SIZE, MemoryKind.MANAGED)
    b.prefetch(f, BLOCK_SIZE, GPU)
    assert _evicted(rec.take()) == [a]


def test_r6_capacity_thrash_gets_no_mitigation():
    """R7 ignores evictions: a cyclic sweep larger than the GPU refaults everything, with no throttling."""
    b, rec = backend("8MiB")
    ptr = b.allocate(12 * MiB, MemoryKind.MANAGED)
    b.prefetch(ptr, 12 * MiB, HOST)
    for _ in range(3):
        r = b.access(ptr, 12 * MiB, GPU, "read")
        assert r.bytes_htod == 12 * MiB
    ev = rec.take()
    assert not len(of(ev, EventKind.THROTTLING)) and not len(of(ev, EventKind.THRASHING))


# -- R7: thrashing between processors -------------------------------------------------------------------------
def test_r7_ping_pong_is_detected_throttled_then_pinned_with_remote_mapping():
    b, rec = backend()
    ptr = b.allocate(64 * KiB, MemoryKind.MANAGED)
    a = np.array([ptr], dtype=np.uint64)
    for _ in range(40):
        b.access_stream(a, GPU, "write", in_flight=1)
        b.access_stream(a, HOST, "write")
    ev = rec.take()
    assert len(of(ev, EventKind.THRASHING)) >= 1
    throttles = of(ev, EventKind.THROTTLING)
    assert len(throttles) >= 10
    assert int((throttles["end"] - throttles["start"])[0]) == 500_000       # nap = lapse = 500 us
    assert len(of(ev, EventKind.REMOTE_MAP, RemoteMapCause.THRASHING))     # pinned: the GPU maps the host copy
    # Once pinned the page stops moving: the last round trips migrate nothing.
    r = b.access_stream(a, GPU, "write", in_flight=1)
    assert r.bytes_htod == 0 and r.bytes_remote > 0


def test_r7_a_prefetch_resets_the_thrashing_state_of_its_range_only():
    b, _ = backend()
    ptr = b.allocate(64 * KiB, MemoryKind.MANAGED)
    a = np.array([ptr, ptr + 8 * KiB], dtype=np.uint64)    # pages 0 and 2 of the block
    for _ in range(40):
        b.access_stream(a, GPU, "write", in_flight=1)
        b.access_stream(a, HOST, "write")
    (state,) = b._thrashing.blocks.values()
    assert state.thrashing[[0, 2]].all() and (state.pin_loc[[0, 2]] != NO_LOCATION).all()
    b.prefetch(ptr, 8 * KiB, GPU)                           # pages 0 and 1
    assert not state.thrashing[0] and state.count[0] == 0 and state.throttles[0] == 0
    assert state.pin_loc[0] == NO_LOCATION
    assert state.thrashing[2] and state.count[2] > 0 and state.pin_loc[2] != NO_LOCATION


def test_r7_off_means_no_detection():
    b, rec = backend(thrashing=False)
    ptr = b.allocate(64 * KiB, MemoryKind.MANAGED)
    a = np.array([ptr], dtype=np.uint64)
    for _ in range(20):
        b.access_stream(a, GPU, "write", in_flight=1)
        b.access_stream(a, HOST, "write")
    assert not len(of(rec.take(), EventKind.THRASHING))


def test_r7_the_host_taking_back_a_block_the_gpu_just_took_starts_thrashing_state_there_only():
    """The host reads back an old GPU block, then one the GPU has just written: only the second is thrashing."""
    b, _ = backend("16MiB")
    p = b.allocate(6 * MiB, MemoryKind.MANAGED)
    other = b.allocate(8 * MiB, MemoryKind.MANAGED)
    b.prefetch(p, 6 * MiB, HOST)
    pages = p + np.arange(6 * MiB // PAGE_SIZE, dtype=np.uint64) * PAGE_SIZE
    b.access_stream(pages[496:512], GPU, "write")
    b.access_stream(other + np.arange(2048, dtype=np.uint64) * PAGE_SIZE, HOST, "write")   # time passes
    b.access_stream(pages[512:1024], GPU, "write")
    b.access_stream(pages, HOST, "read")
    assert len(b._thrashing.blocks) == 1


# -- R9: access counters on ATS -----------------------------------------------------------------------------
def test_r9_counters_migrate_hot_remote_data_on_ats_only():
    for platform, migrates in (("gh200-ats", True), ("x86-pcie5", False)):
        b, rec = backend(platform=platform)
        ptr = b.allocate(BLOCK_SIZE, MemoryKind.MANAGED)
        b.prefetch(ptr, BLOCK_SIZE, HOST)
        b.advise(ptr, BLOCK_SIZE, Advice.SET_ACCESSED_BY, GPU)
        addrs = ptr + np.tile(np.arange(512, dtype=np.uint64) * PAGE_SIZE, 2)
        b.access_stream(addrs, GPU, "read")
        moved = of(rec.take(), EventKind.HTOD, MigrationCause.ACCESS_COUNTERS)
        assert bool(len(moved)) == migrates


# -- platforms and the link --------------------------------------------------------------------------------------
def test_platform_profiles_are_data_and_calibration_is_marked():
    assert {"x86-pcie5", "x86-pcie4", "x86-pcie3", "gh200-ats"} <= set(PLATFORMS)
    assert PLATFORMS["x86-pcie5"].calibrated and not PLATFORMS["gh200-ats"].calibrated
    assert PLATFORMS["gh200-ats"].cpu_maps_gpu_memory and not PLATFORMS["x86-pcie5"].cpu_maps_gpu_memory
    with pytest.raises(InvalidArgumentError, match="no field"):
        PLATFORMS["x86-pcie5"].with_(warp_speed=9)
    with pytest.raises(InvalidArgumentError, match="positive"):
        PLATFORMS["x86-pcie5"].with_(remote_bw=-1.0)


def test_the_h100_profile_ships_as_a_file_and_is_the_fit_of_an_h100():
    h100, h200 = PLATFORMS["x86-pcie5-h100"], PLATFORMS["x86-pcie5"]
    assert h100.calibrated and "H100" in h100.description
    # The fault paths' costs are that machine's; the link's, measured directly, are x86-pcie5's.
    assert h100.fault_batch_latency != h200.fault_batch_latency and h100.cpu_fault_latency != h200.cpu_fault_latency
    assert h100.prefetch_htod_bw == h200.prefetch_htod_bw and h100.remote_bw == h200.remote_bw


def test_a_profile_travels_as_a_file(tmp_path):
    """A profile written on one machine (say, fitted to its GPU) is what the simulator runs elsewhere."""
    import json

    import uvm_lab as ul
    from uvm_lab.backends.sim.platform import Platform

    slower = PLATFORMS["x86-pcie5"].with_(name="my-host", fault_batch_latency=62e-6, calibrated=True)
    path = slower.save(tmp_path / "my-host.json")
    assert Platform.load(path) == slower
    backend = ul.use_backend("sim", device_memory="1GiB", platform=str(path))
    assert backend.platform == slower
    seconds = []
    for profile in ("x86-pcie5", path):
        ul.use_backend("sim", device_memory="1GiB", platform=profile)
        buf = ul.DeviceBuffer(size="64MiB", mr=ul.mr.ManagedMemoryResource())
        ul.touch(buf, on="host", mode="write")
        seconds.append(ul.touch(buf, on="gpu").seconds)
    assert seconds[1] > seconds[0]   # the slower host's batches, as its profile says

    # A profile from before a cost existed takes x86-pcie5's; a field it does not know, or a bad value, is refused.
    data = json.loads(path.read_text())
    del data["fault_chunk_latency"]
    path.write_text(json.dumps(data))
    assert Platform.load(path).fault_chunk_latency == PLATFORMS["x86-pcie5"].fault_chunk_latency
    for change, match in (({"warp_speed": 9}, "warp_speed"), ({"remote_bw": -1}, "remote_bw must be a float > 0"),
                          ({"gpu_pages_in_flight": 2.5}, "gpu_pages_in_flight must be a int > 0"),
                          ({"calibrated": "yes"}, "calibrated must be a bool")):
        path.write_text(json.dumps({**data, **change}))
        with pytest.raises(InvalidArgumentError, match=match):
            Platform.load(path)
    for text in ("not json", json.dumps({"name": "x"}), json.dumps([1])):
        path.write_text(text)
        with pytest.raises(InvalidArgumentError, match="platform profile"):
            ul.use_backend("sim", platform=str(path))
    with pytest.raises(InvalidArgumentError, match="platform profile"):
        Platform.load(tmp_path / "missing.json")
    with pytest.raises(InvalidArgumentError, match=r"or a profile's \.json file"):
        get_platform("my-host")


def test_link_model_is_size_dependent():
    """Small copies get a fraction of the link (UVMSmart's atan fit); big ones approach the asymptote."""
    bw = 50e9
    small = 4 * KiB / link_seconds(4 * KiB, bw, 0.07292)
    big = 2 * MiB / link_seconds(2 * MiB, bw, 0.07292)
    assert small < 0.25 * bw and big > 0.99 * bw


def test_constructor_validates_its_options():
    with pytest.raises(InvalidArgumentError, match="fifo, lru, tree"):
        SimBackend("64MiB", eviction="random")
    with pytest.raises(InvalidArgumentError, match=r"1\.\.100"):
        SimBackend("64MiB", prefetch_threshold=0)
    b, _ = backend()
    with pytest.raises(InvalidArgumentError, match="not inside a live managed allocation"):
        b.access_stream(np.array([12345], dtype=np.uint64), GPU)
    with pytest.raises(InvalidArgumentError, match="in_flight"):
        b.access_stream(np.zeros(0, dtype=np.uint64), GPU, in_flight=0)


# -- determinism ---------------------------------------------------------------------------------------------
def test_the_same_calls_give_the_same_trace():
    def run() -> np.ndarray:
        b, rec = backend("8MiB")
        ptr = b.allocate(12 * MiB, MemoryKind.MANAGED)
        rng = np.random.default_rng(7)
        b.access_stream(ptr + rng.integers(0, 12 * MiB, 5000).astype(np.uint64), GPU, "read", in_flight=512)
        b.access(ptr, 12 * MiB, HOST, "write")
        ev = rec.take()
        ev["address"] -= np.uint64(ptr)        # addresses differ between backends; nothing else may
        ev["alloc_id"] = 0
        return ev
    np.testing.assert_array_equal(run(), run())


def test_r8_prefetch_of_resident_data_moves_nothing_but_walks_every_block():
    """As on the H200: a prefetch of an already resident range copies nothing and still takes time per block."""
    b, rec = backend()
    ptr = b.allocate(32 * MiB, MemoryKind.MANAGED)
    b.prefetch(ptr, 32 * MiB, GPU)
    rec.take()
    start = b.now_ns()
    b.prefetch(ptr, 32 * MiB, GPU)
    took = (b.now_ns() - start) / 1e9
    assert not len(of(rec.take(), EventKind.HTOD))
    assert took == pytest.approx(16 * b.platform.prefetch_block_latency)


def test_host_touch_of_one_byte_per_page_costs_a_miss_not_a_page():
    """The host touching one byte per resident page pays a miss per page, a write more than a read; whole
    pages pay bandwidth."""
    b, _ = backend()
    ptr = b.allocate(4 * MiB, MemoryKind.MANAGED)
    b.prefetch(ptr, 4 * MiB, HOST)
    pages = ptr + np.arange(4 * MiB // PAGE_SIZE, dtype=np.uint64) * PAGE_SIZE
    p = b.platform
    assert p.host_write_latency > p.host_access_latency
    written = b.access_stream(pages, HOST, "write", bytes_per_access=1)
    read = b.access_stream(pages, HOST, "read", bytes_per_access=1)
    whole = b.access_stream(pages, HOST, "write")
    assert written.faults == read.faults == whole.faults == 0
    assert written.seconds == pytest.approx(len(pages) * p.host_write_latency)
    assert read.seconds == pytest.approx(len(pages) * p.host_access_latency)
    assert whole.seconds == pytest.approx(4 * MiB / p.host_memory_bw)


def test_a_host_stream_of_reads_and_writes_costs_each_at_its_own_rate():
    """Mixed in one stream, the host's reads and writes of resident pages add up to what each costs alone."""
    b, _ = backend()
    ptr = b.allocate(4 * MiB, MemoryKind.MANAGED)
    b.prefetch(ptr, 4 * MiB, HOST)
    pages = ptr + np.arange(4 * MiB // PAGE_SIZE, dtype=np.uint64) * PAGE_SIZE
    writes = np.zeros(len(pages), dtype=bool)
    writes[::3] = True
    p = b.platform
    mixed = b.access_stream(pages, HOST, writes, bytes_per_access=1)
    n_write = int(writes.sum())
    assert mixed.faults == 0
    assert mixed.seconds == pytest.approx(n_write * p.host_write_latency
                                          + (len(pages) - n_write) * p.host_access_latency)
