"""uvm_lab.dask at scale: what the client sees of many busy workers, and what the plugin costs each worker.

``scale``: ``--workers`` worker processes of a ``distributed.LocalCluster``, each on a simulated GPU with the
:class:`~uvm_lab.dask.UvmLab` plugin, publish events at ``--rate`` in total for ``--seconds``. The events are
the simulator's own, recorded by each worker from a loop of touches first and then published again in batches
on its bus at a steady pace, as CUPTI's collector publishes a GPU's (the simulator alone makes fewer a second
than a driver reports). The buffer they name is freed before they are published again, so that the residency
tracker passes over them: its cost on events out of their order is not the plugin's, and is not measured here.
The client's :class:`~uvm_lab.dask.ClusterMonitor` counts what reaches it. Reported:
events a second made and counted at the client; each delta's latency, from the first event it counts reaching
its worker's reporter to the delta reaching the client (wall clocks of one machine); the deltas' bytes a second
(``payload``), and with the message around each (``wire``: the msgpack of ``{"worker", "delta"}`` plus the
scheduler's envelope, 40 bytes, which is what crosses the two connections).

``cost``: ``--workers`` workers run a task loop that allocates a 16 MiB managed buffer, touches it on the GPU and
on the host, and frees it, ``--iterations`` times, with the plugin registered and without it, in ``--pairs``
pairs whose order alternates. Reported: the median over pairs of the loop's seconds with the plugin against
without, per worker and overall (the issue's bound: at most 1.05), and the same of the CPU seconds the worker's
process took over the loop (all its threads: steadier where cores are shared).

    python benchmarks/dask_scale.py scale --workers 8 --rate 1000000 --seconds 10 --json out.json
    python benchmarks/dask_scale.py cost --workers 8 --pairs 20 --iterations 200 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import msgpack
from distributed import Client, LocalCluster

from uvm_lab.dask import ClusterMonitor, UvmLab, wire

#: The scheduler's envelope around a topic's message to a client, in bytes: ``{"op": "event", "topic": ...,
#: "event": [timestamp, msg]}`` packed, less the message itself.
ENVELOPE = len(msgpack.packb({"op": "event", "topic": "uvm_lab", "event": [time.time(), None]})) - 1


def publish_load(rate: float, seconds: float, batch: int) -> dict[str, float]:
    """A task: record the simulator's events from a loop of touches, then publish them again at ``rate`` a second
    for ``seconds``, ``batch`` records at a time. Returns what it published and in how long."""
    import uvm_lab as ul
    from uvm_lab.events import get_bus

    bus = get_bus()
    buf = ul.DeviceBuffer(size="16MiB", label="load")
    recorded: list[np.ndarray] = []
    subscription = bus.subscribe(recorded.append, name="benchmark recorder")
    while sum(len(r) for r in recorded) < 20 * batch:
        ul.touch(buf, on="gpu")
        ul.touch(buf, on="host")
        bus.flush()
    subscription.close()
    buf.close()   # the records now name freed memory: the residency tracker passes over them (see the docstring)
    records = np.concatenate(recorded)
    published, start = 0, time.perf_counter()
    due = start
    while (now := time.perf_counter()) - start < seconds:
        if now < due:
            time.sleep(due - now)
        first = (published // batch * batch) % (len(records) - batch)
        bus.publish(records[first:first + batch].copy())
        published += batch
        due += batch / rate
    return {"published": published, "recorded": len(records), "seconds": time.perf_counter() - start}


def task_loop(iterations: int) -> tuple[float, float]:
    """A task: allocate, touch on the GPU and the host, free, ``iterations`` times; its seconds, and the CPU seconds
    the worker's process took meanwhile (every thread: the reporter's and the worker's own)."""
    import uvm_lab as ul

    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(iterations):
        buf = ul.DeviceBuffer(size="16MiB")
        ul.touch(buf, on="gpu")
        ul.touch(buf, on="host")
        buf.close()
    return time.perf_counter() - start, time.process_time() - cpu


def cluster(workers: int) -> tuple[LocalCluster, Client]:
    local = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=":0",
                         worker_dashboard_address=":0")
    return local, Client(local)


def warm(client: Client) -> None:
    """Compile or load the simulator's core on every worker before anything is timed."""
    def prepare() -> None:
        import uvm_lab as ul

        ul.use_backend("sim", device_memory="4GiB")
        ul.backends.sim.prepare()
    client.run(prepare)


def scale(args: argparse.Namespace) -> dict[str, Any]:
    local, client = cluster(args.workers)
    try:
        warm(client)
        monitor = ClusterMonitor(client)
        client.register_plugin(UvmLab(backend="sim", device_memory="4GiB", interval=args.interval))
        deadline = time.monotonic() + 60
        while len([w for w in monitor.workers().values() if w.last is not None]) < args.workers:
            if time.monotonic() > deadline:
                raise SystemExit("not every worker reported within 60 s")
            time.sleep(0.05)
        per_worker = args.rate / args.workers
        start_ms = time.time() * 1000
        futures = [client.submit(publish_load, per_worker, args.seconds, args.batch, workers=[w], pure=False)
                   for w in monitor.workers()]
        made = client.gather(futures)
        time.sleep(4 * args.interval + 0.5)   # the last deltas
        end_ms = time.time() * 1000
        deltas = [(arrived, delta, address) for address, lanes in monitor.workers().items()
                  for arrived, delta in lanes.history if arrived >= start_ms]
        latencies = [arrived - float(d.header["oldest_ms"]) for arrived, d, _ in deltas if d.header["oldest_ms"]]
        # What the recording loops made (and the buffers' frees) is counted too: the loops' records are known.
        counted = sum(int(d.header["events"]) for _, d, _ in deltas)
        sizes = [(wire.HEADER.itemsize + len(d.rows) * wire.ROW.itemsize, a) for _, d, a in deltas]
        payload = sum(n for n, _ in sizes)
        # The message as the worker logs it, with a payload of the delta's length (msgpack frames bytes by length).
        framing = sum(len(msgpack.packb({"worker": a, "delta": bytes(n)})) + ENVELOPE for n, a in sizes)
        window = (end_ms - start_ms) / 1000
        published = sum(m["published"] for m in made)
        recorded = sum(m["recorded"] for m in made)
        busy = max(m["seconds"] for m in made)
        return {
            "mode": "scale", "workers": args.workers, "interval_s": args.interval, "rate_asked": args.rate,
            "batch": args.batch, "seconds": args.seconds,
            "events_published": published, "events_per_s_made": published / busy,
            "events_recorded": recorded, "events_counted": counted,
            "counted_of_made": counted / (published + recorded) if published else None,
            "deltas": len(deltas), "deltas_lost": sum(w.lost for w in monitor.workers().values()),
            "latency_ms": _spread(latencies),
            "payload_bytes_per_s": payload / window, "wire_bytes_per_s": framing / window,
            "window_s": window, "cpus": os.cpu_count(),
        }
    finally:
        client.close()
        local.close()


def _spread(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    ordered = np.sort(values)
    return {"p50": float(np.percentile(ordered, 50)), "p99": float(np.percentile(ordered, 99)),
            "max": float(ordered[-1]), "n": len(values)}


def cost(args: argparse.Namespace) -> dict[str, Any]:
    local, client = cluster(args.workers)
    try:
        warm(client)
        monitor = ClusterMonitor(client)
        workers = sorted(client.scheduler_info()["workers"])
        plugin = UvmLab(backend="sim", device_memory="4GiB", interval=args.interval)

        def run() -> dict[str, tuple[float, float]]:
            futures = {w: client.submit(task_loop, args.iterations, workers=[w], pure=False) for w in workers}
            return {w: f.result() for w, f in futures.items()}

        run()   # warm the loop itself
        pairs = []
        for pair in range(args.pairs):
            order = ("with", "without") if pair % 2 == 0 else ("without", "with")
            timed: dict[str, dict[str, tuple[float, float]]] = {}
            for mode in order:
                if mode == "with":
                    client.register_plugin(plugin)
                timed[mode] = run()
                if mode == "with":
                    client.unregister_worker_plugin(UvmLab.name)
            pairs.append({w: timed["with"][w][0] / timed["without"][w][0] for w in workers} | {
                f"cpu {w}": timed["with"][w][1] / timed["without"][w][1] for w in workers} | {
                "with_s": statistics.mean(t for t, _ in timed["with"].values()),
                "without_s": statistics.mean(t for t, _ in timed["without"].values())})
        ratios = [p[w] for p in pairs for w in workers]
        cpu_ratios = [p[f"cpu {w}"] for p in pairs for w in workers]
        return {
            "mode": "cost", "workers": args.workers, "iterations": args.iterations, "pairs": args.pairs,
            "interval_s": args.interval,
            "ratio_median": statistics.median(ratios),
            "ratio_quartiles": [float(np.percentile(ratios, 25)), float(np.percentile(ratios, 75))],
            "per_worker_median": {w: statistics.median(p[w] for p in pairs) for w in workers},
            "cpu_ratio_median": statistics.median(cpu_ratios),
            "cpu_ratio_quartiles": [float(np.percentile(cpu_ratios, 25)), float(np.percentile(cpu_ratios, 75))],
            "loop_s_without": statistics.median(p["without_s"] for p in pairs),
            "loop_s_with": statistics.median(p["with_s"] for p in pairs),
            "deltas_seen": monitor.messages, "cpus": os.cpu_count(),
        }
    finally:
        client.close()
        local.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("scale", "cost"))
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--rate", type=float, default=1_000_000, help="events a second, all workers together")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--batch", type=int, default=1000, help="records a publish")
    parser.add_argument("--interval", type=float, default=0.25, help="the plugin's seconds between deltas")
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    result = scale(args) if args.mode == "scale" else cost(args)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
