"""``ul.snapshot``: one self-contained HTML file of a trace's view, carrying the timeline as the kernel's own
``EventWindow.query`` answers, and nothing that reaches the network."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import uvm_lab as ul
from uvm_lab.errors import InvalidArgumentError, InvalidStateError
from uvm_lab.events import get_bus
from uvm_lab.jupyter import snapshot as snapshot_module
from uvm_lab.jupyter.protocol import TIMELINE_COLUMNS
from uvm_lab.jupyter.snapshot import BASE_WIDTH, _column
from uvm_lab.jupyter.timeline import EventWindow

pytestmark = pytest.mark.skipif(not snapshot_module.VIEWER.is_file(),
                                reason="the snapshot viewer is not built (cd extension && jlpm build)")


def workload() -> list[ul.DeviceBuffer]:
    buffers = [ul.DeviceBuffer(size="4MiB", label=f"layer{i}") for i in range(3)]
    for buf in buffers:
        ul.touch(buf, on="gpu")
    buffers[0].prefetch("host")
    ul.touch(buffers[0], on="gpu")
    buffers[1].close()
    return buffers


@pytest.fixture
def trace():
    ul.use_backend("sim", device_memory="16MiB")
    with ul.record() as recorded:
        buffers = workload()
    yield recorded
    for buf in buffers:
        buf.close()


def embedded(path) -> dict:
    page = path.read_text(encoding="utf-8")
    found = re.search(r'<script type="application/json" id="uvm-lab-data">(.*?)</script>', page, flags=re.S)
    assert found, "the page carries no data"
    return json.loads(found.group(1))


def test_the_snapshot_is_one_html_file_with_its_viewer_and_data_and_no_network(trace, tmp_path):
    path = ul.snapshot(trace, tmp_path / "view.html")
    assert path == tmp_path / "view.html"
    assert [p.name for p in tmp_path.iterdir()] == ["view.html"]   # no scratch file, no asset beside it
    page = path.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>")
    # Nothing loaded from anywhere: no src or href, no stylesheet link, no request API in the script.
    assert not re.search(r"<(script|link|img|iframe)\b[^>]*\b(src|href)=", page)
    assert not re.search(r"url\(\s*['\"]?https?:", page)
    for request in ("fetch(", "XMLHttpRequest", "WebSocket", "import(", "sendBeacon"):
        assert request not in page, request
    # The only URLs are XML namespace names, which no browser fetches.
    assert {u for u in re.findall(r"https?://[^\s\"'<>)]+", page)} <= {
        "http://www.w3.org/1999/xhtml", "http://www.w3.org/1999/xlink", "http://www.w3.org/2000/svg",
        "http://www.w3.org/2000/xmlns/", "http://www.w3.org/XML/1998/namespace"}
    assert snapshot_module.VIEWER.read_text(encoding="utf-8")[:200] in page   # the viewer, inline

    data = embedded(path)
    assert data["events"] == len(trace)
    assert data["summary"]["bytes_htod"] == trace.summary()["bytes_htod"] > 0
    assert {a["label"] for a in data["allocations"]} >= {"layer0", "layer2"}
    sources = " ".join(row["source"] for row in data["by_source"])
    assert "test_snapshot.py:" in sources                       # the line of this file that caused them
    assert data["bounds"]["events_not_held"] == 0 and data["bounds"]["rows_truncated"] == 0


def test_each_level_is_the_event_windows_answer_for_the_whole_trace(trace, tmp_path):
    data = embedded(ul.snapshot(trace, tmp_path / "view.html"))
    window = EventWindow(capacity=len(trace))
    window.feed(trace.events)
    first, last = window.extent()
    assert (data["first"], data["last"]) == (first, last)
    assert [level["width"] for level in data["levels"]][:2] == [BASE_WIDTH, 2 * BASE_WIDTH]
    for level in data["levels"]:
        columns, events, truncated = window.query(first, last, level["width"], None)
        assert (level["rows"], level["events"], level["truncated"]) == (len(columns["start"]), events, truncated)
        for name, _ in TIMELINE_COLUMNS:
            np.testing.assert_array_equal(_column(level, name), columns[name], err_msg=f"{level['width']} {name}")
    # Coarse levels merge: the kernel's rule, carried as it answers.
    assert data["levels"][0]["rows"] < len(trace)


def test_each_allocation_carries_the_traffic_the_live_view_counts(trace, tmp_path):
    data = embedded(ul.snapshot(trace, tmp_path / "view.html"))
    by_label = {a["label"]: a for a in data["allocations"]}
    layer0 = by_label["layer0"]
    assert layer0["size"] == 4 << 20 and layer0["freed"] is None and "test_snapshot.py:" in layer0["source"]
    assert layer0["traffic"]["dtoh_bytes"] == 4 << 20          # the prefetch to the host
    freed = [a for a in data["allocations"] if a["freed"] is not None]
    assert len(freed) == 1 and freed[0]["traffic"]["faults"] > 0   # read before the window let it go
    assert freed[0]["label"] == "layer1"                          # named as it was made, though freed
    moved = sum(a["traffic"]["htod_bytes"] for a in data["allocations"])
    assert moved == trace.summary()["bytes_htod"]
    samples = data["samples"]
    assert {len(s["htod_bytes"]) for s in samples} == {1}       # one GPU
    assert sum(s["htod_bytes"][0] for s in samples) == trace.summary()["bytes_htod"]
    assert sum(s["gpu_faults"][0] for s in samples) == trace.summary()["gpu_faults"]
    assert samples[-1]["allocated"] == 2 * (4 << 20)           # three made, one freed
    assert "used" not in data["sampled"]                        # not in any record: not drawn


def test_a_two_gpu_traces_samples_tell_each_gpus_moves(tmp_path):
    ul.use_backend("sim", devices=2, device_memory="64MiB")
    with ul.record() as recorded:
        buf = ul.DeviceBuffer(size="8MiB", label="peer")
        ul.touch(buf, on="host", mode="write")
        buf.prefetch("gpu:0")
        buf.prefetch("gpu:1")
    try:
        data = embedded(ul.snapshot(recorded, tmp_path / "view.html"))
    finally:
        buf.close()
    samples = data["samples"]
    assert {len(s[name]) for s in samples for name in ("used", "total", "htod_bytes", "dtod_bytes")} == {2}

    def moved(name):
        return [sum(s[name][gpu] for s in samples) for gpu in (0, 1)]

    assert moved("htod_bytes") == [8 << 20, 0]          # the first prefetch, into GPU 0
    assert moved("dtod_bytes") == [0, 8 << 20] == [0, recorded.summary()["bytes_dtod"]]   # then to GPU 1
    assert moved("dtoh_bytes") == [0, 0]
    assert "dtod_bytes" in data["sampled"] and "used" not in data["sampled"]
    assert all(s["used"] == s["total"] == [0, 0] for s in samples)   # a trace does not know the GPUs' memory


def test_rows_past_the_bound_leave_finer_levels_out_and_say_so(trace, tmp_path):
    data = embedded(ul.snapshot(trace, tmp_path / "view.html", max_rows=1))
    bounds = data["bounds"]
    assert len(data["levels"]) == bounds["levels"] == 1           # the coarsest is always kept
    assert bounds["finer_levels_left_out"] > 0
    assert bounds["finest_pixel_ns"] == pytest.approx((data["last"] - data["first"]) / BASE_WIDTH)


def test_without_a_trace_it_shows_every_event_the_kernel_holds(trace, tmp_path):
    bus = get_bus()
    bus.flush()
    data = embedded(ul.snapshot(None, tmp_path / "held.html"))
    assert data["events"] == len(bus.history()) >= len(trace)
    assert data["bounds"]["events_not_held"] == bus.dropped


@pytest.mark.parametrize(("arguments", "mentions"), [
    (dict(trace="trace.npy"), "uvm_lab.Trace"),
    (dict(path=42), "file path"),
    (dict(path=""), "file path"),
    (dict(path="missing/view.html"), "existing folder"),
    (dict(path="."), "file path"),
    (dict(title=3), "a str"),
    (dict(max_rows=0), "int >= 1"),
    (dict(max_rows=True), "int >= 1"),
])
def test_bad_inputs_raise_typed_errors_and_write_nothing(trace, tmp_path, monkeypatch, arguments, mentions):
    monkeypatch.chdir(tmp_path)
    call = dict(trace=trace, path="view.html") | arguments
    options = {k: v for k, v in call.items() if k in ("title", "max_rows")}
    with pytest.raises(InvalidArgumentError) as err:
        ul.snapshot(call["trace"], call["path"], **options)
    assert mentions in err.value.expected
    assert err.value.value is next(iter(arguments.values()))
    assert list(tmp_path.iterdir()) == []


def test_an_unbuilt_viewer_is_named_and_nothing_is_written(trace, tmp_path, monkeypatch):
    monkeypatch.setattr(snapshot_module, "VIEWER", tmp_path / "absent.js")
    with pytest.raises(InvalidStateError, match="jlpm build"):
        ul.snapshot(trace, tmp_path / "view.html")
    assert list(tmp_path.iterdir()) == []


def test_the_pages_data_has_a_same_named_typescript_twin_with_the_same_fields():
    import typing
    from pathlib import Path

    source = (Path(__file__).resolve().parents[2] / "extension" / "src" / "snapshot.ts").read_text()
    ts = {name: set(re.findall(r"^  (\w+)\??:", body, flags=re.M))
          for name, body in re.findall(r"export interface I(\w+) \{(.*?)\n\}", source, flags=re.S)}
    py = {name: set(typing.get_type_hints(obj)) for name, obj in vars(snapshot_module).items()
          if isinstance(obj, type) and typing.is_typeddict(obj) and name.startswith("Snapshot")}
    assert set(py) == {"SnapshotLevel", "SnapshotAllocation", "SnapshotBounds", "SnapshotData"}
    assert {name: ts.get(name) for name in py} == py
