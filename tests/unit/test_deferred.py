"""Deferred work (frees that garbage collection asks for) runs soon, off every lock, and run() waits for it."""

from __future__ import annotations

import threading

import uvm_lab as ul
from uvm_lab import deferred


def test_run_returns_only_after_work_the_worker_already_took():
    started, release = threading.Event(), threading.Event()
    done: list[str] = []

    def give_back() -> None:
        started.set()
        release.wait(10)
        done.append("given back")

    deferred.defer(give_back)
    assert started.wait(10), "the worker thread never ran the deferred work"
    # The worker is inside give_back now; run() finds the queue empty but must still wait for it.
    threading.Timer(0.05, release.set).start()
    deferred.run()
    assert done == ["given back"]


def test_run_runs_what_is_queued_in_order():
    done: list[int] = []
    with deferred._running:                  # keep the worker out, so this thread runs them
        for i in range(5):
            deferred.defer(done.append, i)
        deferred.run()
    assert done == [0, 1, 2, 3, 4]


def test_a_recording_begins_after_the_frees_already_owed():
    buf = ul.DeviceBuffer(size=1 << 20)
    with deferred._running:                  # keep the worker out: the free stays owed until record() begins
        del buf
        with ul.record() as trace:
            deferred.run()                   # the worker's next round, inside the recording
    assert len(trace.events) == 0, trace.to_pandas()
