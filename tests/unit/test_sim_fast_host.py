"""The host-run fast path is an optimisation only: with it on or off, the same records, clock, state and stats."""

from __future__ import annotations

import numpy as np
import pytest

from uvm_lab import workloads as W
from uvm_lab.backends.sim import SimBackend
from uvm_lab.backends.sim.engine import FaultEngine
from uvm_lab.events import EventBus
from uvm_lab.events.schema import Advice, MemoryKind
from uvm_lab.location import Location

from .test_sim_fast_path import _same

MiB = 1 << 20
GPU, HOST = Location.device(0), Location.host()


@pytest.fixture
def host_run_faults(monkeypatch) -> list[int]:
    """Counts the faults the fast path services, so that a comparison cannot pass by never taking it."""
    served = [0]
    original = FaultEngine._host_run

    def counting(self, pages, pos, log, stats, **kw):
        before = stats.faults
        done = original(self, pages, pos, log, stats, **kw)
        served[0] += stats.faults - before
        return done

    monkeypatch.setattr(FaultEngine, "_host_run", counting)
    return served


def _run(fast: bool, script, **backend) -> tuple:
    bus = EventBus(capacity=1 << 22)
    b = SimBackend(bus=bus, **backend)
    b._engine.fast_host_runs = fast
    results = script(b)
    t, mem, thr = b._table, b._memory, b._engine.thrashing
    state = np.concatenate((t.state, t.writable, t.remote, t.chunk.view(np.uint8), t.last_use.view(np.uint8)))
    detector = (sorted(thr._touch.items()), sorted(thr._resets.items()),
                [(k, v.count.tobytes(), v.last_t.tobytes(), v.last_proc.tobytes(), v.thrashing.tobytes(),
                  v.throttles.tobytes(), v.pin_loc.tobytes(), v.pin_until.tobytes(), v.dnt, v.period_end,
                  v.last_thrash, v.resets) for k, v in sorted(thr.blocks.items())])
    return bus.history(), results, b.now_ns(), state, list(mem._order.items()), mem.used, mem.evicted_blocks, \
        detector


def _assert_same(fast: tuple, slow: tuple) -> None:
    assert len(fast[0]) == len(slow[0])
    assert _same(fast[0], slow[0])
    assert np.array_equal(fast[0]["start"], slow[0]["start"])   # the clock, bit for bit (as stamped)
    assert fast[1] == slow[1]
    assert fast[2] == slow[2]
    assert np.array_equal(fast[3], slow[3])
    assert fast[4:] == slow[4:]


def _host_mix(b: SimBackend) -> list:
    """Host runs over GPU-resident, never-touched, partial and advised blocks, chunked mid-block, mixed flags."""
    out = []
    size = 9 * MiB + 5 * 4096
    p = b.allocate(size, MemoryKind.MANAGED)
    q = b.allocate(6 * MiB, MemoryKind.MANAGED)
    n = size // 4096
    pages = p + np.arange(n, dtype=np.uint64) * 4096
    qp = q + np.arange(6 * MiB // 4096, dtype=np.uint64) * 4096
    out.append(b.access_stream(pages[:1000], HOST, "write"))            # first touch, part of a block
    out.append(b.access_stream(pages[1000:], HOST, "write"))            # the rest, then a partial block
    out.append(b.access_stream(pages, GPU, "read"))
    out.append(b.access_stream([pages[:300], pages[300:2000], pages[2000:]], HOST, "read"))   # read back, cut mid-block
    out.append(b.access_stream(pages[:3000], GPU, "write"))
    writes = np.zeros(n, dtype=bool)
    writes[::7] = True
    writes[1000:1500] = True
    out.append(b.access_stream([pages], HOST, [writes]))               # reads and writes mixed
    out.append(b.access_stream(pages[100:700], GPU, "read"))
    out.append(b.access_stream(pages[50:1200], HOST, "read"))          # starts mid-block
    out.append(b.access_stream(pages[::2], GPU, "read"))
    out.append(b.access_stream(pages, HOST, "read"))                   # every other page at the GPU
    b.advise(q + MiB, MiB, Advice.SET_PREFERRED_LOCATION, GPU)
    b.advise(q + 3 * MiB, MiB, Advice.SET_ACCESSED_BY, GPU)
    b.advise(q + 4 * MiB, 2 * MiB, Advice.SET_READ_MOSTLY, None)
    for proc, mode in ((HOST, "write"), (GPU, "read"), (HOST, "read"), (GPU, "write"), (HOST, "write")):
        out.append(b.access_stream(qp, proc, mode))
    out.append(b.access_stream(qp[::-1].copy(), GPU, "write"))
    out.append(b.access_stream(qp[::-1].copy(), HOST, "read"))
    out.append(b.access_stream(np.concatenate((qp[:512], qp[600:1100], qp[:100])), HOST, "read"))
    return out


def _ping_pong(b: SimBackend) -> list:
    """A GPU sweep, then the host reading it back within the thrashing lapse, over and over."""
    out = []
    size = 2 * MiB + 8192
    p = b.allocate(size, MemoryKind.MANAGED)
    pages = p + np.arange(size // 4096, dtype=np.uint64) * 4096
    for i in range(6):
        out.append(b.access_stream(pages[i * 13:], GPU, "write" if i % 2 else "read"))
        out.append(b.access_stream(pages, HOST, "read" if i % 3 else "write"))
    return out


def _turn_within_the_lapse(b: SimBackend) -> list:
    """The host reads back an old GPU block, then one the GPU has just written: the run stops before the second."""
    out = []
    p = b.allocate(6 * MiB, MemoryKind.MANAGED)
    other = b.allocate(8 * MiB, MemoryKind.MANAGED)
    b.prefetch(p, 6 * MiB, HOST)
    pages = p + np.arange(6 * MiB // 4096, dtype=np.uint64) * 4096
    out.append(b.access_stream(pages[496:512], GPU, "write"))
    out.append(b.access_stream(other + np.arange(2048, dtype=np.uint64) * 4096, HOST, "write"))   # time passes
    out.append(b.access_stream(pages[512:1024], GPU, "write"))
    out.append(b.access_stream(pages, HOST, "read"))
    return out


def test_a_run_stops_before_a_fault_that_makes_thrashing_state(host_run_faults):
    fast, slow = _run(True, _turn_within_the_lapse, device_memory="16MiB"), \
        _run(False, _turn_within_the_lapse, device_memory="16MiB")
    _assert_same(fast, slow)
    assert len(fast[-1][2]) == 1           # the second block has thrashing state
    assert host_run_faults[0] >= 25


_BACKENDS = [{}, {"prefetcher": False}, {"prefetch_threshold": 1}, {"prefetch_threshold": 30},
             {"prefetch_threshold": 90}, {"prefetch_threshold": 100}, {"thrashing": False}, {"eviction": "lru"},
             {"eviction": "tree"}, {"platform": "gh200-ats"}, {"device_memory": "2MiB"}]


@pytest.mark.parametrize("backend", _BACKENDS)
def test_host_runs_give_the_same_trace_either_way(backend, host_run_faults):
    args = {"device_memory": "6MiB", **backend}
    _assert_same(_run(True, _host_mix, **args), _run(False, _host_mix, **args))
    assert host_run_faults[0] > 10


@pytest.mark.parametrize("backend", [{}, {"prefetcher": False}, {"thrashing": False}, {"platform": "gh200-ats"}])
def test_ping_pong_gives_the_same_trace_either_way(backend):
    args = {"device_memory": "6MiB", **backend}
    _assert_same(_run(True, _ping_pong, **args), _run(False, _ping_pong, **args))


@pytest.mark.parametrize("initial", ["host", "nowhere"])
@pytest.mark.parametrize("ratio", [0.5, 1.5])
@pytest.mark.parametrize("name", list(W.WORKLOADS))
def test_workloads_give_the_same_trace_either_way(name, ratio, initial):
    for policy in W.POLICIES:
        for size in ("8MiB", 5 * MiB + 12288):
            w = W.make(name, size=size)
            device = max(2 * MiB, int(w.total_bytes / ratio) // (2 * MiB) * (2 * MiB))

            def script(b, w=w, policy=policy):
                return W.run_sim(w, b, policy=policy, prefetch_chunk="2MiB", initial=initial)

            _assert_same(_run(True, script, device_memory=device), _run(False, script, device_memory=device))


@pytest.mark.parametrize("backend", [{}, {"prefetcher": False}, {"thrashing": False}, {"platform": "gh200-ats"}])
@pytest.mark.parametrize("initial", ["host", "nowhere"])
def test_host_then_device_takes_the_fast_path(backend, initial, host_run_faults):
    """The host's first writes (never-touched pages) and its read-back of an oversubscribed GPU's pages."""
    w = W.host_then_device(size=24 * MiB + 4096, passes=2)

    def script(b):
        return W.run_sim(w, b, initial=initial)

    _assert_same(_run(True, script, device_memory="16MiB", **backend),
                 _run(False, script, device_memory="16MiB", **backend))
    assert host_run_faults[0] > 0


def test_changing_the_prefetcher_between_streams_gives_the_same_trace_either_way(host_run_faults):
    """The fast paths keep what they work out from the prefetcher's settings: a change must not reuse it."""
    def script(b):
        out = []
        p = b.allocate(8 * MiB, MemoryKind.MANAGED)
        pages = p + np.arange(8 * MiB // 4096, dtype=np.uint64) * 4096
        for threshold, prefetch in ((51, True), (90, True), (51, False), (30, True)):
            b._engine.threshold, b._engine.prefetch = threshold, prefetch
            out.append(b.access_stream(pages, GPU, "read"))
            out.append(b.access_stream(pages, HOST, "write"))
        return out

    _assert_same(_run(True, script, device_memory="16MiB"), _run(False, script, device_memory="16MiB"))
    assert host_run_faults[0] > 0
