"""Record what a two-GPU machine publishes with tracing off, for CI to replay (``tests/unit/test_two_gpu_replay.py``).

A scripted sequence on two managed buffers: host writes, prefetches to each GPU and back (whole and in part), a
kernel on GPU 1, ReadMostly duplicates on both GPUs, a host read. After each step the devices are synchronized
and the host watcher runs one round. Saved: every event published (the inferred ones too), and at the end each
buffer's map and the host's page tables of its pages.

    python3 tests/gpu/record_two_gpus.py OUT.npz       # on a machine with two GPUs
"""

from __future__ import annotations

import sys

import numpy as np

import uvm_lab as ul
from uvm_lab.tracing import HostWatcher, host_resident

MiB = 1 << 20


def main(path: str) -> None:
    backend = ul.use_backend("cuda", watch=False)
    if backend.device_count() < 2:
        raise SystemExit(f"needs two GPUs, this machine has {backend.device_count()}")
    watcher = HostWatcher(tracker=ul.get_tracker(), gpus=2)
    mr = ul.mr.ManagedMemoryResource()

    def settle() -> None:
        backend.synchronize()
        watcher.check()

    with ul.record() as trace:
        a = ul.DeviceBuffer(size=8 * MiB, mr=mr)
        b = ul.DeviceBuffer(size=4 * MiB, mr=mr)
        steps = [
            lambda: ul.touch(a, on="host", mode="write"),
            lambda: a.prefetch("gpu:0"),
            lambda: a.prefetch("gpu:1", offset=4 * MiB, size=4 * MiB),
            lambda: a.prefetch("host", offset=0, size=1 * MiB),
            lambda: ul.touch(a, on="gpu:1", mode="read", offset=2 * MiB, size=2 * MiB),
            lambda: ul.touch(b, on="host", mode="write"),
            lambda: setattr(b, "read_mostly", True),
            lambda: b.prefetch("gpu:0"),
            lambda: b.prefetch("gpu:1", offset=0, size=2 * MiB),
            lambda: ul.touch(b, on="host", mode="read"),
        ]
        for step in steps:
            step()
            settle()
    maps = {name: ul.residency(buf) for name, buf in (("a", a), ("b", b))}
    np.savez_compressed(
        path, events=trace.events,
        **{f"{k}_states": m.states for k, m in maps.items()},
        **{f"{k}_host": host_resident(m.address, m.size) for k, m in maps.items()},
        **{f"{k}_address": np.uint64(m.address) for k, m in maps.items()})
    for k, m in maps.items():
        print(k, m)
    a.close()
    b.close()


if __name__ == "__main__":
    main(sys.argv[1])
