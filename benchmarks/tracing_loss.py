"""Are CUPTI's migration records complete? A fault-driven GPU read, checked against the host's page tables.

Each trial writes a managed buffer on the host, reads it on the GPU through faults, synchronizes and
flushes the collector, then compares the HtoD bytes the records report with the pages the host gave up
(``/proc/self/pagemap``, an exact oracle). Then it waits ``--settle`` seconds and flushes again, to tell
records that arrive late (delivered after the flush) from records that never arrive (lost).

Per trial it prints: the host pages lost; the HtoD coverage at the first flush and after the settle; how
many of the GPU-faulted pages no HtoD record covers (a loss check that needs no oracle, and misses
windows where faults and migrations are lost together); the pages ``CuptiCollector.check_host`` finds
unrecorded against those the records miss (they should be equal); the most records one drain brought;
and whether the collector called the trace complete. Needs a GPU and cupti-python.

    python benchmarks/tracing_loss.py [--size 256MiB] [--trials 8] [--settle 0.5]
                                      [--counters faults|migrations|transfers] [--drain 0.001]
                                      [--buffer-size 8MiB] [--attr NAME=VALUE ...]
                                      [--decoder auto|raw|objects] [--save trials.npz]

``--attr`` sets one of CUPTI's activity attributes (``cupti.ActivityAttribute``, for example
``DEVICE_BUFFER_POOL_LIMIT=64``) before the counters are enabled; the first line printed gives every
attribute's value as CUPTI then reports it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PAGE = 4096


def covered_pages(htod: np.ndarray, base: int, pages: int) -> np.ndarray:
    """A bool per page of the buffer: True where an HtoD record's range covers it."""
    cover = np.zeros(pages + 1, dtype=np.int32)
    first = (htod["address"].astype(np.int64) - base) // PAGE
    last = first + (htod["bytes"].astype(np.int64) + PAGE - 1) // PAGE
    first, last = np.clip(first, 0, pages), np.clip(last, 0, pages)
    np.add.at(cover, first, 1)
    np.add.at(cover, last, -1)
    return np.cumsum(cover[:-1]) > 0


def after_sync_ms(stamps: np.ndarray, synced: int) -> float | None:
    """The latest of ``stamps`` relative to the synchronize, in ms (negative: before it)."""
    return float((stamps.astype(np.int64) - synced).max() / 1e6) if len(stamps) else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="256MiB")
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--settle", type=float, default=0.5, help="seconds to wait before the second flush")
    parser.add_argument("--counters", choices=["faults", "migrations", "transfers"], default="faults")
    parser.add_argument("--buffer-size", default="8MiB", help="bytes per CUPTI activity buffer")
    parser.add_argument("--attr", action="append", default=[], metavar="NAME=VALUE",
                        help="a CUPTI activity attribute to set (cupti.ActivityAttribute's name), repeatable")
    parser.add_argument("--drain", type=float, default=0.001)
    parser.add_argument("--decoder", choices=["auto", "raw", "objects"], default="auto",
                        help="how CUPTI's buffers are received (uvm_lab.tracing.CuptiCollector's decoder)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--save", type=Path, help="keep each trial's events and host bitmaps in this .npz")
    args = parser.parse_args()

    import uvm_lab as ul
    from uvm_lab.events import EventKind
    from uvm_lab.tracing import CuptiCollector, host_resident

    backend = ul.use_backend("cuda", watch=False)   # CUPTI's records alone: nothing inferred
    size = ul.parse_size(args.size)
    free, _ = backend.mem_info()
    if size > free // 8:
        raise SystemExit(f"refusing: {ul.format_bytes(size)} is too close to the {ul.format_bytes(free)} free")
    options = {"faults": {"gpu_faults": True}, "migrations": {"counters": ["htod", "dtoh", "dtod"]},
               "transfers": {"counters": ["htod", "dtoh"]}}[args.counters]
    attributes = {name: int(value) for name, value in (a.split("=", 1) for a in args.attr)}
    collector = CuptiCollector(required=True, drain_interval=args.drain, decoder=args.decoder,
                               buffer_size=ul.parse_size(args.buffer_size), attributes=attributes, **options).start()
    print(json.dumps({"config": {"counters": args.counters, "drain": args.drain, "buffer_size": args.buffer_size,
                                 "attributes": collector.attribute_values()}}), flush=True)
    pages = size // PAGE
    rows, kept = [], {}
    for trial in range(args.trials):
        buf = ul.DeviceBuffer(size=size, mr=ul.mr.ManagedMemoryResource())
        buf.host_view()[:] = 1
        collector.flush()
        before = host_resident(buf.ptr, size)
        saturated, most = collector.saturated, collector.max_per_drain
        collector.max_per_drain = 0
        with ul.record() as trace:
            ul.touch(buf, on="gpu")
            backend.synchronize()
            synced = backend.now_ns()
            collector.flush()
            first = trace.events.copy()
            time.sleep(args.settle)
            collector.flush()
            settled = trace.events.copy()
            found = collector.check_host(repair=False)   # what the pagemap check says was missed
        lost = int((before & ~host_resident(buf.ptr, size)).sum())
        htod_first = first[first["kind"] == EventKind.HTOD]
        htod = settled[settled["kind"] == EventKind.HTOD]
        late = htod[len(htod_first):]
        faults = settled[settled["kind"] == EventKind.GPU_PAGE_FAULT]
        fault_pages = np.unique((faults["address"].astype(np.int64) - buf.ptr) // PAGE)
        fault_pages = fault_pages[(fault_pages >= 0) & (fault_pages < pages)]
        uncovered = int((~covered_pages(htod_first, buf.ptr, pages)[fault_pages]).sum())
        row = {
            "trial": trial, "host_pages_lost": lost,
            "htod_first": int(htod_first["bytes"].sum()) / (lost * PAGE or 1),
            "htod_settled": int(htod["bytes"].sum()) / (lost * PAGE or 1),
            "late_records": len(late),
            "late_start_after_sync_ms": after_sync_ms(late["start"], synced),
            "last_htod_end_vs_sync_ms": after_sync_ms(htod["end"], synced),
            "htod_records": len(htod), "gpu_fault_records": len(faults),
            "faulted_pages": len(fault_pages), "faulted_pages_uncovered": uncovered,
            "check_host_htod_pages": found.htod,
            "missed_htod_pages": lost - int(htod["bytes"].sum()) // PAGE,
            "max_per_drain": collector.max_per_drain, "saturated": collector.saturated - saturated,
            "complete": collector.status()["complete"], "receiver": collector.receiver,
        }
        collector.max_per_drain = max(most, collector.max_per_drain)
        rows.append(row)
        if args.save:
            kept.update({f"events{trial}": settled, f"before{trial}": before, f"base{trial}": np.uint64(buf.ptr),
                         f"after{trial}": host_resident(buf.ptr, size), f"synced{trial}": np.int64(synced)})
        print(json.dumps(row), flush=True)
        buf.close()
    collector.stop()
    print(json.dumps({"dropped": collector.dropped, "records": collector.records, "drains": collector.drains}))
    if args.save:
        np.savez_compressed(args.save, **kept)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
