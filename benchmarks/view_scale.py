"""What a live view costs the kernel at scale: 1,000 live allocations, 16 M pages, a loop of touches and prefetches.

The simulated device holds 1,000 managed buffers of 64 MiB (16.4 M pages of 4 KiB). A loop picks buffers at random
and either has a kernel read 1 MiB of one or prefetches one whole to the GPU or the host, as fast as it can. The
same loop (the same seed) is timed with nothing watching (the peer), with the lab view's comm session attached,
and with the widget dashboard live; the modes are interleaved, best and median of ``--repeats``.

The view's session sends into a sink that counts what would cross the comm: JSON bytes and binary buffers. The
snapshot a view gets when it attaches is counted apart from the steady state, which must stay under 1 MB/s.
For the view and the panel it also reports how many updates went out a second, the CPU each took (the other
threads' CPU over the updates), and the kernel's half of a change's latency: from the moment the loop's operation
returned to the moment the first update that holds it (its ``clock`` at or after the operation) was sent. What the
browser does with it (frames a second, long tasks, the rest of the latency) is measured in the browser half of
this benchmark. Each mode also reports the CPU its loop's thread took, and the whole process's CPU over the loop
against the loop alone (``cpu_vs_none``): what a view costs the kernel, steadier than seconds on a shared machine;
and the median over repeats of each run's seconds against the loop alone's with the same seed (``paired_vs_none``).

    python benchmarks/view_scale.py [--ops 2000] [--repeats 3] [--modes none,view,panel,dashboard] [--json out.json]
    python benchmarks/view_scale.py --repeats 0 --pairs 40 --block-ops 400 --modes view,dashboard

    python benchmarks/view_scale.py --repeats 0 --modes view,dashboard --concurrent 8 --slots 40

The second form measures the cost to the loop alone, steadier than whole runs: pairs of short blocks, one with a
view (or the dashboard) and one without, back to back (``alternating``). The third measures it at the same
moments, for a machine with cores to spare: processes side by side, half of them with a view and half without,
swapping every slot (``concurrent``). It also reports how often each half's loop thread slept (waiting for the
interpreter's lock, or another) and its CPU in the kernel an operation; ``--pin`` puts each process's loop thread
on a core of its own and its other threads on one more (``--pin together``: all of them on one core), and
``--switch-interval`` sets the switch interval a view or a live dashboard holds while open
(:data:`uvm_lab.jupyter.throttle.LIVE_SWITCH_INTERVAL`), for an ablation.

``view`` watches the maps a view shows (a screenful of the list's rows), at the view's default rate; ``view_10hz``,
``view_15hz`` and ``view_20hz`` do so with the view's rate set to 10, 15 and 20 updates a second, ``view_no_maps`` with
no map on screen (its updates carry counts, one map read a refresh and the device lanes); ``panel`` watches none, as the
sidebar panel does, and reads every changed map. More modes take the view apart: ``paused`` (a view attached and paused:
fed, sending nothing), ``view_inline`` (the same updates made on the loop's own thread between its operations, with no
hand-off of the interpreter's lock), ``window`` (the timeline window and device series that views share, with no session
to read the loop's events into them), ``snapshot`` (a view's snapshot made and the view closed before the loop starts:
what attaching leaves behind) and ``subscriber`` (a bus subscriber that does nothing, on a thread of its own).
``dashboard`` is the live widget dashboard at its default interval, ``dashboard_1s`` and ``dashboard_5hz`` with it set
to 1 s and 0.2 s. The yardsticks ``busy``, ``busy_numpy`` and ``busy_inline`` (:class:`Busy`) take 5% of a core in other
ways; ``busy_fine`` and ``tick_fine`` (:class:`Paced`) take 1.6 ms and 0.2 ms of pure Python every 50 ms at a view's
switch interval: an update's pace without its reads; ``maps_fine``, ``journal_fine``, ``readin_fine`` and
``refresh_fine`` one of its reads alone at that pace (:data:`PACED_READS`); ``view_unencoded`` is the view with its
messages not encoded as JSON. ``--pairs`` and ``--concurrent`` also report the updates (or the dashboard's refreshes) a
second. ``--reads`` takes an update apart the other way: one of its reads at a time, on a thread beside the loop
(:func:`read_costs`).
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import resource
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import uvm_lab as ul
from uvm_lab.events import get_bus

ALLOCATIONS = 1000
#: The share of a core the yardstick threads (Busy) take: the issue's bound on a view's cost.
BUSY_SHARE = 0.05
BUSY = ("busy", "busy_numpy", "busy_inline")
#: Yardsticks at a view's pace and switch interval (they hold FineSwitching, as a view does): pure Python of the
#: seconds given, every 50 ms, on a thread of their own. Whether what an update costs the loop beyond its CPU comes
#: with the pace and the lock's hand-offs (then these cost it as much) or with what an update reads.
PACED = {"busy_fine": 0.0016, "tick_fine": 0.0002}
#: And at the same pace, one of an update's reads alone: three of the maps on screen (``ul.residency``, as a view's
#: description starts), the residency tracker's journal since the last read (``changes``, as a view's refresh does),
#: the loop's records read into the timeline window that views share (``changed_lanes``, as an update does), or the
#: maps on screen described again where they changed (``LiveAllocations.refresh``: the journal and the descriptions).
PACED_READS = ("maps_fine", "journal_fine", "readin_fine", "refresh_fine")
#: The view with its rate control set, whatever its default: the interval asked for, in ms.
RATES = {"view_10hz": 100, "view_15hz": 67, "view_20hz": 50}
#: The dashboard with its least time between refreshes set, whatever its default: seconds.
DASHBOARD_INTERVALS = {"dashboard_1s": 1.0, "dashboard_5hz": 0.2}
#: The modes that attach a lab view's session, and those that open the live dashboard.
SESSIONS = ("view", *RATES, "view_no_maps", "view_unencoded", "view_inline", "paused")
DASHBOARDS = ("dashboard", *DASHBOARD_INTERVALS)
#: What --pairs and --concurrent measure against none.
COSTED = (*SESSIONS, "window", "snapshot", *DASHBOARDS, *BUSY, *PACED, *PACED_READS)
SIZE = 64 << 20
ON_SCREEN = 20   # the allocation list's rows in a view


class CountingComm:
    """Stands where the kernel's comm would: counts what each message would put on the wire."""

    def __init__(self, encode: bool = True) -> None:
        self.encode = encode   # False: each message's JSON is not made (view_unencoded), and its bytes not counted
        self.lock = threading.Lock()
        self.bytes = 0
        self.messages = 0
        self.updates: list[tuple[float, float]] = []   # each update's clock, and when it was sent (wall ms)

    def send(self, data: Any = None, metadata: Any = None, buffers: Any = None) -> None:
        sent = time.time() * 1000
        size = (len(json.dumps(data)) if self.encode else 0) + sum(memoryview(b).nbytes for b in buffers or ())
        with self.lock:
            self.bytes += size
            self.messages += 1
            if isinstance(data, dict) and data.get("type") == "update":
                self.updates.append((data["clock"], sent))

    def on_msg(self, callback: Any) -> None:
        pass

    def on_close(self, callback: Any) -> None:
        pass

    def close(self, *args: Any, **kwargs: Any) -> None:
        pass

    def taken(self) -> tuple[int, int]:
        with self.lock:
            return self.bytes, self.messages


def loop(buffers: list[ul.DeviceBuffer], ops: int, seed: int,
         tick: Callable[[], None] | None = None) -> tuple[float, list[float]]:
    """The user's loop: seconds for ``ops`` touches and prefetches, and the wall clock (ms) at which each returned;
    ``tick`` is called after each operation (``view_inline``)."""
    rng = np.random.default_rng(seed)
    picks = rng.integers(len(buffers), size=ops).tolist()
    offsets = (rng.integers(SIZE // (1 << 20) - 1, size=ops) << 20).tolist()
    done = []
    start = time.perf_counter()
    for i, (pick, offset) in enumerate(zip(picks, offsets, strict=True)):
        buf = buffers[pick]
        if i % 2:
            buf.prefetch("gpu" if i % 4 == 1 else "host")
        else:
            ul.touch(buf, on="gpu", mode="read", offset=offset, size=1 << 20)
        if tick is not None:
            tick()
        done.append(time.time() * 1000)
    return time.perf_counter() - start, done


def reset(buffers: list[ul.DeviceBuffer]) -> None:
    """Every buffer prefetched to the host: blocks (or slots) that run the same operations start from the same map,
    so they do the same work."""
    for buf in buffers:
        buf.prefetch("host")


def watched_loop(buffers: list[ul.DeviceBuffer], ops: int, seed: int) -> tuple[dict[str, float], list[float]]:
    """The loop's seconds, and the CPU time other threads (a view's) took meanwhile, as a share of them: what the
    throttle holds to 5%, less noisy than the loop's time on a shared machine; and when each operation returned."""
    process, main = time.process_time(), time.thread_time()
    seconds, done = loop(buffers, ops, seed)
    mine = time.thread_time() - main
    others = (time.process_time() - process) - mine
    return {"seconds": seconds, "loop_cpu_s": mine, "other_threads_cpu_s": others,
            "other_threads_cpu_share": others / seconds}, done


def latencies(ops: list[float], drawn: list[list[float]]) -> tuple[list[float], int]:
    """Each operation's time (ms) to the first of ``drawn`` (``[clock, at]``: a read of the maps at ``clock`` shown,
    or sent, at ``at``; in order) whose clock is at or after it, and how many operations none held."""
    out, i, unseen = [], 0, 0
    for op in sorted(ops):
        while i < len(drawn) and drawn[i][0] < op:
            i += 1
        if i == len(drawn):
            unseen += 1
        else:
            out.append(drawn[i][1] - op)
    return out, unseen


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def measure(mode: str, buffers: list[ul.DeviceBuffer], ops: int, seed: int) -> dict[str, float]:
    if mode == "none":
        return watched_loop(buffers, ops, seed)[0]
    if mode in ("view", *RATES, "panel", "paused"):
        session, comm = attach(mode, buffers)
        snapshot, _ = comm.taken()
        try:
            run, done = watched_loop(buffers, ops, seed)
            time.sleep(0.5)   # the updates the loop's last changes cause
        finally:
            session.close()
        if mode == "paused":
            return run
        sent, messages = comm.taken()
        during = [u for u in comm.updates if u[1] <= done[-1]]
        late, _ = latencies(done, comm.updates)
        return {**run, "snapshot_bytes": snapshot, "steady_bytes_per_s": (sent - snapshot) / run["seconds"],
                "messages": messages, "updates_per_s": len(during) / run["seconds"],
                "update_cpu_ms": run["other_threads_cpu_share"] * run["seconds"] / max(len(during), 1) * 1000,
                "sent_latency_p50_ms": percentile(late, 0.5), "sent_latency_p95_ms": percentile(late, 0.95)}
    if mode == "subscriber":   # a bus subscriber that does nothing: what a thread woken for the loop's events costs
        with ul.events.get_bus().subscribe(lambda records: None, name="view_scale's idle subscriber"):
            return watched_loop(buffers, ops, seed)[0]
    if mode == "dashboard":
        from uvm_lab.jupyter.dashboard import Dashboard

        dashboard = Dashboard(live=True)
        try:
            run = watched_loop(buffers, ops, seed)[0]
        finally:
            dashboard.close()
        return {**run, "refreshes": dashboard.refreshes}
    if mode in BUSY:
        busy = Attached(mode, buffers, settle=0.0)
        try:
            return watched_loop(buffers, ops, seed)[0]
        finally:
            busy.close()
    raise SystemExit(f"unknown mode {mode!r}: the modes are none, view, {', '.join(RATES)}, panel, dashboard, "
                     f"paused, subscriber, {', '.join(BUSY)}")


def attach(mode: str, buffers: list[ul.DeviceBuffer], start: bool = True) -> tuple[Any, CountingComm]:
    """A lab view's session in ``mode`` (view, one of :data:`RATES`, panel or paused), its snapshot sent, and what it
    sends to; with ``start=False``, no thread of its own sends its updates."""
    from uvm_lab.jupyter.comm import PanelSession

    comm = CountingComm(encode=mode != "view_unencoded")
    session = PanelSession(comm, start=start)
    session.handle({"type": "hello", "seq": 0})   # the snapshot is sent before handle returns
    if mode.startswith("view"):   # as the view does: the maps on screen (a screenful of the list's rows) first
        shown = [] if mode == "view_no_maps" else [b.id for b in buffers[:ON_SCREEN]]
        session.handle({"type": "watch", "seq": 1, "ids": shown})
    if mode in RATES:   # the view's rate control set
        session.handle({"type": "rate", "seq": 2, "interval_ms": RATES[mode]})
    elif mode == "paused":   # attached but paused: what it costs the loop to be fed, with no update sent
        session.handle({"type": "pause", "seq": 1, "paused": True})
    return session, comm


class Attached:
    """A view (or the dashboard) attached to the kernel and done with its first drawing, for a block of the loop."""

    def __init__(self, mode: str, buffers: list[ul.DeviceBuffer], settle: float = 0.3) -> None:
        self.mode = mode
        self.tick: Callable[[], None] | None = None
        if mode in SESSIONS and mode != "view_inline":   # paused: what feeding the view costs, no update
            self.session, self.comm = attach(mode, buffers)
        elif mode == "view_inline":
            self.session, self.comm = attach("view", buffers, start=False)
            self.tick = InlineUpdates(self.session).tick
        elif mode == "window":   # the timeline window and device series views share, and no session reading them
            from uvm_lab.jupyter.timeline import shared

            shared()
        elif mode == "snapshot":   # a view's snapshot made and the view closed: what attaching leaves behind
            session, _ = attach("paused", buffers)
            session.close()
        elif mode in DASHBOARDS:
            from uvm_lab.jupyter.dashboard import Dashboard

            self.dashboard = Dashboard(live=True, **({"interval": DASHBOARD_INTERVALS[mode]}
                                                     if mode in DASHBOARD_INTERVALS else {}))
        elif mode in BUSY:
            self.busy = Busy(released=mode == "busy_numpy", inline=mode == "busy_inline")
        elif mode in PACED:
            self.busy = Paced(Paced.spinning(PACED[mode]))
        elif mode == "maps_fine":
            self.busy = Paced(Paced.maps(buffers[:ON_SCREEN]))
        elif mode == "journal_fine":
            self.busy = Paced(Paced.journal())
        elif mode == "readin_fine":
            self.busy = Paced(*Paced.read_in())
        elif mode == "refresh_fine":
            self.busy = Paced(Paced.refresh(buffers[:ON_SCREEN]))
        else:
            raise SystemExit(f"--pairs and --concurrent measure {', '.join(COSTED)}, not {mode!r}")
        time.sleep(settle)   # what attaching set going ends before the block's clock starts

    def refreshes(self) -> int:
        """The updates sent (the view) or the refreshes drawn (the dashboard) so far; 0 for the others."""
        if self.mode in SESSIONS:
            return len(self.comm.updates)
        return self.dashboard.refreshes if self.mode in DASHBOARDS else 0

    def close(self) -> None:
        if self.mode in SESSIONS:
            self.session.close()
        elif self.mode in DASHBOARDS:
            self.dashboard.close()
        elif self.mode == "window":
            from uvm_lab.jupyter.timeline import release_shared

            release_shared()
        elif self.mode in BUSY or self.mode in PACED or self.mode in PACED_READS:
            self.busy.close()


class InlineUpdates:
    """``view_inline``: the view's updates made on the loop's own thread, between two of its operations, as a
    progress bar's are, instead of on the session's thread: at most one an interval and the updates' share of the
    kernel's time, as the session's thread makes them. A measure of what the hand-offs of the interpreter's lock
    between the loop's thread and the view's cost, not a way the kernel makes updates."""

    def __init__(self, session: Any) -> None:
        from uvm_lab.jupyter.comm import UPDATES_SHARE
        from uvm_lab.jupyter.throttle import Budget

        self.session = session
        self.budget = Budget(UPDATES_SHARE)
        self.next = 0.0

    def tick(self) -> None:
        if (started := time.monotonic()) < self.next:
            return
        cpu = time.thread_time()
        self.session.flush()
        self.budget.spend(started, time.thread_time() - cpu)
        self.next = max(started + self.session.interval, self.budget.ready_at())


class Busy:
    """The yardstick for a view's cost: work that takes :data:`BUSY_SHARE` of a core from the loop, in pieces of
    2.5 ms every 50 ms (a view's pace). On a thread of its own, as pure Python that holds the interpreter's lock
    throughout, or (``released``) with a small numpy sort every 0.1 ms, each of which lets the lock go, as a view's
    numpy calls do; or (``inline``) as pure Python on the loop's own thread, as the loop publishes its events. What
    each costs the loop says what any work at that share costs under the lock, and what the lock's hand-offs add."""

    def __init__(self, released: bool, inline: bool = False) -> None:
        self._stop = threading.Event()
        self._subscription = None
        if inline:
            self._next = 0.0
            self._subscription = get_bus().subscribe(self._on_events, inline=True, name="view_scale's busy pieces")
            return
        self._thread = threading.Thread(target=self._run, args=(released,), name="view_scale's busy thread",
                                        daemon=True)
        self._thread.start()

    @staticmethod
    def piece(released: bool, small: np.ndarray | None = None, seconds: float = 0.05 * BUSY_SHARE) -> None:
        """``seconds`` of this thread's CPU: pure Python, or (``released``) sorting ``small`` every 0.1 ms."""
        until = time.thread_time() + seconds
        step = time.thread_time() + 1e-4
        while (now := time.thread_time()) < until:
            if released and now >= step:
                np.sort(small)   # numpy lets the lock go around its sort
                step = now + 1e-4

    def _on_events(self, records: np.ndarray) -> None:
        if (now := time.monotonic()) >= self._next:
            self._next = now + 0.05
            self.piece(False)

    def _run(self, released: bool) -> None:
        small = np.random.default_rng(0).random(64)
        while not self._stop.is_set():
            self.piece(released, small)
            self._stop.wait(0.05)

    def close(self) -> None:
        if self._subscription is not None:
            self._subscription.close()
            return
        self._stop.set()
        self._thread.join()


class Paced:
    """A :data:`PACED` or :data:`PACED_READS` yardstick: ``piece()`` every 50 ms on a thread of its own, the switch
    interval held where a view holds it."""

    def __init__(self, piece: Callable[[], Any], release: Callable[[], Any] | None = None) -> None:
        from uvm_lab.jupyter.throttle import FineSwitching

        self._piece, self._release = piece, release
        self._stop = threading.Event()
        self._switching = FineSwitching()
        self._thread = threading.Thread(target=self._run, name="view_scale's paced thread", daemon=True)
        self._thread.start()

    @classmethod
    def spinning(cls, seconds: float) -> Callable[[], Any]:
        """``seconds`` of pure Python: a counted loop, calibrated once. Timing it as it runs would read the thread's
        CPU clock, a system call on some hosts, and the piece would then be mostly those."""
        rounds, cpu = 200_000, time.thread_time()
        cls._spin(rounds)
        per_second = rounds / max(time.thread_time() - cpu, 1e-6)
        return lambda: cls._spin(max(1, round(seconds * per_second)))

    @staticmethod
    def _spin(rounds: int) -> int:
        total = 0
        for i in range(rounds):
            total += i & 7
        return total

    @staticmethod
    def maps(shown: list[ul.DeviceBuffer]) -> Callable[[], Any]:
        """Three of ``shown``'s maps a piece, in turn."""
        turn = itertools.cycle(shown)
        return lambda: [ul.residency(next(turn)) for _ in range(3)]

    @staticmethod
    def journal() -> Callable[[], Any]:
        """The residency tracker's journal since the piece before."""
        from uvm_lab.residency_map import get_tracker

        tracker = get_tracker()
        cursor = [tracker.changes(0)[0]]

        def piece() -> None:
            cursor[0] = tracker.changes(cursor[0])[0]
        return piece

    @staticmethod
    def refresh(shown: list[ul.DeviceBuffer]) -> Callable[[], Any]:
        """``shown``'s maps described again where they changed since the piece before, as a view's refresh does."""
        from uvm_lab.jupyter.dashboard.collect import LiveAllocations

        live, ids = LiveAllocations(), frozenset(b.id for b in shown)
        live.refresh(ids, 0)   # the first: every buffer described, as when a view attaches
        return lambda: live.refresh(ids, 0)

    @staticmethod
    def read_in() -> tuple[Callable[[], Any], Callable[[], Any]]:
        """The loop's records read into the kernel's shared timeline window, and how to give the window back."""
        from uvm_lab.jupyter.timeline import release_shared, shared

        window = shared()[0]
        cursor = [window.changed_lanes(0)[0]]

        def piece() -> None:
            cursor[0] = window.changed_lanes(cursor[0])[0]
        return piece, release_shared

    def _run(self) -> None:
        while not self._stop.is_set():
            self._piece()
            self._stop.wait(0.05)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._switching.release()
        if self._release is not None:
            self._release()


def alternating(mode: str, buffers: list[ul.DeviceBuffer], pairs: int, ops: int) -> dict[str, float]:
    """The loop's cost with ``mode`` against none, from ``pairs`` pairs of short blocks run back to back.

    The machine's speed moves in phases of seconds, by more than the 5% measured; two blocks of a fraction of a
    second each, one right after the other, fall in the same phase. Both blocks of a pair run the same operations
    from the same map (every buffer prefetched to the host first, untimed), so they do the same work. The view is
    attached (and has sent its snapshot) before its block starts and closed after it, so a block with none runs
    as a kernel that no view watches. Which block comes first alternates. Reported: the mean of the pairs' log
    ratios, as a ratio, with a 95% interval (two standard errors), and their median."""
    logs = []
    for pair in range(pairs):
        seconds = {}
        for which in (("none", mode) if pair % 2 == 0 else (mode, "none")):
            reset(buffers)
            attached = Attached(mode, buffers) if which != "none" else None
            try:
                if attached is None:
                    time.sleep(0.3)   # as long as an attached view is given to settle
                seconds[which] = loop(buffers, ops, seed=1_000_000 + pair,
                                      tick=attached.tick if attached is not None else None)[0]
            finally:
                if attached is not None:
                    attached.close()
        logs.append(float(np.log(seconds[mode] / seconds["none"])))
        print(f"pair {pair + 1}/{pairs} {mode:10} none {seconds['none']:.3f} s, {mode} {seconds[mode]:.3f} s, "
              f"{seconds[mode] / seconds['none']:.3f}x", flush=True)
    mean, error = _log_mean(logs)
    return {"pairs": pairs, "ops_per_block": ops, "ratio": float(np.exp(mean)),
            "ratio_low": float(np.exp(mean - error)), "ratio_high": float(np.exp(mean + error)),
            "median_ratio": float(np.exp(np.median(logs)))}



def _slot_worker(worker: int, mode: str, baseline: str, slots: int, slot_s: float, settle_s: float,
                 ready: Any, start: Any, results: Any, pin: str | None = None, switch: float | None = None) -> None:
    """One process of :func:`concurrent`: its own simulated device and 1,000 buffers; in each slot, the loop with
    ``mode`` attached or with ``baseline`` (every other worker the other way round), counting the operations done. A
    failure is put where the results go, so that the parent stops with it instead of waiting for ever."""
    try:
        _slots(worker, mode, baseline, slots, slot_s, settle_s, ready, start, results, pin, switch)
    except BaseException as err:
        ready.put(worker)
        results.put((worker, f"{type(err).__name__}: {err}"))
        raise


def _slots(worker: int, mode: str, baseline: str, slots: int, slot_s: float, settle_s: float,
           ready: Any, start: Any, results: Any, pin: str | None = None, switch: float | None = None) -> None:
    if switch is not None:   # what FineSwitching sets, in this process
        from uvm_lab.jupyter import throttle

        throttle.LIVE_SWITCH_INTERVAL = switch
    width = 2 if pin == "apart" else 1
    cores = sorted(os.sched_getaffinity(0))[width * worker:width * (worker + 1)] if pin else []
    if pin:   # apart: the loop's thread on a core of its own, every other thread of the process on one more;
        # together: all on one (a thread made later takes its maker's cores)
        if len(cores) < width:
            raise SystemExit(f"--pin {pin} needs {width} cores a process, {width * (worker + 1)} at least; this "
                             f"machine lets us use {len(os.sched_getaffinity(0))}")
        os.sched_setaffinity(0, cores[:1])
    ul.use_backend("sim", device_memory="80GiB")
    buffers = [ul.DeviceBuffer(size=SIZE, label=f"b{i}") for i in range(ALLOCATIONS)]
    loop(buffers, 400, seed=5)   # the compiled core loaded and warm before any slot
    # And the modules a view reads with imported: their compiled passes are compiled at import where no cache holds
    # them yet, seconds in each process at once on a fresh machine, which overran the first slots' attaches and left
    # those worker-slots out.
    import uvm_lab.jupyter.comm
    import uvm_lab.jupyter.dashboard.collect
    if mode in DASHBOARDS or baseline in DASHBOARDS:   # and the widgets a dashboard draws with, which only it needs
        import uvm_lab.jupyter.dashboard  # noqa: F401
    gc.collect()
    gc.freeze()
    ready.put(worker)
    begin = start.get()   # the same wall-clock moment in every worker
    out = []
    for slot in range(slots):
        opens = begin + slot * slot_s
        which = mode if (slot + worker) % 2 == 0 else baseline
        time.sleep(max(0.0, opens - time.time()))
        reset(buffers)
        attached = Attached(mode if which == "closed" else which, buffers, settle=0.0) if which != "none" else None
        if which == "closed":   # the same opened and closed before the loop: its after-effects, and nothing running
            attached.close()
            attached = None
        for thread in threading.enumerate() if pin == "apart" else ():
            if thread is not threading.main_thread() and thread.native_id is not None:
                os.sched_setaffinity(thread.native_id, cores[1:])
        # Attached (its snapshot sent, and what that set going given time to end) before the clock starts; an
        # attach that outlasts the settle (a view made once the bus's history is full reads all of it) is waited for.
        time.sleep(max(0.0, max(opens + settle_s, time.time() + 0.3) - time.time()))
        closes = opens + slot_s - 0.05
        done, started, chunk = 0, time.perf_counter(), 0
        refreshed = attached.refreshes() if attached is not None else 0
        cpu_process, cpu_loop = time.process_time(), time.thread_time()
        usage = resource.getrusage(resource.RUSAGE_THREAD)
        while time.time() < closes:
            loop(buffers, 50, seed=1_000_000 + slot * 1000 + chunk,   # the same operations in every worker
                 tick=attached.tick if attached is not None else None)
            done, chunk = done + 50, chunk + 1
        seconds = time.perf_counter() - started
        mine = time.thread_time() - cpu_loop
        others = (time.process_time() - cpu_process) - mine
        used = resource.getrusage(resource.RUSAGE_THREAD)
        refreshes = 0
        if attached is not None:
            refreshes = attached.refreshes() - refreshed
            attached.close()
        out.append({"worker": worker, "slot": slot, "mode": which, "ops": done, "seconds": seconds, "loop_cpu_s": mine,
                    "loop_system_s": used.ru_stime - usage.ru_stime,   # of loop_cpu_s: in the kernel (futexes)
                    "loop_waits": used.ru_nvcsw - usage.ru_nvcsw,   # times the loop's thread slept (the GIL, locks)
                    "other_threads_cpu_share": others / seconds, "refreshes_per_s": refreshes / seconds})
    results.put((worker, out))


def concurrent(mode: str, workers: int, slots: int, slot_s: float, settle_s: float,
               baseline: str = "none", pin: str | None = None, switch: float | None = None) -> dict[str, Any]:
    """The loop's cost with ``mode`` against none, measured at the same moments: ``workers`` processes (an even
    number) run the loop side by side in slots of ``slot_s`` seconds; in each slot half of them have ``mode``
    attached and half have none, and the halves swap every slot. A slot's ratio is the none half's operations a
    second over the ``mode`` half's: the machine's phases (its speed moves by more than 5% over seconds) fall on
    both halves alike, and the swap cancels what differs between processes. Reported: the mean of the log ratios of
    pairs of slots (:func:`_paired`), as a ratio, with a 95% interval (two standard errors), the slots' median, the
    attached half's other threads' CPU over its loop's time, and its loop thread's own CPU an operation against the
    bare half's (``loop_cpu_ratio``, with its interval): whether the loop did more (or slower) work, or waited."""
    import multiprocessing

    if workers < 2 or workers % 2:
        raise SystemExit(f"--concurrent takes an even number of processes >= 2, not {workers}")
    if baseline == mode or baseline not in ("none", "closed", *COSTED):
        raise SystemExit(f"--baseline takes none, closed or one of {', '.join(COSTED)} other than the mode, "
                         f"not {baseline!r}")
    context = multiprocessing.get_context("spawn")
    ready, start, results = context.Queue(), context.Queue(), context.Queue()
    procs = [context.Process(target=_slot_worker, args=(w, mode, baseline, slots, slot_s, settle_s, ready, start,
                                                        results, pin, switch)) for w in range(workers)]
    for proc in procs:
        proc.start()
    for _ in procs:
        ready.get()
    begin = time.time() + 1.0
    for _ in procs:
        start.put(begin)
    answers = [results.get()[1] for _ in procs]
    if failed := [answer for answer in answers if isinstance(answer, str)]:
        raise SystemExit(f"a worker failed: {failed[0]}")
    rows = [row for answer in answers for row in answer]
    for proc in procs:
        proc.join()
    logs, cpu_logs, shares, counted = [], [], [], []
    # A worker whose slot left it under half a second of loop (its attach or reset ran long) is left out of that slot.
    short = [r for r in rows if r["seconds"] < 0.5]
    rows = [r for r in rows if r["seconds"] >= 0.5]
    for slot in range(slots):
        rate = {which: [r["ops"] / r["seconds"] for r in rows if r["slot"] == slot and r["mode"] == which]
                for which in (baseline, mode)}
        if not rate[baseline] or not rate[mode]:
            continue
        logs.append(float(np.log(np.mean(rate[baseline]) / np.mean(rate[mode]))))
        counted.append(slot)
        # The loop thread's own CPU an operation, each half's: where the loop's time went up with its CPU, it did
        # more work or ran slower (caches); where its time went up and its CPU did not, it waited.
        per_op = {which: [r["loop_cpu_s"] / r["ops"] for r in rows if r["slot"] == slot and r["mode"] == which]
                  for which in (baseline, mode)}
        cpu_logs.append(float(np.log(np.mean(per_op[mode]) / np.mean(per_op[baseline]))))
        shares += [r["other_threads_cpu_share"] for r in rows if r["slot"] == slot and r["mode"] == mode]
        print(f"slot {slot + 1}/{slots} {mode:10} {baseline} {np.mean(rate[baseline]):.0f} ops/s, {mode} "
              f"{np.mean(rate[mode]):.0f} ops/s, {np.exp(logs[-1]):.3f}x", flush=True)
    mean, error = _log_mean(_paired(logs, counted))
    cpu_mean, cpu_error = _log_mean(_paired(cpu_logs, counted))
    return {"workers": workers, "slots": slots, "slot_s": slot_s, "ratio": float(np.exp(mean)),
            "ratio_low": float(np.exp(mean - error)), "ratio_high": float(np.exp(mean + error)),
            "loop_cpu_ratio": float(np.exp(cpu_mean)), "loop_cpu_ratio_low": float(np.exp(cpu_mean - cpu_error)),
            "loop_cpu_ratio_high": float(np.exp(cpu_mean + cpu_error)),
            "median_ratio": float(np.exp(np.median(logs))), "other_threads_cpu_share": float(np.median(shares)),
            "slots_counted": len(logs), "worker_slots_left_out": len(short),
            "baseline": baseline, "pinned": pin, "live_switch_interval": switch,
            "baseline_ops_per_s": float(np.median([r["ops"] / r["seconds"] for r in rows if r["mode"] == baseline])),
            "refreshes_per_s": float(np.median([r["refreshes_per_s"] for r in rows if r["mode"] == mode])),
            # Per half: the loop thread's CPU in the kernel an operation (us), and how often it slept a second.
            "loop_system_us_per_op": {which: float(np.median([r["loop_system_s"] / r["ops"] * 1e6 for r in rows
                                                              if r["mode"] == which])) for which in (baseline, mode)},
            "loop_waits_per_s": {which: float(np.median([r["loop_waits"] / r["seconds"] for r in rows
                                                         if r["mode"] == which])) for which in (baseline, mode)},
            # Per half: the share of the loop's time its thread was off the CPU (waiting for the interpreter's lock,
            # or another). Unlike the ratio, it does not move with the machine's speed: the cost that waiting alone
            # accounts for, whatever the loop's CPU an operation did.
            "loop_off_cpu_share": {which: float(np.mean([1 - r["loop_cpu_s"] / r["seconds"] for r in rows
                                                         if r["mode"] == which])) for which in (baseline, mode)},
            # Every worker's slots, a column per field, for analyses of their own (the spread by process and by slot).
            "rows": {field: [r[field] for r in rows] for field in rows[0]} if rows else {}}


def _to_json(table: dict[str, Any]) -> str:
    """``table`` as indented JSON, each list of plain values (a column of ``rows``) on one line."""
    lists: list[str] = []

    def placeholders(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: placeholders(v) for k, v in value.items()}
        if isinstance(value, list) and all(isinstance(v, (int, float, str)) for v in value):
            lists.append(json.dumps([round(v, 6) if isinstance(v, float) else v for v in value]))
            return f"@list{len(lists) - 1}@"
        return value

    text = json.dumps(placeholders(table), indent=2)
    for i, compact in enumerate(lists):
        text = text.replace(f'"@list{i}@"', compact, 1)
    return text


def _paired(logs: list[float], slots: list[int]) -> list[float]:
    """The mean of each pair of slots (0 and 1, 2 and 3, ...) both counted: each process ran once in each half, so
    what differs between processes cancels in a pair as the machine's phases cancel in a slot, and the pairs' spread
    is the measurement's own. Their mean is the slots' (where every slot counted)."""
    at = dict(zip(slots, logs, strict=True))
    return [(at[s] + at[s + 1]) / 2 for s in range(0, max(slots, default=0), 2) if s in at and s + 1 in at]


def _log_mean(logs: list[float]) -> tuple[float, float]:
    """The mean of ``logs`` and two standard errors of it (a 95% interval; NaN from fewer than two)."""
    error = 2 * float(np.std(logs, ddof=1)) / np.sqrt(len(logs)) if len(logs) > 1 else float("nan")
    return float(np.mean(logs)), error


def lock_waits(buffers: list[ul.DeviceBuffer], flushes: int, ops: int = 120) -> dict[str, float]:
    """How often a view's update lets the interpreter's lock go: each of ``flushes`` updates (of ``ops`` operations'
    changes, a 20th of a second of the loop) made beside a thread of pure Python that never lets it go by itself.
    Each time the update lets it go, the spinner takes it and keeps it until it is asked for it, a switch interval
    later: the update's wall time less its CPU, in switch intervals, counts those times. Alternate updates are made
    alone, for their quiet CPU."""
    from uvm_lab.jupyter.comm import PanelSession

    session = PanelSession(CountingComm(), start=False)
    session.handle({"type": "hello", "seq": 0})
    session.handle({"type": "watch", "seq": 1, "ids": [b.id for b in buffers[:ON_SCREEN]]})
    for k in range(5):
        loop(buffers, ops, seed=k)
        session.flush()
    spinning = threading.Event()
    walls, cpus, quiet = [], [], []

    def spin() -> None:
        while spinning.is_set():
            pass

    for k in range(2 * flushes):
        loop(buffers, ops, seed=100 + k)
        if k % 2:
            started = time.thread_time()
            session.flush()
            quiet.append(time.thread_time() - started)
            continue
        spinning.set()
        spinner = threading.Thread(target=spin)
        spinner.start()
        time.sleep(0.01)
        wall, cpu = time.perf_counter(), time.thread_time()
        session.flush()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.thread_time() - cpu)
        spinning.clear()
        spinner.join()
    session.close()
    wall, cpu = statistics.mean(walls), statistics.mean(cpus)
    return {"ops": ops, "quiet_cpu_ms": statistics.mean(quiet) * 1e3, "beside_cpu_ms": cpu * 1e3,
            "beside_wall_ms": wall * 1e3, "lock_let_go": (wall - cpu) / sys.getswitchinterval()}


def read_costs(buffers: list[ul.DeviceBuffer], pairs: int, ops: int = 600) -> dict[str, dict[str, float]]:
    """Which of an update's reads slows the loop's own work: ``pairs`` pairs of blocks of ``ops`` operations, one with
    a thread that makes one read every update interval and one without (in turn first), for each read: the shown
    maps read again where they changed (``maps``), the loop's records read into the timeline window (``read_in``),
    and 0.8 ms of pure Python (``busy``). Per read, the loop thread's CPU an operation and its seconds against the
    block without, with 95% intervals, and the reader's share of a core."""
    from uvm_lab.jupyter.comm import UPDATE_INTERVAL
    from uvm_lab.jupyter.dashboard.collect import LiveAllocations
    from uvm_lab.jupyter.timeline import release_shared, shared

    window, _ = shared()   # fed in every block, as a paused view's is: what differs is the reads
    shown = frozenset(b.id for b in buffers[:ON_SCREEN])
    live = LiveAllocations()
    cursor = 0

    def maps() -> None:
        live.refresh(shown, 0)

    def read_in() -> None:
        nonlocal cursor
        cursor, _ = window.changed_lanes(cursor)

    reads = {"maps": maps, "read_in": read_in, "busy": lambda: Busy.piece(False, seconds=0.0008)}
    logs: dict[str, list[tuple[float, float]]] = {name: [] for name in reads}
    shares: dict[str, list[float]] = {name: [] for name in reads}
    try:
        for pair in range(-1, pairs):   # the first round unrecorded: each read's first time costs more
            for name, read in reads.items():
                block: dict[bool, tuple[float, float]] = {}
                for reading in ((True, False), (False, True))[pair % 2]:
                    reset(buffers)
                    maps()   # caught up, so that a block's reads are its own operations'
                    read_in()
                    stop, spent = threading.Event(), [0.0]

                    def reader(read: Callable[[], None] = read, stop: threading.Event = stop,
                               spent: list[float] = spent) -> None:
                        while not stop.wait(UPDATE_INTERVAL):
                            started = time.thread_time()
                            read()
                            spent[0] += time.thread_time() - started

                    thread = threading.Thread(target=reader) if reading else None
                    if thread is not None:
                        thread.start()
                    cpu, wall = time.thread_time(), time.perf_counter()
                    loop(buffers, ops, seed=10_000 + pair)
                    block[reading] = (time.thread_time() - cpu, time.perf_counter() - wall)
                    if thread is not None:
                        stop.set()
                        thread.join()
                        shares[name].append(spent[0] / block[True][1])
                if pair < 0:
                    shares[name].clear()
                    continue
                logs[name].append((float(np.log(block[True][0] / block[False][0])),
                                   float(np.log(block[True][1] / block[False][1]))))
    finally:
        release_shared()
    out = {}
    for name, pairs_logs in logs.items():
        (cpu_mean, cpu_error), (mean, error) = (_log_mean([p[i] for p in pairs_logs]) for i in (0, 1))
        out[name] = {"pairs": pairs, "ops_per_block": ops, "reader_cpu_share": float(np.mean(shares[name])),
                     "loop_cpu_ratio": float(np.exp(cpu_mean)),
                     "loop_cpu_ratio_low": float(np.exp(cpu_mean - cpu_error)),
                     "loop_cpu_ratio_high": float(np.exp(cpu_mean + cpu_error)), "ratio": float(np.exp(mean)),
                     "ratio_low": float(np.exp(mean - error)), "ratio_high": float(np.exp(mean + error))}
    return out


def publish_cost(buffers: list[ul.DeviceBuffer], rounds: int) -> dict[str, float]:
    """What a paused view adds to each of the loop's publishes, on the loop's thread: the batches 200 of the loop's
    operations publish, captured and published again ``rounds`` times with nothing attached and with a paused view
    (the best round of each, in CPU time per batch)."""
    bus = get_bus()
    batches: list[np.ndarray] = []
    publish = bus.publish
    bus.publish = lambda records: (batches.append(records.copy()), publish(records))[1]   # type: ignore[method-assign]
    try:
        loop(buffers, 200, seed=0)
    finally:
        del bus.publish   # the bound method again

    def best() -> float:
        times = []
        for _ in range(rounds):
            started = time.thread_time()
            for batch in batches:
                bus.publish(batch)
            times.append((time.thread_time() - started) / len(batches))
        return min(times) * 1e6

    alone = best()
    attached = Attached("paused", buffers, settle=0.2)
    try:
        paused = best()
    finally:
        attached.close()
    return {"batches": len(batches), "records_per_batch": sum(map(len, batches)) / len(batches),
            "alone_us": alone, "paused_view_us": paused}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--modes", default="none,view,panel,dashboard")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--pairs", type=int, default=0,
                        help="then this many pairs of short blocks, with and without each of view and dashboard "
                             "among --modes (see alternating)")
    parser.add_argument("--block-ops", type=int, default=400)
    parser.add_argument("--concurrent", type=int, default=0, metavar="PROCESSES",
                        help="then, for each of view and dashboard among --modes, this many processes side by side "
                             "(an even number; see concurrent)")
    parser.add_argument("--baseline", default="none",
                        help="what the other half of --concurrent has attached: none, one of the modes, or closed "
                             "(the mode itself, opened and closed before each slot): the attaching half's history, "
                             "so that the two differ only in what is attached while the loop runs")
    parser.add_argument("--slots", type=int, default=40)
    parser.add_argument("--slot-seconds", type=float, default=3.0)
    parser.add_argument("--pin", nargs="?", const="apart", choices=("apart", "together"), default=None,
                        help="--concurrent: each process's loop thread on a core of its own and its other threads on "
                             "one more (apart, the default), so that a thread that sleeps wakes where it ran; or every "
                             "thread of a process on one core (together), so that no cache line they share moves "
                             "between cores")
    parser.add_argument("--switch-interval", type=float, default=None, metavar="SECONDS",
                        help="--concurrent: the switch interval a view or live dashboard holds while open, instead of "
                             "uvm_lab's (an ablation)")
    parser.add_argument("--publish-cost", type=int, default=0, metavar="ROUNDS",
                        help="then what a paused view adds to each publish of the loop's (see publish_cost)")
    parser.add_argument("--reads", type=int, default=0, metavar="PAIRS",
                        help="then which of an update's reads slows the loop's own work (see read_costs)")
    parser.add_argument("--lock-waits", type=int, default=0, metavar="UPDATES",
                        help="then this many of the view's updates beside a pure-Python thread (see lock_waits)")
    args = parser.parse_args()
    modes = args.modes.split(",")
    known = ("none", "panel", "subscriber", *COSTED)
    if unknown := [mode for mode in modes if mode not in known]:
        raise SystemExit(f"--modes takes {', '.join(known)}; not {', '.join(map(repr, unknown))}")
    if args.switch_interval is not None and not 1e-6 <= args.switch_interval <= 1.0:
        raise SystemExit(f"--switch-interval takes seconds from 1e-6 to 1, not {args.switch_interval}")

    ul.use_backend("sim", device_memory="80GiB")
    buffers = [ul.DeviceBuffer(size=SIZE, label=f"b{i}") for i in range(ALLOCATIONS)]
    pages = sum(b.size for b in buffers) // 4096
    # What was made to set up (the simulator, 1,000 buffers and their maps) is kept out of the collector's later
    # passes: a full pass over it lands in whichever block it falls in, tens of ms, and it is no one's cost.
    gc.collect()
    gc.freeze()
    print(f"{len(buffers)} allocations, {pages / 1e6:.1f} M pages; {args.ops} operations a run", flush=True)
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    for r in range(args.repeats):
        for mode in modes:   # interleaved: the machine's drift falls on every mode alike
            for buf in buffers:   # every run starts from the same map: each page written on the host
                ul.touch(buf, on="host", mode="write")
            runs[mode].append(measure(mode, buffers, args.ops, seed=r))
            # Each run as it ends: a run cut short by a time limit still leaves what it measured.
            done = runs[mode][-1]
            print(f"run {r + 1}/{args.repeats} {mode:10} {done['seconds']:.3f} s, loop thread "
                  f"{done['loop_cpu_s']:.3f} s, other threads {done['other_threads_cpu_s']:.3f} s", flush=True)

    runs = {mode: results for mode, results in runs.items() if results}   # none with --repeats 0 (--pairs alone)
    base = min(run["seconds"] for run in runs["none"]) if "none" in runs else None
    # The CPU the whole process spent on the loop (its thread's and the view's threads'), against the loop alone:
    # less noisy than its seconds where other machines' work shares the cores.
    base_cpu = statistics.median(run["loop_cpu_s"] for run in runs["none"]) if "none" in runs else None
    for results in runs.values():
        for run in results:
            if base_cpu:
                run["cpu_vs_none"] = (run["loop_cpu_s"] + run["other_threads_cpu_s"]) / base_cpu
    # Each run against the loop alone with the same seed (the same operations, right before it): the median of
    # these pairs is steadier than best against best when the loop's own time moves between runs.
    for results in runs.values():
        for run, alone in zip(results, runs.get("none", ()), strict=False):
            run["paired_vs_none"] = run["seconds"] / alone["seconds"]
    print(f"\n{'mode':12} {'best s':>8} {'median s':>9} {'vs none':>8}  extra")
    table = {}
    for mode, results in runs.items():
        times = [run["seconds"] for run in results]
        best, median = min(times), statistics.median(times)
        extra = {k: statistics.median(run[k] for run in results) for k in results[0] if k != "seconds"}
        table[mode] = {"best_s": best, "median_s": median, **extra}
        ratio = f"{best / base:.3f}x" if base else "-"
        shown = ", ".join(f"{k} {v:,.3f}" if k.endswith(("share", "vs_none")) else
                          f"{k} {v:,.1f}" if k.endswith(("_ms", "_s")) else f"{k} {v:,.0f}" for k, v in extra.items())
        print(f"{mode:12} {best:8.3f} {median:9.3f} {ratio:>8}  {shown}")
    if args.pairs:
        print(f"\n{'mode':12} {'pairs':>6} {'ops':>5} {'vs none':>8} {'95% interval':>16} {'median':>8}")
        for mode in (m for m in modes if m in COSTED):
            cost = table.setdefault(f"{mode}_alternating", alternating(mode, buffers, args.pairs, args.block_ops))
            print(f"{mode:12} {args.pairs:6} {args.block_ops:5} {cost['ratio']:7.3f}x "
                  f"{cost['ratio_low']:7.3f}-{cost['ratio_high']:.3f}x {cost['median_ratio']:7.3f}x", flush=True)
    if args.concurrent:
        against = f"vs {args.baseline}"
        print(f"\n{'mode':12} {'procs':>6} {'slots':>6} {against:>8} {'95% interval':>16} {'median':>8} "
              f"{'its threads':>12} {'updates':>11} {'loop CPU':>9}")
        pinned = {"apart": "_pinned", "together": "_pinned_together"}.get(args.pin or "", "")
        suffix = ("" if args.baseline == "none" else f"_vs_{args.baseline}") + pinned + \
            ("" if args.switch_interval is None else f"_switch_{args.switch_interval:g}")
        for mode in (m for m in modes if m in COSTED and m != args.baseline):
            cost = table.setdefault(f"{mode}{suffix}_concurrent", concurrent(
                mode, args.concurrent, args.slots, args.slot_seconds, settle_s=1.0, baseline=args.baseline,
                pin=args.pin, switch=args.switch_interval))
            print(f"{mode:12} {args.concurrent:6} {args.slots:6} {cost['ratio']:7.3f}x "
                  f"{cost['ratio_low']:7.3f}-{cost['ratio_high']:.3f}x {cost['median_ratio']:7.3f}x "
                  f"{cost['other_threads_cpu_share']:11.1%} {cost['refreshes_per_s']:9.1f}/s "
                  f"{cost['loop_cpu_ratio']:8.3f}x  "
                  f"({cost['slots_counted']} slots counted, "
                  f"{cost['worker_slots_left_out']} worker-slots left out)", flush=True)
            system, waits, off = cost["loop_system_us_per_op"], cost["loop_waits_per_s"], cost["loop_off_cpu_share"]
            print(f"{'':12} the loop's thread: {system[mode]:.1f} us an operation in the kernel against "
                  f"{system[args.baseline]:.1f}, slept {waits[mode]:.0f} times a second against "
                  f"{waits[args.baseline]:.0f}, off the CPU {off[mode]:.2%} of its time against "
                  f"{off[args.baseline]:.2%}", flush=True)
    if args.lock_waits:
        waits = table["lock_waits"] = lock_waits(buffers, args.lock_waits)
        print(f"\nan update of {waits['ops']} operations' changes: {waits['quiet_cpu_ms']:.2f} ms of CPU alone; beside "
              f"a pure-Python thread {waits['beside_cpu_ms']:.2f} ms of CPU in {waits['beside_wall_ms']:.1f} ms, "
              f"the lock let go about {waits['lock_let_go']:.1f} times", flush=True)
    if args.reads:
        print(f"\n{'read':8} {'pairs':>6} {'its CPU':>8} {'loop CPU an op':>22} {'loop seconds':>22}")
        for name, cost in read_costs(buffers, args.reads).items():
            table[f"read_{name}"] = cost
            print(f"{name:8} {cost['pairs']:6} {cost['reader_cpu_share']:8.1%} {cost['loop_cpu_ratio']:7.3f}x "
                  f"({cost['loop_cpu_ratio_low']:.3f}-{cost['loop_cpu_ratio_high']:.3f}x) {cost['ratio']:7.3f}x "
                  f"({cost['ratio_low']:.3f}-{cost['ratio_high']:.3f}x)", flush=True)
    if args.publish_cost:
        cost = table["publish_cost"] = publish_cost(buffers, args.publish_cost)
        print(f"\na publish of {cost['records_per_batch']:.1f} records: {cost['alone_us']:.1f} us of the loop's CPU "
              f"alone, {cost['paused_view_us']:.1f} us with a paused view attached", flush=True)
    if args.json:
        args.json.write_text(_to_json(table))


if __name__ == "__main__":
    main()
