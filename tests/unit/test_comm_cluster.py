"""The lab view's session and a Dask cluster: a real distributed.LocalCluster of two process workers on simulated
GPUs, the kernel's ClusterMonitor published to the session (uvm_lab.cluster_feed), every worker x GPU in its
``cluster`` messages, and a worker's buffers, timeline and commands routed to the worker that owns them."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import types

import numpy as np
import pytest

distributed = pytest.importorskip("distributed")

import uvm_lab as ul  # noqa: E402
from uvm_lab import cluster_feed  # noqa: E402
from uvm_lab.dask import ClusterMonitor, UvmLab  # noqa: E402
from uvm_lab.events import EventKind  # noqa: E402
from uvm_lab.jupyter.comm import CLUSTER_INTERVAL, PanelSession  # noqa: E402
from uvm_lab.jupyter.protocol import MAX_CLUSTER_WORKERS, TIMELINE_COLUMNS  # noqa: E402
from uvm_lab.jupyter.timeline import DeviceSeries, EventWindow  # noqa: E402

from .clocks import ManualClock  # noqa: E402
from .test_comm import RecordingComm  # noqa: E402
from .test_dask import PAGES, hold_buffer, until  # noqa: E402

MiB = 2**20


@pytest.fixture(scope="module")
def cluster():
    """Two workers of two simulated GPUs each, each holding an 8 MiB buffer on GPU 1: (client, monitor, {worker:
    buffer id})."""
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  worker_dashboard_address=None) as local, distributed.Client(local) as client:
        monitor = ClusterMonitor(client)
        client.register_plugin(UvmLab(backend="sim", devices=2, device_memory="256MiB", interval=0.05))
        until(lambda: len([w for w in monitor.workers().values() if w.last is not None]) == 2, "both workers report")
        held = {w: client.submit(hold_buffer, f"held on {w}", workers=[w], pure=False).result()
                for w in sorted(monitor.workers())}
        for worker in held:
            until(lambda w=worker: any(r["worker"] == w and r["gpu"] == 1 and r["pages"] == PAGES
                                       for r in monitor.rows()), f"{worker}'s buffer on gpu:1")
        yield client, monitor, held
        monitor.close()


@pytest.fixture
def session(cluster):
    """A view's session on its own clock, its snapshot sent: what the kernel sends is in ``session.comm``."""
    ul.use_backend("sim", device_memory="1GiB")
    clock = ManualClock()
    s = PanelSession(RecordingComm(), start=False, timeline=(EventWindow(), DeviceSeries(clock=ManualClock())),
                     clock=clock)
    s.comm.deliver({"type": "hello", "seq": 1})
    yield types.SimpleNamespace(session=s, comm=s.comm, clock=clock)
    s.close()


def next_cluster(view) -> dict:
    """The cluster message the session sends once its turn comes (the feed changes ten times a second)."""
    def sent():
        before = len(view.comm.of_type("cluster"))
        view.clock.advance(CLUSTER_INTERVAL)
        view.session.flush()
        return view.comm.of_type("cluster")[before:]
    return until(sent, "a cluster message")[-1][0]


def devices_of(message: dict, worker: str) -> list[dict]:
    return next(w for w in message["workers"] if w["address"] == worker)["devices"]


def ask(view, command: dict) -> tuple[list, dict]:
    """Deliver ``command``; what the session sent for it, and its result."""
    before = len(view.comm.messages)
    view.comm.deliver(command)
    sent = view.comm.messages[before:]
    results = [d for d, _ in sent if d["type"] == "result"]
    assert len(results) == 1 and results[0]["seq"] == command.get("seq")
    return [(d, b) for d, b in sent if d["type"] != "result"], results[0]


# -- what the view is sent --------------------------------------------------------------------------------------


def test_a_view_is_shown_every_worker_and_gpu_at_its_snapshot(session, cluster):
    _, monitor, held = cluster
    sent = [d["type"] for d, _ in session.comm.messages if d["type"] != "experiment"]   # one an earlier test made
    assert sent == ["snapshot", "cluster", "result"]
    [(message, buffers)] = session.comm.of_type("cluster")
    assert buffers == [] and message["workers_left_out"] == 0
    assert [w["address"] for w in message["workers"]] == list(monitor.workers())   # in the order they joined
    assert sorted(w["address"] for w in message["workers"]) == sorted(held)
    for worker in message["workers"]:
        assert worker["state"] == "live" and worker["backend"] == "sim" and worker["gpus"] == 2
        assert worker["buffers"] >= 1 and worker["allocated"] >= 8 * MiB and worker["events"] > 0
        assert worker["lost"] == 0 and worker["latency_ms"] >= 0
        gpu0, gpu1 = worker["devices"]
        assert (gpu0["gpu"], gpu1["gpu"]) == (0, 1)
        assert gpu0["total"] == gpu1["total"] == 256 * MiB
        assert gpu1["pages"] == PAGES and gpu0["pages"] == 0   # the buffer, on GPU 1
        assert gpu1["dtod_bytes"] >= 8 * MiB and gpu0["gpu_faults"] >= PAGES   # touched on GPU 0, moved to GPU 1
    assert len(json.dumps(message)) < 4000   # small JSON


def test_changes_reach_the_view_at_most_once_a_cluster_interval(session, cluster):
    client, monitor, held = cluster
    worker = sorted(held)[0]
    sent = len(session.comm.of_type("cluster"))
    messages = monitor.messages
    client.submit(hold_buffer, "another", workers=[worker], pure=False).result()
    until(lambda: monitor.messages > messages, "the feed changes")
    session.session.flush()
    assert len(session.comm.of_type("cluster")) == sent, "before its turn (the session's clock stands still)"
    message = next_cluster(session)
    until(lambda: devices_of(next_cluster(session), worker)[1]["pages"] == 2 * PAGES, "the new buffer's pages")
    assert devices_of(message, worker)[1]["total"] == 256 * MiB


# -- what the view asks of a worker --------------------------------------------------------------------------------


def test_a_workers_buffers_are_listed(session, cluster):
    _, _, held = cluster
    for worker, buffer_id in held.items():
        [(answer, buffers)], result = ask(session, {"type": "worker_buffers", "seq": 5, "worker": worker})
        assert result["ok"] is True and result["command"] == "worker_buffers" and buffers == []
        assert answer["type"] == "worker_buffers" and answer["seq"] == 5 and answer["worker"] == worker
        assert answer["truncated"] is False
        [mine] = [b for b in answer["buffers"] if b["id"] == buffer_id]
        assert mine == {"id": buffer_id, "label": f"held on {worker}", "size": 8 * MiB, "is_managed": True,
                        "copies": {"gpu:1": PAGES}, "unknown": 0}


def test_a_workers_timeline_comes_as_the_panels_columns_with_the_peer_migration(session, cluster):
    _, _, held = cluster
    worker = sorted(held)[1]
    [(rows, buffers)], result = ask(session, {"type": "worker_timeline", "seq": 7, "worker": worker, "start": 0,
                                              "end": 2**53 - 1, "width": 1000})
    assert result["ok"] is True
    assert rows["type"] == "worker_timeline" and rows["seq"] == 7 and rows["worker"] == worker
    assert rows["columns"] == [name for name, _ in TIMELINE_COLUMNS] and len(buffers) == len(TIMELINE_COLUMNS)
    columns = {name: np.frombuffer(data, dtype) for (name, dtype), data in zip(TIMELINE_COLUMNS, buffers, strict=True)}
    assert rows["rows"] == len(columns["kind"]) > 0 and rows["first"] <= rows["last"]
    peer = columns["kind"] == EventKind.DTOD
    assert peer.any(), "the prefetch from GPU 0 to GPU 1 is a DtoD row"
    assert set(columns["src"][peer].tolist()) == {0} and set(columns["dst"][peer].tolist()) == {1}
    assert held[worker] in set(columns["lane"][peer].astype(int).tolist())
    json.dumps(rows)


def test_a_prefetch_goes_to_the_worker_that_owns_the_buffer(session, cluster):
    _, _, held = cluster
    worker, other = sorted(held)
    before = next_cluster(session)
    mine, others = devices_of(before, worker), devices_of(before, other)
    _, result = ask(session, {"type": "worker_command", "seq": 9, "worker": worker, "command": {
        "type": "prefetch", "seq": 0, "id": held[worker], "location": "gpu:0", "first_page": 0, "pages": None}})
    assert result == {"type": "result", "seq": 9, "command": "worker_command", "ok": True, "error": None}
    # The worker's next delta says so: its pages are on GPU 0 now; the other worker's stayed where they were.
    message = until(lambda: (m := next_cluster(session)) and devices_of(m, worker)[0]["pages"] ==
                    mine[0]["pages"] + PAGES and m, "the pages on gpu:0")
    assert devices_of(message, worker)[1]["pages"] == mine[1]["pages"] - PAGES
    assert [d["pages"] for d in devices_of(message, other)] == [d["pages"] for d in others]
    [(answer, _)], _ = ask(session, {"type": "worker_buffers", "seq": 10, "worker": worker})
    assert [b["copies"] for b in answer["buffers"] if b["id"] == held[worker]] == [{"gpu:0": PAGES}]


def test_a_freed_buffer_is_a_typed_error_in_the_result(session, cluster):
    _, _, held = cluster
    worker = sorted(held)[0]
    sent, result = ask(session, {"type": "worker_command", "seq": 11, "worker": worker, "command": {
        "type": "set_advice", "seq": 0, "id": 999999, "advice": "read_mostly", "value": True}})
    assert sent == [] and result["ok"] is False and result["command"] == "worker_command"
    assert result["error"]["type"] == "InvalidArgumentError" and "999999" in result["error"]["message"]


def test_an_unknown_worker_is_named_in_the_error(session, cluster):
    _, result = ask(session, {"type": "worker_buffers", "seq": 12, "worker": "tcp://nowhere:1"})
    assert result["error"]["type"] == "InvalidArgumentError" and "no worker 'tcp://nowhere:1'" in result["error"][
        "message"]


PREFETCH = {"type": "prefetch", "seq": 0, "id": 1, "location": "host", "first_page": 0, "pages": None}


@pytest.mark.parametrize(("command", "mentions"), [
    ({"worker": "W", "command": {**PREFETCH, "location": "tpu"}}, "prefetch location must be"),
    ({"worker": "W", "command": {**PREFETCH, "type": "evict"}}, "carries prefetch or set_advice, got 'evict'"),
    ({"worker": "W", "command": {"type": "pause", "seq": 0, "paused": True}}, "got 'pause'"),
    ({"worker": 3, "command": PREFETCH}, "worker must be a worker's address"),
    ({"worker": ["W"], "command": PREFETCH}, "got ['W']"),
    ({"worker": "W", "command": {**PREFETCH, "code": "import os"}}, "unexpected field 'code'"),
    ({"worker": "W"}, "missing field 'command'"),
])
def test_a_malformed_worker_command_reaches_no_worker(session, cluster, monkeypatch, command, mentions):
    client, monitor, held = cluster
    reached = []
    for target, name in ((client, "run"), (monitor, "command"), (monitor, "timeline"), (monitor, "buffers")):
        monkeypatch.setattr(target, name, lambda *a, _name=name, **k: reached.append(_name))
    command = {"type": "worker_command", "seq": 13, **command}
    if command.get("worker") == "W":
        command["worker"] = sorted(held)[0]
    sent, result = ask(session, command)
    assert sent == [] and result["ok"] is False
    assert result["error"]["type"] == "ProtocolError" and mentions in result["error"]["message"]
    assert reached == []


def test_without_a_monitor_the_view_is_told_and_worker_commands_say_why(session, cluster):
    _, monitor, held = cluster
    cluster_feed.withdraw(monitor)
    try:
        message = next_cluster(session)
        assert message == {"type": "cluster", "workers": [], "workers_left_out": 0}   # the view hides its section
        _, result = ask(session, {"type": "worker_buffers", "seq": 14, "worker": sorted(held)[0]})
        assert result["error"]["type"] == "InvalidStateError" and "ClusterMonitor" in result["error"]["message"]
    finally:
        cluster_feed.publish(monitor)
    assert next_cluster(session)["workers"]


def test_a_dead_worker_is_marked_gone_and_refuses_commands(session, cluster):
    client, _, held = cluster
    victim, survivor = sorted(held)
    with contextlib.suppress(Exception):   # it dies before it can answer: that is the point
        client.run(os._exit, 1, workers=[victim])
    message = until(lambda: (m := next_cluster(session)) and any(
        w["address"] == victim and w["state"] == "gone" for w in m["workers"]) and m, "the dead worker marked gone")
    states = {w["address"]: w["state"] for w in message["workers"]}
    assert states[survivor] == "live"
    assert len(devices_of(message, victim)) == 2   # its last picture stays
    _, result = ask(session, {"type": "worker_buffers", "seq": 15, "worker": victim})
    assert result["error"]["type"] == "InvalidStateError" and "is gone" in result["error"]["message"]


# -- the bound, and the feed -----------------------------------------------------------------------------------


class _ManyWorkers:
    """A monitor's reading side, with ``n`` workers of one GPU; the first ``gone`` of them gone."""

    def __init__(self, n: int, gone: int) -> None:
        self._workers = {f"tcp://w{i}:1": types.SimpleNamespace(
            address=f"tcp://w{i}:1", name=str(i), state="gone" if i < gone else "live", backend="sim", gpus=1,
            latency_ms=1.0) for i in range(n)}

    def workers(self):
        return dict(self._workers)

    def rows(self):
        return [{"worker": a, "gpu": 0, "state": w.state, "used": 0, "total": 1, "pages": 0, "htod_bytes": 0,
                 "dtoh_bytes": 0, "dtod_bytes": 0, "gpu_faults": 0, "evicted_bytes": 0, "events": 0, "cpu_faults": 0,
                 "allocated": 0, "buffers": 0, "lost": 0} for a, w in self._workers.items()]


def test_a_cluster_message_carries_at_most_its_bound_those_gone_longest_left_out_first():
    previous = cluster_feed.current()
    cluster_feed.publish(_ManyWorkers(MAX_CLUSTER_WORKERS + 4, gone=10))
    s = PanelSession(RecordingComm(), start=False, timeline=(EventWindow(), DeviceSeries(clock=ManualClock())),
                     clock=ManualClock())
    try:
        s.comm.deliver({"type": "hello", "seq": 1})
        [(message, _)] = s.comm.of_type("cluster")
    finally:
        s.close()
        cluster_feed.publish(previous)
    names = [w["name"] for w in message["workers"]]
    assert len(names) == MAX_CLUSTER_WORKERS and message["workers_left_out"] == 4
    assert names[:6] == ["4", "5", "6", "7", "8", "9"]   # gone 0 to 3 left out; the rest in the order they joined


def test_the_feed_tells_its_subscribers_of_the_monitor_shown_only(caplog):
    previous = cluster_feed.current()
    told = []
    shown, other = object(), object()
    unsubscribe = cluster_feed.subscribe(lambda: told.append("a"))

    def failing():
        raise RuntimeError("a broken view")

    unsubscribe_failing = cluster_feed.subscribe(failing)
    try:
        with caplog.at_level(logging.ERROR, logger="uvm_lab.cluster_feed"):
            cluster_feed.publish(shown)
        assert told == ["a"] and "a view failed" in caplog.text   # the broken one is logged, the others told
        cluster_feed.changed(other)   # not the one shown: nobody is woken for it
        cluster_feed.withdraw(other)
        assert told == ["a"] and cluster_feed.current() is shown
        cluster_feed.changed(shown)
        cluster_feed.withdraw(shown)
        assert told == ["a", "a", "a"] and cluster_feed.current() is None
        unsubscribe()
        cluster_feed.publish(shown)
        assert told == ["a", "a", "a"]
    finally:
        unsubscribe()
        unsubscribe_failing()
        cluster_feed.publish(previous)


def test_the_views_comm_imports_no_dask():
    code = "import sys, uvm_lab.jupyter.comm, uvm_lab.cluster_feed; print('distributed' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
