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


def test_a_users_function_runs_on_the_gpu_and_cupti_counts_what_it_moved(cuda):
    if not workloads.gpu_available():
        pytest.skip("needs CuPy")
    from uvm_lab.tracing import CuptiCollector, cupti_status

    if not cupti_status()["installed"]:
        pytest.skip(cupti_status()["reason"])

    def step(prefetch: bool) -> None:
        buf = ul.DeviceBuffer(size="64MiB", mr=ul.mr.ManagedMemoryResource())
        ul.touch(buf, on="host", mode="write")
        if prefetch:
            buf.prefetch("gpu")
        ul.touch(buf, on="gpu")
        buf.close()

    untraced = ul.compare(step, {"prefetch": [False]}, on="gpu", progress=False).summary
    assert list(untraced["ran_on"]) == ["gpu"] and untraced["bytes_htod"].isna().all()   # nothing measured them
    collector = CuptiCollector(required=True).start()
    try:
        result = ul.compare(step, {"prefetch": [False, True], "device_memory": [None, "1GiB"]}, on="gpu",
                            progress=False)
    finally:
        collector.stop()
    summary = result.summary
    on_gpu = summary[summary["device_memory"].isna()]
    assert list(on_gpu["ran_on"]) == ["gpu", "gpu"]
    assert (on_gpu["bytes_htod"] >= 60 * 2**20).all()   # the 64 MiB reached the GPU, by fault or by prefetch
    simulated = summary[summary["device_memory"].notna()]
    assert list(simulated["ran_on"]) == ["sim", "sim"] and simulated["note"].str.contains("simulated only").all()
    assert ul.get_backend() is cuda
