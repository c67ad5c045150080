"""The simulated device follows the UVM driver's rules for where pages go (research R1-R8)."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import uvm_lab as ul
from uvm_lab.errors import InvalidArgumentError
from uvm_lab.events import EventKind, MigrationCause
from uvm_lab.events.schema import MemoryKind
from uvm_lab.units import BLOCK_SIZE, PAGE_SIZE

MiB = 1 << 20


def managed(size: int | str, **kw: object) -> ul.DeviceBuffer:
    return ul.DeviceBuffer(size=size, mr=ul.mr.ManagedMemoryResource(**kw))


def truth(buf: ul.DeviceBuffer) -> np.ndarray:
    return ul.get_backend()._segments[buf.ptr].state


def assert_map_matches(buf: ul.DeviceBuffer) -> None:
    np.testing.assert_array_equal(ul.residency(buf).states, truth(buf))


def test_first_touch_on_gpu_populates_without_transfer():
    buf = managed(8 * MiB)
    assert ul.residency(buf).summary()["nowhere"] == 1.0
    with ul.record() as trace:
        result = ul.touch(buf, on="gpu", mode="write")
    assert ul.residency(buf).summary()["gpu"] == 1.0
    assert result.bytes_htod == 0 and result.faults == 8 * MiB // PAGE_SIZE
    assert len(trace.of_kind(EventKind.HTOD)) == 0
    assert trace.summary()["gpu_faults"] == 8 * MiB // PAGE_SIZE
    assert_map_matches(buf)


def test_host_written_buffer_migrates_to_gpu_on_read_and_back_on_host_read():
    buf = managed(16 * MiB)
    ul.touch(buf, on="host", mode="write")
    assert ul.residency(buf).summary()["host"] == 1.0
    with ul.record() as trace:
        r = ul.touch(buf, on="gpu", mode="read")
    assert r.bytes_htod == 16 * MiB
    assert trace.summary()["bytes_htod"] == 16 * MiB
    causes = set(trace.of_kind(EventKind.HTOD)["flags"].tolist())
    assert causes <= {MigrationCause.COHERENCE, MigrationCause.PREFETCH}
    assert ul.residency(buf).summary()["gpu"] == 1.0
    r = ul.touch(buf, on="host", mode="read")
    assert r.bytes_dtoh == 16 * MiB and ul.residency(buf).summary()["host"] == 1.0
    assert_map_matches(buf)


def test_big_page_growth_moves_whole_64k_pages():
    buf = managed(4 * MiB)
    ul.touch(buf, on="host", mode="write")
    r = ul.touch(buf, on="gpu", offset=0, size=PAGE_SIZE)           # one 4 KiB page faults
    assert r.faults == 1 and r.bytes_htod == 64 << 10               # its 64 KiB big page moves
    assert_map_matches(buf)


def test_dense_block_is_filled_by_the_prefetcher():
    buf = managed(2 * MiB)
    ul.touch(buf, on="host", mode="write")
    ul.touch(buf, on="gpu", offset=0, size=(2 * MiB) * 52 // 100)  # past 51% of the block
    assert ul.residency(buf).summary()["gpu"] == 1.0                # the rest came as driver prefetch
    assert_map_matches(buf)


def test_prefetch_moves_pages_with_user_cause_and_populates_untouched_ones():
    buf = managed(8 * MiB)
    with ul.record() as trace:
        buf.prefetch("gpu")
    assert ul.residency(buf).summary()["gpu"] == 1.0
    assert len(trace.of_kind(EventKind.HTOD)) == 0                  # untouched pages need no copy
    with ul.record() as trace:
        buf.prefetch("host")
    dtoh = trace.of_kind(EventKind.DTOH)
    assert int(dtoh["bytes"].sum()) == 8 * MiB
    assert set(dtoh["flags"].tolist()) == {MigrationCause.USER}
    assert len(trace.of_kind(EventKind.PREFETCH)) == 1
    assert_map_matches(buf)


def test_read_mostly_duplicates_on_read_and_collapses_on_write():
    buf = managed(4 * MiB)
    buf.prefetch("host")
    buf.read_mostly = True
    ul.touch(buf, on="gpu", mode="read")
    assert ul.residency(buf).summary()["both"] == 1.0
    assert ul.touch(buf, on="host", mode="read").faults == 0        # the host copy is still valid
    ul.touch(buf, on="gpu", mode="write")
    assert ul.residency(buf).summary()["gpu"] == 1.0
    assert_map_matches(buf)


def test_unsetting_read_mostly_keeps_the_preferred_copy():
    buf = managed(2 * MiB)
    buf.prefetch("host")
    buf.read_mostly = True
    buf.preferred_location = "gpu"
    buf.prefetch("gpu")
    assert ul.residency(buf).summary()["both"] == 1.0
    buf.read_mostly = False
    assert ul.residency(buf).summary()["gpu"] == 1.0
    assert_map_matches(buf)


def test_preferred_location_host_maps_the_gpu_remotely_instead_of_migrating():
    buf = managed(4 * MiB)
    buf.prefetch("host")
    buf.preferred_location = "host"
    with ul.record() as trace:
        first = ul.touch(buf, on="gpu")
    assert first.bytes_htod == 0 and first.bytes_remote == 4 * MiB and first.faults > 0
    assert len(trace.of_kind(EventKind.REMOTE_MAP)) > 0
    second = ul.touch(buf, on="gpu")
    assert second.faults == 0 and second.bytes_remote == 4 * MiB   # the mapping stays
    assert ul.residency(buf).summary()["host"] == 1.0
    assert_map_matches(buf)


def test_a_buffer_in_a_freed_buffers_pages_starts_clean():
    # The page table hands a freed range to the next allocation: none of the old buffer's pages, chunks or
    # advice may come with it.
    old = managed(4 * MiB)
    old.prefetch("host")
    old.read_mostly = True
    old.preferred_location = "host"
    old.accessed_by = ["gpu"]
    ul.touch(old, on="gpu", mode="read")
    free_before = ul.get_backend().mem_info(0)[0]
    old_base = ul.get_backend()._segments[old.ptr].base
    del old
    new = managed(4 * MiB)
    assert ul.get_backend()._segments[new.ptr].base == old_base   # the same pages of the table
    assert ul.residency(new).summary()["nowhere"] == 1.0
    assert ul.get_backend().mem_info(0)[0] >= free_before
    new.prefetch("host")
    first = ul.touch(new, on="gpu", mode="read")
    assert first.faults > 0 and first.bytes_htod == 4 * MiB and first.bytes_remote == 0   # migrates: no advice
    assert ul.residency(new).summary()["gpu"] == 1.0                                  # and is not duplicated
    assert_map_matches(new)


def test_accessed_by_gpu_reads_host_pages_without_faults():
    buf = managed(4 * MiB)
    buf.prefetch("host")
    buf.accessed_by = "gpu"
    r = ul.touch(buf, on="gpu")
    assert r.faults == 0 and r.bytes_remote == 4 * MiB and r.bytes_htod == 0
    assert ul.residency(buf).summary()["host"] == 1.0


def test_host_access_always_migrates_even_with_gpu_preferred():
    buf = managed(2 * MiB)
    buf.preferred_location = "gpu"
    ul.touch(buf, on="host", mode="write")                          # x86: the CPU cannot map GPU memory
    assert ul.residency(buf).summary()["host"] == 1.0
    ul.touch(buf, on="gpu")
    assert ul.residency(buf).summary()["gpu"] == 1.0
    assert_map_matches(buf)


def test_oversubscription_evicts_whole_blocks_fifo_by_migration():
    ul.use_backend("sim", device_memory="8MiB")
    a = managed(4 * MiB, allow_oversubscription=True)
    b = managed(4 * MiB, allow_oversubscription=True)
    c = managed(2 * MiB, allow_oversubscription=True)
    a.prefetch("gpu")
    b.prefetch("gpu")
    assert ul.get_backend().mem_info()[0] == 0
    with ul.record() as trace:
        c.prefetch("gpu")
    evictions = trace.of_kind(EventKind.DTOH)
    assert set(evictions["flags"].tolist()) == {MigrationCause.EVICTION}
    assert int(evictions["bytes"].sum()) == BLOCK_SIZE                   # one 2 MiB block
    assert int(evictions["address"].min()) == a.ptr                       # the oldest migration goes first
    assert ul.residency(a).counts()["host"] == BLOCK_SIZE // PAGE_SIZE
    assert ul.residency(b).summary()["gpu"] == 1.0
    for buf in (a, b, c):
        assert_map_matches(buf)


def test_a_cyclic_sweep_larger_than_the_gpu_never_hits():
    ul.use_backend("sim", device_memory="8MiB")
    buf = managed(12 * MiB, allow_oversubscription=True)
    ul.touch(buf, on="host", mode="write")
    ul.touch(buf, on="gpu")
    second = ul.touch(buf, on="gpu")                                 # FIFO eviction: every block refaults
    assert second.bytes_htod == 12 * MiB
    assert_map_matches(buf)


def test_mem_info_counts_gpu_memory_in_2mib_blocks():
    free0, total = ul.get_backend().mem_info()
    assert free0 == total == 4 << 30
    buf = managed(64 << 10)
    ul.touch(buf, on="gpu")
    assert ul.get_backend().mem_info()[0] == total - BLOCK_SIZE          # one touched page costs a block
    buf.prefetch("host")
    assert ul.get_backend().mem_info()[0] == total                      # the block is given back


def test_device_memory_is_never_evicted_and_can_run_out():
    ul.use_backend("sim", device_memory="8MiB")
    dev = ul.DeviceBuffer(size=6 * MiB, mr=ul.mr.CudaMemoryResource())
    assert ul.residency(dev).summary()["gpu"] == 1.0
    with pytest.raises(ul.errors.OutOfMemoryError) as info:
        ul.DeviceBuffer(size=4 * MiB, mr=ul.mr.CudaMemoryResource())
    assert info.value.size == 4 * MiB
    with pytest.raises(ul.errors.BackendError, match="host cannot access device memory"):
        ul.touch(dev, on="host")


def test_pinned_host_memory_is_read_remotely_by_the_gpu():
    buf = ul.DeviceBuffer(size=4 * MiB, mr=ul.mr.PinnedHostMemoryResource())
    assert ul.residency(buf).summary()["host"] == 1.0
    r = ul.touch(buf, on="gpu")
    assert r.bytes_remote == 4 * MiB and r.faults == 0
    buf.prefetch("gpu")                                             # a no-op, as cudaMemPrefetchAsync via RMM
    assert ul.residency(buf).summary()["host"] == 1.0


def test_prefetching_before_a_kernel_is_cheaper_than_faulting_in_the_model():
    a, b = managed(64 * MiB), managed(64 * MiB)
    ul.touch(a, on="host", mode="write")
    ul.touch(b, on="host", mode="write")
    faulted = ul.touch(a, on="gpu").seconds
    start = ul.get_backend().now_ns()
    b.prefetch("gpu")
    prefetched = (ul.get_backend().now_ns() - start) / 1e9 + ul.touch(b, on="gpu").seconds
    # On the H200 hosts a faulted 1 GiB sweep took 88-96 ms (113-143 on the slower host) and a prefetched one
    # 23-25 ms (benchmarks/sim_vs_gpu_h200_b*.json, sim_vs_gpu_h200.json): 3.5 to 6 times as long.
    assert 3 < faulted / prefetched < 6


def test_simulated_clock_only_moves_forward_and_stamps_events():
    buf = managed(4 * MiB)
    # Buffers of earlier tests' backends, collected now, would be freed during the recording by their own clocks
    gc.collect()
    ul.deferred.run()
    with ul.record() as trace:
        ul.touch(buf, on="host", mode="write")
        ul.touch(buf, on="gpu")
    ev = trace.events
    assert (ev["end"] >= ev["start"]).all()
    assert (np.diff(ev["start"].astype(np.int64)) >= 0).all()


def test_bad_arguments_raise_typed_errors():
    with pytest.raises(ul.errors.InvalidSizeError):
        ul.use_backend("sim", device_memory="lots")
    with pytest.raises(ul.errors.InvalidArgumentError, match="at least 2 MiB"):
        ul.use_backend("sim", device_memory=4096)
    with pytest.raises(ul.errors.InvalidArgumentError, match="x86-pcie5"):
        ul.use_backend("sim", platform="abacus")
    with pytest.raises(ul.errors.InvalidArgumentError, match="sim"):
        ul.use_backend("tpu")


def test_a_stream_over_many_allocations_faults_exactly_the_pages_it_names():
    """Addresses in any order over several allocations: each access lands on its own page (prefetcher off)."""
    from uvm_lab.backends.sim import SimBackend
    from uvm_lab.events import EventBus

    b = SimBackend(device_memory="256MiB", bus=EventBus(), prefetcher=False)
    sizes = [3 * BLOCK_SIZE + 5 * PAGE_SIZE, BLOCK_SIZE, 7 * PAGE_SIZE, 2 * BLOCK_SIZE, 5 * BLOCK_SIZE + PAGE_SIZE,
             PAGE_SIZE, 4 * BLOCK_SIZE, 3 * BLOCK_SIZE]
    ptrs = [b.allocate(s, MemoryKind.MANAGED) for s in sizes]
    rng = np.random.default_rng(3)
    for chosen in ([0], [1, 3], [0, 2, 4], list(range(len(sizes)))):   # one, two, three and all allocations
        for ptr, size in zip(ptrs, sizes, strict=True):
            b.prefetch(ptr, size, ul.Location.host())
        which = rng.choice(chosen, 50_000)
        offsets = rng.integers(0, np.array(sizes)[which]) // 8 * 8
        addresses = np.array(ptrs, dtype=np.uint64)[which] + offsets.astype(np.uint64)
        b.access_stream(addresses, ul.Location.device(0), "read", in_flight=4096)
        for k, (ptr, size) in enumerate(zip(ptrs, sizes, strict=True)):
            touched = np.zeros(size // PAGE_SIZE, dtype=bool)
            touched[offsets[which == k] // PAGE_SIZE] = True
            assert np.array_equal(b.page_states(ptr, size) == 2, touched), (chosen, k)


def test_a_stream_with_an_address_outside_managed_memory_is_refused():
    from uvm_lab.backends.sim import SimBackend
    from uvm_lab.events import EventBus

    b = SimBackend(device_memory="64MiB", bus=EventBus())
    a = b.allocate(BLOCK_SIZE + PAGE_SIZE, MemoryKind.MANAGED)
    c = b.allocate(BLOCK_SIZE, MemoryKind.MANAGED)
    d = b.allocate(BLOCK_SIZE, MemoryKind.DEVICE)
    good = a + np.arange(100, dtype=np.uint64) * PAGE_SIZE
    beyond = c + np.arange(10, dtype=np.uint64) * PAGE_SIZE
    for bad, rest in ((a + BLOCK_SIZE + PAGE_SIZE, beyond), (a + BLOCK_SIZE + PAGE_SIZE, beyond[:0]),
                      (d + PAGE_SIZE, beyond), (a - 1, beyond), (c + BLOCK_SIZE + 12345, beyond[:0])):
        addresses = np.concatenate((good, [np.uint64(bad)], rest))
        before = b.page_states(a, BLOCK_SIZE + PAGE_SIZE), b.now_ns()
        with pytest.raises(ul.errors.InvalidArgumentError, match=f"{bad:#x}"):
            b.access_stream(addresses, ul.Location.device(0), "read")
        assert np.array_equal(b.page_states(a, BLOCK_SIZE + PAGE_SIZE), before[0]) and b.now_ns() == before[1]


def test_a_bad_address_in_a_later_chunk_or_part_leaves_everything_as_it_was():
    """A list of chunks, and an array longer than one translated part, are checked whole before any access."""
    from uvm_lab.backends.sim import SimBackend
    from uvm_lab.events import EventBus

    b = SimBackend(device_memory="8GiB", bus=EventBus())
    size = 5 << 30                                 # 1,310,720 pages: more than one part of 1 Mi accesses
    a = b.allocate(size, MemoryKind.MANAGED)
    every = a + np.arange(size // PAGE_SIZE, dtype=np.uint64) * PAGE_SIZE
    bad = np.uint64(a + size + PAGE_SIZE)
    for stream in ([every[:1000], every[1000:2000], np.array([bad])],
                   (every[:5000], np.concatenate((every[5000:6000], [bad]))),
                   np.concatenate((every, [bad]))):
        before = b.page_states(a, size), b.now_ns(), b.bus.published
        with pytest.raises(ul.errors.InvalidArgumentError, match=f"{int(bad):#x}"):
            b.access_stream(stream, ul.Location.device(0), "read")
        assert np.array_equal(b.page_states(a, size), before[0])
        assert (b.now_ns(), b.bus.published) == before[1:]


def test_write_arrays_must_match_their_chunks():
    from uvm_lab.backends.sim import SimBackend
    from uvm_lab.events import EventBus

    b = SimBackend(device_memory="64MiB", bus=EventBus())
    a = b.allocate(4 * BLOCK_SIZE, MemoryKind.MANAGED)
    pages = a + np.arange(4 * BLOCK_SIZE // PAGE_SIZE, dtype=np.uint64) * PAGE_SIZE
    chunks = [pages[:100], pages[100:300]]
    cases = (([np.zeros(100, bool), np.zeros(3, bool)], "chunk 1 has 3 flags for 200"),
             ([np.zeros(100, bool)], "no write array for address chunk 1"),
             ([np.zeros(100, bool), np.zeros(200, bool), np.zeros(5, bool)], "more write arrays"),
             ([np.zeros(100, np.int8), np.zeros(200, bool)], "must be boolean"))
    for mode, message in cases:
        before = b.page_states(a, 4 * BLOCK_SIZE), b.now_ns(), b.bus.published
        with pytest.raises(ul.errors.InvalidArgumentError, match=message):
            b.access_stream(chunks, ul.Location.device(0), mode)
        assert np.array_equal(b.page_states(a, 4 * BLOCK_SIZE), before[0])
        assert (b.now_ns(), b.bus.published) == before[1:]


def test_a_chunk_longer_than_one_part_keeps_its_write_flags_in_step():
    """Writes go with their own accesses when a chunk is split for translation (2**20 accesses a part)."""
    from uvm_lab.backends.sim import SimBackend
    from uvm_lab.events import EventBus

    b = SimBackend(device_memory="8GiB", bus=EventBus())
    n = (1 << 20) + 4096
    a = b.allocate(n * PAGE_SIZE, MemoryKind.MANAGED)
    every = a + np.arange(n, dtype=np.uint64) * PAGE_SIZE
    write = np.zeros(n, dtype=bool)
    write[-2048:] = True                            # only pages of the second part are written
    got: list[np.ndarray] = []
    b.bus.subscribe(got.append, kinds=[EventKind.GPU_PAGE_FAULT])
    b.access_stream(every, ul.Location.device(0), write)
    b.bus.flush()
    faults = np.concatenate(got)
    written = faults[faults["flags"] != ul.events.AccessType.READ]
    first = (written["address"] - np.uint64(a)) // np.uint64(PAGE_SIZE)
    last = first + written["bytes"] // np.uint64(PAGE_SIZE)
    touched = np.zeros(n, dtype=bool)
    for lo, hi in zip(first.tolist(), last.tolist(), strict=True):
        touched[lo:hi] = True
    assert np.array_equal(touched, write)


def test_a_backend_made_earlier_is_made_current_again_as_it_is():
    first = ul.get_backend()
    buf = ul.DeviceBuffer(size="4MiB")
    second = ul.use_backend("sim", device_memory="8MiB")
    assert ul.get_backend() is second and second is not first
    assert ul.use_backend(first) is first and ul.get_backend() is first
    ul.touch(buf, on="gpu", mode="write")   # the buffer made on it works as before
    assert ul.residency(buf).summary()["gpu"] == 1.0
    with pytest.raises(InvalidArgumentError, match="options are for a new backend"):
        ul.use_backend(second, device_memory="1GiB")
    with pytest.raises(InvalidArgumentError, match="backend must be one of auto, sim, cuda or a Backend"):
        ul.use_backend("tpu")
    assert ul.get_backend() is first   # neither refusal changed the current backend
