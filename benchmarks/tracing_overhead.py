"""What tracing real faults and migrations costs a fault-heavy workload.

A 2 GiB managed buffer is written on the host, then read by a GPU kernel that faults every page in
(about 0.3 s on an H200). The read's wall time, kernel launch to synchronize and then to every record
delivered (``flush``), is measured with CUPTI off (the peer), with migrations only, and with GPU and CPU
fault capture; each run is a fresh process (CUPTI cannot be fully switched off once on), the modes
interleaved, best and median of ``--repeats``. uvm_lab's residency tracker listens throughout, as it
does in a notebook, so its cost is in the figures. Needs a GPU and cupti-python.

The records are checked too: ``htod`` is the fraction of the buffer's bytes the HtoD records account
for (1.0: nothing lost), ``saturated`` the drains that brought CUPTI's whole queue (records lost).

    python benchmarks/tracing_overhead.py [--size 2GiB] [--repeats 3] [--drain 0.001] [--modes ...] [--json out.json]

Modes: ``watcher`` runs no CUPTI, only the host watcher (``ul.tracing.watch``, on by default on a GPU) at its
default interval, ``watcher 0.05 s`` at 20 rounds a second; their rows add the CPU time a round takes per GiB
watched. ``transfers`` enables only the HtoD and DtoH byte counters; ``migrations`` adds DtoD, thrashing,
throttling and remote-map; ``faults`` adds GPU and CPU page faults (``faults (objects)``
receives CUPTI's buffers as cupti-python's objects); ``cupti alone`` enables the same counters as ``faults``
through cupti-python with nothing of uvm_lab listening, the floor any collector stands on.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODES = {
    "off": None,
    # No CUPTI: the host watcher alone (on by default on a GPU), at its default interval and at 20 per second.
    "watcher": {"watch": 0.25},
    "watcher 0.05 s": {"watch": 0.05},
    "transfers": {"counters": ["htod", "dtoh"]},
    "migrations": {"counters": ["htod", "dtoh", "dtod", "thrashing", "throttling", "remote_map"]},
    "faults": {"gpu_faults": True, "cpu_faults": True},
    "faults (objects)": {"gpu_faults": True, "cpu_faults": True, "decoder": "objects"},
    # CUPTI with no uvm_lab in the way: cupti-python's own calls, the same counters as "faults", buffers
    # large enough that no callback runs until the final flush. What the counters cost by themselves.
    "cupti alone": "bare",
}
#: CUpti_ActivityUnifiedMemoryCounterConfig, and the counter kinds the "faults" mode enables.
_CONFIG = [("scope", "<i4"), ("kind", "<i4"), ("device_id", "<u4"), ("enable", "<u4")]
_FAULT_COUNTERS = [1, 2, 3, 4, 5, 6, 7, 8]


def cupti_alone(backend, device: int):
    """Enable the counters through cupti-python alone; return a function that flushes and counts the records."""
    import numpy as np
    from cupti import cupti

    received = [0]

    def requested():
        return 64 << 20, 0

    def completed(activities):
        received[0] += len(activities)

    cupti.activity_register_callbacks(requested, completed)
    config = np.zeros(len(_FAULT_COUNTERS), dtype=_CONFIG)
    config["scope"], config["kind"], config["device_id"], config["enable"] = 1, _FAULT_COUNTERS, device, 1
    cupti.activity_configure_unified_memory_counter(config.ctypes.data, len(config))
    cupti.activity_enable(cupti.ActivityKind.UNIFIED_MEMORY_COUNTER)

    def finish() -> int:
        cupti.activity_flush_all(1)
        return received[0]

    return finish


def child(mode: str, size_text: str, drain: float) -> None:
    import uvm_lab as ul
    from uvm_lab.events import EventKind
    from uvm_lab.tracing import CuptiCollector

    backend = ul.use_backend("cuda", watch=False)
    size = ul.parse_size(size_text)
    free, _ = backend.mem_info()
    if size > free // 4:
        raise SystemExit(f"refusing: {ul.format_bytes(size)} is too close to the {ul.format_bytes(free)} free")
    options = MODES[mode]
    bare = cupti_alone(backend, backend.current_device()) if options == "bare" else None
    watching = isinstance(options, dict) and "watch" in options
    collector = CuptiCollector(required=True, drain_interval=drain, **options).start() \
        if isinstance(options, dict) and not watching else None
    buf = ul.DeviceBuffer(size=size, mr=ul.mr.ManagedMemoryResource())
    t0 = time.perf_counter()
    buf.host_view()[:] = 1
    if collector:
        collector.flush()
    host_write = time.perf_counter() - t0
    backend.synchronize()
    htod = [0]
    counting = ul.events.get_bus().subscribe(lambda r: htod.__setitem__(0, htod[0] + int(r["bytes"].sum())),
                                             kinds=[EventKind.HTOD])
    watcher = ul.tracing.watch(options["watch"]) if watching else None
    if watcher:
        watcher.check()   # the host's side is settled before the kernel, as it would be in a session
        cpu0, rounds0 = watcher.cpu_seconds, watcher.rounds
    t0 = time.perf_counter()
    ul.touch(buf, on="gpu")
    backend.synchronize()
    kernel = time.perf_counter() - t0
    if collector:
        collector.flush()
    bare_records = bare() if bare else 0
    delivered = time.perf_counter() - t0
    if watcher:
        ul.tracing.unwatch()
        rounds, cpu = watcher.rounds - rounds0, watcher.cpu_seconds - cpu0
        watcher.check()   # the map after the kernel, as the next round would leave it (not timed)
        idle0 = watcher.cpu_seconds
        for _ in range(5):   # rounds with nothing moving: a session's usual case
            watcher.check()
        idle = (watcher.cpu_seconds - idle0) / 5
    residency = ul.residency(buf).summary()
    counting.close()
    status = collector.status() if collector else {}
    buf.close()
    if collector:
        collector.stop()
    print(json.dumps({"mode": mode, "host_write_s": host_write, "kernel_s": kernel, "delivered_s": delivered,
                      "records": status.get("records", bare_records), "dropped": status.get("dropped", 0),
                      "receiver": status.get("receiver", ""), "gpu_fraction": residency["gpu"],
                      "htod": htod[0] / size, "saturated": status.get("saturated", 0),
                      "max_per_drain": status.get("max_per_drain", 0),
                      "watch_rounds": rounds if watcher else 0,
                      "watch_cpu_ms_per_gib_round": cpu / rounds / (size / 2**30) * 1e3 if watcher and rounds else None,
                      "watch_idle_cpu_ms_per_gib_round": idle / (size / 2**30) * 1e3 if watcher else None}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="2GiB")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--drain", type=float, default=0.001, help="the collector's drain_interval, seconds")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--modes", default=",".join(MODES), help=f"which of {', '.join(MODES)} (comma-separated)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.size, args.drain)
        return
    modes = ["off", *(m for m in args.modes.split(",") if m != "off")]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"unknown mode(s) {unknown}; choose from {list(MODES)}")
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for _ in range(args.repeats):
        for mode in modes:
            out = subprocess.run([sys.executable, __file__, "--child", mode, "--size", args.size,
                                  "--drain", str(args.drain)], capture_output=True,
                                 text=True, timeout=300)
            if out.returncode:
                print(f"{mode}: failed\n{out.stderr[-2000:]}")
                continue
            runs[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
    base = min(r["delivered_s"] for r in runs["off"]) if runs["off"] else float("nan")
    result = {}
    kernel_off = statistics.median(r["kernel_s"] for r in runs["off"]) if runs["off"] else float("nan")
    print(f"{'mode':<18}{'best ms':>9}{'median':>9}{'vs off':>8}{'kernel ms':>11}{'median':>8}{'vs off':>8}"
          f"{'records':>9}{'dropped':>9}"
          f"{'htod':>7}{'saturated':>10}{'max/drain':>10}{'host write ms':>15}  receiver")
    for mode, rs in runs.items():
        if not rs:
            continue
        d = [r["delivered_s"] for r in rs]
        result[mode] = {"best_s": min(d), "median_s": statistics.median(d), "ratio": min(d) / base, "runs": rs}
        k = [r["kernel_s"] for r in rs]
        print(f"{mode:<18}{min(d) * 1e3:>9.1f}{statistics.median(d) * 1e3:>9.1f}{min(d) / base:>8.3f}"
              f"{min(k) * 1e3:>11.1f}{statistics.median(k) * 1e3:>8.1f}{statistics.median(k) / kernel_off:>8.3f}"
              f"{rs[0]['records']:>9}{max(r['dropped'] for r in rs):>9}"
              f"{min(r['htod'] for r in rs):>7.3f}{max(r['saturated'] for r in rs):>10}"
              f"{max(r['max_per_drain'] for r in rs):>10}"
              f"{min(r['host_write_s'] for r in rs) * 1e3:>15.1f}  {rs[0]['receiver']}"
              + (f"  watcher: {rs[0]['watch_rounds']} rounds in the kernel, "
                 f"{statistics.median(r['watch_cpu_ms_per_gib_round'] for r in rs):.2f} CPU ms per GiB a round, "
                 f"{statistics.median(r['watch_idle_cpu_ms_per_gib_round'] for r in rs):.2f} with nothing moving"
                 if rs[0].get("watch_cpu_ms_per_gib_round") else ""))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
