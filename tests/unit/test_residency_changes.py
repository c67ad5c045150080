"""The tracker's journal of changes: a view that redraws only what it reports never misses a change."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import uvm_lab as ul
from uvm_lab.errors import InvalidArgumentError
from uvm_lab.residency_map import ResidencyTracker, get_tracker

MiB = 1 << 20
PAGE = 4096

operation = st.one_of(
    st.tuples(st.just("touch"), st.integers(0, 3), st.sampled_from(["gpu", "host"]), st.sampled_from(["read", "write"]),
              st.integers(0, 15), st.integers(1, 16)),
    st.tuples(st.just("prefetch"), st.integers(0, 3), st.sampled_from(["gpu", "host"]), st.integers(0, 15),
              st.integers(1, 16)),
    st.tuples(st.just("read_mostly"), st.integers(0, 3), st.booleans()),
    st.tuples(st.just("replace"), st.integers(0, 3)),
)


def apply(buffers: list[ul.DeviceBuffer], op: tuple) -> None:
    name, i = op[0], op[1]
    buf = buffers[i]
    if name == "touch":
        _, _, on, mode, first, n = op
        ul.touch(buf, on=on, mode=mode, offset=first * 64 * 1024, size=min(n, 16 - first) * 64 * 1024)
    elif name == "prefetch":
        _, _, to, first, n = op
        buf.prefetch(to, offset=first * 64 * 1024, size=min(n, 16 - first) * 64 * 1024)
    elif name == "read_mostly":
        buf.read_mostly = op[2]
    else:   # freed, and another made in its place (its address may be reused)
        buf.close()
        buffers[i] = ul.DeviceBuffer(size=MiB)


def states(buffers: list[ul.DeviceBuffer]) -> dict[int, np.ndarray]:
    """Each live buffer's page states, by page address."""
    out = {}
    for buf in buffers:
        st_ = ul.residency(buf).states
        for k, s in enumerate(st_.tolist()):
            out[buf.ptr + k * PAGE] = s
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(operation, min_size=1, max_size=12))
def test_nothing_changes_outside_the_ranges_reported(sim_backend, ops):
    buffers = [ul.DeviceBuffer(size=MiB) for _ in range(4)]
    tracker = get_tracker()
    cursor, _ = tracker.changes()
    before = states(buffers)
    for op in ops:
        apply(buffers, op)
    now, ranges = tracker.changes(cursor)
    assert ranges is not None and now >= cursor
    assert (ranges[1:, 0] > ranges[:-1, 1]).all() and (ranges[:, 1] > ranges[:, 0]).all()   # sorted, disjoint
    after = states(buffers)
    starts, ends = ranges[:, 0], ranges[:, 1]
    for address in set(before) | set(after):
        i = np.searchsorted(starts, address, side="right") - 1
        reported = i >= 0 and address < ends[i]
        if not reported:
            assert before.get(address) == after.get(address), f"page {address:#x} changed unreported"
    assert tracker.changes(now)[1].shape == (0, 2)   # caught up: nothing since
    for buf in buffers:
        buf.close()


def test_a_prefetch_reports_its_own_range_and_nothing_else(sim_backend):
    a, b = ul.DeviceBuffer(size=4 * MiB), ul.DeviceBuffer(size=4 * MiB)
    ul.touch(a, on="host", mode="write")
    ul.touch(b, on="host", mode="write")
    tracker = get_tracker()
    cursor, _ = tracker.changes()
    a.prefetch("gpu", offset=MiB, size=MiB)
    _, ranges = tracker.changes(cursor)
    assert ranges.tolist() == [[a.ptr + MiB, a.ptr + 2 * MiB]]


def test_a_reader_that_falls_behind_the_journal_is_told_to_read_everything(sim_backend):
    tracker = ResidencyTracker()
    tracker.JOURNAL = 3
    try:
        buf = ul.DeviceBuffer(size=4 * MiB)
        cursor, _ = tracker.changes()
        for k in range(4):   # four separate ranges, four batches
            ul.touch(buf, on="host", mode="write", offset=k * MiB, size=PAGE)
        now, ranges = tracker.changes(cursor)
        assert ranges is None and now > cursor
        assert tracker.changes(now)[1].shape == (0, 2)   # caught up: nothing since
    finally:
        tracker.close()


@pytest.mark.parametrize("since, match", [(-1, "int >= 0"), (True, "int >= 0"), ("0", "int >= 0"),
                                          (10**12, "ahead of this tracker")])
def test_a_bad_cursor_is_refused(sim_backend, since, match):
    with pytest.raises(InvalidArgumentError, match=match):
        get_tracker().changes(since)
