"""How ``benchmarks/view_scale.py`` and its browser half turn the loop's operations and updates into latencies, and
slots side by side into a cost."""

from __future__ import annotations

import json

import pytest

from .benchmark_scripts import load

view_scale = load("view_scale")


def test_a_change_is_on_screen_at_the_first_drawing_of_a_read_made_after_it():
    ops = [100.0, 150.0, 210.0, 400.0]
    drawn = [[120.0, 170.0], [220.0, 260.0], [300.0, 330.0]]   # (kernel read at, drawn at), ms
    late, unseen = view_scale.latencies(ops, drawn)
    assert late == [70.0, 110.0, 50.0]   # 100 -> read at 120, drawn 170; 150 and 210 -> drawn at 260
    assert unseen == 1                   # 400: no drawing read the maps after it


def test_a_read_at_the_very_time_of_a_change_holds_it():
    assert view_scale.latencies([5.0], [[5.0, 9.0]]) == ([4.0], 0)


def test_percentiles_take_the_nearest_rank():
    assert view_scale.percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 3.0
    assert view_scale.percentile(list(range(100)), 0.95) == 95


def test_pairs_of_slots_cancel_what_differs_between_processes():
    # Two processes, one 10% faster, swapping halves every slot: the slots' log ratios swing by the difference, the
    # pairs' means hold the view's own cost alone. A pair missing a slot is left out.
    cost, faster = 0.05, 0.10
    logs = [cost + faster, cost - faster] * 3
    pairs = view_scale._paired(logs, list(range(6)))
    assert pairs == [pytest.approx(cost)] * 3
    assert view_scale._paired(logs[:5], [0, 1, 2, 4, 5]) == [pytest.approx(cost)] * 2


def test_a_results_file_reads_back_as_written_with_each_column_on_a_line():
    table = {"view": {"ratio": 1.25, "rows": {"worker": [0, 1], "mode": ["view", "closed"], "seconds": [1.5, 2.25]}}}
    text = view_scale._to_json(table)
    assert json.loads(text) == table
    assert '"worker": [0, 1]' in text and '"mode": ["view", "closed"]' in text


def test_the_benchmark_refuses_a_mode_it_does_not_know_before_it_measures(monkeypatch):
    monkeypatch.setattr("sys.argv", ["view_scale.py", "--repeats", "0", "--concurrent", "2", "--modes", "view,veiw"])
    with pytest.raises(SystemExit, match=r"--modes takes none, panel, .*view.*; not 'veiw'"):
        view_scale.main()
