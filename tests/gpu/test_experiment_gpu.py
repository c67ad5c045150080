"""Experiments on a real GPU: what fits runs there; what would oversubscribe it runs on the simulator only."""

from __future__ import annotations

import pytest

import uvm_lab as ul
from uvm_lab import workloads

pytestmark = pytest.mark.gpu


def test_a_grid_runs_on_the_gpu_where_it_fits_and_on_the_simulator_where_it_would_not(cuda):
    if not workloads.gpu_available():
        pytest.skip("needs CuPy")
    grid = {"policy": ["faults", "prefetch"], "oversubscription": [None, 1.5]}
    result = ul.compare("multi_pass_stream", grid, size="64MiB", passes=2, on="gpu", progress=False)
    summary = result.summary
    on_gpu = summary[summary["oversubscription"].isna()]
    simulated = summary[summary["oversubscription"] == 1.5]
    assert list(on_gpu["ran_on"]) == ["gpu", "gpu"] and (on_gpu["seconds"] > 0).all()
    assert list(simulated["ran_on"]) == ["sim", "sim"]
    assert simulated["note"].str.contains("cannot be made smaller").all()
    assert (simulated["bytes_evicted"] > 0).all()
    assert ul.get_backend() is cuda
