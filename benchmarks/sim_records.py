"""The simulator's records against CUPTI's: how many of each kind a pass makes, and how big the copies are.

    python benchmarks/sim_records.py --size 1GiB --json out/records.json --markdown out/records.md
    python benchmarks/sim_records.py --from-json benchmarks/sim_records_h200.json --readme benchmarks/README.md

The first form needs CuPy, cuda-python, cupti-python and a GPU. Each workload of the catalog runs once under
each policy on GPU 0 with every unified-memory counter enabled, GPU faults included; then the same
description runs on the simulator (``x86-pcie5``, device memory = the card's free memory: neither side is
oversubscribed). Bytes and time are ``sim_vs_gpu.py``'s business; this compares what a trace of the run holds:
HtoD, DtoH, GPU-fault and CPU-fault records, and the HtoD copies by size. The second form rebuilds the table
from a saved run (the simulator side is recomputed).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
from sim_vs_gpu import _label, _workload, sim_device_memory, write_readme

from uvm_lab import workloads as W
from uvm_lab.events.schema import EventKind
from uvm_lab.units import BLOCK_SIZE, format_bytes, parse_size

KINDS = ("htod", "dtoh", "gpu_faults", "cpu_faults")
#: HtoD copy sizes, bucketed: one page, under 64 KiB, exactly 64 KiB, up to 2 MiB, over.
SIZES = ("4 KiB", "<64 KiB", "64 KiB", "<=2 MiB", ">2 MiB")


class CopySizes:
    """HtoD records published on a bus, counted by size bucket (:data:`SIZES`) and by cause, and the faults
    the GPU-fault records count (their ``value``)."""

    def __init__(self, bus) -> None:
        self.counts = np.zeros(len(SIZES), dtype=np.int64)
        self.causes = np.zeros(8, dtype=np.int64)
        self.faults = 0
        self._sub = bus.subscribe(self._add, kinds=(EventKind.HTOD, EventKind.GPU_PAGE_FAULT))

    def _add(self, records: np.ndarray) -> None:
        fault = records["kind"] == EventKind.GPU_PAGE_FAULT
        self.faults += int(records["value"][fault].sum())
        htod = records[~fault]
        n = htod["bytes"].astype(np.int64)
        bucket = np.select([n <= 4096, n < 65536, n == 65536, n <= BLOCK_SIZE], [0, 1, 2, 3], 4)
        self.counts += np.bincount(bucket, minlength=len(SIZES))
        self.causes += np.bincount(np.minimum(htod["flags"], 7), minlength=8)

    def take(self) -> dict:
        out = {"sizes": self.counts.tolist(), "causes": self.causes.tolist(), "faults": self.faults}
        self.counts[:] = 0
        self.causes[:] = 0
        self.faults = 0
        return out

    def close(self) -> None:
        self._sub.close()


def _total(results: list) -> dict[str, int]:
    out = dict.fromkeys(KINDS, 0)
    for r in results:
        for k in KINDS:
            out[k] += (r.records or {}).get(k, 0)
    out["htod_bytes"] = sum(r.bytes_htod or 0 for r in results)
    return out


def run_gpu_side(size: int, policies: tuple[str, ...], names: tuple[str, ...] = tuple(W.WORKLOADS),
                 gpu_faults: bool = True) -> dict:
    """Every workload under every policy once, traced with all of CUPTI's unified-memory counters (GPU faults
    only with ``gpu_faults``)."""
    import cupy

    from uvm_lab.tracing import CuptiCollector
    from uvm_lab.workloads.gpu import _cuda_backend

    backend = _cuda_backend(0)
    free, total = backend.mem_info(0)
    props = cupy.cuda.runtime.getDeviceProperties(0)
    out = {"device": props["name"].decode(), "free": free, "total": total, "size": size, "gpu_faults": gpu_faults,
           "cases": []}
    collector = CuptiCollector(bus=backend.bus, gpu_faults=gpu_faults, cpu_faults=True, required=True)
    collector.start()
    sizes = CopySizes(backend.bus)
    try:
        for name in names:
            for policy in policies:
                case = {"workload": name, "params": {}, "policy": policy}
                w = _workload(case, size)
                if w.total_bytes > free // 2:
                    raise SystemExit(f"{_label(case)} needs {format_bytes(w.total_bytes)}, over half the card's "
                                     f"{format_bytes(free)} free: use a smaller --size")
                before = collector.status()
                sizes.take()
                t0 = time.perf_counter()
                results = W.run_gpu(w, policy=policy, backend=backend, collector=collector)
                after = collector.status()
                case.update(real=_total(results), real_detail=sizes.take(), wall=time.perf_counter() - t0,
                            dropped=after["dropped"] - before["dropped"],
                            saturated=after.get("saturated", 0) - before.get("saturated", 0))
                out["cases"].append(case)
                print(f"gpu {_label(case):24} {policy:12} {case['real']} {case['real_detail']}", flush=True)
    finally:
        sizes.close()
        collector.stop()
        out["cupti_status"] = collector.status()
    return out


def run_sim_side(real: dict) -> None:
    """The simulator's records for every case of ``real``."""
    from uvm_lab.backends.sim import SimBackend
    from uvm_lab.events import EventBus

    device = sim_device_memory(real)
    for case in real["cases"]:
        backend = SimBackend(device_memory=device, platform="x86-pcie5", bus=EventBus())
        sizes = CopySizes(backend.bus)
        results = W.run_sim(_workload(case, real["size"]), backend, policy=case["policy"])
        backend.bus.flush()
        case["sim"], case["sim_detail"] = _total(results), sizes.take()
        sizes.close()


def _mean_kib(case: dict, side: str) -> str:
    n = case[side]["htod"]
    return f"{case[side]['htod_bytes'] / n / 1024:,.0f}" if n else "-"


def table(real: dict) -> str:
    """One row per case, each cell CUPTI / simulator. With GPU-fault capture on, the GPU-fault records and the
    share of the simulated HtoD bytes CUPTI delivered are shown too."""
    faults = real.get("gpu_faults", True)
    head = ["workload", "policy", "HtoD records", "KiB per HtoD record", "by cause: coherence, prefetch, user",
            "HtoD records by size (" + ", ".join(SIZES) + ")", "DtoH records", "CPU fault records"]
    if faults:
        head += ["GPU fault records (faults they count)", "HtoD bytes, CUPTI / sim"]
    lines = [f"{real['device']}, buffers of {format_bytes(real['size'])}, one traced run per case, CUPTI's GPU-fault "
             f"counter {'on' if faults else 'off'}. Each cell is CUPTI / simulator, summed over the run's passes.",
             "", "| " + " | ".join([*head, "note"]) + " |",
             "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: |" + " ---: |" * (len(head) - 8) + " --- |"]
    for case in real["cases"]:
        r, s, rd, sd = case["real"], case["sim"], case["real_detail"], case["sim_detail"]
        note = []
        if case.get("dropped"):
            note.append(f"CUPTI dropped {case['dropped']}")
        if case.get("saturated"):
            note.append(f"{case['saturated']} drains brought a full queue (records likely lost)")
        by_size = " / ".join(f"{a:,}:{b:,}" for a, b in zip(rd["sizes"], sd["sizes"], strict=True))
        cells = [_label(case), case["policy"], f"{r['htod']:,} / {s['htod']:,}",
                 f"{_mean_kib(case, 'real')} / {_mean_kib(case, 'sim')}",
                 " / ".join(", ".join(f"{d['causes'][c]:,}" for c in (2, 3, 1)) for d in (rd, sd)), by_size,
                 f"{r['dtoh']:,} / {s['dtoh']:,}", f"{r['cpu_faults']:,} / {s['cpu_faults']:,}"]
        if faults:
            cells.append(f"{r['gpu_faults']:,} ({rd['faults']:,}) / {s['gpu_faults']:,} ({sd['faults']:,})")
            cells.append(f"{r['htod_bytes'] / s['htod_bytes']:.2f}" if s["htod_bytes"] else "-")
        lines.append("| " + " | ".join([*cells, "; ".join(note)]) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1GiB", help="bytes per buffer (stencil has 2 buffers, matmul 3)")
    ap.add_argument("--policies", default=",".join(W.POLICIES), help="policies to run each workload under")
    ap.add_argument("--json", default=None, help="write the real and simulated counts here")
    ap.add_argument("--markdown", default=None, help="write the table here")
    ap.add_argument("--workloads", default=",".join(W.WORKLOADS), help="workloads to run")
    ap.add_argument("--no-gpu-faults", action="store_true", help="leave CUPTI's GPU-fault counter off")
    ap.add_argument("--from-json", default=None, help="rebuild from a saved run (simulator side recomputed)")
    ap.add_argument("--readme", default=None, help="write the table into this README between the markers")
    args = ap.parse_args()
    policies = tuple(p for p in args.policies.split(",") if p)
    unknown = [p for p in policies if p not in W.POLICIES]
    if unknown or not policies:
        raise SystemExit(f"--policies takes {', '.join(W.POLICIES)}; got {args.policies!r}")
    if args.from_json:
        real = json.loads(Path(args.from_json).read_text())
    else:
        real = run_gpu_side(parse_size(args.size), policies, tuple(n for n in args.workloads.split(",") if n),
                            gpu_faults=not args.no_gpu_faults)
    run_sim_side(real)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(real, indent=1))
    text = table(real)
    print(text)
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(text)
    if args.readme:
        write_readme(Path(args.readme), text, marker="sim_records")


if __name__ == "__main__":
    main()
