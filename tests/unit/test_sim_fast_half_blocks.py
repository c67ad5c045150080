"""The half-block fast path is an optimisation only: with it on or off, the same records, clock, state and stats.

It services a GPU stream's half-block batches with hits between them (a stencil's rows) without a pass over
arrays per batch. These tests run the same streams with it on and off and compare everything, and count the
batches it took over, so that a comparison where it never ran cannot pass.
"""

from __future__ import annotations

import numpy as np
import pytest

from uvm_lab import workloads as W
from uvm_lab.backends.sim import SimBackend
from uvm_lab.backends.sim.engine import FaultEngine
from uvm_lab.events import EventBus
from uvm_lab.events.schema import Advice, MemoryKind
from uvm_lab.location import Location

from .test_sim_fast_batches import _assert_same

MiB = 1 << 20
HALF = 256
GPU, HOST = Location.device(0), Location.host()


def _run(fast: bool, script, switch: str = "fast_half_blocks", **backend) -> tuple:
    """Run ``script`` with the engine's fast path ``switch`` on or off: the trace, results, clock and state."""
    bus = EventBus(capacity=1 << 22)
    b = SimBackend(bus=bus, **backend)
    setattr(b._engine, switch, fast)
    results = script(b)
    t, mem, thr = b._table, b._memory, b._thrashing
    state = np.concatenate((t.state, t.writable, t.remote, t.chunk.view(np.uint8), t.last_use.view(np.uint8)))
    return bus.history(), results, b.now_ns(), state, list(mem._order.items()), mem.evicted_blocks, \
        sorted(thr._touch.items()), sorted(thr.blocks)


def count_taken(monkeypatch, method: str) -> list[int]:
    """Accesses the engine's fast path ``method`` consumed, call by call."""
    consumed: list[int] = []
    original = getattr(FaultEngine, method)

    def counting(self, *args, **kwargs):
        done = original(self, *args, **kwargs)
        if done:
            consumed.append(done)
        return done

    monkeypatch.setattr(FaultEngine, method, counting)
    return consumed


@pytest.fixture
def taken(monkeypatch) -> list[int]:
    """Accesses the half-block path consumed, call by call."""
    return count_taken(monkeypatch, "_half_blocks")


def _pages(ptr: int, size: int) -> np.ndarray:
    return ptr + np.arange(size // 4096, dtype=np.uint64) * 4096


def _rows(b: SimBackend) -> list:
    """Stencil-like rows of two buffers, then the cases the fast path must stop at or hand back."""
    out = []
    src, dst = b.allocate(24 * MiB, MemoryKind.MANAGED), b.allocate(12 * MiB, MemoryKind.MANAGED)
    fresh = b.allocate(8 * MiB, MemoryKind.MANAGED)      # never touched: batches populate
    b.prefetch(src, 24 * MiB, HOST)
    b.prefetch(dst, 12 * MiB, HOST)
    sp, dp, fp = _pages(src, 24 * MiB), _pages(dst, 12 * MiB), _pages(fresh, 8 * MiB)

    def stencil(rows: range, out_pages: np.ndarray, flip: int | None = None):
        parts, flags = [], []
        last = len(sp) // HALF - 1
        for r in rows:
            parts.append(sp[max(r - 1, 0) * HALF:(min(r + 1, last) + 1) * HALF])
            flags.append(np.zeros(len(parts[-1]), dtype=bool))
            o = r % (len(out_pages) // HALF)
            parts.append(out_pages[o * HALF:(o + 1) * HALF])
            flags.append(np.ones(HALF, dtype=bool))
        w = np.concatenate(flags)
        if flip is not None:      # one read inside a written half block: that batch mixes reads and writes
            w[flip] = not w[flip]
        return np.concatenate(parts), w

    pages, writes = stencil(range(48), dp)
    out.append(b.access_stream([pages], GPU, [writes]))            # oversubscribed at 16 MiB: evictions
    pages, writes = stencil(range(47, -1, -1), dp)
    out.append(b.access_stream([pages], GPU, [writes]))            # backwards: victims that are used again
    # Populating the fresh buffer; the fourth row (row 6 writes its first untouched output half block) mixes.
    pages, writes = stencil(range(0, 48, 2), fp, flip=2 * HALF + 2 * (4 * HALF) + 3 * HALF + 17)
    out.append(b.access_stream([pages], GPU, [writes]))
    out.append(b.access_stream(np.concatenate((sp[HALF:2 * HALF], sp[8 * HALF:10 * HALF])), GPU, "read"))
    out.append(b.access_stream(sp[:4 * HALF], HOST, "write"))      # back to the host ...
    pages, writes = stencil(range(16), dp)
    out.append(b.access_stream([pages], GPU, [writes]))            # ... and at once to the GPU: thrashing state
    out.append(b.access_stream(dp[:8 * HALF], HOST, "read"))       # the GPU's last migrations, undone in time
    b.prefetch(src, 24 * MiB, HOST)
    b.prefetch(src + 6 * MiB + 40960, 100 * 4096, GPU)            # half blocks partly here, partly there
    pages, writes = stencil(range(48), dp)
    out.append(b.access_stream([pages], GPU, [writes]))
    b.advise(src + 4 * MiB, 2 * MiB, Advice.SET_READ_MOSTLY, None)
    b.advise(dst, 2 * MiB, Advice.SET_PREFERRED_LOCATION, HOST)
    b.prefetch(src, 24 * MiB, HOST)
    pages, writes = stencil(range(48), dp)
    out.append(b.access_stream([pages], GPU, [writes]))            # advice on some blocks
    out.append(b.access_stream([sp[::-1].copy()], GPU, "read"))    # not half blocks in order
    return out


@pytest.mark.parametrize("backend", [{}, {"thrashing": False}, {"prefetcher": False}, {"prefetch_threshold": 1},
                                     {"prefetch_threshold": 100}, {"device_memory": "4MiB"},
                                     {"device_memory": "64MiB"}, {"eviction": "lru"}, {"platform": "gh200-ats"}])
def test_rows_give_the_same_trace_either_way(backend, taken):
    args = {"device_memory": "16MiB", **backend}
    fast = _run(True, _rows, **args)
    used = sum(taken)
    _assert_same(fast, _run(False, _rows, **args))
    if backend.get("eviction", "fifo") == "fifo" and backend.get("prefetch_threshold", 51) >= 50:
        assert used >= 20 * HALF, used   # it took over for most of the rows
    else:                                # it cannot: LRU eviction, or a prefetcher that adds to half blocks
        assert used == 0


def test_it_stops_where_the_general_path_must_take_over(taken):
    """A victim used again, a mixed batch, thrashing state: each ends a run early instead of going wrong."""
    _run(True, _rows, device_memory="16MiB")
    assert len(taken) > 6          # runs ended and began again
    assert min(taken) < max(taken)


@pytest.mark.parametrize("initial", ["host", "nowhere"])
@pytest.mark.parametrize("ratio", [0.5, 1.5])
@pytest.mark.parametrize("name", ["stencil", "tiled_matmul", "host_then_device", "multi_pass_stream"])
def test_workloads_give_the_same_trace_either_way(name, ratio, initial, taken):
    w = W.make(name, size="32MiB")
    device = max(2 * MiB, int(w.total_bytes / ratio) // (2 * MiB) * (2 * MiB))
    for policy in W.POLICIES:
        def script(b, policy=policy):
            return W.run_sim(w, b, policy=policy, prefetch_chunk="4MiB", initial=initial)

        _assert_same(_run(True, script, device_memory=device), _run(False, script, device_memory=device))
    if name == "stencil":
        assert sum(taken) > 0


def test_a_stencil_is_serviced_by_it_almost_whole(taken):
    w = W.make("stencil", size="64MiB")
    accesses = sum(len(c.offsets) for ph in w.phases for c in W.phase_stream(w, ph))
    W.run_sim(w, device_memory="48MiB")
    assert sum(taken) > 0.95 * accesses
