"""What a slow event subscriber costs the code that makes the events: allocations and ``touch``.

The same loop (alloc+free pairs through a pool, and kernels touching 1 MiB of a 64 MiB managed buffer) runs
with no subscriber (the peer), with one that keeps up, and with two slow ones: one that waits 5 µs for every
record (a writer blocked on I/O: it cannot keep up with a million records a second), and one that computes
for 10 ms in Python on every batch. Reported for
each: every operation's time (p50, p99, max), and the subscriber's waiting and dropped records at the end.

The stated bound: publishing never waits for a subscriber, and no more than a subscriber's ``limit`` of records
(``uvm_lab.events.bus.PENDING_LIMIT``) wait for it, plus the batch being delivered; what arrives past that is
dropped for it and counted. A subscriber that waits costs the loop nothing. One that computes in Python runs
on its own thread, which shares the interpreter with the loop as any Python thread does: each time the loop
gives the interpreter up (a touch does, several times, inside numpy), it may wait one switch interval
(``sys.getswitchinterval()``, 5 ms) to get it back.

    python benchmarks/slow_subscriber.py [--seconds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import uvm_lab as ul
from uvm_lab.events import get_bus
from uvm_lab.events.bus import PENDING_LIMIT

MiB = 1 << 20


def keeps_up(records: np.ndarray) -> None:
    int(records["bytes"].sum())


def waits(records: np.ndarray) -> None:
    time.sleep(5e-6 * len(records))


def computes(records: np.ndarray) -> None:
    end = time.perf_counter() + 0.010
    while time.perf_counter() < end:   # Python bytecode: the interpreter hands the GIL over every switch interval
        pass


SUBSCRIBERS: dict[str, Callable[[np.ndarray], None] | None] = {
    "none (the peer)": None, "keeps up": keeps_up, "waits 5 µs a record": waits, "computes 10 ms a batch": computes,
}


def timed(op: Callable[[], None], seconds: float) -> np.ndarray:
    """Each call's time (µs), calling ``op`` for ``seconds``."""
    out = []
    clock = time.perf_counter
    end = clock() + seconds
    while (now := clock()) < end:
        op()
        out.append(clock() - now)
    return np.array(out) * 1e6


def run(name: str, callback: Callable[[np.ndarray], None] | None, seconds: float) -> dict[str, Any]:
    bus = get_bus()
    pool = ul.mr.PoolMemoryResource(ul.mr.ManagedMemoryResource(), initial_pool_size="64MiB")
    buf = ul.DeviceBuffer(size=64 * MiB)
    rng = np.random.default_rng(0)
    offsets = (rng.integers(63, size=1 << 20) << 20).tolist()
    state = {"i": 0}

    def pair() -> None:
        pool.deallocate(pool.allocate(4096), 4096)

    def touch() -> None:
        state["i"] += 1
        ul.touch(buf, on="gpu" if state["i"] % 2 else "host", mode="read", offset=offsets[state["i"] % len(offsets)],
                 size=MiB)

    bus.flush()
    sub = bus.subscribe(callback, name=name) if callback is not None else None
    try:
        pairs = timed(pair, seconds)
        touches = timed(touch, seconds)
        waiting, dropped = (sub.waiting, sub.dropped) if sub else (0, 0)
    finally:
        if sub is not None:
            sub.close(deliver=False)   # what waits is not wanted
        buf.close()
        pool.release()
    row = {"subscriber": name, "waiting": waiting, "dropped": dropped}
    for what, t in (("pair", pairs), ("touch", touches)):
        row.update({f"{what}_ops": len(t), f"{what}_p50_us": float(np.percentile(t, 50)),
                    f"{what}_p99_us": float(np.percentile(t, 99)), f"{what}_max_us": float(t.max())})
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="per loop and subscriber")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    ul.use_backend("sim", device_memory="8GiB")
    print(f"switch interval {sys.getswitchinterval() * 1e3:.0f} ms; {args.seconds:g} s per loop; at most "
          f"{PENDING_LIMIT:,} records wait for a subscriber\n")
    rows = [run(name, callback, args.seconds) for name, callback in SUBSCRIBERS.items()]
    peer = rows[0]
    print(f"{'subscriber':24} {'pairs/s':>9} {'pair p50':>9} {'p99':>7} {'max':>8} {'touch/s':>8} {'p50':>7} "
          f"{'p99':>7} {'max':>8} {'waiting':>8} {'dropped':>10}")
    for r in rows:
        seconds = args.seconds
        print(f"{r['subscriber']:24} {r['pair_ops'] / seconds:9,.0f} {r['pair_p50_us']:9.1f} {r['pair_p99_us']:7.1f} "
              f"{r['pair_max_us']:8.0f} {r['touch_ops'] / seconds:8,.0f} {r['touch_p50_us']:7.0f} "
              f"{r['touch_p99_us']:7.0f} {r['touch_max_us']:8.0f} {r['waiting']:8,} {r['dropped']:10,}")
    ratios = [f"{r['subscriber']} pairs {r['pair_ops'] / peer['pair_ops']:.2f}x, touches "
              f"{r['touch_ops'] / peer['touch_ops']:.2f}x" for r in rows[1:]]
    print("\ntimes in µs; operations a second against the peer's: " + "; ".join(ratios))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
