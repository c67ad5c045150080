"""ArenaMemoryResource on the simulator: size classes, superblocks, large ranges, validation and failure."""

from __future__ import annotations

from itertools import pairwise

import pytest

import uvm_lab as ul
from uvm_lab.errors import DoubleFreeError, InvalidArgumentError, InvalidSizeError, InvalidStateError, OutOfMemoryError
from uvm_lab.events.schema import EventKind
from uvm_lab.mr.arena import SIZE_CLASSES, SMALL_MAX, SUPERBLOCK_SIZE, ArenaMemoryResource

from .upstreams import CappedUpstream
from .waiting import eventually

KiB = 1 << 10
MiB = 1 << 20


@pytest.fixture
def managed():
    return ul.mr.ManagedMemoryResource()


@pytest.fixture
def arena(managed):
    return ArenaMemoryResource(managed, "8MiB")


def test_size_classes_are_ascending_256_aligned_and_end_at_small_max():
    assert list(SIZE_CLASSES) == sorted(set(SIZE_CLASSES))
    assert all(c % 256 == 0 for c in SIZE_CLASSES)
    assert SIZE_CLASSES[0] == 256 and SIZE_CLASSES[-1] == SMALL_MAX
    # Four classes per doubling past 1 KiB: at most 25 % lost to rounding there.
    assert all(b / a <= 1.25 for a, b in pairwise(SIZE_CLASSES[3:]))


def test_default_arena_is_half_the_free_memory(managed):
    free = ul.get_backend().mem_info(0)[0]
    arena = ArenaMemoryResource(managed)
    assert arena.arena_size == (free // 2) & -256
    assert arena.pool_size() == arena.arena_size
    assert arena.dump_log_on_failure is False


def test_the_arena_is_taken_once_and_published(managed):
    with ul.record() as trace:
        arena = ArenaMemoryResource(managed, "4MiB")
    grows = trace.events[trace.events["kind"] == EventKind.POOL_GROW]
    assert [(int(g["address"]), int(g["bytes"])) for g in grows] == arena.upstream_blocks()
    assert arena.upstream_blocks()[0][1] == 4 * MiB


def test_small_requests_share_a_superblock_of_their_class(arena):
    a, b = arena.allocate(100), arena.allocate(200)          # both in the 256-byte class
    assert abs(a - b) == 256
    c = arena.allocate(1100)                                  # the 1.25 KiB class: another superblock
    sbs = arena.superblocks()
    assert sorted(cls for cls, _ in sbs.values()) == [256, 1280]
    assert arena.free_ranges() == [(arena.upstream_blocks()[0][0] + 2 * SUPERBLOCK_SIZE, 6 * MiB)]
    for p, s in ((a, 100), (b, 200), (c, 1100)):
        arena.deallocate(p, s)
    assert arena.superblocks() == {}                          # empty superblocks go home at once
    assert arena.free_ranges() == arena.upstream_blocks()


def test_large_requests_are_cut_best_fit_and_coalesce(arena):
    base = arena.upstream_blocks()[0][0]
    a = arena.allocate(2 * MiB)
    b = arena.allocate(SMALL_MAX + 1)                         # large: rounded to 256 only
    assert (a, b) == (base, base + 2 * MiB)
    assert arena.free_ranges() == [(b + SMALL_MAX + 256, 8 * MiB - 2 * MiB - SMALL_MAX - 256)]
    arena.deallocate(a, 2 * MiB)
    c = arena.allocate(MiB)                                   # best fit: the 2 MiB hole, not the tail
    assert c == base
    arena.deallocate(b, SMALL_MAX + 1)
    arena.deallocate(c, MiB)
    assert arena.free_ranges() == [(base, 8 * MiB)]


def test_running_out_raises_and_changes_nothing(managed):
    arena = ArenaMemoryResource(managed, "2MiB")
    big = arena.allocate(MiB + 512 * KiB)
    state = (arena.free_ranges(), arena.superblocks(), arena.get_allocated_bytes())
    with ul.record() as trace, pytest.raises(OutOfMemoryError) as err:
        arena.allocate(100)                                   # needs a whole superblock: none is left
    assert err.value.size == 100 and err.value.limit == 2 * MiB and err.value.free == 512 * KiB
    with pytest.raises(OutOfMemoryError, match="largest free range 512 KiB"):
        arena.allocate(600 * KiB)
    assert (arena.free_ranges(), arena.superblocks(), arena.get_allocated_bytes()) == state
    assert list(trace.events["kind"]) == [EventKind.ALLOC_FAILURE]
    arena.deallocate(big, MiB + 512 * KiB)


def test_dump_log_on_failure_appends_rmms_file(managed, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    arena = ArenaMemoryResource(managed, "1MiB", dump_log_on_failure=True)
    with pytest.raises(OutOfMemoryError):
        arena.allocate(2 * MiB)
    text = (tmp_path / "rmm_arena_memory_dump.log").read_text()
    assert "allocation of 2097152 bytes failed" in text
    assert "ArenaMemoryResource: arena 1 MiB" in text
    quiet = ArenaMemoryResource(managed, "1MiB")
    with pytest.raises(OutOfMemoryError):
        quiet.allocate(2 * MiB)
    assert (tmp_path / "rmm_arena_memory_dump.log").read_text() == text


@pytest.mark.parametrize(("kwargs", "error"), [
    ({"arena_size": 0}, InvalidSizeError),
    ({"arena_size": "1KiB"}, InvalidSizeError),                # smaller than a superblock
    ({"arena_size": MiB + 1}, InvalidSizeError),               # not a multiple of 256
    ({"arena_size": "huge"}, InvalidSizeError),
    ({"arena_size": 2.5}, InvalidSizeError),
    ({"dump_log_on_failure": 1}, InvalidArgumentError),
    ({"dump_log_on_failure": "yes"}, InvalidArgumentError),
])
def test_bad_arguments_are_named(managed, kwargs, error):
    with pytest.raises(error) as err:
        ArenaMemoryResource(managed, **kwargs)
    assert err.value.value == next(iter(kwargs.values()))
    assert managed.get_allocated_bytes() == 0


def test_upstream_must_be_a_resource():
    with pytest.raises(InvalidArgumentError, match="upstream_mr"):
        ArenaMemoryResource(42, "1MiB")  # type: ignore[arg-type]


def test_an_upstream_that_cannot_supply_the_arena(managed):
    with pytest.raises(OutOfMemoryError):
        ArenaMemoryResource(CappedUpstream(managed, MiB), "2MiB")


def test_double_free_and_wrong_size(arena):
    ptr = arena.allocate(300)
    with pytest.raises(InvalidArgumentError):
        arena.deallocate(ptr, 301)
    arena.deallocate(ptr, 300)
    with pytest.raises(DoubleFreeError):
        arena.deallocate(ptr, 300)
    assert arena.superblocks() == {}


def test_release_and_lazy_retake(managed):
    upstream = CappedUpstream(managed, 8 * MiB)
    arena = ArenaMemoryResource(upstream, "4MiB")
    ptr = arena.allocate(10)
    with pytest.raises(InvalidStateError, match="still live"):
        arena.release()
    arena.deallocate(ptr, 10)
    arena.release()
    assert upstream.held == 0 and arena.pool_size() == 0
    with pytest.raises(OutOfMemoryError):
        arena.allocate(5 * MiB)                                # retaken for the request, given back on failure
    assert upstream.held == 0
    ptr = arena.allocate(10)
    assert upstream.held == 4 * MiB
    arena.deallocate(ptr, 10)


def test_garbage_collection_gives_the_arena_back(managed):
    upstream = CappedUpstream(managed, 8 * MiB)
    arena = ArenaMemoryResource(upstream, "4MiB")
    del arena
    assert eventually(lambda: upstream.held == 0)       # given back soon, off the collector's thread


def test_repr(managed):
    assert repr(ArenaMemoryResource(managed, "1MiB")) == \
        "ArenaMemoryResource(ManagedMemoryResource(), arena_size='1 MiB', dump_log_on_failure=False)"
