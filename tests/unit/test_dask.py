"""uvm_lab.dask on a real distributed.LocalCluster: worker processes on simulated GPUs, the client's picture of
every worker x GPU, commands routed to the worker that owns a buffer, and workers that die or restart."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import time
import urllib.request

import numpy as np
import pytest

distributed = pytest.importorskip("distributed")

from uvm_lab.dask import ClusterMonitor, ClusterPage, UvmLab, wire  # noqa: E402
from uvm_lab.dask.page import render  # noqa: E402
from uvm_lab.errors import InvalidArgumentError, InvalidSizeError, InvalidStateError, ProtocolError  # noqa: E402
from uvm_lab.events import EventKind  # noqa: E402

MiB = 2**20
PAGES = 8 * MiB // 4096


def hold_buffer(label: str) -> int:
    """A task: make an 8 MiB managed buffer, touch it on GPU 0, prefetch it to GPU 1, and keep it on the worker."""
    import uvm_lab as ul

    buf = ul.DeviceBuffer(size="8MiB", label=label)
    ul.touch(buf, on="gpu:0")
    buf.prefetch("gpu:1")
    worker = distributed.get_worker()
    worker.__dict__.setdefault("uvm_lab_test_buffers", []).append(buf)
    return int(buf.id)


def until(condition, what: str, timeout: float = 60.0):
    """Wait for ``condition()`` to hold (a cluster answers when it answers); fail naming ``what`` if it never does."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"never saw {what}")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                                  worker_dashboard_address=":0") as local, distributed.Client(local) as client:
        monitor = ClusterMonitor(client)
        client.register_plugin(ClusterPage())   # Dask's dashboard's page, before the workers say they joined
        client.register_plugin(UvmLab(backend="sim", devices=2, device_memory="256MiB", interval=0.05))
        until(lambda: len([w for w in monitor.workers().values() if w.last is not None]) == 2, "both workers report")
        yield client, monitor
        monitor.close()


@pytest.fixture(scope="module")
def held(cluster):
    """The cluster, with one buffer made and kept by a task on each worker (:func:`hold_buffer`): each test that
    reads what tasks did asks for it, so it runs alone or in any order."""
    client, monitor = cluster
    for worker in sorted(monitor.workers()):
        client.submit(hold_buffer, f"held on {worker}", workers=[worker], pure=False).result()
    return client, monitor


def rows_of(monitor: ClusterMonitor, worker: str) -> dict[int, dict]:
    return {row["gpu"]: row for row in monitor.rows() if row["worker"] == worker}


# -- the wire ---------------------------------------------------------------------------------------------------


def test_a_delta_reads_back_as_it_was_sent():
    rows = np.zeros(2, dtype=wire.ROW)
    rows["used"], rows["total"], rows["dtod_bytes"] = [1, 2], [10, 20], [0, 4096]
    data = wire.encode({"seq": 7, "events": 3, "wall_ms": 1.5}, rows)
    assert len(data) == wire.HEADER.itemsize + 2 * wire.ROW.itemsize
    delta = wire.decode(data)
    assert delta.seq == 7 and delta.header["events"] == 3 and delta.header["wall_ms"] == 1.5
    assert delta.rows["dtod_bytes"].tolist() == [0, 4096] and delta.rows["total"].tolist() == [10, 20]


@pytest.mark.parametrize("data", [b"", b"x" * 10, "text", None])
def test_what_is_not_a_delta_is_a_protocol_error(data):
    with pytest.raises(ProtocolError, match="a delta is at least"):
        wire.decode(data)


def test_a_delta_of_another_version_or_length_is_refused():
    data = bytearray(wire.encode({"seq": 1}, np.zeros(1, dtype=wire.ROW)))
    with pytest.raises(ProtocolError, match="2 GPUs is"):
        wire.decode(bytes(data[:2]) + bytes([2, 0]) + bytes(data[4:]))   # says 2 GPUs, carries 1
    data[0] = 9
    with pytest.raises(ProtocolError, match="delta version 9"):
        wire.decode(bytes(data))


# -- the plugin's options ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("options", "error", "match"), [
    ({"backend": "tpu"}, InvalidArgumentError, "backend must be"),
    ({"devices": 2}, InvalidArgumentError, "describe simulated GPUs"),
    ({"managed_memory": "yes"}, InvalidArgumentError, "managed_memory must be True or False"),
    ({"pool_size": "12 parsecs"}, InvalidSizeError, "parsecs"),
    ({"maximum_pool_size": "1GiB"}, InvalidArgumentError, "give pool_size as well"),
    ({"allocators": ["jax"]}, InvalidArgumentError, "allocators must be a list of cupy, numba, torch"),
    ({"interval": 0}, InvalidArgumentError, "interval must be from"),
])
def test_bad_plugin_options_are_typed_errors_before_any_worker_sees_them(options, error, match):
    with pytest.raises(error, match=match):
        UvmLab(**options)


def test_the_plugin_says_what_it_was_given():
    assert repr(UvmLab(backend="sim", devices=2)) == ("UvmLab(backend='sim', devices=2, managed_memory=True, "
                                                      "prefetch=False)")


# -- a cluster ----------------------------------------------------------------------------------------------------


def test_every_worker_and_gpu_shows_what_its_tasks_did(held):
    _, monitor = held
    workers = sorted(monitor.workers())
    for worker in workers:
        lanes = monitor.workers()[worker]
        assert lanes.backend == "sim" and lanes.gpus == 2 and lanes.state == "live"
        assert lanes.routed == {"cupy": "not routed: the simulator's addresses are not memory",
                                "numba": "not routed: the simulator's addresses are not memory",
                                "torch": "not routed: the simulator's addresses are not memory"}
        # Its pages are on GPU 1 now, moved there from GPU 0 where they were touched first.
        rows = until(lambda w=worker: (r := rows_of(monitor, w)) and r[1]["pages"] == PAGES and r, f"{worker} on gpu:1")
        assert rows[0]["pages"] == 0
        assert rows[0]["gpu_faults"] >= PAGES   # every page faulted on GPU 0 first (this worker's only buffer)
        assert rows[1]["dtod_bytes"] >= 8 * MiB and rows[0]["dtod_bytes"] == 0
        assert rows[1]["used"] >= 8 * MiB and rows[1]["total"] == 256 * MiB
        assert rows[1]["available"] == rows[1]["total"] - rows[1]["used"]
        assert rows[0]["buffers"] >= 1 and rows[0]["allocated"] >= 8 * MiB
        assert rows[0]["events"] > 0 and rows[0]["lost"] == 0 and rows[0]["dropped"] == 0
    table = monitor.table()
    assert len(table) == 2 * len(workers) and set(table["gpu"]) == {0, 1}


def test_a_workers_timeline_is_a_query_away_and_shows_the_peer_migration(held):
    _, monitor = held
    worker = sorted(monitor.workers())[0]
    until(lambda: rows_of(monitor, worker)[1]["pages"] == PAGES, f"{worker}'s buffer on gpu:1")
    rows, columns = monitor.timeline(worker, 0, 2**53 - 1, 1000)
    assert rows["rows"] == len(columns["kind"]) > 0
    peer = columns["kind"] == EventKind.DTOD
    assert peer.any(), "the prefetch from GPU 0 to GPU 1 is a DtoD row"
    assert set(columns["src"][peer].tolist()) == {0} and set(columns["dst"][peer].tolist()) == {1}


def test_a_command_reaches_the_worker_that_owns_the_buffer(held):
    _, monitor = held
    worker, other = sorted(monitor.workers())
    buffers = until(lambda: [b for b in monitor.buffers(worker) if b["label"] == f"held on {worker}"], "the buffer")
    assert buffers[0]["copies"] == {"gpu:1": PAGES}
    before = until(lambda: (r := rows_of(monitor, other)) and r[1]["pages"] == PAGES and r, f"{other} on gpu:1")
    monitor.prefetch(worker, buffers[0]["id"], "host")
    rows = until(lambda: (r := rows_of(monitor, worker)) and r[1]["pages"] == 0 and r, "the pages leave gpu:1")
    assert rows[1]["dtoh_bytes"] >= 8 * MiB
    assert [b["copies"] for b in monitor.buffers(worker) if b["id"] == buffers[0]["id"]] == [{"host": PAGES}]
    after = rows_of(monitor, other)
    assert after[1]["pages"] == before[1]["pages"] and after[1]["dtoh_bytes"] == before[1]["dtoh_bytes"]


def test_bad_commands_to_a_worker_are_typed_errors(cluster):
    _, monitor = cluster
    worker = sorted(monitor.workers())[0]
    with pytest.raises(InvalidArgumentError, match="no live buffer has id 999999"):
        monitor.prefetch(worker, 999999, "host")
    result = monitor.command(worker, {"type": "prefetch", "seq": 3, "id": 1, "location": "tpu", "first_page": 0,
                                      "pages": None})
    assert result["ok"] is False and result["seq"] == 3 and result["error"]["type"] == "ProtocolError"
    assert "location" in result["error"]["message"]
    result = monitor.command(worker, {"type": "pause", "seq": 4, "paused": True})
    assert result["error"]["type"] == "ProtocolError"
    assert "carries out prefetch and set_advice" in result["error"]["message"]
    with pytest.raises(InvalidArgumentError, match="no worker 'tcp://nowhere:1' here"):
        monitor.prefetch("tcp://nowhere:1", 1, "host")


def test_dasks_own_dashboard_has_a_page_of_every_worker_and_gpu(cluster):
    client, monitor = cluster
    base = client.dashboard_link.rsplit("/status", 1)[0]

    def page(suffix: str) -> str:
        with urllib.request.urlopen(f"{base}/uvm_lab{suffix}", timeout=30) as answer:
            return answer.read().decode()

    rows = until(lambda: (r := json.loads(page(".json"))["rows"]) and
                 sorted((x["worker"], x["gpu"], x["dtod_bytes"]) for x in r) ==
                 sorted((x["worker"], x["gpu"], x["dtod_bytes"]) for x in monitor.rows()) and r,
                 "the page's rows agree with the client's")
    assert len(rows) == 4 and {r["name"] for r in rows} == {"0", "1"}   # it saw them join
    text = page("")
    assert "uvm_lab: 2 worker(s), 4 GPU lane(s)" in text and text.count('<tr class="live">') == 4


def test_the_page_escapes_what_workers_send():
    row = {"name": "<script>x</script>", "worker": "tcp://a:1", "gpu": 0, "state": "gone", "used": 0, "total": 2**30,
           "htod_bytes": 0, "dtoh_bytes": 0, "dtod_bytes": 0, "gpu_faults": 0, "evicted_bytes": 0, "pages": 0,
           "events": 0, "lost": 0}
    text = render([row])
    assert "<script>x" not in text and "&lt;script&gt;" in text and '<tr class="gone">' in text


def test_the_cluster_dashboard_shows_every_worker_and_gpu_and_routes_its_prefetch(held):
    pytest.importorskip("ipywidgets")
    pytest.importorskip("bokeh")
    from uvm_lab.jupyter.dashboard.cluster import ClusterDashboard

    _, monitor = held
    workers = sorted(monitor.workers())
    board = ClusterDashboard(monitor, live=False)
    try:
        lanes = board.memory.data["lane"]
        assert len(lanes) == 2 * len(workers) and all(lane.endswith(("gpu:0", "gpu:1")) for lane in lanes)
        assert board.table.data["dtod_bytes"] == [r["dtod_bytes"] for r in monitor.rows()]
        assert "2 live worker(s)" in board.header.value
        board.worker.value = workers[1]
        assert [b for _, b in board.buffer.options], "the worker's buffers are listed"
        assert list(board.location.options) == ["host", "gpu:0", "gpu:1"]
        board.draw_timeline()
        assert "DtoD (peer)" in board.events.data["kind"]
        board.buffer.options = [("gone", 999999)]
        board.buffer.value = 999999   # a buffer freed since it was listed
        result = board.prefetch()
        assert result is not None and result["ok"] is False
        assert "InvalidArgumentError" in board.message.value and "999999" in board.message.value
    finally:
        board.close()


def test_a_worker_that_dies_is_marked_gone_and_nothing_else_is_lost(cluster):
    client, monitor = cluster
    victim, survivor = sorted(monitor.workers())
    kept = rows_of(monitor, survivor)
    with contextlib.suppress(Exception):   # the worker dies before it can answer: that is the point
        client.run(os._exit, 1, workers=[victim])
    until(lambda: monitor.workers()[victim].state == "gone", "the dead worker marked gone")
    lanes = monitor.workers()[victim]
    assert lanes.last is not None and len(lanes.rows()) == 2   # its last picture stays, marked
    assert {row["state"] for row in lanes.rows()} == {"gone"}
    again = rows_of(monitor, survivor)
    assert again[1]["dtod_bytes"] == kept[1]["dtod_bytes"] and again[0]["state"] == "live"
    # The nanny starts a new worker: new lanes, reporting, under a new address.
    newcomer = until(lambda: [a for a, w in monitor.workers().items() if a not in (victim, survivor)
                              and w.last is not None], "the restarted worker")
    assert monitor.workers()[newcomer[0]].state == "live"
    with pytest.raises(InvalidStateError, match="is gone"):
        monitor.prefetch(victim, 1, "host")
    if importlib.util.find_spec("bokeh") and importlib.util.find_spec("ipywidgets"):
        from uvm_lab.jupyter.dashboard.cluster import ClusterDashboard

        board = ClusterDashboard(monitor, live=False)
        gone = [c for lane, c in zip(board.memory.data["lane"], board.memory.data["colour"], strict=True)
                if victim.split("://")[-1] in lane]
        board.close()
        assert gone and set(gone) == {"#9e9e9e"}, "a gone worker's lanes are drawn grey"
        assert "1 gone" in board.header.value


def test_a_restart_leaves_every_old_lane_marked_and_new_ones_live(cluster):
    client, monitor = cluster
    before = {a for a, w in monitor.workers().items() if w.state == "live"}
    client.restart()
    until(lambda: all(monitor.workers()[a].state != "live" for a in before), "every old worker marked")
    until(lambda: len([w for w in monitor.workers().values() if w.state == "live" and w.last is not None]) == 2,
          "two new workers reporting")
    assert monitor.bad == 0


def test_what_is_not_a_worker_message_is_refused_and_leaves_no_lanes(cluster):
    _, monitor = cluster
    with pytest.raises(ProtocolError):
        monitor.receive({"worker": 3})
    with pytest.raises(ProtocolError):
        monitor.receive({"worker": "tcp://x:1", "delta": b"short"})
    assert "tcp://x:1" not in monitor.workers()   # nothing was made of it


def test_a_monitor_needs_a_client():
    with pytest.raises(InvalidArgumentError, match=r"client must be a distributed\.Client"):
        ClusterMonitor(object())


def test_a_delta_never_names_a_gpu_a_page_state_cannot(sim_backend):
    """The simulator has up to 7 GPUs; a page state names 6. GPU 6's copies read as unknown, never as some GPU's."""
    import uvm_lab as ul
    from uvm_lab.dask.worker import Reporter

    ul.use_backend("sim", devices=7, device_memory="64MiB")
    sent = []
    reporter = Reporter(lambda topic, message: sent.append(message), address="tcp://w:1", name="w", interval=10,
                        start=False)
    try:
        buf = ul.DeviceBuffer(size="2MiB")
        ul.touch(buf, on="host", mode="write")
        buf.prefetch("gpu:6")
        assert reporter.report(force=True)
        delta = wire.decode(sent[-1]["delta"])
        assert len(delta.rows) == 7 and delta.rows["pages"].tolist() == [0] * 7
        assert delta.header["unknown_pages"] == 512 and delta.rows["dtod_bytes"].sum() == 0
        assert delta.rows["htod_bytes"][6] == 2 * MiB   # the bytes are known, and whose they were
        buf.close()
    finally:
        reporter.close()
