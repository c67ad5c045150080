"""PoolMemoryResource on the simulator: alignment, best fit, coalescing, growth, limits, errors."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest

import uvm_lab as ul
from uvm_lab.errors import (
    BackendError,
    DoubleFreeError,
    InvalidArgumentError,
    InvalidSizeError,
    InvalidStateError,
    OutOfMemoryError,
)
from uvm_lab.events.schema import EventKind
from uvm_lab.mr.base import MemoryResource, resource_chain
from uvm_lab.mr.pool import ALIGNMENT, PoolMemoryResource

from .upstreams import CappedUpstream, ContiguousUpstream
from .waiting import eventually

KiB = 1 << 10
MiB = 1 << 20


def align(n: int) -> int:
    return -(-n // ALIGNMENT) * ALIGNMENT


@pytest.fixture(autouse=True)
def backend(sim_backend):
    """The conftest's fresh simulated device."""
    yield sim_backend
    # Pools caught in reference cycles (a pytest.raises traceback) give their blocks back to this
    # device now, not after the next test has made another.
    gc.collect()


@pytest.fixture
def managed() -> MemoryResource:
    return ul.mr.ManagedMemoryResource()


@pytest.fixture
def make_pool():
    """Builds pools; afterwards frees what the test left allocated and gives every block back."""
    pools: list[PoolMemoryResource] = []

    def make(*args, **kwargs) -> PoolMemoryResource:
        pools.append(PoolMemoryResource(*args, **kwargs))
        return pools[-1]

    yield make
    for pool in reversed(pools):
        for ptr, (size, _) in list(pool._live.items()):
            pool.deallocate(ptr, size)
        pool.release()


@pytest.fixture
def grows(backend):
    """The POOL_GROW records published so far in the test, as (address, bytes) pairs."""
    seen: list[tuple[int, int]] = []
    sub = backend.bus.subscribe(lambda recs: seen.extend((int(r["address"]), int(r["bytes"])) for r in recs),
                                kinds=[EventKind.POOL_GROW])

    def published() -> list[tuple[int, int]]:
        backend.bus.flush()
        return seen

    yield published
    sub.close()


def snapshot(pool: PoolMemoryResource) -> tuple:
    return pool.pool_size(), pool.upstream_blocks(), pool.free_ranges(), pool.get_allocated_bytes()


# -- construction -------------------------------------------------------------------------------

def test_initial_pool_size_is_taken_from_upstream_at_once(make_pool, managed, grows):
    before = managed.get_allocated_bytes()
    pool = make_pool(managed, initial_pool_size="1MiB")
    assert pool.pool_size() == MiB
    assert managed.get_allocated_bytes() - before == MiB
    [(address, size)] = pool.upstream_blocks()
    assert size == MiB
    assert pool.free_ranges() == [(address, MiB)]
    assert grows() == [(address, MiB)]


def test_default_initial_pool_size_is_half_the_free_device_memory(make_pool, backend, managed):
    free = backend.mem_info(0)[0]
    pool = make_pool(managed)
    assert pool.pool_size() == (free // 2) // ALIGNMENT * ALIGNMENT
    assert pool.maximum_pool_size is None


def test_default_initial_pool_size_is_clamped_to_the_maximum(make_pool, managed):
    pool = make_pool(managed, maximum_pool_size="1MiB")
    assert pool.pool_size() == MiB
    assert pool.maximum_pool_size == MiB


def test_zero_initial_pool_size_takes_nothing_until_used(make_pool, managed, grows):
    pool = make_pool(managed, initial_pool_size=0)
    assert pool.pool_size() == 0
    assert pool.upstream_blocks() == []
    assert grows() == []


@pytest.mark.parametrize("initial, maximum", [("2 MiB", None), (2048, "1GB"), ("4KiB", "4kib")])
def test_sizes_may_be_ints_or_strings(make_pool, managed, initial, maximum):
    pool = make_pool(managed, initial, maximum)
    assert pool.pool_size() == ul.units.parse_size(initial)


def test_the_pool_follows_its_upstream(make_pool, managed):
    pool = make_pool(managed, initial_pool_size=0)
    assert pool.upstream_mr is managed
    assert pool.get_upstream() is managed
    assert pool.is_managed is managed.is_managed
    assert pool.device_id == managed.device_id
    assert pool.backend is managed.backend
    assert resource_chain(pool) == [pool, managed]
    assert repr(pool) == f"PoolMemoryResource({managed!r}, pool_size='0 B', maximum_pool_size=None)"


# -- argument validation --------------------------------------------------------------------------

@pytest.mark.parametrize("upstream", [None, 5, "managed", object()])
def test_upstream_must_be_a_memory_resource(upstream):
    with pytest.raises(InvalidArgumentError, match="upstream_mr must be a uvm_lab memory resource") as info:
        PoolMemoryResource(upstream)
    assert info.value.value is upstream


@pytest.mark.parametrize("name", ["initial_pool_size", "maximum_pool_size"])
@pytest.mark.parametrize("value", [-256, "12 parsecs", 1.5, True, [1024]])
def test_bad_sizes_raise_invalid_size(make_pool, managed, name, value):
    with pytest.raises(InvalidSizeError, match=name) as info:
        make_pool(managed, **{name: value})
    assert info.value.value == value


@pytest.mark.parametrize("name", ["initial_pool_size", "maximum_pool_size"])
def test_sizes_must_be_multiples_of_256(make_pool, managed, name):
    with pytest.raises(InvalidSizeError, match=r"multiple of 256 bytes, got 1000 = 1000 bytes; use 768 or 1024"):
        make_pool(managed, **{name: 1000})
    with pytest.raises(InvalidSizeError, match=r"use 256$"):
        make_pool(managed, **{name: 100})


def test_maximum_pool_size_must_be_positive(make_pool, managed):
    with pytest.raises(InvalidSizeError, match="maximum_pool_size must be positive"):
        make_pool(managed, maximum_pool_size=0)


def test_initial_larger_than_maximum_is_an_error(make_pool, managed):
    before = managed.get_allocated_bytes()
    with pytest.raises(InvalidArgumentError, match=r"initial_pool_size \(2 MiB\) is larger than maximum_pool_size"):
        make_pool(managed, initial_pool_size="2MiB", maximum_pool_size="1MiB")
    assert managed.get_allocated_bytes() == before


@pytest.mark.parametrize("nbytes", [-1, "lots", 2.0, None])
def test_bad_allocation_sizes_raise_and_change_nothing(make_pool, managed, nbytes):
    pool = make_pool(managed, initial_pool_size="64KiB")
    before = snapshot(pool)
    with pytest.raises(InvalidSizeError):
        pool.allocate(nbytes)
    assert snapshot(pool) == before


def test_bad_stream_raises(make_pool, managed):
    pool = make_pool(managed, initial_pool_size="64KiB")
    with pytest.raises(InvalidArgumentError, match="stream"):
        pool.allocate(256, stream=-1)


# -- alignment and best fit ----------------------------------------------------------------------

@pytest.mark.parametrize("size", [1, 255, 256, 257, 1000, 4096, 65537])
def test_allocations_are_256_byte_aligned_and_take_whole_granules(make_pool, managed, size):
    pool = make_pool(managed, initial_pool_size="1MiB")
    [(base, _)] = pool.upstream_blocks()
    first = pool.allocate(size)
    second = pool.allocate(1)
    assert first % ALIGNMENT == 0 and second % ALIGNMENT == 0
    assert first == base
    assert second - first == align(size)


def test_a_zero_byte_request_is_a_null_pointer_that_takes_nothing(make_pool, managed):
    pool = make_pool(managed, initial_pool_size="64KiB")
    before = snapshot(pool)
    assert pool.allocate(0) == 0
    assert snapshot(pool) == before
    pool.deallocate(0, 0)
    assert snapshot(pool) == before


def test_best_fit_takes_the_smallest_hole_that_holds_the_request(make_pool, managed):
    pool = make_pool(managed, initial_pool_size="1MiB")
    sizes = [4 * KiB, 1 * KiB, 16 * KiB, 1 * KiB, 2 * KiB, 1 * KiB, 2 * KiB, 1 * KiB]
    ptrs = [pool.allocate(s) for s in sizes]
    # Holes of 4 KiB, 16 KiB, 2 KiB and 2 KiB (at ptrs[0], [2], [4], [6]), then the pool's tail.
    for i in (0, 2, 4, 6):
        pool.deallocate(ptrs[i], sizes[i])
    assert pool.allocate(1500) == ptrs[4]          # a 2 KiB hole; of the two, the lower address
    assert pool.allocate(2 * KiB) == ptrs[6]       # the other 2 KiB hole
    assert pool.allocate(3 * KiB) == ptrs[0]       # the 4 KiB hole, not the 16 KiB one
    assert pool.allocate(5 * KiB) == ptrs[2]       # the 16 KiB hole, not the tail
    assert pool.allocate(11 * KiB) == ptrs[2] + 5 * KiB   # what was left of it


def test_a_request_is_cut_from_the_front_of_its_hole(make_pool, managed):
    pool = make_pool(managed, initial_pool_size="64KiB")
    [(base, _)] = pool.upstream_blocks()
    ptr = pool.allocate(1000)
    assert ptr == base
    assert pool.free_ranges() == [(base + 1024, 63 * KiB)]


# -- coalescing ----------------------------------------------------------------------------------

@pytest.mark.parametrize("order", [(0, 1, 2), (1, 0, 2), (1, 2, 0), (2, 1, 0), (0, 2, 1), (2, 0, 1)])
def test_freed_neighbours_coalesce_whatever_the_order(make_pool, managed, order):
    pool = make_pool(managed, initial_pool_size="64KiB")
    [(base, _)] = pool.upstream_blocks()
    sizes = [1000, 3000, 5000]
    ptrs = [pool.allocate(s) for s in sizes]
    tail = pool.allocate(256)            # keeps the three away from the free tail
    for i in order:
        pool.deallocate(ptrs[i], sizes[i])
    hole = align(1000) + align(3000) + align(5000)
    assert (base, hole) in pool.free_ranges()
    pool.deallocate(tail, 256)
    assert pool.free_ranges() == [(base, 64 * KiB)]


def test_free_ranges_never_coalesce_across_upstream_blocks(make_pool, managed):
    region = ContiguousUpstream(managed, 8 * MiB)
    pool = make_pool(region, initial_pool_size="1MiB")
    a = pool.allocate(MiB)                # fills the first block
    b = pool.allocate(MiB)                # grows: the second block starts where the first ends
    blocks = pool.upstream_blocks()
    assert blocks == [(region.region, MiB), (region.region + MiB, MiB)]
    assert b == a + MiB
    pool.deallocate(a, MiB)
    pool.deallocate(b, MiB)
    assert pool.free_ranges() == blocks
    # A request of both blocks' size cannot use the two touching ranges; the pool grows instead.
    c = pool.allocate(2 * MiB)
    assert c == region.region + 2 * MiB
    pool.deallocate(c, 2 * MiB)
    pool.release()
    region.close()


def test_a_range_freed_between_blocks_keeps_to_its_own_block(make_pool, managed):
    region = ContiguousUpstream(managed, 8 * MiB)
    pool = make_pool(region, initial_pool_size="1MiB")
    head = pool.allocate(MiB - 4 * KiB)
    last = pool.allocate(4 * KiB)                      # the last 4 KiB of block 1
    first = pool.allocate(4 * KiB * 256)               # grows: all of block 2 (1 MiB)
    assert first == last + 4 * KiB
    pool.deallocate(last, 4 * KiB)
    assert pool.free_ranges() == [(last, 4 * KiB)]
    pool.deallocate(first, MiB)
    assert pool.free_ranges() == [(last, 4 * KiB), (first, MiB)]
    pool.deallocate(head, MiB - 4 * KiB)
    assert pool.free_ranges() == pool.upstream_blocks()
    pool.release()
    region.close()


# -- growth -------------------------------------------------------------------------------------

def test_an_uncapped_pool_doubles_or_takes_the_request(make_pool, managed, grows):
    pool = make_pool(managed, initial_pool_size="1MiB")
    pool.allocate(512 * KiB)
    pool.allocate(MiB)                       # no fit: grow by max(1 MiB, pool_size 1 MiB)
    assert pool.pool_size() == 2 * MiB
    pool.allocate(5 * MiB)                   # grow by max(5 MiB, 2 MiB)
    assert pool.pool_size() == 7 * MiB
    pool.allocate(256)                       # fits in the first block's free half
    assert pool.pool_size() == 7 * MiB
    assert [size for _, size in grows()] == [MiB, MiB, 5 * MiB]
    assert sorted(grows()) == pool.upstream_blocks()


def test_a_capped_pool_grows_half_way_to_its_maximum(make_pool, managed, grows):
    pool = make_pool(managed, initial_pool_size="1MiB", maximum_pool_size="9MiB")
    pool.allocate(MiB)
    pool.allocate(256)                       # grow by max(256 B, (9 - 1) / 2 MiB) = 4 MiB
    assert pool.pool_size() == 5 * MiB
    pool.allocate(4 * MiB)                   # 4 MiB - 256 B left: grow by max(4 MiB, 2 MiB)
    assert pool.pool_size() == 9 * MiB
    assert [size for _, size in grows()] == [MiB, 4 * MiB, 4 * MiB]


def test_pool_grow_events_name_the_new_block(make_pool, backend, managed):
    seen = []
    sub = backend.bus.subscribe(seen.append, kinds=[EventKind.POOL_GROW, EventKind.ALLOC])
    pool = make_pool(managed, initial_pool_size=0)
    ptr = pool.allocate(3000)
    sub.close()
    records = np.concatenate(seen)
    kinds = [EventKind(k) for k in records["kind"]]
    # The upstream's ALLOC of the block, then POOL_GROW, then the pool's own ALLOC.
    assert kinds == [EventKind.ALLOC, EventKind.POOL_GROW, EventKind.ALLOC]
    block_alloc, grow, alloc = records
    [(block, size)] = pool.upstream_blocks()
    assert (grow["address"], grow["bytes"]) == (block, size) == (block_alloc["address"], block_alloc["bytes"])
    assert grow["alloc_id"] == block_alloc["alloc_id"] == managed.allocation_id(block)
    assert (alloc["address"], alloc["bytes"]) == (ptr, 3000)
    assert alloc["alloc_id"] == pool.allocation_id(ptr)


def test_when_the_upstream_is_short_the_pool_backs_off_to_the_request(make_pool, managed, grows):
    capped = CappedUpstream(managed, limit=5 * MiB)
    pool = make_pool(capped, initial_pool_size="4MiB")
    pool.allocate(4 * MiB)
    pool.allocate(512 * KiB)                 # tries 4 MiB, then 2 MiB, then 1 MiB: that fits
    assert [size for _, size in grows()] == [4 * MiB, MiB]
    assert pool.pool_size() == capped.held == 5 * MiB


# -- running out ---------------------------------------------------------------------------------

def test_past_the_maximum_allocation_fails_and_changes_nothing(make_pool, backend, managed):
    failures = []
    sub = backend.bus.subscribe(failures.append, kinds=[EventKind.ALLOC_FAILURE])
    pool = make_pool(managed, initial_pool_size="1MiB", maximum_pool_size="2MiB")
    ptr = pool.allocate(768 * KiB)
    before = snapshot(pool)
    upstream_before = managed.get_allocated_bytes()
    with pytest.raises(OutOfMemoryError, match="maximum_pool_size") as info:
        pool.allocate(1536 * KiB)
    sub.close()   # after what it was sent
    assert info.value.size == 1536 * KiB
    assert info.value.limit == 2 * MiB
    assert info.value.free == 256 * KiB
    assert isinstance(info.value, MemoryError)
    assert snapshot(pool) == before
    assert managed.get_allocated_bytes() == upstream_before
    assert len(failures) == 1 and failures[0]["bytes"][0] == 1536 * KiB
    # What does fit still works: the whole first block, then a second block up to the maximum.
    pool.deallocate(ptr, 768 * KiB)
    pool.allocate(MiB)
    pool.allocate(MiB)
    assert pool.pool_size() == 2 * MiB


def test_a_request_larger_than_the_maximum_fails(make_pool, managed):
    pool = make_pool(managed, initial_pool_size=0, maximum_pool_size="1MiB")
    with pytest.raises(OutOfMemoryError):
        pool.allocate(MiB + 1)
    assert pool.pool_size() == 0
    assert pool.allocate(MiB) is not None


def test_upstream_out_of_memory_becomes_the_pools_and_changes_nothing(make_pool, managed):
    capped = CappedUpstream(managed, limit=3 * MiB)
    pool = make_pool(capped, initial_pool_size="1MiB")
    pool.allocate(MiB)
    pool.allocate(2 * MiB)                   # grows to the cap exactly
    before = snapshot(pool)
    with pytest.raises(OutOfMemoryError, match="upstream CappedUpstream cannot supply a block of 1 MiB") as info:
        pool.allocate(MiB)
    assert isinstance(info.value.__cause__, OutOfMemoryError)
    assert info.value.size == MiB and info.value.limit == 0
    assert snapshot(pool) == before
    assert capped.held == 3 * MiB


def test_initial_pool_size_the_upstream_cannot_supply_raises(make_pool, managed):
    capped = CappedUpstream(managed, limit=MiB)
    with pytest.raises(OutOfMemoryError):
        make_pool(capped, initial_pool_size="2MiB")
    assert capped.held == 0


def test_a_misaligned_upstream_block_is_refused_and_given_back(make_pool, managed):
    class Misaligned(CappedUpstream):
        def _allocate(self, size: int, stream: int) -> int:
            return super()._allocate(size, stream) + 128

        def _deallocate(self, ptr: int, size: int, stream: int) -> None:
            super()._deallocate(ptr - 128, size, stream)

    shifted = Misaligned(managed, limit=MiB)
    with pytest.raises(BackendError, match="not 256-byte aligned"):
        make_pool(shifted, initial_pool_size="64KiB")
    assert shifted.held == 0


# -- freeing -------------------------------------------------------------------------------------

def test_double_free_raises_and_changes_nothing(make_pool, managed):
    pool = make_pool(managed, initial_pool_size="64KiB")
    ptr = pool.allocate(1000)
    keep = pool.allocate(1000)
    pool.deallocate(ptr, 1000)
    before = snapshot(pool)
    with pytest.raises(DoubleFreeError) as info:
        pool.deallocate(ptr, 1000)
    assert info.value.ptr == ptr
    assert snapshot(pool) == before
    pool.deallocate(keep, 1000)


def test_freeing_what_the_pool_never_gave_raises(make_pool, managed):
    pool = make_pool(managed, initial_pool_size="64KiB")
    other = managed.allocate(4096)
    with pytest.raises(DoubleFreeError):
        pool.deallocate(other, 4096)
    [(base, _)] = pool.upstream_blocks()
    with pytest.raises(DoubleFreeError):
        pool.deallocate(base + 256, 256)     # inside the pool, but not an allocation
    managed.deallocate(other, 4096)


def test_freeing_with_the_wrong_size_raises_and_changes_nothing(make_pool, managed):
    pool = make_pool(managed, initial_pool_size="64KiB")
    ptr = pool.allocate(1000)
    before = snapshot(pool)
    with pytest.raises(InvalidArgumentError, match="allocated with 1000 bytes"):
        pool.deallocate(ptr, 1024)
    assert snapshot(pool) == before
    pool.deallocate(ptr, "1000")


# -- release and lifetime ------------------------------------------------------------------------

def test_release_refuses_while_allocations_are_live(make_pool, managed):
    pool = make_pool(managed, initial_pool_size="64KiB")
    ptrs = [pool.allocate(100) for _ in range(3)]
    before = snapshot(pool)
    with pytest.raises(InvalidStateError, match=r"3 allocation\(s\) \(768 B\) are still live"):
        pool.release()
    assert snapshot(pool) == before
    for ptr in ptrs:
        pool.deallocate(ptr, 100)


def test_release_gives_every_block_back_and_the_pool_can_grow_again(make_pool, managed, grows):
    baseline = managed.get_allocated_bytes()
    pool = make_pool(managed, initial_pool_size="1MiB")
    ptr = pool.allocate(3 * MiB)
    pool.deallocate(ptr, 3 * MiB)
    assert managed.get_allocated_bytes() - baseline == 4 * MiB
    pool.release()
    assert pool.pool_size() == 0
    assert pool.upstream_blocks() == [] and pool.free_ranges() == []
    assert managed.get_allocated_bytes() == baseline
    pool.release()                            # nothing left: a no-op
    ptr = pool.allocate(1000)
    assert pool.pool_size() == ALIGNMENT * 4
    pool.deallocate(ptr, 1000)


def test_garbage_collection_gives_the_blocks_back(managed):
    baseline = managed.get_allocated_bytes()
    pool = PoolMemoryResource(managed, initial_pool_size="1MiB")
    pool.deallocate(pool.allocate(2 * MiB), 2 * MiB)
    assert managed.get_allocated_bytes() > baseline
    del pool
    gc.collect()
    assert eventually(lambda: managed.get_allocated_bytes() == baseline)   # soon, off the collector's thread


def test_garbage_collection_with_live_allocations_warns_and_still_gives_back(managed):
    baseline = managed.get_allocated_bytes()
    pool = PoolMemoryResource(managed, initial_pool_size="1MiB")
    pool.allocate(1000)
    with pytest.warns(ResourceWarning, match="1 live allocation"):
        del pool
        gc.collect()
        ul.deferred.run()          # the queued give-back, run here so that its warning is seen here
    assert managed.get_allocated_bytes() == baseline


# -- threads -------------------------------------------------------------------------------------

def test_concurrent_allocate_and_free_keep_the_pool_consistent(make_pool, managed):
    pool = make_pool(managed, initial_pool_size="1MiB")
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            held = []
            for i in range(400):
                size = (seed * 7919 + i * 104729) % 20000
                held.append((pool.allocate(size), size))
                if i % 3 == 2:
                    for ptr, n in held[:2]:
                        pool.deallocate(ptr, n)
                    del held[:2]
            for ptr, n in held:
                pool.deallocate(ptr, n)
        except BaseException as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert pool.get_allocated_bytes() == 0
    assert pool.free_ranges() == pool.upstream_blocks()


@pytest.mark.parametrize("resource", ["PoolMemoryResource", "ArenaMemoryResource", "FixedSizeMemoryResource"])
def test_a_script_that_leaves_a_suballocator_alive_exits(resource):
    # The suballocator is collected while the interpreter shuts down, when no thread can start:
    # giving its blocks back must not wait for one.
    import subprocess
    import sys

    size = "initial_pool_size=1 << 20" if resource == "PoolMemoryResource" else ""
    code = ("import uvm_lab as ul\n"
            f"mr = ul.mr.{resource}(ul.mr.ManagedMemoryResource(), {size})\n"
            "ptr = mr.allocate(1000)\n"
            "print('allocated')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "allocated"
