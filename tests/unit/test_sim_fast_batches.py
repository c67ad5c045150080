"""The plain-batch fast path is an optimisation only: with it on or off, the same records, clock, state and stats."""

from __future__ import annotations

import numpy as np
import pytest

from uvm_lab import workloads as W
from uvm_lab.backends.sim import SimBackend
from uvm_lab.events import EventBus
from uvm_lab.events.schema import Advice, MemoryKind
from uvm_lab.location import Location

from .test_sim_fast_path import _same

MiB = 1 << 20
GPU, HOST = Location.device(0), Location.host()


def _run(fast: bool, script, **backend) -> tuple:
    bus = EventBus(capacity=1 << 22)
    b = SimBackend(bus=bus, **backend)
    b._engine.fast_batches = fast
    results = script(b)
    t, mem = b._table, b._memory
    state = np.concatenate((t.state, t.writable, t.remote, t.chunk.view(np.uint8), t.last_use.view(np.uint8)))
    return bus.history(), results, b.now_ns(), state, list(mem._order.items()), mem.evicted_blocks


def _assert_same(fast: tuple, slow: tuple) -> None:
    assert len(fast[0]) == len(slow[0])
    assert _same(fast[0], slow[0])
    assert fast[1] == slow[1]
    assert fast[2] == slow[2]
    assert np.array_equal(fast[3], slow[3])
    assert fast[4:] == slow[4:]


@pytest.mark.parametrize("eviction", ["fifo", "lru", "tree"])
@pytest.mark.parametrize("ratio", [0.5, 1.5])
@pytest.mark.parametrize("name", list(W.WORKLOADS))
def test_workloads_give_the_same_trace_either_way(name, ratio, eviction):
    for policy in W.POLICIES:
        w = W.make(name, size="16MiB")
        device = max(2 * MiB, int(w.total_bytes / ratio) // (2 * MiB) * (2 * MiB))

        def script(b, w=w, policy=policy):
            return W.run_sim(w, b, policy=policy, prefetch_chunk="4MiB")

        _assert_same(_run(True, script, device_memory=device, eviction=eviction),
                     _run(False, script, device_memory=device, eviction=eviction))


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


@pytest.mark.parametrize("backend", [{}, {"thrashing": False}, {"prefetcher": False}, {"prefetch_threshold": 90},
                                     {"eviction": "lru"}, {"device_memory": "4MiB"}, {"platform": "gh200-ats"}])
def test_mixed_advice_and_thrashing_give_the_same_trace_either_way(backend):
    args = {"device_memory": "6MiB", **backend}
    _assert_same(_run(True, _ping_pong, **args), _run(False, _ping_pong, **args))
