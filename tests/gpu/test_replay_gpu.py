"""A real GPU's trace replayed on the simulator: the GPU's bytes, reproduced; and what a trace without accesses can
and cannot tell."""

from __future__ import annotations

import pytest

import uvm_lab as ul
from uvm_lab.trace_replay import measured
from uvm_lab.tracing import CuptiCollector, cupti_status
from uvm_lab.workloads import gpu_available, make, run_gpu

pytestmark = pytest.mark.gpu
MiB = 1 << 20


@pytest.fixture
def cupti(cuda):
    """CUPTI's migration counters. Once a process has turned on GPU fault capture (an earlier test may have), CUPTI
    loses HtoD records of fault-driven reads silently (benchmarks/README.md, "CUPTI's silent loss"); run_gpu
    finds what it lost on the host's page tables after each pass."""
    status = cupti_status()
    if not status["installed"]:
        pytest.skip(status["reason"])
    if not gpu_available():
        pytest.skip("needs CuPy")
    collector = CuptiCollector(gpu_faults=False, required=True).start()
    yield collector
    collector.stop()


def within(replayed: int, gpu: int, share: float = 0.05) -> bool:
    return abs(replayed - gpu) <= share * gpu


@pytest.mark.parametrize("policy", ["faults", "prefetch"])
@pytest.mark.parametrize("name", ["sequential_stream", "multi_pass_stream", "strided", "stencil", "tiled_matmul",
                                  "host_then_device"])
def test_a_catalog_run_on_the_gpu_replays_its_bytes_within_5_percent(cuda, cupti, name, policy):
    free, total = cuda.mem_info()
    workload = make(name, size="256MiB")
    assert workload.total_bytes * 8 < free, "GPU tests stay far below the card's free memory"
    with ul.record(accesses=True, limit=1 << 22) as trace:
        run_gpu(workload, policy=policy, backend=cuda, collector=cupti)
    gpu = measured(trace)
    replayed = ul.replay(trace, device_memory=total)

    assert replayed.exact and not trace.missed
    assert gpu["bytes_htod"] > 0
    assert within(replayed.bytes_htod, gpu["bytes_htod"]), (replayed.bytes_htod, gpu["bytes_htod"])
    assert within(replayed.bytes_dtoh, gpu["bytes_dtoh"]) or abs(replayed.bytes_dtoh - gpu["bytes_dtoh"]) <= 2 * MiB


def test_a_touch_on_the_gpu_replays_as_recorded(cuda, cupti):
    with ul.record(accesses=True) as trace:
        buf = ul.DeviceBuffer(size="64MiB", mr=ul.mr.ManagedMemoryResource())
        ul.touch(buf, on="host", mode="write")
        ul.touch(buf, on="gpu")
        cuda.synchronize()
        cupti.check_host()   # what CUPTI lost, from the host's page tables
        ul.touch(buf, on="host")
        cupti.check_host()
    gpu = measured(trace)
    replayed = ul.replay(trace, device_memory=cuda.mem_info()[1])

    assert replayed.exact
    assert within(replayed.bytes_htod, gpu["bytes_htod"]) and gpu["bytes_htod"] >= 60 * MiB
    assert within(replayed.bytes_dtoh, gpu["bytes_dtoh"])
    buf.close()


def test_a_trace_without_accesses_replays_no_more_than_the_gpu_moved(cuda, cupti):
    with ul.record() as trace:   # CUPTI's faults and migrations, no accesses
        run_gpu(make("multi_pass_stream", size="128MiB", passes=3), backend=cuda, collector=cupti)
    gpu = measured(trace)
    replayed = ul.replay(trace, device_memory=cuda.mem_info()[1])

    assert not replayed.exact and "lower bound" in replayed.note
    assert 0 < replayed.bytes_htod <= gpu["bytes_htod"] * 1.05
