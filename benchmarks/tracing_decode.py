"""Decoding CUPTI's unified-memory records, and taking them onto the event bus.

- decode: raw activity-buffer bytes (CUpti_ActivityUnifiedMemoryCounter3, as CUPTI fills its buffers) to
  uvm_lab events with ``decode_buffer``; the peer, in the same run, is the per-record path: one Python
  object per record (cupti-python's ``ActivityUnifiedMemoryCounter3.from_ptr`` where cupti-python is
  installed, else a plain attribute object), its fields read into a tuple, as a buffer callback that
  takes cupti-python's objects one by one would.
- bus: ``EventBus.publish`` of decoded batches to a bus where ``record()`` keeps every event and a
  residency-style kind filter listens; the peer is copying the same batches (``np.concatenate``), the
  least any recording can cost.

    python benchmarks/tracing_decode.py [--records 2000000] [--batch 80000] [--repeats 5] [--json out.json]

Records are synthetic but shaped like an H200's: HtoD/DtoH of 4 KiB..2 MiB, GPU faults, CPU faults.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from uvm_lab.events import EventBus, EventKind
from uvm_lab.events.trace import record
from uvm_lab.tracing import CUPTI_UM_COUNTER3_DTYPE, decode_buffer


def synthetic(n: int, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    raw = np.zeros(n, dtype=CUPTI_UM_COUNTER3_DTYPE)
    raw["kind"] = 25
    raw["counter_kind"] = rng.choice([1, 1, 1, 2, 3, 4], size=n)
    raw["value"] = rng.integers(1, 513, size=n) * 4096
    raw["start"] = np.cumsum(rng.integers(100, 5000, size=n))
    raw["end"] = raw["start"] + rng.integers(500, 20000, size=n)
    raw["address"] = 0x7F0000000000 + rng.integers(0, 1 << 19, size=n) * 4096
    raw["src_id"] = np.where(raw["counter_kind"] == 1, 0xFFFFFFFF, 0)
    raw["dst_id"] = np.where(raw["counter_kind"] == 2, 0xFFFFFFFF, 0)
    raw["flags"] = rng.integers(1, 4, size=n)
    raw["stream_id"] = 0xFFFFFFFF
    return raw


def best_and_median(fn, repeats: int) -> tuple[float, float]:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times)


def per_record_peer(raw: np.ndarray, count: int) -> float:
    """Seconds per record for the one-object-per-record path, on ``count`` records."""
    buf = np.ascontiguousarray(raw[:count])
    try:
        from cupti import cupti

        typed = buf.view(cupti.activity_unified_memory_counter3_dtype)
        make = lambda i: cupti.ActivityUnifiedMemoryCounter3.from_data(typed[i:i + 1])  # noqa: E731
        how = "cupti-python ActivityUnifiedMemoryCounter3 objects"
    except Exception:
        class Rec:
            __slots__ = ("address", "counter_kind", "dst_id", "end", "flags_", "kind", "src_id", "start", "value")

        rows = buf.tolist()

        def make(i):
            r = Rec()
            (r.kind, r.counter_kind, r.value, r.start, r.end, r.address, r.src_id, r.dst_id, _, _, r.flags_, _,
             _) = rows[i]
            return r
        how = "plain Python objects (cupti-python not installed)"

    def run():
        out = []
        for i in range(count):
            a = make(i)
            out.append((a.counter_kind, a.flags_, a.src_id, a.dst_id, a.start, a.end, a.address, a.value))
        return out

    best, _ = best_and_median(run, 3)
    return best / count, how


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--batch", type=int, default=80_000, help="records per activity buffer (8 MiB ~ 80k)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    n, batch = args.records, args.batch
    raw = synthetic(n)
    data = raw.tobytes()
    buffers = [memoryview(data)[i * 104:(i + batch) * 104] for i in range(0, n, batch)]

    decode_best, decode_median = best_and_median(lambda: [decode_buffer(b) for b in buffers], args.repeats)
    peer_per_record, peer_how = per_record_peer(raw, min(n, 200_000))
    decoded = [decode_buffer(b) for b in buffers]
    assert sum(len(d) for d in decoded) == n

    def publish():
        bus = EventBus(capacity=1 << 22)
        bus.subscribe(lambda r: None, kinds=[EventKind.HTOD, EventKind.DTOH, EventKind.GPU_PAGE_FAULT])
        with record(bus) as trace:
            for d in decoded:
                bus.publish(d)
        assert len(trace) == n

    bus_best, bus_median = best_and_median(publish, args.repeats)
    copy_best, _ = best_and_median(lambda: np.concatenate([d.copy() for d in decoded]), args.repeats)

    result = {
        "records": n, "batch": batch,
        "decode_records_per_s": n / decode_best, "decode_median_records_per_s": n / decode_median,
        "per_record_peer_records_per_s": 1 / peer_per_record, "per_record_peer": peer_how,
        "decode_speedup_vs_peer": (n / decode_best) * peer_per_record,
        "bus_events_per_s": n / bus_best, "bus_median_events_per_s": n / bus_median,
        "copy_peer_events_per_s": n / copy_best, "bus_vs_copy": bus_best / copy_best,
    }
    print(f"decode: {n / decode_best / 1e6:.1f} M records/s (median {n / decode_median / 1e6:.1f}); "
          f"per-record peer ({peer_how}): {1 / peer_per_record / 1e6:.2f} M records/s; "
          f"{result['decode_speedup_vs_peer']:.0f}x")
    print(f"bus ingest (record() + a kind filter): {n / bus_best / 1e6:.1f} M events/s "
          f"(median {n / bus_median / 1e6:.1f}); copying the same batches: {n / copy_best / 1e6:.1f} M/s; "
          f"{bus_best / copy_best:.2f}x the copy's time")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
