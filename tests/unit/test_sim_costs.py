"""Time-model rules calibrated against the H200 (benchmarks/sim_vs_gpu_h200.json): each cost follows a driver rule."""

from __future__ import annotations

import numpy as np
import pytest

from uvm_lab.backends.sim import PLATFORMS, SimBackend
from uvm_lab.errors import InvalidArgumentError
from uvm_lab.events import EventBus, EventKind
from uvm_lab.events.schema import AccessType, Advice, MemoryKind, MigrationCause
from uvm_lab.location import Location
from uvm_lab.units import BLOCK_SIZE, PAGE_SIZE

GPU, HOST = Location.device(0), Location.host()
N = BLOCK_SIZE // PAGE_SIZE


class _Recorded(list):
    """Every batch published on ``bus`` from now on."""

    def __init__(self, bus: EventBus) -> None:
        super().__init__()
        self.bus = bus
        bus.subscribe(self.append)


def _backend(**costs: float) -> tuple[SimBackend, _Recorded]:
    bus = EventBus()
    return SimBackend("64MiB", platform=PLATFORMS["x86-pcie5"].with_(**costs), bus=bus), _Recorded(bus)


def _take(got: _Recorded) -> np.ndarray:
    got.bus.flush()   # what waits for the subscriber is delivered first
    out = np.concatenate(got) if got else np.zeros(0)
    got.clear()
    return out


def _pages(ptr: int) -> np.ndarray:
    return ptr + np.arange(N, dtype=np.uint64) * PAGE_SIZE


@pytest.mark.parametrize("latency", [2e-6, 5.07e-6])
def test_host_writes_to_host_held_read_mostly_pages_fault_once_per_page_on_the_read_only_mapping(latency):
    """SetReadMostly leaves the host's mapping read-only (uvm_va_block_set_read_duplication): the first host write
    to each page faults, moves nothing, and costs ``read_mostly_host_write_latency``; later writes do not fault."""
    b, got = _backend(read_mostly_host_write_latency=latency)
    p = b.platform
    ptr = b.allocate(BLOCK_SIZE, MemoryKind.MANAGED)
    plain = b.allocate(BLOCK_SIZE, MemoryKind.MANAGED)
    for q in (ptr, plain):
        b.prefetch(q, BLOCK_SIZE, HOST)
    b.advise(ptr, BLOCK_SIZE, Advice.SET_READ_MOSTLY, None)
    _take(got)
    first = b.access_stream(_pages(ptr), HOST, "write", bytes_per_access=1)
    ev = _take(got)
    faults = ev[ev["kind"] == EventKind.CPU_PAGE_FAULT]
    assert first.faults == len(faults) == N                       # one CPU fault record per page
    assert (faults["flags"] == AccessType.UNKNOWN).all() and (faults["bytes"] == PAGE_SIZE).all()   # as CUPTI's
    assert not ((ev["kind"] == EventKind.HTOD) | (ev["kind"] == EventKind.DTOH)
                | (ev["kind"] == EventKind.INVALIDATE)).any()
    assert first.seconds == pytest.approx(N * (latency + p.host_write_latency))
    assert (b.page_states(ptr, BLOCK_SIZE) == 1).all()
    # Written once, the mapping is read-write: the next pass and plain pages cost a touch each.
    again = b.access_stream(_pages(ptr), HOST, "write", bytes_per_access=1)
    other = b.access_stream(_pages(plain), HOST, "write", bytes_per_access=1)
    for r in (again, other):
        assert r.faults == 0 and r.seconds == pytest.approx(N * p.host_write_latency)
    # A GPU read duplicates the pages (read-only everywhere): the host's next writes fault and invalidate the
    # GPU's copies, a CPU fault of the ordinary kind.
    b.access_stream(_pages(ptr), GPU, "read")
    assert (b.page_states(ptr, BLOCK_SIZE) == 3).all()
    _take(got)
    collapse = b.access_stream(_pages(ptr)[:4], HOST, "write", bytes_per_access=1)
    assert collapse.faults == 4
    assert collapse.seconds == pytest.approx(4 * (p.cpu_fault_latency + p.host_write_latency))
    assert (_take(got)["kind"] == EventKind.INVALIDATE).any()


def test_read_mostly_advice_on_gpu_held_pages_makes_the_next_gpu_write_fault():
    """The same rule on the GPU: advice after the data is there revokes write; a write then collapses (R3 (a))."""
    b, _ = _backend()
    ptr = b.allocate(BLOCK_SIZE, MemoryKind.MANAGED)
    b.prefetch(ptr, BLOCK_SIZE, GPU)
    assert b.access_stream(_pages(ptr), GPU, "write").faults == 0
    b.advise(ptr, BLOCK_SIZE, Advice.SET_READ_MOSTLY, None)
    r = b.access_stream(_pages(ptr), GPU, "write")
    assert r.faults == N and r.bytes_htod == 0
    assert b.access_stream(_pages(ptr), GPU, "write").faults == 0


@pytest.mark.parametrize("unmap", [0.1e-6, 0.5e-6])
def test_a_read_duplicate_of_a_read_only_page_skips_the_source_unmap_a_migration_pays(unmap):
    """A migration unmaps the source copy; a read duplicate keeps it (R3 (a)), and when the holder's mapping is
    already read-only (ReadMostly, never written) nothing changes at the source: ``fault_unmap_latency`` less
    per page and ``fault_unmap_run_latency`` less per range. A duplicate of a page the host has written revokes
    that write access: it pays what a move does per page, ``read_mostly_protect_latency`` a page on top, and
    ``read_mostly_protect_run_latency`` a range in place of the move's ``fault_unmap_run_latency``."""
    took, ranges = {}, {}
    for case in ("migrate", "duplicate", "duplicate_written"):
        b, got = _backend(fault_unmap_latency=unmap, fault_unmap_run_latency=4e-6)
        ptr = b.allocate(BLOCK_SIZE, MemoryKind.MANAGED)
        b.prefetch(ptr, BLOCK_SIZE, HOST)
        if case != "migrate":
            b.advise(ptr, BLOCK_SIZE, Advice.SET_READ_MOSTLY, None)
        if case == "duplicate_written":
            b.access_stream(_pages(ptr), HOST, "write", bytes_per_access=1)
        _take(got)
        r = b.access_stream(_pages(ptr), GPU, "read")
        assert r.bytes_htod == BLOCK_SIZE
        assert (b.page_states(ptr, BLOCK_SIZE) == (2 if case == "migrate" else 3)).all()
        took[case] = r.seconds
        ranges[case] = int(np.count_nonzero(_take(got)["kind"] == EventKind.HTOD))   # one copy a batch
    assert ranges["migrate"] == 2                      # two batches of half a block
    assert took["migrate"] - took["duplicate"] == pytest.approx(N * unmap + ranges["migrate"] * 4e-6)
    p = PLATFORMS["x86-pcie5"]
    assert took["duplicate_written"] == pytest.approx(
        took["migrate"] + N * p.read_mostly_protect_latency + ranges["migrate"] * (p.read_mostly_protect_run_latency
                                                                                  - 4e-6))


@pytest.mark.parametrize("latency", [1e-6, 2.5e-6])
def test_small_remote_reads_cost_a_round_trip_over_the_reads_in_flight_and_large_ones_their_bytes(latency):
    """Through a remote mapping (PreferredLocation=host, AccessedBy=GPU) a GPU read of a few bytes is bound by
    the link's round trip, several in flight; a read of a whole page by the link's bandwidth."""
    b, got = _backend(remote_request_latency=latency)
    p = b.platform
    ptr = b.allocate(BLOCK_SIZE, MemoryKind.MANAGED)
    b.prefetch(ptr, BLOCK_SIZE, HOST)
    b.advise(ptr, BLOCK_SIZE, Advice.SET_PREFERRED_LOCATION, HOST)
    b.advise(ptr, BLOCK_SIZE, Advice.SET_ACCESSED_BY, GPU)
    _take(got)
    small = b.access_stream(_pages(ptr), GPU, "read", in_flight=64, bytes_per_access=32)
    large = b.access_stream(_pages(ptr), GPU, "read", in_flight=64, bytes_per_access=PAGE_SIZE)
    ev = _take(got)
    assert small.faults == large.faults == 0
    assert EventKind.HTOD not in (ev["kind"] if len(ev) else [])                     # nothing moves
    assert small.seconds == pytest.approx(N * max(latency / 64, 32 / p.remote_bw))
    assert large.seconds == pytest.approx(N * max(latency / 64, PAGE_SIZE / p.remote_bw))


@pytest.mark.parametrize("every", [1, 2, 7])
def test_a_gpu_read_duplicating_host_written_read_mostly_pages_takes_the_hosts_write_access_back(every):
    """The host wrote one page in ``every`` of a ReadMostly buffer: the GPU's read duplicates every page, and
    for each written one the driver revokes the host's write access, ``read_mostly_protect_latency`` a page
    and ``read_mostly_protect_run_latency`` a range of such pages (two batches of half a block: one range
    each where every page was written, else one a page)."""
    def gpu_read(**costs: float) -> float:
        b, _ = _backend(**costs)
        ptr = b.allocate(BLOCK_SIZE, MemoryKind.MANAGED)
        b.prefetch(ptr, BLOCK_SIZE, HOST)
        b.advise(ptr, BLOCK_SIZE, Advice.SET_READ_MOSTLY, None)
        b.access_stream(_pages(ptr)[::every], HOST, "write", in_flight=1)
        r = b.access_stream(_pages(ptr), GPU, "read")
        assert r.bytes_htod == BLOCK_SIZE and r.faults > 0
        return r.seconds

    written = len(range(0, N, every))
    ranges = 2 if every == 1 else written
    assert gpu_read(read_mostly_protect_latency=2e-6) - gpu_read(read_mostly_protect_latency=1e-6) \
        == pytest.approx(written * 1e-6)
    assert gpu_read(read_mostly_protect_run_latency=9e-6) - gpu_read(read_mostly_protect_run_latency=1e-6) \
        == pytest.approx(ranges * 8e-6)


@pytest.mark.parametrize("reads, writes", [(3, 1), (1, 1), (1, 3), (0, 2), (2, 0)])
def test_remote_writes_overlap_remote_reads_the_link_being_full_duplex(reads, writes):
    """GPU reads through a remote mapping move data one way over the link, GPU writes the other way: a stream
    of both takes the time of the larger direction (a remote stencil's three rows read to one row written cost
    the reads alone), and its records are those of the reads and writes alike (none: nothing migrates)."""
    b, got = _backend()
    p = b.platform
    ptrs = [b.allocate(BLOCK_SIZE, MemoryKind.MANAGED) for _ in range(max(reads, writes, 1) * 2)]
    for ptr in ptrs:
        b.prefetch(ptr, BLOCK_SIZE, HOST)
        b.advise(ptr, BLOCK_SIZE, Advice.SET_PREFERRED_LOCATION, HOST)
        b.advise(ptr, BLOCK_SIZE, Advice.SET_ACCESSED_BY, GPU)
    _take(got)
    # Interleaved, as a kernel's warps issue them: a block read, a block written, ...
    order = [(ptrs[2 * i], False) for i in range(reads)] + [(ptrs[2 * i + 1], True) for i in range(writes)]
    order.sort(key=lambda x: ptrs.index(x[0]))
    pages = [_pages(ptr) for ptr, _ in order]
    flags = [np.full(N, w) for _, w in order]
    r = b.access_stream(pages, GPU, flags, in_flight=256)
    one_block = N * max(p.remote_request_latency / 256, PAGE_SIZE / p.remote_bw)
    assert r.faults == 0 and r.bytes_remote == (reads + writes) * BLOCK_SIZE
    assert r.seconds == pytest.approx(max(reads, writes) * one_block)
    assert not len(_take(got))


@pytest.mark.parametrize("policy", ["migrate", "duplicate"])
def test_a_fault_batch_pays_per_fault_and_per_unmapped_range_whatever_its_size(policy):
    """One read every 128 KiB of a host-held block: 16 faults, each growing to its 64 KiB big page, which stay
    16 separate runs (half the block is not above the prefetcher's 51 %). The batch pays ``fault_latency`` per
    fault and, where the source loses its mapping (a migration; not a duplicate of a read-only ReadMostly page),
    ``fault_unmap_run_latency`` per run: a TLB shootdown per range, however many pages it holds."""
    costs = {"fault_latency": 0.7e-6, "fault_unmap_run_latency": 5e-6}
    took = {}
    for scale in (1, 2):
        b, got = _backend(**{name: cost * scale for name, cost in costs.items()})
        ptr = b.allocate(BLOCK_SIZE, MemoryKind.MANAGED)
        b.prefetch(ptr, BLOCK_SIZE, HOST)
        if policy == "duplicate":
            b.advise(ptr, BLOCK_SIZE, Advice.SET_READ_MOSTLY, None)
        _take(got)
        r = b.access_stream(_pages(ptr)[::32], GPU, "read")
        ev = _take(got)
        htod = ev[ev["kind"] == EventKind.HTOD]
        assert r.faults == 16 and r.bytes_htod == BLOCK_SIZE // 2
        assert len(np.unique(ev[ev["kind"] == EventKind.GPU_PAGE_FAULT]["start"])) == 1      # one batch
        starts = np.unique(htod["address"] // (16 * PAGE_SIZE))
        assert len(starts) == 16 and (np.diff(starts) == 2).all()       # 16 big pages, every other one
        took[scale] = r.seconds
    unmapped = 16 if policy == "migrate" else 0
    assert took[2] - took[1] == pytest.approx(
        16 * costs["fault_latency"] + unmapped * costs["fault_unmap_run_latency"])


def test_a_fault_batch_pays_per_gpu_chunk_it_allocates_not_per_block_it_revisits():
    """One read in each of four host-held blocks allocates four 2 MiB chunks on the GPU: ``fault_chunk_latency``
    four times. Reads elsewhere in the same blocks later find their chunks and do not pay it again."""
    took = {}
    for scale in (1, 2):
        b, _ = _backend(fault_chunk_latency=3e-6 * scale)
        ptr = b.allocate(4 * BLOCK_SIZE, MemoryKind.MANAGED)
        b.prefetch(ptr, 4 * BLOCK_SIZE, HOST)
        pages = ptr + np.arange(4 * N, dtype=np.uint64) * PAGE_SIZE
        first = b.access_stream(pages[::N], GPU, "read")
        again = b.access_stream(pages[N // 2::N], GPU, "read")
        assert first.faults == again.faults == 4
        assert first.bytes_htod == again.bytes_htod == 4 * 16 * PAGE_SIZE     # one 64 KiB big page each
        took[scale] = (first.seconds, again.seconds)
    assert took[2][0] - took[1][0] == pytest.approx(4 * 3e-6)
    assert took[2][1] == pytest.approx(took[1][1])


@pytest.mark.parametrize("path", ["fault", "prefetch"])
def test_a_fault_waits_for_each_chunk_it_evicts_and_a_prefetch_does_not(path):
    """Reading 16 MiB through a GPU with room for 8 MiB evicts a chunk for every block past the eighth. On the
    fault path each eviction adds ``fault_eviction_latency`` to the clock; on the prefetch path evictions
    overlap the refill and add nothing."""
    took, evicted = {}, {}
    for scale in (1, 2):
        bus = EventBus()
        got = _Recorded(bus)
        b = SimBackend("8MiB", platform=PLATFORMS["x86-pcie5"].with_(fault_eviction_latency=20e-6 * scale), bus=bus)
        ptr = b.allocate(16 << 20, MemoryKind.MANAGED)
        b.prefetch(ptr, 16 << 20, HOST)
        start = b.now_ns()
        if path == "fault":
            b.access_stream(ptr + np.arange(4096, dtype=np.uint64) * PAGE_SIZE, GPU, "read")
        else:
            b.prefetch(ptr, 16 << 20, GPU)
        took[scale] = (b.now_ns() - start) / 1e9
        ev = _take(got)
        eviction = (ev["kind"] == EventKind.DTOH) & (ev["flags"] == MigrationCause.EVICTION)
        evicted[scale] = int(np.count_nonzero(eviction))
    assert evicted[1] == evicted[2] == 4
    expected = 4 * 20e-6 if path == "fault" else 0.0    # blocks 5-8 evict blocks 1-4 (FIFO): four chunks
    assert took[2] - took[1] == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("latency", [0.11e-6, 1e-6])
@pytest.mark.parametrize("order", ["sweep", "shuffled"])
def test_a_gpu_write_fault_costs_fault_write_latency_more_than_a_read_fault(latency, order):
    """A kernel writing host-held pages faults them in as one reading them does, the same batches and the same
    bytes; each write fault adds ``fault_write_latency`` to its batch (a store does not stall its warp)."""
    runs = {}
    for mode in ("read", "write"):
        b, got = _backend(fault_write_latency=latency)
        ptr = b.allocate(8 * BLOCK_SIZE, MemoryKind.MANAGED)
        b.prefetch(ptr, 8 * BLOCK_SIZE, HOST)
        pages = ptr + np.arange(8 * N, dtype=np.uint64) * PAGE_SIZE
        if order == "shuffled":
            pages = np.random.default_rng(7).permutation(pages)
        _take(got)
        r = b.access_stream(pages, GPU, mode)
        ev = _take(got)
        ev["address"] -= ptr          # the two backends place their buffers apart
        runs[mode] = r, ev
    (read, read_ev), (write, write_ev) = runs["read"], runs["write"]
    assert write.faults == read.faults > 0
    assert write.bytes_htod == read.bytes_htod == 8 * BLOCK_SIZE
    faults = write_ev[write_ev["kind"] == EventKind.GPU_PAGE_FAULT]
    read_faults = read_ev[read_ev["kind"] == EventKind.GPU_PAGE_FAULT]
    assert (faults["flags"] == AccessType.WRITE).all() and int(faults["value"].sum()) == write.faults
    assert (faults["address"] == read_faults["address"]).all() and (faults["value"] == read_faults["value"]).all()
    assert write.seconds == pytest.approx(read.seconds + write.faults * latency, rel=1e-9)


@pytest.mark.parametrize("latency", [0.05e-3, 0.2e-3])
def test_a_launched_stream_costs_the_kernel_launch_before_its_first_access(latency):
    """``launch=True`` is a kernel launched on an idle GPU and waited for: its time and every record it makes
    move by ``kernel_launch_latency``; nothing else changes."""
    runs = {}
    for launch in (False, True):
        b, got = _backend(kernel_launch_latency=latency)
        ptr = b.allocate(BLOCK_SIZE, MemoryKind.MANAGED)
        b.prefetch(ptr, BLOCK_SIZE, HOST)
        _take(got)
        start = b.now_ns()
        r = b.access_stream(_pages(ptr), GPU, "read", launch=launch)
        ev = _take(got)
        runs[launch] = (r, ev, b.now_ns() - start, ev["address"] - np.uint64(ptr))
    (plain, plain_ev, plain_ns, plain_at), (launched, launched_ev, launched_ns, launched_at) = runs[False], runs[True]
    assert launched.seconds == pytest.approx(plain.seconds + latency)
    assert launched_ns - plain_ns == pytest.approx(latency * 1e9, abs=1)
    assert (launched.faults, launched.bytes_htod) == (plain.faults, plain.bytes_htod) and plain.faults
    np.testing.assert_array_equal(launched_ev[["kind", "bytes"]], plain_ev[["kind", "bytes"]])
    np.testing.assert_array_equal(launched_at, plain_at)
    np.testing.assert_allclose(launched_ev["start"].astype(np.int64) - plain_ev["start"].astype(np.int64),
                               latency * 1e9, atol=1)


def test_only_a_gpu_stream_can_be_launched():
    b, _ = _backend()
    ptr = b.allocate(BLOCK_SIZE, MemoryKind.MANAGED)
    before = b.now_ns()
    with pytest.raises(InvalidArgumentError, match="host launches nothing"):
        b.access_stream(_pages(ptr), HOST, "read", launch=True)
    with pytest.raises(InvalidArgumentError, match="launch must be True or False"):
        b.access_stream(_pages(ptr), GPU, "read", launch="yes")
    assert b.now_ns() == before


def test_each_gpu_pass_of_a_workload_pays_one_launch_and_host_passes_none():
    """As the GPU side times a pass (from a synchronized device to a synchronized device around its kernels),
    the simulator adds one launch to every GPU pass, whatever its policy or the number of its kernels."""
    from uvm_lab import workloads as W

    base = PLATFORMS["x86-pcie5"]
    for name, params, policy in (("host_then_device", {"passes": 2}, "faults"), ("tiled_matmul", {"tiles": 2},
                                                                                  "faults"),
                                 ("multi_pass_stream", {}, "prefetch"), ("strided", {}, "remote")):
        w = W.make(name, size="64MiB", **params)
        times = [[r.seconds for r in W.run_sim(w, policy=policy, platform=base.with_(kernel_launch_latency=lat),
                                               device_memory="1GiB")]
                 for lat in (0.1e-3, 0.3e-3)]
        gpu = [ph.processor == "gpu" for ph in w.phases for _ in range(int(ph.param("passes", 1)))]
        assert len(gpu) == len(times[0]), name
        for is_gpu, lo, hi in zip(gpu, *times, strict=True):
            assert hi - lo == pytest.approx(0.2e-3 if is_gpu else 0.0, abs=1e-9), (name, policy)


@pytest.mark.parametrize("mode", ["read", "write", "atomic"])
def test_access_on_a_gpu_costs_the_touch_kernels_launch_and_its_rate_on_resident_pages(mode):
    """``access()`` on a GPU is the CUDA backend's byte-wise touch kernel: a launch, then each resident byte at the
    touch kernel's rate for the mode, on device memory and on managed memory already on the GPU alike."""
    rates = {"read": 1e12, "write": 0.5e12, "atomic": 2e12}
    b, _ = _backend(access_launch_latency=0.05e-3, touch_read_bw=rates["read"], touch_write_bw=rates["write"],
                    touch_atomic_bw=rates["atomic"])
    size = 4 * BLOCK_SIZE
    device = b.allocate(size, MemoryKind.DEVICE)
    managed = b.allocate(size, MemoryKind.MANAGED)
    b.prefetch(managed, size, GPU)
    for ptr in (device, managed):
        r = b.access(ptr, size, GPU, mode)
        assert r.faults in (None, 0)
        assert r.seconds == pytest.approx(0.05e-3 + size / rates[mode], abs=2e-9)   # the clock counts whole ns


def test_host_access_pays_no_kernel_launch():
    took = []
    for latency in (0.01e-3, 1e-3):
        b, _ = _backend(access_launch_latency=latency)
        ptr = b.allocate(BLOCK_SIZE, MemoryKind.MANAGED)
        b.prefetch(ptr, BLOCK_SIZE, HOST)
        took.append(b.access(ptr, BLOCK_SIZE, HOST, "read").seconds)
    assert took[0] == took[1] > 0


@pytest.mark.parametrize("mode", ["read", "write", "atomic"])
def test_access_on_the_host_costs_the_host_loop_a_page(mode):
    """``access()`` on the host is the CUDA backend's host loop: one byte of each page read and, to write, written
    back. On resident managed pages and on pinned host memory alike, a page costs a touch, not 4 KiB of traffic."""
    b, _ = _backend(host_access_latency=10e-9, host_write_latency=30e-9, host_memory_bw=1e9)
    size = 4 * BLOCK_SIZE
    managed = b.allocate(size, MemoryKind.MANAGED)
    pinned = b.allocate(size, MemoryKind.PINNED_HOST)
    b.prefetch(managed, size, HOST)
    per_page = 10e-9 + (30e-9 if mode != "read" else 0.0)
    for ptr in (managed, pinned):
        r = b.access(ptr, size, HOST, mode)
        assert r.faults in (None, 0)
        assert r.seconds == pytest.approx(4 * N * per_page, abs=2e-9)
