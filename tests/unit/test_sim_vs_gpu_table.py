"""benchmarks/sim_vs_gpu.py: the comparison table judges the median of the timed runs and shows their spread."""

from __future__ import annotations

import pytest

from . import benchmark_scripts

MiB = 1 << 20


@pytest.fixture(scope="module")
def sim_vs_gpu():
    return benchmark_scripts.load("sim_vs_gpu")


def _row(seconds, htod=0):
    return {"phase": "strided", "pass": 0, "seconds": seconds, "htod": htod, "dtoh": 0}


def _real(runs):
    case = {"workload": "strided", "params": {"stride": 64 << 10, "offset": 1 << 20}, "policy": "faults",
            "runs": [[_row(s)] for s in runs], "bytes": [_row(0.0, 32 * MiB)], "host_pages_lost_bytes": 32 * MiB}
    return {"device": "a GPU", "free": 8 << 30, "total": 8 << 30, "size": 64 * MiB, "cases": [case]}


def test_the_median_of_the_runs_is_what_the_table_judges(sim_vs_gpu):
    real = _real([0.120, 0.060, 0.065])
    case = real["cases"][0]
    case["time"] = sim_vs_gpu.median_rows(case["runs"])
    assert case["time"] == [_row(0.065)]
    case["sim"] = [{**_row(0.060), "htod": 32 * MiB}]
    text = sim_vs_gpu.table(real)
    row = next(line for line in text.splitlines() if line.startswith("| strided"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # label, policy, phase, real ms, spread, sim ms, ratio, ..., bytes verdict, time verdict
    assert cells[0] == "strided stride=64 KiB offset=1 MiB"
    assert cells[3:7] == ["65.00", "60.0-120.0", "60.00", "0.92"]
    assert cells[-3:-1] == ["pass", "pass"]          # 0.92 of the median; 0.50 of the slowest run
    assert "median of 3 untraced runs" in text


def test_a_single_run_shows_no_spread(sim_vs_gpu):
    real = _real([0.1])
    case = real["cases"][0]
    case["time"] = sim_vs_gpu.median_rows(case["runs"])
    case["sim"] = [{**_row(0.2), "htod": 32 * MiB}]
    row = next(line for line in sim_vs_gpu.table(real).splitlines() if line.startswith("| strided"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[4] == "-" and cells[-2] == "FAIL"   # twice the real time
    assert "one untraced run per case" in sim_vs_gpu.table(real)
