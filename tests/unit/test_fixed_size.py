"""FixedSizeMemoryResource on the simulator: blocks, chunks, growth, validation and failure."""

from __future__ import annotations

import pytest

import uvm_lab as ul
from uvm_lab.errors import DoubleFreeError, InvalidArgumentError, InvalidSizeError, InvalidStateError, OutOfMemoryError
from uvm_lab.events.schema import EventKind
from uvm_lab.mr.fixed_size import FixedSizeMemoryResource

from .upstreams import CappedUpstream
from .waiting import eventually

KiB = 1 << 10
MiB = 1 << 20


@pytest.fixture
def managed():
    return ul.mr.ManagedMemoryResource()


def test_defaults_are_rmms(managed):
    mr = FixedSizeMemoryResource(managed)
    assert mr.get_block_size() == mr.block_size == MiB
    assert mr.blocks_to_preallocate == 128
    assert mr.pool_size() == 128 * MiB       # one chunk taken at construction
    assert mr.free_blocks() == 128
    assert mr.upstream_mr is managed and ul.mr.resource_chain(mr) == [mr, managed]


def test_blocks_are_distinct_and_reused(managed):
    mr = FixedSizeMemoryResource(managed, "64KiB", 4)
    ptrs = [mr.allocate(1 + i * 1000) for i in range(4)]
    assert sorted(ptrs) == [ptrs[0] + i * 64 * KiB for i in range(4)]
    assert mr.pool_size() == 256 * KiB
    mr.deallocate(ptrs[2], 2001)
    assert mr.allocate(64 * KiB) == ptrs[2]          # the last freed block is reused first
    assert mr.get_allocated_bytes() == 1 + 1001 + 3001 + 64 * KiB


def test_it_grows_a_chunk_at_a_time_and_says_so(managed):
    mr = FixedSizeMemoryResource(managed, "4KiB", 2)
    with ul.record() as trace:
        ptrs = [mr.allocate(100) for _ in range(5)]
    grows = trace.events[trace.events["kind"] == EventKind.POOL_GROW]
    assert list(grows["bytes"]) == [8 * KiB, 8 * KiB]
    assert mr.pool_size() == 24 * KiB and len(mr.upstream_blocks()) == 3
    assert len(set(ptrs)) == 5
    allocs = trace.events[trace.events["kind"] == EventKind.ALLOC]
    assert [int(a) for a in allocs[allocs["bytes"] == 100]["address"]] == ptrs


def test_block_size_is_rounded_up_to_256(managed):
    assert FixedSizeMemoryResource(managed, 1000, 1).block_size == 1024
    assert FixedSizeMemoryResource(managed, "1KiB", 1).block_size == 1024


def test_a_request_larger_than_the_block_raises(managed):
    mr = FixedSizeMemoryResource(managed, "4KiB", 2)
    with pytest.raises(InvalidSizeError, match="larger") as err:
        mr.allocate(4 * KiB + 1)
    assert err.value.value == 4 * KiB + 1
    assert mr.get_allocated_bytes() == 0 and mr.free_blocks() == 2


@pytest.mark.parametrize(("kwargs", "error"), [
    ({"block_size": 0}, InvalidSizeError),
    ({"block_size": "12 parsecs"}, InvalidSizeError),
    ({"block_size": -1}, InvalidSizeError),
    ({"blocks_to_preallocate": 0}, InvalidArgumentError),
    ({"blocks_to_preallocate": -3}, InvalidArgumentError),
    ({"blocks_to_preallocate": 2.0}, InvalidArgumentError),
    ({"blocks_to_preallocate": True}, InvalidArgumentError),
])
def test_bad_arguments_are_named(managed, kwargs, error):
    with pytest.raises(error) as err:
        FixedSizeMemoryResource(managed, **kwargs)
    assert err.value.value == next(iter(kwargs.values()))
    assert managed.get_allocated_bytes() == 0


def test_upstream_must_be_a_resource():
    with pytest.raises(InvalidArgumentError, match="upstream_mr"):
        FixedSizeMemoryResource("managed")  # type: ignore[arg-type]


def test_a_short_upstream_halves_the_chunk_then_fails_unchanged(managed):
    upstream = CappedUpstream(managed, 20 * KiB)
    mr = FixedSizeMemoryResource(upstream, "4KiB", 4)        # 16 KiB
    ptrs = [mr.allocate(4 * KiB) for _ in range(4)]
    ptrs.append(mr.allocate(1))                               # 16 KiB refused, 8 refused, 4 KiB given
    assert mr.pool_size() == 20 * KiB
    before = (mr.pool_size(), mr.free_blocks(), mr.upstream_blocks(), mr.get_allocated_bytes())
    with ul.record() as trace, pytest.raises(OutOfMemoryError) as err:
        mr.allocate(10)
    assert err.value.size == 4 * KiB
    assert (mr.pool_size(), mr.free_blocks(), mr.upstream_blocks(), mr.get_allocated_bytes()) == before
    assert EventKind.ALLOC_FAILURE in set(trace.events["kind"].tolist())
    for p in ptrs[:4]:
        mr.deallocate(p, 4 * KiB)
    mr.deallocate(ptrs[4], 1)


def test_construction_fails_when_not_even_a_block_fits(managed):
    with pytest.raises(OutOfMemoryError):
        FixedSizeMemoryResource(CappedUpstream(managed, KiB), "4KiB", 8)


def test_double_free_and_wrong_size(managed):
    mr = FixedSizeMemoryResource(managed, "4KiB", 2)
    ptr = mr.allocate(100)
    with pytest.raises(InvalidArgumentError):
        mr.deallocate(ptr, 101)
    mr.deallocate(ptr, 100)
    with pytest.raises(DoubleFreeError):
        mr.deallocate(ptr, 100)
    assert mr.free_blocks() == 2


def test_release_gives_every_chunk_back(managed):
    upstream = CappedUpstream(managed, MiB)
    mr = FixedSizeMemoryResource(upstream, "4KiB", 2)
    ptr = mr.allocate(1)
    with pytest.raises(InvalidStateError, match="still live"):
        mr.release()
    mr.deallocate(ptr, 1)
    mr.release()
    assert upstream.held == 0 and mr.pool_size() == 0
    ptr = mr.allocate(1)                                       # takes a chunk again
    assert upstream.held == 8 * KiB
    mr.deallocate(ptr, 1)


def test_garbage_collection_gives_the_chunks_back(managed):
    upstream = CappedUpstream(managed, MiB)
    mr = FixedSizeMemoryResource(upstream, "4KiB", 2)
    del mr
    assert eventually(lambda: upstream.held == 0)       # given back soon, off the collector's thread


def test_repr(managed):
    assert repr(FixedSizeMemoryResource(managed, "4KiB", 2)) == \
        "FixedSizeMemoryResource(ManagedMemoryResource(), block_size='4 KiB', blocks_to_preallocate=2)"
