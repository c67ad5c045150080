"""The advisor: each pattern found in a trace, the change named as code, and a gain the change really has."""

from __future__ import annotations

import pytest

import uvm_lab as ul
from uvm_lab.errors import InvalidArgumentError
from uvm_lab.trace_replay import measured

MiB = 1 << 20


def by_pattern(advice: ul.Recommendations) -> dict[str, ul.advisor.Recommendation]:
    return {r.pattern: r for r in advice}


def trap(read_mostly: bool) -> tuple[ul.Trace, ul.DeviceBuffer]:
    """A buffer the host and the GPU take turns writing, with ReadMostly set or not; and the buffer."""
    with ul.record(accesses=True) as trace:
        weights = ul.DeviceBuffer(size="16MiB", label="weights")
        weights.read_mostly = read_mostly
        for _ in range(3):
            ul.touch(weights, on="host", mode="write")
            ul.touch(weights, on="gpu", mode="write")
    return trace, weights


def test_a_read_mostly_buffer_that_is_written_is_found_and_dropping_it_gains_what_was_predicted():
    ul.use_backend("sim", device_memory="1GiB")
    trace, _alive = trap(read_mostly=True)
    found = by_pattern(ul.advise(trace))["read_mostly_written"]

    assert found.name == "weights" and found.code == "weights.read_mostly = False"
    assert found.source.startswith("test_advisor.py:") and found.allocated_at.startswith("test_advisor.py:")
    assert found.gain > 0.5
    # Applied for real: the same code without ReadMostly takes the time the replay predicted.
    ul.use_backend("sim", device_memory="1GiB")
    assert measured(trap(read_mostly=False)[0])["seconds"] == pytest.approx(found.after.seconds, rel=0.01)


def test_a_buffer_freed_since_is_named_by_the_line_that_allocated_it():
    ul.use_backend("sim", device_memory="1GiB")
    trace, buf = trap(read_mostly=True)
    buf.close()
    found = by_pattern(ul.advise(trace))["read_mostly_written"]

    assert found.name == f"buffer {found.alloc_id}"
    assert found.code.startswith(f"buf.read_mostly = False   # buf: buffer {found.alloc_id}, allocated at ")
    assert f"allocated at {found.allocated_at}" in found.code


def test_gpu_first_touch_faults_are_answered_with_a_prefetch():
    ul.use_backend("sim", device_memory="1GiB")
    with ul.record(accesses=True) as trace:
        data = ul.DeviceBuffer(size="64MiB", label="data")
        ul.touch(data, on="host", mode="write")
        ul.touch(data, on="gpu")
    top = ul.advise(trace)[0]

    assert (top.pattern, top.code) == ("gpu_first_touch", 'data.prefetch("gpu")   # before the kernel')
    assert top.before.gpu_faults > 0 and top.after.gpu_faults == 0
    assert top.after.seconds < top.before.seconds
    assert "GPU faults moved 64 MiB in" in top.evidence


def test_buffers_that_show_one_pattern_are_also_mended_together():
    ul.use_backend("sim", device_memory="1GiB")
    with ul.record(accesses=True) as trace:
        a, b = ul.DeviceBuffer(size="64MiB", label="a"), ul.DeviceBuffer(size="64MiB", label="b")
        for buf in (a, b):
            ul.touch(buf, on="host", mode="write")
        for buf in (a, b):
            ul.touch(buf, on="gpu")
    advice = ul.advise(trace)
    top = advice[0]

    assert (top.pattern, top.name) == ("gpu_first_touch", "a, b")
    assert top.code.splitlines() == [f'{name}.prefetch("gpu")   # before the kernel' for name in "ab"]
    alone = [r for r in advice if r.pattern == "gpu_first_touch" and r.name in ("a", "b")]
    assert len(alone) == 2 and all(top.after.seconds < r.after.seconds for r in alone)
    assert top.after.gpu_faults == 0 < min(r.after.gpu_faults for r in alone)


def pooled(outermost: bool) -> ul.Trace:
    """Three scratch buffers from a pool, each written by a kernel and read back by the host; a prefetch adaptor
    under the pool (where RMM's guide warns it prefetches the pool's growth) or over it."""
    ul.use_backend("sim", device_memory="1GiB")
    with ul.record(accesses=True) as trace:
        def pool(upstream):
            return ul.mr.PoolMemoryResource(upstream, initial_pool_size="64MiB")

        managed = ul.mr.ManagedMemoryResource()
        mr = ul.mr.PrefetchResourceAdaptor(pool(managed)) if outermost else pool(ul.mr.PrefetchResourceAdaptor(managed))
        for _ in range(3):
            scratch = ul.DeviceBuffer(size="16MiB", mr=mr)
            ul.touch(scratch, on="gpu", mode="write")
            ul.touch(scratch, on="host")
            scratch.close()
    return trace


def test_a_prefetch_adaptor_under_a_pool_is_moved_outermost_and_gains_what_was_predicted():
    found = by_pattern(ul.advise(pooled(outermost=False)))["prefetch_adaptor_not_outermost"]

    assert found.evidence == "1 prefetch of the 64 MiB it took, as it grew; none of the 3 buffers handed out of it"
    assert found.code.startswith("mr = ul.mr.PrefetchResourceAdaptor(ul.mr.PoolMemoryResource(...))")
    assert found.after.gpu_faults < found.before.gpu_faults
    # Applied for real, the adaptor outermost takes the time the replay predicted.
    assert measured(pooled(outermost=True))["seconds"] == pytest.approx(found.after.seconds, rel=0.01)
    assert "prefetch_adaptor_not_outermost" not in by_pattern(ul.advise(pooled(outermost=True)))


def test_buffers_a_pool_hands_out_at_one_address_are_told_apart_by_their_lives():
    """Each of the three scratch buffers moves 16 MiB each way once: none of them ping-pongs, though the three
    together, at one address, moved 48 MiB each way."""
    advice = ul.advise(pooled(outermost=True))
    assert "ping_pong" not in by_pattern(advice)
    assert all(r.name != "buffer" and "48 MiB" not in r.evidence for r in advice)


def test_data_larger_than_the_device_is_left_on_the_host_and_mapped():
    ul.use_backend("sim", device_memory="64MiB")
    with ul.record(accesses=True) as trace:
        big = ul.DeviceBuffer(size="96MiB", label="big", mr=ul.mr.ManagedMemoryResource(allow_oversubscription=True))
        ul.touch(big, on="host", mode="write")
        for _ in range(3):
            ul.touch(big, on="gpu")
    found = by_pattern(ul.advise(trace))["larger_than_device"]

    assert found.before.bytes_evicted > 0 and found.after.bytes_evicted == 0
    assert found.code == 'big.preferred_location = "host"; big.accessed_by = "gpu"'


def test_pages_that_go_back_and_forth_are_kept_in_one_place():
    ul.use_backend("sim", device_memory="1GiB")
    with ul.record(accesses=True) as trace:
        shared = ul.DeviceBuffer(size="32MiB", label="shared")
        for _ in range(4):
            ul.touch(shared, on="host", mode="write")
            ul.touch(shared, on="gpu")
    found = by_pattern(ul.advise(trace))["ping_pong"]

    assert "to the GPU and" in found.evidence and found.gain > 0
    assert found.after.bytes_htod + found.after.bytes_dtoh < found.before.bytes_htod + found.before.bytes_dtoh


def test_thrashing_is_answered_by_keeping_the_pages_in_one_place():
    ul.use_backend("sim", device_memory="1GiB")
    with ul.record(accesses=True) as trace:
        shared = ul.DeviceBuffer(size="8MiB", label="shared")
        for _ in range(20):   # both sides write the same 64 KiB, in turn
            ul.touch(shared, on="host", mode="write", size="64KiB")
            ul.touch(shared, on="gpu", mode="write", size="64KiB")
    assert len(trace.of_kind(ul.events.EventKind.THRASHING)) > 0
    found = by_pattern(ul.advise(trace))["thrashing"]

    assert found.evidence.endswith("thrashing report from the driver") or "thrashing reports" in found.evidence
    assert found.code == 'shared.preferred_location = "host"; shared.accessed_by = "gpu"'
    assert found.after.bytes_htod + found.after.bytes_dtoh < found.before.bytes_htod + found.before.bytes_dtoh


def test_prefetches_that_move_nothing_are_named():
    ul.use_backend("sim", device_memory="1GiB")
    with ul.record(accesses=True) as trace:
        table = ul.DeviceBuffer(size="256MiB", label="table")
        table.prefetch("gpu")   # made there: not idle, though nothing moved
        for i in range(50):
            table.prefetch("gpu")   # already there
            ul.touch(table, on="gpu", offset=i * 4096, size=4096)
    found = by_pattern(ul.advise(trace))["prefetch_moved_nothing"]

    assert found.evidence.startswith("50 prefetches")
    assert found.after.seconds < found.before.seconds


def test_a_trace_with_nothing_to_mend_gets_no_recommendation():
    ul.use_backend("sim", device_memory="1GiB")
    with ul.record(accesses=True) as trace:
        data = ul.DeviceBuffer(size="64MiB")
        data.prefetch("gpu")
        for _ in range(3):
            ul.touch(data, on="gpu", mode="write")
    advice = ul.advise(trace)

    assert len(advice) == 0 and "none" in repr(advice)
    assert advice.baseline.seconds == pytest.approx(measured(trace)["seconds"], rel=0.01)


def test_recommendations_are_ranked_by_the_time_they_save_and_read_as_a_table():
    ul.use_backend("sim", device_memory="1GiB")
    trace, _alive = trap(read_mostly=True)
    advice = ul.advise(trace)
    saved = [r.before.seconds - r.after.seconds for r in advice]
    table = advice.to_pandas()

    assert saved == sorted(saved, reverse=True) and len(advice) >= 2
    assert list(table["rank"]) == list(range(1, len(advice) + 1))
    assert {"pattern", "buffer", "source", "evidence", "code", "seconds_before", "seconds_after", "gain"} <= set(table)
    assert "weights.read_mostly = False" in repr(advice)
    assert len(ul.advise(trace, top=1)) == 1


@pytest.mark.parametrize("policy", ul.workloads.POLICIES)
@pytest.mark.parametrize("name", ul.workloads.WORKLOADS)
def test_on_the_catalog_the_top_recommendation_never_makes_it_slower(name, policy):
    bus = ul.events.EventBus()
    with ul.record(bus, accesses=True, limit=1 << 22) as trace:
        ul.workloads.run_sim(ul.workloads.make(name, size="96MiB"),
                             ul.backends.sim.SimBackend("64MiB", bus=bus), policy=policy)
    advice = ul.advise(trace, device_memory="64MiB", top=1)

    for r in advice:
        assert r.after.seconds <= r.before.seconds * (1 - ul.advisor.MIN_GAIN)
        assert r.before.seconds == pytest.approx(measured(trace)["seconds"], rel=0.01)


@pytest.mark.parametrize(("options", "names"), [({"top": 0}, "top"), ({"top": "3"}, "top"),
                                                ({"device_memory": "none"}, "none")])
def test_bad_input_is_refused(options, names):
    with ul.record(accesses=True) as trace:
        ul.touch(ul.DeviceBuffer(size="4MiB"), on="gpu")
    with pytest.raises(InvalidArgumentError, match=names):
        ul.advise(trace, **options)
    with pytest.raises(InvalidArgumentError, match="Trace"):
        ul.advise("trace.uvmtrace")
