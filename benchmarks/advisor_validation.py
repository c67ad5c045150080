"""Does the advisor's advice pay? Each catalog workload under each policy, advised, then run again with the advice.

For every workload of the catalog and every policy, the run is recorded with its accesses (on the simulator, or
on a GPU with CUPTI on), ``ul.advise`` ranks its changes, and the top one is applied for real: the workload runs
again under its policy with that change made to all of its buffers (the catalog's runs take a policy, a
prefetch strategy and an advice, not per-buffer changes):

============================= ======================================================
top recommendation            applied: the policy, changed
============================= ======================================================
a prefetch before the kernel  its prefetch strategy on (``read_mostly`` becomes
                              ``prefetch+read_mostly``)
ReadMostly dropped            its advice off (``read_mostly`` becomes ``faults``)
kept on the host and mapped   its advice ``remote``
ReadMostly set                its advice ``read_mostly``
only the prefetches that move not applied: no catalog policy makes it
something
============================= ======================================================

The predicted gain is the advisor's (its replay of the change, to the one buffer it names); the measured gain is the
applied run's time against the original run's. Where a workload has several buffers, the applied run changes them
all. On the simulator the rows also run variants the advisor was not tuned on (other sizes, seeds, strides and
device memories).

    python benchmarks/advisor_validation.py --on sim [--size 1GiB] [--json out.json]
    python benchmarks/advisor_validation.py --on gpu --size 256MiB [--json out.json]   # CuPy, CUPTI and a GPU
    python benchmarks/advisor_validation.py --table out.json    # a saved run as benchmarks/README.md's table
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import uvm_lab as ul
from uvm_lab.backends.sim import SimBackend
from uvm_lab.events import EventBus
from uvm_lab.trace_replay import measured
from uvm_lab.workloads import POLICIES, WORKLOADS, make, parse_policy, run_gpu, run_sim

#: The prefetch strategy with each advice: catalog policies too.
COMBINED = ("prefetch+read_mostly", "prefetch+remote")


def applied(rec: ul.advisor.Recommendation, policy: str) -> str | None:
    """``policy`` with the recommendation's change made to every buffer (None: no catalog policy makes it)."""
    prefetching, advice = parse_policy(policy)
    change = rec.change
    if "prefetch" in change:   # a prefetch before the kernel; or only the prefetches that move something (none)
        if "on_access" not in change["prefetch"].values():
            return None
        prefetching = True
    else:
        chosen = next(iter(change["set_advice"].values()))
        advice = "read_mostly" if chosen.get("read_mostly") else \
            "remote" if chosen.get("preferred_location") == "host" else None
    return "+".join(p for p in ("prefetch" if prefetching else "", advice or "") if p) or "faults"


def recorded(workload: Any, policy: str, on: str, device_memory: int, collector: Any) -> tuple[ul.Trace, float]:
    """A run recorded with its accesses, and its time: the span of its records, as the advisor's replays time it
    (the passes, and the buffers' setup before them)."""
    if on == "sim":
        bus = EventBus()
        with ul.record(bus, accesses=True, limit=1 << 24) as trace:
            run_sim(workload, SimBackend(device_memory, bus=bus), policy=policy)
    else:
        with ul.record(accesses=True, limit=1 << 24) as trace:
            run_gpu(workload, policy=policy, backend=ul.get_backend(), collector=collector)
    if trace.missed:
        raise SystemExit(f"the recording missed {trace.missed} records: raise its limit")
    return trace, measured(trace)["seconds"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--on", choices=("sim", "gpu"), default="sim")
    parser.add_argument("--size", default="1GiB")
    parser.add_argument("--device-memory", default="16GiB", help="the simulated GPU's (--on sim)")
    parser.add_argument("--policies", default=",".join(POLICIES + COMBINED),
                        help="comma-separated (default: every policy, and prefetch with each advice)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--table", type=Path, help="print the markdown table of a saved --json run, and stop")
    args = parser.parse_args()
    if args.table:
        print(markdown(json.loads(args.table.read_text())))
        return

    collector = None
    cases: list[tuple[str, dict[str, Any], Any]] = [(name, {"size": args.size}, args.device_memory)
                                                    for name in WORKLOADS]
    if args.on == "gpu":
        from uvm_lab.tracing import CuptiCollector

        backend = ul.use_backend("cuda", watch=False)
        collector = CuptiCollector(gpu_faults=True, required=True).start()
        device_memory = backend.mem_info()[1]
        cases = [(name, params, device_memory) for name, params, _ in cases]
    else:   # variants not tuned on: other sizes, seeds, strides, and a device the data does not fit
        cases += [("random_gather", {"size": "768MiB", "seed": 7}, args.device_memory),
                  ("strided", {"size": "1536MiB", "stride": 192 << 10}, args.device_memory),
                  ("multi_pass_stream", {"size": "3GiB", "passes": 2}, "2GiB"),
                  ("stencil", {"size": "640MiB", "row_bytes": 3 << 20}, "512MiB"),
                  ("host_then_device", {"size": "1GiB", "write_every": 3}, args.device_memory)]
    rows = []
    print(f"{'workload':18} {'params':32} {'policy':20} {'top recommendation':24} {'applied':21} "
          f"{'predicted':>9} {'measured':>9}", flush=True)
    for name, params, device_memory in cases:
        for policy in args.policies.split(","):
            workload = make(name, **params)
            trace, seconds = recorded(workload, policy, args.on, device_memory, collector)
            advice = ul.advise(trace, device_memory=device_memory, top=1)
            row: dict[str, Any] = {"workload": name, "params": params, "device_memory": str(device_memory),
                                   "policy": policy, "seconds": seconds, "exact": advice.baseline.exact}
            if advice:
                top = advice[0]
                policy_after = applied(top, policy)
                row.update(pattern=top.pattern, code=top.code, applied=policy_after, predicted_gain=top.gain,
                           gpu_bytes=measured(trace)["bytes_htod"] + measured(trace)["bytes_dtoh"],
                           replayed_bytes=advice.baseline.bytes_htod + advice.baseline.bytes_dtoh)
                if policy_after is not None:
                    after = recorded(workload, policy_after, args.on, device_memory, collector)[1]
                    row.update(measured_gain=1 - after / seconds, applied_seconds=after)
            rows.append(row)
            shown = ", ".join(f"{k}={v}" for k, v in params.items())
            if "measured_gain" in row:
                print(f"{name:18} {shown:32} {policy:20} {row['pattern']:24} {row['applied']:21} "
                      f"{row['predicted_gain']:9.1%} {row['measured_gain']:9.1%}", flush=True)
            elif "pattern" in row:
                print(f"{name:18} {shown:32} {policy:20} {row['pattern']:24} {'(no policy)':21} "
                      f"{row['predicted_gain']:9.1%}", flush=True)
            else:
                print(f"{name:18} {shown:32} {policy:20} {'(none)':24}", flush=True)
    if collector is not None:
        collector.stop()
    advised = [r for r in rows if "measured_gain" in r]
    worse = [r for r in advised if r["measured_gain"] < 0]
    agree = [r for r in advised if (r["measured_gain"] > 0) == (r["predicted_gain"] > 0)]
    close = [r for r in advised if abs(r["measured_gain"] - r["predicted_gain"]) <= 0.25 * abs(r["predicted_gain"])]
    print(f"\n{len(rows)} runs, {sum('pattern' in r for r in rows)} advised, {len(advised)} applied as a policy: "
          f"{len(worse)} ran slower; the measured gain agreed in sign with the predicted on {len(agree)} and was "
          f"within 25% of it on {len(close)}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2, default=str))


def markdown(rows: list[dict[str, Any]]) -> str:
    """The advised rows as benchmarks/README.md's table, and the runs with no advice in a line."""
    def percent(value: Any) -> str:
        return "-" if value is None else f"{value:.1%}"

    lines = ["| workload | parameters | device | policy | top recommendation | applied as | predicted | measured |"
             " replayed / run's bytes |", "| --- | --- | --- | --- | --- | --- | ---: | ---: | ---: |"]
    quiet = []
    for r in rows:
        params = ", ".join(f"{k}={v}" for k, v in r["params"].items())
        if "pattern" not in r:
            quiet.append(f"{r['workload']} ({params}) {r['policy']}")
            continue
        ratio = r["replayed_bytes"] / r["gpu_bytes"] if r.get("gpu_bytes") else float("nan")
        lines.append(f"| {r['workload']} | {params} | {_size(r['device_memory'])} | {r['policy']} | {r['pattern']} "
                     f"| {r['applied'] or 'no policy makes it'} | {percent(r['predicted_gain'])} "
                     f"| {percent(r.get('measured_gain'))} | {ratio:.3f} |")
    return "\n".join(lines) + f"\n\nNo recommendation (no change saves 1%): {'; '.join(quiet)}."


def _size(value: str) -> str:
    return ul.format_bytes(int(value)) if value.isdigit() else value


if __name__ == "__main__":
    main()
