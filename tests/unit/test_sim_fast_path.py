"""The sweep fast path is an optimisation only: with it on or off, the same records, clock, state and results."""

from __future__ import annotations

import numpy as np
import pytest

from uvm_lab import workloads as W
from uvm_lab.backends.sim import SimBackend
from uvm_lab.events import EventBus
from uvm_lab.events.schema import Advice, MemoryKind
from uvm_lab.location import Location

MiB = 1 << 20
GPU, HOST = Location.device(0), Location.host()


def _run(fast: bool, script) -> tuple[np.ndarray, list, np.ndarray]:
    bus = EventBus(capacity=1 << 22)
    b = SimBackend(device_memory="24MiB", bus=bus)
    b._engine.fast_sweeps = fast
    results = script(b)
    return bus.history(), results, np.concatenate((b._table.state, b._table.writable))


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal records, but for where each backend placed its segments and how it numbered them."""
    if len(a) != len(b):
        return False
    names = [n for n in a.dtype.names if n not in ("address", "alloc_id")]
    shift = a["address"].astype(np.int64) - b["address"].astype(np.int64)
    ids = np.unique(np.stack((a["alloc_id"], b["alloc_id"]), axis=1), axis=0)
    return all(np.array_equal(a[n], b[n]) for n in names) and len(np.unique(shift)) == 1 \
        and len(np.unique(ids[:, 0])) == len(ids) == len(np.unique(ids[:, 1]))


def _sweeps(b: SimBackend) -> list:
    """Oversubscribed and fitting sweeps, a partial last block, writes, a host round trip, a resident part."""
    out = []
    big = b.allocate(40 * MiB, MemoryKind.MANAGED)
    odd = b.allocate(5 * MiB + 12288, MemoryKind.MANAGED)
    b.prefetch(big, 40 * MiB, HOST)
    b.prefetch(odd, 5 * MiB + 12288, HOST)
    pages = big + np.arange(40 * MiB // 4096, dtype=np.uint64) * 4096
    for mode in ("read", "read", "write"):
        out.append(b.access_stream(pages, GPU, mode))
    out.append(b.access_stream(odd + np.arange((5 * MiB + 12288) // 4096, dtype=np.uint64) * 4096, GPU, "read"))
    out.append(b.access_stream(pages[:2048], HOST, "read"))
    b.prefetch(big + 8 * MiB, 4 * MiB, GPU)
    out.append(b.access_stream(pages[::-1].copy(), GPU, "read"))
    writes = np.zeros(len(pages), dtype=bool)
    writes[3000:7000] = True
    out.append(b.access_stream([pages], GPU, [writes]))
    b.advise(big, 4 * MiB, Advice.SET_READ_MOSTLY, None)
    out.append(b.access_stream(pages, GPU, "read"))
    return out


def test_sweeps_give_the_same_trace_either_way():
    fast, slow = _run(True, _sweeps), _run(False, _sweeps)
    assert len(fast[0]) == len(slow[0]) > 300
    assert _same(fast[0], slow[0])
    assert fast[1] == slow[1]
    assert np.array_equal(fast[2], slow[2])


def _host_writes(b: SimBackend) -> list:
    """Host writes to ReadMostly pages: host-only, duplicated, already written, repeated, mixed with reads."""
    out = []
    rm = b.allocate(8 * MiB, MemoryKind.MANAGED)
    plain = b.allocate(2 * MiB, MemoryKind.MANAGED)
    b.prefetch(rm, 8 * MiB, HOST)
    b.prefetch(plain, 2 * MiB, HOST)
    b.advise(rm, 8 * MiB, Advice.SET_READ_MOSTLY, None)
    pages = rm + np.arange(8 * MiB // 4096, dtype=np.uint64) * 4096
    b.access_stream(pages[1024:1536], GPU, "read")               # duplicated: a write there collapses
    out.append(b.access_stream(pages[:300], HOST, "write", bytes_per_access=1))
    mixed = np.concatenate((pages[250:1100], pages[700:710], pages[1600:1700][::-1],
                            plain + np.arange(16, dtype=np.uint64) * 4096, pages[1700:2048]))
    writes = np.ones(len(mixed), dtype=bool)
    writes[100:140] = False
    writes[-50:-45] = False
    out.append(b.access_stream([mixed], HOST, [writes], bytes_per_access=1))
    out.append(b.access_stream(pages, HOST, "write"))
    return out


def test_host_write_upgrades_give_the_same_trace_either_way():
    fast, slow = _run(True, _host_writes), _run(False, _host_writes)
    assert len(fast[0]) == len(slow[0]) > 2000
    assert _same(fast[0], slow[0])
    assert fast[1] == slow[1]
    assert np.array_equal(fast[2], slow[2])


@pytest.mark.parametrize("name", ["multi_pass_stream", "stencil", "tiled_matmul", "host_then_device"])
@pytest.mark.parametrize("policy", W.POLICIES)
def test_workloads_give_the_same_results_either_way(name, policy):
    def script(b):
        return W.run_sim(W.make(name, size="16MiB"), b, policy=policy, prefetch_chunk="4MiB")

    fast, slow = _run(True, script), _run(False, script)
    assert _same(fast[0], slow[0])
    assert fast[1] == slow[1]


def _dense_region(resident, faulted, npages, thrashing, threshold):
    """R5 evaluated on every subtree of every block: the definition the prefetcher's walk from the faults must match."""
    from uvm_lab.backends.sim.prefetcher import PAGES_PER_BLOCK, grow_to_big_pages

    rows = faulted.shape[0]
    valid = np.arange(PAGES_PER_BLOCK)[None, :] < npages[:, None]
    faulted = faulted & valid
    bitmap = (resident | faulted | grow_to_big_pages(faulted, npages, thrashing)) & valid
    region = np.zeros_like(faulted)
    s = 1
    while s <= PAGES_PER_BLOCK:
        count = bitmap.reshape(rows, -1, s).sum(axis=2)
        has_fault = faulted.reshape(rows, -1, s).any(axis=2)
        size = np.clip(npages[:, None] - np.arange(0, PAGES_PER_BLOCK, s)[None, :], 0, s)
        region |= np.repeat(has_fault & (count * 100 > threshold * size), s, axis=1)
        s *= 2
    return region & valid


@pytest.mark.parametrize("threshold", [1, 51, 75, 100])
def test_the_prefetcher_walk_from_the_faults_takes_every_dense_subtree(threshold):
    from uvm_lab.backends.sim.prefetcher import density_region

    rng = np.random.default_rng(threshold)
    for density in (0.002, 0.02, 0.2, 0.6):
        rows = 40
        resident = rng.random((rows, 512)) < density
        faulted = (rng.random((rows, 512)) < density / 2) & ~resident
        npages = np.where(rng.random(rows) < 0.3, rng.integers(1, 512, rows), 512)
        thrashing = rng.random((rows, 512)) < 0.01
        for th in (None, thrashing):
            got = density_region(resident, faulted, npages, thrashing=th, threshold=threshold)
            assert np.array_equal(got, _dense_region(resident, faulted, npages, th, threshold))


@pytest.mark.parametrize("name", ["random_gather", "stencil", "tiled_matmul", "host_then_device"])
@pytest.mark.parametrize("policy", W.POLICIES)
def test_fifo_evictions_at_once_give_the_same_trace_as_one_by_one(name, policy, monkeypatch):
    """R6: the victims of one claim are evicted in one pass; records, clock and state are those of one at a time."""
    from uvm_lab.backends.sim.eviction import GpuMemory

    def script(b):
        return W.run_sim(W.make(name, size="40MiB"), b, policy=policy, prefetch_chunk="4MiB"), b.now_ns()

    fast = _run(True, script)
    monkeypatch.setattr(GpuMemory, "_evict_many", lambda self, victims, log: [self.evict(b, log) for b in victims])
    slow = _run(True, script)
    assert _same(fast[0], slow[0])
    assert fast[1] == slow[1]
    assert np.array_equal(fast[2], slow[2])
