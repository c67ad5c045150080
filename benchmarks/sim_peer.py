"""Prefetches between the GPUs of a two-GPU host, against the simulator's peer link.

    python3 benchmarks/sim_peer.py --json out/peer.json      # on a machine with two GPUs

A managed buffer of 64 MiB, 256 MiB and 1 GiB, three times each: populated on GPU 0 and sent to the host, then
prefetched from the host to GPU 0, from GPU 0 to GPU 1, back, and to the host, each timed from one synchronize to the
next. Then the simulator's time for the same GPU 0 to GPU 1 prefetch, with two devices, under each profile. Every
buffer stays far below either card's free memory.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import uvm_lab as ul
from uvm_lab.backends.sim import SimBackend
from uvm_lab.events.schema import MemoryKind
from uvm_lab.location import Location

SIZES = (64 << 20, 256 << 20, 1 << 30)
STEPS = (("htod", Location.device(0)), ("d0_to_d1", Location.device(1)), ("d1_to_d0", Location.device(0)),
         ("dtoh", Location.host()))


def measure(backend, size: int, repeats: int) -> list[dict]:
    """Each step's seconds for a managed buffer of ``size``, ``repeats`` times."""
    rows = []
    for rep in range(repeats):
        ptr = backend.allocate(size, MemoryKind.MANAGED)
        backend.prefetch(ptr, size, Location.device(0))   # populated on GPU 0, then sent to the host
        backend.prefetch(ptr, size, Location.host())
        row: dict = {"size": size, "rep": rep}
        for name, where in STEPS:
            backend.synchronize()
            start = time.perf_counter()
            backend.prefetch(ptr, size, where)
            backend.synchronize()
            row[name] = time.perf_counter() - start
        backend.free(ptr)
        rows.append(row)
        print(f"{size >> 20:5} MiB, run {rep}: " + ", ".join(f"{n} {row[n] * 1e3:.2f} ms" for n, _ in STEPS)
              + f"; GPU 0 to 1 at {size / row['d0_to_d1'] / 1e9:.1f} GB/s", flush=True)
    return rows


def simulated(profile: str, size: int) -> float:
    """The simulator's seconds for the GPU 0 to GPU 1 prefetch of ``size``, after the same steps before it."""
    sim = SimBackend(device_memory="16GiB", devices=2, platform=profile)
    ptr = sim.allocate(size, MemoryKind.MANAGED)
    for where in (Location.device(0), Location.host(), Location.device(0)):
        sim.prefetch(ptr, size, where)
    start = sim.now_ns()
    sim.prefetch(ptr, size, Location.device(1))
    return (sim.now_ns() - start) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", default=None, help="write every row here")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True).stdout)
    gpu = ul.use_backend("cuda", watch=False)
    free = min(gpu.mem_info(0)[0], gpu.mem_info(1)[0])
    if max(SIZES) > free // 4:
        raise SystemExit(f"the GPUs have {free} bytes free: too little for {max(SIZES)}-byte buffers")
    rows = [row for size in SIZES for row in measure(gpu, size, args.repeats)]
    for profile in ("x86-pcie5", "x86-nvlink"):
        for size in SIZES:
            seconds = simulated(profile, size)
            rows.append({"profile": profile, "size": size, "d0_to_d1": seconds})
            print(f"{profile}: {size >> 20} MiB GPU 0 to 1 simulated in {seconds * 1e3:.2f} ms")
    if args.json:
        Path(args.json).write_text(json.dumps({"free": free, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
