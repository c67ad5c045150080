"""benchmarks/sim_records.py: the simulator's records beside CUPTI's, from a saved H200 run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from . import benchmark_scripts

ROOT = Path(__file__).resolve().parents[2]
SAVED = ROOT / "benchmarks" / "sim_records_h200.json"


@pytest.fixture(scope="module")
def sim_records():
    return benchmark_scripts.load("sim_records")   # it imports its sibling sim_vs_gpu.py


def _saved(*wanted):
    real = json.loads(SAVED.read_text())
    real["cases"] = [c for c in real["cases"] if (c["workload"], c["policy"]) in wanted]
    assert len(real["cases"]) == len(wanted)
    return real


def test_the_random_gather_makes_the_copies_the_h200_made(sim_records):
    # The one workload whose faults come in no order on the GPU as in the simulator: batches, the big-page
    # upgrade and the density prefetcher must make CUPTI's copies, cause by cause and size by size.
    real = _saved(("random_gather", "faults"), ("random_gather", "prefetch"))
    sim_records.run_sim_side(real)
    faults, prefetch = real["cases"]
    assert faults["sim"]["htod_bytes"] == faults["real"]["htod_bytes"] == 1 << 30
    for side in ("real", "sim"):
        assert faults[side + "_detail"]["causes"][1] == 0      # no user prefetch under faults
    for cause in (2, 3):   # coherence, prefetch
        assert faults["sim_detail"]["causes"][cause] == pytest.approx(faults["real_detail"]["causes"][cause],
                                                                      rel=0.05)
    for real_n, sim_n in zip(faults["real_detail"]["sizes"], faults["sim_detail"]["sizes"], strict=True):
        assert sim_n == pytest.approx(real_n, rel=0.05, abs=10)
    # Chunked user prefetch: one 2 MiB record per block on both.
    assert prefetch["sim"]["htod"] == prefetch["real"]["htod"] == 512
    assert prefetch["sim_detail"]["sizes"] == prefetch["real_detail"]["sizes"]


def test_the_table_puts_cupti_beside_the_simulator(sim_records):
    real = _saved(("host_then_device", "faults"))
    sim_records.run_sim_side(real)
    text = sim_records.table(real)
    assert "GPU-fault counter off" in text and "GPU fault records" not in text
    row = next(line for line in text.splitlines() if line.startswith("| host_then_device"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2] == f"{real['cases'][0]['real']['htod']:,} / 1,024"
    assert cells[6:8] == ["6,144 / 6,144", "3,072 / 3,072"]     # DtoH and CPU-fault records agree exactly
    real["gpu_faults"] = True
    assert "GPU fault records (faults they count)" in sim_records.table(real)
