"""Prefetching never-touched pages to the host all at once is an optimisation only: the same records, clock
and state as the block-by-block loop, on odd sizes and partial ranges, and before every workload."""

from __future__ import annotations

import numpy as np
import pytest

from uvm_lab import workloads as W
from uvm_lab.backends.sim import SimBackend
from uvm_lab.events import EventBus
from uvm_lab.events.schema import MemoryKind
from uvm_lab.location import Location

from .test_sim_fast_path import _same as same_records

MiB = 1 << 20
GPU, HOST = Location.device(0), Location.host()


def _backend(fast: bool, **kw) -> tuple[SimBackend, list]:
    b = SimBackend(device_memory=kw.pop("device_memory", "24MiB"), bus=EventBus(capacity=1 << 22), **kw)
    b.fast_populate = fast
    taken = []
    real = b._populate_on_host

    def counted(*args):
        taken.append(args[1:])
        return real(*args)

    b._populate_on_host = counted
    return b, taken


def _state(b: SimBackend) -> tuple:
    t, mem = b._table, b._memory
    return (b.bus.history(), b.now_ns(), t.state.copy(), t.writable.copy(), t.chunk.copy(), list(mem._order),
            mem.used)


def _same(a: tuple, b: tuple) -> None:
    """Equal records (but for where each backend placed its segments and how it numbered them), clock and state."""
    assert same_records(a[0], b[0])
    assert a[1] == b[1]
    for x, y in zip(a[2:], b[2:], strict=True):
        assert np.array_equal(np.asarray(x), np.asarray(y))


def _script(b: SimBackend) -> None:
    odd = b.allocate(5 * MiB + 12288, MemoryKind.MANAGED)
    big = b.allocate(40 * MiB, MemoryKind.MANAGED)
    b.prefetch(odd, 5 * MiB + 12288, HOST)                  # partial last block
    b.prefetch(big + 3 * MiB + 4096, 9 * MiB, HOST)         # starts and ends mid-block
    b.access_stream(big + np.arange(10 * MiB // 4096, dtype=np.uint64) * 4096, GPU, "read")
    b.prefetch(big, 40 * MiB, HOST)                         # now partly on the GPU: the loop's case
    b.prefetch(big + 30 * MiB, 2 * MiB, GPU)
    b.access_stream(odd + np.arange(64, dtype=np.uint64) * 4096, HOST, "write")


def test_a_never_touched_range_goes_to_the_host_the_same_either_way():
    (fast, taken), (slow, untaken) = _backend(True), _backend(False)
    _script(fast)
    _script(slow)
    assert len(taken) == 2 and not untaken   # the two untouched ranges; the later ones hold pages elsewhere
    _same(_state(fast), _state(slow))


@pytest.mark.parametrize("name", sorted(W.WORKLOADS))
def test_every_workload_gives_the_same_trace_either_way(name):
    runs = []
    for fast in (True, False):
        b, taken = _backend(fast, device_memory="16MiB")
        res = W.run_sim(W.make(name, size="12MiB"), b)
        runs.append((_state(b), res, len(taken)))
    (a, res_a, n_fast), (b_, res_b, n_slow) = runs
    assert n_fast == len(W.make(name, size="12MiB").buffers) and n_slow == 0
    assert res_a == res_b
    _same(a, b_)
