"""The pool's free list: the compiled one follows the Python one's rules, step for step."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from uvm_lab.mr import bestfit
from uvm_lab.mr.bestfit import PyBestFit

KINDS = [PyBestFit] + ([bestfit.BestFit] if bestfit.COMPILED else [])
compiled = pytest.mark.skipif(not bestfit.COMPILED, reason="uvm_lab was built without a C compiler: "
                              "the pool runs on the Python free list")


@pytest.mark.parametrize("kind", KINDS)
def test_best_fit_takes_the_smallest_range_that_holds_and_cuts_its_front(kind):
    free = kind()
    free.add_block(0x1000_0000, 0x1000)
    free.add_block(0x2000_0000, 0x300)
    assert free.take(0x200) == 0x2000_0000              # the smaller block holds it
    assert free.ranges() == [(0x1000_0000, 0x1000), (0x2000_0200, 0x100)]
    assert free.take(0x2000) is None                    # nothing holds it: the pool must grow
    assert (free.largest(), free.free_bytes()) == (0x1000, 0x1100)


@pytest.mark.parametrize("kind", KINDS)
def test_freed_ranges_merge_but_never_across_a_block_start(kind):
    free = kind()
    free.add_block(0x1000, 0x1000)
    free.add_block(0x2000, 0x1000)                      # right after the first: still another block
    a, b = free.take(0x1000), free.take(0x800)
    assert (a, b) == (0x1000, 0x2000)
    free.give(a, 0x1000)
    assert free.ranges() == [(0x1000, 0x1000), (0x2800, 0x800)]
    free.give(b, 0x800)
    assert free.ranges() == [(0x1000, 0x1000), (0x2000, 0x1000)]


ops = st.lists(st.tuples(st.sampled_from(["take", "give", "grow"]), st.integers(1, 64)), max_size=120)


@compiled
@settings(max_examples=300, deadline=None)
@given(ops)
def test_the_compiled_free_list_does_what_the_python_one_does(steps):
    py, c = PyBestFit(), bestfit.BestFit()
    held: list[tuple[int, int]] = []
    next_block = 1 << 40
    for op, n in steps:
        if op == "grow":
            size = n * 0x1000
            py.add_block(next_block, size)
            c.add_block(next_block, size)
            # Half the time the next block starts right at this one's end: it must not merge with it.
            next_block += size if n % 2 else size + 0x10_0000
        elif op == "take":
            need = n * 0x100
            got = py.take(need)
            assert c.take(need) == got
            if got is not None:
                held.append((got, need))
        elif held:
            ptr, size = held.pop(n % len(held))
            py.give(ptr, size)
            c.give(ptr, size)
        assert c.ranges() == py.ranges()
        assert (c.largest(), c.free_bytes()) == (py.largest(), py.free_bytes())


@compiled
def test_a_pool_on_either_free_list_hands_out_the_same_addresses(monkeypatch):
    import uvm_lab as ul
    from uvm_lab.mr import pool as pool_module

    def run() -> tuple[list[int], list[tuple[int, int]]]:
        upstream = ul.mr.ManagedMemoryResource()
        pool = pool_module.PoolMemoryResource(upstream, initial_pool_size="1MiB")
        base = pool.upstream_blocks()[0][0]
        sizes = [1000, 70_000, 300, 5000, 2 << 20, 256, 90_000]
        ptrs = [pool.allocate(n) for n in sizes]
        for i in (1, 3, 5):
            pool.deallocate(ptrs[i], sizes[i])
        ptrs += [pool.allocate(n) for n in (4000, 60_000)]
        # Addresses relative to the first block: each run has a fresh address space.
        blocks = [p - base for p, _ in pool.upstream_blocks()]
        return [p - base for p in ptrs] + blocks, [(p - base, n) for p, n in pool.free_ranges()]

    compiled_run = run()
    monkeypatch.setattr(pool_module, "BestFit", PyBestFit)
    assert run() == compiled_run
