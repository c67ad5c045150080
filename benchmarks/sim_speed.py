"""How fast the simulator runs: simulated page accesses per second of wall time, on one core.

    python benchmarks/sim_speed.py                 # resident sweeps, fault sweeps, 1.5x oversubscribed sweeps
    python benchmarks/sim_speed.py --size 64GiB    # 64 GiB, 3 passes at 1.5x (the 10 s goal)
    python benchmarks/sim_speed.py --workloads     # every workload of the catalog, 1 GiB buffers, at 1.5x
    python benchmarks/sim_speed.py --workloads --workload-size 4GiB --ratio 0.5   # 4 GiB buffers that fit
    python benchmarks/sim_speed.py --workloads --repeat 3   # each workload three times in one process

Prints one line per case and, with --json PATH, writes the figures as JSON. The compiled core is loaded (or, the
first time, compiled) before any case, and that time printed apart. For a workload, the line also
gives its faults and records, the time publishing its records takes with no simulation at all (a floor for any
simulator that publishes them), and the GPU time the model predicts for it against the wall time it took.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from uvm_lab.backends.sim import SimBackend, prepare
from uvm_lab.events import EventBus
from uvm_lab.events.schema import MemoryKind
from uvm_lab.location import Location
from uvm_lab.units import BLOCK_SIZE, PAGE_SIZE, format_bytes, parse_size
from uvm_lab.workloads import Workload


def sweep(size: int, ratio: float, passes: int) -> dict[str, float]:
    """``passes`` grid-stride reads of a host-written buffer on a GPU ``ratio`` times too small (or big)."""
    device = max(BLOCK_SIZE, int(size / ratio) // BLOCK_SIZE * BLOCK_SIZE)
    b = SimBackend(device_memory=device, bus=EventBus())
    ptr = b.allocate(size, MemoryKind.MANAGED)
    b.prefetch(ptr, size, Location.host())
    npages = size // PAGE_SIZE
    chunks = [ptr + np.arange(lo, min(npages, lo + (1 << 20)), dtype=np.uint64) * PAGE_SIZE
              for lo in range(0, npages, 1 << 20)]
    start = time.perf_counter()
    rates = []
    for _ in range(passes):
        r = b.access_stream(chunks, Location.device(0), "read")
        rates.append(size / r.seconds / 1e9)
    wall = time.perf_counter() - start
    return {"size": size, "ratio": ratio, "passes": passes, "wall_s": wall,
            "accesses_per_s": passes * npages / wall, "simulated_gb_per_s": rates}


def workload_speeds(size: int = 1 << 30, ratio: float = 1.5, repeat: int = 1) -> list[dict[str, float]]:
    """Each catalog workload (``size`` per buffer) under faults, on a GPU ``ratio`` times too small, run
    ``repeat`` times in this process (the first run of each meets memory the process has not touched yet)."""
    from uvm_lab import workloads as W

    out = []
    for name in W.WORKLOADS:
        w = W.make(name, size=size)
        accesses = sum(len(c.offsets) for ph in w.phases for c in W.phase_stream(w, ph))
        device = max(BLOCK_SIZE, int(w.total_bytes / ratio) // BLOCK_SIZE * BLOCK_SIZE)
        walls = []
        for _ in range(repeat):
            backend = SimBackend(device_memory=device, bus=EventBus())
            start = time.perf_counter()
            results = W.run_sim(w, backend)
            walls.append(time.perf_counter() - start)
        wall = walls[0]
        # Records are the run's events: where every access faults, making them bounds the rate.
        records = backend.bus.published
        # A rate in accesses, in context: the faults and records the run made (what costs the simulator most),
        # and the simulated seconds (the GPU time the model predicts for the run).
        faults = sum(r.faults or 0 for r in results)
        simulated = sum(r.seconds for r in results)
        publishing, replayed = publish_seconds(w, device)
        out.append({"workload": name, "accesses": accesses, "faults": faults, "records": records, "wall_s": wall,
                    "walls_s": walls, "simulated_s": simulated, "publish_s": publishing, "replayed": replayed,
                    "accesses_per_s": accesses / wall, "faults_per_s": faults / wall, "records_per_s": records / wall})
        rates = ", ".join(f"{accesses / x / 1e6:.2f}" for x in walls)
        print(f"{name:18} {accesses / 1e6:6.2f} M accesses {faults / 1e6:5.2f} M faults {records / 1e6:5.2f} M records"
              f" | {wall:5.2f} s wall: {rates} M accesses/s | its records alone {publishing * 1e3:5.1f} ms to publish"
              f" | simulated {simulated:6.3f} s, {simulated / wall:4.1f}x the wall time")
    return out


def publish_seconds(w: Workload, device: int) -> tuple[float, int]:
    """Seconds to publish one run's records to the subscriber a run has (``MigrationCounter``), with no
    simulation: the least time any simulator that publishes those records could take (the best of three);
    and how many records that was."""
    from uvm_lab import workloads as W
    from uvm_lab.workloads.sim import MigrationCounter

    backend = SimBackend(device_memory=device, bus=EventBus())
    parts: list[np.ndarray] = []
    sub = backend.bus.subscribe(lambda r: parts.append(r.copy()))
    W.run_sim(w, backend)
    sub.close()
    best = float("inf")
    for _ in range(3):
        bus = EventBus()
        counter = MigrationCounter(bus)
        start = time.perf_counter()
        for records in parts:
            bus.publish(records)
        counter.take()
        best = min(best, time.perf_counter() - start)
        counter.close()
    return best, bus.published


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default=None, help="one case: this buffer size, 3 passes at 1.5x")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--workloads", action="store_true", help="the catalog's workloads instead of sweeps")
    ap.add_argument("--workload-size", default="1GiB", help="bytes per buffer with --workloads")
    ap.add_argument("--ratio", type=float, default=1.5, help="working set / device memory with --workloads")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each workload with --workloads, in one process")
    args = ap.parse_args()
    if args.ratio <= 0:
        raise SystemExit(f"--ratio must be positive, got {args.ratio}")
    if args.repeat < 1:
        raise SystemExit(f"--repeat must be at least 1, got {args.repeat}")
    # The compiled core, loaded from numba's cache (compiled, the first time): once a process, not a workload's.
    start = time.perf_counter()
    prepare()
    print(f"the simulator's core loaded in {time.perf_counter() - start:.2f} s (once a process)")
    if args.workloads:
        res = workload_speeds(parse_size(args.workload_size, allow_zero=False), args.ratio, args.repeat)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(res, f, indent=1)
        return
    if args.size:
        cases = [(parse_size(args.size), 1.5, 3)]
    else:
        cases = [(4 << 30, 0.5, 3), (4 << 30, 1.5, 3), (16 << 30, 0.5, 10)]
    out = []
    for size, ratio, passes in cases:
        res = sweep(size, ratio, passes)
        out.append(res)
        print(f"{format_bytes(size):>8} x{passes} at {ratio}x: {res['wall_s']:7.2f} s wall, "
              f"{res['accesses_per_s'] / 1e6:6.2f} M page accesses/s; simulated GB/s per pass "
              + ", ".join(f"{g:.1f}" for g in res["simulated_gb_per_s"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
