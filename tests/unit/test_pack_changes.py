"""Packing a map again from the last packing (``pack_states(since=...)``) gives what packing it anew gives, and
re-binning (``rebin``) follows the majority rule."""

from __future__ import annotations

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings

from uvm_lab.errors import InvalidArgumentError
from uvm_lab.jupyter.dashboard.collect import bin_states, rebin
from uvm_lab.jupyter.protocol import pack_states
from uvm_lab.page_states import CATEGORY_NAMES, categories

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


def _majority(codes: list[int]) -> int:
    """The category most of ``codes`` are in, ties to the lower code: the rule spelled out."""
    return max(sorted(set(codes)), key=codes.count)


@settings(max_examples=150, deadline=None)
@given(maps_and_changes())
def test_rebinning_keeps_the_majority_of_each_bin_and_counts_what_moved(case):
    states, limit, edits = case
    cells, gained = rebin(states, limit)
    per_bin = max(1, -(-len(states) // limit))
    codes = categories(states).tolist()
    assert cells.tolist() == [_majority(codes[i:i + per_bin]) for i in range(0, len(states), per_bin)]
    assert gained.tolist() == [codes.count(c) for c in range(len(CATEGORY_NAMES))]
    # Unchanged: the very cells given back, and nothing gained.
    same, nothing = rebin(states, limit, (states.copy(), cells))
    assert same is cells and not nothing.any()
    for first, length, value in edits:
        before = states.copy()
        states[first:first + length] = value
        fresh, gained = rebin(states, limit, (before, cells))
        assert fresh.tolist() == rebin(states, limit)[0].tolist()
        was, now = categories(before).tolist(), categories(states).tolist()
        assert gained.tolist() == [now.count(c) - was.count(c) for c in range(len(CATEGORY_NAMES))]
        if fresh is not cells:   # the earlier cells are left as they were
            assert cells.tolist() == rebin(before, limit)[0].tolist()
        cells = fresh


def test_rebinning_refuses_an_earlier_map_of_other_pages():
    with pytest.raises(InvalidArgumentError, match="same 8 pages"):
        rebin(np.zeros(8, np.uint8), 4, (np.zeros(6, np.uint8), np.zeros(4, np.uint8)))
    with pytest.raises(InvalidArgumentError, match="1-D"):
        rebin(np.zeros((2, 2), np.uint8), 4)
