"""Fit a platform profile's costs to a GPU's measured times (``sim_vs_gpu.py`` runs), and say how well it predicts.

    python benchmarks/sim_calibrate.py RUN.json [RUN.json ...]               # fit x86-pcie5's costs to the runs
    python benchmarks/sim_calibrate.py RUN.json ... --holdout workload       # and predict each workload unseen
    python benchmarks/sim_calibrate.py RUN.json ... --profile h100.json      # and write the fitted profile
    python benchmarks/sim_calibrate.py --measure out/ --profile h100.json    # on a GPU: time, fit, write, check
    python benchmarks/sim_calibrate.py RUN.json ... --check x86-pcie5 h100.json  # each profile on each run, no fit

A simulated pass's time is linear in the profile's latencies and inverse bandwidths, for a given trace (the
costs move the clock, not what happens; thrashing, which watches the clock, does not arise in these runs).
So each constant's weight in each row is measured once, by running the simulator with the constant
nudged, and the constants that best predict the real times are a bounded linear least-squares fit on
relative error. The fit is checked by simulating again with the fitted profile.

Rows: every timed pass of every case in the runs (repeats of a case are averaged), except cases measured in
an earlier run (``earlier_run``) and passes under 0.2 ms (a launch and a synchronization). ``--holdout workload`` refits
without each workload in turn and reports that workload's rows as predicted by constants fitted on the
others: the honest figure for a workload the profile has never seen.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
from sim_vs_gpu import TIME_TOL, _label, _workload

from uvm_lab import workloads as W
from uvm_lab.backends.sim.platform import Platform, get_platform
from uvm_lab.units import BLOCK_SIZE

#: The costs fitted, and what each is fitted as: a latency (seconds) or a bandwidth (fitted as its inverse). The
#: fault paths' costs only: bandwidths measured directly (prefetch, remote reads, GPU memory) stay as measured,
#: and the remote round trip and the ReadMostly GPU-write cost have no rows here that are not at the timer's
#: floor or from an earlier run. A GPU write fault's own cost is set from a later lease's paired write and read
#: sweeps, which these runs do not have.
FITTED = {
    "fault_batch_latency": "latency", "fault_block_latency": "latency", "fault_latency": "latency",
    "fault_page_latency": "latency", "fault_unmap_latency": "latency", "fault_unmap_run_latency": "latency",
    "fault_chunk_latency": "latency",
    "fault_htod_bw": "bandwidth", "cpu_fault_latency": "latency", "fault_dtoh_bw": "bandwidth",
    "host_access_latency": "latency", "host_write_latency": "latency", "read_mostly_host_write_latency": "latency",
    "read_mostly_protect_latency": "latency", "read_mostly_protect_run_latency": "latency",
    "prefetch_block_latency": "latency",
}
#: Passes shorter than this are at the floor of a timed pass on the GPU (a launch and a synchronization from
#: Python: the 128 reads of a remote strided pass at an 8 MiB stride took 0.10 ms). The simulator charges that
#: floor (``Platform.kernel_launch_latency``, set from those passes), but they say little about the fault path's
#: costs and much about the timer's noise: they are reported, not fitted.
MIN_SECONDS = 2e-4
NUDGE = 0.25


def load_rows(paths: list[str]) -> tuple[list[dict], dict]:
    """The cases of the runs, each pass's real time averaged over the runs that have it."""
    cases: dict[tuple, dict] = {}
    times: dict[tuple, list] = defaultdict(list)
    info = {}
    for path in paths:
        run = json.loads(Path(path).read_text())
        info = {"device": run["device"], "free": run["free"]}
        for case in run["cases"]:
            if case.get("earlier_run"):
                continue
            params = dict(sorted((case.get("params") or {}).items()))
            size = int(params.pop("size", run["size"]))
            key = (case["workload"], json.dumps(params), case["policy"], size)
            cases[key] = {"workload": case["workload"], "params": params, "policy": case["policy"], "size": size}
            times[key].append([t["seconds"] for t in case["time"]])
    for key, case in cases.items():
        case["real"] = np.mean(np.array(times[key]), axis=0)
        case["runs"] = len(times[key])
    return list(cases.values()), info


def simulate(cases: list[dict], platform: Platform, device_memory: int) -> np.ndarray:
    """Simulated seconds of every pass of every case, in order."""
    out = []
    for case in cases:
        w = _workload(case, case["size"])
        out += [r.seconds for r in W.run_sim(w, policy=case["policy"], device_memory=device_memory,
                                             platform=platform)]
    return np.array(out)


def _cost(platform: Platform, name: str) -> float:
    value = getattr(platform, name)
    return value if FITTED[name] == "latency" else 1.0 / value


def _with_costs(platform: Platform, costs: dict[str, float]) -> Platform:
    return platform.with_(**{n: c if FITTED[n] == "latency" else 1.0 / c for n, c in costs.items()})


def weights(cases: list[dict], platform: Platform, device_memory: int) -> tuple[np.ndarray, np.ndarray]:
    """``(base, X)``: simulated seconds, and each cost's seconds per unit of cost in each row."""
    base = simulate(cases, platform, device_memory)
    cols = []
    for name in FITTED:
        c = _cost(platform, name)
        step = c * NUDGE if c > 0 else 1e-6    # a cost the profile leaves at zero is nudged from zero
        nudged = simulate(cases, _with_costs(platform, {name: c + step}), device_memory)
        cols.append((nudged - base) / step)
        print(f"  weights of {name}", flush=True)
    return base, np.stack(cols, axis=1)


def fit(base: np.ndarray, X: np.ndarray, real: np.ndarray, costs: np.ndarray, rows: np.ndarray,
        floor: np.ndarray) -> np.ndarray:
    """Costs minimising the relative error over ``rows``, each at least ``floor`` (and a tenth of a nonzero start)."""
    from scipy.optimize import lsq_linear

    fixed = base - X @ costs                  # what no fitted cost moves
    A = X[rows] / real[rows, None]
    b = 1.0 - fixed[rows] / real[rows]
    scale = np.where(costs > 0, costs, 1e-6)  # fit in units of the starting costs: a well-conditioned problem
    lower = np.maximum(np.maximum(floor, 0.1 * costs), 1e-15) / scale   # a profile's costs are positive
    used = np.abs(A).sum(axis=0) > 0
    out = costs.copy()
    res = lsq_linear(A[:, used] * scale[used], b, bounds=(lower[used], np.inf))
    out[used] = res.x * scale[used]
    return out


#: The variants ``--measure`` times beside the catalog, to check the fit on what it never saw: other sizes,
#: strides, rows and tile counts, under the faults policy (a ReadMostly GPU write costs a minute a pass).
VARIANTS = ("sequential_stream:size=256MiB,sequential_stream:size=2GiB,strided:stride=16KiB,strided:stride=256KiB,"
            "stencil:row_bytes=256KiB,stencil:row_bytes=4MiB,tiled_matmul:tiles=2,tiled_matmul:tiles=8,"
            "host_then_device:size=512MiB,random_gather:count=65536")


def measure(folder: Path, size: str, repeats: int) -> tuple[list[str], Path]:
    """Time the catalog (every policy but the two ReadMostly GPU-write cases) and :data:`VARIANTS` on this GPU, as
    ``sim_vs_gpu.py`` does; the runs' paths."""
    from sim_vs_gpu import parse_cases, run_gpu_side

    from uvm_lab.units import parse_size

    folder.mkdir(parents=True, exist_ok=True)
    catalog, variants = folder / "catalog.json", folder / "variants.json"
    print("timing the catalog on this GPU ...", flush=True)
    catalog.write_text(json.dumps(run_gpu_side(parse_size(size), {"stencil:read_mostly", "tiled_matmul:read_mostly"},
                                               None, None, W.POLICIES, repeats), indent=1))
    print("timing the variants ...", flush=True)
    variants.write_text(json.dumps(run_gpu_side(parse_size(size), set(), None, parse_cases(VARIANTS), ("faults",),
                                                repeats), indent=1))
    return [str(catalog)], variants


def check_profiles(runs: list[str], profiles: list[str]) -> None:
    """Print, for each run and each profile, the timed passes the profile predicts within ``TIME_TOL``."""
    for run in runs:
        cases, info = load_rows([run])
        real = np.concatenate([c["real"] for c in cases])
        timed = real >= MIN_SECONDS
        device = max(BLOCK_SIZE, int(info["free"]) // BLOCK_SIZE * BLOCK_SIZE)
        for name in profiles:
            sim = simulate(cases, get_platform(name), device)
            agree = int((np.abs(sim[timed] / real[timed] - 1) <= TIME_TOL).sum())
            print(f"{Path(run).name:40} {Path(name).name:32} within {TIME_TOL:.0%}: {agree}/{int(timed.sum())}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="*", help="sim_vs_gpu.py --json files (the catalog and variants)")
    ap.add_argument("--measure", default=None, metavar="DIR",
                    help="first time the catalog here (this GPU, CuPy and CUPTI; sim_vs_gpu.py's run, in rounds) and "
                         "the variants of VARIANTS, keeping both runs in DIR; fit to the catalog only, and report "
                         "the fitted profile's time on the variants, which the fit never saw")
    ap.add_argument("--size", default="1GiB", help="--measure's bytes per buffer")
    ap.add_argument("--repeats", type=int, default=3, help="--measure's timed runs per case")
    ap.add_argument("--platform", default="x86-pcie5")
    ap.add_argument("--holdout", choices=["workload"], default=None)
    ap.add_argument("--link-max", type=float, default=55.3e9,
                    help="no link bandwidth is fitted above this (bytes/s; x86-pcie5: pinned copies, 55.3 GB/s)")
    ap.add_argument("--memory-max", type=float, default=4.8e12, help="nor GPU memory above this (H200: 4.8 TB/s)")
    ap.add_argument("--json", default=None, help="write the fitted costs and every row here")
    ap.add_argument("--weights", default=None, help="keep the measured weights here (.npz) and reuse them")
    ap.add_argument("--profile", default=None, metavar="PATH.json",
                    help="write the fitted profile here, for use_backend('sim', platform=PATH.json) anywhere")
    ap.add_argument("--name", default=None, help="the written profile's name (default: the GPU's, from the runs)")
    ap.add_argument("--check", nargs="+", default=None, metavar="PROFILE",
                    help="fit nothing: say how many timed passes of each run each profile (a name or a .json file) "
                         "predicts within 25%%")
    args = ap.parse_args()
    if args.check:
        if not args.runs:
            ap.error("--check needs sim_vs_gpu.py runs")
        check_profiles(args.runs, args.check)
        return
    variants = None
    if args.measure:
        args.runs, variants = measure(Path(args.measure), args.size, args.repeats)
    if not args.runs:
        ap.error("give sim_vs_gpu.py runs, or --measure DIR to time them here")
    cases, info = load_rows(args.runs)
    platform = get_platform(args.platform)
    device = max(BLOCK_SIZE, int(info["free"]) // BLOCK_SIZE * BLOCK_SIZE)
    real = np.concatenate([c["real"] for c in cases])
    labels = [(_label(c) + (f" size={c['size'] >> 20}MiB" if c["size"] != 1 << 30 else ""), c["policy"], i)
              for c in cases for i in range(len(c["real"]))]
    rows = real >= MIN_SECONDS
    names = list(FITTED)
    costs = np.array([_cost(platform, n) for n in names])
    fastest = {n: args.memory_max if n == "gpu_memory_bw" else args.link_max for n in names}
    floor = np.array([0.0 if FITTED[n] == "latency" else 1 / fastest[n] for n in names])
    cache = Path(args.weights) if args.weights else None
    if cache is not None and cache.exists():
        saved = np.load(cache)
        base, X = saved["base"], saved["X"]
    else:
        print(f"{len(cases)} cases, {int(rows.sum())} rows; measuring each cost's weight ...", flush=True)
        base, X = weights(cases, platform, device)
        if cache is not None:
            np.savez(cache, base=base, X=X)
    fitted = fit(base, X, real, costs, rows, floor)
    tuned = _with_costs(platform, dict(zip(names, fitted, strict=True)))
    check = simulate(cases, tuned, device)
    print(f"\n{'cost':26} {'profile':>12} {'fitted':>12}")
    for n, before in zip(names, costs, strict=True):
        unit = FITTED[n]
        show = (lambda c: f"{c * 1e6:10.3f} us") if unit == "latency" else (lambda c: f"{1 / c / 1e9:9.1f} GB/s")
        print(f"{n:26} {show(before):>12} {show(dict(zip(names, fitted, strict=True))[n]):>12}")
    within = lambda sim: int((np.abs(sim[rows] / real[rows] - 1) <= TIME_TOL).sum())  # noqa: E731
    n_rows = int(rows.sum())
    n_rows = int(rows.sum())
    print(f"\nwithin {TIME_TOL:.0%}: profile {within(base)}/{n_rows}, fitted {within(check)}/{n_rows}")
    held = None
    if args.holdout:
        held = np.full(len(real), np.nan)
        group = np.array([lab[0].split()[0] for lab in labels])
        for name in dict.fromkeys(group):
            train = rows & (group != name)
            other = _with_costs(platform, dict(zip(names, fit(base, X, real, costs, train, floor), strict=True)))
            sel = [c for c in cases if c["workload"] == name]
            held[group == name] = simulate(sel, other, device)
            print(f"  held out {name}", flush=True)
        print(f"held out, each workload predicted from the others: within {TIME_TOL:.0%} "
              f"{within(held)}/{n_rows}")
    print(f"\n{'case':40} {'policy':12} {'pass':>4} {'real ms':>9} {'profile':>8} {'fitted':>8}"
          + (f" {'held out':>8}" if held is not None else ""))
    for i, (label, policy, p) in enumerate(labels):
        line = f"{label:40} {policy:12} {p:>4} {real[i] * 1e3:9.2f} {base[i] / real[i]:8.2f} {check[i] / real[i]:8.2f}"
        print(line + (f" {held[i] / real[i]:8.2f}" if held is not None else "") + ("" if rows[i] else "  (not fitted)"))
    if variants is not None:   # the variants the fit never saw: the profile it started from, and the fitted one
        unseen, _ = load_rows([str(variants)])
        truth = np.concatenate([c["real"] for c in unseen])
        timed = truth >= MIN_SECONDS
        for label, profile in ((args.platform, platform), ("fitted", tuned)):
            sim = simulate(unseen, profile, device)
            agree = int((np.abs(sim[timed] / truth[timed] - 1) <= TIME_TOL).sum())
            print(f"variants the fit never saw, {label}: within {TIME_TOL:.0%} on {agree}/{int(timed.sum())} passes")
    if args.profile:
        name = args.name or f"{info['device']}-fitted".lower().replace(" ", "-")
        runs = ", ".join(Path(r).name for r in args.runs)
        described = (f"{tuned.description.split(' (')[0]}: fault-path costs fitted to {n_rows} timed passes on "
                     f"{info['device']} (benchmarks/sim_calibrate.py over {runs})")
        path = replace(tuned, name=name, description=described, calibrated=True).save(args.profile)
        print(f"\nprofile {name!r} written to {path}: use_backend('sim', platform={str(path)!r})")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "device": info["device"], "platform": args.platform,
            "costs": {n: {"profile": getattr(platform, n), "fitted": getattr(tuned, n)} for n in names},
            "rows": [{"case": lab[0], "policy": lab[1], "pass": lab[2], "real": float(real[i]),
                      "profile": float(base[i]), "fitted": float(check[i]),
                      "held_out": None if held is None else float(held[i]),
                      "fitted_row": bool(rows[i])} for i, lab in enumerate(labels)],
        }, indent=1))


if __name__ == "__main__":
    main()
