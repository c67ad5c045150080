"""A snapshot (``ul.snapshot``) of a million events: its time, its file's size, and what the page holds.

    python3 benchmarks/snapshot.py                         # 1 M events, best of 3
    python3 benchmarks/snapshot.py --events 200000 --max-rows 100000

The events are ``trace_export.py``'s: the simulator's oversubscribed loop, recorded once and tiled to
``--events``, each copy later and with allocation ids of its own. The time is the whole call (best of
``--repeats``, median beside it), from the trace to the file on disk; the size is the file's, of which
the viewer script is a fixed part. The page's own count of rows, levels and what it left out is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trace_export import recorded_loop, tiled

import uvm_lab as ul
from uvm_lab.events.trace import Trace
from uvm_lab.jupyter.snapshot import DEFAULT_MAX_ROWS, VIEWER


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--passes", type=int, default=3, help="loop passes in the recording that is tiled")
    ap.add_argument("--max-rows", type=int, default=DEFAULT_MAX_ROWS)
    args = ap.parse_args()

    trace = Trace(tiled(recorded_loop(args.passes), args.events))
    with tempfile.TemporaryDirectory() as workdir:
        path = os.path.join(workdir, "snapshot.html")
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            ul.snapshot(trace, path, max_rows=args.max_rows)
            times.append(time.perf_counter() - t0)
        size = os.path.getsize(path)
        page = Path(path).read_text(encoding="utf-8")
    data = json.loads(re.search(r'id="uvm-lab-data">(.*?)</script>', page, flags=re.S).group(1))
    bounds = data["bounds"]
    print(f"{len(trace):,} events, max_rows {args.max_rows:,}: best {min(times):.2f} s, "
          f"median {statistics.median(times):.2f} s, file {size / 1e6:.1f} MB "
          f"(viewer {VIEWER.stat().st_size / 1e6:.2f} MB, {(size - VIEWER.stat().st_size) / len(trace):.1f} B/event)")
    print(f"levels {[level['width'] for level in data['levels']]}, rows {bounds['rows']:,} "
          f"({[level['rows'] for level in data['levels']]}), finest {bounds['finest_pixel_ns']:.0f} ns a pixel, "
          f"finer levels left out {bounds['finer_levels_left_out']}, rows truncated {bounds['rows_truncated']}, "
          f"allocations {len(data['allocations'])} (+{bounds['allocations_left_out']} not listed), "
          f"source lines {len(data['by_source'])}")


if __name__ == "__main__":
    main()
