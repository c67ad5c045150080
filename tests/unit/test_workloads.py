"""Workloads: one description, run on the simulator; the GPU side runs only where CuPy and a GPU exist."""

from __future__ import annotations

import numpy as np
import pytest

from uvm_lab import workloads as W
from uvm_lab.errors import InvalidArgumentError, InvalidSizeError
from uvm_lab.events import EventBus, EventKind
from uvm_lab.events.schema import AccessType

MiB = 1 << 20
SIZE = 64 * MiB


def gib_fraction(ratio: float) -> int:
    """Device memory that makes SIZE a given oversubscription ratio, in whole 2 MiB chunks."""
    return int(SIZE / ratio) // (2 * MiB) * (2 * MiB)


@pytest.mark.parametrize("name", sorted(W.WORKLOADS))
@pytest.mark.parametrize("policy", W.POLICIES)
def test_every_workload_runs_under_every_policy(name, policy):
    results = W.run_sim(W.make(name, size="16MiB"), device_memory="64MiB", policy=policy)
    assert results and all(r.seconds > 0 and r.bytes > 0 for r in results)


def test_the_same_description_gives_the_same_results():
    w = W.random_gather("32MiB", count=20000, seed=3)
    a = W.run_sim(w, device_memory="16MiB")
    b = W.run_sim(w, device_memory="16MiB")
    assert a == b
    c = W.run_sim(W.random_gather("32MiB", count=20000, seed=4), device_memory="16MiB")
    assert c != a


def test_streams_are_deterministic_and_cover_what_they_say():
    w = W.stencil("8MiB", row_bytes=1 << 20)
    offsets = [c.offsets for c in W.phase_stream(w, w.phases[0])]
    again = [c.offsets for c in W.phase_stream(w, w.phases[0])]
    assert all(np.array_equal(x, y) for x, y in zip(offsets, again, strict=True))
    writes = [c for c in W.phase_stream(w, w.phases[0]) if c.buffer == "output"]
    assert sum(len(c.offsets) for c in writes) == 8 * MiB // 4096       # every output page written once


@pytest.mark.parametrize("tiles", [2, 4])
def test_a_tiled_matmul_touches_what_its_kernel_does(tiles):
    """One launch per k step (``c[i] += a[i] * b[i]``) reads an A and a B tile and reads, then writes, a C
    tile: every A and B tile is read ``tiles`` times, every C tile read and written ``tiles`` times."""
    w = W.tiled_matmul("8MiB", tiles=tiles)
    chunks = list(W.phase_stream(w, w.phases[0]))
    tile_pages = 8 * MiB // tiles**2 // 4096
    steps = tiles**3
    assert [(c.buffer, c.write) for c in chunks] == [("a", False), ("b", False), ("c", False), ("c", True)] * steps
    assert all(len(c.offsets) == tile_pages for c in chunks)
    for name, per_step in (("a", 1), ("b", 1), ("c", 2)):
        pages, counts = np.unique(np.concatenate([c.offsets for c in chunks if c.buffer == name]), return_counts=True)
        assert len(pages) == 8 * MiB // 4096 and (counts == tiles * per_step).all()


def test_oversubscription_cliff_past_one():
    """Re-reads hit in HBM below 1.0x; past it FIFO eviction makes every pass fault again (research section 3:
    about 280x slower at 1.1x on an H200). At 1 GiB, so that a resident pass is more than its kernel's launch."""
    size = 1024 * MiB
    fits = W.run_sim(W.multi_pass_stream(size, passes=3), device_memory=int(size / 0.9) // (2 * MiB) * (2 * MiB))
    over = W.run_sim(W.multi_pass_stream(size, passes=3), device_memory=int(size / 1.1) // (2 * MiB) * (2 * MiB))
    assert fits[1].faults == 0 and over[1].faults == size // 4096
    assert fits[1].gb_per_s > 100 * over[1].gb_per_s


def test_policy_ordering_when_oversubscribed():
    """Faults < chunked prefetch < PreferredLocation=host with AccessedBy=GPU, at 1.5x (the H200's order)."""
    w = W.multi_pass_stream(SIZE, passes=2)
    rate = {p: W.run_sim(w, device_memory=gib_fraction(1.5), policy=p, prefetch_chunk="8MiB")[1].gb_per_s
            for p in W.POLICIES}
    assert rate["faults"] < rate["prefetch"] < rate["remote"]


def test_a_prefetch_strategy_and_an_advice_go_together():
    """prefetch+read_mostly: the kernel finds its pages there (no GPU fault), and as ReadMostly they stay on the host
    too, so a host read after moves nothing back."""
    w = W.Workload("read_then_host", {"a": SIZE}, (W.Phase("stream", ("a",)), W.Phase("host_read", ("a",))))
    both = W.run_sim(w, policy="prefetch+read_mostly")
    prefetch, read_mostly = W.run_sim(w, policy="prefetch"), W.run_sim(w, policy="read_mostly")

    assert both[0].faults == prefetch[0].faults == 0 < read_mostly[0].faults
    assert both[1].bytes_dtoh == read_mostly[1].bytes_dtoh == 0 < prefetch[1].bytes_dtoh
    assert W.parse_policy("read_mostly+prefetch") == (True, "read_mostly")
    for bad in ("prefetch+faults", "read_mostly+remote", "prefetch+prefetch", "fastest", "", 3, None):
        with pytest.raises(InvalidArgumentError, match="prefetch\\+read_mostly, prefetch\\+remote"):
            W.parse_policy(bad)


def test_a_strided_read_starts_at_its_offset():
    # One read every 2 MiB from 1 MiB on: each read lands mid-block, and the block holding it migrates as much
    # as a read at the block's start would move.
    plain, shifted = (W.strided("64MiB", stride=2 << 20, offset=off) for off in (0, 1 << 20))
    firsts = [next(W.phase_stream(w, w.phases[0])).offsets[:2].tolist() for w in (plain, shifted)]
    assert firsts == [[0, 2 << 20], [1 << 20, 3 << 20]]
    a, b = (W.run_sim(w, device_memory="1GiB")[0] for w in (plain, shifted))
    assert a.faults == b.faults == 32
    assert a.bytes_htod == b.bytes_htod > 0


def test_descriptions_are_validated():
    with pytest.raises(InvalidArgumentError, match="unknown workload"):
        W.make("bogosort")
    with pytest.raises(InvalidArgumentError, match="unknown pattern"):
        W.Workload("x", {"a": 4096}, (W.Phase("spin", ("a",)),))
    with pytest.raises(InvalidArgumentError, match="does not have"):
        W.Workload("x", {"a": 4096}, (W.Phase("stream", ("b",)),))
    with pytest.raises(InvalidArgumentError, match="positive integer"):
        W.multi_pass_stream("4MiB", passes=0)
    with pytest.raises(InvalidArgumentError, match="multiple of 4"):
        W.strided("4MiB", stride=6)
    for offset in (-4, 6, 4 << 20, 1.5):
        with pytest.raises(InvalidArgumentError, match="offset"):
            W.strided("4MiB", offset=offset)
    with pytest.raises(InvalidArgumentError, match="every must be a positive integer"):
        W.host_then_device("4MiB", write_every=0)
    for write in ("yes", 2, None):
        with pytest.raises(InvalidArgumentError, match="write must be True or False"):
            W.sequential_stream("4MiB", write=write)
    with pytest.raises(InvalidArgumentError, match="write must be True or False"):
        W.Workload("x", {"a": 4096}, (W.Phase("stream", ("a",), {"write": 1}),))
    with pytest.raises(InvalidSizeError):
        W.sequential_stream("lots")
    with pytest.raises(InvalidArgumentError, match="policy"):
        W.run_sim(W.sequential_stream("4MiB"), policy="hope")


def test_the_host_can_write_one_page_in_n():
    w = W.host_then_device("8MiB", write_every=3)
    written = np.concatenate([c.offsets for c in W.phase_stream(w, w.phases[0])])
    assert np.array_equal(written, np.arange(0, 8 * MiB, 3 * 4096))
    assert [r.phase for r in W.run_sim(w)] == ["host_write", "stream", "host_read"]


def test_a_written_stream_faults_as_writes_and_moves_what_a_read_does():
    read, written = W.sequential_stream("32MiB"), W.sequential_stream("32MiB", write=True)
    assert [c.write for c in W.phase_stream(written, written.phases[0])] == [True]
    bus = EventBus()
    got: list = []
    bus.subscribe(got.append, kinds=(EventKind.GPU_PAGE_FAULT,))
    from uvm_lab.backends.sim import SimBackend

    r = W.run_sim(written, SimBackend(device_memory="64MiB", bus=bus))
    bus.flush()
    faults = np.concatenate(got)
    assert (faults["flags"] == AccessType.WRITE).all() and faults["value"].sum() == 32 * MiB // 4096
    assert r[0].bytes_htod == W.run_sim(read)[0].bytes_htod == 32 * MiB
    # Through a remote mapping a write crosses the link as a read does, the other way.
    assert W.run_sim(written, policy="remote")[0].seconds == W.run_sim(read, policy="remote")[0].seconds


def test_gpu_side_refuses_cleanly_without_a_gpu():
    if W.gpu_available():
        pytest.skip("a GPU is present: the gpu suite runs the CuPy side")
    with pytest.raises(Exception, match="CuPy and an NVIDIA GPU"):
        W.run_gpu(W.sequential_stream("4MiB"))


@pytest.mark.gpu
@pytest.mark.skipif(not W.gpu_available(), reason="needs CuPy and a GPU")
@pytest.mark.parametrize("policy", W.POLICIES)
@pytest.mark.parametrize("name", sorted(W.WORKLOADS))
def test_gpu_side_runs_every_workload(name, policy):
    w = W.make(name, size="64MiB", **({"write": True} if name == "sequential_stream" else {}))
    real, sim = W.run_gpu(w, policy=policy), W.run_sim(w, policy=policy)
    assert [(r.phase, r.pass_index) for r in real] == [(r.phase, r.pass_index) for r in sim]
    assert all(r.seconds > 0 and r.bytes == s.bytes for r, s in zip(real, sim, strict=True))


def test_each_pass_counts_the_records_a_trace_of_it_holds():
    # A pass's record counts are what a subscriber to the bus sees between the pass's start and end: the
    # host's writes fault on the host and evict, the GPU's sweep faults and migrates, the host's read brings
    # pages back.
    from uvm_lab.backends.sim import SimBackend

    bus = EventBus()
    seen: list = []
    bus.subscribe(seen.append)
    w = W.host_then_device("32MiB", write_every=2)
    results = W.run_sim(w, SimBackend(device_memory="64MiB", bus=bus))
    bus.flush()
    records = np.concatenate(seen)
    kinds = {"htod": EventKind.HTOD, "dtoh": EventKind.DTOH, "gpu_faults": EventKind.GPU_PAGE_FAULT,
             "cpu_faults": EventKind.CPU_PAGE_FAULT}
    totals = {name: int((records["kind"] == k).sum()) for name, k in kinds.items()}
    assert {name: sum(r.records[name] for r in results) for name in kinds} == totals
    host_write, stream, host_read = results
    assert stream.records["htod"] > 0 and stream.records["gpu_faults"] > 0 and stream.records["cpu_faults"] == 0
    assert host_read.records["dtoh"] > 0 and host_read.records["cpu_faults"] > 0 and host_read.records["htod"] == 0
    assert host_write.records["gpu_faults"] == 0
