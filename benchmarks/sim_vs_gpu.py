"""The simulator against the real GPU: every workload under every policy, at a size that fits.

    python benchmarks/sim_vs_gpu.py --size 1GiB --json out/sim_vs_gpu.json --markdown out/sim_vs_gpu.md
    python benchmarks/sim_vs_gpu.py --from-json out/sim_vs_gpu.json --readme benchmarks/README.md
    python benchmarks/sim_vs_gpu.py --skip stencil:read_mostly --previous benchmarks/sim_vs_gpu_h200.json ...
    python benchmarks/sim_vs_gpu.py --cases "strided:stride=16KiB,host_then_device:size=2GiB" \
        --policies faults,read_mostly --marker sim_vs_gpu_variants --json out/variants.json

The first form needs CuPy, cuda-python and a GPU (cupti-python for bytes). Each workload of the catalog
(buffers of ``--size`` each) runs under each policy of ``uvm_lab.workloads.POLICIES`` on GPU 0: ``--repeats``
times untraced for time (the table shows the median and the spread; a fault-bound pass varies by a third
from run to run), then once under CUPTI's unified-memory counters for the bytes migrated each way; then the
same description runs on the simulator (``x86-pcie5``, device memory = the card's free memory, so neither
side is oversubscribed). Buffers never exceed the card's free memory (checked with cudaMemGetInfo).

Where CUPTI reports dropped records or saturated drains, or the bytes it reports do not add up to the pages
the host gained or lost (``/proc/self/pagemap``), the row is marked rather than hidden. The second form
rebuilds the table from a saved run (the simulator side is recomputed) and writes it into the README
between the markers.

``--cases`` runs variants of the catalog's workloads instead (``name:param=value:...``, sizes as ``64KiB``),
under ``--policies``: parameters no constant was calibrated from, so their rows are an independent check.

Targets (issue 5): bytes within 5 %, time within 25 %.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from uvm_lab import workloads as W
from uvm_lab.units import BLOCK_SIZE, format_bytes, parse_size

BYTES_TOL, TIME_TOL = 0.05, 0.25


def _rows(results: list) -> list[dict]:
    return [{"phase": r.phase, "pass": r.pass_index, "seconds": r.seconds, "htod": r.bytes_htod, "dtoh": r.bytes_dtoh}
            for r in results]


def median_rows(runs: list[list[dict]]) -> list[dict]:
    """Each pass's row with the median of its seconds over ``runs`` (lists of the same passes)."""
    return [{**rows[0], "seconds": float(statistics.median(r["seconds"] for r in rows))}
            for rows in zip(*runs, strict=True)]


def _spread(case: dict, i: int) -> str:
    """``min-max`` ms of pass ``i`` over the case's timed runs ('-' for a single run)."""
    runs = case.get("runs") or []
    if len(runs) < 2:
        return "-"
    secs = [r[i]["seconds"] * 1e3 for r in runs]
    return f"{min(secs):,.1f}-{max(secs):,.1f}"


def parse_cases(spec: str) -> list[tuple[str, dict]]:
    """``"strided:stride=16KiB,host_then_device:size=2GiB"`` as ``[(name, params), ...]``."""
    out = []
    for item in filter(None, (c.strip() for c in spec.split(","))):
        name, *pairs = item.split(":")
        if name not in W.WORKLOADS:
            raise SystemExit(f"unknown workload {name!r}: one of {', '.join(W.WORKLOADS)}")
        params = {}
        for pair in pairs:
            key, _, value = pair.partition("=")
            params[key] = parse_size(value) if value[-1:].upper() == "B" else int(value)
        out.append((name, params))
    return out


def _label(case: dict) -> str:
    params = case.get("params") or {}
    return case["workload"] + "".join(f" {k}={format_bytes(v) if k in ('size', 'stride', 'row_bytes', 'offset') else v}"
                                      for k, v in params.items())


def _workload(case: dict, size: int) -> W.Workload:
    return W.make(case["workload"], **{"size": size, **(case.get("params") or {})})


def run_gpu_side(size: int, skip: set[str] = frozenset(), previous: dict | None = None,
                 cases: list[tuple[str, dict]] | None = None, policies: tuple[str, ...] = W.POLICIES,
                 repeats: int = 3) -> dict:
    """Real time (untraced, the median of ``repeats`` runs) and real bytes (CUPTI) for every workload x policy.

    The timed runs go in rounds, every case once a round, so that a drift of the machine spreads over all
    cases instead of landing on some. Cases named in ``skip`` (``"workload:policy"``) are not run; their
    figures come from ``previous`` (an earlier run's JSON at the same size), marked as such, or with no
    ``previous`` are left out. ``cases``
    replaces the catalog with variants (name and parameters); a ``size`` parameter replaces ``size`` for
    that case.
    """
    import cupy

    from uvm_lab.tracing import CuptiCollector, host_resident
    from uvm_lab.workloads.gpu import _cuda_backend

    backend = _cuda_backend(0)
    free, total = backend.mem_info(0)
    props = cupy.cuda.runtime.getDeviceProperties(0)
    out = {"device": props["name"].decode(), "free": free, "total": total, "size": size, "cases": []}
    todo = [{"workload": name, "params": params, "policy": policy}
            for name, params in (cases or [(name, {}) for name in W.WORKLOADS]) for policy in policies]
    earlier = {(c["workload"], c["policy"]): c for c in (previous or {}).get("cases", [])}
    if previous is not None and previous["size"] != size:
        raise SystemExit(f"--previous ran at {format_bytes(previous['size'])}, not {format_bytes(size)}")
    run = []
    for case in todo:
        name, policy = case["workload"], case["policy"]
        if f"{name}:{policy}" in skip:
            if previous is None:   # left out, with nothing in its place
                continue
            if (name, policy) not in earlier:
                raise SystemExit(f"{name}:{policy} is skipped but --previous does not have it")
            out["cases"].append({**earlier[(name, policy)], "earlier_run": True})
            continue
        w = _workload(case, size)
        if w.total_bytes > free // 2:
            raise SystemExit(f"{_label(case)} needs {format_bytes(w.total_bytes)}, over half the card's "
                             f"{format_bytes(free)} free: use a smaller --size")
        case = {**case, "runs": [], "wall": 0.0}
        out["cases"].append(case)
        run.append(case)
    for _ in range(repeats):
        for case in run:
            t0 = time.perf_counter()
            timed = W.run_gpu(_workload(case, size), policy=case["policy"], backend=backend)
            case["wall"] += time.perf_counter() - t0
            case["runs"].append(_rows(timed))
            print(f"gpu {_label(case):32} {case['policy']:12} "
                  + " ".join(f"{r.seconds * 1e3:8.2f}" for r in timed) + " ms", flush=True)
    for case in run:
        case["time"] = median_rows(case["runs"])
    collector = CuptiCollector(bus=backend.bus, counters=["htod", "dtoh"])
    collector.start()
    out["cupti"] = collector.reason or collector.receiver
    try:
        for case in out["cases"]:
            if case.get("earlier_run"):
                continue
            w = _workload(case, size)
            before = collector.status()
            # Host pages present at free time, against all of them after the host wrote the buffers:
            # the difference is what left the host, net, which CUPTI's HtoD minus DtoH must equal.
            real_alloc, real_free = backend.allocate, backend.free
            seen: dict[int, int] = {}
            present: dict[int, int] = {}

            def allocate(n, kind, _alloc=real_alloc, _seen=seen, **kw):
                ptr = _alloc(n, kind, **kw)
                _seen[ptr] = n
                return ptr

            def free(ptr, _free=real_free, _seen=seen, _present=present, **kw):
                _present[ptr] = int(host_resident(ptr, _seen[ptr]).sum())
                _free(ptr, **kw)

            backend.allocate, backend.free = allocate, free
            try:
                traced = W.run_gpu(w, policy=case["policy"], backend=backend, collector=collector)
            finally:
                backend.allocate, backend.free = real_alloc, real_free
            host_loss = sum(n // 4096 - present.get(p, n // 4096) for p, n in seen.items()) * 4096
            case["bytes"] = _rows(traced)
            after = collector.status()
            case["dropped"] = after["dropped"] - before["dropped"]
            # Drains that brought a whole CUPTI queue (records likely lost), where the collector counts them.
            case["saturated"] = after.get("saturated", 0) - before.get("saturated", 0)
            case["host_pages_lost_bytes"] = host_loss
            print(f"cupti {_label(case):32} {case['policy']:12} "
                  + " ".join(f"{r.bytes_htod}/{r.bytes_dtoh}" for r in traced), flush=True)
    finally:
        collector.stop()
        out["cupti_status"] = collector.status()
    return out


def sim_device_memory(real: dict) -> int:
    """The simulated GPU's memory for a saved run: the card's free memory, in whole 2 MiB chunks."""
    return max(BLOCK_SIZE, int(real["free"]) // BLOCK_SIZE * BLOCK_SIZE)


def run_sim_side(real: dict) -> None:
    """The simulator's time and bytes for every case of ``real``, beside the real ones."""
    device = sim_device_memory(real)
    for case in real["cases"]:
        w = _workload(case, real["size"])
        t0 = time.perf_counter()
        case["sim"] = _rows(W.run_sim(w, policy=case["policy"], device_memory=device, platform="x86-pcie5"))
        case["sim_wall"] = time.perf_counter() - t0


def _ratio(sim: float, real: float) -> float | None:
    return sim / real if real else (1.0 if not sim else None)


def _fmt_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    return "0" if n == 0 else f"{n / (1 << 20):,.0f} MiB" if n >= 1 << 20 else f"{n / 1024:,.0f} KiB"


def table(real: dict) -> str:
    """The markdown table: one row per pass of each phase, per workload x policy."""
    lines = [f"Card: **{real['device']}** ({format_bytes(real['free'])} free of {format_bytes(real['total'])}); "
             f"buffers of {format_bytes(real['size'])} each; simulator profile `x86-pcie5` with device memory = "
             f"the free memory; CUPTI receiver: {real.get('cupti', '-')}. Real time: {_timed(real)}.", "",
             "| workload | policy | phase | real ms | real spread | sim ms | time sim/real "
             "| real MiB moved (HtoD+DtoH) | sim MiB moved | bytes sim/real | bytes | time | note |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | --- |"]
    passed = {"bytes": 0, "time": 0, "rows": 0}
    for case in real["cases"]:
        note = ["measured in the earlier run"] if case.get("earlier_run") else []
        if case.get("note"):
            note.append(case["note"])
        if case.get("dropped"):
            note.append(f"CUPTI dropped {case['dropped']} records")
        if case.get("saturated"):
            note.append(f"{case['saturated']} saturated CUPTI drains")
        moved = sum((r["htod"] or 0) - (r["dtoh"] or 0) for r in case["bytes"])
        if case["policy"] == "read_mostly":
            if any(r["htod"] for r in case["bytes"]):
                note.append("not checkable: duplicates leave the host's pages in place")
        elif moved != case["host_pages_lost_bytes"]:
            note.append(f"incomplete: CUPTI net HtoD {_fmt_bytes(moved)} vs host pages lost "
                        f"{_fmt_bytes(case['host_pages_lost_bytes'])}")
        for i, (t, b, s) in enumerate(zip(case["time"], case["bytes"], case["sim"], strict=True)):
            rb = (b["htod"] or 0) + (b["dtoh"] or 0)
            sb = s["htod"] + s["dtoh"]
            tr, br = _ratio(s["seconds"], t["seconds"]), _ratio(sb, rb)
            ok_t = tr is not None and abs(tr - 1) <= TIME_TOL
            ok_b = br is not None and abs(br - 1) <= BYTES_TOL
            passed["rows"] += 1
            passed["time"] += ok_t
            passed["bytes"] += ok_b
            phase = t["phase"] + (f" #{t['pass'] + 1}" if t["pass"] or case["workload"] == "multi_pass_stream" else "")
            lines.append(f"| {_label(case)} | {case['policy']} | {phase} | {t['seconds'] * 1e3:,.2f} | "
                         f"{_spread(case, i)} | {s['seconds'] * 1e3:,.2f} | {'-' if tr is None else f'{tr:.2f}'} | "
                         f"{rb / (1 << 20):,.1f} "
                         f"| {sb / (1 << 20):,.1f} | {'-' if br is None else f'{br:.2f}'} | "
                         f"{'pass' if ok_b else 'FAIL'} | {'pass' if ok_t else 'FAIL'} | {'; '.join(note)} |")
    lines += ["", f"Rows within target: bytes {passed['bytes']}/{passed['rows']}, time {passed['time']}/"
              f"{passed['rows']}."]
    return "\n".join(lines)


def _timed(real: dict) -> str:
    counts = sorted({len(c.get("runs") or [None]) for c in real["cases"]})
    if counts == [1]:
        return "one untraced run per case"
    return f"the median of {'/'.join(map(str, counts))} untraced runs per case, taken in rounds (spread: min-max)"


def write_readme(path: Path, text: str, marker: str = "sim_vs_gpu") -> None:
    """Put ``text`` between ``<!-- marker:begin -->`` and ``<!-- marker:end -->`` (appended if absent)."""
    begin, end = f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->"
    doc = path.read_text()
    if begin in doc and end in doc:
        head, rest = doc.split(begin, 1)
        doc = head + begin + "\n" + text + "\n" + end + rest.split(end, 1)[1]
    else:
        doc = doc.rstrip("\n") + "\n\n" + begin + "\n" + text + "\n" + end + "\n"
    path.write_text(doc)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1GiB", help="bytes per buffer (stencil has 2 buffers, matmul 3)")
    ap.add_argument("--json", default=None, help="write the real and simulated figures here")
    ap.add_argument("--markdown", default=None, help="write the table here")
    ap.add_argument("--from-json", default=None, help="rebuild from a saved run (simulator side recomputed)")
    ap.add_argument("--readme", default=None, help="write the table into this README between the markers")
    ap.add_argument("--skip", default="", help="workload:policy,... not to run; their figures come from --previous")
    ap.add_argument("--previous", default=None, help="an earlier run's JSON, for the skipped cases")
    ap.add_argument("--cases", default="", help="variants instead of the catalog: name:param=value:...,...")
    ap.add_argument("--policies", default=",".join(W.POLICIES), help="policies to run each case under")
    ap.add_argument("--marker", default="sim_vs_gpu", help="the README section the table goes in")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per case (the table shows their median)")
    args = ap.parse_args()
    policies = tuple(filter(None, args.policies.split(",")))
    if unknown := set(policies) - set(W.POLICIES):
        raise SystemExit(f"unknown policies {sorted(unknown)}: one of {', '.join(W.POLICIES)}")
    if args.repeats < 1:
        raise SystemExit(f"--repeats must be at least 1, got {args.repeats}")
    if args.from_json:
        real = json.loads(Path(args.from_json).read_text())
    else:
        previous = json.loads(Path(args.previous).read_text()) if args.previous else None
        real = run_gpu_side(parse_size(args.size), set(filter(None, args.skip.split(","))), previous,
                            parse_cases(args.cases) or None, policies, args.repeats)
    run_sim_side(real)
    text = table(real)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(real, indent=1))
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
    if args.readme:
        write_readme(Path(args.readme), text, args.marker)


if __name__ == "__main__":
    main()
