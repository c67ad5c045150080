"""Packing a map again from the last packing (``pack_states(since=...)``) gives what packing it anew gives."""

from __future__ import annotations

import hypothesis.strategies as st
import numpy as np
from hypothesis import given, settings

from uvm_lab.jupyter.dashboard.collect import bin_states
from uvm_lab.jupyter.protocol import pack_states

# States from every category: nowhere, host, gpu:0, gpu:1, both, several GPUs, unknown with and without the host.
STATES = st.sampled_from([0, 1, 2, 4, 3, 6, 0x80, 0x81, 0x40, 5])


@st.composite
def maps_and_changes(draw: st.DrawFn) -> tuple[np.ndarray, int, list[tuple[int, int, int]]]:
    pages = draw(st.integers(0, 300))
    limit = draw(st.integers(1, 40))
    states = np.array(draw(st.lists(STATES, min_size=pages, max_size=pages)), dtype=np.uint8)
    edits = draw(st.lists(st.tuples(st.integers(0, max(pages - 1, 0)), st.integers(0, 64), STATES), max_size=12))
    return states, limit, edits


def same(a: tuple, b: tuple) -> bool:
    return a[0] == b[0] and a[1].dtype == b[1].dtype and a[1].tolist() == b[1].tolist() and a[2] == b[2]


@settings(max_examples=150, deadline=None)
@given(maps_and_changes())
def test_packing_from_the_last_packing_equals_packing_from_scratch(case):
    states, limit, edits = case
    packed = pack_states(states, limit)
    assert same(packed, pack_states(states, limit, since=(states.copy(), packed[1], packed[2])))
    for first, length, value in edits:   # each edit a change the next packing starts from the last one
        before = states.copy()
        states[first:first + length] = value
        packed = pack_states(states, limit, since=(before, packed[1], packed[2]))
        assert same(packed, pack_states(states, limit))
        assert sum(packed[2].values()) == len(states)


@settings(max_examples=100, deadline=None)
@given(st.lists(STATES, max_size=200), st.integers(1, 50), st.data())
def test_binning_a_slice_gives_those_bins_of_the_whole(states, n_bins, data):
    states = np.array(states, dtype=np.uint8)
    whole = bin_states(states, n_bins)
    total = len(whole["first"])
    first = data.draw(st.integers(0, total))
    stop = data.draw(st.integers(first, total))
    part = bin_states(states, n_bins, bins=(first, stop))
    assert set(part) == set(whole)
    for name, column in part.items():
        assert column.tolist() == whole[name][first:stop].tolist(), name
