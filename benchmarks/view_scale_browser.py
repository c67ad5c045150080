"""The browser half of ``view_scale.py``: the lab view at 1,000 live allocations and 16 M pages, in Chromium.

A JupyterLab server (a temporary root, a token, this checkout's built extension) and Debian's Chromium through
Playwright, never a downloaded browser. A notebook makes 1,000 managed buffers of 64 MiB on the simulated device
and writes each on the host; then it runs the loop of ``view_scale.py`` (random 1 MiB GPU reads and whole-buffer
prefetches) for ``--seconds`` with no view open, opens the view (``%uvm view``), and runs the loop again. While
the view is open the page counts:

- frames a second (``requestAnimationFrame`` callbacks) and long tasks (``PerformanceObserver('longtask')``:
  their number and the longest);
- the time from a change to the view's picture of it: the loop notes the wall-clock time each operation
  returns; each update carries the kernel's wall clock when it read the maps (``clock``), and the view marks
  it on its node when it draws (``data-clock``), which the page timestamps. A change's latency is the time
  at which the first drawing whose ``clock`` is at or after the change was made, less the change's time
  (the kernel and the page read the same clock on one machine). p50 and p95 over every operation;
- the bytes each message to the view would put on the wire (its JSON and its binary buffers), counted in
  the kernel, the first snapshot apart.

The loop's operations a second with and without the view are printed too; ``view_scale.py`` measures the
kernel's cost properly (interleaved, best of several).

    python benchmarks/view_scale_browser.py [--seconds 20] [--json benchmarks/out/view_scale_browser.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from view_scale import latencies, percentile  # noqa: E402  (the kernel half's: one way to match changes to updates)

import tests.browser.lab as lab  # noqa: E402
from tests.browser.lab import (  # noqa: E402  (the browser tests' own lab and Chromium)
    CHROMIUM,
    CHROMIUM_ARGS,
    LabError,
    jupyter_lab,
    open_notebook,
    run_cell,
    write_notebook,
)

SETUP = """\
%load_ext uvm_lab
import json, time
import numpy as np
import uvm_lab as ul
ul.use_backend("sim", device_memory="80GiB")
SIZE = 64 << 20
buffers = [ul.DeviceBuffer(size=SIZE, label=f"b{i}") for i in range(1000)]
for buf in buffers:
    ul.touch(buf, on="host", mode="write")

def loop(seconds, seed):
    \"\"\"view_scale.py's loop for `seconds`; the wall-clock time (ms) at which each operation returned.\"\"\"
    rng = np.random.default_rng(seed)
    done, i, end = [], 0, time.monotonic() + seconds
    while time.monotonic() < end:
        buf = buffers[int(rng.integers(len(buffers)))]
        if i % 2:
            buf.prefetch("gpu" if i % 4 == 1 else "host")
        else:
            ul.touch(buf, on="gpu", mode="read", offset=int(rng.integers(SIZE >> 20)) << 20, size=1 << 20)
        done.append(time.time() * 1000)
        i += 1
    return done
print("ready", sum(b.size for b in buffers) // 4096, "pages")"""

ALONE = """\
alone = loop({seconds}, 0)
print("alone", len(alone) / {seconds:.3f}, "ops/s")"""

VIEW = "%uvm view"

# Counts what each message to the view would put on the wire, from here on (the view's snapshot is sent). Each
# message is kept and measured after the run: measuring it as it is sent would charge the view for the count.
COUNT = """\
from uvm_lab.jupyter.comm import sessions
sent = []
def counting(send):
    def counted(data=None, metadata=None, buffers=None):
        sent.append((data, [memoryview(b).nbytes for b in buffers or ()]))
        return send(data=data, metadata=metadata, buffers=buffers)
    return counted
for s in sessions():
    s.comm.send = counting(s.comm.send)
print("counting", len(sessions()), "sessions")"""

WATCHED = """\
started = time.time() * 1000
watched = loop({seconds}, 1)
seconds = (time.time() * 1000 - started) / 1000
time.sleep(1.0)   # the update that carries the last changes
wire = {{"bytes": sum(len(json.dumps(data)) + sum(sizes) for data, sizes in sent), "messages": len(sent),
         "updates": sum(isinstance(data, dict) and data.get("type") == "update" for data, _ in sent)}}
json.dump({{"ops": watched, "seconds": seconds, "alone_ops_per_s": len(alone) / {seconds:.3f}, **wire}},
          open("watched.json", "w"))
print("watched", len(watched) / seconds, "ops/s")"""

# In the page: frames, long tasks, and when each of the view's drawings (its data-clock) was made.
PROBE = """() => {
    const probe = window.__viewScale = {frames: 0, longTasks: [], drawn: [], started: performance.now()};
    const frame = () => { probe.frames += 1; probe.raf = requestAnimationFrame(frame); };
    probe.raf = requestAnimationFrame(frame);
    probe.observer = new PerformanceObserver(list => {
        for (const entry of list.getEntries()) probe.longTasks.push(entry.duration);
    });
    probe.observer.observe({type: 'longtask'});
    const view = document.querySelector('.jp-UvmLabView');
    probe.mutations = new MutationObserver(() => {
        const clock = Number(view.dataset.clock);
        const last = probe.drawn.length ? probe.drawn[probe.drawn.length - 1][0] : 0;
        if (clock > last) probe.drawn.push([clock, performance.timeOrigin + performance.now()]);
    });
    probe.mutations.observe(view, {attributes: true, attributeFilter: ['data-clock']});
}"""

COLLECT = """() => {
    const probe = window.__viewScale;
    cancelAnimationFrame(probe.raf);
    probe.observer.disconnect();
    probe.mutations.disconnect();
    return {frames: probe.frames, seconds: (performance.now() - probe.started) / 1000,
            longTasks: probe.longTasks, drawn: probe.drawn};
}"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not CHROMIUM.exists():
        raise SystemExit(f"Debian's Chromium is not at {CHROMIUM}; this benchmark never downloads a browser")
    os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
    lab.WAIT_MS = int(args.seconds * 1000) + 300_000   # a cell here runs for minutes, not the tests' seconds
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="view-scale-") as tmp:
        try:
            with jupyter_lab(Path(tmp)) as (url, token, root):
                cells = [SETUP, ALONE.format(seconds=args.seconds), VIEW, COUNT, WATCHED.format(seconds=args.seconds)]
                write_notebook(root / "scale.ipynb", cells)
                with sync_playwright() as p:
                    browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, timeout=60_000)
                    page = browser.new_page(viewport={"width": 1600, "height": 1000})
                    open_notebook(page, url, token, "scale.ipynb")
                    print(run_cell(page, "scale.ipynb", 0, "ready"))
                    print(run_cell(page, "scale.ipynb", 1, "alone"))
                    run_cell(page, "scale.ipynb", 2, "UVM Lab view")
                    page.locator('.jp-UvmLabView[data-state="connected"]').wait_for(timeout=120_000)
                    print(run_cell(page, "scale.ipynb", 3, "counting"))
                    page.evaluate(PROBE)
                    print(run_cell(page, "scale.ipynb", 4, "watched"))
                    seen = page.evaluate(COLLECT)
                    browser.close()
                kernel = json.loads((root / "watched.json").read_text())
        except LabError as err:
            raise SystemExit(str(err)) from err

    late, unseen = latencies(kernel["ops"], seen["drawn"])
    tasks = seen["longTasks"]
    # Where in the run the slow ones fall: a second's p95 each (by when the operation returned), and the longest
    # wait between two drawings, with when it began.
    ops = sorted(kernel["ops"])
    first = ops[0] if ops else 0.0
    by_second: dict[int, list[float]] = {}
    for op, ms in zip(ops, late, strict=False):   # latencies(): in that order, the undrawn last
        by_second.setdefault(int((op - first) // 1000), []).append(ms)
    drawn_at = [at for _, at in seen["drawn"]]
    gaps = [(later - earlier, earlier) for earlier, later in itertools.pairwise(drawn_at)]
    gap, gap_at = max(gaps, default=(0.0, first))
    result: dict[str, Any] = {
        "fps": seen["frames"] / seen["seconds"],
        "long_tasks": len(tasks), "long_task_max_ms": max(tasks, default=0.0),
        "long_task_median_ms": statistics.median(tasks) if tasks else 0.0,
        "latency_p50_ms": percentile(late, 0.5), "latency_p95_ms": percentile(late, 0.95),
        "latency_max_ms": max(late, default=float("nan")), "ops": len(kernel["ops"]), "ops_not_drawn": unseen,
        "drawings": len(seen["drawn"]), "updates": kernel["updates"],
        "bytes_per_s": kernel["bytes"] / kernel["seconds"], "messages": kernel["messages"],
        "ops_per_s_alone": kernel["alone_ops_per_s"], "ops_per_s_watched": len(kernel["ops"]) / kernel["seconds"],
        "longest_gap_ms": gap, "longest_gap_at_s": (gap_at - first) / 1000,
    }
    goals = {"fps": ">= 30", "long_task_max_ms": "<= 100", "latency_p95_ms": "<= 100", "bytes_per_s": "<= 1e6"}
    print(f"\n{'measure':24} {'value':>14}  goal")
    for key, value in result.items():
        print(f"{key:24} {value:14,.1f}  {goals.get(key, '')}")
    p95s = {second: percentile(values, 0.95) for second, values in sorted(by_second.items())}
    print("p95 ms by second of the loop:", " ".join(f"{second}:{ms:.0f}" for second, ms in p95s.items()))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({**result, "latency_p95_ms_by_second": p95s}, indent=2))


if __name__ == "__main__":
    main()
