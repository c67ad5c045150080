"""benchmarks/sim_calibrate.py: fitting a profile's fault-path costs to measured times recovers them."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("scipy")

from uvm_lab.backends.sim import PLATFORMS

from . import benchmark_scripts

MiB = 1 << 20


@pytest.fixture(scope="module")
def calibrate():
    return benchmark_scripts.load("sim_calibrate")


def _cases(*specs):
    return [{"workload": name, "params": params, "policy": policy, "size": 32 * MiB} for name, params, policy in specs]


def test_the_fit_finds_costs_that_reproduce_a_machine_the_profile_does_not_describe(calibrate):
    """Times made by a profile with other fault costs (a slower host) are what the fitted profile predicts, on
    the passes it was fitted to and on a workload it never saw; the starting profile was far off on both."""
    start = PLATFORMS["x86-pcie5"]
    host = start.with_(fault_batch_latency=3 * start.fault_batch_latency, fault_unmap_run_latency=2e-6,
                       cpu_fault_latency=2 * start.cpu_fault_latency)
    device = 1 << 30
    seen = _cases(("strided", {"stride": 64 << 10}, "faults"), ("strided", {"stride": 256 << 10}, "faults"),
                  ("strided", {"stride": 16 << 10}, "read_mostly"), ("sequential_stream", {}, "faults"),
                  ("sequential_stream", {}, "read_mostly"), ("host_then_device", {}, "faults"))
    unseen = _cases(("strided", {"stride": 128 << 10}, "faults"), ("stencil", {"row_bytes": 256 << 10}, "faults"))
    real = calibrate.simulate(seen, host, device)
    base, X = calibrate.weights(seen, start, device)
    names = list(calibrate.FITTED)
    costs = np.array([calibrate._cost(start, n) for n in names])
    fitted = calibrate.fit(base, X, real, costs, real > 0, np.zeros(len(names)))
    tuned = calibrate._with_costs(start, dict(zip(names, fitted, strict=True)))

    assert np.abs(base / real - 1).max() > 0.2
    np.testing.assert_allclose(calibrate.simulate(seen, tuned, device), real, rtol=0.01)
    truth = calibrate.simulate(unseen, host, device)
    assert np.abs(calibrate.simulate(unseen, start, device) / truth - 1).max() > 0.2
    np.testing.assert_allclose(calibrate.simulate(unseen, tuned, device), truth, rtol=0.05)


def test_check_counts_the_passes_each_profile_predicts(calibrate, tmp_path, capsys):
    """--check: a run made by one profile is predicted on every timed pass by that profile, and not by another
    whose fault path is three times as slow."""
    start = PLATFORMS["x86-pcie5"]
    slow = start.with_(fault_batch_latency=3 * start.fault_batch_latency, fault_latency=3 * start.fault_latency,
                       fault_htod_bw=start.fault_htod_bw / 3)
    cases = _cases(("strided", {"stride": 64 << 10}, "faults"), ("sequential_stream", {}, "faults"))
    device = 1 << 30
    times = calibrate.simulate(cases, start, device)
    run = {"device": "test", "free": device, "size": 32 * MiB, "cases": [
        {**case, "time": [{"seconds": float(times[i])}]} for i, case in enumerate(cases)]}
    path = tmp_path / "run.json"
    path.write_text(__import__("json").dumps(run))
    profile = slow.save(tmp_path / "slow.json")
    calibrate.check_profiles([str(path)], ["x86-pcie5", str(profile)])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("within 25%: 2/2")
    assert lines[1].endswith("within 25%: 0/2")
