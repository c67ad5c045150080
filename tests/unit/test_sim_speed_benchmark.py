"""benchmarks/sim_speed.py: the figures it prints for each workload describe the run they say they do."""

from __future__ import annotations

import json

import pytest

from uvm_lab import workloads as W

from . import benchmark_scripts


@pytest.fixture(scope="module")
def sim_speed():
    return benchmark_scripts.load("sim_speed")


@pytest.fixture(scope="module")
def rows(sim_speed):
    return {r["workload"]: r for r in sim_speed.workload_speeds(size=32 << 20, ratio=1.5, repeat=2)}


def test_every_workload_gets_a_row_that_json_can_hold(rows):
    assert sorted(rows) == sorted(W.WORKLOADS)
    assert json.loads(json.dumps(list(rows.values()))) == list(rows.values())


def test_the_floor_publishes_the_records_the_run_published(rows):
    # The "records alone" time is a floor only if it publishes what the run did, no more and no fewer.
    for name, r in rows.items():
        assert r["replayed"] == r["records"] > 0, name
        assert r["publish_s"] > 0, name


def test_the_rates_and_the_simulated_time_are_those_of_the_run(rows):
    gather = W.make("random_gather", size=32 << 20)
    results = W.run_sim(gather, device_memory=int(gather.total_bytes / 1.5) // (2 << 20) * (2 << 20))
    r = rows["random_gather"]
    assert r["accesses"] == sum(len(c.offsets) for c in W.phase_stream(gather, gather.phases[0])) > 0
    assert r["faults"] == sum(p.faults for p in results)
    assert r["simulated_s"] == pytest.approx(sum(p.seconds for p in results), rel=1e-12)
    assert len(r["walls_s"]) == 2 and r["wall_s"] == r["walls_s"][0]
    assert r["accesses_per_s"] == pytest.approx(r["accesses"] / r["wall_s"])
