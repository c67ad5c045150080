"""CUPTI and the host watcher together, as a session runs them: are CUPTI's losses counted, and is the map true?

With the defaults of ``use_backend("cuda")`` (the host watcher on) and a CUPTI collector capturing GPU and CPU
faults, a managed buffer is written on the host and read by a kernel that faults it in, ``--trials`` times. After
each read the devices are synchronized, CUPTI drained and one watcher round run. Printed per trial: whether the
map's host side equals the host's page tables on every page, the map's page counts, and the collector's status
(records, pages found moved with no record, complete or not). Needs a GPU and cupti-python.

    python3 benchmarks/watch_with_cupti.py [--size 1GiB] [--trials 3]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1GiB")
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()

    import uvm_lab as ul
    from uvm_lab.tracing import CuptiCollector, host_resident

    backend = ul.use_backend("cuda")
    size = ul.parse_size(args.size)
    if size > backend.mem_info()[0] // 8:
        raise SystemExit(f"refusing: {ul.format_bytes(size)} is too close to what the GPU has free")
    watcher = ul.tracing.get_watcher()
    with CuptiCollector(gpu_faults=True, required=True) as cupti:
        for trial in range(args.trials):
            buf = ul.DeviceBuffer(size=size, mr=ul.mr.ManagedMemoryResource())
            buf.host_view()[:] = 1
            ul.touch(buf, on="gpu")
            backend.synchronize()
            cupti.flush()
            watcher.check()
            m = ul.residency(buf)
            exact = bool((((m.states & 1) != 0) == host_resident(buf.ptr, buf.size)).all())
            status = cupti.status()
            print(trial, "host side exact:", exact, m.counts(),
                  {k: status[k] for k in ("records", "unrecorded", "saturated", "complete")}, flush=True)
            buf.close()
    print(watcher)


if __name__ == "__main__":
    main()
