"""``access()``: the CUDA backend's touch kernel, and its host loop, against the simulator's model of them.

    python benchmarks/sim_access.py --json out/sim_access.json        # on a GPU machine: measure, then compare
    python benchmarks/sim_access.py --from-json benchmarks/sim_access_h200.json   # the simulated side again

For device memory and for managed memory already on the GPU, each mode and size: the median of 20 timed
``CudaBackend.access`` calls after one untimed call (which compiles the kernel), beside ``SimBackend.access``
on the ``x86-pcie5`` profile. Then the host's side: managed memory prefetched to the host and pinned host
memory, touched by the host (one byte a page). Resident pages only: this measures the launch and the kernel,
or the host's loop, not faults.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from uvm_lab.backends.sim import SimBackend
from uvm_lab.events import EventBus
from uvm_lab.events.schema import MemoryKind
from uvm_lab.location import Location

GPU = Location.device(0)
HOST = Location.host()
KINDS = (MemoryKind.DEVICE, MemoryKind.MANAGED)
HOST_KINDS = (MemoryKind.MANAGED, MemoryKind.PINNED_HOST)
MODES = ("read", "write", "atomic")
SIZES = (4096, 64 << 20, 1 << 30)
HOST_SIZES = (64 << 20, 1 << 30)
REPEATS = 20


def measure(backend, repeats: int, host: bool = True) -> dict[str, dict[str, float]]:
    """``{"device read 4096": {"median_ms", "min_ms", "max_ms"}, ..., "managed read 67108864 host": ...}`` for
    every kind, mode and size on the GPU, then (with ``host``) on the host."""
    out = {}
    cases = [(kind, mode, size, GPU) for kind in KINDS for mode in MODES for size in SIZES]
    if host:
        cases += [(kind, mode, size, HOST) for kind in HOST_KINDS for mode in MODES for size in HOST_SIZES]
    for kind, mode, size, where in cases:
        ptr = backend.allocate(size, kind)
        try:
            if kind is MemoryKind.MANAGED:
                backend.prefetch(ptr, size, where)
            backend.synchronize()
            backend.access(ptr, size, where, mode)
            t = [backend.access(ptr, size, where, mode).seconds * 1e3 for _ in range(repeats)]
        finally:
            backend.free(ptr)
        key = f"{kind.name.lower()} {mode} {size}" + (" host" if where.is_host else "")
        out[key] = {"median_ms": statistics.median(t), "min_ms": min(t), "max_ms": max(t)}
    return out


def table(real: dict, sim: dict) -> str:
    lines = ["| memory | by | mode | bytes | real ms (median) | real min-max | sim ms | sim/real |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for key, r in real.items():
        kind, mode, size, *on = key.split()
        s = sim[key]["median_ms"]
        lines.append(f"| {kind} | {'host' if on else 'GPU'} | {mode} | {int(size):,} | {r['median_ms']:.4f} "
                     f"| {r['min_ms']:.4f}-{r['max_ms']:.4f} "
                     f"| {s:.4f} | {s / r['median_ms']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default=None, help="write the measurements here")
    ap.add_argument("--from-json", default=None, help="compare a saved run with the simulator as it is now")
    args = ap.parse_args()
    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text())
    else:
        from uvm_lab.backends.cuda import CudaBackend

        cuda = CudaBackend(bus=EventBus())
        saved = {"device": cuda.device_name, "repeats": REPEATS, "real": measure(cuda, REPEATS)}
        if args.json:
            Path(args.json).write_text(json.dumps(saved, indent=1))
    sim = measure(SimBackend(device_memory="16GiB", bus=EventBus()), 3)
    print(f"{saved['device']}; simulator profile x86-pcie5\n")
    print(table(saved["real"], sim))


if __name__ == "__main__":
    main()
