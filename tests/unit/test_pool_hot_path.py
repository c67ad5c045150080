"""The pool's compiled hot path does what the Python methods do: same addresses, events, errors and state."""

from __future__ import annotations

import gc
import inspect
import itertools
import random
import threading
import weakref
from typing import Any

import numpy as np
import pytest

import uvm_lab as ul
from uvm_lab.errors import DoubleFreeError, InvalidArgumentError, InvalidStateError, OutOfMemoryError, UvmLabError
from uvm_lab.events import EventBus
from uvm_lab.mr import pool as pool_module
from uvm_lab.mr.bestfit import COMPILED, PyBestFit

compiled = pytest.mark.skipif(not COMPILED, reason="uvm_lab was built without a C compiler: there is no hot path")
MiB = 1 << 20


def make_pool(pure: bool, monkeypatch: pytest.MonkeyPatch, **kwargs: Any) -> pool_module.PoolMemoryResource:
    """A pool on the compiled hot path, or (``pure``) one that runs every call in Python."""
    with monkeypatch.context() as patch:
        if pure:
            patch.setattr(pool_module, "BestFit", PyBestFit)
        return pool_module.PoolMemoryResource(ul.mr.ManagedMemoryResource(), **kwargs)


def script(pool: pool_module.PoolMemoryResource, seed: int) -> tuple[list[object], list[tuple[Any, ...]]]:
    """A random mix of every kind of call, good and bad; what each returned or raised, and the events."""
    events: list[np.ndarray] = []
    sub = pool.backend.bus.subscribe(events.append)
    base = pool.upstream_blocks()[0][0]
    rng = random.Random(seed)
    stream = ul.Stream()
    live: list[tuple[int, object]] = []
    seen: list[object] = []

    def call(fn: Any, *args: Any, **kwargs: Any) -> None:
        try:
            out = fn(*args, **kwargs)
        except UvmLabError as err:
            seen.append(type(err).__name__)
            return
        seen.append(out - base if out else out)
        if fn == pool.allocate and out:
            live.append((out, args[0]))

    for _ in range(400):
        op = rng.random()
        if op < 0.45 or not live:
            size = rng.choice([rng.randint(1, 4096), rng.randint(1, 3 * MiB), "64KiB", 0, 256])
            how = rng.randrange(4)
            if how == 0:
                call(pool.allocate, size)
            elif how == 1:
                call(pool.allocate, size, rng.choice([None, 0, 7, stream]))
            elif how == 2:
                call(pool.allocate, size, stream=rng.choice([None, 5, stream]))
            else:
                call(pool.allocate, rng.choice([-5, 2.5, "lots", 64 * MiB]))   # invalid, or past the cap
        elif op < 0.85:
            ptr, size = live.pop(rng.randrange(len(live)))
            call(pool.deallocate, ptr, size, *([rng.choice([None, 3, stream])] if rng.random() < 0.5 else []))
        elif op < 0.95:
            ptr, size = rng.choice(live)
            bad = size + 256 if isinstance(size, int) else 1
            call(pool.deallocate, ptr, bad)                  # wrong size: refused, nothing changes
            call(pool.deallocate, ptr + 256, 256)            # not a pointer it handed out
        else:
            call(pool.deallocate, -1, 10, stream=-3)          # every argument wrong
    for ptr, size in live:
        call(pool.deallocate, ptr, size)
    pool.backend.bus.flush()
    sub.close()
    records = np.concatenate(events) if events else np.zeros(0, dtype=ul.events.EVENT_DTYPE)
    first_id = int(records["alloc_id"][records["alloc_id"] > 0].min())
    observed = [(int(r["kind"]), int(r["dst"]), int(r["address"]) - base if r["address"] else 0, int(r["bytes"]),
                 int(r["value"]), int(r["alloc_id"]) - first_id if r["alloc_id"] else -1, int(r["stream"]) == 0)
                for r in records]
    seen.append(sorted((p - base, n) for p, n in pool.free_ranges()))
    seen.append(pool.get_allocated_bytes())
    return seen, observed


@compiled
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_hot_path_and_the_python_methods_agree_call_for_call(monkeypatch, seed):
    runs = []
    for pure in (True, False):
        # The same address space for both, and a bus of its own: nothing another test left behind is recorded.
        ul.use_backend("sim", device_memory="4GiB", bus=EventBus())
        pool = make_pool(pure, monkeypatch, initial_pool_size="1MiB", maximum_pool_size="16MiB")
        runs.append(script(pool, seed))
    (py_seen, py_events), (c_seen, c_events) = runs
    assert c_seen == py_seen
    assert c_events == py_events
    assert any(isinstance(x, str) for x in c_seen), "the script must exercise the error paths"


@compiled
def test_a_compiled_pool_serves_plain_calls_in_c_and_a_subclass_keeps_python(monkeypatch):
    pool = make_pool(False, monkeypatch, initial_pool_size="1MiB")
    assert type(pool.allocate).__name__ == "builtin_function_or_method"
    for name in ("allocate", "deallocate"):     # help() and completion show the Python method's parameters
        python = inspect.signature(getattr(pool_module.PoolMemoryResource, name))
        assert [(p.name, p.default) for p in inspect.signature(getattr(pool, name)).parameters.values()] == \
            [(p.name, p.default) for p in python.parameters.values()][1:]

    class Counting(pool_module.PoolMemoryResource):
        calls = 0

        def _allocate(self, size: int, stream: int) -> int:
            Counting.calls += 1
            return super()._allocate(size, stream)

    sub = Counting(ul.mr.ManagedMemoryResource(), initial_pool_size="1MiB")
    sub.deallocate(sub.allocate(1000), 1000)
    assert Counting.calls == 1
    assert make_pool(True, monkeypatch, initial_pool_size="1MiB").allocate.__func__ is \
        pool_module.PoolMemoryResource.allocate


@pytest.mark.parametrize("pure", [True, False] if COMPILED else [True])
def test_errors_leave_the_pool_exactly_as_it_was(monkeypatch, pure):
    pool = make_pool(pure, monkeypatch, initial_pool_size="1MiB", maximum_pool_size="2MiB")
    ptr = pool.allocate(1000)
    before = (pool.free_ranges(), pool.get_allocated_bytes(), pool.allocation_id(ptr))
    with pytest.raises(InvalidArgumentError, match="1000"):
        pool.deallocate(ptr, 999)
    with pytest.raises(DoubleFreeError):
        pool.deallocate(ptr + 256, 256)
    with pytest.raises(InvalidArgumentError, match="stream"):
        pool.allocate(100, -1)
    with pytest.raises(InvalidArgumentError, match="stream"):
        pool.deallocate(ptr, 1000, "default")
    with pytest.raises(OutOfMemoryError):
        pool.allocate("3MiB")
    assert (pool.free_ranges(), pool.get_allocated_bytes(), pool.allocation_id(ptr)) == before
    pool.deallocate(ptr, 1000)
    with pytest.raises(DoubleFreeError):
        pool.deallocate(ptr, 1000)


@pytest.mark.parametrize("pure", [True, False] if COMPILED else [True])
def test_a_dropped_pool_is_freed_at_once_and_its_kept_allocate_refuses(monkeypatch, pure):
    pool = make_pool(pure, monkeypatch, initial_pool_size="1MiB")
    upstream = pool.upstream_mr
    allocate = pool.allocate
    pool.deallocate(pool.allocate(4096), 4096)
    gc.disable()                  # freed by its reference count, not by the cyclic collector
    try:
        ref = weakref.ref(pool)
        del pool
        ul.deferred.run()         # the blocks go back off the caller's thread
        if pure:                  # a Python bound method keeps its pool alive
            assert ref() is not None
            return
        assert ref() is None
    finally:
        gc.enable()
    assert upstream.get_allocated_bytes() == 0
    with pytest.raises(InvalidStateError, match="garbage-collected"):
        allocate(4096)


@pytest.mark.parametrize("pure", [True, False] if COMPILED else [True])
def test_threads_sharing_a_pool_never_get_overlapping_memory(monkeypatch, pure):
    pool = make_pool(pure, monkeypatch, initial_pool_size="64MiB")
    held: list[list[tuple[int, int]]] = [[] for _ in range(4)]

    def work(mine: list[tuple[int, int]], seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(3000):
            if mine and rng.random() < 0.5:
                pool.deallocate(*mine.pop(rng.randrange(len(mine))))
            else:
                size = rng.randint(1, 64 << 10)
                mine.append((pool.allocate(size), size))

    threads = [threading.Thread(target=work, args=(held[i], i)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    spans = sorted((p, p + (n + 255) // 256 * 256) for mine in held for p, n in mine)
    assert all(end <= nxt for (_, end), (nxt, _) in itertools.pairwise(spans))
    assert pool.get_allocated_bytes() == sum(n for mine in held for _, n in mine)


@compiled
def test_the_compiled_live_table_behaves_as_the_dict_it_replaces():
    from hypothesis import given, settings
    from hypothesis import strategies as st
    from uvm_lab.mr._pool import LiveTable

    # Few distinct addresses, many operations: keys collide, are removed from the middle of probe runs,
    # and the table grows past several sizes.
    addresses = st.integers(1, 600).map(lambda i: i * 256 * (1 + (i % 3) * 4096))
    ops = st.lists(st.tuples(st.sampled_from(["set", "del", "get"]), addresses, st.integers(1, 1 << 40)),
                   max_size=400)

    @settings(max_examples=80, deadline=None)
    @given(ops)
    def check(steps: list[tuple[str, int, int]]) -> None:
        table, model = LiveTable(), {}
        for op, ptr, size in steps:
            if op == "set":
                table[ptr] = model[ptr] = (size, ptr // 256)
            elif op == "del" and ptr in model:
                del table[ptr], model[ptr]
            elif op == "del":
                with pytest.raises(KeyError):
                    del table[ptr]
            assert table.get(ptr) == model.get(ptr)
            assert (ptr in table) == (ptr in model)
            assert len(table) == len(model) and bool(table) == bool(model)
        assert table.items() == sorted(model.items())
        assert table.values() == [model[k] for k in sorted(model)]
        assert table.keys() == list(table) == sorted(model)

    check()


@compiled
def test_the_compiled_live_table_refuses_what_a_pool_never_holds():
    from uvm_lab.mr._pool import LiveTable

    table = LiveTable()
    for key in (0, -256, 1 << 64, "0x100", None):
        assert table.get(key, "absent") == "absent" and key not in table
        with pytest.raises(KeyError):
            table[key]
    with pytest.raises(TypeError, match="addresses"):
        table[-256] = (1, 1)
    with pytest.raises(TypeError, match="nbytes, alloc_id"):
        table[256] = (1, "one")
    with pytest.raises(TypeError, match="nbytes, alloc_id"):
        table[256] = 5
    assert len(table) == 0
    table[np.uint64(512)] = (3, 4)            # any integer, as the base class's checks allow
    assert table.get(512) == (3, 4)
